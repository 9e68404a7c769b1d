//! Sequence parallelism on the shared-GPU driver, through the computing host stand-in: a
//! tp2 tiny GPT and a tp2 tiny Llama with `sequence_parallel = true` train as the single
//! rank does (the tensor-parallel bound) and as the CPU executor's own sequence-parallel
//! run does (the bf16 bound of `host.rs`); so does a tp2·pp2 split, whose pipeline
//! messages are the residual's sequence shards; a rank holds less than under tp alone, as
//! the plan predicts; and leaving the replicated tensors' gradients unsummed over the tp
//! group (Megatron-LM's sequence-parallel norm-gradient all-reduce), or the collectives'
//! additions, is caught.
//!
//! Measured (3 steps, seq 16, 8 microbatches of 1): tp2 GPT 5.4e-5 nats from the single
//! rank (tp alone's gap: the same fp32 sums in the same order), Llama 4.7e-7 (bound 2e-4);
//! against the CPU executor's sequence-parallel run 5.2e-5 and 3.5e-5 relative (bound
//! 1e-3); tp2·pp2 5.4e-5; full recomputation and tp2·dp2 ZeRO-3 2.3e-5 over 2 steps. Rank
//! 0's activations 97,280 → 78,848 B measured (103,936 → 80,896 B predicted), the pool's
//! high-water mark 9.7 kB lower; GPT-2 124M's `act L0 mb0` 0.94× the plan's. Without the
//! norm-gradient sum: 3.1e-3 nats after one step (15× the bound); without additions
//! 2.2e-2 at the first forward.

use std::sync::Arc;

use strata_models::plan::Plan;

use super::MultiGpu;
use super::tests::{STEPS, TP_LOSS_TOL_NATS, opts, plan_of, worst};
use crate::cuda::exec::host::HostDevice;
use crate::cuda::exec::rank::check_plan;
use crate::cuda::exec::train::train_multi;
use crate::exec::{ExecConfig, MemoryPeaks};
use crate::train::TrainOptions;

const GPT: &str = include_str!("../../../../../scenarios/tiny-gpt-cpu.toml");
const LLAMA: &str = include_str!("../../../../../scenarios/tiny-llama-cpu.toml");
const SP: &str = "parallel.sequence_parallel=true";

/// The GPU's losses against the CPU executor's (fp32), relative: `host.rs`'s bound.
const CPU_REL_TOL: f64 = 1e-3;

/// What a mutation must move the losses by to be caught: ten times the tensor-parallel bound.
const CAUGHT_NATS: f64 = 10.0 * TP_LOSS_TOL_NATS;

/// A mutation of the shared-GPU driver.
#[derive(Clone, Copy, PartialEq)]
enum Broken {
    None,
    /// The collectives copy without adding.
    Sums,
    /// The replicated gradients are not summed over tp.
    SpGrads,
}

/// Every step's loss and rank 0's peaks, every rank of `text` laid over by `sets` on one
/// computing stand-in.
fn run(text: &str, sets: &[&str], broken: Broken, o: &TrainOptions) -> (Vec<f64>, MemoryPeaks) {
    let p = Arc::new(plan_of(text, sets));
    check_plan(&p).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let first = HostDevice::computing(80 << 30);
    let devices: Vec<HostDevice> = (0..p.grid.ranks()).map(|_| first.sibling()).collect();
    let mut multi =
        MultiGpu::new(p.clone(), devices, Arc::new(corpus), ExecConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    multi.drop_sums = broken == Broken::Sums;
    multi.skip_sp_grads = broken == Broken::SpGrads;
    let (r, _) = train_multi(p, multi, o, None).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
    (r.steps.iter().map(|s| s.loss).collect(), r.memory[0].peaks.clone())
}

fn losses(text: &str, sets: &[&str], broken: Broken) -> Vec<f64> {
    run(text, sets, broken, &opts()).0
}

/// The CPU executor's losses for the same model, data and split, fp32 on CPU ranks.
fn cpu_losses(text: &str, sets: &[&str]) -> Vec<f64> {
    let mut all = vec!["cluster.preset=\"cpu-local\"", "cluster.nics_per_node=0", "training.dtype=\"fp32\""];
    all.extend_from_slice(sets);
    let p: Arc<Plan> = Arc::new(plan_of(text, &all));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let r = crate::train::train_threads(p, Arc::new(corpus), &opts(), None).unwrap_or_else(|e| panic!("{e}"));
    r.steps.iter().map(|s| s.loss).collect()
}

fn worst_rel(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs()).fold(0.0, f64::max)
}

