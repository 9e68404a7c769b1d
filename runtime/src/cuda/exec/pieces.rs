//! `Compute` ops on the GPU: each (piece, phase) of the plan as cuBLAS GEMMs (bf16, fp32
//! accumulation) and the NVRTC kernels of `cuda::kernels`, with the CPU executor's tensor
//! flow (`exec::compute`, `layer.rs`, `head.rs`, `embed.rs`): the same tensors pass between
//! the same pieces, the same activations are saved per layer and microbatch, weight
//! gradients accumulate over microbatches (fp32), and the optimizer is AdamW on fp32
//! master weights with the bf16 copy written back, after the global-norm clip.
//!
//! A Llama block (`Dims::llama`) runs the same pieces with RMSNorm for the norms (no β, no
//! mean saved), no biases (null addresses, skipped), qkv (T, D + 2·Dkv) turned by RoPE on
//! q and k in place after the projection (its gradient turned back before the input and
//! weight GEMMs), attention with kv heads < query heads read by the kernels' own GQA
//! indexing (dk/dv launched per kv head, summing its group), SwiGLU on FC1's (T, 2F)
//! [gate | up], no position table, and the head's own `out_w`.
//!
//! Saved state lives in the plan's buffers: a layer's activations in its `act L mb` block,
//! the head's in `head mb` (both carved at 256-byte offsets, `saved`); tensors between pieces are
//! pool blocks of their own (the workspace), given back when their consumer is enqueued.

use strata_models::Recompute;
use strata_models::plan::{ComputeOp, Phase, Piece, Stream};

use super::device::{Arg, Device, Dt, Ptr, blocks, n, per_cols, per_row, t};
use super::rank::{GpuExecError, GpuRank, Res, Tensor};
use crate::cuda::kernels::attn_kernels;
use crate::exec::pool::BufKey;
use crate::params::LAYER_KINDS;
use crate::params::ParamKind;

/// Position of a layer tensor in `LAYER_KINDS`.
pub(super) fn ix(k: ParamKind) -> usize {
    LAYER_KINDS.iter().position(|x| *x == k).expect("a layer tensor")
}

/// A tensor between pieces of one microbatch (`exec::T` at tp = 1), or one kept for a
/// weight pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum W {
    /// The residual stream (T, h).
    R,
    /// A piece's output before the residual add (T, h).
    Out,
    /// The residual gradient (T, h).
    Dr,
    /// An input gradient (T, h).
    DPart,
    /// Per-token loss statistics (T, 3) fp32.
    Stats,
    /// Kept for the weight pass: the output gradient of FC2 / the projection (T, h), the
    /// FC1 pre-activation gradient (T, F), the qkv gradient (T, 3h).
    DFc2Out,
    DFc1Pre,
    DProjOut,
    DQkv,
    /// Sequence parallelism (`sp`): a column-parallel piece's input gathered over the
    /// sequence shards (T, h) — or, in backward, its output gradient, and the embedding's
    /// residual gradient; and a weight pass's saved input gathered again (T, h).
    Full,
    Saved,
    /// Selective recomputation: the attention core's log-sum-exp (B·heads·s fp32), from its
    /// forward re-run by the plan's `Attn` `Recompute` op, for the attention's backward.
    Lse,
}

pub use super::saved::{Acts, HeadActs, acts, head_acts, saved_acts};

pub(super) const C: Stream = Stream::Compute;

impl<D: Device> GpuRank<D> {
    /// Sequence parallelism on a tensor-parallel group (a plan that asks for it at tp = 1
    /// shards nothing: its gathers are groups of one).
    pub(super) fn sp(&self) -> bool {
        self.plan.sequence_parallel() && self.plan.grid.tp > 1
    }

    pub(super) fn k(&self, name: &str, cfg: cudarc::driver::LaunchConfig, args: &[Arg]) -> Res<()> {
        Ok(self.gpu.launch(C, name, cfg, args)?)
    }

