//! A training run on one GPU: the plan's steps through [`GpuRank`], the loss curve, the
//! measured trace of the traced step (CUDA events, the CPU executor's format) and the
//! measured peak (the pool's high-water mark plus the CUDA context) — a [`TrainResult`]
//! like the CPU executor's, so `write_outputs`, `strata report` and the comparison read it
//! unchanged.

use std::sync::Arc;
use std::time::Instant;

use strata_models::plan::Plan;
use strata_models::trace::{Trace, TraceSource};

use super::device::Device;
use super::rank::{GpuExecError, GpuRank};
use crate::data::Corpus;
use crate::error::RuntimeError;
use crate::train::{RankMemory, StepRecord, TrainError, TrainOptions, TrainResult};

fn failed(plan: &Plan, e: GpuExecError) -> TrainError {
    match e {
        GpuExecError::Unsupported(why) => {
            TrainError::Setup(RuntimeError::BadSetting(format!("the CUDA executor cannot run this plan: {why}")))
        }
        GpuExecError::Runtime(r) => TrainError::Setup(r),
        other => TrainError::RankFailed { rank: 0, label: plan.grid.label(0), reason: other.to_string() },
    }
}

/// Trains `plan` on GPU `ordinal` for `opts.steps` steps (checkpoints and injected faults
/// are the CPU executor's; refused here by the caller).
pub fn train_cuda(
    plan: Arc<Plan>,
    ordinal: usize,
    corpus: Arc<Corpus>,
    opts: &TrainOptions,
    progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    let rank = GpuRank::new(plan.clone(), ordinal, corpus, opts.exec.clone()).map_err(|e| failed(&plan, e))?;
    train_on(plan, rank, opts, progress)
}

/// Trains on a rank already built (on a GPU, or on the tests' host stand-in).
pub fn train_on<D: Device>(
    plan: Arc<Plan>,
    mut rank: GpuRank<D>,
    opts: &TrainOptions,
    mut progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    let s = &plan.scenario;
    let tokens = s.tokens_per_step() as f64;
    let denom = s.parallel.microbatches() as f64;
    let mut result = TrainResult { start_step: 0, steps: Vec::new(), trace: None, memory: Vec::new(), cpu: Vec::new() };
    for step in 0..opts.steps {
        let t0 = Instant::now();
        let report = rank.step(step).map_err(|e| failed(&plan, e))?;
        let secs = t0.elapsed().as_secs_f64();
        let loss = report.loss_sum.unwrap_or(f64::NAN) / denom;
        let bad = report.nonfinite_grad.clone().or_else(|| (!loss.is_finite()).then(|| ("the loss".to_string(), loss)));
        if let Some((tensor, value)) = bad {
            return Err(TrainError::Diverged { step, rank: 0, label: plan.grid.label(0), tensor, value });
        }
        let rec = StepRecord { step, loss, tokens_per_s: tokens / secs, grad_norm: report.grad_norm, seconds: secs };
        if let Some(p) = progress.as_mut() {
            p(&rec);
        }
        result.steps.push(rec);
        if !report.spans.is_empty() {
            let mut t = Trace {
                source: TraceSource::Measured,
                step,
                seed: s.training.seed,
                ranks: vec![0],
                spans: report.spans,
                memory: report.memory,
            };
            t.canonicalize();
            result.trace = Some(t);
        }
    }
    result.memory.push(RankMemory { rank: 0, peaks: rank.peaks().clone() });
    Ok((result, rank.gpu_name().to_string()))
}
