//! One GPU rank of a plan: its device state (the chunk states of `layout` in pool blocks),
//! the plan's buffers bound to pool blocks, and one step enqueued in the order and with the
//! event waits of `schedule` — the plan's one execution semantics, with the GPU as the
//! backend that runs each op (`pieces` for compute, `Alloc`/`Free` through the pool).
//!
//! Scope so far: dense GPT and Llama blocks, bf16 storage, flash attention, full or
//! selective activation recomputation (`pieces::saved_acts`); one rank, or
//! several of one plan under tensor (with or without sequence parallelism: `sp`), pipeline
//! and data parallelism (cp = 1; interleaved 1F1B with `vpp` chunks per rank, each with its own
//! states in `bufs`; ZeRO-0 to 3, ZeRO-2/3's gradients through the plan's full-gradient
//! buckets and ZeRO-3's parameters through its gathered buffers) through the multi-rank
//! driver (`multi`) or NCCL (`nccl`), which run the ops that need peers. Other plans are
//! refused at construction with the reason.
//!
//! Measured memory is the pool's: its high-water mark of reserved bytes plus the CUDA
//! context (the device's used bytes before the first allocation); its difference from the
//! plan's predicted peak is split into named terms (`overhead`, `MemoryPeaks::overhead_bytes`). The trace of the traced
//! step comes from CUDA events recorded around each op, in the CPU executor's format.

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_models::plan::exec::ProgramGraph;
use strata_models::plan::{BufClass, BufId, OpId, OpKind, Plan, Stream};
use strata_models::{Dtype, Family, Recompute};

use super::device::{Block, Device, Gpu, Ptr};
use super::layout::{ChunkState, rank_state};
use super::pool::{DevicePool, Lease, PoolError};
use super::schedule::Schedule;
use crate::cuda::CudaError;
use crate::data::{Batch, Corpus};
use crate::error::RuntimeError;
use crate::exec::pool::BufKey;
use crate::exec::{ExecConfig, MemoryPeaks};
use crate::micro::Micro;
use crate::optim::AdamWConfig;

