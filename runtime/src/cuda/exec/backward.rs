//! `Compute` ops of the backward pass, the head and the optimizer on the GPU, with the CPU
//! executor's tensor flow (`layer.rs`, `head.rs`, `exec/coll.rs`): input gradients are
//! overwritten, weight gradients accumulate in fp32 over microbatches, output gradients a
//! weight pass needs are kept from its backward-input pass and given back after it.

use strata_models::plan::{ComputeOp, Phase, Piece, Stream};

use super::device::{Arg, Device, blocks, per_row};
use super::pieces::{C, W};
use super::rank::{GpuExecError, GpuRank, Res, Tensor};
use crate::cuda::kernels::{ATTN_DELTA, attn_kernels};
use crate::params::ParamKind;

impl<D: Device> GpuRank<D> {
    fn keep(&mut self, layer: u32, mb: u32, w: W, t: super::rank::Tensor) {
        self.kept.insert((layer, mb, w), t);
    }

    fn kept(&mut self, layer: u32, mb: u32, w: W) -> Res<super::rank::Tensor> {
        self.kept.remove(&(layer, mb, w)).ok_or_else(|| {
            GpuExecError::Unsupported(format!("layer {layer} mb {mb}: the weight pass before its backward-input pass"))
        })
    }

    /// The output gradient a row-parallel piece's backward reads, and its copy kept for
    /// the weight pass: the residual gradient (T, h), copied, to go back to the residual
    /// stream (returned); under sequence parallelism the gathered one (`W::Full`), kept as
    /// it is (the residual gradient, the rank's shard, stays where it was).
    fn output_grad(&mut self, chunk: u32, mb: u32, what: &str) -> Res<(Option<Tensor>, Tensor)> {
        if self.sp() {
            return Ok((None, self.got_here(chunk, mb, W::Full)?));
        }
        let th = self.dims.t * self.dims.h;
        let dout = self.got(chunk, mb, W::Dr)?;
        let keep = self.ws(what, 2 * th)?;
        self.gpu.copy(C, keep.ptr(), dout.ptr(), 2 * th)?;
        Ok((Some(dout), keep))
    }

