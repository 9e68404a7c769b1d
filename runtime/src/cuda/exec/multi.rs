//! Every rank of a plan in one process on one GPU: the multi-rank driver. Each rank is a
//! [`GpuRank`] with its own streams (a sibling of one device), its own pool and state; one
//! host thread walks their schedules, enqueueing each rank's ops in its schedule's order
//! per stream, an op once every dependency is enqueued, and holding a stream (not the
//! rank) at an op that needs its peers — the plan's own semantics, streams in order:
//!
//! - a **collective** on a group of more than one rank waits at the plan's [`Rendezvous`]
//!   (the k-th collective on a group meets the k-th, as on the CPU communicator); when the
//!   last member arrives, the shared-GPU communicator's steps (`shared`) run on every
//!   member's stream — its contribution's Ready event, its reduce into scratch, ReadDone,
//!   then the copy into place — so every member holds the sums in rank order, bit for bit;
//! - a **send** never waits: its tensor is copied on the sender's stream into a block of the
//!   receiver's pool (a message in flight, the receiver's memory until taken);
//! - a **receive** waits until its send (paired by `pair_messages`) is enqueued, then the
//!   receiver's stream waits on the send's end event and copies the message into the
//!   plan's receive buffer.
//!
//! An op is enqueued only after every op it depends on, so every wait names an event
//! recorded this step and the GPU cannot deadlock on them; a plan whose ranks cannot all
//! reach their ends (never, for one that passed verify) is an error naming where each rank
//! stopped. Holding a whole rank at its first blocked op would not do: the last stage's
//! tied-embedding all-reduce comes before its last gradient send in its schedule, while the
//! first stage needs that gradient before it reaches the all-reduce. The gradient norm is a world sum of each rank's Σ g²
//! (read back, added on the host in rank order).
//!
//! Runs what the single-rank pieces run, under pipeline and data parallelism: gradient
//! buckets all-reduced (ZeRO-0) or reduce-scattered into each replica's owned part and the
//! updated parameters all-gathered (ZeRO-1/2, uneven shards crossing units); under
//! ZeRO-2/3 each microbatch's full-gradient bucket buffers (the plan's) reduce-scattered in
//! place and each owner's part added into its gradient shard, and ZeRO-3's gathered buffers
//! filled by each owner copying in its shard's part and an in-place all-gather; the tied word
//! table's gradients all-reduced between the first and last stage, pipeline messages.
//! Tensor parallelism: the row-parallel GEMMs' partial sums and the column-parallel input
//! gradients all-reduced in fp32 and rounded to bf16 once (as the single rank's GEMM
//! rounds once), the vocabulary shards' embeddings in bf16 (exact), the loss statistics of
//! the vocabulary shards all-gathered; with sequence parallelism those sums reduce-scattered
//! into each rank's sequence shard instead, the norms' outputs and the residual gradient
//! all-gathered, and the replicated tensors' gradients all-reduced once a step
//! (`multi/sp.rs`; tests in `multi/tests_sp.rs`). Llama plans run
//! through the same collectives (no tied table: its output layer is its own; each tp rank
//! holds whole query heads and the key/value heads they read, and [gate_r | up_r]; tests in
//! `multi/tests_llama.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_models::plan::exec::{ActorMap, Arrival, Rendezvous, pair_messages};
use strata_models::plan::{
    CollKind, CollPurpose, CollectiveOp, OpKind, P2pOp, Phase, Piece, Plan, Stream, TpSite, Unit,
};

use super::device::{Arg, Device, Ptr, blocks};
use super::overhead::MESSAGES;
use super::pieces::W;
use super::rank::{GpuExecError, GpuRank, Res, Tensor};
use super::shared::{Ev, Member, Step, plan_segments};
use super::step::StepRun;
use crate::data::Corpus;
use crate::error::RuntimeError;
use crate::exec::units::BucketInfo;
use crate::exec::{ExecConfig, StepReport};

