//! Gradient checks of the Llama kernels against central finite differences
//! (`crate::gradcheck`), and the facts the layer relies on: RoPE is a rotation (its
//! backward undoes it, norms are kept, position 0 is the identity), and `reduce_kv` is the
//! transpose of `expand_kv`.

use super::*;
use crate::gradcheck::{Probe, check_directional, seeded_vec};

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    let (n, c) = (5, 8);
    let x = seeded_vec(n * c, 1, 1.0);
    let gamma = seeded_vec(c, 2, 1.0);
    let probe = Probe::new(n * c, 3);
    let fwd = |x: &[f32], g: &[f32]| {
        let (mut y, mut rstd) = (vec![0.0; x.len()], vec![0.0; n]);
        rmsnorm_forward(x, g, &mut y, &mut rstd);
        (y, rstd)
    };
    let (_, rstd) = fwd(&x, &gamma);
    let (mut dx, mut dg) = (vec![0.0; n * c], vec![0.0; c]);
    rmsnorm_backward(&probe.weights, &x, &gamma, &rstd, &mut dx, &mut dg);
    check_directional("rmsnorm dx", &x, &dx, 4, |x| probe.loss(&fwd(x, &gamma).0));
    check_directional("rmsnorm dgamma", &gamma, &dg, 5, |g| probe.loss(&fwd(&x, g).0));
}

#[test]
fn swiglu_backward_matches_finite_differences() {
    let (t, f) = (4, 6);
    let pre = seeded_vec(t * 2 * f, 6, 2.0);
    let probe = Probe::new(t * f, 7);
    let fwd = |p: &[f32]| {
        let mut a = vec![0.0; t * f];
        swiglu_forward(p, &mut a, f);
        a
    };
    let mut d_pre = vec![f32::NAN; pre.len()];
    swiglu_backward(&pre, &probe.weights, &mut d_pre, f);
    check_directional("swiglu dpre", &pre, &d_pre, 8, |p| probe.loss(&fwd(p)));
}

#[test]
fn rope_is_a_rotation_undone_by_its_backward_and_checked_by_finite_differences() {
    let (seq, heads, d, width, offset) = (5, 3, 4, 16, 2);
    let positions: Vec<u32> = (0..seq as u32).map(|p| p * 7 + 3).collect();
    let rope = Rope { base: 10_000.0, head_dim: d, positions: &positions };
    let x = seeded_vec(2 * seq * width, 9, 1.0);
    let mut y = x.clone();
    rope.apply(&mut y, width, offset, heads, 1.0);
    // Columns outside the heads are untouched; every head's norm is kept.
    for (a, b) in x.chunks(width).zip(y.chunks(width)) {
        assert_eq!(&a[..offset], &b[..offset]);
        assert_eq!(&a[offset + heads * d..], &b[offset + heads * d..]);
        for h in 0..heads {
            let n = |r: &[f32]| r[offset + h * d..offset + (h + 1) * d].iter().map(|v| v * v).sum::<f32>();
            assert!((n(a) - n(b)).abs() < 1e-5, "rotation changed a norm");
        }
    }
    assert_ne!(x, y, "positions past 0 rotate");
    let mut back = y.clone();
    rope.apply(&mut back, width, offset, heads, -1.0);
    assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5), "the backward rotation undoes the forward");
    // Gradient: the backward of a linear map applied to the probe weights.
    let probe = Probe::new(x.len(), 10);
    let mut g = probe.weights.clone();
    rope.apply(&mut g, width, offset, heads, -1.0);
    check_directional("rope dx", &x, &g, 11, |x| {
        let mut y = x.to_vec();
        rope.apply(&mut y, width, offset, heads, 1.0);
        probe.loss(&y)
    });
    // Position 0 does not rotate.
    let zero = [0u32];
    let mut z = x[..width].to_vec();
    Rope { positions: &zero, ..rope }.apply(&mut z, width, offset, heads, 1.0);
    assert_eq!(z, x[..width]);
}

#[test]
fn rope_turns_pairs_half_a_head_apart_by_the_published_angles() {
    // d = 4, base 100: θ_0 = pos, θ_1 = pos/10; pairs (x0, x2) and (x1, x3).
    let positions = [0u32, 2];
    let rope = Rope { base: 100.0, head_dim: 4, positions: &positions };
    let mut x = vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0];
    rope.apply(&mut x, 4, 0, 1, 1.0);
    let (a, b) = (2.0f64, 0.2f64);
    let want = [a.cos(), b.cos(), a.sin(), b.sin()];
    for (got, want) in x[4..].iter().zip(want) {
        assert!((*got as f64 - want).abs() < 1e-6, "{x:?}");
    }
}

#[test]
fn reduce_kv_is_the_transpose_of_expand_kv() {
    let (heads, kv_heads, d, t) = (4, 2, 3, 5);
    let narrow = seeded_vec(t * (heads + 2 * kv_heads) * d, 12, 1.0);
    let wide = expand_kv(&narrow, heads, kv_heads, d);
    // Query heads 0, 1 read kv head 0; 2, 3 read kv head 1.
    let (q, w) = (heads * d, 3 * heads * d);
    assert_eq!(wide[q + d..q + 2 * d], narrow[q..q + d]);
    assert_eq!(wide[q + 2 * d..q + 3 * d], narrow[q + d..q + 2 * d]);
    let probe = Probe::new(wide.len(), 13);
    let mut g = vec![f32::NAN; narrow.len()];
    reduce_kv(&probe.weights, heads, kv_heads, d, &mut g);
    check_directional("expand_kv", &narrow, &g, 14, |x| probe.loss(&expand_kv(x, heads, kv_heads, d)));
    assert_eq!(expand_kv(&wide[..w], heads, heads, d), wide[..w].to_vec(), "no groups: the identity");
}
