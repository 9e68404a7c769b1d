//! The host stand-in's arithmetic (tests only): each kernel the executor launches, and
//! its GEMM, computed on the stand-in's host copy of device memory with the kernels' own
//! formulas (`kernels/*.cu`): fp32 arithmetic, bf16 rounded to nearest even on every bf16
//! store, accumulations into fp32 where the kernel accumulates. Sums run in index order
//! (the GPU's block reductions add in another order: equal within fp32 rounding), so a
//! whole training step yields real losses without a GPU, and runs of one plan split over
//! several ranks can be held against the single rank.
//!
//! The Llama block's kernels too (RMSNorm, SwiGLU, RoPE; grouped-query attention in
//! `host_attn`). A kernel the executor does not launch is refused by name.

use super::device::{Arg, Ptr};
use super::host::{HostState, Ty};

type Res = Result<(), String>;

struct A<'a>(&'a [Arg]);

impl A<'_> {
    fn p(&self, i: usize) -> Ptr {
        match self.0[i] {
            Arg::P(p) => p,
            _ => unreachable!("checked against the signature"),
        }
    }
    fn i(&self, i: usize) -> usize {
        match self.0[i] {
            Arg::I(v) => v.max(0) as usize,
            Arg::L(v) => v.max(0) as usize,
            _ => unreachable!("checked against the signature"),
        }
    }
    fn f(&self, i: usize) -> f32 {
        match self.0[i] {
            Arg::F(v) => v,
            _ => unreachable!("checked against the signature"),
        }
    }
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

fn gelu_u(v: f32) -> f32 {
    0.797_884_6 * (v + 0.044715 * v * v * v)
}

