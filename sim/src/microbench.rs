//! Published microbenchmarks (sim/data/gpu_microbench.csv) and the compute model's figure
//! for each: the fit set of the H100 / H200 / B200 profiles and its residuals.
//!
//! A row is one published figure with its source: a cuBLAS GEMM rate at (m, n, k), a fused
//! attention kernel's rate at (s, d, causal) in the kernel benchmarks' own convention
//! (causal FLOPs halved), an NCCL all-reduce bus bandwidth on 8 GPUs of one node, or an HBM
//! streaming rate. [`model_value`] computes the same figure from a profile through the code
//! the simulator runs ([`ComputeModel`], the fabric network); [`fit_gemm`] and
//! [`fit_attention`] are the grid searches the `fit_*` examples run and the tests repeat,
//! minimising the worst relative residual over a GPU's `fit` rows.

use strata_models::plan::{AttnShape, ComputeCost, Gemm};
use strata_models::{ClusterSpec, Dtype, GpuKind};

use crate::compute::ComputeModel;
use crate::net::NetworkKind;
use crate::net::collbench::{BenchOp, sweep_cluster};
use crate::net::nccl::NcclEnv;
use crate::profile::{AttentionParams, HardwareProfile};

/// The data file, compiled in.
pub const DATA: &str = include_str!("../data/gpu_microbench.csv");

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gemm,
    AttnFwd,
    AttnBwd,
    AllReduceNvls,
    AllReduceRing,
    HbmStream,
}

/// One published figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub gpu: GpuKind,
    pub kind: Kind,
    /// `cublas`, `flash-attention-2`, `cudnn`, `flash-attention-3`, `nccl`, …
    pub kernel: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub seq: u64,
    pub head_dim: u64,
    pub causal: bool,
    pub ranks: u32,
    /// The published figure, in `unit`.
    pub value: f64,
    pub unit: String,
    /// `fit`, `check` or `info`.
    pub role: String,
    pub source: String,
}

impl Point {
    /// The row's shape, one short label.
    pub fn label(&self) -> String {
        match self.kind {
            Kind::Gemm => format!("gemm {}x{}x{}", self.m, self.n, self.k),
            Kind::AttnFwd | Kind::AttnBwd => format!(
                "{} {} s={} d={}{}",
                self.kernel,
                if self.kind == Kind::AttnFwd { "fwd" } else { "bwd" },
                self.seq,
                self.head_dim,
                if self.causal { " causal" } else { "" }
            ),
            Kind::AllReduceNvls => format!("all-reduce NVLS x{}", self.ranks),
            Kind::AllReduceRing => format!("all-reduce ring x{}", self.ranks),
            Kind::HbmStream => "HBM stream".into(),
        }
    }
}

/// Parses the data file; an error names the line.
pub fn parse(text: &str) -> Result<Vec<Point>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.starts_with("gpu,") || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.splitn(14, ',').collect();
        let bad = |what: &str| format!("gpu_microbench.csv line {}: {what}: {line}", i + 1);
        if f.len() != 14 {
            return Err(bad("expected 14 fields"));
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad("a shape field is not a whole number"));
        let kind = match f[1] {
            "gemm" => Kind::Gemm,
            "attn-fwd" => Kind::AttnFwd,
            "attn-bwd" => Kind::AttnBwd,
            "allreduce-nvls" => Kind::AllReduceNvls,
            "allreduce-ring" => Kind::AllReduceRing,
            "hbm-stream" => Kind::HbmStream,
            _ => return Err(bad("unknown kind")),
        };
        out.push(Point {
            gpu: GpuKind::from_key(f[0]).ok_or_else(|| bad("unknown gpu"))?,
            kind,
            kernel: f[2].into(),
            m: num(f[3])?,
            n: num(f[4])?,
            k: num(f[5])?,
            seq: num(f[6])?,
            head_dim: num(f[7])?,
            causal: f[8] == "true",
            ranks: num(f[9])? as u32,
            value: f[10].parse().map_err(|_| bad("the value is not a number"))?,
            unit: f[11].into(),
            role: f[12].into(),
            source: f[13].into(),
        });
    }
    Ok(out)
}

