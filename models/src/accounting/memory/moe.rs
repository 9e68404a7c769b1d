//! What a mixture-of-experts layer saves for backward, per rank and microbatch: the dense
//! layer's activations with the dense MLP's internals replaced by the router's
//! probabilities and top-k, the permuted tokens, the experts' internals, the combined
//! expert outputs and the shared experts' internals ([`crate::plan::moe::MoeShape`]);
//! under full recomputation only the layer input, as for a dense layer. Likewise the
//! output gradients its deferred weight passes read under a split backward (ZB), and the
//! stage totals the analytic memory takes from them ([`moe_stage`]).

use crate::accounting::memory::{head_buffer_bytes, layer_activation_bytes, weight_grad_bytes};
use crate::accounting::params::StageParams;
use crate::model::{Activation, ModelSpec};
use crate::parallel::{ParallelConfig, Recompute};
use crate::plan::lowered::Unit;
use crate::plan::moe::MoeShape;
use crate::scenario::{Dtype, Scenario};

/// What a stage of a MoE model (or one with multi-token prediction) saves, as the plan
/// counts it: the per-layer averages and maxima of its layers' activations, and on the
/// last stage the multi-token-prediction modules'. (Its states, dense ones sharded over
/// cp·dp and expert ones over the expert-data-parallel group, are
/// `accounting::states::stage_state_bytes`.)
pub(super) struct MoeStage {
    /// Mean saved activations per layer and microbatch, under the split's recomputation.
    pub per_layer: f64,
    /// Mean deferred weight-pass gradients per layer (ZB).
    pub wgrad: f64,
    /// The largest layer's activations without recomputation (full recomputation's working set).
    pub full_rc: f64,
    /// The largest unit's parameters (ZeRO-2's full-gradient bucket).
    pub largest_unit: u64,
    /// Multi-token prediction on the last stage, per microbatch held: its layers'
    /// activations with the projection's saved input, and its heads' buffers.
    pub mtp_act: f64,
    pub mtp_head: f64,
}

pub(super) fn moe_stage(s: &Scenario, sp: &StageParams) -> MoeStage {
    let (m, p, dtype) = (&s.model, &s.parallel, s.training.storage_dtype());
    let flash = s.training.flash_attention;
    let pipe = p.pipeline();
    let layers: Vec<u32> = (0..p.vpp).flat_map(|c| p.chunk_layers(m, pipe.vstage(c, sp.stage))).collect();
    let mtp: Vec<u32> = if sp.stage + 1 == p.pp { (m.layers..m.layers + m.mtp_layers).collect() } else { vec![] };
    let unit = |u| crate::plan::lower::unit_params(s, u);
    let owned = || layers.iter().chain(&mtp);
    let act = |l: u32, rc: Recompute| {
        if m.is_moe_layer(l) {
            moe_layer_activation_bytes(m, p, dtype, rc, flash)
        } else {
            layer_activation_bytes(m, p.micro_batch, dtype, p.tp, p.sequence_parallel, rc, flash)
        }
    };
    let wgrad = |l: u32| {
        if m.is_moe_layer(l) {
            moe_weight_grad_bytes(m, p, dtype)
        } else {
            weight_grad_bytes(m, p.micro_batch, dtype, p.tp)
        }
    };
    let n = layers.len().max(1) as f64;
    let sbh_e = p.micro_batch as f64 * m.seq_len as f64 * m.hidden as f64 * dtype.bytes() as f64;
    MoeStage {
        per_layer: layers.iter().map(|l| act(*l, p.recompute)).sum::<f64>() / n,
        wgrad: layers.iter().map(|l| wgrad(*l)).sum::<f64>() / n,
        full_rc: layers.iter().map(|l| act(*l, Recompute::None)).fold(0.0, f64::max),
        largest_unit: owned().flat_map(|l| [unit(Unit::Layer(*l)), unit(Unit::Experts(*l))]).max().unwrap_or(0),
        mtp_act: mtp.iter().map(|l| act(*l, p.recompute) + 2.0 * sbh_e).sum(),
        mtp_head: mtp.len() as f64 * head_buffer_bytes(m, p.micro_batch, dtype, p.tp, p.sequence_parallel) as f64,
    }
}

