//! `Compute` ops: each (piece, phase) of the plan calls its function of the numerical core
//! (the table in the crate's module comment), on this rank's shard, for one microbatch.

use strata_models::Recompute;
use strata_models::plan::{BufId, ComputeOp, P2pKind, Phase, Piece, Unit};

use super::{ExecError, RankExec, T};
use crate::embed::{embed_backward_at, embed_forward_at};
use crate::head::*;
use crate::layer::*;
use crate::params::{EmbedTensors, HeadTensors};

impl RankExec {
    pub(super) fn compute(&mut self, c: &ComputeOp, bufs: &[BufId]) -> Result<(), ExecError> {
        let (chunk, mb) = (c.chunk, c.mb);
        match (c.piece, c.phase) {
            (Piece::Embed, Phase::Forward) => self.embed_fwd(chunk, mb, bufs),
            (Piece::Embed, Phase::BackwardWeight) => self.embed_bwd(chunk, mb),
            (Piece::Router | Piece::Experts | Piece::SharedExperts, _) => self.moe_compute(c, bufs),
            (Piece::LayerOut, _) if self.plan.scenario.model.is_moe_layer(c.layer) => self.moe_compute(c, bufs),
            (p, _) if p.in_layer() => self.layer_piece(c, bufs),
            (Piece::FinalNorm | Piece::Logits | Piece::Loss, _) => self.head_piece(c.piece, c.phase, chunk, mb, bufs),
            (Piece::Optimizer, Phase::Step) => {
                self.optimizer_step();
                Ok(())
            }
            (p, phase) => Err(crate::error::RuntimeError::BadSetting(format!(
                "the plan asks for {} {}, which the CPU runtime does not implement",
                p.key(),
                phase.key()
            ))
            .into()),
        }
    }

    fn embed_fwd(&mut self, chunk: u32, mb: u32, bufs: &[BufId]) -> Result<(), ExecError> {
        let h = self.plan.hidden() as usize;
        let mut out = vec![0.0f32; self.micro.tokens() * h];
        {
            let p = EmbedTensors {
                wte: self.param_unit(chunk, Unit::WordEmbedding, bufs),
                wpe: if self.learned_positions() { self.param_unit(chunk, Unit::PosEmbedding, bufs) } else { &[] },
            };
            let d = self.chunks[chunk as usize].layout.dims();
            embed_forward_at(d, &p, self.micro, &self.positions, &self.batch(mb).inputs, &mut out);
        }
        let dst = if self.tp > 1 { T::Out } else { T::R };
        self.put(chunk, mb, dst, out);
        Ok(())
    }

    fn embed_bwd(&mut self, chunk: u32, mb: u32) -> Result<(), ExecError> {
        let dr = self.take(chunk, mb, if self.sp { T::DFull } else { T::Dr });
        let mut wte = self.take_grad(chunk, Unit::WordEmbedding, mb);
        let learned = self.learned_positions();
        let mut wpe = if learned { self.take_grad(chunk, Unit::PosEmbedding, mb) } else { Vec::new() };
        {
            let mut g = EmbedTensors { wte: &mut wte[..], wpe: &mut wpe[..] };
            let d = self.chunks[chunk as usize].layout.dims();
            embed_backward_at(d, &mut g, self.micro, &self.positions, &self.batch(mb).inputs, &dr);
        }
        self.put_grad(chunk, Unit::WordEmbedding, mb, wte);
        if learned {
            self.put_grad(chunk, Unit::PosEmbedding, mb, wpe);
        }
        Ok(())
    }

    /// The residual entering the first layer of a chunk: from the previous stage's message.
    fn residual_in(&mut self, chunk: u32, mb: u32) -> Vec<f32> {
        if self.has(chunk, mb, T::R) {
            return self.take(chunk, mb, T::R);
        }
        let vs = self.vstage(chunk);
        assert!(vs > 0, "rank {}: the first chunk's residual comes from the embedding", self.rank);
        self.received(P2pKind::Activation, vs, mb)
    }

    /// The residual gradient entering a chunk's backward: from the next stage's message.
    pub(super) fn grad_in(&mut self, chunk: u32, mb: u32) -> Vec<f32> {
        if self.has(chunk, mb, T::Dr) {
            return self.take(chunk, mb, T::Dr);
        }
        self.received(P2pKind::Gradient, self.vstage(chunk) + 1, mb)
    }

    /// Whether a forward pass stores the softmax probabilities.
    fn store_probs(&self, phase: Phase) -> bool {
        !self.flash && (phase == Phase::Recompute || self.recompute == Recompute::None)
    }