    pub(super) fn layer_bwd(&mut self, c: &ComputeOp) -> Res<()> {
        let (chunk, mb, layer) = (c.chunk, c.mb, c.layer);
        let d = self.dims;
        // All tokens (the column-parallel pieces), and the rank's rows of the residual stream
        // (its sequence shard under sequence parallelism).
        let (th, rh, dc, dkv, w) = (d.t * d.h, d.rows * d.h, d.q_dim(), d.kv_dim(), d.qkv_w());
        let sp = self.sp();
        let ac = self.acts_of(layer, mb, c.phase)?;
        let lp = self.layer_ptrs(chunk, layer)?;
        let pg = |k| -> Res<(super::device::Ptr, super::device::Ptr)> { Ok(lp[super::pieces::ix(k)]) };
        match (c.piece, c.phase) {
            (Piece::LayerOut, Phase::BackwardInput) => {
                let (_, db2) = pg(ParamKind::Fc2B)?;
                let dr = self.got(chunk, mb, W::Dr)?;
                self.col_sum(dr.ptr(), db2, d.rows, d.h)?;
                self.put(chunk, mb, W::Dr, dr)
            }
            (Piece::Mlp, Phase::BackwardInput) => {
                let ((w1, _), (w2, _)) = (pg(ParamKind::Fc1W)?, pg(ParamKind::Fc2W)?);
                let (dout, keep_out) =
                    self.output_grad(chunk, mb, "FC2's output gradient, kept for the weight pass")?;
                let (tf, f1) = (d.t * d.f, d.fc1_w());
                let dact = self.ws("the activation output's gradient", 2 * tf)?;
                self.dinput(keep_out.ptr(), w2, dact.ptr(), d.f, d.h)?;
                let dpre = self.ws("FC1's pre-activation gradient, kept for the weight pass", 2 * d.t * f1)?;
                if d.llama {
                    // d[gate | up] from d act (overwritten, both halves).
                    let args = [
                        Arg::P(ac.fc1_pre),
                        Arg::P(dact.ptr()),
                        Arg::P(dpre.ptr()),
                        Arg::L(d.t as i64),
                        Arg::I(d.f as i32),
                    ];
                    self.k("swiglu_bwd_bf16", blocks(tf), &args)?;
                } else {
                    let args = [Arg::P(ac.fc1_pre), Arg::P(dact.ptr()), Arg::P(dpre.ptr()), Arg::L(tf as i64)];
                    self.k("gelu_bwd_bf16", blocks(tf), &args)?;
                }
                self.give(dact);
                let part = self.ws("the MLP input's gradient", self.partial_dt().1 * th)?;
                self.dinput_partial(dpre.ptr(), w1, part.ptr(), d.h, f1)?;
                self.keep(layer, mb, W::DFc2Out, keep_out);
                self.keep(layer, mb, W::DFc1Pre, dpre);
                if let Some(dout) = dout {
                    self.put(chunk, mb, W::Dr, dout)?;
                }
                self.put(chunk, mb, W::DPart, part)
            }
            (Piece::MlpIn | Piece::AttnIn, Phase::BackwardInput) => {
                let attn_in = c.piece == Piece::AttnIn;
                let (wk, bk) =
                    if attn_in { (ParamKind::Ln1W, ParamKind::Ln1B) } else { (ParamKind::Ln2W, ParamKind::Ln2B) };
                let ((g, dg), (_, db)) = (pg(wk)?, pg(bk)?);
                let (x, mean, rstd) =
                    if attn_in { (ac.r_in, ac.ln1_mean, ac.ln1_rstd) } else { (ac.r_mid, ac.ln2_mean, ac.ln2_rstd) };
                let dx = self.got(chunk, mb, W::DPart)?;
                let dr = self.got(chunk, mb, W::Dr)?;
                let tmp = self.ws("a LayerNorm input's gradient", 2 * rh)?;
                self.ln_bwd(dx.ptr(), x, g, mean, rstd, tmp.ptr(), dg, db)?;
                self.add(dr.ptr(), tmp.ptr(), rh)?;
                self.give(tmp);
                self.give(dx);
                if !attn_in {
                    let (_, dbp) = pg(ParamKind::ProjB)?;
                    self.col_sum(dr.ptr(), dbp, d.rows, d.h)?;
                }
                self.put(chunk, mb, W::Dr, dr)
            }
            (Piece::Attn, Phase::BackwardInput) => {
                let ((wq, _), (wp, _)) = (pg(ParamKind::QkvW)?, pg(ParamKind::ProjW)?);
                let (dout, keep_out) =
                    self.output_grad(chunk, mb, "the projection's output gradient, kept for the weight pass")?;
                let dctx = self.ws("the attention context's gradient", 2 * d.t * dc)?;
                self.dinput(keep_out.ptr(), wp, dctx.ptr(), dc, d.h)?;
                let rows = d.b * d.heads * d.s;
                let delta = self.ws("the attention's rowwise dO·O", 4 * rows)?;
                let (bi, si, hi, ki, di) = (
                    Arg::I(d.b as i32),
                    Arg::I(d.s as i32),
                    Arg::I(d.heads as i32),
                    Arg::I(d.kv as i32),
                    Arg::I(d.hd as i32),
                );
                let (os, qs) = (Arg::L(dc as i64), Arg::L(w as i64));
                let delta_args = [Arg::P(ac.ctx), Arg::P(dctx.ptr()), Arg::P(delta.ptr()), bi, si, hi, di, os];
                self.k(ATTN_DELTA.delta, ATTN_DELTA.grid(d.s, d.heads, d.b), &delta_args)?;
                // [dQ | dK | dV] in one (T, D + 2·Dkv) tensor: the kv gradients of a group's
                // query heads summed by the dk/dv kernel (one block per kv head).
                let dqkv = self.ws("the qkv gradient, kept for the weight pass", 2 * d.t * w)?;
                let (q, k, v) = (ac.qkv, ac.qkv + 2 * dc as u64, ac.qkv + 2 * (dc + dkv) as u64);
                let (dq, dk, dv) = (dqkv.ptr(), dqkv.ptr() + 2 * dc as u64, dqkv.ptr() + 2 * (dc + dkv) as u64);
                let scale = Arg::F(1.0 / (d.hd as f32).sqrt());
                // Selective recomputation kept no statistics (`saved_acts`): the log-sum-exp of
                // the plan's recomputation op, or — for a plan without one (a framework that
                // does not checkpoint a fused core) — the core's forward again here.
                let stats = if ac.lse != 0 {
                    None
                } else if self.flight.contains_key(&(chunk, mb, W::Lse)) {
                    Some(self.got_here(chunk, mb, W::Lse)?)
                } else {
                    let lse = self.ws("the attention's recomputed log-sum-exp", 4 * rows)?;
                    let ctx = self.ws("the attention's recomputed context (unread)", 2 * d.t * dc)?;
                    self.attn_core_fwd(ac.qkv, ctx.ptr(), lse.ptr())?;
                    self.give(ctx);
                    Some(lse)
                };
                let lse = stats.as_ref().map_or(ac.lse, super::rank::Tensor::ptr);
                let common = [Arg::P(q), Arg::P(k), Arg::P(v), Arg::P(dctx.ptr()), Arg::P(lse), Arg::P(delta.ptr())];
                let mut dq_args = common.to_vec();
                dq_args.extend([Arg::P(dq), bi, si, hi, ki, di, qs, qs, os, qs, scale]);
                let ak = attn_kernels(d.hd);
                self.k(ak.dq, ak.grid(d.s, d.heads, d.b), &dq_args)?;
                let mut dkv_args = common.to_vec();
                dkv_args.extend([Arg::P(dk), Arg::P(dv), bi, si, hi, ki, di, qs, qs, os, qs, scale]);
                self.k(ak.dkdv, ak.grid(d.s, d.kv, d.b), &dkv_args)?;
                self.give(delta);
                self.give(dctx);
                if let Some(t) = stats {
                    self.give(t);
                }
                // Back through RoPE (the rotation by −θ) to the projection's output gradient.
                self.rope_qk(dqkv.ptr(), -1.0)?;
                let part = self.ws("the attention input's gradient", self.partial_dt().1 * th)?;
                self.dinput_partial(dqkv.ptr(), wq, part.ptr(), d.h, w)?;
                self.keep(layer, mb, W::DProjOut, keep_out);
                self.keep(layer, mb, W::DQkv, dqkv);
                if let Some(dout) = dout {
                    self.put(chunk, mb, W::Dr, dout)?;
                }
                self.put(chunk, mb, W::DPart, part)
            }
            (Piece::Mlp, Phase::BackwardWeight) => {
                let ((_, dw1), (_, db1), (_, dw2)) = (pg(ParamKind::Fc1W)?, pg(ParamKind::Fc1B)?, pg(ParamKind::Fc2W)?);
                let dout = self.kept(layer, mb, W::DFc2Out)?;
                let dpre = self.kept(layer, mb, W::DFc1Pre)?;
                let saved = if sp { Some(self.got_here(chunk, mb, W::Saved)?) } else { None };
                self.dweight(ac.fc1_act, dout.ptr(), dw2, d.f, d.h)?;
                self.dweight(saved.as_ref().map_or(ac.m, Tensor::ptr), dpre.ptr(), dw1, d.h, d.fc1_w())?;
                self.col_sum(dpre.ptr(), db1, d.t, d.fc1_w())?;
                self.give(dout);
                self.give(dpre);
                if let Some(t) = saved {
                    self.give(t);
                }
                Ok(())
            }
            (Piece::Attn, Phase::BackwardWeight) => {
                let ((_, dwq), (_, dbq), (_, dwp)) =
                    (pg(ParamKind::QkvW)?, pg(ParamKind::QkvB)?, pg(ParamKind::ProjW)?);
                let dout = self.kept(layer, mb, W::DProjOut)?;
                let dqkv = self.kept(layer, mb, W::DQkv)?;
                let saved = if sp { Some(self.got_here(chunk, mb, W::Saved)?) } else { None };
                self.dweight(ac.ctx, dout.ptr(), dwp, dc, d.h)?;
                self.dweight(saved.as_ref().map_or(ac.a, Tensor::ptr), dqkv.ptr(), dwq, d.h, w)?;
                self.col_sum(dqkv.ptr(), dbq, d.t, w)?;
                self.give(dout);
                self.give(dqkv);
                if let Some(t) = saved {
                    self.give(t);
                }
                Ok(())
            }
            (p, ph) => Err(GpuExecError::Unsupported(format!("{} {} in a layer", p.key(), ph.key()))),
        }
    }

