//! A GPU profile fitted to measurements taken on the GPU itself (`strata calibrate
//! --backend cuda`): the same fits the published microbenchmarks go through
//! ([`crate::microbench::fit_gemm`], [`crate::microbench::fit_attention`]), from a different
//! source. The measured rates become `microbench::Point` rows (role `fit`, the source
//! naming the measurement), so the grid searches, the model figures and the residuals are
//! the code the `fit_*` examples run.
//!
//! What each measurement sets, on top of the catalog GPU's built-in profile:
//! - bf16 GEMM rates: `gemm_efficiency` and `gemm_k_half` (the tile model, for shapes not
//!   measured), and every measured shape kept as an exact `[[compute.gemms]]` entry;
//! - a fused attention kernel's rates (forward and backward, FlashAttention's convention:
//!   causal FLOPs halved): `[compute.attention]`;
//! - a device-to-device copy's rate: `hbm_gb_per_s` (what a stream reaches, not the
//!   datasheet). Element-wise kernels keep the rate the base profile gives them
//!   (`hbm · elementwise_bw_efficiency` is unchanged) unless their own rate was measured,
//!   which then sets `elementwise_bw_efficiency` as its fraction of the copy's.
//!
//! - NCCL all-reduce bus bandwidth (two GPUs or more): compared with the simulator's NCCL
//!   model on one node of the GPU's DGX preset (`net::collbench`, as `strata collbench`),
//!   residuals only — no profile parameter holds NVLink bandwidth (the catalog does).
//!
//! Anything not measured (NCCL on one GPU, overlap, memory overheads) stays the base
//! profile's, and the notes say so.

use serde::Serialize;
use strata_models::GpuKind;

use crate::microbench::{self, Kind, Point};
use crate::profile::{HardwareProfile, MeasuredGemm};

/// A measured GEMM faster than this per call is launch-bound (a kernel launch and its
/// completion take several µs on current GPUs): the tile model is not fitted to it.
pub const LAUNCH_BOUND_S: f64 = 20e-6;

/// A bf16 GEMM C (m×n) = A (m×k) · B (k×n) at its measured rate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GemmRate {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub tflops: f64,
}

/// A fused attention kernel's measured rate at (seq, head_dim), in the kernel benchmarks'
/// convention (4·s²·d FLOPs per head forward, 2.5× backward, halved when causal).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttentionRate {
    pub backward: bool,
    pub seq: u64,
    pub head_dim: u64,
    pub causal: bool,
    pub tflops: f64,
}

/// An NCCL all-reduce's bus bandwidth (nccl-tests' GB/s) over `ranks` GPUs of this node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllReduceRate {
    pub ranks: u32,
    pub bytes: u64,
    pub busbw_gbps: f64,
}

/// What was measured on one GPU (and, for NCCL, on the GPUs of its node).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuMeasurements {
    pub gpu: GpuKind,
    /// The device and the command, for the profile's `source`.
    pub source: String,
    pub gemms: Vec<GemmRate>,
    /// The attention kernel's name (`strata-nvrtc`, `flash-attention-2`) and its rates.
    pub attention_kernel: String,
    pub attention: Vec<AttentionRate>,
    /// A device-to-device copy, bytes read + written per second / 1e9.
    pub hbm_copy_gb_per_s: Option<f64>,
    /// Element-wise kernels' traffic per second / 1e9, when measured.
    pub elementwise_gb_per_s: Option<f64>,
    /// NCCL all-reduce over the node's GPUs (empty on one GPU).
    pub all_reduce: Vec<AllReduceRate>,
}

/// One measurement beside the fitted model's figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Residual {
    pub label: String,
    pub measured: f64,
    pub model: f64,
    /// model / measured − 1.
    pub residual: f64,
    pub unit: String,
}

