//! A training run of one process driving every GPU of its node ([`train_node`],
//! `strata train --backend cuda --all-gpus`): one thread per rank of the plan, rank i on
//! GPU i, each the one-process-per-GPU run's rank (`train_nccl::open_rank` and
//! `train_ranked`: its own GPU, its NCCL communicators from one unique id, the steps
//! through the NCCL driver), the job's bootstrap in shared memory
//! (`cuda::node_boot::ThreadBootstrap`) instead of MPI — NCCL needs every rank's
//! `ncclCommInitRank` to run concurrently, which threads do.
//!
//! A rank that fails (an error, a panic) raises the node's [`Halt`]: its peers' NCCL calls
//! and waits fail at once ([`Halting`]) and so do their bootstrap waits, so the job ends
//! with the first failing rank's error, not its peers' timeouts; the caller does not wait
//! past `timeout` more for the other ranks to end (a thread stuck inside an NCCL call is
//! left behind, and ends with the process). The result is rank 0's loss curve (every rank
//! gathers the same) with every rank's measured memory and the traced step's spans of all
//! ranks, as the shared-GPU run returns them.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use strata_models::plan::{OpId, Plan, Stream};
use strata_models::trace::{Trace, TraceSource};

use super::device::Device;
use super::nccl::{Call, Nccl, NcclRank};
use super::nccl_gpu::{gpu_count, nccl_present};
use super::rank::check_plan;
use super::train_nccl::{bad, failed, open_rank, train_ranked};
use crate::cuda::nccl_comm::NcclFailure;
use crate::cuda::node_boot::{Halt, ThreadBootstrap};
use crate::data::Corpus;
use crate::train::{StepRecord, TrainError, TrainOptions, TrainResult};

/// Trains every rank of `plan` on this node's GPUs, one thread and one GPU per rank;
/// `timeout` bounds every wait of a rank on its peers.
pub fn train_node(
    plan: Arc<Plan>,
    corpus: Arc<Corpus>,
    opts: &TrainOptions,
    timeout: Duration,
    progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    check_plan(&plan).map_err(|e| failed(&plan, 0, e))?;
    let (ranks, gpus) = (plan.grid.ranks(), gpu_count());
    if ranks as usize != gpus {
        return Err(bad(format!(
            "the plan has {ranks} ranks (tp · pp · dp) but this node has {gpus} visible GPU(s); one process for all \
             GPUs drives one GPU per rank: size the plan to {gpus} ranks (--ranks {gpus}), or make {ranks} GPUs \
             visible (CUDA_VISIBLE_DEVICES), or leave out --all-gpus to run every rank on one GPU"
        )));
    }
    if !nccl_present() {
        return Err(bad("one process for all GPUs needs NCCL: no libnccl.so on this machine; install NCCL and put \
                        it on LD_LIBRARY_PATH"
            .into()));
    }
    let (p, o) = (plan.clone(), opts.clone());
    let open = move |boot: &mut ThreadBootstrap| {
        let rank = crate::cuda::nccl_comm::Bootstrap::rank(boot);
        open_rank(&p, corpus.clone(), boot, rank as usize, &o, timeout, None)
    };
    run_node(plan, opts, timeout, progress, open)
}

/// What a rank thread tells the caller: rank 0's step records, each rank's end.
enum Event {
    Step(StepRecord),
    Done(u32, Result<(TrainResult, String), TrainError>),
}

