//! The hardware catalog: datasheet facts about each accelerator Strata knows.
//!
//! These are the vendor's peak numbers — dense tensor-core rates, HBM size and bandwidth,
//! NVLink bandwidth, SM count — not a timing model. How fast a kernel really runs is the
//! simulator's business (`strata-sim`'s compute model and its calibrated hardware
//! profiles); `models` only carries the facts that the accounting (MFU, "does it fit")
//! needs. Sources, per row: NVIDIA datasheets for A100 SXM4 (2020), H100 SXM5 (2022),
//! H200 SXM (2024) and HGX B200 (2024), as collected in the project's
//! `models/data/gpu_peaks.csv` (the A100/H100/H200 rows copied from the published sheet that
//! the tests use). Memory is what `nvidia-smi` reports (MiB), because that is what a job
//! can allocate from.
//!
//! Units: rates in TFLOP/s (1e12 FLOP/s), bandwidth in bytes/s, memory in bytes.

use serde::{Deserialize, Serialize};

/// An accelerator kind in the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuKind {
    #[serde(rename = "a100-40gb")]
    A100_40gb,
    #[serde(rename = "a100-80gb")]
    A100_80gb,
    #[serde(rename = "h100-sxm")]
    H100Sxm,
    #[serde(rename = "h200-sxm")]
    H200Sxm,
    /// H800 SXM5: the H100 die for the Chinese market, NVLink cut to 8 links (400 GB/s
    /// bidirectional); what DeepSeek-V3 trained on.
    #[serde(rename = "h800-sxm")]
    H800Sxm,
    #[serde(rename = "b200")]
    B200,
    /// A CPU core group standing in for a GPU: the CPU executor's ranks.
    #[serde(rename = "cpu")]
    Cpu,
}

impl GpuKind {
    /// Hopper (H100, H200, H800) or Blackwell (B200): the generations Transformer Engine's
    /// userbuffer overlap and fp8 were published on.
    pub fn hopper_or_newer(self) -> bool {
        matches!(self, GpuKind::H100Sxm | GpuKind::H200Sxm | GpuKind::H800Sxm | GpuKind::B200)
    }
}

/// Every catalog entry, for `--help` and tests.
pub const GPU_KINDS: &[GpuKind] = &[
    GpuKind::A100_40gb,
    GpuKind::A100_80gb,
    GpuKind::H100Sxm,
    GpuKind::H200Sxm,
    GpuKind::H800Sxm,
    GpuKind::B200,
    GpuKind::Cpu,
];

/// Datasheet figures of one accelerator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub kind: GpuKind,
    pub name: String,
    /// Dense (no sparsity) bf16 tensor-core peak.
    pub bf16_tflops: f64,
    /// Dense fp16 tensor-core peak.
    pub fp16_tflops: f64,
    /// Non-tensor-core fp32 peak (CUDA cores).
    pub fp32_tflops: f64,
    /// Dense TF32 tensor-core peak (what fp32 GEMMs get when TF32 is allowed).
    pub tf32_tflops: f64,
    /// Dense fp8 tensor-core peak; 0 where the GPU has no fp8 tensor cores (A100, CPU ranks).
    #[serde(default)]
    pub fp8_tflops: f64,
    /// Device memory a job can allocate from.
    pub hbm_bytes: u64,
    pub hbm_bw_bytes_per_s: f64,
    /// NVLink bandwidth per GPU per direction (half the datasheet's bidirectional figure).
    pub nvlink_bw_bytes_per_s: f64,
    pub sm_count: u32,
}

const MIB: u64 = 1 << 20;
const GB: f64 = 1e9;

