//! Framework mechanics the plan mirrors: how each framework moves a sharded model's
//! parameters and gradients at run time, beyond which splits it accepts
//! ([`super::Framework::violations`]).
//!
//! - **DeepSpeed ZeRO-3** (`runtime/zero/partitioned_param_coordinator.py`, `stage3.py`):
//!   a forward (and backward) pre-hook on every sub-module fetches that module's own
//!   flattened parameters with one all-gather; on fetching module *i* the coordinator
//!   prefetches the modules that follow in its recorded trace while the elements it has
//!   queued are below `min(stage3_prefetch_bucket_size, stage3_max_live_parameters − live)`
//!   (so it may overshoot by one module), and not at all with a bucket of 0 (the export's
//!   `stage3_prefetch_bucket_size` for `parallel.overlap_param_gather = false`); a module's
//!   parameters are released after it runs;
//!   parameters of at most `stage3_param_persistence_threshold` elements are kept whole on
//!   every rank and never gathered. Defaults from `runtime/zero/config.py` (element counts).
//!   After a module runs, its parameters are released unless the module recurs in the
//!   trace within `stage3_max_reuse_distance` elements (`__params_to_release`): under full
//!   recomputation a layer's recomputed forward is followed by its backward, so a module
//!   whose backward lies further than that (counting the modules between) is gathered again
//!   ([`Zero3Mechanics::kept_for_backward`]).
//!   Each hooked module also costs host time (the Python hooks, the coordinator's
//!   bookkeeping, the all-gather launch and its event wait), which the plan charges to the
//!   module's compute.
//! - **torchtitan FSDP2** (`fully_shard` per transformer block, embeddings, and
//!   [norm, output]): one all-gather and one reduce-scatter per unit, whatever
//!   `grad_bucket_mb` says; resharded after forward under ZeRO-3.
//! - **torch.distributed.pipelining with FSDP2** (torchtitan with pp > 1): every
//!   microbatch's backward runs with gradient sync off, and after a chunk's last backward
//!   each parameter group's `post_backward` reduce-scatters the accumulated (fp32, unsharded)
//!   gradients: one reduce-scatter per unit per step, not per microbatch
//!   ([`Framework::accumulates_unsharded`]).
//! - **DeepSpeed's PipelineEngine** (`runtime/pipe/engine.py`): runs the whole 1F1B
//!   `TrainSchedule` and only then reduces the data-parallel gradients
//!   (`_exec_reduce_grads` after the flush), so no gradient reduction overlaps the backward.
//!   Its sends are synchronous (`runtime/pipe/p2p.py`: `send` asserts `async_op == False`
//!   and runs a blocking `dist.broadcast` on the two stages' group, whose `wait` makes the
//!   compute stream wait for it): the stage's next pass starts only once the activation or
//!   gradient it sent has been delivered, so no pipeline send overlaps compute.
//! - **Megatron-LM's vocab-parallel cross entropy** (`tensor_parallel/cross_entropy.py`,
//!   unfused unless `--cross-entropy-loss-fusion`): the logits are cast to fp32 and pass
//!   through max, subtraction, `exp`, sum and division kernels, and the gradient through a
//!   multiplication and a cast back ([`crate::plan::cost::vocab_parallel_cross_entropy`]):
//!   a few dozen bytes per local logit, which a small model with a large vocabulary feels.
//! - **DeepSpeed's `BF16_Optimizer`** (`runtime/bf16_optimizer.py`; the optimizer of bf16
//!   with ZeRO-1, whose fp32 gradient buffer `accounting::states` counts, and of bf16 under a
//!   pipeline at ZeRO-0, with a bf16 buffer: [`Framework::bf16_optimizer`]): it does not fuse
//!   the gradient accumulation into the weight-gradient GEMMs as Megatron-LM's main gradients
//!   do. Before each microbatch's backward `clear_lp_grads` zeroes the bf16 gradients
//!   (`_foreach_zero_`), so autograd adds each new gradient into them in place; after it,
//!   `update_hp_grads` (the pipeline engine's `_exec_backward_pass`, the engine's
//!   `_backward_epilogue`; `immediate_grad_update` is off by default) casts every bf16
//!   gradient to the buffer's dtype and adds it in, tensor by tensor. Those passes run on
//!   the compute stream between the backward and the next instruction (the pipeline send):
//!   [`crate::plan::cost::bf16_optimizer_accumulate`]. Its gradients are then all-reduced
//!   whole, not reduce-scattered: the engine's `buffered_allreduce_fallback` over the fp32
//!   buffers `get_grads_for_reduction` returns (`_bf16_reduce_grads` under a pipeline), each
//!   bucket cast to `communication_data_type`; the step updates the rank's partition and
//!   all-gathers the bf16 weights (`update_lp_params`) — ZeRO-1's two collectives with an
//!   all-reduce in place of the reduce-scatter ([`Framework::all_reduces_zero1_grads`]).
//! - **DeepSpeed ZeRO-1/2's weight all-gather** (`stage_1_and_2.py` `step`,
//!   `bf16_optimizer.py` `update_lp_params`: `all_gather_dp_groups`) runs inside the step,
//!   after the update, not under the next forward as Megatron-LM's `--overlap-param-gather`
//!   does ([`Framework::overlaps_param_gather`]).
//! - **Megatron-LM's selective recomputation** (megatron-core `transformer_config.py`:
//!   `recompute_modules` defaults to `["core_attn"]`; `attention.py`:
//!   `checkpoint_core_attention` wraps the core attention in `tensor_parallel.checkpoint`
//!   whatever its backend) re-runs the attention core's forward in the backward even when
//!   that core is a fused (flash) kernel, which stores no scores to save; the config only
//!   warns that it may be unneeded. Strata's CUDA executor does the same (it keeps no
//!   log-sum-exp under selective). Megatron-DeepSpeed's flash path
//!   (`core_attention_flash`) and torchtitan's selective activation checkpointing (whose
//!   save list keeps the flash kernel's outputs) recompute nothing
//!   ([`Framework::recomputes_attention_core`]).

