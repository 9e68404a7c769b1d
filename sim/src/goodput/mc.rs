//! The Monte Carlo: `trials` independent runs of the job, each against its own seeded
//! failure stream, each trying every checkpoint interval on that same stream. Trials run in
//! parallel (rayon) and are collected by index, and every trial's seed is a function of the
//! run's seed and its index alone, so a figure never depends on the thread count.
//!
//! Per interval: the mean wall time T_w with a 95% confidence interval (mean ± 1.96·s/√n),
//! goodput T_s / mean T_w (Daly's efficiency is this ratio, not a mean of per-trial
//! ratios) with the interval mapped through it, the 5th/95th percentile of the wall time,
//! and where the time went — checkpoint blocking, lost work and restarts by cause — as mean
//! GPU-hours. The best interval is the one with the least mean wall time.

use rayon::prelude::*;
use serde::Serialize;
use strata_models::faults::failures::Cause;

use super::stream::{FailureStream, trial_seed};
use super::trial::{self, Outcome, SaveNs, TrialSpec};
use super::{Inputs, Save};

/// A trial gives up past this multiple of the failure-free time (goodput under 1/50).
pub const WALL_CAP_FACTOR: u64 = 50;
/// … or past this many failures.
pub const FAILURE_CAP: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct McOptions {
    pub trials: u32,
    pub seed: u64,
    /// Checkpoint intervals to try, in steps (each ≥ 1).
    pub intervals_steps: Vec<u64>,
}

/// Mean lost time of one cause, GPU-hours.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CauseLoss {
    pub cause: Cause,
    /// Mean failures per run.
    pub failures: f64,
    /// Work lost (since the last durable checkpoint, and interrupted saves).
    pub lost_work_gpu_hours: f64,
    pub restart_gpu_hours: f64,
}

/// The figures of one interval.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct IntervalResult {
    pub interval_steps: u64,
    pub interval_s: f64,
    pub mean_wall_s: f64,
    /// Half-width of the 95% confidence interval of the mean wall time.
    pub ci95_wall_s: f64,
    pub p05_wall_s: f64,
    pub p95_wall_s: f64,
    pub goodput: f64,
    pub goodput_lo: f64,
    pub goodput_hi: f64,
    /// Daly's efficiency at this interval (the closed form the Monte Carlo is checked against).
    pub daly_efficiency: f64,
    pub checkpoint_gpu_hours: f64,
    pub losses: Vec<CauseLoss>,
    /// Trials that hit the wall-time or failure cap (counted at the cap).
    pub unfinished: u32,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GoodputResult {
    pub seed: u64,
    pub trials: u32,
    pub job_mtbf_s: f64,
    pub young_tau_s: f64,
    pub daly_tau_s: f64,
    pub daly_efficiency: f64,
    pub intervals: Vec<IntervalResult>,
    /// Index into `intervals` of the best (least mean wall time; the shorter on a tie).
    pub best: usize,
}

impl GoodputResult {
    pub fn best(&self) -> &IntervalResult {
        &self.intervals[self.best]
    }
}

fn ns(s: f64) -> u64 {
    (s * 1e9).round().max(0.0) as u64
}

/// Runs the Monte Carlo; `progress(done)` after each finished trial (from any thread).
pub fn monte_carlo(inputs: &Inputs, opts: &McOptions, progress: &(dyn Fn(u64) + Sync)) -> GoodputResult {
    let work_ns = ns(inputs.work_s).max(1);
    let save = match inputs.save {
        Save::Sync { block_s } => SaveNs::Sync { block_ns: ns(block_s) },
        Save::Async { block_s, write_s } => SaveNs::Async { block_ns: ns(block_s), write_ns: ns(write_s) },
    };
    let specs: Vec<TrialSpec> = opts
        .intervals_steps
        .iter()
        .map(|&k| TrialSpec {
            work_ns,
            interval_ns: ns(k.max(1) as f64 * inputs.step_s).max(1),
            save,
            restart_ns: ns(inputs.restart.total_s()),
            wall_cap_ns: work_ns.saturating_mul(WALL_CAP_FACTOR),
            failure_cap: FAILURE_CAP,
        })
        .collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let outcomes: Vec<Vec<Outcome>> = (0..opts.trials as u64)
        .into_par_iter()
        .map(|t| {
            let mut stream = FailureStream::new(&inputs.processes, trial_seed(opts.seed, t));
            let row = specs.iter().map(|spec| trial::run(*spec, &mut stream)).collect();
            progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
            row
        })
        .collect();
    let intervals: Vec<IntervalResult> = opts
        .intervals_steps
        .iter()
        .enumerate()
        .map(|(i, &k)| summarise(inputs, k, outcomes.iter().map(|row| &row[i])))
        .collect();
    let best = (0..intervals.len())
        .min_by(|&a, &b| intervals[a].mean_wall_s.total_cmp(&intervals[b].mean_wall_s).then(a.cmp(&b)))
        .unwrap_or(0);
    let daly_tau_s = inputs.daly_tau_s();
    GoodputResult {
        seed: opts.seed,
        trials: opts.trials,
        job_mtbf_s: inputs.job_mtbf_s(),
        young_tau_s: inputs.young_tau_s(),
        daly_tau_s,
        daly_efficiency: inputs.daly_efficiency(daly_tau_s),
        intervals,
        best,
    }
}

fn summarise<'a>(inputs: &Inputs, steps: u64, outs: impl Iterator<Item = &'a Outcome>) -> IntervalResult {
    let outs: Vec<&Outcome> = outs.collect();
    let n = outs.len().max(1) as f64;
    let mut walls: Vec<f64> = outs.iter().map(|o| o.wall_ns as f64 / 1e9).collect();
    let mean = walls.iter().sum::<f64>() / n;
    let var = walls.iter().map(|w| (w - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    let ci = 1.96 * (var / n).sqrt();
    walls.sort_by(f64::total_cmp);
    let pct = |q: f64| walls.get(((walls.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    let gpu_h = |total_ns: u64| total_ns as f64 / 1e9 / 3600.0 * inputs.gpus as f64 / n;
    let losses = Cause::ALL
        .iter()
        .enumerate()
        .filter(|(_, c)| inputs.processes.iter().any(|p| p.cause == **c))
        .map(|(j, &cause)| CauseLoss {
            cause,
            failures: outs.iter().map(|o| o.failures[j] as f64).sum::<f64>() / n,
            lost_work_gpu_hours: gpu_h(outs.iter().map(|o| o.lost_ns[j]).sum()),
            restart_gpu_hours: gpu_h(outs.iter().map(|o| o.restart_ns[j]).sum()),
        })
        .collect();
    let interval_s = steps as f64 * inputs.step_s;
    let work = inputs.work_s;
    IntervalResult {
        interval_steps: steps,
        interval_s,
        mean_wall_s: mean,
        ci95_wall_s: ci,
        p05_wall_s: pct(0.05),
        p95_wall_s: pct(0.95),
        goodput: work / mean,
        goodput_lo: work / (mean + ci),
        goodput_hi: if mean > ci { work / (mean - ci) } else { 1.0 },
        daly_efficiency: inputs.daly_efficiency(interval_s),
        checkpoint_gpu_hours: gpu_h(outs.iter().map(|o| o.checkpoint_ns).sum()),
        losses,
        unfinished: outs.iter().filter(|o| o.unfinished).count() as u32,
    }
}
