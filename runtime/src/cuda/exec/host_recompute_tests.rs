//! Activation recomputation on the computing host stand-in: `recompute = "full"` and
//! `"selective"` train the tiny GPT to the same losses as no recomputation (the recomputed
//! forward runs the same bf16 kernels on the same inputs, so the values are the same bits)
//! and as the CPU executor, alone and under pipeline and tensor parallelism; and the
//! measured peak (pool high-water + context) falls as the plan's prediction does.
//!
//! The plan's two modes, as lowered (`plan::lower::backward`): full recomputation keeps
//! only a layer's input in `act L mb`, allocates `recompute L mb` at the layer's backward
//! and runs its five forward pieces again (`Phase::Recompute`) into it; selective
//! recomputation with flash attention keeps no log-sum-exp statistics in `act L mb`
//! (`layer_activation_bytes`: the flash form of the scores). Under Megatron-LM (and
//! Strata's own framework) the plan re-runs the core's forward before each attention
//! backward (an `Attn` `Recompute` op, megatron-core's `core_attn` checkpoint), which the
//! GPU runs for the statistics; under a framework that does not checkpoint a fused core
//! (torchtitan, DeepSpeed) the plan has no such op and the GPU's attention backward
//! recomputes them itself.

use std::sync::Arc;

use strata_models::plan::{OpKind, Phase, Plan};

use super::multi::tests::{LOSS_TOL_NATS, TP_LOSS_TOL_NATS, opts, plan_of, plan_on, run_plan, worst};

/// The tiny GPT on H200s (bf16, flash attention, 16-token sequences), one GPU per rank, or
/// on the CPU cluster in fp32.
fn plan(sets: &[&str], cpu: bool) -> Plan {
    plan_on(include_str!("../../../../scenarios/tiny-gpt-cpu.toml"), sets, cpu)
}

/// A GPU-executor run: its losses, and per rank (measured peak, the plan's predicted peak).
fn gpu_run(sets: &[&str]) -> (Vec<f64>, Vec<(u64, u64)>) {
    gpu_run_plan(plan(sets, false))
}

fn gpu_run_plan(p: Plan) -> (Vec<f64>, Vec<(u64, u64)>) {
    let r = run_plan(p, false);
    let peaks = r.memory.iter().map(|m| (m.peaks.measured_bytes, m.peaks.predicted_bytes)).collect();
    (r.steps.iter().map(|s| s.loss).collect(), peaks)
}

fn cpu_losses(sets: &[&str]) -> Vec<f64> {
    let p = Arc::new(plan(sets, true));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let r = crate::train::train_threads(p, Arc::new(corpus), &opts(), None).unwrap_or_else(|e| panic!("{e}"));
    r.steps.iter().map(|s| s.loss).collect()
}

/// Selective recomputation under a framework that does not checkpoint a fused core.
const TORCHTITAN: &str = "training.framework=\"torchtitan\"";

fn recompute_ops(sets: &[&str]) -> (usize, usize) {
    let p = plan(sets, false);
    let ops = &p.program(0).ops;
    let recomputes = ops.iter().filter(|o| matches!(&o.kind, OpKind::Compute(c) if c.phase == Phase::Recompute));
    let bufs = ops.iter().filter(|o| matches!(&o.kind, OpKind::Alloc(a) if a.name.starts_with("recompute ")));
    (recomputes.count(), bufs.count())
}

#[test]
fn the_plans_recompute_ops_under_flash_attention_follow_the_framework() {
    let count = |rc: &str| recompute_ops(&[&format!("parallel.recompute=\"{rc}\"")]);
    // tiny GPT: 4 layers, 8 microbatches; five pieces per recomputed layer.
    assert_eq!(count("none"), (0, 0));
    assert_eq!(count("selective"), (4 * 8, 0), "megatron-core checkpoints the fused core: one op per layer and mb");
    assert_eq!(count("full"), (5 * 4 * 8, 4 * 8));
    let titan = recompute_ops(&["parallel.recompute=\"selective\"", TORCHTITAN]);
    assert_eq!(titan, (0, 0), "torchtitan keeps the flash kernel's outputs: nothing recomputed outside it");
}

#[test]
fn selective_recomputation_without_the_plans_op_trains_the_same() {
    // torchtitan's plan has no core recomputation: the attention backward recomputes the
    // statistics itself, to the same losses as the op's path.
    let (op, _) = gpu_run(&["parallel.recompute=\"selective\""]);
    let (inline, _) = gpu_run(&["parallel.recompute=\"selective\"", TORCHTITAN]);
    let d = worst(&inline, &op);
    eprintln!("selective: with the op {op:?}, without {inline:?}, worst {d:.3e} nats");
    assert!(d <= LOSS_TOL_NATS, "selective without the op {inline:?} against with it {op:?}");
}

