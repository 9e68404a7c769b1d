//! Transformer specifications: the decoder-only models Strata plans, simulates and trains.
//!
//! Two families cover the field:
//! - **GPT** (Radford et al. 2019, Brown et al. 2020; Megatron-LM's `GPTModel`): learned
//!   position embeddings, LayerNorm with bias, biased linear layers, a GELU MLP of width
//!   `ffn_hidden` (usually 4h), and the output layer tied to the input embedding;
//! - **Llama** (Touvron et al. 2023, Llama 3 report 2024): rotary positions (no position
//!   table), RMSNorm without bias, bias-free linear layers, a SwiGLU MLP (three matrices),
//!   grouped-query attention (`kv_heads < heads`), and an untied output layer.
//!
//! A spec is plain data. Shapes follow Megatron-LM's names: `hidden` = h, `heads` = a,
//! `ffn_hidden` = f, `seq_len` = s, `vocab` = V, `layers` = l.

use serde::{Deserialize, Serialize};

mod check;

/// Model family: decides positions, norms, biases, MLP and embedding tying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    Gpt,
    Llama,
}

/// The MLP's activation. `Swiglu` means three matrices (gate, up, down), `Gelu` two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    Gelu,
    Swiglu,
}

/// A decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    pub family: Family,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    /// Key/value heads; grouped-query attention when smaller than `heads`.
    pub kv_heads: u32,
    /// Channels of one attention head (Hugging Face's `head_dim`, Megatron-LM's
    /// `--kv-channels`); absent = h / heads. Qwen3 sets it apart from h: 64 heads of 128
    /// over h = 4,096, a query width heads · head_dim = 8,192. Read through
    /// [`ModelSpec::head_dim`], never as h / heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    pub ffn_hidden: u32,
    pub vocab: u32,
    pub seq_len: u32,
    pub activation: Activation,
    /// Dropout probability on the attention probabilities and the residual branches
    /// (Megatron-LM's `attention_dropout` and `hidden_dropout`, one value). It decides
    /// whether masks are saved for backward. GPT presets 0.1, Llama 0; 0 on a CPU cluster,
    /// whose executor has no dropout (see `scenario`).
    #[serde(default)]
    pub dropout: f64,
    /// Base θ of the rotary position embedding (Llama; GPT has learned positions): 500,000
    /// for Llama 3, 10,000 for Llama 2 and RoFormer. Megatron-LM's `--rotary-base`,
    /// torchtitan's `rope_theta`.
    #[serde(default = "default_rope_base")]
    pub rope_base: f64,
    /// Mixture of experts in the MLP of every layer past `moe.dense_layers`; absent = dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeSpec>,
    /// Multi-head latent attention (DeepSeek-V2/V3) instead of (grouped-query) multi-head
    /// attention; absent = MHA/GQA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaSpec>,
    /// Multi-token-prediction modules after the last layer (DeepSeek-V3's
    /// `num_nextn_predict_layers`, Megatron-LM's `--mtp-num-layers`); 0 = none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtp_layers: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// How a router scores experts: softmax over the experts (Mixtral, Qwen3) or an
/// independent sigmoid per expert (DeepSeek-V3, Llama 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RouterScore {
    #[default]
    Softmax,
    Sigmoid,
}