    /// Element offset of tensor `kind` (of `layer`) in chunk `chunk`'s flat buffers.
    fn off(&self, chunk: u32, layer: Option<u32>, kind: ParamKind) -> Res<usize> {
        self.offsets[chunk as usize]
            .get(&(layer.map(|l| l as usize), kind))
            .copied()
            .ok_or_else(|| GpuExecError::Unsupported(format!("chunk {chunk} holds no {kind:?} of layer {layer:?}")))
    }

    /// (bf16 parameter, fp32 gradient) addresses of a tensor.
    pub(super) fn pg(&self, chunk: u32, layer: Option<u32>, kind: ParamKind) -> Res<(Ptr, Ptr)> {
        let o = self.off(chunk, layer, kind)?;
        let b = &self.bufs[chunk as usize];
        let (Some(p), Some(g)) = (b.params.as_ref(), b.grads.as_ref()) else {
            return Err(GpuExecError::Unsupported(format!(
                "chunk {chunk}'s parameters are used before the plan allocates them"
            )));
        };
        let zero = self.plan.scenario.zero_stage();
        if zero < 2 {
            return Ok((p.ptr() + 2 * o as u64, g.ptr() + 4 * o as u64));
        }
        // ZeRO-2/3: a backward's gradient accumulates in the bucket's full-gradient buffer of
        // its microbatch (null outside the backward); ZeRO-3 reads the bucket's gathered copy.
        // A tensor never crosses a unit, so it is contiguous in both.
        let ch = &self.chunks[chunk as usize];
        let (bi, at) = ch.locate(o).ok_or_else(|| {
            GpuExecError::Unsupported(format!("{kind:?} of layer {layer:?} is in no bucket of chunk {chunk}"))
        })?;
        let bucket = ch.buckets[bi].index;
        let grad = match self.grad_mb {
            None => 0,
            Some(m) => {
                let full = self.bucket_buf(|k| {
                    matches!(k, BufKey::GradBucket { chunk: c, bucket: b, mb } if c == chunk && b == bucket && mb == m)
                });
                full.ok_or_else(|| {
                    GpuExecError::Unsupported(format!(
                        "ZeRO-{zero}: the backward of microbatch {m} writes {kind:?} of layer {layer:?} (bucket \
                         {bucket} of chunk {chunk}) while the plan holds no full-gradient buffer for it"
                    ))
                })? + 4 * at as u64
            }
        };
        if zero < 3 {
            return Ok((p.ptr() + 2 * o as u64, grad));
        }
        // Null where the plan gathers no copy for this op (the embedding's backward writes its
        // gradient and reads no parameter): the host stand-in refuses a read through it.
        let gathered =
            self.bucket_buf(|k| matches!(k, BufKey::Gathered { chunk: c, bucket: b, .. } if c == chunk && b == bucket));
        let param = gathered.map_or(0, |p| p + 2 * at as u64);
        Ok((param, grad))
    }

    /// The block of the live plan buffer whose key `pick` accepts (any of them: every
    /// gathered copy of a bucket holds the same parameters within a step).
    fn bucket_buf(&self, pick: impl Fn(BufKey) -> bool) -> Option<Ptr> {
        self.live.values().filter(|l| pick(l.key)).find_map(|l| l.tensor.as_ref().map(Tensor::ptr))
    }

    /// (parameter, gradient) addresses of every tensor of `layer`, in `LAYER_KINDS` order;
    /// (0, 0) for a bias or norm β the model does not hold (Llama holds none).
    pub(super) fn layer_ptrs(&self, chunk: u32, layer: u32) -> Res<[(Ptr, Ptr); 12]> {
        use ParamKind::*;
        let mut out = [(0, 0); 12];
        for (o, k) in out.iter_mut().zip(LAYER_KINDS) {
            let optional = matches!(k, Ln1B | QkvB | ProjB | Ln2B | Fc1B | Fc2B);
            if optional && self.offset_of(chunk, Some(layer), k).is_none() {
                continue;
            }
            *o = self.pg(chunk, Some(layer), k)?;
        }
        Ok(out)
    }