use std::sync::atomic::{AtomicU32, Ordering};

use super::Framework;
use crate::scenario::Scenario;

/// One framework mechanic, for `cargo xtask validate --published`'s before/after columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mechanic {
    /// DeepSpeed ZeRO-3's per-module gathers and their prefetch limits.
    Zero3Modules,
    /// DeepSpeed ZeRO-3's per-module host time.
    Zero3Host,
    /// DeepSpeed PipelineEngine's gradient reduction after the flush.
    PipeFlushReduce,
    /// FSDP2's per-unit gradient reduction under torchtitan.
    FsdpUnits,
    /// DeepSpeed PipelineEngine's synchronous sends: the next pass waits for delivery.
    PipeSyncSend,
    /// DeepSpeed ZeRO-3's reuse distance: recomputed modules released before their backward.
    Zero3Reuse,
    /// DeepSpeed ZeRO-3's prefetch queue counting the gathered modules it pops.
    Zero3Queue,
    /// Megatron-LM's unfused vocab-parallel cross entropy: its fp32 passes over the logits.
    VocabCrossEntropy,
    /// Megatron-LM's `--tp-comm-overlap` (`parallel.tp_comm_overlap`): off, every
    /// sequence-parallel collective runs whole, whatever the scenario says.
    TpCommOverlap,
    /// torch.distributed.pipelining under FSDP2: gradients accumulate unsharded over the
    /// microbatches and reduce-scatter once, after each model chunk's last backward.
    FsdpPipeAccumulate,
    /// DeepSpeed's `BF16_Optimizer`: the per-microbatch passes that accumulate the bf16
    /// gradients into its fp32 buffer.
    Bf16HpGrads,
    /// DeepSpeed's `BF16_Optimizer`: its gradients all-reduced whole rather than
    /// reduce-scattered to the partitions' owners.
    Bf16AllReduce,
    /// DeepSpeed ZeRO-1/2 (and `BF16_Optimizer`): the updated 16-bit weights all-gathered
    /// inside the optimizer step, never under the next forward.
    StepGather,
    /// Megatron-LM's selective recomputation re-running a fused attention core's forward in
    /// the backward (`recompute_modules = ["core_attn"]`).
    CoreAttnRecompute,
}

