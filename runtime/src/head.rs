//! The head on one tensor-parallel rank: final LayerNorm (RMSNorm for Llama), the
//! vocabulary-parallel output layer (tied to the word embedding for GPT, Llama's own
//! `out_w`; `wte_r` below is whichever it is), and the cross-entropy loss (Megatron-LM's
//! `vocab_parallel_cross_entropy`).
//!
//! Rank r holds logits for its vocabulary rows only, z_r = hn·wte_rᵀ (T, V/t). It reduces
//! them to three numbers per token, which the caller all-gathers over tp:
//!
//! ```text
//! m_r = max_v z_r[v]     s_r = Σ_v exp(z_r[v] − m_r)     y_r = z_r[target] if the target is in shard r, else 0
//! ```
//!
//! and the `Loss` piece combines them exactly: M = max_r m_r, lse = M + ln Σ_r s_r·exp(m_r − M),
//! loss_i = lse_i − Σ_r y_r (nats), reported as the mean over the T tokens of the microbatch.
//!
//! Backward, with `grad_scale` = 1 / (tokens the loss is averaged over, across every
//! microbatch and data-parallel replica of the step):
//! dz_r = (exp(z_r − lse) − onehot_r(target))·grad_scale, dhn_partial = dz_r·wte_r (the
//! caller reduces), dwte_r += dz_rᵀ·hn.

use crate::llama::{norm_backward, norm_forward};
use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::params::{HeadGrads, HeadParams};
use crate::shard::ShardDims;
use crate::tensor::Tensor;

/// Columns of the per-token statistics: (max, sum of exp(z − max), target logit).
pub const STATS: usize = 3;

/// What the head saves for one microbatch (T tokens, Tl residual rows, V/t local vocab).
#[derive(Clone, Debug, Default)]
pub struct HeadActs {
    pub r_in: Tensor,     // (Tl, h) final residual: the LNf input
    pub lnf_mean: Tensor, // (Tl)
    pub lnf_rstd: Tensor, // (Tl)
    pub hn: Tensor,       // (T, h) LNf output (gathered): the output layer's input; (Tl, h) if the caller keeps a slice
    pub logits: Tensor,   // (T, V/t) local logits; holds dlogits after backward-input
    pub lse: Tensor,      // (T) log-sum-exp over the whole vocabulary, from `Loss`
    /// Whether `logits` already holds dlogits (backward-input ran).
    pub logits_are_grads: bool,
}

impl HeadActs {
    pub fn bytes(&self) -> usize {
        [&self.r_in, &self.lnf_mean, &self.lnf_rstd, &self.hn, &self.logits, &self.lse].iter().map(|t| t.bytes()).sum()
    }

    pub fn release(&mut self) {
        *self = HeadActs::default();
    }
}

/// `FinalNorm` forward: hn = LNf(r). Any row count.
pub fn final_norm_forward(p: &HeadParams, r: &[f32], hn: &mut [f32], acts: &mut HeadActs) {
    let h = p.lnf_w.len();
    let n = r.len() / h;
    acts.r_in.assign(r, &[n, h]);
    norm_forward(r, p.lnf_w, p.lnf_b, hn, &mut acts.lnf_mean, &mut acts.lnf_rstd);
}

/// `FinalNorm` backward: dr = LNfᵀ(dhn) (overwrites dr: it starts the backward pass),
/// accumulating the LNf weight gradients.
pub fn final_norm_backward(p: &HeadParams, g: &mut HeadGrads, acts: &HeadActs, dhn: &[f32], dr: &mut [f32]) {
    dr.fill(0.0);
    norm_backward(dhn, &acts.r_in, p.lnf_w, &acts.lnf_mean, &acts.lnf_rstd, dr, g.lnf_w, g.lnf_b);
}