    /// Element offset of a tensor, if the chunk holds it.
    pub(super) fn offset_of(&self, chunk: u32, layer: Option<u32>, kind: ParamKind) -> Option<usize> {
        self.offsets.get(chunk as usize)?.get(&(layer.map(|l| l as usize), kind)).copied()
    }

    /// As [`Self::pg`], or (0, 0) (null) for a tensor the chunk does not hold.
    pub(super) fn pg_opt(&self, chunk: u32, layer: Option<u32>, kind: ParamKind) -> Res<(Ptr, Ptr)> {
        match self.offset_of(chunk, layer, kind) {
            Some(_) => self.pg(chunk, layer, kind),
            None => Ok((0, 0)),
        }
    }

    pub(super) fn plan_buf(&self, key: BufKey) -> Res<Ptr> {
        self.live
            .values()
            .find(|l| l.key == key)
            .and_then(|l| l.tensor.as_ref())
            .map(Tensor::ptr)
            .ok_or_else(|| GpuExecError::Unsupported(format!("{key:?} is used but not allocated by the plan")))
    }

    /// The activations a layer piece of `phase` writes or reads. Without full
    /// recomputation: the `act L mb` block (`saved_acts`). Under it, the forward writes a
    /// transient block of the layer's own (`fwd_ws`, given back at its `LayerOut`) and
    /// saves only r_in in `act L mb`; the recomputation rebuilds everything in the plan's
    /// `recompute L mb` block, which the backward then reads.
    pub(super) fn acts_of(&self, layer: u32, mb: u32, phase: Phase) -> Res<Acts> {
        let saved = self.plan_buf(BufKey::Act { layer, mb })?;
        match (self.recompute, phase) {
            (Recompute::Full, Phase::Forward) => {
                let ws = self.fwd_ws.get(&(layer, mb)).map(Tensor::ptr).ok_or_else(|| {
                    GpuExecError::Unsupported(format!("layer {layer} mb {mb}: a forward piece before its AttnIn"))
                })?;
                let mut a = acts(&self.dims, ws).0;
                a.r_in = saved;
                Ok(a)
            }
            (Recompute::Full, _) => Ok(acts(&self.dims, self.plan_buf(BufKey::Recompute { layer, mb })?).0),
            (rc, _) => Ok(saved_acts(&self.dims, saved, rc).0),
        }
    }

    pub(super) fn head(&self, mb: u32) -> Res<HeadActs> {
        Ok(head_acts(&self.dims, self.plan_buf(BufKey::Head { mb })?).0)
    }

    pub(super) fn put(&mut self, chunk: u32, mb: u32, w: W, t: Tensor) -> Res<()> {
        if self.flight.insert((chunk, mb, w), t).is_some() {
            return Err(GpuExecError::Unsupported(format!("{w:?} of chunk {chunk} mb {mb} produced twice")));
        }
        Ok(())
    }

    /// Tensor `w` of (chunk, mb): from an earlier piece, or from a received pipeline message.
    pub(super) fn got(&mut self, chunk: u32, mb: u32, w: W) -> Res<Tensor> {
        if !self.flight.contains_key(&(chunk, mb, w))
            && let Some(t) = self.incoming(chunk, mb, w)?
        {
            return Ok(t);
        }
        self.got_here(chunk, mb, w)
    }

    pub(super) fn ws(&mut self, what: &str, bytes: usize) -> Res<Tensor> {
        self.take_as(super::overhead::WORKSPACE, what, bytes as u64)
    }

    pub(super) fn tok(&self, mb: u32) -> (Ptr, Ptr) {
        let base = self.tokens.as_ref().map(Tensor::ptr).expect("the step's tokens are loaded");
        let tk = self.dims.t as u64;
        (base + 4 * tk * mb as u64, base + 4 * tk * (self.m as u64 + mb as u64))
    }

