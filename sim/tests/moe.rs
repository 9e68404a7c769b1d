//! Router imbalance in the engine: an EP rank's `Experts` compute scales by its load, the
//! dispatch/combine bytes by the most loaded rank's, the all-to-all makes the group wait for
//! that rank (closed forms over the router's own draws), symmetric mode takes the stage's
//! most loaded rank, and the report is the same bytes on one and two threads.
//!
//! The MoE lowering lands separately (`moe-plan`): until then these plans are dense plans
//! edited by hand into MoE ones — every `Mlp` op becomes `Experts`, every tensor-parallel
//! all-reduce after it an expert-parallel all-to-all (`CollPurpose::Moe`), and the scenario
//! gains a `MoeSpec` and the grid an ep. MERGE: once the lowering emits MoE layers, add a
//! test over a lowered `tiny-moe` beside these.

mod common;

use common::{FreeNetwork, fnv1a};
use strata_models::GpuKind;
use strata_models::model::{MoeSpec, RouterScore};
use strata_models::plan::{CollKind, CollPurpose, ComputeCost, ComputeOp, GroupKind, OpKind, Piece, Plan};
use strata_sim::net::{CommChoice, CommId, CommKind, CommRequest, Network};
use strata_sim::program::ComputeTimer;
use strata_sim::router::RouterLoads;
use strata_sim::simulate::simulate_timed;
use strata_sim::{HardwareProfile, Mode, SimOptions, SimReport};

const EXPERT_NS: u64 = 1_000_000;
const EXPERTS: u32 = 16;

fn text(tp: u32, dp: u32, m: u32) -> String {
    format!(
        "[model]\nfamily = \"gpt\"\nlayers = 4\nhidden = 64\nheads = 4\nvocab = 256\nseq_len = 64\n\
         [cluster]\npreset = \"dgx-a100\"\nnodes = 1\ngpus_per_node = {}\n\
         [parallel]\ntp = {tp}\ndp = {dp}\nmicro_batch = 1\nglobal_batch = {}\n",
        tp * dp,
        m * dp
    )
}

/// A dense plan turned into a MoE one with `ep` expert-parallel ranks at Gini `skew`.
fn moe_plan(tp: u32, dp: u32, m: u32, ep: u32, skew: f64) -> Plan {
    let mut plan = common::plan(&text(tp, dp, m));
    plan.scenario.model.moe = Some(MoeSpec {
        experts: EXPERTS,
        top_k: 2,
        expert_ffn_hidden: 128,
        shared_experts: 0,
        shared_ffn_hidden: 0,
        dense_layers: 0,
        capacity_factor: None,
        score: RouterScore::Softmax,
        aux_loss_coeff: 0.0,
        skew: Some(skew),
    });
    plan.scenario.parallel.ep = ep;
    plan.grid = plan.grid.with_cp_ep(1, ep);
    for program in &mut plan.programs {
        for op in &mut program.ops {
            match &mut op.kind {
                OpKind::Compute(c) if c.piece == Piece::Mlp => c.piece = Piece::Experts,
                OpKind::Collective(c) => {
                    if let CollPurpose::Tp { piece: Piece::Mlp, phase, mb, chunk, layer, .. } = c.purpose {
                        c.kind = CollKind::AllToAll;
                        c.group = GroupKind::Ep;
                        c.purpose = CollPurpose::Moe { dispatch: false, phase, mb, chunk, layer };
                    }
                }
                _ => {}
            }
        }
    }
    plan
}

/// Experts take `EXPERT_NS` (before imbalance); everything else is free.
struct ExpertTimer;

impl ComputeTimer for ExpertTimer {
    fn duration_ns(&self, op: &ComputeOp, _cost: &ComputeCost) -> u64 {
        if op.piece == Piece::Experts { EXPERT_NS } else { 0 }
    }
}

/// Free communication that records the bytes of every all-to-all it is asked for.
#[derive(Default)]
struct Recording {
    free: FreeNetwork,
    a2a_bytes: Vec<u64>,
}

impl Network for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId {
        if req.kind == CommKind::Collective(CollKind::AllToAll) {
            self.a2a_bytes.push(req.bytes);
        }
        self.free.start(now_ns, req)
    }
    fn next_completion_ns(&self) -> Option<u64> {
        self.free.next_completion_ns()
    }
    fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        self.free.advance(now_ns)
    }
    fn choice(&self, req: &CommRequest) -> CommChoice {
        self.free.choice(req)
    }
}

fn run(plan: &Plan, mode: Mode, seed: u64) -> (SimReport, Vec<u64>) {
    let profile = HardwareProfile::builtin(GpuKind::A100_80gb);
    let mut net = Recording::default();
    let options = SimOptions { mode, seed, ..SimOptions::default() };
    let r = simulate_timed(plan, &options, &mut net, &ExpertTimer, &profile).unwrap();
    (r, net.a2a_bytes)
}