/// `Logits` forward: local logits (T, V/t) = hn·wte_rᵀ, saved, and the per-token
/// statistics `stats` (T, 3) that the caller all-gathers.
pub fn logits_forward(
    d: &ShardDims,
    p: &HeadParams,
    hn: &[f32],
    targets: &[u32],
    acts: &mut HeadActs,
    stats: &mut [f32],
) {
    let (h, v) = (d.hidden, d.vocab);
    let t = targets.len();
    assert!(hn.len() == t * h && stats.len() == t * STATS, "Logits: hn must be (T, h), stats (T, 3), T = {t}");
    acts.hn.assign(hn, &[t, h]);
    acts.logits.reset(&[t, v]);
    acts.logits_are_grads = false;
    matmul(
        MatRef::new(hn, t, h),
        MatRef::new(p.wte, v, h),
        MatMut::new(&mut acts.logits, t, v),
        Transpose::Nt,
        1.0,
        0.0,
    );
    for (i, (z, st)) in acts.logits.chunks_exact(v).zip(stats.chunks_exact_mut(STATS)).enumerate() {
        let max = z.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let sum: f32 = z.iter().map(|&x| (x - max).exp()).sum();
        let target = (targets[i] as usize).checked_sub(d.vocab_start).filter(|&c| c < v);
        st.copy_from_slice(&[max, sum, target.map_or(0.0, |c| z[c])]);
    }
}

/// `Loss` forward: combines the gathered statistics `gathered` (t, T, 3), rank-major as an
/// all-gather lays them out, into the exact log-sum-exp per token (saved for the backward
/// pass) and returns the mean loss over the T tokens, in nats. The mean is accumulated and
/// returned in f64 so that sums over microbatches and replicas lose no digits.
pub fn loss_forward(gathered: &[f32], tp: usize, acts: &mut HeadActs) -> f64 {
    assert!(tp > 0 && gathered.len().is_multiple_of(tp * STATS), "Loss: statistics must be (t, T, 3) with t = {tp}");
    let t = gathered.len() / (tp * STATS);
    acts.lse.reset(&[t]);
    let mut total = 0.0f64;
    for i in 0..t {
        let stat = |r: usize| &gathered[(r * t + i) * STATS..][..STATS];
        let max = (0..tp).map(|r| stat(r)[0]).fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = (0..tp).map(|r| stat(r)[1] * (stat(r)[0] - max).exp()).sum();
        let lse = max + sum.ln();
        let target: f32 = (0..tp).map(|r| stat(r)[2]).sum();
        acts.lse[i] = lse;
        total += lse as f64 - target as f64;
    }
    total / t as f64
}

/// `Logits` backward-input: turns the saved logits into dlogits (in place, see the module
/// comment) and writes dhn_partial (T, h) = dlogits·wte_r, which the caller reduces.
pub fn logits_backward_input(
    d: &ShardDims,
    p: &HeadParams,
    acts: &mut HeadActs,
    targets: &[u32],
    grad_scale: f32,
    dhn_partial: &mut [f32],
) {
    let (h, v, t) = (d.hidden, d.vocab, targets.len());
    assert!(acts.lse.len() == t && acts.logits.len() == t * v, "Logits backward before Loss forward");
    assert!(!acts.logits_are_grads, "Logits backward-input ran twice");
    for (i, z) in acts.logits.chunks_exact_mut(v).enumerate() {
        let lse = acts.lse[i];
        for x in z.iter_mut() {
            *x = (*x - lse).exp() * grad_scale;
        }
        if let Some(c) = (targets[i] as usize).checked_sub(d.vocab_start).filter(|&c| c < v) {
            z[c] -= grad_scale;
        }
    }
    acts.logits_are_grads = true;
    matmul(
        MatRef::new(&acts.logits, t, v),
        MatRef::new(p.wte, v, h),
        MatMut::new(dhn_partial, t, h),
        Transpose::Nn,
        1.0,
        0.0,
    );
}

/// `Logits` backward-weight: dwte_r += dlogitsᵀ·hn. `hn` (T, h) is the gathered final-norm
/// output (`&acts.hn`, or re-gathered sequence-parallel slices).
pub fn logits_backward_weight(d: &ShardDims, acts: &HeadActs, hn: &[f32], g: &mut HeadGrads) {
    let (h, v) = (d.hidden, d.vocab);
    let t = acts.lse.len();
    assert!(acts.logits_are_grads, "Logits backward-weight before backward-input");
    matmul(MatRef::new(&acts.logits, t, v), MatRef::new(hn, t, h), MatMut::new(g.wte, v, h), Transpose::Tn, 1.0, 1.0);
}

#[cfg(test)]
mod tests {
    use strata_models::{Activation, Family, ModelSpec};

