//! What `strata calibrate --backend cuda` times on a GPU beside cuBLAS's GEMMs: HBM (a
//! device-to-device copy, and the model's element-wise `add_bf16` kernel) and the model's
//! fused causal attention kernels the executor runs at each head size (forward; backward =
//! delta + dq + dk/dv: the tensor-core kernels at head_dim 64 and 128, else the scalar
//! ones — `kernels::attn_kernels`) at given shapes. Each is one warm-up launch,
//! then `reps` launches between two CUDA events; inputs are seeded random bf16 values.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use half::bf16;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::kernels::{ATTN_DELTA, SOURCES, attn_kernels, compile};
use super::{CudaError, fail, require_driver};

/// Memory rates, bytes read + written per second / 1e9.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryRates {
    pub bytes: u64,
    /// `cuMemcpyDtoDAsync` of `bytes`: 2 · bytes moved per copy.
    pub copy_gb_per_s: f64,
    /// `add_bf16` (y += x) over bytes / 2 elements: 3 · bytes moved per launch; `None`
    /// when it was not timed (no architecture to compile it for: NVRTC absent).
    pub elementwise_gb_per_s: Option<f64>,
}

/// The causal attention kernels timed at one shape (batch, seq, heads = kv heads, head_dim).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttentionTiming {
    pub batch: u64,
    pub seq: u64,
    pub heads: u64,
    pub head_dim: u64,
    pub fwd_s: f64,
    pub bwd_s: f64,
}

impl AttentionTiming {
    /// The kernel benchmarks' convention: 4·B·h·s²·d forward, 2.5× backward, halved (causal).
    pub fn credited_tflops(&self) -> (f64, f64) {
        let fwd = 4.0 * (self.batch * self.heads) as f64 * (self.seq * self.seq) as f64 * self.head_dim as f64 * 0.5;
        (fwd / self.fwd_s / 1e12, 2.5 * fwd / self.bwd_s / 1e12)
    }
}

/// The PTX architecture of a compute capability (`sm_90` for 9.0), one NVRTC accepts.
pub fn arch_of(cc: (u32, u32)) -> Result<&'static str, CudaError> {
    let want = format!("sm_{}{}", cc.0, cc.1);
    super::kernels::ARCHES.iter().copied().find(|a| *a == want).ok_or_else(|| CudaError {
        what: format!("compiling the model's kernels for compute capability {}.{}", cc.0, cc.1),
        cause: format!("{want} is not one of {:?}", super::kernels::ARCHES),
    })
}

struct Gpu {
    stream: Arc<CudaStream>,
    rng: ChaCha8Rng,
}

impl Gpu {
    fn open(ordinal: usize) -> Result<(Arc<CudaContext>, Gpu), CudaError> {
        require_driver()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| fail(format!("opening GPU {ordinal}"))(&e))?;
        let stream = ctx.default_stream();
        Ok((ctx, Gpu { stream, rng: ChaCha8Rng::seed_from_u64(0x5eed) }))
    }

    fn random(&mut self, n: usize) -> Result<CudaSlice<bf16>, CudaError> {
        let host: Vec<bf16> = (0..n).map(|_| bf16::from_f32(self.rng.random_range(-1.0..1.0))).collect();
        self.stream.clone_htod(&host).map_err(|e| fail(format!("copying {n} inputs to the GPU"))(&e))
    }

    /// Seconds per call of `f`: one warm-up, then `reps` between two events.
    fn time(&self, what: &str, reps: u32, f: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        f()?;
        let event = || {
            self.stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| fail(format!("timing {what}"))(&e))
        };
        let reps = reps.max(1);
        let start = event()?;
        for _ in 0..reps {
            f()?;
        }
        let end = event()?;
        let ms = start.elapsed_ms(&end).map_err(|e| fail(format!("timing {what}"))(&e))?;
        Ok(f64::from(ms) / 1e3 / f64::from(reps))
    }
}

fn function(ctx: &Arc<CudaContext>, file: &str, name: &str, arch: &'static str) -> Result<CudaFunction, CudaError> {
    module(ctx, file, arch)?.load_function(name).map_err(|e| fail(format!("loading kernel {name}"))(&e))
}

