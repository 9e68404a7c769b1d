//! The host stand-in's causal attention (tests only): `attention.cu`'s four kernels —
//! forward with the saved lse, the row term delta, dq, and dk/dv — on strided views (head h
//! of token t at base + t·stride + h·d, tokens batch-major; GQA: query head h reads kv head
//! h / (hq / hkv)), fp32 arithmetic, the outputs stored in the tensors' type. The scores are
//! formed in full per query row (the kernels' online softmax is the same sum in another
//! order).

use super::device::{Arg, Ptr};
use super::host::{HostState, Ty};

struct V {
    base: Ptr,
    stride: usize,
}

fn arg_p(a: &[Arg], i: usize) -> Ptr {
    match a[i] {
        Arg::P(p) => p,
        _ => unreachable!("checked against the signature"),
    }
}

fn arg_n(a: &[Arg], i: usize) -> usize {
    match a[i] {
        Arg::I(v) => v.max(0) as usize,
        Arg::L(v) => v.max(0) as usize,
        _ => unreachable!("checked against the signature"),
    }
}

fn arg_f(a: &[Arg], i: usize) -> f32 {
    match a[i] {
        Arg::F(v) => v,
        _ => unreachable!("checked against the signature"),
    }
}

/// A view's elements as a dense (tokens, heads·d) matrix.
fn load(st: &HostState, ty: Ty, v: &V, tokens: usize, width: usize) -> Result<Vec<f32>, String> {
    let all = st.rd(ty, v.base, (tokens - 1) * v.stride + width)?;
    Ok((0..tokens).flat_map(|t| all[t * v.stride..t * v.stride + width].to_vec()).collect())
}

/// Writes a dense (tokens, width) matrix into a view, leaving the elements between rows.
fn store(st: &mut HostState, ty: Ty, v: &V, tokens: usize, width: usize, x: &[f32]) -> Result<(), String> {
    let n = (tokens - 1) * v.stride + width;
    let mut all = st.rd(ty, v.base, n)?;
    for t in 0..tokens {
        all[t * v.stride..t * v.stride + width].copy_from_slice(&x[t * width..(t + 1) * width]);
    }
    st.wr(ty, v.base, &all)
}

/// Shapes of one launch: batch, seq, query heads, kv heads, head_dim.
#[derive(Clone, Copy)]
struct Sh {
    b: usize,
    s: usize,
    hq: usize,
    hkv: usize,
    d: usize,
}

impl Sh {
    fn tokens(&self) -> usize {
        self.b * self.s
    }
    /// Softmax probabilities of query row (b, h, i) against keys 0..=i, and their lse (or
    /// with the saved one).
    #[allow(clippy::too_many_arguments)]
    fn probs(
        &self,
        q: &[f32],
        k: &[f32],
        bb: usize,
        h: usize,
        i: usize,
        scale: f32,
        lse: Option<f32>,
    ) -> (Vec<f32>, f32) {
        let (d, hk) = (self.d, h / (self.hq / self.hkv));
        let (qw, kw) = (self.hq * d, self.hkv * d);
        let ti = bb * self.s + i;
        let sc: Vec<f32> = (0..=i)
            .map(|j| {
                let tj = bb * self.s + j;
                (0..d).map(|c| q[ti * qw + h * d + c] * k[tj * kw + hk * d + c]).sum::<f32>() * scale
            })
            .collect();
        let l = lse.unwrap_or_else(|| {
            let m = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            m + sc.iter().map(|x| (x - m).exp()).sum::<f32>().ln()
        });
        (sc.iter().map(|x| (x - l).exp()).collect(), l)
    }
}

/// The grid the kernels index by: (query blocks of 8 rows, `heads`, batch) — the kernels
/// read their head and sequence from blockIdx.y and .z, so another grid computes other rows
/// (or, for dk/dv over query heads, reads past the tensors).
fn check_grid(kernel: &str, grid: (u32, u32, u32), sh: &Sh, heads: usize, family: Family) -> Result<(), String> {
    let rows = match family {
        Family::Scalar => 8,
        Family::TensorCore { head_dim } if head_dim == sh.d => 64,
        Family::TensorCore { head_dim } => {
            return Err(format!("{kernel}: the head_dim-{head_dim} kernel launched for head_dim {}", sh.d));
        }
    };
    let want = (sh.s.div_ceil(rows) as u32, heads as u32, sh.b as u32);
    if grid != want {
        return Err(format!("{kernel}: launched on grid {grid:?}, its rows need {want:?}"));
    }
    Ok(())
}

/// Which kernel file's launch shape a call must have: `attention.cu` (blocks of 8 rows) or
/// `attention_tc.cu` (blocks of 64 rows, one head size per kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Scalar,
    TensorCore { head_dim: usize },
}

