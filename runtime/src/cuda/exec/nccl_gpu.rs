//! cudarc's NCCL behind the driver's [`Nccl`] trait: the rank's communicators — the
//! world's from the bootstrapped unique id (`ncclCommInitRank`), then one per plan group
//! kind that groups two or more ranks anywhere in the plan, split from it
//! (`ncclCommSplit` with `nccl_comm::split`'s colour and key; every rank splits the same
//! kinds in the same order, as the call is collective over the world) and one more for
//! pipeline messages — and each [`Call`] as the NCCL call on the plan stream's CUDA
//! stream. Result codes become failures naming the rank and the plan op.
//!
//! With the `mpi` feature, [`MpiBootstrap`] is the job's [`Bootstrap`] over
//! `MPI_COMM_WORLD`. Needs libnccl at run time (loaded on first use, checked first).

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::nccl::result::{self as nr, NcclError};
use cudarc::nccl::sys::{self as ns, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};
use strata_models::plan::{OpId, Plan, Stream};

use super::device::Gpu;
use super::nccl::{Call, CommKey, GROUP_KINDS, Nccl, NcclDt};
use super::rank::{GpuExecError, Res};
use crate::cuda::nccl_comm::{ID_BYTES, NcclFailure, split};
use crate::cuda::{CudaError, fail};

/// A rank's NCCL communicators.
pub struct GpuNccl {
    rank: u32,
    world: ncclComm_t,
    comms: Vec<(CommKey, ncclComm_t)>,
    aborted: bool,
}

fn dt(d: NcclDt) -> ncclDataType_t {
    match d {
        NcclDt::F32 => ncclDataType_t::ncclFloat32,
        NcclDt::Bf16 => ncclDataType_t::ncclBfloat16,
        NcclDt::F64 => ncclDataType_t::ncclFloat64,
    }
}

fn code(r: ncclResult_t) -> u32 {
    r as u32
}

/// Whether libnccl can be loaded (cudarc would panic on a missing library).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to open the shared library by its candidate names.
    unsafe { ns::is_culib_present() }
}

/// NCCL's unique id for rank 0 to broadcast (`ncclGetUniqueId`).
pub fn unique_id() -> Result<[u8; ID_BYTES], String> {
    if !nccl_present() {
        return Err("no libnccl.so on this machine: install NCCL and put it on LD_LIBRARY_PATH".into());
    }
    let id = nr::get_uniqueid().map_err(|NcclError(r)| format!("ncclGetUniqueId: code {}", code(r)))?;
    Ok(id.internal.map(|b| b as u8))
}

impl GpuNccl {
    /// Rank `rank`'s communicators of `plan`'s job from rank 0's unique `id`, on `gpu`.
    pub fn open(gpu: &Gpu, plan: &Plan, rank: u32, id: [u8; ID_BYTES]) -> Res<GpuNccl> {
        if !nccl_present() {
            return Err(GpuExecError::Cuda(CudaError {
                what: format!("rank {rank}: loading NCCL"),
                cause: "no libnccl.so on this machine: install NCCL and put it on LD_LIBRARY_PATH".into(),
            }));
        }
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| fail(format!("rank {rank}: making {}'s context current", gpu.name))(&e))?;
        let failed = |what: &str| {
            let what = what.to_string();
            move |NcclError(r): NcclError| NcclFailure::Error { rank, what, code: code(r) }
        };
        let n = plan.grid.ranks();
        let uid = ns::ncclUniqueId { internal: id.map(|b| b as _) };
        let mut world = null_mut();
        // SAFETY: `world` receives the new communicator; every rank of the job makes this call.
        unsafe { nr::comm_init_rank(&mut world, n as i32, uid, rank as i32) }
            .map_err(failed(&format!("ncclCommInitRank of a {n}-rank job")))?;
        let mut me = GpuNccl { rank, world, comms: Vec::new(), aborted: false };
        let split_one = |me: &mut GpuNccl, key: CommKey, color: u32, pos: u32| -> Res<()> {
            let mut c = null_mut();
            // SAFETY: a split of the live world communicator; a null config inherits its own.
            let r = unsafe { ns::ncclCommSplit(me.world, color as i32, pos as i32, &mut c, null_mut()) };
            if r != ncclResult_t::ncclSuccess {
                return Err(
                    NcclFailure::Error { rank, what: format!("ncclCommSplit for {key:?}"), code: code(r) }.into()
                );
            }
            me.comms.push((key, c));
            Ok(())
        };
        for kind in GROUP_KINDS {
            if (0..n).all(|r| plan.grid.group(r, kind).len() < 2) {
                continue;
            }
            let s = split(plan, rank, kind);
            split_one(&mut me, CommKey::Group(kind), s.color, s.key)?;
        }
        if plan.grid.pp > 1 {
            split_one(&mut me, CommKey::P2p, 0, rank)?;
        }
        Ok(me)
    }

    fn comm(&self, key: CommKey) -> Result<ncclComm_t, NcclFailure> {
        self.comms.iter().find(|c| c.0 == key).map(|c| c.1).ok_or_else(|| NcclFailure::Error {
            rank: self.rank,
            what: format!("a call on the {key:?} communicator, which this job did not create"),
            code: 4,
        })
    }
}

