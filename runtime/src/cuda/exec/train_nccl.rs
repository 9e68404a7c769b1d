//! A training run with one process per GPU ([`train_nccl`]): this process's rank of the
//! plan on its node's GPU (the launcher's local rank), NCCL bootstrapped through the job's
//! [`Bootstrap`] (MPI's under `mpirun`), the steps through the NCCL driver, and each
//! step's loss gathered over the job in rank order — the sum `train_multi` takes over the
//! ranks it holds, so every rank reports the same curve. A rank's own trace and peak go in
//! its result; a rank that fails (an NCCL error, a peer that never answers, a bad value)
//! ends with an error naming it. [`open_rank`] takes the GPU ordinal explicitly: the
//! launcher's local rank here, the thread's rank in `train_node`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_models::plan::Plan;

use super::device::{Device, Gpu};
use super::nccl::{Nccl, NcclRank};
use super::nccl_gpu::{GpuNccl, gpu_count, unique_id};
use super::rank::{GpuExecError, GpuRank, check_plan};
use crate::cuda::nccl_comm::{Bootstrap, bootstrap_id, local_rank, pick_gpu};
use crate::data::Corpus;
use crate::error::RuntimeError;
use crate::train::{RankMemory, StepRecord, TrainError, TrainOptions, TrainResult};

pub(super) fn bad(why: String) -> TrainError {
    TrainError::Setup(RuntimeError::BadSetting(why))
}

pub(super) fn failed(plan: &Plan, rank: u32, e: GpuExecError) -> TrainError {
    match e {
        GpuExecError::Unsupported(why) => bad(format!("the CUDA executor cannot run this plan: {why}")),
        other => TrainError::RankFailed { rank, label: plan.grid.label(rank), reason: other.to_string() },
    }
}

/// Trains this process's rank of `plan` on its GPU — the launcher's local rank names it
/// ([`local_rank`]) —, its peers reached through NCCL; `timeout` bounds every wait on them.
pub fn train_nccl(
    plan: Arc<Plan>,
    corpus: Arc<Corpus>,
    boot: &mut dyn Bootstrap,
    opts: &TrainOptions,
    timeout: Duration,
    progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    let (rank, world) = (boot.rank(), boot.size());
    if world != plan.grid.ranks() {
        return Err(bad(format!(
            "the plan has {} ranks (tp · pp · dp) but the job has {world} processes; launch one process per rank \
             (mpirun -n {} strata train --backend cuda …)",
            plan.grid.ranks(),
            plan.grid.ranks()
        )));
    }
    check_plan(&plan).map_err(|e| failed(&plan, rank, e))?;
    let local = local_rank(|k| std::env::var(k).ok()).map_err(bad)?;
    let ordinal = pick_gpu(rank, local, gpu_count()).map_err(bad)?;
    let nr = open_rank(&plan, corpus, boot, ordinal, opts, timeout, Some(timeout))?;
    train_ranked(plan, nr, boot, opts, progress)
}

/// Rank `boot.rank()` of `plan` on GPU `ordinal`, ready to train: the GPU opened, NCCL's
/// unique id from rank 0 through `boot`, the rank's communicators (`ncclCommInitRank`,
/// which every rank of the job must call concurrently: processes, or threads of one) and
/// its buffers. The one-process-per-GPU run passes its local rank's GPU; the run of a
/// whole node in one process (`train_node`) passes GPU i to its thread of rank i.
/// `init_deadline`: how long the communicators' set-up may take before this process exits
/// naming the rank (the one-process-per-GPU run's `timeout`); `None` for `train_node`, whose
/// halting ends a node's job from the first failing rank and must keep that rank's error.
pub fn open_rank(
    plan: &Arc<Plan>,
    corpus: Arc<Corpus>,
    boot: &mut dyn Bootstrap,
    ordinal: usize,
    opts: &TrainOptions,
    timeout: Duration,
    init_deadline: Option<Duration>,
) -> Result<NcclRank<Gpu, GpuNccl>, TrainError> {
    let rank = boot.rank();
    let gpu = Gpu::open(ordinal).map_err(|e| failed(plan, rank, e.into()))?;
    let id = bootstrap_id(boot, unique_id).map_err(bad)?;
    // ncclCommInitRank waits for every rank: a peer that never joins would block it for
    // ever, beyond NCCL's errors and the step timeout, so the set-up gets a deadline.
    let n = plan.grid.ranks();
    let open = || GpuNccl::open(&gpu, plan, rank, id);
    let nccl = match init_deadline {
        Some(limit) => {
            let on_expiry = move || {
                eprintln!(
                    "error: rank {rank}: NCCL's communicator set-up (ncclCommInitRank of the {n}-rank job) did not finish \
                     within {} s (--timeout): a peer never joined — it died, was not started, or cannot reach this one; \
                     ending the job",
                    limit.as_secs()
                );
                std::process::exit(1)
            };
            super::deadline::run_with_deadline(limit, on_expiry, open)
        }
        None => open(),
    }
    .map_err(|e| failed(plan, rank, e))?;
    let g = GpuRank::for_rank(plan.clone(), rank, gpu, corpus, opts.exec.clone()).map_err(|e| failed(plan, rank, e))?;
    Ok(NcclRank::new(g, nccl, timeout))
}

