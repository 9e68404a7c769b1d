//! One GPU as the executor uses it: its context, one CUDA stream per plan stream, cuBLAS
//! on the compute stream, the model's kernels (`cuda::kernels`, compiled by NVRTC for the
//! GPU's architecture and loaded), launches and row-major bf16 GEMMs over raw device
//! pointers, and the device memory the caching pool draws from.
//!
//! The executor keeps its tensors as raw device pointers into pool blocks and orders all
//! work itself (the plan's streams and events, `schedule`), so cudarc's own per-slice event
//! tracking is switched off.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use strata_models::plan::Stream;

use super::pool::DeviceMemory;
use crate::cuda::kernels::{ARCHES, Param, SOURCES, compile, signatures};
use crate::cuda::{CudaError, fail, require_cublas, require_driver};

/// A device address (`CUdeviceptr`).
pub type Ptr = u64;

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    P(Ptr),
    I(i32),
    L(i64),
    F(f32),
}

/// Element type of a GEMM operand in device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dt {
    Bf16,
    F32,
}

impl Dt {
    fn cuda(self) -> cudaDataType_t {
        match self {
            Dt::Bf16 => cudaDataType_t::CUDA_R_16BF,
            Dt::F32 => cudaDataType_t::CUDA_R_32F,
        }
    }
}

/// A row-major matrix operand: its pointer and whether it is used transposed.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub ptr: Ptr,
    pub t: bool,
}

pub fn n(ptr: Ptr) -> Op {
    Op { ptr, t: false }
}

pub fn t(ptr: Ptr) -> Op {
    Op { ptr, t: true }
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    /// One CUDA stream per plan stream, by `Stream::index`.
    pub streams: [Arc<CudaStream>; 4],
    blas: CudaBlas,
    funcs: BTreeMap<String, CudaFunction>,
    sigs: BTreeMap<String, Vec<Param>>,
    pub name: String,
    pub memory_bytes: u64,
}

type Res<T> = Result<T, CudaError>;

/// The NVRTC architecture of compute capability (major, minor), if the kernels support it.
pub fn arch_of(cc: (i32, i32)) -> Option<&'static str> {
    let want = format!("sm_{}{}", cc.0, cc.1);
    ARCHES.iter().copied().find(|a| *a == want)
}

impl Gpu {
    /// Opens GPU `ordinal`: streams, cuBLAS, and every kernel compiled for its architecture.
    pub fn open(ordinal: usize) -> Res<Gpu> {
        require_driver()?;
        require_cublas()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| fail(format!("opening GPU {ordinal}"))(&e))?;
        // SAFETY: the executor orders every use of its buffers through the plan's streams and
        // events (`schedule`), and never hands a cudarc slice to two streams unordered.
        unsafe { ctx.disable_event_tracking() };
        let mk = || ctx.new_stream().map_err(|e| fail(format!("creating a stream on GPU {ordinal}"))(&e));
        let streams = [mk()?, mk()?, mk()?, mk()?];
        let blas = CudaBlas::new(streams[Stream::Compute.index()].clone())
            .map_err(|e| fail("starting cuBLAS (is libcublas installed?)")(&e))?;
        let cc = ctx.compute_capability().map_err(|e| fail(format!("reading GPU {ordinal}'s architecture"))(&e))?;
        let arch = arch_of(cc).ok_or_else(|| CudaError {
            what: format!("choosing the kernels' architecture for GPU {ordinal}"),
            cause: format!("compute capability {}.{} is none of {ARCHES:?}", cc.0, cc.1),
        })?;
        let mut funcs = BTreeMap::new();
        for s in SOURCES {
            let ptx = compile(s, arch)?;
            let module = ctx.load_module(ptx).map_err(|e| fail(format!("loading {} on GPU {ordinal}", s.file))(&e))?;
            for e in s.entries {
                let f = module.load_function(e).map_err(|er| fail(format!("finding kernel {e} in {}", s.file))(&er))?;
                funcs.insert(e.to_string(), f);
            }
        }
        let name = ctx.name().map_err(|e| fail(format!("naming GPU {ordinal}"))(&e))?;
        let memory_bytes = ctx.total_mem().map_err(|e| fail(format!("sizing GPU {ordinal}'s memory"))(&e))? as u64;
        let sigs = signatures().map_err(|cause| CudaError { what: "reading the kernels' signatures".into(), cause })?;
        Ok(Gpu { ctx, streams, blas, funcs, sigs, name, memory_bytes })
    }

    /// Another rank's view of this GPU (the multi-rank driver's): the same context, memory
    /// and loaded kernels, its own four streams and cuBLAS handle.
    pub fn sibling(&self) -> Res<Gpu> {
        let mk = || self.ctx.new_stream().map_err(|e| fail(format!("creating a stream on {}", self.name))(&e));
        let streams = [mk()?, mk()?, mk()?, mk()?];
        let blas = CudaBlas::new(streams[Stream::Compute.index()].clone())
            .map_err(|e| fail("starting cuBLAS for another rank")(&e))?;
        Ok(Gpu {
            ctx: self.ctx.clone(),
            streams,
            blas,
            funcs: self.funcs.clone(),
            sigs: self.sigs.clone(),
            name: self.name.clone(),
            memory_bytes: self.memory_bytes,
        })
    }

    pub fn stream(&self, s: Stream) -> &Arc<CudaStream> {
        &self.streams[s.index()]
    }
}

