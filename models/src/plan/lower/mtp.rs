//! Multi-token prediction on the last stage (DeepSeek-V3 §2.2; Megatron-core's
//! `MultiTokenPredictionBlock`, `--mtp-num-layers`): after the main head, each depth d of
//! `model.mtp_layers` runs the embedding lookup of the tokens d + 1 ahead (`Embed`), its
//! input projection (`MtpProj`: two norms, concatenation, the 2h → h `eh_proj`; a
//! tensor-parallel all-gather of its column-parallel output when tp > 1), one transformer
//! layer (a MoE layer when the model's are; layer index model.layers + d, its parameters
//! in `Unit::Layer` / `Unit::Experts` of that index) and the shared output head with its
//! own loss (`FinalNorm`, `Logits`, `Loss`). Backward runs the depths in reverse before the
//! main head's. The output layer and the embedding are shared with the main model, so their
//! gradients complete with the main head's and embedding's passes, as before.

use std::collections::BTreeMap;

use crate::accounting::memory::head_buffer_bytes;
use crate::plan::cost::piece_cost;
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::scenario::Scenario;

/// Appends `MtpProj`'s costs when the model has multi-token prediction.
pub(super) fn mtp_costs(s: &Scenario, costs: &mut Vec<ComputeCost>, cost_ids: &mut BTreeMap<(Piece, Phase), CostId>) {
    if s.model.mtp_layers == 0 {
        return;
    }
    let (m, p, dtype) = (&s.model, &s.parallel, s.training.storage_dtype());
    for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight] {
        cost_ids.insert((Piece::MtpProj, phase), costs.len() as CostId);
        costs.push(piece_cost(m, p, dtype, s.training.flash_attention, Piece::MtpProj, phase));
    }
}

impl<'p, 'a> StageLowering<'p, 'a> {
    /// Layer indices of the multi-token-prediction modules (empty without them).
    pub(super) fn mtp_layers(&self) -> std::ops::Range<u32> {
        let m = &self.s().model;
        m.layers..m.layers + m.mtp_layers
    }

