//! Model states as each framework allocates them: bytes per parameter of weights,
//! gradients and optimizer state, which of them a ZeRO stage, Megatron-LM's distributed
//! optimizer or FSDP2 shards over the data-parallel ranks, and the dtype data-parallel
//! gradients are reduced in. Sources and versions are in `docs/frameworks.md`.
//!
//! Bytes per parameter, mixed precision (bf16 or fp16 weights), Adam; d = data-parallel size:
//!
//! | framework | ZeRO-0 | ZeRO-1 | ZeRO-2 | ZeRO-3 | gradients reduced in |
//! |---|---|---|---|---|---|
//! | Strata (ZeRO paper) | 2 + 2 + 12 | 4 + 12/d | 2 + 14/d | 16/d | the weights' dtype |
//! | Megatron-LM | 2 + 4 + 12 = 18 | 6 + 12/d (distributed optimizer) | — | — | fp32 (main gradients) |
//! | Megatron-LM, `grad_reduce_in_bf16` | 16 | 4 + 12/d | — | — | bf16 |
//! | Megatron-LM, fp16 | 2 + 2 + 16 = 20 | 4 + 16/d | — | — | fp16 |
//! | DeepSpeed | 2 + 2 + 12; bf16 under a pipeline 6 + 12/d (`BF16_Optimizer`, bf16 buffer) | bf16 8 + 12/d (BF16_Optimizer: bf16 and fp32 gradients); fp16 4 + 16/d | 2 + 18/d | 18/d (+ 4·P_largest, its estimator) | bf16 (`communication_data_type`) |
//! | torchtitan (FSDP2, fp32 states) | 4 + 4 + 8 (DDP) | — | 2 + 16/d (no reshard: bf16 weights kept) | 16/d (+ bf16 blocks in flight) | fp32 (`mixed_precision_reduce`) |
//!
//! - Megatron-LM keeps an fp32 main gradient beside every bf16 weight (`--bf16` sets
//!   `accumulate_allreduce_grads_in_fp32`); its distributed optimizer shards only the fp32
//!   master weights and Adam moments; `theoretical_memory_usage.py` counts 18 and 6 + 12/d.
//! - DeepSpeed's estimators: ZeRO-2 `2Ψ + 18Ψ/N` (16-bit weights whole; 16-bit and fp32
//!   gradient partitions, fp32 master, Adam sharded); ZeRO-3 `4·P_largest + 18Ψ/N` (16-bit
//!   weight and fp32 gradient partitions, fp32 master, Adam), the first term the largest
//!   module's 16-bit weights and gradients gathered whole. ZeRO-1 with bf16
//!   runs `BF16_Optimizer`: the bf16 gradients (autograd's, zeroed by `clear_lp_grads` and
//!   kept until the step's `zero_grad`) and an fp32 gradient buffer for all parameters
//!   (`fp32_groups_gradients_flat`, shaped as the whole flat bf16 group), the fp32 master and
//!   Adam partitioned; with fp16, stage 1 keeps fp16 gradients whole and the fp32 gradient,
//!   master and Adam of its partition. Under a pipeline, bf16 at stage 0 runs
//!   `BF16_Optimizer` too, its buffer in bf16 (the engine's default accumulation dtype):
//!   2 + 2 + 2 whole, the fp32 master and Adam partitioned (6 + 12/d); without a pipeline
//!   it is `FP16_Optimizer` in bf16, 2 + 2 + 12 whole.
//! - torchtitan keeps parameters, gradients and Adam state in fp32 (`training.storage_dtype()`),
//!   sharded by FSDP2; forward gathers each block in bf16 and, with reshard after forward
//!   (ZeRO-3 here), frees it again, else (ZeRO-2) keeps it until its backward.
//!
//! In fp32 training every framework holds 4 + 4 + 8 bytes (the weights are the master copy),
//! sharded by stage as ZeRO does, and reduces in fp32.
//!
//! **Experts** are replicated over the expert-data-parallel ranks (tp · cp · dp / ep), not
//! over the dense parameters' cp · dp ([`crate::parallel::ParallelConfig::grad_ranks`]):
//! ZeRO and the distributed optimizer shard each over its own group, as Megatron-LM's
//! `theoretical_memory_usage.py` does with d_expert ([`stage_state_bytes`]).
//!
//! **fp8 training** (`training.dtype = "fp8"`, Transformer Engine's delayed-scaling recipe
//! without `--fp8-param-gather`) keeps every state above as bf16 training does — fp32 master
//! weights, main gradients and Adam moments unchanged — and the bf16 weights too, and adds
//! per linear-layer weight an fp8 copy and its transposed fp8 copy for the backward's data
//! gradient, 2 bytes per linear parameter (TE modules cache both between steps by default;
//! `transformer_engine/pytorch/quantization.py`): [`fp8_weight_bytes`]. Under ZeRO-3 the
//! copies live only while a layer is gathered, so none persist.

