//! Llama blocks on the CUDA executor, through the computing host stand-in: the tiny Llama
//! (RMSNorm, SwiGLU with FC1 as [gate | up] per tp rank, half-split RoPE, 4 query heads
//! sharing 2 key/value heads, untied output layer, no biases) trains on one GPU rank as
//! the CPU executor trains it, within the bf16 bound the GPT test uses (`host.rs`) and a
//! tighter one on the first forward pass; its tp2, pp2, dp2 ZeRO-1 and tp2·pp2·dp2 ZeRO-1
//! splits on the shared-GPU communicator give the single rank's losses within the GPT
//! splits' bounds (`tests.rs`); a communicator that forgets to add is caught on the Llama
//! too. Measured (3 steps, seq 16, 8 microbatches of 1): one rank against the CPU
//! executor 3.5e-5 relative (5.3e-6 at step 0); pp2 and dp2 ZeRO-1 bit for bit; tp2 and
//! tp2·pp2·dp2 ZeRO-1 4.7e-7 nats (bound 2e-4); tp2 without the sums 5.3e-2 nats.

use std::sync::Arc;

use strata_models::Scenario;
use strata_models::plan::Plan;

use super::tests::{LOSS_TOL_NATS, STEPS, TP_LOSS_TOL_NATS, opts, plan_of, plan_on, run_plan, worst};
use crate::cuda::exec::host::HostDevice;
use crate::cuda::exec::rank::{GpuExecError, GpuRank, check_plan};
use crate::cuda::exec::train::train_on;
use crate::exec::ExecConfig;

/// The GPU rank's losses against the CPU executor's, relative: the GPT test's bound
/// (`host.rs`: bf16 storage moves the curve by rounding only). Measured: 3.5e-5.
const REL_TOL: f64 = 1e-3;

/// The same at step 0, the first forward pass before any update, where only the bf16
/// rounding of weights and activations separates the two (measured: 5.3e-6). The bound
/// above alone does not see a SwiGLU that reads [up | gate] (measured by hand: 1.35e-4 over
/// the three steps, since gate and up start as draws of one distribution); this one does
/// (9.0e-5 at step 0, 4.5× over). Key/value heads shared as h mod kv instead of h / group:
/// 8.2e-4 at step 0, 1.25e-3 over the steps (both bounds fail).
const FIRST_REL_TOL: f64 = 2e-5;

const TEXT: &str = include_str!("../../../../../scenarios/tiny-llama-cpu.toml");

/// The tiny Llama on H200s (bf16, flash attention), one GPU per rank, short sequences.
fn plan(sets: &[&str]) -> Plan {
    plan_of(TEXT, sets)
}

fn losses(sets: &[&str], drop_sums: bool) -> Vec<f64> {
    let p = Arc::new(plan(sets));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let corpus = Arc::new(corpus);
    let r = if p.grid.ranks() == 1 && !drop_sums {
        let rank = GpuRank::with_device(p.clone(), HostDevice::computing(80 << 30), corpus, ExecConfig::default())
            .unwrap_or_else(|e| panic!("{e}"));
        train_on(p, rank, &opts(), None).unwrap_or_else(|e| panic!("{e}")).0
    } else {
        run_plan(plan(sets), drop_sums)
    };
    r.steps.iter().map(|s| s.loss).collect()
}

/// The CPU executor's losses for the same model and data, fp32 on CPU ranks.
fn cpu_losses() -> Vec<f64> {
    let p = Arc::new(plan_on(TEXT, &[], true));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let r = crate::train::train_threads(p, Arc::new(corpus), &opts(), None).unwrap_or_else(|e| panic!("{e}"));
    r.steps.iter().map(|s| s.loss).collect()
}

#[test]
fn the_plan_is_a_llama_with_grouped_query_attention_and_no_biases() {
    let p = plan(&[]);
    let m = &p.scenario.model;
    assert_eq!((m.family, m.heads, m.kv_heads), (strata_models::Family::Llama, 4, 2));
    check_plan(&p).unwrap();
}

#[test]
fn one_gpu_rank_trains_the_tiny_llama_as_the_cpu_executor_does() {
    let gpu = losses(&[], false);
    let cpu = cpu_losses();
    let rel = gpu.iter().zip(&cpu).map(|(g, c)| (g - c).abs() / c.abs()).fold(0.0, f64::max);
    eprintln!(
        "stand-in {gpu:?}\ncpu      {cpu:?}\nworst relative {rel:.3e}, step 0 {:.3e}",
        (gpu[0] - cpu[0]).abs() / cpu[0]
    );
    assert!(rel < REL_TOL, "stand-in {gpu:?} against cpu {cpu:?}: {rel:.3e} relative");
    let first = (gpu[0] - cpu[0]).abs() / cpu[0].abs();
    assert!(first < FIRST_REL_TOL, "step 0: stand-in {} against cpu {}: {first:.3e} relative", gpu[0], cpu[0]);
    assert!(gpu[STEPS as usize - 1] < gpu[0], "the loss falls: {gpu:?}");
}

