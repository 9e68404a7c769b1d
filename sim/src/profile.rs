//! Hardware profiles: the parameters of the compute model and the memory model for one GPU
//! kind, as TOML files.
//!
//! A profile says how fast this GPU really runs the pieces of a plan, not what its
//! datasheet promises: the fraction of the tensor-core peak a large GEMM reaches, how
//! small inner dimensions and small tiles fall short of it, the fraction of HBM bandwidth
//! that element-wise kernels reach, a per-kernel overhead, how much compute slows down
//! while NCCL kernels share the SMs, and what a process holds in memory beyond the plan's
//! buffers (CUDA context, NCCL buffers, allocator slack). [`crate::compute`] and
//! [`crate::memory`] give the equations.
//!
//! Built-in profiles live in `sim/profiles/*.toml` (compiled in with `include_str!`); each
//! file documents where its numbers come from. `strata calibrate` writes a file of the same
//! shape from measurements; [`HardwareProfile::load`] reads one. Unknown keys are errors.
//!
//! A measured profile can carry more than the datasheet-shaped parameters, each optional
//! (absent in the GPU profiles, which keep their meaning unchanged):
//! - `compute.gemms`: the GEMM rate measured at exact (m, n, k) shapes, used for those
//!   shapes instead of the tile model;
//! - `compute.pieces`: per (piece, phase), the rate at which that piece moves the bytes the
//!   plan counts for its element-wise work, and a fixed cost per call (what the piece does
//!   besides its GEMMs, measured rather than assumed to stream at one bandwidth);
//! - `[execution]`: how ranks run — on one thread each, so a rank's compute never overlaps
//!   its own communication (the CPU executor), and on a number of cores shared by the ranks
//!   that compute at the same instant (processor sharing);
//! - `[network]`: a latency and a bandwidth per collective kind and group size, measured on
//!   the executor's own communicator; the simulator then uses
//!   [`crate::net::CalibratedNetwork`] instead of a topology model.
//!
//! Units are in the key names: TFLOP/s (1e12 FLOP/s), GB/s (1e9 bytes/s), GFLOP/s, µs, MiB
//! (2^20 bytes).

use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_models::plan::{Phase, Piece};
use strata_models::{Dtype, GpuKind};

mod comm;
pub use comm::{CommFit, CommFitKind, NetworkParams};

/// One GEMM tile shape the library can pick, with how well it keeps an SM busy relative to
/// the best (large) tile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TileShape {
    pub m: u64,
    pub n: u64,
    /// Per-SM throughput of this tile relative to the profile's `gemm_efficiency` (≤ 1).
    pub efficiency: f64,
}

/// The compute model's parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeParams {
    /// Dense tensor-core peak for 16-bit GEMMs (bf16 and fp16).
    pub bf16_tflops: f64,
    /// The peak fp32 training GEMMs run at (CUDA-core fp32; TF32 is off by default in
    /// PyTorch matmuls).
    pub fp32_tflops: f64,
    /// Dense tensor-core peak for fp8 (E4M3/E5M2) GEMMs, from the datasheet (H100/H200
    /// SXM 1,979; B200 4,500: twice bf16 on Hopper and Blackwell). Absent on GPUs without
    /// fp8 tensor cores (A100, V100, CPUs): an fp8 GEMM then runs at the bf16 rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_tflops: Option<f64>,
    /// Fraction of the fp8 peak a large GEMM sustains (as `gemm_efficiency` for bf16);
    /// absent = `gemm_efficiency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_gemm_efficiency: Option<f64>,
    pub sm_count: u32,
    pub hbm_gb_per_s: f64,
    /// Fraction of the peak a large, well-shaped GEMM sustains (clocks under load, kernel
    /// prologue/epilogue, tensor-core issue limits).
    pub gemm_efficiency: f64,
    /// Inner dimension k at which a GEMM reaches half of `gemm_efficiency`: efficiency ·
    /// k / (k + k_half) models the fixed per-tile cost of loading and storing.
    pub gemm_k_half: f64,
    /// Tile shapes the GEMM library chooses among (the fastest for each shape is taken).
    pub tiles: Vec<TileShape>,
    /// Fraction of HBM bandwidth that element-wise kernels (norms, softmax, dropout,
    /// activations, the optimizer) and memory-bound GEMMs sustain.
    pub elementwise_bw_efficiency: f64,
    /// Fixed cost per kernel: launch gap and tail of a kernel on a busy stream.
    pub kernel_overhead_us: f64,
    /// GEMM rates measured at exact shapes; they override the tile model for those shapes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemms: Vec<MeasuredGemm>,
    /// Measured rates per model piece, for pieces not in `ops`; they override
    /// `elementwise_bw_efficiency` and `kernel_overhead_us` for those pieces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pieces: Vec<PieceRate>,
    /// Compute ops measured as the executor runs them: a plan op of the same piece, phase
    /// and cost takes the measured time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<MeasuredOp>,
    /// The fused attention kernel's throughput, fitted to its published benchmarks; absent,
    /// a fused core is costed as its GEMMs (the A100 profiles, fitted without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionParams>,
}

