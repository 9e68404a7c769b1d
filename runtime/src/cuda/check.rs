//! Every kernel against its CPU reference (`reference.rs`), on a GPU: fresh random inputs
//! from a seed, outputs poisoned with NaN before each launch (accumulators start from random
//! values instead, and the reference adds to them), then ‖out − ref‖ / ‖ref‖ within the
//! bound of the storage type — fp32 ≤ 1e-5, bf16 ≤ 1e-2; a NaN never passes. The reference
//! reads the inputs exactly as the GPU does (rounded to bf16 where stored in bf16).

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::exec::device::per_cols;
use super::kernels::{SOURCES, compile};
use super::reference as r;
use super::{CudaError, fail, require_driver};

/// One kernel's verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelCheck {
    /// The entry point, e.g. `attn_fwd_bf16`.
    pub kernel: String,
    pub dtype: &'static str,
    pub shape: String,
    /// ‖out − ref‖₂ / ‖ref‖₂ over the outputs the kernel writes (the worst of them).
    pub rel_error: f64,
    pub bound: f64,
    pub passed: bool,
}

/// A storage type of the kernels: fp32, or bf16 kept as its bits.
trait Store: DeviceRepr + Copy + Default + Unpin {
    const SUFFIX: &'static str;
    const BOUND: f64;
    /// The bound of fp32 outputs computed from inputs in this storage (accumulators,
    /// statistics): the inputs' rounding is shared with the reference, so only the fp32
    /// sums differ — fp32's bound, or a tenth of the storage's where that is looser.
    const ACC_BOUND: f64;
    const NAN: Self;
    fn enc(x: f64) -> Self;
    fn dec(self) -> f64;
}

impl Store for f32 {
    const SUFFIX: &'static str = "f32";
    const BOUND: f64 = 1e-5;
    const ACC_BOUND: f64 = 1e-5;
    const NAN: f32 = f32::NAN;
    fn enc(x: f64) -> f32 {
        x as f32
    }
    fn dec(self) -> f64 {
        self as f64
    }
}

impl Store for u16 {
    const SUFFIX: &'static str = "bf16";
    const BOUND: f64 = 1e-2;
    const ACC_BOUND: f64 = 1e-3;
    const NAN: u16 = 0x7fc0;
    fn enc(x: f64) -> u16 {
        // Through f32: half 2.7's `bf16::from_f64` drops the f64's low 32 bits before it
        // rounds, so an f32 just above a tie (low half 0x8001..0x8007) rounds down. Its
        // `from_f32` rounds to nearest even, as the kernels' `f32_to_bf16` does — the H200's
        // first kernel check found 0x8001..0x8007 values off by one ulp the other way.
        half::bf16::from_f32(x as f32).to_bits()
    }
    fn dec(self) -> f64 {
        half::bf16::from_bits(self).to_f64()
    }
}

/// The loaded kernels and a stream to run them on.
struct Gpu {
    stream: Arc<CudaStream>,
    funcs: BTreeMap<String, CudaFunction>,
    rng: ChaCha8Rng,
    out: Vec<KernelCheck>,
}

type Res<T> = Result<T, CudaError>;

impl Gpu {
    fn f(&self, name: &str) -> Res<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| CudaError { what: format!("finding kernel {name}"), cause: "not loaded".into() })
    }
    fn random(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.rng.random_range(-1.0..1.0)).collect()
    }
    /// Uploads x in storage S; returns the device copy and the values as the GPU sees them.
    fn up<S: Store>(&self, x: &[f64]) -> Res<(CudaSlice<S>, Vec<f64>)> {
        let enc: Vec<S> = x.iter().map(|&v| S::enc(v)).collect();
        let seen = enc.iter().map(|v| v.dec()).collect();
        Ok((self.stream.clone_htod(&enc).map_err(|e| fail("copying inputs to the GPU")(&e))?, seen))
    }
    fn fresh<S: Store>(&mut self, n: usize) -> Res<(CudaSlice<S>, Vec<f64>)> {
        let x = self.random(n);
        self.up::<S>(&x)
    }
    fn up_f32(&self, x: &[f64]) -> Res<CudaSlice<f32>> {
        Ok(self.up::<f32>(x)?.0)
    }
    fn up_u32(&self, x: &[u32]) -> Res<CudaSlice<u32>> {
        self.stream.clone_htod(x).map_err(|e| fail("copying tokens to the GPU")(&e))
    }
    fn poisoned<S: Store>(&self, n: usize) -> Res<CudaSlice<S>> {
        self.stream.clone_htod(&vec![S::NAN; n]).map_err(|e| fail("allocating outputs")(&e))
    }
    fn poisoned_f64(&self, n: usize) -> Res<CudaSlice<f64>> {
        self.stream.clone_htod(&vec![f64::NAN; n]).map_err(|e| fail("allocating outputs")(&e))
    }
    fn down<S: Store>(&self, x: &CudaSlice<S>) -> Res<Vec<f64>> {
        let h = self.stream.clone_dtoh(x).map_err(|e| fail("copying outputs back")(&e))?;
        Ok(h.into_iter().map(|v| v.dec()).collect())
    }
    fn record(&mut self, kernel: String, dtype: &'static str, shape: String, errs: &[f64], bound: f64) {
        let rel_error = errs.iter().cloned().fold(0.0, f64::max);
        self.out.push(KernelCheck { kernel, dtype, shape, rel_error, bound, passed: rel_error <= bound });
    }
}

