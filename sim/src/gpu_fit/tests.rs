//! The fit recovers a known profile from samples the model generates under it (exactly,
//! and near it under measurement noise), and refuses rates that are not rates.

use super::*;
use crate::profile::AttentionParams;

/// A profile off the built-in one in every fitted parameter, on the fits' grids.
fn truth() -> HardwareProfile {
    let mut t = HardwareProfile::builtin(GpuKind::H200Sxm);
    let elementwise = t.compute.hbm_gb_per_s * t.compute.elementwise_bw_efficiency;
    t.compute.hbm_gb_per_s = 4300.0;
    t.compute.elementwise_bw_efficiency = elementwise / 4300.0;
    t.compute.gemm_efficiency = 0.77;
    t.compute.gemm_k_half = 150.0;
    t.compute.attention = Some(AttentionParams {
        kernel: "strata-nvrtc".into(),
        fwd_efficiency: 0.3,
        fwd_seq_half: 80.0,
        bwd_efficiency: 0.25,
        bwd_seq_half: 300.0,
        causal_seq_extra: 200.0,
    });
    t
}

fn shapes() -> Vec<(u64, u64, u64)> {
    let mut s = Vec::new();
    for &(m, n) in &[(8192, 8192), (4096, 3072), (2048, 768), (16384, 2304), (1024, 1024)] {
        for &k in &[128, 256, 512, 768, 2048, 8192] {
            s.push((m, n, k));
        }
    }
    s
}

/// Samples as the model computes them under `t`, each scaled by `noise(i)`.
fn samples(t: &HardwareProfile, noise: &dyn Fn(usize) -> f64) -> GpuMeasurements {
    let gpu = t.gpu;
    let gemms = shapes()
        .into_iter()
        .enumerate()
        .map(|(i, (m, n, k))| {
            let p = gemm_point(gpu, &GemmRate { m, n, k, tflops: 1.0 }, "synthetic");
            GemmRate { m, n, k, tflops: microbench::model_value(t, &p).unwrap() * noise(i) }
        })
        .collect();
    let mut attention = Vec::new();
    for backward in [false, true] {
        for causal in [false, true] {
            for seq in [512, 1024, 2048, 4096, 8192] {
                let a = AttentionRate { backward, seq, head_dim: 128, causal, tflops: 1.0 };
                let p = attention_point(gpu, "strata-nvrtc", &a, "synthetic");
                let i = attention.len() + 100;
                attention.push(AttentionRate { tflops: microbench::model_value(t, &p).unwrap() * noise(i), ..a });
            }
        }
    }
    GpuMeasurements {
        gpu,
        source: "synthetic samples from a known profile".into(),
        gemms,
        attention_kernel: "strata-nvrtc".into(),
        attention,
        hbm_copy_gb_per_s: Some(t.compute.hbm_gb_per_s),
        elementwise_gb_per_s: None,
        all_reduce: Vec::new(),
    }
}

#[test]
fn the_fit_recovers_the_profile_its_samples_came_from() {
    let t = truth();
    let f = fit(&samples(&t, &|_| 1.0)).unwrap();
    let (c, w) = (&f.profile.compute, &t.compute);
    assert!((c.gemm_efficiency - w.gemm_efficiency).abs() < 1e-9, "{}", c.gemm_efficiency);
    assert_eq!(c.gemm_k_half, w.gemm_k_half);
    let (a, want) = (c.attention.as_ref().unwrap(), w.attention.as_ref().unwrap());
    assert_eq!((&a.kernel, a.fwd_seq_half, a.bwd_seq_half, a.causal_seq_extra), (&want.kernel, 80.0, 300.0, 200.0));
    assert!((a.fwd_efficiency - 0.3).abs() < 1e-9 && (a.bwd_efficiency - 0.25).abs() < 1e-9, "{a:?}");
    assert_eq!(c.hbm_gb_per_s, 4300.0);
    assert!((c.hbm_gb_per_s * c.elementwise_bw_efficiency - 4800.0 * 0.65).abs() < 1e-6);
    assert!(f.gemm_worst.unwrap() < 1e-9 && f.attention_worst.unwrap() < 1e-9, "{f:?}");
    assert!(f.residuals.iter().all(|r| r.residual.abs() < 1e-9));
    assert_eq!(f.residuals.len(), shapes().len() + 20);
    // Every measured shape is in the exact table; the profile round-trips through TOML.
    assert_eq!(c.gemms.len(), shapes().len());
    assert_eq!(HardwareProfile::from_toml(&f.profile.to_toml(), "fit").unwrap(), f.profile);
    assert_eq!(f.profile.name, "h200-sxm-measured");
    assert!(f.notes.iter().any(|n| n.contains("element-wise kernels not measured")), "{:?}", f.notes);
    // The table shows every row.
    assert_eq!(residual_table(&f).lines().count(), 1 + f.residuals.len());
}