/// Why a GPU rank stopped.
#[derive(Debug, thiserror::Error)]
pub enum GpuExecError {
    /// The plan asks for something this executor does not run (bad input for it).
    #[error("the CUDA executor cannot run this plan: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

pub type Res<T> = Result<T, GpuExecError>;

/// The ops whose end events a reused block's next user waits on.
pub type Fence = Vec<OpId>;

/// A pool block in use.
pub struct Tensor {
    pub(super) lease: Lease<Block, Fence>,
}

impl Tensor {
    pub fn ptr(&self) -> Ptr {
        self.lease.block.ptr
    }
}

/// A chunk's persistent device buffers (allocated by the plan's first step).
#[derive(Default)]
pub struct ChunkBufs {
    /// bf16 parameters (the plan's `params cN`).
    pub params: Option<Tensor>,
    /// fp32 gradients (the plan's `grads cN`; beyond the plan's bytes where its framework
    /// keeps bf16: `overhead`'s `grads-fp32`).
    pub grads: Option<Tensor>,
    /// fp32 master weights, then m, then v (the plan's `optimizer cN`).
    pub opt: Option<Tensor>,
}

/// A live plan buffer.
pub(super) struct Live {
    pub key: BufKey,
    pub class: BufClass,
    pub predicted: u64,
    pub tensor: Option<Tensor>,
}

/// One GPU rank.
pub struct GpuRank<D: Device = Gpu> {
    pub(super) plan: Arc<Plan>,
    pub(super) gpu: D,
    pub(super) pool: DevicePool<D::Mem, Fence>,
    pub(super) sched: Arc<Schedule>,
    pub(super) chunks: Vec<ChunkState>,
    /// Per chunk: (layer, tensor) → its first element in the chunk's flat buffers (the
    /// head's tied copy of the word table included).
    pub(super) offsets: Vec<BTreeMap<(Option<usize>, crate::params::ParamKind), usize>>,
    pub(super) bufs: Vec<ChunkBufs>,
    pub(super) live: BTreeMap<BufId, Live>,
    /// The microbatch of the backward compute op being enqueued (`None` for any other op):
    /// ZeRO-2/3 write its gradients into the plan's full-gradient bucket buffers of that
    /// microbatch.
    pub(super) grad_mb: Option<u32>,
    /// Tensors between the pieces of a microbatch (`exec`'s workspace), by (chunk, mb, what).
    pub(super) flight: BTreeMap<(u32, u32, super::pieces::W), Tensor>,
    /// Full recomputation: a layer's forward activations between its `AttnIn` and its
    /// `LayerOut` (the plan's `act L mb` keeps only the input), by (layer, mb).
    pub(super) fwd_ws: BTreeMap<(u32, u32), Tensor>,
    /// The plan's recomputation (which activations `act L mb` keeps).
    pub(super) recompute: Recompute,
    /// Output gradients kept from a backward-input pass for its weight pass, by (layer, mb, what).
    pub(super) kept: BTreeMap<(u32, u32, super::pieces::W), Tensor>,
    /// The step's token ids (inputs, then targets, m·T each) and per-token losses (m·T).
    pub(super) tokens: Option<Tensor>,
    pub(super) losses: Option<Tensor>,
    /// End event of every op (waits and the trace), start events for the traced step.
    pub(super) ends: Vec<D::Event>,
    pub(super) starts: Vec<D::Event>,
    pub(super) dims: Dims,
    pub(super) m: u32,
    pub(super) micro: Micro,
    pub(super) grad_scale: f32,
    pub(super) adamw: AdamWConfig,
    pub(super) adam_steps: u64,
    base_lr: f32,
    warmup: u32,
    pub(super) clip: f32,
    pub(super) clip_scale: f32,
    pub(super) grad_norm: Option<f64>,
    pub(super) nonfinite: Option<(String, f64)>,
    corpus: Arc<Corpus>,
    pub(super) batches: Vec<Batch>,
    /// The op being enqueued (the fence of the blocks it frees) and its stream.
    pub(super) cur: (OpId, Stream),
    pub(super) cfg: ExecConfig,
    /// Device bytes in use before the executor allocated anything (the CUDA context).
    pub context_bytes: u64,
    /// The plan's bytes of each buffer, by name (the `overhead` breakdown's plan side).
    predicted_by_name: BTreeMap<String, u64>,
    peaks: MemoryPeaks,
    pub(super) rank: u32,
    /// This rank's data-parallel index and the replicas (its batches, the loss scale).
    pub(super) dp: (u32, u32),
}

impl GpuRank<Gpu> {
    /// Rank 0 of `plan` on GPU `ordinal`, with freshly initialised state (the CPU
    /// executor's initial parameters, seeded from the scenario).
    pub fn new(plan: Arc<Plan>, ordinal: usize, corpus: Arc<Corpus>, cfg: ExecConfig) -> Res<GpuRank> {
        check_plan(&plan)?;
        let gpu = Gpu::open(ordinal)?;
        GpuRank::with_device(plan, gpu, corpus, cfg)
    }
}

impl<D: Device> GpuRank<D> {
    /// Rank 0 of `plan` on `gpu`.
    pub fn with_device(plan: Arc<Plan>, gpu: D, corpus: Arc<Corpus>, cfg: ExecConfig) -> Res<GpuRank<D>> {
        GpuRank::for_rank(plan, 0, gpu, corpus, cfg)
    }

