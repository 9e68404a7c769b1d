//! Measuring the machine the executor runs on, for `strata calibrate`: plain samples that
//! the simulator's fit turns into a hardware profile (`strata_sim::calibrate`).
//!
//! Four measurements, each with the machine as loaded as a job loads it:
//! - [`time_gemms`]: seconds of one `matmul` call of each (m, n, k), timed on as many
//!   threads at once as the host has cores (every core busy, as in a job with at least as
//!   many ranks as cores), median over repetitions and threads;
//! - [`time_pieces`]: every compute op of small jobs of a model (one pipeline stage, one
//!   data-parallel replica, each tensor-parallel size the plans use), run as the executor
//!   runs them with every core busy — one-rank jobs several at once, a tensor-parallel job's
//!   ranks sharing the cores: each op's own CPU time with its plan cost, what a piece really
//!   costs beside its GEMMs, on a core of its own. (What more ranks than cores cost on top —
//!   time slices that start on caches other threads filled — is [`shared_cores`]'. The fit
//!   takes medians.)
//! - [`time_comm`]: collectives (and a pipeline message) on the threads communicator — the
//!   kinds every plan sends ([`KINDS`]) and context parallelism's ring exchange and
//!   all-to-all ([`CP_KINDS`]) — over group sizes and message sizes, with all of the job's
//!   ranks at once (every group of the size runs concurrently): each member's CPU work
//!   posting its contribution and finishing (combining what arrived) — thread CPU time
//!   (`CLOCK_THREAD_CPUTIME_ID` on 64-bit Linux; wall time elsewhere) — and the delay from
//!   the last member's post until a waiting member notices it; medians over repetitions;
//! - [`shared_cores`]: how many cores' worth of compute N busy threads get, relative to one
//!   thread's speed while every core is busy (processor sharing's capacity), with a unit of
//!   work as large as a rank's own, so that the threads evict each other's caches as ranks do;
//! - [`staging_rates`]: what the executor's copies around a data-parallel collective cost per
//!   byte (into a fresh message, and back over the held tensors), every rank thread copying.
//!
//! Nothing here chooses a configuration or knows the simulator; the samples are plain data.
//! Units: seconds, bytes.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_models::Scenario;
use strata_models::plan::{CollKind, ComputeCost, GroupKind, OpKind, Phase, Piece, lower};

use crate::comm::collective::{Group, Mailbox, Pending};
use crate::comm::threads::{AbortFlag, ThreadComm};
use crate::comm::{CommError, Communicator, Payload, Tag};
use crate::data::MarkovSource;
use crate::exec::ExecConfig;
use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::train::{TrainOptions, train_threads};

mod host;
pub use host::{CpuMeter, StagingRates, shared_cores, speed_probe, staging_rates};

/// Cores of this host (at least 1).
pub fn host_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// One GEMM shape: seconds per call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmSample {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub seconds: f64,
}

/// One compute op as it ran: its piece, its plan cost and its seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PieceSample {
    pub piece: Piece,
    pub phase: Phase,
    pub cost: ComputeCost,
    pub seconds: f64,
}

/// What a communication sample moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommOp {
    Collective(CollKind),
    /// A pipeline message: send, receive, acknowledgement.
    SendRecv,
}

/// One communication of `bytes` (nccl-tests' S) over `ranks` ranks: a member's CPU seconds
/// posting and finishing, and the seconds between the last post and a waiting member
/// noticing it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommSample {
    pub op: CommOp,
    pub ranks: u32,
    pub bytes: u64,
    pub post_s: f64,
    pub finish_s: f64,
    pub latency_s: f64,
}

/// CPU time this thread has run, ns, where the platform reports it ([`crate::cputime`]).
pub fn thread_cpu_ns() -> Option<u64> {
    crate::cputime::thread_ns()
}