/// The fitted profile, its residuals, and what was kept from the base profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuFit {
    pub profile: HardwareProfile,
    /// Worst |residual| of the tile model over the GEMM rows it was fitted to (the exact table
    /// aside; launch-bound rows left out, see [`LAUNCH_BOUND_S`]).
    pub gemm_worst: Option<f64>,
    pub attention_worst: Option<f64>,
    pub residuals: Vec<Residual>,
    pub notes: Vec<String>,
}

fn gemm_point(gpu: GpuKind, g: &GemmRate, source: &str) -> Point {
    Point {
        gpu,
        kind: Kind::Gemm,
        kernel: "cublas".into(),
        m: g.m,
        n: g.n,
        k: g.k,
        seq: 0,
        head_dim: 0,
        causal: false,
        ranks: 0,
        value: g.tflops,
        unit: "TFLOP/s".into(),
        role: "fit".into(),
        source: source.into(),
    }
}

fn attention_point(gpu: GpuKind, kernel: &str, a: &AttentionRate, source: &str) -> Point {
    Point {
        gpu,
        kind: if a.backward { Kind::AttnBwd } else { Kind::AttnFwd },
        kernel: kernel.into(),
        m: 0,
        n: 0,
        k: 0,
        seq: a.seq,
        head_dim: a.head_dim,
        causal: a.causal,
        ranks: 0,
        value: a.tflops,
        unit: "TFLOP/s".into(),
        role: "fit".into(),
        source: source.into(),
    }
}

/// Rates must be positive and finite, shapes non-zero: an error names the first that is not.
fn check(m: &GpuMeasurements) -> Result<(), String> {
    let good = |v: f64| v.is_finite() && v > 0.0;
    if let Some(g) = m.gemms.iter().find(|g| !good(g.tflops) || g.m == 0 || g.n == 0 || g.k == 0) {
        return Err(format!("the GEMM {}x{}x{} measured {} TFLOP/s: not a rate to fit", g.m, g.n, g.k, g.tflops));
    }
    if let Some(a) = m.attention.iter().find(|a| !good(a.tflops) || a.seq == 0 || a.head_dim == 0) {
        return Err(format!("attention s={} d={} measured {} TFLOP/s: not a rate to fit", a.seq, a.head_dim, a.tflops));
    }
    for (what, v) in [("the HBM copy", m.hbm_copy_gb_per_s), ("the element-wise kernels", m.elementwise_gb_per_s)] {
        if let Some(v) = v.filter(|v| !good(*v)) {
            return Err(format!("{what} measured {v} GB/s: not a rate to fit"));
        }
    }
    if m.gemms.is_empty() {
        return Err("no GEMM was measured: a GPU profile is fitted to GEMM rates first".into());
    }
    Ok(())
}

