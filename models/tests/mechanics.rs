//! Framework mechanics in the lowering: DeepSpeed ZeRO-3 gathers each sub-module's
//! flattened parameters on its own within its prefetch and live-parameter limits and never
//! gathers persistent parameters; torchtitan's FSDP2 reduces one unit per collective;
//! DeepSpeed's PipelineEngine reduces gradients only after the pipeline flush and runs its
//! sends and receives in series with compute; torchtitan with a pipeline accumulates
//! gradients unsharded and reduce-scatters them once, after each chunk's last backward.

use std::collections::BTreeMap;

use proptest::prelude::*;
use strata_models::framework::mechanics::DEEPSPEED_ZERO3;
use strata_models::plan::*;
use strata_models::{Scenario, TrainingConfig};

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
fn without_parameter_gather_overlap_deepspeed_prefetches_nothing() {
    // `overlap_param_gather = false` exports `stage3_prefetch_bucket_size = 0`, with which
    // DeepSpeed's coordinator skips its prefetch: each fetch gathers only its own piece's
    // modules, so the gathered peak is the largest piece and the step is no faster.
    let on = scenario("deepspeed", "llama3-8b", 1, 1, 16, 3, "micro_batch = 1");
    let off = scenario("deepspeed", "llama3-8b", 1, 1, 16, 3, "micro_batch = 1\noverlap_param_gather = false");
    let bucket = |s: &Scenario| match s.training.framework.zero3_gathering(s) {
        strata_models::framework::mechanics::Gathering::PerModule(m) => m.prefetch_bucket,
        other => panic!("{other:?}"),
    };
    assert_eq!(bucket(&on), DEEPSPEED_ZERO3.prefetch_bucket);
    assert_eq!(bucket(&off), 0);
    let export = strata_models::export::deepspeed::config(&off);
    assert_eq!(export["zero_optimization"]["stage3_prefetch_bucket_size"], 0, "the export and the model agree");

    let (peak_on, ..) = live_gathered(&lower(&on).unwrap());
    let plan_off = lower(&off).unwrap();
    verify(&plan_off).unwrap();
    let (peak_off, _, left, burst) = live_gathered(&plan_off);
    let (h, f) = (4096u64, 14336u64);
    // The largest piece is the MLP's gate, up and down, gathered together on demand.
    assert_eq!(peak_off, 3 * h * f, "only the running piece is gathered");
    assert_eq!(burst, 3 * h * f);
    assert_eq!(left, 0);
    assert!(peak_on > peak_off, "with prefetch more is gathered at once: {peak_on} vs {peak_off}");
}

