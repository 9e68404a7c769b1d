//! A mixture-of-experts layer's MLP half in the executor: the plan's `Router`, `Experts`,
//! `SharedExperts` and a MoE layer's `LayerOut` ops (each phase), and the expert-parallel
//! all-to-alls between them (`CollPurpose::Moe` on the `Ep` group, as all-to-all-v: the
//! router decides the counts). Each op calls its function of [`crate::moe::ops`]; the
//! layer's state between ops is one [`MoeState`] per (layer, microbatch):
//!
//! ```text
//! Router fwd      x = MlpIn's output; route; blocks = [counts | rows] per ep member  → send
//! a2a dispatch    send → recv
//! SharedExperts   shared(x), kept for LayerOut
//! Experts fwd     recv → the local experts → each source's outputs                   → send
//! a2a combine     send → recv
//! LayerOut fwd    r += Σ_slot w·y + shared(x)
//! LayerOut bwd-in dr → dw (weights' gradient), dy = w·dr blocks                      → send
//! a2a combine     send → recv                       SharedExperts bwd-in: shared dx from dr
//! Experts bwd-in  recv → the experts' dx rows per source                             → send
//! a2a dispatch    send → recv                       Experts bwd-w: expert gradients
//! Router bwd-in   dm = Σ_slot rows + dl·Wrᵀ + shared dx   (MlpIn's backward reads dm)
//! Router bwd-w    dWr += xᵀ·dl; the state is dropped
//! ```
//!
//! Under full recomputation the forward drops the state after `LayerOut` and the
//! recomputed forward (its all-to-alls included) builds it again.
//!
//! Tensor parallelism (with sequence parallelism, which the plan's rules require): each tp
//! rank routes its own Tl = T/tp rows (its expert-parallel group spans tp ranks, experts
//! whole, expert-tp 1); the shared experts are a column-/row-parallel MLP over the gathered
//! rows (the plan's gather before, reduce-scatter after), whose FC2 bias is added once
//! after the reduction, in `LayerOut` (its gradient there, over the rank's rows, summed by
//! the replicated tensors' tp all-reduce with the router's); the routed input gradient
//! waits as `MoeDx` for `MlpIn`'s backward, which adds it to the shared experts' reduced one.
//!
//! A Llama-family MoE layer's experts (routed and shared) are SwiGLU without biases
//! ([`crate::moe::expert_forward`]); the ops are the same, with no FC2 bias to add.

use strata_models::Recompute;
use strata_models::plan::{BufId, ComputeOp, GroupKind, Phase, Piece, Unit};

use super::{ExecError, RankExec, T};
use crate::comm::collective::Pending;
use crate::moe::ops::{self, ExpertsActs, ExpertsGrads};
use crate::moe::{Dispatch, ExpertActs, ExpertTensors, MoeDims, Routing};
use crate::params::moe_tensors;

/// One MoE layer's MLP state for one microbatch, between its ops.
#[derive(Debug, Default)]
pub(crate) struct MoeState {
    /// Built by a recomputed forward (its bytes are the recomputation buffer's).
    pub(crate) recomputed: bool,
    x: Vec<f32>,
    routing: Routing,
    dispatch: Dispatch,
    /// Blocks the next all-to-all sends; blocks the last one delivered.
    send: Option<Vec<Vec<f32>>>,
    recv: Option<Vec<Vec<f32>>>,
    experts: ExpertsActs,
    y: Vec<f32>,
    shared: Option<ExpertActs>,
    shared_out: Vec<f32>,
    dweight: Vec<f32>,
    grads: ExpertsGrads,
    /// The shared experts' input gradient, and (dy, dh) for their weight pass.
    shared_dx: Vec<f32>,
    shared_g: (Vec<f32>, Vec<f32>),
    dl: Vec<f32>,
}