fn blocks(n: usize) -> LaunchConfig {
    let grid = n.div_ceil(256).clamp(1, 8192) as u32;
    LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

macro_rules! launch {
    ($gpu:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let name: String = $name;
        let f = $gpu.f(&name)?;
        let mut b = $gpu.stream.launch_builder(f);
        $(b.arg($arg);)*
        // SAFETY: the arguments are the kernel's parameters in order, with device buffers of
        // the sizes its indexing reaches for the given sizes (checked by the references'
        // identical shapes).
        unsafe { b.launch($cfg) }.map_err(|e| $crate::cuda::fail(format!("launching {name}"))(&e))?;
    }};
}

fn norms<S: Store>(g: &mut Gpu) -> Res<()> {
    let (rows, cols, eps) = (64usize, 1000usize, 1e-5f32);
    let (x, xs) = g.fresh::<S>(rows * cols)?;
    let (gam, gs) = g.fresh::<S>(cols)?;
    let (bet, bs) = g.fresh::<S>(cols)?;
    let (dy, dys) = g.fresh::<S>(rows * cols)?;
    let (ri, ci) = (rows as i32, cols as i32);
    let shape = format!("{rows}×{cols}");
    for rms in [false, true] {
        let name = if rms { "rmsnorm" } else { "layernorm" };
        let (y_ref, mean_ref, rstd_ref) = r::norm_fwd(&xs, &gs, (!rms).then_some(&bs[..]), eps as f64, rms);
        let mut y = g.poisoned::<S>(rows * cols)?;
        let mut mean = g.poisoned::<f32>(rows)?;
        let mut rstd = g.poisoned::<f32>(rows)?;
        if rms {
            launch!(
                g,
                format!("rmsnorm_fwd_{}", S::SUFFIX),
                per_row(rows),
                &x,
                &gam,
                &mut y,
                &mut rstd,
                &ri,
                &ci,
                &eps
            );
        } else {
            launch!(
                g,
                format!("layernorm_fwd_{}", S::SUFFIX),
                per_row(rows),
                &x,
                &gam,
                &bet,
                &mut y,
                &mut mean,
                &mut rstd,
                &ri,
                &ci,
                &eps
            );
        }
        let mut errs = vec![r::rel_error(&g.down(&y)?, &y_ref), r::rel_error(&g.down(&rstd)?, &rstd_ref)];
        if !rms {
            errs.push(r::rel_error(&g.down(&mean)?, &mean_ref));
        }
        g.record(format!("{name}_fwd_{}", S::SUFFIX), S::SUFFIX, shape.clone(), &errs, S::BOUND);
        // Backward from the reference's statistics.
        let (dx_ref, dg_ref, db_ref) = r::norm_bwd(&dys, &xs, &gs, eps as f64, rms);
        let mean_d = g.up_f32(&mean_ref)?;
        let rstd_d = g.up_f32(&rstd_ref)?;
        let mut dx = g.poisoned::<S>(rows * cols)?;
        if rms {
            launch!(
                g,
                format!("rmsnorm_bwd_dx_{}", S::SUFFIX),
                per_row(rows),
                &dy,
                &x,
                &gam,
                &rstd_d,
                &mut dx,
                &ri,
                &ci
            );
        } else {
            launch!(
                g,
                format!("layernorm_bwd_dx_{}", S::SUFFIX),
                per_row(rows),
                &dy,
                &x,
                &gam,
                &mean_d,
                &rstd_d,
                &mut dx,
                &ri,
                &ci
            );
        }
        let e = r::rel_error(&g.down(&dx)?, &dx_ref);
        g.record(format!("{name}_bwd_dx_{}", S::SUFFIX), S::SUFFIX, shape.clone(), &[e], S::BOUND);
        // Parameter gradients accumulate: start from random values.
        let (g0, b0) = (g.random(cols), g.random(cols));
        let mut dg = g.up_f32(&g0)?;
        let mut db = g.up_f32(&b0)?;
        if rms {
            launch!(
                g,
                format!("rmsnorm_bwd_params_{}", S::SUFFIX),
                per_cols(cols),
                &dy,
                &x,
                &rstd_d,
                &mut dg,
                &ri,
                &ci
            );
        } else {
            launch!(
                g,
                format!("layernorm_bwd_params_{}", S::SUFFIX),
                per_cols(cols),
                &dy,
                &x,
                &mean_d,
                &rstd_d,
                &mut dg,
                &mut db,
                &ri,
                &ci
            );
        }
        let plus = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x + y).collect::<Vec<f64>>();
        let mut errs = vec![r::rel_error(&g.down(&dg)?, &plus(&g0, &dg_ref))];
        if !rms {
            errs.push(r::rel_error(&g.down(&db)?, &plus(&b0, &db_ref)));
        }
        g.record(format!("{name}_bwd_params_{}", S::SUFFIX), S::SUFFIX, shape.clone(), &errs, S::ACC_BOUND);
    }
    Ok(())
}