/// (layer, microbatch) of every `Experts` op of a stage's program, in program order.
fn expert_keys(plan: &Plan) -> Vec<(u32, u32)> {
    plan.programs[0]
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Compute(c) if c.piece == Piece::Experts => Some((c.layer, c.mb)),
            _ => None,
        })
        .collect()
}

/// Every Experts op is followed by an all-to-all of its group before the next one, and the
/// rest is free: a group's step is Σ over its Experts ops of its most loaded rank's time, the
/// step the slowest group's (the groups meet only at the gradient reduction).
fn closed_form_ns(plan: &Plan, seed: u64, per_group: bool) -> u64 {
    let g = plan.grid;
    let moe = plan.scenario.model.moe.as_ref().unwrap();
    let mut loads = RouterLoads::with(moe.experts, moe.skew.unwrap(), None, seed, g);
    let groups = g.stage_ranks() / g.ep;
    let keys = expert_keys(plan);
    if per_group {
        (0..groups)
            .map(|gr| {
                let max = |&(l, mb): &(u32, u32)| (EXPERT_NS as f64 * loads.rank_loads(gr, l, mb).1).ceil() as u64;
                keys.iter().map(max).sum::<u64>()
            })
            .max()
            .unwrap()
    } else {
        // Symmetric: each op at the stage's most loaded rank.
        keys.iter().map(|&(l, mb)| (EXPERT_NS as f64 * loads.stage_max(0, l, mb)).ceil() as u64).sum()
    }
}

#[test]
fn balanced_routing_costs_what_the_plan_says() {
    let plan = moe_plan(4, 2, 4, 4, 0.0);
    let (r, bytes) = run(&plan, Mode::Full, 1);
    let want = expert_keys(&plan).len() as u64 * EXPERT_NS;
    assert_eq!((r.step_time_s * 1e9).round() as u64, want);
    // The all-to-alls move the plan's bytes.
    let planned: Vec<u64> = plan.programs[0]
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Collective(c) if c.kind == CollKind::AllToAll => Some(c.bytes),
            _ => None,
        })
        .collect();
    assert_eq!(bytes.len(), planned.len() * 2, "one request per EP group");
    assert!(bytes.iter().all(|b| planned.contains(b)));
}

#[test]
fn the_most_loaded_rank_sets_the_pace_of_its_group() {
    for seed in [1, 2, 3] {
        let plan = moe_plan(4, 2, 4, 4, 0.3);
        let (r, bytes) = run(&plan, Mode::Full, seed);
        let step = (r.step_time_s * 1e9).round() as u64;
        let want = closed_form_ns(&plan, seed, true);
        assert!(step.abs_diff(want) <= 2 * expert_keys(&plan).len() as u64, "seed {seed}: {step} vs {want} ns");
        let balanced = expert_keys(&plan).len() as u64 * EXPERT_NS;
        assert!(step > balanced * 105 / 100, "imbalance slows the step: {step} vs {balanced}");
        // Every all-to-all moved at least the balanced bytes, scaled by its group's max.
        let planned = plan.programs[0]
            .ops
            .iter()
            .find_map(|o| match &o.kind {
                OpKind::Collective(c) if c.kind == CollKind::AllToAll => Some(c.bytes),
                _ => None,
            })
            .unwrap();
        assert!(bytes.iter().all(|&b| b > planned), "{bytes:?} vs {planned}");
        // The waits for the most loaded rank (at the all-to-alls, and at attention's
        // all-reduces for a partner still on its experts' weight gradients) and its time
        // past the balanced share are their own line; the breakdown still sums, and at
        // most the balanced share is compute.
        let b = &r.breakdown_s;
        assert!((b.total() - r.step_time_s).abs() < 1e-9);
        assert!((b.compute + b.moe_imbalance - r.step_time_s).abs() < 1e-9, "{b:?}");
        assert!(b.compute <= balanced as f64 * 1e-9 + 1e-9 && b.moe_imbalance > 0.05 * b.compute, "{b:?}");
    }
}

#[test]
fn a_capacity_factor_caps_the_most_loaded_rank() {
    // Capacity = the balanced share (factor 1): no rank computes more than the plan says and
    // the dropped tokens make the step shorter than the balanced one.
    let mut plan = moe_plan(4, 2, 4, 4, 0.3);
    plan.scenario.model.moe.as_mut().unwrap().capacity_factor = Some(1.0);
    let (r, _) = run(&plan, Mode::Full, 1);
    let balanced = expert_keys(&plan).len() as u64 * EXPERT_NS;
    let step = (r.step_time_s * 1e9).round() as u64;
    assert!(step < balanced, "{step} vs {balanced}");
    let (dropless, _) = run(&moe_plan(4, 2, 4, 4, 0.3), Mode::Full, 1);
    assert!(r.step_time_s < dropless.step_time_s);
}