/// One member's view of one communication (seconds since the run's epoch; CPU seconds).
#[derive(Clone, Copy, Debug, Default)]
struct Member {
    post_end: f64,
    post_cpu: f64,
    finish_start: f64,
    finish_cpu: f64,
    /// Whether this member waits for others (not the last to post; a message's receiver).
    waits: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Seconds per call of each shape, median over `reps` calls (after one warm-up call), on
/// `threads` threads at once: all threads time the same shape together.
pub fn time_gemms(shapes: &[(u64, u64, u64)], threads: u32, reps: u32) -> Vec<GemmSample> {
    let threads = threads.max(1);
    let shapes = Arc::new(shapes.to_vec());
    let barrier = Arc::new(Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (shapes, barrier) = (shapes.clone(), barrier.clone());
            std::thread::spawn(move || {
                shapes
                    .iter()
                    .map(|&(m, n, k)| {
                        let (m, n, k) = (m as usize, n as usize, k as usize);
                        let a: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 * 1e-2).collect();
                        let b: Vec<f32> = (0..k * n).map(|i| (i % 89) as f32 * 1e-2).collect();
                        let mut c = vec![0.0f32; m * n];
                        let mut run = || {
                            let t = Instant::now();
                            matmul(
                                MatRef::new(&a, m, k),
                                MatRef::new(&b, k, n),
                                MatMut::new(&mut c, m, n),
                                Transpose::Nn,
                                1.0,
                                0.0,
                            );
                            t.elapsed().as_secs_f64()
                        };
                        barrier.wait();
                        run();
                        median((0..reps.max(1)).map(|_| run()).collect())
                    })
                    .collect::<Vec<f64>>()
            })
        })
        .collect();
    let per_thread: Vec<Vec<f64>> = handles.into_iter().map(|h| h.join().expect("a GEMM timing thread")).collect();
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(m, n, k))| GemmSample { m, n, k, seconds: median(per_thread.iter().map(|t| t[i]).collect()) })
        .collect()
}

/// What small real jobs of a model tell: every compute op, every communication op as the
/// executor ran it, and the interpreter's own CPU time per op.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSamples {
    pub pieces: Vec<PieceSample>,
    /// Each communication op's own CPU time on its rank (post and completion), with its
    /// kind, group size and bytes.
    pub comm: Vec<CommInSitu>,
    /// Per rank of every job: (ops of its program, CPU seconds of the step outside any op).
    pub loop_cpu: Vec<(u64, f64)>,
}

/// A communication op as a job ran it: CPU seconds of its own work on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommInSitu {
    pub op: CommOp,
    pub ranks: u32,
    pub bytes: u64,
    pub cpu_s: f64,
}

/// Runs each scenario for `steps` steps and returns what its last step shows on every rank
/// ([`JobSamples`]). Op times are thread CPU times where the platform has them (the op's
/// own work, whoever else held the core meanwhile), else spans. A scenario of r ranks runs
/// as `threads / r` concurrent jobs (at least one): with `threads` the host's cores, every
/// core busy, as in a real job.
pub fn time_jobs(scenarios: &[Scenario], threads: u32, steps: u32) -> Result<JobSamples, String> {
    let mut out = JobSamples::default();
    for s in scenarios {
        let p = &s.parallel;
        let copies = (u64::from(threads) / p.ranks()).max(1) as u32;
        let plan = Arc::new(lower(s).map_err(|e| e.to_string())?);
        let need = (steps as usize + 1) * p.global_batch as usize * (s.model.seq_len as usize + 1);
        let src = MarkovSource::new(s.model.vocab as usize, 3, s.training.seed).map_err(|e| e.to_string())?;
        let corpus = Arc::new(src.corpus(need.max(4096), s.training.seed + 1));
        let opts = TrainOptions {
            steps,
            data_name: "calibration".into(),
            checkpoint: None,
            exec: ExecConfig { recv_timeout: Duration::from_secs(600), trace_step: steps.checked_sub(1) },
            faults: Vec::new(),
        };
        let jobs: Vec<_> = (0..copies)
            .map(|_| {
                let (plan, corpus, opts) = (plan.clone(), corpus.clone(), opts.clone());
                std::thread::spawn(move || train_threads(plan, corpus, &opts, None))
            })
            .collect();
        for job in jobs {
            let r = job.join().map_err(|_| "a calibration job panicked".to_string())?.map_err(|e| e.to_string())?;
            let trace = r.trace.ok_or("a calibration job recorded no trace")?;
            let by_rank: std::collections::BTreeMap<u32, &crate::exec::StepCpu> =
                r.cpu.iter().map(|c| (c.rank, &c.cpu)).collect();
            for span in &trace.spans {
                let ops = &plan.program(span.rank).ops;
                let cpu = by_rank.get(&span.rank).map(|c| c.ops[span.op as usize].1 as f64 * 1e-9);
                let seconds = cpu.unwrap_or((span.end_ns - span.start_ns) as f64 * 1e-9);
                let g = plan.grid;
                match &ops[span.op as usize].kind {
                    OpKind::Compute(c) => out.pieces.push(PieceSample {
                        piece: c.piece,
                        phase: c.phase,
                        cost: plan.cost(c.cost).clone(),
                        seconds,
                    }),
                    OpKind::Collective(c) if cpu.is_some() => {
                        let n = g.group(span.rank, c.group).len() as u32;
                        if n > 1 {
                            out.comm.push(CommInSitu {
                                op: CommOp::Collective(c.kind),
                                ranks: n,
                                bytes: c.bytes,
                                cpu_s: seconds,
                            });
                        }
                    }
                    _ => {}
                }
            }
            for (rank, c) in &by_rank {
                let own: u64 = c.ops.iter().map(|o| o.1).sum();
                let ops = plan.program(*rank).ops.len() as u64;
                out.loop_cpu.push((ops, c.step_ns.saturating_sub(own) as f64 * 1e-9));
            }
        }
    }
    Ok(out)
}

