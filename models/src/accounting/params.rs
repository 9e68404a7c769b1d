//! Parameter counts: total, per pipeline stage, per rank.
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

/// Attention parameters of one layer: (sharded, replicated).
pub fn attention_params(m: &ModelSpec) -> (u64, u64) {
    let h = m.hidden as u64;
    let qkv = h + 2 * m.kv_dim();
    let weights = h * qkv + h * h;
    if m.has_bias() { (weights + qkv, h) } else { (weights, 0) }
}

/// MLP parameters of one layer: (sharded, replicated).
pub fn mlp_params(m: &ModelSpec) -> (u64, u64) {
    let h = m.hidden as u64;
    let f = m.ffn_hidden as u64;
    let weights = m.mlp_matrices() * h * f;
    if m.has_bias() { (weights + (m.mlp_matrices() - 1) * f, h) } else { (weights, 0) }
}

/// Parameters of one transformer layer.
pub fn layer_params(m: &ModelSpec) -> LayerParams {
    let (a_s, a_r) = attention_params(m);
    let (m_s, m_r) = mlp_params(m);
    LayerParams { sharded: a_s + m_s, replicated: a_r + m_r + 2 * m.norm_params() }
}

/// Input embedding: (vocab-parallel table, replicated position table).
pub fn embedding_params(m: &ModelSpec) -> (u64, u64) {
    let h = m.hidden as u64;
    let pos = if m.learned_positions() { m.seq_len as u64 * h } else { 0 };
    (m.vocab as u64 * h, pos)
}

/// Unique parameters of the whole model.
pub fn total_params(m: &ModelSpec) -> u64 {
    let (word, pos) = embedding_params(m);
    let head = if m.tied_embeddings() { 0 } else { m.vocab as u64 * m.hidden as u64 };
    m.layers as u64 * layer_params(m).total() + word + pos + m.norm_params() + head
}

/// Parameters held by one rank of each pipeline stage, with the pieces named.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StageParams {
    pub stage: u32,
    pub layers: u32,
    /// Per tp rank: the transformer layers of all this stage's chunks.
    pub layer_params: u64,
    /// Per tp rank: word (vocab shard) and position embeddings, on the first stage.
    pub embedding_params: u64,
    /// Per tp rank: final norm and output layer (or the tied copy) on the last stage.
    pub head_params: u64,
    /// All parameters of the stage summed over its tp ranks, counting each unique tensor once.
    pub stage_total: u64,
}

impl StageParams {
    /// Parameters held by one rank of the stage.
    pub fn per_rank(&self) -> u64 {
        self.layer_params + self.embedding_params + self.head_params
    }
}

/// Parameters of each pipeline stage (each stage holds vpp chunks of l / (pp · vpp) layers).
pub fn stage_params(m: &ModelSpec, p: &ParallelConfig) -> Vec<StageParams> {
    let lp = layer_params(m);
    let t = p.tp as u64;
    let (word, pos) = embedding_params(m);
    (0..p.pp)
        .map(|stage| {
            let layers = p.stage_layers(m, stage);
            let first = stage == 0;
            let last = stage == p.pp - 1;
            let embedding_params = if first { word / t + pos } else { 0 };
            let head_params = if last {
                let out = if m.tied_embeddings() && p.pp == 1 { 0 } else { m.vocab as u64 * m.hidden as u64 / t };
                out + m.norm_params()
            } else {
                0
            };
            let mut stage_total = layers as u64 * lp.total();
            if first {
                stage_total += word + pos;
            }
            if last {
                stage_total += m.norm_params() + if m.tied_embeddings() { 0 } else { m.vocab as u64 * m.hidden as u64 };
            }
            StageParams {
                stage,
                layers,
                layer_params: layers as u64 * lp.per_rank(p.tp),
                embedding_params,
                head_params,
                stage_total,
            }
        })
        .collect()
}

/// Parameters of the largest single module one tensor-parallel rank holds, as DeepSpeed's
/// `model_to_params` counts them for its ZeRO-3 estimator (a module's own parameters, not
/// its children's): the word embedding or output layer (V·h/t), the position table, the
/// fused QKV projection, or one MLP matrix with its bias.
pub fn largest_module_params(m: &ModelSpec, tp: u32) -> u64 {
    let t = tp.max(1) as u64;
    let h = m.hidden as u64;
    let (word, pos) = embedding_params(m);
    let bias = |n: u64| if m.has_bias() { n } else { 0 };
    let qkv = h + 2 * m.kv_dim();
    let f = m.ffn_hidden as u64;
    [word / t, pos, (h * qkv + bias(qkv)) / t, (h * f + bias(f)) / t].into_iter().max().unwrap_or(0)
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