/// Every row of the compiled-in data file.
pub fn points() -> Vec<Point> {
    parse(DATA).expect("sim/data/gpu_microbench.csv parses (checked by a test)")
}

/// The FLOPs a fused attention benchmark credits (4·B·s²·d forward, 2.5× backward, halved
/// when causal), for the FlashAttention-3 paper's setting: B·s = 16k tokens, 16 heads.
fn attention_cost(p: &Point) -> (ComputeCost, f64) {
    let bh = (16384 / p.seq).max(1) * 16;
    let g = |m, n, k| Gemm { m, n, k, batch: bh, fp8: false };
    let (s, d) = (p.seq, p.head_dim);
    let gemms = if p.kind == Kind::AttnFwd {
        vec![g(s, s, d), g(s, d, s)]
    } else {
        vec![g(s, s, d), g(s, d, s), g(s, d, s), g(s, d, s), g(s, s, d)]
    };
    let flops: u64 = gemms.iter().map(Gemm::flops).sum();
    let credited = flops as f64 * if p.causal { 0.5 } else { 1.0 };
    let attention = Some(AttnShape { batch_heads: bh, seq_q: s, seq_k: s, head_dim: d, causal: p.causal, fused: true });
    (ComputeCost { flops, gemms, attention, mem_bytes: 0, kernels: 0 }, credited)
}

/// The model's figure for a row, in the row's unit, under `profile` (bf16).
pub fn model_value(profile: &HardwareProfile, p: &Point) -> Result<f64, String> {
    let model = ComputeModel::new(profile, Dtype::Bf16);
    Ok(match p.kind {
        Kind::Gemm => {
            let g = Gemm { m: p.m, n: p.n, k: p.k, batch: 1, fp8: false };
            g.flops() as f64 / model.tile_model_s(&g) / 1e12
        }
        Kind::AttnFwd | Kind::AttnBwd => {
            let (cost, credited) = attention_cost(p);
            credited / model.gemms_s(&cost) / 1e12
        }
        Kind::AllReduceNvls | Kind::AllReduceRing => {
            let preset = match p.gpu {
                GpuKind::H100Sxm => "dgx-h100",
                GpuKind::H200Sxm => "dgx-h200",
                GpuKind::B200 => "dgx-b200",
                _ => "dgx-a100",
            };
            let mut c = ClusterSpec::preset(preset).ok_or_else(|| format!("no cluster preset {preset}"))?;
            c.nodes = 1;
            let env = NcclEnv { nvls_enable: p.kind == Kind::AllReduceNvls, ..NcclEnv::default() };
            let rows = sweep_cluster(&c, 0, NetworkKind::Fabric, &env, BenchOp::AllReduce, p.ranks, 8 << 30, 8 << 30)
                .map_err(|e| e.to_string())?;
            rows[0].busbw_gbps
        }
        // Element-wise kernels of a training step, not a pure stream: the profile's
        // fraction of HBM bandwidth (reported beside the stream figure, never fitted to it).
        Kind::HbmStream => profile.compute.hbm_gb_per_s * profile.compute.elementwise_bw_efficiency,
    })
}

/// model / published − 1.
pub fn residual(profile: &HardwareProfile, p: &Point) -> Result<f64, String> {
    Ok(model_value(profile, p)? / p.value - 1.0)
}

/// The rows of one GPU used for fitting a kind (and, for attention, one kernel).
pub fn fit_rows<'a>(points: &'a [Point], gpu: GpuKind, kernel: Option<&str>) -> Vec<&'a Point> {
    points
        .iter()
        .filter(|p| p.gpu == gpu && p.role == "fit")
        .filter(|p| match kernel {
            None => p.kind == Kind::Gemm,
            Some(k) => matches!(p.kind, Kind::AttnFwd | Kind::AttnBwd) && p.kernel == k,
        })
        .collect()
}

