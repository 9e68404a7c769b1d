//! Hardware-independent cost of each model piece: its GEMM shapes, attention core and
//! bytes of element-wise traffic, per tensor-parallel rank and microbatch.
//!
//! Shapes (T = b·s tokens, t = tp, R = T/t rows for norm and residual pieces under sequence
//! parallelism else T, h_t = h/t, kv_t = kv/t, f_t = f/t, V_t = V/t, a_t = a/t):
//! - `Attn` fwd: QKV (T × (h_t + 2kv_t) × h), QKᵀ and P·V (b·a_t batches of s × s × d and
//!   s × d × s), projection (T × h × h_t); bwd-in: the transposed data-gradient GEMMs and
//!   the four attention-core GEMMs; bwd-w: the weight-gradient GEMMs (h × n × T);
//! - `Mlp` fwd: FC1 (T × f_t·(1|2) × h), FC2 (T × h × f_t); likewise backward;
//! - `Logits` fwd: T × V_t × h; backward likewise; the embedding lookup has no GEMM.
//!
//! Llama pieces: GQA narrows the K/V projections to kv_t (QKV n = h_t + 2kv_t) while the
//! core keeps a_t query heads (K/V are shared, not copied); SwiGLU's gate and up matrices
//! run as one GEMM of width 2f_t (Megatron-LM's fused `linear_fc1`; the same FLOPs as two);
//! RMSNorm has a weight and no bias; RoPE reads and writes the local q and k
//! (2·T·(h_t + kv_t)·e bytes) after the projection, and its backward rotates dq and dk.
//!
//! Multi-head latent attention (DeepSeek-V3; Megatron-core `MLASelfAttention`): the query
//! down projection (R × r_q × h) and the key/value down projection (R × (r_kv + d_rope) × h)
//! run on every tp rank (`TELinear`, duplicated) over the rows it holds — under sequence
//! parallelism its T/t tokens, whose small latents are then gathered, else all T — then
//! the column-parallel up projections (T × a_t·(d_nope + d_rope) × r_q, T × a_t·(d_nope + d_v)
//! × r_kv; or one T × a_t·(d_nope + d_rope) × h without a query rank), the core with
//! queries/keys of d_nope + d_rope and values of d_v channels, and the row-parallel output
//! (T × h × a_t·d_v). RMSNorms over the two latents and RoPE over the rotary channels (the
//! query's a_t·d_rope and the one shared rotary key) are element-wise bytes.
//!
//! Under fp8 training (`dtype` = [`Dtype::Fp8`]: tensors are bf16, linear GEMMs fp8) every
//! linear-layer GEMM — QKV/MLA projections, output projection, MLP — is marked `fp8` and
//! runs at the GPU's fp8 rate in Fprop, Dgrad and Wgrad (Transformer Engine's `Linear`;
//! DeepSeek-V3 §3.3), while the attention core, the embedding, the output layer and the
//! router stay bf16 (TE's `DotProductAttention` computes in bf16 under delayed scaling;
//! Megatron-LM's output layer is not a TE module; DeepSeek-V3 §3.3 keeps embedding, head,
//! gating and attention in high precision). [`linear`] builds such a GEMM for other pieces.
//!
//! FLOPs count GEMMs only (2·m·n·k), the Megatron-LM papers' convention, so the FLOPs of a
//! plan's compute ops summed over all ranks equal [`crate::accounting::flops::step_flops`]
//! (with latent attention, when sequence parallelism or tp = 1 keeps the duplicated down
//! projections from running twice on a token).
//! Element-wise work (norms, softmax, dropout, activations, residual adds, optimizer) is
//! carried as bytes read and written, with `e` bytes per activation element.

use crate::model::{Activation, ModelSpec};
use crate::parallel::ParallelConfig;
use crate::plan::ir::{AttnShape, ComputeCost, Gemm, Phase, Piece};
use crate::plan::moe::MoeShape;
use crate::scenario::Dtype;

mod cp;
mod moe;
pub use cp::{attn_core_shape, cp_piece_cost};

pub(crate) fn gemm(m: u64, n: u64, k: u64) -> Gemm {
    Gemm { m, n, k, batch: 1, fp8: false }
}

