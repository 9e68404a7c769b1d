//! Parameter counts: total, active, per pipeline stage, per rank.
//!
//! Per transformer layer (h hidden, f ffn_hidden, kv = kv_heads · h/heads):
//! - attention: QKV h·(h + 2kv) (+ bias h + 2kv), output projection h² (+ bias h);
//! - MLP: 2·h·f (GELU) or 3·h·f (SwiGLU) (+ biases f + h for GPT);
//! - two norms: 2h each (LayerNorm) or h (RMSNorm).
//!
//! For GPT with f = 4h this is 12h² + 13h per layer, and the whole model is
//! P = 12·l·h² + 13·l·h + (V + s)·h + 2h — Narayanan et al. SC'21 Eq. 2 plus the final
//! LayerNorm (2h) that the paper's closed form leaves out.
//!
//! Under tensor parallelism (Megatron-LM) the QKV and FC1 weights and biases are split by
//! columns, the projection and FC2 weights by rows, and the vocabulary of the embedding and
//! output layer by rows; norms, position embeddings and row-parallel biases are replicated
//! on every tensor-parallel rank. With a tied output layer and pp > 1, the last stage holds
//! its own copy of the (vocab-parallel) embedding, as Megatron-LM does.
//!
//! **Mixture of experts** (Megatron-core `MoELayer`, the count of
//! `theoretical_memory_usage.py`): a MoE layer's MLP is E routed experts of width f_e, each
//! an MLP of the model's activation (2 or 3 matrices of h·f_e), S shared experts of width
//! f_s that every token passes through, and a router of h·E weights (no bias; DeepSeek-V3's
//! expert bias is a buffer, not a parameter). Routed experts are split over the ep ranks
//! and not over tp (expert-tp 1); shared experts are tensor-parallel like a dense MLP; the
//! router is replicated. *Active* parameters are those one token passes through: the
//! attention, top-k routed experts, the shared experts and the router, the embedding and
//! the output layer (the convention of the published "active" counts: Mixtral 8x7B 12.9B).
//!
//! **Multi-head latent attention** (DeepSeek-V2/V3; Megatron-core `MLASelfAttention`), a
//! heads, ranks r_q and r_kv, per-head widths d_nope, d_rope, d_v: query down h·r_q and up
//! r_q·a·(d_nope + d_rope) (or one h·a·(d_nope + d_rope) when r_q = 0), key/value down
//! h·(r_kv + d_rope) (the shared rotary key included), up r_kv·a·(d_nope + d_v), output
//! a·d_v·h, and RMSNorms of r_q and r_kv. The down projections and their norms are
//! replicated over tp (`TELinear`, Megatron-Bridge's `ReplicatedMapping`), the up and output
//! projections column- and row-parallel. DeepSeek-V3: 187.1M per layer.
//!
//! **Multi-token prediction** (DeepSeek-V3 §2.2, Megatron-core `MultiTokenPredictionLayer`):
//! each module has two RMSNorms (h each, on the hidden state and on the next token's
//! embedding), a projection 2h·h, one transformer layer shaped as the model's last, and a
//! final norm; it shares the embedding and output layer with the main model. The modules
//! sit on the last pipeline stage. The published totals leave them out (DeepSeek-V3: 671B
//! main model, the MTP module counted apart), so [`param_counts`] gives them apart too.

use serde::Serialize;

use crate::model::ModelSpec;
use crate::parallel::ParallelConfig;

/// Parameters of one transformer layer, split into what tensor parallelism shards and what
/// it replicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayerParams {
    /// Split over the tp ranks (QKV, projection, FC1, FC2 weights; column-parallel biases).
    pub sharded: u64,
    /// Held whole by every tp rank (norms, row-parallel biases).
    pub replicated: u64,
}

impl LayerParams {
    pub fn total(&self) -> u64 {
        self.sharded + self.replicated
    }

    /// Parameters one tensor-parallel rank holds.
    pub fn per_rank(&self, tp: u32) -> u64 {
        self.sharded / tp as u64 + self.replicated
    }
}