/// The dense MLP's internals a dense layer saves on one tp rank: 2|3 tensors of f/t per token.
fn dense_mlp_internals(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype) -> f64 {
    let tensors = if m.activation == Activation::Swiglu { 3.0 } else { 2.0 };
    let sb = m.seq_len as f64 * p.micro_batch as f64 / p.cp.max(1) as f64;
    sb * dtype.bytes() as f64 * tensors * m.ffn_hidden as f64 / p.tp.max(1) as f64
}

/// Activation bytes one rank saves for a MoE layer and one microbatch.
pub fn moe_layer_activation_bytes(
    m: &ModelSpec,
    p: &ParallelConfig,
    dtype: Dtype,
    recompute: Recompute,
    flash: bool,
) -> f64 {
    let dense = layer_activation_bytes(m, p.micro_batch, dtype, p.tp, p.sequence_parallel, recompute, flash);
    match (recompute, MoeShape::new(m, p, dtype)) {
        (Recompute::Full, _) | (_, None) => dense,
        (_, Some(x)) => dense - dense_mlp_internals(m, p, dtype) + x.saved_bytes() as f64,
    }
}

/// The output gradients a MoE layer's deferred weight passes read, per rank and microbatch:
/// the attention half's (QKV and projection, as for a dense layer) and the MoE half's.
pub fn moe_weight_grad_bytes(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype) -> f64 {
    let dense = weight_grad_bytes(m, p.micro_batch, dtype, p.tp);
    let Some(x) = MoeShape::new(m, p, dtype) else { return dense };
    let t = p.tp.max(1) as f64;
    let tokens = m.seq_len as f64 * p.micro_batch as f64;
    let fc1 = m.ffn_hidden as f64 / t * if m.activation == Activation::Swiglu { 2.0 } else { 1.0 };
    dense - tokens * (fc1 + m.hidden as f64) * dtype.bytes() as f64 + x.wgrad_bytes() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MoeSpec;

    #[test]
    fn a_moe_layer_saves_its_routed_rows_and_full_recompute_only_the_input() {
        let mut m = ModelSpec::preset("tiny-llama").unwrap();
        m.moe = Some(MoeSpec {
            experts: 8,
            top_k: 2,
            expert_ffn_hidden: 64,
            shared_experts: 0,
            shared_ffn_hidden: 0,
            dense_layers: 0,
            capacity_factor: None,
            score: Default::default(),
            aux_loss_coeff: 0.0,
            skew: None,
        });
        let p = ParallelConfig::default();
        let d = Dtype::Bf16;
        let dense = layer_activation_bytes(&m, 1, d, 1, false, Recompute::None, false);
        let moe = moe_layer_activation_bytes(&m, &p, d, Recompute::None, false);
        let x = MoeShape::new(&m, &p, d).unwrap();
        let (s, h) = (m.seq_len as f64, m.hidden as f64);
        // Dense MLP internals: 3 tensors of ffn_hidden; MoE: router fp32 scores and top-k,
        // 2k rows of h (permuted, combined) and 3 tensors of the expert width per routed row.
        let want = dense - s * 2.0 * 3.0 * m.ffn_hidden as f64
            + s * 8.0 * 4.0
            + s * 2.0 * 8.0
            + x.routed as f64 * (2.0 * h + 3.0 * 64.0) * 2.0;
        assert_eq!(moe, want);
        let full = moe_layer_activation_bytes(&m, &p, d, Recompute::Full, false);
        assert_eq!(full, layer_activation_bytes(&m, 1, d, 1, false, Recompute::Full, false));
    }
}
