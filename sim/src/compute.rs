//! The compute model: how long one `Compute` op of a plan takes on one GPU.
//!
//! An op's [`ComputeCost`] lists its GEMMs with their shapes, its attention core, the bytes
//! its element-wise kernels move and its kernel count. Its time is
//!
//!   T = Σ_gemms T_gemm + mem_bytes / (η_mem · B_hbm) + kernels · t_kernel
//!
//! **GEMMs** (tile and wave quantisation, as cuBLAS/CUTLASS execute them). C(m×n) is cut
//! into tiles of tm×tn; `batch` independent problems give tiles = ⌈m/tm⌉·⌈n/tn⌉·batch. The
//! SMs run one tile each per wave, so waves = ⌈tiles / SMs⌉ and
//!
//!   T_compute = waves · 2·tm·tn·k / (P/SMs · η · η_tile · k/(k + k_½))
//!
//! with P the dense peak for the dtype, η the efficiency of a large GEMM, η_tile the
//! relative throughput of the tile shape, and k/(k + k_½) the share of a tile's time spent
//! in its main loop rather than in loading and storing (short inner dimensions — the
//! attention core's k = d — fall short of the peak). The fastest tile shape of the
//! profile's list is taken, as the library heuristics do. A GEMM is never faster than its
//! operands can stream from HBM: T_gemm = max(T_compute, e·(mk + kn + mn)·batch / (η_mem ·
//! B_hbm)). With 108 SMs a GEMM of 109 tiles takes two waves: the quantisation that makes
//! the time a step function of the shape.
//!
//! **Attention core.** The plan lists QKᵀ and P·V as batched GEMMs (batch = b·a/t, k = d
//! or s) and counts the softmax, masking and dropout over the s×s scores in `mem_bytes`
//! (plan/cost.rs), so the core is costed as memory-bound s² traffic plus short-k GEMMs —
//! which is why it dominates at long sequences without fused attention.
//!
//! **Fused attention** (a core whose plan marks it `fused`, on a profile with
//! `[compute.attention]`): one kernel that keeps the scores on chip, so its time is its
//! FLOPs at the kernel's fitted rate, not the memory-bound score GEMMs above:
//!
//!   T_core = F / (P · η_dir · x / (x + x_½,dir + causal · x_c))
//!
//! with F the plan's core GEMM FLOPs (4·b·a·s²·d forward, 2.5× that backward, where the
//! kernel recomputes QKᵀ), scaled by the share of the listed keys the kernel attends (a
//! later ring-attention step lists its whole block and attends half of it, unmasked) and
//! halved under a causal mask, and x = s (s/2 causal) the keys a query sees on average, s
//! the keys of the plan's `AttnShape`. η, x_½ and x_c are fitted to FlashAttention's published kernel
//! benchmarks (sim/data/gpu_microbench.csv, `cargo run --example fit_h100`).
//!
//! **Element-wise** work moves `mem_bytes` at η_mem of the HBM bandwidth.
//!
//! **Measured profiles** (`strata calibrate`) refine this where they have data, in order:
//! an op whose piece, phase and cost were measured as the executor ran them takes the
//! measured time (a full recomputation's op runs the forward piece, so its forward
//! measurement serves); otherwise a piece kind with a fitted rate takes
//! `s·Σ T_gemm + mem_bytes / rate + overhead` (s, the rate and the overhead fitted to the
//! piece's real times); and a GEMM whose (m, n, k) was measured takes 2·m·n·k·batch / its
//! measured rate. [`ComputeModel::op_cost_s`] applies them; [`ComputeModel::cost_s`] is the
//! shape-only model.
//!
//! Units: seconds inside, integer nanoseconds out (rounded up).

use std::collections::BTreeMap;

use strata_models::Dtype;
use strata_models::plan::{ComputeCost, Gemm, Phase, Piece};

use crate::profile::{AttentionParams, HardwareProfile};

