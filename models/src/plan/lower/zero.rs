//! ZeRO's data-parallel traffic: the parameter all-gathers (ZeRO-1/2 per bucket after the
//! optimizer step or overlapped with the next forward; ZeRO-3 per unit before its forward
//! and its backward, prefetching one unit ahead), the gradient-bucket reductions
//! (all-reduce for ZeRO-0, reduce-scatter for ZeRO ≥ 1; after the last microbatch, or every
//! microbatch for ZeRO-2/3) and the full-gradient buffers ZeRO-2/3 reduce from. Gradients
//! move in the framework's reduction dtype ([`crate::accounting::states::StateLayout`]).

use std::collections::BTreeMap;

use crate::accounting::memory::state_bytes_per_param;
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::plan::lowered::Unit;

/// Per-microbatch state of a gradient bucket (ZB runs input and weight passes of
/// different microbatches interleaved, so completion is tracked per microbatch).
#[derive(Default)]
pub(super) struct BucketState {
    /// mb → ops that completed a unit's gradient in that microbatch.
    done: BTreeMap<u32, Vec<OpId>>,
    /// mb → ZeRO-2/3's transient full-gradient buffer.
    full_grad: BTreeMap<u32, BufId>,
    /// The reduction of the bucket's last full-gradient buffer: the next one waits for it.
    last_reduce: Option<OpId>,
}

impl<'p, 'a> StageLowering<'p, 'a> {
    pub(super) fn param_bucket_gather(&mut self, bucket: usize, deps: &[OpId]) -> OpId {
        let b = &self.buckets()[bucket];
        let bytes = b.params * state_bytes_per_param(self.dtype()).0;
        let purpose = CollPurpose::ParamBucket { chunk: b.chunk, bucket: b.index };
        let group = if b.is_expert() { GroupKind::ExpertDp } else { GroupKind::Dp };
        let params = self.params_buf(b.chunk);
        let op = self.collective(Stream::Dp, deps, &[params], CollKind::AllGather, group, bytes, purpose);
        self.dp_ops.push(op);
        op
    }

    /// Deps a unit's first compute op needs for its parameters: the ZeRO-1/2 all-gather of
    /// its bucket (first use in the step), or the ZeRO-3 gather of the unit itself.
    pub(super) fn params_for(&mut self, chunk: u32, units: &[Unit], mb: u32, phase: Phase) -> (Vec<OpId>, Vec<BufId>) {
        let mut deps = Vec::new();
        let mut bufs = Vec::new();
        let per_module = self.per_module();
        for u in units {
            let Some(&b) = self.unit_bucket.get(&(chunk, *u)) else { continue };
            if let Some(op) = self.param_ready.remove(&b) {
                deps.push(op);
            }
            // DeepSpeed gathers a layer module by module (`fetch_modules`) and never gathers
            // parameters at or under its persistence threshold (the final norm).
            let persistent = per_module
                .is_some_and(|m| matches!(u, Unit::Layer(_)) || self.buckets()[b].params <= m.persistence_threshold);
            if self.zero() >= 3 && !persistent {
                let (op, buf) = match self.prefetched.remove(&(b, mb, phase)) {
                    Some(x) => x,
                    None => self.gather_unit(b, mb, phase),
                };
                deps.push(op);
                bufs.push(buf);
            }
        }
        (deps, bufs)
    }

    /// ZeRO-3 in backward: gather the next layer's parameters now, ahead of this layer's
    /// gradient reduce-scatter on the in-order data-parallel stream, so the gather overlaps
    /// this layer's backward instead of waiting behind its reduction.
    pub(super) fn prefetch(&mut self, chunk: u32, unit: Unit, mb: u32, phase: Phase) {
        if self.zero() < 3 || !self.s().parallel.overlap_param_gather || self.per_module().is_some() {
            return;
        }
        if let Some(&b) = self.unit_bucket.get(&(chunk, unit))
            && !self.prefetched.contains_key(&(b, mb, phase))
        {
            let g = self.gather_unit(b, mb, phase);
            self.prefetched.insert((b, mb, phase), g);
        }
    }

    /// ZeRO-3: allocate and all-gather one unit's full parameters, at most `prefetch` ahead.
    pub(super) fn gather_unit(&mut self, bucket: usize, mb: u32, phase: Phase) -> (OpId, BufId) {
        let b = &self.buckets()[bucket];
        let bytes = b.params * state_bytes_per_param(self.dtype()).0;
        let window = if self.s().parallel.overlap_param_gather { 2 } else { 1 };
        let wait: Vec<OpId> = if self.gathered_frees.len() >= window {
            vec![self.gathered_frees[self.gathered_frees.len() - window]]
        } else {
            vec![]
        };
        let name = format!("gathered c{} b{} mb{mb}", b.chunk, b.index);
        let (buf, _) = self.e.alloc(Stream::Dp, &wait, BufClass::Params, bytes, name);
        let purpose = CollPurpose::ParamGather { chunk: b.chunk, bucket: b.index, mb, phase };
        let shard = self.params_buf(b.chunk);
        let op = self.collective(Stream::Dp, &[], &[buf, shard], CollKind::AllGather, GroupKind::Dp, bytes, purpose);
        self.dp_ops.push(op);
        (op, buf)
    }

