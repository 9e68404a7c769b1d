//! A GPU rank's side of sequence parallelism (Megatron-LM's, as the plan lowers it and
//! the CPU executor runs it: `exec::coll`, `exec::compute`): which of its tensors each of
//! the plan's sequence-parallel collectives moves and where the result goes, for both
//! communicators (`multi/sp.rs` on one GPU, `nccl/sp.rs` through NCCL).
//!
//! The norms and the residual stream hold the rank's shard of the microbatch's tokens
//! (`Dims::rows` = T / tp, tp position p holding rows p·T/tp..); the column-parallel pieces
//! read every token:
//! - **all-gather** (`TpSite::Gather`): before QKV, FC1 and the output layer, the norm's
//!   output shard (the saved `a`, `m`, `hn`) into `W::Full` (T, h); in backward, before
//!   the attention's and the MLP's input-gradient pass, the residual gradient's shard
//!   (left in place for the residual stream) and, before the embedding's backward, the
//!   residual gradient itself (taken);
//! - **all-gather again** (`TpSite::GatherSaved`): a weight pass's saved input shard into
//!   `W::Saved` (T, h), as Megatron-LM gathers it again rather than keeping it;
//! - **reduce-scatter** (`TpSite::Reduce` under sequence parallelism): the row-parallel
//!   GEMMs' fp32 partial sums (T, h) of the attention projection and FC2 (backward: of the
//!   column-parallel pieces' input gradients, and of the output layer's), and the
//!   vocabulary shards' bf16 embeddings, summed into the rank's (T / tp, h) shard, rounded
//!   to bf16 once after the fp32 sum as the all-reduce is;
//! - **all-reduce of the replicated gradients** (`CollPurpose::SpReplicatedGrads`, once a
//!   step): each rank computed the norms' and the row-parallel biases' gradients from its
//!   own tokens, so they are summed over the tensor-parallel group — the CPU executor's
//!   `sp_ranges`: every replicated tensor but the position table (every rank computes its
//!   gradient from all tokens' gathered residual gradient), over the owned gradients.

use std::ops::Range;

use strata_models::plan::{Phase, Piece, TpSite};

use super::device::{Arg, Device, Ptr, blocks};
use super::pieces::W;
use super::rank::{GpuExecError, GpuRank, Res, Tensor};
use crate::params::{ParamKind, TpSplit};

/// One rank's part in a sequence-parallel all-gather: its shard (rows · h bf16 at
/// `src`), a tensor taken for it and given back after the gather (the embedding's
/// residual gradient), and the tensor the gathered (T, h) becomes.
pub(super) struct SpGather {
    pub src: Ptr,
    pub taken: Option<Tensor>,
    pub into: W,
}

fn bad(why: String) -> GpuExecError {
    GpuExecError::Unsupported(why)
}

impl<D: Device> GpuRank<D> {
    /// Elements of a rank's sequence shard of a (T, h) tensor, and of the whole tensor.
    pub(super) fn sp_elems(&self) -> (usize, usize) {
        (self.dims.rows * self.dims.h, self.dims.t * self.dims.h)
    }

