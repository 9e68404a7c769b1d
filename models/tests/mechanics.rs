//! Framework mechanics in the lowering: DeepSpeed ZeRO-3 gathers each sub-module's
//! flattened parameters on its own within its prefetch and live-parameter limits and never
//! gathers persistent parameters; torchtitan's FSDP2 reduces one unit per collective;
//! DeepSpeed's PipelineEngine reduces gradients only after the pipeline flush.

use std::collections::BTreeMap;

use proptest::prelude::*;
use strata_models::Scenario;
use strata_models::framework::mechanics::DEEPSPEED_ZERO3;
use strata_models::plan::*;

fn scenario(framework: &str, preset: &str, tp: u32, pp: u32, dp: u32, zero: u8, extra: &str) -> Scenario {
    let text = format!(
        "[model]\npreset = \"{preset}\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = {}\n[parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nglobal_batch = {}\nzero = {zero}\n{extra}\n[training]\nframework = \"{framework}\"\n",
        (tp * pp * dp).div_ceil(8),
        2 * dp * pp,
    );
    Scenario::from_toml(&text, "mech", "mech", &[]).unwrap()
}

/// (layer, mb, phase) → sizes of its ZeRO-3 parameter gathers, in bytes.
fn gathers(plan: &Plan, stage: usize) -> BTreeMap<(u32, u32, Phase), Vec<u64>> {
    let mut out: BTreeMap<(u32, u32, Phase), Vec<u64>> = BTreeMap::new();
    let ops = &plan.programs[stage].ops;
    let names: BTreeMap<BufId, &str> = ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Alloc(a) => Some((a.buf, a.name.as_str())),
            _ => None,
        })
        .collect();
    for op in ops {
        if let OpKind::Collective(c) = &op.kind
            && let CollPurpose::ParamGather { mb, phase, .. } = c.purpose
            && let Some(a) = names.get(&op.bufs[0]).map(|n| n.to_string())
            && let Some(layer) = a.strip_prefix("gathered L").and_then(|r| r.split(' ').next())
        {
            out.entry((layer.parse().unwrap(), mb, phase)).or_default().push(c.bytes);
        }
    }
    out
}

#[test]
fn deepspeed_zero3_gathers_each_module_not_each_layer() {
    let s = scenario("deepspeed", "llama3-8b", 1, 1, 16, 3, "");
    let plan = lower(&s).unwrap();
    verify(&plan).unwrap();
    let (h, kv, f) = (4096u64, 1024u64, 14336u64);
    // q, k, v, o, gate, up, down: each its own all-gather of its bf16 weights; no norm.
    let mut want = vec![h * h, h * kv, h * kv, h * h, h * f, h * f, f * h];
    want.iter_mut().for_each(|w| *w *= 2);
    let g = gathers(&plan, 0);
    assert_eq!(g.len(), 32 * 2 * 2, "every layer, both microbatches, forward and backward");
    for ((layer, mb, phase), sizes) in &g {
        let mut sorted = sizes.clone();
        sorted.sort();
        let mut w = want.clone();
        w.sort();
        assert_eq!(sorted, w, "layer {layer} mb {mb} {phase:?}");
    }
    // Strata's executor gathers the layer as one unit.
    let strata = lower(&scenario("strata", "llama3-8b", 1, 1, 16, 3, "")).unwrap();
    let layer = unit_params(&strata.scenario, Unit::Layer(0)) * 2;
    assert!(gathers(&strata, 0).values().all(|v| v == &vec![layer]));
}