impl GpuKind {
    /// The catalog name, as written in scenario files (`gpu = "h100-sxm"`).
    pub fn key(self) -> &'static str {
        match self {
            GpuKind::A100_40gb => "a100-40gb",
            GpuKind::A100_80gb => "a100-80gb",
            GpuKind::H100Sxm => "h100-sxm",
            GpuKind::H200Sxm => "h200-sxm",
            GpuKind::H800Sxm => "h800-sxm",
            GpuKind::B200 => "b200",
            GpuKind::Cpu => "cpu",
        }
    }

    /// Looks a catalog name up; `None` if it is not in the catalog.
    pub fn from_key(key: &str) -> Option<GpuKind> {
        GPU_KINDS.iter().copied().find(|k| k.key() == key)
    }

    /// The datasheet figures.
    pub fn spec(self) -> GpuSpec {
        let s = |name: &str, bf16, fp32, tf32, hbm_mib: u64, hbm_gbps: f64, nvlink_gbps: f64, sms| GpuSpec {
            kind: self,
            name: name.to_string(),
            bf16_tflops: bf16,
            fp16_tflops: bf16,
            fp32_tflops: fp32,
            tf32_tflops: tf32,
            fp8_tflops: 0.0,
            hbm_bytes: hbm_mib * MIB,
            hbm_bw_bytes_per_s: hbm_gbps * GB,
            nvlink_bw_bytes_per_s: nvlink_gbps * GB,
            sm_count: sms,
        };
        // Dense fp8 rates (half the datasheets' sparsity figures): H100/H200 SXM 1,979 TFLOP/s,
        // B200 4,500 (HGX B200: 72 PFLOP/s sparse fp8 per 8 GPUs); Ampere has no fp8.
        let fp8 = |spec: GpuSpec, tflops: f64| GpuSpec { fp8_tflops: tflops, ..spec };
        match self {
            // A100 SXM4: 312 dense bf16/fp16, 19.5 fp32, 156 TF32; 12 NVLink3 links, 600 GB/s bidirectional.
            GpuKind::A100_40gb => s("A100 SXM4 40GB", 312.0, 19.5, 156.0, 40_960, 1555.0, 300.0, 108),
            GpuKind::A100_80gb => s("A100 SXM4 80GB", 312.0, 19.5, 156.0, 81_920, 2039.0, 300.0, 108),
            // H100 SXM5: 989.4 dense bf16, 67 fp32, 494.7 TF32; 18 NVLink4 links, 900 GB/s bidirectional.
            GpuKind::H100Sxm => fp8(s("H100 SXM5 80GB", 989.4, 67.0, 494.7, 81_559, 3350.0, 450.0, 132), 1978.9),
            // H200 SXM: the H100 die with 141 GB HBM3e at 4.8 TB/s.
            GpuKind::H200Sxm => fp8(s("H200 SXM 141GB", 989.4, 67.0, 494.7, 143_771, 4800.0, 450.0, 132), 1978.9),
            // H800 SXM5: H100 compute and memory, 8 NVLink4 links (400 GB/s bidirectional; DeepSeek-V3
            // §3.1 measures 160 GB/s). Datasheet transcription (secondary): 989 bf16, 1,979 fp8 dense.
            GpuKind::H800Sxm => fp8(s("H800 SXM5 80GB", 989.4, 67.0, 494.7, 81_559, 3350.0, 200.0, 132), 1978.9),
            // B200 (HGX B200 datasheet): 2.25 PFLOP/s dense bf16, 180 GB HBM3e at 8 TB/s, NVLink5 1.8 TB/s bidirectional.
            GpuKind::B200 => fp8(s("B200 180GB", 2250.0, 75.0, 1100.0, 183_359, 8000.0, 900.0, 148), 4500.0),
            // A CPU rank: nominal figures for one AVX-512 core (about 0.16 TFLOP/s fp32 GEMM measured
            // with the `gemm` crate); `strata calibrate` replaces them with measurements.
            GpuKind::Cpu => s("CPU rank", 0.16, 0.16, 0.16, 16 * 1024, 20.0, 10.0, 1),
        }
    }
}

impl GpuSpec {
    /// The GPU has fp8 tensor cores (Hopper and later).
    pub fn has_fp8(&self) -> bool {
        self.fp8_tflops > 0.0
    }
}

impl std::fmt::Display for GpuKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        for k in GPU_KINDS {
            assert_eq!(GpuKind::from_key(k.key()), Some(*k));
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.key()));
        }
        assert_eq!(GpuKind::from_key("v100"), None);
    }

    #[test]
    fn a100_and_h100_figures_match_the_published_sheet() {
        // models/data/gpu_peaks.csv: A100 312 TFLOP/s, 2039 GB/s (80 GB); H100 989.4, 3.35 TB/s.
        let a = GpuKind::A100_80gb.spec();
        assert_eq!(a.bf16_tflops, 312.0);
        assert_eq!(a.hbm_bw_bytes_per_s, 2039e9);
        let h = GpuKind::H100Sxm.spec();
        assert_eq!(h.bf16_tflops, 989.4);
        assert_eq!(h.nvlink_bw_bytes_per_s, 450e9);
        // gpu_peaks.csv: H100 sparse bf16 1,978.9 = dense fp8 (fp8 doubles bf16's dense rate).
        assert_eq!(h.fp8_tflops, 1978.9);
        assert!(h.has_fp8() && !a.has_fp8() && !GpuKind::Cpu.spec().has_fp8());
        assert_eq!(GpuKind::B200.spec().fp8_tflops, 2.0 * GpuKind::B200.spec().bf16_tflops);
    }
}
