//! Attention over blocks of keys, for context parallelism: the causal softmax attention of
//! [`crate::attention`] computed one (query block × key block) at a time, with the mask
//! taken from the tokens' original positions (key j is seen by query i iff pos_k[j] ≤
//! pos_q[i]), and partial results merged by their log-sum-exp — the online softmax of
//! FlashAttention (Dao et al. 2022) that ring attention (Liu et al. 2023) and Transformer
//! Engine's context parallelism use. Each rank holds the load-balanced chunks r and
//! 2·cp − 1 − r of every sequence ([`cp_positions`]).
//!
//! Per (sequence, head), a block of `sq` queries and `sk` keys:
//! forward  S = q·kᵀ/√d, m = max over seen keys, p = exp(S − m), l = Σ p,
//!          o = (p·v)/l, lse = m + ln l (−∞ and o = 0 for a row that sees no key);
//! merge    lse = ln(e^lse₁ + e^lse₂), o = o₁·e^(lse₁ − lse) + o₂·e^(lse₂ − lse);
//! backward with the final o and lse of the whole row: P = exp(S − lse) on seen keys,
//!          δ = rowsum(dO ⊙ o), dv += Pᵀ·dO, dS = P ⊙ (dO·vᵀ − δ), dq += dS·k/√d,
//!          dk += dSᵀ·q/√d.
//! So the blocks' backward contributions sum to the full attention's gradient exactly (up
//! to f32 rounding), in any order of blocks.
//!
//! Layouts: a [`View`] is `batch` sequences of `seq` rows each (row stride `stride`), head
//! h at columns `off + h·head_dim`; `o`, `dO`, `dq` and the dense outputs are (batch·seq,
//! heads·head_dim); `lse` is (batch, heads, seq).

use crate::kernels::exp_fast;
use crate::matmul::{MatMut, MatRef, Transpose, matmul};

/// Heads and their size of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub fn channels(&self) -> usize {
        self.heads * self.head_dim
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// A strided token set: `batch` sequences of `seq` rows, head h at `off + h·head_dim`.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub seq: usize,
    pub stride: usize,
    pub off: usize,
}

impl<'a> View<'a> {
    fn head(&self, hs: &Heads, b: usize, h: usize) -> MatRef<'a> {
        MatRef::strided(
            &self.data[b * self.seq * self.stride + self.off + h * hs.head_dim..],
            self.seq,
            hs.head_dim,
            self.stride,
        )
    }
}

/// The original positions of the rows rank `rank` of `cp` holds of a sequence of `seq`
/// tokens: chunks `rank` and 2·cp − 1 − `rank` of 2·cp (Transformer Engine's DualChunkSwap;
/// Megatron-LM's `get_batch_on_this_cp_rank`). `cp` = 1 gives 0 … seq − 1.
pub fn cp_positions(seq: usize, cp: usize, rank: usize) -> Vec<u32> {
    if cp <= 1 {
        return (0..seq as u32).collect();
    }
    let c = seq / (2 * cp);
    let first = rank * c..(rank + 1) * c;
    let second = (2 * cp - 1 - rank) * c..(2 * cp - rank) * c;
    first.chain(second).map(|p| p as u32).collect()
}

/// Forward of one block: writes o (batch·sq, D) and lse (batch, heads, sq).
pub fn block_forward(
    hs: &Heads,
    q: View<'_>,
    k: View<'_>,
    v: View<'_>,
    pos_q: &[u32],
    pos_k: &[u32],
    o: &mut [f32],
    lse: &mut [f32],
) {
    let (sq, sk, d, hd) = (q.seq, k.seq, hs.channels(), hs.head_dim);
    assert!(pos_q.len() == sq && pos_k.len() == sk && v.seq == sk, "block attention: positions and rows");
    assert!(o.len() == hs.batch * sq * d && lse.len() == hs.batch * hs.heads * sq, "block attention: outputs");
    let mut p = vec![0.0f32; sq * sk];
    for b in 0..hs.batch {
        for h in 0..hs.heads {
            matmul(q.head(hs, b, h), k.head(hs, b, h), MatMut::new(&mut p, sq, sk), Transpose::Nt, hs.scale(), 0.0);
            let l = &mut lse[(b * hs.heads + h) * sq..][..sq];
            let mut inv = vec![0.0f32; sq];
            for i in 0..sq {
                let row = &mut p[i * sk..(i + 1) * sk];
                let max = (0..sk).filter(|&j| pos_k[j] <= pos_q[i]).map(|j| row[j]).fold(f32::NEG_INFINITY, f32::max);
                if max == f32::NEG_INFINITY {
                    row.fill(0.0);
                    l[i] = f32::NEG_INFINITY;
                    continue;
                }
                let mut sum = 0.0f32;
                for j in 0..sk {
                    row[j] = if pos_k[j] <= pos_q[i] { exp_fast(row[j] - max) } else { 0.0 };
                    sum += row[j];
                }
                inv[i] = 1.0 / sum;
                l[i] = max + sum.ln();
            }
            let out = &mut o[b * sq * d + h * hd..];
            matmul(MatRef::new(&p, sq, sk), v.head(hs, b, h), MatMut::strided(out, sq, hd, d), Transpose::Nn, 1.0, 0.0);
            for (i, s) in inv.iter().enumerate() {
                o[b * sq * d + i * d + h * hd..][..hd].iter_mut().for_each(|x| *x *= s);
            }
        }
    }
}

