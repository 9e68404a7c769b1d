//! Throughput of the simulator core: one step of GPT-3 175B on 1,024 A100s (TP 8, PP 8,
//! DP 16, global batch 1,536, 1F1B, selective recomputation, sequence parallelism), the
//! configuration of Narayanan et al. SC'21 — 96 microbatches through 8 stages.
//!
//! Not a test: `cargo xtask bench` calls [`simulate_gpt3_175b`] in release mode and prints
//! the [`StepBench`]. The lowering is timed apart from the simulation. Wall time comes from
//! `std::time::Instant` here only; the simulation itself never reads a clock.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_models::Scenario;
use strata_models::plan::lower;

use crate::simulate::{SimOptions, simulate};

/// The scenario the benchmark simulates.
pub const GPT3_175B_1024_A100: &str = r#"
name = "gpt3-175b-1024xa100-bench"
[model]
preset = "gpt3-175b"
[cluster]
preset = "dgx-a100"
nodes = 128
[parallel]
tp = 8
pp = 8
dp = 16
schedule = "1f1b"
micro_batch = 1
global_batch = 1536
recompute = "selective"
sequence_parallel = true
zero = 1
"#;

/// What one benchmark run measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepBench {
    pub name: String,
    /// Ops in the plan's distinct programs.
    pub ops: u64,
    pub lower_wall_s: f64,
    pub simulate_wall_s: f64,
    pub events: u64,
    pub events_per_s: f64,
    /// The simulated step, for a sanity check of what was timed.
    pub step_time_s: f64,
    pub mfu: f64,
}

/// Simulates one step of GPT-3 175B on 1,024 A100s, `repeats` times, and reports the
/// fastest simulation.
pub fn simulate_gpt3_175b(repeats: u32) -> StepBench {
    let scenario =
        Scenario::from_toml(GPT3_175B_1024_A100, "bench", "bench", &[]).expect("the benchmark scenario is valid");
    let t0 = Instant::now();
    let plan = lower(&scenario).expect("the benchmark scenario lowers");
    let lower_wall_s = t0.elapsed().as_secs_f64();
    let mut best = f64::INFINITY;
    let mut report = None;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        let r = simulate(&plan, &SimOptions::default()).expect("the benchmark plan simulates");
        best = best.min(t.elapsed().as_secs_f64());
        report = Some(r);
    }
    let r = report.expect("at least one run");
    StepBench {
        name: scenario.name.clone(),
        ops: plan.op_count() as u64,
        lower_wall_s,
        simulate_wall_s: best,
        events: r.events,
        events_per_s: r.events as f64 / best,
        step_time_s: r.step_time_s,
        mfu: r.mfu,
    }
}