fn module(ctx: &Arc<CudaContext>, file: &str, arch: &'static str) -> Result<Arc<CudaModule>, CudaError> {
    let s = SOURCES
        .iter()
        .find(|s| s.file == file)
        .ok_or_else(|| CudaError { what: format!("finding {file}"), cause: "not among the kernel sources".into() })?;
    ctx.load_module(compile(s, arch)?).map_err(|e| fail(format!("loading {file}"))(&e))
}

/// HBM on GPU `ordinal`: a copy of `bytes`, and with an `arch` to compile it for, the
/// element-wise add over as many bytes.
pub fn time_memory(
    ordinal: usize,
    arch: Option<&'static str>,
    bytes: u64,
    reps: u32,
) -> Result<MemoryRates, CudaError> {
    let (ctx, mut g) = Gpu::open(ordinal)?;
    let n = (bytes / 2) as usize;
    let src = g.random(n)?;
    let mut dst = g.random(n)?;
    let copy_s = g.time("a device-to-device copy", reps, &mut || {
        g.stream.memcpy_dtod(&src, &mut dst).map_err(|e| fail("copying on the GPU")(&e))
    })?;
    let b = (2 * n) as f64;
    let Some(arch) = arch else {
        return Ok(MemoryRates { bytes: b as u64, copy_gb_per_s: 2.0 * b / copy_s / 1e9, elementwise_gb_per_s: None });
    };
    let add = function(&ctx, "elementwise.cu", "add_bf16", arch)?;
    let nn = n as i64;
    let grid = n.div_ceil(256).clamp(1, 8192) as u32;
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let add_s = g.time("add_bf16", reps, &mut || {
        let mut l = g.stream.launch_builder(&add);
        l.arg(&mut dst).arg(&src).arg(&nn);
        // SAFETY: add_bf16(y, x, n) reads x[0..n) and updates y[0..n); both hold n elements.
        unsafe { l.launch(cfg) }.map(|_| ()).map_err(|e| fail("launching add_bf16")(&e))
    })?;
    Ok(MemoryRates {
        bytes: b as u64,
        copy_gb_per_s: 2.0 * b / copy_s / 1e9,
        elementwise_gb_per_s: Some(3.0 * b / add_s / 1e9),
    })
}

