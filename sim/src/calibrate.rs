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
//!   then scaled, per kind and group size, to what the collectives cost inside the real
//!   jobs the pieces ran in (the median of in-job CPU over the line's prediction);
//! - **execution**: one thread per rank, the measured shared-core capacity, and the
//!   executor loop's CPU per op (the median over the jobs' ranks of their step's CPU outside
//!   any op, per op).
//!
//! Units: seconds and bytes in the samples, the profile's units (GFLOP/s, GB/s, µs) out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_models::GpuKind;
use strata_models::plan::{ComputeCost, Phase, Piece};

use crate::compute::ComputeModel;
use crate::profile::{
    CommFit, CommFitKind, ExecutionParams, HardwareProfile, MeasuredGemm, MeasuredOp, NetworkParams, PieceRate,
    TileShape,
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

/// A communication op as a real job ran it: the CPU seconds of its own work on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommInJob {
    pub kind: CommFitKind,
    pub ranks: u32,
    pub bytes: u64,
    pub cpu_s: f64,
}

/// Everything `strata calibrate` measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    pub gemms: Vec<GemmTiming>,
    pub pieces: Vec<PieceTiming>,
    pub comm: Vec<CommTiming>,
    /// Communication ops of the real jobs the pieces were measured in.
    #[serde(default)]
    pub comm_in_jobs: Vec<CommInJob>,
    /// Per rank of those jobs: (ops in its program, CPU seconds of its step outside the ops).
    #[serde(default)]
    pub loop_cpu: Vec<(u64, f64)>,
    /// Processor sharing's capacity with the job's ranks all computing.
    pub shared_cores: f64,
    /// The executor's copies around a collective with the job's ranks all copying, CPU ns
    /// per byte in [`ExecutionParams::staging_ns_per_byte`]'s order (zeros: not measured).
    #[serde(default)]
    pub staging_ns_per_byte: [f64; 3],
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
    let mut per_op: Vec<f64> = m.loop_cpu.iter().filter(|(ops, _)| *ops > 0).map(|(ops, s)| s / *ops as f64).collect();
    per_op.sort_by(f64::total_cmp);
    let loop_us_per_op = per_op.get(per_op.len() / 2).map_or(0.0, |s| s * 1e6);
    p.execution = ExecutionParams {
        one_thread_per_rank: true,
        shared_cores: m.shared_cores,
        loop_us_per_op,
        staging_message_ns_per_byte: m.staging_ns_per_byte[0],
        staging_tensor_ns_per_byte: m.staging_ns_per_byte[1],
        staging_copy_ns_per_byte: m.staging_ns_per_byte[2],
    };
    if !m.comm.is_empty() {
        let mut links = fit_comm(&m.comm);
        scale_to_jobs(&mut links, &m.comm_in_jobs);
        p.network = Some(NetworkParams { source: m.source.clone(), links });
    }
    p
}

