//! One GPU rank of a plan in its own process, its communication through NCCL: the
//! per-rank driver ([`NcclRank`]) and what it asks of NCCL ([`Nccl`], one [`Call`] at a
//! time), so that the order and sizes of the calls can be recorded and checked without a
//! GPU (the tests' fake) and the same driver runs on cudarc's NCCL (`nccl_gpu`).
//!
//! The rank enqueues its whole schedule in order, as a single rank does (`GpuRank::step`),
//! without waiting for its peers — but for the gradient norm, which it reads back and so
//! enqueues after everything that does not depend on it ([`NcclRank::host_order`]): NCCL calls are asynchronous on the plan's streams, and
//! NCCL matches the k-th call on a communicator with the k-th of every other member, which
//! is the plan's own rendezvous rule (the k-th collective on a group meets the k-th; the
//! shared-GPU driver `multi` applies it with `Rendezvous`). Communicators: one per plan
//! group kind ([`CommKey::Group`], split from the world by `nccl_comm::split`'s colour and
//! key, so a member's NCCL rank is its position in the plan's group), and one more over the
//! world for pipeline messages ([`CommKey::P2p`], so that sends never queue behind a world
//! collective). A run of consecutive sends and receives in the schedule is one
//! `ncclGroupStart`/`ncclGroupEnd`, as Megatron-LM batches its paired p2p, so a send and
//! the receive that crosses it cannot wait on each other.
//!
//! The collectives are `multi`'s, on one rank's buffers: gradient buckets all-reduced in
//! place (ZeRO-0, one call per unit range in one NCCL group) or, under ZeRO-1, reduced to
//! each owner's part and the owners' parameters broadcast back (one `ncclReduce` /
//! `ncclBroadcast` per owned piece: the shards are uneven and cross units, which NCCL's
//! reduce-scatter and all-gather, equal counts per rank, cannot express); the tied word
//! table's gradients; under ZeRO-2/3 each microbatch's full-gradient bucket reduced to
//! each owner's part in place (one `ncclReduce` per member's contiguous part of the bucket)
//! and added into the owner's gradient shard, and (ZeRO-3) a unit's gathered parameters
//! assembled by each owner copying in its shard's part and broadcasting it; the tensor-parallel partial sums (fp32, then rounded to bf16 once)
//! and embeddings (bf16) — under sequence parallelism reduce-scattered into the rank's
//! sequence shard instead, beside the all-gathers of the shards and the replicated
//! tensors' gradients all-reduced once a step (`nccl/sp.rs`) —; the vocabulary shards'
//! loss statistics all-gathered in tp order;
//! the gradient norm's Σ g² all-reduced in f64. Numerics: NCCL's ring and tree sums do not
//! add in rank order, so sums over more than two ranks may differ from the shared-GPU
//! communicator's in the last bits (fp32: a relative 2⁻²³ per addition; two-rank sums are
//! order-free, a + b = b + a).
//!
//! Failure: a call's result code ends the step with an error naming the rank; the host
//! waits for the step's end polling `ncclCommGetAsyncError` and the streams
//! (`nccl_comm::watch`), so a peer's NCCL error or a silent peer ends it within the
//! timeout, and the rank aborts its communicators so its peers' calls return too.

use std::time::Duration;

use strata_models::plan::{CollKind, CollPurpose, CollectiveOp, GroupKind, OpId, OpKind, Stream, TpSite, Unit};

use super::device::{Arg, Device, Ptr, blocks};
use super::pieces::W;
use super::rank::{GpuExecError, GpuRank, Res, Tensor};
use super::step::StepRun;
use crate::cuda::nccl_comm::{NcclFailure, watch};
use crate::error::RuntimeError;
use crate::exec::StepReport;
use crate::optim::ZeroShard;

/// An element type of an NCCL call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclDt {
    F32,
    Bf16,
    F64,
}

impl NcclDt {
    pub fn bytes(self) -> usize {
        match self {
            NcclDt::F32 => 4,
            NcclDt::Bf16 => 2,
            NcclDt::F64 => 8,
        }
    }
}

/// A communicator of the rank: its plan group of a kind, or the world's one for p2p.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommKey {
    Group(GroupKind),
    P2p,
}

