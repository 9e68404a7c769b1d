//! A training run that survives a dead rank: the ranks run under a supervisor that, as
//! torchrun's elastic agent does, notices a failed attempt, restarts every rank from the
//! last complete checkpoint and carries on to the requested steps.
//!
//! ```text
//! attempt k ─▶ ok ─────────────────────────────────────────────▶ the run's result
//!           └▶ failed: rank R, cause (killed | panic | stall | checkpoint write)
//!                ├ not restartable (bad setup or checkpoint, divergence), or no restarts
//!                │ left ─▶ the error, with every attempt's record
//!                └ remove partial step directories; newest complete checkpoint C
//!                  (none yet: start afresh) ─▶ attempt k+1 resumes from C, proven first
//!                  (scenario, settings, every shard's checksum: checkpoint::check)
//! ```
//!
//! A divergence is not restarted: the resumed run is bit-identical, so it would diverge at
//! the same step again. The resumed attempt reproduces the uninterrupted run's losses bit
//! for bit (the resume contract of [`crate::checkpoint`]): the step records of the steps
//! that count are stitched into one loss curve, and the steps an attempt completed past
//! the checkpoint the next one resumed from are counted as lost. Injected faults
//! ([`inject`]): a kill or hang fires in the first attempt only; a slow rank stays slow.
//! The records and the measured goodput are in [`record`]; ranks as processes (MPI) are
//! supervised by relaunching their launcher ([`relaunch`], `strata-mpi-restart`).

pub mod inject;
pub mod record;
pub mod relaunch;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use strata_models::plan::Plan;
use thiserror::Error;

use crate::checkpoint::{self, CheckpointError, Start};
use crate::data::Corpus;
use crate::train::{Progress, StepRecord, TrainError, TrainOptions, TrainResult, train_threads};
pub use inject::{InjectError, Injection};
use record::total;
pub use record::{Attempt, Failure, Goodput};

/// The most restarts `--restarts N` takes.
pub const MAX_RESTARTS: u32 = 1000;

/// How a run is supervised.
#[derive(Clone, Debug, Default)]
pub struct SuperviseOptions {
    /// Restarts allowed after failed attempts (0: a failure ends the run).
    pub restarts: u32,
    pub inject: Vec<Injection>,
}

/// A supervised run that reached its last step.
#[derive(Clone, Debug)]
pub struct SupervisedRun {
    /// The loss curve over every step the run executed, each from the attempt that kept it;
    /// the trace, memory and CPU figures of the last attempt.
    pub result: TrainResult,
    pub attempts: Vec<Attempt>,
    pub goodput: Goodput,
}

#[derive(Debug, Error)]
pub enum SuperviseError {
    /// An `--inject` spec that does not fit the job (bad input).
    #[error(transparent)]
    Inject(#[from] InjectError),
    #[error(
        "--restarts {0} needs --checkpoint-dir DIR: a restart resumes from the last complete checkpoint, and without a directory there is none, so every failure would throw all steps away; add --checkpoint-dir DIR --checkpoint-every K (or drop --restarts)"
    )]
    NoCheckpointDir(u32),
    #[error("--restarts {0} is above the limit of {MAX_RESTARTS}")]
    TooManyRestarts(u32),
    /// The run failed: the last attempt's error, and every attempt.
    #[error("{error}{}", gave_up(*restarts, attempts))]
    Failed { error: TrainError, attempts: Vec<Attempt>, restarts: u32 },
}

fn gave_up(restarts: u32, attempts: &[Attempt]) -> String {
    match attempts.len() {
        n if restarts > 0 && n as u32 > restarts => format!("; gave up after {restarts} restart(s)"),
        _ => String::new(),
    }
}

/// Whether a restart can help: a rank died, hung or failed, or a write failed; not a bad
/// setup or checkpoint (it would fail alike) nor a divergence (it would recur bit for bit).
fn restartable(e: &TrainError) -> bool {
    match e {
        TrainError::RankFailed { .. } | TrainError::RankExited { .. } => true,
        TrainError::Checkpoint(c) => c.is_io(),
        TrainError::Setup(_) | TrainError::Diverged { .. } => false,
    }
}

/// One attempt's measurements: its step records with the instant each completed.
struct Seen {
    start: Instant,
    end: Instant,
    steps: Vec<(StepRecord, Instant)>,
}

