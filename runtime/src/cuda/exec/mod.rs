//! The CUDA executor: plans run on GPUs as another backend of the plan's one execution
//! semantics (`strata_models::plan::exec`), not another copy of it.
//!
//! - [`pool`]: the device caching pool every plan `Alloc`/`Free` draws from (size classes,
//!   reuse, high-water mark, a limit with an error naming the buffer);
//! - [`schedule`]: the plan's streams as CUDA streams — the enqueue order from the shared
//!   `Cursor`, and the minimal CUDA event waits that carry cross-stream dependencies;
//! - [`layout`]: a rank's model states on the device (bf16 parameters, fp32 gradients,
//!   fp32 masters and Adam moments), from the CPU executor's chunk layouts and buckets;
//! - [`device`]: what the executor asks of a GPU (the `Device` trait) and the GPU behind
//!   it; `host` (tests): a stand-in that checks every launch and address without a GPU,
//!   and with `host_kernels` / `host_attn` computes every kernel and GEMM on the host, so
//!   a run yields real losses (`host_llama_tests`: its Llama kernels against the CPU
//!   executor's functions; `host_recompute_tests`: full and selective recomputation);
//! - [`rank`]: one GPU rank — plan buffers bound to pool blocks, the CUDA-event trace,
//!   measured peak = pool high-water + context = the plan's peak + [`overhead`]'s named
//!   terms (fp32 gradients, communicator scratch, workspace, rounding, …); [`step`]: a step entry by entry; `pieces`
//!   and `backward`: the GPT and Llama pieces, head, loss, AdamW and clipping (`saved`:
//!   the blocks of their saved state); `comm`: a rank's side of the gradient norm and of
//!   pipeline messages;
//! - [`shared`]: the shared-GPU communicator's plan of device copies and additions
//!   (deterministic, two-phase), tested on host memory; `sp`: a rank's side of sequence
//!   parallelism (which tensor each gather, reduce-scatter and replicated-gradient sum
//!   moves, for both communicators);
//! - [`multi`]: every rank of a plan on one GPU, on one host thread — collectives through
//!   `shared` at the plan's rendezvous, pipeline messages as device copies;
//! - [`train`]: a run (`strata train --backend cuda`, `strata compare --backend cuda`);
//! - [`nccl`]: one rank per process, its collectives and pipeline messages as NCCL calls
//!   behind a trait (tested with a recording fake); [`nccl_gpu`]: cudarc's NCCL behind
//!   it; [`train_nccl`]: a one-process-per-GPU run (`mpirun -n N strata train --backend
//!   cuda`, bootstrapped over MPI); [`train_node`]: one process for all GPUs of a node
//!   (`strata train --backend cuda --all-gpus`), a thread per rank and GPU, each the same
//!   NCCL rank, bootstrapped in shared memory (`cuda::node_boot`), the first failing rank
//!   named (tested with a fake NCCL that moves the data between the threads with NCCL's
//!   stream semantics, `train_node/wire.rs`).
//!
//! Runs dense GPT and dense Llama blocks (RMSNorm, SwiGLU with FC1 as [gate | up] per tp
//! rank, half-split RoPE, grouped-query attention on the kernels' own kv-head indexing —
//! no K/V heads repeated —, untied output layer, no biases), bf16, flash attention, full
//! or selective recomputation (full: a layer's forward pieces again from its saved input
//! into the plan's `recompute L mb` block; selective, which the plan lowers with flash
//! attention to no op and no saved statistics: the attention backward recomputes its
//! log-sum-exp); one rank, tp · pp · dp ranks on one GPU, or one per GPU through NCCL (with
//! sequence parallelism or without — the norms and residual on the rank's shard of the
//! sequence, all-gathers before the column-parallel GEMMs and reduce-scatters after the
//! row-parallel ones, the replicated gradients summed over tp — `multi/tests_sp.rs`;
//! interleaved 1F1B with `vpp` model chunks per rank, each its own layers, parameters,
//! gradients and optimizer state, pipeline messages keyed by virtual stage —
//! `multi/tests_vpp.rs`); ZeRO-0 to 3 as the plan lowers them — ZeRO-2/3's kernels
//! accumulate each microbatch's gradients into the plan's full-gradient bucket buffers,
//! reduce-scattered into the rank's shard, AdamW on the shards, and ZeRO-3's pieces read
//! each unit from the plan's gathered buffers (not torchtitan's unsharded accumulation
//! under a pipeline: refused); other plans (MoE, MLA, MTP, cp, the zero-bubble schedules among them) are refused naming
//! why.

mod backward;
mod comm;
pub mod deadline;
pub mod device;
#[cfg(test)]
mod host;
#[cfg(test)]
mod host_attn;
#[cfg(test)]
mod host_kernels;
#[cfg(test)]
mod host_llama_tests;
#[cfg(test)]
mod host_recompute_tests;
pub mod layout;
pub mod multi;
pub mod nccl;
pub mod nccl_gpu;
pub mod overhead;
mod pieces;
pub mod pool;
pub mod rank;
mod saved;
pub mod schedule;
pub mod shared;
mod sp;
pub mod step;
pub mod train;
pub mod train_nccl;
pub mod train_node;
