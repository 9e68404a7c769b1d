//! `parallel.moe_a2a_overlap` (a steady-state backward merged with the next forward, so each
//! one's expert all-to-alls run under the other's compute): every such plan passes the
//! verifier (deadlock, matching, lifetimes) over ep, tp with sequence parallelism, dp, pp,
//! every schedule, ZeRO 0–2, recomputation and MTP; it holds exactly the ops of the plan
//! without the overlap, only reordered; a forward's dispatch is followed by another
//! microbatch's backward compute before the experts that wait for it; the program-order
//! memory peak grows by at most one microbatch's activations; and the refused splits name
//! their rule.

mod common;
use common::program_order_peak;
use proptest::prelude::*;
use strata_models::Scenario;
use strata_models::parallel::{Recompute, Schedule};
use strata_models::plan::*;

/// A small MoE model (hidden 16, 8 experts top-2, a shared expert, the first layer dense)
/// on CPU ranks, planned for `framework`.
#[allow(clippy::too_many_arguments)]
fn scenario(
    tp: u32,
    pp: u32,
    dp: u32,
    ep: u32,
    schedule: Schedule,
    zero: u8,
    m: u32,
    overlap: bool,
    extra: &str,
    framework: &str,
) -> Result<Scenario, String> {
    let vpp = if schedule == Schedule::Interleaved { 2 } else { 1 };
    let text = format!(
        "[model]\nfamily = \"llama\"\nlayers = 4\nhidden = 16\nheads = 4\nffn_hidden = 64\nvocab = 32\nseq_len = 8\n\
         [model.moe]\nexperts = 8\ntop_k = 2\nexpert_ffn_hidden = 32\nshared_experts = 1\nshared_ffn_hidden = 32\ndense_layers = 1\n\
         [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
         [parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nep = {ep}\nvpp = {vpp}\nschedule = \"{}\"\nglobal_batch = {}\nzero = {zero}\n\
         sequence_parallel = {}\nmoe_a2a_overlap = {overlap}\n{extra}\n[training]\nframework = \"{framework}\"\n",
        tp * pp * dp,
        schedule.key(),
        m * dp,
        tp > 1,
    );
    Scenario::from_toml(&text, "overlap", "overlap", &[]).map_err(|e| e.to_string())
}

fn with_overlap(s: &Scenario, on: bool) -> Scenario {
    let mut s = s.clone();
    s.parallel.moe_a2a_overlap = on;
    s
}

/// Each op of a program as text, without its deps (which the reordering renumbers), sorted.
fn op_multiset(p: &Program) -> Vec<String> {
    let mut v: Vec<String> = p.ops.iter().map(|o| format!("{:?} {:?} {:?}", o.stream, o.kind, o.bufs)).collect();
    v.sort();
    v
}

prop_compose! {
    fn any_overlap_scenario()(tp in prop::sample::select(vec![1u32, 2]), pp in 1u32..5, dp in 1u32..5,
                              ep in prop::sample::select(vec![2u32, 4, 8]), sched in 0usize..Schedule::ALL.len(),
                              zero in 0u8..3, rc in 0usize..3, mfac in 1u32..4, mtp: bool,
                              overlap_grad: bool) -> Option<Scenario> {
        let schedule = Schedule::ALL[sched];
        let m = if schedule == Schedule::Interleaved { pp * mfac } else { mfac + pp };
        let extra = format!("recompute = \"{}\"\noverlap_grad_reduce = {overlap_grad}", Recompute::ALL[rc].key());
        let s = scenario(tp, pp, dp, ep, schedule, zero, m, true, &extra, "strata").ok()?;
        if !mtp {
            return Some(s);
        }
        // An MTP module on the last stage, planned for Megatron-LM (Strata's CPU executor runs
        // none), where megatron-core's rules allow it.
        let text = s.to_toml().replacen("[model]\n", "[model]\nmtp_layers = 1\n", 1)
            .replace("framework = \"strata\"", "framework = \"megatron\"");
        Scenario::from_toml(&text, "prop", "prop", &[]).ok()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Every plan with the overlap verifies, and holds the ops of the plan without it.
    #[test]
    fn overlap_plans_verify_and_only_reorder(s in any_overlap_scenario()) {
        prop_assume!(s.is_some());
        let s = s.unwrap();
        let plan = lower(&s).unwrap();
        if let Err(e) = verify(&plan) {
            panic!("{e}\n{}", s.to_toml());
        }
        let plain = lower(&with_overlap(&s, false)).unwrap();
        for (a, b) in plan.programs.iter().zip(&plain.programs) {
            prop_assert_eq!(op_multiset(a), op_multiset(b));
        }
    }
}

/// The compute ops between a forward's dispatch all-to-all and the `Experts` op that waits
/// for it: (the dispatch's mb, the compute's mb, its phase) for each.
fn computes_under_dispatches(p: &Program) -> Vec<(u32, u32, Phase)> {
    let mut out = Vec::new();
    for (i, op) in p.ops.iter().enumerate() {
        let OpKind::Collective(c) = &op.kind else { continue };
        let CollPurpose::Moe { dispatch: true, phase: Phase::Forward, mb, layer, .. } = c.purpose else { continue };
        for later in &p.ops[i + 1..] {
            if let OpKind::Compute(k) = &later.kind {
                if k.piece == Piece::Experts && k.phase == Phase::Forward && k.mb == mb && k.layer == layer {
                    break;
                }
                out.push((mb, k.mb, k.phase));
            }
        }
    }
    out
}

#[test]
fn a_forward_dispatch_runs_under_another_microbatchs_backward() {
    // Two stages, 1F1B, 6 microbatches: steady pairs B(k), F(k + w + 1) on both stages (on
    // the last, w = 0: never one microbatch's own two passes).
    let s = scenario(1, 2, 2, 2, Schedule::OneFOneB, 1, 6, true, "", "strata").unwrap();
    let on = lower(&s).unwrap();
    let off = lower(&with_overlap(&s, false)).unwrap();
    for stage in 0..2 {
        let under = computes_under_dispatches(&on.programs[stage]);
        let backward: Vec<_> = under.iter().filter(|(_, _, ph)| *ph == Phase::BackwardInput).collect();
        assert!(!backward.is_empty(), "stage {stage}: no backward compute under a forward dispatch: {under:?}");
        assert!(backward.iter().all(|(f, b, _)| f != b), "stage {stage}: {backward:?}");
        // Without the overlap only the forward's own shared experts run there.
        let plain = computes_under_dispatches(&off.programs[stage]);
        assert!(
            !plain.is_empty() && plain.iter().all(|(f, b, ph)| *ph == Phase::Forward && f == b),
            "stage {stage}: {plain:?}"
        );
    }
}

#[test]
fn overlap_costs_at_most_one_more_microbatch_of_activations() {
    for (pp, sched, rc) in [
        (2, Schedule::OneFOneB, Recompute::None),
        (4, Schedule::OneFOneB, Recompute::Selective),
        (2, Schedule::Interleaved, Recompute::None),
        (2, Schedule::ZbH1, Recompute::None),
    ] {
        let extra = format!("recompute = \"{}\"", rc.key());
        let s = scenario(1, pp, 2, 2, sched, 1, 2 * pp, true, &extra, "strata").unwrap();
        let on = lower(&s).unwrap();
        let off = lower(&with_overlap(&s, false)).unwrap();
        for stage in 0..pp as usize {
            let (a, b) = (program_order_peak(&on.programs[stage]), program_order_peak(&off.programs[stage]));
            // One microbatch's activation buffers on this stage (every chunk's).
            let one_mb: u64 = off.programs[stage]
                .ops
                .iter()
                .filter_map(|o| match &o.kind {
                    OpKind::Alloc(x) if x.class == BufClass::Activations && x.name.ends_with(" mb0") => Some(x.bytes),
                    _ => None,
                })
                .sum();
            assert!(a >= b && a <= b + one_mb, "pp{pp} {sched:?} stage {stage}: {a} vs {b} (+{one_mb})");
        }
    }
}

#[test]
fn refused_overlaps_name_their_rule() {
    // No expert parallelism: nothing to overlap.
    let e = scenario(1, 2, 2, 1, Schedule::OneFOneB, 1, 4, true, "", "strata").unwrap_err();
    assert!(e.contains("parallel.moe_a2a_overlap = true with parallel.ep = 1"), "{e}");
    // Megatron-LM: a pipeline needs the interleaved schedule; no full recomputation.
    let e = scenario(1, 2, 2, 2, Schedule::OneFOneB, 1, 4, true, "", "megatron").unwrap_err();
    assert!(e.contains("--overlap-moe-expert-parallel-comm") && e.contains("\"interleaved\""), "{e}");
    let e = scenario(1, 2, 2, 2, Schedule::Interleaved, 1, 4, true, "recompute = \"full\"", "megatron").unwrap_err();
    assert!(e.contains("recompute = \"full\"") && !e.contains("\"interleaved\" (vpp"), "{e}");
    assert!(scenario(1, 2, 2, 2, Schedule::Interleaved, 1, 4, true, "", "megatron").is_ok());
    assert!(scenario(1, 1, 2, 2, Schedule::OneFOneB, 1, 4, true, "", "megatron").is_ok());
    // DeepSpeed and torchtitan run no combined forward-backward (torchtitan only in DualPipeV).
    let e = scenario(1, 1, 2, 2, Schedule::OneFOneB, 1, 4, true, "", "deepspeed").unwrap_err();
    assert!(e.contains("DeepSpeed-MoE"), "{e}");
    let e = scenario(1, 1, 2, 2, Schedule::OneFOneB, 2, 4, true, "", "torchtitan").unwrap_err();
    assert!(e.contains("DualPipeV"), "{e}");
}

#[test]
fn every_schedule_with_a_steady_state_is_reordered() {
    for sched in Schedule::ALL {
        for (tp, pp, dp, ep, zero) in [(1, 2, 2, 2, 1), (2, 3, 2, 4, 2), (1, 1, 4, 4, 0)] {
            let m = if sched == Schedule::Interleaved { 2 * pp } else { 2 * pp + 1 };
            let Ok(s) = scenario(tp, pp, dp, ep, sched, zero, m, true, "", "strata") else { continue };
            let on = lower(&s).unwrap();
            let off = lower(&with_overlap(&s, false)).unwrap();
            let changed = on.programs.iter().zip(&off.programs).filter(|(a, b)| a.ops != b.ops).count();
            // Stages that hold a MoE layer (a stage of dense layers has no all-to-all to cut at).
            let moe_stages = (0..pp)
                .filter(|&st| {
                    (0..s.parallel.vpp).any(|c| {
                        s.parallel
                            .chunk_layers(&s.model, s.parallel.pipeline().vstage(c, st))
                            .any(|l| s.model.is_moe_layer(l))
                    })
                })
                .count();
            // GPipe has no steady state: nothing to merge.
            let want = if sched == Schedule::Gpipe { 0 } else { moe_stages };
            assert_eq!(changed, want, "{sched:?} tp{tp} pp{pp} dp{dp} ep{ep}: {changed} stages reordered");
        }
    }
}

#[test]
fn merged_pairs_keep_pace_only_with_two_warm_ups_more_per_stage() {
    let pace = |s: Schedule, vpp| s.merge_keeps_pace(4, vpp, 16);
    assert!(pace(Schedule::Interleaved, 2) && pace(Schedule::ZbH2, 1));
    assert!(!pace(Schedule::OneFOneB, 1) && !pace(Schedule::ZbH1, 1) && !pace(Schedule::Gpipe, 1));
    // One stage: nothing to wait for.
    assert!(Schedule::OneFOneB.merge_keeps_pace(1, 1, 4));
    // Interleaved with m = pp runs every forward first: no steady state to keep.
    assert!(!Schedule::Interleaved.merge_keeps_pace(4, 2, 4));
}