/// Fits the measurements into a profile of `m.gpu` (its built-in profile is the base).
pub fn fit(m: &GpuMeasurements) -> Result<GpuFit, String> {
    check(m)?;
    let base = HardwareProfile::builtin(m.gpu);
    let mut p = base.clone();
    let mut notes = Vec::new();
    p.name = format!("{}-measured", base.name);
    p.source = m.source.clone();

    // HBM first: the tile model's operand bound reads it.
    if let Some(copy) = m.hbm_copy_gb_per_s {
        let elementwise = base.compute.hbm_gb_per_s * base.compute.elementwise_bw_efficiency;
        p.compute.hbm_gb_per_s = copy;
        match m.elementwise_gb_per_s {
            Some(e) => p.compute.elementwise_bw_efficiency = e / copy,
            None => {
                p.compute.elementwise_bw_efficiency = elementwise / copy;
                notes.push(format!(
                    "element-wise kernels not measured: kept at the base profile's {elementwise:.0} GB/s \
                     (elementwise_bw_efficiency {:.3} of the measured copy)",
                    p.compute.elementwise_bw_efficiency
                ));
            }
        }
    } else {
        notes.push(format!("HBM not measured: hbm_gb_per_s stays the datasheet's {}", base.compute.hbm_gb_per_s));
    }

    let gemm_rows: Vec<Point> = m.gemms.iter().map(|g| gemm_point(m.gpu, g, &m.source)).collect();
    // The tile model has no per-call term, so a GEMM that takes a few launch latencies is
    // left out of its fit (kept in the exact table, and in the residuals).
    let launch_bound = |r: &&Point| 2.0 * (r.m * r.n * r.k) as f64 / (r.value * 1e12) < LAUNCH_BOUND_S;
    let all: Vec<&Point> = gemm_rows.iter().collect();
    let refs: Vec<&Point> = all.iter().copied().filter(|r| !launch_bound(r)).collect();
    let refs = if refs.is_empty() { all.clone() } else { refs };
    if refs.len() < all.len() {
        notes.push(format!(
            "{} of the {} GEMM shapes ran under {:.0} µs a call, launch-bound: kept in the table, left out of the tile              model's fit (which has no per-call term)",
            all.len() - refs.len(),
            all.len(),
            LAUNCH_BOUND_S * 1e6
        ));
    }
    let (eff, k_half, worst) = microbench::fit_gemm(&p, &refs);
    p.compute.gemm_efficiency = eff;
    p.compute.gemm_k_half = k_half;
    if eff <= 0.6 || eff >= 0.95 || k_half >= 1000.0 {
        notes.push(format!(
            "the GEMM fit sits at the edge of its grid (efficiency 0.600..0.950, k_half 0..1000): efficiency {eff:.3}, \
             k_half {k_half}; the measured shapes' exact rates are in the profile's table"
        ));
    }

    let mut attention_rows = Vec::new();
    let attention_worst = if m.attention.is_empty() {
        notes.push(match &base.compute.attention {
            Some(a) => format!("fused attention not measured: the base profile's {} fit is kept", a.kernel),
            None => "fused attention not measured: cores are costed as their GEMMs".into(),
        });
        None
    } else {
        attention_rows =
            m.attention.iter().map(|a| attention_point(m.gpu, &m.attention_kernel, a, &m.source)).collect();
        let refs: Vec<&Point> = attention_rows.iter().collect();
        let (a, _) = microbench::fit_attention(&p, &refs, &m.attention_kernel);
        p.compute.attention = Some(a);
        refine_attention_efficiency(&mut p, &refs)?;
        if m.attention.iter().all(|a| a.causal) {
            notes.push(
                "attention measured causal only: fwd_seq_half + causal_seq_extra is fitted, not each (the search \
                 keeps the smallest fwd_seq_half)"
                    .into(),
            );
        }
        Some(
            refs.iter()
                .map(|r| microbench::residual(&p, r).map(f64::abs))
                .try_fold(0.0f64, |w, r| r.map(|r| w.max(r)))?,
        )
    };

    // Residuals of the fitted models (before the exact table, which would make GEMMs exact).
    let mut residuals = Vec::new();
    for r in gemm_rows.iter().chain(&attention_rows) {
        let model = microbench::model_value(&p, r)?;
        residuals.push(Residual {
            label: r.label(),
            measured: r.value,
            model,
            residual: model / r.value - 1.0,
            unit: r.unit.clone(),
        });
    }
    residuals.extend(all_reduce_residuals(m)?);
    if m.all_reduce.is_empty() {
        notes.push("NCCL all-reduce not measured (one GPU, or no NCCL)".into());
    } else {
        notes.push(
            "NCCL all-reduce busbw is compared with the simulator's NCCL model (residuals), not fitted: NVLink \
             bandwidth is the GPU catalog's"
                .into(),
        );
    }
    p.compute.gemms = m
        .gemms
        .iter()
        .map(|g| ((g.m, g.n, g.k), MeasuredGemm { m: g.m, n: g.n, k: g.k, gflops: g.tflops * 1e3 }))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_values()
        .collect();
    notes.push(format!(
        "the {} measured GEMM shapes are kept at their bf16 rates (a bf16 job's table); other shapes and dtypes \
         use the fitted tile model",
        p.compute.gemms.len()
    ));
    notes.push("not measured here, kept from the base profile: overlap slowdowns, memory overheads, host".into());
    p.check().map_err(|e| format!("the fitted profile is not valid: {e}"))?;
    Ok(GpuFit { profile: p, gemm_worst: Some(worst), attention_worst, residuals, notes })
}