/// Attention parameters of one layer: (sharded, replicated). Multi-head latent attention
/// when the model has it.
pub fn attention_params(m: &ModelSpec) -> (u64, u64) {
    let h = m.hidden as u64;
    if let Some(a) = &m.mla {
        let n = m.heads as u64;
        let (r_q, r_kv) = (a.q_lora_rank as u64, a.kv_lora_rank as u64);
        let (nope, rope, v) = (a.qk_nope_head_dim as u64, a.qk_rope_head_dim as u64, a.v_head_dim as u64);
        let q_out = n * (nope + rope);
        // Queries: down + norm (replicated) and up (column-parallel), or one projection.
        let (q_sharded, q_replicated) = if r_q > 0 { (r_q * q_out, h * r_q + r_q) } else { (h * q_out, 0) };
        let kv_replicated = h * (r_kv + rope) + r_kv;
        let sharded = q_sharded + r_kv * n * (nope + v) + n * v * h;
        return (sharded, q_replicated + kv_replicated);
    }
    // Q (heads · head_dim), K and V (kv_heads · head_dim each), and the projection back to h.
    let q = m.q_dim();
    let qkv = q + 2 * m.kv_dim();
    let weights = h * qkv + q * h;
    if m.has_bias() { (weights + qkv, h) } else { (weights, 0) }
}

/// Parameters of one MLP of width `f` in the model's activation: (sharded, replicated).
fn mlp_of_width(m: &ModelSpec, f: u64) -> (u64, u64) {
    let h = m.hidden as u64;
    let weights = m.mlp_matrices() * h * f;
    if m.has_bias() { (weights + (m.mlp_matrices() - 1) * f, h) } else { (weights, 0) }
}

/// Dense MLP parameters of one layer: (sharded, replicated).
pub fn mlp_params(m: &ModelSpec) -> (u64, u64) {
    mlp_of_width(m, m.ffn_hidden as u64)
}

/// Parameters of one routed expert (its biases included under GPT).
pub fn expert_params(m: &ModelSpec) -> u64 {
    m.moe.as_ref().map_or(0, |e| {
        let (a, b) = mlp_of_width(m, e.expert_ffn_hidden as u64);
        a + b
    })
}

/// Parameters of a dense transformer layer (attention and the dense MLP of `ffn_hidden`).
/// A MoE layer's are [`layer_params_at`] plus [`layer_expert_params`].
pub fn layer_params(m: &ModelSpec) -> LayerParams {
    let (a_s, a_r) = attention_params(m);
    let (m_s, m_r) = mlp_params(m);
    LayerParams { sharded: a_s + m_s, replicated: a_r + m_r + 2 * m.norm_params() }
}

/// Parameters of layer `layer` that tensor parallelism splits or replicates: a dense
/// layer's, or for a MoE layer the attention, shared experts (tensor-parallel) and router
/// (replicated), without the routed experts ([`layer_expert_params`]).
pub fn layer_params_at(m: &ModelSpec, layer: u32) -> LayerParams {
    let Some(e) = m.moe.as_ref().filter(|_| m.is_moe_layer(layer)) else {
        return layer_params(m);
    };
    let (a_s, a_r) = attention_params(m);
    let (s_s, s_r) = mlp_of_width(m, e.shared_ffn_hidden as u64);
    let shared = e.shared_experts as u64;
    let router = m.hidden as u64 * e.experts as u64;
    LayerParams { sharded: a_s + shared * s_s, replicated: a_r + shared * s_r + router + 2 * m.norm_params() }
}

/// Routed-expert parameters of layer `layer` (0 for a dense layer), split over ep.
pub fn layer_expert_params(m: &ModelSpec, layer: u32) -> u64 {
    match &m.moe {
        Some(e) if m.is_moe_layer(layer) => e.experts as u64 * expert_params(m),
        _ => 0,
    }
}

