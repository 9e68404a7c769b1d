//! One GPT transformer layer on one tensor-parallel rank, cut into the pieces that the plan
//! IR names, with hand-written forward and backward passes (Megatron-LM's decomposition).
//!
//! Forward, with r the residual stream (Tl, h), T = b·s tokens and Tl = T without sequence
//! parallelism or T/t with it:
//!
//! ```text
//! AttnIn    a  = LN1(r)                                             rows: any (Tl)
//! Attn      qkv = a·Wqkv + bqkv ; ctx = causal-attention(qkv) ;
//!           p_partial = ctx·Wproj            (no bias)              rows: T
//!           ── caller: p = Σ_ranks p_partial (all-reduce, or reduce-scatter with SP)
//! MlpIn     r ← r + p + bproj ; m = LN2(r)                          rows: any (Tl)
//! Mlp       f = GELU(m·W1 + b1) ; p2_partial = f·W2 (no bias)       rows: T
//!           ── caller: p2 = Σ_ranks p2_partial
//! LayerOut  r ← r + p2 + bfc2                                       rows: any (Tl)
//! ```
//!
//! Row-parallel biases (bproj, bfc2) are added once, after the reduction. With sequence
//! parallelism the caller all-gathers a and m to T rows before Attn and Mlp.
//!
//! A Llama block (`ShardDims::llama`, [`crate::llama`]'s kernels) runs the same pieces with
//! RMSNorm for LN1/LN2, no biases, qkv (T, D + 2·Dkv) rotated by RoPE (q and k, positions
//! 0..s of each sequence) and its key/value heads repeated over their query groups for the
//! attention core, and f = SiLU(gate) ⊙ up over FC1's (T, 2F) output. Absent biases are
//! empty views and are skipped.
//!
//! Backward runs in reverse. Attn and Mlp are split into backward-input (the gradient of
//! their input, a partial sum the caller reduces) and backward-weight (weight gradients from
//! saved tensors), so a zero-bubble schedule (Qi et al. 2023) can run them apart. Weight
//! gradients accumulate (`+=`) over microbatches. Replicated parameters (norms, bproj,
//! bfc2) get identical gradients on every tp rank without sequence parallelism; with it
//! each rank's are partial sums over its rows, which the caller all-reduces over tp.
//!
//! Everything a layer keeps between its forward and backward passes for one microbatch is
//! in [`LayerActs`], so its bytes can be counted. Full recomputation keeps only `r_in` and
//! re-runs the forward pieces from it before the backward pass (Chen et al. 2016).
//! The weight halves take the gathered piece input (a or m) as an argument: the forward
//! pass saves it whole, but under sequence parallelism a caller may keep only its row
//! slice (`Tensor::keep_rows`) and gather it again for the weight gradient, as Megatron-LM
//! does and as the plan's `GatherSaved` collective expects.

use strata_models::Recompute;

use crate::attention::{AttnShape, attention_backward, attention_forward};
use crate::kernels::{add_bias, add_into, col_sum_into, gelu_backward, gelu_forward};
use crate::llama::{Rope, expand_kv, norm_backward, norm_forward, reduce_kv, swiglu_backward, swiglu_forward};
use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::micro::Micro;
use crate::params::{LayerGrads, LayerParams};
use crate::shard::ShardDims;
use crate::tensor::Tensor;