/// The ranks of one plan on one device.
pub struct MultiGpu<D: Device> {
    plan: Arc<Plan>,
    pub ranks: Vec<GpuRank<D>>,
    actors: ActorMap,
    /// Per rank and op: the paired op of a send or receive on the peer.
    partner: Vec<Vec<u32>>,
    /// A mutation for the tests: collectives copy without adding.
    #[cfg(test)]
    pub(super) drop_sums: bool,
    /// A mutation for the tests: sequence parallelism's replicated gradients left unsummed.
    #[cfg(test)]
    pub(super) skip_sp_grads: bool,
}

/// The tensor a tensor-parallel reduction sums: the partial sums of a row-parallel GEMM
/// (or of the vocabulary shards' embeddings; backward: a column-parallel piece's input
/// gradient).
pub(super) fn tp_partial(piece: Piece, phase: Phase) -> W {
    match phase {
        Phase::BackwardInput => W::DPart,
        _ if piece == Piece::Embed => W::R,
        _ => W::Out,
    }
}

fn internal(why: String) -> GpuExecError {
    GpuExecError::Runtime(RuntimeError::BadSetting(why))
}

impl<D: Device> MultiGpu<D> {
    /// Every rank of `plan`, rank r on `devices[r]` (siblings of one device).
    pub fn new(plan: Arc<Plan>, devices: Vec<D>, corpus: Arc<Corpus>, cfg: ExecConfig) -> Res<MultiGpu<D>> {
        let n = plan.grid.ranks() as usize;
        if devices.len() != n {
            return Err(internal(format!("{} devices for a plan of {n} ranks", devices.len())));
        }
        let ranks = devices
            .into_iter()
            .enumerate()
            .map(|(r, d)| GpuRank::for_rank(plan.clone(), r as u32, d, corpus.clone(), cfg.clone()))
            .collect::<Res<Vec<_>>>()?;
        MultiGpu::from_ranks(plan, ranks)
    }

    /// Ranks already built, one per rank of `plan` in rank order.
    pub fn from_ranks(plan: Arc<Plan>, ranks: Vec<GpuRank<D>>) -> Res<MultiGpu<D>> {
        if ranks.len() != plan.grid.ranks() as usize || ranks.iter().enumerate().any(|(r, g)| g.rank != r as u32) {
            return Err(internal(format!("{} ranks for a plan of {}", ranks.len(), plan.grid.ranks())));
        }
        let actors = ActorMap::new(&plan, false);
        let partner = pair_messages(&actors, |a| plan.program(a))
            .map_err(|e| internal(format!("the plan's pipeline messages do not pair: {e:?}")))?;
        Ok(MultiGpu {
            plan,
            ranks,
            actors,
            partner,
            #[cfg(test)]
            drop_sums: false,
            #[cfg(test)]
            skip_sp_grads: false,
        })
    }

