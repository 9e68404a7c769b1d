//! Op emission: [`Emitter`] appends ops to a program and hands out buffer ids; the
//! `StageLowering` helpers here emit one compute op or collective with the dependencies
//! every backend relies on (pending synchronous reductions before compute, persistent
//! buffers' allocations before collectives on them, the tensor-parallel collectives of
//! Megatron-LM's layers).

use crate::plan::ir::*;
use crate::plan::lower::StageLowering;

/// Appends ops and hands out buffer ids.
pub(super) struct Emitter {
    pub(super) ops: Vec<Op>,
    next_buf: BufId,
}

impl Emitter {
    pub(super) fn new() -> Emitter {
        Emitter { ops: Vec::new(), next_buf: 0 }
    }

    pub(super) fn op(&mut self, stream: Stream, deps: &[OpId], bufs: &[BufId], kind: OpKind) -> OpId {
        let id = self.ops.len() as OpId;
        // A dependency on an earlier op of the same stream is implied by stream order, except
        // on a send or a free, which the stream moves past before they complete, and except
        // for a free's own deps (it waits for nothing else).
        let is_free = matches!(kind, OpKind::Free { .. });
        let mut deps: Vec<OpId> = deps
            .iter()
            .copied()
            .filter(|d| {
                let o = &self.ops[*d as usize];
                is_free || o.stream != stream || matches!(o.kind, OpKind::Send(_) | OpKind::Free { .. })
            })
            .collect();
        deps.sort_unstable();
        deps.dedup();
        self.ops.push(Op { stream, deps, bufs: bufs.to_vec(), kind });
        id
    }

    pub(super) fn alloc(
        &mut self,
        stream: Stream,
        deps: &[OpId],
        class: BufClass,
        bytes: u64,
        name: String,
    ) -> (BufId, OpId) {
        let buf = self.next_buf;
        self.next_buf += 1;
        let op = self.op(stream, deps, &[], OpKind::Alloc(AllocOp { buf, class, bytes, name }));
        (buf, op)
    }

    pub(super) fn free(&mut self, stream: Stream, deps: &[OpId], buf: BufId) -> OpId {
        self.op(stream, deps, &[], OpKind::Free { buf })
    }
}

impl<'p, 'a> StageLowering<'p, 'a> {
    pub(super) fn compute(
        &mut self,
        piece: Piece,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        deps: &[OpId],
        bufs: &[BufId],
    ) -> OpId {
        // A selective recomputation of the attention core runs no hooked module.
        let selective_core =
            phase == Phase::Recompute && self.s().parallel.recompute != crate::parallel::Recompute::Full;
        let cost = match self.pl.host_cost(piece, phase) {
            Some(c) if !selective_core => c,
            _ => match piece {
                Piece::LayerOut => self.layer_out_cost(layer, phase).unwrap_or_else(|| self.pl.cost(piece, phase)),
                _ => self.pl.cost(piece, phase),
            },
        };
        self.compute_step(ComputeOp { piece, phase, mb, chunk, layer, step: 0, cost }, deps, bufs)
    }

    /// A compute op as given (a ring step of the attention core names its step and cost).
    pub(super) fn compute_step(&mut self, op: ComputeOp, deps: &[OpId], bufs: &[BufId]) -> OpId {
        let mut deps = deps.to_vec();
        deps.append(&mut self.pending_sync);
        let id = self.e.op(Stream::Compute, &deps, bufs, OpKind::Compute(op));
        self.last_compute = Some(id);
        self.recent_compute.push_back(id);
        if self.recent_compute.len() > 2 {
            self.recent_compute.pop_front();
        }
        id
    }

    pub(super) fn collective(
        &mut self,
        stream: Stream,
        deps: &[OpId],
        bufs: &[BufId],
        kind: CollKind,
        group: GroupKind,
        bytes: u64,
        purpose: CollPurpose,
    ) -> OpId {
        self.typed_collective(stream, deps, bufs, kind, group, bytes, self.dtype(), purpose)
    }

    /// A collective of gradients, in the framework's reduction dtype.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grad_collective(
        &mut self,
        stream: Stream,
        deps: &[OpId],
        bufs: &[BufId],
        kind: CollKind,
        group: GroupKind,
        bytes: u64,
        purpose: CollPurpose,
    ) -> OpId {
        let dtype = crate::accounting::states::scenario_layout(self.s()).grad_reduce;
        self.typed_collective(stream, deps, bufs, kind, group, bytes, dtype, purpose)
    }

    #[allow(clippy::too_many_arguments)]
    fn typed_collective(
        &mut self,
        stream: Stream,
        deps: &[OpId],
        bufs: &[BufId],
        kind: CollKind,
        group: GroupKind,
        bytes: u64,
        dtype: crate::scenario::Dtype,
        purpose: CollPurpose,
    ) -> OpId {
        let c = CollectiveOp { kind, group, bytes, dtype, purpose };
        let mut deps = deps.to_vec();
        deps.extend(bufs.iter().filter_map(|b| self.persistent_alloc.get(b)));
        self.e.op(stream, &deps, bufs, OpKind::Collective(c))
    }

    /// A tensor-parallel collective after `after`; returns the id the next consumer waits on.
    pub(super) fn tp_coll(
        &mut self,
        site: TpSite,
        piece: Piece,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        after: OpId,
    ) -> OpId {
        let kind = match site {
            TpSite::Reduce if self.sp => CollKind::ReduceScatter,
            TpSite::Reduce => CollKind::AllReduce,
            TpSite::Gather | TpSite::GatherSaved | TpSite::LossStats => CollKind::AllGather,
        };
        let bytes = match site {
            // Per token: (max, sum of exponentials, target logit) in fp32 from each of t ranks.
            TpSite::LossStats => self.rank_tokens() * 3 * 4 * self.s().parallel.tp as u64,
            _ => self.tensor_bytes(),
        };
        let purpose = CollPurpose::Tp { site, piece, phase, mb, chunk, layer };
        self.collective(Stream::Tp, &[after], &[], kind, GroupKind::Tp, bytes, purpose)
    }
}
