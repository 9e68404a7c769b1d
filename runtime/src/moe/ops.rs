//! A MoE layer cut at its all-to-alls: the functions the plan's ops call one by one
//! (`Router` forward, `Experts` forward, `LayerOut` forward, and their backward halves),
//! each taking or returning the per-destination blocks an all-to-all-v moves. The
//! executor posts those blocks on its communicator between ops; [`super::moe_forward`]
//! and [`super::moe_backward`] chain the same functions through an [`super::Exchange`].
//!
//! A dispatch block to member j of the expert-parallel group is
//! `[counts of j's E/ep local experts | the rows, grouped by local expert, in token order]`
//! (the counts travel in front of the rows, as f32, exact below 2^24), so one
//! all-to-all-v carries what Megatron-core's dispatcher sends as two. The combine and
//! both gradient all-to-alls carry rows only, in the order the dispatch fixed.

use super::{Dispatch, ExpertActs, MoeDims, Routing, expert_backward_input, expert_backward_weight, expert_forward};
use crate::moe::ExpertTensors;

impl Dispatch {
    /// Per destination: the rows of `x` (one per (token, slot), `width` wide) in dispatch
    /// order. `row(t, slot)` picks the source row.
    pub(super) fn blocks<'x>(&self, width: usize, row: impl Fn(u32, u32) -> &'x [f32]) -> Vec<Vec<f32>> {
        self.rows
            .iter()
            .map(|per_expert| {
                let mut b = Vec::with_capacity(per_expert.iter().map(Vec::len).sum::<usize>() * width);
                for &(t, s) in per_expert.iter().flatten() {
                    b.extend_from_slice(row(t, s));
                }
                b
            })
            .collect()
    }

    /// Places rows returned in dispatch order (`blocks[dest]`, `width` wide) at their
    /// (token, slot) in a (T·k, width) buffer.
    pub(super) fn scatter(&self, blocks: &[Vec<f32>], width: usize, top_k: usize, out: &mut [f32]) {
        for (per_expert, block) in self.rows.iter().zip(blocks) {
            for (i, &(t, s)) in per_expert.iter().flatten().enumerate() {
                let at = (t as usize * top_k + s as usize) * width;
                out[at..at + width].copy_from_slice(&block[i * width..(i + 1) * width]);
            }
        }
    }
}

/// Rows each local expert received, concatenated over sources in source order.
fn by_expert(d: &MoeDims, counts: &[Vec<usize>], blocks: &[Vec<f32>], width: usize, skip: usize) -> Vec<Vec<f32>> {
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); d.local()];
    for (src, block) in blocks.iter().enumerate() {
        let mut at = skip;
        for (e, &n) in counts[src].iter().enumerate() {
            out[e].extend_from_slice(&block[at..at + n * width]);
            at += n * width;
        }
        assert_eq!(at, block.len(), "source {src} sent {} values for {:?} rows of {width}", block.len(), counts[src]);
    }
    out
}

/// The inverse of [`by_expert`]: each source's rows back, in the order it sent them.
fn by_source(d: &MoeDims, counts: &[Vec<usize>], per_expert: &[Vec<f32>], width: usize) -> Vec<Vec<f32>> {
    let mut at = vec![0usize; d.local()];
    counts
        .iter()
        .map(|c| {
            let mut b = Vec::new();
            for (e, &n) in c.iter().enumerate() {
                b.extend_from_slice(&per_expert[e][at[e]..at[e] + n * width]);
                at[e] += n * width;
            }
            b
        })
        .collect()
}

/// `Router` forward, after the gate: the dispatch of `routing` and its blocks (counts,
/// then the rows of `x` (T, h)) for each member of the expert-parallel group.
pub fn dispatch_send(d: &MoeDims, routing: &Routing, x: &[f32]) -> (Dispatch, Vec<Vec<f32>>) {
    let h = d.hidden;
    let dispatch = Dispatch::new(d, routing);
    let rows = dispatch.blocks(h, |tok, _| &x[tok as usize * h..(tok as usize + 1) * h]);
    let blocks = dispatch
        .rows
        .iter()
        .zip(rows)
        .map(|(per_expert, r)| {
            let mut b: Vec<f32> = per_expert.iter().map(|v| v.len() as f32).collect();
            b.extend(r);
            b
        })
        .collect();
    (dispatch, blocks)
}

/// What the `Experts` op keeps of its forward: the rows each source sent per local expert,
/// and each expert's internals.
#[derive(Clone, Debug, Default)]
pub struct ExpertsActs {
    /// counts[src][e]: rows source `src` sent to local expert e.
    pub counts: Vec<Vec<usize>>,
    pub experts: Vec<ExpertActs>,
}

impl ExpertsActs {
    pub fn bytes(&self) -> usize {
        self.experts.iter().map(|a| 4 * (a.x.len() + a.h1.len() + a.a.len())).sum()
    }
}

/// `Experts` forward: the dispatch blocks received from each source in, the combine's
/// blocks (each source's outputs, in the order it sent the rows) out.
pub fn experts_forward(
    d: &MoeDims,
    experts: &[ExpertTensors<&[f32]>],
    received: &[Vec<f32>],
) -> (ExpertsActs, Vec<Vec<f32>>) {
    let (h, local) = (d.hidden, d.local());
    let counts: Vec<Vec<usize>> = received.iter().map(|b| b[..local].iter().map(|&v| v as usize).collect()).collect();
    let inputs = by_expert(d, &counts, received, h, local);
    let mut outs = Vec::with_capacity(local);
    let mut acts = Vec::with_capacity(local);
    for (e, xe) in inputs.into_iter().enumerate() {
        let (y, a) = expert_forward(&experts[e], h, d.ffn, xe);
        outs.push(y);
        acts.push(a);
    }
    let back = by_source(d, &counts, &outs, h);
    (ExpertsActs { counts, experts: acts }, back)
}

