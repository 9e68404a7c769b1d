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
//!
//! **Mixtures of experts** count what a token runs, not what the layer holds: its top-k
//! routed experts, the shared experts and the router GEMM (2·h·E), so model FLOPs — and
//! MFU — use the *active* shapes (the convention of DeepSeek-V3's and Megatron-LM's MoE
//! throughput figures). Dropped tokens under a capacity factor are not subtracted (an upper
//! bound; dropless routing runs exactly k per token). **Latent attention** counts its five
//! projections (2 FLOPs per weight per token) and a core of 2·s·a·(d_nope + d_rope) for QKᵀ
//! and 2·s·a·d_v for P·V. **Multi-token prediction** adds per module its 2h·h projection,
//! one layer and the output layer again (the head is shared, its GEMM is not).

use serde::Serialize;

use crate::model::ModelSpec;
use crate::parallel::Recompute;

/// Forward FLOPs of one dense transformer layer for one token (sequence length s of
/// context).
pub fn layer_forward_flops_per_token(m: &ModelSpec) -> u64 {
    attention_linear_forward_flops_per_token(m)
        + attention_core_forward_flops_per_token(m)
        + 2 * m.mlp_matrices() * m.hidden as u64 * m.ffn_hidden as u64
}

/// Forward FLOPs of layer `layer` for one token: a dense layer's, or with a MoE MLP the
/// top-k routed experts, the shared experts and the router.
pub fn layer_forward_flops_per_token_at(m: &ModelSpec, layer: u32) -> u64 {
    match &m.moe {
        Some(e) if m.is_moe_layer(layer) => {
            let h = m.hidden as u64;
            let mlp = |f: u32| 2 * m.mlp_matrices() * h * f as u64;
            attention_linear_forward_flops_per_token(m)
                + attention_core_forward_flops_per_token(m)
                + e.top_k as u64 * mlp(e.expert_ffn_hidden)
                + e.shared_experts as u64 * mlp(e.shared_ffn_hidden)
                + 2 * h * e.experts as u64
        }
        _ => layer_forward_flops_per_token(m),
    }
}

/// Forward FLOPs of the attention's linear layers for one token: QKV and projection, or
/// latent attention's down, up and output projections.
pub fn attention_linear_forward_flops_per_token(m: &ModelSpec) -> u64 {
    let h = m.hidden as u64;
    match &m.mla {
        Some(a) => {
            let n = m.heads as u64;
            let (r_q, r_kv) = (a.q_lora_rank as u64, a.kv_lora_rank as u64);
            let (nope, rope, v) = (a.qk_nope_head_dim as u64, a.qk_rope_head_dim as u64, a.v_head_dim as u64);
            let q = if r_q > 0 { h * r_q + r_q * n * (nope + rope) } else { h * n * (nope + rope) };
            2 * (q + h * (r_kv + rope) + r_kv * n * (nope + v) + n * v * h)
        }
        None => 2 * h * (m.q_dim() + 2 * m.kv_dim()) + 2 * m.q_dim() * h,
    }
}

/// Forward FLOPs of the attention core (QKᵀ and probabilities · V) for one token.
pub fn attention_core_forward_flops_per_token(m: &ModelSpec) -> u64 {
    2 * m.seq_len as u64 * m.heads as u64 * (m.qk_head_dim() + m.v_head_dim())
}

/// Forward FLOPs of the output layer for one token.
pub fn logits_forward_flops_per_token(m: &ModelSpec) -> u64 {
    2 * m.hidden as u64 * m.vocab as u64
}

/// Forward FLOPs of all layers for one token.
fn layers_forward_flops_per_token(m: &ModelSpec) -> u64 {
    (0..m.layers).map(|l| layer_forward_flops_per_token_at(m, l)).sum()
}