/// A mixture-of-experts MLP (Shazeer et al. 2017; Fedus et al. 2021; Megatron-core's
/// `MoELayer`). Each token goes to its `top_k` routed experts out of `experts` (SwiGLU or
/// GELU MLPs of width `expert_ffn_hidden`, the model's activation), plus `shared_experts`
/// MLPs of width `shared_ffn_hidden` that every token passes through. The first
/// `dense_layers` layers keep the dense MLP of width `ModelSpec::ffn_hidden`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSpec {
    /// Routed experts per MoE layer (E).
    pub experts: u32,
    /// Experts each token is sent to (k).
    pub top_k: u32,
    /// Hidden width of one routed expert's MLP.
    pub expert_ffn_hidden: u32,
    /// Shared experts every token passes through (DeepSeek-V3: 1).
    #[serde(default)]
    pub shared_experts: u32,
    /// Hidden width of one shared expert (0 when there are none).
    #[serde(default)]
    pub shared_ffn_hidden: u32,
    /// Leading layers with a dense MLP (DeepSeek-V3's `first_k_dense_replace` = 3).
    #[serde(default)]
    pub dense_layers: u32,
    /// Tokens an expert takes, as a multiple of an even share (Megatron-LM's
    /// `--moe-expert-capacity-factor`): capacity = ceil(tokens·k / E · factor), the rest
    /// dropped. Absent = dropless (every token is computed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<f64>,
    #[serde(default)]
    pub score: RouterScore,
    /// Load-balancing auxiliary loss coefficient α (Switch-style, L = α·E·Σ f_i·P_i).
    #[serde(default)]
    pub aux_loss_coeff: f64,
    /// Router imbalance: the Gini coefficient of tokens over experts in a microbatch, which
    /// the simulator draws per (layer, microbatch) from one seeded generator. Absent = the
    /// published default; 0 = perfectly balanced (force-balanced benchmarks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew: Option<f64>,
}

/// Multi-head latent attention shapes (DeepSeek-V3 config: `q_lora_rank` 1536,
/// `kv_lora_rank` 512, `qk_nope_head_dim` 128, `qk_rope_head_dim` 64, `v_head_dim` 128).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlaSpec {
    /// Rank of the query down-projection (0 = queries projected directly from h).
    pub q_lora_rank: u32,
    /// Rank of the joint key/value down-projection.
    pub kv_lora_rank: u32,
    /// Per-head query/key width without rotary positions.
    pub qk_nope_head_dim: u32,
    /// Per-head query/key width that carries rotary positions (one shared rotary key).
    pub qk_rope_head_dim: u32,
    /// Per-head value width.
    pub v_head_dim: u32,
}

impl MoeSpec {
    /// `experts` routed experts of width `expert_ffn_hidden`, `top_k` per token, dropless,
    /// softmax scoring, no shared expert, every layer MoE.
    pub fn routed(experts: u32, top_k: u32, expert_ffn_hidden: u32, aux_loss_coeff: f64) -> MoeSpec {
        MoeSpec {
            experts,
            top_k,
            expert_ffn_hidden,
            shared_experts: 0,
            shared_ffn_hidden: 0,
            dense_layers: 0,
            capacity_factor: None,
            score: RouterScore::Softmax,
            aux_loss_coeff,
            skew: None,
        }
    }
}

/// Llama 3's rotary base, the default of a spec that does not give one.
pub fn default_rope_base() -> f64 {
    500_000.0
}

/// Names of the built-in model presets, in the order `--help` lists them.
pub const MODEL_PRESETS: &[&str] = &[
    "gpt2-124m",
    "gpt2-350m",
    "gpt3-175b",
    "gpt-22b",
    "gpt-530b",
    "gpt-1t",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "tiny-gpt",
    "tiny-gpt-deep",
    "tiny-llama",
    "small-gpt",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "deepseek-v3",
    "qwen3-235b-a22b",
    "tiny-moe",
    "tiny-moe-gpt",
];