    /// Rank `rank` of `plan` on `gpu` (the multi-rank driver builds one per rank).
    pub fn for_rank(plan: Arc<Plan>, rank: u32, gpu: D, corpus: Arc<Corpus>, cfg: ExecConfig) -> Res<GpuRank<D>> {
        check_plan(&plan)?;
        let s = &plan.scenario;
        if corpus.vocab() > s.model.vocab as usize {
            return Err(RuntimeError::BadSetting(format!(
                "the training data has {} token ids but model.vocab = {}",
                corpus.vocab(),
                s.model.vocab
            ))
            .into());
        }
        let chunks = rank_state(&plan, rank)?;
        let graph = ProgramGraph::new(plan.program(rank))
            .map_err(|e| RuntimeError::BadSetting(format!("the plan's program for rank {rank} cannot run: {e}")))?;
        let sched = Arc::new(Schedule::new(plan.program(rank), &graph));
        let context_bytes = gpu.memory_bytes().saturating_sub(gpu.free_bytes()?);
        let limit = gpu.memory_bytes().saturating_sub(context_bytes);
        let pool = DevicePool::new(gpu.memory(), limit);
        let n = graph.len();
        let ends = (0..n).map(|_| gpu.event(true)).collect::<Result<Vec<_>, _>>()?;
        let starts = (0..n).map(|_| gpu.event(true)).collect::<Result<Vec<_>, _>>()?;
        let d = chunks[0].layout.dims();
        let (p, t) = (&s.parallel, &s.training);
        let micro = Micro { batch: p.micro_batch as usize, seq: s.model.seq_len as usize };
        let mut dims = Dims::new(d, micro.batch, micro.seq);
        // Sequence parallelism: the norms and the residual stream on this rank's shard of
        // the microbatch's tokens (lowering checked that tp divides them).
        if plan.sequence_parallel() {
            dims.rows = dims.t / p.tp as usize;
        }
        let m = p.microbatches();
        let adamw = AdamWConfig { lr: t.lr as f32, weight_decay: t.weight_decay as f32, ..AdamWConfig::default() };
        let mut predicted_by_name = BTreeMap::new();
        for op in &plan.program(rank).ops {
            if let OpKind::Alloc(a) = &op.kind {
                predicted_by_name.insert(a.name.clone(), a.bytes);
            }
        }
        let offsets =
            chunks.iter().map(|c| c.layout.entries().iter().map(|e| ((e.layer, e.kind), e.offset)).collect()).collect();
        Ok(GpuRank {
            offsets,
            bufs: chunks.iter().map(|_| ChunkBufs::default()).collect(),
            chunks,
            gpu,
            pool,
            sched,
            live: BTreeMap::new(),
            grad_mb: None,
            flight: BTreeMap::new(),
            kept: BTreeMap::new(),
            fwd_ws: BTreeMap::new(),
            recompute: p.recompute,
            tokens: None,
            losses: None,
            ends,
            starts,
            dims,
            m,
            micro,
            grad_scale: 1.0 / (m as usize * p.dp as usize * micro.tokens()) as f32,
            base_lr: adamw.lr,
            adamw,
            adam_steps: 0,
            warmup: t.warmup_steps,
            clip: t.grad_clip as f32,
            clip_scale: 1.0,
            grad_norm: None,
            nonfinite: None,
            corpus,
            batches: Vec::new(),
            cur: (0, Stream::Compute),
            cfg,
            context_bytes,
            predicted_by_name,
            peaks: MemoryPeaks::default(),
            rank,
            dp: (plan.grid.coord(rank).dp, p.dp),
            plan,
        })
    }

    pub fn pool_stats(&self) -> super::pool::PoolStats {
        self.pool.stats()
    }

    /// The pool's blocks in use at its high-water mark, by account.
    pub fn pool_at_peak(&self) -> &super::pool::ByAccount {
        self.pool.at_peak()
    }

    pub fn chunk_states(&self) -> &[ChunkState] {
        &self.chunks
    }

    pub fn gpu_name(&self) -> &str {
        self.gpu.name()
    }

    /// Peak memory so far: measured = the pool's reserved high-water mark + the context.
    pub fn peaks(&self) -> &MemoryPeaks {
        &self.peaks
    }

    pub(super) fn lr_at(&self, step: u32) -> f32 {
        if self.warmup == 0 {
            self.base_lr
        } else {
            self.base_lr * ((step + 1).min(self.warmup) as f32 / self.warmup as f32)
        }
    }

    /// A block for `name`, held under its account (`overhead::account`); its stream waits
    /// on the fence of the block's previous user.
    pub(super) fn take(&mut self, name: &str, bytes: u64) -> Res<Tensor> {
        self.take_as(&super::overhead::account(name), name, bytes)
    }

    /// A block for `name` held under `account`.
    pub(super) fn take_as(&mut self, account: &str, name: &str, bytes: u64) -> Res<Tensor> {
        let lease = self.pool.alloc_as(account, name, bytes)?;
        if let Some(fence) = &lease.fence {
            let (_, s) = self.cur;
            for &op in fence {
                if self.plan.program(self.rank).ops[op as usize].stream != s {
                    self.gpu.wait(s, &self.ends[op as usize])?;
                }
            }
        }
        Ok(Tensor { lease })
    }