impl Mechanic {
    pub const ALL: [Mechanic; 14] = [
        Mechanic::Zero3Modules,
        Mechanic::Zero3Host,
        Mechanic::PipeFlushReduce,
        Mechanic::FsdpUnits,
        Mechanic::PipeSyncSend,
        Mechanic::Zero3Reuse,
        Mechanic::Zero3Queue,
        Mechanic::VocabCrossEntropy,
        Mechanic::TpCommOverlap,
        Mechanic::FsdpPipeAccumulate,
        Mechanic::Bf16HpGrads,
        Mechanic::Bf16AllReduce,
        Mechanic::StepGather,
        Mechanic::CoreAttnRecompute,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Mechanic::Zero3Modules => "zero3-modules",
            Mechanic::Zero3Host => "zero3-host",
            Mechanic::PipeFlushReduce => "pipe-flush-reduce",
            Mechanic::FsdpUnits => "fsdp-units",
            Mechanic::PipeSyncSend => "pipe-sync-send",
            Mechanic::Zero3Reuse => "zero3-reuse",
            Mechanic::Zero3Queue => "zero3-queue",
            Mechanic::VocabCrossEntropy => "vocab-ce",
            Mechanic::TpCommOverlap => "tp-overlap",
            Mechanic::FsdpPipeAccumulate => "fsdp-pipe-accumulate",
            Mechanic::Bf16HpGrads => "bf16-hp-grads",
            Mechanic::Bf16AllReduce => "bf16-allreduce",
            Mechanic::StepGather => "step-gather",
            Mechanic::CoreAttnRecompute => "core-attn-recompute",
        }
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }

    /// Whether this mechanic is modelled (always, unless a validation run turned it off).
    pub fn on(self) -> bool {
        DISABLED.load(Ordering::Relaxed) & self.bit() == 0
    }
}

/// Mechanics turned off, one bit each. Only `cargo xtask validate --published` sets it (to
/// show what each mechanic changes); every other caller sees all of them on. A process-wide
/// switch, not a scenario key, so no scenario file can depend on it.
static DISABLED: AtomicU32 = AtomicU32::new(0);

/// Turns the given mechanics off (and all others on) for the rest of the process.
pub fn set_disabled(off: &[Mechanic]) {
    DISABLED.store(off.iter().map(|m| m.bit()).fold(0, |a, b| a | b), Ordering::Relaxed);
}

/// ZeRO-3 parameter-fetch limits and costs, all in elements except the host time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zero3Mechanics {
    /// `stage3_prefetch_bucket_size`: elements the coordinator prefetches ahead at most.
    pub prefetch_bucket: u64,
    /// `stage3_max_live_parameters`: gathered elements alive at once (prefetch stops at it).
    pub max_live: u64,
    /// `stage3_param_persistence_threshold`: parameters this small stay whole, never gathered.
    pub persistence_threshold: u64,
    /// `stage3_max_reuse_distance`: a module's parameters stay gathered after it runs only if
    /// it recurs within this many elements of the modules that follow it in the trace.
    pub max_reuse_distance: u64,
    /// Host nanoseconds per hooked module per pass (pre- and post-hook, fetch, release).
    pub host_ns_per_module: u64,
    /// Host nanoseconds per rank of the partition group and per view a fetch builds: the
    /// launch (`_all_gather_dtype`) narrows the flat output into one partition per rank,
    /// and the wait (`AllGatherCoalescedHandle.wait`) narrows every gathered tensor's piece
    /// out of each rank's partition and concatenates them — (1 + tensors) · ranks views
    /// in Python per fetch ([`Self::fetch_host_ns`]).
    pub host_ns_per_rank_view: u64,
    /// Whether the prefetch queue counts, against its budget, the trace entries it pops of
    /// modules already gathered (`fetch_sub_module`: every popped parameter adds its
    /// elements, gathered or not). It matters where a module recurs: a recomputed module's
    /// backward occurrence, still gathered, ends the prefetch there.
    pub queue_counts_gathered: bool,
}

/// DeepSpeed's documented defaults (`runtime/zero/config.py`: 5e7, 1e9, 1e5 and 1e9 elements).
///
/// The host time per rank and view is measured, not fitted to a run: PyTorch 2.15 running
/// the fetch's Python loops on host tensors (`models/tests/data/bench_zero3_fetch_host.py`,
/// its figures in `zero3_fetch_host.csv` beside it; the test `the_fetch_host_time_is_the_
/// measured_one` holds the constant to them).
///
/// The host time per module is a first-principles estimate, not a fit to any run: the pre-
/// and post-hook walk a handful of Python calls each (trace step, queue pops, status checks,
/// `all_gather_coalesced` launch, event record and wait, release and re-partition), each a
/// few microseconds, ≈ 100 µs in all. DeepSpeed#1174 (0.3.16, BERT-5B on 8 A100: forward
/// 480 ms under ZeRO-3 vs 60 ms under ZeRO-2, all-gathers over NVLink ≈ 45 ms of it) bounds
/// it from above at ≈ 1.5 ms per module for that old coordinator, which PR #1453 rewrote.
pub const DEEPSPEED_ZERO3: Zero3Mechanics = Zero3Mechanics {
    prefetch_bucket: 50_000_000,
    max_live: 1_000_000_000,
    persistence_threshold: 100_000,
    max_reuse_distance: 1_000_000_000,
    host_ns_per_module: 100_000,
    host_ns_per_rank_view: HOST_NS_PER_RANK_VIEW,
    queue_counts_gathered: true,
};

