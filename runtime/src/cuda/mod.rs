//! The GPU side, behind the `cuda` feature: what the GPUs of this machine are (the CUDA
//! driver's device attributes), how fast cuBLAS runs a model's GEMMs on them — what
//! `strata calibrate --backend cuda` measures — and the model's kernels (`kernels`: NVRTC
//! sources; `check`: each against the CPU reference in `reference`, on a GPU; `measure`:
//! HBM and the attention kernels timed for a GPU profile; `nccl_bench`: NCCL all-reduce
//! bus bandwidth over the node's GPUs; `peers`: which GPUs reach each other, for
//! `strata probe`), and the CUDA executor (`exec`: plans on one GPU, every rank of a
//! tp · pp · dp plan on it through the shared-GPU communicator, or one rank per GPU through
//! NCCL — one process per GPU under MPI, or one process for a node's GPUs with its ranks as
//! threads, `node_boot` their bootstrap).
//!
//! cudarc loads the driver and cuBLAS when first called (dynamic loading), so this builds
//! on a machine without CUDA; there, every call returns an error that says so (the
//! libraries are looked for first: cudarc itself would panic).

pub mod check;
pub mod exec;
pub mod kernels;
pub mod measure;
pub mod nccl_bench;
pub mod nccl_comm;
pub mod node_boot;
pub mod peers;
pub mod reference;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use half::bf16;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// A GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub memory_bytes: u64,
    pub sms: u32,
    /// (major, minor), e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
}

/// One GEMM shape timed on a GPU: C (m×n) = A (m×k) · B (k×n) in bf16, fp32 accumulation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuGemmSample {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// Seconds per call, the mean over the timed calls.
    pub seconds: f64,
    pub tflops: f64,
}

/// A CUDA failure, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {cause}")]
pub struct CudaError {
    pub what: String,
    pub cause: String,
}

pub(crate) fn fail(what: impl Into<String>) -> impl FnOnce(&dyn std::fmt::Debug) -> CudaError {
    let what = what.into();
    move |e| CudaError { what, cause: format!("{e:?}") }
}

/// An error unless the CUDA driver library (libcuda) can be loaded; cudarc panics on a
/// missing library, so every entry point asks first.
pub(crate) fn require_driver() -> Result<(), CudaError> {
    // SAFETY: only tries to open the shared library by its candidate names.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError {
            what: "loading the CUDA driver".into(),
            cause: "no libcuda.so on this machine: install the NVIDIA driver, or put its directory on \
                    LD_LIBRARY_PATH"
                .into(),
        })
    }
}

/// An error unless cuBLAS can be loaded.
pub(crate) fn require_cublas() -> Result<(), CudaError> {
    // SAFETY: as for the driver.
    if unsafe { cudarc::cublas::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError {
            what: "loading cuBLAS".into(),
            cause: "no libcublas.so on this machine: install the CUDA toolkit's cuBLAS, or put its \
                    directory on LD_LIBRARY_PATH"
                .into(),
        })
    }
}

/// Every GPU the driver sees (an error when there is no driver or no library to load).
pub fn devices() -> Result<Vec<DeviceInfo>, CudaError> {
    require_driver()?;
    let n = CudaContext::device_count()
        .map_err(|e| fail("asking the CUDA driver for its GPUs (is the NVIDIA driver installed?)")(&e))?;
    (0..n.max(0) as usize)
        .map(|i| {
            let ctx = CudaContext::new(i).map_err(|e| fail(format!("opening GPU {i}"))(&e))?;
            let attr = |a: CUdevice_attribute| {
                ctx.attribute(a).map(|v| v as u32).map_err(|e| fail(format!("reading {a:?} of GPU {i}"))(&e))
            };
            Ok(DeviceInfo {
                ordinal: i,
                name: ctx.name().map_err(|e| fail(format!("naming GPU {i}"))(&e))?,
                memory_bytes: ctx.total_mem().map_err(|e| fail(format!("sizing GPU {i}'s memory"))(&e))? as u64,
                sms: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
                compute_capability: (
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                ),
            })
        })
        .collect()
}

/// Times each (m, n, k) on GPU `ordinal` with cuBLAS in bf16: one warm-up call, then `reps`
/// calls between two CUDA events. Inputs are seeded random values in [−1, 1) (all-zero
/// inputs run faster than real data on recent GPUs).
pub fn time_gemms_bf16(ordinal: usize, shapes: &[(u64, u64, u64)], reps: u32) -> Result<Vec<GpuGemmSample>, CudaError> {
    require_driver()?;
    require_cublas()?;
    let ctx = CudaContext::new(ordinal).map_err(|e| fail(format!("opening GPU {ordinal}"))(&e))?;
    let stream = ctx.default_stream();
    let blas = CudaBlas::new(stream.clone()).map_err(|e| fail("starting cuBLAS (is libcublas installed?)")(&e))?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let mut random = |n: usize| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect() };
    let reps = reps.max(1);
    let mut out = Vec::with_capacity(shapes.len());
    for &(m, n, k) in shapes {
        let shape = format!("the {m}×{n}×{k} GEMM on GPU {ordinal}");
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let a = stream.clone_htod(&random(mu * ku)).map_err(|e| fail(format!("copying A of {shape}"))(&e))?;
        let b = stream.clone_htod(&random(ku * nu)).map_err(|e| fail(format!("copying B of {shape}"))(&e))?;
        let mut c = stream.alloc_zeros::<bf16>(mu * nu).map_err(|e| fail(format!("allocating C of {shape}"))(&e))?;
        // cuBLAS is column-major: C (m×n) = A (m×k) · B (k×n) with leading dimensions m, k, m.
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            alpha: bf16::ONE,
            lda: m as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: m as i32,
        };
        // SAFETY: A, B and C are device buffers of exactly m·k, k·n and m·n elements, which
        // is what the configuration's sizes and leading dimensions address.
        let mut call = || unsafe { blas.gemm(cfg, &a, &b, &mut c) }.map_err(|e| fail(format!("running {shape}"))(&e));
        call()?;
        let event = |what: &str| {
            stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| fail(format!("{what} {shape}"))(&e))
        };
        let start = event("timing")?;
        for _ in 0..reps {
            call()?;
        }
        let end = event("timing")?;
        let ms = start.elapsed_ms(&end).map_err(|e| fail(format!("timing {shape}"))(&e))?;
        let seconds = f64::from(ms) / 1e3 / f64::from(reps);
        out.push(GpuGemmSample { m, n, k, seconds, tflops: 2.0 * (m * n * k) as f64 / seconds / 1e12 });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_cuda_gets_an_error_not_a_panic() {
        // SAFETY: only tries to open the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return; // a CUDA machine: the device check covers it
        }
        let e = devices().unwrap_err().to_string();
        assert!(e.contains("libcuda") && e.contains("NVIDIA driver"), "{e}");
        assert!(time_gemms_bf16(0, &[(8, 8, 8)], 1).is_err());
    }
}