    /// Gives a block back; its next user waits for the op being enqueued now.
    pub(super) fn give(&mut self, t: Tensor) {
        self.pool.free(t.lease, Some(vec![self.cur.0]));
    }

    /// Microbatch k of data-parallel replica d in step n reads batch (n·dp + d)·m + k, as
    /// on the CPU executor, so the global batch is the single rank's.
    pub(super) fn load_batches(&mut self, step: u32) -> Res<()> {
        let m = self.m as u64;
        let (d, dp) = (self.dp.0 as u64, self.dp.1 as u64);
        self.batches = (0..m)
            .map(|k| self.corpus.batch((step as u64 * dp + d) * m + k, self.micro))
            .collect::<Result<_, _>>()
            .map_err(RuntimeError::from)?;
        let mut ids: Vec<u32> = Vec::with_capacity(2 * self.m as usize * self.dims.t);
        for b in &self.batches {
            crate::embed::check_tokens(&b.inputs, self.plan.vocab() as usize)?;
            ids.extend_from_slice(&b.inputs);
        }
        for b in &self.batches {
            ids.extend_from_slice(&b.targets);
        }
        self.cur = (0, Stream::Compute);
        let tokens = self.take("the step's token ids", 4 * ids.len() as u64)?;
        self.gpu.upload(tokens.ptr(), &ids)?;
        let losses = self.take("the step's per-token losses", 4 * (self.m as usize * self.dims.t) as u64)?;
        self.gpu.zero(Stream::Compute, losses.ptr(), 4 * self.m as usize * self.dims.t)?;
        self.tokens = Some(tokens);
        self.losses = Some(losses);
        Ok(())
    }

    /// Σ over microbatches of their mean loss, read back after the step.
    pub(super) fn step_losses(&mut self) -> Res<f64> {
        let (m, t) = (self.m as usize, self.dims.t);
        let mut host = vec![0f32; m * t];
        let ptr = self.losses.as_ref().map(Tensor::ptr).expect("loaded with the batches");
        self.gpu.download(Stream::Compute, &mut host, ptr)?;
        Ok(host.chunks_exact(t).map(|mb| mb.iter().map(|&x| x as f64).sum::<f64>() / t as f64).sum())
    }

    /// Returns the step's own blocks and checks that every transient plan buffer was freed.
    pub(super) fn end_of_step(&mut self) -> Res<()> {
        for t in [self.tokens.take(), self.losses.take()].into_iter().flatten() {
            self.give(t);
        }
        let left: Vec<String> =
            self.live.values().filter(|l| !l.key.persistent()).map(|l| format!("{:?}", l.key)).collect();
        let flight: Vec<String> = self
            .flight
            .keys()
            .chain(self.kept.keys())
            .map(|k| format!("{k:?}"))
            .chain(self.fwd_ws.keys().map(|(l, mb)| format!("forward activations of L{l} mb{mb}")))
            .collect();
        if !left.is_empty() || !flight.is_empty() {
            return Err(RuntimeError::BadSetting(format!(
                "after the step, buffers still live: {left:?}; tensors between pieces: {flight:?}"
            ))
            .into());
        }
        Ok(())
    }

    /// Peaks: the pool's high-water marks (with the context), the named terms between them
    /// and the plan's peak (`overhead`), and, per class, the plan buffers' bytes and
    /// predictions — sampled after every `Alloc` and before every `Free`, the only points
    /// where the live plan buffers change, and after every step.
    pub(super) fn measure(&mut self) {
        let st = self.pool.stats();
        let mut by: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for l in self.live.values() {
            let e = by.entry(l.class.key()).or_default();
            e.0 += self.live_bytes(l);
            e.1 += l.predicted;
        }
        let plan_blocks: u64 = by.values().map(|v| v.0).sum();
        let pk = &mut self.peaks;
        pk.measured_bytes = pk.measured_bytes.max(st.peak_reserved + self.context_bytes);
        pk.measured_plan_bytes = pk.measured_plan_bytes.max(plan_blocks);
        pk.overhead_bytes = super::overhead::breakdown(
            self.pool.at_peak(),
            &self.predicted_by_name,
            pk.predicted_bytes,
            st,
            self.context_bytes,
        );
        pk.by_class.insert("context".into(), self.context_bytes);
        for (k, (measured, predicted)) in by {
            let e = pk.by_class.entry(k.to_string()).or_default();
            *e = (*e).max(measured);
            let e = pk.predicted_by_class.entry(k.to_string()).or_default();
            *e = (*e).max(predicted);
        }
    }