impl MoeState {
    pub(crate) fn bytes(&self) -> u64 {
        let v = |x: &Vec<f32>| x.len() as u64 * 4;
        let blocks = |b: &Option<Vec<Vec<f32>>>| b.as_ref().map_or(0, |b| b.iter().map(v).sum());
        let r = &self.routing;
        let shared = self.shared.as_ref().map_or(0, |a| v(&a.x) + v(&a.h1) + v(&a.a));
        v(&self.x)
            + v(&r.scores)
            + 8 * r.idx.len() as u64
            + blocks(&self.send)
            + blocks(&self.recv)
            + self.experts.bytes() as u64
            + v(&self.y)
            + shared
            + v(&self.shared_out)
            + v(&self.dweight)
            + self.grads.bytes() as u64
            + v(&self.shared_dx)
            + v(&self.shared_g.0)
            + v(&self.shared_g.1)
            + v(&self.dl)
    }
}

impl RankExec {
    fn moe_dims(&self, chunk: u32) -> MoeDims {
        *self.chunks[chunk as usize].layout.moe().expect("a MoE layer's op on a chunk of a MoE model")
    }

    fn moe_state(&mut self, layer: u32, mb: u32) -> &mut MoeState {
        let rank = self.rank;
        self.moe
            .get_mut(&(layer, mb))
            .unwrap_or_else(|| panic!("rank {rank}: MoE layer {layer} mb {mb} has no state for this op"))
    }

    /// Posts a MoE all-to-all: the blocks the op before it left to send.
    pub(super) fn post_moe(&mut self, layer: u32, mb: u32) -> Result<Pending, ExecError> {
        let blocks = self.moe_state(layer, mb).send.take().expect("an all-to-all after the op that fills it");
        let g = self.groups[&GroupKind::Ep].clone();
        Ok(self.mailbox.post_all_to_all_v(&g, false, blocks)?)
    }

    pub(super) fn finish_moe(&mut self, layer: u32, mb: u32, blocks: Vec<Vec<f32>>) {
        let st = self.moe_state(layer, mb);
        debug_assert!(st.recv.is_none(), "an all-to-all's blocks arrived before the last ones were read");
        st.recv = Some(blocks);
    }

