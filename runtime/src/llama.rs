//! The Llama block's own kernels, with hand-written backward passes: RMSNorm, SwiGLU,
//! rotary position embedding (RoPE) and grouped-query attention's sharing of key/value
//! heads. `layer` and `head` call them where a model has no norm bias (RMSNorm), a
//! two-block FC1 (SwiGLU), rotary positions and fewer key/value heads than query heads.
//!
//! - **RMSNorm** (Zhang & Sennrich 2019; Llama, Megatron-LM's `RMSNorm`): per row,
//!   rstd = 1/√(mean(x²) + ε), y = x·rstd·γ (no mean, no β); ε = 1e-5 as Llama's `norm_eps`.
//! - **SwiGLU** (Shazeer 2020): FC1's output row is [gate | up] (F each, Megatron-LM's
//!   `glu`: `chunk(2, dim=-1)`, SiLU on the first half), act = SiLU(gate) ⊙ up.
//! - **RoPE** (Su et al. 2021), the half-split layout Llama / Megatron-LM use (and
//!   `cuda/kernels/rope.cu`): for head width d and i < d/2, θ_i = pos · base^(−2i/d) and the
//!   pair (x_i, x_{i+d/2}) turns by θ_i; angles are computed in f64. The backward pass is the
//!   rotation by −θ_i applied to the gradient.
//! - **Grouped-query attention** (Ainslie et al. 2023): query head j reads key/value head
//!   j / (heads / kv_heads). The attention core (`attention`) works on [Q | K | V] with as
//!   many K/V heads as query heads, so the layer widens (T, D + 2·Dkv) to (T, 3·D) by
//!   repeating each key/value head over its group (Megatron-LM's `repeat_interleave` in its
//!   unfused core attention), and the backward pass sums the group's gradients back.

use crate::kernels::{LN_EPS, layernorm_backward, layernorm_forward};
use crate::tensor::Tensor;

fn rows_of(len: usize, cols: usize, what: &str) -> usize {
    assert!(cols > 0 && len.is_multiple_of(cols), "{what}: {len} elements are not whole rows of {cols}");
    len / cols
}

/// RMSNorm over each row of x(N, C): writes y(N, C) and saves rstd(N).
pub fn rmsnorm_forward(x: &[f32], gamma: &[f32], y: &mut [f32], rstd: &mut [f32]) {
    let c = gamma.len();
    let n = rows_of(x.len(), c, "rmsnorm_forward");
    assert!(y.len() == x.len() && rstd.len() == n, "rmsnorm_forward: shapes");
    for i in 0..n {
        let row = &x[i * c..(i + 1) * c];
        let ms = row.iter().map(|v| v * v).sum::<f32>() / c as f32;
        let rs = 1.0 / (ms + LN_EPS).sqrt();
        for ((o, &v), &g) in y[i * c..(i + 1) * c].iter_mut().zip(row).zip(gamma) {
            *o = v * rs * g;
        }
        rstd[i] = rs;
    }
}

/// RMSNorm backward. With x̂ = x·rstd and g = dy ⊙ γ: dx += rstd·(g − x̂·mean(g ⊙ x̂)),
/// dγ += Σ_rows dy ⊙ x̂. Accumulates into dx and dγ.
pub fn rmsnorm_backward(dy: &[f32], x: &[f32], gamma: &[f32], rstd: &[f32], dx: &mut [f32], dgamma: &mut [f32]) {
    let c = gamma.len();
    let n = rows_of(x.len(), c, "rmsnorm_backward");
    assert!(dy.len() == x.len() && dx.len() == x.len() && rstd.len() == n && dgamma.len() == c);
    for i in 0..n {
        let (xr, dyr, rs) = (&x[i * c..(i + 1) * c], &dy[i * c..(i + 1) * c], rstd[i]);
        let gx_mean = (0..c).map(|j| dyr[j] * gamma[j] * xr[j] * rs).sum::<f32>() / c as f32;
        let dxr = &mut dx[i * c..(i + 1) * c];
        for j in 0..c {
            let xhat = xr[j] * rs;
            dgamma[j] += dyr[j] * xhat;
            dxr[j] += rs * (dyr[j] * gamma[j] - xhat * gx_mean);
        }
    }
}

/// The block's norm: LayerNorm when it has a bias β, RMSNorm when `beta` is empty (Llama
/// holds no β). Saves the statistics in `mean` (empty under RMSNorm) and `rstd`.
pub fn norm_forward(x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32], mean: &mut Tensor, rstd: &mut Tensor) {
    let n = rows_of(x.len(), gamma.len(), "norm_forward");
    rstd.reset(&[n]);
    if beta.is_empty() {
        mean.release();
        rmsnorm_forward(x, gamma, y, rstd);
    } else {
        mean.reset(&[n]);
        layernorm_forward(x, gamma, beta, y, mean, rstd);
    }
}

/// The backward of [`norm_forward`]: accumulates into dx, dγ and (LayerNorm) dβ.
#[allow(clippy::too_many_arguments)] // the norm backward has exactly these operands
pub fn norm_backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    if dbeta.is_empty() {
        rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma);
    } else {
        layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
    }
}

fn silu(x: f32) -> (f32, f32) {
    let s = 1.0 / (1.0 + crate::kernels::exp_fast(-x));
    (x * s, s)
}

