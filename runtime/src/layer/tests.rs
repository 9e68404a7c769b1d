//! Gradient checks of every layer piece, both backward halves, with and without stored
//! attention probabilities, and of the whole layer under full recomputation — for a GPT
//! block and for a Llama block (RMSNorm, no biases, RoPE, grouped-query attention with 2
//! query heads per key/value head, SwiGLU).
//! Method and tolerance: see `crate::gradcheck`.

use strata_models::{Activation, Family, ModelSpec, Recompute};

use super::*;
use crate::gradcheck::{Probe, check_directional, seeded_vec};
use crate::params::{ChunkSpec, ParamLayout};
use crate::shard::TpRank;

const MB: Micro = Micro { batch: 2, seq: 4 };

fn spec() -> ModelSpec {
    ModelSpec {
        name: "gradcheck".into(),
        family: Family::Gpt,
        layers: 1,
        hidden: 8,
        heads: 2,
        kv_heads: 2,
        head_dim: None,
        ffn_hidden: 16,
        vocab: 16,
        seq_len: 4,
        activation: Activation::Gelu,
        dropout: 0.0,
        rope_base: 500_000.0,
        moe: None,
        mla: None,
        mtp_layers: 0,
    }
}

/// The Llama block of the checks: h = 8, 2 query heads of 4 sharing 1 key/value head,
/// SwiGLU of width 16, RoPE base 10⁴ (so positions 0..3 turn every pair measurably).
fn llama_spec() -> ModelSpec {
    ModelSpec {
        name: "gradcheck-llama".into(),
        family: Family::Llama,
        kv_heads: 1,
        activation: Activation::Swiglu,
        rope_base: 10_000.0,
        ..spec()
    }
}

/// Both blocks, each test runs on.
fn specs() -> [ModelSpec; 2] {
    [spec(), llama_spec()]
}

/// One layer with random parameters of scale 0.5 (far from GPT-2's 0.02, so every
/// nonlinearity is exercised).
fn setup(model: &ModelSpec) -> (ParamLayout, Vec<f32>) {
    let layout =
        ParamLayout::new(model, TpRank::SINGLE, ChunkSpec { embedding: false, layers: 0..1, head: false }).unwrap();
    let params = seeded_vec(layout.len(), 100, 0.5);
    (layout, params)
}

fn with_range(buf: &[f32], range: std::ops::Range<usize>, values: &[f32]) -> Vec<f32> {
    let mut out = buf.to_vec();
    out[range].copy_from_slice(values);
    out
}

/// Checks every parameter tensor's gradient against finite differences of `loss(params)`.
fn check_all_params(what: &str, layout: &ParamLayout, params: &[f32], grads: &[f32], loss: impl Fn(&[f32]) -> f64) {
    for (i, e) in layout.entries().iter().enumerate() {
        let name = format!("{what}: d{}", e.name());
        check_directional(&name, &params[e.range()], &grads[e.range()], 1000 + i as u64, |x| {
            loss(&with_range(params, e.range(), x))
        });
    }
}

#[test]
fn attn_in_backward_matches_finite_differences() {
    for model in specs() {
        attn_in_backward_matches_finite_differences_on(&model);
    }
}

fn attn_in_backward_matches_finite_differences_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    let h = 8;
    let r = seeded_vec(MB.tokens() * h, 1, 1.0);
    let probe = Probe::new(r.len(), 2);
    let fwd = |params: &[f32], r: &[f32]| {
        let mut a = vec![0.0; r.len()];
        attn_in_forward(&layout.layer(params, 0), r, &mut a, &mut LayerActs::default());
        probe.loss(&a)
    };
    let mut acts = LayerActs::default();
    let mut a = vec![0.0; r.len()];
    attn_in_forward(&layout.layer(&params, 0), &r, &mut a, &mut acts);
    let mut grads = vec![0.0; layout.len()];
    let mut dr = vec![0.0; r.len()];
    attn_in_backward(&layout.layer(&params, 0), &mut layout.layer_mut(&mut grads, 0), &acts, &probe.weights, &mut dr);
    check_directional("AttnIn dr", &r, &dr, 3, |x| fwd(&params, x));
    check_all_params("AttnIn", &layout, &params, &grads, |p| fwd(p, &r));
}

