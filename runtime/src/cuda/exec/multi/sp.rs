//! The multi-rank driver's sequence-parallel collectives on the tensor-parallel group
//! (which tensors: `exec/sp.rs`): all-gathers of the members' sequence shards into a
//! (T, h) tensor of each, reduce-scatters of their (T, h) partial sums into each one's
//! shard, and the once-a-step all-reduce of the replicated tensors' gradients — the
//! shared-GPU communicator's plans of copies and additions (`shared`), in tp order.

use super::*;

impl<D: Device> MultiGpu<D> {
    /// A sequence-parallel all-gather: every member's shard (rows · h bf16) copied in tp
    /// order into a new (T, h) block of each, its `Full` or `Saved` tensor from then on.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sp_gather(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        site: TpSite,
        piece: Piece,
        phase: Phase,
        chunk: u32,
        mb: u32,
        layer: u32,
    ) -> Res<()> {
        let (shard, full) = self.ranks[members[0]].sp_elems();
        let mut ms = Vec::with_capacity(members.len());
        let mut held = Vec::with_capacity(members.len());
        for &a in members {
            let g = self.ranks[a].sp_gather_src(site, piece, phase, chunk, mb, layer)?;
            let out = self.ranks[a].take("a sequence-parallel gathered tensor", 2 * full as u64)?;
            let scratch = self.ranks[a].take("the shared-GPU communicator's scratch", 2 * full as u64)?;
            ms.push(Member { input: g.src, output: out.ptr(), scratch: scratch.ptr() });
            held.push((g, out, scratch));
        }
        let steps = crate::cuda::exec::shared::plan(CollKind::AllGather, &ms, shard, 2).map_err(internal)?;
        self.run_steps(members, streams, &steps, "add_bf16", 2)?;
        for (&a, (g, out, scratch)) in members.iter().zip(held) {
            self.ranks[a].give(scratch);
            if let Some(t) = g.taken {
                self.ranks[a].give(t);
            }
            self.ranks[a].put(chunk, mb, g.into, out)?;
        }
        Ok(())
    }

    /// A sequence-parallel reduce-scatter of tensor `w` of (chunk, mb), a (T, h) partial
    /// sum on every member: member p's shard (rows p·T/tp..) summed in rank order — the
    /// embeddings in bf16, the GEMMs' fp32 partials in fp32 then rounded once — becomes
    /// its `w`, (T / tp, h).
    pub(super) fn sp_reduce_scatter(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        chunk: u32,
        mb: u32,
        w: W,
    ) -> Res<()> {
        let (shard, full) = self.ranks[members[0]].sp_elems();
        let eb = if w == W::R { 2 } else { self.ranks[members[0]].partial_dt().1 };
        let mut ms = Vec::with_capacity(members.len());
        let mut held = Vec::with_capacity(members.len());
        for &a in members {
            let part = self.ranks[a].got_here(chunk, mb, w)?;
            let out = self.ranks[a].take("a reduce-scattered shard", (eb * shard) as u64)?;
            let scratch = self.ranks[a].take("the shared-GPU communicator's scratch", (eb * shard) as u64)?;
            ms.push(Member { input: part.ptr(), output: out.ptr(), scratch: scratch.ptr() });
            held.push((part, out, scratch));
        }
        let steps = crate::cuda::exec::shared::plan(CollKind::ReduceScatter, &ms, full, eb as u64).map_err(internal)?;
        self.run_steps(members, streams, &steps, if eb == 4 { "add_f32" } else { "add_bf16" }, eb as u64)?;
        for ((&a, &s), (part, out, scratch)) in members.iter().zip(streams).zip(held) {
            self.ranks[a].give(part);
            self.ranks[a].give(scratch);
            self.ranks[a].sp_reduced(s, chunk, mb, w, out, eb)?;
        }
        Ok(())
    }

    /// The replicated tensors' gradients (`GpuRank::sp_grad_runs`) summed over the
    /// tensor-parallel group, in place.
    pub(super) fn sp_replicated_grads(&mut self, members: &[usize], streams: &[Stream]) -> Res<()> {
        #[cfg(test)]
        if self.skip_sp_grads {
            return Ok(());
        }
        let runs = members.iter().map(|&a| self.ranks[a].sp_grad_runs()).collect::<Res<Vec<_>>>()?;
        let lens: Vec<usize> = runs[0].iter().map(|r| r.1).collect();
        if runs.iter().any(|rs| rs.iter().map(|r| r.1).ne(lens.iter().copied())) {
            return Err(internal(format!(
                "the tensor-parallel ranks' replicated gradients differ in layout: {:?}",
                runs.iter().map(|rs| rs.iter().map(|r| r.1).collect::<Vec<_>>()).collect::<Vec<_>>()
            )));
        }
        if lens.is_empty() {
            return Ok(());
        }
        let ptrs: Vec<Vec<Ptr>> = runs.iter().map(|rs| rs.iter().map(|r| r.0).collect()).collect();
        self.all_reduce_f32(members, streams, &ptrs, &lens)
    }
}