    /// One step of every rank; the reports in rank order.
    pub fn step(&mut self, step: u32) -> Res<Vec<StepReport>> {
        let n = self.ranks.len();
        let plan = self.plan.clone();
        let mut runs = Vec::with_capacity(n);
        for r in &mut self.ranks {
            runs.push(r.begin(step)?);
        }
        // Per rank: entries not yet enqueued (in schedule order), ops enqueued, and the
        // entries waiting at a rendezvous (op → entry).
        let mut pending: Vec<Vec<usize>> = self.ranks.iter().map(|r| (0..r.entries()).collect()).collect();
        let mut done: Vec<Vec<bool>> = (0..n).map(|r| vec![false; plan.program(r as u32).ops.len()]).collect();
        let mut waiting: Vec<BTreeMap<u32, usize>> = vec![BTreeMap::new(); n];
        // Messages in flight: (sender, send op) → the block in the receiver's pool.
        let mut sent: BTreeMap<(u32, u32), Tensor> = BTreeMap::new();
        let mut rdv = Rendezvous::new(&self.actors);
        loop {
            let mut moved = false;
            for r in 0..n {
                // A stream whose next entry cannot run yet holds its later entries.
                let mut held = [false; 4];
                let mut i = 0;
                while i < pending[r].len() {
                    let k = pending[r][i];
                    let id = self.ranks[r].entry_op(k);
                    let op = &plan.program(r as u32).ops[id as usize];
                    let stream = self.ranks[r].entry_stream(k);
                    if stream.is_some_and(|s| held[s.index()]) {
                        i += 1;
                        continue;
                    }
                    let hold = |held: &mut [bool; 4]| {
                        if let Some(s) = stream {
                            held[s.index()] = true;
                        }
                    };
                    if !op.deps.iter().all(|d| done[r][*d as usize]) {
                        hold(&mut held);
                        i += 1;
                        continue;
                    }
                    match &op.kind {
                        OpKind::Collective(c) if plan.grid.group(r as u32, c.group).len() > 1 => {
                            if waiting[r].contains_key(&id) {
                                hold(&mut held);
                                i += 1;
                                continue;
                            }
                            waiting[r].insert(id, k);
                            moved = true;
                            match rdv.arrive(r as u32, id, c.group) {
                                Arrival::Complete(members) => {
                                    let mut at: BTreeMap<usize, usize> = BTreeMap::new();
                                    for &(a, aop) in &members {
                                        let ka = waiting[a as usize].remove(&aop).expect("an arrived member");
                                        at.insert(a as usize, ka);
                                        done[a as usize][aop as usize] = true;
                                        pending[a as usize].retain(|&x| x != ka);
                                    }
                                    self.collective(&mut runs, &at, r as u32, c)?;
                                }
                                Arrival::Waiting => {
                                    hold(&mut held);
                                    i += 1;
                                }
                                Arrival::Alone => unreachable!("a group of more than one rank"),
                            }
                            continue;
                        }
                        OpKind::Send(p) => {
                            let t = self.send(&mut runs[r], r, k, p)?;
                            sent.insert((r as u32, id), t);
                        }
                        OpKind::Recv(p) => {
                            let from = plan.grid.peer(r as u32, p.peer);
                            let Some(t) = sent.remove(&(from, self.partner[r][id as usize])) else {
                                hold(&mut held);
                                i += 1;
                                continue;
                            };
                            self.recv(&mut runs[r], r, k, from as usize, self.partner[r][id as usize], t)?;
                        }
                        _ => self.ranks[r].enqueue(&mut runs[r], k)?,
                    }
                    done[r][id as usize] = true;
                    pending[r].remove(i);
                    moved = true;
                }
            }
            if pending.iter().all(Vec::is_empty) {
                break;
            }
            if !moved {
                let at: Vec<String> = (0..n)
                    .filter(|&r| !pending[r].is_empty())
                    .map(|r| {
                        let id = self.ranks[r].entry_op(pending[r][0]);
                        let what = match &plan.program(r as u32).ops[id as usize].kind {
                            OpKind::Collective(c) => format!("{} {:?} on {:?}", c.kind.key(), c.purpose, c.group),
                            OpKind::Recv(p) => format!("a receive of {:?} mb {} from {:?}", p.kind, p.mb, p.peer),
                            other => format!("{other:?}"),
                        };
                        format!("rank {r} at op #{id} ({what})")
                    })
                    .collect();
                return Err(internal(format!("the ranks cannot all reach the end of step {step}: {}", at.join(", "))));
            }
        }
        if let Some(((from, op), _)) = sent.iter().next() {
            return Err(internal(format!("rank {from}'s send #{op} was never received")));
        }
        let mut reports = Vec::with_capacity(n);
        for (r, run) in self.ranks.iter_mut().zip(runs) {
            reports.push(r.finish(run)?);
        }
        Ok(reports)
    }