/// SwiGLU: from pre (T, 2F) = [gate | up] per row, writes act (T, F) = SiLU(gate) ⊙ up.
pub fn swiglu_forward(pre: &[f32], act: &mut [f32], f: usize) {
    assert!(f > 0 && pre.len() == 2 * act.len() && act.len().is_multiple_of(f), "swiglu_forward: shapes");
    for (p, a) in pre.chunks_exact(2 * f).zip(act.chunks_exact_mut(f)) {
        let (gate, up) = p.split_at(f);
        for ((o, &g), &u) in a.iter_mut().zip(gate).zip(up) {
            *o = silu(g).0 * u;
        }
    }
}

/// SwiGLU backward: from d_act (T, F) writes d_pre (T, 2F) (overwrites): d_gate = d_act ⊙
/// up ⊙ SiLU'(gate), SiLU'(g) = σ(g)·(1 + g·(1 − σ(g))); d_up = d_act ⊙ SiLU(gate).
pub fn swiglu_backward(pre: &[f32], d_act: &[f32], d_pre: &mut [f32], f: usize) {
    assert!(pre.len() == d_pre.len() && pre.len() == 2 * d_act.len() && f > 0, "swiglu_backward: shapes");
    for ((p, da), dp) in pre.chunks_exact(2 * f).zip(d_act.chunks_exact(f)).zip(d_pre.chunks_exact_mut(2 * f)) {
        let (gate, up) = p.split_at(f);
        let (dg, du) = dp.split_at_mut(f);
        for j in 0..f {
            let (sg, s) = silu(gate[j]);
            dg[j] = da[j] * up[j] * s * (1.0 + gate[j] * (1.0 - s));
            du[j] = da[j] * sg;
        }
    }
}

/// Where RoPE acts in a (T, width) buffer: `heads` heads of `head_dim` starting at column
/// `offset` of each row; row i of a sequence sits at position `positions[i mod seq]`.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    pub base: f64,
    pub head_dim: usize,
    pub positions: &'a [u32],
}

impl Rope<'_> {
    /// Rotates heads [offset, offset + heads·d) of every row of x (rows of `width`) by
    /// `sign`·θ: forward with sign 1, backward (on a gradient) with −1.
    pub fn apply(&self, x: &mut [f32], width: usize, offset: usize, heads: usize, sign: f64) {
        let (d, seq) = (self.head_dim, self.positions.len());
        assert!(d.is_multiple_of(2) && seq > 0 && offset + heads * d <= width, "rope: shapes");
        let half = d / 2;
        let inv: Vec<f64> = (0..half).map(|i| self.base.powf(-2.0 * i as f64 / d as f64)).collect();
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            let pos = self.positions[t % seq] as f64;
            let trig: Vec<(f32, f32)> = inv
                .iter()
                .map(|f| {
                    let (s, c) = (pos * f).sin_cos();
                    ((s * sign) as f32, c as f32)
                })
                .collect();
            for hd in row[offset..offset + heads * d].chunks_exact_mut(d) {
                let (a, b) = hd.split_at_mut(half);
                for ((x0, x1), &(sn, cs)) in a.iter_mut().zip(b.iter_mut()).zip(&trig) {
                    let (u, v) = (*x0, *x1);
                    *x0 = u * cs - v * sn;
                    *x1 = v * cs + u * sn;
                }
            }
        }
    }
}

/// Widens qkv (T, D + 2·Dkv) to (T, 3·D): each key/value head repeated over its group of
/// `heads / kv_heads` query heads.
pub fn expand_kv(qkv: &[f32], heads: usize, kv_heads: usize, d: usize) -> Vec<f32> {
    let (q, kv) = (heads * d, kv_heads * d);
    let group = heads / kv_heads;
    let t = rows_of(qkv.len(), q + 2 * kv, "expand_kv");
    let mut out = vec![0.0f32; t * 3 * q];
    for (src, dst) in qkv.chunks_exact(q + 2 * kv).zip(out.chunks_exact_mut(3 * q)) {
        dst[..q].copy_from_slice(&src[..q]);
        for block in 0..2 {
            for j in 0..heads {
                let from = q + block * kv + (j / group) * d;
                let to = q + block * q + j * d;
                dst[to..to + d].copy_from_slice(&src[from..from + d]);
            }
        }
    }
    out
}

/// The transpose of [`expand_kv`]: from d_wide (T, 3·D), writes d (T, D + 2·Dkv) with each
/// key/value head's gradient the sum over its group, in query-head order (overwrites d).
pub fn reduce_kv(d_wide: &[f32], heads: usize, kv_heads: usize, d: usize, out: &mut [f32]) {
    let (q, kv) = (heads * d, kv_heads * d);
    let group = heads / kv_heads;
    assert_eq!(rows_of(d_wide.len(), 3 * q, "reduce_kv"), rows_of(out.len(), q + 2 * kv, "reduce_kv"));
    for (src, dst) in d_wide.chunks_exact(3 * q).zip(out.chunks_exact_mut(q + 2 * kv)) {
        dst[..q].copy_from_slice(&src[..q]);
        dst[q..].fill(0.0);
        for block in 0..2 {
            for j in 0..heads {
                let to = q + block * kv + (j / group) * d;
                let from = q + block * q + j * d;
                for (o, v) in dst[to..to + d].iter_mut().zip(&src[from..from + d]) {
                    *o += v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
