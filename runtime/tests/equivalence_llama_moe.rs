//! Llama-family mixture-of-experts layers (SwiGLU routed and shared experts, FC1 [gate | up],
//! no biases; RMSNorm, RoPE, grouped-query attention around them) train the tiny Llama MoE
//! exactly as one rank does: ep 2 and 4 with expert-data-parallel replicas, ZeRO-2, a 1F1B
//! pipeline, tp 2 with sequence parallelism — each gives the single rank's loss curve within
//! the tolerance of `equivalence.rs` at every one of 20 steps; and the single rank's plan
//! gives the reference trainer's losses bit for bit.
//!
//! Near-ties: the top-k selection is discrete, so a rounding difference can flip a near-tie
//! and move a loss by far more than rounding (`equivalence_moe.rs` holds its GPT curve to a
//! looser bound after its step-15 tie). This curve has none in 20 steps: measured (debug
//! build, this machine), every split stays within 2.5e-8 nats of the single rank at every
//! step, so every step is held to `LOSS_TOL_NATS`; a flip would fail the test, and the
//! printed per-step differences show where.
//!
//! The bound can fail (measured with temporary changes, not kept): the routed experts of
//! odd ep ranks reading FC1 as [up | gate] (forward and backward consistently) moves ep2-dp2
//! by 8.6e-5 nats at step 0 and 5.4e-4 by step 9; each tp rank cutting a SwiGLU FC1 as one
//! block instead of the r-th t-th of gate and of up (dense and shared experts alike) moves
//! ep2-tp2-sp by 5.2e-5 at step 0 and 3.1e-3 by step 15.

mod common;

use common::*;
use strata_models::Scenario;

/// As in `equivalence.rs`: the largest |loss_split − loss_single| allowed at any step.
const LOSS_TOL_NATS: f64 = 2e-6;

const STEPS: u32 = 20;

/// The `tiny-moe` preset (Llama family: 4 layers, the first dense, then 3 MoE layers of 8
/// SwiGLU experts of width 64, top-2, softmax router; hidden 64, 4 query and 2 key/value
/// heads, seq 64) with one SwiGLU shared expert of width 64 and no auxiliary loss, global
/// batch 16 of 2.
fn scenario(split: &[&str]) -> Scenario {
    common::scenario_of("tiny-llama-moe-test", MODEL, split)
}

const MODEL: &str = r#"
preset = "tiny-moe"
[model.moe]
aux_loss_coeff = 0.0
shared_experts = 1
shared_ffn_hidden = 64
"#;

const SPLITS: &[(&str, &[&str])] = &[
    ("ep2-dp2", &["parallel.ep=2", "parallel.dp=2"]),
    ("ep4-dp4", &["parallel.ep=4", "parallel.dp=4"]),
    ("ep4-dp8-zero2", &["parallel.ep=4", "parallel.dp=8", "parallel.zero=2"]),
    ("ep2-dp2-pp2-1f1b", &["parallel.ep=2", "parallel.dp=2", "parallel.pp=2", "parallel.schedule=1f1b"]),
    ("ep2-tp2-sp", &["parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true"]),
];

#[test]
fn every_llama_moe_split_gives_the_single_rank_loss_curve() {
    let only = std::env::var("MOE_SPLIT").ok();
    let single = losses(&scenario(&[]), STEPS);
    println!("single rank: {single:?}");
    let mut failures = Vec::new();
    for (name, split) in SPLITS.iter().filter(|(n, _)| only.as_deref().is_none_or(|o| n.contains(o))) {
        let s = scenario(split);
        let got = losses(&s, STEPS);
        let diff = max_diff(&got, &single);
        let per_step: Vec<String> = got.iter().zip(&single).map(|(a, b)| format!("{:.1e}", (a - b).abs())).collect();
        println!(
            "{name:<20} ranks {:>2}  max |Δloss| over {STEPS} steps = {diff:.3e} nats; per step {per_step:?}",
            s.parallel.ranks()
        );
        if diff.is_nan() || diff > LOSS_TOL_NATS || got.len() != STEPS as usize {
            failures.push(format!("{name}: max |Δloss| {diff:e} (≤ {LOSS_TOL_NATS:e}): {got:?} vs {single:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The interpreter on one rank against the reference trainer (every expert on one rank,
/// `runtime::moe`'s MLP through a group of one): the same bits, and the model learns.
#[test]
fn one_rank_llama_moe_plan_equals_the_reference_trainer() {
    let s = scenario(&[]);
    let interp = losses(&s, 5);
    let want = common::reference_losses(&s, 5);
    assert!(want[4] < want[0] - 0.05, "the reference does not learn: {want:?}");
    for (step, (a, b)) in interp.iter().zip(&want).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "step {step}: interpreter {a} vs reference {b}");
    }
}
