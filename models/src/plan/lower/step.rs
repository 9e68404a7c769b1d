//! The end of a step: the deferred gradient reductions, the tied-embedding gradient
//! all-reduce between the first and the last stage, the all-reduce of the replicated
//! tensors' gradients under sequence parallelism, the global gradient-norm all-reduce, and
//! the optimizer step (followed, for ZeRO-1/2 without overlap, by the parameter gathers).

use crate::accounting::params::layer_params;
use crate::plan::ir::*;
use crate::plan::lower::{StageLowering, unit_params};
use crate::plan::lowered::Unit;

impl<'p, 'a> StageLowering<'p, 'a> {
    pub(super) fn end_of_step(&mut self) {
        let p = self.s().parallel.clone();
        let last_compute = self.last_compute.expect("a step computes");
        // What the next compute would have waited for (DeepSpeed's last blocking send): the
        // reductions after the flush and the optimizer wait for it too.
        let pending = std::mem::take(&mut self.pending_sync);
        // Accumulated gradients whose last unit finished after its chunk's backward (a weight
        // pass run later): reduced now.
        self.flush_chunk_grad_reduce(last_compute);
        for (b, mb, deps) in std::mem::take(&mut self.deferred_grad_reduce) {
            let mut d = deps;
            d.push(last_compute);
            d.extend(&pending);
            self.grad_reduce(b, mb, &d, None);
        }
        let mut sync: Vec<OpId> = self.dp_ops.clone();
        sync.push(last_compute);
        sync.extend(pending);
        // Tied embeddings: sum the two copies' gradients (the ZeRO shard of them).
        let m = &self.s().model;
        if m.tied_embeddings() && p.pp > 1 && (self.stage == 0 || self.stage == p.pp - 1) {
            let rows = unit_params(self.s(), Unit::WordEmbedding);
            let rows = if self.zero() >= 1 { rows.div_ceil(p.grad_ranks()) } else { rows };
            let bytes = rows * self.grad_reduce_bytes();
            // The word embedding lives in chunk 0 of the first stage and the last chunk of the last.
            let grads = self.grads_buf(if self.stage == 0 { 0 } else { p.vpp - 1 });
            let op = self.grad_collective(
                Stream::Dp,
                &sync,
                &[grads],
                CollKind::AllReduce,
                GroupKind::Embedding,
                bytes,
                CollPurpose::TiedEmbeddingGrad,
            );
            sync.push(op);
        }
        // Sequence parallelism leaves the replicated tensors' gradients partial per tp rank.
        if p.sequence_parallel && p.tp > 1 {
            let m = &self.s().model;
            // A MoE layer's replicated part carries its router (Megatron-core marks the
            // router's weight sequence-parallel, so it is reduced here too).
            let replicated = |l: u32| {
                if m.is_moe_layer(l) { crate::plan::moe::moe_dense_params(m).1 } else { layer_params(m).replicated }
            };
            let mut params: u64 = (0..p.vpp).map(|c| self.layers(c).map(replicated).sum::<u64>()).sum();
            if self.stage == p.pp - 1 {
                params += m.norm_params();
                // Multi-token-prediction modules: their layer's and their three norms.
                params += (m.layers..m.layers + m.mtp_layers).map(|l| replicated(l) + 3 * m.norm_params()).sum::<u64>();
            }
            let owned = if self.zero() >= 1 { params.div_ceil(p.grad_ranks()) } else { params };
            let bytes = owned * self.grad_reduce_bytes();
            let grads: Vec<BufId> = (0..p.vpp).map(|c| self.grads_buf(c)).collect();
            let op = self.grad_collective(
                Stream::Tp,
                &sync,
                &grads,
                CollKind::AllReduce,
                GroupKind::Tp,
                bytes,
                CollPurpose::SpReplicatedGrads,
            );
            sync.push(op);
        }
        if self.s().training.grad_clip > 0.0 {
            let op = self.collective(
                Stream::Dp,
                &sync,
                &[],
                CollKind::AllReduce,
                GroupKind::World,
                4,
                CollPurpose::GradNorm,
            );
            sync.push(op);
        }
        let cost = self.pl.optimizer_cost(self.stage);
        let op = ComputeOp { piece: Piece::Optimizer, phase: Phase::Step, mb: 0, chunk: 0, layer: 0, step: 0, cost };
        let bufs = self.persistent.clone();
        let step = self.e.op(Stream::Compute, &sync, &bufs, OpKind::Compute(op));
        self.last_compute = Some(step);
        if (1..=2).contains(&self.zero()) && !self.s().training.framework.overlaps_param_gather(self.s()) {
            for i in 0..self.buckets().len() {
                self.param_bucket_gather(i, &[step]);
            }
        }
    }
}