#[test]
fn recomputation_trains_to_the_same_losses_and_lowers_the_measured_peak() {
    let (none, none_pk) = gpu_run(&[]);
    let cpu = cpu_losses(&[]);
    for (g, c) in none.iter().zip(&cpu) {
        assert!((g - c).abs() < 1e-3 * c.abs(), "stand-in {none:?} against cpu {cpu:?}");
    }
    let mut peaks = vec![none_pk[0]];
    for rc in ["selective", "full"] {
        let sets = [format!("parallel.recompute=\"{rc}\"")];
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let (got, pk) = gpu_run(&sets);
        let cpu_rc = cpu_losses(&sets);
        let d = worst(&got, &none);
        eprintln!("{rc}: {got:?} (none {none:?}, cpu {cpu_rc:?}), worst {d:.3e} nats; peaks {pk:?} (none {none_pk:?})");
        assert!(d <= LOSS_TOL_NATS, "{rc}: {got:?} against no recomputation's {none:?}");
        for (g, c) in got.iter().zip(&cpu_rc) {
            assert!((g - c).abs() < 1e-3 * c.abs(), "{rc}: stand-in {got:?} against cpu {cpu_rc:?}");
        }
        peaks.push(pk[0]);
    }
    // (measured, predicted) for none, selective, full. Selective drops the log-sum-exp
    // statistics, b·heads·s fp32 = 256 B per layer here: the plan's peak falls by them
    // (4 layers, one microbatch in flight), while the device's moves by less than the
    // pool's 512 B classes and the backward's transient recomputed statistics (measured:
    // +512 B). Full recomputation lowers both clearly.
    eprintln!("peaks (measured, predicted): none {:?}, selective {:?}, full {:?}", peaks[0], peaks[1], peaks[2]);
    let (none_pk, sel, full) = (peaks[0], peaks[1], peaks[2]);
    assert_eq!(none_pk.1 - sel.1, 4 * 256, "selective: the plan drops each layer's statistics: {peaks:?}");
    assert!(sel.0.abs_diff(none_pk.0) <= 4 << 10, "selective: the device's peak within 4 KiB of none's: {peaks:?}");
    assert!(full.0 < sel.0 && full.1 < sel.1, "full recomputation must lower both peaks: {peaks:?}");
    // What full recomputation saves on the device is close to what the plan says it saves.
    let (saved_measured, saved_predicted) = (none_pk.0 - full.0, none_pk.1 - full.1);
    let ratio = saved_measured as f64 / saved_predicted as f64;
    assert!((0.5..2.0).contains(&ratio), "saved {saved_measured} B measured, {saved_predicted} B predicted");
}

#[test]
fn full_recomputation_matches_under_pipeline_and_tensor_parallelism() {
    for (split, tol) in [(&["parallel.pp=2"][..], LOSS_TOL_NATS), (&["parallel.tp=2"], TP_LOSS_TOL_NATS)] {
        let (plain, _) = gpu_run(split);
        let mut sets = split.to_vec();
        sets.push("parallel.recompute=\"full\"");
        let (rc, _) = gpu_run(&sets);
        let d = worst(&rc, &plain);
        eprintln!("{split:?}: full {rc:?}, none {plain:?}, worst {d:.3e} nats");
        assert!(d <= tol, "{split:?}: full recomputation {rc:?} against {plain:?}");
    }
}

#[test]
fn the_llama_pieces_recompute_to_the_same_losses() {
    // RoPE on the recomputed qkv, RMSNorm, SwiGLU and grouped-query attention again.
    let text = include_str!("../../../../scenarios/tiny-llama-cpu.toml");
    let (none, _) = gpu_run_plan(plan_of(text, &[]));
    for rc in ["\"selective\"", "\"full\""] {
        let set = format!("parallel.recompute={rc}");
        let (got, _) = gpu_run_plan(plan_of(text, &[&set]));
        let d = worst(&got, &none);
        eprintln!("tiny Llama {rc}: {got:?} (none {none:?}), worst {d:.3e} nats");
        assert!(d <= LOSS_TOL_NATS, "tiny Llama {rc}: {got:?} against no recomputation's {none:?}");
    }
}
