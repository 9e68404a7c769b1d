//! An NCCL rank's lookups into its plan and layout: an op's buffer blocks, a bucket's
//! owners' parts (ZeRO's shards) and the one per-owner run of NCCL calls over them (ZeRO-1
//! on the chunk's flat buffers, ZeRO-2/3 on the bucket-shaped ones), its gradient and
//! parameter shards and bucket records.

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

    /// ZeRO over the data-parallel group, per owner of a part of bucket `bucket` of chunk
    /// `chunk` in the buffer at `base`: `sum` reduces each member's part of the fp32
    /// gradients to it, in place; otherwise each owner broadcasts its part of the bf16
    /// parameters. `shape` is the buffer's layout: the chunk's flat buffers (ZeRO-1: a part
    /// cut at unit boundaries, at each unit's place) or a bucket-shaped buffer (ZeRO-2/3's
    /// full gradients and gathered parameters: the units concatenated, one contiguous part
    /// per member). One NCCL group of calls (the parts are uneven, which NCCL's
    /// reduce-scatter and all-gather cannot express); the parts are `ZeroShard::split`'s,
    /// checked against this rank's own.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn owner_parts(
        &mut self,
        s: Stream,
        comm: CommKey,
        group: GroupKind,
        chunk: u32,
        bucket: u32,
        base: Ptr,
        shape: Shape,
        sum: bool,
    ) -> Res<()> {
        let members = self.rank.plan.grid.group(self.rank.rank, group);
        let me = members.iter().position(|&m| m == self.rank.rank).unwrap_or(0);
        let b = self.bucket(chunk, bucket)?;
        let ch = &self.rank.chunks[chunk as usize];
        let (eb, dt) = if sum { (4u64, NcclDt::F32) } else { (2, NcclDt::Bf16) };
        let mut calls = Vec::new();
        for j in 0..members.len() {
            let part = ZeroShard::split(b.len, j, members.len())?.range();
            if j == me && part != b.owned {
                return Err(internal(format!(
                    "rank {}: bucket {bucket} of chunk {chunk} owns {:?}, the shard rule says {part:?}",
                    self.rank.rank, b.owned
                )));
            }
            // (first element in the buffer, elements) of each run of the part.
            let runs: Vec<(usize, usize)> = match shape {
                Shape::Bucket if part.is_empty() => Vec::new(),
                Shape::Bucket => vec![(part.start, part.len())],
                Shape::Chunk => b
                    .pieces(part)
                    .into_iter()
                    .map(|(u, r)| {
                        let start = ch.unit_range(u).map(|x| x.start).ok_or_else(|| {
                            internal(format!("unit {u:?} of bucket {bucket} is not in chunk {chunk}"))
                        })?;
                        Ok((start + r.start, r.len()))
                    })
                    .collect::<Res<_>>()?,
            };
            for (at, count) in runs {
                let (buf, root) = (base + eb * at as u64, j as u32);
                calls.push(if sum {
                    Call::Reduce { comm, buf, count, dt, root }
                } else {
                    Call::Broadcast { comm, buf, count, dt, root }
                });
            }
        }
        self.call(s, Call::GroupStart)?;
        for call in calls {
            self.call(s, call)?;
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

    pub(super) fn params(&self, chunk: u32) -> Res<Ptr> {
        self.rank.bufs[chunk as usize]
            .params
            .as_ref()
            .map(Tensor::ptr)
            .ok_or_else(|| internal(format!("rank {}'s parameters of chunk {chunk} are not allocated", self.rank.rank)))
    }

    /// Bucket `bucket` of chunk `chunk` and its position among the chunk's buckets.
    fn bucket_at(&self, chunk: u32, bucket: u32) -> Res<(usize, &crate::exec::units::BucketInfo)> {
        self.rank.chunks[chunk as usize]
            .buckets
            .iter()
            .enumerate()
            .find(|(_, b)| b.index == bucket)
            .ok_or_else(|| internal(format!("rank {} has no bucket {bucket} in chunk {chunk}", self.rank.rank)))
    }

    pub(super) fn bucket(&self, chunk: u32, bucket: u32) -> Res<&crate::exec::units::BucketInfo> {
        Ok(self.bucket_at(chunk, bucket)?.1)
    }

    /// This rank's part of bucket `bucket` (positions in the bucket) and where it starts in
    /// the chunk's sharded buffers (ZeRO-2/3's gradient shard, ZeRO-3's parameter shard).
    pub(super) fn owned_in_shard(&self, chunk: u32, bucket: u32) -> Res<(std::ops::Range<usize>, usize)> {
        let (bi, b) = self.bucket_at(chunk, bucket)?;
        Ok((b.owned.clone(), self.rank.chunks[chunk as usize].shard_offset(bi)))
    }
}

/// The layout of a buffer [`NcclRank::owner_parts`] runs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// The chunk's flat parameter or gradient buffer: each unit at its place in the chunk.
    Chunk,
    /// A bucket's units concatenated (the plan's full-gradient and gathered buffers).
    Bucket,
}