/// What one layer saves for one microbatch. Shapes: T tokens, Tl rows of the residual
/// slice, h hidden, D = (a/t)·d local attention channels, F = f/t local FFN width.
#[derive(Clone, Debug, Default)]
pub struct LayerActs {
    // Saved by the forward pieces.
    pub r_in: Tensor,     // (Tl, h) residual entering the layer; all that full recompute keeps
    pub ln1_mean: Tensor, // (Tl)
    pub ln1_rstd: Tensor, // (Tl)
    pub a: Tensor,        // (T, h) LN1 output (gathered): the QKV input; (Tl, h) if the caller keeps a slice
    pub qkv: Tensor,      // (T, D + 2*Dkv) = (T, 3*D) for GPT; after RoPE for Llama
    pub probs: Tensor,    // (b, a/t, s, s) softmax probabilities; empty under selective recompute
    pub ctx: Tensor,      // (T, D) attention output: the projection input
    pub r_mid: Tensor,    // (Tl, h) residual after attention: the LN2 input
    pub ln2_mean: Tensor, // (Tl)
    pub ln2_rstd: Tensor, // (Tl)
    pub m: Tensor,        // (T, h) LN2 output (gathered): the FC1 input; (Tl, h) if the caller keeps a slice
    pub fc1_pre: Tensor,  // (T, F) FC1 output before GELU; (T, 2F) [gate | up] under SwiGLU
    pub fc1_act: Tensor,  // (T, F) GELU (or SwiGLU) output: the FC2 input
    // Saved by the backward-input halves for the backward-weight halves.
    pub d_qkv: Tensor,      // (T, D + 2*Dkv), before RoPE
    pub d_proj_out: Tensor, // (T, h) gradient of the attention projection's output
    pub d_fc1_pre: Tensor,  // (T, F), or (T, 2F) under SwiGLU
    pub d_fc2_out: Tensor,  // (T, h) gradient of FC2's output
    // Context parallelism (`exec::cp`): the attention's log-sum-exp per (sequence, head,
    // row), and under Ulysses the Q/K/V and output in head layout (all s tokens, a/t/cp heads).
    pub lse: Tensor,
    pub cp_qkv: Tensor,
    pub cp_out: Tensor,
}

impl LayerActs {
    fn tensors(&self) -> [&Tensor; 20] {
        [
            &self.r_in,
            &self.ln1_mean,
            &self.ln1_rstd,
            &self.a,
            &self.qkv,
            &self.probs,
            &self.ctx,
            &self.r_mid,
            &self.ln2_mean,
            &self.ln2_rstd,
            &self.m,
            &self.fc1_pre,
            &self.fc1_act,
            &self.d_qkv,
            &self.d_proj_out,
            &self.d_fc1_pre,
            &self.d_fc2_out,
            &self.lse,
            &self.cp_qkv,
            &self.cp_out,
        ]
    }

    /// Bytes of every saved tensor's elements.
    pub fn bytes(&self) -> usize {
        self.tensors().iter().map(|t| t.bytes()).sum()
    }

    /// Bytes of the output gradients kept for the weight passes (the `d_*` tensors).
    pub fn weight_grad_bytes(&self) -> usize {
        [&self.d_qkv, &self.d_proj_out, &self.d_fc1_pre, &self.d_fc2_out].iter().map(|t| t.bytes()).sum()
    }

    /// Frees everything but the layer input: the state kept under full recompute.
    pub fn keep_only_input(&mut self) {
        let r_in = std::mem::take(&mut self.r_in);
        *self = LayerActs { r_in, ..LayerActs::default() };
    }

    /// Frees everything (after both backward halves ran).
    pub fn release(&mut self) {
        *self = LayerActs::default();
    }
}

fn rows(x: &[f32], h: usize) -> usize {
    assert!(h > 0 && x.len().is_multiple_of(h), "{} elements are not rows of {h}", x.len());
    x.len() / h
}

/// y(T, n) = x(T, k)·W(k, n) + b, or without bias when `b` is None.
fn linear(x: &[f32], w: &[f32], b: Option<&[f32]>, y: &mut [f32], k: usize, n: usize) {
    let t = rows(x, k);
    matmul(MatRef::new(x, t, k), MatRef::new(w, k, n), MatMut::new(y, t, n), Transpose::Nn, 1.0, 0.0);
    if let Some(b) = b.filter(|b| !b.is_empty()) {
        add_bias(y, b);
    }
}

/// y += b on every row, unless the block has no such bias (Llama).
fn add_bias_if(y: &mut [f32], b: &[f32]) {
    if !b.is_empty() {
        add_bias(y, b);
    }
}

/// db += Σ_rows dy, unless the block has no such bias.
fn col_sum_if(db: &mut [f32], dy: &[f32]) {
    if !db.is_empty() {
        col_sum_into(db, dy);
    }
}

/// The attention core's shape: as many key/value heads as query heads (see [`wide_qkv`]).
fn attn_shape(d: &ShardDims, mb: Micro) -> AttnShape {
    AttnShape { batch: mb.batch, seq: mb.seq, heads: d.heads, head_dim: d.head_dim }
}