impl ModelSpec {
    /// A built-in model by name, or `None`.
    ///
    /// The GPT-3-shaped models (`gpt-22b`, `gpt3-175b`, `gpt-530b`, `gpt-1t`) are the four of
    /// Korthikanti et al. 2022 Table 3 (vocab 51,200, sequence 2,048). The Llama 3 shapes are
    /// those of the Llama 3 report (Table 3). The `tiny-*` and `small-gpt` models are sized
    /// for the CPU executor: byte-level vocabulary, a few layers.
    ///
    /// Mixtures of experts:
    /// - `mixtral-8x7b` / `mixtral-8x22b`: Llama-style layers, 8 SwiGLU experts, top-2, softmax
    ///   router, no shared expert, rope θ 10^6 (Megatron-LM `examples/mixtral`, NeMo
    ///   `MixtralConfig8x7B`/`8x22B`); sequence 4,096 as Megatron-LM's Mixtral example trains;
    ///   8x22B's vocabulary 32,768 (Mistral's v3 tokenizer; unverified against a training run);
    /// - `deepseek-v3`: 61 layers of h 7,168, MLA (q rank 1,536, kv rank 512, heads 128 of
    ///   128 + 64 rotary query/key and 128 value channels), the first 3 layers dense (18,432),
    ///   the other 58 with 256 routed experts of 2,048, top-8 sigmoid routing, 1 shared expert
    ///   of 2,048, one multi-token-prediction module, vocabulary 129,280, sequence 4,096, rope θ
    ///   10^4 (DeepSeek-V3 `inference/configs/config_671B.json`, arXiv 2412.19437);
    /// - `qwen3-235b-a22b`: 94 layers of h 4,096, grouped-query attention of 64 query and 4
    ///   key/value heads of `head_dim` 128 (a query width of 8,192 ≠ h), every layer a MoE of
    ///   128 SwiGLU experts of 1,536, top-8 softmax routing, no shared expert, untied
    ///   embeddings over a vocabulary of 151,936, RMSNorm, RoPE θ 10^6, router aux-loss 10^-3
    ///   (Hugging Face `Qwen/Qwen3-235B-A22B` `config.json`; Megatron-LM
    ///   `examples/post_training/modelopt/conf/Qwen/Qwen3-235B-A22B.sh`); `ffn_hidden` is the
    ///   config's `intermediate_size` 12,288 (Megatron-LM's `--ffn-hidden-size`), unused with
    ///   no dense layer; sequence 4,096, the Qwen3 report's first pre-training stages (arXiv
    ///   2505.09388). Its per-head q/k RMSNorm (`--qk-layernorm`, 2 · 128 weights a layer) is
    ///   not modelled;
    /// - `tiny-moe` (Llama family) and `tiny-moe-gpt` (GPT, with a shared expert): CPU-sized.
    pub fn preset(name: &str) -> Option<ModelSpec> {
        use Activation::*;
        use Family::*;
        let m = |family, layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, activation| ModelSpec {
            dropout: if family == Gpt { 0.1 } else { 0.0 },
            rope_base: default_rope_base(),
            name: name.to_string(),
            family,
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim: None,
            ffn_hidden,
            vocab,
            seq_len,
            activation,
            moe: None,
            mla: None,
            mtp_layers: 0,
        };
        Some(match name {
            "gpt2-124m" => m(Gpt, 12, 768, 12, 12, 3072, 50257, 1024, Gelu),
            "gpt2-350m" => m(Gpt, 24, 1024, 16, 16, 4096, 50257, 1024, Gelu),
            "gpt3-175b" => m(Gpt, 96, 12288, 96, 96, 49152, 51200, 2048, Gelu),
            "gpt-22b" => m(Gpt, 48, 6144, 64, 64, 24576, 51200, 2048, Gelu),
            "gpt-530b" => m(Gpt, 105, 20480, 128, 128, 81920, 51200, 2048, Gelu),
            "gpt-1t" => m(Gpt, 128, 25600, 160, 160, 102400, 51200, 2048, Gelu),
            "llama3-8b" => m(Llama, 32, 4096, 32, 8, 14336, 128256, 8192, Swiglu),
            "llama3-70b" => m(Llama, 80, 8192, 64, 8, 28672, 128256, 8192, Swiglu),
            "llama3-405b" => m(Llama, 126, 16384, 128, 8, 53248, 128256, 8192, Swiglu),
            "tiny-gpt" => m(Gpt, 4, 64, 4, 4, 256, 256, 64, Gelu),
            "tiny-gpt-deep" => m(Gpt, 8, 64, 4, 4, 256, 256, 32, Gelu),
            "tiny-llama" => m(Llama, 4, 64, 4, 2, 176, 256, 64, Swiglu),
            "small-gpt" => m(Gpt, 8, 256, 8, 8, 1024, 256, 128, Gelu),
            "mixtral-8x7b" => ModelSpec {
                rope_base: 1e6,
                moe: Some(MoeSpec::routed(8, 2, 14336, 0.01)),
                ..m(Llama, 32, 4096, 32, 8, 14336, 32000, 4096, Swiglu)
            },
            "mixtral-8x22b" => ModelSpec {
                rope_base: 1e6,
                moe: Some(MoeSpec::routed(8, 2, 16384, 0.01)),
                ..m(Llama, 56, 6144, 48, 8, 16384, 32768, 4096, Swiglu)
            },
            "deepseek-v3" => ModelSpec {
                rope_base: 10_000.0,
                moe: Some(MoeSpec {
                    shared_experts: 1,
                    shared_ffn_hidden: 2048,
                    dense_layers: 3,
                    score: RouterScore::Sigmoid,
                    ..MoeSpec::routed(256, 8, 2048, 1e-4)
                }),
                mla: Some(MlaSpec {
                    q_lora_rank: 1536,
                    kv_lora_rank: 512,
                    qk_nope_head_dim: 128,
                    qk_rope_head_dim: 64,
                    v_head_dim: 128,
                }),
                mtp_layers: 1,
                ..m(Llama, 61, 7168, 128, 128, 18432, 129280, 4096, Swiglu)
            },
            "qwen3-235b-a22b" => ModelSpec {
                rope_base: 1e6,
                head_dim: Some(128),
                moe: Some(MoeSpec::routed(128, 8, 1536, 1e-3)),
                ..m(Llama, 94, 4096, 64, 4, 12288, 151936, 4096, Swiglu)
            },
            "tiny-moe" => ModelSpec {
                moe: Some(MoeSpec { dense_layers: 1, ..MoeSpec::routed(8, 2, 64, 0.01) }),
                ..m(Llama, 4, 64, 4, 2, 176, 256, 64, Swiglu)
            },
            "tiny-moe-gpt" => ModelSpec {
                moe: Some(MoeSpec { shared_experts: 1, shared_ffn_hidden: 64, ..MoeSpec::routed(8, 2, 64, 0.01) }),
                ..m(Gpt, 4, 64, 4, 4, 256, 256, 64, Gelu)
            },
            _ => return None,
        })
    }