/// See [`Zero3Mechanics::host_ns_per_rank_view`]: the median, over the measured fetches of
/// 64 ranks or more, of host time ÷ (ranks · (1 + tensors)) (`models/tests/data/zero3_fetch_host.csv`).
pub const HOST_NS_PER_RANK_VIEW: u64 = 1_550;

/// How a framework gathers and reduces ZeRO units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gathering {
    /// One gather per unit (a layer, an embedding piece): FSDP2, Strata's executor.
    PerUnit,
    /// One gather per sub-module of a unit, with DeepSpeed's prefetch limits.
    PerModule(Zero3Mechanics),
}

impl Framework {
    /// How this framework gathers ZeRO-3 parameters for this scenario. Under DeepSpeed,
    /// `parallel.overlap_param_gather = false` is `stage3_prefetch_bucket_size = 0` (what the
    /// export writes): the coordinator's prefetch is skipped (`fetch_sub_module` prefetches
    /// only while `__prefetch_bucket_sz > 0`), so every module is gathered on demand.
    pub fn zero3_gathering(self, s: &Scenario) -> Gathering {
        match self {
            Framework::DeepSpeed if Mechanic::Zero3Modules.on() => {
                let (host, per_view) = if Mechanic::Zero3Host.on() {
                    (DEEPSPEED_ZERO3.host_ns_per_module, DEEPSPEED_ZERO3.host_ns_per_rank_view)
                } else {
                    (0, 0)
                };
                // Without the reuse rule every recomputed module is kept for its backward.
                let reuse = if Mechanic::Zero3Reuse.on() { DEEPSPEED_ZERO3.max_reuse_distance } else { u64::MAX };
                let prefetch_bucket = if s.parallel.overlap_param_gather { DEEPSPEED_ZERO3.prefetch_bucket } else { 0 };
                Gathering::PerModule(Zero3Mechanics {
                    prefetch_bucket,
                    host_ns_per_module: host,
                    host_ns_per_rank_view: per_view,
                    max_reuse_distance: reuse,
                    queue_counts_gathered: Mechanic::Zero3Queue.on(),
                    ..DEEPSPEED_ZERO3
                })
            }
            _ => Gathering::PerUnit,
        }
    }

    /// Whether gradients are reduced one unit at a time (FSDP2's per-`fully_shard`
    /// reduce-scatter) rather than in `grad_bucket_mb` buckets.
    pub fn reduces_per_unit(self, s: &Scenario) -> bool {
        self == Framework::Torchtitan && s.parallel.zero >= 2 && Mechanic::FsdpUnits.on()
    }

    /// Whether the data-parallel gradient reduction waits for the pipeline to flush
    /// (DeepSpeed's PipelineEngine): no overlap with the backward.
    pub fn reduces_after_flush(self, s: &Scenario) -> bool {
        self == Framework::DeepSpeed && s.parallel.pp > 1 && Mechanic::PipeFlushReduce.on()
    }

    /// Whether sharded gradients (ZeRO ≥ 2) accumulate unsharded over the microbatches and
    /// reduce-scatter once per step: torchtitan with a pipeline, where
    /// torch.distributed.pipelining (`stage.py`, `backward_maybe_with_nosync`) turns FSDP2's
    /// gradient sync off for every microbatch's backward and, after a model chunk's last
    /// one, runs every parameter group's `post_backward` (the reduce-scatter) by hand. The
    /// unsharded accumulators (FSDP2 accumulates in the reduce dtype, fp32) are alive from
    /// the chunk's first backward to that reduce-scatter.
    pub fn accumulates_unsharded(self, s: &Scenario) -> bool {
        self == Framework::Torchtitan && s.parallel.pp > 1 && s.parallel.zero >= 2 && Mechanic::FsdpPipeAccumulate.on()
    }