    pub(super) fn release_gathered(&mut self, bufs: &[BufId], after: OpId) {
        for b in bufs {
            let f = self.e.free(Stream::Compute, &[after], *b);
            self.gathered_frees.push_back(f);
        }
    }

    /// First gradient work on some units in this microbatch: ZeRO-2/3 need their bucket's
    /// full-gradient buffer.
    pub(super) fn touch(&mut self, chunk: u32, units: &[Unit], mb: u32) {
        if self.zero() < 2 {
            return;
        }
        // Accumulated unsharded over the microbatches (torchtitan with a pipeline): one
        // buffer per bucket for the whole step, keyed by microbatch 0.
        let key = if self.s().training.framework.accumulates_unsharded(self.s()) { 0 } else { mb };
        for u in units {
            let Some(&b) = self.unit_bucket.get(&(chunk, *u)) else { continue };
            if !self.bucket_state[b].full_grad.contains_key(&key) {
                let bk = &self.buckets()[b];
                let bytes = bk.params * self.grad_reduce_bytes();
                let name = format!("grad bucket c{} b{} mb{mb}", bk.chunk, bk.index);
                // One full-gradient buffer per bucket at a time, as DeepSpeed's and
                // Megatron-LM's buckets are reused: a microbatch's waits until the previous
                // one's reduction is done, so a rank that runs ahead of its data-parallel
                // peers cannot pile up a buffer per microbatch.
                let after: Vec<OpId> = self.bucket_state[b].last_reduce.into_iter().collect();
                let (buf, _) = self.e.alloc(Stream::Compute, &after, BufClass::Grads, bytes, name);
                self.bucket_state[b].full_grad.insert(key, buf);
            }
        }
    }

    /// A unit's gradient for this microbatch is complete after `op`.
    pub(super) fn unit_done(&mut self, chunk: u32, unit: Unit, mb: u32, op: OpId) {
        let Some(&b) = self.unit_bucket.get(&(chunk, unit)) else { return };
        // Every schedule runs a chunk's backwards in microbatch order, so m − 1 is the last.
        let last = mb + 1 == self.s().parallel.microbatches();
        let accumulate = self.s().training.framework.accumulates_unsharded(self.s());
        let st = &mut self.bucket_state[b];
        let done = st.done.entry(mb).or_default();
        done.push(op);
        let bucket = &self.pl.buckets[self.stage as usize][b];
        if done.len() < bucket.units.len() {
            return;
        }
        let deps = st.done.remove(&mb).expect("just filled");
        if accumulate {
            // torch.distributed.pipelining: no sync until the chunk's last backward is done.
            if last {
                let full = st.full_grad.remove(&0);
                self.chunk_grad_reduce.push((b, mb, deps, full));
            }
            return;
        }
        let full = st.full_grad.remove(&mb);
        let zero = self.zero();
        if zero >= 2 || last {
            // DeepSpeed's PipelineEngine reduces after the pipeline flush, whatever the
            // overlap setting says.
            let after_flush = self.s().training.framework.reduces_after_flush(self.s());
            if (!self.s().parallel.overlap_grad_reduce || after_flush) && zero < 2 {
                self.deferred_grad_reduce.push((b, mb, deps));
            } else {
                let op = self.grad_reduce(b, mb, &deps, full);
                if !self.s().parallel.overlap_grad_reduce {
                    // Without overlap the next compute waits for the reduction.
                    self.pending_sync.push(op);
                }
            }
        }
    }

    /// torchtitan with a pipeline: after a chunk's last backward (`after`), the
    /// reduce-scatters of its accumulated gradients, as `post_backward` issues them.
    pub(super) fn flush_chunk_grad_reduce(&mut self, after: OpId) {
        for (b, mb, mut deps, full) in std::mem::take(&mut self.chunk_grad_reduce) {
            deps.push(after);
            self.grad_reduce(b, mb, &deps, full);
        }
    }

    pub(super) fn grad_reduce(&mut self, b: usize, mb: u32, deps: &[OpId], full: Option<BufId>) -> OpId {
        let bk = &self.pl.buckets[self.stage as usize][b];
        let bytes = bk.params * self.grad_reduce_bytes();
        // ZeRO-1 reduce-scatters to the partitions' owners, except DeepSpeed's BF16_Optimizer,
        // which all-reduces whole buckets (the owners read their part of the result).
        let whole = self.zero() == 0 || self.s().training.framework.all_reduces_zero1_grads(self.s());
        let kind = if whole { CollKind::AllReduce } else { CollKind::ReduceScatter };
        // Expert buckets reduce over the ranks that hold the same experts.
        let (purpose, group) = if bk.is_expert() {
            (CollPurpose::ExpertGradBucket { chunk: bk.chunk, bucket: bk.index, mb }, GroupKind::ExpertDp)
        } else {
            (CollPurpose::GradBucket { chunk: bk.chunk, bucket: bk.index, mb }, GroupKind::Dp)
        };
        let grads = self.grads_buf(bk.chunk);
        let mut bufs = vec![grads];
        bufs.extend(full);
        let op = self.grad_collective(Stream::Dp, deps, &bufs, kind, group, bytes, purpose);
        if let Some(f) = full {
            self.e.free(Stream::Dp, &[op], f);
            self.bucket_state[b].last_reduce = Some(op);
        }
        self.dp_ops.push(op);
        op
    }
}