use serde::Serialize;

use crate::framework::Framework;
use crate::scenario::{Dtype, Scenario};

/// Bytes per parameter of one kind of state: `whole` held by every data-parallel rank,
/// `sharded` split over them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PerParam {
    pub whole: u64,
    pub sharded: u64,
}

impl PerParam {
    const fn whole(b: u64) -> PerParam {
        PerParam { whole: b, sharded: 0 }
    }

    const fn sharded(b: u64) -> PerParam {
        PerParam { whole: 0, sharded: b }
    }

    /// `b` bytes, sharded when `shard`.
    const fn by(b: u64, shard: bool) -> PerParam {
        if shard { PerParam::sharded(b) } else { PerParam::whole(b) }
    }

    /// Bytes of `params` parameters on one of `dp` ranks (the shard rounded up, as buffers are).
    pub fn bytes(&self, params: u64, dp: u32) -> u64 {
        self.whole * params + self.sharded * params.div_ceil(dp.max(1) as u64)
    }

    /// The same as a real number, for the analytic model (no rounding of the shard).
    pub fn bytes_f64(&self, params: f64, dp: u32) -> f64 {
        self.whole as f64 * params + self.sharded as f64 * params / dp.max(1) as f64
    }
}

/// What a framework keeps per parameter and how it reduces gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StateLayout {
    pub weights: PerParam,
    /// The persistent gradient buffer (Megatron's fp32 main gradients, ZeRO's partitions).
    pub grads: PerParam,
    /// Master weights (when they are a separate copy) and the Adam moments.
    pub optimizer: PerParam,
    /// The dtype of data-parallel gradient reductions (and of the full-gradient buckets
    /// ZeRO-2/3 reduce from).
    pub grad_reduce: Dtype,
}

impl StateLayout {
    /// Bytes per parameter in all, on one of `dp` ranks.
    pub fn per_param(&self, dp: u32) -> f64 {
        let d = dp.max(1) as f64;
        let s = |p: PerParam| p.whole as f64 + p.sharded as f64 / d;
        s(self.weights) + s(self.grads) + s(self.optimizer)
    }
}

/// The layout of `framework` for weights in `dtype` under ZeRO stage `zero`.
pub fn layout(framework: Framework, dtype: Dtype, zero: u8, grad_reduce_in_bf16: bool) -> StateLayout {
    let half = matches!(dtype, Dtype::Bf16 | Dtype::Fp16);
    let (z1, z2, z3) = (zero >= 1, zero >= 2, zero >= 3);
    if !half {
        // fp32: the weights are the master copy; Adam's two moments.
        return StateLayout {
            weights: PerParam::by(4, z3),
            grads: PerParam::by(4, z2),
            optimizer: PerParam::by(8, z1),
            grad_reduce: Dtype::Fp32,
        };
    }
    match framework {
        Framework::Strata => StateLayout {
            weights: PerParam::by(2, z3),
            grads: PerParam::by(2, z2),
            optimizer: PerParam::by(12, z1),
            grad_reduce: dtype,
        },
        // fp16: fp16 main gradients, the optimizer keeps an fp32 copy of them beside the fp32
        // master and Adam (Megatron's dist_optimizer.md: 20, 4 + 16/d).
        Framework::Megatron if dtype == Dtype::Fp16 => StateLayout {
            weights: PerParam::whole(2),
            grads: PerParam::whole(2),
            optimizer: PerParam::by(16, z1),
            grad_reduce: dtype,
        },
        Framework::Megatron => StateLayout {
            weights: PerParam::whole(2),
            grads: PerParam::whole(if grad_reduce_in_bf16 { 2 } else { 4 }),
            optimizer: PerParam::by(12, z1),
            grad_reduce: if grad_reduce_in_bf16 { dtype } else { Dtype::Fp32 },
        },
        Framework::DeepSpeed => match zero {
            0 => StateLayout {
                weights: PerParam::whole(2),
                grads: PerParam::whole(2),
                optimizer: PerParam::whole(12),
                grad_reduce: dtype,
            },
            // bf16: `BF16_Optimizer` keeps the bf16 gradients (zeroed, never freed, between
            // microbatches) beside its fp32 accumulation buffer for every parameter. fp16: ZeRO
            // stage 1 (`stage_1_and_2.py`) accumulates in the fp16 gradients and keeps the fp32
            // gradient of its partition only.
            1 => StateLayout {
                weights: PerParam::whole(2),
                grads: if dtype == Dtype::Bf16 { PerParam::whole(6) } else { PerParam { whole: 2, sharded: 4 } },
                optimizer: PerParam::sharded(12),
                grad_reduce: dtype,
            },
            2 => StateLayout {
                weights: PerParam::whole(2),
                grads: PerParam::sharded(6),
                optimizer: PerParam::sharded(12),
                grad_reduce: dtype,
            },
            _ => StateLayout {
                weights: PerParam::sharded(2),
                grads: PerParam::sharded(4),
                optimizer: PerParam::sharded(12),
                grad_reduce: dtype,
            },
        },
        Framework::Torchtitan => match zero {
            0 | 1 => StateLayout {
                weights: PerParam::whole(4),
                grads: PerParam::whole(4),
                optimizer: PerParam::whole(8),
                grad_reduce: Dtype::Fp32,
            },
            2 => StateLayout {
                weights: PerParam { whole: 2, sharded: 4 },
                grads: PerParam::sharded(4),
                optimizer: PerParam::sharded(8),
                grad_reduce: Dtype::Fp32,
            },
            _ => StateLayout {
                weights: PerParam::sharded(4),
                grads: PerParam::sharded(4),
                optimizer: PerParam::sharded(8),
                grad_reduce: Dtype::Fp32,
            },
        },
    }
}

