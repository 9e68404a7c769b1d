//! Parameter accounting per ZeRO unit: how many parameters one tensor-parallel rank holds
//! of a layer or an embedding piece ([`crate::accounting::params`] does the counting; a
//! mixture-of-experts layer's dense part and local experts, [`crate::plan::moe`]).

use crate::accounting::params::{embedding_params, layer_params};
use crate::plan::lowered::Unit;
use crate::scenario::Scenario;

/// Parameters per tensor-parallel rank in a unit.
pub fn unit_params(s: &Scenario, unit: Unit) -> u64 {
    let m = &s.model;
    let t = s.parallel.tp as u64;
    let (word, pos) = embedding_params(m);
    // A multi-token-prediction module adds eh_proj (2h × h, column-parallel) and three
    // norms (the hidden state's, the embedding's, its own final norm) to its layer.
    let mtp = |l: u32| {
        if l >= m.layers { 2 * m.hidden as u64 * m.hidden as u64 / t + 3 * m.norm_params() } else { 0 }
    };
    match unit {
        Unit::WordEmbedding | Unit::OutputLayer => word / t,
        Unit::PosEmbedding => pos,
        Unit::Layer(l) if m.is_moe_layer(l) => {
            let (sharded, replicated) = crate::plan::moe::moe_dense_params(m);
            sharded / t + replicated + mtp(l)
        }
        Unit::Layer(l) => layer_params(m).per_rank(s.parallel.tp) + mtp(l),
        Unit::Experts(l) if m.is_moe_layer(l) => crate::plan::moe::local_expert_params(m, &s.parallel),
        Unit::Experts(_) => 0,
        Unit::FinalNorm => m.norm_params(),
    }
}
