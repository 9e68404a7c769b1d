//! The references themselves checked: against the CPU executor's functions where it has the
//! piece, by finite differences and closed forms where it does not.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::attention::{AttnShape, attention_backward, attention_forward};
use crate::optim::{AdamW, AdamWConfig, ZeroShard};

fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Checks `grad` against central differences of Σ w·f(x) at x.
fn fd_check(x: &[f64], w: &[f64], f: impl Fn(&[f64]) -> Vec<f64>, grad: &[f64]) {
    let h = 1e-6;
    let num: Vec<f64> = (0..x.len())
        .map(|i| {
            let (mut a, mut b) = (x.to_vec(), x.to_vec());
            a[i] += h;
            b[i] -= h;
            let dot = |y: Vec<f64>| y.iter().zip(w).map(|(p, q)| p * q).sum::<f64>();
            (dot(f(&a)) - dot(f(&b))) / (2.0 * h)
        })
        .collect();
    let e = rel_error(grad, &num);
    assert!(e < 1e-6, "finite differences disagree: rel error {e:e}");
}

#[test]
fn a_nan_never_passes() {
    assert_eq!(rel_error(&[1.0, f64::NAN], &[1.0, 2.0]), f64::INFINITY);
    assert_eq!(rel_error(&[1.0, f64::INFINITY], &[1.0, 2.0]), f64::INFINITY);
    assert!(rel_error(&[1.0, 2.0], &[1.0, 2.0]) == 0.0);
    assert!((rel_error(&[1.1], &[1.0]) - 0.1).abs() < 1e-12);
}

#[test]
fn layernorm_matches_the_cpu_executor() {
    let (rows, c) = (5, 24);
    let (x, g, b, dy) = (random(rows * c, 1), random(c, 2), random(c, 3), random(rows * c, 4));
    let (y, mean, rstd) = norm_fwd(&x, &g, Some(&b), crate::kernels::LN_EPS as f64, false);
    let (mut yc, mut mc, mut rc) = (vec![0.0f32; rows * c], vec![0.0f32; rows], vec![0.0f32; rows]);
    crate::kernels::layernorm_forward(&f32s(&x), &f32s(&g), &f32s(&b), &mut yc, &mut mc, &mut rc);
    assert!(
        rel_error(&f64s(&yc), &y) < 1e-5 && rel_error(&f64s(&mc), &mean) < 1e-5 && rel_error(&f64s(&rc), &rstd) < 1e-5
    );
    let (dx, dg, db) = norm_bwd(&dy, &x, &g, crate::kernels::LN_EPS as f64, false);
    let (mut dxc, mut dgc, mut dbc) = (vec![0.0f32; rows * c], vec![0.0f32; c], vec![0.0f32; c]);
    crate::kernels::layernorm_backward(&f32s(&dy), &f32s(&x), &f32s(&g), &mc, &rc, &mut dxc, &mut dgc, &mut dbc);
    for (cpu, r) in [(&dxc, &dx), (&dgc, &dg), (&dbc, &db)] {
        assert!(rel_error(&f64s(cpu), r) < 1e-4, "{}", rel_error(&f64s(cpu), r));
    }
}

#[test]
fn rmsnorm_backward_is_the_derivative_of_its_forward() {
    let (rows, c) = (3, 16);
    let (x, g, w) = (random(rows * c, 5), random(c, 6), random(rows * c, 7));
    let (dx, dg, _) = norm_bwd(&w, &x, &g, 1e-5, true);
    fd_check(&x, &w, |x| norm_fwd(x, &g, None, 1e-5, true).0, &dx);
    fd_check(&g, &w, |g| norm_fwd(&x, g, None, 1e-5, true).0, &dg);
    // RMSNorm of a row with unit γ has unit root mean square.
    let (y, _, _) = norm_fwd(&x, &vec![1.0; c], None, 0.0, true);
    let ms: f64 = y[..c].iter().map(|v| v * v).sum::<f64>() / c as f64;
    assert!((ms - 1.0).abs() < 1e-12);
}

#[test]
fn gelu_matches_the_cpu_executor_and_swiglu_its_derivative() {
    let x = random(64, 8);
    let mut yc = vec![0.0f32; 64];
    crate::kernels::gelu_forward(&f32s(&x), &mut yc);
    assert!(rel_error(&f64s(&yc), &gelu_fwd(&x)) < 1e-5);
    let dy = random(64, 9);
    let mut dxc = vec![0.0f32; 64];
    crate::kernels::gelu_backward(&f32s(&x), &f32s(&dy), &mut dxc);
    assert!(rel_error(&f64s(&dxc), &gelu_bwd(&x, &dy)) < 1e-5);
    let f = 6;
    let (gu, w) = (random(4 * 2 * f, 10), random(4 * f, 11));
    fd_check(&gu, &w, |gu| swiglu_fwd(gu, f), &swiglu_bwd(&gu, &w, f));
}

