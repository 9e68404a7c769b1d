//! FLOPs per training step: model FLOPs (what the math needs) and hardware FLOPs (what is
//! executed, recomputation included).
//!
//! Counted from the GEMM shapes, 2·m·n·k each, with the convention of the Megatron-LM
//! papers: the attention core counts the full s×s score matrix (no causal halving),
//! element-wise work is not counted, and backward costs twice forward. Per token and layer,
//! forward = 2·h·(h + 2kv) (QKV) + 4·s·h (QKᵀ and ·V) + 2·h² (projection)
//! + 2·(2 or 3)·h·f (MLP); the output layer adds 2·h·V per token.
//!
//! For GPT shapes (kv = h, f = 4h) model FLOPs reduce to Korthikanti et al. 2022,
//! Appendix A: 72·B·l·s·h²·(1 + s/(6h) + V/(12·h·l)). Hardware FLOPs add the recomputed
//! forward work: the attention core (4·s·h per token and layer) under selective
//! recomputation, the whole layer forward under full recomputation — the latter gives
//! Narayanan et al. SC'21 Eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).

use serde::Serialize;

use crate::model::ModelSpec;
use crate::parallel::Recompute;

/// Forward FLOPs of one transformer layer for one token (sequence length s of context).
pub fn layer_forward_flops_per_token(m: &ModelSpec) -> u64 {
    let h = m.hidden as u64;
    let f = m.ffn_hidden as u64;
    2 * h * (h + 2 * m.kv_dim()) + attention_core_forward_flops_per_token(m) + 2 * h * h + 2 * m.mlp_matrices() * h * f
}

/// Forward FLOPs of the attention core (QKᵀ and probabilities · V) for one token.
pub fn attention_core_forward_flops_per_token(m: &ModelSpec) -> u64 {
    4 * m.seq_len as u64 * m.hidden as u64
}

/// Forward FLOPs of the output layer for one token.
pub fn logits_forward_flops_per_token(m: &ModelSpec) -> u64 {
    2 * m.hidden as u64 * m.vocab as u64
}

/// FLOPs of one step of `global_batch` sequences.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepFlops {
    /// Forward + backward without recomputation (Korthikanti's model FLOPs).
    pub model: f64,
    /// What is executed, recomputation included.
    pub hardware: f64,
}

/// Model and hardware FLOPs of one step.
pub fn step_flops(m: &ModelSpec, global_batch: u64, recompute: Recompute) -> StepFlops {
    let tokens = global_batch as f64 * m.seq_len as f64;
    let l = m.layers as f64;
    let layer = layer_forward_flops_per_token(m) as f64;
    let logits = logits_forward_flops_per_token(m) as f64;
    let model = 3.0 * tokens * (l * layer + logits);
    let extra = match recompute {
        Recompute::None => 0.0,
        Recompute::Selective => tokens * l * attention_core_forward_flops_per_token(m) as f64,
        Recompute::Full => tokens * l * layer,
    };
    StepFlops { model, hardware: model + extra }
}

/// FLOPs of one step of a scenario: [`step_flops`] plus, with fused (flash) attention,
/// the score GEMM QKᵀ that its backward kernel recomputes (2·s·h per token and layer).
pub fn scenario_step_flops(s: &crate::scenario::Scenario) -> StepFlops {
    let m = &s.model;
    let mut f = step_flops(m, s.parallel.global_batch as u64, s.parallel.recompute);
    if s.training.flash_attention {
        let tokens = s.tokens_per_step() as f64;
        f.hardware += tokens * m.layers as f64 * attention_core_forward_flops_per_token(m) as f64 / 2.0;
    }
    f
}

/// Korthikanti et al. 2022 Appendix A, model FLOPs: 72·B·l·s·h²·(1 + s/(6h) + V/(12·h·l)).
pub fn korthikanti_model_flops(b: f64, l: f64, s: f64, h: f64, v: f64) -> f64 {
    72.0 * b * l * s * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l))
}

/// Korthikanti et al. 2022 Appendix A, hardware FLOPs with selective recomputation as the
/// paper counts them: 72·B·l·s·h²·(1 + s/(3h) + V/(12·h·l)). (The paper charges the
/// recomputed attention core at three times its forward cost; [`step_flops`] charges one
/// forward, which is what a kernel executes.)
pub fn korthikanti_selective_hardware_flops(b: f64, l: f64, s: f64, h: f64, v: f64) -> f64 {
    72.0 * b * l * s * h * h * (1.0 + s / (3.0 * h) + v / (12.0 * h * l))
}

/// Narayanan et al. SC'21 Eq. 3 (full recomputation): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).
pub fn narayanan_flops(b: f64, l: f64, s: f64, h: f64, v: f64) -> f64 {
    96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        (a / b - 1.0).abs()
    }

    #[test]
    fn gpt_shapes_reduce_to_the_papers_closed_forms() {
        for name in ["gpt-22b", "gpt3-175b", "gpt-530b", "gpt-1t"] {
            let m = ModelSpec::preset(name).unwrap();
            let (l, s, h, v) = (m.layers as f64, m.seq_len as f64, m.hidden as f64, m.vocab as f64);
            let f = step_flops(&m, 64, Recompute::None);
            assert!(rel(f.model, korthikanti_model_flops(64.0, l, s, h, v)) < 1e-12, "{name}");
            let full = step_flops(&m, 64, Recompute::Full);
            assert!(rel(full.hardware, narayanan_flops(64.0, l, s, h, v)) < 1e-12, "{name}");
            let sel = step_flops(&m, 64, Recompute::Selective);
            assert!(sel.hardware > f.model && sel.hardware < full.hardware);
        }
    }
}