    /// Bytes of the block bound to a live plan buffer (the persistent states' live in `bufs`).
    fn live_bytes(&self, l: &Live) -> u64 {
        let held = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.lease.class);
        match l.key {
            BufKey::Params { chunk } => held(&self.bufs[chunk as usize].params),
            BufKey::Grads { chunk } => held(&self.bufs[chunk as usize].grads),
            BufKey::Optimizer { chunk } => held(&self.bufs[chunk as usize].opt),
            _ => held(&l.tensor),
        }
    }

    /// Runs (enqueues) one op on stream `s`.
    pub(super) fn run(&mut self, id: OpId, s: Stream) -> Res<()> {
        let plan = self.plan.clone();
        let op = &plan.program(self.rank).ops[id as usize];
        match &op.kind {
            OpKind::Compute(c) => self.compute(c),
            OpKind::Alloc(a) => {
                let key = BufKey::parse(&a.name).ok_or_else(|| {
                    RuntimeError::BadSetting(format!(
                        "the plan allocates \"{}\", which the executor does not know",
                        a.name
                    ))
                })?;
                if key.persistent() && self.live.contains_key(&a.buf) {
                    return Ok(());
                }
                let tensor = self.alloc_buffer(key, &a.name)?;
                let predicted = a.bytes;
                self.live.insert(a.buf, Live { key, class: a.class, predicted, tensor });
                let live_predicted: u64 = self.live.values().map(|l| l.predicted).sum();
                self.peaks.predicted_bytes = self.peaks.predicted_bytes.max(live_predicted);
                Ok(())
            }
            OpKind::Collective(c) => {
                let members = plan.grid.group(0, c.group).len();
                if members != 1 {
                    return Err(unsupported(format!("a collective over {members} ranks: no communicator yet")));
                }
                // A group of one: nothing moves; the gradient norm is this rank's own.
                if c.purpose == strata_models::plan::CollPurpose::GradNorm {
                    self.grad_norm_local(s)?;
                }
                Ok(())
            }
            OpKind::Send(_) | OpKind::Recv(_) => Err(unsupported("pipeline messages: no communicator yet")),
            OpKind::Free { .. } => unreachable!("frees run on no stream"),
        }
    }

    pub(super) fn free(&mut self, buf: BufId, fence: Fence) -> Res<()> {
        let live = self
            .live
            .remove(&buf)
            .ok_or_else(|| RuntimeError::BadSetting(format!("the plan frees buffer b{buf}, which is not live")))?;
        if let Some(t) = live.tensor {
            self.pool.free(t.lease, Some(fence));
        }
        Ok(())
    }
}

impl<D: Device> GpuRank<D> {
    /// Bucket `bucket` (the plan's index) of chunk `chunk`.
    pub(super) fn bucket_of(&self, chunk: u32, bucket: u32) -> Res<&crate::exec::units::BucketInfo> {
        self.chunks.get(chunk as usize).and_then(|c| c.buckets.iter().find(|b| b.index == bucket)).ok_or_else(|| {
            unsupported(format!(
                "the plan names bucket {bucket} of chunk {chunk}, which rank {} does not hold",
                self.rank
            ))
        })
    }