    /// A `Router`, `Experts`, `SharedExperts` op, or a MoE layer's `LayerOut`.
    pub(super) fn moe_compute(&mut self, c: &ComputeOp, bufs: &[BufId]) -> Result<(), ExecError> {
        let (piece, phase, chunk, mb, layer) = (c.piece, c.phase, c.chunk, c.mb, c.layer);
        let d = self.moe_dims(chunk);
        let h = d.hidden;
        let fwd = matches!(phase, Phase::Forward | Phase::Recompute);
        match (piece, fwd) {
            (Piece::Router, true) => {
                let x = self.take(chunk, mb, T::X);
                let routing = crate::moe::router_forward(&d, self.layer_params(chunk, layer, bufs).router_w, &x);
                let (dispatch, send) = ops::dispatch_send(&d, &routing, &x);
                let st = MoeState {
                    recomputed: phase == Phase::Recompute,
                    x,
                    routing,
                    dispatch,
                    send: Some(send),
                    ..MoeState::default()
                };
                self.moe.insert((layer, mb), st);
            }
            (Piece::SharedExperts, true) => {
                let x = if self.tp > 1 { self.take(chunk, mb, T::XFull) } else { self.moe_state(layer, mb).x.clone() };
                let (y, a) = {
                    let mut sp = self.shared_params(chunk, layer, bufs);
                    // Row-parallel: the bias joins after the reduction (LayerOut).
                    let zeros = vec![0.0f32; if self.tp > 1 { sp.fc2_b.len() } else { 0 }];
                    if self.tp > 1 {
                        sp.fc2_b = &zeros;
                    }
                    crate::moe::expert_forward(&sp, h, d.shared_ffn, x)
                };
                self.moe_state(layer, mb).shared = Some(a);
                if self.tp > 1 {
                    self.put(chunk, mb, T::Out, y);
                } else {
                    self.moe_state(layer, mb).shared_out = y;
                }
            }
            (Piece::Experts, true) => {
                let recv = self.moe_state(layer, mb).recv.take().expect("the dispatch's blocks");
                let (acts, back) = {
                    let ex = self.experts_params(chunk, layer, bufs);
                    ops::experts_forward(&d, &ex, &recv)
                };
                let st = self.moe_state(layer, mb);
                st.experts = acts;
                st.send = Some(back);
            }
            (Piece::LayerOut, true) => {
                let st = self.moe_state(layer, mb);
                let back = st.recv.take().expect("the combine's blocks");
                let (y, mut out) = ops::combine(&d, &st.routing, &st.dispatch, &back);
                st.y = y;
                if !st.shared_out.is_empty() {
                    crate::kernels::add_into(&mut out, &std::mem::take(&mut st.shared_out));
                }
                if self.tp > 1 && self.has(chunk, mb, T::Red) {
                    let shared = self.take(chunk, mb, T::Red);
                    crate::kernels::add_into(&mut out, &shared);
                    let b = self.layer_params(chunk, layer, bufs).fc2_b;
                    if !b.is_empty() {
                        crate::kernels::add_bias(&mut out, b);
                    }
                }
                let mut r = self.take(chunk, mb, T::R);
                crate::kernels::add_into(&mut r, &out);
                if phase == Phase::Forward {
                    self.put(chunk, mb, T::R, r);
                    if self.recompute == Recompute::Full {
                        // The recomputed forward builds the layer's state again.
                        self.moe.remove(&(layer, mb));
                        if let Some(a) = self.acts.get_mut(&(layer, mb)) {
                            a.keep_only_input();
                        }
                    }
                }
            }
            (Piece::LayerOut, false) => {
                let dr = self.grad_in(chunk, mb);
                let st = self.moe_state(layer, mb);
                let (dweight, send) = ops::combine_backward(&d, &st.routing, &st.dispatch, &st.y, &dr);
                st.y = Vec::new();
                st.dweight = dweight;
                st.send = Some(send);
                if self.tp > 1
                    && self.moe[&(layer, mb)].shared.is_some()
                    && !self.chunks[chunk as usize].layout.dims().llama
                {
                    // The shared experts' row-parallel bias, over this rank's rows (SwiGLU
                    // shared experts have none).
                    let mut g = self.take_grad(chunk, Unit::Layer(layer), mb);
                    crate::kernels::col_sum_into(self.chunks[chunk as usize].layout.layer_block_mut(&mut g).fc2_b, &dr);
                    self.put_grad(chunk, Unit::Layer(layer), mb, g);
                }
                self.put(chunk, mb, T::Dr, dr);
            }
            (Piece::SharedExperts, false) if phase == Phase::BackwardInput => {
                let dout =
                    if self.tp > 1 { self.take(chunk, mb, T::DFull) } else { self.flight[&(chunk, mb, T::Dr)].clone() };
                let (dx, dh) = {
                    let sp = self.shared_params(chunk, layer, bufs);
                    let a = self.moe[&(layer, mb)].shared.as_ref().expect("the shared experts' forward");
                    crate::moe::expert_backward_input(&sp, h, d.shared_ffn, a, &dout)
                };
                if self.tp > 1 {
                    self.put(chunk, mb, T::DPart, dx);
                } else {
                    self.moe_state(layer, mb).shared_dx = dx;
                }
                self.moe_state(layer, mb).shared_g = (dout, dh);
            }
            (Piece::SharedExperts, false) => {
                let mut g = self.take_grad(chunk, Unit::Layer(layer), mb);
                {
                    let st = &self.moe[&(layer, mb)];
                    let a = st.shared.as_ref().expect("the shared experts' forward");
                    let lv = self.chunks[chunk as usize].layout.layer_block_mut(&mut g);
                    // Under tp the bias's gradient is LayerOut's.
                    let mut scratch = vec![0.0f32; if self.tp > 1 { lv.fc2_b.len() } else { 0 }];
                    let fc2_b = if self.tp > 1 { &mut scratch[..] } else { lv.fc2_b };
                    let mut sg = ExpertTensors { fc1_w: lv.fc1_w, fc1_b: lv.fc1_b, fc2_w: lv.fc2_w, fc2_b };
                    crate::moe::expert_backward_weight(&mut sg, h, d.shared_ffn, a, &st.shared_g.0, &st.shared_g.1);
                }
                self.put_grad(chunk, Unit::Layer(layer), mb, g);
                // The re-gathered input (sequence parallelism): the forward kept it whole.
                self.flight.remove(&(chunk, mb, T::Saved));
                let st = self.moe_state(layer, mb);
                st.shared = None;
                st.shared_g = Default::default();
            }
            (Piece::Experts, false) if phase == Phase::BackwardInput => {
                let recv = self.moe_state(layer, mb).recv.take().expect("the combine gradient's blocks");
                let (grads, back) = {
                    let ex = self.experts_params(chunk, layer, bufs);
                    ops::experts_backward_input(&d, &ex, &self.moe[&(layer, mb)].experts, &recv)
                };
                let st = self.moe_state(layer, mb);
                st.grads = grads;
                st.send = Some(back);
            }
            (Piece::Experts, false) => {
                let mut g = self.take_grad(chunk, Unit::Experts(layer), mb);
                {
                    let st = &self.moe[&(layer, mb)];
                    let mut eg = self.chunks[chunk as usize].layout.experts_block_mut(&mut g);
                    ops::experts_backward_weight(&d, &mut eg, &st.experts, &st.grads);
                }
                self.put_grad(chunk, Unit::Experts(layer), mb, g);
                let st = self.moe_state(layer, mb);
                st.experts = ExpertsActs::default();
                st.grads = ExpertsGrads::default();
            }
            (Piece::Router, false) if phase == Phase::BackwardInput => {
                let wr = self.layer_params(chunk, layer, bufs).router_w.to_vec();
                let st = self.moe_state(layer, mb);
                let back = st.recv.take().expect("the dispatch gradient's blocks");
                let tokens = st.x.len() / h;
                let mut dx = ops::uncombine_rows(&d, &st.dispatch, &back, tokens);
                st.dl = crate::moe::router_backward_input(&d, &wr, &st.routing, &st.dweight, &mut dx);
                if !st.shared_dx.is_empty() {
                    crate::kernels::add_into(&mut dx, &std::mem::take(&mut st.shared_dx));
                }
                let dst = if self.tp > 1 { T::MoeDx } else { T::DPart };
                self.put(chunk, mb, dst, dx);
            }
            (Piece::Router, false) => {
                let st = self.moe.remove(&(layer, mb)).expect("the router's state");
                let mut g = self.take_grad(chunk, Unit::Layer(layer), mb);
                {
                    let lv = self.chunks[chunk as usize].layout.layer_block_mut(&mut g);
                    crate::moe::router_backward_weight(&d, &st.x, &st.dl, lv.router_w);
                }
                self.put_grad(chunk, Unit::Layer(layer), mb, g);
            }
            (p, _) => panic!("rank {}: {} {} is not a MoE op", self.rank, p.key(), phase.key()),
        }
        Ok(())
    }