    use super::*;
    use crate::embed::{embed_backward, embed_forward};
    use crate::gradcheck::{Probe, check_directional, seeded_vec};
    use crate::micro::Micro;
    use crate::params::{ChunkSpec, ParamLayout};
    use crate::shard::TpRank;

    const MB: Micro = Micro { batch: 2, seq: 3 };

    fn layout() -> ParamLayout {
        layout_of(Family::Gpt)
    }

    /// The head of a one-chunk model: GPT (LayerNorm, the tied table) or Llama (RMSNorm,
    /// its own `out_w`).
    fn layout_of(family: Family) -> ParamLayout {
        let llama = family == Family::Llama;
        let spec = ModelSpec {
            name: "head".into(),
            family,
            layers: 1,
            hidden: 8,
            heads: 2,
            kv_heads: 2,
            head_dim: None,
            ffn_hidden: 16,
            vocab: 12,
            seq_len: 4,
            activation: if llama { Activation::Swiglu } else { Activation::Gelu },
            dropout: 0.0,
            rope_base: 500_000.0,
            moe: None,
            mla: None,
            mtp_layers: 0,
        };
        ParamLayout::new(&spec, TpRank::SINGLE, ChunkSpec { embedding: true, layers: 0..0, head: true }).unwrap()
    }

    const TARGETS: [u32; 6] = [3, 0, 11, 7, 7, 2];

    /// FinalNorm → Logits → Loss at t = 1; returns the mean loss.
    fn head_loss(layout: &ParamLayout, params: &[f32], r: &[f32], acts: &mut HeadActs) -> f64 {
        let d = layout.dims();
        let p = layout.head(params);
        let mut hn = vec![0.0; r.len()];
        final_norm_forward(&p, r, &mut hn, acts);
        let mut stats = vec![0.0; TARGETS.len() * STATS];
        logits_forward(d, &p, &hn, &TARGETS, acts, &mut stats);
        loss_forward(&stats, 1, acts)
    }

    #[test]
    fn uniform_logits_cost_ln_vocab() {
        let layout = layout();
        let mut params = layout.init(0);
        params.iter_mut().for_each(|v| *v = 0.0);
        let r = seeded_vec(MB.tokens() * 8, 1, 1.0);
        let loss = head_loss(&layout, &params, &r, &mut HeadActs::default());
        assert!((loss - 12f64.ln()).abs() < 1e-6, "{loss} vs ln 12");
    }

    #[test]
    fn head_backward_matches_finite_differences() {
        for family in [Family::Gpt, Family::Llama] {
            head_backward_matches_finite_differences_for(family);
        }
    }

    fn head_backward_matches_finite_differences_for(family: Family) {
        let layout = layout_of(family);
        let names: Vec<String> = layout.entries().iter().map(|e| e.name()).collect();
        if family == Family::Llama {
            // wte (embedding), lnf_w, out_w: no position table, no β, an untied output layer.
            assert_eq!(names, ["wte", "lnf_w", "out_w"]);
        }
        let params = seeded_vec(layout.len(), 2, 0.5);
        let r = seeded_vec(MB.tokens() * 8, 3, 1.0);
        let mut acts = HeadActs::default();
        head_loss(&layout, &params, &r, &mut acts);
        let d = layout.dims();
        let p = layout.head(&params);
        let mut grads = vec![0.0; layout.len()];
        let mut dhn = vec![0.0; r.len()];
        logits_backward_input(d, &p, &mut acts, &TARGETS, 1.0 / TARGETS.len() as f32, &mut dhn);
        let mut g = layout.head_mut(&mut grads);
        logits_backward_weight(d, &acts, &acts.hn, &mut g);
        let mut dr = vec![f32::NAN; r.len()];
        final_norm_backward(&p, &mut g, &acts, &dhn, &mut dr);
        let loss = |params: &[f32], r: &[f32]| head_loss(&layout, params, r, &mut HeadActs::default());
        check_directional("head dr", &r, &dr, 4, |x| loss(&params, x));
        for (i, e) in layout.entries().iter().enumerate() {
            check_directional(
                &format!("head d{}", e.name()),
                &params[e.range()],
                &grads[e.range()],
                5 + i as u64,
                |x| {
                    let mut q = params.clone();
                    q[e.range()].copy_from_slice(x);
                    loss(&q, &r)
                },
            );
        }
    }