    /// The block of a plan buffer, filled where the buffer starts with a value: the
    /// persistent states from the seeded initial parameters (the CPU executor's), zeroed
    /// gradients and moments — these live in `bufs`, for the whole run. Activation and head
    /// buffers are carved by `pieces`.
    fn alloc_buffer(&mut self, key: BufKey, name: &str) -> Res<Option<Tensor>> {
        let seed = self.plan.scenario.training.seed;
        Ok(match key {
            BufKey::Params { chunk } => {
                let c = &self.chunks[chunk as usize];
                let full = c.layout.init(seed);
                // ZeRO-3 holds the owned runs only, in the masters' order.
                let init: Vec<half::bf16> = if c.param_elems() < c.len {
                    let mut shard = vec![half::bf16::ZERO; c.owned];
                    for r in c.owned_runs() {
                        for (d, &x) in shard[r.master..r.master + r.len].iter_mut().zip(&full[r.flat..r.flat + r.len]) {
                            *d = half::bf16::from_f32(x);
                        }
                    }
                    shard
                } else {
                    full.into_iter().map(half::bf16::from_f32).collect()
                };
                let t = self.take(name, c.device_bytes(key).unwrap_or_default())?;
                self.gpu.upload(t.ptr(), &init)?;
                self.bufs[chunk as usize].params = Some(t);
                None
            }
            BufKey::Grads { chunk } => {
                let c = &self.chunks[chunk as usize];
                let (len, bytes) = (c.grad_elems(), c.device_bytes(key).unwrap_or_default());
                let t = self.take(name, bytes)?;
                self.gpu.zero(Stream::Compute, t.ptr(), 4 * len)?;
                self.bufs[chunk as usize].grads = Some(t);
                None
            }
            BufKey::Optimizer { chunk } => {
                // fp32 masters of the owned runs, in their order; then m and v, zeroed.
                let c = &self.chunks[chunk as usize];
                let (owned, init, bytes) = (c.owned, c.layout.init(seed), c.device_bytes(key).unwrap_or_default());
                let mut master = vec![0f32; owned];
                for r in c.owned_runs() {
                    master[r.master..r.master + r.len].copy_from_slice(&init[r.flat..r.flat + r.len]);
                }
                let t = self.take(name, bytes)?;
                self.gpu.upload(t.ptr(), &master)?;
                self.gpu.zero(Stream::Compute, t.ptr() + 4 * owned as u64, 8 * owned)?;
                self.bufs[chunk as usize].opt = Some(t);
                None
            }
            BufKey::Act { .. } => Some(self.take(name, super::pieces::saved_acts(&self.dims, 0, self.recompute).1)?),
            // Full recomputation's working set: every tensor the backward reads.
            BufKey::Recompute { .. } => Some(self.take(name, super::pieces::acts(&self.dims, 0).1)?),
            BufKey::Head { .. } => Some(self.take(name, super::pieces::head_acts(&self.dims, 0).1)?),
            // ZeRO-2/3: a bucket's full fp32 gradients of one microbatch (its units
            // concatenated in bucket order), zeroed, for the kernels to accumulate into until
            // the bucket's reduce-scatter; ZeRO-3: a bucket's gathered bf16 parameters.
            BufKey::GradBucket { chunk, bucket, .. } => {
                let len = self.bucket_of(chunk, bucket)?.len;
                let t = self.take(name, 4 * len as u64)?;
                self.gpu.zero(self.cur.1, t.ptr(), 4 * len)?;
                Some(t)
            }
            BufKey::Gathered { chunk, bucket, .. } => {
                let len = self.bucket_of(chunk, bucket)?.len;
                Some(self.take(name, 2 * len as u64)?)
            }
            // The embedding saves nothing (no dropout).
            BufKey::Embed { .. } => None,
            // A piece's output gradients from its input pass through its weight pass: the
            // pieces keep them in workspace blocks of their own (`pieces::W`), which the
            // pool's high-water mark measures, so the plan's buffer needs no storage here.
            // (A split backward, which would keep them longer, is refused up front.)
            BufKey::WeightGrad { .. } => None,
            // A pass's tensors between pieces: workspace blocks of the pieces, measured by
            // the pool's high-water mark, as the output gradients above.
            BufKey::Work { .. } => None,
            // A pipeline message: one (T, h) bf16 tensor, the rank's rows of it under
            // sequence parallelism (`multi` moves it).
            BufKey::Msg { .. } => Some(self.take(name, self.msg_bytes() as u64)?),
            other => {
                return Err(unsupported(format!("plan buffer {other:?} (\"{name}\") is not implemented on the GPU")));
            }
        })
    }
}

fn unsupported(why: impl Into<String>) -> GpuExecError {
    GpuExecError::Unsupported(why.into())
}

mod check;
mod dims;
pub use check::check_plan;
pub use dims::Dims;

#[cfg(test)]
mod tests;