fn worst(profile: &HardwareProfile, rows: &[&Point]) -> f64 {
    rows.iter().map(|p| residual(profile, p).map_or(f64::INFINITY, f64::abs)).fold(0.0, f64::max)
}

/// Grid search of (gemm_efficiency, gemm_k_half): efficiency 0.600..0.950 by 0.005, k_half
/// 0..1000 by 25; returns (efficiency, k_half, worst |residual|).
pub fn fit_gemm(base: &HardwareProfile, rows: &[&Point]) -> (f64, f64, f64) {
    let mut best = (0.0, 0.0, f64::INFINITY);
    let mut p = base.clone();
    for e in 0..=70 {
        for kh in 0..=40 {
            p.compute.gemm_efficiency = 0.6 + 0.005 * e as f64;
            p.compute.gemm_k_half = 25.0 * kh as f64;
            let w = worst(&p, rows);
            if w < best.2 {
                best = (p.compute.gemm_efficiency, p.compute.gemm_k_half, w);
            }
        }
    }
    best
}

/// Minimax efficiency for rows whose model is proportional to it: with q = model/published
/// at efficiency 1, η = 2 / (q_min + q_max), rounded to three significant digits (0.001 for
/// the published kernels' 0.1..1; finer for a kernel far below the peak, whose shape fit a
/// coarser rounding would bend), and the worst residual there.
fn minimax_eff(p: &HardwareProfile, rows: &[&Point]) -> (f64, f64) {
    let q: Vec<f64> = rows.iter().map(|r| residual(p, r).map_or(f64::INFINITY, |e| e + 1.0)).collect();
    let (lo, hi) = q.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let raw = 2.0 / (lo + hi);
    let scale = if raw > 0.0 && raw.is_finite() { 10f64.powi(2 - raw.log10().floor() as i32) } else { 1000.0 };
    let eff = (raw * scale).round() / scale;
    (eff, q.iter().map(|v| (eff * v - 1.0).abs()).fold(0.0, f64::max))
}

/// Grid search of the fused attention kernel's parameters on its `fit` rows: forward
/// half-length 0..800 and causal extra 0..2000 (steps of 10 keys) with the minimax forward
/// efficiency, then the backward half-length 0..2000 with the minimax backward efficiency.
/// Returns the parameters and the worst |residual| over all the rows.
pub fn fit_attention(base: &HardwareProfile, rows: &[&Point], kernel: &str) -> (AttentionParams, f64) {
    let fwd: Vec<&Point> = rows.iter().copied().filter(|p| p.kind == Kind::AttnFwd).collect();
    let bwd: Vec<&Point> = rows.iter().copied().filter(|p| p.kind == Kind::AttnBwd).collect();
    let mut a = AttentionParams {
        kernel: kernel.into(),
        fwd_efficiency: 1.0,
        fwd_seq_half: 0.0,
        bwd_efficiency: 1.0,
        bwd_seq_half: 0.0,
        causal_seq_extra: 0.0,
    };
    let mut p = base.clone();
    let mut best_f = (f64::INFINITY, 0.0, 0.0, 1.0);
    for half in 0..=80 {
        for extra in 0..=200 {
            a.fwd_seq_half = 10.0 * half as f64;
            a.causal_seq_extra = 10.0 * extra as f64;
            p.compute.attention = Some(AttentionParams { fwd_efficiency: 1.0, ..a.clone() });
            let (eff, w) = minimax_eff(&p, &fwd);
            if w < best_f.0 {
                best_f = (w, a.fwd_seq_half, a.causal_seq_extra, eff);
            }
        }
    }
    (a.fwd_seq_half, a.causal_seq_extra, a.fwd_efficiency) = (best_f.1, best_f.2, best_f.3);
    let mut best_b = (f64::INFINITY, 0.0, 1.0);
    for half in 0..=200 {
        a.bwd_seq_half = 10.0 * half as f64;
        p.compute.attention = Some(AttentionParams { bwd_efficiency: 1.0, ..a.clone() });
        let (eff, w) = minimax_eff(&p, &bwd);
        if w < best_b.0 {
            best_b = (w, a.bwd_seq_half, eff);
        }
    }
    (a.bwd_seq_half, a.bwd_efficiency) = (best_b.1, best_b.2);
    p.compute.attention = Some(a.clone());
    (a, worst(&p, rows))
}