/// What every plan may send: the data-parallel and tensor-parallel collectives, and messages.
pub const KINDS: [CommOp; 5] = [
    CommOp::Collective(CollKind::AllReduce),
    CommOp::Collective(CollKind::ReduceScatter),
    CommOp::Collective(CollKind::AllGather),
    CommOp::Collective(CollKind::Broadcast),
    CommOp::SendRecv,
];

/// What context parallelism sends besides: ring attention's K/V and dK/dV passes, Ulysses'
/// all-to-all over heads (its all-gather and reduce-scatter are among [`KINDS`]).
pub const CP_KINDS: [CommOp; 2] = [CommOp::Collective(CollKind::RingExchange), CommOp::Collective(CollKind::AllToAll)];

/// Each of `kinds` over every group size in `groups` (each dividing `world`) and every size
/// in `sizes` (bytes), `reps` times after one warm-up, on `world` rank threads at once
/// (every group of a size runs concurrently).
pub fn time_comm(
    kinds: &[CommOp],
    world: u32,
    groups: &[u32],
    sizes: &[u64],
    reps: u32,
) -> Result<Vec<CommSample>, CommError> {
    let mut cases = Vec::new();
    for &g in groups.iter().filter(|g| **g >= 2 && world.is_multiple_of(**g)) {
        for &op in kinds {
            for &bytes in sizes {
                cases.push((op, g, bytes));
            }
        }
    }
    let cases = Arc::new(cases);
    let epoch = Instant::now();
    let flag = AbortFlag::default();
    let reps = reps.max(1) as usize;
    let handles: Vec<_> = ThreadComm::group(world, &flag)
        .into_iter()
        .map(|c| {
            let cases = cases.clone();
            std::thread::spawn(move || {
                let rank = c.rank();
                let mut mb = Mailbox::new(Box::new(c));
                let mut out = Vec::new();
                for (i, &(op, g, bytes)) in cases.iter().enumerate() {
                    for rep in 0..=reps {
                        let m = comm_once(&mut mb, rank, world, op, g, bytes, (i * 64 + rep) as u32, epoch)?;
                        if rep > 0 {
                            out.push(m);
                        }
                    }
                }
                Ok::<_, CommError>(out)
            })
        })
        .collect();
    let per_rank: Vec<Vec<Member>> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err(CommError::Transport { rank: 0, what: "panicked".into() })))
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for (i, &(op, g, bytes)) in cases.iter().enumerate() {
        let (mut post, mut finish, mut latency) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..reps {
            for grp in 0..world / g {
                let members: Vec<Member> =
                    (grp * g..(grp + 1) * g).map(|m| per_rank[m as usize][i * reps + r]).collect();
                let last_post = members.iter().map(|m| m.post_end).fold(0.0, f64::max);
                for m in &members {
                    post.push(m.post_cpu);
                    finish.push(m.finish_cpu);
                    if m.waits {
                        latency.push((m.finish_start - last_post).max(0.0));
                    }
                }
            }
        }
        let latency = if latency.is_empty() { 0.0 } else { median(latency) };
        out.push(CommSample {
            op,
            ranks: g,
            bytes,
            post_s: median(post),
            finish_s: median(finish),
            latency_s: latency,
        });
    }
    Ok(out)
}

