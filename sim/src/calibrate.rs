//! From measurements to a hardware profile: the fit behind `strata calibrate`.
//!
//! The runtime measures (`strata_runtime::calibrate`); this module turns the samples into
//! the profile the simulator reads, so that the compute model, the engine and the network
//! reproduce the CPU executor:
//!
//! - **GEMMs**: every measured shape becomes a `compute.gemms` line (2·m·n·k / seconds);
//!   the tile model's parameters (the peak, the efficiency, k½) are fitted to the same
//!   shapes for shapes that were not measured: peak P = the best measured rate, and for each
//!   k½ on a grid the efficiency η = geometric mean of measured / (P·k/(k + k½)), keeping the
//!   (η, k½) with the least squared log error;
//! - **pieces**: for each (piece, phase), the seconds a compute op took beyond its GEMMs
//!   (residual r = t − Σ T_gemm, T_gemm from the measured table) against the bytes its plan
//!   cost counts: least squares r = bytes / B + c over the distinct costs measured (median
//!   time per cost), with c ≥ 0 and B > 0 (through the origin when only one size was
//!   measured, or when the intercept would be negative);
//! - **the rest of compute**: one bandwidth for pieces not measured, Σ r / Σ bytes;
//! - **network**: per (kind, group size), the members' post and finish work at each measured
//!   size (the calibrated network interpolates between them) and the latency α, the median
//!   over sizes of the delay between the last post and a member noticing it;
//! - **execution**: one thread per rank, and the measured shared-core capacity.
//!
//! Units: seconds and bytes in the samples, the profile's units (GFLOP/s, GB/s, µs) out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_models::GpuKind;
use strata_models::plan::{ComputeCost, Phase, Piece};

use crate::compute::ComputeModel;
use crate::profile::{
    CommFit, CommFitKind, ExecutionParams, HardwareProfile, MeasuredGemm, NetworkParams, PieceRate, TileShape,
};

/// One GEMM shape: seconds per call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmTiming {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub seconds: f64,
}

/// One compute op as it ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PieceTiming {
    pub piece: Piece,
    pub phase: Phase,
    pub cost: ComputeCost,
    pub seconds: f64,
}

/// One communication: S bytes over `ranks` ranks — a member's CPU work posting and
/// finishing, and the delay between the last post and a member noticing it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommTiming {
    pub kind: CommFitKind,
    pub ranks: u32,
    pub bytes: u64,
    pub post_s: f64,
    pub finish_s: f64,
    pub latency_s: f64,
}

/// Everything `strata calibrate` measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    pub gemms: Vec<GemmTiming>,
    pub pieces: Vec<PieceTiming>,
    pub comm: Vec<CommTiming>,
    /// Processor sharing's capacity with the job's ranks all computing.
    pub shared_cores: f64,
    /// One line on what was measured (host, ranks, model).
    pub source: String,
}

/// The profile the measurements imply (a CPU profile: one thread per rank, shared cores).
pub fn fit(m: &Measurements) -> HardwareProfile {
    let mut p = HardwareProfile::builtin(GpuKind::Cpu);
    p.name = "cpu-calibrated".into();
    p.source = m.source.clone();
    fit_gemms(&mut p, &m.gemms);
    fit_pieces(&mut p, &m.pieces);
    p.execution = ExecutionParams { one_thread_per_rank: true, shared_cores: m.shared_cores };
    if !m.comm.is_empty() {
        p.network = Some(NetworkParams { source: m.source.clone(), links: fit_comm(&m.comm) });
    }
    p
}

