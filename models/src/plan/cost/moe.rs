//! Costs of a mixture-of-experts layer's pieces, per rank and microbatch, in the shapes of
//! [`crate::plan::moe::MoeShape`] (T tokens routed, R rows dispatched, E experts, E/ep
//! local, f one expert's width, f_s the shared experts' width on one tp rank):
//! - `Router` fwd: the gate GEMM (T × E × h), the fp32 scores (written, read and written
//!   by softmax or sigmoid), top-k (reads the scores, writes k weights and indices), and
//!   the permutation of the tokens into per-destination order (R rows of h read and
//!   written); bwd-in: the gate's data gradient (T × h × E), the score backward and the
//!   un-permutation of the dispatched gradient (R rows read, T written); bwd-w: h × E × T;
//! - `Experts`: one GEMM per local expert (Megatron-core's grouped GEMM), m = the rows that
//!   expert receives, balanced; FC1 (m × fc1 × h) and FC2 (m × h × f), and backward likewise;
//! - `SharedExperts`: a tensor-parallel MLP of width f_s over b·s/cp tokens, as `Mlp`;
//! - `LayerOut` of a MoE layer (`moe_layer_out`): the dense residual add plus the
//!   un-permutation of the combined rows, the weighting by the router's probabilities and
//!   the shared output's add (R rows read, T written); backward the same traffic again.
//!
//! FLOPs are GEMMs only, so summed over the ranks of a step they are the MoE layers'
//! 2·T·E·h (router) + 2·R·(fc1 + f)·h (experts) + the shared MLP, times 3 with backward.

use crate::plan::ir::{ComputeCost, Gemm, Phase, Piece};
use crate::plan::moe::MoeShape;

use super::{cost, gemm};

/// The cost of `Router`, `Experts` or `SharedExperts` in `phase` (Recompute = Forward).
pub(super) fn moe_piece_cost(x: &MoeShape, piece: Piece, phase: Phase) -> ComputeCost {
    let phase = if phase == Phase::Recompute { Phase::Forward } else { phase };
    let (t, r, e, h) = (x.tokens, x.routed, x.e, x.h);
    let scores = t * x.experts * 4;
    let topk = t * x.top_k * 8;
    let per_expert = |f: &dyn Fn(u64) -> Vec<Gemm>| -> Vec<Gemm> {
        x.expert_rows().into_iter().filter(|m| *m > 0).flat_map(f).collect()
    };
    let act = |fwd: bool| {
        if x.swiglu {
            if fwd { 3 } else { 5 }
        } else if fwd {
            2
        } else {
            3
        }
    };
    match (piece, phase) {
        (Piece::Router, Phase::Forward) => {
            cost(vec![gemm(t, x.experts, h)], None, 3 * scores + scores + topk + 2 * r * h * e, 4)
        }
        (Piece::Router, Phase::BackwardInput) => {
            cost(vec![gemm(t, h, x.experts)], None, 3 * scores + topk + (r + t) * h * e, 3)
        }
        (Piece::Router, _) => cost(vec![gemm(h, x.experts, t)], None, t * x.experts * e, 1),
        (Piece::Experts, Phase::Forward) => {
            let g = per_expert(&|m| vec![gemm(m, x.fc1(), h), gemm(m, h, x.f)]);
            cost(g, None, act(true) * r * x.f * e, 3)
        }
        (Piece::Experts, Phase::BackwardInput) => {
            let g = per_expert(&|m| vec![gemm(m, x.f, h), gemm(m, h, x.fc1())]);
            cost(g, None, act(false) * r * x.f * e, 3)
        }
        (Piece::Experts, _) => {
            let g = per_expert(&|m| vec![gemm(h, x.fc1(), m), gemm(x.f, h, m)]);
            cost(g, None, r * (x.fc1() + h) * e, 3)
        }
        (Piece::SharedExperts, _) if x.shared_f_t == 0 => cost(vec![], None, 0, 0),
        (Piece::SharedExperts, Phase::Forward) => {
            let n = x.full_tokens;
            let g = vec![gemm(n, x.shared_fc1(), h), gemm(n, h, x.shared_f_t)];
            cost(g, None, act(true) * n * x.shared_f_t * e, 3)
        }
        (Piece::SharedExperts, Phase::BackwardInput) => {
            let n = x.full_tokens;
            let g = vec![gemm(n, x.shared_f_t, h), gemm(n, h, x.shared_fc1())];
            cost(g, None, act(false) * n * x.shared_f_t * e, 3)
        }
        (Piece::SharedExperts, _) => {
            let n = x.full_tokens;
            let g = vec![gemm(h, x.shared_fc1(), n), gemm(x.shared_f_t, h, n)];
            cost(g, None, n * (x.shared_fc1() + h) * e, 3)
        }
        _ => cost(vec![], None, 0, 0),
    }
}

/// A MoE layer's `LayerOut`: `dense` (the dense layer's residual add) plus the combine's
/// un-permutation, probability weighting and shared add (R rows and the shared output
/// read, T rows written), forward and backward alike.
pub(super) fn moe_layer_out(x: &MoeShape, dense: ComputeCost) -> ComputeCost {
    let extra = (x.routed + 2 * x.tokens) * x.h * x.e + x.tokens * x.top_k * 4;
    cost(dense.gemms, dense.attention, dense.mem_bytes + extra, dense.kernels + 1)
}
