//! What each CUDA kernel must compute, in plain f64 on the CPU: the reference `check` holds
//! the GPU's outputs against. Layouts are the kernels' (`kernels/*.cu`), dense: tokens are
//! batch-major rows, heads contiguous within a row. The GPT pieces are tested against the
//! CPU executor's own functions (`crate::kernels`, `crate::attention`, `crate::optim`); the
//! pieces the CPU executor lacks (RMSNorm, SwiGLU, RoPE, GQA) against finite differences
//! and closed forms.

/// The relative error ‖out − ref‖₂ / ‖ref‖₂ (∞ when `out` holds a NaN or an infinity, so a
/// poisoned output never passes).
pub fn rel_error(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "rel_error: lengths differ");
    if out.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = out.iter().zip(reference).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = reference.iter().map(|b| b * b).sum();
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// Token + position embedding over a vocabulary shard [vocab_start, vocab_start + rows).
#[allow(clippy::too_many_arguments)] // the kernel's operands
pub fn embed_fwd(
    tok: &[u32],
    wte: &[f64],
    wpe: Option<&[f64]>,
    seq: usize,
    hidden: usize,
    vocab_start: usize,
    rows: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; tok.len() * hidden];
    for (t, &id) in tok.iter().enumerate() {
        let row = (id as usize).checked_sub(vocab_start).filter(|&r| r < rows);
        for c in 0..hidden {
            let mut v = row.map_or(0.0, |r| wte[r * hidden + c]);
            if let Some(p) = wpe {
                v += p[(t % seq) * hidden + c];
            }
            out[t * hidden + c] = v;
        }
    }
    out
}

/// Gradients of [`embed_fwd`]: (dwte (rows, hidden), dwpe (seq, hidden)).
pub fn embed_bwd(
    tok: &[u32],
    dout: &[f64],
    seq: usize,
    hidden: usize,
    vocab_start: usize,
    rows: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (mut dwte, mut dwpe) = (vec![0.0; rows * hidden], vec![0.0; seq * hidden]);
    for (t, &id) in tok.iter().enumerate() {
        let row = (id as usize).checked_sub(vocab_start).filter(|&r| r < rows);
        for c in 0..hidden {
            let g = dout[t * hidden + c];
            if let Some(r) = row {
                dwte[r * hidden + c] += g;
            }
            dwpe[(t % seq) * hidden + c] += g;
        }
    }
    (dwte, dwpe)
}

/// LayerNorm (`rms = false`, with β) or RMSNorm (`rms = true`): (y, mean, rstd).
pub fn norm_fwd(x: &[f64], gamma: &[f64], beta: Option<&[f64]>, eps: f64, rms: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let c = gamma.len();
    let n = x.len() / c;
    let (mut y, mut mean, mut rstd) = (vec![0.0; x.len()], vec![0.0; n], vec![0.0; n]);
    for r in 0..n {
        let row = &x[r * c..(r + 1) * c];
        let mu = if rms { 0.0 } else { row.iter().sum::<f64>() / c as f64 };
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / c as f64;
        let rs = 1.0 / (var + eps).sqrt();
        for j in 0..c {
            y[r * c + j] = (row[j] - mu) * rs * gamma[j] + beta.map_or(0.0, |b| b[j]);
        }
        (mean[r], rstd[r]) = (mu, rs);
    }
    (y, mean, rstd)
}

/// Gradients of [`norm_fwd`]: (dx, dγ, dβ).
pub fn norm_bwd(dy: &[f64], x: &[f64], gamma: &[f64], eps: f64, rms: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let c = gamma.len();
    let n = x.len() / c;
    let (_, mean, rstd) = norm_fwd(x, gamma, None, eps, rms);
    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
    for r in 0..n {
        let (mu, rs) = (mean[r], rstd[r]);
        let xhat = |j: usize| (x[r * c + j] - mu) * rs;
        let g = |j: usize| dy[r * c + j] * gamma[j];
        let g_mean = if rms { 0.0 } else { (0..c).map(g).sum::<f64>() / c as f64 };
        let gx_mean = (0..c).map(|j| g(j) * xhat(j)).sum::<f64>() / c as f64;
        for j in 0..c {
            dx[r * c + j] = rs * (g(j) - g_mean - xhat(j) * gx_mean);
            dg[j] += dy[r * c + j] * xhat(j);
            db[j] += dy[r * c + j];
        }
    }
    (dx, dg, db)
}

const GELU_C: f64 = 0.797_884_560_802_865_4;

