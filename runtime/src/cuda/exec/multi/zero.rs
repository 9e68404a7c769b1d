//! The multi-rank driver's ZeRO-2/3 collectives and the lookups they share: a member's op
//! buffers, its owned part of a bucket, gradient buckets reduce-scattered into the shards,
//! gathered buffers filled from the owners' parts — the last two and ZeRO-1's `sharded`
//! through one run of the communicator over parts (`parts_collective`).

use super::*;

impl<D: Device> MultiGpu<D> {
    /// The block of buffer `which` (its position in the op's buffers) of member `a`'s op at
    /// its entry `at[a]`.
    pub(super) fn op_buf(&self, a: usize, at: &BTreeMap<usize, usize>, which: usize) -> Res<Ptr> {
        let id = self.ranks[a].entry_op(at[&a]);
        let op = &self.plan.program(a as u32).ops[id as usize];
        op.bufs
            .get(which)
            .and_then(|b| self.ranks[a].live.get(b))
            .and_then(|l| l.tensor.as_ref())
            .map(Tensor::ptr)
            .ok_or_else(|| internal(format!("rank {a}'s op #{id} names no live buffer at position {which}")))
    }

    /// Where bucket `bucket` of chunk `chunk` sits among rank `a`'s buckets, and the part of
    /// it that rank owns.
    pub(super) fn owned_part(&self, a: usize, chunk: u32, bucket: u32) -> Res<(usize, std::ops::Range<usize>)> {
        let ch = &self.ranks[a].chunks[chunk as usize];
        let bi = ch
            .buckets
            .iter()
            .position(|b| b.index == bucket)
            .ok_or_else(|| internal(format!("rank {a} has no bucket {bucket} in chunk {chunk}")))?;
        Ok((bi, ch.buckets[bi].owned.clone()))
    }

    /// Where rank `a`'s part of one bucket starts in its gradient (fp32) or parameter (bf16)
    /// shard, and the part's range within the bucket.
    fn owned_shard(&self, a: usize, chunk: u32, bucket: u32, which: Shard) -> Res<(Ptr, std::ops::Range<usize>)> {
        let (bi, owned) = self.owned_part(a, chunk, bucket)?;
        let bufs = &self.ranks[a].bufs[chunk as usize];
        let (buf, bytes, what) = match which {
            Shard::Grads => (&bufs.grads, 4, "gradient"),
            Shard::Params => (&bufs.params, 2, "parameter"),
        };
        let base = buf
            .as_ref()
            .map(Tensor::ptr)
            .ok_or_else(|| internal(format!("rank {a}'s {what} shard of chunk {chunk} is not allocated")))?;
        Ok((base + bytes * self.ranks[a].chunks[chunk as usize].shard_offset(bi) as u64, owned))
    }

    /// ZeRO-2/3: the members' full-gradient buffers of one bucket and microbatch (the op's
    /// second buffer) reduce-scattered in place, each member's owned part then added into
    /// its gradient shard (which accumulates over the microbatches).
    pub(super) fn reduce_scatter_bucket(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        at: &BTreeMap<usize, usize>,
        chunk: u32,
        bucket: u32,
    ) -> Res<()> {
        let mut full = Vec::with_capacity(members.len());
        let mut parts = Vec::with_capacity(members.len());
        let mut shard = Vec::with_capacity(members.len());
        for &a in members {
            full.push(self.op_buf(a, at, 1)?);
            let (dst, owned) = self.owned_shard(a, chunk, bucket, Shard::Grads)?;
            parts.push(vec![(owned.start as u64, owned.len())]);
            shard.push((dst, owned));
        }
        self.parts_collective(members, streams, &full, &parts, true)?;
        for (i, (&a, &s)) in members.iter().zip(streams).enumerate() {
            let (dst, owned) = &shard[i];
            let n = owned.len();
            if n > 0 {
                let args = [Arg::P(*dst), Arg::P(full[i] + 4 * owned.start as u64), Arg::L(n as i64)];
                self.ranks[a].gpu.launch(s, "add_f32", blocks(n), &args)?;
            }
        }
        Ok(())
    }