/// Forward FLOPs of the multi-token-prediction modules for one token.
pub fn mtp_forward_flops_per_token(m: &ModelSpec) -> u64 {
    let h = m.hidden as u64;
    let module = 2 * 2 * h * h + layer_forward_flops_per_token_at(m, m.layers) + logits_forward_flops_per_token(m);
    m.mtp_layers as u64 * module
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
    let layers = layers_forward_flops_per_token(m) as f64;
    let logits = logits_forward_flops_per_token(m) as f64;
    let model = 3.0 * tokens * (layers + logits + mtp_forward_flops_per_token(m) as f64);
    let extra = match recompute {
        Recompute::None => 0.0,
        Recompute::Selective => tokens * l * attention_core_forward_flops_per_token(m) as f64,
        Recompute::Full => tokens * layers,
    };
    StepFlops { model, hardware: model + extra }
}

/// FLOPs of one step of a scenario: [`step_flops`] plus, with fused (flash) attention or
/// context parallelism (whose block attention recomputes each block's probabilities from
/// the log-sum-exp, fused or not), the score GEMM QKᵀ that the backward recomputes
/// (2·s·a·d_qk per token and layer, 2·s·h without latent attention).
pub fn scenario_step_flops(s: &crate::scenario::Scenario) -> StepFlops {
    let m = &s.model;
    let mut f = step_flops(m, s.parallel.global_batch as u64, s.parallel.recompute);
    if s.parallel.recompute == Recompute::Selective && !s.training.framework.recomputes_attention_core(s) {
        // A fused core that the framework does not checkpoint is not run again.
        f.hardware -= s.tokens_per_step() as f64 * m.layers as f64 * attention_core_forward_flops_per_token(m) as f64;
    }
    if s.training.flash_attention || s.parallel.cp > 1 {
        // QKᵀ: 2·s·a·d_qk per token and layer (half the core when d_qk = d_v), MTP layers too.
        let tokens = s.tokens_per_step() as f64;
        let qk = 2 * m.seq_len as u64 * m.heads as u64 * m.qk_head_dim();
        f.hardware += tokens * (m.layers + m.mtp_layers) as f64 * qk as f64;
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

    #[test]
    fn moe_flops_count_the_active_experts() {
        // Mixtral 8x7B, 4,096 tokens of context: 2 of 8 experts, router 2·h·8 per token.
        let m = ModelSpec::preset("mixtral-8x7b").unwrap();
        let (h, s, f) = (4096u64, 4096u64, 14336u64);
        let attn = 2 * h * (h + 2 * 1024) + 2 * h * h + 4 * s * h;
        assert_eq!(layer_forward_flops_per_token_at(&m, 0), attn + 2 * 3 * 2 * h * f + 2 * h * 8);
        // Per token the linear FLOPs are twice the active non-embedding parameters.
        let c = crate::accounting::params::param_counts(&m);
        let linear = 32 * (layer_forward_flops_per_token_at(&m, 0) - 4 * s * h) + 2 * h * 32000;
        let norms = 32 * 2 * h + h;
        assert_eq!(linear, 2 * (c.active - 32000 * h - norms));
        // DeepSeek-V3's dense first layers keep their 18,432-wide MLP, as wide as the 8 routed
        // and 1 shared experts of 2,048 a token passes through: they differ by the router.
        let d = ModelSpec::preset("deepseek-v3").unwrap();
        let dense = layer_forward_flops_per_token_at(&d, 2);
        assert_eq!(layer_forward_flops_per_token_at(&d, 3) - dense, 2 * 7168 * 256);
    }

    #[test]
    fn mla_flops_are_twice_its_weights_plus_its_core() {
        let m = ModelSpec::preset("deepseek-v3").unwrap();
        let (sharded, replicated) = crate::accounting::params::attention_params(&m);
        let norms = 1536 + 512;
        assert_eq!(attention_linear_forward_flops_per_token(&m), 2 * (sharded + replicated - norms));
        // QKᵀ over 128 heads of 192 channels, P·V of 128: 2·s·128·(192 + 128).
        assert_eq!(attention_core_forward_flops_per_token(&m), 2 * 4096 * 128 * 320);
        // One MTP module: its projection, a MoE layer, the output layer again.
        let mtp = mtp_forward_flops_per_token(&m);
        assert_eq!(mtp, 4 * 7168 * 7168 + layer_forward_flops_per_token_at(&m, 60) + 2 * 7168 * 129_280);
    }

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
