//! The search's expert-parallel, context-parallel and fp8 dimensions: enumerated only where
//! they can matter, within their rules, and costed by the screening estimate (router
//! imbalance, the all-to-alls, the K/V exchange, the fp8 rate).
//!
//! The models are built here (`[model.moe]` on a Llama preset) until `moe-models` adds the
//! MoE presets. MERGE: switch `mixtral()` to `preset = "mixtral-8x7b"` and add the Mixtral
//! 8x7B search on 64 H100 (a simulated winner) once the MoE lowering lands.

use strata_models::{Dtype, Scenario};
use strata_sim::HardwareProfile;
use strata_sim::compute::ComputeModel;
use strata_sim::search::estimate::Estimator;
use strata_sim::search::{SearchSpace, enumerate};

fn scenario(text: &str) -> Scenario {
    Scenario::from_toml(text, "test", "test", &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// Mixtral 8x7B's shapes (Megatron-LM examples/mixtral) on `nodes` DGX H100.
fn mixtral(nodes: u32, seq: u32, extra: &str) -> Scenario {
    scenario(&format!(
        r#"
[model]
preset = "llama3-8b"
vocab = 32000
seq_len = {seq}
[model.moe]
experts = 8
top_k = 2
expert_ffn_hidden = 14336
{extra}
[cluster]
preset = "dgx-h100"
nodes = {nodes}
[parallel]
tp = 8
sequence_parallel = true
global_batch = 256
"#
    ))
}

fn estimate(s: &Scenario) -> f64 {
    let profile = HardwareProfile::builtin(s.cluster.gpu);
    let mut est = Estimator::new(s, ComputeModel::new(&profile, s.training.storage_dtype()), &profile).unwrap();
    est.step_s(s)
}

#[test]
fn expert_parallelism_is_searched_only_for_experts_and_within_its_rules() {
    let base = mixtral(8, 4096, "");
    let space = SearchSpace::splits(&base);
    assert_eq!(space.ep, vec![1, 2, 4, 8]);
    assert_eq!(space.cp, vec![1], "4,096 tokens: no context parallelism");
    assert_eq!(space.fp8, vec![false], "bf16 asked: no fp8");
    let e = enumerate(&base, &space);
    assert!(e.valid.iter().any(|s| s.parallel.ep == 8) && e.valid.iter().any(|s| s.parallel.ep == 1));
    for s in &e.valid {
        let p = &s.parallel;
        assert!(8 % p.ep == 0 && (p.tp * p.cp * p.dp) % p.ep == 0, "{p:?}");
        assert_eq!(p.ep > 1, strata_sim::search::label(p).contains(" ep"), "{}", strata_sim::search::label(p));
    }
    // A dense model keeps ep = 1 and its space.
    let dense = scenario(
        "[model]\npreset = \"llama3-8b\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 8\n[parallel]\ntp = 8\nglobal_batch = 256\n",
    );
    assert_eq!(SearchSpace::splits(&dense).ep, vec![1]);
}

#[test]
fn context_parallelism_is_searched_for_long_sequences_only() {
    let base = mixtral(8, 32768, "");
    let space = SearchSpace::splits(&base);
    assert_eq!(space.cp, vec![1, 2, 4, 8], "each rank keeps ≥ 4,096 of 32,768 tokens");
    let e = enumerate(&base, &space);
    let with_cp: Vec<&Scenario> = e.valid.iter().filter(|s| s.parallel.cp > 1).collect();
    assert!(!with_cp.is_empty());
    for s in &with_cp {
        let p = &s.parallel;
        assert_eq!(p.ranks(), 64, "{p:?}");
        // Ulysses shards 32 heads and 8 kv heads over tp·cp.
        if p.cp_comm == strata_models::parallel::CpComm::Ulysses {
            assert!(8 % (p.tp * p.cp) == 0, "{p:?}");
        }
    }
    assert!(e.invalid.get("ulysses-divides-heads").is_some_and(|n| *n > 0), "{:?}", e.invalid);
}

#[test]
fn fp8_is_searched_where_asked_and_the_gpu_has_it() {
    let mut base = mixtral(8, 4096, "");
    base.training.dtype = Dtype::Fp8;
    let space = SearchSpace::splits(&base);
    assert_eq!(space.fp8, vec![false, true]);
    let e = enumerate(&base, &space);
    let fp8 = e.valid.iter().filter(|s| s.training.dtype == Dtype::Fp8).count();
    assert!(fp8 > 0 && fp8 * 2 == e.valid.len(), "{fp8} of {}", e.valid.len());
    base.cluster.gpu = strata_models::GpuKind::A100_80gb;
    assert_eq!(SearchSpace::splits(&base).fp8, vec![false], "an A100 has no fp8 tensor cores");
}

#[test]
fn the_estimate_costs_experts_imbalance_exchange_and_fp8() {
    // Router imbalance: the most loaded EP rank sets the pace of the experts and all-to-alls.
    let ep8 = |skew: &str| {
        let mut s = mixtral(8, 4096, skew);
        s.parallel.tp = 1;
        s.parallel.dp = 64;
        s.parallel.ep = 8;
        s
    };
    let balanced = estimate(&ep8("skew = 0.0"));
    let skewed = estimate(&ep8("skew = 0.3"));
    let default = estimate(&ep8(""));
    assert!(balanced < default && default < skewed, "{balanced} {default} {skewed}");
    // Top-2 of 8 experts: the MoE step costs more than the dense model with one expert's
    // MLP, less than one with all eight (active parameters, not total).
    let dense = |ffn: u32| {
        let mut s = ep8("skew = 0.0");
        s.model.moe = None;
        s.model.ffn_hidden = ffn;
        s.parallel.ep = 1;
        estimate(&s)
    };
    assert!(dense(14336) < balanced && balanced < dense(8 * 14336), "{} {balanced} {}", dense(14336), dense(8 * 14336));
    // fp8 linear layers run faster on an H100.
    let mut fp8 = ep8("skew = 0.0");
    fp8.training.dtype = Dtype::Fp8;
    assert!(estimate(&fp8) < balanced);
    // Context parallelism: a ring's exchange hides under attention at long sequences, an
    // all-gather's does not.
    let cp = |comm: &str, cp: u32| {
        let mut s = mixtral(8, 32768, "skew = 0.0");
        s.parallel.dp = 8 / cp;
        s.parallel.cp = cp;
        s.parallel.cp_comm = match comm {
            "ring" => strata_models::parallel::CpComm::Ring,
            _ => strata_models::parallel::CpComm::AllGather,
        };
        s.parallel.global_batch = 16 / cp;
        estimate(&s)
    };
    assert!(cp("ring", 2) <= cp("all-gather", 2), "{} {}", cp("ring", 2), cp("all-gather", 2));
}

#[test]
fn the_all_to_all_overlap_is_searched_where_ep_is_and_the_framework_runs_it() {
    let mut base = mixtral(8, 4096, "");
    base.training.framework = strata_models::Framework::Megatron;
    let space = SearchSpace::splits(&base);
    assert_eq!(space.moe_a2a_overlap, vec![false, true]);
    let e = enumerate(&base, &space);
    let on: Vec<_> = e.valid.iter().filter(|s| s.parallel.moe_a2a_overlap).collect();
    assert!(!on.is_empty());
    for s in &on {
        let p = &s.parallel;
        // Only with expert parallelism; under Megatron-LM a pipeline only interleaved, and no
        // full recomputation (megatron-core's asserts).
        assert!(p.ep > 1, "{p:?}");
        assert!(p.pp == 1 || p.schedule.chunked(), "{p:?}");
        assert!(p.recompute != strata_models::parallel::Recompute::Full, "{p:?}");
        assert!(strata_sim::search::label(p).contains(" a2a-overlap"));
    }
    assert!(e.unrunnable.get("megatron-a2a-overlap").copied().unwrap_or(0) > 0, "{:?}", e.unrunnable);
    // Strata's executor runs it on any schedule, but the search tries it only where the
    // schedule keeps its pace with merged passes (not 1F1B or ZB-H1 with a pipeline).
    let mut strata = base.clone();
    strata.training.framework = strata_models::Framework::Strata;
    let e = enumerate(&strata, &SearchSpace::splits(&strata));
    let on: Vec<_> = e.valid.iter().map(|s| &s.parallel).filter(|p| p.moe_a2a_overlap).collect();
    assert!(on.iter().any(|p| p.pp > 1 && p.schedule == strata_models::parallel::Schedule::ZbH2), "ZB-H2 keeps pace");
    for p in on {
        assert!(p.schedule.merge_keeps_pace(p.pp, p.vpp, p.microbatches()), "{p:?}");
    }
    // The estimate hides the all-to-alls under the merged passes' compute.
    let mut s = mixtral(8, 4096, "skew = 0.0");
    s.parallel.tp = 1;
    s.parallel.dp = 64;
    s.parallel.ep = 8;
    s.parallel.sequence_parallel = false;
    let plain = estimate(&s);
    s.parallel.moe_a2a_overlap = true;
    let hidden = estimate(&s);
    assert!(hidden < plain, "{hidden} vs {plain}");
    // A dense model has nothing to overlap.
    let dense = scenario(
        "[model]\npreset = \"llama3-8b\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 8\n[parallel]\ntp = 8\nglobal_batch = 256\n",
    );
    assert_eq!(SearchSpace::splits(&dense).moe_a2a_overlap, vec![false]);
}
