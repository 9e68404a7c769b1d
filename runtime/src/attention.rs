//! The causal self-attention core over a rank's local heads (Vaswani et al. 2017):
//! for each sequence and head, S = q·kᵀ / √d, P = softmax(S) over keys j ≤ i, ctx = P·v.
//!
//! Layouts (T = batch·seq tokens, D = heads·head_dim local channels):
//! - `qkv` (T, 3·D): columns [Q | K | V], head `j` at columns j·d..(j+1)·d of each block,
//!   so a column-parallel QKV shard is exactly a rank's whole heads;
//! - `ctx` (T, D): head `j` at columns j·d..(j+1)·d;
//! - `probs` (batch, heads, seq, seq): P, zero above the diagonal.
//!
//! Memory modes (Korthikanti et al. 2022, "selective activation recomputation"): either the
//! forward pass stores P (batch·heads·seq² floats) for the backward pass, or it stores
//! nothing and the backward pass recomputes P from the saved q and k with the very same
//! operations, so both modes give bit-identical gradients.
//!
//! Each (sequence, head) block is two GEMMs on strided views of `qkv`; the masked upper
//! triangle costs a factor < 2 of wasted FLOPs, which is cheaper than scalar loops.
//! Forward: 4·seq²·d FLOPs per block; backward: 8·seq²·d.

use crate::matmul::{MatMut, MatRef, Transpose, matmul};

/// Sizes of one attention call on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub batch: usize,
    pub seq: usize,
    /// Heads on this rank (heads / tp).
    pub heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// Tokens T = batch·seq.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// Local channels D = heads·head_dim.
    pub fn channels(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Elements of the stored probabilities: batch·heads·seq².
    pub fn probs_len(&self) -> usize {
        self.batch * self.heads * self.seq * self.seq
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    fn check(&self, qkv: &[f32]) {
        assert_eq!(qkv.len(), self.tokens() * 3 * self.channels(), "attention: qkv must be (T, 3·D) for {self:?}");
    }
}

/// Views of q, k, v for sequence `b`, head `h`: (seq, head_dim) each, row stride 3·D.
fn qkv_views<'a>(sh: &AttnShape, qkv: &'a [f32], b: usize, h: usize) -> [MatRef<'a>; 3] {
    let (d, hd) = (sh.channels(), sh.head_dim);
    let base = b * sh.seq * 3 * d + h * hd;
    let view = |block: usize| MatRef::strided(&qkv[base + block * d..], sh.seq, hd, 3 * d);
    [view(0), view(1), view(2)]
}

/// P = causal softmax(q·kᵀ·scale) for one (sequence, head), into `p` (seq, seq).
fn probs_block(sh: &AttnShape, qkv: &[f32], b: usize, h: usize, p: &mut [f32]) {
    let s = sh.seq;
    let [q, k, _] = qkv_views(sh, qkv, b, h);
    matmul(q, k, MatMut::new(p, s, s), Transpose::Nt, sh.scale(), 0.0);
    for i in 0..s {
        let row = &mut p[i * s..(i + 1) * s];
        let max = row[..=i].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        for v in &mut row[..=i] {
            *v = crate::kernels::exp_fast(*v - max);
        }
        let sum: f32 = row[..=i].iter().sum();
        let inv = 1.0 / sum;
        for v in &mut row[..=i] {
            *v *= inv;
        }
        row[i + 1..].fill(0.0);
    }
}

/// Forward: ctx(T, D) = P·v per (sequence, head). When `probs` is `Some`, P is stored
/// there (batch, heads, seq, seq) for the backward pass; when `None`, P lives only in a
/// seq² scratch buffer (selective recompute).
pub fn attention_forward(sh: &AttnShape, qkv: &[f32], ctx: &mut [f32], mut probs: Option<&mut [f32]>) {
    sh.check(qkv);
    let (s, d, hd) = (sh.seq, sh.channels(), sh.head_dim);
    assert_eq!(ctx.len(), sh.tokens() * d, "attention: ctx must be (T, D)");
    let mut scratch = if probs.is_some() { Vec::new() } else { vec![0.0; s * s] };
    if let Some(p) = probs.as_deref() {
        assert_eq!(p.len(), sh.probs_len(), "attention: probs must be (batch, heads, seq, seq)");
    }
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            let p: &mut [f32] = match probs.as_deref_mut() {
                Some(all) => &mut all[(b * sh.heads + h) * s * s..][..s * s],
                None => &mut scratch,
            };
            probs_block(sh, qkv, b, h, p);
            let [_, _, v] = qkv_views(sh, qkv, b, h);
            let out = MatMut::strided(&mut ctx[b * s * d + h * hd..], s, hd, d);
            matmul(MatRef::new(p, s, s), v, out, Transpose::Nn, 1.0, 0.0);
        }
    }
}