/// The group kinds a rank holds a communicator for, in the order every rank splits them
/// (`ncclCommSplit` is collective over the world, so the order must be the same).
pub const GROUP_KINDS: [GroupKind; 6] =
    [GroupKind::Tp, GroupKind::Dp, GroupKind::Cp, GroupKind::Ep, GroupKind::Embedding, GroupKind::World];

/// One NCCL call. Sums only; `root` and `peer` are ranks of the communicator (a plan
/// group's position; the p2p communicator's world rank). Counts are elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    GroupStart,
    GroupEnd,
    /// In place.
    AllReduce {
        comm: CommKey,
        buf: Ptr,
        count: usize,
        dt: NcclDt,
    },
    /// `count` elements from each member into `dst`, in member order.
    AllGather {
        comm: CommKey,
        src: Ptr,
        dst: Ptr,
        count: usize,
        dt: NcclDt,
    },
    /// `count` elements per member: member p's sum of every member's slice p of `src`
    /// (count × members elements) into its `dst`.
    ReduceScatter {
        comm: CommKey,
        src: Ptr,
        dst: Ptr,
        count: usize,
        dt: NcclDt,
    },
    /// In place: the sum lands in `root`'s `buf`; the others' are read only.
    Reduce {
        comm: CommKey,
        buf: Ptr,
        count: usize,
        dt: NcclDt,
        root: u32,
    },
    /// In place: `root`'s `buf` into everyone's.
    Broadcast {
        comm: CommKey,
        buf: Ptr,
        count: usize,
        dt: NcclDt,
        root: u32,
    },
    Send {
        comm: CommKey,
        buf: Ptr,
        count: usize,
        dt: NcclDt,
        peer: u32,
    },
    Recv {
        comm: CommKey,
        buf: Ptr,
        count: usize,
        dt: NcclDt,
        peer: u32,
    },
}

impl Call {
    /// The communicator it runs on (none for a group bracket).
    pub fn comm(&self) -> Option<CommKey> {
        match *self {
            Call::GroupStart | Call::GroupEnd => None,
            Call::AllReduce { comm, .. }
            | Call::AllGather { comm, .. }
            | Call::ReduceScatter { comm, .. }
            | Call::Reduce { comm, .. }
            | Call::Broadcast { comm, .. }
            | Call::Send { comm, .. }
            | Call::Recv { comm, .. } => Some(comm),
        }
    }

    /// Bytes this rank contributes (sends, for p2p; receives, for a receive).
    pub fn bytes(&self) -> usize {
        match *self {
            Call::GroupStart | Call::GroupEnd => 0,
            Call::AllReduce { count, dt, .. }
            | Call::AllGather { count, dt, .. }
            | Call::ReduceScatter { count, dt, .. }
            | Call::Reduce { count, dt, .. }
            | Call::Broadcast { count, dt, .. }
            | Call::Send { count, dt, .. }
            | Call::Recv { count, dt, .. } => count * dt.bytes(),
        }
    }
}

/// What the driver asks of NCCL: enqueue a call on a plan stream of the rank's device,
/// report an asynchronous error, abort.
pub trait Nccl<D: Device> {
    /// Enqueues `call` for plan op `op` on stream `s` of `gpu` (a group bracket ignores
    /// the three).
    fn call(&mut self, gpu: &D, s: Stream, op: OpId, call: Call) -> Result<(), NcclFailure>;
    /// The first asynchronous error of the rank's communicators (`ncclCommGetAsyncError`):
    /// 0 if none, 7 (`ncclInProgress`) while an operation is still being set up.
    fn async_error(&mut self) -> u32;
    /// Aborts every communicator (`ncclCommAbort`), so the peers' calls return too.
    fn abort(&mut self);
}

/// A failed NCCL call or wait, as the executor's error.
impl From<NcclFailure> for GpuExecError {
    fn from(f: NcclFailure) -> GpuExecError {
        GpuExecError::Runtime(RuntimeError::BadSetting(f.to_string()))
    }
}