/// A linear layer's GEMM (m × n × k), in fp8 when the run trains in fp8.
pub(crate) fn linear(m: u64, n: u64, k: u64, fp8: bool) -> Gemm {
    Gemm { m, n, k, batch: 1, fp8 }
}

pub(crate) fn cost(gemms: Vec<Gemm>, attention: Option<AttnShape>, mem_bytes: u64, kernels: u32) -> ComputeCost {
    ComputeCost { flops: gemms.iter().map(Gemm::flops).sum(), gemms, attention, mem_bytes, kernels }
}

/// Shapes shared by every piece of one configuration.
struct Dims {
    t: u64,
    tokens: u64,
    rows: u64,
    b: u64,
    s: u64,
    h: u64,
    /// h/t: the MTP projection's output columns per rank.
    h_t: u64,
    /// Query (and attention output) width per rank: heads · head_dim / t.
    q_t: u64,
    kv_t: u64,
    f_t: u64,
    v_t: u64,
    a_t: u64,
    e: u64,
    /// Linear-layer GEMMs run in fp8.
    fp8: bool,
    /// Per-head query/key and value widths of the core (`head_dim` each without MLA).
    qk_d: u64,
    v_d: u64,
    swiglu: bool,
    dropout: bool,
    /// Rotary positions: q and k are rotated after the QKV projection (Llama).
    rope: bool,
    /// Parameters of one norm: 2h for LayerNorm (weight, bias), h for RMSNorm.
    norm_params: u64,
}

fn dims(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype) -> Dims {
    let t = p.tp as u64;
    let b = p.micro_batch as u64;
    let s = m.seq_len as u64;
    // Context parallelism: each rank holds s/cp tokens of every sequence.
    let tokens = b * s / p.cp.max(1) as u64;
    Dims {
        t,
        tokens,
        rows: if p.sequence_parallel { tokens / t } else { tokens },
        b,
        s,
        h: m.hidden as u64,
        h_t: m.hidden as u64 / t,
        q_t: m.q_dim() / t,
        kv_t: m.kv_dim() / t,
        f_t: m.ffn_hidden as u64 / t,
        v_t: (m.vocab as u64).div_ceil(t),
        a_t: m.heads as u64 / t,
        e: if dtype == Dtype::Fp8 { Dtype::Bf16.bytes() } else { dtype.bytes() },
        fp8: dtype == Dtype::Fp8,
        qk_d: m.qk_head_dim(),
        v_d: m.v_head_dim(),
        swiglu: m.activation == Activation::Swiglu,
        dropout: crate::accounting::memory::has_dropout(m),
        rope: !m.learned_positions(),
        norm_params: m.norm_params(),
    }
}

/// The attention's linear layers as (m, n, k) forward shapes: the input projections, then
/// the output projection last; and the bytes their outputs take (written and read once).
fn attn_linears(m: &ModelSpec, x: &Dims) -> (Vec<(u64, u64, u64)>, u64) {
    let Some(a) = &m.mla else {
        let qkv_n = x.q_t + 2 * x.kv_t;
        return (vec![(x.tokens, qkv_n, x.h), (x.tokens, x.h, x.q_t)], x.tokens * qkv_n * x.e);
    };
    let (r_q, r_kv) = (a.q_lora_rank as u64, a.kv_lora_rank as u64);
    let (nope, rope, v) = (a.qk_nope_head_dim as u64, a.qk_rope_head_dim as u64, a.v_head_dim as u64);
    let (q_n, kv_n) = (x.a_t * (nope + rope), x.a_t * (nope + v));
    let mut g = Vec::new();
    if r_q > 0 {
        g.push((x.rows, r_q, x.h));
        g.push((x.tokens, q_n, r_q));
    } else {
        g.push((x.tokens, q_n, x.h));
    }
    g.push((x.rows, r_kv + rope, x.h));
    g.push((x.tokens, kv_n, r_kv));
    g.push((x.tokens, x.h, x.a_t * v));
    let out = x.tokens * (q_n + kv_n + r_q + r_kv + rope) * x.e;
    (g, out)
}