/// One multi-token-prediction module without its routed experts: two norms, the 2h·h
/// projection (column-parallel), a layer shaped as the model's last, a final norm.
pub fn mtp_module_params(m: &ModelSpec) -> LayerParams {
    let h = m.hidden as u64;
    let layer = layer_params_at(m, m.layers);
    LayerParams { sharded: layer.sharded + 2 * h * h, replicated: layer.replicated + 3 * m.norm_params() }
}

/// Routed-expert parameters of one multi-token-prediction module.
pub fn mtp_module_expert_params(m: &ModelSpec) -> u64 {
    layer_expert_params(m, m.layers)
}

/// Input embedding: (vocab-parallel table, replicated position table).
pub fn embedding_params(m: &ModelSpec) -> (u64, u64) {
    let h = m.hidden as u64;
    let pos = if m.learned_positions() { m.seq_len as u64 * h } else { 0 };
    (m.vocab as u64 * h, pos)
}

/// Parameters in the published convention: the main model's total and the active
/// parameters per token, and apart from them the multi-token-prediction modules'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ParamCounts {
    /// Unique parameters of the main model (embedding, layers, final norm, output layer).
    pub total: u64,
    /// What one token passes through: routed experts counted top-k times, not E.
    pub active: u64,
    /// The multi-token-prediction modules (sharing embedding and output layer).
    pub mtp: u64,
    /// Their active part.
    pub mtp_active: u64,
}

/// Total and active parameters.
pub fn param_counts(m: &ModelSpec) -> ParamCounts {
    let (word, pos) = embedding_params(m);
    let head = if m.tied_embeddings() { 0 } else { m.vocab as u64 * m.hidden as u64 };
    let edges = word + pos + m.norm_params() + head;
    let k = m.moe.as_ref().map_or(0, |e| e.top_k as u64);
    let (mut total, mut active) = (edges, edges);
    for l in 0..m.layers {
        let base = layer_params_at(m, l).total();
        total += base + layer_expert_params(m, l);
        active += base + if m.is_moe_layer(l) { k * expert_params(m) } else { 0 };
    }
    let mtp_base = mtp_module_params(m).total();
    let mtp_k = if m.is_moe_layer(m.layers) { k * expert_params(m) } else { 0 };
    let n = m.mtp_layers as u64;
    ParamCounts { total, active, mtp: n * (mtp_base + mtp_module_expert_params(m)), mtp_active: n * (mtp_base + mtp_k) }
}

/// Unique parameters the run trains and stores: the main model and its MTP modules.
pub fn total_params(m: &ModelSpec) -> u64 {
    let c = param_counts(m);
    c.total + c.mtp
}

/// Parameters held by one rank of each pipeline stage, with the pieces named.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StageParams {
    pub stage: u32,
    pub layers: u32,
    /// Per tp rank: the transformer layers of all this stage's chunks (routed experts not
    /// included).
    pub layer_params: u64,
    /// Per tp rank: word (vocab shard) and position embeddings, on the first stage.
    pub embedding_params: u64,
    /// Per tp rank: final norm and output layer (or the tied copy) on the last stage, and
    /// the multi-token-prediction modules without their routed experts.
    pub head_params: u64,
    /// Per ep rank: the routed experts of this stage's MoE layers (and MTP modules), E/ep
    /// of each. Replicated over the expert-data-parallel ranks, not over tp.
    pub expert_params: u64,
    /// All parameters of the stage summed over its tp (and ep) ranks, counting each unique
    /// tensor once.
    pub stage_total: u64,
}

impl StageParams {
    /// Parameters held by one rank of the stage.
    pub fn per_rank(&self) -> u64 {
        self.layer_params + self.embedding_params + self.head_params + self.expert_params
    }

    /// Of them, those replicated over `grad_ranks()` (all but the routed experts).
    pub fn dense_per_rank(&self) -> u64 {
        self.layer_params + self.embedding_params + self.head_params
    }
}

