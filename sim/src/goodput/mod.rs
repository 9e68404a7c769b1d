//! Goodput of a long run: the simulated step time turned into weeks of wall time under
//! failures, checkpoints and restarts, by Monte Carlo ([`mc`]), beside the closed forms of
//! Young and Daly ([`closed`]).
//!
//! [`Inputs::of`] resolves a scenario's `[faults.failures]` (published defaults where unset)
//! against its model and cluster: the checkpoint is the model states a framework keeps —
//! weights and optimizer state, not gradients — counted once over data-parallel replicas
//! (`accounting::states`), so a sync save blocks bytes ÷ write bandwidth, an async one the
//! largest per-rank shard ÷ the staging bandwidth, and a restart loads bytes ÷ read
//! bandwidth after detection, rescheduling and NCCL initialisation. Intervals are whole
//! steps: a checkpoint is taken between steps.

pub mod closed;
pub mod mc;
pub mod stream;
pub mod trial;

#[cfg(test)]
mod tests;

use serde::Serialize;
use strata_models::Scenario;
use strata_models::accounting::params::stage_params;
use strata_models::accounting::states::scenario_layout;
use strata_models::faults::failures::{
    DEFAULT_DETECT_S, DEFAULT_INIT_S, DEFAULT_RESCHEDULE_S, DEFAULT_STAGING_GBPS, DEFAULT_STORAGE_GBPS, Process,
    SaveMode,
};

pub use mc::{GoodputResult, IntervalResult, McOptions, monte_carlo};

/// A save's blocking time and, for an asynchronous one, the background write after it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum Save {
    Sync { block_s: f64 },
    Async { block_s: f64, write_s: f64 },
}

impl Save {
    /// What training waits for per save (Daly's δ).
    pub fn block_s(&self) -> f64 {
        match *self {
            Save::Sync { block_s } | Save::Async { block_s, .. } => block_s,
        }
    }
}

/// A restart's parts, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Restart {
    pub detect_s: f64,
    pub reschedule_s: f64,
    pub init_s: f64,
    pub load_s: f64,
}

impl Restart {
    pub fn total_s(&self) -> f64 {
        self.detect_s + self.reschedule_s + self.init_s + self.load_s
    }
}

/// Everything a goodput run needs, resolved.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Inputs {
    pub gpus: u64,
    pub nodes: u64,
    /// Simulated (or given) time of one training step.
    pub step_s: f64,
    /// Failure-free training to do (T_s).
    pub work_s: f64,
    /// Bytes of one checkpoint (all ranks, replicas once) and of the largest rank's shard.
    pub checkpoint_bytes: f64,
    pub shard_bytes_max: f64,
    pub save: Save,
    pub restart: Restart,
    pub processes: Vec<Process>,
    /// The scenario's own interval (`checkpoint.interval_s`), if it sets one.
    pub scenario_interval_s: Option<f64>,
}

impl Inputs {
    /// A scenario's inputs for `work_s` of training at `step_s` per step.
    pub fn of(s: &Scenario, step_s: f64, work_s: f64) -> Inputs {
        let f = &s.faults.failures;
        let (bytes, shard) = checkpoint_bytes(s);
        let cp = &f.checkpoint;
        let write_bps = cp.write_gbps.unwrap_or(DEFAULT_STORAGE_GBPS) * 1e9;
        let read_bps = cp.read_gbps.unwrap_or(DEFAULT_STORAGE_GBPS) * 1e9;
        let save = match cp.mode.unwrap_or_default() {
            SaveMode::Sync => Save::Sync { block_s: cp.save_s.unwrap_or(bytes / write_bps) },
            SaveMode::Async => Save::Async {
                block_s: cp.save_s.unwrap_or(shard / (cp.staging_gbps.unwrap_or(DEFAULT_STAGING_GBPS) * 1e9)),
                write_s: bytes / write_bps,
            },
        };
        let r = &f.restart;
        let restart = Restart {
            detect_s: r.detect_s.unwrap_or(DEFAULT_DETECT_S),
            reschedule_s: r.reschedule_s.unwrap_or(DEFAULT_RESCHEDULE_S),
            init_s: r.init_s.unwrap_or(DEFAULT_INIT_S),
            load_s: r.load_s.unwrap_or(bytes / read_bps),
        };
        let gpus = s.cluster.gpus();
        let nodes = s.cluster.nodes as u64;
        Inputs {
            gpus,
            nodes,
            step_s,
            work_s,
            checkpoint_bytes: bytes,
            shard_bytes_max: shard,
            save,
            restart,
            processes: f.processes(gpus, nodes),
            scenario_interval_s: cp.interval_s,
        }
    }

    /// The job's mean time between failures, seconds (∞ when nothing fails): the units'
    /// rates summed, whatever their distribution (a renewal process's long-run rate is
    /// 1/mean).
    pub fn job_mtbf_s(&self) -> f64 {
        let rate: f64 = self.processes.iter().map(|p| p.units as f64 / (p.mtbf_hours * 3600.0)).sum();
        if rate > 0.0 { 1.0 / rate } else { f64::INFINITY }
    }

    /// Daly's interval for these inputs, seconds (the work when nothing fails).
    pub fn daly_tau_s(&self) -> f64 {
        let m = self.job_mtbf_s();
        if m.is_finite() { closed::daly_tau_s(self.save.block_s(), m) } else { self.work_s }
    }

    pub fn young_tau_s(&self) -> f64 {
        let m = self.job_mtbf_s();
        if m.is_finite() { closed::young_tau_s(self.save.block_s(), m) } else { self.work_s }
    }

    /// Daly's efficiency at interval `tau_s` (1 − δ/(τ+δ) when nothing fails).
    pub fn daly_efficiency(&self, tau_s: f64) -> f64 {
        let m = self.job_mtbf_s();
        if m.is_finite() {
            closed::daly_efficiency(tau_s, self.save.block_s(), self.restart.total_s(), m)
        } else {
            tau_s / (tau_s + self.save.block_s())
        }
    }

    /// `tau_s` as whole steps (at least one).
    pub fn steps_of(&self, tau_s: f64) -> u64 {
        ((tau_s / self.step_s).round() as u64).max(1)
    }
}

/// Bytes a checkpoint writes, and the largest per-rank shard: each stage's weights and
/// optimizer state (not gradients) per tensor-parallel rank under the framework's layout, replicas over
/// data parallelism counted once (each replica writes its 1/dp of them, as PyTorch DCP and
/// Megatron's distributed checkpoints deduplicate).
pub fn checkpoint_bytes(s: &Scenario) -> (f64, f64) {
    let p = &s.parallel;
    let l = scenario_layout(s);
    let per_param = |x: strata_models::accounting::states::PerParam| (x.whole + x.sharded) as f64;
    // torchtitan's parameters are fp32 (FSDP2 casts a bf16 copy for compute, which ZeRO-2
    // keeps whole and a checkpoint does not save); the others save their 16-bit weights
    // beside the fp32 master and Adam moments (14 B/param: BLOOM's 2.3 TB for 176B).
    let weights = match s.training.framework {
        strata_models::Framework::Torchtitan => 4.0,
        _ => per_param(l.weights),
    };
    let b = weights + per_param(l.optimizer);
    let mut total = 0.0;
    let mut shard = 0.0f64;
    for sp in stage_params(&s.model, p) {
        let stage = sp.per_rank() as f64 * b * p.tp as f64;
        total += stage;
        shard = shard.max(stage / (p.tp as f64 * p.dp as f64));
    }
    (total, shard)
}