    /// ZeRO-3: each member's owned part of one bucket's bf16 parameters (from its shard)
    /// copied into its place in the op's gathered buffer, then all-gathered in place, so
    /// every member holds the whole bucket.
    pub(super) fn gather_bucket(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        at: &BTreeMap<usize, usize>,
        chunk: u32,
        bucket: u32,
    ) -> Res<()> {
        let mut gathered = Vec::with_capacity(members.len());
        let mut parts = Vec::with_capacity(members.len());
        for (&a, &s) in members.iter().zip(streams) {
            let dst = self.op_buf(a, at, 0)?;
            let (src, owned) = self.owned_shard(a, chunk, bucket, Shard::Params)?;
            if !owned.is_empty() {
                self.ranks[a].gpu.copy(s, dst + 2 * owned.start as u64, src, 2 * owned.len())?;
            }
            gathered.push(dst);
            parts.push(vec![(owned.start as u64, owned.len())]);
        }
        self.parts_collective(members, streams, &gathered, &parts, false)
    }

    /// Bucket `bucket` of chunk `chunk` on rank `a`.
    pub(super) fn bucket(&self, a: usize, chunk: u32, bucket: u32) -> Res<&BucketInfo> {
        self.ranks[a].chunks[chunk as usize]
            .buckets
            .iter()
            .find(|b| b.index == bucket)
            .ok_or_else(|| internal(format!("rank {a} has no bucket {bucket} in chunk {chunk}")))
    }

    /// Each member's owned part of bucket `bucket` of chunk `chunk`, as (offset, elements)
    /// ranges of the flat buffers.
    pub(super) fn owned_parts(&self, members: &[usize], chunk: u32, bucket: u32) -> Res<Vec<Vec<(u64, usize)>>> {
        members
            .iter()
            .map(|&a| {
                let ch = &self.ranks[a].chunks[chunk as usize];
                let b = self.bucket(a, chunk, bucket)?;
                b.pieces(b.owned.clone())
                    .into_iter()
                    .map(|(u, r)| {
                        let start = ch.unit_range(u).map(|x| x.start).ok_or_else(|| {
                            internal(format!("rank {a}: unit {u:?} of bucket {bucket} is not in chunk {chunk}"))
                        })?;
                        Ok(((start + r.start) as u64, r.len()))
                    })
                    .collect()
            })
            .collect()
    }

    /// ZeRO-1 over the members' shards of chunk `chunk`: `sum` reduce-scatters the fp32
    /// gradients into each member's owned part, otherwise the bf16 parameters' owned parts
    /// are all-gathered.
    pub(super) fn sharded(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        chunk: u32,
        parts: &[Vec<(u64, usize)>],
        sum: bool,
    ) -> Res<()> {
        let mut bases = Vec::with_capacity(members.len());
        for &a in members {
            let b = &self.ranks[a].bufs[chunk as usize];
            let t = if sum { b.grads.as_ref() } else { b.params.as_ref() };
            bases.push(
                t.map(Tensor::ptr).ok_or_else(|| internal(format!("rank {a}'s chunk {chunk} is not allocated")))?,
            );
        }
        self.parts_collective(members, streams, &bases, parts, sum)
    }

    /// The shared-GPU communicator over parts of the members' buffers at `bases`, in place:
    /// `sum` reduce-scatters fp32 (each member's parts summed in rank order), otherwise the
    /// bf16 parts are all-gathered (`shared::plan_parts`), through scratch taken from each
    /// member's pool for the collective.
    fn parts_collective(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        bases: &[Ptr],
        parts: &[Vec<(u64, usize)>],
        sum: bool,
    ) -> Res<()> {
        let eb = if sum { 4 } else { 2 };
        let mut scratch = Vec::with_capacity(members.len());
        for (i, &a) in members.iter().enumerate() {
            let elems = super::super::shared::parts_scratch(sum, parts, i).max(1);
            scratch.push(self.ranks[a].take("the shared-GPU communicator's scratch", eb * elems as u64)?);
        }
        let ptrs: Vec<Ptr> = scratch.iter().map(Tensor::ptr).collect();
        let steps = super::super::shared::plan_parts(sum, bases, bases, &ptrs, parts, eb);
        self.run_steps(members, streams, &steps, "add_f32", eb)?;
        for (&a, t) in members.iter().zip(scratch) {
            self.ranks[a].give(t);
        }
        Ok(())
    }
}

/// Which of a rank's ZeRO shards a bucket's owned part is read from or added into.
#[derive(Clone, Copy)]
enum Shard {
    Grads,
    Params,
}
