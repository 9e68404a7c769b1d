//! The backward of (microbatch, chunk): the forward's pieces in reverse, each
//! tensor-parallel collective replaced by its dual; recomputation first (the attention core,
//! or the whole layer forward); weight gradients inline, or for ZB-H1 in a later slot (the
//! W pass, [`StageLowering::backward_weight`]). A layer's activations are freed and its
//! gradient marked done once its last gradient op is emitted.

use crate::accounting::memory::layer_activation_parts;
use crate::parallel::Recompute;
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::plan::lower::modules::{Pass, Walk};
use crate::plan::lowered::Unit;

impl<'p, 'a> StageLowering<'p, 'a> {
    /// Backward of (chunk, mb): input gradients, and weight gradients too unless `split`.
    pub(super) fn backward(&mut self, chunk: u32, mb: u32, split: bool) {
        let vs = self.vstage(chunk);
        let mut deps = Vec::new();
        let mut grad_in = None;
        // DeepSpeed: a backward after a backward has an (empty) forward step between them,
        // which sends the earlier backward's gradient before this one's RecvGrad.
        if self.deferred_send.is_some_and(|(m, _)| m.kind == P2pKind::Gradient) {
            self.flush_send();
        }
        if vs != self.last_vs {
            let bytes = self.residual_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Pp, &[], BufClass::Activations, bytes, format!("recv grad vs{} mb{mb}", vs + 1));
            let p2p = P2pOp { peer: Peer::Next, kind: P2pKind::Gradient, mb, vstage: vs + 1, bytes };
            deps.push(self.recv(p2p, buf));
            grad_in = Some(buf);
            // DeepSpeed's backward step: RecvGrad, then SendActivation(prev).
            self.flush_send();
        } else {
            self.flush_send();
            self.mtp_backward(chunk, mb, split);
            self.head_backward(chunk, mb, split);
        }
        let layers: Vec<u32> = self.layers(chunk).rev().collect();
        for (i, layer) in layers.iter().enumerate() {
            let first = self.layer_backward(*layer, mb, chunk, split, &deps);
            deps.clear();
            if i == 0
                && let Some(b) = grad_in.take()
            {
                self.e.free(Stream::Compute, &[first], b);
            }
        }
        if vs > 0 {
            if !split {
                self.charge_hp_grads(chunk, mb);
            }
            let bytes = self.residual_bytes();
            let after = self.last_compute.expect("a chunk has layers");
            let (buf, _) =
                self.e.alloc(Stream::Pp, &[after], BufClass::Activations, bytes, format!("send grad vs{vs} mb{mb}"));
            let p2p = P2pOp { peer: Peer::Prev, kind: P2pKind::Gradient, mb, vstage: vs, bytes };
            self.send(after, p2p, buf);
        } else if !split {
            self.embed_backward(chunk, mb);
            self.charge_hp_grads(chunk, mb);
        } else {
            // A split backward runs the embedding's weight pass in the W slot, from the
            // output gradient the first layer's input pass leaves: held from here to there.
            let bytes = self.residual_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("embed grad mb{mb}"));
            self.embed_grad.insert(mb, buf);
        }
        if !self.chunk_grad_reduce.is_empty() {
            let after = self.last_compute.expect("a backward computes");
            self.flush_chunk_grad_reduce(after);
        }
    }

    pub(super) fn head_backward(&mut self, chunk: u32, mb: u32, split: bool) {
        let buf = self.head_buf[&mb];
        let units = self.head_units();
        let (pdeps, pbufs) = self.params_for(chunk, &units, mb, Phase::BackwardInput);
        let mut bufs = vec![buf];
        bufs.extend(&pbufs);
        self.touch(chunk, &units, mb);
        let saved = if self.sp && !split {
            let after = self.last_compute.expect("the head's forward ran");
            Some(self.tp_coll(TpSite::GatherSaved, Piece::Logits, Phase::BackwardWeight, mb, chunk, 0, after))
        } else {
            None
        };
        let op = self.compute(Piece::Logits, Phase::BackwardInput, mb, chunk, 0, &pdeps, &bufs);
        let wait: Vec<OpId> = if self.tp {
            vec![self.tp_coll(TpSite::Reduce, Piece::Logits, Phase::BackwardInput, mb, chunk, 0, op)]
        } else {
            vec![]
        };
        if !split {
            self.head_weight(chunk, mb, saved);
        }
        let op = self.compute(Piece::FinalNorm, Phase::BackwardInput, mb, chunk, 0, &wait, &bufs);
        self.release_gathered(&pbufs, op);
        self.unit_done(chunk, Unit::FinalNorm, mb, op);
        if !split {
            let b = self.head_buf.remove(&mb).expect("head buffer");
            self.e.free(Stream::Compute, &[op], b);
        }
    }

    pub(super) fn head_weight(&mut self, chunk: u32, mb: u32, saved: Option<OpId>) {
        let buf = self.head_buf[&mb];
        let wait: Vec<OpId> = match saved {
            Some(op) => vec![op],
            None if self.sp => {
                let after = self.last_compute.expect("after the head's backward");
                vec![self.tp_coll(TpSite::GatherSaved, Piece::Logits, Phase::BackwardWeight, mb, chunk, 0, after)]
            }
            None => vec![],
        };
        let op = self.compute(Piece::Logits, Phase::BackwardWeight, mb, chunk, 0, &wait, &[buf]);
        let tied = self.s().model.tied_embeddings();
        // With one pipeline stage the tied embedding's gradient is completed by the
        // embedding's own backward, which comes later.
        if !tied || self.s().parallel.pp > 1 {
            self.unit_done(chunk, if tied { Unit::WordEmbedding } else { Unit::OutputLayer }, mb, op);
        }
        // Under ZB the weight half runs last; otherwise FinalNorm's backward frees the buffer.
        if self.s().parallel.schedule.splits_backward() {
            let b = self.head_buf.remove(&mb).expect("head buffer");
            self.e.free(Stream::Compute, &[op], b);
        }
    }

    pub(super) fn layer_backward(&mut self, layer: u32, mb: u32, chunk: u32, split: bool, deps: &[OpId]) -> OpId {
        let p = self.s().parallel.clone();
        let act = self.act[&(layer, mb)];
        let mut first = None;
        let (pdeps, pbufs) = self.params_for(chunk, &[Unit::Layer(layer)], mb, Phase::BackwardInput);
        if layer > self.layers(chunk).start {
            self.prefetch(chunk, Unit::Layer(layer - 1), mb, Phase::BackwardInput);
        }
        let mut d: Vec<OpId> = deps.to_vec();
        d.extend(pdeps);
        if p.recompute == Recompute::Full {
            let bytes = self.act_bytes_of(layer, Recompute::None);
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("recompute L{layer} mb{mb}"));
            self.recompute.insert((layer, mb), buf);
            first = Some(self.layer_forward(layer, mb, chunk, Phase::Recompute, &d, Some(&pbufs)));
            d.clear();
        }
        let mut bufs = vec![act];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        if split {
            // ZB-H1 defers the weight passes: the output gradients they read (of QKV, the
            // attention projection, FC1 and FC2) stay alive until then (freed with the layer).
            let bytes = self.wgrad_bytes_of(layer);
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("wgrad L{layer} mb{mb}"));
            self.wgrad.insert((layer, mb), buf);
            bufs.push(buf);
        }
        bufs.extend(&pbufs);
        self.touch(chunk, &[Unit::Layer(layer)], mb);
        let op = self.compute(Piece::LayerOut, Phase::BackwardInput, mb, chunk, layer, &d, &bufs);
        let first = first.unwrap_or(op);
        let mut prev = op;
        for (piece, norm) in [(Piece::Mlp, Piece::MlpIn), (Piece::Attn, Piece::AttnIn)] {
            if piece == Piece::Mlp && self.s().model.is_moe_layer(layer) {
                let wait = self.moe_backward(layer, mb, chunk, split, prev, &bufs);
                prev = self.compute(norm, Phase::BackwardInput, mb, chunk, layer, &wait, &bufs);
                continue;
            }
            let mut wait = Vec::new();
            // Under sequence parallelism the saved input is gathered again for the weight
            // gradient; issued before the input-gradient pass, it overlaps it (Megatron-LM).
            let mut saved = None;
            if self.sp {
                wait.push(self.tp_coll(TpSite::Gather, piece, Phase::BackwardInput, mb, chunk, layer, prev));
                if !split {
                    saved =
                        Some(self.tp_coll(TpSite::GatherSaved, piece, Phase::BackwardWeight, mb, chunk, layer, prev));
                }
            }
            let mut scores = None;
            // Selective recomputation re-runs the attention core: an unfused core into its
            // s×s scores; a fused one where the framework checkpoints it all the same
            // (Megatron-LM), into nothing the plan holds (the kernel keeps no scores).
            // Autograd reaches the checkpoint once the output projection's input gradient
            // exists, so under sequence parallelism it waits for that gradient's gather.
            let s = self.s();
            if piece == Piece::Attn && s.training.framework.recomputes_attention_core(s) {
                let mut b = bufs.clone();
                if !s.training.flash_attention {
                    let bytes = (layer_activation_parts(&s.model, p.micro_batch, s.training.storage_dtype(), false)
                        .scores
                        / p.tp as f64)
                        .ceil() as u64;
                    let (buf, _) = self.e.alloc(
                        Stream::Compute,
                        &[],
                        BufClass::Activations,
                        bytes,
                        format!("scores L{layer} mb{mb}"),
                    );
                    b.push(buf);
                    scores = Some(buf);
                }
                self.compute(Piece::Attn, Phase::Recompute, mb, chunk, layer, &wait, &b);
            }
            let walk = if p.recompute == Recompute::Full { Walk::BackwardRecomputed } else { Walk::Backward };
            let (mdeps, mbufs) = self.fetch_modules(chunk, layer, piece, mb, walk);
            wait.extend(mdeps);
            let mut b = bufs.clone();
            b.extend(scores);
            b.extend(&mbufs);
            // Without a split backward the piece's output gradients live from its input pass
            // through its weight pass (ZB-H1 holds the whole layer's in its `wgrad` buffer).
            let piece_wgrad = if split {
                None
            } else {
                let bytes = self.piece_wgrad_bytes(piece == Piece::Mlp);
                let (buf, _) =
                    self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("wgrad L{layer} mb{mb}"));
                b.push(buf);
                Some(buf)
            };
            let op = if piece == Piece::Attn && self.cp() > 1 {
                self.cp_attention_backward(mb, chunk, layer, &wait, &b)
            } else {
                self.compute(piece, Phase::BackwardInput, mb, chunk, layer, &wait, &b)
            };
            if let Some(sb) = scores {
                self.e.free(Stream::Compute, &[op], sb);
            }
            let reduce = if self.tp {
                Some(self.tp_coll(TpSite::Reduce, piece, Phase::BackwardInput, mb, chunk, layer, op))
            } else {
                None
            };
            let mut last = op;
            if !split {
                // The weight gradient overlaps the reduction of the input gradient.
                last = self.piece_weight(piece, layer, mb, chunk, act, saved);
            }
            if let Some(buf) = piece_wgrad {
                self.e.free(Stream::Compute, &[last], buf);
            }
            // DeepSpeed releases a module after its backward (its weight gradient included).
            self.release_modules(layer, piece, mb, Pass::Backward, last);
            prev = self.compute(
                norm,
                Phase::BackwardInput,
                mb,
                chunk,
                layer,
                &reduce.into_iter().collect::<Vec<_>>(),
                &bufs,
            );
        }
        self.release_gathered(&pbufs, prev);
        if !split && !self.is_mtp(layer) {
            self.layer_done(layer, mb, chunk, prev);
        }
        first
    }

    /// The weight pass of a piece; `saved` is the gather of its saved input if already issued.
    pub(super) fn piece_weight(
        &mut self,
        piece: Piece,
        layer: u32,
        mb: u32,
        chunk: u32,
        act: BufId,
        saved: Option<OpId>,
    ) -> OpId {
        let wait: Vec<OpId> = match saved {
            Some(op) => vec![op],
            None if self.sp => {
                let after = self.last_compute.expect("weight pass follows an input pass");
                vec![self.tp_coll(TpSite::GatherSaved, piece, Phase::BackwardWeight, mb, chunk, layer, after)]
            }
            None => vec![],
        };
        let mut bufs = vec![act];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        if piece == Piece::Attn && self.cp() > 1 {
            return self.cp_attention_weight(mb, chunk, layer, &wait, &bufs);
        }
        self.compute(piece, Phase::BackwardWeight, mb, chunk, layer, &wait, &bufs)
    }

    /// A layer's backward is complete: free its activations, mark its gradient done.
    pub(super) fn layer_done(&mut self, layer: u32, mb: u32, chunk: u32, last: OpId) {
        let act = self.act.remove(&(layer, mb)).expect("activation buffer of the layer");
        self.e.free(Stream::Compute, &[last], act);
        if let Some(b) = self.wgrad.remove(&(layer, mb)) {
            self.e.free(Stream::Compute, &[last], b);
        }
        if let Some(b) = self.recompute.remove(&(layer, mb)) {
            self.e.free(Stream::Compute, &[last], b);
        }
        self.unit_done(chunk, Unit::Layer(layer), mb, last);
    }

    /// ZB's W pass of (chunk, mb).
    pub(super) fn backward_weight(&mut self, chunk: u32, mb: u32) {
        let vs = self.vstage(chunk);
        if vs == self.last_vs {
            self.mtp_weight(chunk, mb);
            self.head_weight(chunk, mb, None);
        }
        let layers: Vec<u32> = self.layers(chunk).rev().collect();
        for layer in layers {
            let act = self.act[&(layer, mb)];
            let op = self.layer_weight(layer, mb, chunk, act);
            self.layer_done(layer, mb, chunk, op);
        }
        if vs == 0 {
            self.embed_backward(chunk, mb);
        }
    }

    /// The weight passes of one layer (ZB's W slot): its MLP half's, then its attention's.
    pub(super) fn layer_weight(&mut self, layer: u32, mb: u32, chunk: u32, act: BufId) -> OpId {
        if self.s().model.is_moe_layer(layer) {
            self.moe_weight(layer, mb, chunk, act);
        } else {
            self.piece_weight(Piece::Mlp, layer, mb, chunk, act, None);
        }
        self.piece_weight(Piece::Attn, layer, mb, chunk, act, None)
    }

    pub(super) fn embed_backward(&mut self, chunk: u32, mb: u32) {
        let buf = self.embed_buf.remove(&mb).expect("embedding buffer");
        let mut units = vec![Unit::WordEmbedding];
        if self.s().model.learned_positions() {
            units.push(Unit::PosEmbedding);
        }
        self.touch(chunk, &units, mb);
        let wait: Vec<OpId> = if self.sp {
            let after = self.last_compute.expect("after the first layer's backward");
            vec![self.tp_coll(TpSite::Gather, Piece::Embed, Phase::BackwardWeight, mb, chunk, 0, after)]
        } else {
            vec![]
        };
        let mut bufs = vec![buf];
        bufs.extend(self.embed_grad.remove(&mb));
        let op = self.compute(Piece::Embed, Phase::BackwardWeight, mb, chunk, 0, &wait, &bufs);
        for b in bufs {
            self.e.free(Stream::Compute, &[op], b);
        }
        for u in units {
            self.unit_done(chunk, u, mb, op);
        }
    }
}