/// Throughput of a fused (FlashAttention-style) attention kernel as a fraction of the
/// 16-bit peak: rate = P · η · x / (x + x_½), with x the keys a query attends to on average
/// (s, or s/2 under a causal mask, whose diagonal blocks cost `causal_seq_extra` more keys
/// of fixed work). FLOPs are the plan's core GEMM FLOPs (4·b·a·s²·d forward, 2.5× that
/// backward), halved under a causal mask — the convention of the kernels' benchmarks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionParams {
    /// Which kernel's benchmarks the numbers come from, one line.
    pub kernel: String,
    pub fwd_efficiency: f64,
    pub fwd_seq_half: f64,
    pub bwd_efficiency: f64,
    pub bwd_seq_half: f64,
    pub causal_seq_extra: f64,
}

/// One compute op as measured (median time): its piece and phase and the cost that
/// identifies its shapes (GEMMs as [m, n, k, batch], element-wise bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredOp {
    pub piece: Piece,
    pub phase: Phase,
    pub gemms: Vec<[u64; 4]>,
    pub mem_bytes: u64,
    pub us: f64,
}

/// One GEMM shape as measured: C(m×n) = A(m×k)·B(k×n) at `gflops` (2·m·n·k FLOPs per call,
/// the call's fixed costs included).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredGemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub gflops: f64,
}

/// What one (piece, phase) costs: its GEMMs' time (from the GEMM table or the tile model)
/// times `gemm_scale` (how the piece's own GEMM layouts and operands compare with the
/// table's), its element-wise bytes (as the plan counts them) at `gb_per_s`, and
/// `overhead_us` per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PieceRate {
    pub piece: Piece,
    pub phase: Phase,
    #[serde(default = "one")]
    pub gemm_scale: f64,
    pub gb_per_s: f64,
    pub overhead_us: f64,
}

fn one() -> f64 {
    1.0
}

/// How much compute slows down while communication kernels of a stream run beside it:
/// compute time × (1 + Σ over busy streams (factor − 1)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlapParams {
    pub tp_slowdown: f64,
    pub dp_slowdown: f64,
    pub pp_slowdown: f64,
}

/// What a rank holds beyond the plan's buffers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryParams {
    /// CUDA context, kernels images and library handles (cuBLAS workspace), per process.
    pub cuda_context_mib: f64,
    /// Channels per collective communicator.
    pub nccl_channels: u32,
    /// Channels per point-to-point peer.
    pub nccl_p2p_channels: u32,
    /// Buffer per channel and peer connection (Simple 4 MiB + LL128 4.69 MiB + LL 0.5 MiB).
    pub nccl_buffer_mib: f64,
    /// Caching-allocator slack on top of the peak of live buffers (fragmentation, block
    /// rounding), as a fraction of that peak.
    pub allocator_fragmentation: f64,
}

/// Per-step costs outside the plan's ops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostParams {
    /// Host-side work once per step that the GPU waits for (optimizer bookkeeping, loss
    /// reduction, the iteration's synchronisation), µs.
    pub step_overhead_us: f64,
}

impl ExecutionParams {
    /// The executor's copies around a collective, ns per byte: [into a fresh message, into
    /// fresh per-unit tensors, over held tensors].
    pub fn staging_ns_per_byte(&self) -> [f64; 3] {
        [self.staging_message_ns_per_byte, self.staging_tensor_ns_per_byte, self.staging_copy_ns_per_byte]
    }
}