    #[test]
    fn embed_backward_matches_finite_differences_on_every_tp_rank() {
        // Embed is linear, so this checks the indexing: vocabulary shard rows, positions
        // (i mod s), and position rows added on rank 0 only.
        let tokens = [3, 0, 11, 7, 7, 2];
        let full = layout();
        for t in [1, 2] {
            for rank in 0..t {
                let spec_layout = ParamLayout::new(
                    &ModelSpec { vocab: 12, ..ModelSpec::preset("tiny-gpt").unwrap() },
                    TpRank::new(rank, t).unwrap(),
                    ChunkSpec { embedding: true, layers: 0..0, head: true },
                );
                let layout = if t == 1 { full.clone() } else { spec_layout.unwrap() };
                let d = layout.dims().clone();
                let params = seeded_vec(layout.len(), 6, 1.0);
                let probe = Probe::new(MB.tokens() * d.hidden, 7);
                let fwd = |params: &[f32]| {
                    let mut out = vec![0.0; MB.tokens() * d.hidden];
                    embed_forward(&d, &layout.embedding(params), MB, &tokens, &mut out);
                    probe.loss(&out)
                };
                let mut grads = vec![0.0; layout.len()];
                embed_backward(&d, &mut layout.embedding_mut(&mut grads), MB, &tokens, &probe.weights);
                let wte = layout.entries()[0].range();
                check_directional("embed dwte", &params[wte.clone()], &grads[wte.clone()], 8, |x| {
                    let mut q = params.clone();
                    q[wte.clone()].copy_from_slice(x);
                    fwd(&q)
                });
                // Every rank computes the position gradient; only rank 0's forward uses wpe.
                let wpe = layout.entries()[1].range();
                let dwpe_fd: Vec<f32> = if rank == 0 { grads[wpe.clone()].to_vec() } else { vec![0.0; wpe.len()] };
                check_directional("embed dwpe", &params[wpe.clone()], &dwpe_fd, 9, |x| {
                    let mut q = params.clone();
                    q[wpe.clone()].copy_from_slice(x);
                    fwd(&q)
                });
                assert!(grads[wpe].iter().any(|&g| g != 0.0), "rank {rank} must compute dwpe too");
            }
        }
    }

    #[test]
    fn a_llama_embedding_is_the_word_rows_alone() {
        // No position table: rank r's partial row is its wte row or zero, on every rank.
        let tokens = [3, 0, 11, 7, 7, 2];
        let m = ModelSpec { vocab: 12, ..ModelSpec::preset("tiny-llama").unwrap() };
        for rank in 0..2 {
            let layout = ParamLayout::new(
                &m,
                TpRank::new(rank, 2).unwrap(),
                ChunkSpec { embedding: true, layers: 0..0, head: true },
            )
            .unwrap();
            let d = layout.dims().clone();
            let params = seeded_vec(layout.len(), 6, 1.0);
            let p = layout.embedding(&params);
            assert!(p.wpe.is_empty());
            let mut out = vec![f32::NAN; MB.tokens() * d.hidden];
            embed_forward(&d, &p, MB, &tokens, &mut out);
            for (&x, row) in tokens.iter().zip(out.chunks(d.hidden)) {
                let local = (x as usize).checked_sub(d.vocab_start).filter(|&v| v < d.vocab);
                match local {
                    Some(v) => assert_eq!(row, &p.wte[v * d.hidden..(v + 1) * d.hidden]),
                    None => assert!(row.iter().all(|&v| v == 0.0)),
                }
            }
            let probe = Probe::new(out.len(), 7);
            let mut grads = vec![0.0; layout.len()];
            embed_backward(&d, &mut layout.embedding_mut(&mut grads), MB, &tokens, &probe.weights);
            let wte = layout.entries()[0].range();
            check_directional("llama embed dwte", &params[wte.clone()], &grads[wte.clone()], 8, |x| {
                let mut q = params.clone();
                q[wte.clone()].copy_from_slice(x);
                let mut out = vec![0.0; MB.tokens() * d.hidden];
                embed_forward(&d, &layout.embedding(&q), MB, &tokens, &mut out);
                probe.loss(&out)
            });
        }
    }
}