/// The causal attention kernels at each (batch, seq, heads, head_dim) on GPU `ordinal`.
pub fn time_attention_bf16(
    ordinal: usize,
    arch: &'static str,
    shapes: &[(u64, u64, u64, u64)],
    reps: u32,
) -> Result<Vec<AttentionTiming>, CudaError> {
    let (ctx, mut g) = Gpu::open(ordinal)?;
    let mut out = Vec::new();
    // Each file compiled and loaded once.
    let mut modules: std::collections::BTreeMap<&'static str, Arc<CudaModule>> = Default::default();
    let mut f = |file: &'static str, name: &str| -> Result<CudaFunction, CudaError> {
        if !modules.contains_key(file) {
            modules.insert(file, module(&ctx, file, arch)?);
        }
        modules[file].load_function(name).map_err(|e| fail(format!("loading kernel {name}"))(&e))
    };
    for &(batch, seq, heads, d) in shapes {
        // The kernels the executor runs at this head size (tensor-core ones at 64 and 128).
        let ak = attn_kernels(d as usize);
        let (fwd, dq_k, dkdv_k) = (f(ak.file, ak.fwd)?, f(ak.file, ak.dq)?, f(ak.file, ak.dkdv)?);
        let delta = f(ATTN_DELTA.file, ATTN_DELTA.delta)?;
        if d == 0 || d > 256 || seq == 0 || batch == 0 || heads == 0 {
            return Err(CudaError {
                what: format!("timing attention at batch {batch}, seq {seq}, {heads} heads of {d}"),
                cause: "the kernels take 1 ≤ head_dim ≤ 256 and non-empty shapes".into(),
            });
        }
        let t = (batch * seq * heads * d) as usize;
        let rows = (batch * heads * seq) as usize;
        let (q, k, v, dout) = (g.random(t)?, g.random(t)?, g.random(t)?, g.random(t)?);
        let (mut o, mut dq, mut dk, mut dv) = (g.random(t)?, g.random(t)?, g.random(t)?, g.random(t)?);
        let alloc = |n: usize| g.stream.alloc_zeros::<f32>(n).map_err(|e| fail("allocating attention rows")(&e));
        let (mut lse, mut dl) = (alloc(rows)?, alloc(rows)?);
        let (bi, si, hi, di) = (batch as i32, seq as i32, heads as i32, d as i32);
        let stride = (heads * d) as i64;
        let scale = 1.0 / (d as f32).sqrt();
        let (seq_n, heads_n, batch_n) = (seq as usize, heads as usize, batch as usize);
        let cfg = ak.grid(seq_n, heads_n, batch_n);
        let delta_cfg = ATTN_DELTA.grid(seq_n, heads_n, batch_n);
        let shape = format!("attention b{batch} s{seq} h{heads} d{d}");
        let launched = |r: Result<(), cudarc::driver::DriverError>, name: &str| {
            r.map_err(|e| fail(format!("launching {name} for {shape}"))(&e))
        };
        let stream = g.stream.clone();
        // SAFETY (every launch below): the arguments are each kernel's parameters in the order
        // runtime/src/cuda/check.rs passes them; q, k, v, o, dout, dq, dk, dv hold
        // batch·seq·heads·d elements with token stride heads·d (hq = hkv = heads), lse and
        // delta batch·heads·seq, which is what the kernels index for these sizes.
        let fwd_s = g.time(&shape, reps, &mut || {
            let mut b = stream.launch_builder(&fwd);
            b.arg(&q).arg(&k).arg(&v).arg(&mut o).arg(&mut lse);
            b.arg(&bi).arg(&si).arg(&hi).arg(&hi).arg(&di).arg(&stride).arg(&stride).arg(&stride).arg(&scale);
            launched(unsafe { b.launch(cfg) }.map(|_| ()), ak.fwd)
        })?;
        let bwd_s = g.time(&shape, reps, &mut || {
            let mut b = stream.launch_builder(&delta);
            b.arg(&o).arg(&dout).arg(&mut dl).arg(&bi).arg(&si).arg(&hi).arg(&di).arg(&stride);
            launched(unsafe { b.launch(delta_cfg) }.map(|_| ()), ATTN_DELTA.delta)?;
            let mut b = stream.launch_builder(&dq_k);
            b.arg(&q).arg(&k).arg(&v).arg(&dout).arg(&lse).arg(&dl).arg(&mut dq);
            b.arg(&bi).arg(&si).arg(&hi).arg(&hi).arg(&di).arg(&stride).arg(&stride).arg(&stride).arg(&stride);
            b.arg(&scale);
            launched(unsafe { b.launch(cfg) }.map(|_| ()), ak.dq)?;
            let mut b = stream.launch_builder(&dkdv_k);
            b.arg(&q).arg(&k).arg(&v).arg(&dout).arg(&lse).arg(&dl).arg(&mut dk).arg(&mut dv);
            b.arg(&bi).arg(&si).arg(&hi).arg(&hi).arg(&di).arg(&stride).arg(&stride).arg(&stride).arg(&stride);
            b.arg(&scale);
            launched(unsafe { b.launch(cfg) }.map(|_| ()), ak.dkdv)
        })?;
        out.push(AttentionTiming { batch, seq, heads, head_dim: d, fwd_s, bwd_s });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credited_rates_follow_the_benchmarks_convention() {
        // 16k tokens, 16 heads of 128 at s = 2048: 4·128·2048²·128·0.5 FLOPs forward.
        let t = AttentionTiming { batch: 8, seq: 2048, heads: 16, head_dim: 128, fwd_s: 1e-3, bwd_s: 2.5e-3 };
        let (f, b) = t.credited_tflops();
        let fwd = 4.0 * 128.0 * 2048.0 * 2048.0 * 128.0 * 0.5;
        assert!((f - fwd / 1e-3 / 1e12).abs() < 1e-9 && (b - f).abs() < 1e-9, "{f} {b}");
    }

    #[test]
    fn architectures_come_from_the_compute_capability() {
        assert_eq!(arch_of((9, 0)).unwrap(), "sm_90");
        assert_eq!(arch_of((10, 0)).unwrap(), "sm_100");
        assert!(arch_of((7, 0)).unwrap_err().to_string().contains("sm_70"));
    }

    #[test]
    fn without_a_driver_timing_is_an_error() {
        // SAFETY: only tries to open the library.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            return;
        }
        assert!(time_memory(0, Some("sm_90"), 1 << 20, 1).is_err());
        assert!(time_attention_bf16(0, "sm_90", &[(1, 128, 1, 64)], 1).is_err());
    }
}