/// How ranks execute and share the machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionParams {
    /// A rank runs its four streams interleaved on one thread (the CPU executor): while it
    /// computes, none of its communication is posted or completed; GPUs run streams
    /// concurrently (false).
    #[serde(default)]
    pub one_thread_per_rank: bool,
    /// Cores shared by every rank of the job (processor sharing: n ranks computing at once
    /// each run at min(1, cores / n) of their speed). 0: every rank has a device of its own.
    #[serde(default)]
    pub shared_cores: f64,
    /// CPU time the executor's loop spends per op of a rank's program beyond the ops' own
    /// work (noticing messages, checking what can start or finish, measuring memory), µs.
    #[serde(default)]
    pub loop_us_per_op: f64,
    /// CPU time per byte the executor copies into a freshly allocated message before a
    /// collective (the flat message of a gradient or parameter bucket), ns — page faults
    /// included ([`strata_models::plan::exec::staging`]).
    #[serde(default)]
    pub staging_message_ns_per_byte: f64,
    /// CPU time per byte it copies into freshly allocated per-unit tensors after one
    /// (ZeRO-3's gathered parameters, one tensor per layer or embedding), ns.
    #[serde(default)]
    pub staging_tensor_ns_per_byte: f64,
    /// CPU time per byte it copies back over tensors a rank holds, ns.
    #[serde(default)]
    pub staging_copy_ns_per_byte: f64,
}

/// A hardware profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub name: String,
    /// The catalog GPU this profile describes.
    pub gpu: GpuKind,
    /// Where the numbers come from, one line.
    pub source: String,
    pub compute: ComputeParams,
    pub overlap: OverlapParams,
    pub memory: MemoryParams,
    pub host: HostParams,
    #[serde(default)]
    pub execution: ExecutionParams,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkParams>,
}

/// Why a profile could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read hardware profile {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("hardware profile {origin} is not valid: {message}")]
    Parse { origin: String, message: String },
}

const A100_40GB: &str = include_str!("../profiles/a100-40gb.toml");
const A100_80GB: &str = include_str!("../profiles/a100-80gb.toml");
const H100_SXM: &str = include_str!("../profiles/h100-sxm.toml");
const H200_SXM: &str = include_str!("../profiles/h200-sxm.toml");
const H800_SXM: &str = include_str!("../profiles/h800-sxm.toml");
const B200: &str = include_str!("../profiles/b200.toml");
const CPU: &str = include_str!("../profiles/cpu.toml");

impl HardwareProfile {
    /// The built-in profile of a catalog GPU.
    pub fn builtin(gpu: GpuKind) -> HardwareProfile {
        let (text, file) = match gpu {
            GpuKind::A100_40gb => (A100_40GB, "a100-40gb.toml"),
            GpuKind::A100_80gb => (A100_80GB, "a100-80gb.toml"),
            GpuKind::H100Sxm => (H100_SXM, "h100-sxm.toml"),
            GpuKind::H200Sxm => (H200_SXM, "h200-sxm.toml"),
            GpuKind::H800Sxm => (H800_SXM, "h800-sxm.toml"),
            GpuKind::B200 => (B200, "b200.toml"),
            GpuKind::Cpu => (CPU, "cpu.toml"),
        };
        // The built-in files are checked by a test; failing here is a build defect.
        HardwareProfile::from_toml(text, file).expect("built-in hardware profile parses")
    }