#[test]
fn rope_is_a_rotation_and_its_inverse_undoes_it() {
    let (seq, heads, d) = (7, 3, 8);
    let x = random(2 * seq * heads * d, 12);
    let mut y = x.clone();
    rope(&mut y, seq, heads, d, 10_000.0, 1.0);
    for (a, b) in x.chunks(d).zip(y.chunks(d)) {
        let n = |v: &[f64]| v.iter().map(|e| e * e).sum::<f64>();
        assert!((n(a) - n(b)).abs() < 1e-12);
    }
    // Position 0 is not rotated; position 1's first pair turns by exactly 1 rad.
    assert_eq!(&y[..heads * d], &x[..heads * d]);
    let (a, b) = (x[heads * d], x[heads * d + d / 2]);
    assert!((y[heads * d] - (a * 1f64.cos() - b * 1f64.sin())).abs() < 1e-12);
    rope(&mut y, seq, heads, d, 10_000.0, -1.0);
    assert!(rel_error(&y, &x) < 1e-14);
    // The backward pass (rotate the gradient back) is the transpose of the forward.
    let w = random(x.len(), 13);
    let mut g = w.clone();
    rope(&mut g, seq, heads, d, 10_000.0, -1.0);
    fd_check(
        &x,
        &w,
        |x| {
            let mut y = x.to_vec();
            rope(&mut y, seq, heads, d, 10_000.0, 1.0);
            y
        },
        &g,
    );
}

/// (T, 3·D) as the CPU executor lays out q, k, v.
fn fused(a: &Attn, q: &[f64], k: &[f64], v: &[f64]) -> Vec<f32> {
    let (t, dd) = (a.batch * a.seq, a.hq * a.d);
    let mut out = vec![0.0f32; t * 3 * dd];
    for r in 0..t {
        for c in 0..dd {
            out[r * 3 * dd + c] = q[r * dd + c] as f32;
            out[r * 3 * dd + dd + c] = k[r * dd + c] as f32;
            out[r * 3 * dd + 2 * dd + c] = v[r * dd + c] as f32;
        }
    }
    out
}

#[test]
fn attention_matches_the_cpu_executor() {
    let a = Attn { batch: 2, seq: 9, hq: 2, hkv: 2, d: 8 };
    let n = a.batch * a.seq * a.hq * a.d;
    let (q, k, v, dout) = (random(n, 14), random(n, 15), random(n, 16), random(n, 17));
    let sh = AttnShape { batch: a.batch, seq: a.seq, heads: a.hq, head_dim: a.d };
    let qkv = fused(&a, &q, &k, &v);
    let mut ctx = vec![0.0f32; n];
    attention_forward(&sh, &qkv, &mut ctx, None);
    let (o, _) = attn_fwd(&a, &q, &k, &v);
    assert!(rel_error(&f64s(&ctx), &o) < 1e-5, "{}", rel_error(&f64s(&ctx), &o));
    let mut dqkv = vec![0.0f32; qkv.len()];
    attention_backward(&sh, &qkv, None, &f32s(&dout), &mut dqkv);
    let (dq, dk, dv) = attn_bwd(&a, &q, &k, &v, &dout);
    let cpu = fused(&a, &dq, &dk, &dv);
    assert!(rel_error(&f64s(&dqkv), &f64s(&cpu)) < 1e-4, "{}", rel_error(&f64s(&dqkv), &f64s(&cpu)));
}