    fn layer_piece(&mut self, c: &ComputeOp, bufs: &[BufId]) -> Result<(), ExecError> {
        let (piece, phase, chunk, mb, layer) = (c.piece, c.phase, c.chunk, c.mb, c.layer);
        let key = (layer, mb);
        let full_rc = self.recompute == Recompute::Full;
        // The activations this piece reads or fills: the forward's, or full recomputation's
        // (which the backward pieces then read).
        let (mut acts, in_rc) = match phase {
            Phase::Forward if piece == Piece::AttnIn => (LayerActs::default(), false),
            Phase::Recompute if full_rc && piece == Piece::AttnIn => (LayerActs::default(), true),
            _ => match self.rc_acts.remove(&key) {
                Some(a) => (a, true),
                None => (
                    self.acts.remove(&key).unwrap_or_else(|| {
                        panic!(
                            "rank {}: layer {layer} mb {mb} has no saved activations for {piece:?} {phase:?}",
                            self.rank
                        )
                    }),
                    false,
                ),
            },
        };
        let needs_grads = matches!(phase, Phase::BackwardInput | Phase::BackwardWeight)
            && !(phase == Phase::BackwardInput
                && matches!(piece, Piece::Attn | Piece::Mlp | Piece::AttnQkv | Piece::AttnCore | Piece::AttnProj));
        let mut grad = needs_grads.then(|| self.take_grad(chunk, Unit::Layer(layer), mb));
        let cp_piece = matches!(piece, Piece::AttnQkv | Piece::AttnCore | Piece::AttnProj);
        if cp_piece && matches!(phase, Phase::Forward | Phase::Recompute) {
            self.cp_forward_piece(c, bufs, &mut acts);
        } else if cp_piece {
            self.cp_backward_piece(c, bufs, &mut acts, grad.as_mut());
        } else if matches!(phase, Phase::Forward | Phase::Recompute) {
            self.layer_forward_piece(c, bufs, &mut acts);
        } else {
            self.layer_backward_piece(c, bufs, &mut acts, grad.as_mut());
        }
        if let Some(g) = grad {
            self.put_grad(chunk, Unit::Layer(layer), mb, g);
        }
        if in_rc {
            self.rc_acts.insert(key, acts);
        } else {
            self.acts.insert(key, acts);
        }
        Ok(())
    }

    /// A forward (or recomputed) layer piece; see `layer::*_forward`.
    fn layer_forward_piece(&mut self, c: &ComputeOp, bufs: &[BufId], acts: &mut LayerActs) {
        let (piece, phase, chunk, mb, layer) = (c.piece, c.phase, c.chunk, c.mb, c.layer);
        let (key, full_rc) = ((layer, mb), self.recompute == Recompute::Full);
        let (t_all, h) = (self.micro.tokens(), self.plan.hidden() as usize);
        let rows = self.my_rows(t_all * h);
        match (piece, phase) {
            (Piece::AttnIn, Phase::Forward | Phase::Recompute) => {
                let r = if phase == Phase::Forward {
                    self.residual_in(chunk, mb)
                } else {
                    self.acts.get(&key).expect("the layer input kept for recomputation").r_in.to_vec()
                };
                let mut a = vec![0.0; r.len()];
                attn_in_forward(&self.layer_params(chunk, layer, bufs), &r, &mut a, acts);
                self.put(chunk, mb, T::R, r);
                self.put(chunk, mb, T::X, a);
            }
            (Piece::Attn, Phase::Recompute) if !full_rc => {
                attn_recompute_probs(self.chunks[chunk as usize].layout.dims(), self.micro, acts);
            }
            (Piece::Attn, Phase::Forward | Phase::Recompute) => {
                let a = self.take(chunk, mb, self.gathered_input());
                let mut out = vec![0.0; t_all * h];
                let mode = if self.store_probs(phase) { Recompute::None } else { Recompute::Selective };
                let d = self.chunks[chunk as usize].layout.dims();
                attn_forward(d, &self.layer_params(chunk, layer, bufs), self.micro, &a, &mut out, acts, mode);
                if self.sp {
                    acts.a.keep_rows(rows.start / h..rows.end / h);
                }
                self.put(chunk, mb, T::Out, out);
            }
            (Piece::MlpIn, Phase::Forward | Phase::Recompute) => {
                let mut r = self.take(chunk, mb, T::R);
                let p = self.take(chunk, mb, self.reduced(T::Out));
                let mut m = vec![0.0; r.len()];
                mlp_in_forward(&self.layer_params(chunk, layer, bufs), &mut r, &p, &mut m, acts);
                self.put(chunk, mb, T::R, r);
                self.put(chunk, mb, T::X, m);
            }
            (Piece::Mlp, Phase::Forward | Phase::Recompute) => {
                let m = self.take(chunk, mb, self.gathered_input());
                let mut out = vec![0.0; t_all * h];
                let d = self.chunks[chunk as usize].layout.dims();
                mlp_forward(d, &self.layer_params(chunk, layer, bufs), &m, &mut out, acts);
                if self.sp {
                    acts.m.keep_rows(rows.start / h..rows.end / h);
                }
                self.put(chunk, mb, T::Out, out);
            }
            (Piece::LayerOut, Phase::Forward | Phase::Recompute) => {
                let mut r = self.take(chunk, mb, T::R);
                let p2 = self.take(chunk, mb, self.reduced(T::Out));
                layer_out_forward(&self.layer_params(chunk, layer, bufs), &mut r, &p2);
                if phase == Phase::Forward {
                    self.put(chunk, mb, T::R, r);
                    if full_rc {
                        acts.keep_only_input();
                    }
                }
            }
            (p, ph) => panic!("rank {}: {} {} is not a forward layer op", self.rank, p.key(), ph.key()),
        }
    }

