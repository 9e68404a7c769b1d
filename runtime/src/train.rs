//! Training a plan for real: every rank runs [`run_rank`], in-process threads
//! ([`train_threads`]) or one process per rank (`mpi_main`, feature `mpi`).
//!
//! Per step, each rank runs its program ([`RankExec::step`]) and reports its loss to rank
//! 0 over the communicator (a control message outside the plan); rank 0 forms the step's
//! loss — the mean over the global batch, Σ loss / (m·dp) — and its tokens per second
//! (global batch · seq over rank 0's wall time for the step, loss reports included).
//! Checkpoints are written every `every` steps and at the end (see [`crate::checkpoint`]).
//! At the end every rank sends rank 0 its spans and memory peaks, and rank 0 returns the
//! [`TrainResult`]: the loss curve, the measured trace of one step, the peaks per rank.
//! The ranks enter the traced step through a barrier, so that each rank's span times,
//! counted from its own start of the step, share one origin (up to the barrier's skew:
//! microseconds on threads).
//!
//! Failure: a rank that errors or panics tells the others ([`Communicator::abort`]); they
//! stop at their next wait with an error naming it. A rank that goes silent is noticed by
//! the receive timeout of whoever waits for it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_models::plan::Plan;
use strata_models::trace::{MemSample, Span, Trace, TraceSource};
use thiserror::Error;

use crate::checkpoint::{self, CheckpointError, ShardEntry};
use crate::comm::collective::Mailbox;
use crate::comm::threads::{AbortFlag, POLL, ThreadComm};
use crate::comm::{CommError, Communicator, Payload, Tag};
use crate::data::Corpus;
use crate::error::RuntimeError;
use crate::exec::{ExecConfig, ExecError, MemoryPeaks, RankExec, StepCpu, StepReport};

/// Checkpointing of a run.
#[derive(Clone, Debug)]
pub struct CheckpointOptions {
    pub dir: PathBuf,
    /// Write after every `every` steps (0: only at the end).
    pub every: u32,
    /// Start from the newest checkpoint in `dir`.
    pub resume: bool,
    /// A fresh run deletes the checkpoints already in `dir` (without it, it refuses a
    /// directory that holds anything; see [`checkpoint::dir`]).
    pub overwrite: bool,
    /// Training settings (`training.lr`, …) a resume may find changed.
    pub allow_changed: Vec<String>,
    /// Complete checkpoints kept; older ones are deleted.
    pub keep: usize,
}

/// Faults a test or `strata train --inject` injects (see [`crate::supervise::inject`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Rank `rank` panics at the start of step `step`.
    Panic { rank: u32, step: u32 },
    /// Rank `rank` stops talking at the start of step `step` but stays alive (a hang).
    Silent { rank: u32, step: u32 },
    /// Rank `rank` vanishes at the start of step `step` without a word (a killed process).
    Exit { rank: u32, step: u32 },
    /// Rank `rank`'s checkpoint write after step `step` is killed halfway.
    KillCheckpointWrite { rank: u32, step: u32 },
    /// Rank `rank` computes `factor` (≥ 1) times slower all run ([`RankExec::slow_compute`]).
    Slow { rank: u32, factor: f64 },
}

/// Everything about a run that is not in the scenario.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The run ends after this many steps in all (a resumed run continues to it).
    pub steps: u32,
    /// Name of the training data, recorded in checkpoints.
    pub data_name: String,
    pub checkpoint: Option<CheckpointOptions>,
    pub exec: ExecConfig,
    /// Injected faults (none in a real run).
    pub faults: Vec<Fault>,
}

/// One step as rank 0 saw it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u32,
    /// Mean cross-entropy over the global batch, nats per token.
    pub loss: f64,
    pub tokens_per_s: f64,
    pub grad_norm: Option<f64>,
    pub seconds: f64,
}

/// Memory of one rank over the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankMemory {
    pub rank: u32,
    #[serde(flatten)]
    pub peaks: MemoryPeaks,
}