    pub(super) fn head_piece(&mut self, c: &ComputeOp) -> Res<()> {
        let (chunk, mb) = (c.chunk, c.mb);
        let d = self.dims;
        let (th, rh, sp) = (d.t * d.h, d.rows * d.h, self.sp());
        let hd = self.head(mb)?;
        let (tgt_ptr, (t_in, t_out)) = (self.tok(mb).1, (d.t as i32, d.v as i32));
        // The output layer: GPT's tied word table (the head's copy), Llama's own `out_w`;
        // both (V, h) over the vocabulary shard.
        let out_kind = if d.llama { ParamKind::OutW } else { ParamKind::Wte };
        match (c.piece, c.phase) {
            (Piece::FinalNorm, Phase::Forward) => {
                let ((g, _), (b, _)) =
                    (self.pg(chunk, None, ParamKind::LnfW)?, self.pg_opt(chunk, None, ParamKind::LnfB)?);
                let r = self.got(chunk, mb, W::R)?;
                self.gpu.copy(C, hd.r_in, r.ptr(), 2 * rh)?;
                self.ln_fwd(r.ptr(), g, b, hd.hn, hd.mean, hd.rstd)?;
                self.give(r);
                Ok(())
            }
            (Piece::Logits, Phase::Forward) => {
                let (w_out, _) = self.pg(chunk, None, out_kind)?;
                // Sequence parallelism: the final norm's output of every token, gathered.
                let gathered = if sp { Some(self.got_here(chunk, mb, W::Full)?) } else { None };
                // logits (T, V) = hn · wteᵀ
                self.gpu.gemm(
                    d.t,
                    d.v,
                    d.h,
                    super::device::n(gathered.as_ref().map_or(hd.hn, Tensor::ptr)),
                    super::device::t(w_out),
                    hd.logits,
                    super::device::Dt::Bf16,
                    0.0,
                )?;
                if let Some(t) = gathered {
                    self.give(t);
                }
                let stats = self.ws("the loss statistics", 4 * 3 * d.t)?;
                let args = [
                    Arg::P(hd.logits),
                    Arg::P(tgt_ptr),
                    Arg::P(stats.ptr()),
                    Arg::I(t_in),
                    Arg::I(t_out),
                    Arg::I(d.v0 as i32),
                ];
                self.k("xent_stats_bf16", per_row(d.t), &args)?;
                self.put(chunk, mb, W::Stats, stats)
            }
            (Piece::Loss, Phase::Forward) => {
                let stats = self.got(chunk, mb, W::Stats)?;
                // The statistics of every vocabulary shard (gathered over tp; one rank: its own).
                let tp = self.plan.grid.tp as i32;
                let args = [Arg::P(stats.ptr()), Arg::P(hd.lse), Arg::P(hd.loss), Arg::I(t_in), Arg::I(tp)];
                self.k("xent_combine", blocks(d.t), &args)?;
                self.give(stats);
                let losses = self.losses.as_ref().map(|t| t.ptr()).expect("the step's losses");
                Ok(self.gpu.copy(C, losses + 4 * (d.t * mb as usize) as u64, hd.loss, 4 * d.t)?)
            }
            (Piece::Logits, Phase::BackwardInput) => {
                let (w_out, _) = self.pg(chunk, None, out_kind)?;
                let n = d.t * d.v;
                let args = [
                    Arg::P(hd.logits),
                    Arg::P(tgt_ptr),
                    Arg::P(hd.lse),
                    Arg::I(t_in),
                    Arg::I(t_out),
                    Arg::I(d.v0 as i32),
                    Arg::F(self.grad_scale),
                ];
                self.k("xent_grad_bf16", blocks(n), &args)?;
                let (dt, eb) = self.partial_dt();
                let part = self.ws("the final norm output's gradient", eb * th)?;
                // dhn (T, h) = dlogits (T, V) · w_out (V, h), a partial sum over vocabulary shards
                self.gpu.gemm(
                    d.t,
                    d.h,
                    d.v,
                    super::device::n(hd.logits),
                    super::device::n(w_out),
                    part.ptr(),
                    dt,
                    0.0,
                )?;
                self.put(chunk, mb, W::DPart, part)
            }
            (Piece::Logits, Phase::BackwardWeight) => {
                let (_, dw_out) = self.pg(chunk, None, out_kind)?;
                let saved = if sp { Some(self.got_here(chunk, mb, W::Saved)?) } else { None };
                // dw_out (V, h) += dlogitsᵀ · hn
                self.gpu.gemm(
                    d.v,
                    d.h,
                    d.t,
                    super::device::t(hd.logits),
                    super::device::n(saved.as_ref().map_or(hd.hn, Tensor::ptr)),
                    dw_out,
                    super::device::Dt::F32,
                    1.0,
                )?;
                if let Some(t) = saved {
                    self.give(t);
                }
                Ok(())
            }
            (Piece::FinalNorm, Phase::BackwardInput) => {
                let ((g, dg), (_, db)) =
                    (self.pg(chunk, None, ParamKind::LnfW)?, self.pg_opt(chunk, None, ParamKind::LnfB)?);
                let dhn = self.got(chunk, mb, W::DPart)?;
                let dr = self.ws("the residual gradient", 2 * rh)?;
                self.ln_bwd(dhn.ptr(), hd.r_in, g, hd.mean, hd.rstd, dr.ptr(), dg, db)?;
                self.give(dhn);
                self.put(chunk, mb, W::Dr, dr)
            }
            (p, ph) => Err(GpuExecError::Unsupported(format!("{} {} in the head", p.key(), ph.key()))),
        }
    }