/// The steps of one rank through NCCL (on a GPU, or the tests' stand-ins): after each, the
/// job's loss and non-finite checks from every rank's (loss, bad) pair gathered.
pub fn train_ranked<D: Device, N: Nccl<D>>(
    plan: Arc<Plan>,
    mut nr: NcclRank<D, N>,
    boot: &mut dyn Bootstrap,
    opts: &TrainOptions,
    mut progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    let s = &plan.scenario;
    let rank = nr.rank.rank;
    let tokens = s.tokens_per_step() as f64;
    let denom = (s.parallel.microbatches() * s.parallel.dp) as f64;
    let tp0 = plan.grid.coord(rank).tp == 0;
    let mut result = TrainResult { start_step: 0, steps: Vec::new(), trace: None, memory: Vec::new(), cpu: Vec::new() };
    for step in 0..opts.steps {
        let t0 = Instant::now();
        let rep = match nr.step(step) {
            Ok(rep) => rep,
            Err(e) => {
                // Abort, not destroy, the communicators: ncclCommDestroy would first wait
                // for the step's calls still queued, which wait on peers that wait on us.
                nr.nccl.abort();
                return Err(failed(&plan, rank, e));
            }
        };
        let mine = if tp0 { rep.loss_sum.unwrap_or(f64::NAN) } else { 0.0 };
        let bad_here = f64::from(u8::from(rep.nonfinite_grad.is_some()));
        let all =
            boot.all_gather(&[mine, bad_here]).map_err(|e| failed(&plan, rank, RuntimeError::BadSetting(e).into()))?;
        let secs = t0.elapsed().as_secs_f64();
        let loss = all.chunks(2).map(|p| p[0]).sum::<f64>() / denom;
        if let Some((tensor, value)) = rep.nonfinite_grad.clone() {
            return Err(TrainError::Diverged { step, rank, label: plan.grid.label(rank), tensor, value });
        }
        if let Some(r) = all.chunks(2).position(|p| p[1] != 0.0) {
            let r = r as u32;
            let why = "a non-finite gradient (that rank's error names it)".to_string();
            return Err(TrainError::Diverged {
                step,
                rank: r,
                label: plan.grid.label(r),
                tensor: why,
                value: f64::NAN,
            });
        }
        if !loss.is_finite() {
            return Err(TrainError::Diverged {
                step,
                rank: 0,
                label: plan.grid.label(0),
                tensor: "the loss".into(),
                value: loss,
            });
        }
        let rec = StepRecord { step, loss, tokens_per_s: tokens / secs, grad_norm: rep.grad_norm, seconds: secs };
        if let Some(p) = progress.as_mut() {
            p(&rec);
        }
        result.steps.push(rec);
        if !rep.spans.is_empty() {
            let mut t = strata_models::trace::Trace {
                source: strata_models::trace::TraceSource::Measured,
                step,
                seed: s.training.seed,
                ranks: vec![rank],
                spans: rep.spans,
                memory: rep.memory,
            };
            t.canonicalize();
            result.trace = Some(t);
        }
    }
    result.memory.push(RankMemory { rank, peaks: nr.rank.peaks().clone() });
    Ok((result, nr.rank.gpu_name().to_string()))
}