/// The cost of one piece in one phase, for one microbatch on one tensor-parallel rank.
/// `Recompute` costs what the recomputation runs: the attention core alone for `Attn`
/// under selective recomputation, the full forward otherwise.
/// With `flash` (fused attention) the s×s scores never travel through memory, and the
/// backward kernel recomputes QKᵀ: five core GEMMs instead of four. `dtype` is the training
/// dtype (`training.dtype`): fp8 means bf16 tensors and fp8 linear GEMMs.
pub fn piece_cost(
    m: &ModelSpec,
    p: &ParallelConfig,
    dtype: Dtype,
    flash: bool,
    piece: Piece,
    phase: Phase,
) -> ComputeCost {
    let x = dims(m, p, dtype);
    let selective = phase == Phase::Recompute && p.recompute == crate::parallel::Recompute::Selective;
    let phase = if phase == Phase::Recompute && !selective { Phase::Forward } else { phase };
    let mask = u64::from(x.dropout);
    let rh = x.rows * x.h;
    let fc1_n = x.f_t * if x.swiglu { 2 } else { 1 };
    // The core's head width: `head_dim`, or under MLA the mean of the query/key and value widths,
    // so that a kernel model's 4·s²·d per head is the core's FLOPs.
    let core_d = (x.qk_d + x.v_d) / 2;
    let core =
        AttnShape { batch_heads: x.b * x.a_t, seq_q: x.s, seq_k: x.s, head_dim: core_d, causal: true, fused: flash };
    let core_gemms = |backward: bool| {
        let bh = x.b * x.a_t;
        let g = |m, n, k| Gemm { m, n, k, batch: bh, fp8: false };
        let (qk, v) = (x.qk_d, x.v_d);
        if backward {
            // dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q (+ QKᵀ recomputed when fused).
            let mut out = vec![g(x.s, x.s, v), g(x.s, v, x.s), g(x.s, qk, x.s), g(x.s, qk, x.s)];
            if flash {
                out.push(g(x.s, x.s, qk));
            }
            out
        } else {
            vec![g(x.s, x.s, qk), g(x.s, v, x.s)]
        }
    };
    let (linears, linear_out_bytes) = attn_linears(m, &x);
    let lin = |(m, n, k): (u64, u64, u64)| linear(m, n, k, x.fp8);
    // Latent attention's extra element-wise work: RMSNorms over the two latents.
    let (mla_bytes, mla_kernels) = match &m.mla {
        Some(a) => (2 * x.tokens * (a.q_lora_rank as u64 + a.kv_lora_rank as u64) * x.e, 2),
        None => (0, 0),
    };
    let scores = x.b * x.a_t * x.s * x.s;
    // Softmax reads scores and writes probabilities; dropout writes a mask and its output.
    let softmax_fwd_bytes = if flash { 0 } else { scores * (2 * x.e + mask * (1 + 2 * x.e)) };
    let norm_bytes = 2 * rh * x.e + x.norm_params * x.e;
    // RoPE reads and writes the local q and k heads (one fused kernel), forward and again
    // for their gradients in backward; the attention recomputation starts after it.
    let rope_width = match &m.mla {
        Some(a) => (x.a_t + 1) * a.qk_rope_head_dim as u64,
        None => x.q_t + x.kv_t,
    };
    let rope_bytes = if x.rope { 2 * x.tokens * rope_width * x.e } else { 0 };
    let rope_kernels = u32::from(x.rope);
    match (piece, phase) {
        (Piece::AttnQkv | Piece::AttnCore | Piece::AttnProj, _) => {
            cp::cp_piece_cost(m, p, dtype, flash, piece, phase, 0)
        }
        // Two norms (the hidden state's and the shifted embedding's), the concatenation and
        // the column-parallel 2h → h projection over all T tokens.
        (Piece::MtpProj, Phase::Forward) => {
            cost(vec![gemm(x.tokens, x.h_t, 2 * x.h)], None, 2 * norm_bytes + 2 * x.tokens * x.h * x.e, 3)
        }
        (Piece::MtpProj, Phase::BackwardInput) => {
            cost(vec![gemm(x.tokens, 2 * x.h, x.h_t)], None, 4 * norm_bytes + 2 * x.tokens * x.h * x.e, 3)
        }
        (Piece::MtpProj, _) => cost(vec![gemm(2 * x.h, x.h_t, x.tokens)], None, 2 * x.tokens * x.h * x.e, 1),
        (Piece::Router | Piece::Experts | Piece::SharedExperts, _) => match MoeShape::new(m, p, dtype) {
            Some(moe) => moe::moe_piece_cost(&moe, piece, phase),
            None => cost(vec![], None, 0, 0),
        },
        (Piece::Attn, Phase::Recompute) => cost(core_gemms(false), Some(core), softmax_fwd_bytes, 4),
        (Piece::Embed, Phase::Forward) => cost(vec![], None, 3 * x.tokens * x.h * x.e, 2),
        (Piece::Embed, _) => cost(vec![], None, x.tokens * x.h * (x.e + 4), 1),
        (Piece::AttnIn | Piece::FinalNorm, Phase::Forward) => cost(vec![], None, norm_bytes, 1),
        (Piece::AttnIn | Piece::FinalNorm, _) => cost(vec![], None, 2 * norm_bytes, 2),
        (Piece::MlpIn, Phase::Forward) => cost(vec![], None, 3 * rh * x.e + mask * rh + norm_bytes, 2),
        (Piece::MlpIn, _) => cost(vec![], None, 2 * norm_bytes + 2 * rh * x.e + mask * rh, 3),
        (Piece::LayerOut, Phase::Forward) => cost(vec![], None, 3 * rh * x.e + mask * rh, 1),
        (Piece::LayerOut, _) => cost(vec![], None, rh * x.e + mask * rh, 1),
        (Piece::Attn, Phase::Forward) => {
            let (out, ins) = linears.split_last().expect("attention has an output projection");
            let mut g: Vec<Gemm> = ins.iter().copied().map(lin).collect();
            g.extend(core_gemms(false));
            g.push(lin(*out));
            let bytes = 2 * linear_out_bytes + softmax_fwd_bytes + rope_bytes + mla_bytes;
            cost(g, Some(core), bytes, 7 + rope_kernels + mla_kernels)
        }
        (Piece::Attn, Phase::BackwardInput) => {
            // Data gradients, (m, n, k) → (m, k, n): the output projection's first.
            let (out, ins) = linears.split_last().expect("attention has an output projection");
            let dgrad = |(m, n, k): (u64, u64, u64)| lin((m, k, n));
            let mut g = vec![dgrad(*out)];
            g.extend(core_gemms(true));
            g.extend(ins.iter().rev().copied().map(dgrad));
            // Softmax backward reads P and dP and writes dS; dropout backward reads its mask.
            let softmax_bwd = if flash { 0 } else { scores * (3 * x.e + mask * (1 + 2 * x.e)) };
            let bytes = softmax_bwd + 2 * linear_out_bytes + rope_bytes + 2 * mla_bytes;
            cost(g, Some(core), bytes, 8 + rope_kernels + mla_kernels)
        }
        (Piece::Attn, _) => {
            // Weight gradients, (m, n, k) → (k, n, m), the input projections first.
            let g = linears.iter().map(|&(m, n, k)| lin((k, n, m))).collect();
            cost(g, None, linear_out_bytes, 3)
        }
        (Piece::Mlp, Phase::Forward) => {
            let g = vec![linear(x.tokens, fc1_n, x.h, x.fp8), linear(x.tokens, x.h, x.f_t, x.fp8)];
            let act = if x.swiglu { 3 } else { 2 } * x.tokens * x.f_t * x.e;
            cost(g, None, act, 3)
        }
        (Piece::Mlp, Phase::BackwardInput) => {
            let g = vec![linear(x.tokens, x.f_t, x.h, x.fp8), linear(x.tokens, x.h, fc1_n, x.fp8)];
            let act = if x.swiglu { 5 } else { 3 } * x.tokens * x.f_t * x.e;
            cost(g, None, act, 3)
        }
        (Piece::Mlp, _) => {
            let g = vec![linear(x.h, fc1_n, x.tokens, x.fp8), linear(x.f_t, x.h, x.tokens, x.fp8)];
            cost(g, None, x.tokens * (fc1_n + x.h) * x.e, 3)
        }
        (Piece::Logits, Phase::Forward) => cost(vec![gemm(x.tokens, x.v_t, x.h)], None, 2 * x.tokens * x.v_t * 4, 2),
        (Piece::Logits, Phase::BackwardInput) => {
            cost(vec![gemm(x.tokens, x.h, x.v_t)], None, x.tokens * x.v_t * (4 + x.e), 2)
        }
        (Piece::Logits, _) => cost(vec![gemm(x.v_t, x.h, x.tokens)], None, x.tokens * x.v_t * x.e, 1),
        (Piece::Loss, _) => cost(vec![], None, x.tokens * 3 * 4 * x.t, 1),
        (Piece::Optimizer, _) => cost(vec![], None, 0, 0),
    }
}