/// GELU, tanh approximation.
pub fn gelu_fwd(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| 0.5 * v * (1.0 + (GELU_C * (v + 0.044715 * v * v * v)).tanh())).collect()
}

/// dx of [`gelu_fwd`].
pub fn gelu_bwd(x: &[f64], dy: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(dy)
        .map(|(&v, &d)| {
            let th = (GELU_C * (v + 0.044715 * v * v * v)).tanh();
            d * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * GELU_C * (1.0 + 3.0 * 0.044715 * v * v))
        })
        .collect()
}

fn sigmoid(g: f64) -> f64 {
    1.0 / (1.0 + (-g).exp())
}

/// SwiGLU over gu (rows, 2f) = [gate | up]: y (rows, f) = silu(gate)·up.
pub fn swiglu_fwd(gu: &[f64], f: usize) -> Vec<f64> {
    let rows = gu.len() / (2 * f);
    let mut y = vec![0.0; rows * f];
    for r in 0..rows {
        for c in 0..f {
            let (g, u) = (gu[r * 2 * f + c], gu[r * 2 * f + f + c]);
            y[r * f + c] = g * sigmoid(g) * u;
        }
    }
    y
}

/// d(gu) of [`swiglu_fwd`].
pub fn swiglu_bwd(gu: &[f64], dy: &[f64], f: usize) -> Vec<f64> {
    let rows = gu.len() / (2 * f);
    let mut d = vec![0.0; gu.len()];
    for r in 0..rows {
        for c in 0..f {
            let (g, u, dd) = (gu[r * 2 * f + c], gu[r * 2 * f + f + c], dy[r * f + c]);
            let s = sigmoid(g);
            d[r * 2 * f + c] = dd * u * s * (1.0 + g * (1.0 - s));
            d[r * 2 * f + f + c] = dd * g * s;
        }
    }
    d
}

/// Rotary embedding, half-split pairs, in place on x (tokens, heads, d), pos = token mod seq,
/// rotated by sign·θ.
pub fn rope(x: &mut [f64], seq: usize, heads: usize, d: usize, base: f64, sign: f64) {
    let half = d / 2;
    let tokens = x.len() / (heads * d);
    for t in 0..tokens {
        let pos = (t % seq) as f64;
        for h in 0..heads {
            let p = &mut x[(t * heads + h) * d..][..d];
            for i in 0..half {
                let ang = pos * base.powf(-2.0 * i as f64 / d as f64);
                let (s, c) = (sign * ang.sin(), ang.cos());
                let (a, b) = (p[i], p[i + half]);
                p[i] = a * c - b * s;
                p[i + half] = b * c + a * s;
            }
        }
    }
}

/// Sizes of an attention call: q (batch·seq, hq, d), k and v (batch·seq, hkv, d).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attn {
    pub batch: usize,
    pub seq: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

