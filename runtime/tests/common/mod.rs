//! Shared helpers of the runtime's end-to-end tests: a tiny scenario under a split, lowered
//! and trained on threads, the reference trainer's losses, and loss-curve distances.

#![allow(dead_code)] // each test binary uses a subset

use std::sync::Arc;
use std::time::Duration;

use strata_models::Scenario;
use strata_models::plan::{Plan, lower, verify};
use strata_runtime::data::{Corpus, MarkovSource};
use strata_runtime::exec::ExecConfig;
use strata_runtime::train::{TrainError, TrainOptions, TrainResult, train_threads};

/// The tiny GPT (4 layers, hidden 64, 4 heads, vocab 256, seq 64) on CPU ranks; `split`
/// are `--set` overrides such as `parallel.tp=2`. Global batch 16 of micro-batches of 2.
pub fn scenario(split: &[&str]) -> Scenario {
    scenario_of("tiny-gpt-test", TINY_GPT, split)
}

/// Scenario `name` with the `[model]` table's keys `model` (sub-tables may follow) on
/// [`RUN`]'s cluster, batch and training, under `split` ([`scenario_from`]).
pub fn scenario_of(name: &str, model: &str, split: &[&str]) -> Scenario {
    scenario_from(&format!("name = \"{name}\"\n[model]\n{model}\n{RUN}"), split)
}

const TINY_GPT: &str = "preset = \"tiny-gpt\"";

/// Every test scenario's cluster, batch and training: CPU ranks, global batch 16 of
/// micro-batches of 2, fp32, seed 0, lr 1e-3.
const RUN: &str = r#"
[cluster]
preset = "cpu-local"
[parallel]
micro_batch = 2
global_batch = 16
[training]
dtype = "fp32"
steps = 20
seed = 0
lr = 1e-3
"#;

/// The scenario `text` (a tiny model on `cpu-local`) under `split`, on a cluster of exactly
/// as many CPU "GPUs" as the split has ranks.
pub fn scenario_from(text: &str, split: &[&str]) -> Scenario {
    let mut overrides: Vec<String> = split.iter().map(|s| s.to_string()).collect();
    if !split.iter().any(|o| o.starts_with("parallel.dp=")) {
        overrides.push("parallel.dp=1".into());
    }
    let s0 = Scenario::from_toml(text, "test", "test", &overrides).ok();
    // The cluster has exactly as many CPU "GPUs" as the split has ranks.
    let ranks = s0.map(|s| s.parallel.ranks()).unwrap_or_else(|| {
        let get = |k: &str| {
            split
                .iter()
                .find_map(|o| o.strip_prefix(&format!("parallel.{k}=")))
                .map_or(1, |v| v.parse::<u64>().unwrap())
        };
        get("tp") * get("cp") * get("pp") * get("dp")
    });
    overrides.push(format!("cluster.gpus_per_node={ranks}"));
    Scenario::from_toml(text, "test", "test", &overrides).unwrap_or_else(|e| panic!("{split:?}: {e}"))
}

pub fn plan(s: &Scenario) -> Arc<Plan> {
    let plan = lower(s).expect("the scenario lowers");
    verify(&plan).expect("the plan verifies");
    Arc::new(plan)
}

/// The Markov corpus every test trains on (vocabulary 256, branching 3).
pub fn corpus() -> Arc<Corpus> {
    Arc::new(MarkovSource::new(256, 3, 7).unwrap().corpus(200_000, 8))
}

pub fn options(steps: u32) -> TrainOptions {
    TrainOptions {
        steps,
        data_name: "markov(V=256, seed=8)".into(),
        checkpoint: None,
        exec: ExecConfig { recv_timeout: Duration::from_secs(60), trace_step: Some(steps.saturating_sub(1)) },
        faults: Vec::new(),
    }
}

pub fn train(split: &[&str], opts: &TrainOptions) -> Result<TrainResult, TrainError> {
    let s = scenario(split);
    train_threads(plan(&s), corpus(), opts, None)
}

/// The reference trainer's losses over `steps` steps of `s`'s model (one rank, 8
/// microbatches of 2 × 64 tokens, `s`'s optimizer, clipping and recomputation), on [`corpus`].
pub fn reference_losses(s: &Scenario, steps: usize) -> Vec<f64> {
    use strata_runtime::micro::Micro;
    use strata_runtime::optim::AdamWConfig;
    use strata_runtime::reference::{ReferenceTrainer, TrainConfig};
    let cfg = TrainConfig {
        seed: s.training.seed,
        micro: Micro { batch: 2, seq: 64 },
        microbatches: 8,
        adamw: AdamWConfig {
            lr: s.training.lr as f32,
            weight_decay: s.training.weight_decay as f32,
            ..AdamWConfig::default()
        },
        grad_clip: s.training.grad_clip as f32,
        recompute: s.parallel.recompute,
    };
    let mut reference = ReferenceTrainer::new(&s.model, cfg).expect("the reference trainer takes the model");
    reference.train(&corpus(), steps).expect("the reference trainer runs")
}

/// The losses of `steps` steps of `s` on threads, on [`corpus`].
pub fn losses(s: &Scenario, steps: u32) -> Vec<f64> {
    train_threads(plan(s), corpus(), &options(steps), None).unwrap_or_else(|e| panic!("{}: {e}", s.name)).losses()
}

/// The largest difference between two loss curves (infinite if their lengths differ).
pub fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}