/// Bytes and kernels Megatron-LM's unfused vocab-parallel cross entropy
/// (`megatron/core/tensor_parallel/cross_entropy.py`, `_VocabParallelCrossEntropy`; the same
/// passes in Megatron-DeepSpeed's `mpu/cross_entropy.py`) moves over one rank's logits, in
/// place of the generic head cost of [`piece_cost`]. Over the N = T · V/t local logits
/// (e-byte activations, fp32 arithmetic):
/// - before the loss statistics' all-reduces (charged to `Logits` forward): the cast to fp32
///   (`.float()`: read e, write 4), the row max (read 4), the in-place subtraction of the
///   max (read 4, write 4), the in-place `exp` (read 4, write 4) and the row sum (read 4):
///   (e + 28)·N bytes, five kernels beside the GEMM;
/// - after them (charged to `Loss` forward): the in-place division by the sum that leaves
///   the softmax saved for backward (read 4, write 4): 8·N bytes, one kernel;
/// - backward (charged to `Logits` backward-input): the in-place multiplication by the
///   incoming loss gradient (read 4, write 4), then the fp32 gradient cast back to the
///   e-byte activation dtype for the output layer's GEMMs (read 4, write e): (12 + e)·N
///   bytes, two kernels (the target-logit update touches T elements only).
///
/// The generic cost charges 8·N (fp32 logits written and read) forward and (4 + e)·N
/// backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrossEntropyPasses {
    pub logits_fwd_bytes: u64,
    pub logits_fwd_kernels: u32,
    pub loss_fwd_bytes: u64,
    pub loss_fwd_kernels: u32,
    pub logits_bwd_bytes: u64,
    pub logits_bwd_kernels: u32,
}

