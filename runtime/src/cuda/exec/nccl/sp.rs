//! The NCCL driver's sequence-parallel collectives on the tensor-parallel communicator
//! (which tensors: `exec/sp.rs`; the shared-GPU driver's: `multi/sp.rs`): `ncclAllGather`
//! of the rank's shard into a (T, h) tensor, `ncclReduceScatter` of a (T, h) partial sum
//! into the rank's shard (equal counts per rank: tp divides the microbatch's tokens), in
//! the communicator's rank order, which is the tp position.

use strata_models::plan::{GroupKind, Phase, Piece, Stream, TpSite};

use super::{Call, CommKey, Nccl, NcclDt, NcclRank, internal};
use crate::cuda::exec::device::Device;
use crate::cuda::exec::pieces::W;
use crate::cuda::exec::rank::Res;

impl<D: Device, N: Nccl<D>> NcclRank<D, N> {
    /// The members of this rank's `group`, checked to put it at its tp position (the order
    /// the shards of a sequence follow).
    fn sp_members(&self, group: GroupKind) -> Res<usize> {
        let r = &self.rank;
        let members = r.plan.grid.group(r.rank, group);
        let tp = r.plan.grid.coord(r.rank).tp as usize;
        if members.len() != r.plan.grid.tp as usize || members.get(tp) != Some(&r.rank) {
            return Err(internal(format!(
                "rank {}: a sequence-parallel collective on {group:?} group {members:?}, not its tensor-parallel group",
                r.rank
            )));
        }
        Ok(members.len())
    }

    /// An all-gather of (site, piece, phase) of (chunk, layer, mb): this rank's shard into a
    /// new (T, h) bf16 block, its `Full` or `Saved` tensor.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sp_gather(
        &mut self,
        s: Stream,
        comm: CommKey,
        group: GroupKind,
        (site, piece, phase): (TpSite, Piece, Phase),
        chunk: u32,
        mb: u32,
        layer: u32,
    ) -> Res<()> {
        self.sp_members(group)?;
        let (shard, full) = self.rank.sp_elems();
        let g = self.rank.sp_gather_src(site, piece, phase, chunk, mb, layer)?;
        let out = self.rank.take("a sequence-parallel gathered tensor", 2 * full as u64)?;
        self.call(s, Call::AllGather { comm, src: g.src, dst: out.ptr(), count: shard, dt: NcclDt::Bf16 })?;
        if let Some(t) = g.taken {
            self.rank.give(t);
        }
        self.rank.put(chunk, mb, g.into, out)
    }

    /// A reduce-scatter of tensor `w` of (chunk, mb), a (T, h) partial sum, into this
    /// rank's (T / tp, h) shard: bf16 embeddings, fp32 GEMM partials then rounded once.
    pub(super) fn sp_reduce_scatter(
        &mut self,
        s: Stream,
        comm: CommKey,
        group: GroupKind,
        chunk: u32,
        mb: u32,
        w: W,
    ) -> Res<()> {
        self.sp_members(group)?;
        let (shard, _) = self.rank.sp_elems();
        let eb = if w == W::R { 2 } else { self.rank.partial_dt().1 };
        let dt = if eb == 4 { NcclDt::F32 } else { NcclDt::Bf16 };
        let part = self.rank.got_here(chunk, mb, w)?;
        let out = self.rank.take("a reduce-scattered shard", (eb * shard) as u64)?;
        self.call(s, Call::ReduceScatter { comm, src: part.ptr(), dst: out.ptr(), count: shard, dt })?;
        self.rank.give(part);
        self.rank.sp_reduced(s, chunk, mb, w, out, eb)
    }
}
