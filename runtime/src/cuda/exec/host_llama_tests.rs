//! The host stand-in's Llama kernels (tests only) against the CPU executor's own functions
//! (`crate::llama`), in fp32 (the kernels' `_f32` entry points): RMSNorm forward and
//! backward, SwiGLU forward and backward on [gate | up] rows, and RoPE on q and k inside a
//! fused (T, D + 2·Dkv) qkv row with its backward rotation. A loss curve sees RoPE little
//! over a few steps of a fresh tiny model (measured: skipping it moves the tiny Llama's
//! first three losses by 7e-5 relative), so it is held here element by element.

use cudarc::driver::LaunchConfig;
use strata_models::plan::Stream;

use super::device::{Arg, Device, Ptr, blocks, per_cols, per_row};
use super::host::HostDevice;
use super::pool::DeviceMemory;
use crate::llama::{Rope, rmsnorm_backward, rmsnorm_forward, swiglu_backward, swiglu_forward};

const S: Stream = Stream::Compute;

/// Deterministic values in about [−2, 2).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

struct Dev {
    d: HostDevice,
}

impl Dev {
    fn new() -> Dev {
        Dev { d: HostDevice::computing(1 << 30) }
    }
    fn put(&self, x: &[f32]) -> Ptr {
        let b = self.d.memory().reserve(4 * x.len() as u64).unwrap();
        self.d.upload(b.ptr, x).unwrap();
        b.ptr
    }
    fn get(&self, p: Ptr, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n];
        self.d.download(S, &mut out, p).unwrap();
        out
    }
    fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) {
        self.d.launch(S, name, cfg, args).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0f32, f32::max);
    assert!(worst <= tol, "{what}: worst difference {worst:e}");
}

#[test]
fn rmsnorm_is_the_cpu_executors() {
    let (rows, cols) = (6, 40);
    let (x, g, dy) = (data(rows * cols, 1), data(cols, 2), data(rows * cols, 3));
    let (mut y, mut rstd) = (vec![0f32; rows * cols], vec![0f32; rows]);
    rmsnorm_forward(&x, &g, &mut y, &mut rstd);
    let (mut dx, mut dg) = (vec![0f32; rows * cols], vec![0.5f32; cols]);
    rmsnorm_backward(&dy, &x, &g, &rstd, &mut dx, &mut dg);
    let dev = Dev::new();
    let (px, pg, pdy) = (dev.put(&x), dev.put(&g), dev.put(&dy));
    let (py, pr, pdx, pdg) = (
        dev.put(&vec![0.0; rows * cols]),
        dev.put(&vec![0.0; rows]),
        dev.put(&vec![0.0; rows * cols]),
        dev.put(&[0.5; 40]),
    );
    let (r, c) = (Arg::I(rows as i32), Arg::I(cols as i32));
    let eps = Arg::F(crate::kernels::LN_EPS);
    dev.launch("rmsnorm_fwd_f32", per_row(rows), &[Arg::P(px), Arg::P(pg), Arg::P(py), Arg::P(pr), r, c, eps]);
    close("rmsnorm y", &dev.get(py, rows * cols), &y, 1e-6);
    close("rmsnorm rstd", &dev.get(pr, rows), &rstd, 1e-6);
    let dx_args = [Arg::P(pdy), Arg::P(px), Arg::P(pg), Arg::P(pr), Arg::P(pdx), r, c];
    dev.launch("rmsnorm_bwd_dx_f32", per_row(rows), &dx_args);
    dev.launch("rmsnorm_bwd_params_f32", per_cols(cols), &[Arg::P(pdy), Arg::P(px), Arg::P(pr), Arg::P(pdg), r, c]);
    close("rmsnorm dx", &dev.get(pdx, rows * cols), &dx, 1e-5);
    close("rmsnorm dgamma (accumulated)", &dev.get(pdg, cols), &dg, 1e-5);
}

#[test]
fn swiglu_reads_gate_then_up_as_the_cpu_executor_does() {
    let (rows, f) = (5, 12);
    let (pre, da) = (data(rows * 2 * f, 4), data(rows * f, 5));
    let mut act = vec![0f32; rows * f];
    swiglu_forward(&pre, &mut act, f);
    let mut dpre = vec![0f32; rows * 2 * f];
    swiglu_backward(&pre, &da, &mut dpre, f);
    let dev = Dev::new();
    let (pp, pda, pa, pd) =
        (dev.put(&pre), dev.put(&da), dev.put(&vec![0.0; rows * f]), dev.put(&vec![0.0; rows * 2 * f]));
    let (r, ff) = (Arg::L(rows as i64), Arg::I(f as i32));
    dev.launch("swiglu_fwd_f32", blocks(rows * f), &[Arg::P(pp), Arg::P(pa), r, ff]);
    dev.launch("swiglu_bwd_f32", blocks(rows * f), &[Arg::P(pp), Arg::P(pda), Arg::P(pd), r, ff]);
    // exp_fast (the CPU's) is within 2 ulp of exp.
    close("swiglu act", &dev.get(pa, rows * f), &act, 1e-6);
    close("swiglu d[gate | up]", &dev.get(pd, rows * 2 * f), &dpre, 1e-6);
}

#[test]
fn rope_turns_q_and_k_inside_the_fused_row_as_the_cpu_executor_does() {
    // 2 sequences of 7 tokens, 4 query heads and 2 key/value heads of 8: rows of 64.
    let (seq, tokens, heads, kv, hd) = (7usize, 14usize, 4usize, 2usize, 8usize);
    let w = (heads + 2 * kv) * hd;
    let base = 500_000.0f32;
    let x = data(tokens * w, 6);
    let positions: Vec<u32> = (0..seq as u32).collect();
    let rope = Rope { base: f64::from(base), head_dim: hd, positions: &positions };
    let mut want = x.clone();
    rope.apply(&mut want, w, 0, heads, 1.0);
    rope.apply(&mut want, w, heads * hd, kv, 1.0);
    let dev = Dev::new();
    let px = dev.put(&x);
    let turn = |at: usize, n: usize, sign: f32| {
        let args = [
            Arg::P(px + 4 * at as u64),
            Arg::I(tokens as i32),
            Arg::I(seq as i32),
            Arg::I(n as i32),
            Arg::I(hd as i32),
            Arg::L(w as i64),
            Arg::F(base),
            Arg::F(sign),
        ];
        dev.launch("rope_f32", blocks(tokens * n * hd / 2), &args);
    };
    turn(0, heads, 1.0);
    turn(heads * hd, kv, 1.0);
    let got = dev.get(px, tokens * w);
    close("rope forward", &got, &want, 1e-6);
    // V is left as it was; position 0 is not turned.
    assert_eq!(&got[(heads + kv) * hd..w], &x[(heads + kv) * hd..w]);
    assert_eq!(&got[..hd], &x[..hd]);
    assert_ne!(&got[w..w + hd], &x[w..w + hd], "position 1 turns");
    // The backward rotation undoes the forward one.
    turn(0, heads, -1.0);
    turn(heads * hd, kv, -1.0);
    close("rope backward of forward", &dev.get(px, tokens * w), &x, 1e-6);
}
