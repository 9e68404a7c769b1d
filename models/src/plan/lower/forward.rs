//! The forward of (microbatch, chunk): receive the activation (or embed), then per layer
//! `AttnIn`, `Attn`, `MlpIn`, `Mlp`, `LayerOut` with Megatron-LM's tensor-parallel
//! collectives between them, then send the activation on or run the head (`FinalNorm`,
//! `Logits`, the loss-statistics all-gather, `Loss`). Allocates the saved activations of
//! each (layer, microbatch), sized by [`crate::accounting::memory::layer_activation_bytes`]
//! (a mixture-of-experts layer's MLP half is `moe.rs`'s).

use crate::accounting::memory::{has_dropout, head_buffer_bytes};
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::plan::lower::modules::{Pass, Walk};
use crate::plan::lowered::Unit;

impl<'p, 'a> StageLowering<'p, 'a> {
    pub(super) fn forward(&mut self, chunk: u32, mb: u32) {
        let vs = self.vstage(chunk);
        let mut deps = Vec::new();
        let mut input_buf = None;
        // DeepSpeed's forward step: SendGrad(prev) before RecvActivation.
        self.flush_send();
        if vs > 0 {
            let bytes = self.residual_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Pp, &[], BufClass::Activations, bytes, format!("recv act vs{vs} mb{mb}"));
            let p2p = P2pOp { peer: Peer::Prev, kind: P2pKind::Activation, mb, vstage: vs, bytes };
            deps.push(self.recv(p2p, buf));
            input_buf = Some(buf);
        } else {
            let units = if self.s().model.learned_positions() {
                vec![Unit::WordEmbedding, Unit::PosEmbedding]
            } else {
                vec![Unit::WordEmbedding]
            };
            let (pdeps, pbufs) = self.params_for(chunk, &units, mb, Phase::Forward);
            let m = &self.s().model;
            let p = &self.s().parallel;
            let mask = if has_dropout(m) {
                let sbh = self.rank_tokens() * m.hidden as u64;
                if self.sp { sbh / p.tp as u64 } else { sbh }
            } else {
                0
            };
            let (buf, _) = self.e.alloc(Stream::Compute, &[], BufClass::Activations, mask, format!("embed mb{mb}"));
            self.embed_buf.insert(mb, buf);
            let mut bufs = vec![buf];
            bufs.extend(&pbufs);
            let op = self.compute(Piece::Embed, Phase::Forward, mb, chunk, 0, &pdeps, &bufs);
            self.release_gathered(&pbufs, op);
            if self.tp {
                deps.push(self.tp_coll(TpSite::Reduce, Piece::Embed, Phase::Forward, mb, chunk, 0, op));
            }
        }
        let layers = self.layers(chunk);
        for (i, layer) in layers.clone().enumerate() {
            let bytes = self.act_bytes_of(layer, self.s().parallel.recompute);
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("act L{layer} mb{mb}"));
            self.act.insert((layer, mb), buf);
            let first = self.layer_forward(layer, mb, chunk, Phase::Forward, &deps, None);
            deps.clear();
            if i == 0
                && let Some(b) = input_buf.take()
            {
                self.e.free(Stream::Compute, &[first], b);
            }
        }
        if vs == self.last_vs {
            self.head_forward(chunk, mb);
            self.mtp_forward(chunk, mb);
        } else {
            let bytes = self.residual_bytes();
            let after = self.last_compute.expect("a chunk has layers");
            let (buf, _) = self.e.alloc(
                Stream::Pp,
                &[after],
                BufClass::Activations,
                bytes,
                format!("send act vs{} mb{mb}", vs + 1),
            );
            let p2p = P2pOp { peer: Peer::Next, kind: P2pKind::Activation, mb, vstage: vs + 1, bytes };
            self.send(after, p2p, buf);
        }
    }

    /// The output gradients of one dense piece's weight pass, the attention's or the MLP's
    /// ([`crate::accounting::memory::piece_weight_grad_bytes`]).
    pub(super) fn piece_wgrad_bytes(&self, mlp: bool) -> u64 {
        let s = self.s();
        let p = &s.parallel;
        let bytes = crate::accounting::memory::piece_weight_grad_bytes(
            &s.model,
            p.micro_batch,
            s.training.storage_dtype(),
            p.tp,
            mlp,
        );
        self.per_cp_rank(bytes)
    }

    /// The output gradients a layer's deferred weight passes read
    /// ([`crate::accounting::memory::weight_grad_bytes`]).
    pub(super) fn wgrad_bytes(&self) -> u64 {
        let s = self.s();
        let p = &s.parallel;
        self.per_cp_rank(crate::accounting::memory::weight_grad_bytes(
            &s.model,
            p.micro_batch,
            s.training.storage_dtype(),
            p.tp,
        ))
    }

    /// A tp rank's bytes of a whole sequence, rounded up, held by each of the cp ranks.
    pub(super) fn per_cp_rank(&self, bytes: f64) -> u64 {
        bytes.ceil() as u64 / self.s().parallel.cp as u64
    }

    /// The five forward pieces of a layer with their tensor-parallel collectives. Returns the
    /// first compute op.
    /// `gathered`: parameters the caller already gathered (ZeRO-3 recomputation reuses the
    /// backward's gather); otherwise this gathers and releases them itself.
    pub(super) fn layer_forward(
        &mut self,
        layer: u32,
        mb: u32,
        chunk: u32,
        phase: Phase,
        deps: &[OpId],
        gathered: Option<&[BufId]>,
    ) -> OpId {
        let mut bufs = vec![self.act[&(layer, mb)]];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        let (pdeps, pbufs) = match gathered {
            Some(g) => (vec![], g.to_vec()),
            None => self.params_for(chunk, &[Unit::Layer(layer)], mb, phase),
        };
        bufs.extend(&pbufs);
        let mut d: Vec<OpId> = deps.to_vec();
        d.extend(pdeps);
        let first = self.compute(Piece::AttnIn, phase, mb, chunk, layer, &d, &bufs);
        let mut prev = first;
        for (gather_piece, body) in [(Piece::Attn, Piece::MlpIn), (Piece::Mlp, Piece::LayerOut)] {
            if gather_piece == Piece::Mlp && self.s().model.is_moe_layer(layer) {
                prev = self.moe_forward(layer, mb, chunk, phase, prev, &bufs);
                continue;
            }
            let mut wait = Vec::new();
            if self.sp {
                wait.push(self.tp_coll(TpSite::Gather, gather_piece, phase, mb, chunk, layer, prev));
            }
            let (walk, pass) = if phase == Phase::Forward {
                (Walk::Forward, Pass::Forward)
            } else {
                (Walk::Recompute, Pass::Backward)
            };
            let (mdeps, mbufs) = self.fetch_modules(chunk, layer, gather_piece, mb, walk);
            wait.extend(mdeps);
            let mut b = bufs.clone();
            b.extend(&mbufs);
            let op = if gather_piece == Piece::Attn && self.cp() > 1 {
                self.cp_attention(phase, mb, chunk, layer, &wait, &b)
            } else {
                self.compute(gather_piece, phase, mb, chunk, layer, &wait, &b)
            };
            if pass == Pass::Forward {
                self.release_modules(layer, gather_piece, mb, pass, op);
            } else {
                self.release_recomputed(layer, gather_piece, mb, op);
            }
            let mut wait = Vec::new();
            if self.tp {
                wait.push(self.tp_coll(TpSite::Reduce, gather_piece, phase, mb, chunk, layer, op));
            }
            prev = self.compute(body, phase, mb, chunk, layer, &wait, &bufs);
        }
        if gathered.is_none() {
            self.release_gathered(&pbufs, prev);
        }
        first
    }

    pub(super) fn head_forward(&mut self, chunk: u32, mb: u32) {
        let s = self.s();
        let p = &s.parallel;
        let bytes = head_buffer_bytes(&s.model, p.micro_batch, s.training.storage_dtype(), p.tp, self.sp) / p.cp as u64;
        let (buf, _) = self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("head mb{mb}"));
        self.head_buf.insert(mb, buf);
        let units = self.head_units();
        let (pdeps, pbufs) = self.params_for(chunk, &units, mb, Phase::Forward);
        let mut bufs = vec![buf];
        bufs.extend(&pbufs);
        let op = self.compute(Piece::FinalNorm, Phase::Forward, mb, chunk, 0, &pdeps, &bufs);
        let wait: Vec<OpId> = if self.sp {
            vec![self.tp_coll(TpSite::Gather, Piece::Logits, Phase::Forward, mb, chunk, 0, op)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Logits, Phase::Forward, mb, chunk, 0, &wait, &bufs);
        let wait: Vec<OpId> = if self.tp {
            vec![self.tp_coll(TpSite::LossStats, Piece::Loss, Phase::Forward, mb, chunk, 0, op)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Loss, Phase::Forward, mb, chunk, 0, &wait, &bufs);
        self.release_gathered(&pbufs, op);
    }

    /// Units the head's pieces use.
    pub(super) fn head_units(&self) -> Vec<Unit> {
        let m = &self.s().model;
        let out = if m.tied_embeddings() { Unit::WordEmbedding } else { Unit::OutputLayer };
        vec![Unit::FinalNorm, out]
    }
}
