//! The training-speed benchmark `cargo xtask bench` runs: a GPT-2-small-shaped model
//! (12 layers, hidden 768, 12 heads, FFN 3072, byte vocabulary, sequence 1024) trained by
//! the plan interpreter on 1 and 2 CPU ranks, against the GEMM kernel's own rate on the
//! very GEMMs of the step.
//!
//! ```text
//! achieved GFLOP/s = Σ_ranks Σ_compute ops FLOPs(op) / step time        (FLOPs from the plan's costs)
//! GEMM GFLOP/s     = Σ GEMM FLOPs of one rank's step / Σ their times      (each shape timed alone,
//!                    × ranks                                                all ranks timing at once)
//! efficiency       = achieved / GEMM
//! ```
//!
//! The GEMM rate is `matrixmultiply::sgemm` (through [`crate::matmul`]) on every
//! (m, n, k) the step's pieces run, timed with as many threads as ranks running at once,
//! so it is the ceiling the step could reach on this machine; the step also does softmax,
//! norms, GELU, AdamW and communication, which the efficiency charges against it. Not a
//! timed test: a run takes about four minutes on 2 cores, in release mode.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use strata_models::Scenario;
use strata_models::plan::{OpKind, Plan, lower};

use crate::exec::ExecConfig;
use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::train::{TrainOptions, synthetic_corpus, train_threads};

/// What to benchmark.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub seq: u32,
    /// Sequences per step (the global batch); micro-batches of one sequence.
    pub global_batch: u32,
    /// Splits as (name, tp, dp); ranks = tp · dp.
    pub splits: Vec<(String, u32, u32)>,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            layers: 12,
            hidden: 768,
            heads: 12,
            seq: 1024,
            global_batch: 2,
            splits: vec![("1 rank".into(), 1, 1), ("2 ranks, dp".into(), 1, 2), ("2 ranks, tp".into(), 2, 1)],
        }
    }
}

/// One split's figures.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    pub split: String,
    pub ranks: u32,
    pub step_s: f64,
    pub tokens_per_s: f64,
    /// Plan-counted FLOPs of every rank's compute ops over the step time.
    pub achieved_gflops: f64,
    /// The GEMM kernel alone on the step's GEMM shapes, all ranks' threads at once.
    pub gemm_gflops: f64,
    pub efficiency: f64,
}

fn scenario(c: &BenchConfig, tp: u32, dp: u32) -> Scenario {
    let text = format!(
        r#"name = "gpt2-small-bench"
[model]
family = "gpt"
layers = {}
hidden = {}
heads = {}
ffn_hidden = {}
vocab = 256
seq_len = {}
[cluster]
preset = "cpu-local"
gpus_per_node = {}
[parallel]
tp = {tp}
dp = {dp}
micro_batch = 1
global_batch = {}
[training]
dtype = "fp32"
steps = 2
"#,
        c.layers,
        c.hidden,
        c.heads,
        4 * c.hidden,
        c.seq,
        tp * dp,
        c.global_batch
    );
    Scenario::from_toml(&text, "bench", "bench", &[]).expect("the benchmark scenario is valid")
}

/// (m, n, k) → how many such GEMMs one step of rank 0 runs, and the step's compute FLOPs
/// over all ranks.
fn step_work(plan: &Plan) -> (BTreeMap<(u64, u64, u64), u64>, u64) {
    let mut shapes = BTreeMap::new();
    let mut flops = 0;
    for rank in 0..plan.grid.ranks() {
        for op in &plan.program(rank).ops {
            if let OpKind::Compute(c) = &op.kind {
                let cost = plan.cost(c.cost);
                flops += cost.flops;
                if rank == 0 {
                    for g in &cost.gemms {
                        *shapes.entry((g.m, g.n, g.k)).or_insert(0) += g.batch;
                    }
                }
            }
        }
    }
    (shapes, flops)
}

/// Seconds of one (m, n, k) sgemm, best of a few.
fn time_gemm(m: usize, n: usize, k: usize) -> f64 {
    let a: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 * 1e-2).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 89) as f32 * 1e-2).collect();
    let mut c = vec![0.0f32; m * n];
    let mut run =
        || matmul(MatRef::new(&a, m, k), MatRef::new(&b, k, n), MatMut::new(&mut c, m, n), Transpose::Nn, 1.0, 0.0);
    run();
    let reps = if 2 * m * n * k > 1 << 28 { 2 } else { 5 };
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The GEMM mix of one rank's step, timed on `threads` threads at once: aggregate GFLOP/s.
fn gemm_rate(shapes: &BTreeMap<(u64, u64, u64), u64>, threads: u32) -> f64 {
    let shapes = Arc::new(shapes.clone());
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let shapes = shapes.clone();
            std::thread::spawn(move || {
                let (mut flops, mut secs) = (0.0, 0.0);
                for (&(m, n, k), &count) in shapes.iter() {
                    let t = time_gemm(m as usize, n as usize, k as usize);
                    flops += 2.0 * (m * n * k * count) as f64;
                    secs += t * count as f64;
                }
                flops / secs
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("a GEMM timing thread")).sum::<f64>() / 1e9
}

/// Runs the benchmark; `report` sees each row as it is measured.
pub fn run(c: &BenchConfig, mut report: impl FnMut(&BenchRow)) -> Result<Vec<BenchRow>, String> {
    let mut rows = Vec::new();
    for (name, tp, dp) in &c.splits {
        let s = scenario(c, *tp, *dp);
        let plan = lower(&s).map_err(|e| e.to_string())?;
        let (shapes, flops) = step_work(&plan);
        let (corpus, data, _) = synthetic_corpus(256, 0).map_err(|e| e.to_string())?;
        let opts = TrainOptions {
            steps: 3,
            data_name: data,
            checkpoint: None,
            exec: ExecConfig { recv_timeout: Duration::from_secs(600), trace_step: None },
            faults: Vec::new(),
        };
        let result = train_threads(Arc::new(plan), Arc::new(corpus), &opts, None).map_err(|e| e.to_string())?;
        // The first step warms caches and allocations; the faster of the next two is the
        // measurement, and the GEMM rate is the better of two passes (the host is shared).
        let step = result.steps[1..].iter().min_by(|a, b| a.seconds.total_cmp(&b.seconds)).ok_or("no step ran")?;
        let achieved = flops as f64 / step.seconds / 1e9;
        let gemm = gemm_rate(&shapes, tp * dp).max(gemm_rate(&shapes, tp * dp));
        let row = BenchRow {
            split: name.clone(),
            ranks: tp * dp,
            step_s: step.seconds,
            tokens_per_s: step.tokens_per_s,
            achieved_gflops: achieved,
            gemm_gflops: gemm,
            efficiency: achieved / gemm,
        };
        report(&row);
        rows.push(row);
    }
    Ok(rows)
}