fn activations<S: Store>(g: &mut Gpu) -> Res<()> {
    let n = 1 << 16;
    let (x, xs) = g.fresh::<S>(n)?;
    let (dy, dys) = g.fresh::<S>(n)?;
    let nn = n as i64;
    let mut y = g.poisoned::<S>(n)?;
    launch!(g, format!("gelu_fwd_{}", S::SUFFIX), blocks(n), &x, &mut y, &nn);
    let e = r::rel_error(&g.down(&y)?, &r::gelu_fwd(&xs));
    g.record(format!("gelu_fwd_{}", S::SUFFIX), S::SUFFIX, format!("{n}"), &[e], S::BOUND);
    let mut dx = g.poisoned::<S>(n)?;
    launch!(g, format!("gelu_bwd_{}", S::SUFFIX), blocks(n), &x, &dy, &mut dx, &nn);
    let e = r::rel_error(&g.down(&dx)?, &r::gelu_bwd(&xs, &dys));
    g.record(format!("gelu_bwd_{}", S::SUFFIX), S::SUFFIX, format!("{n}"), &[e], S::BOUND);
    // SwiGLU over (rows, 2f).
    let (rows, f) = (128usize, 512usize);
    let (gu, gus) = g.fresh::<S>(rows * 2 * f)?;
    let (dyy, dyys) = g.fresh::<S>(rows * f)?;
    let (rr, fi) = (rows as i64, f as i32);
    let mut y = g.poisoned::<S>(rows * f)?;
    launch!(g, format!("swiglu_fwd_{}", S::SUFFIX), blocks(rows * f), &gu, &mut y, &rr, &fi);
    let e = r::rel_error(&g.down(&y)?, &r::swiglu_fwd(&gus, f));
    g.record(format!("swiglu_fwd_{}", S::SUFFIX), S::SUFFIX, format!("{rows}×2·{f}"), &[e], S::BOUND);
    let mut dgu = g.poisoned::<S>(rows * 2 * f)?;
    launch!(g, format!("swiglu_bwd_{}", S::SUFFIX), blocks(rows * f), &gu, &dyy, &mut dgu, &rr, &fi);
    let e = r::rel_error(&g.down(&dgu)?, &r::swiglu_bwd(&gus, &dyys, f));
    g.record(format!("swiglu_bwd_{}", S::SUFFIX), S::SUFFIX, format!("{rows}×2·{f}"), &[e], S::BOUND);
    Ok(())
}

fn rope<S: Store>(g: &mut Gpu) -> Res<()> {
    let (seq, heads, d, batch, base) = (512usize, 4usize, 128usize, 2usize, 500_000f32);
    let tokens = batch * seq;
    let (mut x, xs) = g.fresh::<S>(tokens * heads * d)?;
    let mut want = xs.clone();
    r::rope(&mut want, seq, heads, d, base as f64, 1.0);
    let (ti, si, hi, di, stride, sign) = (tokens as i32, seq as i32, heads as i32, d as i32, (heads * d) as i64, 1f32);
    launch!(
        g,
        format!("rope_{}", S::SUFFIX),
        blocks(tokens * heads * d / 2),
        &mut x,
        &ti,
        &si,
        &hi,
        &di,
        &stride,
        &base,
        &sign
    );
    let e = r::rel_error(&g.down(&x)?, &want);
    g.record(format!("rope_{}", S::SUFFIX), S::SUFFIX, format!("{tokens}×{heads}×{d}, base {base}"), &[e], S::BOUND);
    Ok(())
}

