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
        *yi = 0.5 * xi * (1.0 + tanh_fast(u));
    }
}

/// GELU backward: dx = dy · y'(x), with
/// y'(x) = ½(1 + tanh u) + ½·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²). Overwrites dx.
pub fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    assert!(x.len() == dy.len() && x.len() == dx.len());
    for i in 0..x.len() {
        let xi = x[i];
        let u = GELU_SCALE * (xi + 0.044715 * xi * xi * xi);
        let th = tanh_fast(u);
        let du = GELU_SCALE * (1.0 + 3.0 * 0.044715 * xi * xi);
        dx[i] = dy[i] * (0.5 * (1.0 + th) + 0.5 * xi * (1.0 - th * th) * du);
    }
}

/// e^x in f32, branch-free so that loops over it vectorise (libm's `expf` is a call per
/// element): e^x = 2^k · e^r with k = round(x·log₂e) and r = x − k·ln 2 (Cody–Waite, two
/// parts), e^r by Cephes' degree-6 `expf` polynomial, 2^k built in the exponent bits.
/// Relative error ≤ 2 ulp on [−87, 88] (checked in a test); inputs are clamped there.
#[inline]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2²³: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let k = t - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * z + r + 1.0;
    let ki = t.to_bits() as i32 - ROUND.to_bits() as i32;
    e * f32::from_bits(((ki + 127) << 23) as u32)
}

/// tanh in f32, branch-free (vectorises): Eigen's rational approximation (odd degree-13
/// numerator over even degree-6 denominator) on [−7.9, 7.9], where it saturates to ±1 in
/// f32. Absolute error ≤ 5e-7, a few ulp of values near ±1 (checked in a test).
#[inline]
pub fn tanh_fast(x: f32) -> f32 {
    let x = x.clamp(-7.905_311, 7.905_311);
    let x2 = x * x;
    let p = ((((((-2.760_768_5e-16 * x2 + 2.000_188e-13) * x2 - 8.604_672e-11) * x2 + 5.122_297e-8) * x2
        + 1.485_722_4e-5)
        * x2
        + 6.372_619_3e-4)
        * x2
        + 4.893_524_6e-3)
        * x;
    let q = ((1.198_258_4e-6 * x2 + 1.185_347_1e-4) * x2 + 2.268_434_6e-3) * x2 + 4.893_525e-3;
    p / q
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
    fn fast_exp_and_tanh_are_accurate_to_a_few_ulp() {
        let (mut worst_exp, mut worst_tanh) = (0.0f64, 0.0f64);
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f64 / 200_000.0;
            let e = exp_fast(x as f32) as f64;
            worst_exp = worst_exp.max(((e - (x as f32 as f64).exp()) / (x as f32 as f64).exp()).abs());
            let t = -10.0 + 20.0 * i as f64 / 200_000.0;
            worst_tanh = worst_tanh.max((tanh_fast(t as f32) as f64 - (t as f32 as f64).tanh()).abs());
        }
        // 2 ulp of f32 is 2.4e-7 relative.
        assert!(worst_exp < 2.4e-7, "exp_fast relative error {worst_exp:e}");
        assert!(worst_tanh < 5e-7, "tanh_fast absolute error {worst_tanh:e}");
        assert_eq!(exp_fast(0.0), 1.0);
        assert_eq!(tanh_fast(0.0), 0.0);
        assert_eq!((tanh_fast(20.0), tanh_fast(-20.0)), (1.0, -1.0));
    }

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