#[test]
fn llama_splits_on_the_shared_gpu_communicator_match_the_single_rank() {
    let single = losses(&[], false);
    for sets in [
        &["parallel.tp=2"][..],
        &["parallel.pp=2"],
        &["parallel.dp=2", "parallel.zero=1"],
        &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=1"],
    ] {
        let split = losses(sets, false);
        let d = worst(&split, &single);
        let rel = d / single.iter().fold(f64::INFINITY, |m, &x| m.min(x.abs()));
        eprintln!("{sets:?}: {split:?} (single {single:?}), worst {d:.3e} nats ({rel:.3e} relative)");
        let tol = if sets.iter().any(|s| s.starts_with("parallel.tp=")) { TP_LOSS_TOL_NATS } else { LOSS_TOL_NATS };
        assert!(d <= tol, "{sets:?}: {split:?} against the single rank's {single:?} ({d:.3e} nats)");
    }
}

#[test]
fn a_llama_communicator_that_copies_without_adding_is_caught() {
    let single = losses(&[], false);
    let broken = losses(&["parallel.tp=2"], true);
    let d = worst(&broken, &single);
    eprintln!("tp2 without the sums: {broken:?}, worst {d:.3e} nats");
    assert!(d > 10.0 * TP_LOSS_TOL_NATS, "dropping the sums went unnoticed: {d:.3e} nats");
}

#[test]
fn llama_plans_the_gpu_pieces_do_not_run_are_refused_naming_why() {
    let why = |sets: &[&str]| match check_plan(&plan(sets)) {
        Err(GpuExecError::Unsupported(w)) => w,
        other => panic!("{sets:?}: {other:?}"),
    };
    // Sequence parallelism runs (`tests_sp.rs`).
    check_plan(&plan(&["parallel.tp=2", "parallel.sequence_parallel=true"])).unwrap();
    assert!(why(&["model.rope_base=500000.1"]).contains("rope_base"));
    assert!(why(&["model.preset=\"tiny-moe\""]).contains("model.moe"));
}

#[test]
fn the_tiny_llama_device_check_scenario_runs_here_and_on_cpu_with_the_same_weights() {
    let text = include_str!("../../../../../scenarios/tiny-llama-1xh200.toml");
    let lower = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        strata_models::plan::lower(&Scenario::from_toml(text, "tiny", "tiny", &sets).unwrap()).unwrap()
    };
    let gpu = lower(&[]);
    check_plan(&gpu).unwrap();
    let cpu = lower(&["cluster.preset=\"cpu-local\"", "cluster.nics_per_node=0", "training.dtype=\"fp32\""]);
    let (g, c) = (
        crate::cuda::exec::layout::rank_state(&gpu, 0).unwrap(),
        crate::cuda::exec::layout::rank_state(&cpu, 0).unwrap(),
    );
    assert_eq!(g[0].layout.init(0), c[0].layout.init(0), "the same initial weights");
    assert!(g[0].layout.entries().iter().any(|e| e.kind == crate::params::ParamKind::OutW), "an untied output layer");
}

#[test]
fn a_llama_layers_saved_activations_fit_their_block_and_are_compared_with_the_plan() {
    let p = plan(&["model.seq_len=64", "parallel.micro_batch=2"]);
    let c = &crate::cuda::exec::layout::rank_state(&p, 0).unwrap()[0];
    let d = c.layout.dims();
    let dims = crate::cuda::exec::rank::Dims::new(d, 2, 64);
    let (a, bytes) = crate::cuda::exec::pieces::acts(&dims, 0);
    assert!(a.fc1_act + 2 * (dims.t * dims.f) as u64 <= bytes);
    assert_eq!((a.ln1_mean, a.ln2_mean), (0, 0), "RMSNorm keeps no means");
    let predicted = p.program(0).ops.iter().find_map(|o| match &o.kind {
        strata_models::plan::OpKind::Alloc(al) if al.name == "act L0 mb0" => Some(al.bytes),
        _ => None,
    });
    let predicted = predicted.expect("the plan allocates act L0 mb0");
    let ratio = bytes as f64 / predicted as f64;
    eprintln!("executor {bytes} B, plan {predicted} B, ratio {ratio:.3}");
    assert!((0.9..1.1).contains(&ratio), "executor {bytes} B, plan {predicted} B");
}

/// The tiny Llama (its own output layer, no tied table) under pp2·dp2 ZeRO-3 with
/// the plan's prefetching gathers (`overlap_param_gather`: the next unit's gather issued
/// during this one's backward) and tp2·dp2 ZeRO-2: the single rank's losses.
#[test]
fn the_tiny_llama_trains_under_zero_2_and_3_as_the_single_rank_does() {
    let single = losses(&[], false);
    for sets in [
        &["parallel.pp=2", "parallel.dp=2", "parallel.zero=3", "parallel.overlap_param_gather=true"][..],
        &["parallel.tp=2", "parallel.dp=2", "parallel.zero=2"],
    ] {
        let sets: Vec<&str> = sets.iter().copied().chain(["training.framework=\"strata\""]).collect();
        let split = losses(&sets, false);
        let d = worst(&split, &single);
        eprintln!("{sets:?}: {split:?} (single {single:?}), worst {d:.3e} nats");
        let tol = if sets.iter().any(|s| s.starts_with("parallel.tp=")) { TP_LOSS_TOL_NATS } else { LOSS_TOL_NATS };
        assert!(d <= tol, "{sets:?}: {split:?} against the single rank's {single:?} ({d:.3e} nats)");
    }
}
