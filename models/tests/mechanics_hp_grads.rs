//! DeepSpeed `BF16_Optimizer`'s per-microbatch fp32 gradient accumulation in the plan: under
//! DeepSpeed with bf16 and ZeRO-1, each microbatch's backward of a stage ends with an op whose
//! cost carries 22 bytes per parameter of the stage (first microbatch) or 26 (the others) on
//! top of its own, before the gradient's pipeline send; not under Megatron-LM, fp16 or
//! ZeRO-0 without a pipeline (with one, DeepSpeed runs it too, accumulating in bf16);
//! `bf16-hp-grads` off gives the same ops with their pieces' own costs.
//!
//! Its gradients are all-reduced whole (ZeRO-1 elsewhere reduce-scatters them).
//!
//! Its own test binary: the mechanic switch is process-wide; the tests take [`SWITCH`].

use strata_models::Scenario;
use strata_models::framework::mechanics::{Mechanic, set_disabled};
use strata_models::plan::*;

static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn scenario(framework: &str, dtype: &str, zero: u8) -> Scenario {
    model_scenario(
        2,
        "preset = \"gpt3-175b\"\nlayers = 4\nhidden = 1024\nheads = 16\nkv_heads = 16\nffn_hidden = 4096\nvocab = 32000\nseq_len = 1024",
        framework,
        dtype,
        zero,
    )
}

/// `model`'s table on one DGX node as tp · pp 2 · dp, 8 sequences of one per microbatch.
fn model_scenario(tp: u32, model: &str, framework: &str, dtype: &str, zero: u8) -> Scenario {
    let text = format!(
        "[model]\n{model}\n[cluster]\npreset = \"dgx-a100\"\nnodes = 1\n[parallel]\ntp = {tp}\npp = 2\ndp = {dp}\nschedule = \"1f1b\"\nglobal_batch = 8\nmicro_batch = 1\nzero = {zero}\nsequence_parallel = false\n[training]\nframework = \"{framework}\"\ndtype = \"{dtype}\"\n",
        dp = 4 / tp,
    );
    Scenario::from_toml(&text, "hp", "hp", &[]).unwrap()
}

/// The scenario lowered with the mechanic off: the same ops, each with its piece's own cost.
fn without(s: &Scenario) -> Plan {
    set_disabled(&[Mechanic::Bf16HpGrads]);
    let plan = lower(s);
    set_disabled(&[]);
    plan.unwrap()
}

/// Per stage, each compute op whose cost carries more bytes than without the mechanic: its
/// microbatch, the extra bytes, and whether the next compute op or send after it is that
/// microbatch's gradient send.
fn extras(plan: &Plan, off: &Plan) -> Vec<Vec<(u32, u64, bool)>> {
    plan.programs
        .iter()
        .zip(&off.programs)
        .map(|(prog, base)| {
            assert_eq!(prog.ops.len(), base.ops.len(), "the mechanic adds no op");
            let mut out = Vec::new();
            for (i, (o, b)) in prog.ops.iter().zip(&base.ops).enumerate() {
                let (OpKind::Compute(c), OpKind::Compute(cb)) = (&o.kind, &b.kind) else { continue };
                assert_eq!((c.piece, c.phase, c.mb, c.layer), (cb.piece, cb.phase, cb.mb, cb.layer));
                let (own, was) = (plan.costs[c.cost as usize].mem_bytes, off.costs[cb.cost as usize].mem_bytes);
                if own != was {
                    let next =
                        prog.ops[i + 1..].iter().find(|n| matches!(n.kind, OpKind::Compute(_) | OpKind::Send(_)));
                    let before_send = next.is_some_and(
                        |n| matches!(&n.kind, OpKind::Send(s) if s.kind == P2pKind::Gradient && s.mb == c.mb),
                    );
                    out.push((c.mb, own - was, before_send));
                }
            }
            out
        })
        .collect()
}

#[test]
fn deepspeed_bf16_zero1_adds_the_fp32_accumulation_after_every_backward() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let s = scenario("deepspeed", "bf16", 1);
    let plan = lower(&s).unwrap();
    verify(&plan).unwrap();
    let off = without(&s);
    assert_eq!(plan.scenario.parallel.microbatches(), 4);
    check_every_microbatch(&plan, &off);
}