/// The attention core's input: the saved qkv, its key/value heads repeated over their
/// query groups under grouped-query attention (borrowed as it is otherwise).
fn wide_qkv<'a>(d: &ShardDims, qkv: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
    if d.kv_heads == d.heads {
        std::borrow::Cow::Borrowed(qkv)
    } else {
        std::borrow::Cow::Owned(expand_kv(qkv, d.heads, d.kv_heads, d.head_dim))
    }
}

/// RoPE over q and k of a (T, D + 2·Dkv) buffer, positions 0..s of each sequence; `sign`
/// −1 rotates a gradient back. Nothing for GPT (learned positions).
fn rope_qk(d: &ShardDims, mb: Micro, x: &mut [f32], sign: f64) {
    if !d.llama {
        return;
    }
    let positions: Vec<u32> = (0..mb.seq as u32).collect();
    let rope = Rope { base: d.rope_base, head_dim: d.head_dim, positions: &positions };
    let w = d.qkv_width();
    rope.apply(x, w, 0, d.heads, sign);
    rope.apply(x, w, d.attn_channels(), d.kv_heads, sign);
}

/// dx(T, k) = dy(T, n)·W(k, n)ᵀ (overwrites dx).
fn linear_dinput(dy: &[f32], w: &[f32], dx: &mut [f32], k: usize, n: usize) {
    let t = rows(dy, n);
    matmul(MatRef::new(dy, t, n), MatRef::new(w, k, n), MatMut::new(dx, t, k), Transpose::Nt, 1.0, 0.0);
}

/// dW(k, n) += x(T, k)ᵀ·dy(T, n).
fn linear_dweight(x: &[f32], dy: &[f32], dw: &mut [f32], k: usize, n: usize) {
    let t = rows(x, k);
    matmul(MatRef::new(x, t, k), MatRef::new(dy, t, n), MatMut::new(dw, k, n), Transpose::Tn, 1.0, 1.0);
}

/// `AttnIn` forward: a = LN1(r). Saves r and the LN statistics. Any row count.
pub fn attn_in_forward(p: &LayerParams, r: &[f32], a: &mut [f32], acts: &mut LayerActs) {
    let n = rows(r, p.ln1_w.len());
    acts.r_in.assign(r, &[n, p.ln1_w.len()]);
    norm_forward(r, p.ln1_w, p.ln1_b, a, &mut acts.ln1_mean, &mut acts.ln1_rstd);
}

/// `AttnIn` backward: dr += LN1ᵀ(da), where da is the reduced gradient of a.
/// Accumulates the LN1 weight gradients.
pub fn attn_in_backward(p: &LayerParams, g: &mut LayerGrads, acts: &LayerActs, da: &[f32], dr: &mut [f32]) {
    norm_backward(da, &acts.r_in, p.ln1_w, &acts.ln1_mean, &acts.ln1_rstd, dr, g.ln1_w, g.ln1_b);
}

/// `Attn` forward on all T rows: qkv = a·Wqkv + bqkv over the local heads, causal
/// attention, and the partial projection out = ctx·Wproj (no bias; the caller reduces).
/// Under `Recompute::Selective` the softmax probabilities are not stored.
pub fn attn_forward(
    d: &ShardDims,
    p: &LayerParams,
    mb: Micro,
    a: &[f32],
    out: &mut [f32],
    acts: &mut LayerActs,
    recompute: Recompute,
) {
    let (t, h, dc, w) = (mb.tokens(), d.hidden, d.attn_channels(), d.qkv_width());
    assert_eq!(a.len(), t * h, "Attn: input must be (T, h) = ({t}, {h})");
    let sh = attn_shape(d, mb);
    acts.a.assign(a, &[t, h]);
    acts.qkv.reset(&[t, w]);
    linear(a, p.qkv_w, Some(p.qkv_b), &mut acts.qkv, h, w);
    rope_qk(d, mb, &mut acts.qkv, 1.0);
    acts.ctx.reset(&[t, dc]);
    let qkv = wide_qkv(d, &acts.qkv);
    if recompute == Recompute::Selective {
        acts.probs.release();
        attention_forward(&sh, &qkv, &mut acts.ctx, None);
    } else {
        acts.probs.reset(&[mb.batch, d.heads, mb.seq, mb.seq]);
        attention_forward(&sh, &qkv, &mut acts.ctx, Some(&mut acts.probs));
    }
    linear(&acts.ctx, p.proj_w, None, out, dc, h);
}