/// CPU seconds of `f` on this thread (wall seconds where thread CPU time is not reported).
fn cpu_of<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let (w0, c0) = (Instant::now(), thread_cpu_ns());
    let out = f();
    let secs = match (c0, thread_cpu_ns()) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 * 1e-9,
        _ => w0.elapsed().as_secs_f64(),
    };
    (out, secs)
}

/// One communication on every group of `g` consecutive ranks: this member's view. Ranks
/// line up first on a world barrier.
#[allow(clippy::too_many_arguments)]
fn comm_once(
    mb: &mut Mailbox,
    rank: u32,
    world: u32,
    op: CommOp,
    g: u32,
    bytes: u64,
    step: u32,
    epoch: Instant,
) -> Result<Member, CommError> {
    let all = Group { kind: GroupKind::World, members: (0..world).collect(), position: rank as usize };
    let barrier = mb.post(&all, CollKind::AllReduce, true, Payload::F32(vec![0.0]))?;
    wait(mb, &barrier)?;
    let first = rank / g * g;
    let group = Group { kind: GroupKind::Tp, members: (first..first + g).collect(), position: (rank - first) as usize };
    let len = (bytes / 4) as usize;
    let t = || epoch.elapsed().as_secs_f64();
    let mut m = Member::default();
    match op {
        CommOp::Collective(kind) => {
            // An all-gather's input is this member's part of the whole buffer S.
            let mine = if kind == CollKind::AllGather { len / g as usize } else { len };
            let data = Payload::F32(vec![1.0; mine]);
            let (p, cpu) = cpu_of(|| mb.post(&group, kind, false, data));
            let p = p?;
            (m.post_end, m.post_cpu) = (t(), cpu);
            m.waits = !mb.missing(&p).is_empty();
            // The finishing work is everything the thread does after posting: taking the
            // contributions in as they arrive (a wake-up each) and combining them. Blocked
            // waiting costs no CPU time, so thread CPU time counts exactly that work.
            let cpu0 = thread_cpu_ns();
            wait_until(mb, |mb| mb.missing(&p).is_empty(), "a calibration collective")?;
            m.finish_start = t();
            let (out, cpu) = cpu_of(|| mb.try_finish(&p));
            assert!(out.is_some(), "every contribution was in");
            m.finish_cpu = match (cpu0, thread_cpu_ns()) {
                (Some(a), Some(b)) => b.saturating_sub(a) as f64 * 1e-9,
                _ => cpu,
            };
        }
        CommOp::SendRecv => {
            // Member 0 sends to member 1 (pairs within the group), as a pipeline stage does;
            // the receiver acknowledges, as the executor's receive does.
            let kind = strata_models::plan::P2pKind::Activation;
            let tag = Tag::P2p { step, kind, mb: 0, vstage: 0 };
            let ack = Tag::Ack { step, kind, mb: 0, vstage: 0 };
            let pos = group.position;
            if pos.is_multiple_of(2) && pos + 1 < g as usize {
                let to = group.members[pos + 1];
                let data = Payload::F32(vec![1.0; len]);
                let (r, cpu) = cpu_of(|| mb.send(to, tag, data));
                r?;
                (m.post_end, m.post_cpu) = (t(), cpu);
                wait_until(mb, |mb| mb.has(ack, to), "a calibration acknowledgement")?;
                m.finish_start = t();
                mb.take(ack, to);
            } else if pos % 2 == 1 {
                let from = group.members[pos - 1];
                m.waits = true;
                let cpu0 = thread_cpu_ns();
                wait_until(mb, |mb| mb.has(tag, from), "a calibration message")?;
                m.finish_start = t();
                let (r, cpu) = cpu_of(|| {
                    let msg = mb.take(tag, from);
                    std::hint::black_box(&msg);
                    mb.send(from, ack, Payload::Empty)
                });
                r?;
                m.finish_cpu = match (cpu0, thread_cpu_ns()) {
                    (Some(a), Some(b)) => b.saturating_sub(a) as f64 * 1e-9,
                    _ => cpu,
                };
            }
        }
    }
    Ok(m)
}