/// Runs `plan` on threads (as [`train_threads`]) under the supervisor. `progress` sees
/// every step of every attempt as rank 0 completes it; `log` gets one line per event
/// (a failure, the cleanup, the restart).
pub fn train_supervised(
    plan: Arc<Plan>,
    corpus: Arc<Corpus>,
    opts: &TrainOptions,
    sup: &SuperviseOptions,
    progress: Option<Progress>,
    log: &mut dyn FnMut(&str),
) -> Result<SupervisedRun, SuperviseError> {
    let wall = Instant::now();
    if sup.restarts > MAX_RESTARTS {
        return Err(SuperviseError::TooManyRestarts(sup.restarts));
    }
    if sup.restarts > 0 && opts.checkpoint.is_none() {
        return Err(SuperviseError::NoCheckpointDir(sup.restarts));
    }
    // A resume that cannot find its checkpoint fails in the first attempt, naming it.
    let first_step = match &opts.checkpoint {
        Some(ck) if ck.resume => checkpoint::latest(&ck.dir).map_or(0, |(_, m)| m.step),
        _ => 0,
    };
    inject::check(&sup.inject, plan.grid.ranks(), first_step, opts.steps)?;
    let shared = Arc::new(Mutex::new(progress));
    let (mut attempts, mut seen) = (Vec::<Attempt>::new(), Vec::<Seen>::new());
    let mut this = opts.clone();
    let mut start_step = first_step;
    loop {
        let k = attempts.len() as u32;
        let armed: Vec<&Injection> = sup.inject.iter().filter(|i| k == 0 || i.step().is_none()).collect();
        this.faults = opts.faults.iter().copied().chain(armed.iter().map(|i| i.fault())).collect();
        let steps = Arc::new(Mutex::new(Vec::new()));
        let cb: Progress = {
            let (steps, shared) = (steps.clone(), shared.clone());
            Box::new(move |r: &StepRecord| {
                steps.lock().unwrap_or_else(PoisonError::into_inner).push((*r, Instant::now()));
                if let Some(p) = shared.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                    p(r);
                }
            })
        };
        let start = Instant::now();
        let out = train_threads(plan.clone(), corpus.clone(), &this, Some(cb));
        let steps = std::mem::take(&mut *steps.lock().unwrap_or_else(PoisonError::into_inner));
        let s = Seen { start, end: Instant::now(), steps };
        attempts.push(Attempt {
            attempt: k,
            start_step,
            steps_done: s.steps.len() as u32,
            steps_lost: 0,
            seconds: (s.end - s.start).as_secs_f64(),
            step_seconds: total(s.steps.iter().map(|(r, _)| r.seconds)),
            lost_seconds: 0.0,
            restart_seconds: None,
            injected: armed.iter().map(|i| i.spec()).collect(),
            failure: out.as_ref().err().map(Failure::of),
        });
        seen.push(s);
        let error = match out {
            Ok(last) => return Ok(finish(last, attempts, &seen, wall)),
            Err(e) => e,
        };
        let failed = |error, attempts| SuperviseError::Failed { error, attempts, restarts: sup.restarts };
        if !restartable(&error) || k >= sup.restarts {
            return Err(failed(error, attempts));
        }
        log(&format!("attempt {k} failed: {error}"));
        let Some(ck) = this.checkpoint.as_mut() else { unreachable!("restarts need a checkpoint directory") };
        let (next, how) = match checkpoint::latest(&ck.dir) {
            Ok((_, m)) => (m.step, Start::Resume),
            Err(CheckpointError::NoneFound(_)) => (first_step, Start::Overwrite),
            Err(e) => return Err(failed(e.into(), attempts)),
        };
        let removed = match checkpoint::prepare(&ck.dir, how) {
            Ok(r) => r,
            Err(e) => return Err(failed(e.into(), attempts)),
        };
        for d in removed {
            log(&format!("removed {} (a partial checkpoint: no manifest)", d.display()));
        }
        let reached = attempts[k as usize].start_step + attempts[k as usize].steps_done;
        let from = match how {
            Start::Resume => format!("from {}", checkpoint::step_dir(&ck.dir, next).display()),
            _ => "afresh (no complete checkpoint yet)".to_string(),
        };
        log(&format!(
            "restart {} of {}: every rank restarts {from} at step {next}; {} completed step(s) past it will be recomputed",
            k + 1,
            sup.restarts,
            reached.saturating_sub(next)
        ));
        (ck.resume, ck.overwrite) = (how == Start::Resume, how == Start::Overwrite);
        start_step = next;
    }
}

/// The run's result: the steps that count, stitched; every attempt's losses and restart
/// time; the goodput.
fn finish(last: TrainResult, mut attempts: Vec<Attempt>, seen: &[Seen], wall: Instant) -> SupervisedRun {
    let mut steps = Vec::new();
    for k in 0..attempts.len() {
        // A step counts from the last attempt that ran it: any later start before it redid it.
        let next_start = attempts[k + 1..].iter().map(|a| a.start_step).min().unwrap_or(u32::MAX);
        let (kept, lost): (Vec<_>, Vec<_>) = seen[k].steps.iter().partition(|(r, _)| r.step < next_start);
        steps.extend(kept.iter().map(|(r, _)| *r));
        attempts[k].steps_lost = lost.len() as u32;
        attempts[k].lost_seconds = total(lost.iter().map(|(r, _)| r.seconds));
        if let Some(next) = seen.get(k + 1) {
            let ended = seen[k].steps.last().map_or(seen[k].start, |(_, at)| *at);
            let resumed = next.steps.first().map_or(next.end, |(r, at)| {
                at.checked_sub(std::time::Duration::from_secs_f64(r.seconds)).unwrap_or(next.start)
            });
            attempts[k].restart_seconds = Some(resumed.saturating_duration_since(ended).as_secs_f64());
        }
    }
    let goodput = Goodput::of(&attempts, wall.elapsed().as_secs_f64());
    let start_step = attempts.first().map_or(last.start_step, |a| a.start_step);
    SupervisedRun { result: TrainResult { start_step, steps, ..last }, attempts, goodput }
}