#[test]
fn persistent_parameters_are_never_gathered() {
    // GPT-2 350M: every bias and norm (≤ 4·1024 elements) is under the 1e5 threshold.
    let s = scenario("deepspeed", "gpt2-350m", 1, 1, 8, 3, "");
    let plan = lower(&s).unwrap();
    let h = 1024u64;
    let weights = [3 * h * h, h * h, 4 * h * h, 4 * h * h].map(|w| w * 2);
    let embeddings = [50257 * h * 2, 1024 * h * 2];
    for sizes in gathers(&plan, 0).values() {
        assert!(sizes.iter().all(|b| weights.contains(b)), "{sizes:?}");
    }
    // No gather of the final norm (2h elements), which the plan would label as its unit.
    for op in &plan.programs[0].ops {
        if let OpKind::Collective(c) = &op.kind
            && matches!(c.purpose, CollPurpose::ParamGather { .. })
        {
            assert!(c.bytes > DEEPSPEED_ZERO3.persistence_threshold * 2, "{c:?}");
            assert!(weights.contains(&c.bytes) || embeddings.contains(&c.bytes), "{c:?}");
        }
    }
}

/// Walks the program in order: (most gathered elements alive, largest module, elements
/// left gathered at the end, most elements one fetch gathered between two compute ops).
fn live_gathered(plan: &Plan) -> (u64, u64, u64, u64) {
    let ops = &plan.programs[0].ops;
    let mut live: BTreeMap<BufId, u64> = BTreeMap::new();
    let (mut now, mut peak, mut largest, mut burst, mut most) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for op in ops {
        match &op.kind {
            OpKind::Alloc(a) if a.name.starts_with("gathered L") => {
                let e = a.bytes / 2;
                live.insert(a.buf, e);
                now += e;
                burst += e;
                peak = peak.max(now);
                largest = largest.max(e);
                most = most.max(burst);
            }
            OpKind::Free { buf } => now -= live.remove(buf).unwrap_or(0),
            OpKind::Compute(_) => burst = 0,
            _ => {}
        }
    }
    (peak, largest, now, most)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    /// Whatever the model's shape, DeepSpeed's plan never prefetches past `max_live`
    /// gathered elements, no fetch prefetches more than the
    /// bucket plus the one module the coordinator may overshoot by, and every gather is
    /// released. (Prefetches accumulate across fetches up to `max_live`, as DeepSpeed's
    /// do: a small model ends up wholly gathered under the defaults.)
    #[test]
    fn prefetch_stays_within_the_bucket_and_max_live(
        preset in prop::sample::select(vec!["gpt2-350m", "llama3-8b", "gpt-22b", "llama3-70b"]),
        recompute in prop::sample::select(vec!["none", "selective", "full"]),
    ) {
        let s = scenario("deepspeed", preset, 1, 1, 16, 3, &format!("recompute = \"{recompute}\""));
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap();
        let (peak, largest, left, burst) = live_gathered(&plan);
        let m = DEEPSPEED_ZERO3;
        // Prefetching stops at max_live; only a piece's own on-demand fetch (at most four
        // modules) may go beyond it, as DeepSpeed's fetch of the current module does.
        prop_assert!(peak <= m.max_live + 4 * largest, "peak {peak} over max_live {}", m.max_live);
        // One fetch gathers its piece's modules (at most 4) on demand and prefetches at
        // most the bucket plus the one module the coordinator may overshoot by.
        prop_assert!(burst <= 4 * largest + m.prefetch_bucket + largest, "one fetch gathered {burst}");
        prop_assert_eq!(left, 0);
    }
}

#[test]
fn llama3_70b_zero3_transients_follow_the_prefetch_bucket() {
    // The previous plan gathered whole layers two at a time (≈ 3.4 GB at tp 1); DeepSpeed
    // holds a piece's modules and what the 5e7-element bucket lets it prefetch.
    let s = scenario("deepspeed", "llama3-70b", 1, 1, 64, 3, "micro_batch = 1");
    let plan = lower(&s).unwrap();
    let (peak, largest, _, _) = live_gathered(&plan);
    let gb = peak as f64 * 2.0 / 1e9;
    // The plan runs gate, up and down as one compute op, so that piece holds all three
    // (3 × 235M elements) while it runs, plus the prefetch; DeepSpeed itself would release
    // each after its own forward. Still well under the whole-layer pair (≈ 3.4 GB).
    assert!(gb < 2.2, "{gb:.2} GB gathered at the peak");
    assert_eq!(largest, 8192 * 28672);
    // The analytic model's walk of the same rule over the layers agrees.
    let pieces: Vec<Vec<u64>> = [Piece::Attn, Piece::Mlp]
        .into_iter()
        .map(|p| strata_models::plan::lower::piece_modules(&s.model, 1, p, DEEPSPEED_ZERO3.persistence_threshold))
        .collect();
    assert_eq!(DEEPSPEED_ZERO3.pass_peak(&pieces, 80), peak);
}