    /// A send on rank `r`: its tensor copied into a block of the receiver's pool.
    fn send(&mut self, run: &mut StepRun<D::Event>, r: usize, k: usize, p: &P2pOp) -> Res<Tensor> {
        let s = self.ranks[r].open(run, k)?.ok_or_else(|| internal("a send on no stream".into()))?;
        let t = self.ranks[r].outgoing(p)?;
        let to = self.plan.grid.peer(r as u32, p.peer) as usize;
        let bytes = self.ranks[r].msg_bytes();
        let lease = self.ranks[to].pool.alloc_as(MESSAGES, "a pipeline message in flight", bytes as u64)?;
        // The block's previous user on the receiver must be done before the copy lands.
        for &op in lease.fence.iter().flatten() {
            self.ranks[r].gpu.wait(s, &self.ranks[to].ends[op as usize])?;
        }
        self.ranks[r].gpu.copy(s, lease.block.ptr, t.ptr(), bytes)?;
        self.ranks[r].give(t);
        self.ranks[r].close(run, k)?;
        Ok(Tensor { lease })
    }

    /// A receive on rank `r` of send `sop` of rank `from`, whose message is `t`.
    fn recv(&mut self, run: &mut StepRun<D::Event>, r: usize, k: usize, from: usize, sop: u32, t: Tensor) -> Res<()> {
        let s = self.ranks[r].open(run, k)?.ok_or_else(|| internal("a receive on no stream".into()))?;
        self.ranks[r].gpu.wait(s, &self.ranks[from].ends[sop as usize])?;
        let OpKind::Recv(p) = &self.plan.program(r as u32).ops[self.ranks[r].entry_op(k) as usize].kind else {
            unreachable!("entry {k} is a receive")
        };
        let dst = self.ranks[r].msg_ptr(false, p.kind, p.vstage, p.mb)?;
        self.ranks[r].gpu.copy(s, dst, t.ptr(), self.ranks[r].msg_bytes())?;
        self.ranks[r].give(t);
        self.ranks[r].close(run, k)
    }