/// Scales each line's work to what the collectives cost inside real jobs: the harness
/// times a collective alone, on warm buffers; in a job its data comes from and goes to the
/// pieces, among the job's allocations. Per (kind, group size), the median of in-job CPU /
/// the line's post + finish at the op's size; a line without in-job samples takes its
/// kind's median over the other group sizes, else stays as measured.
fn scale_to_jobs(links: &mut [CommFit], in_jobs: &[CommInJob]) {
    let net = match crate::net::CalibratedNetwork::new(&NetworkParams { source: String::new(), links: links.to_vec() })
    {
        Ok(n) => n,
        Err(_) => return, // an incomplete table (a test's): leave it as measured
    };
    let mut ratios: BTreeMap<(CommFitKind, u32), Vec<f64>> = BTreeMap::new();
    for c in in_jobs {
        let req = crate::net::CommRequest {
            kind: kind_to_comm(c.kind),
            ranks: (0..c.ranks).collect(),
            bytes: c.bytes,
            multiplicity: 1,
        };
        use crate::net::Network;
        let Some(w) = net.host_work(&req) else { continue };
        let model = (w.post_ns + w.finish_ns) as f64 * 1e-9;
        if model > 0.0 && c.cpu_s > 0.0 {
            ratios.entry((c.kind, c.ranks)).or_default().push(c.cpu_s / model);
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for l in links.iter_mut() {
        let own = ratios.get(&(l.kind, l.ranks)).map(|v| median(v));
        let kind: Vec<f64> = ratios.iter().filter(|((k, _), _)| *k == l.kind).flat_map(|(_, v)| v.clone()).collect();
        let Some(r) = own.or_else(|| (!kind.is_empty()).then(|| median(&kind))) else { continue };
        l.post_us.iter_mut().for_each(|v| *v *= r);
        l.finish_us.iter_mut().for_each(|v| *v *= r);
    }
}

fn kind_to_comm(k: CommFitKind) -> crate::net::CommKind {
    use strata_models::plan::CollKind;
    match k {
        CommFitKind::AllReduce => crate::net::CommKind::Collective(CollKind::AllReduce),
        CommFitKind::ReduceScatter => crate::net::CommKind::Collective(CollKind::ReduceScatter),
        CommFitKind::AllGather => crate::net::CommKind::Collective(CollKind::AllGather),
        CommFitKind::Broadcast => crate::net::CommKind::Collective(CollKind::Broadcast),
        CommFitKind::AllToAll => crate::net::CommKind::Collective(CollKind::AllToAll),
        CommFitKind::SendRecv => crate::net::CommKind::SendRecv,
        CommFitKind::RingExchange => crate::net::CommKind::Collective(CollKind::RingExchange),
    }
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

/// Weighted least squares y ≈ Σ_j c_j·x_j with every c_j ≥ 0: the best (least weighted
/// squared error) of the fits over every subset of the regressors whose solution is
/// non-negative. `rows` are (x, y, weight); at most three regressors.
fn nonneg_fit(rows: &[([f64; 3], f64, f64)], used: [bool; 3]) -> [f64; 3] {
    let mut best = ([0.0; 3], f64::INFINITY);
    for mask in 1u8..8 {
        let cols: Vec<usize> = (0..3).filter(|j| used[*j] && mask & (1 << j) != 0).collect();
        if cols.len() != (mask.count_ones() as usize) {
            continue;
        }
        // Normal equations A c = b over the chosen columns.
        let k = cols.len();
        let mut a = vec![vec![0.0; k + 1]; k];
        for (x, y, w) in rows {
            for (i, ci) in cols.iter().enumerate() {
                for (j, cj) in cols.iter().enumerate() {
                    a[i][j] += w * x[*ci] * x[*cj];
                }
                a[i][k] += w * x[*ci] * y;
            }
        }
        let Some(sol) = solve(a) else { continue };
        if sol.iter().any(|c| *c < 0.0 || !c.is_finite()) {
            continue;
        }
        let mut c = [0.0; 3];
        for (i, ci) in cols.iter().enumerate() {
            c[*ci] = sol[i];
        }
        let err: f64 = rows.iter().map(|(x, y, w)| w * (x[0] * c[0] + x[1] * c[1] + x[2] * c[2] - y).powi(2)).sum();
        if err < best.1 {
            best = (c, err);
        }
    }
    best.0
}

/// Gaussian elimination with partial pivoting on an augmented k × (k+1) system.
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let k = a.len();
    for col in 0..k {
        let pivot = (col..k).max_by(|i, j| a[*i][col].abs().total_cmp(&a[*j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

/// Every distinct (piece, phase, cost) measured: its cost and times.
type OpKey = (Piece, Phase, Vec<[u64; 4]>, u64);

fn by_op(pieces: &[PieceTiming]) -> BTreeMap<OpKey, (&ComputeCost, Vec<f64>)> {
    let mut ops: BTreeMap<OpKey, (&ComputeCost, Vec<f64>)> = BTreeMap::new();
    for s in pieces {
        let gemms = s.cost.gemms.iter().map(|g| [g.m, g.n, g.k, g.batch]).collect();
        ops.entry((s.piece, s.phase, gemms, s.cost.mem_bytes)).or_insert((&s.cost, Vec::new())).1.push(s.seconds);
    }
    ops
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The measured-op table of a profile (`compute.ops`): each distinct (piece, phase, cost)
/// at the median of its samples (the upper one of an even count). A plan op of exactly
/// that cost then takes this time; others use the fitted models.
pub fn measured_ops(pieces: &[PieceTiming]) -> Vec<MeasuredOp> {
    by_op(pieces)
        .iter()
        .map(|((piece, phase, gemms, bytes), (_, t))| MeasuredOp {
            piece: *piece,
            phase: *phase,
            gemms: gemms.clone(),
            mem_bytes: *bytes,
            us: median(t) * 1e6,
        })
        .collect()
}

fn fit_pieces(p: &mut HardwareProfile, pieces: &[PieceTiming]) {
    if pieces.is_empty() {
        return;
    }
    let ops = by_op(pieces);
    p.compute.ops = measured_ops(pieces);
    // For ops of other shapes, per (piece, phase): t ≈ s·T_gemm + bytes/B + c over the
    // measured ones, least squares on relative error, every coefficient ≥ 0.
    let model = ComputeModel::new(p, strata_models::Dtype::Fp32);
    // (piece, phase) → rows of ([T_gemm, bytes, 1], measured seconds, weight).
    type Rows = Vec<([f64; 3], f64, f64)>;
    let mut by_kind: BTreeMap<(Piece, Phase), Rows> = BTreeMap::new();
    for ((piece, phase, ..), (cost, t)) in &ops {
        let gemm_s: f64 = cost.gemms.iter().map(|g| model.gemm_s(g)).sum();
        let y = median(t);
        if y > 0.0 {
            by_kind.entry((*piece, *phase)).or_default().push(([gemm_s, cost.mem_bytes as f64, 1.0], y, 1.0 / (y * y)));
        }
    }
    let (mut all_r, mut all_bytes) = (0.0, 0.0);
    let mut rates = Vec::new();
    for ((piece, phase), rows) in by_kind {
        let has_gemms = rows.iter().any(|r| r.0[0] > 0.0);
        let c = nonneg_fit(&rows, [has_gemms, true, true]);
        for (x, y, _) in &rows {
            all_r += (y - c[0] * x[0]).max(0.0);
            all_bytes += x[1];
        }
        // A piece whose time does not grow with its counted bytes moves them "instantly".
        let gb_per_s = if c[1] > 0.0 { 1.0 / c[1] / 1e9 } else { 1e6 };
        let gemm_scale = if has_gemms { c[0] } else { 1.0 };
        rates.push(PieceRate { piece, phase, gemm_scale, gb_per_s, overhead_us: c[2] * 1e6 });
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

    /// A cost of one n³ GEMM and `bytes` of element-wise traffic over `kernels` launches.
    fn cube_cost(n: u64, bytes: u64, kernels: u32) -> ComputeCost {
        ComputeCost {
            flops: 0,
            gemms: vec![Gemm { m: n, n, k: n, batch: 1, fp8: false }],
            attention: None,
            mem_bytes: bytes,
            kernels,
        }
    }

    #[test]
    fn measured_ops_take_the_median_per_piece_phase_and_cost() {
        let t = |piece, phase, bytes, seconds| PieceTiming { piece, phase, cost: cube_cost(64, bytes, 1), seconds };
        // Twelve layers' attention forward (the same cost), one slow outlier; one backward.
        let mut pieces: Vec<PieceTiming> =
            (0..11).map(|i| t(Piece::Attn, Phase::Forward, 100, 1e-3 + 1e-6 * i as f64)).collect();
        pieces.push(t(Piece::Attn, Phase::Forward, 100, 9e-3));
        pieces.push(t(Piece::Attn, Phase::BackwardInput, 100, 2e-3));
        pieces.push(t(Piece::Attn, Phase::Forward, 200, 5e-3));
        let ops = measured_ops(&pieces);
        assert_eq!(ops.len(), 3, "one line per (piece, phase, cost)");
        let fwd = ops.iter().find(|o| o.phase == Phase::Forward && o.mem_bytes == 100).unwrap();
        assert!((fwd.us - 1006.0).abs() < 1e-9, "the median, not the outlier: {}", fwd.us);
        assert!(ops.iter().any(|o| o.phase == Phase::Forward && o.mem_bytes == 200 && (o.us - 5000.0).abs() < 1e-9));
        assert_eq!(fwd.gemms, vec![[64, 64, 64, 1]]);
    }

    #[test]
    fn a_fitted_profile_reproduces_its_samples() {
        let g = |m, n, k, gflops: f64| GemmTiming { m, n, k, seconds: 2.0 * (m * n * k) as f64 / (gflops * 1e9) };
        let gemms = vec![g(256, 256, 256, 80.0), g(256, 768, 256, 90.0), g(128, 128, 32, 20.0)];
        // A piece of one 256³ GEMM plus 2 GB/s of counted bytes plus 30 µs, at two sizes.
        let cost = |bytes| cube_cost(256, bytes, 3);
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
        let m = Measurements {
            gemms,
            pieces,
            comm,
            shared_cores: 1.9,
            loop_cpu: vec![(100, 1e-3), (200, 4e-3), (100, 2e-3)],
            source: "test".into(),
            ..Measurements::default()
        };
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
        // The median loop time per op: 10, 20, 20 µs.
        assert_eq!(
            p.execution,
            ExecutionParams {
                one_thread_per_rank: true,
                shared_cores: 1.9,
                loop_us_per_op: 20.0,
                ..Default::default()
            }
        );
        // The tile model fallback is near the measured rates (within the fit's spread).
        let near = model.tile_model_s(&Gemm { m: 256, n: 512, k: 256, batch: 1, fp8: false });
        let want = 2.0 * 256.0 * 512.0 * 256.0 / 85e9;
        assert!((near / want - 1.0).abs() < 0.5, "{near} vs {want}");
    }

    #[test]
    fn the_fit_keeps_costs_non_negative() {
        let row = |x: f64, y: f64| ([x, 0.0, 1.0], y, 1.0);
        let c = nonneg_fit(&[row(1.0, 3.0), row(2.0, 5.0)], [true, false, true]);
        assert!((c[0] - 2.0).abs() < 1e-12 && (c[2] - 1.0).abs() < 1e-12, "{c:?}");
        // A negative intercept refits through the origin: y = 1.4·x minimises the error.
        let c = nonneg_fit(&[row(1.0, 1.0), row(2.0, 3.0)], [true, false, true]);
        assert!(c[2] == 0.0 && (c[0] - 1.4).abs() < 1e-12, "{c:?}");
    }
}