impl Nccl<Gpu> for GpuNccl {
    fn call(&mut self, gpu: &Gpu, s: Stream, op: OpId, call: Call) -> Result<(), NcclFailure> {
        let st = gpu.stream(s).cu_stream() as ns::cudaStream_t;
        let sum = ncclRedOp_t::ncclSum;
        let p = |x: u64| x as *mut c_void;
        // SAFETY: the driver passes pool blocks of the rank's device, sized by the plan, and
        // orders every use of them through the plan's streams and events.
        let r = unsafe {
            match call {
                Call::GroupStart => nr::group_start().map(|_| ()),
                Call::GroupEnd => nr::group_end().map(|_| ()),
                Call::AllReduce { comm, buf, count, dt: d } => {
                    nr::all_reduce(p(buf), p(buf), count, dt(d), sum, self.comm(comm)?, st).map(|_| ())
                }
                Call::AllGather { comm, src, dst, count, dt: d } => {
                    nr::all_gather(p(src), p(dst), count, dt(d), self.comm(comm)?, st).map(|_| ())
                }
                Call::ReduceScatter { comm, src, dst, count, dt: d } => {
                    nr::reduce_scatter(p(src), p(dst), count, dt(d), sum, self.comm(comm)?, st).map(|_| ())
                }
                Call::Reduce { comm, buf, count, dt: d, root } => {
                    nr::reduce(p(buf), p(buf), count, dt(d), sum, root as i32, self.comm(comm)?, st).map(|_| ())
                }
                Call::Broadcast { comm, buf, count, dt: d, root } => {
                    nr::broadcast(p(buf), p(buf), count, dt(d), root as i32, self.comm(comm)?, st).map(|_| ())
                }
                Call::Send { comm, buf, count, dt: d, peer } => {
                    nr::send(p(buf), count, dt(d), peer as i32, self.comm(comm)?, st).map(|_| ())
                }
                Call::Recv { comm, buf, count, dt: d, peer } => {
                    nr::recv(p(buf), count, dt(d), peer as i32, self.comm(comm)?, st).map(|_| ())
                }
            }
        };
        r.map_err(|NcclError(c)| NcclFailure::Error {
            rank: self.rank,
            what: format!("op #{op} ({call:?})"),
            code: code(c),
        })
    }

    fn async_error(&mut self) -> u32 {
        for &c in std::iter::once(&self.world).chain(self.comms.iter().map(|c| &c.1)) {
            let mut e = ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and a place for its state.
            let r = unsafe { ns::ncclCommGetAsyncError(c, &mut e) };
            if r != ncclResult_t::ncclSuccess {
                return code(r);
            }
            if e != ncclResult_t::ncclSuccess {
                return code(e);
            }
        }
        0
    }

    fn abort(&mut self) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        for &(_, c) in &self.comms {
            // SAFETY: a live communicator, not used again.
            let _ = unsafe { nr::comm_abort(c) };
        }
        // SAFETY: as above.
        let _ = unsafe { nr::comm_abort(self.world) };
    }
}

impl Drop for GpuNccl {
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        for &(_, c) in &self.comms {
            // SAFETY: a live communicator, not used again.
            let _ = unsafe { nr::comm_destroy(c) };
        }
        // SAFETY: as above.
        let _ = unsafe { nr::comm_destroy(self.world) };
    }
}

/// The number of GPUs the CUDA driver sees (0 without a driver).
pub fn gpu_count() -> usize {
    if crate::cuda::require_driver().is_err() {
        return 0;
    }
    cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// The job's bootstrap over `MPI_COMM_WORLD` (after `comm::mpi::init`).
#[cfg(feature = "mpi")]
pub struct MpiBootstrap {
    world: mpi::topology::SimpleCommunicator,
}

#[cfg(feature = "mpi")]
impl MpiBootstrap {
    pub fn world() -> MpiBootstrap {
        MpiBootstrap { world: mpi::topology::SimpleCommunicator::world() }
    }

    /// Ends the whole job with exit `code` (`MPI_Abort`): a rank that fails must not just
    /// return, or its peers wait for it in MPI's collectives forever.
    pub fn abort(&self, code: i32) -> ! {
        use mpi::topology::Communicator;
        self.world.abort(code)
    }
}

#[cfg(feature = "mpi")]
impl crate::cuda::nccl_comm::Bootstrap for MpiBootstrap {
    fn rank(&self) -> u32 {
        use mpi::topology::Communicator;
        self.world.rank() as u32
    }
    fn size(&self) -> u32 {
        use mpi::topology::Communicator;
        self.world.size() as u32
    }
    fn broadcast(&mut self, buf: &mut [u8; crate::cuda::nccl_comm::FRAME_BYTES]) -> Result<(), String> {
        use mpi::collective::Root;
        use mpi::topology::Communicator;
        self.world.process_at_rank(0).broadcast_into(&mut buf[..]);
        Ok(())
    }
    fn all_gather(&mut self, v: &[f64]) -> Result<Vec<f64>, String> {
        use mpi::collective::CommunicatorCollectives;
        use mpi::topology::Communicator;
        let mut out = vec![0f64; v.len() * self.world.size() as usize];
        self.world.all_gather_into(v, &mut out[..]);
        Ok(out)
    }
}