    /// Reads a profile file.
    pub fn load(path: &Path) -> Result<HardwareProfile, ProfileError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io { path: origin.clone(), source })?;
        HardwareProfile::from_toml(&text, &origin)
    }

    /// Parses and checks profile text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<HardwareProfile, ProfileError> {
        let p: HardwareProfile =
            toml::from_str(text).map_err(|e| ProfileError::Parse { origin: origin.into(), message: e.to_string() })?;
        p.check().map_err(|message| ProfileError::Parse { origin: origin.into(), message })?;
        Ok(p)
    }

    /// The profile as TOML (what `strata calibrate` writes).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a profile always serialises")
    }

    /// Range checks; every message names the key and the value.
    pub fn check(&self) -> Result<(), String> {
        let c = &self.compute;
        let mut bad = Vec::new();
        let mut positive = |key: &str, v: f64| {
            if !(v > 0.0 && v.is_finite()) {
                bad.push(format!("{key} = {v}: it must be a positive number"));
            }
        };
        positive("compute.bf16_tflops", c.bf16_tflops);
        positive("compute.fp32_tflops", c.fp32_tflops);
        positive("compute.hbm_gb_per_s", c.hbm_gb_per_s);
        if let Some(v) = c.fp8_tflops {
            positive("compute.fp8_tflops", v);
        }
        if let Some(v) = c.fp8_gemm_efficiency.filter(|v| !(*v > 0.0 && *v <= 1.0)) {
            bad.push(format!("compute.fp8_gemm_efficiency = {v}: it is a fraction of the peak, in (0, 1]"));
        }
        for (key, v) in [
            ("compute.gemm_efficiency", c.gemm_efficiency),
            ("compute.elementwise_bw_efficiency", c.elementwise_bw_efficiency),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                bad.push(format!("{key} = {v}: it is a fraction of the peak, in (0, 1]"));
            }
        }
        if c.sm_count == 0 {
            bad.push("compute.sm_count = 0: a GPU has at least one SM".into());
        }
        if c.tiles.is_empty() {
            bad.push("compute.tiles is empty: list at least one GEMM tile shape".into());
        }
        for (i, t) in c.tiles.iter().enumerate() {
            if t.m == 0 || t.n == 0 || !(t.efficiency > 0.0 && t.efficiency <= 1.0) {
                bad.push(format!(
                    "compute.tiles[{i}] = {}×{} at {}: tiles need positive sides and an efficiency in (0, 1]",
                    t.m, t.n, t.efficiency
                ));
            }
        }
        if !(c.kernel_overhead_us >= 0.0 && c.gemm_k_half >= 0.0 && self.host.step_overhead_us >= 0.0) {
            bad.push(format!(
                "compute.kernel_overhead_us = {}, compute.gemm_k_half = {} and host.step_overhead_us = {} \
                 must not be negative",
                c.kernel_overhead_us, c.gemm_k_half, self.host.step_overhead_us
            ));
        }
        let o = &self.overlap;
        for (key, v) in [
            ("overlap.tp_slowdown", o.tp_slowdown),
            ("overlap.dp_slowdown", o.dp_slowdown),
            ("overlap.pp_slowdown", o.pp_slowdown),
        ] {
            if !(1.0..=4.0).contains(&v) {
                bad.push(format!("{key} = {v}: a slowdown factor is between 1 (none) and 4"));
            }
        }
        let m = &self.memory;
        if !(m.cuda_context_mib >= 0.0 && m.nccl_buffer_mib >= 0.0 && (0.0..=1.0).contains(&m.allocator_fragmentation))
        {
            bad.push(format!(
                "memory.cuda_context_mib = {}, memory.nccl_buffer_mib = {} must not be negative and \
                 memory.allocator_fragmentation = {} must be in [0, 1]",
                m.cuda_context_mib, m.nccl_buffer_mib, m.allocator_fragmentation
            ));
        }
        if let Some(a) = &c.attention {
            let frac = |v: f64| v > 0.0 && v <= 1.0;
            let keys = |v: f64| v >= 0.0 && v.is_finite();
            if !(frac(a.fwd_efficiency)
                && frac(a.bwd_efficiency)
                && keys(a.fwd_seq_half)
                && keys(a.bwd_seq_half)
                && keys(a.causal_seq_extra))
            {
                bad.push(format!(
                    "compute.attention = {a:?}: the efficiencies are fractions of the peak in (0, 1] and the \
                     sequence lengths not negative"
                ));
            }
        }
        self.check_measured(&mut bad);
        if bad.is_empty() { Ok(()) } else { Err(bad.join("\n")) }
    }

    /// Range checks of the measured (optional) sections.
    fn check_measured(&self, bad: &mut Vec<String>) {
        let rate = |v: f64| v > 0.0 && v.is_finite();
        for (i, g) in self.compute.gemms.iter().enumerate() {
            if g.m == 0 || g.n == 0 || g.k == 0 || !rate(g.gflops) {
                bad.push(format!(
                    "compute.gemms[{i}] = {}×{}×{} at {} GFLOP/s: shapes must be positive and the rate a positive number",
                    g.m, g.n, g.k, g.gflops
                ));
            }
        }
        for (i, p) in self.compute.pieces.iter().enumerate() {
            let scale_ok = p.gemm_scale >= 0.0 && p.gemm_scale.is_finite();
            if !(rate(p.gb_per_s) && p.overhead_us >= 0.0 && p.overhead_us.is_finite() && scale_ok) {
                bad.push(format!(
                    "compute.pieces[{i}] ({} {}) = {} × GEMMs + bytes at {} GB/s + {} us: the rate must be positive, the \
                     scale and the overhead not negative",
                    p.piece.key(),
                    p.phase.key(),
                    p.gemm_scale,
                    p.gb_per_s,
                    p.overhead_us
                ));
            }
        }
        for (i, o) in self.compute.ops.iter().enumerate() {
            if !(o.us >= 0.0 && o.us.is_finite()) {
                bad.push(format!(
                    "compute.ops[{i}] ({} {}) = {} us: a time is not negative",
                    o.piece.key(),
                    o.phase.key(),
                    o.us
                ));
            }
        }
        let cores = self.execution.shared_cores;
        if !(cores >= 0.0 && cores.is_finite()) {
            bad.push(format!("execution.shared_cores = {cores}: give the cores the ranks share, or 0 for none"));
        }
        let per_op = self.execution.loop_us_per_op;
        if !(per_op >= 0.0 && per_op.is_finite()) {
            bad.push(format!("execution.loop_us_per_op = {per_op}: a time is not negative"));
        }
        for (key, v) in [
            ("staging_message_ns_per_byte", self.execution.staging_message_ns_per_byte),
            ("staging_tensor_ns_per_byte", self.execution.staging_tensor_ns_per_byte),
            ("staging_copy_ns_per_byte", self.execution.staging_copy_ns_per_byte),
        ] {
            if !(v >= 0.0 && v.is_finite()) {
                bad.push(format!("execution.{key} = {v}: a time is not negative"));
            }
        }
        if let Some(n) = &self.network {
            for (i, l) in n.links.iter().enumerate() {
                let sizes_ok = !l.bytes.is_empty()
                    && l.bytes.windows(2).all(|w| w[0] < w[1])
                    && l.post_us.len() == l.bytes.len()
                    && l.finish_us.len() == l.bytes.len();
                let work_ok = l.post_us.iter().chain(&l.finish_us).all(|v| *v >= 0.0 && v.is_finite());
                if !(l.ranks >= 2 && l.latency_us >= 0.0 && l.latency_us.is_finite() && sizes_ok && work_ok) {
                    bad.push(format!(
                        "network.links[{i}] ({} over {} ranks): a line needs at least 2 ranks, a latency not negative, \
                         ascending sizes, and one post and one finish time (not negative) per size",
                        l.kind.key(),
                        l.ranks
                    ));
                }
            }
            for kind in CommFitKind::ALL.into_iter().filter(|k| k.fallback().is_none()) {
                if !n.links.iter().any(|l| l.kind == kind) {
                    bad.push(format!(
                        "network.links has no {} line: measure every kind (strata calibrate)",
                        kind.key()
                    ));
                }
            }
        }
    }

    /// The GEMM peak for a training dtype, FLOP/s.
    pub fn peak_flops_per_s(&self, dtype: Dtype) -> f64 {
        match dtype {
            Dtype::Bf16 | Dtype::Fp16 => self.compute.bf16_tflops * 1e12,
            // The GPU's fp8 tensor-core peak; a GPU without one runs fp8 GEMMs at bf16.
            Dtype::Fp8 => self.compute.fp8_tflops.unwrap_or(self.compute.bf16_tflops) * 1e12,
            Dtype::Fp32 => self.compute.fp32_tflops * 1e12,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::hardware::GPU_KINDS;

    #[test]
    fn builtin_profiles_parse_and_agree_with_the_catalog() {
        for &gpu in GPU_KINDS {
            let p = HardwareProfile::builtin(gpu);
            assert_eq!(p.gpu, gpu, "{}", p.name);
            let spec = gpu.spec();
            assert_eq!(p.compute.bf16_tflops, spec.bf16_tflops, "{}", p.name);
            assert_eq!(p.compute.sm_count, spec.sm_count, "{}", p.name);
            // fp8 tensor cores: Hopper and Blackwell only, at twice bf16 (datasheets).
            let fp8 = matches!(gpu, GpuKind::H100Sxm | GpuKind::H200Sxm | GpuKind::B200);
            assert_eq!(p.compute.fp8_tflops.is_some(), fp8, "{}", p.name);
            if let Some(f) = p.compute.fp8_tflops {
                assert!((f / spec.bf16_tflops - 2.0).abs() < 0.001, "{}: fp8 {f}", p.name);
            }
            assert!((p.compute.hbm_gb_per_s * 1e9 - spec.hbm_bw_bytes_per_s).abs() < 1.0, "{}", p.name);
            // A profile written back reads back equal.
            assert_eq!(HardwareProfile::from_toml(&p.to_toml(), "round trip").unwrap(), p);
        }
    }

    #[test]
    fn a_measured_profile_round_trips_and_its_bad_lines_are_named() {
        let mut p = HardwareProfile::builtin(GpuKind::Cpu);
        p.compute.gemms.push(MeasuredGemm { m: 256, n: 768, k: 256, gflops: 90.5 });
        p.compute.pieces.push(PieceRate {
            piece: Piece::Attn,
            phase: Phase::Forward,
            gemm_scale: 1.2,
            gb_per_s: 2.5,
            overhead_us: 12.0,
        });
        p.compute.ops.push(MeasuredOp {
            piece: Piece::Mlp,
            phase: Phase::Forward,
            gemms: vec![[256, 1024, 256, 1]],
            mem_bytes: 1 << 20,
            us: 800.0,
        });
        p.execution = ExecutionParams {
            one_thread_per_rank: true,
            shared_cores: 1.9,
            loop_us_per_op: 12.0,
            ..Default::default()
        };
        let line = |kind| CommFit {
            kind,
            ranks: 2,
            latency_us: 20.0,
            bytes: vec![4096, 1 << 20],
            post_us: vec![1.0, 100.0],
            finish_us: vec![2.0, 200.0],
        };
        let links = CommFitKind::ALL.iter().filter(|k| k.fallback().is_none()).map(|k| line(*k)).collect();
        p.network = Some(NetworkParams { source: "test".into(), links });
        assert_eq!(HardwareProfile::from_toml(&p.to_toml(), "round trip").unwrap(), p);
        let mut bad = p.clone();
        bad.network.as_mut().unwrap().links.retain(|l| l.kind != CommFitKind::Broadcast);
        bad.network.as_mut().unwrap().links[0].post_us.pop();
        bad.execution.shared_cores = -1.0;
        let e = bad.check().unwrap_err();
        assert!(e.contains("no broadcast line") && e.contains("network.links[0]") && e.contains("shared_cores"), "{e}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let text = A100_80GB.replace("[host]", "[host]\nturbo = true");
        let e = HardwareProfile::from_toml(&text, "x.toml").unwrap_err().to_string();
        assert!(e.contains("turbo") && e.contains("x.toml"), "{e}");
        let mut p = HardwareProfile::builtin(GpuKind::A100_80gb);
        p.compute.gemm_efficiency = 1.5;
        p.overlap.dp_slowdown = 0.5;
        let mut h100 = HardwareProfile::builtin(GpuKind::H100Sxm).compute.attention.unwrap();
        h100.causal_seq_extra = -1.0;
        p.compute.attention = Some(h100);
        let e = p.check().unwrap_err();
        assert!(e.contains("compute.gemm_efficiency = 1.5") && e.contains("overlap.dp_slowdown = 0.5"), "{e}");
        assert!(e.contains("compute.attention") && e.contains("causal_seq_extra: -1.0"), "{e}");
        let mut p = HardwareProfile::builtin(GpuKind::H100Sxm);
        p.compute.fp8_tflops = Some(-1.0);
        p.compute.fp8_gemm_efficiency = Some(1.2);
        let e = p.check().unwrap_err();
        assert!(e.contains("compute.fp8_tflops = -1") && e.contains("compute.fp8_gemm_efficiency = 1.2"), "{e}");
    }
}