    /// The shared experts' input rows of this rank (re-gathered for their weight pass).
    pub(super) fn moe_saved_input(&self, layer: u32, mb: u32) -> Vec<f32> {
        self.moe.get(&(layer, mb)).map_or_else(Vec::new, |st| st.x.clone())
    }

    /// `MlpIn`'s backward input: the reduced MLP input gradient, plus a MoE layer's routed
    /// one under tensor parallelism.
    pub(super) fn mlp_input_grad(&mut self, piece: Piece, chunk: u32, mb: u32) -> Vec<f32> {
        if piece == Piece::MlpIn
            && let Some(mut dx) = self.flight.remove(&(chunk, mb, T::MoeDx))
        {
            if let Some(shared) = self.flight.remove(&(chunk, mb, self.reduced(T::DPart))) {
                crate::kernels::add_into(&mut dx, &shared);
            }
            return dx;
        }
        self.take(chunk, mb, self.reduced(T::DPart))
    }

    fn shared_params(&self, chunk: u32, layer: u32, bufs: &[BufId]) -> ExpertTensors<&[f32]> {
        let m = moe_tensors(self.layer_params(chunk, layer, bufs), Vec::new());
        m.shared.expect("a SharedExperts op in a layer with shared experts")
    }

    fn experts_params(&self, chunk: u32, layer: u32, bufs: &[BufId]) -> Vec<ExpertTensors<&[f32]>> {
        self.chunks[chunk as usize].layout.experts_block(self.param_unit(chunk, Unit::Experts(layer), bufs))
    }
}