    /// Layers whose MLP is a mixture of experts.
    pub fn moe_layers(&self) -> u32 {
        self.moe.as_ref().map_or(0, |m| self.layers.saturating_sub(m.dense_layers))
    }

    /// Layers with a dense MLP of width `ffn_hidden`.
    pub fn dense_layers(&self) -> u32 {
        self.layers - self.moe_layers()
    }

    /// Width of one query (and key) head in the attention core: [`Self::head_dim`], or MLA's
    /// nope + rope channels.
    pub fn qk_head_dim(&self) -> u64 {
        self.mla.as_ref().map_or(self.head_dim(), |a| (a.qk_nope_head_dim + a.qk_rope_head_dim) as u64)
    }

    /// Width of one value head: [`Self::head_dim`], or MLA's `v_head_dim`.
    pub fn v_head_dim(&self) -> u64 {
        self.mla.as_ref().map_or(self.head_dim(), |a| a.v_head_dim as u64)
    }

    /// The width of one attention head: `head_dim` where the model sets it, else h / a.
    pub fn head_dim(&self) -> u64 {
        self.head_dim.map_or((self.hidden / self.heads.max(1)) as u64, u64::from)
    }

    /// Width of the query projection and of the attention output the projection reads:
    /// heads · head_dim (h unless `head_dim` sets the head apart from h / heads).
    pub fn q_dim(&self) -> u64 {
        self.heads as u64 * self.head_dim()
    }

