//! The MLP half of a mixture-of-experts layer (Megatron-core's `MoELayer` with the
//! all-to-all token dispatcher, `--moe-shared-expert-overlap`):
//! - forward: after `MlpIn`, `Router` (gate, scores, top-k, permutation), the dispatch
//!   all-to-all on the expert-parallel group (tp stream, as tensor-parallel collectives),
//!   `SharedExperts` meanwhile (it only needs `MlpIn`'s output; under sequence parallelism
//!   with its all-gather before and reduce-scatter after, as the dense MLP), `Experts` once
//!   the tokens arrived, the combine all-to-all, and `LayerOut` (un-permute, weight, add the
//!   shared output and the residual);
//! - backward in reverse: the combine's gradient all-to-all after `LayerOut`'s backward,
//!   `SharedExperts` backward meanwhile, `Experts` bwd-in, the dispatch's gradient
//!   all-to-all, `Experts` bwd-w overlapping it, `Router` bwd-in and bwd-w; split schedules
//!   (ZB) defer the three weight passes to the W slot;
//! - the layer's local experts are a unit of their own ([`Unit::Experts`]) whose buckets
//!   gather and reduce over the expert-data-parallel group.
//!
//! Sizes come from [`crate::plan::moe::MoeShape`].

use std::collections::BTreeMap;

use crate::parallel::Recompute;
use crate::plan::cost::{moe_layer_out_cost, piece_cost};
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::plan::lowered::{Bucket, Unit};
use crate::plan::moe::MoeShape;
use crate::scenario::Scenario;

/// Parameters of `buckets` as (dense, expert), per rank before sharding.
pub(super) fn split_params<'b>(buckets: impl Iterator<Item = &'b Bucket>) -> (u64, u64) {
    buckets.fold((0, 0), |(d, e), b| if b.is_expert() { (d, e + b.params) } else { (d + b.params, e) })
}

/// Appends the MoE pieces' costs (Router, Experts, SharedExperts in every phase) to the
/// table and returns the cost ids of a MoE layer's `LayerOut` per phase; nothing for a
/// dense model.
pub(super) fn moe_costs(
    s: &Scenario,
    costs: &mut Vec<ComputeCost>,
    cost_ids: &mut BTreeMap<(Piece, Phase), CostId>,
) -> BTreeMap<Phase, CostId> {
    let mut out = BTreeMap::new();
    if s.model.moe.is_none() {
        return out;
    }
    let (m, p, dtype) = (&s.model, &s.parallel, s.training.storage_dtype());
    let flash = s.training.flash_attention;
    for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight, Phase::Recompute] {
        for piece in [Piece::Router, Piece::Experts, Piece::SharedExperts] {
            cost_ids.insert((piece, phase), costs.len() as CostId);
            costs.push(piece_cost(m, p, dtype, flash, piece, phase));
        }
        out.insert(phase, costs.len() as CostId);
        costs.push(moe_layer_out_cost(m, p, dtype, phase));
    }
    out
}

impl<'p, 'a> StageLowering<'p, 'a> {
    fn moe_shape(&self) -> MoeShape {
        let s = self.s();
        MoeShape::new(&s.model, &s.parallel, self.dtype()).expect("a MoE layer has a MoE spec")
    }

    fn has_shared(&self) -> bool {
        self.moe_shape().shared_f_t > 0
    }

    /// The cost id of `LayerOut` in `layer` (a MoE layer's own, else the dense one).
    pub(super) fn layer_out_cost(&self, layer: u32, phase: Phase) -> Option<CostId> {
        if self.s().model.is_moe_layer(layer) { self.pl.moe_out_ids.get(&phase).copied() } else { None }
    }

    /// Saved activations of `layer` for one microbatch under `recompute`.
    pub(super) fn act_bytes_of(&self, layer: u32, recompute: Recompute) -> u64 {
        let s = self.s();
        let p = &s.parallel;
        let flash = crate::accounting::memory::saves_lse_only(s);
        if s.model.is_moe_layer(layer) {
            crate::accounting::memory::moe_layer_activation_bytes(&s.model, p, self.dtype(), recompute, flash).ceil()
                as u64
        } else {
            // Context parallelism: each rank saves its s/cp share, and under Ulysses the
            // head-layout attention output beside it (none for the full-recomputation buffer).
            let extra = if recompute == p.recompute { crate::accounting::memory::cp_saved_extra_bytes(s) } else { 0 };
            crate::accounting::memory::layer_activation_bytes(
                &s.model,
                p.micro_batch,
                self.dtype(),
                p.tp,
                p.sequence_parallel,
                recompute,
                flash,
            )
            .ceil() as u64
                / p.cp.max(1) as u64
                + extra
        }
    }

    /// The output gradients `layer`'s deferred weight passes read (ZB).
    pub(super) fn wgrad_bytes_of(&self, layer: u32) -> u64 {
        let s = self.s();
        if s.model.is_moe_layer(layer) {
            crate::accounting::memory::moe_weight_grad_bytes(&s.model, &s.parallel, self.dtype()).ceil() as u64
        } else {
            self.wgrad_bytes()
        }
    }