/// The simulator's busbw for each measured all-reduce: one node of the GPU's DGX preset
/// with as many GPUs as were measured, the fabric network, NCCL's default choice.
fn all_reduce_residuals(m: &GpuMeasurements) -> Result<Vec<Residual>, String> {
    use crate::net::NetworkKind;
    use crate::net::collbench::{BenchOp, sweep_cluster};
    use crate::net::nccl::NcclEnv;
    let preset = match m.gpu {
        GpuKind::H100Sxm => "dgx-h100",
        GpuKind::H200Sxm => "dgx-h200",
        GpuKind::B200 => "dgx-b200",
        _ => "dgx-a100",
    };
    let mut out = Vec::new();
    for r in &m.all_reduce {
        if !(r.busbw_gbps.is_finite() && r.busbw_gbps > 0.0) || r.ranks < 2 || r.bytes == 0 {
            return Err(format!(
                "the all-reduce of {} bytes over {} GPUs measured {} GB/s: not a rate to compare",
                r.bytes, r.ranks, r.busbw_gbps
            ));
        }
        let mut c = strata_models::ClusterSpec::preset(preset).ok_or_else(|| format!("no cluster preset {preset}"))?;
        (c.gpu, c.nodes, c.gpus_per_node) = (m.gpu, 1, r.ranks);
        let rows = sweep_cluster(
            &c,
            0,
            NetworkKind::Fabric,
            &NcclEnv::default(),
            BenchOp::AllReduce,
            r.ranks,
            r.bytes,
            r.bytes,
        )
        .map_err(|e| e.to_string())?;
        let model = rows.first().map(|row| row.busbw_gbps).ok_or("the simulated sweep returned no row")?;
        out.push(Residual {
            label: format!("all-reduce x{} {} B", r.ranks, r.bytes),
            measured: r.busbw_gbps,
            model,
            residual: model / r.busbw_gbps - 1.0,
            unit: "GB/s busbw".into(),
        });
    }
    Ok(out)
}

/// The attention fit rounds each efficiency to 0.001 (the published profiles' figures); a
/// kernel far from the tensor-core peak (Strata's own runs at a few percent of it) needs the
/// unrounded minimax value: with q = model / measured, the model proportional to the
/// efficiency, η · 2 / (q_min + q_max) balances the worst residuals, forward and backward
/// apart.
fn refine_attention_efficiency(p: &mut HardwareProfile, rows: &[&Point]) -> Result<(), String> {
    for backward in [false, true] {
        let q: Vec<f64> = rows
            .iter()
            .filter(|r| (r.kind == Kind::AttnBwd) == backward)
            .map(|r| microbench::residual(p, r).map(|e| e + 1.0))
            .collect::<Result<_, _>>()?;
        if q.is_empty() {
            continue;
        }
        let (lo, hi) = q.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        if let Some(a) = p.compute.attention.as_mut() {
            let eff = if backward { &mut a.bwd_efficiency } else { &mut a.fwd_efficiency };
            *eff = (*eff * 2.0 / (lo + hi)).min(1.0);
        }
    }
    Ok(())
}

/// The residual table: measured, model, residual.
pub fn residual_table(f: &GpuFit) -> String {
    let mut out = format!("{:<44} {:>10} {:>10} {:>9}  {}\n", "point", "measured", "model", "residual", "unit");
    for r in &f.residuals {
        out += &format!(
            "{:<44} {:>10.1} {:>10.1} {:>+8.1}%  {}\n",
            r.label,
            r.measured,
            r.model,
            100.0 * r.residual,
            r.unit
        );
    }
    out
}

#[cfg(test)]
mod tests;