/// Trains every rank of `plan` on its own thread: `open` makes the thread's rank (its
/// device and NCCL, or the tests' stand-ins) from its bootstrap handle, and it trains
/// through [`train_ranked`] under the node's [`Halt`].
pub fn run_node<D, N, F>(
    plan: Arc<Plan>,
    opts: &TrainOptions,
    timeout: Duration,
    mut progress: Option<&mut dyn FnMut(&StepRecord)>,
    open: F,
) -> Result<(TrainResult, String), TrainError>
where
    D: Device,
    N: Nccl<D>,
    F: Fn(&mut ThreadBootstrap) -> Result<NcclRank<D, N>, TrainError> + Send + Sync + 'static,
{
    let n = plan.grid.ranks();
    let boots = ThreadBootstrap::node(n, timeout);
    let halt = boots[0].halt();
    let open = Arc::new(open);
    let (tx, rx) = channel();
    for (rank, mut boot) in (0..n).zip(boots) {
        let (plan, opts, open, tx, halt) = (plan.clone(), opts.clone(), open.clone(), tx.clone(), halt.clone());
        let body = move || {
            let run = catch_unwind(AssertUnwindSafe(|| {
                let nr = (*open)(&mut boot)?;
                let nccl = Halting { inner: nr.nccl, halt: halt.clone(), rank };
                let nr = NcclRank::new(nr.rank, nccl, nr.timeout);
                let step_tx = tx.clone();
                let mut tell = move |r: &StepRecord| {
                    if rank == 0 {
                        let _ = step_tx.send(Event::Step(*r));
                    }
                };
                train_ranked(plan.clone(), nr, &mut boot, &opts, Some(&mut tell))
            }));
            let run = run.unwrap_or_else(|p| {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                Err(TrainError::RankFailed { rank, label: plan.grid.label(rank), reason: format!("panicked: {why}") })
            });
            if run.is_err() {
                halt.leave(rank);
            }
            let _ = tx.send(Event::Done(rank, run));
        };
        std::thread::Builder::new()
            .name(format!("rank {rank}"))
            .spawn(body)
            .map_err(|e| bad(format!("starting the thread of rank {rank}: {e}")))?;
    }
    drop(tx);
    let mut ends: Vec<Option<Result<(TrainResult, String), TrainError>>> = (0..n).map(|_| None).collect();
    let mut until = None;
    while ends.iter().any(Option::is_none) {
        let ev = match until {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => rx.recv_timeout(t - Instant::now().min(t)),
        };
        match ev {
            Ok(Event::Step(r)) => {
                if let Some(p) = progress.as_mut() {
                    p(&r);
                }
            }
            Ok(Event::Done(rank, run)) => {
                if run.is_err() && until.is_none() {
                    until = Some(Instant::now() + timeout);
                }
                ends[rank as usize] = Some(run);
            }
            Err(_) => break,
        }
    }
    // The job's error: the first rank that failed, else any (in rank order).
    let first = halt.left().filter(|&r| matches!(ends[r as usize], Some(Err(_))));
    if let Some(r) = first.or_else(|| ends.iter().position(|e| matches!(e, Some(Err(_)))).map(|r| r as u32)) {
        return Err(ends[r as usize].take().and_then(Result::err).expect("an error"));
    }
    let mut oks = Vec::with_capacity(n as usize);
    for (rank, end) in ends.into_iter().enumerate() {
        match end {
            Some(Ok(r)) => oks.push(r),
            _ => return Err(bad(format!("rank {rank} ended without a result"))),
        }
    }
    Ok(merge(&plan, oks))
}

/// Rank 0's curve, every rank's memory, and the traced step's spans of every rank.
fn merge(plan: &Plan, ranks: Vec<(TrainResult, String)>) -> (TrainResult, String) {
    let traces: Vec<Trace> = ranks.iter().filter_map(|r| r.0.trace.clone()).collect();
    let memory = ranks.iter().flat_map(|r| r.0.memory.iter().cloned()).collect();
    let mut it = ranks.into_iter();
    let (mut result, name) = it.next().expect("a plan has a rank");
    result.memory = memory;
    result.trace = traces.first().map(|t0| {
        let mut t = Trace {
            source: TraceSource::Measured,
            step: t0.step,
            seed: plan.scenario.training.seed,
            ranks: traces.iter().flat_map(|t| t.ranks.iter().copied()).collect(),
            spans: traces.iter().flat_map(|t| t.spans.iter().cloned()).collect(),
            memory: traces.iter().flat_map(|t| t.memory.iter().cloned()).collect(),
        };
        t.canonicalize();
        t
    });
    (result, name)
}

/// A rank's NCCL under its node's [`Halt`]: once a peer has failed, this rank's next call
/// or wait fails as a remote peer's failure (`ncclRemoteError`, naming the peer), so the
/// driver aborts its communicators and the rank ends instead of waiting on the peer until
/// its timeout.
pub struct Halting<N> {
    pub inner: N,
    halt: Halt,
    rank: u32,
}

impl<N> Halting<N> {
    fn peer_left(&self) -> Option<u32> {
        self.halt.left().filter(|&r| r != self.rank)
    }
}

impl<D: Device, N: Nccl<D>> Nccl<D> for Halting<N> {
    fn call(&mut self, gpu: &D, s: Stream, op: OpId, call: Call) -> Result<(), NcclFailure> {
        if let Some(r) = self.peer_left() {
            return Err(NcclFailure::Error {
                rank: self.rank,
                what: format!("op #{op} after rank {r} failed"),
                code: 6,
            });
        }
        self.inner.call(gpu, s, op, call)
    }
    fn async_error(&mut self) -> u32 {
        if self.peer_left().is_some() { 6 } else { self.inner.async_error() }
    }
    /// The driver aborts on its rank's failure, or on a peer's seen here: the first marks
    /// this rank as the node's first failure before its thread even returns.
    fn abort(&mut self) {
        self.halt.leave(self.rank);
        self.inner.abort();
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wire;
