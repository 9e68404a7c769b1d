//! How well the prediction held: the figures the report's summary and `cargo xtask
//! validate` print.
//!
//! - step-time error of a plan: e = (predicted − measured) / measured, measured the median
//!   step; the summary gives the median and the largest |e| over plans;
//! - ranking agreement: Kendall's τ-b between predicted and measured step times over plans
//!   (1 = same order, −1 = reversed; ties counted as in τ-b);
//! - memory: the largest |predicted / measured − 1| of peak bytes over every rank of every
//!   plan that has both.

use serde::Serialize;

use crate::inputs::{ComparisonSet, median};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Accuracy {
    pub plans: usize,
    /// Median |e| over plans (0.05 = 5 %).
    pub median_abs_step_error: f64,
    pub max_abs_step_error: f64,
    /// `None` with fewer than two plans.
    pub kendall_tau: Option<f64>,
    /// `None` when no plan has both peaks for a rank.
    pub max_abs_peak_memory_error: Option<f64>,
}

pub fn accuracy(set: &ComparisonSet) -> Accuracy {
    let errors: Vec<f64> = set.plans.iter().map(|p| p.step_error().abs()).collect();
    let predicted: Vec<f64> = set.plans.iter().map(|p| p.predicted_step_s).collect();
    let measured: Vec<f64> = set.plans.iter().map(|p| p.measured_step_s()).collect();
    let mut mem: Option<f64> = None;
    for p in &set.plans {
        for pr in &p.predicted_peak_bytes {
            if let Some(me) = p.measured_peak_bytes.iter().find(|m| m.rank == pr.rank)
                && me.bytes > 0
            {
                let e = (pr.bytes as f64 / me.bytes as f64 - 1.0).abs();
                mem = Some(mem.map_or(e, |m| m.max(e)));
            }
        }
    }
    Accuracy {
        plans: set.plans.len(),
        median_abs_step_error: median(&errors),
        max_abs_step_error: errors.iter().copied().fold(0.0, f64::max),
        kendall_tau: kendall_tau_b(&predicted, &measured),
        max_abs_peak_memory_error: mem,
    }
}

/// Kendall's τ-b of two equally long samples; `None` below two points or when either
/// sample is constant.
pub fn kendall_tau_b(x: &[f64], y: &[f64]) -> Option<f64> {
    assert_eq!(x.len(), y.len(), "kendall_tau_b of samples of {} and {}", x.len(), y.len());
    let n = x.len();
    let (mut concordant, mut discordant, mut ties_x, mut ties_y) = (0i64, 0i64, 0i64, 0i64);
    for i in 0..n {
        for j in i + 1..n {
            let dx = x[i].total_cmp(&x[j]) as i64;
            let dy = y[i].total_cmp(&y[j]) as i64;
            match (dx, dy) {
                (0, 0) => {}
                (0, _) => ties_x += 1,
                (_, 0) => ties_y += 1,
                _ if dx == dy => concordant += 1,
                _ => discordant += 1,
            }
        }
    }
    let a = (concordant + discordant + ties_x) as f64;
    let b = (concordant + discordant + ties_y) as f64;
    if n < 2 || a == 0.0 || b == 0.0 {
        return None;
    }
    Some((concordant - discordant) as f64 / (a * b).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tau_of_same_reversed_and_one_swap() {
        let x = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(kendall_tau_b(&x, &[10.0, 20.0, 30.0, 40.0]), Some(1.0));
        assert_eq!(kendall_tau_b(&x, &[4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        // One discordant pair of six: (5 − 1) / 6.
        let t = kendall_tau_b(&x, &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((t - 4.0 / 6.0).abs() < 1e-12, "{t}");
        assert_eq!(kendall_tau_b(&[1.0], &[1.0]), None);
        assert_eq!(kendall_tau_b(&x, &[1.0; 4]), None);
    }
}