    /// A backward layer piece (input or weight half); see `layer::*_backward*`. `grad` is
    /// the layer's gradient accumulator, for the pieces that write weight gradients.
    fn layer_backward_piece(
        &mut self,
        c: &ComputeOp,
        bufs: &[BufId],
        acts: &mut LayerActs,
        grad: Option<&mut Vec<f32>>,
    ) {
        let (piece, phase, chunk, mb, layer) = (c.piece, c.phase, c.chunk, c.mb, c.layer);
        let (t_all, h) = (self.micro.tokens(), self.plan.hidden() as usize);
        match (piece, phase) {
            (Piece::LayerOut, Phase::BackwardInput) => {
                let dr = self.grad_in(chunk, mb);
                let g = grad.expect("layer gradients");
                layer_out_backward(&mut self.chunks[chunk as usize].layout.layer_block_mut(g), &dr);
                self.put(chunk, mb, T::Dr, dr);
            }
            (Piece::Mlp | Piece::Attn, Phase::BackwardInput) => {
                let d_out = if self.sp { self.take(chunk, mb, T::DFull) } else { self.take(chunk, mb, T::Dr) };
                let mut part = vec![0.0; t_all * h];
                {
                    let (d, p) = (self.chunks[chunk as usize].layout.dims(), self.layer_params(chunk, layer, bufs));
                    if piece == Piece::Mlp {
                        mlp_backward_input(d, &p, acts, &d_out, &mut part);
                    } else {
                        attn_backward_input(d, &p, self.micro, acts, &d_out, &mut part);
                    }
                }
                if !self.sp {
                    self.put(chunk, mb, T::Dr, d_out);
                }
                self.put(chunk, mb, T::DPart, part);
            }
            (Piece::MlpIn | Piece::AttnIn, Phase::BackwardInput) => {
                let dx = self.mlp_input_grad(piece, chunk, mb);
                let mut dr = self.take(chunk, mb, T::Dr);
                let g = grad.expect("layer gradients");
                let layout = &self.chunks[chunk as usize].layout;
                let (p, mut gv) = (self.layer_params(chunk, layer, bufs), layout.layer_block_mut(g));
                if piece == Piece::MlpIn {
                    mlp_in_backward(&p, &mut gv, acts, &dx, &mut dr);
                } else {
                    attn_in_backward(&p, &mut gv, acts, &dx, &mut dr);
                }
                self.put(chunk, mb, T::Dr, dr);
            }
            (Piece::Mlp | Piece::Attn, Phase::BackwardWeight) => {
                let saved = if self.sp { Some(self.take(chunk, mb, T::Saved)) } else { None };
                let g = grad.expect("layer gradients");
                let layout = &self.chunks[chunk as usize].layout;
                let (d, mut gv) = (layout.dims(), layout.layer_block_mut(g));
                // The output gradients were kept for this weight pass only; drop them now
                // rather than with the layer's activations.
                if piece == Piece::Mlp {
                    mlp_backward_weight(d, acts, saved.as_deref().unwrap_or(&acts.m), &mut gv);
                    acts.d_fc1_pre.release();
                    acts.d_fc2_out.release();
                } else {
                    attn_backward_weight(d, acts, saved.as_deref().unwrap_or(&acts.a), &mut gv);
                    acts.d_qkv.release();
                    acts.d_proj_out.release();
                }
            }
            (p, ph) => panic!("rank {}: {} {} is not a backward layer op", self.rank, p.key(), ph.key()),
        }
    }

