//! Mixture-of-experts plans: every MoE split the planner lowers passes the verifier (a
//! property test over ep, tp with sequence parallelism, dp, pp, schedules, ZeRO 0–2,
//! recomputation), the plan's FLOPs summed over all ranks are the MoE step's (computed
//! here from the shapes), the dispatch and combine move k·h·e bytes per token, expert
//! gradients reduce over the expert-data-parallel group, and the refused splits name their
//! rule.

mod common;
use common::program_order_peak;
use proptest::prelude::*;
use strata_models::Scenario;
use strata_models::accounting::flops::{
    attention_core_forward_flops_per_token, layer_forward_flops_per_token, logits_forward_flops_per_token,
};
use strata_models::parallel::{Recompute, Schedule};
use strata_models::plan::*;

/// A small MoE model: `family` preset shapes (hidden 16, 4 heads), 8 experts top-2 of width
/// 32, one shared expert of width 32 unless `shared` is false, the first layer dense.
#[allow(clippy::too_many_arguments)]
fn moe_scenario(
    family: &str,
    tp: u32,
    pp: u32,
    dp: u32,
    ep: u32,
    schedule: Schedule,
    zero: u8,
    m: u32,
    extra: &str,
) -> Result<Scenario, String> {
    moe_scenario_with(family, tp, pp, dp, ep, schedule, zero, m, "", extra)
}

/// As [`moe_scenario`] with `mtp` multi-token-prediction modules.
#[allow(clippy::too_many_arguments)]
fn mtp_scenario(
    family: &str,
    tp: u32,
    pp: u32,
    dp: u32,
    ep: u32,
    schedule: Schedule,
    zero: u8,
    m: u32,
    mtp: u32,
    extra: &str,
) -> Result<Scenario, String> {
    let text = moe_scenario(family, tp, pp, dp, ep, schedule, zero, m, extra)?.to_toml();
    let text = text.replacen("[model]\n", &format!("[model]\nmtp_layers = {mtp}\n"), 1);
    // Planned as for Megatron-LM: Strata's own executor runs no MTP modules (strata-cpu-mla).
    let text = text.replace("framework = \"strata\"", "framework = \"megatron\"");
    Scenario::from_toml(&text, "mtp", "mtp", &[]).map_err(|e| e.to_string())
}