/// [`CrossEntropyPasses`] for one microbatch on one tensor-parallel rank.
pub fn vocab_parallel_cross_entropy(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype) -> CrossEntropyPasses {
    let x = dims(m, p, dtype);
    let n = x.tokens * x.v_t;
    CrossEntropyPasses {
        logits_fwd_bytes: (x.e + 28) * n,
        logits_fwd_kernels: 6,
        loss_fwd_bytes: 8 * n,
        loss_fwd_kernels: 1,
        logits_bwd_bytes: (12 + x.e) * n,
        logits_bwd_kernels: 3,
    }
}

/// `LayerOut` of a mixture-of-experts layer: the dense residual add plus the combine's
/// un-permutation, probability weighting and shared add ([`moe`]'s `moe_layer_out`).
pub fn moe_layer_out_cost(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype, phase: Phase) -> ComputeCost {
    let dense = piece_cost(m, p, dtype, false, Piece::LayerOut, phase);
    match MoeShape::new(m, p, dtype) {
        Some(x) => moe::moe_layer_out(&x, dense),
        None => dense,
    }
}

/// DeepSpeed `BF16_Optimizer`'s gradient passes around one microbatch's backward over a
/// rank's `params` parameters in `tensors` tensors (`runtime/bf16_optimizer.py`,
/// [`crate::framework::mechanics`]), bf16 gradients (2 bytes) into a buffer of `hp_bytes`
/// per element (4 for its fp32 buffer under ZeRO-1, 2 for the bf16 one of a pipeline at
/// ZeRO-0):
/// - `update_hp_grads` after every backward, per tensor `hp.add_(lp.grad.to(hp.dtype))`:
///   into fp32 the cast reads 2 and writes a 4-byte temporary, the add reads 4 + 4 and
///   writes 4 — 18 bytes, two kernels; into bf16 the cast is a no-op and the add reads
///   2 + 2 and writes 2 — 6 bytes, one kernel;
/// - on the first microbatch, the buffer zeroed by the previous step's `zero_grad`
///   (`clear_hp_grads`, one flat write of `hp_bytes`; the bf16 gradients are `None` then,
///   and autograd stores the new ones without an add): 22 bytes (fp32) or 8 (bf16);
/// - on every later microbatch, `clear_lp_grads` zeroes the kept bf16 gradients (write 2,
///   one `_foreach_zero_` kernel per tensor) and autograd's `AccumulateGrad` adds each new
///   gradient into them in place (read 2 + 2, write 2, one kernel): 26 bytes and four
///   kernels per tensor (fp32), 14 bytes and three kernels (bf16).
pub fn bf16_optimizer_accumulate(params: u64, tensors: u64, hp_bytes: u64, first_mb: bool) -> ComputeCost {
    let (add_bytes, add_kernels) = if hp_bytes == 2 { (6, 1) } else { (2 + 4 + 3 * hp_bytes, 2) };
    let (bytes, kernels) =
        if first_mb { (add_bytes + hp_bytes, add_kernels) } else { (add_bytes + 8, add_kernels + 2) };
    let kernels = u32::try_from(kernels * tensors).unwrap_or(u32::MAX);
    cost(vec![], None, bytes * params, kernels)
}

