//! The CUDA executor's host-side parts: plans run on GPUs as another backend of the plan's
//! one execution semantics (`strata_models::plan::exec`), not another copy of it.
//!
//! - [`pool`]: the device caching pool every plan `Alloc`/`Free` draws from (size classes,
//!   reuse, high-water mark, a limit with an error naming the buffer);
//! - [`schedule`]: the plan's streams as CUDA streams — the enqueue order from the shared
//!   `Cursor`, and the minimal CUDA event waits that carry cross-stream dependencies;
//! - [`layout`]: a rank's model states on the device (bf16 parameters and gradients, fp32
//!   masters and Adam moments), from the CPU executor's chunk layouts and buckets.
//!
//! Not built yet: the piece functions on the GPU (cuBLAS GEMMs and the NVRTC kernels of
//! `cuda::kernels` per plan piece), the driver that enqueues a step, the communicators
//! (shared-GPU device copies, NCCL) — so `strata train --backend cuda` still refuses.

mod backward;
pub mod device;
#[cfg(test)]
mod host;
pub mod layout;
mod pieces;
pub mod pool;
pub mod rank;
pub mod schedule;
pub mod train;
