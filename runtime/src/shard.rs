//! What one tensor-parallel rank holds of a GPT or Llama model (Megatron-LM, Shoeybi et al.
//! 2019).
//!
//! With t tensor-parallel ranks, rank r of t holds:
//! - QKV (column-parallel): heads/t whole query heads, D = (a/t)·d columns of Q, and
//!   kv_heads/t whole key/value heads, Dkv = (g/t)·d columns of each of K and V (g = a
//!   without grouped-query attention); Megatron-LM requires t to divide g, and so does this;
//! - attention projection (row-parallel): the matching D input rows; output is a partial sum;
//! - FC1 (column-parallel): F = f/t columns, or under SwiGLU F gate and F up columns (the
//!   r-th t-th of each half of the fused [gate | up] weight); FC2 (row-parallel): the
//!   matching F input rows;
//! - word embedding / output layer (vocab-parallel): rows [r·V/t, (r+1)·V/t) of the table;
//! - everything else (norms, row-parallel biases, the position table): a full replica.
//!
//! Worked example, h = 64, a = 4, f = 256, V = 256, t = 2: each rank holds 2 heads
//! (D = 32), F = 128 FC1 columns and 128 vocabulary rows; rank 1's vocabulary is 128..256.
//! Llama (`tiny-llama`: a = 4, g = 2, f = 176), t = 2: 2 query heads and 1 key/value head
//! (D = 32, Dkv = 16), 88 gate and 88 up columns.

use strata_models::{Activation, Family, ModelSpec};

use crate::error::RuntimeError;

/// Rank `rank` of a tensor-parallel group of `size` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpRank {
    pub rank: usize,
    pub size: usize,
}

impl TpRank {
    /// The unsharded model: rank 0 of 1.
    pub const SINGLE: TpRank = TpRank { rank: 0, size: 1 };

    pub fn new(rank: usize, size: usize) -> Result<TpRank, RuntimeError> {
        if size == 0 || rank >= size {
            return Err(RuntimeError::TpSplit(format!(
                "rank {rank} of a group of {size}: ranks run from 0 to size − 1"
            )));
        }
        Ok(TpRank { rank, size })
    }
}

/// The sizes one tensor-parallel rank works with, validated against the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardDims {
    /// Hidden size h (never split).
    pub hidden: usize,
    /// Local attention heads a/t.
    pub heads: usize,
    /// Local key/value heads g/t (= `heads` without grouped-query attention).
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Local FFN width F = f/t.
    pub ffn: usize,
    /// Local vocabulary rows V/t.
    pub vocab: usize,
    /// First vocabulary id of this rank's rows: r·V/t.
    pub vocab_start: usize,
    /// Full vocabulary V.
    pub vocab_total: usize,
    /// Rows of the position table: the longest sequence the model accepts.
    pub max_seq: usize,
    pub tp: TpRank,
    /// The block's family (`ModelSpec` flags): Llama is RMSNorm, no biases, SwiGLU, rotary
    /// positions of base `rope_base`, an untied output layer; GPT none of these.
    pub llama: bool,
    /// RoPE's base θ (Llama only).
    pub rope_base: f64,
}

impl ShardDims {
    /// Checks that the CPU executor implements `model` (GPT: learned positions, LayerNorm,
    /// biases, GELU, tied embeddings; Llama: rotary positions, RMSNorm, no biases, SwiGLU,
    /// grouped-query attention, untied output layer; MoE layers with the family's experts,
    /// GELU or SwiGLU, dropless, without the auxiliary loss) and that `tp` splits heads, key/value heads, FFN and
    /// vocabulary evenly. Every problem is reported at once.
    pub fn new(model: &ModelSpec, tp: TpRank) -> Result<ShardDims, RuntimeError> {
        model.check().map_err(|reason| RuntimeError::UnsupportedModel { model: model.name.clone(), reason })?;
        let mut bad = Vec::new();
        let llama = model.family == Family::Llama;
        let wanted = if llama { Activation::Swiglu } else { Activation::Gelu };
        if model.activation != wanted {
            bad.push(format!(
                "model.activation = {:?} with model.family = {:?}; the executor runs the {:?} family with {wanted:?} only",
                model.activation, model.family, model.family
            ));
        }
        if model.kv_heads == 0 || !model.heads.is_multiple_of(model.kv_heads) {
            bad.push(format!(
                "model.kv_heads = {} does not divide model.heads = {}; each key/value head serves a whole group of query heads",
                model.kv_heads, model.heads
            ));
        } else if !llama && model.kv_heads != model.heads {
            bad.push(format!(
                "model.kv_heads = {} differs from model.heads = {}; grouped-query attention is implemented for the Llama family only",
                model.kv_heads, model.heads
            ));
        }
        if model.q_dim() != model.hidden as u64 {
            bad.push(format!(
                "model.head_dim = {} with model.heads = {}: the CPU executor's attention is hidden / heads = {} wide per head (heads · head_dim = hidden); a head width apart from it is not implemented",
                model.head_dim(),
                model.heads,
                model.hidden / model.heads
            ));
        }
        if llama && !model.head_dim().is_multiple_of(2) {
            bad.push(format!(
                "model.head_dim = {}: rotary positions rotate pairs of channels, so it must be even",
                model.head_dim()
            ));
        }
        if let Some(moe) = &model.moe {
            if let Some(cf) = moe.capacity_factor {
                bad.push(format!(
                    "model.moe.capacity_factor = {cf}; the executor's routing is dropless (remove the key)"
                ));
            }
            if moe.aux_loss_coeff != 0.0 {
                bad.push(format!(
                    "model.moe.aux_loss_coeff = {}; the executor trains without the load-balancing loss (set it to 0)",
                    moe.aux_loss_coeff
                ));
            }
        }
        if model.mtp_layers > 0 {
            bad.push(format!("model.mtp_layers = {}; multi-token prediction is not implemented", model.mtp_layers));
        }
        if !bad.is_empty() {
            return Err(RuntimeError::UnsupportedModel { model: model.name.clone(), reason: bad.join("; ") });
        }
        let t = tp.size;
        for (key, v) in [
            ("heads", model.heads),
            ("kv_heads", model.kv_heads),
            ("ffn_hidden", model.ffn_hidden),
            ("vocab", model.vocab),
        ] {
            if !(v as usize).is_multiple_of(t) {
                bad.push(format!("tp = {t} does not divide model.{key} = {v}"));
            }
        }
        if !bad.is_empty() {
            return Err(RuntimeError::TpSplit(format!("{}; choose a tp that divides them", bad.join("; "))));
        }
        let vocab = model.vocab as usize / t;
        Ok(ShardDims {
            hidden: model.hidden as usize,
            heads: model.heads as usize / t,
            kv_heads: model.kv_heads as usize / t,
            head_dim: model.head_dim() as usize,
            ffn: model.ffn_hidden as usize / t,
            vocab,
            vocab_start: tp.rank * vocab,
            vocab_total: model.vocab as usize,
            max_seq: model.seq_len as usize,
            tp,
            llama,
            rope_base: model.rope_base,
        })
    }