#[test]
fn grouped_query_attention_is_attention_with_shared_kv_heads() {
    let g = Attn { batch: 1, seq: 6, hq: 4, hkv: 2, d: 4 };
    let full = Attn { hkv: 4, ..g };
    let (q, k, v, dout) = (random(6 * 4 * 4, 18), random(6 * 2 * 4, 19), random(6 * 2 * 4, 20), random(6 * 4 * 4, 21));
    // kv head j serves query heads 2j and 2j + 1: duplicate it for the full-head reference.
    let dup = |x: &[f64]| -> Vec<f64> { x.chunks(4).flat_map(|h| [h, h]).flatten().cloned().collect() };
    let (kf, vf) = (dup(&k), dup(&v));
    assert_eq!(attn_fwd(&g, &q, &k, &v), attn_fwd(&full, &q, &kf, &vf));
    let (dq, dk, _) = attn_bwd(&g, &q, &k, &v, &dout);
    let (dqf, dkf, _) = attn_bwd(&full, &q, &kf, &vf, &dout);
    assert!(rel_error(&dq, &dqf) < 1e-14);
    let summed: Vec<f64> = dkf.chunks(8).flat_map(|p| (0..4).map(move |c| p[c] + p[4 + c])).collect();
    assert!(rel_error(&dk, &summed) < 1e-14);
    // And the backward is the derivative of the forward.
    fd_check(&k, &dout, |k| attn_fwd(&g, &q, k, &v).0, &dk);
}

#[test]
fn vocab_parallel_loss_equals_the_full_vocabulary_loss() {
    let (rows, vocab) = (4, 10);
    let logits = random(rows * vocab, 22);
    let target = [3u32, 9, 0, 5];
    let full = xent_stats(&logits, &target, vocab, 0);
    let (lse, loss) = xent_combine(&full, rows, 1);
    for r in 0..rows {
        let x = &logits[r * vocab..(r + 1) * vocab];
        let want = x.iter().map(|v| v.exp()).sum::<f64>().ln() - x[target[r] as usize];
        assert!((loss[r] - want).abs() < 1e-12);
    }
    // Two shards of 6 and 4 ids.
    let shard =
        |lo: usize, n: usize| -> Vec<f64> { logits.chunks(vocab).flat_map(|x| x[lo..lo + n].to_vec()).collect() };
    let (s0, s1) = (shard(0, 6), shard(6, 4));
    let gathered = [xent_stats(&s0, &target, 6, 0), xent_stats(&s1, &target, 4, 6)].concat();
    let (lse2, loss2) = xent_combine(&gathered, rows, 2);
    assert!(rel_error(&loss2, &loss) < 1e-14 && rel_error(&lse2, &lse) < 1e-14);
    // The gradient of the mean loss, shard by shard, is the derivative of the loss.
    let g0 = xent_grad(&s0, &target, &lse, 6, 0, 1.0);
    let g1 = xent_grad(&s1, &target, &lse, 4, 6, 1.0);
    let g: Vec<f64> = (0..rows).flat_map(|r| [&g0[r * 6..(r + 1) * 6], &g1[r * 4..(r + 1) * 4]].concat()).collect();
    let loss_of = |l: &[f64]| xent_combine(&xent_stats(l, &target, vocab, 0), rows, 1).1;
    fd_check(&logits, &[1.0; 4], loss_of, &g);
}

#[test]
fn adamw_matches_the_cpu_optimizer() {
    let n = 50;
    let (p, g) = (random(n, 23), random(n, 24));
    let cfg = AdamWConfig { lr: 1e-2, ..Default::default() };
    let mut opt = AdamW::new(ZeroShard::whole(n));
    let mut pc = f32s(&p);
    let decayed = [std::ops::Range { start: 0, end: n }];
    opt.update(&cfg, &mut pc, &f32s(&g), &decayed);
    let h = Adam {
        lr: cfg.lr as f64,
        beta1: cfg.beta1 as f64,
        beta2: cfg.beta2 as f64,
        eps: cfg.eps as f64,
        weight_decay: cfg.weight_decay as f64,
        step: 1,
        grad_scale: 1.0,
    };
    let (pr, mr, vr) = adamw(&h, &p, &g, &vec![0.0; n], &vec![0.0; n]);
    assert!(rel_error(&f64s(&pc), &pr) < 1e-6);
    assert!(rel_error(&f64s(&opt.m), &mr) < 1e-6 && rel_error(&f64s(&opt.v), &vr) < 1e-6);
}

#[test]
fn embedding_backward_is_the_transpose_of_its_forward() {
    let (seq, hidden, rows, start) = (4, 3, 5, 2);
    let tok = [2u32, 6, 3, 0, 2, 4, 9, 6];
    let (wte, wpe, dout) = (random(rows * hidden, 25), random(seq * hidden, 26), random(8 * hidden, 27));
    let (dwte, dwpe) = embed_bwd(&tok, &dout, seq, hidden, start, rows);
    fd_check(&wte, &dout, |w| embed_fwd(&tok, w, Some(&wpe), seq, hidden, start, rows), &dwte);
    fd_check(&wpe, &dout, |p| embed_fwd(&tok, &wte, Some(p), seq, hidden, start, rows), &dwpe);
}