/// Runs kernel `name` (launched on `grid` blocks) on the stand-in's memory.
pub fn run(st: &mut HostState, name: &str, grid: (u32, u32, u32), args: &[Arg]) -> Res {
    let a = A(args);
    const WHOLE: [&str; 3] = ["cast_f32_bf16", "scale_f32", "accumulate_bf16_f32"];
    let (base, ty) = match (name.strip_suffix("_bf16"), name.strip_suffix("_f32")) {
        _ if WHOLE.contains(&name) => (name, Ty::F32),
        (Some(b), _) => (b, Ty::Bf16),
        (_, Some(b)) => (b, Ty::F32),
        _ => (name, Ty::F32),
    };
    match base {
        "embed_fwd" => {
            let (tokens, seq, h, v0, rows) = (a.i(4), a.i(5), a.i(6), a.i(7), a.i(8));
            let tok = st.u32s(a.p(0), tokens)?;
            let wte = st.rd(ty, a.p(1), rows * h)?;
            // The position table on tensor-parallel rank 0 only (null elsewhere).
            let wpe = if a.p(2) == 0 { vec![0f32; seq * h] } else { st.rd(ty, a.p(2), seq * h)? };
            let mut out = vec![0f32; tokens * h];
            for (t, &id) in tok.iter().enumerate() {
                let row = (id as usize).checked_sub(v0).filter(|&r| r < rows);
                for c in 0..h {
                    out[t * h + c] = row.map_or(0.0, |r| wte[r * h + c]) + wpe[(t % seq) * h + c];
                }
            }
            st.wr(ty, a.p(3), &out)
        }
        "embed_bwd" => {
            let (tokens, seq, h, v0, rows) = (a.i(4), a.i(5), a.i(6), a.i(7), a.i(8));
            let tok = st.u32s(a.p(0), tokens)?;
            let dout = st.rd(ty, a.p(1), tokens * h)?;
            // No position table's gradient where it is null (Llama).
            let has_wpe = a.p(3) != 0;
            let mut dwte = st.rd(Ty::F32, a.p(2), rows * h)?;
            let mut dwpe = if has_wpe { st.rd(Ty::F32, a.p(3), seq * h)? } else { vec![0f32; seq * h] };
            for (t, &id) in tok.iter().enumerate() {
                let row = (id as usize).checked_sub(v0).filter(|&r| r < rows);
                for c in 0..h {
                    let g = dout[t * h + c];
                    if let Some(r) = row {
                        dwte[r * h + c] += g;
                    }
                    dwpe[(t % seq) * h + c] += g;
                }
            }
            st.wr(Ty::F32, a.p(2), &dwte)?;
            if has_wpe { st.wr(Ty::F32, a.p(3), &dwpe) } else { Ok(()) }
        }
        "layernorm_fwd" => {
            let (rows, cols, eps) = (a.i(6), a.i(7), a.f(8));
            let x = st.rd(ty, a.p(0), rows * cols)?;
            let (g, b) = (st.rd(ty, a.p(1), cols)?, st.rd(ty, a.p(2), cols)?);
            let (mut y, mut mean, mut rstd) = (vec![0f32; rows * cols], vec![0f32; rows], vec![0f32; rows]);
            for r in 0..rows {
                let xr = &x[r * cols..(r + 1) * cols];
                let mu = xr.iter().sum::<f32>() / cols as f32;
                let q: f32 = xr.iter().map(|v| (v - mu) * (v - mu)).sum();
                let rs = 1.0 / (q / cols as f32 + eps).sqrt();
                for c in 0..cols {
                    y[r * cols + c] = (xr[c] - mu) * rs * g[c] + b[c];
                }
                (mean[r], rstd[r]) = (mu, rs);
            }
            st.wr(ty, a.p(3), &y)?;
            st.wr(Ty::F32, a.p(4), &mean)?;
            st.wr(Ty::F32, a.p(5), &rstd)
        }
        "layernorm_bwd_dx" => {
            let (rows, cols) = (a.i(6), a.i(7));
            let (dy, x) = (st.rd(ty, a.p(0), rows * cols)?, st.rd(ty, a.p(1), rows * cols)?);
            let g = st.rd(ty, a.p(2), cols)?;
            let (mean, rstd) = (st.rd(Ty::F32, a.p(3), rows)?, st.rd(Ty::F32, a.p(4), rows)?);
            let mut dx = vec![0f32; rows * cols];
            for r in 0..rows {
                let o = r * cols;
                let (mu, rs) = (mean[r], rstd[r]);
                let (mut gs, mut gx) = (0f32, 0f32);
                for c in 0..cols {
                    let gg = dy[o + c] * g[c];
                    gs += gg;
                    gx += gg * (x[o + c] - mu) * rs;
                }
                let (gm, gxm) = (gs / cols as f32, gx / cols as f32);
                for c in 0..cols {
                    let xhat = (x[o + c] - mu) * rs;
                    dx[o + c] = rs * (dy[o + c] * g[c] - gm - xhat * gxm);
                }
            }
            st.wr(ty, a.p(5), &dx)
        }
        "layernorm_bwd_params" => {
            let (rows, cols) = (a.i(6), a.i(7));
            let (dy, x) = (st.rd(ty, a.p(0), rows * cols)?, st.rd(ty, a.p(1), rows * cols)?);
            let (mean, rstd) = (st.rd(Ty::F32, a.p(2), rows)?, st.rd(Ty::F32, a.p(3), rows)?);
            let (mut dg, mut db) = (st.rd(Ty::F32, a.p(4), cols)?, st.rd(Ty::F32, a.p(5), cols)?);
            for c in 0..cols {
                let (mut sg, mut sb) = (0f32, 0f32);
                for r in 0..rows {
                    let o = r * cols + c;
                    sg += dy[o] * (x[o] - mean[r]) * rstd[r];
                    sb += dy[o];
                }
                dg[c] += sg;
                db[c] += sb;
            }
            st.wr(Ty::F32, a.p(4), &dg)?;
            st.wr(Ty::F32, a.p(5), &db)
        }
        "add" => {
            let n = a.i(2);
            let (mut y, x) = (st.rd(ty, a.p(0), n)?, st.rd(ty, a.p(1), n)?);
            y.iter_mut().zip(&x).for_each(|(y, x)| *y += x);
            st.wr(ty, a.p(0), &y)
        }
        "add_bias" => {
            let (rows, cols) = (a.i(2), a.i(3));
            let (mut y, b) = (st.rd(ty, a.p(0), rows * cols)?, st.rd(ty, a.p(1), cols)?);
            y.iter_mut().enumerate().for_each(|(i, y)| *y += b[i % cols]);
            st.wr(ty, a.p(0), &y)
        }
        "col_sum" => {
            let (rows, cols) = (a.i(2), a.i(3));
            let (dy, mut db) = (st.rd(ty, a.p(0), rows * cols)?, st.rd(Ty::F32, a.p(1), cols)?);
            for (c, d) in db.iter_mut().enumerate() {
                *d += (0..rows).map(|r| dy[r * cols + c]).sum::<f32>();
            }
            st.wr(Ty::F32, a.p(1), &db)
        }
        "gelu_fwd" => {
            let n = a.i(2);
            let x = st.rd(ty, a.p(0), n)?;
            let y: Vec<f32> = x.iter().map(|&v| 0.5 * v * (1.0 + gelu_u(v).tanh())).collect();
            st.wr(ty, a.p(1), &y)
        }
        "gelu_bwd" => {
            let n = a.i(3);
            let (x, dy) = (st.rd(ty, a.p(0), n)?, st.rd(ty, a.p(1), n)?);
            let dx: Vec<f32> = x
                .iter()
                .zip(&dy)
                .map(|(&v, &g)| {
                    let th = gelu_u(v).tanh();
                    let du = 0.797_884_6 * (1.0 + 3.0 * 0.044715 * v * v);
                    g * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * du)
                })
                .collect();
            st.wr(ty, a.p(2), &dx)
        }
        "rmsnorm_fwd" => {
            // x g y rstd rows cols eps: rstd = 1/√(Σx²/cols + ε), y = x·rstd·γ.
            let (rows, cols, eps) = (a.i(4), a.i(5), a.f(6));
            let x = st.rd(ty, a.p(0), rows * cols)?;
            let g = st.rd(ty, a.p(1), cols)?;
            let (mut y, mut rstd) = (vec![0f32; rows * cols], vec![0f32; rows]);
            for r in 0..rows {
                let xr = &x[r * cols..(r + 1) * cols];
                let q: f32 = xr.iter().map(|v| v * v).sum();
                let rs = 1.0 / (q / cols as f32 + eps).sqrt();
                for c in 0..cols {
                    y[r * cols + c] = xr[c] * rs * g[c];
                }
                rstd[r] = rs;
            }
            st.wr(ty, a.p(2), &y)?;
            st.wr(Ty::F32, a.p(3), &rstd)
        }
        "rmsnorm_bwd_dx" => {
            // dy x g rstd dx rows cols: dx = rstd·(dy·γ − x̂·mean(dy·γ·x̂)), written.
            let (rows, cols) = (a.i(5), a.i(6));
            let (dy, x) = (st.rd(ty, a.p(0), rows * cols)?, st.rd(ty, a.p(1), rows * cols)?);
            let g = st.rd(ty, a.p(2), cols)?;
            let rstd = st.rd(Ty::F32, a.p(3), rows)?;
            let mut dx = vec![0f32; rows * cols];
            for (r, &rs) in rstd.iter().enumerate() {
                let o = r * cols;
                let gx: f32 = (0..cols).map(|c| dy[o + c] * g[c] * x[o + c] * rs).sum();
                let gxm = gx / cols as f32;
                for c in 0..cols {
                    dx[o + c] = rs * (dy[o + c] * g[c] - x[o + c] * rs * gxm);
                }
            }
            st.wr(ty, a.p(4), &dx)
        }
        "rmsnorm_bwd_params" => {
            // dy x rstd dgamma rows cols: dγ[c] += Σ_r dy·x̂ (fp32).
            let (rows, cols) = (a.i(4), a.i(5));
            let (dy, x) = (st.rd(ty, a.p(0), rows * cols)?, st.rd(ty, a.p(1), rows * cols)?);
            let rstd = st.rd(Ty::F32, a.p(2), rows)?;
            let mut dg = st.rd(Ty::F32, a.p(3), cols)?;
            for (c, d) in dg.iter_mut().enumerate() {
                *d += (0..rows).map(|r| dy[r * cols + c] * x[r * cols + c] * rstd[r]).sum::<f32>();
            }
            st.wr(Ty::F32, a.p(3), &dg)
        }
        "swiglu_fwd" => {
            // gu (rows, 2f) = [gate | up] → y (rows, f) = SiLU(gate)·up.
            let (rows, f) = (a.i(2), a.i(3));
            let gu = st.rd(ty, a.p(0), rows * 2 * f)?;
            let y: Vec<f32> = (0..rows * f)
                .map(|i| {
                    let (r, c) = (i / f, i % f);
                    let (g, u) = (gu[r * 2 * f + c], gu[r * 2 * f + f + c]);
                    g * sigmoid(g) * u
                })
                .collect();
            st.wr(ty, a.p(1), &y)
        }
        "swiglu_bwd" => {
            // gu dy dgu rows f: d gate = dy·u·σ(g)(1 + g(1 − σ(g))), d up = dy·SiLU(g).
            let (rows, f) = (a.i(3), a.i(4));
            let (gu, dy) = (st.rd(ty, a.p(0), rows * 2 * f)?, st.rd(ty, a.p(1), rows * f)?);
            let mut dgu = vec![0f32; rows * 2 * f];
            for (i, &d) in dy.iter().enumerate() {
                let (r, c) = (i / f, i % f);
                let (g, u) = (gu[r * 2 * f + c], gu[r * 2 * f + f + c]);
                let sg = sigmoid(g);
                dgu[r * 2 * f + c] = d * u * sg * (1.0 + g * (1.0 - sg));
                dgu[r * 2 * f + f + c] = d * g * sg;
            }
            st.wr(ty, a.p(2), &dgu)
        }
        "rope" => {
            // x tokens seq heads d row_stride base sign, in place: the pair (i, i + d/2) of
            // each head turned by sign·pos·base^(−2i/d), the angle in f64.
            let (tokens, seq, heads, d, stride) = (a.i(1), a.i(2), a.i(3), a.i(4), a.i(5));
            let (base, sign) = (f64::from(a.f(6)), a.f(7));
            if d % 2 != 0 || tokens == 0 || heads * d > stride {
                return Err(format!("rope: head_dim {d}, {heads} heads in rows of {stride}"));
            }
            let half = d / 2;
            let n = (tokens - 1) * stride + heads * d;
            let mut x = st.rd(ty, a.p(0), n)?;
            for t in 0..tokens {
                let pos = (t % seq) as f64;
                for i in 0..half {
                    let ang = pos * base.powf(-2.0 * i as f64 / d as f64);
                    let (sn, cs) = ((ang.sin() as f32) * sign, ang.cos() as f32);
                    for h in 0..heads {
                        let o = t * stride + h * d;
                        let (u, v) = (x[o + i], x[o + i + half]);
                        x[o + i] = u * cs - v * sn;
                        x[o + i + half] = v * cs + u * sn;
                    }
                }
            }
            st.wr(ty, a.p(0), &x)
        }
        "attn_fwd" | "attn_bwd_delta" | "attn_bwd_dq" | "attn_bwd_dkdv" => {
            super::host_attn::run(st, base, ty, grid, args, super::host_attn::Family::Scalar)
        }
        // attention_tc.cu's kernels: the same results, blocks of 64 rows, one head size each.
        "attn_fwd_tc64"
        | "attn_bwd_dq_tc64"
        | "attn_bwd_dkdv_tc64"
        | "attn_fwd_tc128"
        | "attn_bwd_dq_tc128"
        | "attn_bwd_dkdv_tc128" => {
            let (plain, width) = base.rsplit_once("_tc").expect("the names above hold _tc");
            let head_dim = width.parse().expect("the names above end in a number");
            if ty != Ty::Bf16 {
                return Err(format!("{name}: the tensor-core attention kernels are bf16 only"));
            }
            super::host_attn::run(st, plain, ty, grid, args, super::host_attn::Family::TensorCore { head_dim })
        }
        "xent_stats" => {
            let (rows, cols, v0) = (a.i(3), a.i(4), a.i(5));
            let x = st.rd(ty, a.p(0), rows * cols)?;
            let tgt = st.u32s(a.p(1), rows)?;
            let mut stats = vec![0f32; 3 * rows];
            for r in 0..rows {
                let xr = &x[r * cols..(r + 1) * cols];
                let m = xr.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let s: f32 = xr.iter().map(|v| (v - m).exp()).sum();
                let t = (tgt[r] as usize).checked_sub(v0).filter(|&t| t < cols);
                stats[3 * r..3 * r + 3].copy_from_slice(&[m, s, t.map_or(0.0, |t| xr[t])]);
            }
            st.wr(Ty::F32, a.p(2), &stats)
        }
        "xent_combine" => {
            let (rows, tp) = (a.i(3), a.i(4));
            let g = st.rd(Ty::F32, a.p(0), 3 * tp * rows)?;
            let (mut lse, mut loss) = (vec![0f32; rows], vec![0f32; rows]);
            for r in 0..rows {
                let at = |k: usize, j: usize| g[3 * (k * rows + r) + j];
                let mx = (0..tp).fold(f32::NEG_INFINITY, |m, k| m.max(at(k, 0)));
                let s: f32 = (0..tp).map(|k| at(k, 1) * (at(k, 0) - mx).exp()).sum();
                let tg: f32 = (0..tp).map(|k| at(k, 2)).sum();
                lse[r] = mx + s.ln();
                loss[r] = lse[r] - tg;
            }
            st.wr(Ty::F32, a.p(1), &lse)?;
            st.wr(Ty::F32, a.p(2), &loss)
        }
        "xent_grad" => {
            let (rows, cols, v0, scale) = (a.i(3), a.i(4), a.i(5), a.f(6));
            let mut x = st.rd(ty, a.p(0), rows * cols)?;
            let (tgt, lse) = (st.u32s(a.p(1), rows)?, st.rd(Ty::F32, a.p(2), rows)?);
            for (i, v) in x.iter_mut().enumerate() {
                let (r, c) = (i / cols, i % cols);
                let mut p = (*v - lse[r]).exp();
                if (tgt[r] as usize).checked_sub(v0) == Some(c) {
                    p -= 1.0;
                }
                *v = p * scale;
            }
            st.wr(ty, a.p(0), &x)
        }
        "adamw_step" => {
            let n = a.i(5);
            let (lr, b1, b2, eps, wd, bc1, bc2, gs) =
                (a.f(6), a.f(7), a.f(8), a.f(9), a.f(10), a.f(11), a.f(12), a.f(13));
            let mut p = st.rd(Ty::F32, a.p(0), n)?;
            let g = st.rd(Ty::F32, a.p(1), n)?;
            let (mut m, mut v) = (st.rd(Ty::F32, a.p(2), n)?, st.rd(Ty::F32, a.p(3), n)?);
            for i in 0..n {
                let gi = g[i] * gs;
                m[i] = b1 * m[i] + (1.0 - b1) * gi;
                v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                p[i] -= lr * ((m[i] / bc1) / ((v[i] / bc2).sqrt() + eps) + wd * p[i]);
            }
            st.wr(Ty::F32, a.p(0), &p)?;
            st.wr(Ty::F32, a.p(2), &m)?;
            st.wr(Ty::F32, a.p(3), &v)?;
            if a.p(4) != 0 { st.wr(Ty::Bf16, a.p(4), &p) } else { Ok(()) }
        }
        "sum_squares_partial" => {
            let n = a.i(1);
            let x = st.rd(Ty::F32, a.p(0), n)?;
            let mut part = vec![0f64; grid.0 as usize];
            part[0] = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            st.wr_f64(a.p(2), &part)
        }
        "sum_partials" => {
            let part = st.f64s(a.p(0), a.i(1))?;
            st.wr_f64(a.p(2), &[part.iter().sum()])
        }
        "scale_f32" => {
            let n = a.i(1);
            let x: Vec<f32> = st.rd(Ty::F32, a.p(0), n)?.iter().map(|v| v * a.f(2)).collect();
            st.wr(Ty::F32, a.p(0), &x)
        }
        "cast_f32_bf16" => {
            let x = st.rd(Ty::F32, a.p(0), a.i(2))?;
            st.wr(Ty::Bf16, a.p(1), &x)
        }
        "accumulate_bf16_f32" => {
            let n = a.i(2);
            let (x, mut acc) = (st.rd(Ty::Bf16, a.p(0), n)?, st.rd(Ty::F32, a.p(1), n)?);
            acc.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
            st.wr(Ty::F32, a.p(1), &acc)
        }
        _ => Err(format!("the host stand-in does not compute kernel {name}")),
    }
}