/// Parameters of each pipeline stage (each stage holds vpp chunks of l / (pp · vpp) layers).
pub fn stage_params(m: &ModelSpec, p: &ParallelConfig) -> Vec<StageParams> {
    let t = p.tp as u64;
    let ep = p.ep.max(1) as u64;
    let (word, pos) = embedding_params(m);
    let pipe = p.pipeline();
    (0..p.pp)
        .map(|stage| {
            let first = stage == 0;
            let last = stage == p.pp - 1;
            let (mut layers, mut layer_params, mut stage_total, mut experts) = (0u32, 0u64, 0u64, 0u64);
            for c in 0..p.vpp {
                for l in p.chunk_layers(m, pipe.vstage(c, stage)) {
                    let lp = layer_params_at(m, l);
                    layers += 1;
                    layer_params += lp.per_rank(p.tp);
                    experts += layer_expert_params(m, l);
                    stage_total += lp.total() + layer_expert_params(m, l);
                }
            }
            let embedding_params = if first { word / t + pos } else { 0 };
            let mut head_params = 0;
            if last {
                let out = if m.tied_embeddings() && p.pp == 1 { 0 } else { m.vocab as u64 * m.hidden as u64 / t };
                let mtp = m.mtp_layers as u64;
                head_params = out + m.norm_params() + mtp * mtp_module_params(m).per_rank(p.tp);
                experts += mtp * mtp_module_expert_params(m);
                stage_total += m.norm_params()
                    + if m.tied_embeddings() { 0 } else { m.vocab as u64 * m.hidden as u64 }
                    + mtp * (mtp_module_params(m).total() + mtp_module_expert_params(m));
            }
            if first {
                stage_total += word + pos;
            }
            StageParams {
                stage,
                layers,
                layer_params,
                embedding_params,
                head_params,
                expert_params: experts / ep,
                stage_total,
            }
        })
        .collect()
}

/// Weights of linear layers (GEMM operands, no biases, norms or router) one rank of
/// pipeline stage `stage` holds: what Transformer Engine keeps an fp8 copy of under fp8
/// training. The embedding, output layer and router stay bf16 (DeepSeek-V3 §3.3; Megatron-LM
/// builds the output layer as a plain `ColumnParallelLinear`, not a TE module).
pub fn stage_linear_params(m: &ModelSpec, p: &ParallelConfig, stage: u32) -> u64 {
    let t = p.tp as u64;
    let ep = p.ep.max(1) as u64;
    let h = m.hidden as u64;
    let attention = match &m.mla {
        Some(_) => {
            let (sharded, replicated) = attention_params(m);
            let a = m.mla.as_ref().map_or(0, |a| a.q_lora_rank as u64 + a.kv_lora_rank as u64);
            sharded / t + replicated - a
        }
        None => (h * (m.q_dim() + 2 * m.kv_dim()) + m.q_dim() * h) / t,
    };
    let mats = m.mlp_matrices() * h;
    let layer = |l: u32| -> u64 {
        attention
            + match &m.moe {
                Some(e) if m.is_moe_layer(l) => {
                    e.shared_experts as u64 * mats * e.shared_ffn_hidden as u64 / t
                        + e.experts as u64 * mats * e.expert_ffn_hidden as u64 / ep
                }
                _ => mats * m.ffn_hidden as u64 / t,
            }
    };
    let pipe = p.pipeline();
    let mut n: u64 = (0..p.vpp).flat_map(|c| p.chunk_layers(m, pipe.vstage(c, stage))).map(layer).sum();
    if stage == p.pp - 1 {
        n += m.mtp_layers as u64 * (2 * h * h / t + layer(m.layers));
    }
    n
}