    /// Local attention channels D = (a/t)·d.
    pub fn attn_channels(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Local key (or value) channels Dkv = (g/t)·d.
    pub fn kv_channels(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Local QKV projection width D + 2·Dkv.
    pub fn qkv_width(&self) -> usize {
        self.attn_channels() + 2 * self.kv_channels()
    }

    /// Local FC1 width: F, or 2F (gate and up) under SwiGLU.
    pub fn fc1_width(&self) -> usize {
        if self.llama { 2 * self.ffn } else { self.ffn }
    }

    /// The same model on one rank (t = 1).
    pub fn unsharded(&self) -> ShardDims {
        let t = self.tp.size;
        ShardDims {
            heads: self.heads * t,
            kv_heads: self.kv_heads * t,
            ffn: self.ffn * t,
            vocab: self.vocab_total,
            vocab_start: 0,
            tp: TpRank::SINGLE,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_of_the_module_comment() {
        let mut m = ModelSpec::preset("tiny-gpt").unwrap();
        m.vocab = 256;
        let d = ShardDims::new(&m, TpRank::new(1, 2).unwrap()).unwrap();
        assert_eq!((d.heads, d.attn_channels(), d.ffn, d.vocab, d.vocab_start), (2, 32, 128, 128, 128));
        assert_eq!(d.unsharded(), ShardDims::new(&m, TpRank::SINGLE).unwrap());
    }

    #[test]
    fn errors_name_every_factor() {
        let m = ModelSpec::preset("tiny-gpt").unwrap();
        let e = ShardDims::new(&m, TpRank::new(0, 3).unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("model.heads = 4") && e.contains("model.ffn_hidden = 256") && e.contains("model.vocab = 256"),
            "{e}"
        );
        let llama = ModelSpec::preset("tiny-llama").unwrap();
        let d = ShardDims::new(&llama, TpRank::new(1, 2).unwrap()).unwrap();
        assert_eq!(
            (d.heads, d.kv_heads, d.attn_channels(), d.kv_channels(), d.ffn, d.fc1_width()),
            (2, 1, 32, 16, 88, 176)
        );
        let e = ShardDims::new(&llama, TpRank::new(0, 4).unwrap()).unwrap_err().to_string();
        assert!(e.contains("tp = 4 does not divide model.kv_heads = 2"), "{e}");
        let mut gelu = llama.clone();
        gelu.activation = Activation::Gelu;
        let e = ShardDims::new(&gelu, TpRank::SINGLE).unwrap_err().to_string();
        assert!(e.contains("model.activation = Gelu") && e.contains("Llama"), "{e}");
        let mut moe = ModelSpec::preset("tiny-moe").unwrap();
        moe.moe.as_mut().unwrap().aux_loss_coeff = 0.0;
        let d = ShardDims::new(&moe, TpRank::new(1, 2).unwrap()).unwrap();
        assert!(d.llama && d.fc1_width() == 176, "{d:?}");
        moe.moe.as_mut().unwrap().aux_loss_coeff = 0.01;
        let e = ShardDims::new(&moe, TpRank::SINGLE).unwrap_err().to_string();
        assert!(e.contains("aux_loss_coeff = 0.01"), "{e}");
        assert!(TpRank::new(2, 2).is_err());
    }
}