/// Each stage's backward of each microbatch carries 22 (first) or 26 bytes per parameter
/// of the stage on exactly one op, which on the later stage is followed by its send.
fn check_every_microbatch(plan: &Plan, off: &Plan) {
    check_every_microbatch_at(plan, off, (22, 26));
}

/// As [`check_every_microbatch`], `bytes` per parameter on the first and later microbatches.
fn check_every_microbatch_at(plan: &Plan, off: &Plan, bytes: (u64, u64)) {
    let m = plan.scenario.parallel.microbatches();
    for (stage, ex) in extras(plan, off).iter().enumerate() {
        let params: u64 = plan.buckets[stage].iter().map(|b| b.params).sum();
        let want: Vec<(u32, u64, bool)> =
            (0..m).map(|mb| (mb, if mb == 0 { bytes.0 } else { bytes.1 } * params, stage == 1)).collect();
        assert_eq!(ex, &want, "stage {stage}");
    }
}

#[test]
fn llama_and_mixture_of_experts_backwards_end_with_it_too() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    // DeepSpeed runs no sequence parallelism, which MoE under tp needs: the MoE split is tp 1.
    let llama = "preset = \"llama3-8b\"\nlayers = 4\nseq_len = 1024";
    let mixtral = "preset = \"mixtral-8x7b\"\nlayers = 4\nseq_len = 1024";
    for (tp, model) in [(2, llama), (1, mixtral)] {
        let s = model_scenario(tp, model, "deepspeed", "bf16", 1);
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap();
        check_every_microbatch(&plan, &without(&s));
    }
}

/// The kinds of the plan's data-parallel gradient-bucket collectives.
fn grad_kinds(plan: &Plan) -> std::collections::BTreeSet<CollKind> {
    plan.programs
        .iter()
        .flat_map(|p| &p.ops)
        .filter_map(|o| match &o.kind {
            OpKind::Collective(c) if matches!(c.purpose, CollPurpose::GradBucket { .. }) => Some(c.kind),
            _ => None,
        })
        .collect()
}

#[test]
fn bf16_optimizer_all_reduces_zero_1_buckets_whole_where_zero_1_reduce_scatters() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let ds = scenario("deepspeed", "bf16", 1);
    assert_eq!(grad_kinds(&lower(&ds).unwrap()), [CollKind::AllReduce].into());
    for (fw, dtype) in [("megatron", "bf16"), ("deepspeed", "fp16")] {
        assert_eq!(
            grad_kinds(&lower(&scenario(fw, dtype, 1)).unwrap()),
            [CollKind::ReduceScatter].into(),
            "{fw} {dtype}"
        );
    }
    set_disabled(&[Mechanic::Bf16AllReduce]);
    let off = lower(&ds);
    set_disabled(&[]);
    assert_eq!(grad_kinds(&off.unwrap()), [CollKind::ReduceScatter].into());
}

#[test]
fn other_frameworks_and_dtypes_add_nothing() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    for (fw, dtype, zero) in [("megatron", "bf16", 1), ("deepspeed", "fp16", 1), ("megatron", "bf16", 0)] {
        let s = scenario(fw, dtype, zero);
        let plan = lower(&s).unwrap();
        assert!(extras(&plan, &without(&s)).iter().all(Vec::is_empty), "{fw} {dtype} zero {zero}");
        assert_eq!(plan.costs, without(&s).costs, "{fw} {dtype} zero {zero}");
    }
}

/// Rank 0's persistent optimizer-state bytes and whether its program all-gathers parameter
/// buckets.
fn optimizer_bytes_and_gathers(plan: &Plan) -> (u64, bool) {
    let ops = &plan.programs[0].ops;
    let bytes = ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Alloc(a) if a.class == BufClass::OptimizerState => Some(a.bytes),
            _ => None,
        })
        .sum();
    let gathers = ops.iter().any(|o| {
        matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::ParamBucket { .. }) && c.kind == CollKind::AllGather)
    });
    (bytes, gathers)
}