fn attention<S: Store>(g: &mut Gpu) -> Res<()> {
    let a = r::Attn { batch: 2, seq: 200, hq: 8, hkv: 2, d: 64 };
    let suffix = S::SUFFIX;
    let names = [format!("attn_fwd_{suffix}"), format!("attn_bwd_dq_{suffix}"), format!("attn_bwd_dkdv_{suffix}")];
    attention_with::<S>(g, a, names, (8, 256))
}

/// The tensor-core kernels (bf16; head_dim 64 and 128), at sequence lengths that leave a
/// partial block and with grouped kv heads.
fn attention_tc(g: &mut Gpu) -> Res<()> {
    for a in
        [r::Attn { batch: 2, seq: 200, hq: 8, hkv: 2, d: 64 }, r::Attn { batch: 1, seq: 300, hq: 4, hkv: 1, d: 128 }]
    {
        let k = super::kernels::attn_kernels(a.d);
        attention_with::<u16>(g, a, [k.fwd.into(), k.dq.into(), k.dkdv.into()], (k.block_rows, k.threads))?;
    }
    Ok(())
}

/// Forward, delta, dq and dk/dv at shape `a` against the reference, with `names` (forward,
/// dq, dk/dv) launched on blocks of `block` = (rows, threads); delta is attention.cu's.
fn attention_with<S: Store>(g: &mut Gpu, a: r::Attn, names: [String; 3], block: (u32, u32)) -> Res<()> {
    let [fwd_name, dq_name, dkdv_name] = names;
    let (tq, tkv) = (a.batch * a.seq * a.hq * a.d, a.batch * a.seq * a.hkv * a.d);
    let (q, qs) = g.fresh::<S>(tq)?;
    let (k, ks) = g.fresh::<S>(tkv)?;
    let (v, vs) = g.fresh::<S>(tkv)?;
    let (dout, ds) = g.fresh::<S>(tq)?;
    let shape = format!("b{} s{} hq{} hkv{} d{}", a.batch, a.seq, a.hq, a.hkv, a.d);
    let (o_ref, lse_ref) = r::attn_fwd(&a, &qs, &ks, &vs);
    let (bi, si, hqi, hkvi, di) = (a.batch as i32, a.seq as i32, a.hq as i32, a.hkv as i32, a.d as i32);
    let (qst, kvst) = ((a.hq * a.d) as i64, (a.hkv * a.d) as i64);
    let scale = 1.0 / (a.d as f32).sqrt();
    let grid_of = |rows: u32, threads: u32, heads: usize| LaunchConfig {
        grid_dim: (a.seq.div_ceil(rows as usize) as u32, heads as u32, a.batch as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let grid = |heads: usize| grid_of(block.0, block.1, heads);
    let delta_grid = |heads: usize| grid_of(8, 256, heads);
    let mut o = g.poisoned::<S>(tq)?;
    let mut lse = g.poisoned::<f32>(a.batch * a.hq * a.seq)?;
    launch!(
        g,
        fwd_name.clone(),
        grid(a.hq),
        &q,
        &k,
        &v,
        &mut o,
        &mut lse,
        &bi,
        &si,
        &hqi,
        &hkvi,
        &di,
        &qst,
        &kvst,
        &qst,
        &scale
    );
    let errs = [r::rel_error(&g.down(&o)?, &o_ref), r::rel_error(&g.down(&lse)?, &lse_ref)];
    g.record(fwd_name, S::SUFFIX, shape.clone(), &errs, S::BOUND);
    // Backward from the reference's o and lse.
    let (o_in, os) = g.up::<S>(&o_ref)?;
    let lse_in = g.up_f32(&lse_ref)?;
    let delta_ref: Vec<f64> = (0..a.batch * a.hq * a.seq)
        .map(|row| {
            let (b, h, i) = (row / (a.hq * a.seq), row / a.seq % a.hq, row % a.seq);
            let base = ((b * a.seq + i) * a.hq + h) * a.d;
            (0..a.d).map(|c| ds[base + c] * os[base + c]).sum()
        })
        .collect();
    let mut delta = g.poisoned::<f32>(a.batch * a.hq * a.seq)?;
    launch!(
        g,
        format!("attn_bwd_delta_{}", S::SUFFIX),
        delta_grid(a.hq),
        &o_in,
        &dout,
        &mut delta,
        &bi,
        &si,
        &hqi,
        &di,
        &qst
    );
    let e = r::rel_error(&g.down(&delta)?, &delta_ref);
    g.record(format!("attn_bwd_delta_{}", S::SUFFIX), S::SUFFIX, shape.clone(), &[e], S::BOUND);
    let delta_in = g.up_f32(&delta_ref)?;
    let (dq_ref, dk_ref, dv_ref) = r::attn_bwd(&a, &qs, &ks, &vs, &ds);
    let mut dq = g.poisoned::<S>(tq)?;
    launch!(
        g,
        dq_name.clone(),
        grid(a.hq),
        &q,
        &k,
        &v,
        &dout,
        &lse_in,
        &delta_in,
        &mut dq,
        &bi,
        &si,
        &hqi,
        &hkvi,
        &di,
        &qst,
        &kvst,
        &qst,
        &qst,
        &scale
    );
    let e = r::rel_error(&g.down(&dq)?, &dq_ref);
    g.record(dq_name, S::SUFFIX, shape.clone(), &[e], S::BOUND);
    let mut dk = g.poisoned::<S>(tkv)?;
    let mut dv = g.poisoned::<S>(tkv)?;
    launch!(
        g,
        dkdv_name.clone(),
        grid(a.hkv),
        &q,
        &k,
        &v,
        &dout,
        &lse_in,
        &delta_in,
        &mut dk,
        &mut dv,
        &bi,
        &si,
        &hqi,
        &hkvi,
        &di,
        &qst,
        &kvst,
        &qst,
        &kvst,
        &scale
    );
    let errs = [r::rel_error(&g.down(&dk)?, &dk_ref), r::rel_error(&g.down(&dv)?, &dv_ref)];
    g.record(dkdv_name, S::SUFFIX, shape, &errs, S::BOUND);
    Ok(())
}

#[path = "check_more.rs"]
mod more;

/// Compiles every kernel for `arch`, loads it on GPU `ordinal` and checks each entry point
/// against its reference on inputs drawn from `seed`.
pub fn check_all(ordinal: usize, arch: &'static str, seed: u64) -> Result<Vec<KernelCheck>, CudaError> {
    require_driver()?;
    let ctx = CudaContext::new(ordinal).map_err(|e| fail(format!("opening GPU {ordinal}"))(&e))?;
    let mut funcs = BTreeMap::new();
    for s in SOURCES {
        let module =
            ctx.load_module(compile(s, arch)?).map_err(|e| fail(format!("loading {} on GPU {ordinal}", s.file))(&e))?;
        for name in s.entries {
            let f = module.load_function(name).map_err(|e| fail(format!("loading kernel {name}"))(&e))?;
            funcs.insert(name.to_string(), f);
        }
    }
    let mut g = Gpu { stream: ctx.default_stream(), funcs, rng: ChaCha8Rng::seed_from_u64(seed), out: Vec::new() };
    norms::<f32>(&mut g)?;
    norms::<u16>(&mut g)?;
    activations::<f32>(&mut g)?;
    activations::<u16>(&mut g)?;
    rope::<f32>(&mut g)?;
    rope::<u16>(&mut g)?;
    attention::<f32>(&mut g)?;
    attention::<u16>(&mut g)?;
    attention_tc(&mut g)?;
    more::embedding::<f32>(&mut g)?;
    more::embedding::<u16>(&mut g)?;
    more::loss::<f32>(&mut g)?;
    more::loss::<u16>(&mut g)?;
    more::elementwise::<f32>(&mut g)?;
    more::elementwise::<u16>(&mut g)?;
    more::optimizer(&mut g)?;
    Ok(g.out)
}

#[cfg(test)]
mod tests {
    use super::Store;

    #[test]
    fn the_reference_rounds_to_bf16_as_the_kernels_do() {
        // 1.00390637…: f32 low half 0x8001, just above the tie between 0x3f80 and 0x3f81.
        assert_eq!(u16::enc(f32::from_bits(0x3f80_8001) as f64), 0x3f81);
        // An exact tie rounds to even, both ways.
        assert_eq!(u16::enc(f32::from_bits(0x3f80_8000) as f64), 0x3f80);
        assert_eq!(u16::enc(f32::from_bits(0x3f81_8000) as f64), 0x3f82);
        // Just below the tie rounds down.
        assert_eq!(u16::enc(f32::from_bits(0x3f80_7fff) as f64), 0x3f80);
    }
}