fn wait(mb: &mut Mailbox, p: &Pending) -> Result<(), CommError> {
    let start = Instant::now();
    while mb.try_finish(p).is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            return Err(CommError::Transport { rank: mb.rank(), what: "a calibration collective stalled".into() });
        }
        mb.poll(Duration::from_millis(20))?;
    }
    Ok(())
}

fn wait_until(mb: &mut Mailbox, ready: impl Fn(&Mailbox) -> bool, what: &str) -> Result<(), CommError> {
    let start = Instant::now();
    while !ready(mb) {
        if start.elapsed() > Duration::from_secs(120) {
            return Err(CommError::Transport { rank: mb.rank(), what: format!("{what} stalled") });
        }
        mb.poll(Duration::from_millis(20))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_samples_cover_every_kind_and_group_and_grow_with_size() {
        let s = time_comm(&KINDS, 4, &[2, 4], &[4096, 1 << 20], 2).unwrap();
        assert_eq!(s.len(), 2 * 5 * 2);
        // Context parallelism's kinds: a ring step copies the previous member's block in.
        let cp = time_comm(&CP_KINDS, 4, &[2, 4], &[4096, 1 << 20], 2).unwrap();
        let ring = |b| cp.iter().find(|x| x.op == CP_KINDS[0] && x.ranks == 4 && x.bytes == b).unwrap().finish_s;
        assert!(cp.len() == 2 * 2 * 2 && ring(1 << 20) > ring(4096), "{cp:?}");
        let ok = |v: f64| v >= 0.0 && v.is_finite();
        assert!(s.iter().all(|x| ok(x.post_s) && ok(x.finish_s) && ok(x.latency_s)), "{s:?}");
        // Summing 1 MiB from 4 ranks is more work than 4 KiB.
        let ar = |bytes| {
            s.iter().find(|x| x.op == CommOp::Collective(CollKind::AllReduce) && x.ranks == 4 && x.bytes == bytes)
        };
        assert!(ar(1 << 20).unwrap().finish_s > ar(4096).unwrap().finish_s);
    }

    #[test]
    fn gemm_and_piece_samples_are_positive_and_name_their_ops() {
        let g = time_gemms(&[(64, 64, 64), (128, 32, 64)], 2, 2);
        assert_eq!((g[1].m, g[1].n, g[1].k), (128, 32, 64));
        assert!(g.iter().all(|x| x.seconds > 0.0));
        let text = "[model]\npreset = \"tiny-gpt\"\nlayers = 2\n[cluster]\npreset = \"cpu-local\"\ngpus_per_node = 1\n\
                    [parallel]\ntp = 1\npp = 1\ndp = 1\nmicro_batch = 2\nglobal_batch = 4\n";
        let s = Scenario::from_toml(text, "t", "t", &[]).unwrap();
        let tp2 =
            Scenario::from_toml(text, "t", "t", &["parallel.tp=2".into(), "cluster.gpus_per_node=2".into()]).unwrap();
        // Four rank threads at once: four copies of the one-rank job, two of the tp = 2 one.
        let j = time_jobs(&[s, tp2], 4, 2).unwrap();
        if thread_cpu_ns().is_some() {
            // The tp = 2 job's all-reduces, and every rank's loop time.
            assert!(j.comm.iter().any(|c| c.op == CommOp::Collective(CollKind::AllReduce) && c.ranks == 2));
            assert_eq!(j.loop_cpu.len(), 4 + 2 * 2);
        }
        let p = j.pieces;
        // Every piece of every job, forward and backward, and the step.
        assert!(p.iter().any(|x| x.piece == Piece::Optimizer && x.phase == Phase::Step));
        assert!(p.iter().any(|x| x.piece == Piece::Attn && x.phase == Phase::BackwardWeight));
        assert!(p.iter().all(|x| x.seconds >= 0.0));
        assert!(shared_cores(2, (64, 96, 32)) > 0.3);
    }
}
