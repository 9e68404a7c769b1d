//! Element-wise and row-wise kernels with hand-written backward passes: LayerNorm, GELU,
//! bias and residual adds, column sums.
//!
//! Every kernel works on row-major (rows, C) f32 slices and infers the row count from the
//! slice length, so the same code runs on a full (T, C) activation or on a sequence-parallel
//! (T/t, C) slice. Backward kernels *accumulate* into weight gradients (`+=`), because
//! gradients add up over microbatches; what they do to input gradients is stated per kernel.
//! Loops run row by row over contiguous memory (llm.c's CPU reference style).

/// LayerNorm's ε, added to the variance (GPT-2's value).
pub const LN_EPS: f32 = 1e-5;

/// √(2/π), the GELU tanh approximation's constant.
const GELU_SCALE: f32 = 0.797_884_6;

fn rows_of(len: usize, cols: usize, what: &str) -> usize {
    assert!(cols > 0 && len.is_multiple_of(cols), "{what}: {len} elements are not whole rows of {cols}");
    len / cols
}

/// LayerNorm over each row of x(N, C) (Ba et al. 2016):
/// μ = mean(x), σ² = mean((x − μ)²), rstd = 1/√(σ² + ε), y = (x − μ)·rstd·γ + β.
/// Writes y(N, C) and saves mean(N), rstd(N) for the backward pass.
pub fn layernorm_forward(x: &[f32], gamma: &[f32], beta: &[f32], y: &mut [f32], mean: &mut [f32], rstd: &mut [f32]) {
    let c = gamma.len();
    let n = rows_of(x.len(), c, "layernorm_forward");
    assert!(beta.len() == c && y.len() == x.len() && mean.len() == n && rstd.len() == n);
    for i in 0..n {
        let row = &x[i * c..(i + 1) * c];
        let mu = row.iter().sum::<f32>() / c as f32;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / c as f32;
        let rs = 1.0 / (var + LN_EPS).sqrt();
        let out = &mut y[i * c..(i + 1) * c];
        for j in 0..c {
            out[j] = (row[j] - mu) * rs * gamma[j] + beta[j];
        }
        mean[i] = mu;
        rstd[i] = rs;
    }
}

/// LayerNorm backward. With x̂ = (x − μ)·rstd and g = dy ⊙ γ:
/// dx += rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)), dγ += Σ_rows dy ⊙ x̂, dβ += Σ_rows dy.
/// Accumulates into dx, dγ and dβ.
#[allow(clippy::too_many_arguments)] // the LayerNorm backward has exactly these operands
pub fn layernorm_backward(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let c = gamma.len();
    let n = rows_of(x.len(), c, "layernorm_backward");
    assert!(dy.len() == x.len() && dx.len() == x.len() && mean.len() == n && rstd.len() == n);
    assert!(dgamma.len() == c && dbeta.len() == c);
    for i in 0..n {
        let (xr, dyr) = (&x[i * c..(i + 1) * c], &dy[i * c..(i + 1) * c]);
        let (mu, rs) = (mean[i], rstd[i]);
        let mut g_mean = 0.0f32;
        let mut gx_mean = 0.0f32;
        for j in 0..c {
            let g = dyr[j] * gamma[j];
            g_mean += g;
            gx_mean += g * (xr[j] - mu) * rs;
        }
        g_mean /= c as f32;
        gx_mean /= c as f32;
        let dxr = &mut dx[i * c..(i + 1) * c];
        for j in 0..c {
            let xhat = (xr[j] - mu) * rs;
            dgamma[j] += dyr[j] * xhat;
            dbeta[j] += dyr[j];
            dxr[j] += rs * (dyr[j] * gamma[j] - g_mean - xhat * gx_mean);
        }
    }
}

/// GELU, tanh approximation (Hendrycks & Gimpel 2016, as GPT-2):
/// y = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
pub fn gelu_forward(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    for (yi, &xi) in y.iter_mut().zip(x) {
        let u = GELU_SCALE * (xi + 0.044715 * xi * xi * xi);
        *yi = 0.5 * xi * (1.0 + u.tanh());
    }
}

/// GELU backward: dx = dy · y'(x), with
/// y'(x) = ½(1 + tanh u) + ½·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²). Overwrites dx.
pub fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert!(x.len() == dy.len() && x.len() == dx.len());
    for i in 0..x.len() {
        let xi = x[i];
        let u = GELU_SCALE * (xi + 0.044715 * xi * xi * xi);
        let th = u.tanh();
        let du = GELU_SCALE * (1.0 + 3.0 * 0.044715 * xi * xi);
        dx[i] = dy[i] * (0.5 * (1.0 + th) + 0.5 * xi * (1.0 - th * th) * du);
    }
}