/// `LayerOut` forward, routed part: the combine's blocks placed at their (token, slot) as
/// y (T·k, h) and out[t] = Σ_slot w[t, slot]·y[t, slot] (T, h).
pub fn combine(d: &MoeDims, routing: &Routing, dispatch: &Dispatch, back: &[Vec<f32>]) -> (Vec<f32>, Vec<f32>) {
    let (h, k) = (d.hidden, d.top_k);
    let t = routing.weight.len() / k;
    let mut y = vec![0.0f32; t * k * h];
    dispatch.scatter(back, h, k, &mut y);
    let mut out = vec![0.0f32; t * h];
    for tok in 0..t {
        let o = &mut out[tok * h..(tok + 1) * h];
        for s in 0..k {
            let w = routing.weight[tok * k + s];
            let row = &y[(tok * k + s) * h..(tok * k + s + 1) * h];
            o.iter_mut().zip(row).for_each(|(a, b)| *a += w * b);
        }
    }
    (y, out)
}

/// `LayerOut` backward, routed part: from dout (T, h), the weights' gradient
/// dw[t, slot] = ⟨dout[t], y[t, slot]⟩ (T, k) and the blocks of dy = w·dout that the
/// combine's gradient all-to-all sends back to the experts.
pub fn combine_backward(
    d: &MoeDims,
    routing: &Routing,
    dispatch: &Dispatch,
    y: &[f32],
    dout: &[f32],
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (h, k) = (d.hidden, d.top_k);
    let t = dout.len() / h;
    let mut dweight = vec![0.0f32; t * k];
    let mut dy = vec![0.0f32; t * k * h];
    for tok in 0..t {
        let go = &dout[tok * h..(tok + 1) * h];
        for s in 0..k {
            let i = tok * k + s;
            dweight[i] = go.iter().zip(&y[i * h..(i + 1) * h]).map(|(a, b)| a * b).sum();
            let w = routing.weight[i];
            dy[i * h..(i + 1) * h].iter_mut().zip(go).for_each(|(a, b)| *a = w * b);
        }
    }
    let blocks = dispatch.blocks(h, |tok, s| {
        let i = tok as usize * k + s as usize;
        &dy[i * h..(i + 1) * h]
    });
    (dweight, blocks)
}

/// What the experts' input-gradient pass leaves for their weight pass: per local expert
/// its output gradient dy and FC1's pre-activation gradient dh.
#[derive(Clone, Debug, Default)]
pub struct ExpertsGrads {
    pub dy: Vec<Vec<f32>>,
    pub dh: Vec<Vec<f32>>,
}

impl ExpertsGrads {
    pub fn bytes(&self) -> usize {
        4 * self.dy.iter().chain(&self.dh).map(Vec::len).sum::<usize>()
    }
}

/// `Experts` backward-input: the combine-gradient blocks received in, the dispatch
/// gradient's blocks (each source's dx rows, in the order it sent the rows) out.
pub fn experts_backward_input(
    d: &MoeDims,
    experts: &[ExpertTensors<&[f32]>],
    acts: &ExpertsActs,
    received: &[Vec<f32>],
) -> (ExpertsGrads, Vec<Vec<f32>>) {
    let h = d.hidden;
    let dy = by_expert(d, &acts.counts, received, h, 0);
    let mut dxs = Vec::with_capacity(d.local());
    let mut dh = Vec::with_capacity(d.local());
    for (e, dye) in dy.iter().enumerate() {
        let (dx, dhe) = expert_backward_input(&experts[e], h, d.ffn, &acts.experts[e], dye);
        dxs.push(dx);
        dh.push(dhe);
    }
    let back = by_source(d, &acts.counts, &dxs, h);
    (ExpertsGrads { dy, dh }, back)
}

/// `Experts` backward-weight: accumulates each local expert's weight gradients.
pub fn experts_backward_weight(
    d: &MoeDims,
    grads: &mut [ExpertTensors<&mut [f32]>],
    acts: &ExpertsActs,
    g: &ExpertsGrads,
) {
    for (e, ge) in grads.iter_mut().enumerate() {
        expert_backward_weight(ge, d.hidden, d.ffn, &acts.experts[e], &g.dy[e], &g.dh[e]);
    }
}

/// `Router` backward-input, first half: the dispatch gradient's blocks placed back at
/// their tokens and summed over slots, dx (T, h).
pub fn uncombine_rows(d: &MoeDims, dispatch: &Dispatch, back: &[Vec<f32>], tokens: usize) -> Vec<f32> {
    let (h, k) = (d.hidden, d.top_k);
    let mut dxr = vec![0.0f32; tokens * k * h];
    dispatch.scatter(back, h, k, &mut dxr);
    let mut dx = vec![0.0f32; tokens * h];
    for tok in 0..tokens {
        let o = &mut dx[tok * h..(tok + 1) * h];
        for s in 0..k {
            o.iter_mut().zip(&dxr[(tok * k + s) * h..(tok * k + s + 1) * h]).for_each(|(a, b)| *a += b);
        }
    }
    dx
}