#[test]
fn attn_backward_halves_match_finite_differences_with_and_without_recompute() {
    for model in specs() {
        attn_backward_halves_match_finite_differences_with_and_without_recompute_on(&model);
    }
}

fn attn_backward_halves_match_finite_differences_with_and_without_recompute_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    let d = layout.dims().clone();
    let a = seeded_vec(MB.tokens() * 8, 4, 1.0);
    let probe = Probe::new(a.len(), 5);
    let fwd = |params: &[f32], a: &[f32]| {
        let mut out = vec![0.0; a.len()];
        attn_forward(&d, &layout.layer(params, 0), MB, a, &mut out, &mut LayerActs::default(), Recompute::None);
        probe.loss(&out)
    };
    let mut results = Vec::new();
    // Stored probabilities; recomputed block by block inside backward-input; recomputed
    // by the separate `attn_recompute_probs` step (the plan's `Attn` `Recompute` op).
    for (mode, separate_step) in [(Recompute::None, false), (Recompute::Selective, false), (Recompute::Selective, true)]
    {
        let mut acts = LayerActs::default();
        let mut out = vec![0.0; a.len()];
        attn_forward(&d, &layout.layer(&params, 0), MB, &a, &mut out, &mut acts, mode);
        assert_eq!(acts.probs.is_empty(), mode == Recompute::Selective, "{mode:?}: probabilities stored or not");
        if separate_step {
            attn_recompute_probs(&d, MB, &mut acts);
        }
        let mut da = vec![f32::NAN; a.len()];
        attn_backward_input(&d, &layout.layer(&params, 0), MB, &mut acts, &probe.weights, &mut da);
        let mut grads = vec![0.0; layout.len()];
        attn_backward_weight(&d, &acts, &acts.a, &mut layout.layer_mut(&mut grads, 0));
        results.push((out, da, grads));
    }
    let (out, da, grads) = &results[0];
    assert_eq!(&results[1], &results[0], "selective recompute must give bit-identical outputs and gradients");
    assert_eq!(&results[2], &results[0], "the separate recompute step must give bit-identical gradients");
    assert!(out.iter().all(|v| v.is_finite()));
    check_directional("Attn backward-input da", &a, da, 6, |x| fwd(&params, x));
    check_all_params("Attn backward-weight", &layout, &params, grads, |p| fwd(p, &a));
}

#[test]
fn mlp_in_backward_matches_finite_differences() {
    for model in specs() {
        mlp_in_backward_matches_finite_differences_on(&model);
    }
}

fn mlp_in_backward_matches_finite_differences_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    let n = MB.tokens() * 8;
    let (r0, p_sum) = (seeded_vec(n, 7, 1.0), seeded_vec(n, 8, 1.0));
    // Probe both outputs: L = ⟨w_r, r_new⟩ + ⟨w_m, m⟩.
    let (probe_r, probe_m) = (Probe::new(n, 9), Probe::new(n, 10));
    let fwd = |params: &[f32], r0: &[f32], p_sum: &[f32]| {
        let (mut r, mut m) = (r0.to_vec(), vec![0.0; n]);
        mlp_in_forward(&layout.layer(params, 0), &mut r, p_sum, &mut m, &mut LayerActs::default());
        probe_r.loss(&r) + probe_m.loss(&m)
    };
    let mut acts = LayerActs::default();
    let (mut r, mut m) = (r0.clone(), vec![0.0; n]);
    mlp_in_forward(&layout.layer(&params, 0), &mut r, &p_sum, &mut m, &mut acts);
    let mut grads = vec![0.0; layout.len()];
    let mut dr = probe_r.weights.clone();
    mlp_in_backward(&layout.layer(&params, 0), &mut layout.layer_mut(&mut grads, 0), &acts, &probe_m.weights, &mut dr);
    check_directional("MlpIn dr (residual)", &r0, &dr, 11, |x| fwd(&params, x, &p_sum));
    check_directional("MlpIn dr (attention output)", &p_sum, &dr, 12, |x| fwd(&params, &r0, x));
    check_all_params("MlpIn", &layout, &params, &grads, |p| fwd(p, &r0, &p_sum));
}