#[test]
fn symmetric_mode_bounds_the_full_run_by_the_most_loaded_rank() {
    // One EP group per stage (ep = tp·dp) or two (ep = tp): symmetric runs every Experts op
    // at the stage's most loaded rank; the full run sums each rank's own ops between two
    // all-to-alls of its group, so symmetric is an upper bound, close to it.
    for (ep, m) in [(8, 4), (4, 8)] {
        let plan = moe_plan(4, 2, m, ep, 0.3);
        let (full, _) = run(&plan, Mode::Full, 5);
        let (sym, _) = run(&plan, Mode::Symmetric, 5);
        let gap = sym.step_time_s / full.step_time_s - 1.0;
        assert!((0.0..0.1).contains(&gap), "ep {ep}: symmetric {} vs full {}", sym.step_time_s, full.step_time_s);
        assert_eq!((sym.step_time_s * 1e9).round() as u64, closed_form_ns(&plan, 5, false), "ep {ep}");
        assert!(sym.mode_note.as_deref().is_some_and(|n| n.contains("upper bound")), "{:?}", sym.mode_note);
        // Auto picks full mode and says why.
        let (auto, _) = run(&plan, Mode::Auto, 5);
        assert_eq!(auto.mode, Mode::Full);
        assert!(auto.mode_note.as_deref().is_some_and(|n| n.contains("router imbalance")), "{:?}", auto.mode_note);
        assert_eq!(auto.step_time_s, full.step_time_s);
    }
    // Balanced routing: symmetric is exact again, and auto keeps it.
    let plan = moe_plan(4, 2, 4, 4, 0.0);
    let (auto, _) = run(&plan, Mode::Auto, 5);
    assert_eq!(auto.mode, Mode::Symmetric);
    assert_eq!(auto.step_time_s, run(&plan, Mode::Full, 5).0.step_time_s);
}

#[test]
fn the_report_is_the_same_bytes_on_one_and_two_threads() {
    let plan = moe_plan(4, 2, 4, 4, 0.3);
    let json = |threads: usize, seed: u64| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| serde_json::to_vec(&run(&plan, Mode::Full, seed).0).unwrap())
    };
    let one = json(1, 9);
    assert_eq!(fnv1a(&one), fnv1a(&json(2, 9)));
    assert_eq!(one, json(1, 9));
    assert_ne!(one, json(1, 10), "another seed draws other loads");
}

/// DeepSeek-V3's published layout (arXiv 2412.19437 §3.2: 16-way PP, 64-way EP over 8 nodes,
/// ZeRO-1 DP, no TP; seq 4,096; FP8) on 256 DGX H100 nodes (Strata's catalog has no H800: the
/// same compute, NVLink 400 GB/s instead of 900), simulated with its breakdown lines.
/// Uses the MoE lowering and the `deepseek-v3` preset;
/// DualPipe is not modelled (1F1B here), so the exposed all-to-all is an upper bound.
#[test]
fn deepseek_v3_published_layout_shows_all_to_all_bubble_and_imbalance() {
    let s = common::scenario(
        "[model]\npreset = \"deepseek-v3\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 256\n\
         [parallel]\ntp = 1\npp = 16\ndp = 128\nep = 64\nzero = 1\nmicro_batch = 1\nglobal_batch = 15360\n\
         [training]\ndtype = \"fp8\"\n",
    );
    let plan = strata_models::plan::lower(&s).unwrap();
    let r = strata_sim::simulate::simulate(&plan, &SimOptions::default()).unwrap();
    let b = &r.breakdown_s;
    println!("{:?} mode, step {:.3} s: {b:?}", r.mode, r.step_time_s);
    assert!(b.ep_exposed > 0.0 && b.bubble > 0.0 && b.moe_imbalance > 0.0, "{b:?}");
    assert!((b.total() - r.step_time_s).abs() < 1e-6);
}

/// A Mixtral 8x7B search on 64 H100 (8 DGX nodes): the winner and its breakdown.
/// Uses the MoE lowering and the `mixtral-8x7b` preset.
#[test]
fn mixtral_8x7b_search_on_64_h100() {
    let base = common::scenario(
        "[model]\npreset = \"mixtral-8x7b\"\nseq_len = 4096\n[cluster]\npreset = \"dgx-h100\"\nnodes = 8\n\
         [parallel]\nglobal_batch = 512\n",
    );
    let opts = strata_sim::search::SearchOptions::new(&base);
    let r = strata_sim::search::search(&base, &opts, &|_, _, _| {}).unwrap();
    let best = r.best().expect("a split fits");
    println!("winner {}: {:?}", best.label, best.report.as_ref().map(|x| (x.step_time_s, &x.breakdown_s)));
    // Expert parallelism is searched and simulated (it need not win: 64 H100 hold Mixtral's
    // 46.7 B parameters with ZeRO over a wide data-parallel group).
    let ranked = r.ranking.iter().map(|i| &r.candidates[*i]);
    let ep = ranked.filter(|c| c.scenario.parallel.ep > 1 && c.report.is_some()).count();
    println!("{ep} simulated candidates with ep > 1 among {} simulated", r.simulated);
    assert!(ep > 0, "no expert-parallel split was simulated");
    let rep = best.report.as_ref().expect("the winner was simulated");
    assert!(rep.step_time_s.is_finite() && rep.step_time_s > 0.0);
}