/// `Attn` backward-input: from d_out (T, h), the full gradient of the projection's
/// output, writes da_partial (T, h), this rank's part of the gradient of a (the caller
/// reduces it). Saves d_out and dqkv for [`attn_backward_weight`]. Recomputes the
/// softmax probabilities from q and k when the forward pass did not store them.
pub fn attn_backward_input(
    d: &ShardDims,
    p: &LayerParams,
    mb: Micro,
    acts: &mut LayerActs,
    d_out: &[f32],
    da_partial: &mut [f32],
) {
    let (t, h, dc, w) = (mb.tokens(), d.hidden, d.attn_channels(), d.qkv_width());
    assert_eq!(d_out.len(), t * h, "Attn backward: d_out must be (T, h) = ({t}, {h})");
    let sh = attn_shape(d, mb);
    acts.d_proj_out.assign(d_out, &[t, h]);
    let mut dctx = vec![0.0f32; t * dc];
    linear_dinput(d_out, p.proj_w, &mut dctx, dc, h);
    acts.d_qkv.reset(&[t, w]);
    let probs = if acts.probs.is_empty() { None } else { Some(&acts.probs[..]) };
    if d.kv_heads == d.heads {
        attention_backward(&sh, &acts.qkv, probs, &dctx, &mut acts.d_qkv);
    } else {
        let qkv = wide_qkv(d, &acts.qkv);
        let mut d_wide = vec![0.0f32; qkv.len()];
        attention_backward(&sh, &qkv, probs, &dctx, &mut d_wide);
        reduce_kv(&d_wide, d.heads, d.kv_heads, d.head_dim, &mut acts.d_qkv);
    }
    rope_qk(d, mb, &mut acts.d_qkv, -1.0);
    linear_dinput(&acts.d_qkv, p.qkv_w, da_partial, h, w);
}

/// Selective recompute as a separate step (the plan's `Attn` `Recompute` op): refills the
/// softmax probabilities from the saved q and k, so that the next backward-input uses them
/// instead of recomputing block by block. The caller frees them after backward-input
/// (`acts.probs.release()`). Bit-identical to the forward pass's probabilities.
pub fn attn_recompute_probs(d: &ShardDims, mb: Micro, acts: &mut LayerActs) {
    acts.probs.reset(&[mb.batch, d.heads, mb.seq, mb.seq]);
    let mut ctx = vec![0.0f32; mb.tokens() * d.attn_channels()];
    attention_forward(&attn_shape(d, mb), &wide_qkv(d, &acts.qkv), &mut ctx, Some(&mut acts.probs));
}

/// `Attn` backward-weight: dWproj += ctxᵀ·d_out, dWqkv += aᵀ·dqkv, dbqkv += Σ_rows dqkv.
/// `a` (T, h) is the gathered LN1 output: `&acts.a` as saved by the forward pass, or, when
/// the caller kept only its sequence-parallel slice, the slices gathered again.
pub fn attn_backward_weight(d: &ShardDims, acts: &LayerActs, a: &[f32], g: &mut LayerGrads) {
    let (h, dc) = (d.hidden, d.attn_channels());
    assert!(!acts.d_qkv.is_empty(), "Attn backward-weight before backward-input");
    linear_dweight(&acts.ctx, &acts.d_proj_out, g.proj_w, dc, h);
    linear_dweight(a, &acts.d_qkv, g.qkv_w, h, d.qkv_width());
    col_sum_if(g.qkv_b, &acts.d_qkv);
}

/// `MlpIn` forward: r ← r + p + bproj, with p the reduced attention output; m = LN2(r).
/// Saves the new r and the LN statistics. Any row count.
pub fn mlp_in_forward(p: &LayerParams, r: &mut [f32], p_sum: &[f32], m: &mut [f32], acts: &mut LayerActs) {
    let h = p.ln2_w.len();
    let n = rows(r, h);
    add_into(r, p_sum);
    add_bias_if(r, p.proj_b);
    acts.r_mid.assign(r, &[n, h]);
    norm_forward(r, p.ln2_w, p.ln2_b, m, &mut acts.ln2_mean, &mut acts.ln2_rstd);
}