/// As [`moe_scenario`], with more keys of `[model.moe]` (`moe_extra`).
#[allow(clippy::too_many_arguments)]
fn moe_scenario_with(
    family: &str,
    tp: u32,
    pp: u32,
    dp: u32,
    ep: u32,
    schedule: Schedule,
    zero: u8,
    m: u32,
    moe_extra: &str,
    extra: &str,
) -> Result<Scenario, String> {
    let vpp = if schedule == Schedule::Interleaved { 2 } else { 1 };
    let text = format!(
        "[model]\nfamily = \"{family}\"\nlayers = 4\nhidden = 16\nheads = 4\nffn_hidden = 64\nvocab = 32\nseq_len = 8\n\
         [model.moe]\nexperts = 8\ntop_k = 2\nexpert_ffn_hidden = 32\nshared_experts = 1\nshared_ffn_hidden = 32\ndense_layers = 1\n{moe_extra}\
         [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
         [parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nep = {ep}\nvpp = {vpp}\nschedule = \"{}\"\nglobal_batch = {}\nzero = {zero}\n\
         sequence_parallel = {}\n{extra}",
        tp * pp * dp,
        schedule.key(),
        m * dp,
        tp > 1,
    );
    // `extra` may hold keys of [parallel] or, after its own header, of [training].
    Scenario::from_toml(&text, "moe", "moe", &[]).map_err(|e| e.to_string())
}

/// Model FLOPs of the test model's step, from its shapes: dense layers as
/// `layer_forward_flops_per_token`, MoE layers with the dense MLP replaced by the router
/// (2·h·E), k routed experts and the shared expert, all times 3 with backward.
fn moe_step_flops(s: &Scenario) -> f64 {
    let m = &s.model;
    let moe = m.moe.as_ref().unwrap();
    let h = m.hidden as f64;
    let mats = m.mlp_matrices() as f64;
    let tokens = s.parallel.global_batch as f64 * m.seq_len as f64;
    let dense = layer_forward_flops_per_token(m) as f64;
    let moe_layer = dense - 2.0 * mats * h * m.ffn_hidden as f64
        + 2.0 * h * moe.experts as f64
        + 2.0 * mats * h * moe.expert_ffn_hidden as f64 * moe.top_k as f64
        + 2.0 * mats * h * (moe.shared_experts * moe.shared_ffn_hidden) as f64;
    let all = m.layers + m.mtp_layers;
    let layers: f64 = (0..all).map(|l| if m.is_moe_layer(l) { moe_layer } else { dense }).sum();
    // Each multi-token-prediction depth: its layer (above), eh_proj (2·2h·h) and a head.
    let logits = logits_forward_flops_per_token(m) as f64;
    let mtp = m.mtp_layers as f64 * (4.0 * h * h + logits);
    let fwd = tokens * (layers + logits + mtp);
    let recompute = match s.parallel.recompute {
        Recompute::None => 0.0,
        Recompute::Selective => tokens * all as f64 * attention_core_forward_flops_per_token(m) as f64,
        Recompute::Full => tokens * layers,
    };
    3.0 * fwd + recompute
}

/// FLOPs of every compute op of the plan, over all ranks.
fn plan_flops(plan: &Plan) -> f64 {
    let per_stage = plan.grid.ranks() / plan.grid.pp;
    (0..plan.grid.pp)
        .map(|stage| {
            let ops = &plan.programs[stage as usize].ops;
            let f: u64 = ops
                .iter()
                .filter_map(|o| match &o.kind {
                    OpKind::Compute(c) => Some(plan.cost(c.cost).flops),
                    _ => None,
                })
                .sum();
            f as f64 * per_stage as f64
        })
        .sum()
}

#[test]
fn plan_flops_are_the_moe_step_flops() {
    for (family, tp, pp, dp, ep, sched, zero) in [
        ("gpt", 1, 1, 1, 1, Schedule::OneFOneB, 0),
        ("llama", 1, 1, 4, 4, Schedule::OneFOneB, 1),
        ("llama", 2, 2, 2, 4, Schedule::OneFOneB, 2),
        ("gpt", 2, 1, 2, 2, Schedule::ZbH1, 0),
        ("llama", 1, 2, 2, 2, Schedule::Interleaved, 1),
    ] {
        let s = moe_scenario(family, tp, pp, dp, ep, sched, zero, 4, "").unwrap();
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap();
        let want = moe_step_flops(&s);
        let got = plan_flops(&plan);
        assert!((got - want).abs() <= want * 1e-12, "{family} tp{tp} pp{pp} dp{dp} ep{ep}: plan {got} vs {want}");
    }
}

/// Multi-token prediction (DeepSeek-V3's one depth, or two): the plan's FLOPs gain each
/// depth's layer, projection and head, and every split verifies.
#[test]
fn mtp_modules_are_costed_on_the_last_stage() {
    for (family, tp, pp, dp, ep, sched, zero, mtp, rc) in [
        ("llama", 1, 1, 2, 2, Schedule::OneFOneB, 0, 1, "none"),
        ("llama", 2, 2, 2, 4, Schedule::OneFOneB, 1, 2, "full"),
        ("gpt", 2, 2, 1, 2, Schedule::OneFOneB, 1, 1, "selective"),
        ("llama", 1, 2, 2, 2, Schedule::Interleaved, 1, 1, "none"),
    ] {
        let s = mtp_scenario(family, tp, pp, dp, ep, sched, zero, 4, mtp, &format!("recompute = \"{rc}\"\n")).unwrap();
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap_or_else(|e| panic!("{e}\n{}", s.to_toml()));
        let want = moe_step_flops(&s);
        let got = plan_flops(&plan);
        assert!((got - want).abs() <= want * 1e-12, "{family} tp{tp} pp{pp} mtp{mtp}: plan {got} vs {want}");
        // The MTP ops sit on the last stage only.
        let mtp_ops = |stage: usize| {
            plan.programs[stage]
                .ops
                .iter()
                .filter(|o| matches!(&o.kind, OpKind::Compute(c) if c.piece == Piece::MtpProj))
                .count()
        };
        assert_eq!(mtp_ops(pp as usize - 1), (3 * mtp * plan.scenario.parallel.microbatches()) as usize);
        if pp > 1 {
            assert_eq!(mtp_ops(0), 0);
        }
    }
}

#[test]
fn dispatch_and_combine_move_k_h_e_bytes_per_token_each_way() {
    let s = moe_scenario("llama", 2, 1, 2, 4, Schedule::OneFOneB, 0, 2, "").unwrap();
    let plan = lower(&s).unwrap();
    let m = &s.model;
    // Tokens per rank under SP: b·s/tp; k = 2; the training dtype's bytes.
    let e = s.training.storage_dtype().bytes();
    let per_rank = m.seq_len as u64 / 2 * 2 * m.hidden as u64 * e;
    let mut seen = [0u32; 2];
    for op in &plan.programs[0].ops {
        if let OpKind::Collective(c) = &op.kind
            && let CollPurpose::Moe { dispatch, phase, .. } = c.purpose
        {
            assert_eq!((c.kind, c.group, c.bytes), (CollKind::AllToAll, GroupKind::Ep, per_rank));
            assert!(matches!(phase, Phase::Forward | Phase::BackwardInput));
            seen[usize::from(dispatch)] += 1;
        }
    }
    // 3 MoE layers × 2 microbatches × (forward + backward), each way.
    assert_eq!(seen, [12, 12]);
    // A capacity factor of 0.5 halves the balanced volume: T = 8 tokens on one tp rank,
    // ⌈T·k/E · 0.5⌉ = 1 row per expert, 8 rows instead of 16.
    let s = moe_scenario_with("llama", 1, 1, 4, 4, Schedule::OneFOneB, 0, 2, "capacity_factor = 0.5\n", "").unwrap();
    let plan = lower(&s).unwrap();
    verify(&plan).unwrap();
    let bytes = plan.programs[0].ops.iter().find_map(|o| match &o.kind {
        OpKind::Collective(c) if matches!(c.purpose, CollPurpose::Moe { .. }) => Some(c.bytes),
        _ => None,
    });
    assert_eq!(bytes, Some(8 * m.hidden as u64 * e));
}

#[test]
fn expert_gradients_reduce_over_the_expert_data_parallel_group() {
    let s = moe_scenario("llama", 1, 1, 4, 2, Schedule::OneFOneB, 1, 2, "grad_bucket_mb = 0.001\n").unwrap();
    let plan = lower(&s).unwrap();
    let experts: Vec<&Bucket> = plan.buckets[0].iter().filter(|b| b.is_expert()).collect();
    assert_eq!(experts.iter().map(|b| b.units.len()).sum::<usize>(), 3, "one expert unit per MoE layer");
    let per_expert = 3 * 16 * 32;
    assert!(experts.iter().all(|b| b.params == b.units.len() as u64 * 4 * per_expert));
    let mut expert_reduces = 0;
    for op in &plan.programs[0].ops {
        if let OpKind::Collective(c) = &op.kind {
            match c.purpose {
                CollPurpose::ExpertGradBucket { .. } => {
                    assert_eq!((c.kind, c.group), (CollKind::ReduceScatter, GroupKind::ExpertDp));
                    expert_reduces += 1;
                }
                CollPurpose::GradBucket { .. } => assert_eq!(c.group, GroupKind::Dp),
                CollPurpose::ParamBucket { bucket, .. } => {
                    let b = plan.buckets[0].iter().find(|b| b.index == bucket).unwrap();
                    let want = if b.is_expert() { GroupKind::ExpertDp } else { GroupKind::Dp };
                    assert_eq!(c.group, want);
                }
                _ => {}
            }
        }
    }
    assert_eq!(expert_reduces, experts.len());
    assert_eq!(plan.grid.group_size(GroupKind::ExpertDp), 2);
}

#[test]
fn refused_moe_splits_name_their_rule() {
    let cases = [
        (moe_scenario("llama", 1, 1, 4, 3, Schedule::OneFOneB, 0, 2, ""), "parallel.ep = 3"),
        (moe_scenario("llama", 1, 1, 2, 4, Schedule::OneFOneB, 0, 2, ""), "tp · cp · dp"),
        (moe_scenario("llama", 1, 1, 2, 2, Schedule::OneFOneB, 3, 2, ""), "ZeRO-3"),
    ];
    for (r, want) in cases {
        let e = r.unwrap_err();
        assert!(e.contains(want), "{e}");
    }
    let tp_no_sp = moe_scenario("llama", 2, 1, 1, 1, Schedule::OneFOneB, 0, 2, "")
        .unwrap()
        .to_toml()
        .replace("sequence_parallel = true", "sequence_parallel = false");
    let e = Scenario::from_toml(&tp_no_sp, "moe", "moe", &[]).unwrap_err().to_string();
    assert!(e.contains("sequence parallelism"), "{e}");
}

prop_compose! {
    fn any_moe_scenario()(tp in prop::sample::select(vec![1u32, 2]), pp in 1u32..4, dp in 1u32..5,
                          ep in prop::sample::select(vec![1u32, 2, 4, 8]), sched in 0usize..Schedule::ALL.len(),
                          zero in 0u8..3, rc in 0usize..3, mfac in 1u32..4, gelu: bool,
                          bucket in prop::sample::select(vec![0.001f64, 1.0]), cf in prop::sample::select(vec![0.0f64, 0.5, 1.25]),
                          overlap_grad: bool, overlap_param: bool, clip: bool, mtp in 0u32..3) -> Option<Scenario> {
        // MTP modules are planned as for Megatron-LM (Strata's executor runs none): its
        // schedules and ZeRO-1 at most.
        let schedule = match Schedule::ALL[sched] {
            Schedule::ZbH1 | Schedule::ZbH2 | Schedule::Gpipe if mtp > 0 => Schedule::OneFOneB,
            other => other,
        };
        let zero = if mtp > 0 { zero.min(1) } else { zero };
        let m = if schedule == Schedule::Interleaved { pp * mfac } else { mfac + pp / 2 };
        let extra = format!(
            "recompute = \"{}\"\ngrad_bucket_mb = {bucket}\noverlap_grad_reduce = {overlap_grad}\noverlap_param_gather = {overlap_param}\n\
             [training]\ngrad_clip = {}\n",
            Recompute::ALL[rc].key(), if clip { 1.0 } else { 0.0 });
        let moe = if cf > 0.0 { format!("capacity_factor = {cf}\n") } else { String::new() };
        let s = moe_scenario_with(if gelu { "gpt" } else { "llama" }, tp, pp, dp, ep, schedule, zero, m, &moe, &extra).ok()?;
        let text = s.to_toml().replacen("[model]\n", &format!("[model]\nmtp_layers = {mtp}\n"), 1);
        let text = if mtp > 0 { text.replace("framework = \"strata\"", "framework = \"megatron\"") } else { text };
        Scenario::from_toml(&text, "prop", "prop", &[]).ok()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Every MoE plan the planner emits passes the verifier.
    #[test]
    fn moe_plans_verify(s in any_moe_scenario()) {
        prop_assume!(s.is_some());
        let s = s.unwrap();
        let plan = lower(&s).unwrap();
        if let Err(e) = verify(&plan) {
            panic!("{e}\n{}", s.to_toml());
        }
    }
}

/// The plan's Alloc/Free peak of a Mixtral-like MoE (Llama-3 70B shapes, 8 experts top-2,
/// the first layer dense) agrees with the analytic memory within 3% on every stage, as the
/// dense plans do (`models/tests/plan.rs`): expert state sharded over the expert-data-parallel
/// group, the MoE activations and the multi-token-prediction modules on the last stage are
/// counted alike.
#[test]
fn moe_alloc_free_peak_agrees_with_the_analytic_model() {
    use strata_models::accounting::memory::stage_memory;
    for (tp, pp, dp, ep, sched, zero, rc, mtp) in [
        (4, 4, 4, 8, Schedule::OneFOneB, 1, Recompute::Selective, 0),
        (2, 4, 8, 16, Schedule::OneFOneB, 2, Recompute::None, 0),
        (4, 4, 4, 4, Schedule::ZbH1, 1, Recompute::Selective, 0),
        (8, 2, 4, 8, Schedule::Gpipe, 0, Recompute::Full, 0),
        (4, 4, 4, 8, Schedule::OneFOneB, 1, Recompute::Selective, 1),
        (2, 4, 8, 16, Schedule::OneFOneB, 2, Recompute::None, 2),
    ] {
        let text = format!(
            "[model]\npreset = \"llama3-70b\"\nmtp_layers = {mtp}\n[model.moe]\nexperts = 16\ntop_k = 2\nexpert_ffn_hidden = 7168\ndense_layers = 1\n\
             [cluster]\npreset = \"dgx-h100\"\nnodes = {}\n[parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nep = {ep}\nschedule = \"{}\"\n\
             global_batch = {}\nzero = {zero}\nrecompute = \"{}\"\nsequence_parallel = true\n[training]\nframework = \"strata\"\n",
            tp * pp * dp / 8,
            sched.key(),
            16 * dp,
            rc.key()
        );
        let s = Scenario::from_toml(&text, "mem", "mem", &[]).unwrap_or_else(|e| panic!("{e}"));
        let plan = lower(&s).unwrap();
        let analytic = stage_memory(&s);
        for stage in 0..pp {
            let ours = program_order_peak(&plan.programs[stage as usize]) as f64;
            let theirs = analytic[stage as usize].total_bytes();
            let err = (ours / theirs - 1.0).abs();
            assert!(
                err < 0.03,
                "tp{tp} pp{pp} dp{dp} ep{ep} {sched:?} zero{zero} {rc:?} mtp{mtp} stage {stage}: plan {ours:.4e} vs analytic {theirs:.4e} ({:.2}%)",
                err * 100.0
            );
        }
    }
}
