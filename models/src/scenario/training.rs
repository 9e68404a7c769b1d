//! The `[training]` table's types: the numeric format ([`Dtype`], with fp8 training as
//! Transformer Engine runs it) and the optimisation settings of a run ([`TrainingConfig`]).

use serde::{Deserialize, Serialize};

use crate::framework::Framework;
use crate::parallel::Violation;

/// Numeric format of weights and activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
    /// As a training dtype: Transformer Engine's fp8 recipe (linear-layer GEMMs in fp8,
    /// everything else bf16; see [`TrainingConfig::storage_dtype`]). As a tensor's dtype:
    /// one byte per element.
    Fp8,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp8 => 1,
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
            Dtype::Fp8 => "fp8",
        }
    }
}

/// The optimisation settings of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    pub dtype: Dtype,
    pub steps: u32,
    pub seed: u64,
    /// Peak learning rate of AdamW.
    pub lr: f64,
    /// Linear warm-up steps before the peak learning rate.
    pub warmup_steps: u32,
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: f64,
    /// Fused attention (FlashAttention, Dao et al. 2022): the s×s scores are never stored
    /// and are recomputed inside the backward kernel. Default: on for GPU clusters (every
    /// framework's default there), off on the CPU cluster.
    pub flash_attention: bool,
    /// The framework the plan is meant for: its memory, gradient dtype, exports and the
    /// splits it runs ([`Framework`]). Megatron-LM on GPU clusters, Strata's executor on CPU.
    pub framework: Framework,
    /// Reduce data-parallel gradients in bf16 instead of the fp32 main gradients
    /// (Megatron-LM's `--grad-reduce-in-bf16`).
    pub grad_reduce_in_bf16: bool,
}

impl TrainingConfig {
    /// The dtype of activations, weights the GEMMs read outside fp8, gradients and
    /// communication: the training dtype, except bf16 under fp8 training (Transformer
    /// Engine keeps activations, norms, attention and the high-precision weights in bf16).
    pub fn storage_dtype(&self) -> Dtype {
        if self.dtype == Dtype::Fp8 { Dtype::Bf16 } else { self.dtype }
    }

    /// The linear layers' GEMMs run in fp8.
    pub fn fp8(&self) -> bool {
        self.dtype == Dtype::Fp8
    }
}

/// The precision rules a cluster imposes on the training dtype: fp8 needs fp8 tensor cores
/// (Hopper or later; Transformer Engine refuses fp8 below compute capability 8.9, its
/// `check_fp8_support`). One [`Violation`] per broken rule, as the split's rules.
pub fn precision_violations(t: &TrainingConfig, cluster: &crate::cluster::ClusterSpec) -> Vec<Violation> {
    let gpu = cluster.gpu.spec();
    let mut v = Vec::new();
    if t.fp8() && !gpu.has_fp8() {
        v.push(Violation {
            rule: "fp8-needs-hardware",
            message: format!(
                "training.dtype = \"fp8\" on cluster.gpu = \"{}\" ({}): it has no fp8 tensor cores (Hopper H100/H200 and Blackwell B200 do); use dtype = \"bf16\" or an fp8 GPU",
                cluster.gpu.key(),
                gpu.name
            ),
        });
    }
    v
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            dtype: Dtype::Bf16,
            steps: 1,
            seed: 0,
            lr: 3e-4,
            warmup_steps: 0,
            weight_decay: 0.1,
            grad_clip: 1.0,
            flash_attention: false,
            framework: Framework::Megatron,
            grad_reduce_in_bf16: false,
        }
    }
}