fn fit_gemms(p: &mut HardwareProfile, gemms: &[GemmTiming]) {
    let c = &mut p.compute;
    c.gemms = gemms
        .iter()
        .filter(|g| g.seconds > 0.0)
        .map(|g| MeasuredGemm { m: g.m, n: g.n, k: g.k, gflops: 2.0 * (g.m * g.n * g.k) as f64 / g.seconds / 1e9 })
        .collect();
    c.gemms.sort_by_key(|g| (g.m, g.n, g.k));
    c.gemms.dedup_by_key(|g| (g.m, g.n, g.k));
    let Some(peak) = c.gemms.iter().map(|g| g.gflops).max_by(f64::total_cmp) else { return };
    // The tile model for unmeasured shapes: one small tile (a CPU core has no waves to
    // speak of), the best rate as the peak, (η, k½) fitted in log space.
    c.fp32_tflops = peak / 1e3;
    c.bf16_tflops = peak / 1e3;
    c.sm_count = 1;
    c.tiles = vec![TileShape { m: 8, n: 8, efficiency: 1.0 }];
    let mut best = (f64::INFINITY, 1.0, 0.0);
    for k_half in (0..=64).map(|i| i as f64 * 8.0) {
        let logs: Vec<f64> =
            c.gemms.iter().map(|g| (g.gflops / (peak * g.k as f64 / (g.k as f64 + k_half))).ln()).collect();
        let mean = logs.iter().sum::<f64>() / logs.len() as f64;
        let eff = mean.exp().min(1.0);
        let err: f64 = logs.iter().map(|l| (l - eff.ln()).powi(2)).sum();
        if err < best.0 {
            best = (err, eff, k_half);
        }
    }
    c.gemm_efficiency = best.1.max(1e-3);
    c.gemm_k_half = best.2;
}

/// Least squares y = a·x + b over points, with b ≥ 0 and a > 0 where possible; through the
/// origin when x has one value or the intercept would be negative.
fn line_fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    if sxx > 0.0 {
        let a = sxy / sxx;
        let b = my - a * mx;
        if a > 0.0 && b >= 0.0 {
            return (a, b);
        }
        if a <= 0.0 {
            // No growth with size: a fixed cost.
            return (0.0, my.max(0.0));
        }
    }
    let sxx0: f64 = points.iter().map(|(x, _)| x * x).sum();
    let sxy0: f64 = points.iter().map(|(x, y)| x * y).sum();
    if sxx0 > 0.0 { ((sxy0 / sxx0).max(0.0), 0.0) } else { (0.0, my.max(0.0)) }
}

fn fit_pieces(p: &mut HardwareProfile, pieces: &[PieceTiming]) {
    if pieces.is_empty() {
        return;
    }
    // GEMM time from the table just fitted (the pieces' own shapes are in it).
    let model = ComputeModel::new(p, strata_models::Dtype::Fp32);
    // (piece, phase) → the cost's counted bytes → the op's residual seconds, every time it ran.
    type Residuals = BTreeMap<u64, (u64, Vec<f64>)>;
    let mut by_kind: BTreeMap<(Piece, Phase), Residuals> = BTreeMap::new();
    for s in pieces {
        let gemm_s: f64 = s.cost.gemms.iter().map(|g| model.gemm_s(g)).sum();
        let key = s.cost.mem_bytes;
        let e = by_kind.entry((s.piece, s.phase)).or_default().entry(key).or_insert((s.cost.mem_bytes, Vec::new()));
        e.1.push(s.seconds - gemm_s);
    }
    let (mut all_r, mut all_bytes) = (0.0, 0.0);
    let mut rates = Vec::new();
    for ((piece, phase), costs) in by_kind {
        let points: Vec<(f64, f64)> = costs
            .values()
            .map(|(bytes, r)| {
                let mut r = r.clone();
                r.sort_by(f64::total_cmp);
                (*bytes as f64, r[r.len() / 2].max(0.0))
            })
            .collect();
        for (b, r) in &points {
            all_r += r;
            all_bytes += b;
        }
        let (per_byte, fixed_s) = line_fit(&points);
        // A piece whose time does not grow with its counted bytes moves them "instantly".
        let gb_per_s = if per_byte > 0.0 { 1.0 / per_byte / 1e9 } else { 1e6 };
        rates.push(PieceRate { piece, phase, gb_per_s, overhead_us: fixed_s * 1e6 });
    }
    p.compute.pieces = rates;
    if all_bytes > 0.0 && all_r > 0.0 {
        p.compute.hbm_gb_per_s = all_bytes / all_r / 1e9;
        p.compute.elementwise_bw_efficiency = 1.0;
        p.compute.kernel_overhead_us = 0.0;
    }
}