#[test]
fn mlp_backward_halves_match_finite_differences() {
    for model in specs() {
        mlp_backward_halves_match_finite_differences_on(&model);
    }
}

fn mlp_backward_halves_match_finite_differences_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    let d = layout.dims().clone();
    let m = seeded_vec(MB.tokens() * 8, 13, 1.0);
    let probe = Probe::new(m.len(), 14);
    let fwd = |params: &[f32], m: &[f32]| {
        let mut out = vec![0.0; m.len()];
        mlp_forward(&d, &layout.layer(params, 0), m, &mut out, &mut LayerActs::default());
        probe.loss(&out)
    };
    let mut acts = LayerActs::default();
    let mut out = vec![0.0; m.len()];
    mlp_forward(&d, &layout.layer(&params, 0), &m, &mut out, &mut acts);
    let mut dm = vec![f32::NAN; m.len()];
    mlp_backward_input(&d, &layout.layer(&params, 0), &mut acts, &probe.weights, &mut dm);
    let mut grads = vec![0.0; layout.len()];
    mlp_backward_weight(&d, &acts, &acts.m, &mut layout.layer_mut(&mut grads, 0));
    check_directional("Mlp backward-input dm", &m, &dm, 15, |x| fwd(&params, x));
    check_all_params("Mlp backward-weight", &layout, &params, &grads, |p| fwd(p, &m));
}

#[test]
fn layer_out_backward_matches_finite_differences() {
    for model in specs() {
        layer_out_backward_matches_finite_differences_on(&model);
    }
}

fn layer_out_backward_matches_finite_differences_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    let n = MB.tokens() * 8;
    let (r0, p2) = (seeded_vec(n, 16, 1.0), seeded_vec(n, 17, 1.0));
    let probe = Probe::new(n, 18);
    let fwd = |params: &[f32], r0: &[f32], p2: &[f32]| {
        let mut r = r0.to_vec();
        layer_out_forward(&layout.layer(params, 0), &mut r, p2);
        probe.loss(&r)
    };
    let mut grads = vec![0.0; layout.len()];
    layer_out_backward(&mut layout.layer_mut(&mut grads, 0), &probe.weights);
    // dr and dp2 both equal the incoming gradient: the residual passes it through.
    check_directional("LayerOut dr", &r0, &probe.weights, 19, |x| fwd(&params, x, &p2));
    check_directional("LayerOut dp2", &p2, &probe.weights, 20, |x| fwd(&params, &r0, x));
    check_all_params("LayerOut", &layout, &params, &grads, |p| fwd(p, &r0, &p2));
}

/// The whole layer at t = 1 (reductions are the identity), forward then backward in the
/// order a plan runs them. Returns (output residual, d input residual, parameter grads).
fn run_layer(layout: &ParamLayout, params: &[f32], r_in: &[f32], dr_out: &[f32], mode: Recompute) -> [Vec<f32>; 3] {
    let d = layout.dims().clone();
    let p = layout.layer(params, 0);
    let n = r_in.len();
    let mut acts = LayerActs::default();
    let forward = |acts: &mut LayerActs, r: &mut Vec<f32>| {
        let (mut a, mut out, mut m) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        attn_in_forward(&p, r, &mut a, acts);
        attn_forward(&d, &p, MB, &a, &mut out, acts, mode);
        mlp_in_forward(&p, r, &out, &mut m, acts);
        mlp_forward(&d, &p, &m, &mut out, acts);
        layer_out_forward(&p, r, &out);
    };
    let mut r = r_in.to_vec();
    forward(&mut acts, &mut r);
    if mode == Recompute::Full {
        let kept = acts.bytes();
        acts.keep_only_input();
        assert!(acts.bytes() == n * 4 && kept > acts.bytes(), "full recompute keeps only the input");
        let mut again = acts.r_in.to_vec();
        forward(&mut acts, &mut again);
        assert_eq!(again, r, "re-running the forward pass must reproduce the output");
    }
    let mut grads = vec![0.0; layout.len()];
    let mut g = layout.layer_mut(&mut grads, 0);
    let mut dr = dr_out.to_vec();
    let mut dpartial = vec![0.0; n];
    layer_out_backward(&mut g, &dr);
    mlp_backward_input(&d, &p, &mut acts, &dr, &mut dpartial);
    mlp_backward_weight(&d, &acts, &acts.m, &mut g);
    mlp_in_backward(&p, &mut g, &acts, &dpartial, &mut dr);
    attn_backward_input(&d, &p, MB, &mut acts, &dr, &mut dpartial);
    attn_backward_weight(&d, &acts, &acts.a, &mut g);
    attn_in_backward(&p, &mut g, &acts, &dpartial, &mut dr);
    [r, dr, grads]
}