    /// The gradient norm of this rank's gradients (one rank: the global one), on stream `s`.
    pub(super) fn grad_norm_local(&mut self, s: Stream) -> Res<()> {
        let sum = self.grad_sq_local(s)?;
        self.set_grad_norm(sum);
        Ok(())
    }

    /// AdamW on the fp32 masters of the owned runs, tensor by tensor (weight decay on the
    /// tensors the CPU executor decays), writing the bf16 copy (ZeRO-1: the parameter
    /// all-gather then brings the other replicas' parts); then the gradients start again
    /// from zero.
    /// A non-finite gradient norm leaves every parameter as it was.
    pub(super) fn optimizer_step(&mut self) -> Res<()> {
        if let Some(g) = self.grad_norm.filter(|g| !g.is_finite()) {
            self.nonfinite = Some(("the gradient norm".into(), g));
        } else {
            self.adam_steps += 1;
            let k = self.adam_steps.min(i32::MAX as u64) as i32;
            let cfg = self.adamw;
            let (bc1, bc2) = (1.0 - cfg.beta1.powi(k), 1.0 - cfg.beta2.powi(k));
            let zero = self.plan.scenario.zero_stage();
            for c in 0..self.bufs.len() {
                let b = &self.bufs[c];
                let (Some(p), Some(g), Some(o)) = (b.params.as_ref(), b.grads.as_ref(), b.opt.as_ref()) else {
                    continue;
                };
                let owned = self.chunks[c].owned as u64;
                let (master, m, v) = (o.ptr(), o.ptr() + 4 * owned, o.ptr() + 8 * owned);
                // The owned runs only (all of the chunk under ZeRO-0); the head's tied copy
                // of the word table steps too: after the tied-gradient all-reduce its
                // gradient is the table's, so both copies stay equal.
                for run in self.chunks[c].owned_runs() {
                    let (off, mo, n) = (run.flat as u64, run.master as u64, run.len);
                    // ZeRO-2 holds the owned gradients, ZeRO-3 the owned parameters too,
                    // in the masters' order.
                    let (goff, poff) = match zero {
                        0 | 1 => (off, off),
                        2 => (mo, off),
                        _ => (mo, mo),
                    };
                    let wd = if run.decays { cfg.weight_decay } else { 0.0 };
                    let args = [
                        Arg::P(master + 4 * mo),
                        Arg::P(g.ptr() + 4 * goff),
                        Arg::P(m + 4 * mo),
                        Arg::P(v + 4 * mo),
                        Arg::P(p.ptr() + 2 * poff),
                        Arg::L(n as i64),
                        Arg::F(cfg.lr),
                        Arg::F(cfg.beta1),
                        Arg::F(cfg.beta2),
                        Arg::F(cfg.eps),
                        Arg::F(wd),
                        Arg::F(bc1),
                        Arg::F(bc2),
                        Arg::F(self.clip_scale),
                    ];
                    self.gpu.launch(C, "adamw_step", blocks(n), &args)?;
                }
            }
        }
        for c in 0..self.bufs.len() {
            if let Some(g) = self.bufs[c].grads.as_ref() {
                self.gpu.zero(C, g.ptr(), 4 * self.chunks[c].grad_elems())?;
            }
        }
        Ok(())
    }
}
