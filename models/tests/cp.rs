//! Context-parallel plans (cp > 1; ring, all-gather and Ulysses attention): every plan the
//! planner emits verifies, its FLOPs over all ranks are the step's, its Alloc/Free peak
//! agrees with the analytic memory, its exchanges move what Transformer Engine's do, and
//! ZeRO shards over the cp · dp ranks of the data-parallel group.

mod common;
use common::program_order_peak;
use proptest::prelude::*;
use strata_models::Scenario;
use strata_models::accounting::flops::scenario_step_flops;
use strata_models::accounting::memory::stage_memory;
use strata_models::parallel::{CpComm, Recompute, Schedule};
use strata_models::plan::*;

fn scenario(text: &str) -> Scenario {
    Scenario::from_toml(text, "cp", "cp", &[]).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

prop_compose! {
    fn any_cp_scenario()(cp in prop::sample::select(vec![2u32, 4]), comm in 0usize..3,
                         tp in prop::sample::select(vec![1u32, 2]), pp in 1u32..4, dp in 1u32..3,
                         sched in 0usize..Schedule::ALL.len(), zero in 0u8..4, rc in 0usize..3, sp: bool,
                         mb in 1u32..3, mfac in 1u32..3, flash: bool, overlap: bool,
                         gpt: bool) -> Option<Scenario> {
        let schedule = Schedule::ALL[sched];
        let vpp = if schedule == Schedule::Interleaved { 2 } else { 1 };
        let m = if schedule == Schedule::Interleaved { pp * mfac } else { mfac + pp / 2 };
        // Selective recomputation of an unfused core is refused under cp; keep it fused.
        let flash = flash || Recompute::ALL[rc] == Recompute::Selective;
        let family = if gpt { "gpt" } else { "llama" };
        let text = format!(
            "[model]\nfamily = \"{family}\"\nlayers = 6\nhidden = 32\nheads = 8\nkv_heads = {}\nffn_hidden = 64\nvocab = 32\nseq_len = 16\n\
             [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
             [parallel]\ntp = {tp}\ncp = {cp}\ncp_comm = \"{}\"\npp = {pp}\ndp = {dp}\nvpp = {vpp}\nschedule = \"{}\"\nmicro_batch = {mb}\nglobal_batch = {}\n\
             zero = {zero}\nrecompute = \"{}\"\nsequence_parallel = {}\noverlap_grad_reduce = {overlap}\noverlap_param_gather = {overlap}\n\
             [training]\nflash_attention = {flash}\n",
            if gpt { 8 } else { 8 / tp.min(2) * tp },
            tp * cp * pp * dp, CpComm::ALL[comm].key(), schedule.key(), m * mb * dp, Recompute::ALL[rc].key(), sp && tp > 1);
        Scenario::from_toml(&text, "prop", "prop", &[]).ok()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    /// Every context-parallel plan the planner emits passes the verifier.
    #[test]
    fn context_parallel_plans_verify(s in any_cp_scenario()) {
        prop_assume!(s.is_some());
        let s = s.unwrap();
        let plan = lower(&s).unwrap_or_else(|e| panic!("{e}\n{}", s.to_toml()));
        if let Err(e) = verify(&plan) {
            panic!("{e}\n{}", s.to_toml());
        }
    }
}

fn toy(cp: u32, comm: CpComm, extra: &str) -> Scenario {
    scenario(&format!(
        "[model]\nfamily = \"gpt\"\nlayers = 4\nhidden = 32\nheads = 8\nffn_hidden = 64\nvocab = 32\nseq_len = 32\n\
         [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
         [parallel]\ntp = 2\ncp = {cp}\ncp_comm = \"{}\"\npp = 2\ndp = 2\nmicro_batch = 2\nglobal_batch = 8\n{extra}\n\
         [training]\nflash_attention = true\n",
        8 * cp,
        comm.key()
    ))
}

/// FLOPs of every compute op of the plan, summed over all ranks.
fn plan_flops(plan: &Plan) -> f64 {
    let per_stage = plan.grid.stage_ranks() as f64;
    plan.programs
        .iter()
        .flat_map(|p| &p.ops)
        .filter_map(|op| match &op.kind {
            OpKind::Compute(c) => Some(plan.costs[c.cost as usize].flops as f64 * per_stage),
            _ => None,
        })
        .sum()
}

#[test]
fn plan_flops_over_all_ranks_are_the_steps_for_every_variant() {
    for cp in [1, 2, 4] {
        for comm in CpComm::ALL {
            for rc in ["none", "full"] {
                let s = toy(cp, comm, &format!("recompute = \"{rc}\""));
                let plan = lower(&s).unwrap();
                let want = scenario_step_flops(&s).hardware;
                let got = plan_flops(&plan);
                assert_eq!(got, want, "cp {cp} {comm:?} {rc}");
            }
        }
    }
}

/// The pieces a ring step runs: a core per step, the ring steps numbered, the K/V passed
/// cp − 1 times forward and K/V plus dK/dV (cp − 1 + cp passes) in backward.
#[test]
fn ring_attention_runs_cp_steps_with_their_exchanges() {
    let cp = 4u32;
    let s = toy(cp, CpComm::Ring, "");
    let plan = lower(&s).unwrap();
    let prog = &plan.programs[0];
    let cores: Vec<(Phase, u32)> = prog
        .ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Compute(c) if c.piece == Piece::AttnCore && c.layer == 0 && c.mb == 0 => Some((c.phase, c.step)),
            _ => None,
        })
        .collect();
    let want: Vec<(Phase, u32)> =
        [Phase::Forward, Phase::BackwardInput].iter().flat_map(|p| (0..cp).map(move |i| (*p, i))).collect();
    assert_eq!(cores, want);
    // kv = b · (s/cp) · 2 · (kv/t) · e = 2 · 8 · 2 · 16 · 4 (fp32 on CPU ranks).
    let kv = 2 * 8 * 2 * 16 * 4;
    let ring: Vec<(Phase, u32, u64)> = prog
        .ops
        .iter()
        .filter_map(|op| match &op.kind {
            OpKind::Collective(c) => match c.purpose {
                CollPurpose::Cp { phase, mb: 0, layer: 0, step, .. } => {
                    assert_eq!((c.kind, c.group), (CollKind::RingExchange, GroupKind::Cp));
                    Some((phase, step, c.bytes))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    let fwd: Vec<_> = ring.iter().filter(|r| r.0 == Phase::Forward).map(|r| (r.1, r.2)).collect();
    assert_eq!(fwd, vec![(1, kv), (2, kv), (3, kv)]);
    let bwd: u64 = ring.iter().filter(|r| r.0 == Phase::BackwardInput).map(|r| r.2).sum();
    assert_eq!(bwd, (cp as u64 - 1 + cp as u64) * kv, "K/V and dK/dV: about twice the forward's bytes");
    // The step after the diagonal costs a merge more.
    let core_cost = |step| {
        prog.ops.iter().find_map(|op| match &op.kind {
            OpKind::Compute(c) if c.piece == Piece::AttnCore && c.step == step => Some(&plan.costs[c.cost as usize]),
            _ => None,
        })
    };
    let (c0, c1) = (core_cost(0).unwrap(), core_cost(1).unwrap());
    assert_eq!(c0.flops, c1.flops);
    assert_eq!(c1.kernels, c0.kernels + 1);
}

#[test]
fn all_gather_and_ulysses_move_what_transformer_engine_moves() {
    let kv = 2 * 16 * 2 * 16 * 4u64; // b · (s/2) · 2 · (kv/t) · e at cp = 2, fp32
    let colls = |s: &Scenario| -> Vec<(Phase, u32, CollKind, u64)> {
        let plan = lower(s).unwrap();
        plan.programs[0]
            .ops
            .iter()
            .filter_map(|op| match &op.kind {
                OpKind::Collective(c) => match c.purpose {
                    CollPurpose::Cp { phase, mb: 0, layer: 0, step, .. } => Some((phase, step, c.kind, c.bytes)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    };
    use CollKind::*;
    use Phase::*;
    assert_eq!(
        colls(&toy(2, CpComm::AllGather, "")),
        vec![
            (Forward, 0, AllGather, 2 * kv),
            (BackwardInput, 0, AllGather, 2 * kv),
            (BackwardInput, 1, ReduceScatter, 2 * kv)
        ]
    );
    // Q, K, V: b · (s/cp) · (h + 2kv)/t · e; the output b · (s/cp) · h/t · e.
    let (qkv, out) = (2 * 16 * 48 * 4u64, 2 * 16 * 16 * 4u64);
    assert_eq!(
        colls(&toy(2, CpComm::Ulysses, "")),
        vec![
            (Forward, 0, AllToAll, qkv),
            (Forward, 1, AllToAll, out),
            (BackwardInput, 1, AllToAll, out),
            (BackwardInput, 0, AllToAll, qkv)
        ]
    );
}

/// Every other piece and message works on s/cp tokens: the pipeline message halves with
/// cp = 2, and the data-parallel group (cp · dp ranks) shards ZeRO state as dp · cp would.
#[test]
fn tokens_shrink_by_cp_and_zero_shards_over_cp_dp() {
    let msg = |s: &Scenario| {
        let plan = lower(s).unwrap();
        plan.programs[0]
            .ops
            .iter()
            .find_map(|op| match &op.kind {
                OpKind::Send(p) => Some(p.bytes),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(msg(&toy(2, CpComm::Ring, "")) * 2, msg(&toy(1, CpComm::Ring, "")));
    let optim = |cp: u32, dp: u32| {
        let s = scenario(&format!(
            "[model]\nfamily = \"gpt\"\nlayers = 4\nhidden = 32\nheads = 8\nffn_hidden = 64\nvocab = 32\nseq_len = 32\n\
             [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
             [parallel]\ncp = {cp}\ndp = {dp}\nmicro_batch = 1\nglobal_batch = {dp}\nzero = 1\n",
            cp * dp
        ));
        let plan = lower(&s).unwrap();
        let bytes: Vec<u64> = plan.programs[0]
            .ops
            .iter()
            .filter_map(|op| match &op.kind {
                OpKind::Alloc(a) if a.class == BufClass::OptimizerState => Some(a.bytes),
                _ => None,
            })
            .collect();
        (bytes, plan.grid.group_size(GroupKind::Dp))
    };
    let (cp2, group) = optim(2, 2);
    assert_eq!(group, 4);
    assert_eq!(cp2, optim(1, 4).0);
}

/// The Alloc/Free peak of a context-parallel plan agrees with the analytic memory within
/// 3% (as for cp = 1, models/tests/plan.rs), every variant.
#[test]
fn alloc_free_peak_agrees_with_the_analytic_model_under_cp() {
    for comm in CpComm::ALL {
        for (cp, rc) in [(1, Recompute::Full), (2, Recompute::Selective), (4, Recompute::None), (2, Recompute::Full)] {
            // Ulysses needs kv heads / tp divisible by cp: tp 2 leaves 4 of Llama's 8.
            let tp = if comm == CpComm::Ulysses { 2 } else { 8 };
            let text = format!(
                "[model]\npreset = \"llama3-70b\"\nseq_len = 8192\n[cluster]\npreset = \"dgx-h100\"\nnodes = {}\n[parallel]\ntp = {tp}\ncp = {cp}\ncp_comm = \"{}\"\npp = 4\ndp = 2\nschedule = \"1f1b\"\nglobal_batch = 16\nzero = 1\nrecompute = \"{}\"\nsequence_parallel = true\n[training]\nframework = \"strata\"\nflash_attention = true\n",
                tp * cp * 4 * 2 / 8,
                comm.key(),
                rc.key()
            );
            let s = scenario(&text);
            let plan = lower(&s).unwrap();
            verify(&plan).unwrap();
            let analytic = stage_memory(&s);
            for (stage, (program, mem)) in plan.programs.iter().zip(&analytic).enumerate() {
                let ours = program_order_peak(program) as f64;
                let theirs = mem.total_bytes();
                let err = (ours / theirs - 1.0).abs();
                assert!(err < 0.03, "{comm:?} cp {cp} {rc:?} stage {stage}: plan {ours:.4e} vs {theirs:.4e}");
            }
        }
    }
}

#[test]
fn impossible_cp_splits_are_refused_naming_the_rule() {
    let err = |cp: u32, comm: &str, extra: &str| {
        let text = format!(
            "[model]\nfamily = \"gpt\"\nlayers = 4\nhidden = 32\nheads = 4\nffn_hidden = 64\nvocab = 32\nseq_len = 12\n\
             [cluster]\npreset = \"cpu-local\"\ngpus_per_node = {cp}\n\
             [parallel]\ncp = {cp}\ncp_comm = \"{comm}\"\nglobal_batch = 1\n{extra}"
        );
        match Scenario::from_toml(&text, "cp", "cp", &[]) {
            Err(e) => e.to_string(),
            Ok(s) => lower(&s).err().map(|e| e.to_string()).unwrap_or_default(),
        }
    };
    assert!(err(4, "ring", "").contains("seq_len = 12"), "{}", err(4, "ring", ""));
    let e = err(8, "ulysses", "");
    assert!(e.contains("heads"), "{e}");
    let e = err(2, "all-gather", "recompute = \"selective\"\n[training]\nflash_attention = false\n");
    assert!(e.contains("flash_attention"), "{e}");
}

/// Fused or not, a context-parallel layer saves each row's log-sum-exp and never the
/// attention probabilities (its block attention recomputes them in the backward, as the CPU
/// executor's does): the plan's buffers and the analytic memory are the fused layer's, and
/// the hardware FLOPs count the recomputed QKᵀ. A dense unfused layer still saves them.
#[test]
fn an_unfused_cp_layer_saves_the_log_sum_exp_and_recomputes_its_scores() {
    let unfused = |s: &Scenario| {
        let text = s.to_toml().replace("flash_attention = true", "flash_attention = false");
        let u = scenario(&text);
        assert!(!u.training.flash_attention, "{text}");
        u
    };
    let peaks = |s: &Scenario| lower(s).unwrap().programs.iter().map(program_order_peak).collect::<Vec<_>>();
    let acts = |s: &Scenario| stage_memory(s).iter().map(|m| m.activations_bytes).collect::<Vec<_>>();
    for comm in CpComm::ALL {
        let fused = toy(2, comm, "");
        let u = unfused(&fused);
        assert_eq!(peaks(&u), peaks(&fused), "{comm:?}");
        assert_eq!(acts(&u), acts(&fused), "{comm:?}");
        assert_eq!(plan_flops(&lower(&u).unwrap()), scenario_step_flops(&u).hardware, "{comm:?}");
        assert_eq!(scenario_step_flops(&u).hardware, scenario_step_flops(&fused).hardware, "{comm:?}");
    }
    let dense = toy(1, CpComm::Ring, "");
    assert!(acts(&unfused(&dense))[0] > acts(&dense)[0]);
}
