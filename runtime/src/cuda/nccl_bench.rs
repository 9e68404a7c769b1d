//! NCCL all-reduce bus bandwidth over this machine's GPUs, as nccl-tests measures it, for
//! `strata calibrate --backend cuda` on two or more GPUs: one process drives every GPU
//! (`ncclCommInitAll` through cudarc's `Comm::from_devices`), each size is one warm-up and
//! `reps` out-of-place all-reduces of f32 in one NCCL group per call, timed between stream
//! synchronisations. algbw = bytes / time; busbw = algbw · 2(n − 1)/n (nccl-tests'
//! `doc/PERFORMANCE.md`, all-reduce).

use std::time::Instant;

use cudarc::driver::CudaContext;
use cudarc::nccl::{Comm, ReduceOp, group_end, group_start};
use serde::Serialize;

use super::{CudaError, fail, require_driver};

/// One size's figures, in nccl-tests' units (GB/s = 1e9 bytes per second).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllReduceSample {
    pub ranks: u32,
    pub bytes: u64,
    pub seconds: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

/// nccl-tests' all-reduce figures for `bytes` over `ranks` in `seconds`.
pub fn all_reduce_bandwidth(ranks: u32, bytes: u64, seconds: f64) -> (f64, f64) {
    let algbw = bytes as f64 / seconds / 1e9;
    let n = f64::from(ranks.max(1));
    (algbw, algbw * 2.0 * (n - 1.0) / n)
}

/// An error unless NCCL can be loaded (cudarc would panic on a missing library).
fn require_nccl() -> Result<(), CudaError> {
    // SAFETY: only tries to open the shared library by its candidate names.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError {
            what: "loading NCCL".into(),
            cause: "no libnccl.so on this machine: install NCCL (pip's nvidia-nccl-cu13 ships libnccl.so.2 only; \
                    link it as libnccl.so on LD_LIBRARY_PATH)"
                .into(),
        })
    }
}

/// All-reduce over the first `gpus` GPUs at each size (bytes, a multiple of 4).
pub fn time_all_reduce(gpus: usize, sizes: &[u64], reps: u32) -> Result<Vec<AllReduceSample>, CudaError> {
    require_driver()?;
    require_nccl()?;
    let nccl = |what: String| move |e: cudarc::nccl::result::NcclError| CudaError { what, cause: format!("{e:?}") };
    let streams = (0..gpus)
        .map(|i| CudaContext::new(i).map(|c| c.default_stream()).map_err(|e| fail(format!("opening GPU {i}"))(&e)))
        .collect::<Result<Vec<_>, _>>()?;
    let comms = Comm::from_devices(streams.clone()).map_err(nccl(format!("starting NCCL on {gpus} GPUs")))?;
    let mut out = Vec::new();
    for &bytes in sizes {
        let n = (bytes / 4).max(1) as usize;
        let what = format!("all-reduce of {bytes} bytes over {gpus} GPUs");
        let mut send = Vec::new();
        let mut recv = Vec::new();
        for (i, s) in streams.iter().enumerate() {
            send.push(s.clone_htod(&vec![i as f32 + 1.0; n]).map_err(|e| fail(format!("inputs of {what}"))(&e))?);
            recv.push(s.alloc_zeros::<f32>(n).map_err(|e| fail(format!("outputs of {what}"))(&e))?);
        }
        let sync = || -> Result<(), CudaError> {
            for s in &streams {
                s.synchronize().map_err(|e| fail(format!("waiting for {what}"))(&e))?;
            }
            Ok(())
        };
        let mut call = || -> Result<(), CudaError> {
            group_start().map_err(nccl(format!("grouping {what}")))?;
            for (i, c) in comms.iter().enumerate() {
                c.all_reduce(&send[i], &mut recv[i], &ReduceOp::Sum).map_err(nccl(format!("running {what}")))?;
            }
            group_end().map_err(nccl(format!("running {what}")))?;
            Ok(())
        };
        call()?;
        sync()?;
        let t0 = Instant::now();
        for _ in 0..reps.max(1) {
            call()?;
        }
        sync()?;
        let seconds = t0.elapsed().as_secs_f64() / f64::from(reps.max(1));
        // Every rank holds the sum 1 + 2 + … + gpus.
        let want = (gpus * (gpus + 1) / 2) as f32;
        let got = streams[0].clone_dtoh(&recv[0]).map_err(|e| fail(format!("reading back {what}"))(&e))?;
        if got.iter().any(|v| *v != want) {
            return Err(CudaError { what, cause: format!("the result is not the sum {want} on GPU 0") });
        }
        let (algbw_gbps, busbw_gbps) = all_reduce_bandwidth(gpus as u32, (4 * n) as u64, seconds);
        out.push(AllReduceSample { ranks: gpus as u32, bytes: (4 * n) as u64, seconds, algbw_gbps, busbw_gbps });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nccl-tests' PERFORMANCE.md: busbw = algbw · 2(n−1)/n; 8 GPUs, 8 GiB in 40 ms.
    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        let (alg, bus) = all_reduce_bandwidth(8, 8 << 30, 0.04);
        assert!((alg - 8.0 * 1073741824.0 / 0.04 / 1e9).abs() < 1e-9);
        assert!((bus - alg * 1.75).abs() < 1e-9);
        assert_eq!(all_reduce_bandwidth(1, 1000, 1.0).1, 0.0);
    }

    #[test]
    fn without_a_driver_it_is_an_error() {
        // SAFETY: only tries to open the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        assert!(time_all_reduce(2, &[1 << 20], 1).is_err());
    }
}