/// Merges a block's (o₂, lse₂) into the running (o, lse) of the same rows.
pub fn merge(hs: &Heads, seq: usize, o: &mut [f32], lse: &mut [f32], o2: &[f32], lse2: &[f32]) {
    let (d, hd) = (hs.channels(), hs.head_dim);
    for b in 0..hs.batch {
        for h in 0..hs.heads {
            for i in 0..seq {
                let li = (b * hs.heads + h) * seq + i;
                let (l1, l2) = (lse[li], lse2[li]);
                if l2 == f32::NEG_INFINITY {
                    continue;
                }
                let row = b * seq * d + i * d + h * hd;
                if l1 == f32::NEG_INFINITY {
                    o[row..row + hd].copy_from_slice(&o2[row..row + hd]);
                    lse[li] = l2;
                    continue;
                }
                let m = l1.max(l2);
                let l = m + ((l1 - m).exp() + (l2 - m).exp()).ln();
                let (w1, w2) = ((l1 - l).exp(), (l2 - l).exp());
                for (x, y) in o[row..row + hd].iter_mut().zip(&o2[row..row + hd]) {
                    *x = *x * w1 + y * w2;
                }
                lse[li] = l;
            }
        }
    }
}

/// Backward of one block with the rows' final `o` and `lse`: adds to dq (batch·sq, D), and
/// to dk and dv (batch·sk, D) of the block's keys.
#[allow(clippy::too_many_arguments)]
pub fn block_backward(
    hs: &Heads,
    q: View<'_>,
    k: View<'_>,
    v: View<'_>,
    pos_q: &[u32],
    pos_k: &[u32],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (sq, sk, d, hd) = (q.seq, k.seq, hs.channels(), hs.head_dim);
    assert!(o.len() == hs.batch * sq * d && d_o.len() == o.len() && dq.len() == o.len(), "block backward: rows");
    assert!(dk.len() == hs.batch * sk * d && dv.len() == dk.len(), "block backward: key rows");
    let (mut p, mut dp) = (vec![0.0f32; sq * sk], vec![0.0f32; sq * sk]);
    for b in 0..hs.batch {
        for h in 0..hs.heads {
            let (qh, kh, vh) = (q.head(hs, b, h), k.head(hs, b, h), v.head(hs, b, h));
            matmul(qh, kh, MatMut::new(&mut p, sq, sk), Transpose::Nt, hs.scale(), 0.0);
            let l = &lse[(b * hs.heads + h) * sq..][..sq];
            for i in 0..sq {
                let row = &mut p[i * sk..(i + 1) * sk];
                for j in 0..sk {
                    row[j] =
                        if pos_k[j] <= pos_q[i] && l[i] > f32::NEG_INFINITY { exp_fast(row[j] - l[i]) } else { 0.0 };
                }
            }
            let at = b * sq * d + h * hd;
            let doh = MatRef::strided(&d_o[at..], sq, hd, d);
            let kat = b * sk * d + h * hd;
            matmul(MatRef::new(&p, sq, sk), doh, MatMut::strided(&mut dv[kat..], sk, hd, d), Transpose::Tn, 1.0, 1.0);
            matmul(doh, vh, MatMut::new(&mut dp, sq, sk), Transpose::Nt, 1.0, 0.0);
            for i in 0..sq {
                let r = at + i * d;
                let delta: f32 = d_o[r..r + hd].iter().zip(&o[r..r + hd]).map(|(a, b)| a * b).sum();
                for j in 0..sk {
                    let x = i * sk + j;
                    dp[x] = p[x] * (dp[x] - delta);
                }
            }
            let ds = MatRef::new(&dp, sq, sk);
            matmul(ds, kh, MatMut::strided(&mut dq[at..], sq, hd, d), Transpose::Nn, hs.scale(), 1.0);
            matmul(ds, qh, MatMut::strided(&mut dk[kat..], sk, hd, d), Transpose::Tn, hs.scale(), 1.0);
        }
    }
}

#[cfg(test)]
mod tests;