    /// Whether the loss runs Megatron-LM's unfused vocab-parallel cross entropy and its fp32
    /// passes over the logits ([`crate::plan::cost::vocab_parallel_cross_entropy`]):
    /// Megatron-LM, and DeepSpeed, whose GPT runs are Megatron-DeepSpeed's (the same
    /// `vocab_parallel_cross_entropy`). Megatron-LM's `--cross-entropy-loss-fusion` (off by
    /// default) would fuse them; torchtitan and Strata's executor keep the generic cost.
    pub fn vocab_parallel_cross_entropy(self) -> bool {
        matches!(self, Framework::Megatron | Framework::DeepSpeed) && Mechanic::VocabCrossEntropy.on()
    }

    /// Whether each microbatch's backward ends with DeepSpeed `BF16_Optimizer`'s gradient
    /// accumulation passes ([`Self::bf16_optimizer`]).
    pub fn accumulates_hp_grads(self, s: &Scenario) -> bool {
        self.bf16_optimizer(s).is_some() && Mechanic::Bf16HpGrads.on()
    }

    /// The dtype DeepSpeed's `BF16_Optimizer` accumulates gradients in, if the engine picks
    /// it for this run (`engine.py` `_do_optimizer_sanity_check`), else `None`:
    /// - bf16 weights under ZeRO-1 with `data_types.grad_accum_dtype = "fp32"` (which the
    ///   export writes): an fp32 buffer;
    /// - bf16 weights under a pipeline at ZeRO-0, where the gradient accumulation dtype is
    ///   left at the model's: the engine warns that bf16 accumulation is not safe and picks
    ///   `BF16_Optimizer` all the same, with a bf16 buffer. It partitions the fp32 master
    ///   weights and Adam over the data-parallel ranks and all-gathers the bf16 weights after
    ///   its step as ZeRO-1 does ([`crate::scenario::Scenario::zero_stage`]).
    ///
    /// Without a pipeline, bf16 at ZeRO-0 is `FP16_Optimizer` in bf16 (`DDP_BFLOAT16`): fp32
    /// master and Adam whole, no separate buffer — plain ZeRO-0.
    pub fn bf16_optimizer(self, s: &Scenario) -> Option<crate::scenario::Dtype> {
        use crate::scenario::Dtype;
        if self != Framework::DeepSpeed || s.training.dtype != Dtype::Bf16 {
            return None;
        }
        match s.parallel.zero {
            1 => Some(Dtype::Fp32),
            0 if s.parallel.pp > 1 => Some(Dtype::Bf16),
            _ => None,
        }
    }

    /// Whether ZeRO-1's data-parallel gradient reduction is an all-reduce of whole buckets
    /// (DeepSpeed's `BF16_Optimizer`, the same condition as [`Self::accumulates_hp_grads`])
    /// rather than a reduce-scatter to the partitions' owners.
    pub fn all_reduces_zero1_grads(self, s: &Scenario) -> bool {
        self.bf16_optimizer(s).is_some() && Mechanic::Bf16AllReduce.on()
    }

    /// Whether ZeRO-1/2's all-gather of the updated weights runs under the next step's
    /// forward (`parallel.overlap_param_gather`, Megatron-LM's `--overlap-param-gather`)
    /// rather than at the end of the step. DeepSpeed has no such overlap: ZeRO-1/2's
    /// `step` (`stage_1_and_2.py`) and `BF16_Optimizer`'s (`update_lp_params`) call
    /// `all_gather_dp_groups` in the step itself, bucketed by `allgather_bucket_size`.
    pub fn overlaps_param_gather(self, s: &Scenario) -> bool {
        s.parallel.overlap_param_gather && !self.gathers_in_step()
    }

    /// Whether this framework all-gathers ZeRO-1/2's updated weights inside the step
    /// whatever `parallel.overlap_param_gather` says (DeepSpeed), so that the flag changes
    /// nothing there.
    pub fn gathers_in_step(self) -> bool {
        self == Framework::DeepSpeed && Mechanic::StepGather.on()
    }

