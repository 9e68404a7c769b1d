//! A training run on one GPU: the plan's steps through its ranks ([`MultiGpu`], one
//! [`GpuRank`] or several), the loss curve, the measured trace of the traced step (CUDA
//! events, the CPU executor's format) and the measured peak per rank (the pool's
//! high-water mark plus the CUDA context) — a [`TrainResult`]
//! like the CPU executor's, so `write_outputs`, `strata report` and the comparison read it
//! unchanged.

use std::sync::Arc;
use std::time::Instant;

use strata_models::plan::Plan;
use strata_models::trace::{Trace, TraceSource};

use super::device::{Device, Gpu};
use super::multi::MultiGpu;
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

/// Trains `plan` on GPU `ordinal` for `opts.steps` steps — every rank of the plan on that
/// one GPU (checkpoints and injected faults are the CPU executor's; refused here by the
/// caller).
pub fn train_cuda(
    plan: Arc<Plan>,
    ordinal: usize,
    corpus: Arc<Corpus>,
    opts: &TrainOptions,
    progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    super::rank::check_plan(&plan).map_err(|e| failed(&plan, e))?;
    let first = Gpu::open(ordinal).map_err(|e| failed(&plan, e.into()))?;
    let mut devices = Vec::with_capacity(plan.grid.ranks() as usize);
    for _ in 1..plan.grid.ranks() {
        devices.push(first.sibling().map_err(|e| failed(&plan, e.into()))?);
    }
    devices.insert(0, first);
    let multi = MultiGpu::new(plan.clone(), devices, corpus, opts.exec.clone()).map_err(|e| failed(&plan, e))?;
    train_multi(plan, multi, opts, progress)
}

/// Trains on one rank already built (on a GPU, or on the tests' host stand-in).
pub fn train_on<D: Device>(
    plan: Arc<Plan>,
    rank: GpuRank<D>,
    opts: &TrainOptions,
    progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    let multi = MultiGpu::from_ranks(plan.clone(), vec![rank]).map_err(|e| failed(&plan, e))?;
    train_multi(plan, multi, opts, progress)
}

/// Trains every rank of `plan` on one device: the step's loss is the mean over the m · dp
/// microbatches of the last stage's ranks (tp rank 0's), the trace every rank's spans, the memory every
/// rank's peaks.
pub fn train_multi<D: Device>(
    plan: Arc<Plan>,
    mut multi: MultiGpu<D>,
    opts: &TrainOptions,
    mut progress: Option<&mut dyn FnMut(&StepRecord)>,
) -> Result<(TrainResult, String), TrainError> {
    let s = &plan.scenario;
    let tokens = s.tokens_per_step() as f64;
    let denom = (s.parallel.microbatches() * s.parallel.dp) as f64;
    let mut result = TrainResult { start_step: 0, steps: Vec::new(), trace: None, memory: Vec::new(), cpu: Vec::new() };
    for step in 0..opts.steps {
        let t0 = Instant::now();
        let reports = multi.step(step).map_err(|e| failed(&plan, e))?;
        let secs = t0.elapsed().as_secs_f64();
        // Every tensor-parallel rank holds the whole loss: count tp rank 0's.
        let loss = reports
            .iter()
            .enumerate()
            .filter(|(r, _)| plan.grid.coord(*r as u32).tp == 0)
            .map(|(_, rep)| rep.loss_sum.unwrap_or(f64::NAN))
            .sum::<f64>()
            / denom;
        let bad = reports
            .iter()
            .enumerate()
            .find_map(|(r, rep)| rep.nonfinite_grad.clone().map(|b| (r as u32, b)))
            .or_else(|| (!loss.is_finite()).then(|| (0, ("the loss".to_string(), loss))));
        if let Some((rank, (tensor, value))) = bad {
            return Err(TrainError::Diverged { step, rank, label: plan.grid.label(rank), tensor, value });
        }
        let grad_norm = reports.first().and_then(|r| r.grad_norm);
        let rec = StepRecord { step, loss, tokens_per_s: tokens / secs, grad_norm, seconds: secs };
        if let Some(p) = progress.as_mut() {
            p(&rec);
        }
        result.steps.push(rec);
        if reports.iter().any(|r| !r.spans.is_empty()) {
            let mut t = Trace {
                source: TraceSource::Measured,
                step,
                seed: s.training.seed,
                ranks: (0..reports.len() as u32).collect(),
                spans: reports.iter().flat_map(|r| r.spans.iter().cloned()).collect(),
                memory: reports.iter().flat_map(|r| r.memory.iter().cloned()).collect(),
            };
            t.canonicalize();
            result.trace = Some(t);
        }
    }
    for (r, rank) in multi.ranks.iter().enumerate() {
        result.memory.push(RankMemory { rank: r as u32, peaks: rank.peaks().clone() });
    }
    let name = multi.ranks.first().map(|r| r.gpu_name().to_string()).unwrap_or_default();
    Ok((result, name))
}