    /// Collective `c`, every member of `r`'s group arrived (member a at its entry `at[a]`).
    fn collective(
        &mut self,
        runs: &mut [StepRun<D::Event>],
        at: &BTreeMap<usize, usize>,
        r: u32,
        c: &CollectiveOp,
    ) -> Res<()> {
        let pc = |a: usize| at[&a];
        let members: Vec<usize> = self.plan.grid.group(r, c.group).into_iter().map(|a| a as usize).collect();
        let mut streams = Vec::with_capacity(members.len());
        for &a in &members {
            let s = self.ranks[a].open(&runs[a], pc(a))?.ok_or_else(|| internal("a collective on no stream".into()))?;
            streams.push(s);
        }
        let zero = self.plan.scenario.zero_stage();
        match c.purpose {
            CollPurpose::GradNorm => {
                let mut total = 0.0;
                for (&a, &s) in members.iter().zip(&streams) {
                    total += self.ranks[a].grad_sq_local(s)?;
                }
                for &a in &members {
                    self.ranks[a].set_grad_norm(total);
                }
            }
            // ZeRO-0, and ZeRO-1 under DeepSpeed's BF16_Optimizer (whole buckets all-reduced).
            CollPurpose::GradBucket { chunk, bucket, .. } if zero <= 1 && c.kind == CollKind::AllReduce => {
                let segs = members
                    .iter()
                    .map(|&a| {
                        let b = self.bucket(a, chunk, bucket)?;
                        Ok(b.units.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>())
                    })
                    .collect::<Res<Vec<_>>>()?;
                let ranges: Vec<(u32, Vec<std::ops::Range<usize>>)> = segs.into_iter().map(|rs| (chunk, rs)).collect();
                self.all_reduce_grads(&members, &streams, &ranges)?;
            }
            CollPurpose::TiedEmbeddingGrad if zero == 0 => {
                let ranges = members
                    .iter()
                    .map(|&a| {
                        let rk = &self.ranks[a];
                        (0..rk.chunks.len())
                            .find_map(|ci| rk.chunks[ci].unit_range(Unit::WordEmbedding).map(|r| (ci as u32, vec![r])))
                            .ok_or_else(|| internal(format!("rank {a} holds no word table for the tied gradient")))
                    })
                    .collect::<Res<Vec<_>>>()?;
                self.all_reduce_grads(&members, &streams, &ranges)?;
            }
            CollPurpose::GradBucket { chunk, bucket, .. } if zero == 1 && c.kind == CollKind::ReduceScatter => {
                let parts = self.owned_parts(&members, chunk, bucket)?;
                self.sharded(&members, &streams, chunk, &parts, true)?;
            }
            CollPurpose::GradBucket { chunk, bucket, .. } if zero >= 2 && c.kind == CollKind::ReduceScatter => {
                self.reduce_scatter_bucket(&members, &streams, at, chunk, bucket)?;
            }
            CollPurpose::ParamGather { chunk, bucket, .. } if zero >= 3 && c.kind == CollKind::AllGather => {
                self.gather_bucket(&members, &streams, at, chunk, bucket)?;
            }
            CollPurpose::ParamBucket { chunk, bucket } if (1..=2).contains(&zero) && c.kind == CollKind::AllGather => {
                let parts = self.owned_parts(&members, chunk, bucket)?;
                self.sharded(&members, &streams, chunk, &parts, false)?;
            }
            CollPurpose::TiedEmbeddingGrad if zero >= 1 => {
                // The owned part of the word table on each end of the pipeline (ZeRO-2/3: at
                // its place in the gradient shard).
                let ranges = members
                    .iter()
                    .map(|&a| {
                        let rk = &self.ranks[a];
                        for (ci, ch) in rk.chunks.iter().enumerate() {
                            let Some(word) = ch.unit_range(Unit::WordEmbedding) else { continue };
                            let rs = ch
                                .owned_runs()
                                .into_iter()
                                .filter(|r| r.flat >= word.start && r.flat < word.end)
                                .map(|r| if zero >= 2 { r.master..r.master + r.len } else { r.flat..r.flat + r.len })
                                .collect();
                            return Ok((ci as u32, rs));
                        }
                        Err(internal(format!("rank {a} holds no word table for the tied gradient")))
                    })
                    .collect::<Res<Vec<_>>>()?;
                self.all_reduce_grads(&members, &streams, &ranges)?;
            }
            CollPurpose::Tp { site: TpSite::Reduce, piece, phase, mb, chunk, .. } if c.kind == CollKind::AllReduce => {
                self.tp_all_reduce(&members, &streams, chunk, mb, tp_partial(piece, phase))?;
            }
            CollPurpose::Tp { site: TpSite::LossStats, mb, chunk, .. } if c.kind == CollKind::AllGather => {
                self.tp_gather_stats(&members, &streams, chunk, mb)?;
            }
            // Sequence parallelism (`multi/sp.rs`).
            CollPurpose::Tp { site: TpSite::Reduce, piece, phase, mb, chunk, .. }
                if c.kind == CollKind::ReduceScatter =>
            {
                self.sp_reduce_scatter(&members, &streams, chunk, mb, tp_partial(piece, phase))?;
            }
            CollPurpose::Tp { site: site @ (TpSite::Gather | TpSite::GatherSaved), piece, phase, mb, chunk, layer }
                if c.kind == CollKind::AllGather =>
            {
                self.sp_gather(&members, &streams, site, piece, phase, chunk, mb, layer)?;
            }
            CollPurpose::SpReplicatedGrads if c.kind == CollKind::AllReduce => {
                self.sp_replicated_grads(&members, &streams)?;
            }
            other => {
                return Err(GpuExecError::Unsupported(format!(
                    "the shared-GPU communicator does not run {:?} ({}) under ZeRO-{zero} yet",
                    other,
                    c.kind.key()
                )));
            }
        }
        for &a in &members {
            self.ranks[a].close(&mut runs[a], pc(a))?;
        }
        Ok(())
    }