    /// Whether the backward re-runs each layer's attention core (its forward, from the saved
    /// q, k and v) before the attention's backward: selective recomputation of an unfused
    /// core under every framework (its s×s scores are what selective drops), and of a fused
    /// (flash) core where the framework checkpoints it regardless — Megatron-LM (its default
    /// `recompute_modules = ["core_attn"]`) and Strata's own executor. Context parallelism's
    /// attention keeps its own rule (its lowering recomputes nothing outside the kernels).
    pub fn recomputes_attention_core(self, s: &Scenario) -> bool {
        if s.parallel.recompute != crate::parallel::Recompute::Selective {
            return false;
        }
        if !s.training.flash_attention {
            return true;
        }
        s.parallel.cp <= 1
            && matches!(self, Framework::Megatron | Framework::Strata)
            && Mechanic::CoreAttnRecompute.on()
    }

    /// Whether a pipeline send holds up the stage's compute until it is delivered
    /// (DeepSpeed's PipelineEngine: blocking broadcasts in the instruction stream).
    pub fn sends_block_compute(self, s: &Scenario) -> bool {
        self == Framework::DeepSpeed && s.parallel.pp > 1 && Mechanic::PipeSyncSend.on()
    }
}

impl Zero3Mechanics {
    /// Host nanoseconds of one module's fetch over a partition group of `ranks` ranks that
    /// gathers `tensors` tensors: the per-rank views of its launch and its wait (the hooks'
    /// fixed cost is [`Self::host_ns_per_module`], charged per hooked module).
    pub fn fetch_host_ns(&self, ranks: u64, tensors: u64) -> u64 {
        self.host_ns_per_rank_view * ranks * (1 + tensors)
    }

    /// Under full recomputation, which of a layer's gathered modules (element counts, in
    /// forward order) stay gathered from their recomputed forward to their backward. The
    /// trace after recomputed module *t* is the recomputation's modules after it, then the
    /// backward's in reverse; DeepSpeed walks it adding each module's elements and keeps *t*
    /// if *t* recurs before the sum exceeds `max_reuse_distance` (the first module after it
    /// is always looked at).
    pub fn kept_for_backward(&self, modules: &[u64]) -> Vec<bool> {
        let n = modules.len();
        let trace: Vec<usize> = (0..n).chain((0..n).rev()).collect();
        (0..n)
            .map(|t| {
                let mut traversed = 0u64;
                for &m in &trace[t + 1..] {
                    if traversed > self.max_reuse_distance {
                        return false;
                    }
                    if m == t {
                        return true;
                    }
                    traversed = traversed.saturating_add(modules[m]);
                }
                false
            })
            .collect()
    }

    /// Most gathered elements alive at once over a pass of `layers` layers whose pieces
    /// run the modules `pieces` (element counts, in forward order), under the coordinator's
    /// rule: fetch a piece's modules, prefetch the ones after them while the queued
    /// elements are under `min(prefetch_bucket, max_live − live)`, release the piece's
    /// modules once it has run. Both directions (forward, and backward in reverse) count.
    pub fn pass_peak(&self, pieces: &[Vec<u64>], layers: usize) -> u64 {
        let forward: Vec<Vec<u64>> = (0..layers).flat_map(|_| pieces.iter().cloned()).collect();
        let mut backward: Vec<Vec<u64>> = forward.iter().rev().cloned().collect();
        for p in &mut backward {
            p.reverse();
        }
        self.trace_peak(&forward).max(self.trace_peak(&backward))
    }

    fn trace_peak(&self, pieces: &[Vec<u64>]) -> u64 {
        // (piece, module) of every module in trace order.
        let order: Vec<(usize, usize)> =
            pieces.iter().enumerate().flat_map(|(p, ms)| (0..ms.len()).map(move |m| (p, m))).collect();
        let mut live = std::collections::BTreeSet::new();
        let (mut live_elems, mut peak) = (0u64, 0u64);
        for (k, ms) in pieces.iter().enumerate() {
            for (m, e) in ms.iter().enumerate() {
                if live.insert((k, m)) {
                    live_elems += e;
                }
            }
            peak = peak.max(live_elems);
            let budget = self.prefetch_bucket.min(self.max_live.saturating_sub(live_elems));
            let mut queued = 0;
            for &(p, m) in order.iter().filter(|(p, _)| *p > k) {
                if queued >= budget {
                    break;
                }
                if live.insert((p, m)) {
                    live_elems += pieces[p][m];
                    queued += pieces[p][m];
                }
            }
            peak = peak.max(live_elems);
            for (m, e) in ms.iter().enumerate() {
                live.remove(&(k, m));
                live_elems -= e;
            }
        }
        peak
    }
}