/// tp2 with sequence parallelism: the single rank's losses within the tensor-parallel
/// bound, the CPU executor's sequence-parallel run's within the bf16 one.
fn tp2_sequence_parallel_trains_as_the_single_rank_and_the_cpu_executor(name: &str, text: &str) {
    let single = losses(text, &[], Broken::None);
    let sets = ["parallel.tp=2", SP];
    let sp = losses(text, &sets, Broken::None);
    let cpu = cpu_losses(text, &sets);
    let (d, rel) = (worst(&sp, &single), worst_rel(&sp, &cpu));
    eprintln!("{name} tp2 sp: {sp:?}\n  single {single:?}: worst {d:.3e} nats\n  cpu sp {cpu:?}: {rel:.3e} relative");
    assert_eq!(sp.len(), STEPS as usize);
    assert!(d <= TP_LOSS_TOL_NATS, "{name}: {sp:?} against the single rank's {single:?} ({d:.3e} nats)");
    assert!(rel <= CPU_REL_TOL, "{name}: {sp:?} against the CPU executor's {cpu:?} ({rel:.3e})");
    assert!(sp[STEPS as usize - 1] < sp[0], "{name}: the loss falls: {sp:?}");
}

#[test]
fn a_tp2_sequence_parallel_gpt_trains_as_the_single_rank_and_the_cpu_executor() {
    tp2_sequence_parallel_trains_as_the_single_rank_and_the_cpu_executor("gpt", GPT);
}

#[test]
fn a_tp2_sequence_parallel_llama_trains_as_the_single_rank_and_the_cpu_executor() {
    tp2_sequence_parallel_trains_as_the_single_rank_and_the_cpu_executor("llama", LLAMA);
}

/// tp2·pp2 with sequence parallelism: the pipeline messages carry the residual's (and its
/// gradient's) sequence shard; the last stage's final norm joins the replicated sum.
#[test]
fn tp2_pp2_sequence_parallel_trains_as_the_single_rank() {
    let single = losses(GPT, &[], Broken::None);
    let sets = ["parallel.tp=2", "parallel.pp=2", SP];
    let sp = losses(GPT, &sets, Broken::None);
    let d = worst(&sp, &single);
    eprintln!("tp2·pp2 sp: {sp:?} (single {single:?}), worst {d:.3e} nats");
    assert!(d <= TP_LOSS_TOL_NATS, "{sp:?} against the single rank's {single:?} ({d:.3e} nats)");
}

/// The rank's norms and residual stream hold its sequence shard, so it holds less than
/// under tp alone — measured (the pool's high-water mark) as the plan predicts.
#[test]
fn sequence_parallelism_holds_less_than_tensor_parallelism_alone_as_the_plan_predicts() {
    let one = TrainOptions { steps: 1, ..opts() };
    let (_, tp) = run(GPT, &["parallel.tp=2"], Broken::None, &one);
    let (_, sp) = run(GPT, &["parallel.tp=2", SP], Broken::None, &one);
    let act = |p: &MemoryPeaks| p.by_class.get("activations").copied().unwrap_or_default();
    let act_pred = |p: &MemoryPeaks| p.predicted_by_class.get("activations").copied().unwrap_or_default();
    eprintln!(
        "rank 0 measured (pool high-water + context) tp2 {} B, tp2 sp {} B; plan buffers in use {} / {} B; \
         predicted {} / {} B; activations measured {} / {} B, predicted {} / {} B",
        tp.measured_bytes,
        sp.measured_bytes,
        tp.measured_plan_bytes,
        sp.measured_plan_bytes,
        tp.predicted_bytes,
        sp.predicted_bytes,
        act(&tp),
        act(&sp),
        act_pred(&tp),
        act_pred(&sp)
    );
    assert!(sp.predicted_bytes < tp.predicted_bytes, "the plan predicts less under sp: {sp:?} vs {tp:?}");
    assert!(
        sp.measured_bytes < tp.measured_bytes,
        "measured: {} B under sp, {} B without",
        sp.measured_bytes,
        tp.measured_bytes
    );
    assert!(act(&sp) < act(&tp) && act_pred(&sp) < act_pred(&tp), "the activations shrink: {sp:?} vs {tp:?}");
}

/// Each tp rank's norm gradients come from its own tokens: without their sum over the
/// group the ranks step on half-sums (and their copies of the norms drift apart), which
/// the loss shows after the first step; the reduce-scatters and gathers without their
/// additions are caught at the first forward.
#[test]
fn unsummed_norm_gradients_and_additions_under_sequence_parallelism_are_caught() {
    let sets = ["parallel.tp=2", SP];
    let two = TrainOptions { steps: 2, ..opts() };
    let good = run(GPT, &sets, Broken::None, &two).0;
    let no_grads = run(GPT, &sets, Broken::SpGrads, &two).0;
    let no_sums = run(GPT, &sets, Broken::Sums, &TrainOptions { steps: 1, ..opts() }).0;
    let (dg, ds) = (worst(&no_grads, &good), worst(&no_sums, &good));
    eprintln!("sp without the norm-gradient sum {no_grads:?} ({dg:.3e}), without additions {no_sums:?} ({ds:.3e})");
    assert_eq!(no_grads[0], good[0], "the first forward runs before any optimizer step");
    assert!(dg > CAUGHT_NATS, "skipping the replicated gradients' tp sum went unnoticed: {dg:.3e} nats");
    assert!(ds > CAUGHT_NATS, "dropping the additions went unnoticed: {ds:.3e} nats");
}