/// The optimizer step over `params` parameters (the rank's shard under ZeRO ≥ 1): AdamW
/// reads and writes fp32 master weights, momentum and variance, reads the gradient and
/// writes the working-precision weights — 28 bytes per parameter in mixed precision and
/// in fp32 alike (where the weights are the master copy but the gradient is 4 bytes) —
/// and the gradient is read once more for its norm and zeroed for the next step.
pub fn optimizer_cost(params: u64, grad_bytes: u64) -> ComputeCost {
    cost(vec![], None, (28 + 2 * grad_bytes) * params, 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama70b_tp8() -> (ModelSpec, ParallelConfig) {
        let m = ModelSpec::preset("llama3-70b").unwrap();
        (m, ParallelConfig { tp: 8, micro_batch: 1, sequence_parallel: true, ..Default::default() })
    }

    #[test]
    fn gqa_attention_matches_its_closed_form() {
        // Llama 3 70B: h 8192, 64 query heads, 8 kv heads of d 128; tp 8, b 1, s 8192.
        let (m, p) = llama70b_tp8();
        let (t, s, h, d) = (8u64, 8192u64, 8192u64, 128u64);
        let (a_t, kv_t) = (64 / t, 8 * d / t);
        let tokens = s;
        let c = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Attn, Phase::Forward);
        // QKV: n = h/t + 2·kv/t = 1024 + 256, not 3h/t as without GQA.
        assert_eq!(c.gemms[0], Gemm { m: tokens, n: h / t + 2 * kv_t, k: h, batch: 1, fp8: false });
        assert_eq!(c.gemms[0].n, 1280);
        let core_flops = 4 * a_t * s * s * d;
        let want = 2 * tokens * h * (h / t + 2 * kv_t) + core_flops + 2 * tokens * h * (h / t);
        assert_eq!(c.flops, want);
        let a = c.attention.unwrap();
        assert_eq!((a.batch_heads, a.seq_q, a.head_dim, a.causal, a.fused), (a_t, s, d, true, true));
        // Fused: no score traffic; QKV write + read and RoPE over q and k only.
        let rope = 2 * tokens * (h / t + kv_t) * 2;
        assert_eq!(c.mem_bytes, 2 * tokens * (h / t + 2 * kv_t) * 2 + rope);
        // Backward recomputes QKᵀ inside the fused kernel: 2.5× the core's forward FLOPs.
        let b = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Attn, Phase::BackwardInput);
        let core_b: u64 = b.gemms.iter().filter(|g| g.batch == a_t).map(Gemm::flops).sum();
        assert_eq!(2 * core_b, 5 * core_flops);
        // Unfused, the scores move through memory and the plan says so.
        let u = piece_cost(&m, &p, Dtype::Bf16, false, Piece::Attn, Phase::Forward);
        assert!(!u.attention.unwrap().fused && u.mem_bytes > c.mem_bytes + a_t * s * s);
    }

    #[test]
    fn swiglu_is_three_gemms_of_h_by_f() {
        let (m, p) = llama70b_tp8();
        let (t, s, h, f) = (8u64, 8192u64, 8192u64, 28672u64);
        let fwd = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Mlp, Phase::Forward);
        // gate and up fused (n = 2f/t), down (k = f/t): 3 · 2·T·h·f/t FLOPs.
        assert_eq!(fwd.gemms, vec![gemm(s, 2 * f / t, h), gemm(s, h, f / t)]);
        assert_eq!(fwd.flops, 3 * 2 * s * h * f / t);
        // SiLU(gate)·up reads two f/t-wide tensors and writes one.
        assert_eq!(fwd.mem_bytes, 3 * s * (f / t) * 2);
        let bi = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Mlp, Phase::BackwardInput);
        let bw = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Mlp, Phase::BackwardWeight);
        assert_eq!(bi.flops + bw.flops, 2 * fwd.flops);
    }

    #[test]
    fn a_128k_vocabulary_output_layer_and_loss_follow_their_shapes() {
        // Untied output layer of Llama 3 (V = 128,256), vocab-parallel over tp 8.
        let (m, p) = llama70b_tp8();
        let (t, s, h) = (8u64, 8192u64, 8192u64);
        let v_t = 128_256u64.div_ceil(t);
        let f = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Logits, Phase::Forward);
        assert_eq!(f.gemms, vec![gemm(s, v_t, h)]);
        assert_eq!(f.flops, 2 * s * v_t * h);
        // fp32 logits written and read by the loss: 8 bytes per local logit.
        assert_eq!(f.mem_bytes, 2 * s * v_t * 4);
        let bi = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Logits, Phase::BackwardInput);
        assert_eq!((bi.gemms[0], bi.mem_bytes), (gemm(s, h, v_t), s * v_t * (4 + 2)));
        let bw = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Logits, Phase::BackwardWeight);
        assert_eq!(bw.gemms, vec![gemm(v_t, h, s)]);
        // The loss itself moves per-token scalars (max, sum, target logit) across tp ranks.
        let l = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Loss, Phase::Forward);
        assert_eq!((l.flops, l.mem_bytes), (0, s * 3 * 4 * t));
        // The output layer is the largest GEMM of the stage: V_t·h > 3·(h·f/t) / 2 here.
        assert!(f.flops > piece_cost(&m, &p, Dtype::Bf16, true, Piece::Mlp, Phase::Forward).flops / 2);
    }

    #[test]
    fn rope_and_rmsnorm_are_llama_only() {
        let (llama, p) = llama70b_tp8();
        let mut gpt = ModelSpec::preset("gpt3-175b").unwrap();
        gpt.seq_len = 2048;
        let rows = 8192 / 8;
        let n = piece_cost(&llama, &p, Dtype::Bf16, true, Piece::AttnIn, Phase::Forward);
        assert_eq!(n.mem_bytes, 2 * rows * 8192 * 2 + 8192 * 2, "RMSNorm: weight, no bias");
        let g = piece_cost(&gpt, &p, Dtype::Bf16, true, Piece::AttnIn, Phase::Forward);
        assert_eq!(g.mem_bytes, 2 * (2048 / 8) * 12288 * 2 + 2 * 12288 * 2, "LayerNorm: weight and bias");
        // GPT: no RoPE bytes or kernel in the attention piece.
        let a = piece_cost(&gpt, &p, Dtype::Bf16, true, Piece::Attn, Phase::Forward);
        assert_eq!((a.mem_bytes, a.kernels), (2 * 2048 * (3 * 12288 / 8) * 2, 7));
    }

    #[test]
    fn layer_gemm_flops_match_the_accounting() {
        // One layer, one microbatch, summed over tp ranks: forward 2·T·(layer flops per token),
        // backward (input + weight) twice that.
        let m = ModelSpec::preset("llama3-8b").unwrap();
        for tp in [1, 2, 8] {
            let p = ParallelConfig { tp, micro_batch: 2, ..Default::default() };
            let f = |piece, phase| piece_cost(&m, &p, Dtype::Bf16, false, piece, phase).flops * tp as u64;
            let tokens = 2 * m.seq_len as u64;
            let per_token = crate::accounting::flops::layer_forward_flops_per_token(&m);
            assert_eq!(f(Piece::Attn, Phase::Forward) + f(Piece::Mlp, Phase::Forward), tokens * per_token);
            let bwd = f(Piece::Attn, Phase::BackwardInput)
                + f(Piece::Attn, Phase::BackwardWeight)
                + f(Piece::Mlp, Phase::BackwardInput)
                + f(Piece::Mlp, Phase::BackwardWeight);
            assert_eq!(bwd, 2 * tokens * per_token);
        }
    }

    #[test]
    fn mla_gemms_follow_deepseek_v3_shapes_and_sum_to_the_accounting() {
        let m = ModelSpec::preset("deepseek-v3").unwrap();
        let (s, h) = (4096u64, 7168u64);
        let p = ParallelConfig { tp: 1, micro_batch: 1, ..Default::default() };
        let f = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Attn, Phase::Forward);
        let shapes: Vec<(u64, u64, u64, u64)> = f.gemms.iter().map(|g| (g.m, g.n, g.k, g.batch)).collect();
        assert_eq!(
            shapes,
            vec![
                (s, 1536, h, 1),         // q down
                (s, 128 * 192, 1536, 1), // q up: 128 heads of 128 + 64
                (s, 512 + 64, h, 1),     // kv down with the shared rotary key
                (s, 128 * 256, 512, 1),  // kv up: 128 heads of 128 (key) + 128 (value)
                (s, s, 192, 128),        // QKᵀ
                (s, 128, s, 128),        // P·V
                (s, h, 128 * 128, 1),    // output
            ]
        );
        assert_eq!(f.attention.unwrap().head_dim, 160);
        // Forward and backward sum to the accounting's latent-attention FLOPs, for tp 1 and
        // for tp 8 with sequence parallelism (the duplicated down projections see T/8 rows).
        for p in [p.clone(), ParallelConfig { tp: 8, sequence_parallel: true, ..p.clone() }] {
            let tp = p.tp as u64;
            let c = |phase| piece_cost(&m, &p, Dtype::Bf16, false, Piece::Attn, phase).flops * tp;
            let per_token = crate::accounting::flops::attention_linear_forward_flops_per_token(&m)
                + crate::accounting::flops::attention_core_forward_flops_per_token(&m);
            assert_eq!(c(Phase::Forward), s * per_token, "tp {tp}");
            assert_eq!(c(Phase::BackwardInput) + c(Phase::BackwardWeight), 2 * s * per_token, "tp {tp}");
        }
        // Without sequence parallelism every tp rank runs the down projections on all T rows.
        let no_sp = ParallelConfig { tp: 8, ..p };
        let dup = piece_cost(&m, &no_sp, Dtype::Bf16, false, Piece::Attn, Phase::Forward).flops * 8;
        let down = 2 * s * h * (1536 + 576);
        assert_eq!(
            dup - s
                * (crate::accounting::flops::attention_linear_forward_flops_per_token(&m)
                    + crate::accounting::flops::attention_core_forward_flops_per_token(&m)),
            7 * down
        );
    }

    #[test]
    fn fp8_marks_linear_gemms_only() {
        let (m, p) = llama70b_tp8();
        for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight] {
            let a = piece_cost(&m, &p, Dtype::Fp8, true, Piece::Attn, phase);
            // QKV and projection in fp8, the core (batched over heads) in bf16.
            assert!(a.gemms.iter().all(|g| g.fp8 == (g.batch == 1)), "{phase:?}: {:?}", a.gemms);
            let mlp = piece_cost(&m, &p, Dtype::Fp8, true, Piece::Mlp, phase);
            assert!(mlp.gemms.iter().all(|g| g.fp8));
            let head = piece_cost(&m, &p, Dtype::Fp8, true, Piece::Logits, phase);
            assert!(head.gemms.iter().all(|g| !g.fp8));
            // Tensors stay bf16: the same bytes and FLOPs as bf16 training.
            let b = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Attn, phase);
            assert_eq!((a.flops, a.mem_bytes), (b.flops, b.mem_bytes));
            assert!(b.gemms.iter().all(|g| !g.fp8));
        }
        assert_eq!(linear(2, 3, 4, true), Gemm { m: 2, n: 3, k: 4, batch: 1, fp8: true });
    }
}