pub fn run(
    st: &mut HostState,
    kernel: &str,
    ty: Ty,
    grid: (u32, u32, u32),
    a: &[Arg],
    family: Family,
) -> Result<(), String> {
    if kernel == "attn_bwd_delta" {
        let sh = Sh { b: arg_n(a, 3), s: arg_n(a, 4), hq: arg_n(a, 5), hkv: 1, d: arg_n(a, 6) };
        check_grid(kernel, grid, &sh, sh.hq, family)?;
        let os = arg_n(a, 7);
        let (w, n) = (sh.hq * sh.d, sh.tokens());
        let o = load(st, ty, &V { base: arg_p(a, 0), stride: os }, n, w)?;
        let dout = load(st, ty, &V { base: arg_p(a, 1), stride: os }, n, w)?;
        let mut delta = vec![0f32; sh.b * sh.hq * sh.s];
        for bb in 0..sh.b {
            for h in 0..sh.hq {
                for i in 0..sh.s {
                    let t = bb * sh.s + i;
                    delta[(bb * sh.hq + h) * sh.s + i] =
                        (0..sh.d).map(|c| o[t * w + h * sh.d + c] * dout[t * w + h * sh.d + c]).sum();
                }
            }
        }
        return st.wr(Ty::F32, arg_p(a, 2), &delta);
    }
    // attn_fwd: q k v o lse | b s hq hkv d qs kvs os scale; the backward kernels: q k v dout
    // lse delta then dq (or dk dv), then the same sizes and strides, the output's stride.
    let outs = match kernel {
        "attn_fwd" => 2,
        "attn_bwd_dq" => 7,
        _ => 8,
    };
    let at = if kernel == "attn_fwd" { 5 } else { outs };
    let sh =
        Sh { b: arg_n(a, at), s: arg_n(a, at + 1), hq: arg_n(a, at + 2), hkv: arg_n(a, at + 3), d: arg_n(a, at + 4) };
    let (qs, kvs, os) = (arg_n(a, at + 5), arg_n(a, at + 6), arg_n(a, at + 7));
    if sh.hkv == 0 || !sh.hq.is_multiple_of(sh.hkv) {
        return Err(format!("{kernel}: {} query heads over {} kv heads", sh.hq, sh.hkv));
    }
    // dk/dv: one block per key/value head (it sums its group's query heads).
    check_grid(kernel, grid, &sh, if kernel == "attn_bwd_dkdv" { sh.hkv } else { sh.hq }, family)?;
    let n = sh.tokens();
    let (qw, kw) = (sh.hq * sh.d, sh.hkv * sh.d);
    let q = load(st, ty, &V { base: arg_p(a, 0), stride: qs }, n, qw)?;
    let k = load(st, ty, &V { base: arg_p(a, 1), stride: kvs }, n, kw)?;
    let v = load(st, ty, &V { base: arg_p(a, 2), stride: kvs }, n, kw)?;
    let rows = sh.b * sh.hq * sh.s;
    let group = sh.hq / sh.hkv;
    let d = sh.d;
    if kernel == "attn_fwd" {
        let scale = arg_f(a, at + 8);
        let (mut o, mut lse) = (vec![0f32; n * qw], vec![0f32; rows]);
        for bb in 0..sh.b {
            for h in 0..sh.hq {
                let hk = h / group;
                for i in 0..sh.s {
                    let (p, l) = sh.probs(&q, &k, bb, h, i, scale, None);
                    let ti = bb * sh.s + i;
                    for c in 0..d {
                        o[ti * qw + h * d + c] =
                            p.iter().enumerate().map(|(j, pj)| pj * v[(bb * sh.s + j) * kw + hk * d + c]).sum();
                    }
                    lse[(bb * sh.hq + h) * sh.s + i] = l;
                }
            }
        }
        store(st, ty, &V { base: arg_p(a, 3), stride: os }, n, qw, &o)?;
        return st.wr(Ty::F32, arg_p(a, 4), &lse);
    }
    let dout = load(st, ty, &V { base: arg_p(a, 3), stride: os }, n, qw)?;
    let lse = st.rd(Ty::F32, arg_p(a, 4), rows)?;
    let delta = st.rd(Ty::F32, arg_p(a, 5), rows)?;
    let dstride = arg_n(a, at + 8);
    let scale = arg_f(a, at + 9);
    let (mut dq, mut dk, mut dv) = (vec![0f32; n * qw], vec![0f32; n * kw], vec![0f32; n * kw]);
    for bb in 0..sh.b {
        for h in 0..sh.hq {
            let hk = h / group;
            for i in 0..sh.s {
                let row = (bb * sh.hq + h) * sh.s + i;
                let (p, _) = sh.probs(&q, &k, bb, h, i, scale, Some(lse[row]));
                let ti = bb * sh.s + i;
                for (j, &pij) in p.iter().enumerate() {
                    let tj = bb * sh.s + j;
                    let dp: f32 = (0..d).map(|c| dout[ti * qw + h * d + c] * v[tj * kw + hk * d + c]).sum();
                    let ds = pij * (dp - delta[row]);
                    for c in 0..d {
                        dq[ti * qw + h * d + c] += ds * k[tj * kw + hk * d + c] * scale;
                        dk[tj * kw + hk * d + c] += ds * q[ti * qw + h * d + c] * scale;
                        dv[tj * kw + hk * d + c] += pij * dout[ti * qw + h * d + c];
                    }
                }
            }
        }
    }
    if kernel == "attn_bwd_dq" {
        store(st, ty, &V { base: arg_p(a, 6), stride: dstride }, n, qw, &dq)
    } else {
        store(st, ty, &V { base: arg_p(a, 6), stride: dstride }, n, kw, &dk)?;
        store(st, ty, &V { base: arg_p(a, 7), stride: dstride }, n, kw, &dv)
    }
}