/// Sequence parallelism beside full recomputation (the recomputed forward gathers again
/// into the plan's `recompute L mb` block) and beside ZeRO-3 on two replicas (the
/// replicated gradients summed at their places in the gradient shards): the single rank's
/// losses after an optimizer step.
#[test]
fn sequence_parallelism_with_full_recomputation_and_with_zero_3_trains_as_the_single_rank() {
    let two = TrainOptions { steps: 2, ..opts() };
    let single = run(GPT, &[], Broken::None, &two).0;
    for sets in [
        &["parallel.tp=2", SP, "parallel.recompute=\"full\""][..],
        &["parallel.tp=2", "parallel.dp=2", "parallel.zero=3", "training.framework=\"strata\"", SP],
    ] {
        let sp = run(GPT, sets, Broken::None, &two).0;
        let d = worst(&sp, &single);
        eprintln!("{sets:?}: {sp:?} (single {single:?}), worst {d:.3e} nats");
        assert!(d <= TP_LOSS_TOL_NATS, "{sets:?}: {sp:?} against the single rank's {single:?} ({d:.3e} nats)");
    }
}

/// The device check's sequence-parallel step (`xtask/device/check.sh`, `tiny-tp2-sp`): the
/// tiny GPT on H200s at tp 2 with sequence parallelism is a plan this executor runs, and a
/// step of it on the checking stand-in (every launch and address checked) completes.
#[test]
fn the_device_checks_sequence_parallel_split_runs_here() {
    let text = include_str!("../../../../../scenarios/tiny-gpt-1xh200.toml");
    let sets: Vec<String> = ["parallel.tp=2", SP, "cluster.gpus_per_node=2"].iter().map(|s| s.to_string()).collect();
    let s = strata_models::Scenario::from_toml(text, "tiny", "tiny", &sets).unwrap();
    let p = Arc::new(strata_models::plan::lower(&s).unwrap());
    check_plan(&p).unwrap();
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let first = HostDevice::new(80 << 30);
    let devices: Vec<HostDevice> = (0..p.grid.ranks()).map(|_| first.sibling()).collect();
    let mut multi = MultiGpu::new(p.clone(), devices, Arc::new(corpus), ExecConfig::default()).unwrap();
    let reports = multi.step(0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reports.len(), 2);
}

/// A layer's `act L mb` block under sequence parallelism (GPT-2 124M at tp 2, b 8, s 1024):
/// the residual stream's and the norms' tensors on the rank's half of the sequence, the
/// rest whole — within 10 % of the plan's figure for the buffer, as without it
/// (`rank/tests.rs`), and smaller than the block without it.
#[test]
fn a_sequence_parallel_layers_saved_activations_are_compared_with_the_plan() {
    let text = include_str!("../../../../../scenarios/gpt2-124m-1xh200.toml");
    let lower = |sp: bool| {
        // The vocabulary padded to a multiple of 64, as Megatron-LM pads it, so tp 2 divides it.
        let mut sets: Vec<String> =
            ["parallel.tp=2", "cluster.gpus_per_node=2", "model.vocab=50304"].iter().map(|s| s.to_string()).collect();
        sets.extend(sp.then(|| SP.to_string()));
        strata_models::plan::lower(&strata_models::Scenario::from_toml(text, "gpt2", "gpt2", &sets).unwrap()).unwrap()
    };
    let mut blocks = Vec::new();
    for sp in [false, true] {
        let p = lower(sp);
        check_plan(&p).unwrap();
        let c = &crate::cuda::exec::layout::rank_state(&p, 0).unwrap()[0];
        let (b, seq) = (p.scenario.parallel.micro_batch as usize, p.scenario.model.seq_len as usize);
        assert_eq!((b, seq), (8, 1024));
        let mut dims = crate::cuda::exec::rank::Dims::new(c.layout.dims(), b, seq);
        if sp {
            dims.rows = dims.t / 2;
        }
        let (a, bytes) = crate::cuda::exec::pieces::saved_acts(&dims, 0, p.scenario.parallel.recompute);
        assert!(a.m + 2 * (dims.rows * dims.h) as u64 <= bytes && a.fc1_act + 2 * (dims.t * dims.f) as u64 <= bytes);
        let predicted = p.program(0).ops.iter().find_map(|o| match &o.kind {
            strata_models::plan::OpKind::Alloc(al) if al.name == "act L0 mb0" => Some(al.bytes),
            _ => None,
        });
        let predicted = predicted.expect("the plan allocates act L0 mb0");
        let ratio = bytes as f64 / predicted as f64;
        eprintln!("sp {sp}: executor {bytes} B, plan {predicted} B, ratio {ratio:.3}");
        assert!((0.9..1.1).contains(&ratio), "sp {sp}: executor {bytes} B, plan {predicted} B");
        blocks.push((bytes, predicted));
    }
    assert!(blocks[1].0 < blocks[0].0 && blocks[1].1 < blocks[0].1, "{blocks:?}");
}
