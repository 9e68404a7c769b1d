//! The router (the plan's `Router`): gate logits l = x·Wr, scores s = exp(l − max l)
//! (softmax) or σ(l) (sigmoid), the top-k experts per token (descending score, ties to the
//! lower index), and weights w = s_sel / Σ s_sel — Mixtral's softmax over the selected
//! logits, DeepSeek-V3's normalised sigmoid scores (Megatron-core `TopKRouter`,
//! `--moe-router-pre-softmax` off). Backward: with S = Σ s_sel,
//! dl_j = (dw_j − Σ_i dw_i·w_i) / S · s'(l_j) for a selected j (s' = s for the exponential,
//! s·(1 − s) for the sigmoid), 0 for the others (the selection is piecewise constant).

use strata_models::model::RouterScore;

use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::moe::MoeDims;

/// A microbatch's routing on one rank: T tokens, E experts, k slots per token.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Routing {
    /// Scores s (T, E).
    pub scores: Vec<f32>,
    /// Selected experts (T, k), global indices.
    pub idx: Vec<u32>,
    /// Normalised weights of the selected experts (T, k).
    pub weight: Vec<f32>,
}

/// Routes the tokens `x` (T, h) with the gate `w` (h, E).
pub fn router_forward(d: &MoeDims, w: &[f32], x: &[f32]) -> Routing {
    let (h, e, k) = (d.hidden, d.experts, d.top_k);
    let t = x.len() / h;
    let mut scores = vec![0.0f32; t * e];
    matmul(MatRef::new(x, t, h), MatRef::new(w, h, e), MatMut::new(&mut scores, t, e), Transpose::Nn, 1.0, 0.0);
    let mut idx = Vec::with_capacity(t * k);
    let mut weight = Vec::with_capacity(t * k);
    for row in scores.chunks_exact_mut(e) {
        match d.score {
            RouterScore::Softmax => {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row.iter_mut().for_each(|v| *v = (*v - m).exp());
            }
            RouterScore::Sigmoid => row.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
        }
        let mut order: Vec<usize> = (0..e).collect();
        // Descending score, ties to the lower index: a total order, so every rank agrees.
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let sel = &order[..k];
        let sum: f32 = sel.iter().map(|&j| row[j]).sum();
        for &j in sel {
            idx.push(j as u32);
            weight.push(row[j] / sum);
        }
    }
    Routing { scores, idx, weight }
}

/// Backward of the router from the weights' gradient `dweight` (T, k): adds dl·Wrᵀ to `dx`
/// (T, h) and xᵀ·dl to `dw` (h, E).
pub fn router_backward(
    d: &MoeDims,
    w: &[f32],
    x: &[f32],
    r: &Routing,
    dweight: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
) {
    let dl = router_backward_input(d, w, r, dweight, dx);
    router_backward_weight(d, x, &dl, dw);
}

/// The input half: the logits' gradient dl (T, E), returned, and dx += dl·Wrᵀ.
pub fn router_backward_input(d: &MoeDims, w: &[f32], r: &Routing, dweight: &[f32], dx: &mut [f32]) -> Vec<f32> {
    let (h, e, k) = (d.hidden, d.experts, d.top_k);
    let t = r.idx.len() / k;
    let mut dl = vec![0.0f32; t * e];
    for tok in 0..t {
        let sel = &r.idx[tok * k..(tok + 1) * k];
        let wsel = &r.weight[tok * k..(tok + 1) * k];
        let dws = &dweight[tok * k..(tok + 1) * k];
        let s = &r.scores[tok * e..(tok + 1) * e];
        let sum: f32 = sel.iter().map(|&j| s[j as usize]).sum();
        let dot: f32 = dws.iter().zip(wsel).map(|(a, b)| a * b).sum();
        for (slot, &j) in sel.iter().enumerate() {
            let sj = s[j as usize];
            let deriv = match d.score {
                RouterScore::Softmax => sj,
                RouterScore::Sigmoid => sj * (1.0 - sj),
            };
            dl[tok * e + j as usize] = (dws[slot] - dot) / sum * deriv;
        }
    }
    matmul(MatRef::new(&dl, t, e), MatRef::new(w, h, e), MatMut::new(dx, t, h), Transpose::Nt, 1.0, 1.0);
    dl
}

/// The weight half: dw += xᵀ·dl.
pub fn router_backward_weight(d: &MoeDims, x: &[f32], dl: &[f32], dw: &mut [f32]) {
    let (h, e) = (d.hidden, d.experts);
    let t = x.len() / h;
    matmul(MatRef::new(x, t, h), MatRef::new(dl, t, e), MatMut::new(dw, h, e), Transpose::Tn, 1.0, 1.0);
}