/// What the executor asks of a GPU: launches, GEMMs, copies, events and its memory. The
/// GPU itself ([`Gpu`]) implements it; so does a host stand-in in the tests
/// (`exec::host`), which checks every launch and every address without a GPU.
pub trait Device {
    type Event;
    type Mem: DeviceMemory<Block = Block>;
    /// The memory the caching pool draws from.
    fn memory(&self) -> Self::Mem;
    fn name(&self) -> &str;
    fn memory_bytes(&self) -> u64;
    /// Bytes the device has free now (the context and other processes already taken).
    fn free_bytes(&self) -> Res<u64>;
    /// Launches kernel `name` on stream `s`.
    fn launch(&self, s: Stream, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Res<()>;
    /// Row-major C (m×n) = op(A)·op(B) + β·C on the compute stream (see [`Gpu`]'s).
    #[allow(clippy::too_many_arguments)]
    fn gemm(&self, m: usize, nn: usize, k: usize, a: Op, b: Op, c: Ptr, c_dt: Dt, beta: f32) -> Res<()>;
    fn copy(&self, s: Stream, dst: Ptr, src: Ptr, bytes: usize) -> Res<()>;
    fn zero(&self, s: Stream, dst: Ptr, bytes: usize) -> Res<()>;
    fn upload<T: Copy>(&self, dst: Ptr, src: &[T]) -> Res<()>;
    fn download<T: Copy>(&self, s: Stream, dst: &mut [T], src: Ptr) -> Res<()>;
    fn event(&self, timing: bool) -> Res<Self::Event>;
    fn record(&self, e: &Self::Event, s: Stream) -> Res<()>;
    fn wait(&self, s: Stream, e: &Self::Event) -> Res<()>;
    fn elapsed_ms(&self, from: &Self::Event, to: &Self::Event) -> Res<f32>;
    fn sync_all(&self) -> Res<()>;
    /// Whether every plan stream has finished its work, without waiting (the NCCL
    /// driver's watchdog polls it).
    fn idle(&self) -> Res<bool>;
}

impl Device for Gpu {
    type Event = CudaEvent;
    type Mem = CudaMemory;