/// One GPU rank whose collectives and pipeline messages go through NCCL.
pub struct NcclRank<D: Device, N: Nccl<D>> {
    pub rank: GpuRank<D>,
    pub nccl: N,
    /// How long a step may wait for its peers before it is a failure naming this rank.
    pub timeout: Duration,
    /// A mutation for the tests: the first two collectives of a step are issued swapped.
    #[cfg(test)]
    pub(super) swap_first_two: bool,
    /// A mutation for the tests: the schedule's own order (the norm not deferred).
    #[cfg(test)]
    pub(super) schedule_order: bool,
}

fn internal(why: String) -> GpuExecError {
    GpuExecError::Runtime(RuntimeError::BadSetting(why))
}

impl<D: Device, N: Nccl<D>> NcclRank<D, N> {
    pub fn new(rank: GpuRank<D>, nccl: N, timeout: Duration) -> NcclRank<D, N> {
        NcclRank {
            rank,
            nccl,
            timeout,
            #[cfg(test)]
            swap_first_two: false,
            #[cfg(test)]
            schedule_order: false,
        }
    }

    fn is_p2p(&self, k: usize) -> bool {
        let id = self.rank.entry_op(k);
        matches!(self.rank.plan.program(self.rank.rank).ops[id as usize].kind, OpKind::Send(_) | OpKind::Recv(_))
    }

    /// The collective of entry `k` if it needs peers (a group of more than one rank).
    fn shared_collective(&self, k: usize) -> Option<CollectiveOp> {
        let r = &self.rank;
        match &r.plan.program(r.rank).ops[r.entry_op(k) as usize].kind {
            OpKind::Collective(c) if r.plan.grid.group(r.rank, c.group).len() > 1 => Some(*c),
            _ => None,
        }
    }

    /// The order the host enqueues the schedule's entries in: the schedule's, except that
    /// the gradient norm — where the host blocks, to read the world's sum back — comes
    /// after every later entry that does not depend on it (those on other streams whose
    /// dependencies are enqueued). Otherwise a rank could block there before enqueuing
    /// an op a peer waits on before its own norm: the last stage's last gradient send
    /// comes after its norm in its schedule (found by the tests' check).
    pub fn host_order(&self) -> Vec<usize> {
        let (r, n) = (&self.rank, self.rank.entries());
        let prog = r.plan.program(r.rank);
        let norm = (0..n).find(|&k| {
            matches!(&prog.ops[r.entry_op(k) as usize].kind,
                OpKind::Collective(c) if c.purpose == CollPurpose::GradNorm && r.plan.grid.group(r.rank, c.group).len() > 1)
        });
        #[cfg(test)]
        if self.schedule_order {
            return (0..n).collect();
        }
        let Some(g) = norm else { return (0..n).collect() };
        let mut done = vec![false; prog.ops.len()];
        let mut held = [false; 4];
        let (mut order, mut later) = ((0..g).collect::<Vec<_>>(), vec![g]);
        for k in 0..g {
            done[r.entry_op(k) as usize] = true;
        }
        if let Some(s) = r.entry_stream(g) {
            held[s.index()] = true;
        }
        for k in g + 1..n {
            let op = &prog.ops[r.entry_op(k) as usize];
            let stream_held = r.entry_stream(k).is_some_and(|s| held[s.index()]);
            if stream_held || !op.deps.iter().all(|d| done[*d as usize]) {
                if let Some(s) = r.entry_stream(k) {
                    held[s.index()] = true;
                }
                later.push(k);
            } else {
                done[r.entry_op(k) as usize] = true;
                order.push(k);
            }
        }
        order.extend(later);
        order
    }

    /// One step: every entry of the schedule enqueued in [`Self::host_order`], then the
    /// wait for its end under the watchdog; the rank's own report.
    pub fn step(&mut self, step: u32) -> Res<StepReport> {
        let mut run = self.rank.begin(step)?;
        let n = self.rank.entries();
        #[allow(unused_mut)]
        let mut order = self.host_order();
        #[cfg(test)]
        if self.swap_first_two {
            let colls: Vec<usize> = (0..n).filter(|&i| self.shared_collective(order[i]).is_some()).take(2).collect();
            if let [a, b] = colls[..] {
                order.swap(a, b);
            }
        }
        let mut i = 0;
        while i < n {
            let k = order[i];
            if let Some(c) = self.shared_collective(k) {
                self.collective(&mut run, k, &c)?;
                i += 1;
            } else if self.is_p2p(k) {
                let mut j = i;
                while j < n && self.is_p2p(order[j]) {
                    j += 1;
                }
                self.p2p(&mut run, &order[i..j])?;
                i = j;
            } else {
                self.rank.enqueue(&mut run, k)?;
                i += 1;
            }
        }
        self.wait_idle(&format!("step {step}"))?;
        self.rank.finish(run)
    }