/// y[i, :] += b for every row i of y(N, C), C = b.len().
pub fn add_bias(y: &mut [f32], b: &[f32]) {
    rows_of(y.len(), b.len(), "add_bias");
    for row in y.chunks_exact_mut(b.len()) {
        for (v, bj) in row.iter_mut().zip(b) {
            *v += bj;
        }
    }
}

/// y += x, element-wise (a residual connection).
pub fn add_into(y: &mut [f32], x: &[f32]) {
    assert_eq!(y.len(), x.len(), "add_into: lengths differ");
    for (v, xi) in y.iter_mut().zip(x) {
        *v += xi;
    }
}

/// db[j] += Σ_i dy[i, j]: the gradient of a bias added to every row of dy(N, C).
pub fn col_sum_into(db: &mut [f32], dy: &[f32]) {
    rows_of(dy.len(), db.len(), "col_sum_into");
    for row in dy.chunks_exact(db.len()) {
        for (d, v) in db.iter_mut().zip(row) {
            *d += v;
        }
    }
}

/// Σ x² in f64, so that a caller can add the sums of many shards without losing digits.
pub fn sum_of_squares(x: &[f32]) -> f64 {
    x.iter().map(|&v| (v as f64) * (v as f64)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{Probe, check_directional, seeded_vec};

    #[test]
    fn layernorm_rows_have_zero_mean_and_unit_variance_before_the_affine() {
        let x = seeded_vec(3 * 8, 1, 2.0);
        let (g, b) = (vec![1.0; 8], vec![0.0; 8]);
        let (mut y, mut mean, mut rstd) = (vec![0.0; 24], vec![0.0; 3], vec![0.0; 3]);
        layernorm_forward(&x, &g, &b, &mut y, &mut mean, &mut rstd);
        for row in y.chunks(8) {
            let mu: f32 = row.iter().sum::<f32>() / 8.0;
            let var: f32 = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / 8.0;
            assert!(mu.abs() < 1e-6 && (var - 1.0).abs() < 1e-3, "mean {mu}, var {var}");
        }
    }

    #[test]
    fn layernorm_backward_matches_finite_differences() {
        let (n, c) = (3, 6);
        let x = seeded_vec(n * c, 2, 1.5);
        let g = seeded_vec(c, 3, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>();
        let b = seeded_vec(c, 4, 0.5);
        let probe = Probe::new(n * c, 5);
        let fwd = |x: &[f32], g: &[f32], b: &[f32]| {
            let (mut y, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
            layernorm_forward(x, g, b, &mut y, &mut m, &mut r);
            (y, m, r)
        };
        let (_, mean, rstd) = fwd(&x, &g, &b);
        let (mut dx, mut dg, mut db) = (vec![0.0; n * c], vec![0.0; c], vec![0.0; c]);
        layernorm_backward(&probe.weights, &x, &g, &mean, &rstd, &mut dx, &mut dg, &mut db);
        check_directional("layernorm dx", &x, &dx, 11, |xp| probe.loss(&fwd(xp, &g, &b).0));
        check_directional("layernorm dgamma", &g, &dg, 12, |gp| probe.loss(&fwd(&x, gp, &b).0));
        check_directional("layernorm dbeta", &b, &db, 13, |bp| probe.loss(&fwd(&x, &g, bp).0));
    }

    #[test]
    fn gelu_backward_matches_finite_differences_and_known_values() {
        let x = seeded_vec(40, 6, 3.0);
        let probe = Probe::new(40, 7);
        let fwd = |x: &[f32]| {
            let mut y = vec![0.0; x.len()];
            gelu_forward(x, &mut y);
            y
        };
        let mut dx = vec![0.0; 40];
        gelu_backward(&x, &probe.weights, &mut dx);
        check_directional("gelu", &x, &dx, 14, |xp| probe.loss(&fwd(xp)));
        // GELU(0) = 0, GELU(x) → x for large x, and GELU(1) ≈ 0.8412 (tanh form).
        let y = fwd(&[0.0, 10.0, 1.0]);
        assert!(y[0] == 0.0 && (y[1] - 10.0).abs() < 1e-5 && (y[2] - 0.841192).abs() < 1e-5, "{y:?}");
    }

    #[test]
    fn bias_and_column_sums_are_adjoint() {
        // ⟨add_bias(0, b), dy⟩ = ⟨b, col_sum(dy)⟩ for any b, dy.
        let b = seeded_vec(4, 8, 1.0);
        let dy = seeded_vec(12, 9, 1.0);
        let mut y = vec![0.0; 12];
        add_bias(&mut y, &b);
        let mut db = vec![0.0; 4];
        col_sum_into(&mut db, &dy);
        let lhs: f32 = y.iter().zip(&dy).map(|(a, b)| a * b).sum();
        let rhs: f32 = b.iter().zip(&db).map(|(a, b)| a * b).sum();
        assert!((lhs - rhs).abs() < 1e-5, "{lhs} vs {rhs}");
    }
}
