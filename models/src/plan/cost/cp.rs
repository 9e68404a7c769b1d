//! The cost of a context-parallel attention (cp > 1), split as the plan runs it: `AttnQkv`
//! (the QKV projection and RoPE of the rank's b·s/cp tokens), `AttnCore` (softmax
//! attention, per ring step under ring attention) and `AttnProj` (the output projection).
//!
//! The core's shape follows Transformer Engine's `context_parallel.py`, where the sequence
//! is cut into 2·cp chunks and rank r holds chunks r and 2·cp − 1 − r:
//! - ring (`AttnFuncWithCPAndKVP2P`): cp steps of (s/cp) queries × (s/cp) keys. Step 0 is
//!   the diagonal: the rank's two chunks against themselves, causal. At a later step TE
//!   runs half of the block without a mask — both query chunks against the first K/V chunk
//!   when the K/V came from an earlier rank, else the second query chunk against both K/V
//!   chunks — and then corrects the running output and log-sum-exp (the online-softmax
//!   merge, an fp32 read and write of the output per step);
//! - all-gather (`AttnFuncWithCPAndKVAllGather`): (s/cp) queries against all s keys, causal;
//! - Ulysses (`AttnFuncWithCPAndQKVOA2A`): all s tokens for (a/t)/cp heads, causal.
//!
//! Every core's GEMMs are listed at the full block, the convention the unsplit `Attn`
//! follows for its causal core (Megatron-LM counts the masked half), so a plan's FLOPs
//! summed over its ranks equal [`crate::accounting::flops::scenario_step_flops`] for every
//! cp and variant: cp² ring blocks of (s/cp)² make s², as do cp all-gather rows of (s/cp)·s
//! and cp Ulysses head groups. The backward lists the score GEMM QKᵀ a second time, fused
//! or not: a block's backward recomputes its probabilities from the row's log-sum-exp (TE's
//! fused kernels do; so does the CPU executor's `attention_cp::block_backward`).
//!
//! The shape (`AttnShape`) says what a fused kernel attends, so that the simulator costs the
//! kernel TE launches: the diagonal step and the all-gather and Ulysses cores are causal
//! (half of the listed block); a later ring step is TE's half block *without* a mask —
//! (s/cp) queries against the s/(2·cp) keys of the first K/V chunk, the case of the ranks
//! after the sender (r > j), which every step has and which attend fewer keys per query
//! than the other case (the second query chunk against all s/cp keys), so they set the
//! step's pace. The CPU executor computes every listed block whole, masking by position,
//! which is what an unfused core is costed at (its GEMMs).

use super::{Dims, cost, dims, linear};
use crate::model::ModelSpec;
use crate::parallel::{CpComm, ParallelConfig};
use crate::plan::ir::{AttnShape, ComputeCost, Gemm, Phase, Piece};
use crate::scenario::Dtype;

/// The attention core of one context-parallel rank: the whole core under all-gather and
/// Ulysses, one ring step's block under ring attention (the same shape at every step).
pub fn attn_core_shape(m: &ModelSpec, p: &ParallelConfig, flash: bool) -> AttnShape {
    let x = dims(m, p, Dtype::Bf16);
    core_shape(&x, p, flash, 0)
}

/// The GEMMs' block (queries, keys) and the shape the kernel attends at ring step `step`.
fn core_shape(x: &Dims, p: &ParallelConfig, flash: bool, step: u32) -> AttnShape {
    let c = p.cp.max(1) as u64;
    let (batch_heads, seq_q, seq_k) = match p.cp_comm {
        CpComm::Ring => (x.b * x.a_t, x.s / c, x.s / c),
        CpComm::AllGather => (x.b * x.a_t, x.s / c, x.s),
        CpComm::Ulysses => (x.b * x.a_t / c, x.s, x.s),
    };
    let d = (x.qk_d + x.v_d) / 2;
    if p.cp_comm == CpComm::Ring && step > 0 {
        // TE's later step: half the block, unmasked (both query chunks, the first K/V chunk).
        return AttnShape { batch_heads, seq_q, seq_k: seq_k / 2, head_dim: d, causal: false, fused: flash };
    }
    AttnShape { batch_heads, seq_q, seq_k, head_dim: d, causal: true, fused: flash }
}