#[test]
fn under_noise_the_fit_stays_near_and_says_how_near() {
    let t = truth();
    // ±3 %, deterministic.
    let f = fit(&samples(&t, &|i| 1.0 + 0.03 * ((i as f64) * 1.7).sin())).unwrap();
    let c = &f.profile.compute;
    assert!((c.gemm_efficiency - 0.77).abs() <= 0.03, "{}", c.gemm_efficiency);
    assert!(f.gemm_worst.unwrap() <= 0.035, "{:?}", f.gemm_worst);
    let a = c.attention.as_ref().unwrap();
    assert!((a.fwd_efficiency - 0.3).abs() <= 0.02 && (a.bwd_efficiency - 0.25).abs() <= 0.02, "{a:?}");
    assert!(f.attention_worst.unwrap() <= 0.035, "{:?}", f.attention_worst);
}

#[test]
fn gemms_alone_keep_the_base_attention_and_hbm() {
    let mut m = samples(&HardwareProfile::builtin(GpuKind::H200Sxm), &|_| 1.0);
    m.attention.clear();
    m.hbm_copy_gb_per_s = None;
    let f = fit(&m).unwrap();
    let base = HardwareProfile::builtin(GpuKind::H200Sxm);
    assert_eq!(f.profile.compute.attention, base.compute.attention);
    assert_eq!(f.profile.compute.hbm_gb_per_s, base.compute.hbm_gb_per_s);
    assert!((f.profile.compute.gemm_efficiency - base.compute.gemm_efficiency).abs() < 1e-9);
    assert_eq!(f.attention_worst, None);
    assert!(f.notes.iter().any(|n| n.contains("flash-attention-2 fit is kept")), "{:?}", f.notes);
    // Measured element-wise traffic sets its fraction of the copy.
    m.hbm_copy_gb_per_s = Some(4000.0);
    m.elementwise_gb_per_s = Some(3000.0);
    assert_eq!(fit(&m).unwrap().profile.compute.elementwise_bw_efficiency, 0.75);
}

#[test]
fn rates_that_are_not_rates_are_refused_by_name() {
    let mut m = samples(&truth(), &|_| 1.0);
    m.gemms[3].tflops = f64::NAN;
    let e = fit(&m).unwrap_err();
    assert!(e.contains("4096x3072x128") || e.contains("8192x8192x768"), "{e}");
    let mut m = samples(&truth(), &|_| 1.0);
    m.hbm_copy_gb_per_s = Some(0.0);
    assert!(fit(&m).unwrap_err().contains("the HBM copy measured 0 GB/s"));
    m.gemms.clear();
    m.hbm_copy_gb_per_s = None;
    assert!(fit(&m).unwrap_err().contains("no GEMM was measured"));
    // Element-wise faster than a copy is not a fraction of it.
    let mut m = samples(&truth(), &|_| 1.0);
    m.elementwise_gb_per_s = Some(5000.0);
    assert!(fit(&m).unwrap_err().contains("elementwise_bw_efficiency"));
}

/// A kernel at a few percent of the tensor-core peak (Strata's own, CUDA cores in fp32),
/// measured causal only: the efficiencies are not lost to the fit's 0.001 rounding.
#[test]
fn a_slow_causal_kernel_keeps_its_efficiency() {
    let mut t = truth();
    if let Some(a) = t.compute.attention.as_mut() {
        (a.fwd_efficiency, a.bwd_efficiency, a.fwd_seq_half, a.causal_seq_extra) = (0.0123, 0.0081, 0.0, 40.0);
    }
    let mut m = samples(&t, &|_| 1.0);
    m.attention.retain(|a| a.causal);
    let f = fit(&m).unwrap();
    let a = f.profile.compute.attention.as_ref().unwrap();
    assert!((a.fwd_efficiency - 0.0123).abs() < 1e-9 && (a.bwd_efficiency - 0.0081).abs() < 1e-9, "{a:?}");
    assert_eq!(a.fwd_seq_half + a.causal_seq_extra, 40.0);
    assert!(f.attention_worst.unwrap() < 1e-9);
    assert!(f.notes.iter().any(|n| n.contains("causal only")), "{:?}", f.notes);
}