    /// Waits until the rank's streams are idle, under the watchdog; on a failure aborts
    /// the communicators (so the peers' waits end too).
    fn wait_idle(&mut self, what: &str) -> Res<()> {
        let (rank, gpu, nccl) = (self.rank.rank, &self.rank.gpu, &mut self.nccl);
        let mut query_failed = false;
        let done = || {
            gpu.idle().unwrap_or_else(|_| {
                query_failed = true;
                true
            })
        };
        let r = watch(rank, what, self.timeout, Duration::from_millis(1), done, || nccl.async_error());
        if let Err(e) = r {
            self.nccl.abort();
            return Err(e.into());
        }
        // A failed stream query surfaces as the synchronisation's error.
        if query_failed {
            self.rank.gpu.sync_all()?;
        }
        Ok(())
    }

    fn call(&mut self, s: Stream, call: Call) -> Res<()> {
        if let Err(e) = self.nccl.call(&self.rank.gpu, s, self.rank.cur.0, call) {
            self.nccl.abort();
            return Err(e.into());
        }
        Ok(())
    }

    /// Entries `ks` (consecutive sends and receives) as one NCCL group.
    fn p2p(&mut self, run: &mut StepRun<D::Event>, ks: &[usize]) -> Res<()> {
        let plan = self.rank.plan.clone();
        let me = self.rank.rank;
        let count = self.rank.msg_bytes() / 2;
        let mut opened = Vec::with_capacity(ks.len());
        self.call(Stream::Compute, Call::GroupStart)?;
        for &k in ks {
            let s = self.rank.open(run, k)?.ok_or_else(|| internal("a pipeline message on no stream".into()))?;
            let op = &plan.program(me).ops[self.rank.entry_op(k) as usize];
            match &op.kind {
                OpKind::Send(p) => {
                    let peer = plan.grid.peer(me, p.peer);
                    let t = self.rank.outgoing(p)?;
                    self.call(s, Call::Send { comm: CommKey::P2p, buf: t.ptr(), count, dt: NcclDt::Bf16, peer })?;
                    self.rank.give(t);
                }
                OpKind::Recv(p) => {
                    let peer = plan.grid.peer(me, p.peer);
                    let buf = self.rank.msg_ptr(false, p.kind, p.vstage, p.mb)?;
                    self.call(s, Call::Recv { comm: CommKey::P2p, buf, count, dt: NcclDt::Bf16, peer })?;
                }
                other => return Err(internal(format!("entry {k} is {other:?}, not a pipeline message"))),
            }
            opened.push((k, self.rank.cur));
        }
        self.call(Stream::Compute, Call::GroupEnd)?;
        for (k, cur) in opened {
            self.rank.cur = cur;
            self.rank.close(run, k)?;
        }
        Ok(())
    }

