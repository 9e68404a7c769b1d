//! Which GPUs of this machine reach each other directly, from the CUDA driver's P2P
//! attributes (`cuDeviceGetP2PAttribute`), for `strata probe`: access supported, native
//! atomics over the link, and the driver's performance rank of the pair.
//!
//! The driver does not name the link. GPU-to-GPU atomics are native over NVLink and not
//! over PCIe peer access (`nvidia-smi topo -p2p a` shows the same attribute), so probe
//! reports a pair with access and native atomics as an NVLink peer: a heuristic, and named
//! as one wherever it is printed.

use cudarc::driver::CudaContext;
use cudarc::driver::sys::{self, CUdevice_P2PAttribute};
use serde::Serialize;

use super::{CudaError, fail, require_driver};

/// One direction of a GPU pair as the driver describes it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerLink {
    pub from: usize,
    pub to: usize,
    /// `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`.
    pub access: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (relative; lower is faster).
    pub performance_rank: i32,
}

impl PeerLink {
    /// Access with native atomics: NVLink (see the module's note).
    pub fn nvlink(&self) -> bool {
        self.access && self.native_atomics
    }
}

/// Every ordered pair of distinct GPUs among the first `count` the driver lists.
pub fn peer_links(count: usize) -> Result<Vec<PeerLink>, CudaError> {
    require_driver()?;
    let handles: Vec<sys::CUdevice> = (0..count)
        .map(|i| CudaContext::new(i).map(|c| c.cu_device()).map_err(|e| fail(format!("opening GPU {i}"))(&e)))
        .collect::<Result<_, _>>()?;
    let attr = |a: CUdevice_P2PAttribute, from: usize, to: usize| -> Result<i32, CudaError> {
        let mut v = 0i32;
        // SAFETY: both handles came from the driver for ordinals it listed; v is an out-parameter.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut v, a, handles[from], handles[to]) }
            .result()
            .map_err(|e| fail(format!("reading {a:?} of GPUs {from} → {to}"))(&e))?;
        Ok(v)
    };
    let mut out = Vec::new();
    for from in 0..count {
        for to in (0..count).filter(|t| *t != from) {
            out.push(PeerLink {
                from,
                to,
                access: attr(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, from, to)? != 0,
                native_atomics: attr(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, from, to)?
                    != 0,
                performance_rank: attr(CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, from, to)?,
            });
        }
    }
    Ok(out)
}