#[test]
fn whole_layer_matches_finite_differences_under_every_recompute_mode() {
    for model in specs() {
        whole_layer_matches_finite_differences_under_every_recompute_mode_on(&model);
    }
}

fn whole_layer_matches_finite_differences_under_every_recompute_mode_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    let r_in = seeded_vec(MB.tokens() * 8, 21, 1.0);
    let probe = Probe::new(r_in.len(), 22);
    let reference = run_layer(&layout, &params, &r_in, &probe.weights, Recompute::None);
    for mode in [Recompute::Selective, Recompute::Full] {
        assert_eq!(
            run_layer(&layout, &params, &r_in, &probe.weights, mode),
            reference,
            "{mode:?} must be bit-identical"
        );
    }
    let [_, dr, grads] = &reference;
    let loss = |params: &[f32], r_in: &[f32]| {
        probe.loss(&run_layer(&layout, params, r_in, &probe.weights, Recompute::None)[0])
    };
    check_directional("layer dr_in", &r_in, dr, 23, |x| loss(&params, x));
    check_all_params("layer", &layout, &params, grads, |p| loss(p, &r_in));
}

#[test]
fn saved_bytes_follow_the_shapes() {
    for model in specs() {
        saved_bytes_follow_the_shapes_on(&model);
    }
}

fn saved_bytes_follow_the_shapes_on(model: &ModelSpec) {
    let (layout, params) = setup(model);
    if model.family == Family::Llama {
        // No biases, no norm β: ln1_w qkv_w (8, 8 + 2·4) proj_w ln2_w fc1_w (8, 32) fc2_w.
        assert_eq!(layout.len(), 8 + 8 * 16 + 8 * 8 + 8 + 8 * 32 + 16 * 8);
    }
    let d = layout.dims().clone();
    let (t, h, dc, f) = (MB.tokens(), 8, d.attn_channels(), d.ffn);
    let probs = MB.batch * d.heads * MB.seq * MB.seq;
    for (mode, stored_probs) in [(Recompute::None, probs), (Recompute::Selective, 0)] {
        let r_in = seeded_vec(t * h, 24, 1.0);
        let mut acts = LayerActs::default();
        let p = layout.layer(&params, 0);
        let (mut r, mut a, mut out, mut m) = (r_in.clone(), vec![0.0; t * h], vec![0.0; t * h], vec![0.0; t * h]);
        attn_in_forward(&p, &r, &mut a, &mut acts);
        attn_forward(&d, &p, MB, &a, &mut out, &mut acts, mode);
        mlp_in_forward(&p, &mut r, &out, &mut m, &mut acts);
        mlp_forward(&d, &p, &m, &mut out, &mut acts);
        // r_in, a, r_mid, m: 4·T·h; LN stats 4·T; qkv 3·T·D; ctx T·D; fc1 pre and act 2·T·F.
        // Llama: RMSNorm keeps rstd only (2·T); qkv T·(D + 2·Dkv); SwiGLU pre 2·T·F, act T·F.
        let floats = if d.llama {
            4 * t * h + 2 * t + t * (dc + 2 * d.kv_channels()) + t * dc + 3 * t * f + stored_probs
        } else {
            4 * t * h + 4 * t + 4 * t * dc + 2 * t * f + stored_probs
        };
        assert_eq!(acts.bytes(), floats * 4, "{mode:?}");
        acts.release();
        assert_eq!(acts.bytes(), 0);
    }
}