/// The compute model of one GPU kind for one training dtype.
#[derive(Clone, Debug)]
pub struct ComputeModel {
    per_sm_flops_per_s: f64,
    /// An fp8 GEMM's (`Gemm::fp8`): per-SM peak and large-GEMM efficiency.
    fp8_per_sm_flops_per_s: f64,
    fp8_efficiency: f64,
    sm_count: u64,
    gemm_efficiency: f64,
    k_half: f64,
    tiles: Vec<(u64, u64, f64)>,
    mem_bytes_per_s: f64,
    kernel_s: f64,
    elem_bytes: f64,
    /// A GPU runs a MoE layer's experts as one grouped GEMM ([`ComputeModel::grouped_s`]);
    /// a CPU profile (the executor's ranks run one GEMM per expert) does not.
    grouped_experts: bool,
    /// The fused attention kernel's fit, and the peak its efficiencies are fractions of.
    attention: Option<(AttentionParams, f64)>,
    /// Measured seconds of one GEMM of shape (m, n, k).
    measured_gemm_s: BTreeMap<(u64, u64, u64), f64>,
    /// Measured (GEMM scale, bytes/s, fixed seconds) of a piece.
    measured_piece: BTreeMap<(Piece, Phase), (f64, f64, f64)>,
    /// Measured seconds of an op, by (piece, phase, GEMMs, element-wise bytes).
    measured_op: BTreeMap<OpKey, f64>,
}

type OpKey = (Piece, Phase, Vec<[u64; 4]>, u64);

fn op_key(piece: Piece, phase: Phase, c: &ComputeCost) -> OpKey {
    (piece, phase, c.gemms.iter().map(|g| [g.m, g.n, g.k, g.batch]).collect(), c.mem_bytes)
}

impl ComputeModel {
    pub fn new(profile: &HardwareProfile, dtype: Dtype) -> ComputeModel {
        let c = &profile.compute;
        ComputeModel {
            per_sm_flops_per_s: profile.peak_flops_per_s(dtype) / c.sm_count as f64,
            fp8_per_sm_flops_per_s: profile.peak_flops_per_s(Dtype::Fp8) / c.sm_count as f64,
            fp8_efficiency: c.fp8_gemm_efficiency.unwrap_or(c.gemm_efficiency),
            sm_count: c.sm_count as u64,
            gemm_efficiency: c.gemm_efficiency,
            k_half: c.gemm_k_half,
            tiles: c.tiles.iter().map(|t| (t.m, t.n, t.efficiency)).collect(),
            mem_bytes_per_s: c.hbm_gb_per_s * 1e9 * c.elementwise_bw_efficiency,
            kernel_s: c.kernel_overhead_us * 1e-6,
            elem_bytes: dtype.bytes() as f64,
            grouped_experts: profile.gpu != strata_models::GpuKind::Cpu,
            attention: c.attention.clone().map(|a| (a, profile.peak_flops_per_s(dtype))),
            measured_gemm_s: c
                .gemms
                .iter()
                .map(|g| ((g.m, g.n, g.k), 2.0 * (g.m * g.n * g.k) as f64 / (g.gflops * 1e9)))
                .collect(),
            measured_piece: c
                .pieces
                .iter()
                .map(|p| ((p.piece, p.phase), (p.gemm_scale, p.gb_per_s * 1e9, p.overhead_us * 1e-6)))
                .collect(),
            measured_op: c
                .ops
                .iter()
                .map(|o| ((o.piece, o.phase, o.gemms.clone(), o.mem_bytes), o.us * 1e-6))
                .collect(),
        }
    }