#[test]
fn deepspeed_charges_host_time_per_hooked_module() {
    // Each hooked module's hooks, and per fetch (1 + tensors) views per rank of the
    // partition group: Llama's modules gather one tensor each (no biases).
    let per = DEEPSPEED_ZERO3.host_ns_per_module;
    for dp in [16u32, 512] {
        let plan = lower(&scenario("deepspeed", "llama3-8b", 1, 1, dp, 3, "")).unwrap();
        let mut seen = BTreeMap::new();
        for op in &plan.programs[0].ops {
            if let OpKind::Compute(c) = &op.kind
                && c.phase == Phase::Forward
            {
                seen.insert(c.piece, plan.host_ns(c.cost));
            }
        }
        let views = |modules: u64| modules * DEEPSPEED_ZERO3.fetch_host_ns(dp as u64, 1);
        assert_eq!(seen[&Piece::Attn], 4 * per + views(4), "dp {dp}: q, k, v, o");
        assert_eq!(seen[&Piece::Mlp], 3 * per + views(3), "dp {dp}: gate, up, down");
        assert_eq!(seen[&Piece::AttnIn], 0);
    }
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

/// Program indices of a stage's sends and receives, and of its compute ops.
fn p2p_and_compute(prog: &Program) -> (Vec<usize>, Vec<usize>) {
    let p2p = (0..prog.ops.len()).filter(|&i| matches!(prog.ops[i].kind, OpKind::Send(_) | OpKind::Recv(_))).collect();
    let compute = (0..prog.ops.len()).filter(|&i| matches!(prog.ops[i].kind, OpKind::Compute(_))).collect();
    (p2p, compute)
}

/// Whether op `i` of `prog` starts only after op `j` is done: an explicit dep, or an earlier
/// op of its stream that holds the stream up (the emitter leaves those implied).
fn waits_for(prog: &Program, i: usize, j: usize) -> bool {
    let (a, b) = (&prog.ops[i], &prog.ops[j]);
    a.deps.contains(&(j as OpId))
        || (j < i && a.stream == b.stream && !matches!(b.kind, OpKind::Send(_) | OpKind::Free { .. }))
}

#[test]
fn deepspeed_pipeline_sends_and_receives_in_series_with_compute() {
    for (pp, dp) in [(2, 4), (4, 2), (8, 1)] {
        let plan = lower(&scenario("deepspeed", "gpt2-350m", 1, pp, dp, 1, "")).unwrap();
        verify(&plan).unwrap();
        for (stage, prog) in plan.programs.iter().enumerate() {
            let (p2p, compute) = p2p_and_compute(prog);
            assert!(!p2p.is_empty(), "pp {pp} stage {stage}");
            for (k, &i) in p2p.iter().enumerate() {
                // Issued after the compute before it and after the transfer before it.
                if let Some(&c) = compute.iter().rev().find(|&&c| c < i) {
                    assert!(waits_for(prog, i, c), "pp {pp} stage {stage} op {i}: not after compute {c}");
                }
                if k > 0 {
                    assert!(waits_for(prog, i, p2p[k - 1]), "pp {pp} stage {stage} op {i}: not in series");
                }
                // The next compute waits for it (a receive's consumer, or a send's delivery).
                if matches!(prog.ops[i].kind, OpKind::Send(_))
                    && let Some(&c) = compute.iter().find(|&&c| c > i)
                {
                    assert!(waits_for(prog, c, i), "pp {pp} stage {stage} send {i}");
                }
            }
            // DeepSpeed's instruction order: a backward step receives its gradient before it
            // sends the activation of the forward before it; a step after a backward sends
            // that backward's gradient before anything else.
            let recv_grad = |mb: u32| {
                p2p.iter().copied().find(
                    |&r| matches!(&prog.ops[r].kind, OpKind::Recv(m) if m.kind == P2pKind::Gradient && m.mb == mb),
                )
            };
            for &i in &p2p {
                let OpKind::Send(m) = &prog.ops[i].kind else { continue };
                let Some(&c) = compute.iter().find(|&&c| c > i) else { continue };
                let OpKind::Compute(next) = &prog.ops[c].kind else { unreachable!() };
                if matches!(next.phase, Phase::Forward | Phase::Step) {
                    continue;
                }
                if let Some(r) = recv_grad(next.mb) {
                    let before = m.kind == P2pKind::Activation;
                    assert_eq!(
                        r < i,
                        before,
                        "pp {pp} stage {stage}: {:?} of mb {} vs RecvGrad mb {}",
                        m.kind,
                        m.mb,
                        next.mb
                    );
                }
            }
        }
    }
    // Megatron-LM posts its sends and computes on: no compute waits for a send.
    let m = lower(&scenario("megatron", "gpt2-350m", 1, 4, 2, 1, "")).unwrap();
    for prog in &m.programs {
        let sends: Vec<OpId> =
            (0..prog.ops.len() as OpId).filter(|&i| matches!(prog.ops[i as usize].kind, OpKind::Send(_))).collect();
        assert!(!sends.is_empty());
        assert!(
            prog.ops.iter().all(|o| !matches!(o.kind, OpKind::Compute(_)) || o.deps.iter().all(|d| !sends.contains(d)))
        );
    }
}

#[test]
fn the_reuse_distance_keeps_a_recomputed_module_only_if_its_backward_is_near() {
    let m = DEEPSPEED_ZERO3;
    assert_eq!(m.max_reuse_distance, 1_000_000_000);
    // GPT-3 175B (h = 12288): QKV, projection, FC1, FC2. After FC1's recomputation the
    // trace is FC2 (604M), FC2's backward (604M): 1.21e9 > 1e9 before FC1's backward.
    let h = 12288u64;
    let gpt3 = [3 * h * h, h * h, 4 * h * h, 4 * h * h];
    assert_eq!(m.kept_for_backward(&gpt3), [false, false, false, true]);
    // h = 8192: FC1's backward comes 536M elements after it, the projection's 1.07e9.
    let h = 8192u64;
    assert_eq!(m.kept_for_backward(&[3 * h * h, h * h, 4 * h * h, 4 * h * h]), [false, false, true, true]);
    // h = 4096: the whole layer (201M) is within the distance.
    let h = 4096u64;
    assert_eq!(m.kept_for_backward(&[3 * h * h, h * h, 4 * h * h, 4 * h * h]), [true; 4]);
    // Distance 0: only the last module, whose backward comes next, survives.
    let zero = strata_models::framework::mechanics::Zero3Mechanics { max_reuse_distance: 0, ..m };
    assert_eq!(zero.kept_for_backward(&[5, 5, 5]), [false, false, true]);
}

#[test]
fn deepspeed_gathers_again_in_backward_what_the_reuse_distance_released() {
    let text = |preset: &str| {
        format!(
            "[model]\npreset = \"{preset}\"\nlayers = 2\n[cluster]\npreset = \"dgx-a100\"\nnodes = 1\n[parallel]\ntp = 1\npp = 1\ndp = 8\nglobal_batch = 8\nzero = 3\nrecompute = \"full\"\n[training]\nframework = \"deepspeed\"\n"
        )
    };
    let s = Scenario::from_toml(&text("gpt3-175b"), "reuse", "reuse", &[]).unwrap();
    let plan = lower(&s).unwrap();
    verify(&plan).unwrap();
    let h = 12288u64;
    let (qkv, proj, fc1, fc2) = (3 * h * h * 2, h * h * 2, 4 * h * h * 2, 4 * h * h * 2);
    for ((layer, _, phase), sizes) in gathers(&plan, 0) {
        let mut sizes = sizes.clone();
        sizes.sort();
        let mut want = if phase == Phase::Forward {
            vec![qkv, proj, fc1, fc2]
        } else {
            // The recomputation's four, then QKV, projection and FC1 again for the backward.
            vec![qkv, proj, fc1, fc2, qkv, proj, fc1]
        };
        want.sort();
        assert_eq!(sizes, want, "layer {layer} {phase:?}");
    }
    // A 350M model's layer lies within the distance: its backward reuses every gather.
    let small = lower(&Scenario::from_toml(&text("gpt2-350m"), "reuse", "reuse", &[]).unwrap()).unwrap();
    assert!(gathers(&small, 0).values().all(|v| v.len() == 4));
}

#[test]
fn the_prefetch_queue_stops_at_a_recomputed_modules_backward() {
    // h = 4096: every module is ≥ 1.6e7 elements, the layer 2e8, within the reuse distance.
    // DeepSpeed's queue pops the recomputation's modules, then their backward occurrences
    // (still gathered, but counted), so the next layer's recomputation is first prefetched
    // from the attention's backward, not from the MLP's recomputation.
    let text = "[model]\npreset = \"gpt2-350m\"\nlayers = 3\nhidden = 4096\nheads = 32\nkv_heads = 32\nffn_hidden = 16384\n[cluster]\npreset = \"dgx-a100\"\nnodes = 1\n[parallel]\ntp = 1\npp = 1\ndp = 8\nglobal_batch = 8\nzero = 3\nrecompute = \"full\"\n[training]\nframework = \"deepspeed\"\n";
    let plan = lower(&Scenario::from_toml(text, "queue", "queue", &[]).unwrap()).unwrap();
    verify(&plan).unwrap();
    let ops = &plan.programs[0].ops;
    let names: BTreeMap<BufId, &str> = ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Alloc(a) => Some((a.buf, a.name.as_str())),
            _ => None,
        })
        .collect();
    let first_gather = |layer: u32| {
        ops.iter().position(|o| {
            matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::ParamGather { phase: Phase::BackwardInput, .. }))
                && names[&o.bufs[0]].starts_with(&format!("gathered L{layer} "))
        })
    };
    let compute = |layer: u32, piece: Piece| {
        ops.iter()
            .position(|o| matches!(&o.kind, OpKind::Compute(c) if c.layer == layer && c.piece == piece && c.phase == Phase::BackwardInput))
            .unwrap()
    };
    for layer in [2u32, 1] {
        let next = first_gather(layer - 1).unwrap();
        assert!(next > compute(layer, Piece::Mlp), "layer {}'s gather before layer {layer}'s MLP backward", layer - 1);
        assert!(next < compute(layer, Piece::Attn), "layer {}'s gather not prefetched", layer - 1);
    }
}