/// Parameters of the largest single module one tensor-parallel rank holds, as DeepSpeed's
/// `model_to_params` counts them for its ZeRO-3 estimator (a module's own parameters, not
/// its children's): the word embedding or output layer (V·h/t), the position table, the
/// fused QKV projection (or latent attention's largest projection), one MLP matrix with its
/// bias, or one routed expert's matrix (whole: experts are not tensor-parallel).
pub fn largest_module_params(m: &ModelSpec, tp: u32) -> u64 {
    let t = tp.max(1) as u64;
    let h = m.hidden as u64;
    let (word, pos) = embedding_params(m);
    let bias = |n: u64| if m.has_bias() { n } else { 0 };
    let qkv = m.q_dim() + 2 * m.kv_dim();
    let f = m.ffn_hidden as u64;
    // A routed expert's matrix is held whole (experts are not tensor-parallel); latent
    // attention's largest projection is its output (a·d_v·h) or query up projection.
    let expert = m.moe.as_ref().map_or(0, |e| h * e.expert_ffn_hidden as u64 + bias(e.expert_ffn_hidden as u64));
    let attn = match &m.mla {
        Some(a) => {
            let n = m.heads as u64;
            let rank = if a.q_lora_rank > 0 { a.q_lora_rank } else { m.hidden } as u64;
            let q = rank * n * (a.qk_nope_head_dim + a.qk_rope_head_dim) as u64;
            q.max(n * a.v_head_dim as u64 * h) / t
        }
        None => (h * qkv + bias(qkv)) / t,
    };
    [word / t, pos, attn, (h * f + bias(f)) / t, expert].into_iter().max().unwrap_or(0)
}

/// Narayanan et al. SC'21 Eq. 2: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)).
pub fn narayanan_params(layers: u64, hidden: u64, vocab: u64, seq: u64) -> f64 {
    let (l, h, v, s) = (layers as f64, hidden as f64, vocab as f64, seq as f64);
    12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(n: &str) -> ModelSpec {
        ModelSpec::preset(n).unwrap()
    }

    #[test]
    fn gpt2_small_is_exactly_124_439_808() {
        assert_eq!(total_params(&preset("gpt2-124m")), 124_439_808);
    }

    #[test]
    fn gpt3_matches_narayanan_eq2() {
        let m = preset("gpt3-175b");
        let ours = total_params(&m) as f64;
        let eq2 = narayanan_params(96, 12288, 51200, 2048);
        // Eq. 2 leaves out the final LayerNorm (2h parameters).
        assert!((ours - eq2 - 2.0 * 12288.0).abs() < 1.0, "{ours} vs {eq2}");
        assert_eq!(format!("{:.1}", ours / 1e9), "174.6");
    }

    #[test]
    fn llama3_totals_match_the_published_sizes() {
        // Published sizes as the Hugging Face model pages of Meta-Llama-3(.1) round them:
        // 8.03 B, 70.6 B, 406 B parameters.
        for (name, published) in [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 406e9)] {
            let ours = total_params(&preset(name)) as f64;
            assert!((ours / published - 1.0).abs() < 0.005, "{name}: {ours} vs {published}");
        }
    }

    #[test]
    fn stage_params_sum_to_the_total() {
        for name in ["gpt3-175b", "llama3-70b", "tiny-gpt"] {
            let m = preset(name);
            for (tp, pp) in [(1, 1), (2, 2), (4, 4)] {
                if !m.layers.is_multiple_of(pp) || !m.heads.is_multiple_of(tp) || !m.kv_heads.is_multiple_of(tp) {
                    continue;
                }
                let p = ParallelConfig { tp, pp, ..Default::default() };
                let stages = stage_params(&m, &p);
                let sum: u64 = stages.iter().map(|s| s.stage_total).sum();
                assert_eq!(sum, total_params(&m), "{name} tp{tp} pp{pp}");
                // Per-rank counts times tp cover the stage, replicated tensors counted tp times.
                for s in &stages {
                    assert!(
                        s.per_rank() * tp as u64
                            >= s.stage_total
                                - if m.tied_embeddings() && pp > 1 && s.stage == pp - 1 {
                                    m.vocab as u64 * m.hidden as u64
                                } else {
                                    0
                                }
                    );
                }
            }
        }
    }
}