    /// The block's norm forward: LayerNorm (GPT) or RMSNorm (Llama: no β, no mean saved),
    /// over the rank's rows (its sequence shard under sequence parallelism).
    pub(super) fn ln_fwd(&self, x: Ptr, g: Ptr, b: Ptr, y: Ptr, mean: Ptr, rstd: Ptr) -> Res<()> {
        let (rows, cols, eps) = (self.dims.rows as i32, self.dims.h as i32, crate::kernels::LN_EPS);
        if self.dims.llama {
            let args = [Arg::P(x), Arg::P(g), Arg::P(y), Arg::P(rstd), Arg::I(rows), Arg::I(cols), Arg::F(eps)];
            return self.k("rmsnorm_fwd_bf16", per_row(self.dims.rows), &args);
        }
        let args = [
            Arg::P(x),
            Arg::P(g),
            Arg::P(b),
            Arg::P(y),
            Arg::P(mean),
            Arg::P(rstd),
            Arg::I(rows),
            Arg::I(cols),
            Arg::F(eps),
        ];
        self.k("layernorm_fwd_bf16", per_row(self.dims.rows), &args)
    }

    /// dx = normᵀ(dy) (overwritten), dγ (and LayerNorm's dβ) += (fp32), over the rank's
    /// rows (under sequence parallelism the tp group's sum comes at the step's end).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ln_bwd(&self, dy: Ptr, x: Ptr, g: Ptr, mean: Ptr, rstd: Ptr, dx: Ptr, dg: Ptr, db: Ptr) -> Res<()> {
        let (rows, cols) = (self.dims.rows as i32, self.dims.h as i32);
        if self.dims.llama {
            let dx_args = [Arg::P(dy), Arg::P(x), Arg::P(g), Arg::P(rstd), Arg::P(dx), Arg::I(rows), Arg::I(cols)];
            self.k("rmsnorm_bwd_dx_bf16", per_row(self.dims.rows), &dx_args)?;
            let p_args = [Arg::P(dy), Arg::P(x), Arg::P(rstd), Arg::P(dg), Arg::I(rows), Arg::I(cols)];
            return self.k("rmsnorm_bwd_params_bf16", per_cols(self.dims.h), &p_args);
        }
        let dx_args =
            [Arg::P(dy), Arg::P(x), Arg::P(g), Arg::P(mean), Arg::P(rstd), Arg::P(dx), Arg::I(rows), Arg::I(cols)];
        self.k("layernorm_bwd_dx_bf16", per_row(self.dims.rows), &dx_args)?;
        let p_args =
            [Arg::P(dy), Arg::P(x), Arg::P(mean), Arg::P(rstd), Arg::P(dg), Arg::P(db), Arg::I(rows), Arg::I(cols)];
        self.k("layernorm_bwd_params_bf16", per_cols(self.dims.h), &p_args)
    }

    /// RoPE in place on `heads` heads of every token's row (`stride` elements apart) from
    /// `x`: forward (sign 1) on q and k, backward (sign −1) on their gradients.
    pub(super) fn rope(&self, x: Ptr, heads: usize, stride: usize, sign: f32) -> Res<()> {
        let d = self.dims;
        let args = [
            Arg::P(x),
            Arg::I(d.t as i32),
            Arg::I(d.s as i32),
            Arg::I(heads as i32),
            Arg::I(d.hd as i32),
            Arg::L(stride as i64),
            Arg::F(d.rope_base),
            Arg::F(sign),
        ];
        self.k("rope_bf16", blocks(d.t * heads * (d.hd / 2)), &args)
    }

    /// RoPE over q and k of a (T, D + 2·Dkv) qkv buffer (or its gradient); none for GPT.
    pub(super) fn rope_qk(&self, qkv: Ptr, sign: f32) -> Res<()> {
        let d = self.dims;
        if !d.llama {
            return Ok(());
        }
        self.rope(qkv, d.heads, d.qkv_w(), sign)?;
        self.rope(qkv + 2 * d.q_dim() as u64, d.kv, d.qkv_w(), sign)
    }

    pub(super) fn add(&self, y: Ptr, x: Ptr, elems: usize) -> Res<()> {
        self.k("add_bf16", blocks(elems), &[Arg::P(y), Arg::P(x), Arg::L(elems as i64)])
    }

    /// y += b per row of `rows`; nothing for an absent bias (null: Llama).
    fn add_bias(&self, y: Ptr, b: Ptr, rows: usize, cols: usize) -> Res<()> {
        if b == 0 {
            return Ok(());
        }
        self.k("add_bias_bf16", blocks(rows * cols), &[Arg::P(y), Arg::P(b), Arg::L(rows as i64), Arg::I(cols as i32)])
    }

    /// db += Σ_rows dy over `rows` rows; nothing for an absent bias (null: Llama).
    pub(super) fn col_sum(&self, dy: Ptr, db: Ptr, rows: usize, cols: usize) -> Res<()> {
        if db == 0 {
            return Ok(());
        }
        self.k("col_sum_bf16", per_cols(cols), &[Arg::P(dy), Arg::P(db), Arg::L(rows as i64), Arg::I(cols as i32)])
    }

    /// y (T×k→n) = x·W (+ b, unless null): bf16 out.
    fn linear(&self, x: Ptr, w: Ptr, b: Ptr, y: Ptr, k: usize, nn: usize) -> Res<()> {
        self.gpu.gemm(self.dims.t, nn, k, n(x), n(w), y, Dt::Bf16, 0.0)?;
        self.add_bias(y, b, self.dims.t, nn)
    }

    /// How a partial sum the tensor-parallel group reduces is stored (element type, bytes):
    /// fp32 under tp > 1, rounded to bf16 once after the sum (`multi`) as the single rank's
    /// GEMM rounds its full sum once; bf16 on one rank (nothing to reduce).
    pub(super) fn partial_dt(&self) -> (Dt, usize) {
        if self.plan.grid.tp > 1 { (Dt::F32, 4) } else { (Dt::Bf16, 2) }
    }

    /// dx (T×k) = dy (T×n)·Wᵀ into a partial sum (`partial_dt`).
    pub(super) fn dinput_partial(&self, dy: Ptr, w: Ptr, dx: Ptr, k: usize, nn: usize) -> Res<()> {
        Ok(self.gpu.gemm(self.dims.t, k, nn, n(dy), t(w), dx, self.partial_dt().0, 0.0)?)
    }

    /// dx (T×k) = dy (T×n)·Wᵀ.
    pub(super) fn dinput(&self, dy: Ptr, w: Ptr, dx: Ptr, k: usize, nn: usize) -> Res<()> {
        Ok(self.gpu.gemm(self.dims.t, k, nn, n(dy), t(w), dx, Dt::Bf16, 0.0)?)
    }

    /// dW (k×n, fp32) += xᵀ·dy.
    pub(super) fn dweight(&self, x: Ptr, dy: Ptr, dw: Ptr, k: usize, nn: usize) -> Res<()> {
        Ok(self.gpu.gemm(k, nn, self.dims.t, t(x), n(dy), dw, Dt::F32, 1.0)?)
    }

    pub(super) fn compute(&mut self, c: &ComputeOp) -> Res<()> {
        let (chunk, mb) = (c.chunk, c.mb);
        self.grad_mb = matches!(c.phase, Phase::BackwardInput | Phase::BackwardWeight).then_some(mb);
        match (c.piece, c.phase) {
            (Piece::Embed, Phase::Forward) => self.embed_fwd(chunk, mb),
            (Piece::Embed, Phase::BackwardWeight) => self.embed_bwd(chunk, mb),
            (p, Phase::Forward | Phase::Recompute) if p.in_layer() => self.layer_fwd(c),
            (p, Phase::BackwardInput | Phase::BackwardWeight) if p.in_layer() => self.layer_bwd(c),
            (Piece::FinalNorm | Piece::Logits | Piece::Loss, _) => self.head_piece(c),
            (Piece::Optimizer, Phase::Step) => self.optimizer_step(),
            (p, phase) => Err(GpuExecError::Unsupported(format!("{} {} on the GPU", p.key(), phase.key()))),
        }
    }

    fn embed_fwd(&mut self, chunk: u32, mb: u32) -> Res<()> {
        let d = self.dims;
        let (wte, _) = self.pg(chunk, None, ParamKind::Wte)?;
        // Llama has no position table (RoPE in the layers): a null one, which the kernel skips.
        let (wpe, _) = self.pg_opt(chunk, None, ParamKind::Wpe)?;
        let out = self.ws("the embedding's output", 2 * d.t * d.h)?;
        let (inputs, _) = self.tok(mb);
        let args = [
            Arg::P(inputs),
            Arg::P(wte),
            // wte[x] + wpe[i] counted once over the tensor-parallel sum: the position table
            // on tp rank 0 only (the CPU executor's rule); the kernel skips a null one.
            Arg::P(if self.plan.grid.coord(self.rank).tp == 0 { wpe } else { 0 }),
            Arg::P(out.ptr()),
            Arg::I(d.t as i32),
            Arg::I(d.s as i32),
            Arg::I(d.h as i32),
            Arg::I(d.v0 as i32),
            Arg::I(d.v as i32),
        ];
        self.k("embed_fwd_bf16", per_row(d.t), &args)?;
        self.put(chunk, mb, W::R, out)
    }

    fn embed_bwd(&mut self, chunk: u32, mb: u32) -> Res<()> {
        let d = self.dims;
        // Sequence parallelism: every token's residual gradient, gathered over the shards.
        let dr = self.got(chunk, mb, if self.sp() { W::Full } else { W::Dr })?;
        let (_, dwte) = self.pg(chunk, None, ParamKind::Wte)?;
        let (_, dwpe) = self.pg_opt(chunk, None, ParamKind::Wpe)?;
        let (inputs, _) = self.tok(mb);
        let args = [
            Arg::P(inputs),
            Arg::P(dr.ptr()),
            Arg::P(dwte),
            Arg::P(dwpe),
            Arg::I(d.t as i32),
            Arg::I(d.s as i32),
            Arg::I(d.h as i32),
            Arg::I(d.v0 as i32),
            Arg::I(d.v as i32),
        ];
        self.k("embed_bwd_bf16", per_row(d.t), &args)?;
        self.give(dr);
        Ok(())
    }

    /// The residual entering a layer: the previous piece's, the embedding's, or the one
    /// received from the previous stage.
    fn residual_in(&mut self, chunk: u32, mb: u32) -> Res<Tensor> {
        self.got(chunk, mb, W::R)
    }

    /// A forward layer piece, or its recomputation (`Phase::Recompute`, full recomputation:
    /// the same kernels from the saved input into the `recompute L mb` block).
    fn layer_fwd(&mut self, c: &ComputeOp) -> Res<()> {
        let (chunk, mb, layer, phase) = (c.chunk, c.mb, c.layer, c.phase);
        let d = self.dims;
        // The residual stream's elements on this rank (its sequence shard under `sp`).
        let th = d.rows * d.h;
        let full = self.recompute == Recompute::Full;
        if full && phase == Phase::Forward && c.piece == Piece::AttnIn {
            let ws = self.ws("a layer's forward activations (full recomputation keeps only its input)", {
                acts(&d, 0).1 as usize
            })?;
            self.fwd_ws.insert((layer, mb), ws);
        }
        let ac = self.acts_of(layer, mb, phase)?;
        let lp = self.layer_ptrs(chunk, layer)?;
        let p = |k| -> Res<Ptr> { Ok(lp[ix(k)].0) };
        match c.piece {
            Piece::AttnIn => {
                let (g, b) = (p(ParamKind::Ln1W)?, lp[ix(ParamKind::Ln1B)].0);
                let r = if phase == Phase::Recompute {
                    // The residual stream again, from the input the forward saved.
                    let saved = saved_acts(&d, self.plan_buf(BufKey::Act { layer, mb })?, Recompute::Full).0;
                    let r = self.ws("the recomputed layer's residual stream", 2 * th)?;
                    self.gpu.copy(C, r.ptr(), saved.r_in, 2 * th)?;
                    r
                } else {
                    self.residual_in(chunk, mb)?
                };
                self.gpu.copy(C, ac.r_in, r.ptr(), 2 * th)?;
                self.ln_fwd(r.ptr(), g, b, ac.a, ac.ln1_mean, ac.ln1_rstd)?;
                self.put(chunk, mb, W::R, r)
            }
            Piece::Attn if phase == Phase::Recompute && !full => {
                // Selective recomputation of a fused core (Megatron-LM's `core_attn`): its
                // forward again from the saved q, k, v, for the log-sum-exp the backward reads.
                let lse = self.ws("the attention's recomputed log-sum-exp", 4 * d.b * d.heads * d.s)?;
                let ctx = self.ws("the attention's recomputed context (unread)", 2 * d.t * d.q_dim())?;
                self.attn_core_fwd(ac.qkv, ctx.ptr(), lse.ptr())?;
                self.give(ctx);
                self.put(chunk, mb, W::Lse, lse)
            }
            Piece::Attn => {
                let (wq, bq, wp) = (p(ParamKind::QkvW)?, lp[ix(ParamKind::QkvB)].0, p(ParamKind::ProjW)?);
                // This rank's heads: [Q | K | V] of D = heads · head_dim and Dkv = kv · head_dim
                // columns (Dkv = D unless grouped-query attention); RoPE on q and k (Llama).
                let (dc, w) = (d.q_dim(), d.qkv_w());
                // Sequence parallelism: the norm's output of every token, gathered.
                let gathered = if self.sp() { Some(self.got_here(chunk, mb, W::Full)?) } else { None };
                self.linear(gathered.as_ref().map_or(ac.a, Tensor::ptr), wq, bq, ac.qkv, d.h, w)?;
                if let Some(t) = gathered {
                    self.give(t);
                }
                self.rope_qk(ac.qkv, 1.0)?;
                // Selective recomputation keeps no statistics: a scratch for the kernel's.
                let scratch = if ac.lse == 0 {
                    Some(self.ws("the attention's log-sum-exp (not kept: selective)", 4 * d.b * d.heads * d.s)?)
                } else {
                    None
                };
                self.attn_core_fwd(ac.qkv, ac.ctx, scratch.as_ref().map_or(ac.lse, Tensor::ptr))?;
                if let Some(t) = scratch {
                    self.give(t);
                }
                let (dt, eb) = self.partial_dt();
                let out = self.ws("the attention's output", eb * d.t * d.h)?;
                self.gpu.gemm(d.t, d.h, dc, n(ac.ctx), n(wp), out.ptr(), dt, 0.0)?;
                self.put(chunk, mb, W::Out, out)
            }
            Piece::MlpIn => {
                let (bp, g, b) = (lp[ix(ParamKind::ProjB)].0, p(ParamKind::Ln2W)?, lp[ix(ParamKind::Ln2B)].0);
                let r = self.got(chunk, mb, W::R)?;
                let o = self.got(chunk, mb, W::Out)?;
                self.add(r.ptr(), o.ptr(), th)?;
                self.add_bias(r.ptr(), bp, d.rows, d.h)?;
                self.give(o);
                self.gpu.copy(C, ac.r_mid, r.ptr(), 2 * th)?;
                self.ln_fwd(r.ptr(), g, b, ac.m, ac.ln2_mean, ac.ln2_rstd)?;
                self.put(chunk, mb, W::R, r)
            }
            Piece::Mlp => {
                let (w1, b1, w2) = (p(ParamKind::Fc1W)?, lp[ix(ParamKind::Fc1B)].0, p(ParamKind::Fc2W)?);
                let gathered = if self.sp() { Some(self.got_here(chunk, mb, W::Full)?) } else { None };
                self.linear(gathered.as_ref().map_or(ac.m, Tensor::ptr), w1, b1, ac.fc1_pre, d.h, d.fc1_w())?;
                if let Some(t) = gathered {
                    self.give(t);
                }
                let tf = d.t * d.f;
                if d.llama {
                    // act = SiLU(gate) ⊙ up from FC1's [gate | up] row.
                    let args = [Arg::P(ac.fc1_pre), Arg::P(ac.fc1_act), Arg::L(d.t as i64), Arg::I(d.f as i32)];
                    self.k("swiglu_fwd_bf16", blocks(tf), &args)?;
                } else {
                    let args = [Arg::P(ac.fc1_pre), Arg::P(ac.fc1_act), Arg::L(tf as i64)];
                    self.k("gelu_fwd_bf16", blocks(tf), &args)?;
                }
                let (dt, eb) = self.partial_dt();
                let out = self.ws("the MLP's output", eb * d.t * d.h)?;
                self.gpu.gemm(d.t, d.h, d.f, n(ac.fc1_act), n(w2), out.ptr(), dt, 0.0)?;
                self.put(chunk, mb, W::Out, out)
            }
            Piece::LayerOut if phase == Phase::Recompute => {
                // The layer's output is the next layer's saved input already: the
                // recomputation ends with the MLP's activations in the block.
                let (r, o) = (self.got(chunk, mb, W::R)?, self.got(chunk, mb, W::Out)?);
                self.give(o);
                self.give(r);
                Ok(())
            }
            Piece::LayerOut => {
                let b2 = lp[ix(ParamKind::Fc2B)].0;
                let r = self.got(chunk, mb, W::R)?;
                let o = self.got(chunk, mb, W::Out)?;
                if let Some(ws) = self.fwd_ws.remove(&(layer, mb)) {
                    self.give(ws);
                }
                self.add(r.ptr(), o.ptr(), th)?;
                self.add_bias(r.ptr(), b2, d.rows, d.h)?;
                self.give(o);
                self.put(chunk, mb, W::R, r)
            }
            other => Err(GpuExecError::Unsupported(format!("{} forward in a layer", other.key()))),
        }
    }
}