    fn memory(&self) -> CudaMemory {
        CudaMemory { ctx: self.ctx.clone() }
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    fn elapsed_ms(&self, from: &CudaEvent, to: &CudaEvent) -> Res<f32> {
        from.elapsed_ms(to).map_err(|e| fail("reading the time between two events")(&e))
    }

    /// Bytes the device has free now (the context and other processes already taken).
    fn free_bytes(&self) -> Res<u64> {
        let (free, _) = self.ctx.mem_get_info().map_err(|e| fail("asking the GPU for its free memory")(&e))?;
        Ok(free as u64)
    }

    /// Launches kernel `name` on stream `s`.
    fn launch(&self, s: Stream, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Res<()> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError { what: format!("finding kernel {name}"), cause: "not loaded".into() })?;
        check_args(name, args, self.sigs.get(name).map(Vec::as_slice))
            .map_err(|cause| CudaError { what: format!("launching {name}"), cause })?;
        let stream = self.stream(s);
        let mut b = stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(p) => b.arg(p),
                Arg::I(i) => b.arg(i),
                Arg::L(l) => b.arg(l),
                Arg::F(x) => b.arg(x),
            };
        }
        // SAFETY: every caller passes the kernel's parameters in order (the signatures in
        // `kernels/*.cu`), with device pointers into pool blocks of the sizes the kernel's
        // indexing reaches for the given sizes (carved by the piece functions).
        unsafe { b.launch(cfg) }.map_err(|e| fail(format!("launching {name}"))(&e))?;
        Ok(())
    }

    /// Row-major C (m×n) = α·op(A)·op(B) + β·C on the compute stream, bf16 inputs, fp32
    /// accumulation, C in `c_dt`. A is (m×k) as stored, or (k×m) when transposed; B is
    /// (k×n), or (n×k) when transposed. cuBLAS is column-major, so it computes Cᵀ = op(B)ᵀ·op(A)ᵀ.
    #[allow(clippy::too_many_arguments)]
    fn gemm(&self, m: usize, nn: usize, k: usize, a: Op, b: Op, c: Ptr, c_dt: Dt, beta: f32) -> Res<()> {
        let op = |tr: bool| if tr { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
        let lda = if a.t { m } else { k };
        let ldb = if b.t { k } else { nn };
        let alpha = 1.0f32;
        // SAFETY: A, B and C are device buffers of m·k, k·n and m·n elements of their types
        // (the callers carve them so), which is what these sizes and leading dimensions
        // address; the scalars are fp32 as the 32F compute type requires.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op(b.t),
                op(a.t),
                nn as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                b.ptr as *const c_void,
                Dt::Bf16.cuda(),
                ldb as i32,
                a.ptr as *const c_void,
                Dt::Bf16.cuda(),
                lda as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                c_dt.cuda(),
                nn as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| fail(format!("running a {m}×{nn}×{k} GEMM"))(&e))
    }

    /// Copies `bytes` from `src` to `dst` on stream `s`.
    fn copy(&self, s: Stream, dst: Ptr, src: Ptr, bytes: usize) -> Res<()> {
        // SAFETY: both are device addresses of blocks of at least `bytes` (the callers').
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream(s).cu_stream()) }
            .map_err(|e| fail("copying on the GPU")(&e))
    }

    /// Zeroes `bytes` at `dst` on stream `s`.
    fn zero(&self, s: Stream, dst: Ptr, bytes: usize) -> Res<()> {
        // SAFETY: as for `copy`.
        unsafe { cudarc::driver::result::memset_d8_async(dst, 0, bytes, self.stream(s).cu_stream()) }
            .map_err(|e| fail("zeroing GPU memory")(&e))
    }

    /// Copies host data to `dst` and waits for the copy (the host data may go after).
    fn upload<T: Copy>(&self, dst: Ptr, src: &[T]) -> Res<()> {
        let s = self.stream(Stream::Compute);
        // SAFETY: `dst` is a device block of at least size_of_val(src) bytes; the copy is
        // finished before `src` can be dropped (synchronize below).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, s.cu_stream()) }
            .map_err(|e| fail("copying to the GPU")(&e))?;
        s.synchronize().map_err(|e| fail("waiting for a copy to the GPU")(&e))
    }

    /// Copies `dst.len()` elements from `src` back to the host, after stream `s`'s work.
    fn download<T: Copy>(&self, s: Stream, dst: &mut [T], src: Ptr) -> Res<()> {
        let st = self.stream(s);
        // SAFETY: `src` is a device block of at least size_of_val(dst) bytes; the host buffer
        // outlives the copy (synchronize below).
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, st.cu_stream()) }
            .map_err(|e| fail("copying from the GPU")(&e))?;
        st.synchronize().map_err(|e| fail("waiting for a copy from the GPU")(&e))
    }

    /// An event (timing enabled when `timing`).
    fn event(&self, timing: bool) -> Res<CudaEvent> {
        let flags = if timing {
            cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        self.ctx.new_event(Some(flags)).map_err(|e| fail("creating a CUDA event")(&e))
    }

    fn record(&self, e: &CudaEvent, s: Stream) -> Res<()> {
        e.record(self.stream(s)).map_err(|er| fail(format!("recording an event on stream {}", s.key()))(&er))
    }

    fn wait(&self, s: Stream, e: &CudaEvent) -> Res<()> {
        self.stream(s).wait(e).map_err(|er| fail(format!("making stream {} wait on an event", s.key()))(&er))
    }

    fn sync_all(&self) -> Res<()> {
        for s in Stream::ALL {
            self.stream(s).synchronize().map_err(|e| fail(format!("finishing stream {}", s.key()))(&e))?;
        }
        Ok(())
    }

    fn idle(&self) -> Res<bool> {
        use cudarc::driver::sys::{CUresult, cuStreamQuery};
        for s in Stream::ALL {
            // SAFETY: the stream is alive (this GPU holds it).
            match unsafe { cuStreamQuery(self.stream(s).cu_stream()) } {
                CUresult::CUDA_SUCCESS => {}
                CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                e => {
                    let e = cudarc::driver::DriverError(e);
                    return Err(fail(format!("querying stream {}", s.key()))(&e));
                }
            }
        }
        Ok(true)
    }
}

