//! The engine end to end: determinism, symmetric mode against full mode, the memory
//! verdict, and plans that cannot run.

mod common;

use strata_models::plan::{OpKind, lower};
use strata_sim::net::ClosedFormNetwork;
use strata_sim::net::NcclEnv;
use strata_sim::{Mode, SimError, SimOptions, simulate, simulate_with};

/// A small GPT on 2 nodes of DGX A100: tp 2, dp 2, pp 4, ZeRO-1, sequence parallel,
/// selective recompute.
/// A small GPT on two DGX A100 nodes, with unfused attention: Korthikanti's hardware-FLOP
/// count (selective recomputation re-runs the attention core) is what the plan executes.
fn small(schedule: &str, vpp: u32) -> String {
    format!(
        "name = \"small\"\n[model]\nfamily = \"gpt\"\nlayers = 16\nhidden = 1024\nheads = 16\nvocab = 4096\nseq_len = 512\n[cluster]\npreset = \"dgx-a100\"\nnodes = 2\n\
         [parallel]\ntp = 2\npp = 4\ndp = 2\nvpp = {vpp}\nschedule = \"{schedule}\"\nmicro_batch = 2\nglobal_batch = 32\n\
         zero = 1\nrecompute = \"selective\"\nsequence_parallel = true\n\
         [training]\nflash_attention = false\n"
    )
}

fn json_hash(report: &strata_sim::SimReport) -> (u64, u64) {
    let r = serde_json::to_vec(report).unwrap();
    let t = serde_json::to_vec(report.trace.as_ref().unwrap()).unwrap();
    (common::fnv1a(&r), common::fnv1a(&t))
}

#[test]
fn same_plan_and_seed_give_byte_identical_report_and_trace() {
    let plan = common::plan(&small("1f1b", 1));
    let opts = SimOptions { trace: true, seed: 42, jitter: 0.05, ..SimOptions::default() };
    let a = simulate(&plan, &opts).unwrap();
    let b = simulate(&plan, &opts).unwrap();
    assert_eq!(json_hash(&a), json_hash(&b));
    assert_eq!(a.seed, 42);
    assert_eq!(a.trace.as_ref().unwrap().seed, 42);
    // The seed matters: another one draws other jitter.
    let c = simulate(&plan, &SimOptions { seed: 43, ..opts.clone() }).unwrap();
    assert_ne!(json_hash(&a).1, json_hash(&c).1);
    // The report carries the keys scripts read.
    let v: serde_json::Value = serde_json::to_value(&a).unwrap();
    for key in [
        "step_time_s",
        "tokens_per_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "breakdown_s",
        "peak_memory_bytes",
        "fits",
        "seed",
    ] {
        assert!(v.get(key).is_some(), "report lacks {key}");
    }
    for key in ["compute", "tp_exposed", "dp_exposed", "pp_exposed", "bubble", "optimizer"] {
        assert!(v["breakdown_s"].get(key).is_some(), "breakdown lacks {key}");
    }
}

#[test]
fn breakdown_sums_to_the_step_and_hardware_flops_are_the_plans() {
    let plan = common::plan(&small("interleaved", 2));
    let r = simulate(&plan, &SimOptions::default()).unwrap();
    assert!((r.breakdown_s.total() - r.step_time_s).abs() < 1e-9, "{:?} vs {}", r.breakdown_s, r.step_time_s);
    let s = &plan.scenario;
    let f =
        strata_models::accounting::flops::step_flops(&s.model, s.parallel.global_batch as u64, s.parallel.recompute);
    let executed = r.hardware_tflops_per_gpu * 1e12 * r.step_time_s * r.gpus as f64;
    assert!((executed / f.hardware - 1.0).abs() < 1e-9, "{executed} vs {}", f.hardware);
    let model = r.model_tflops_per_gpu * 1e12 * r.step_time_s * r.gpus as f64;
    assert!((model / f.model - 1.0).abs() < 1e-9);
    assert!(r.mfu > 0.0 && r.mfu < r.hfu && r.hfu < 1.0, "mfu {} hfu {}", r.mfu, r.hfu);
    assert_eq!(r.peak_memory_bytes.len(), 4);
    assert!(r.fits);
}

#[test]
fn symmetric_and_full_modes_agree_on_small_plans() {
    for (schedule, vpp) in [("1f1b", 1), ("interleaved", 2), ("gpipe", 1), ("zb-h1", 1), ("zb-h2", 1)] {
        let plan = common::plan(&small(schedule, vpp));
        let run = |mode| {
            let mut net = ClosedFormNetwork::new(&plan.scenario.cluster, NcclEnv::default()).unwrap();
            simulate_with(&plan, &SimOptions { mode, ..SimOptions::default() }, &mut net).unwrap()
        };
        let sym = run(Mode::Symmetric);
        let full = run(Mode::Full);
        assert_eq!(sym.mode, Mode::Symmetric);
        assert_eq!(full.mode, Mode::Full);
        assert_eq!(sym.step_time_s, full.step_time_s, "{schedule}");
        assert_eq!(sym.breakdown_s, full.breakdown_s, "{schedule}");
        assert_eq!(sym.peak_memory_bytes, full.peak_memory_bytes, "{schedule}");
        assert_eq!(sym.hardware_tflops_per_gpu, full.hardware_tflops_per_gpu, "{schedule}");
        assert!(full.events > sym.events, "{schedule}: full mode runs every rank");
    }
}