/// The residual table of a GPU's rows under a profile: published, model, residual, role.
pub fn residual_table(profile: &HardwareProfile, points: &[Point]) -> String {
    let mut out =
        format!("{:<44} {:>10} {:>10} {:>9}  {:<6} {}\n", "point", "published", "model", "residual", "role", "unit");
    // Attention rows of other kernels belong to those kernels' fits (see `fit_report`).
    let kernel = profile.compute.attention.as_ref().map(|a| a.kernel.as_str());
    let shown = |p: &&Point| {
        p.gpu == profile.gpu
            && (!matches!(p.kind, Kind::AttnFwd | Kind::AttnBwd) || kernel.is_none_or(|k| k == p.kernel))
    };
    for p in points.iter().filter(shown) {
        let line = match model_value(profile, p) {
            Ok(v) => format!(
                "{:<44} {:>10.1} {:>10.1} {:>+8.1}%  {:<6} {}\n",
                p.label(),
                p.value,
                v,
                100.0 * (v / p.value - 1.0),
                p.role,
                p.unit
            ),
            Err(e) => format!("{:<44} {:>10.1} {:>10} {:>9}  {:<6} {e}\n", p.label(), p.value, "-", "-", p.role),
        };
        out += &line;
    }
    out
}

/// What a `fit_*` example prints for one GPU: the GEMM fit and each attention kernel's fit
/// on the GPU's `fit` rows (with the built-in profile's values beside them), then every row
/// of the GPU under the built-in profile.
pub fn fit_report(gpu: GpuKind) -> String {
    let points = points();
    let shipped = HardwareProfile::builtin(gpu);
    let c = &shipped.compute;
    let mut out = format!("== {} ({} rows in sim/data/gpu_microbench.csv)\n", shipped.name, {
        points.iter().filter(|p| p.gpu == gpu).count()
    });
    let gemm = fit_rows(&points, gpu, None);
    if gemm.is_empty() {
        out += "gemm: no fit rows for this GPU; the profile's GEMM parameters are not fitted here\n";
    } else {
        let (e, kh, w) = fit_gemm(&shipped, &gemm);
        out += &format!(
            "gemm fit over {} points: gemm_efficiency {e:.3}, gemm_k_half {kh}, worst |residual| {:.1}% \
             (profile: {}, {})\n",
            gemm.len(),
            100.0 * w,
            c.gemm_efficiency,
            c.gemm_k_half
        );
    }
    let mut kernels: Vec<&str> = points
        .iter()
        .filter(|p| p.gpu == gpu && p.role == "fit" && matches!(p.kind, Kind::AttnFwd | Kind::AttnBwd))
        .map(|p| p.kernel.as_str())
        .collect();
    kernels.dedup();
    let mut alternatives = String::new();
    for k in kernels {
        let rows = fit_rows(&points, gpu, Some(k));
        let (a, w) = fit_attention(&shipped, &rows, k);
        let used = c.attention.as_ref().is_some_and(|x| x.kernel == k);
        if !used {
            let mut alt = shipped.clone();
            alt.compute.attention = Some(a.clone());
            let own: Vec<Point> = rows.iter().map(|p| (*p).clone()).collect();
            alternatives += &format!("\nresiduals of {k} under its own fit (not the profile's kernel):\n");
            alternatives += &residual_table(&alt, &own);
        }
        out += &format!(
            "attention fit {k} over {} points: fwd_efficiency {:.3}, fwd_seq_half {}, bwd_efficiency {:.3}, \
             bwd_seq_half {}, causal_seq_extra {}, worst |residual| {:.1}%{}\n",
            rows.len(),
            a.fwd_efficiency,
            a.fwd_seq_half,
            a.bwd_efficiency,
            a.bwd_seq_half,
            a.causal_seq_extra,
            100.0 * w,
            if used { "  <- the profile's kernel" } else { "" }
        );
    }
    match &c.attention {
        Some(a) => out += &format!("profile attention: {a:?}\n"),
        None => out += "profile attention: none (a fused core is costed as its GEMMs)\n",
    }
    out += &format!("\nresiduals under the built-in profile {} (model / published - 1):\n", shipped.name);
    out + &residual_table(&shipped, &points) + &alternatives
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_data_file_parses_and_every_row_names_its_source() {
        let pts = points();
        assert!(pts.len() > 60);
        for p in &pts {
            assert!(["fit", "check", "info"].contains(&p.role.as_str()), "{p:?}");
            assert!(p.source.len() > 20 && p.value > 0.0, "{p:?}");
        }
        for gpu in [GpuKind::H100Sxm, GpuKind::H200Sxm, GpuKind::B200] {
            assert!(pts.iter().any(|p| p.gpu == gpu && p.kind == Kind::Gemm), "{gpu:?}");
        }
        let e = parse("h100-sxm,gemm,cublas,1,2,x,0,0,false,0,1,TFLOP/s,fit,src").unwrap_err();
        assert!(e.contains("line 1") && e.contains("whole number"), "{e}");
    }

    /// The built-in profile is the grid search's optimum, and reproduces its fit rows.
    #[test]
    fn gemm_fits_reproduce_the_profiles_and_their_points() {
        let pts = points();
        for (gpu, tolerance) in [(GpuKind::H100Sxm, 0.07), (GpuKind::B200, 0.11)] {
            let p = HardwareProfile::builtin(gpu);
            let rows = fit_rows(&pts, gpu, None);
            let (eff, k_half, w) = fit_gemm(&p, &rows);
            assert!(close(eff, p.compute.gemm_efficiency) && close(k_half, p.compute.gemm_k_half), "{gpu:?}");
            assert!(w <= tolerance, "{gpu:?}: worst {w}");
            for r in rows {
                assert!(residual(&p, r).unwrap().abs() <= tolerance, "{gpu:?} {}", r.label());
            }
        }
    }

    #[test]
    fn the_h100_attention_fit_reproduces_the_profile_and_its_points() {
        let pts = points();
        let p = HardwareProfile::builtin(GpuKind::H100Sxm);
        let shipped = p.compute.attention.clone().unwrap();
        let rows = fit_rows(&pts, GpuKind::H100Sxm, Some(&shipped.kernel));
        assert_eq!(rows.len(), 18);
        let (a, w) = fit_attention(&p, &rows, &shipped.kernel);
        assert_eq!(a, shipped);
        assert!(w <= 0.05, "worst {w}");
        // The fused model differs from costing the core as score GEMMs: FlashAttention-2
        // causal at s = 8192 runs at 333 TFLOP/s (credited), the GEMM path at about 126.
        let causal = rows.iter().find(|r| r.causal && r.seq == 8192).unwrap();
        let mut unfused = p.clone();
        unfused.compute.attention = None;
        assert!(model_value(&unfused, causal).unwrap() < 0.5 * causal.value);
    }

    #[test]
    fn h200_checks_hold_with_the_h100_compute_fit() {
        let (h100, h200) = (HardwareProfile::builtin(GpuKind::H100Sxm), HardwareProfile::builtin(GpuKind::H200Sxm));
        let (a, b) = (&h100.compute, &h200.compute);
        assert_eq!((a.gemm_efficiency, a.gemm_k_half, &a.attention), (b.gemm_efficiency, b.gemm_k_half, &b.attention));
        for r in points().iter().filter(|r| r.gpu == GpuKind::H200Sxm && r.role == "check") {
            assert!(residual(&h200, r).unwrap().abs() <= 0.05, "{}", r.label());
        }
    }
}
