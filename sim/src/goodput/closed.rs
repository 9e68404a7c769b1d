//! Closed forms of checkpoint/restart under exponential failures, the oracles the Monte
//! Carlo is checked against.
//!
//! Notation (seconds): M job MTBF, δ blocking time of one checkpoint, R restart time, τ
//! compute between checkpoints, T_s failure-free solve time, T_w expected wall time.
//!
//! - Young (1974, CACM 17(9)): τ_opt ≈ √(2δM), first order, δ ≪ M.
//! - Daly (2006, FGCS 22(3)): τ_opt = √(2δM)·[1 + ⅓·√(δ/(2M)) + (1/9)·(δ/(2M))] − δ for
//!   δ < 2M, else M; and, failures striking during checkpoints and restarts as well,
//!   T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ, so the efficiency (goodput) is
//!   E = T_s/T_w = τ·e^{−R/M} / (M·(e^{(τ+δ)/M} − 1)).
//!
//! Daly's wall time is exact, not an approximation, for the process it describes: a
//! segment of length L that a failure restarts (after a restart R, itself restarted by a
//! failure) takes M·e^{R/M}·(e^{L/M} − 1) on average. [`discrete_wall_s`] applies it to the
//! job the Monte Carlo runs — whole intervals each followed by a checkpoint, then a last
//! (shorter) interval with none — so the two must agree to within the Monte Carlo's
//! sampling error.

/// Young's interval √(2δM), seconds.
pub fn young_tau_s(delta_s: f64, m_s: f64) -> f64 {
    (2.0 * delta_s * m_s).sqrt()
}

/// Daly's higher-order interval, seconds.
pub fn daly_tau_s(delta_s: f64, m_s: f64) -> f64 {
    if delta_s >= 2.0 * m_s {
        return m_s;
    }
    let x = delta_s / (2.0 * m_s);
    (2.0 * delta_s * m_s).sqrt() * (1.0 + x.sqrt() / 3.0 + x / 9.0) - delta_s
}

/// Expected time to complete a segment of length `l_s` under failures of mean `m_s`, each
/// followed by a restart `r_s` (itself restartable): M·e^{R/M}·(e^{L/M} − 1).
pub fn segment_wall_s(l_s: f64, r_s: f64, m_s: f64) -> f64 {
    m_s * (r_s / m_s).exp() * (l_s / m_s).exp_m1()
}

/// Daly's expected wall time T_w for T_s of work at interval τ.
pub fn daly_wall_s(work_s: f64, tau_s: f64, delta_s: f64, r_s: f64, m_s: f64) -> f64 {
    segment_wall_s(tau_s + delta_s, r_s, m_s) * work_s / tau_s
}

/// Daly's efficiency E = T_s/T_w.
pub fn daly_efficiency(tau_s: f64, delta_s: f64, r_s: f64, m_s: f64) -> f64 {
    tau_s * (-r_s / m_s).exp() / (m_s * ((tau_s + delta_s) / m_s).exp_m1())
}

/// Expected wall time of the job the Monte Carlo runs: ⌈T_s/τ⌉ − 1 whole intervals, each
/// followed by a checkpoint, then the rest of the work with no checkpoint after it.
pub fn discrete_wall_s(work_s: f64, tau_s: f64, delta_s: f64, r_s: f64, m_s: f64) -> f64 {
    let n = (work_s / tau_s).ceil().max(1.0) - 1.0;
    let rest = work_s - n * tau_s;
    n * segment_wall_s(tau_s + delta_s, r_s, m_s) + segment_wall_s(rest, r_s, m_s)
}