    pub(super) fn layer_params(&self, chunk: u32, layer: u32, bufs: &[BufId]) -> crate::params::LayerParams<'_> {
        self.chunks[chunk as usize].layout.layer_block(self.param_unit(chunk, Unit::Layer(layer), bufs))
    }

    /// A GPT model's position table (Llama has rotary positions and none).
    fn learned_positions(&self) -> bool {
        self.plan.scenario.model.learned_positions()
    }

    /// The output layer's unit: the tied word embedding (GPT) or its own (Llama).
    fn output_unit(&self) -> Unit {
        if self.plan.scenario.model.tied_embeddings() { Unit::WordEmbedding } else { Unit::OutputLayer }
    }

    fn head_params(&self, chunk: u32, bufs: &[BufId]) -> crate::params::HeadParams<'_> {
        let lnf = self.param_unit(chunk, Unit::FinalNorm, bufs);
        // LayerNorm's γ then β, or RMSNorm's γ alone.
        let (lnf_w, lnf_b) = lnf.split_at(self.plan.hidden() as usize);
        HeadTensors { lnf_w, lnf_b, wte: self.param_unit(chunk, self.output_unit(), bufs) }
    }

    fn head_piece(&mut self, piece: Piece, phase: Phase, chunk: u32, mb: u32, bufs: &[BufId]) -> Result<(), ExecError> {
        let mut acts = if (piece, phase) == (Piece::FinalNorm, Phase::Forward) {
            HeadActs::default()
        } else {
            self.heads.remove(&mb).unwrap_or_else(|| panic!("rank {}: mb {mb} has no head state", self.rank))
        };
        let (t_all, h) = (self.micro.tokens(), self.plan.hidden() as usize);
        let rows = self.my_rows(t_all * h);
        match (piece, phase) {
            (Piece::FinalNorm, Phase::Forward) => {
                let r = self.take(chunk, mb, T::R);
                let mut hn = vec![0.0; r.len()];
                final_norm_forward(&self.head_params(chunk, bufs), &r, &mut hn, &mut acts);
                self.put(chunk, mb, T::X, hn);
            }
            (Piece::Logits, Phase::Forward) => {
                let hn = self.take(chunk, mb, self.gathered_input());
                let mut stats = vec![0.0; t_all * STATS];
                let d = self.chunks[chunk as usize].layout.dims();
                logits_forward(d, &self.head_params(chunk, bufs), &hn, &self.batch(mb).targets, &mut acts, &mut stats);
                if self.sp {
                    acts.hn.keep_rows(rows.start / h..rows.end / h);
                }
                self.put(chunk, mb, T::Stats, stats);
            }
            (Piece::Loss, Phase::Forward) => {
                let stats = self.take(chunk, mb, self.reduced(T::Stats));
                let t = if self.tp > 1 { self.tp } else { 1 };
                self.loss_sum += loss_forward(&stats, t, &mut acts);
            }
            (Piece::Logits, Phase::BackwardInput) => {
                let mut part = vec![0.0; t_all * h];
                let d = self.chunks[chunk as usize].layout.dims();
                let targets = &self.batch(mb).targets;
                logits_backward_input(
                    d,
                    &self.head_params(chunk, bufs),
                    &mut acts,
                    targets,
                    self.grad_scale,
                    &mut part,
                );
                self.put(chunk, mb, T::DPart, part);
            }
            (Piece::Logits, Phase::BackwardWeight) => {
                let saved = if self.sp { Some(self.take(chunk, mb, T::Saved)) } else { None };
                let unit = self.output_unit();
                let mut wte = self.take_grad(chunk, unit, mb);
                {
                    let mut g = HeadTensors { lnf_w: &mut [][..], lnf_b: &mut [][..], wte: &mut wte[..] };
                    let d = self.chunks[chunk as usize].layout.dims();
                    logits_backward_weight(d, &acts, saved.as_deref().unwrap_or(&acts.hn), &mut g);
                }
                self.put_grad(chunk, unit, mb, wte);
            }
            (Piece::FinalNorm, Phase::BackwardInput) => {
                let dhn = self.take(chunk, mb, self.reduced(T::DPart));
                let mut dr = vec![0.0; dhn.len()];
                let mut lnf = self.take_grad(chunk, Unit::FinalNorm, mb);
                {
                    let (lnf_w, lnf_b) = lnf.split_at_mut(h);
                    let mut g = HeadTensors { lnf_w, lnf_b, wte: &mut [][..] };
                    final_norm_backward(&self.head_params(chunk, bufs), &mut g, &acts, &dhn, &mut dr);
                }
                self.put_grad(chunk, Unit::FinalNorm, mb, lnf);
                self.put(chunk, mb, T::Dr, dr);
            }
            (p, ph) => panic!("rank {}: {} {} is not a head op", self.rank, p.key(), ph.key()),
        }
        self.heads.insert(mb, acts);
        Ok(())
    }
}