/// The layout of a scenario's framework, dtype and ZeRO stage.
pub fn scenario_layout(s: &Scenario) -> StateLayout {
    // The stage the framework runs: DeepSpeed's BF16_Optimizer at ZeRO-0 under a pipeline
    // is ZeRO-1's layout with its buffer in bf16 (2 + 2 bytes of gradients, not 2 + 4).
    let mut l =
        layout(s.training.framework, s.training.storage_dtype(), s.zero_stage(), s.training.grad_reduce_in_bf16);
    if s.training.framework.bf16_optimizer(s) == Some(Dtype::Bf16) {
        l.grads = PerParam::whole(4);
    }
    l
}

/// Model-state bytes on one rank of a stage, (weights, gradients, optimizer): the dense
/// parameters sharded over cp · dp, the routed experts over the expert-data-parallel ranks,
/// and under fp8 the weights' fp8 copies ([`fp8_weight_bytes`]) in the weights.
pub fn stage_state_bytes(s: &Scenario, sp: &crate::accounting::params::StageParams) -> (f64, f64, f64) {
    let l = scenario_layout(s);
    let p = &s.parallel;
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let (dense, experts) = (sp.dense_per_rank() as f64, sp.expert_params as f64);
    let (dd, ed) = (clamp(p.grad_ranks()), clamp(p.expert_dp()));
    let of = |x: PerParam| x.bytes_f64(dense, dd) + x.bytes_f64(experts, ed);
    (of(l.weights) + fp8_weight_bytes(s, sp.stage) as f64, of(l.grads), of(l.optimizer))
}

/// Bytes of Transformer Engine's persistent fp8 weight copies on one rank of `stage`: the
/// fp8 weight and its transpose, 1 byte each per linear-layer parameter; 0 without fp8 or
/// under ZeRO-3.
pub fn fp8_weight_bytes(s: &Scenario, stage: u32) -> u64 {
    if !s.training.fp8() || s.parallel.zero >= 3 {
        return 0;
    }
    2 * crate::accounting::params::stage_linear_params(&s.model, &s.parallel, stage)
}