    /// Sums fp32 gradient ranges over the members, in place: member i's ranges are
    /// `ranges[i]` (its chunk, element ranges of its flat gradients), of equal sizes.
    fn all_reduce_grads(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        ranges: &[(u32, Vec<std::ops::Range<usize>>)],
    ) -> Res<()> {
        let lens: Vec<usize> = ranges[0].1.iter().map(|r| r.len()).collect();
        if ranges.iter().any(|(_, rs)| rs.iter().map(|r| r.len()).ne(lens.iter().copied())) {
            return Err(internal(format!("an all-reduce over ranges of different sizes: {ranges:?}")));
        }
        let mut ptrs: Vec<Vec<Ptr>> = Vec::with_capacity(members.len());
        for (&a, (chunk, rs)) in members.iter().zip(ranges) {
            let g = self.ranks[a].bufs[*chunk as usize]
                .grads
                .as_ref()
                .map(Tensor::ptr)
                .ok_or_else(|| internal(format!("rank {a}'s gradients of chunk {chunk} are not allocated")))?;
            ptrs.push(rs.iter().map(|r| g + 4 * r.start as u64).collect());
        }
        self.all_reduce_f32(members, streams, &ptrs, &lens)
    }

    /// Sums fp32 segments over the members, in place: member i's segment s starts at
    /// `ptrs[i][s]` and holds `lens[s]` elements (through one scratch block per member).
    pub(super) fn all_reduce_f32(
        &mut self,
        members: &[usize],
        streams: &[Stream],
        ptrs: &[Vec<Ptr>],
        lens: &[usize],
    ) -> Res<()> {
        let total: usize = lens.iter().sum();
        let mut scratch = Vec::with_capacity(members.len());
        for &a in members {
            scratch.push(self.ranks[a].take("the shared-GPU communicator's scratch", 4 * total as u64)?);
        }
        let mut at = 0u64;
        let segments: Vec<Vec<Member>> = (0..lens.len())
            .map(|s| {
                let seg = (0..members.len())
                    .map(|i| Member { input: ptrs[i][s], output: ptrs[i][s], scratch: scratch[i].ptr() + 4 * at })
                    .collect();
                at += lens[s] as u64;
                seg
            })
            .collect();
        let steps = plan_segments(CollKind::AllReduce, &segments, lens, 4).map_err(internal)?;
        self.run_steps(members, streams, &steps, "add_f32", 4)?;
        for (&a, t) in members.iter().zip(scratch) {
            self.ranks[a].give(t);
        }
        Ok(())
    }

    /// The members' tensor `w` of (chunk, mb), a (T, h) partial sum, summed in place: the
    /// embeddings in bf16 (exact: one shard's row and the positions, zeros elsewhere), the
    /// GEMMs' fp32 partial sums (`partial_dt`) in fp32, then rounded once into a bf16 tensor.
    fn tp_all_reduce(&mut self, members: &[usize], streams: &[Stream], chunk: u32, mb: u32, w: W) -> Res<()> {
        let elems = self.ranks[members[0]].dims.t * self.ranks[members[0]].dims.h;
        let eb = if w == W::R { 2 } else { self.ranks[members[0]].partial_dt().1 as u64 };
        let mut seg = Vec::with_capacity(members.len());
        let mut scratch = Vec::with_capacity(members.len());
        for &a in members {
            let p = self.ranks[a].flight.get(&(chunk, mb, w)).map(Tensor::ptr).ok_or_else(|| {
                internal(format!("rank {a}: {w:?} of chunk {chunk} mb {mb} is reduced before a piece produced it"))
            })?;
            let t = self.ranks[a].take("the shared-GPU communicator's scratch", eb * elems as u64)?;
            seg.push(Member { input: p, output: p, scratch: t.ptr() });
            scratch.push(t);
        }
        let steps = plan_segments(CollKind::AllReduce, &[seg], &[elems], eb).map_err(internal)?;
        self.run_steps(members, streams, &steps, if eb == 4 { "add_f32" } else { "add_bf16" }, eb)?;
        for (&a, t) in members.iter().zip(scratch) {
            self.ranks[a].give(t);
        }
        if eb == 4 {
            for (&a, &s) in members.iter().zip(streams) {
                let sum = self.ranks[a].got_here(chunk, mb, w)?;
                let out = self.ranks[a].take("a reduced partial sum in bf16", 2 * elems as u64)?;
                let args = [Arg::P(sum.ptr()), Arg::P(out.ptr()), Arg::L(elems as i64)];
                self.ranks[a].gpu.launch(s, "cast_f32_bf16", blocks(elems), &args)?;
                self.ranks[a].give(sum);
                self.ranks[a].put(chunk, mb, w, out)?;
            }
        }
        Ok(())
    }

