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
//!   it; `host` (tests): a stand-in that checks every launch and address without a GPU;
//! - [`rank`]: one GPU rank — plan buffers bound to pool blocks, a step enqueued, the
//!   CUDA-event trace, measured peak = pool high-water + context; `pieces` and `backward`:
//!   the GPT pieces, head, loss, AdamW and clipping;
//! - [`train`]: a run (`strata train --backend cuda`, `strata compare --backend cuda`);
//! - [`shared`]: the shared-GPU communicator's plan of device copies and additions
//!   (deterministic, two-phase), tested on host memory — not wired into `rank` yet.
//!
//! Runs one rank (tp = pp = dp = 1), GPT, bf16, flash attention, no recompute, ZeRO ≤ 1;
//! other plans are refused naming why. Not built: the multi-rank driver, NCCL.

mod backward;
pub mod device;
#[cfg(test)]
mod host;
pub mod layout;
mod pieces;
pub mod pool;
pub mod rank;
pub mod schedule;
pub mod shared;
pub mod train;