/// A profile fitted to the built-in profile's own figures simulates the device check's
/// scenario as the built-in one does; one off by a slower GEMM rate predicts a longer step.
#[test]
fn a_fitted_profile_drives_the_simulator() {
    use crate::simulate::{SimOptions, simulate};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/gpt2-124m-1xh200.toml");
    let s = strata_models::Scenario::load(&path, &[]).unwrap();
    let plan = strata_models::plan::lower(&s).unwrap();
    let step = |p: Option<HardwareProfile>| {
        simulate(&plan, &SimOptions { profile: p, ..SimOptions::default() }).unwrap().step_time_s
    };
    let base = HardwareProfile::builtin(GpuKind::H200Sxm);
    let mut m = samples(&base, &|_| 1.0);
    m.attention.clear();
    m.hbm_copy_gb_per_s = None;
    let fitted = fit(&m).unwrap().profile;
    let (builtin, same) = (step(None), step(Some(fitted)));
    assert!((same / builtin - 1.0).abs() < 0.02, "fitted {same} s vs built-in {builtin} s");
    let mut slow = base.clone();
    slow.compute.gemm_efficiency = 0.6;
    let slower = step(Some(fit(&samples(&slow, &|_| 1.0)).unwrap().profile));
    assert!(slower > 1.1 * builtin, "slower GEMMs {slower} s vs {builtin} s");
}

/// Measured all-reduce busbw sits beside the simulator's NCCL model: figures the model gives
/// come back with no residual, a slower fabric with its shortfall; nothing is fitted.
#[test]
fn all_reduce_is_compared_with_the_nccl_model() {
    let base = HardwareProfile::builtin(GpuKind::H200Sxm);
    let mut m = samples(&base, &|_| 1.0);
    let model = |ranks: u32, bytes: u64| {
        let mut c = strata_models::ClusterSpec::preset("dgx-h200").unwrap();
        c.gpus_per_node = ranks;
        crate::net::collbench::sweep_cluster(
            &c,
            0,
            crate::net::NetworkKind::Fabric,
            &crate::net::nccl::NcclEnv::default(),
            crate::net::collbench::BenchOp::AllReduce,
            ranks,
            bytes,
            bytes,
        )
        .unwrap()[0]
            .busbw_gbps
    };
    m.all_reduce = vec![
        AllReduceRate { ranks: 8, bytes: 1 << 30, busbw_gbps: model(8, 1 << 30) },
        AllReduceRate { ranks: 2, bytes: 1 << 24, busbw_gbps: 0.5 * model(2, 1 << 24) },
    ];
    let f = fit(&m).unwrap();
    let ar: Vec<&Residual> = f.residuals.iter().filter(|r| r.label.starts_with("all-reduce")).collect();
    assert_eq!(ar.len(), 2);
    assert!(ar[0].residual.abs() < 1e-12 && ar[0].label == "all-reduce x8 1073741824 B", "{ar:?}");
    assert!((ar[1].residual - 1.0).abs() < 1e-9, "{ar:?}");
    assert!(ar[0].measured > 100.0, "8 H200s all-reduce at {} GB/s busbw in the model", ar[0].measured);
    assert!(f.notes.iter().any(|n| n.contains("not fitted")), "{:?}", f.notes);
    m.all_reduce[1].busbw_gbps = f64::NAN;
    assert!(fit(&m).unwrap_err().contains("over 2 GPUs"));
}

#[test]
fn launch_bound_gemms_stay_in_the_table_but_out_of_the_tile_fit() {
    // A 1024×64×1024 GEMM at 10 TFLOP/s (13 µs a call, as cuBLAS ran it on the H200): the
    // tile model cannot express the launch, so fitting to it would bend every other shape.
    let t = truth();
    let mut m = samples(&t, &|_| 1.0);
    m.gemms.push(GemmRate { m: 1024, n: 64, k: 1024, tflops: 10.0 });
    let f = fit(&m).unwrap();
    let c = &f.profile.compute;
    assert!(
        (c.gemm_efficiency - 0.77).abs() < 1e-9 && c.gemm_k_half == 150.0,
        "{} {}",
        c.gemm_efficiency,
        c.gemm_k_half
    );
    assert!(f.gemm_worst.unwrap() < 1e-9, "the fitted rows stay exact: {:?}", f.gemm_worst);
    assert!(c.gemms.iter().any(|g| (g.m, g.n, g.k) == (1024, 64, 1024) && (g.gflops - 10e3).abs() < 1e-6));
    let r = f.residuals.iter().find(|r| r.label == "gemm 1024x64x1024").expect("its residual is reported");
    assert!(r.residual > 1.0, "the tile model is far off a launch-bound call: {r:?}");
    assert!(f.notes.iter().any(|n| n.contains("launch-bound")), "{:?}", f.notes);
}
