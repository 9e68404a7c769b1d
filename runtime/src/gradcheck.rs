//! Test support: central finite differences against hand-written backward passes.
//!
//! A piece maps inputs x to outputs y. We check its backward pass through a scalar probe
//! L = Σ_i w_i·y_i with fixed random weights w (so dL/dy = w is the output gradient fed to
//! the backward pass), and compare the analytic directional derivative ⟨∇L, v⟩ with
//! (L(x + εv) − L(x − εv)) / 2ε along random sign vectors v ∈ {−1, +1}ⁿ.
//!
//! Why f32 finite differences are trustworthy here (the model code is f32 only):
//! - L is accumulated in f64, so its only noise is the f32 rounding of the outputs:
//!   |δy_i| ≲ a few ulps ≈ 1e-7·|y_i|; summed over n ≲ 10³ outputs with random-sign weights
//!   that gives |δL| ≲ 1e-7·√n ≈ 3e-6, i.e. ≲ 3e-4 after dividing by 2ε with ε = 5e-3;
//! - the truncation error of the central difference is ε²/6·L''' ≈ 4e-6·L''': small for the
//!   smooth functions here (LayerNorm, GELU, softmax) at unit-scale inputs, and measured to
//!   dominate (the error grows 4× when ε doubles, ≤ 1e-4 at ε = 5e-3, 3e-4 at 1e-2);
//! - a random sign direction sums the gradient over all n coordinates, so the signal is
//!   ≈ ‖∇L‖₂, which is ≳ 1 in these tests (n ≳ 64 coordinates with |∂L/∂x| ~ 0.1–1), while
//!   the noise above does not grow with n: ≲ 3e-4 relative in all.
//!
//! The tests assert |fd − analytic| ≤ 1e-3·max(|analytic|, ‖∇L‖₂) + 1e-5 (measured worst
//! case 9e-5, so the margin is 10×). A wrong term in any coordinate shifts the analytic
//! value by a fraction of ‖∇L‖₂ that is O(1) for real bugs (a missing factor, a transposed
//! index, a dropped row), far above that bound; three independent directions make an
//! accidental cancellation vanishingly unlikely. Run with GRADCHECK_VERBOSE=1 to print the
//! worst error of every check.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Relative tolerance of a directional-derivative check (see the module comment).
pub const FD_RTOL: f64 = 1e-3;
/// Absolute floor, for gradients that are exactly zero.
pub const FD_ATOL: f64 = 1e-5;
/// Finite-difference step along a ±1 direction.
pub const FD_EPS: f32 = 5e-3;
/// Random directions per check.
const DIRECTIONS: u64 = 3;

/// Uniform values in [−scale, scale), reproducible from `seed`.
pub fn seeded_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| scale * (2.0 * rng.random::<f32>() - 1.0)).collect()
}

/// The scalar probe L = Σ w_i·y_i.
pub struct Probe {
    pub weights: Vec<f32>,
}

impl Probe {
    pub fn new(n: usize, seed: u64) -> Probe {
        Probe { weights: seeded_vec(n, seed ^ 0x9e37_79b9, 1.0) }
    }

    pub fn loss(&self, y: &[f32]) -> f64 {
        assert_eq!(y.len(), self.weights.len(), "probe and output sizes differ");
        y.iter().zip(&self.weights).map(|(&a, &b)| a as f64 * b as f64).sum()
    }
}

/// Asserts that `grad` is the gradient of `f` at `x`, along random ±1 directions.
/// Returns the worst relative error seen, for tests that want to report it.
pub fn check_directional(name: &str, x: &[f32], grad: &[f32], seed: u64, f: impl Fn(&[f32]) -> f64) -> f64 {
    assert_eq!(x.len(), grad.len(), "{name}: parameter and gradient sizes differ");
    let norm = grad.iter().map(|&g| g as f64 * g as f64).sum::<f64>().sqrt();
    let mut worst = 0.0f64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..DIRECTIONS {
        let v: Vec<f32> = (0..x.len()).map(|_| if rng.random::<bool>() { 1.0 } else { -1.0 }).collect();
        let shifted = |sign: f32| x.iter().zip(&v).map(|(&a, &d)| a + sign * FD_EPS * d).collect::<Vec<_>>();
        let fd = (f(&shifted(1.0)) - f(&shifted(-1.0))) / (2.0 * FD_EPS as f64);
        let analytic: f64 = grad.iter().zip(&v).map(|(&g, &d)| g as f64 * d as f64).sum();
        let scale = analytic.abs().max(norm);
        let err = (fd - analytic).abs();
        assert!(
            err <= FD_RTOL * scale + FD_ATOL,
            "{name}: finite difference {fd:.6e} vs analytic {analytic:.6e} (‖grad‖ {norm:.3e}, error {err:.3e})"
        );
        worst = worst.max(err / scale.max(1e-12));
    }
    if std::env::var_os("GRADCHECK_VERBOSE").is_some() {
        eprintln!("gradcheck {name}: worst relative error {worst:.2e}");
    }
    worst
}