    /// The forward of every depth after the main head of (chunk, mb).
    pub(super) fn mtp_forward(&mut self, chunk: u32, mb: u32) {
        for layer in self.mtp_layers() {
            let bytes = self.act_bytes_of(layer, self.s().parallel.recompute) + self.mtp_input_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("act MTP{layer} mb{mb}"));
            self.act.insert((layer, mb), buf);
            self.compute(Piece::Embed, Phase::Forward, mb, chunk, 0, &[], &[buf]);
            let proj = self.compute(Piece::MtpProj, Phase::Forward, mb, chunk, layer, &[], &[buf]);
            let deps: Vec<OpId> = if self.tp {
                vec![self.tp_coll(TpSite::Gather, Piece::MtpProj, Phase::Forward, mb, chunk, layer, proj)]
            } else {
                vec![]
            };
            self.layer_forward(layer, mb, chunk, Phase::Forward, &deps, None);
            self.mtp_head_forward(chunk, mb, layer);
        }
    }

    /// The concatenated input `eh_proj` reads in its weight pass: 2h per token.
    fn mtp_input_bytes(&self) -> u64 {
        2 * self.tensor_bytes()
    }

    fn mtp_head_forward(&mut self, chunk: u32, mb: u32, layer: u32) {
        let s = self.s();
        let p = &s.parallel;
        let bytes = head_buffer_bytes(&s.model, p.micro_batch, s.training.storage_dtype(), p.tp, self.sp);
        let (buf, _) =
            self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("head MTP{layer} mb{mb}"));
        self.mtp_head_buf.insert((layer, mb), buf);
        let units = self.head_units();
        let (pdeps, pbufs) = self.params_for(chunk, &units[1..], mb, Phase::Forward);
        let mut bufs = vec![buf];
        bufs.extend(&pbufs);
        let op = self.compute(Piece::FinalNorm, Phase::Forward, mb, chunk, layer, &pdeps, &bufs);
        let wait: Vec<OpId> = if self.sp {
            vec![self.tp_coll(TpSite::Gather, Piece::Logits, Phase::Forward, mb, chunk, layer, op)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Logits, Phase::Forward, mb, chunk, layer, &wait, &bufs);
        let wait: Vec<OpId> = if self.tp {
            vec![self.tp_coll(TpSite::LossStats, Piece::Loss, Phase::Forward, mb, chunk, layer, op)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Loss, Phase::Forward, mb, chunk, layer, &wait, &bufs);
        self.release_gathered(&pbufs, op);
    }

    /// The backward of every depth, deepest first, before the main head's.
    pub(super) fn mtp_backward(&mut self, chunk: u32, mb: u32, split: bool) {
        for layer in self.mtp_layers().rev() {
            let buf = self.mtp_head_buf[&(layer, mb)];
            let op = self.compute(Piece::Logits, Phase::BackwardInput, mb, chunk, layer, &[], &[buf]);
            let wait: Vec<OpId> = if self.tp {
                vec![self.tp_coll(TpSite::Reduce, Piece::Logits, Phase::BackwardInput, mb, chunk, layer, op)]
            } else {
                vec![]
            };
            if !split {
                self.compute(Piece::Logits, Phase::BackwardWeight, mb, chunk, layer, &[], &[buf]);
            }
            let norm = self.compute(Piece::FinalNorm, Phase::BackwardInput, mb, chunk, layer, &wait, &[buf]);
            if !split {
                let buf = self.mtp_head_buf.remove(&(layer, mb)).expect("MTP head buffer");
                self.e.free(Stream::Compute, &[norm], buf);
            }
            // `layer_backward` leaves an MTP layer open: its projection comes after it.
            self.layer_backward(layer, mb, chunk, split, &[]);
            let act = vec![self.act[&(layer, mb)]];
            let wait: Vec<OpId> = if self.tp {
                let after = self.last_compute.expect("after the MTP layer's backward");
                vec![self.tp_coll(TpSite::Gather, Piece::MtpProj, Phase::BackwardInput, mb, chunk, layer, after)]
            } else {
                vec![]
            };
            self.compute(Piece::MtpProj, Phase::BackwardInput, mb, chunk, layer, &wait, &act);
            if !split {
                self.mtp_proj_weight(chunk, mb, layer, &act);
                let last = self.last_compute.expect("the projection's weight pass");
                self.layer_done(layer, mb, chunk, last);
            }
        }
    }

    /// Whether `layer` is a multi-token-prediction module's.
    pub(super) fn is_mtp(&self, layer: u32) -> bool {
        layer >= self.s().model.layers
    }

    /// A split backward's deferred head weight pass, which frees the head's buffer.
    fn mtp_head_weight(&mut self, chunk: u32, mb: u32, layer: u32) {
        let buf = self.mtp_head_buf.remove(&(layer, mb)).expect("MTP head buffer");
        let op = self.compute(Piece::Logits, Phase::BackwardWeight, mb, chunk, layer, &[], &[buf]);
        self.e.free(Stream::Compute, &[op], buf);
    }

    fn mtp_proj_weight(&mut self, chunk: u32, mb: u32, layer: u32, act: &[BufId]) {
        self.compute(Piece::MtpProj, Phase::BackwardWeight, mb, chunk, layer, &[], act);
        // The shifted tokens' embedding gradient (a scatter-add into the shared table).
        self.compute(Piece::Embed, Phase::BackwardWeight, mb, chunk, 0, &[], act);
    }

    /// ZB's W pass of every depth: the head's weight gradient, the layer's, the projection's.
    pub(super) fn mtp_weight(&mut self, chunk: u32, mb: u32) {
        for layer in self.mtp_layers().rev() {
            self.mtp_head_weight(chunk, mb, layer);
            let act = self.act[&(layer, mb)];
            self.layer_weight(layer, mb, chunk, act);
            self.mtp_proj_weight(chunk, mb, layer, &[act]);
            let last = self.last_compute.expect("the projection's weight pass");
            self.layer_done(layer, mb, chunk, last);
        }
    }
}
