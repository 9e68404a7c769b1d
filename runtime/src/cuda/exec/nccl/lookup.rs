//! An NCCL rank's lookups into its plan and layout: an op's buffer blocks, a bucket's
//! owners' parts (ZeRO's shards), its gradient shard and bucket records.

use super::*;

impl<D: Device, N: Nccl<D>> NcclRank<D, N> {
    /// The block of buffer `which` (its position in the op's buffers) of entry `k`'s op.
    pub(super) fn op_buf(&self, k: usize, which: usize) -> Res<Ptr> {
        let id = self.rank.entry_op(k);
        let op = &self.rank.plan.program(self.rank.rank).ops[id as usize];
        op.bufs
            .get(which)
            .and_then(|b| self.rank.live.get(b))
            .and_then(|l| l.tensor.as_ref())
            .map(Tensor::ptr)
            .ok_or_else(|| internal(format!("rank {}'s op #{id} names no live buffer at {which}", self.rank.rank)))
    }

    /// ZeRO-2/3 over the data-parallel group, on a bucket-shaped buffer at `base` (the
    /// bucket's units concatenated, the same layout on every member): `sum` reduces each
    /// member's part of the fp32 full gradients to it, in place; otherwise each owner
    /// broadcasts its part of the bf16 gathered parameters. One call per member, in one
    /// NCCL group (the parts are uneven, which NCCL's reduce-scatter and all-gather cannot
    /// express); the parts are `ZeroShard::split`'s, checked against this rank's own.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bucket_parts(
        &mut self,
        s: Stream,
        comm: CommKey,
        group: GroupKind,
        chunk: u32,
        bucket: u32,
        base: Ptr,
        sum: bool,
    ) -> Res<()> {
        let members = self.rank.plan.grid.group(self.rank.rank, group);
        let me = members.iter().position(|&m| m == self.rank.rank).unwrap_or(0);
        let b = self.bucket(chunk, bucket)?.clone();
        let (eb, dt) = if sum { (4u64, NcclDt::F32) } else { (2, NcclDt::Bf16) };
        self.call(s, Call::GroupStart)?;
        for j in 0..members.len() {
            let part = ZeroShard::split(b.len, j, members.len())?.range();
            if j == me && part != b.owned {
                return Err(internal(format!(
                    "rank {}: bucket {bucket} of chunk {chunk} owns {:?}, the shard rule says {part:?}",
                    self.rank.rank, b.owned
                )));
            }
            if part.is_empty() {
                continue;
            }
            let (buf, count, root) = (base + eb * part.start as u64, part.len(), j as u32);
            self.call(
                s,
                if sum {
                    Call::Reduce { comm, buf, count, dt, root }
                } else {
                    Call::Broadcast { comm, buf, count, dt, root }
                },
            )?;
        }
        self.call(s, Call::GroupEnd)
    }

    pub(super) fn grads(&self, chunk: u32) -> Res<Ptr> {
        self.rank.bufs[chunk as usize]
            .grads
            .as_ref()
            .map(Tensor::ptr)
            .ok_or_else(|| internal(format!("rank {}'s gradients of chunk {chunk} are not allocated", self.rank.rank)))
    }

    pub(super) fn bucket(&self, chunk: u32, bucket: u32) -> Res<&crate::exec::units::BucketInfo> {
        self.rank.chunks[chunk as usize]
            .buckets
            .iter()
            .find(|b| b.index == bucket)
            .ok_or_else(|| internal(format!("rank {} has no bucket {bucket} in chunk {chunk}", self.rank.rank)))
    }
}