/// The device memory behind the caching pool: plain `cuMemAlloc` blocks, valid on every
/// stream at once (a stream-ordered allocation on one stream would not be, for the other
/// plan streams that use it), given back with `cuMemFree` when the pool releases its cache.
pub struct CudaMemory {
    pub ctx: Arc<CudaContext>,
}

/// A reserved device block: its address and size.
#[derive(Debug)]
pub struct Block {
    pub ptr: Ptr,
    pub bytes: u64,
}

impl DeviceMemory for CudaMemory {
    type Block = Block;
    fn reserve(&mut self, bytes: u64) -> Result<Block, String> {
        self.ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
        // SAFETY: a plain allocation of `bytes`; the block is uninitialised and every user
        // writes before it reads (the pieces zero the accumulators they add into).
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes as usize) }.map_err(|e| format!("{e:?}"))?;
        Ok(Block { ptr, bytes })
    }
    fn release(&mut self, block: Block) {
        // SAFETY: the block came from `reserve` and no user holds it (it sat in the cache);
        // cuMemFree waits for the device's work, so no enqueued kernel still reads it.
        let _ = unsafe { cudarc::driver::result::free_sync(block.ptr) };
    }
}

/// A launch's arguments against the kernel's parameters (`kernels::signatures`): the count
/// and each one's kind, so that a wrong list is an error naming the kernel, not a fault.
pub fn check_args(name: &str, args: &[Arg], sig: Option<&[Param]>) -> Result<(), String> {
    let sig = sig.ok_or_else(|| format!("kernel {name} has no signature in the sources"))?;
    if sig.len() != args.len() {
        return Err(format!("{} arguments for {name}, which takes {}", args.len(), sig.len()));
    }
    for (i, (a, p)) in args.iter().zip(sig).enumerate() {
        let ok = matches!(
            (a, p),
            (Arg::P(_), Param::Ptr) | (Arg::I(_), Param::I32) | (Arg::L(_), Param::I64) | (Arg::F(_), Param::F32)
        );
        if !ok {
            return Err(format!("argument {i} of {name} is {a:?}, the kernel takes {p:?}"));
        }
    }
    Ok(())
}

/// A launch of one thread per element, in blocks of 256 (grid-stride kernels).
pub fn blocks(n: usize) -> LaunchConfig {
    let grid = n.div_ceil(256).clamp(1, 8192) as u32;
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The column reductions' launch (`col_sum`, `*_bwd_params`): a block of 1,024 threads per
/// 32 columns (32 columns × 32 row lanes, combined in a fixed order).
pub fn per_cols(cols: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (cols.div_ceil(32).max(1) as u32, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 }
}

/// One block of 256 threads per row.
pub fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_map_to_the_kernels_targets() {
        assert_eq!(arch_of((9, 0)), Some("sm_90"));
        assert_eq!(arch_of((8, 0)), Some("sm_80"));
        assert_eq!(arch_of((7, 0)), None, "NVRTC 13 has no Volta");
    }

    #[test]
    fn launch_arguments_are_checked_against_the_kernels_signature() {
        let sigs = signatures().unwrap();
        let sig = sigs.get("add_bf16").map(Vec::as_slice);
        assert_eq!(check_args("add_bf16", &[Arg::P(1), Arg::P(2), Arg::L(3)], sig), Ok(()));
        let e = check_args("add_bf16", &[Arg::P(1), Arg::P(2), Arg::I(3)], sig).unwrap_err();
        assert!(e.contains("argument 2 of add_bf16"), "{e}");
        let e = check_args("add_bf16", &[Arg::P(1), Arg::P(2)], sig).unwrap_err();
        assert!(e.contains("2 arguments for add_bf16, which takes 3"), "{e}");
        assert!(check_args("nope", &[], None).unwrap_err().contains("no signature"));
    }
}