    /// Collective `c` of entry `k`.
    fn collective(&mut self, run: &mut StepRun<D::Event>, k: usize, c: &CollectiveOp) -> Res<()> {
        let s = self.rank.open(run, k)?.ok_or_else(|| internal("a collective on no stream".into()))?;
        let comm = CommKey::Group(c.group);
        let zero = self.rank.plan.scenario.zero_stage();
        match c.purpose {
            CollPurpose::GradNorm => self.grad_norm(s, comm)?,
            // ZeRO-0, and ZeRO-1 under DeepSpeed's BF16_Optimizer (whole buckets all-reduced).
            CollPurpose::GradBucket { chunk, bucket, .. } if zero <= 1 && c.kind == CollKind::AllReduce => {
                let g = self.grads(chunk)?;
                let b = self.bucket(chunk, bucket)?;
                let ranges: Vec<_> = b.units.iter().map(|(_, r)| r.clone()).collect();
                self.all_reduce_f32(s, comm, g, &ranges)?;
            }
            CollPurpose::TiedEmbeddingGrad => {
                let (chunk, word) = (0..self.rank.chunks.len())
                    .find_map(|ci| self.rank.chunks[ci].unit_range(Unit::WordEmbedding).map(|r| (ci as u32, r)))
                    .ok_or_else(|| internal(format!("rank {} holds no word table", self.rank.rank)))?;
                let ranges: Vec<_> = if zero == 0 {
                    vec![word]
                } else {
                    self.rank.chunks[chunk as usize]
                        .owned_runs()
                        .into_iter()
                        .filter(|r| r.flat >= word.start && r.flat < word.end)
                        // ZeRO-2/3: at its place in the gradient shard.
                        .map(|r| if zero >= 2 { r.master..r.master + r.len } else { r.flat..r.flat + r.len })
                        .collect()
                };
                let g = self.grads(chunk)?;
                self.all_reduce_f32(s, comm, g, &ranges)?;
            }
            CollPurpose::GradBucket { chunk, bucket, .. } if zero == 1 && c.kind == CollKind::ReduceScatter => {
                let g = self.grads(chunk)?;
                self.owner_parts(s, comm, c.group, chunk, bucket, g, Shape::Chunk, true)?;
            }
            CollPurpose::GradBucket { chunk, bucket, .. } if zero >= 2 && c.kind == CollKind::ReduceScatter => {
                let full = self.op_buf(k, 1)?;
                self.owner_parts(s, comm, c.group, chunk, bucket, full, Shape::Bucket, true)?;
                // The owned part, summed, accumulates into the gradient shard.
                let (owned, at) = self.owned_in_shard(chunk, bucket)?;
                if !owned.is_empty() {
                    let dst = self.grads(chunk)? + 4 * at as u64;
                    let args = [Arg::P(dst), Arg::P(full + 4 * owned.start as u64), Arg::L(owned.len() as i64)];
                    self.rank.gpu.launch(s, "add_f32", blocks(owned.len()), &args)?;
                }
            }
            CollPurpose::ParamGather { chunk, bucket, .. } if zero >= 3 && c.kind == CollKind::AllGather => {
                let gathered = self.op_buf(k, 0)?;
                let (owned, at) = self.owned_in_shard(chunk, bucket)?;
                let shard = self.params(chunk)?;
                if !owned.is_empty() {
                    self.rank.gpu.copy(s, gathered + 2 * owned.start as u64, shard + 2 * at as u64, 2 * owned.len())?;
                }
                self.owner_parts(s, comm, c.group, chunk, bucket, gathered, Shape::Bucket, false)?;
            }
            CollPurpose::ParamBucket { chunk, bucket } if (1..=2).contains(&zero) && c.kind == CollKind::AllGather => {
                let p = self.params(chunk)?;
                self.owner_parts(s, comm, c.group, chunk, bucket, p, Shape::Chunk, false)?;
            }
            CollPurpose::Tp { site: TpSite::Reduce, piece, phase, mb, chunk, .. } if c.kind == CollKind::AllReduce => {
                self.tp_all_reduce(s, comm, chunk, mb, super::multi::tp_partial(piece, phase))?;
            }
            // Sequence parallelism (`nccl/sp.rs`).
            CollPurpose::Tp { site: TpSite::Reduce, piece, phase, mb, chunk, .. }
                if c.kind == CollKind::ReduceScatter =>
            {
                self.sp_reduce_scatter(s, comm, c.group, chunk, mb, super::multi::tp_partial(piece, phase))?;
            }
            CollPurpose::Tp { site: site @ (TpSite::Gather | TpSite::GatherSaved), piece, phase, mb, chunk, layer }
                if c.kind == CollKind::AllGather =>
            {
                self.sp_gather(s, comm, c.group, (site, piece, phase), chunk, mb, layer)?;
            }
            CollPurpose::SpReplicatedGrads if c.kind == CollKind::AllReduce => {
                let runs = self.rank.sp_grad_runs()?;
                self.call(s, Call::GroupStart)?;
                for (buf, count) in runs {
                    self.call(s, Call::AllReduce { comm, buf, count, dt: NcclDt::F32 })?;
                }
                self.call(s, Call::GroupEnd)?;
            }
            CollPurpose::Tp { site: TpSite::LossStats, mb, chunk, .. } if c.kind == CollKind::AllGather => {
                let n = self.rank.plan.grid.group(self.rank.rank, c.group).len();
                let count = 3 * self.rank.dims.t;
                let stats = self.rank.got_here(chunk, mb, W::Stats)?;
                let all = self.rank.take("the gathered loss statistics", 4 * (n * count) as u64)?;
                let call = Call::AllGather { comm, src: stats.ptr(), dst: all.ptr(), count, dt: NcclDt::F32 };
                self.call(s, call)?;
                self.rank.give(stats);
                self.rank.put(chunk, mb, W::Stats, all)?;
            }
            other => {
                return Err(GpuExecError::Unsupported(format!(
                    "the NCCL communicator does not run {other:?} ({}) under ZeRO-{zero} yet",
                    c.kind.key()
                )));
            }
        }
        self.rank.close(run, k)
    }