#[test]
fn torchtitan_pipelines_reduce_scatter_once_after_each_chunks_last_backward() {
    for (zero, sched) in
        [(2u8, "schedule = \"1f1b\""), (2, "schedule = \"interleaved\"\nvpp = 2"), (3, "schedule = \"1f1b\"")]
    {
        let s = scenario("torchtitan", "gpt2-350m", 1, 2, 4, zero, sched);
        let m = s.parallel.microbatches();
        assert!(m > 1);
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap();
        for (stage, prog) in plan.programs.iter().enumerate() {
            let buckets = plan.buckets[stage].len();
            let rs: Vec<(usize, u32, u32)> = prog
                .ops
                .iter()
                .enumerate()
                .filter_map(|(i, o)| match &o.kind {
                    OpKind::Collective(c) => match c.purpose {
                        CollPurpose::GradBucket { chunk, mb, .. } => Some((i, chunk, mb)),
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            // One per unit per step, from the last microbatch: no sync before it.
            assert_eq!(rs.len(), buckets, "zero {zero} {sched} stage {stage}");
            assert!(rs.iter().all(|&(_, _, mb)| mb + 1 == m), "zero {zero} {sched} stage {stage}");
            // Each after its chunk's last backward compute, and waiting for it.
            for &(i, chunk, _) in &rs {
                let last_bwd = prog
                    .ops
                    .iter()
                    .rposition(|o| {
                        matches!(&o.kind, OpKind::Compute(c) if c.chunk == chunk && c.mb + 1 == m
                            && matches!(c.phase, Phase::BackwardInput | Phase::BackwardWeight))
                    })
                    .unwrap();
                assert!(i > last_bwd && prog.ops[i].deps.contains(&(last_bwd as OpId)), "zero {zero} {sched} op {i}");
            }
        }
    }
    // Without a pipeline FSDP2 reduces every microbatch (`fsdp2_reduces_one_unit_per_collective`).
    let s = scenario("torchtitan", "gpt2-350m", 1, 1, 8, 2, "");
    assert!(!s.training.framework.accumulates_unsharded(&s));
}

/// (ops, total FLOPs) of the `Attn` `Recompute` ops of stage 0.
fn core_recomputes(s: &Scenario) -> (usize, u64) {
    let plan = lower(s).unwrap();
    verify(&plan).unwrap();
    plan.programs[0]
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Compute(c) if c.piece == Piece::Attn && c.phase == Phase::Recompute => Some(plan.cost(c.cost)),
            _ => None,
        })
        .fold((0, 0), |(n, f), c| (n + 1, f + c.flops))
}

#[test]
fn megatron_selective_recomputation_reruns_a_fused_attention_core() {
    // megatron-core checkpoints the core attention (`recompute_modules = ["core_attn"]`) even
    // when it is the fused kernel: one recomputed core forward per layer and microbatch,
    // costed as the fused forward (no scores through memory, no buffer for them).
    let sel = "recompute = \"selective\"\nsequence_parallel = true";
    let s = scenario("megatron", "llama3-8b", 2, 1, 4, 1, sel);
    assert!(s.training.flash_attention);
    let (n, flops) = core_recomputes(&s);
    let mbs = s.parallel.global_batch / (s.parallel.dp * s.parallel.micro_batch);
    assert_eq!(n as u32, 32 * mbs, "every layer of every microbatch");
    let one = strata_models::plan::cost::piece_cost(
        &s.model,
        &s.parallel,
        s.training.dtype,
        true,
        Piece::Attn,
        Phase::Recompute,
    );
    assert_eq!(flops, one.flops * n as u64);
    assert!(one.attention.is_some_and(|a| a.fused) && one.gemms.len() == 2 && one.mem_bytes == 0);
    let plan = lower(&s).unwrap();
    assert!(!plan.programs[0].ops.iter().any(|o| matches!(&o.kind, OpKind::Alloc(a) if a.name.starts_with("scores "))));
    // torchtitan's selective checkpointing keeps the flash kernel's outputs, and
    // Megatron-DeepSpeed's flash path is not checkpointed: nothing recomputed.
    assert_eq!(core_recomputes(&scenario("torchtitan", "llama3-8b", 2, 1, 4, 2, sel)).0, 0);
    assert_eq!(core_recomputes(&scenario("deepspeed", "llama3-8b", 1, 1, 8, 1, "recompute = \"selective\"")).0, 0);
    // Without flash every framework re-runs the unfused core into its scores.
    let unfused = scenario("torchtitan", "llama3-8b", 2, 1, 4, 2, sel);
    let unfused = Scenario { training: TrainingConfig { flash_attention: false, ..unfused.training }, ..unfused };
    assert_eq!(core_recomputes(&unfused).0 as u32, 32 * mbs);
    // The step's hardware FLOPs count the recomputation exactly where the plan runs it.
    let flops = |s: &Scenario| strata_models::accounting::flops::scenario_step_flops(s).hardware;
    let titan = scenario("torchtitan", "llama3-8b", 2, 1, 4, 2, sel);
    let core = strata_models::accounting::flops::attention_core_forward_flops_per_token(&s.model) as f64;
    let extra = s.tokens_per_step() as f64 * 32.0 * core;
    assert!((flops(&s) - flops(&titan) - extra).abs() < 1e-9 * flops(&s), "{} vs {}", flops(&s), flops(&titan));
}

#[test]
fn the_fetch_host_time_is_the_measured_one() {
    // PyTorch running DeepSpeed's per-fetch loops (bench_zero3_fetch_host.py): host time
    // grows as ranks · (1 + tensors) views; the constant is the median per view.
    let csv = include_str!("data/zero3_fetch_host.csv");
    let rows: Vec<(u64, u64, f64)> = csv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("ranks"))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .filter(|r| r.0 >= 64)
        .collect();
    assert_eq!(rows.len(), 12);
    let mut per_view: Vec<f64> = rows.iter().map(|(n, t, us)| us * 1e3 / (n * (1 + t)) as f64).collect();
    per_view.sort_by(f64::total_cmp);
    let median = (per_view[5] + per_view[6]) / 2.0;
    let fitted = DEEPSPEED_ZERO3.host_ns_per_rank_view as f64;
    assert!((fitted / median - 1.0).abs() < 0.03, "constant {fitted} ns, measured median {median:.0} ns");
    for (n, t, us) in rows {
        let model = DEEPSPEED_ZERO3.fetch_host_ns(n, t) as f64 / 1e3;
        assert!((model / us - 1.0).abs() < 0.15, "{n} ranks, {t} tensors: {model:.0} µs modelled, {us} measured");
    }
}