    /// Seconds for one GEMM (or a batch of identical ones): measured when the profile has
    /// this shape, else the tile model.
    pub fn gemm_s(&self, g: &Gemm) -> f64 {
        if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
            return 0.0;
        }
        if let Some(s) = self.measured_gemm_s.get(&(g.m, g.n, g.k)) {
            return s * g.batch as f64;
        }
        self.tile_model_s(g)
    }

    /// Seconds for one GEMM (or a batch) from the tile and wave model alone.
    pub fn tile_model_s(&self, g: &Gemm) -> f64 {
        if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
            return 0.0;
        }
        self.grouped_s(std::slice::from_ref(g))
    }

    /// (per-SM FLOP/s × large-GEMM efficiency, operand bytes of A and B, of C) for a GEMM:
    /// an fp8 GEMM reads fp8 operands (1 byte) and writes its output in the storage dtype.
    fn rate_and_bytes(&self, g: &Gemm) -> (f64, f64, f64) {
        if g.fp8 {
            (self.fp8_per_sm_flops_per_s * self.fp8_efficiency, 1.0, self.elem_bytes)
        } else {
            (self.per_sm_flops_per_s * self.gemm_efficiency, self.elem_bytes, self.elem_bytes)
        }
    }

    /// Seconds for GEMMs run as one grouped kernel (CUTLASS grouped GEMM, Megatron-LM's
    /// `--moe-grouped-gemm`): one launch whose SMs take the tiles of every problem together,
    /// so waves = ⌈Σ_g tiles_g / SMs⌉ over the whole group (one tile shape for the group,
    /// the fastest), each wave as long as the group's longest tile (the largest k). Never
    /// faster than streaming every problem's operands from HBM. With one problem this is
    /// the tile model of a single GEMM; with many small ones (few rows per expert) the
    /// last partial tile of each problem and each expert's weights read for few rows make
    /// the efficiency fall.
    pub fn grouped_s(&self, gemms: &[Gemm]) -> f64 {
        let live: Vec<&Gemm> = gemms.iter().filter(|g| g.m > 0 && g.n > 0 && g.k > 0 && g.batch > 0).collect();
        if live.is_empty() {
            return 0.0;
        }
        let compute = self
            .tiles
            .iter()
            .map(|&(tm, tn, eff)| {
                let mut tiles = 0.0;
                // The longest tile of the group, as (FLOPs, rate): compared as a ratio, kept
                // apart so that one GEMM costs exactly what it did as a single kernel.
                let (mut flops, mut rate) = (0.0, 1.0);
                for g in &live {
                    // In f64 (exact below 2^53, as every real shape is): a hand-edited plan
                    // may hold any u64 dimensions, whose product would overflow.
                    tiles += g.m.div_ceil(tm) as f64 * g.n.div_ceil(tn) as f64 * g.batch as f64;
                    let k = g.k as f64;
                    let main_loop = k / (k + self.k_half);
                    let (per_sm, _, _) = self.rate_and_bytes(g);
                    let (f, r) = (2.0 * tm as f64 * tn as f64 * k, per_sm * eff * main_loop);
                    if f / r > flops / rate {
                        (flops, rate) = (f, r);
                    }
                }
                let waves = (tiles / self.sm_count as f64).ceil();
                waves * flops / rate
            })
            .fold(f64::INFINITY, f64::min);
        let operands: f64 = live
            .iter()
            .map(|g| {
                let (m, n, k) = (g.m as f64, g.n as f64, g.k as f64);
                let (_, ab, c) = self.rate_and_bytes(g);
                if ab == c {
                    (m * k + k * n + m * n) * g.batch as f64 * ab
                } else {
                    ((m * k + k * n) * ab + m * n * c) * g.batch as f64
                }
            })
            .sum();
        compute.max(operands / self.mem_bytes_per_s)
    }

    /// Seconds for all GEMMs of an op: a fused attention core at the profile's fitted kernel
    /// rate when it has one, every other GEMM (and every core otherwise) as [`Self::gemm_s`].
    pub fn gemms_s(&self, c: &ComputeCost) -> f64 {
        let (Some(a), Some((fit, peak))) = (c.attention.filter(|a| a.fused), &self.attention) else {
            return c.gemms.iter().map(|g| self.gemm_s(g)).sum();
        };
        // The core's GEMMs: (seq_q × keys) blocks with head_dim as the other dimension, the
        // keys listed at least those the kernel attends (a later ring step lists its whole
        // block and attends half of it, unmasked).
        let listed_keys = |g: &Gemm| match (g.n == a.head_dim, g.k == a.head_dim) {
            (_, true) => Some(g.n),
            (true, false) => Some(g.k),
            (false, false) => None,
        };
        let is_core = |g: &Gemm| {
            g.batch == a.batch_heads
                && g.m == a.seq_q
                && listed_keys(g).is_some_and(|k| k >= a.seq_k && k.is_multiple_of(a.seq_k.max(1)))
        };
        let (core, rest): (Vec<&Gemm>, Vec<&Gemm>) = c.gemms.iter().partition(|g| is_core(g));
        let others: f64 = rest.iter().map(|g| self.gemm_s(g)).sum();
        if core.is_empty() {
            return others;
        }
        // Forward lists QKᵀ and P·V; backward five GEMMs (QKᵀ recomputed, dV, dP, dQ, dK).
        let backward = core.len() > 2;
        let (eff, half) =
            if backward { (fit.bwd_efficiency, fit.bwd_seq_half) } else { (fit.fwd_efficiency, fit.fwd_seq_half) };
        let flops: f64 = core.iter().map(|g| g.flops() as f64).sum();
        let seq = a.seq_k as f64;
        let attended = seq / listed_keys(core[0]).map_or(seq, |k| k as f64);
        let (work, keys, extra) =
            if a.causal { (0.5 * attended, seq / 2.0, fit.causal_seq_extra) } else { (attended, seq, 0.0) };
        let rate = peak * eff * keys / (keys + half + extra);
        others + work * flops / rate
    }

    /// Seconds for the element-wise traffic of `bytes`.
    pub fn memory_s(&self, bytes: u64) -> f64 {
        bytes as f64 / self.mem_bytes_per_s
    }

    /// Seconds for one op of this cost, before any slowdown.
    pub fn cost_s(&self, c: &ComputeCost) -> f64 {
        self.gemms_s(c) + self.memory_s(c.mem_bytes) + c.kernels as f64 * self.kernel_s
    }

    /// Seconds for one op of `piece` from shapes alone: a MoE layer's `Experts` (one GEMM
    /// per local expert and pass) as one grouped kernel on a GPU, every other piece as
    /// [`ComputeModel::cost_s`].
    pub fn piece_cost_s(&self, piece: Piece, c: &ComputeCost) -> f64 {
        if piece == Piece::Experts && self.grouped_experts {
            return self.grouped_s(&c.gemms) + self.memory_s(c.mem_bytes) + c.kernels as f64 * self.kernel_s;
        }
        self.cost_s(c)
    }

    /// Nanoseconds for one op of this cost, rounded up.
    pub fn cost_ns(&self, c: &ComputeCost) -> u64 {
        (self.cost_s(c) * 1e9).ceil() as u64
    }

    /// Seconds for one op of a known piece: its GEMMs, and its other work at the piece's
    /// measured rate when the profile has one (else as [`ComputeModel::cost_s`]).
    pub fn op_cost_s(&self, piece: Piece, phase: Phase, c: &ComputeCost) -> f64 {
        if !self.measured_op.is_empty() {
            if let Some(s) = self.measured_op.get(&op_key(piece, phase, c)) {
                return *s;
            }
            if phase == Phase::Recompute
                && let Some(s) = self.measured_op.get(&op_key(piece, Phase::Forward, c))
            {
                return *s;
            }
        }
        let Some(&(scale, bytes_per_s, fixed_s)) = self.measured_piece.get(&(piece, phase)) else {
            return self.piece_cost_s(piece, c);
        };
        scale * self.gemms_s(c) + c.mem_bytes as f64 / bytes_per_s + fixed_s
    }

    /// Whether the profile measured pieces or ops (op times then depend on the piece).
    pub fn has_piece_rates(&self) -> bool {
        !self.measured_piece.is_empty() || !self.measured_op.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::GpuKind;

    fn a100() -> ComputeModel {
        ComputeModel::new(&HardwareProfile::builtin(GpuKind::A100_80gb), Dtype::Bf16)
    }

    #[test]
    fn one_tile_more_than_a_wave_costs_a_second_wave() {
        // With a single tile shape, 12 × 9 = 108 tiles fill the A100's 108 SMs once; one more
        // row of tiles takes a second wave and twice the time.
        let mut p = HardwareProfile::builtin(GpuKind::A100_80gb);
        p.compute.tiles.truncate(1);
        let (tm, tn) = (p.compute.tiles[0].m, p.compute.tiles[0].n);
        let one = ComputeModel::new(&p, Dtype::Bf16);
        let k = 8192;
        let full = one.gemm_s(&Gemm { m: tm * 12, n: tn * 9, k, batch: 1, fp8: false });
        let spill = one.gemm_s(&Gemm { m: tm * 12 + 1, n: tn * 9, k, batch: 1, fp8: false });
        assert!((spill / full - 2.0).abs() < 1e-12, "{spill} vs {full}");
        // The library's choice among tile shapes softens the step but does not remove it.
        let m = a100();
        let full = m.gemm_s(&Gemm { m: tm * 12, n: tn * 9, k, batch: 1, fp8: false });
        let spill = m.gemm_s(&Gemm { m: tm * 12 + 1, n: tn * 9, k, batch: 1, fp8: false });
        assert!(spill > 1.2 * full && spill < 2.0 * full, "{spill} vs {full}");
        // A big, well-shaped GEMM runs at the profile's efficiency, within tail effects.
        let g = Gemm { m: 16384, n: 16384, k: 16384, batch: 1, fp8: false };
        let achieved = g.flops() as f64 / m.gemm_s(&g) / 312e12;
        let ideal = p.compute.gemm_efficiency * 16384.0 / (16384.0 + p.compute.gemm_k_half);
        assert!(achieved <= ideal + 1e-12 && achieved > 0.95 * ideal, "{achieved} vs {ideal}");
    }

    #[test]
    fn short_inner_dimensions_are_memory_bound() {
        let m = a100();
        // QKᵀ of one head: 2048 × 2048 × 128 moves 2·(2·2048·128 + 2048²) bytes for 1 GFLOP.
        let g = Gemm { m: 2048, n: 2048, k: 128, batch: 64, fp8: false };
        let bytes = 2.0 * (2.0 * 2048.0 * 128.0 + 2048.0 * 2048.0) * 64.0;
        let t = m.gemm_s(&g);
        assert!(t >= bytes / (2039e9 * 0.99), "{t}");
        assert!(g.flops() as f64 / t < 0.6 * 312e12);
    }

    #[test]
    fn measured_shapes_and_pieces_override_the_shape_model() {
        use crate::profile::{MeasuredGemm, PieceRate};
        let mut p = HardwareProfile::builtin(GpuKind::Cpu);
        p.compute.gemms.push(MeasuredGemm { m: 256, n: 768, k: 256, gflops: 50.0 });
        p.compute.pieces.push(PieceRate {
            piece: Piece::Attn,
            phase: Phase::Forward,
            gemm_scale: 1.0,
            gb_per_s: 2.0,
            overhead_us: 10.0,
        });
        let m = ComputeModel::new(&p, Dtype::Fp32);
        let g = Gemm { m: 256, n: 768, k: 256, batch: 3, fp8: false };
        assert!((m.gemm_s(&g) - 3.0 * 2.0 * 256.0 * 768.0 * 256.0 / 50e9).abs() < 1e-15);
        let other = Gemm { m: 256, n: 768, k: 255, batch: 1, fp8: false };
        assert_eq!(m.gemm_s(&other), m.tile_model_s(&other));
        let c = ComputeCost { flops: g.flops(), gemms: vec![g], attention: None, mem_bytes: 4_000_000, kernels: 7 };
        let want = m.gemm_s(&g) + 4e6 / 2e9 + 10e-6;
        assert!((m.op_cost_s(Piece::Attn, Phase::Forward, &c) - want).abs() < 1e-15);
        // A piece without a measured rate keeps the uniform model.
        assert_eq!(m.op_cost_s(Piece::Mlp, Phase::Forward, &c), m.cost_s(&c));
        // A measured op takes its measured time, and serves a full recomputation of it.
        p.compute.ops.push(crate::profile::MeasuredOp {
            piece: Piece::Mlp,
            phase: Phase::Forward,
            gemms: vec![[256, 768, 256, 3]],
            mem_bytes: 4_000_000,
            us: 777.0,
        });
        let m = ComputeModel::new(&p, Dtype::Fp32);
        assert!((m.op_cost_s(Piece::Mlp, Phase::Forward, &c) - 777e-6).abs() < 1e-15);
        assert!((m.op_cost_s(Piece::Mlp, Phase::Recompute, &c) - 777e-6).abs() < 1e-15);
        assert!((m.op_cost_s(Piece::Attn, Phase::Forward, &c) - want).abs() < 1e-15);
    }

    #[test]
    fn a_fused_core_runs_at_the_fitted_kernel_rate() {
        use strata_models::plan::AttnShape;
        let p = HardwareProfile::builtin(GpuKind::H100Sxm);
        let a = p.compute.attention.clone().unwrap();
        let m = ComputeModel::new(&p, Dtype::Bf16);
        let (bh, s, d) = (8, 8192, 128);
        let core = |fused| AttnShape { batch_heads: bh, seq_q: s, seq_k: s, head_dim: d, causal: true, fused };
        let qkv = Gemm { m: s, n: 1280, k: 8192, batch: 1, fp8: false };
        let gemms = vec![
            qkv,
            Gemm { m: s, n: s, k: d, batch: bh, fp8: false },
            Gemm { m: s, n: d, k: s, batch: bh, fp8: false },
        ];
        let c = ComputeCost { flops: 0, gemms, attention: Some(core(true)), mem_bytes: 0, kernels: 0 };
        // Causal: half of 4·bh·s²·d at P·η·(s/2)/(s/2 + x_½ + x_c).
        let x = s as f64 / 2.0;
        let rate = 989.4e12 * a.fwd_efficiency * x / (x + a.fwd_seq_half + a.causal_seq_extra);
        let want = m.gemm_s(&qkv) + 0.5 * 4.0 * (bh * s * s * d) as f64 / rate;
        assert!((m.gemms_s(&c) / want - 1.0).abs() < 1e-12);
        // Unfused, or on a profile without a kernel fit (A100), the core is its GEMMs.
        let unfused = ComputeCost { attention: Some(core(false)), ..c.clone() };
        let gemm_sum: f64 = c.gemms.iter().map(|g| m.gemm_s(g)).sum();
        assert_eq!(m.gemms_s(&unfused), gemm_sum);
        let a100 = a100();
        assert_eq!(a100.gemms_s(&c), c.gemms.iter().map(|g| a100.gemm_s(g)).sum::<f64>());
        // A later ring step: the whole block listed, half its keys attended without a mask —
        // the same FLOPs as the causal diagonal step, at the unmasked rate over s/2 keys.
        let half = AttnShape { seq_k: s / 2, causal: false, ..core(true) };
        let ring = ComputeCost { attention: Some(half), ..c.clone() };
        let unmasked = 989.4e12 * a.fwd_efficiency * x / (x + a.fwd_seq_half);
        let want = m.gemm_s(&qkv) + 0.5 * 4.0 * (bh * s * s * d) as f64 / unmasked;
        assert!((m.gemms_s(&ring) / want - 1.0).abs() < 1e-12);
        assert!(m.gemms_s(&ring) < m.gemms_s(&c));
    }

    #[test]
    fn element_wise_time_is_bytes_over_bandwidth_plus_launches() {
        let m = a100();
        let p = HardwareProfile::builtin(GpuKind::A100_80gb).compute;
        let c = ComputeCost { flops: 0, gemms: vec![], attention: None, mem_bytes: 1 << 30, kernels: 3 };
        let want = (1u64 << 30) as f64 / (2039e9 * p.elementwise_bw_efficiency) + 3.0 * p.kernel_overhead_us * 1e-6;
        assert!((m.cost_s(&c) - want).abs() < 1e-12);
        assert_eq!(m.cost_ns(&c), (want * 1e9).ceil() as u64);
    }

    #[test]
    fn an_fp8_gemm_runs_at_the_fp8_peak_where_the_gpu_has_one() {
        let h100 = HardwareProfile::builtin(GpuKind::H100Sxm);
        let m = ComputeModel::new(&h100, Dtype::Bf16);
        let bf16 = Gemm { m: 8192, n: 8192, k: 8192, batch: 1, fp8: false };
        let fp8 = Gemm { fp8: true, ..bf16 };
        // Compute-bound: the same tiles and waves at twice the peak (1,979 vs 989.4 TFLOP/s).
        let ratio = m.gemm_s(&bf16) / m.gemm_s(&fp8);
        assert!((ratio - 1979.0 / 989.4).abs() < 1e-9, "{ratio}");
        let tflops = fp8.flops() as f64 / m.gemm_s(&fp8) / 1e12;
        println!("H100 8192³: fp8 {tflops:.1} TFLOP/s, bf16 {:.1}", bf16.flops() as f64 / m.gemm_s(&bf16) / 1e12);
        assert!(tflops > 1400.0 && tflops < 1979.0, "{tflops}");
        // A memory-bound fp8 GEMM reads one-byte operands: faster than bf16 by less than 2×.
        let thin = Gemm { m: 16, n: 8192, k: 8192, batch: 1, fp8: false };
        let r = m.gemm_s(&thin) / m.gemm_s(&Gemm { fp8: true, ..thin });
        assert!(r > 1.3 && r < 2.0, "{r}");
        // An A100 has no fp8 tensor cores: an fp8 GEMM runs at bf16's rate.
        let a = a100();
        assert!((a.gemm_s(&fp8) / a.gemm_s(&bf16) - 1.0).abs() < 0.01);
    }

    #[test]
    fn grouped_experts_lose_efficiency_as_rows_per_expert_shrink() {
        let p = HardwareProfile::builtin(GpuKind::H100Sxm);
        let m = ComputeModel::new(&p, Dtype::Bf16);
        // Mixtral's expert up-projection (h 4096 → 2·14336) over 8 local experts; the rows each
        // expert gets shrink from 8192 to 64.
        let eff = |rows: u64| {
            let gemms: Vec<Gemm> = (0..8).map(|_| Gemm { m: rows, n: 28672, k: 4096, batch: 1, fp8: false }).collect();
            let flops: f64 = gemms.iter().map(|g| g.flops() as f64).sum();
            let grouped = m.grouped_s(&gemms);
            let apart: f64 = gemms.iter().map(|g| m.gemm_s(g)).sum();
            assert!(grouped <= apart * (1.0 + 1e-12), "{rows}: grouped {grouped} vs apart {apart}");
            flops / grouped / 989.4e12
        };
        let effs: Vec<f64> = [8192, 2048, 512, 128, 64].iter().map(|&r| eff(r)).collect();
        for w in effs.windows(2) {
            assert!(w[1] < w[0], "{effs:?}");
        }
        assert!(effs[0] > 0.7 && effs[4] < 0.5, "{effs:?}");
        // One problem is a plain GEMM; a grouped kernel beats one launch per expert when each
        // expert's tiles fill few SMs (8 × 64 tiles of 256 × 128 in 4 waves on 132 SMs, not 8
        // half-empty ones; compute-bound at 512 rows). Alone each GEMM takes its best tile
        // (128 × 128, one wave at 0.9), which softens the gain to about 10%.
        let one = Gemm { m: 4096, n: 4096, k: 4096, batch: 1, fp8: false };
        assert_eq!(m.grouped_s(&[one]), m.gemm_s(&one));
        let small: Vec<Gemm> = (0..8).map(|_| Gemm { m: 512, n: 4096, k: 4096, batch: 1, fp8: false }).collect();
        let apart: f64 = small.iter().map(|g| m.gemm_s(g)).sum();
        assert!(m.grouped_s(&small) < 0.92 * apart, "{} vs {apart}", m.grouped_s(&small));
        // The piece decides: Experts are grouped on a GPU, other pieces are not, nor CPU ranks.
        let c = ComputeCost { flops: 0, gemms: small.clone(), attention: None, mem_bytes: 0, kernels: 1 };
        assert!(m.piece_cost_s(Piece::Experts, &c) < m.piece_cost_s(Piece::Mlp, &c));
        let cpu = ComputeModel::new(&HardwareProfile::builtin(GpuKind::Cpu), Dtype::Fp32);
        assert_eq!(cpu.piece_cost_s(Piece::Experts, &c), cpu.cost_s(&c));
    }
}