    /// fp32 element ranges of the flat buffer at `base`, summed in place in one NCCL group.
    fn all_reduce_f32(&mut self, s: Stream, comm: CommKey, base: Ptr, ranges: &[std::ops::Range<usize>]) -> Res<()> {
        self.call(s, Call::GroupStart)?;
        for r in ranges.iter().filter(|r| !r.is_empty()) {
            let call = Call::AllReduce { comm, buf: base + 4 * r.start as u64, count: r.len(), dt: NcclDt::F32 };
            self.call(s, call)?;
        }
        self.call(s, Call::GroupEnd)
    }

    /// The world's Σ g²: this rank's on the device, all-reduced in f64, read back once
    /// the streams are idle (under the watchdog: a peer that never arrives is a timeout).
    fn grad_norm(&mut self, s: Stream, comm: CommKey) -> Res<()> {
        self.wait_idle("the wait before the gradient norm")?;
        let mine = self.rank.grad_sq_local(s)?;
        let buf = self.rank.take("the gradient norm's all-reduce", 8)?;
        self.rank.gpu.upload(buf.ptr(), &[mine])?;
        if s != Stream::Compute {
            let e = self.rank.gpu.event(false)?;
            self.rank.gpu.record(&e, Stream::Compute)?;
            self.rank.gpu.wait(s, &e)?;
        }
        self.call(s, Call::AllReduce { comm, buf: buf.ptr(), count: 1, dt: NcclDt::F64 })?;
        self.wait_idle("the gradient norm's all-reduce")?;
        let mut total = [0f64];
        self.rank.gpu.download(s, &mut total, buf.ptr())?;
        self.rank.give(buf);
        self.rank.set_grad_norm(total[0]);
        Ok(())
    }

    /// A tensor-parallel partial sum `w` of (chunk, mb), summed in place: bf16 embeddings,
    /// fp32 GEMM partials then rounded once into a bf16 tensor (as `multi` does).
    fn tp_all_reduce(&mut self, s: Stream, comm: CommKey, chunk: u32, mb: u32, w: W) -> Res<()> {
        let elems = self.rank.dims.t * self.rank.dims.h;
        let eb = if w == W::R { 2 } else { self.rank.partial_dt().1 };
        let p = self.rank.flight.get(&(chunk, mb, w)).map(Tensor::ptr).ok_or_else(|| {
            internal(format!(
                "rank {}: {w:?} of chunk {chunk} mb {mb} is reduced before a piece produced it",
                self.rank.rank
            ))
        })?;
        let dt = if eb == 4 { NcclDt::F32 } else { NcclDt::Bf16 };
        self.call(s, Call::AllReduce { comm, buf: p, count: elems, dt })?;
        if eb == 4 {
            let sum = self.rank.got_here(chunk, mb, w)?;
            let out = self.rank.take("a reduced partial sum in bf16", 2 * elems as u64)?;
            let args = [Arg::P(sum.ptr()), Arg::P(out.ptr()), Arg::L(elems as i64)];
            self.rank.gpu.launch(s, "cast_f32_bf16", blocks(elems), &args)?;
            self.rank.give(sum);
            self.rank.put(chunk, mb, w, out)?;
        }
        Ok(())
    }
}

mod lookup;
mod sp;
use lookup::Shape;

#[cfg(test)]
mod tests;