    /// The loss statistics (T, 3) of every vocabulary shard, gathered in tp order into
    /// (tp, T, 3) on each member: its `Stats` tensor from then on.
    fn tp_gather_stats(&mut self, members: &[usize], streams: &[Stream], chunk: u32, mb: u32) -> Res<()> {
        let (n, elems) = (members.len(), 3 * self.ranks[members[0]].dims.t);
        let mut ms = Vec::with_capacity(n);
        let mut held = Vec::with_capacity(n);
        for &a in members {
            let stats = self.ranks[a].got_here(chunk, mb, W::Stats)?;
            let all = self.ranks[a].take("the gathered loss statistics", 4 * (n * elems) as u64)?;
            let scratch = self.ranks[a].take("the shared-GPU communicator's scratch", 4 * (n * elems) as u64)?;
            ms.push(Member { input: stats.ptr(), output: all.ptr(), scratch: scratch.ptr() });
            held.push((stats, all, scratch));
        }
        let steps = super::shared::plan(CollKind::AllGather, &ms, elems, 4).map_err(internal)?;
        self.run_steps(members, streams, &steps, "add_f32", 4)?;
        for (&a, (stats, all, scratch)) in members.iter().zip(held) {
            self.ranks[a].give(stats);
            self.ranks[a].give(scratch);
            self.ranks[a].put(chunk, mb, W::Stats, all)?;
        }
        Ok(())
    }

    /// Enqueues the communicator's steps: every member's Ready, then every member's phase one
    /// (through its ReadDone), then every member's phase two — so each wait names an event
    /// recorded before it.
    fn run_steps(&self, members: &[usize], streams: &[Stream], steps: &[Vec<Step>], add: &str, eb: u64) -> Res<()> {
        let dev = &self.ranks[members[0]].gpu;
        let ready = (0..members.len()).map(|_| dev.event(false)).collect::<Result<Vec<_>, _>>()?;
        let done = (0..members.len()).map(|_| dev.event(false)).collect::<Result<Vec<_>, _>>()?;
        for (i, (&a, &s)) in members.iter().zip(streams).enumerate() {
            self.ranks[a].gpu.record(&ready[i], s)?;
        }
        let mut cut = vec![0usize; members.len()];
        for phase in 0..2 {
            for (i, (&a, &s)) in members.iter().zip(streams).enumerate() {
                let gpu = &self.ranks[a].gpu;
                let from = cut[i];
                for (j, step) in steps[i].iter().enumerate().skip(from) {
                    match *step {
                        Step::Wait(Ev::Ready(m)) => gpu.wait(s, &ready[m])?,
                        Step::Wait(Ev::ReadDone(m)) => gpu.wait(s, &done[m])?,
                        Step::Record(Ev::ReadDone(m)) => {
                            gpu.record(&done[m], s)?;
                            if phase == 0 {
                                cut[i] = j + 1;
                                break;
                            }
                        }
                        Step::Record(Ev::Ready(m)) => gpu.record(&ready[m], s)?,
                        Step::Copy { dst, src, elems } => gpu.copy(s, dst, src, elems * eb as usize)?,
                        #[cfg(test)]
                        Step::Add { .. } if self.drop_sums => {}
                        Step::Add { dst, src, elems } => {
                            gpu.launch(s, add, blocks(elems), &[Arg::P(dst), Arg::P(src), Arg::L(elems as i64)])?
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

mod sp;
mod zero;

#[cfg(test)]
pub(super) mod tests;
#[cfg(test)]
mod tests_llama;
#[cfg(test)]
mod tests_memory;
#[cfg(test)]
mod tests_sp;
#[cfg(test)]
mod tests_vpp;