/// The cost of a context-parallel attention piece in one phase, for one microbatch on one
/// rank; `step` is the ring step of an `AttnCore` (0 otherwise). `Recompute` costs the
/// forward (of the core alone under selective recomputation).
pub fn cp_piece_cost(
    m: &ModelSpec,
    p: &ParallelConfig,
    dtype: Dtype,
    flash: bool,
    piece: Piece,
    phase: Phase,
    step: u32,
) -> ComputeCost {
    let x = dims(m, p, dtype);
    let phase = if phase == Phase::Recompute { Phase::Forward } else { phase };
    let qkv_n = x.q_t + 2 * x.kv_t;
    let rope_bytes = if x.rope { 2 * x.tokens * (x.q_t + x.kv_t) * x.e } else { 0 };
    let rope_kernels = u32::from(x.rope);
    match (piece, phase) {
        (Piece::AttnQkv, Phase::Forward) => cost(
            vec![linear(x.tokens, qkv_n, x.h, x.fp8)],
            None,
            2 * x.tokens * qkv_n * x.e + rope_bytes,
            2 + rope_kernels,
        ),
        (Piece::AttnQkv, Phase::BackwardInput) => cost(
            vec![linear(x.tokens, x.h, qkv_n, x.fp8)],
            None,
            2 * x.tokens * qkv_n * x.e + rope_bytes,
            2 + rope_kernels,
        ),
        (Piece::AttnQkv, _) => cost(vec![linear(x.h, qkv_n, x.tokens, x.fp8)], None, x.tokens * qkv_n * x.e, 2),
        (Piece::AttnProj, Phase::Forward) => cost(vec![linear(x.tokens, x.h, x.q_t, x.fp8)], None, 0, 1),
        (Piece::AttnProj, Phase::BackwardInput) => cost(vec![linear(x.tokens, x.q_t, x.h, x.fp8)], None, 0, 1),
        (Piece::AttnProj, _) => cost(vec![linear(x.q_t, x.h, x.tokens, x.fp8)], None, 0, 1),
        (Piece::AttnCore, Phase::Forward | Phase::BackwardInput) => {
            let a = core_shape(&x, p, flash, step);
            let backward = phase == Phase::BackwardInput;
            let g = |m, n, k| Gemm { m, n, k, batch: a.batch_heads, fp8: false };
            // The listed block: the whole (s/cp)² of a ring step, whatever the kernel attends.
            let (sq, sk, d) = (a.seq_q, core_shape(&x, p, flash, 0).seq_k, a.head_dim);
            let mut gemms = vec![g(sq, sk, d), g(sq, d, sk)];
            if backward {
                // dV, dP, dQ, dK and the recomputed QKᵀ.
                gemms.extend([g(sq, d, sk), g(sq, d, sk), g(sq, sk, d)]);
            }
            let mask = u64::from(x.dropout);
            let scores = a.batch_heads * sq * sk;
            let softmax = match (flash, backward) {
                (true, _) => 0,
                (false, false) => scores * (2 * x.e + mask * (1 + 2 * x.e)),
                (false, true) => scores * (3 * x.e + mask * (1 + 2 * x.e)),
            };
            // A later ring step merges its partial output into the running one: the fp32
            // output and log-sum-exp read and written (TE's `flash_attn_fwd_out_correction`);
            // in backward the received dK/dV are added to (one read, one write).
            let merge = p.cp_comm == CpComm::Ring && step > 0;
            let merge_bytes = match (merge, backward) {
                (false, _) => 0,
                (true, false) => 2 * x.tokens * x.q_t * 4,
                (true, true) => 2 * x.tokens * 2 * x.kv_t * x.e,
            };
            let kernels = if backward { 5 } else { 4 } + u32::from(merge);
            cost(gemms, Some(a), softmax + merge_bytes, kernels)
        }
        (Piece::AttnCore, _) => cost(vec![], None, 0, 0),
        (piece, _) => unreachable!("{piece:?} is not a context-parallel attention piece"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::cost::piece_cost;

    fn gpt(seq: u32) -> ModelSpec {
        let mut m = ModelSpec::preset("gpt2-350m").unwrap();
        m.seq_len = seq;
        m
    }

    /// Over the cp ranks (and ring steps), the split attention's FLOPs are the unsplit
    /// `Attn`'s, in every phase and variant, with and without fused attention and tp — the
    /// fused `Attn`'s, since a block's backward always recomputes QKᵀ.
    #[test]
    fn split_attention_flops_sum_to_the_unsplit_pieces() {
        let m = gpt(2048);
        for comm in CpComm::ALL {
            for (cp, tp) in [(2u32, 1u32), (4, 2), (8, 1)] {
                for flash in [false, true] {
                    let one = ParallelConfig { tp, micro_batch: 2, ..Default::default() };
                    let p = ParallelConfig { cp, cp_comm: comm, ..one.clone() };
                    for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight] {
                        let want = piece_cost(&m, &one, Dtype::Bf16, true, Piece::Attn, phase).flops;
                        let steps = if comm == CpComm::Ring { cp } else { 1 };
                        let core: u64 = if phase == Phase::BackwardWeight {
                            0
                        } else {
                            (0..steps)
                                .map(|i| cp_piece_cost(&m, &p, Dtype::Bf16, flash, Piece::AttnCore, phase, i).flops)
                                .sum()
                        };
                        let f = |piece| cp_piece_cost(&m, &p, Dtype::Bf16, flash, piece, phase, 0).flops;
                        let got = (f(Piece::AttnQkv) + core + f(Piece::AttnProj)) * cp as u64;
                        assert_eq!(got, want, "{comm:?} cp {cp} tp {tp} flash {flash} {phase:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn core_shapes_follow_transformer_engine() {
        let m = gpt(4096);
        let shape = |comm, cp| {
            let p = ParallelConfig { tp: 2, cp, cp_comm: comm, micro_batch: 1, ..Default::default() };
            let a = attn_core_shape(&m, &p, true);
            (a.batch_heads, a.seq_q, a.seq_k)
        };
        // gpt2-350m: 16 heads, 8 per tp rank.
        assert_eq!(shape(CpComm::Ring, 4), (8, 1024, 1024));
        assert_eq!(shape(CpComm::AllGather, 4), (8, 1024, 4096));
        assert_eq!(shape(CpComm::Ulysses, 4), (2, 4096, 4096));
        // Every other piece works on the rank's s/cp tokens.
        let p = ParallelConfig { cp: 4, ..Default::default() };
        let mlp = piece_cost(&m, &p, Dtype::Bf16, true, Piece::Mlp, Phase::Forward);
        assert_eq!(mlp.gemms[0].m, 1024);
        // A later ring step merges its output: one more kernel than the diagonal step.
        let ring = ParallelConfig { cp: 4, ..Default::default() };
        let k = |step| cp_piece_cost(&m, &ring, Dtype::Bf16, true, Piece::AttnCore, Phase::Forward, step);
        assert_eq!(k(1).kernels, k(0).kernels + 1);
        assert_eq!(k(1).flops, k(0).flops);
        assert!(k(1).mem_bytes > k(0).mem_bytes);
        // The diagonal step's kernel is causal over the 1024 × 1024 block; a later step's is
        // TE's unmasked half: the 1024 queries against 512 keys, the GEMMs still listed whole.
        let (a0, a1) = (k(0).attention.unwrap(), k(1).attention.unwrap());
        assert_eq!((a0.seq_q, a0.seq_k, a0.causal), (1024, 1024, true));
        assert_eq!((a1.seq_q, a1.seq_k, a1.causal), (1024, 512, false));
        assert_eq!(k(1).gemms, k(0).gemms);
        // Backward lists dV, dP, dQ, dK and the recomputed QKᵀ, fused or not.
        let unfused = cp_piece_cost(&m, &ring, Dtype::Fp32, false, Piece::AttnCore, Phase::BackwardInput, 1);
        assert_eq!(unfused.gemms.len(), 5);
    }
}