#[test]
fn a_plan_that_does_not_fit_names_the_stage_and_the_bytes_over() {
    // GPT-3 175B on one node without ZeRO: ~22 B parameters per GPU at 16 bytes each.
    let plan = common::plan(
        "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\n\
         [parallel]\ntp = 8\npp = 1\nmicro_batch = 1\nglobal_batch = 2\nrecompute = \"full\"\n",
    );
    let r = simulate(&plan, &SimOptions::default()).unwrap();
    assert!(!r.fits);
    assert_eq!(r.out_of_memory.len(), 1);
    let oom = &r.out_of_memory[0];
    assert_eq!(oom.stage, 0);
    assert_eq!(oom.capacity_bytes, plan.scenario.cluster.gpu.spec().hbm_bytes);
    assert_eq!(oom.over_bytes, oom.peak_bytes - oom.capacity_bytes);
    // At least the model states: 16 bytes per parameter of the rank.
    let params =
        strata_models::accounting::params::stage_params(&plan.scenario.model, &plan.scenario.parallel)[0].per_rank();
    assert!(oom.peak_bytes >= 16 * params, "{} < {}", oom.peak_bytes, 16 * params);
    assert_eq!(r.peak_memory_bytes, vec![oom.peak_bytes]);
    // The timing is still reported.
    assert!(r.step_time_s > 0.0);
}

#[test]
fn a_receive_without_its_send_is_an_error_not_a_panic() {
    let mut plan = common::plan(&small("1f1b", 1));
    let program = plan.program_of_rank_mut(2);
    let recv = program.ops.iter_mut().find(|o| matches!(o.kind, OpKind::Recv(_))).unwrap();
    if let OpKind::Recv(p) = &mut recv.kind {
        p.mb += 1000;
    }
    let e = simulate(&plan, &SimOptions::default()).unwrap_err();
    assert!(matches!(e, SimError::InvalidPlan { .. }), "{e}");
    assert!(e.to_string().contains("no matching send"), "{e}");
}

#[test]
fn a_collective_one_member_skips_is_a_deadlock() {
    let mut plan = lower(&common::scenario(&small("1f1b", 1))).unwrap();
    // Rank 1 turns its first tensor-parallel collective into a data-parallel one: rank 0
    // waits for a partner that never comes.
    let program = plan.program_of_rank_mut(1);
    let op = program
        .ops
        .iter_mut()
        .find(|o| matches!(&o.kind, OpKind::Collective(c) if c.group == strata_models::plan::GroupKind::Tp))
        .unwrap();
    if let OpKind::Collective(c) = &mut op.kind {
        c.group = strata_models::plan::GroupKind::Embedding;
    }
    let e = simulate(&plan, &SimOptions::default()).unwrap_err();
    assert!(matches!(e, SimError::Deadlock { .. }), "{e}");
    assert!(e.to_string().contains("waits at"), "{e}");
}

#[test]
fn compute_slows_down_while_a_data_parallel_transfer_runs_beside_it() {
    // Gradient buckets reduce on the dp stream while the backward goes on; with a slowdown
    // of 1.5 the overlapped compute stretches, by at most half the overlapped transfer time.
    let plan = common::plan(&small("1f1b", 1));
    let coll_ns = 200_000;
    let dp_colls = plan.programs[0]
        .ops
        .iter()
        .filter(|o| matches!(&o.kind, OpKind::Collective(c) if c.group == strata_models::plan::GroupKind::Dp))
        .count() as f64;
    let run = |dp_slowdown: f64| {
        let mut profile = strata_sim::HardwareProfile::builtin(strata_models::GpuKind::A100_80gb);
        profile.overlap = strata_sim::profile::OverlapParams { tp_slowdown: 1.0, dp_slowdown, pp_slowdown: 1.0 };
        let timer = strata_sim::simulate::ProfileTimer::new(&profile, &plan);
        let mut net = common::FixedNetwork::new(coll_ns, 0);
        let opts = SimOptions::default();
        strata_sim::simulate::simulate_timed(&plan, &opts, &mut net, &timer, &profile).unwrap().step_time_s
    };
    let (plain, slowed) = (run(1.0), run(1.5));
    assert!(slowed > plain, "{slowed} vs {plain}");
    assert!(slowed - plain <= 0.5 * dp_colls * coll_ns as f64 * 1e-9 + 1e-9, "{slowed} vs {plain}");
}

#[test]
fn simulated_buffer_peaks_match_the_analytic_memory_model() {
    // The Alloc/Free timeline's peak per stage against models' closed forms (ZeRO model
    // states, Korthikanti activations × microbatches in flight): GPT-3 175B, 1F1B.
    let plan = common::plan(
        "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = 128\n\
         [parallel]\ntp = 8\npp = 8\ndp = 16\nschedule = \"1f1b\"\nmicro_batch = 1\nglobal_batch = 1536\n\
         zero = 1\nrecompute = \"selective\"\nsequence_parallel = true\n",
    );
    let r = simulate(&plan, &SimOptions::default()).unwrap();
    let analytic = strata_models::accounting::memory::stage_memory(&plan.scenario);
    for (m, a) in r.memory.iter().zip(&analytic) {
        let err = m.buffers_bytes as f64 / a.total_bytes() - 1.0;
        assert!(err.abs() < 0.01, "stage {}: simulated {} B, analytic {} B", m.stage, m.buffers_bytes, a.total_bytes());
        assert!(m.peak_bytes > m.buffers_bytes + m.cuda_context_bytes, "overheads are added");
    }
}