/// The interval that maximises Daly's efficiency, found numerically (golden-section search
/// on a log scale over [δ/1000 + 1 ns, 10·M]); the reference Daly's formula approximates.
pub fn exact_tau_s(delta_s: f64, r_s: f64, m_s: f64) -> f64 {
    let f = |ln_tau: f64| -daly_efficiency(ln_tau.exp(), delta_s, r_s, m_s);
    let (mut a, mut b) = ((delta_s / 1000.0 + 1e-9).ln(), (10.0 * m_s).ln());
    let g = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..200 {
        let c = b - g * (b - a);
        let d = a + g * (b - a);
        if f(c) < f(d) {
            b = d;
        } else {
            a = c;
        }
    }
    ((a + b) / 2.0).exp()
}

/// Γ(x) for x > 0: Lanczos (g = 7, 9 terms), relative error ~1e-15; the Weibull scale that
/// gives a mean MTBF is MTBF / Γ(1 + 1/k).
pub fn gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma(1.0 - x));
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    (2.0 * std::f64::consts::PI).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_matches_known_values() {
        for (x, want) in [(1.0, 1.0), (2.0, 1.0), (3.0, 2.0), (5.0, 24.0), (1.5, std::f64::consts::PI.sqrt() / 2.0)] {
            assert!((gamma(x) - want).abs() < 1e-12 * want, "Γ({x}) = {}", gamma(x));
        }
        // Γ(1 + 1/0.5) = Γ(3): a Weibull of shape 0.5 has mean 2·scale.
        assert!((gamma(0.5) - std::f64::consts::PI.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn young_and_daly_agree_when_the_checkpoint_is_short() {
        // δ ≪ M: Daly's correction terms vanish, relative difference ≈ ⅓√(δ/2M) − δ/τ.
        let m = 3600.0 * 24.0;
        for delta in [0.1, 1.0, 10.0] {
            let (y, d) = (young_tau_s(delta, m), daly_tau_s(delta, m));
            assert!((d - y).abs() / y < 0.01, "δ {delta}: Young {y} Daly {d}");
        }
        // And they part when δ is a good fraction of M.
        let (y, d) = (young_tau_s(600.0, 3600.0), daly_tau_s(600.0, 3600.0));
        assert!((d - y).abs() / y > 0.05);
        assert_eq!(daly_tau_s(7200.0, 3600.0), 3600.0);
    }

    #[test]
    fn daly_interval_is_near_the_exact_optimum_of_his_wall_time() {
        // Daly (2006) reports the higher-order estimate within a few percent of the true
        // optimum for δ up to about M/2 and much closer for δ ≪ M; the efficiency at it is
        // within 1e-3 of the best.
        for (delta, m) in [(10.0, 3600.0), (60.0, 3600.0), (300.0, 3600.0), (60.0, 36000.0), (1800.0, 3600.0)] {
            let (d, x) = (daly_tau_s(delta, m), exact_tau_s(delta, 300.0, m));
            let gap = daly_efficiency(x, delta, 300.0, m) - daly_efficiency(d, delta, 300.0, m);
            assert!((0.0..1e-3).contains(&gap), "δ {delta} M {m}: Daly {d} exact {x} gap {gap}");
            if delta / m <= 0.1 {
                assert!((d - x).abs() / x < 0.02, "δ {delta} M {m}: Daly {d} exact {x}");
            }
        }
    }

    #[test]
    fn first_order_overhead_matches_the_expansion() {
        // E ≈ 1 − δ/τ − (R + τ/2)/M when everything is small against M.
        let (delta, r, m) = (1.0, 10.0, 1e6);
        let tau = young_tau_s(delta, m);
        let e = daly_efficiency(tau, delta, r, m);
        let approx = 1.0 - delta / tau - (r + tau / 2.0) / m;
        assert!((e - approx).abs() < 1e-5, "{e} vs {approx}");
        // The discrete job with τ dividing T_s is Daly's wall time less the last checkpoint.
        let w = discrete_wall_s(100.0 * tau, tau, delta, r, m);
        let d = daly_wall_s(100.0 * tau, tau, delta, r, m);
        assert!(w < d && d - w < 1.01 * segment_wall_s(tau + delta, r, m) - segment_wall_s(tau, r, m));
    }
}