/// DeepSpeed with bf16 at ZeRO-0 under a pipeline runs `BF16_Optimizer` accumulating in
/// bf16 (`_do_optimizer_sanity_check` returns BFLOAT16 there): the passes at bf16 widths
/// (8 bytes per parameter on the first microbatch, 14 on the others), the fp32 master and
/// Adam partitioned over dp with the bf16 weights all-gathered after the step — ZeRO-1's
/// plan with its all-reduce. Without a pipeline it is plain ZeRO-0.
#[test]
fn deepspeed_bf16_zero0_under_a_pipeline_is_bf16_optimizer_accumulating_in_bf16() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let z0 = scenario("deepspeed", "bf16", 0);
    assert_eq!((z0.parallel.zero, z0.zero_stage()), (0, 1));
    let plan = lower(&z0).unwrap();
    verify(&plan).unwrap();
    check_every_microbatch_at(&plan, &without(&z0), (8, 14));
    assert_eq!(grad_kinds(&plan), [CollKind::AllReduce].into());
    let z1 = lower(&scenario("deepspeed", "bf16", 1)).unwrap();
    let (opt, gathers) = optimizer_bytes_and_gathers(&plan);
    assert!(gathers, "the step's bf16 weights are all-gathered");
    assert_eq!((opt, gathers), optimizer_bytes_and_gathers(&z1), "the partition is ZeRO-1's");
    // The same split under Megatron-LM keeps the whole optimizer state: dp = 2 here.
    let (whole, no_gathers) = optimizer_bytes_and_gathers(&lower(&scenario("megatron", "bf16", 0)).unwrap());
    assert!(!no_gathers);
    assert!(whole >= 2 * opt - 64 && whole <= 2 * opt + 64, "{whole} vs 2 × {opt}");
    // Bytes per parameter: bf16 weights, gradients and buffer whole, 12 / d of fp32 state.
    let layout = strata_models::accounting::states::scenario_layout(&z0);
    assert_eq!(layout.per_param(2), 6.0 + 12.0 / 2.0);

    // pp = 1: FP16_Optimizer in bf16 — no passes, no partition.
    let text = z0.to_toml().replace("pp = 2", "pp = 1").replace("dp = 2", "dp = 4");
    let flat = Scenario::from_toml(&text, "hp", "hp", &[]).unwrap();
    assert_eq!((flat.parallel.pp, flat.zero_stage()), (1, 0));
    let plan = lower(&flat).unwrap();
    assert_eq!(plan.costs, without(&flat).costs);
    assert!(!optimizer_bytes_and_gathers(&plan).1);
    assert_eq!(strata_models::accounting::states::scenario_layout(&flat).per_param(4), 16.0);
}

/// Whether every parameter-bucket all-gather of rank 0 comes after its optimizer step (in
/// program order), and how many there are.
fn gathers_after_the_step(plan: &Plan) -> (bool, usize) {
    let ops = &plan.programs[0].ops;
    let step =
        ops.iter().position(|o| matches!(&o.kind, OpKind::Compute(c) if c.piece == Piece::Optimizer)).expect("a step");
    let gathers: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::ParamBucket { .. }) && c.kind == CollKind::AllGather)
        })
        .map(|(i, _)| i)
        .collect();
    (gathers.iter().all(|&i| i > step && ops[i].deps.contains(&(step as OpId))), gathers.len())
}

/// DeepSpeed ZeRO-1/2 all-gathers the updated weights inside its step (`all_gather_dp_groups`
/// in `stage_1_and_2.py` and `BF16_Optimizer.update_lp_params`), whatever
/// `overlap_param_gather` says; Megatron-LM's `--overlap-param-gather` puts them under the
/// next forward. `step-gather` off gives DeepSpeed the overlap back.
#[test]
fn deepspeed_gathers_the_updated_weights_inside_its_step() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    for (fw, dtype, zero) in [("deepspeed", "bf16", 1), ("deepspeed", "fp16", 1), ("deepspeed", "bf16", 0)] {
        let s = scenario(fw, dtype, zero);
        assert!(s.parallel.overlap_param_gather, "the default asks for the overlap");
        let (after, n) = gathers_after_the_step(&lower(&s).unwrap());
        assert!(after && n > 0, "{fw} {dtype} zero {zero}: {n} gathers, after the step: {after}");
    }
    let (after, n) = gathers_after_the_step(&lower(&scenario("megatron", "bf16", 1)).unwrap());
    assert!(!after && n > 0, "Megatron-LM overlaps them with the forward");
    set_disabled(&[Mechanic::StepGather]);
    let off = lower(&scenario("deepspeed", "bf16", 1));
    set_disabled(&[]);
    assert!(!gathers_after_the_step(&off.unwrap()).0);
}