    /// What a sequence-parallel all-gather of (site, piece, phase) of (chunk, layer, mb)
    /// reads on this rank, as the CPU executor's `coll_input` picks it.
    pub(super) fn sp_gather_src(
        &mut self,
        site: TpSite,
        piece: Piece,
        phase: Phase,
        chunk: u32,
        mb: u32,
        layer: u32,
    ) -> Res<SpGather> {
        let norm_out = |r: &Self, ph: Phase| -> Res<Ptr> {
            match piece {
                Piece::Logits => Ok(r.head(mb)?.hn),
                Piece::Attn => Ok(r.acts_of(layer, mb, ph)?.a),
                Piece::Mlp => Ok(r.acts_of(layer, mb, ph)?.m),
                other => Err(bad(format!("a sequence-parallel gather of {}'s input", other.key()))),
            }
        };
        let g = match (site, phase) {
            (TpSite::Gather, Phase::Forward | Phase::Recompute) => {
                SpGather { src: norm_out(self, phase)?, taken: None, into: W::Full }
            }
            // The embedding's backward reads every token's residual gradient.
            (TpSite::Gather, Phase::BackwardWeight) if piece == Piece::Embed => {
                let dr = self.got(chunk, mb, W::Dr)?;
                SpGather { src: dr.ptr(), taken: Some(dr), into: W::Full }
            }
            // An input-gradient pass's output gradient; the shard stays the residual's.
            (TpSite::Gather, Phase::BackwardInput) if matches!(piece, Piece::Attn | Piece::Mlp) => {
                // The layer's output backward put it there (from the next stage's message).
                let dr = self.flight.get(&(chunk, mb, W::Dr)).map(Tensor::ptr).ok_or_else(|| {
                    bad(format!("the residual gradient of chunk {chunk} mb {mb} is gathered before it is produced"))
                })?;
                SpGather { src: dr, taken: None, into: W::Full }
            }
            (TpSite::GatherSaved, _) => {
                SpGather { src: norm_out(self, Phase::BackwardWeight)?, taken: None, into: W::Saved }
            }
            (s, ph) => {
                return Err(bad(format!("a sequence-parallel {s:?} of {} in {}", piece.key(), ph.key())));
            }
        };
        Ok(g)
    }

    /// A reduce-scatter's sum (`elems` of `eb` bytes: fp32 partial sums, or the bf16
    /// embeddings) as tensor `w` of (chunk, mb): rounded to bf16 once if fp32.
    pub(super) fn sp_reduced(
        &mut self,
        s: strata_models::plan::Stream,
        chunk: u32,
        mb: u32,
        w: W,
        sum: Tensor,
        eb: usize,
    ) -> Res<()> {
        let elems = self.sp_elems().0;
        if eb == 2 {
            return self.put(chunk, mb, w, sum);
        }
        let out = self.take("a reduce-scattered partial sum in bf16", 2 * elems as u64)?;
        let args = [Arg::P(sum.ptr()), Arg::P(out.ptr()), Arg::L(elems as i64)];
        self.gpu.launch(s, "cast_f32_bf16", blocks(elems), &args)?;
        self.give(sum);
        self.put(chunk, mb, w, out)
    }

    /// The fp32 gradients the tensor-parallel group sums under sequence parallelism, as
    /// (address, elements) runs, contiguous ones merged: the owned runs of every
    /// replicated tensor but the position table, in offset order per chunk (at their
    /// place in the gradient shard under ZeRO-2/3).
    pub(super) fn sp_grad_runs(&self) -> Res<Vec<(Ptr, usize)>> {
        let sharded = self.plan.scenario.zero_stage() >= 2;
        let mut out: Vec<(Ptr, usize)> = Vec::new();
        for (c, ch) in self.chunks.iter().enumerate() {
            let entries = ch.layout.entries();
            let summed = |flat: usize| {
                entries.iter().any(|e| {
                    (e.offset..e.offset + e.len()).contains(&flat)
                        && e.kind.split() == TpSplit::Replicated
                        && e.kind != ParamKind::Wpe
                        && !e.kind.is_expert()
                })
            };
            let mut runs: Vec<Range<usize>> = ch
                .owned_runs()
                .into_iter()
                .filter(|r| r.replicated && summed(r.flat))
                .map(|r| if sharded { r.master..r.master + r.len } else { r.flat..r.flat + r.len })
                .collect();
            if runs.is_empty() {
                continue;
            }
            runs.sort_by_key(|r| r.start);
            let g = self.bufs[c].grads.as_ref().map(Tensor::ptr).ok_or_else(|| {
                bad(format!("rank {}'s gradients of chunk {c} are summed before the plan allocates them", self.rank))
            })?;
            for r in runs {
                let p = g + 4 * r.start as u64;
                match out.last_mut() {
                    Some(last) if last.0 + 4 * last.1 as u64 == p => last.1 += r.len(),
                    _ => out.push((p, r.len())),
                }
            }
        }
        Ok(out)
    }
}