    /// Width of the key (or value) projection: kv_heads · head_dim.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads as u64 * self.head_dim()
    }

    /// Learned position table (GPT) rather than rotary positions (Llama).
    pub fn learned_positions(&self) -> bool {
        self.family == Family::Gpt
    }

    /// Output layer shares the input embedding's weights (GPT) or has its own (Llama).
    pub fn tied_embeddings(&self) -> bool {
        self.family == Family::Gpt
    }

    /// Linear layers and norms carry biases (GPT) or not (Llama).
    pub fn has_bias(&self) -> bool {
        self.family == Family::Gpt
    }

    /// Parameters of one norm: LayerNorm has weight and bias (2h), RMSNorm weight only (h).
    pub fn norm_params(&self) -> u64 {
        let h = self.hidden as u64;
        if self.has_bias() { 2 * h } else { h }
    }

    /// Matrices in the MLP: 2 for GELU (up, down), 3 for SwiGLU (gate, up, down).
    pub fn mlp_matrices(&self) -> u64 {
        match self.activation {
            Activation::Gelu => 2,
            Activation::Swiglu => 3,
        }
    }

    /// The MLP of `layer` is a mixture of experts.
    pub fn is_moe_layer(&self, layer: u32) -> bool {
        self.moe.as_ref().is_some_and(|m| layer >= m.dense_layers)
    }

    /// Structural checks that do not depend on the parallel split. Every message names the
    /// values involved.
    pub fn check(&self) -> Result<(), String> {
        let mut bad = Vec::new();
        for (key, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn_hidden", self.ffn_hidden),
            ("vocab", self.vocab),
            ("seq_len", self.seq_len),
        ] {
            if v == 0 {
                bad.push(format!("model.{key} = 0: it must be at least 1"));
            }
        }
        if !(self.rope_base > 1.0 && self.rope_base.is_finite()) {
            bad.push(format!("model.rope_base = {}: the rotary base must be a number above 1", self.rope_base));
        }
        if bad.is_empty()
            && let Err(e) = crate::limits::check_model(self)
        {
            bad.push(e);
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bad.push(format!("model.dropout = {}: a dropout probability is in [0, 1)", self.dropout));
        }
        if bad.is_empty() {
            self.check_moe_mla(&mut bad);
        }
        if bad.is_empty() {
            if self.head_dim.is_none() && !self.hidden.is_multiple_of(self.heads) {
                bad.push(format!(
                    "model.hidden = {} is not divisible by model.heads = {}: every head needs hidden/heads channels (or set model.head_dim)",
                    self.hidden, self.heads
                ));
            }
            if !self.heads.is_multiple_of(self.kv_heads) {
                bad.push(format!(
                    "model.heads = {} is not divisible by model.kv_heads = {}: grouped-query attention shares each key/value head among heads/kv_heads query heads",
                    self.heads, self.kv_heads
                ));
            }
        }
        if bad.is_empty() { Ok(()) } else { Err(bad.join("\n")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_preset_exists_and_is_consistent() {
        for name in MODEL_PRESETS {
            let m = ModelSpec::preset(name).unwrap_or_else(|| panic!("preset {name} missing"));
            assert_eq!(m.name, *name);
            m.check().unwrap();
        }
        assert!(ModelSpec::preset("gpt5").is_none());
    }

    #[test]
    fn check_names_the_values() {
        let mut m = ModelSpec::preset("tiny-gpt").unwrap();
        m.heads = 3;
        let e = m.check().unwrap_err();
        assert!(e.contains("model.hidden = 64") && e.contains("model.heads = 3"), "{e}");
        m.heads = 4;
        m.kv_heads = 3;
        let e = m.check().unwrap_err();
        assert!(e.contains("model.kv_heads = 3"), "{e}");
    }
}