fn fit_comm(comm: &[CommTiming]) -> Vec<CommFit> {
    let mut by: BTreeMap<(CommFitKind, u32), BTreeMap<u64, Vec<CommTiming>>> = BTreeMap::new();
    for c in comm {
        by.entry((c.kind, c.ranks)).or_default().entry(c.bytes).or_default().push(*c);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    by.into_iter()
        .map(|((kind, ranks), sizes)| {
            let latency = median(sizes.values().flatten().map(|c| c.latency_s.max(0.0)).collect());
            CommFit {
                kind,
                ranks,
                latency_us: latency * 1e6,
                bytes: sizes.keys().copied().collect(),
                post_us: sizes.values().map(|v| median(v.iter().map(|c| c.post_s.max(0.0)).collect()) * 1e6).collect(),
                finish_us: sizes
                    .values()
                    .map(|v| median(v.iter().map(|c| c.finish_s.max(0.0)).collect()) * 1e6)
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::plan::Gemm;

    #[test]
    fn a_fitted_profile_reproduces_its_samples() {
        let g = |m, n, k, gflops: f64| GemmTiming { m, n, k, seconds: 2.0 * (m * n * k) as f64 / (gflops * 1e9) };
        let gemms = vec![g(256, 256, 256, 80.0), g(256, 768, 256, 90.0), g(128, 128, 32, 20.0)];
        // A piece of one 256³ GEMM plus 2 GB/s of counted bytes plus 30 µs, at two sizes.
        let cost = |bytes| ComputeCost {
            flops: 0,
            gemms: vec![Gemm { m: 256, n: 256, k: 256, batch: 1 }],
            attention: None,
            mem_bytes: bytes,
            kernels: 3,
        };
        let t = |bytes: u64| 2.0 * 256f64.powi(3) / 80e9 + bytes as f64 / 2e9 + 30e-6;
        let pieces = [1_000_000u64, 4_000_000]
            .iter()
            .flat_map(|&b| {
                (0..3).map(move |_| PieceTiming {
                    piece: Piece::Mlp,
                    phase: Phase::Forward,
                    cost: cost(b),
                    seconds: t(b),
                })
            })
            .collect();
        let line = |bytes: u64, latency_s: f64| CommTiming {
            kind: CommFitKind::AllReduce,
            ranks: 2,
            bytes,
            post_s: bytes as f64 / 3e9,
            finish_s: 2.0 * bytes as f64 / 3e9,
            latency_s,
        };
        let comm = vec![line(4096, 20e-6), line(1 << 20, 30e-6), line(1 << 20, 10e-6), line(1 << 20, 25e-6)];
        let m = Measurements { gemms, pieces, comm, shared_cores: 1.9, source: "test".into() };
        let p = fit(&m);
        let model = ComputeModel::new(&p, strata_models::Dtype::Fp32);
        for b in [1_000_000u64, 2_500_000, 4_000_000] {
            let got = model.op_cost_s(Piece::Mlp, Phase::Forward, &cost(b));
            assert!((got / t(b) - 1.0).abs() < 1e-9, "{b}: {got} vs {}", t(b));
        }
        let l = &p.network.as_ref().unwrap().links[0];
        // The median delay, and per size the median work.
        assert!((l.latency_us - 25.0).abs() < 1e-6, "{l:?}");
        assert_eq!(l.bytes, vec![4096, 1 << 20]);
        assert!((l.post_us[1] - (1 << 20) as f64 / 3e3).abs() < 1e-6, "{l:?}");
        assert_eq!(p.execution, ExecutionParams { one_thread_per_rank: true, shared_cores: 1.9 });
        // The tile model fallback is near the measured rates (within the fit's spread).
        let near = model.tile_model_s(&Gemm { m: 256, n: 512, k: 256, batch: 1 });
        let want = 2.0 * 256.0 * 512.0 * 256.0 / 85e9;
        assert!((near / want - 1.0).abs() < 0.5, "{near} vs {want}");
    }

    #[test]
    fn line_fit_keeps_costs_non_negative() {
        assert_eq!(line_fit(&[(1.0, 3.0), (2.0, 5.0)]), (2.0, 1.0));
        // A negative intercept refits through the origin.
        let (a, b) = line_fit(&[(1.0, 1.0), (2.0, 3.0)]);
        assert!(b == 0.0 && (a - 1.4).abs() < 1e-12, "{a} {b}");
        // One size: through the origin.
        assert_eq!(line_fit(&[(2.0, 4.0), (2.0, 4.0)]), (2.0, 0.0));
    }
}