/// `MlpIn` backward: dr += LN2ᵀ(dm) with dm the reduced gradient of m; then
/// dbproj += Σ_rows dr. Afterwards dr is also the gradient of the attention output p.
pub fn mlp_in_backward(p: &LayerParams, g: &mut LayerGrads, acts: &LayerActs, dm: &[f32], dr: &mut [f32]) {
    norm_backward(dm, &acts.r_mid, p.ln2_w, &acts.ln2_mean, &acts.ln2_rstd, dr, g.ln2_w, g.ln2_b);
    col_sum_if(g.proj_b, dr);
}

/// `Mlp` forward on all T rows: f = GELU(m·W1 + b1) (Llama: SiLU(gate) ⊙ up of m·W1),
/// out = f·W2 (no bias; the caller reduces).
pub fn mlp_forward(d: &ShardDims, p: &LayerParams, m: &[f32], out: &mut [f32], acts: &mut LayerActs) {
    let (h, f, w1) = (d.hidden, d.ffn, d.fc1_width());
    let t = rows(m, h);
    acts.m.assign(m, &[t, h]);
    acts.fc1_pre.reset(&[t, w1]);
    linear(m, p.fc1_w, Some(p.fc1_b), &mut acts.fc1_pre, h, w1);
    acts.fc1_act.reset(&[t, f]);
    if d.llama {
        swiglu_forward(&acts.fc1_pre, &mut acts.fc1_act, f);
    } else {
        gelu_forward(&acts.fc1_pre, &mut acts.fc1_act);
    }
    linear(&acts.fc1_act, p.fc2_w, None, out, f, h);
}

/// `Mlp` backward-input: from d_out (T, h), the full gradient of FC2's output, writes
/// dm_partial (T, h) = ((d_out·W2ᵀ) ⊙ GELU'(pre))·W1ᵀ, this rank's part of the gradient
/// of m. Saves d_out and the FC1 pre-activation gradient for [`mlp_backward_weight`].
pub fn mlp_backward_input(d: &ShardDims, p: &LayerParams, acts: &mut LayerActs, d_out: &[f32], dm_partial: &mut [f32]) {
    let (h, f, w1) = (d.hidden, d.ffn, d.fc1_width());
    let t = rows(d_out, h);
    acts.d_fc2_out.assign(d_out, &[t, h]);
    let mut d_act = vec![0.0f32; t * f];
    linear_dinput(d_out, p.fc2_w, &mut d_act, f, h);
    acts.d_fc1_pre.reset(&[t, w1]);
    if d.llama {
        swiglu_backward(&acts.fc1_pre, &d_act, &mut acts.d_fc1_pre, f);
    } else {
        gelu_backward(&acts.fc1_pre, &d_act, &mut acts.d_fc1_pre);
    }
    linear_dinput(&acts.d_fc1_pre, p.fc1_w, dm_partial, h, w1);
}

/// `Mlp` backward-weight: dW2 += fᵀ·d_out, dW1 += mᵀ·dpre, db1 += Σ_rows dpre.
/// `m` (T, h) is the gathered LN2 output (`&acts.m`, or re-gathered slices).
pub fn mlp_backward_weight(d: &ShardDims, acts: &LayerActs, m: &[f32], g: &mut LayerGrads) {
    let (h, f) = (d.hidden, d.ffn);
    assert!(!acts.d_fc1_pre.is_empty(), "Mlp backward-weight before backward-input");
    linear_dweight(&acts.fc1_act, &acts.d_fc2_out, g.fc2_w, f, h);
    linear_dweight(m, &acts.d_fc1_pre, g.fc1_w, h, d.fc1_width());
    col_sum_if(g.fc1_b, &acts.d_fc1_pre);
}

/// `LayerOut` forward: r ← r + p2 + bfc2, with p2 the reduced MLP output. Saves nothing.
pub fn layer_out_forward(p: &LayerParams, r: &mut [f32], p2_sum: &[f32]) {
    add_into(r, p2_sum);
    add_bias_if(r, p.fc2_b);
}

/// `LayerOut` backward: dbfc2 += Σ_rows dr. The residual gradient dr passes through
/// unchanged and is also the gradient of the MLP output.
pub fn layer_out_backward(g: &mut LayerGrads, dr: &[f32]) {
    col_sum_if(g.fc2_b, dr);
}

#[cfg(test)]
mod tests;