/// Backward: from dctx(T, D), writes dqkv(T, 3·D) (overwriting it). With P = softmax(S):
/// dP = dctx·vᵀ, dv = Pᵀ·dctx, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dq = dS·k·scale,
/// dk = dSᵀ·q·scale. Uses the stored `probs` when given, else recomputes each block.
pub fn attention_backward(sh: &AttnShape, qkv: &[f32], probs: Option<&[f32]>, dctx: &[f32], dqkv: &mut [f32]) {
    sh.check(qkv);
    let (s, d, hd) = (sh.seq, sh.channels(), sh.head_dim);
    assert!(dctx.len() == sh.tokens() * d && dqkv.len() == qkv.len(), "attention backward: shapes");
    if let Some(p) = probs {
        assert_eq!(p.len(), sh.probs_len(), "attention: probs must be (batch, heads, seq, seq)");
    }
    let mut p_scratch = if probs.is_some() { Vec::new() } else { vec![0.0; s * s] };
    let mut dp = vec![0.0f32; s * s];
    for b in 0..sh.batch {
        for h in 0..sh.heads {
            let p: &[f32] = match probs {
                Some(all) => &all[(b * sh.heads + h) * s * s..][..s * s],
                None => {
                    probs_block(sh, qkv, b, h, &mut p_scratch);
                    &p_scratch
                }
            };
            let [q, k, v] = qkv_views(sh, qkv, b, h);
            let dc = MatRef::strided(&dctx[b * s * d + h * hd..], s, hd, d);
            let base = b * s * 3 * d + h * hd;
            // dv = Pᵀ·dctx.
            let dv = MatMut::strided(&mut dqkv[base + 2 * d..], s, hd, 3 * d);
            matmul(MatRef::new(p, s, s), dc, dv, Transpose::Tn, 1.0, 0.0);
            // dP = dctx·vᵀ, then dS in place (zero above the diagonal, where P is zero).
            matmul(dc, v, MatMut::new(&mut dp, s, s), Transpose::Nt, 1.0, 0.0);
            for i in 0..s {
                let (pr, dr) = (&p[i * s..(i + 1) * s], &mut dp[i * s..(i + 1) * s]);
                let dot: f32 = pr[..=i].iter().zip(&dr[..=i]).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    dr[j] = pr[j] * (dr[j] - dot);
                }
                dr[i + 1..].fill(0.0);
            }
            let ds = MatRef::new(&dp, s, s);
            let dq = MatMut::strided(&mut dqkv[base..], s, hd, 3 * d);
            matmul(ds, k, dq, Transpose::Nn, sh.scale(), 0.0);
            let dk = MatMut::strided(&mut dqkv[base + d..], s, hd, 3 * d);
            matmul(ds, q, dk, Transpose::Tn, sh.scale(), 0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{Probe, check_directional, seeded_vec};

    const SH: AttnShape = AttnShape { batch: 2, seq: 5, heads: 2, head_dim: 3 };

    fn forward(qkv: &[f32]) -> Vec<f32> {
        let mut ctx = vec![0.0; SH.tokens() * SH.channels()];
        attention_forward(&SH, qkv, &mut ctx, None);
        ctx
    }

    #[test]
    fn probabilities_are_causal_and_normalised() {
        let qkv = seeded_vec(SH.tokens() * 3 * SH.channels(), 1, 1.0);
        let mut ctx = vec![0.0; SH.tokens() * SH.channels()];
        let mut p = vec![0.0; SH.probs_len()];
        attention_forward(&SH, &qkv, &mut ctx, Some(&mut p));
        for block in p.chunks(SH.seq * SH.seq) {
            for (i, row) in block.chunks(SH.seq).enumerate() {
                assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6, "row {i} sums to {}", row.iter().sum::<f32>());
                assert!(row[i + 1..].iter().all(|&v| v == 0.0), "row {i} sees the future: {row:?}");
            }
        }
        // The first token attends only to itself, so its context is its own value vector.
        let (d, hd) = (SH.channels(), SH.head_dim);
        for h in 0..SH.heads {
            for c in 0..hd {
                assert!((ctx[h * hd + c] - qkv[2 * d + h * hd + c]).abs() < 1e-6);
            }
        }
        assert_eq!(ctx, forward(&qkv), "storing P must not change the output");
    }

    #[test]
    fn backward_matches_finite_differences_with_and_without_stored_probs() {
        let qkv = seeded_vec(SH.tokens() * 3 * SH.channels(), 2, 1.0);
        let probe = Probe::new(SH.tokens() * SH.channels(), 3);
        let mut ctx = vec![0.0; SH.tokens() * SH.channels()];
        let mut p = vec![0.0; SH.probs_len()];
        attention_forward(&SH, &qkv, &mut ctx, Some(&mut p));
        let mut stored = vec![0.0; qkv.len()];
        attention_backward(&SH, &qkv, Some(&p), &probe.weights, &mut stored);
        let mut recomputed = vec![f32::NAN; qkv.len()];
        attention_backward(&SH, &qkv, None, &probe.weights, &mut recomputed);
        assert_eq!(stored, recomputed, "selective recompute must reproduce the stored-P gradients bit for bit");
        check_directional("attention dqkv", &qkv, &stored, 4, |x| probe.loss(&forward(x)));
    }
}