/// Where one rank's thread spent its CPU time in the traced step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankCpu {
    pub rank: u32,
    #[serde(flatten)]
    pub cpu: StepCpu,
}

/// What a run gives back (on rank 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainResult {
    /// The first step this run executed (after a resume, the checkpoint's step).
    pub start_step: u32,
    pub steps: Vec<StepRecord>,
    /// The measured trace of `exec.trace_step` (every rank), if that step ran.
    pub trace: Option<Trace>,
    pub memory: Vec<RankMemory>,
    /// The traced step's CPU time per rank, where the platform reports thread CPU time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu: Vec<RankCpu>,
}

impl TrainResult {
    pub fn losses(&self) -> Vec<f64> {
        self.steps.iter().map(|s| s.loss).collect()
    }
}

#[derive(Debug, Error)]
pub enum TrainError {
    /// The job cannot start: the plan, model or data do not fit the runtime (bad input).
    #[error(transparent)]
    Setup(#[from] RuntimeError),
    /// A checkpoint to resume from is missing, corrupt or from another job (bad input), or
    /// a write failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A rank failed; the job stopped.
    #[error("rank {rank} ({label}) failed: {reason}")]
    RankFailed { rank: u32, label: String, reason: String },
    /// A rank ended without a word (fault injection of a killed process).
    #[error("rank {rank} exited before the end of the run")]
    RankExited { rank: u32 },
    /// A loss, gradient or parameter became NaN or infinite; the step was not checkpointed.
    #[error(
        "training diverged at step {step}: rank {rank} ({label}) found {value} in {tensor}; the run stopped without checkpointing that step; lower training.lr (or training.grad_clip)"
    )]
    Diverged { step: u32, rank: u32, label: String, tensor: String, value: f64 },
}

impl CheckpointOptions {
    /// How the run starts in its directory.
    pub fn start(&self) -> checkpoint::Start {
        match (self.resume, self.overwrite) {
            (true, _) => checkpoint::Start::Resume,
            (false, true) => checkpoint::Start::Overwrite,
            (false, false) => checkpoint::Start::Fresh,
        }
    }
}

/// Stops the run at the first non-finite value this rank sees after `step`: a gradient
/// (found before the optimizer stepped on it), the loss, the gradient norm, a parameter.
fn check_finite(exec: &RankExec, plan: &Plan, step: u32, report: &StepReport) -> Result<(), TrainError> {
    let bad = report
        .nonfinite_grad
        .clone()
        .or_else(|| report.loss_sum.filter(|l| !l.is_finite()).map(|l| ("the loss".to_string(), l)))
        .or_else(|| report.grad_norm.filter(|g| !g.is_finite()).map(|g| ("the gradient norm".to_string(), g)))
        .or_else(|| exec.first_nonfinite_param());
    match bad {
        None => Ok(()),
        Some((tensor, value)) => {
            let rank = exec.rank();
            Err(TrainError::Diverged { step, rank, label: plan.grid.label(rank), tensor, value })
        }
    }
}

/// A callback that sees each step as rank 0 completes it.
pub type Progress = Box<dyn FnMut(&StepRecord) + Send>;

const LOSS: u32 = 1;
const SHARD: u32 = 2;
const FINAL: u32 = 3;

/// What each rank sends rank 0 at the end.
#[derive(Serialize, Deserialize)]
struct Final {
    spans: Vec<Span>,
    memory: Vec<MemSample>,
    peaks: MemoryPeaks,
    cpu: Option<StepCpu>,
}

/// Why a rank is named when a peer found its channel gone (its thread ended).
const PEER_GONE: &str = "it exited";

fn rank_failed(plan: &Plan, rank: u32, reason: String) -> TrainError {
    TrainError::RankFailed { rank, label: plan.grid.label(rank), reason }
}

fn from_exec(plan: &Plan, me: u32, e: ExecError) -> TrainError {
    match e {
        ExecError::Comm(CommError::RankFailed { rank, reason }) => rank_failed(plan, rank, reason),
        ExecError::Comm(CommError::PeerGone { rank }) => rank_failed(plan, rank, PEER_GONE.into()),
        ExecError::Runtime(r) => TrainError::Setup(r),
        other => rank_failed(plan, me, other.to_string()),
    }
}