impl<D: Device> GpuRank<D> {
    /// The fused attention core's forward over a (T, D + 2·Dkv) [Q | K | V] after RoPE:
    /// ctx (T, D) and the per-row log-sum-exp (b, heads, s) fp32 its backward reads.
    pub(super) fn attn_core_fwd(&self, qkv: Ptr, ctx: Ptr, lse: Ptr) -> Res<()> {
        let d = self.dims;
        let (dc, dkv, w) = (d.q_dim(), d.kv_dim(), d.qkv_w());
        let (qs, os) = (w as i64, dc as i64);
        let args = [
            Arg::P(qkv),
            Arg::P(qkv + 2 * dc as u64),
            Arg::P(qkv + 2 * (dc + dkv) as u64),
            Arg::P(ctx),
            Arg::P(lse),
            Arg::I(d.b as i32),
            Arg::I(d.s as i32),
            Arg::I(d.heads as i32),
            Arg::I(d.kv as i32),
            Arg::I(d.hd as i32),
            Arg::L(qs),
            Arg::L(qs),
            Arg::L(os),
            Arg::F(1.0 / (d.hd as f32).sqrt()),
        ];
        let ak = attn_kernels(d.hd);
        self.k(ak.fwd, ak.grid(d.s, d.heads, d.b), &args)
    }
}