#[test]
fn deepspeed_charges_host_time_per_hooked_module() {
    let plan = lower(&scenario("deepspeed", "llama3-8b", 1, 1, 16, 3, "")).unwrap();
    let per = DEEPSPEED_ZERO3.host_ns_per_module;
    let mut seen = BTreeMap::new();
    for op in &plan.programs[0].ops {
        if let OpKind::Compute(c) = &op.kind
            && c.phase == Phase::Forward
        {
            seen.insert(c.piece, plan.host_ns(c.cost));
        }
    }
    assert_eq!(seen[&Piece::Attn], 4 * per, "q, k, v, o");
    assert_eq!(seen[&Piece::Mlp], 3 * per, "gate, up, down");
    assert_eq!(seen[&Piece::AttnIn], 0);
    // Not under ZeRO-1, nor under another framework.
    let z1 = lower(&scenario("deepspeed", "llama3-8b", 1, 1, 16, 1, "")).unwrap();
    assert!(z1.host_ns.is_empty());
}

#[test]
fn fsdp2_reduces_one_unit_per_collective() {
    for zero in [2u8, 3] {
        let s = scenario("torchtitan", "gpt2-350m", 1, 1, 8, zero, "grad_bucket_mb = 1000");
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap();
        assert!(plan.buckets[0].iter().all(|b| b.units.len() == 1), "zero {zero}");
        // One reduce-scatter per unit per microbatch (ZeRO-2/3 reduce every microbatch).
        let rs = plan.programs[0]
            .ops
            .iter()
            .filter(|o| matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::GradBucket { .. })))
            .count();
        assert_eq!(rs, plan.buckets[0].len() * 2, "zero {zero}");
    }
    // Megatron-LM packs the same units into its buckets.
    let m = lower(&scenario("megatron", "gpt2-350m", 1, 1, 8, 1, "grad_bucket_mb = 1000")).unwrap();
    assert!(m.buckets[0].len() < 10, "{}", m.buckets[0].len());
}

#[test]
fn deepspeed_pipeline_reduces_after_the_flush() {
    let s = scenario("deepspeed", "gpt2-350m", 1, 4, 2, 1, "");
    let plan = lower(&s).unwrap();
    verify(&plan).unwrap();
    for (stage, prog) in plan.programs.iter().enumerate() {
        let last_backward = prog
            .ops
            .iter()
            .rposition(
                |o| matches!(&o.kind, OpKind::Compute(c) if c.phase != Phase::Forward && c.piece != Piece::Optimizer),
            )
            .unwrap();
        for (i, o) in prog.ops.iter().enumerate() {
            if let OpKind::Collective(c) = &o.kind
                && matches!(c.purpose, CollPurpose::GradBucket { .. })
            {
                assert!(i > last_backward && o.deps.contains(&(last_backward as OpId)), "stage {stage} op {i}");
            }
        }
    }
    // Megatron-LM overlaps them with the backward.
    let m = lower(&scenario("megatron", "gpt2-350m", 1, 4, 2, 1, "")).unwrap();
    let prog = &m.programs[0];
    let first_rs = prog
        .ops
        .iter()
        .position(|o| matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::GradBucket { .. })))
        .unwrap();
    let last_bwd = prog
        .ops
        .iter()
        .rposition(
            |o| matches!(&o.kind, OpKind::Compute(c) if c.phase != Phase::Forward && c.piece != Piece::Optimizer),
        )
        .unwrap();
    assert!(first_rs < last_bwd);
}