    /// An expert-parallel all-to-all after `after`: the dispatch (or its gradient) or the
    /// combine (or its gradient).
    fn moe_a2a(&mut self, dispatch: bool, phase: Phase, mb: u32, chunk: u32, layer: u32, after: OpId) -> OpId {
        let bytes = self.moe_shape().a2a_bytes();
        let purpose = CollPurpose::Moe { dispatch, phase, mb, chunk, layer };
        self.collective(Stream::Tp, &[after], &[], CollKind::AllToAll, GroupKind::Ep, bytes, purpose)
    }

    /// The MLP half of a MoE layer in `phase` (Forward or Recompute) after `MlpIn`'s op
    /// `after`; returns `LayerOut`'s op.
    pub(super) fn moe_forward(
        &mut self,
        layer: u32,
        mb: u32,
        chunk: u32,
        phase: Phase,
        after: OpId,
        bufs: &[BufId],
    ) -> OpId {
        let (edeps, _) = self.params_for(chunk, &[Unit::Experts(layer)], mb, phase);
        let shared = self.has_shared();
        let mut shared_wait = Vec::new();
        if shared && self.sp {
            shared_wait.push(self.tp_coll(TpSite::Gather, Piece::SharedExperts, phase, mb, chunk, layer, after));
        }
        let router = self.compute(Piece::Router, phase, mb, chunk, layer, &[], bufs);
        let dispatch = self.moe_a2a(true, phase, mb, chunk, layer, router);
        let mut out_wait = Vec::new();
        if shared {
            let op = self.compute(Piece::SharedExperts, phase, mb, chunk, layer, &shared_wait, bufs);
            if self.tp {
                out_wait.push(self.tp_coll(TpSite::Reduce, Piece::SharedExperts, phase, mb, chunk, layer, op));
            }
        }
        let mut wait = vec![dispatch];
        wait.extend(edeps);
        let experts = self.compute(Piece::Experts, phase, mb, chunk, layer, &wait, bufs);
        out_wait.push(self.moe_a2a(false, phase, mb, chunk, layer, experts));
        self.compute(Piece::LayerOut, phase, mb, chunk, layer, &out_wait, bufs)
    }

    /// The MLP half of a MoE layer's backward, after `LayerOut`'s backward op `after`.
    /// Returns what `MlpIn`'s backward waits for (the shared experts' input-gradient
    /// reduction under tensor parallelism).
    pub(super) fn moe_backward(
        &mut self,
        layer: u32,
        mb: u32,
        chunk: u32,
        split: bool,
        after: OpId,
        bufs: &[BufId],
    ) -> Vec<OpId> {
        let combine = self.moe_a2a(false, Phase::BackwardInput, mb, chunk, layer, after);
        let mut norm_wait = Vec::new();
        if self.has_shared() {
            let mut wait = Vec::new();
            let mut saved = None;
            if self.sp {
                let ph = Phase::BackwardInput;
                wait.push(self.tp_coll(TpSite::Gather, Piece::SharedExperts, ph, mb, chunk, layer, after));
                if !split {
                    let ph = Phase::BackwardWeight;
                    saved = Some(self.tp_coll(TpSite::GatherSaved, Piece::SharedExperts, ph, mb, chunk, layer, after));
                }
            }
            let op = self.compute(Piece::SharedExperts, Phase::BackwardInput, mb, chunk, layer, &wait, bufs);
            if self.tp {
                let ph = Phase::BackwardInput;
                norm_wait.push(self.tp_coll(TpSite::Reduce, Piece::SharedExperts, ph, mb, chunk, layer, op));
            }
            if !split {
                let act = bufs[0];
                self.piece_weight(Piece::SharedExperts, layer, mb, chunk, act, saved);
            }
        }
        self.touch(chunk, &[Unit::Experts(layer)], mb);
        let op = self.compute(Piece::Experts, Phase::BackwardInput, mb, chunk, layer, &[combine], bufs);
        let dispatch = self.moe_a2a(true, Phase::BackwardInput, mb, chunk, layer, op);
        if !split {
            self.experts_weight(layer, mb, chunk, bufs);
        }
        self.compute(Piece::Router, Phase::BackwardInput, mb, chunk, layer, &[dispatch], bufs);
        if !split {
            self.compute(Piece::Router, Phase::BackwardWeight, mb, chunk, layer, &[], bufs);
        }
        norm_wait
    }

    /// The experts' weight pass; completes the layer's expert gradients.
    fn experts_weight(&mut self, layer: u32, mb: u32, chunk: u32, bufs: &[BufId]) -> OpId {
        let op = self.compute(Piece::Experts, Phase::BackwardWeight, mb, chunk, layer, &[], bufs);
        self.unit_done(chunk, Unit::Experts(layer), mb, op);
        op
    }

    /// ZB's W pass of a MoE layer's MLP half: shared experts, experts, router.
    pub(super) fn moe_weight(&mut self, layer: u32, mb: u32, chunk: u32, act: BufId) {
        if self.has_shared() {
            self.piece_weight(Piece::SharedExperts, layer, mb, chunk, act, None);
        }
        let mut bufs = vec![act];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        if let Some(b) = self.wgrad.get(&(layer, mb)) {
            bufs.push(*b);
        }
        self.experts_weight(layer, mb, chunk, &bufs);
        self.compute(Piece::Router, Phase::BackwardWeight, mb, chunk, layer, &[], &bufs);
    }
}