/// Waits until `tag` arrived from every rank in `from`, then takes them in rank order.
fn gather_control(
    mb: &mut Mailbox,
    tag: Tag,
    from: impl Iterator<Item = u32> + Clone,
    timeout: Duration,
) -> Result<Vec<(u32, Payload)>, ExecError> {
    let start = Instant::now();
    loop {
        let missing: Vec<u32> = from.clone().filter(|r| !mb.has(tag, *r)).collect();
        if missing.is_empty() {
            return Ok(from.map(|r| (r, mb.take(tag, r).expect("checked"))).collect());
        }
        if start.elapsed() >= timeout {
            return Err(ExecError::Stalled {
                rank: mb.rank(),
                step: match tag {
                    Tag::Control { step, .. } => step,
                    _ => 0,
                },
                secs: timeout.as_secs_f64(),
                waiting: format!("{tag:?} from rank(s) {missing:?}"),
            });
        }
        mb.poll(POLL)?;
    }
}

/// Runs one rank of a training job to the end. Rank 0 returns the result; `progress`
/// (rank 0 only) sees every step as it completes.
pub fn run_rank(
    plan: Arc<Plan>,
    comm: Box<dyn Communicator>,
    corpus: Arc<Corpus>,
    opts: &TrainOptions,
    progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<Option<TrainResult>, TrainError> {
    let rank = comm.rank();
    let mut exec = RankExec::new(plan.clone(), rank, Mailbox::new(comm), corpus, opts.exec.clone())?;
    for f in &opts.faults {
        if let Fault::Slow { rank: r, factor } = *f
            && r == rank
        {
            exec.slow_compute(factor);
        }
    }
    let run = std::panic::AssertUnwindSafe(|| run_steps(&mut exec, &plan, opts, progress));
    let out = std::panic::catch_unwind(run)
        .unwrap_or_else(|panic| Err(rank_failed(&plan, rank, format!("panicked: {}", panic_text(panic.as_ref())))));
    match &out {
        // Another rank's failure, or a silent death (fault injection): nothing to tell.
        Err(TrainError::RankFailed { rank: r, .. }) if *r != rank => {}
        Err(TrainError::RankExited { .. }) | Ok(_) => {}
        Err(TrainError::RankFailed { reason, .. }) => exec.mailbox.comm().abort(reason),
        Err(e) => exec.mailbox.comm().abort(&e.to_string()),
    }
    out
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

fn run_steps(
    exec: &mut RankExec,
    plan: &Arc<Plan>,
    opts: &TrainOptions,
    mut progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<Option<TrainResult>, TrainError> {
    let (rank, n) = (exec.rank(), plan.grid.ranks());
    let timeout = opts.exec.recv_timeout;
    let mut start_step = 0;
    if let Some(ck) = opts.checkpoint.as_ref().filter(|c| c.resume) {
        let (sdir, m) = checkpoint::latest(&ck.dir)?;
        let allowed = checkpoint::allowed_changes(&plan.scenario, &ck.allow_changed)?;
        checkpoint::check_manifest(&sdir, &m, &plan.scenario, &opts.data_name, &allowed)?;
        start_step = checkpoint::load_shard(exec, &sdir, &m)?;
    }
    let s = &plan.scenario;
    let tokens = s.tokens_per_step() as f64;
    // Every (replica, cp rank, microbatch) reports its mean loss over equal token counts.
    let denom = (s.parallel.microbatches() * s.parallel.dp * s.parallel.cp.max(1)) as f64;
    let mut result = TrainResult { start_step, steps: Vec::new(), trace: None, memory: Vec::new(), cpu: Vec::new() };
    let (mut spans, mut samples, mut cpu) = (Vec::new(), Vec::new(), None);
    let err = |e: ExecError| from_exec(plan, rank, e);
    for step in start_step..opts.steps {
        for f in &opts.faults {
            match *f {
                Fault::Panic { rank: r, step: k } if r == rank && k == step => {
                    panic!("injected fault: rank {rank} panics at step {step}")
                }
                Fault::Exit { rank: r, step: k } if r == rank && k == step => {
                    return Err(TrainError::RankExited { rank });
                }
                Fault::Silent { rank: r, step: k } if r == rank && k == step => {
                    // Say nothing until the job is over (the others notice by their timeouts).
                    loop {
                        if let Err(e) = exec.mailbox.poll(POLL) {
                            return Err(err(e.into()));
                        }
                    }
                }
                _ => {}
            }
        }
        let t0 = Instant::now();
        let report = exec.step(step).map_err(err)?;
        check_finite(exec, plan, step, &report)?;
        spans.extend(report.spans);
        samples.extend(report.memory);
        cpu = report.cpu.or(cpu);
        let mine = vec![
            report.loss_sum.unwrap_or(0.0),
            f64::from(u8::from(report.loss_sum.is_some())),
            report.grad_norm.unwrap_or(f64::NAN),
        ];
        let tag = Tag::Control { step, what: LOSS };
        if rank != 0 {
            exec.mailbox.send(0, tag, Payload::F64(mine)).map_err(|e| err(e.into()))?;
        } else {
            let others = gather_control(&mut exec.mailbox, tag, 1..n, timeout).map_err(err)?;
            let mut loss = mine[0];
            for (_, p) in others {
                if let Payload::F64(v) = p {
                    loss += v[0];
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            let rec = StepRecord {
                step,
                loss: loss / denom,
                tokens_per_s: tokens / secs,
                grad_norm: report.grad_norm,
                seconds: secs,
            };
            if let Some(p) = progress.as_mut() {
                p(&rec);
            }
            result.steps.push(rec);
        }
        if let Some(ck) = &opts.checkpoint {
            let last = step + 1 == opts.steps;
            if last || (ck.every > 0 && (step + 1) % ck.every == 0) {
                checkpoint_step(exec, plan, ck, opts, step + 1, timeout)?;
            }
        }
    }
    let fin = Final { spans, memory: samples, peaks: exec.peaks().clone(), cpu };
    let tag = Tag::Control { step: u32::MAX, what: FINAL };
    if rank != 0 {
        let text = serde_json::to_string(&fin).expect("spans serialise");
        exec.mailbox.send(0, tag, Payload::Text(text)).map_err(|e| err(e.into()))?;
        return Ok(None);
    }
    let mut finals = vec![(0, fin)];
    for (r, p) in gather_control(&mut exec.mailbox, tag, 1..n, timeout).map_err(err)? {
        let Payload::Text(t) = p else { unreachable!("final reports are text") };
        finals.push((r, serde_json::from_str(&t).expect("a rank's final report parses")));
    }
    let mut trace = Trace {
        source: TraceSource::Measured,
        step: opts.exec.trace_step.unwrap_or(0),
        seed: s.training.seed,
        ranks: (0..n).collect(),
        spans: Vec::new(),
        memory: Vec::new(),
    };
    for (r, f) in finals {
        trace.spans.extend(f.spans);
        trace.memory.extend(f.memory);
        result.memory.push(RankMemory { rank: r, peaks: f.peaks });
        if let Some(cpu) = f.cpu {
            result.cpu.push(RankCpu { rank: r, cpu });
        }
    }
    if !trace.spans.is_empty() {
        trace.canonicalize();
        result.trace = Some(trace);
    }
    Ok(Some(result))
}

/// Every rank writes its shard; rank 0 collects the checksums and writes the manifest.
fn checkpoint_step(
    exec: &mut RankExec,
    plan: &Arc<Plan>,
    ck: &CheckpointOptions,
    opts: &TrainOptions,
    done_steps: u32,
    timeout: Duration,
) -> Result<(), TrainError> {
    let rank = exec.rank();
    let kill = opts.faults.contains(&Fault::KillCheckpointWrite { rank, step: done_steps - 1 });
    let entry = checkpoint::write_shard(exec, &ck.dir, done_steps, kill)?;
    let tag = Tag::Control { step: done_steps, what: SHARD };
    let err = |e: ExecError| from_exec(plan, rank, e);
    if rank != 0 {
        let text = serde_json::to_string(&entry).expect("an entry serialises");
        return exec.mailbox.send(0, tag, Payload::Text(text)).map_err(|e| err(e.into()));
    }
    let mut shards = vec![entry];
    for (_, p) in gather_control(&mut exec.mailbox, tag, 1..plan.grid.ranks(), timeout).map_err(err)? {
        let Payload::Text(t) = p else { unreachable!("shard reports are text") };
        let e: ShardEntry = serde_json::from_str(&t).expect("a shard entry parses");
        shards.push(e);
    }
    let m = checkpoint::manifest(&plan.scenario, &opts.data_name, done_steps, shards);
    checkpoint::write_manifest(&ck.dir, &m)?;
    checkpoint::prune(&ck.dir, ck.keep.max(1));
    Ok(())
}

/// Runs every rank of `plan` as a thread of this process and returns rank 0's result.
/// The first rank to fail names the error; a resume's checkpoint is verified (every
/// shard's checksum) before any rank starts.
pub fn train_threads(
    plan: Arc<Plan>,
    corpus: Arc<Corpus>,
    opts: &TrainOptions,
    progress: Option<Progress>,
) -> Result<TrainResult, TrainError> {
    if let Some(ck) = &opts.checkpoint {
        let allowed = checkpoint::allowed_changes(&plan.scenario, &ck.allow_changed)?;
        checkpoint::prepare(&ck.dir, ck.start())?;
        if ck.resume {
            let (sdir, m) = checkpoint::latest(&ck.dir)?;
            checkpoint::check_manifest(&sdir, &m, &plan.scenario, &opts.data_name, &allowed)?;
            checkpoint::verify_all(&sdir, &m)?;
        }
    }
    let n = plan.grid.ranks();
    let flag = AbortFlag::default();
    let mut progress = progress;
    let handles: Vec<_> = ThreadComm::group(n, &flag)
        .into_iter()
        .map(|comm| {
            let (plan, corpus, opts, flag) = (plan.clone(), corpus.clone(), opts.clone(), flag.clone());
            let mut cb = if comm.rank() == 0 { progress.take() } else { None };
            std::thread::Builder::new()
                .name(format!("rank-{}", comm.rank()))
                .spawn(move || {
                    let rank = comm.rank();
                    let run = std::panic::AssertUnwindSafe(|| {
                        let p = cb.as_mut().map(|f| f.as_mut() as &mut dyn FnMut(&StepRecord));
                        run_rank(plan.clone(), Box::new(comm), corpus, &opts, p)
                    });
                    let out = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
                        Err(rank_failed(&plan, rank, format!("panicked: {}", panic_text(panic.as_ref()))))
                    });
                    match &out {
                        // A killed rank says nothing; the driver notices that it is gone.
                        Err(TrainError::RankExited { .. }) | Ok(_) => {}
                        // A peer found gone is named by its own thread's outcome (its error
                        // here, or `watch` for a killed one): a rank that failed drops its
                        // channel before it records why, so a peer's `PeerGone` could
                        // otherwise win the flag and name the wrong rank.
                        Err(TrainError::RankFailed { reason, .. }) if reason == PEER_GONE => {}
                        // The first failure is the cause; later ones are its consequences.
                        Err(TrainError::RankFailed { rank: r, reason, .. }) => flag.set(*r, reason),
                        Err(other) => flag.set(rank, &other.to_string()),
                    }
                    out
                })
                .expect("spawning a rank thread")
        })
        .collect();
    let mut results = watch(handles, &flag);
    if flag.get().is_none() {
        // Only a gone peer was seen (its thread ended without an error of its own).
        if let Some(Err(TrainError::RankFailed { rank, reason, .. })) =
            results.iter().find(|r| matches!(r, Err(TrainError::RankFailed { .. })))
        {
            flag.set(*rank, reason);
        }
    }
    if let Some((rank, reason)) = flag.get() {
        // A bad setup or checkpoint (every rank fails alike) and a divergence are reported
        // as themselves (the lowest rank's), not as a rank failure.
        let own = |r: &Result<_, TrainError>| {
            matches!(r, Err(TrainError::Setup(_) | TrainError::Checkpoint(_) | TrainError::Diverged { .. }))
        };
        if let Some(i) = results.iter().position(own) {
            return Err(match results.swap_remove(i) {
                Err(e) => e,
                Ok(_) => rank_failed(&plan, rank, reason),
            });
        }
        return Err(rank_failed(&plan, rank, reason));
    }
    match results.swap_remove(0) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => unreachable!("rank 0 returns the result"),
        Err(e) => Err(e),
    }
}

/// Joins the rank threads, noticing within [`POLL`] a rank whose thread ended before the
/// others while the job still runs: it is named as the cause and the others are stopped.
fn watch(
    handles: Vec<std::thread::JoinHandle<Result<Option<TrainResult>, TrainError>>>,
    flag: &AbortFlag,
) -> Vec<Result<Option<TrainResult>, TrainError>> {
    let mut handles: Vec<_> = handles.into_iter().map(Some).collect();
    let mut results: Vec<Option<Result<Option<TrainResult>, TrainError>>> = handles.iter().map(|_| None).collect();
    while results.iter().any(Option::is_none) {
        for (r, h) in handles.iter_mut().enumerate() {
            if h.as_ref().is_some_and(|h| h.is_finished()) {
                let out = h.take().expect("checked").join().expect("rank threads catch their panics");
                if let Err(TrainError::RankExited { rank }) = &out {
                    flag.set(*rank, "its thread ended before the end of the run without a word (killed)");
                }
                results[r] = Some(out);
            }
        }
        std::thread::sleep(POLL);
    }
    results.into_iter().map(|r| r.expect("all joined")).collect()
}

/// Tokens of the default synthetic corpus (4 MiB of u32 ids).
pub const MARKOV_TOKENS: usize = 1 << 20;
/// Successors per state of the default synthetic Markov source.
pub const MARKOV_BRANCHING: usize = 3;

/// The default training data of a scenario: a Markov source over the model's vocabulary,
/// seeded by the training seed. Returns the corpus, its name (recorded in checkpoints) and
/// the source's entropy rate in nats per token (the best loss any model can reach).
pub fn synthetic_corpus(vocab: u32, seed: u64) -> Result<(Corpus, String, f64), crate::data::DataError> {
    let src = crate::data::MarkovSource::new(vocab as usize, MARKOV_BRANCHING, seed)?;
    let name = format!("markov(V={vocab}, branching={MARKOV_BRANCHING}, seed={seed})");
    Ok((src.corpus(MARKOV_TOKENS, seed.wrapping_add(1)), name, src.entropy_rate_nats()))
}

/// Writes a run's outputs to `dir`: `loss.csv` (columns `step,loss,tokens_per_s`),
/// `measured-trace.json` (the measured [`Trace`], if a step was traced; `strata train` adds
/// its Chrome/Perfetto form, `trace.json`), `memory.json` (peak bytes per
/// rank, measured and predicted, per class) and `plan.json` (the plan whose op ids the trace
/// uses).
pub fn write_outputs(dir: &std::path::Path, plan: &Plan, r: &TrainResult) -> std::io::Result<()> {
    // Every failure names the file it was writing.
    let at = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"))
    };
    let write = |name: &str, text: String| std::fs::write(dir.join(name), text).map_err(at(&dir.join(name)));
    std::fs::create_dir_all(dir).map_err(at(dir))?;
    let mut csv = String::from("step,loss,tokens_per_s\n");
    for s in &r.steps {
        csv.push_str(&format!("{},{},{}\n", s.step, s.loss, s.tokens_per_s));
    }
    write("loss.csv", csv)?;
    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).expect("plain data serialises")
    }
    if let Some(t) = &r.trace {
        write("measured-trace.json", json(t))?;
    }
    write("memory.json", json(&r.memory))?;
    write("plan.json", json(plan))
}