impl Attn {
    fn q(&self, t: usize, h: usize) -> usize {
        (t * self.hq + h) * self.d
    }
    fn kv(&self, t: usize, h: usize) -> usize {
        (t * self.hkv + h / (self.hq / self.hkv)) * self.d
    }
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
    /// Softmax row i of head h in sequence b: P_ij for j ≤ i, and the log-sum-exp.
    fn probs(&self, q: &[f64], k: &[f64], b: usize, h: usize, i: usize) -> (Vec<f64>, f64) {
        let ti = b * self.seq + i;
        let s: Vec<f64> = (0..=i)
            .map(|j| {
                let tj = b * self.seq + j;
                (0..self.d).map(|c| q[self.q(ti, h) + c] * k[self.kv(tj, h) + c]).sum::<f64>() * self.scale()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|v| (v - m).exp()).sum();
        (s.iter().map(|v| (v - m).exp() / l).collect(), m + l.ln())
    }
}

/// Causal attention forward: (o (batch·seq, hq, d), lse (batch, hq, seq)).
pub fn attn_fwd(a: &Attn, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut o = vec![0.0; a.batch * a.seq * a.hq * a.d];
    let mut lse = vec![0.0; a.batch * a.hq * a.seq];
    for b in 0..a.batch {
        for h in 0..a.hq {
            for i in 0..a.seq {
                let (p, l) = a.probs(q, k, b, h, i);
                lse[(b * a.hq + h) * a.seq + i] = l;
                let ti = b * a.seq + i;
                for (j, pj) in p.iter().enumerate() {
                    let tj = b * a.seq + j;
                    for c in 0..a.d {
                        o[a.q(ti, h) + c] += pj * v[a.kv(tj, h) + c];
                    }
                }
            }
        }
    }
    (o, lse)
}

/// Causal attention backward: (dq, dk, dv) in the layouts of q, k, v.
pub fn attn_bwd(a: &Attn, q: &[f64], k: &[f64], v: &[f64], dout: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..a.batch {
        for h in 0..a.hq {
            for i in 0..a.seq {
                let ti = b * a.seq + i;
                let (p, _) = a.probs(q, k, b, h, i);
                let dp: Vec<f64> = (0..=i)
                    .map(|j| (0..a.d).map(|c| dout[a.q(ti, h) + c] * v[a.kv(b * a.seq + j, h) + c]).sum())
                    .collect();
                let delta: f64 = p.iter().zip(&dp).map(|(x, y)| x * y).sum();
                for j in 0..=i {
                    let tj = b * a.seq + j;
                    let ds = p[j] * (dp[j] - delta) * a.scale();
                    for c in 0..a.d {
                        dq[a.q(ti, h) + c] += ds * k[a.kv(tj, h) + c];
                        dk[a.kv(tj, h) + c] += ds * q[a.q(ti, h) + c];
                        dv[a.kv(tj, h) + c] += p[j] * dout[a.q(ti, h) + c];
                    }
                }
            }
        }
    }
    (dq, dk, dv)
}

/// Vocab-parallel cross-entropy, one shard: stats (rows, 3) = (max, Σ exp(x − max), target
/// logit or 0).
pub fn xent_stats(logits: &[f64], target: &[u32], cols: usize, vocab_start: usize) -> Vec<f64> {
    let rows = logits.len() / cols;
    let mut st = vec![0.0; rows * 3];
    for r in 0..rows {
        let x = &logits[r * cols..(r + 1) * cols];
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        st[3 * r] = m;
        st[3 * r + 1] = x.iter().map(|v| (v - m).exp()).sum();
        st[3 * r + 2] = (target[r] as usize).checked_sub(vocab_start).filter(|&t| t < cols).map_or(0.0, |t| x[t]);
    }
    st
}

/// Gathered stats (tp, rows, 3) → (lse, loss) per row.
pub fn xent_combine(gathered: &[f64], rows: usize, tp: usize) -> (Vec<f64>, Vec<f64>) {
    let st = |k: usize, r: usize| &gathered[3 * (k * rows + r)..][..3];
    (0..rows)
        .map(|r| {
            let m = (0..tp).map(|k| st(k, r)[0]).fold(f64::NEG_INFINITY, f64::max);
            let l = m + (0..tp).map(|k| st(k, r)[1] * (st(k, r)[0] - m).exp()).sum::<f64>().ln();
            (l, l - (0..tp).map(|k| st(k, r)[2]).sum::<f64>())
        })
        .unzip()
}

/// dlogits = (softmax − onehot)·scale for one shard.
pub fn xent_grad(logits: &[f64], target: &[u32], lse: &[f64], cols: usize, vocab_start: usize, scale: f64) -> Vec<f64> {
    logits
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let (r, c) = (i / cols, i % cols);
            let hot = target[r] as usize == vocab_start + c;
            ((x - lse[r]).exp() - if hot { 1.0 } else { 0.0 }) * scale
        })
        .collect()
}

/// AdamW hyper-parameters of one step (k ≥ 1, bias corrections from it).
#[derive(Clone, Copy, Debug)]
pub struct Adam {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub step: i32,
    pub grad_scale: f64,
}

/// One AdamW step: (param, m, v) after it.
pub fn adamw(h: &Adam, param: &[f64], grad: &[f64], m: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (bc1, bc2) = (1.0 - h.beta1.powi(h.step), 1.0 - h.beta2.powi(h.step));
    let mut out = (Vec::with_capacity(param.len()), Vec::with_capacity(param.len()), Vec::with_capacity(param.len()));
    for i in 0..param.len() {
        let g = grad[i] * h.grad_scale;
        let mi = h.beta1 * m[i] + (1.0 - h.beta1) * g;
        let vi = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
        let p = param[i] - h.lr * ((mi / bc1) / ((vi / bc2).sqrt() + h.eps) + h.weight_decay * param[i]);
        out.0.push(p);
        out.1.push(mi);
        out.2.push(vi);
    }
    out
}

#[cfg(test)]
#[path = "reference_tests.rs"]
mod tests;