/// Bytes on one rank that the framework's own formula counts beside the states but Strata's
/// plan does not allocate as such: DeepSpeed ZeRO-3's estimator term 4·P_largest (the
/// largest module's 16-bit weights and gradients gathered whole; Strata's plan gathers
/// whole layers with its prefetch window instead, in `transient_bytes`).
pub fn formula_buffer_bytes(s: &Scenario) -> f64 {
    let half = matches!(s.training.storage_dtype(), Dtype::Bf16 | Dtype::Fp16);
    if s.training.framework == Framework::DeepSpeed && s.parallel.zero >= 3 && half {
        4.0 * crate::accounting::params::largest_module_params(&s.model, s.parallel.tp) as f64
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn megatron_keeps_18_bytes_or_6_plus_12_over_d() {
        let l = layout(Framework::Megatron, Dtype::Bf16, 0, false);
        assert_eq!(l.per_param(16), 18.0);
        let l = layout(Framework::Megatron, Dtype::Bf16, 1, false);
        assert_eq!(l.per_param(16), 6.0 + 12.0 / 16.0);
        assert_eq!(l.grad_reduce, Dtype::Fp32);
        let l = layout(Framework::Megatron, Dtype::Bf16, 1, true);
        assert_eq!((l.per_param(8), l.grad_reduce), (4.0 + 12.0 / 8.0, Dtype::Bf16));
        assert_eq!(layout(Framework::Megatron, Dtype::Fp16, 0, false).per_param(8), 20.0);
        assert_eq!(layout(Framework::Megatron, Dtype::Fp16, 1, false).per_param(8), 6.0);
        let l = layout(Framework::Megatron, Dtype::Fp32, 1, false);
        assert_eq!((l.per_param(8), layout(Framework::Megatron, Dtype::Fp32, 0, false).per_param(8)), (9.0, 16.0));
    }

    #[test]
    fn deepspeed_matches_its_estimators_per_parameter() {
        assert!(close(layout(Framework::DeepSpeed, Dtype::Bf16, 2, false).per_param(64), 2.0 + 18.0 / 64.0));
        assert!(close(layout(Framework::DeepSpeed, Dtype::Bf16, 3, false).per_param(64), 18.0 / 64.0));
        assert!(close(layout(Framework::DeepSpeed, Dtype::Bf16, 1, false).per_param(8), 8.0 + 12.0 / 8.0));
        assert!(close(layout(Framework::DeepSpeed, Dtype::Fp16, 1, false).per_param(8), 4.0 + 16.0 / 8.0));
        assert_eq!(layout(Framework::DeepSpeed, Dtype::Bf16, 2, false).grad_reduce, Dtype::Bf16);
    }

    #[test]
    fn torchtitan_shards_16_bytes_and_keeps_bf16_weights_without_reshard() {
        assert_eq!(layout(Framework::Torchtitan, Dtype::Bf16, 3, false).per_param(8), 2.0);
        assert_eq!(layout(Framework::Torchtitan, Dtype::Bf16, 2, false).per_param(8), 4.0);
        assert_eq!(layout(Framework::Torchtitan, Dtype::Bf16, 3, false).grad_reduce, Dtype::Fp32);
    }

    fn scenario(text: &str) -> Scenario {
        Scenario::from_toml(text, "t.toml", "t", &[]).unwrap()
    }

    #[test]
    fn fp8_adds_two_bytes_per_linear_weight_and_keeps_the_rest() {
        let base = "[model]\npreset = \"llama3-8b\"\n[cluster]\npreset = \"dgx-h100\"\n[parallel]\ntp = 8\npp = 1\nsequence_parallel = true\nglobal_batch = 8\nzero = 1\n";
        let bf16 = scenario(base);
        let fp8 = scenario(&format!("{base}[training]\ndtype = \"fp8\"\n"));
        let sp = &crate::accounting::params::stage_params(&bf16.model, &bf16.parallel)[0];
        let (w0, g0, o0) = stage_state_bytes(&bf16, sp);
        let (w1, g1, o1) = stage_state_bytes(&fp8, sp);
        // Gradients and optimizer unchanged; weights gain 2 B per linear parameter.
        assert_eq!((g0, o0), (g1, o1));
        // Llama 3 8B per tp rank: 32 layers of (4096·6144 + 4096² + 3·4096·14336) / 8.
        let linear: u64 = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336) / 8;
        assert_eq!(w1 - w0, 2.0 * linear as f64);
        // Under ZeRO-3 the copies are transient.
        let z3 = scenario(&format!(
            "{}[training]\ndtype = \"fp8\"\nframework = \"torchtitan\"\n",
            base.replace("zero = 1", "zero = 3")
        ));
        assert_eq!(fp8_weight_bytes(&z3, 0), 0);
    }

    #[test]
    fn experts_shard_over_the_expert_data_parallel_ranks() {
        // Mixtral 8x7B on 64 H100: tp 1, pp 4, dp 16, ep 8 → expert-dp 2, dense dp 16.
        let text = "[model]\npreset = \"mixtral-8x7b\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 8\n[parallel]\ntp = 1\npp = 4\nep = 8\nglobal_batch = 64\nzero = 1\n";
        let s = scenario(text);
        let sp = &crate::accounting::params::stage_params(&s.model, &s.parallel)[1];
        let (_, _, opt) = stage_state_bytes(&s, sp);
        let want = 12.0 * (sp.dense_per_rank() as f64 / 16.0 + sp.expert_params as f64 / 2.0);
        assert!((opt - want).abs() < 1.0, "{opt} vs {want}");
    }

    #[test]
    fn strata_keeps_the_zero_paper() {
        for (zero, per) in [(0, 16.0), (1, 4.0 + 12.0 / 4.0), (2, 2.0 + 14.0 / 4.0), (3, 4.0)] {
            assert!(close(layout(Framework::Strata, Dtype::Bf16, zero, false).per_param(4), per));
        }
        assert_eq!(layout(Framework::Strata, Dtype::Fp32, 1, false).per_param(4), 10.0);
    }
}
