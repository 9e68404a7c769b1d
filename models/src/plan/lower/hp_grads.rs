//! DeepSpeed `BF16_Optimizer`'s gradient accumulation (into fp32, or bf16 under a pipeline at ZeRO-0)
//! ([`crate::framework::mechanics`], [`crate::plan::cost::bf16_optimizer_accumulate`]): after
//! each microbatch's backward of a model chunk, its passes over every parameter of the chunk
//! run on the compute stream before the engine's next instruction (the pipeline send of the
//! input gradient, or the next pass). They are charged to the backward's last compute op —
//! the first layer's input-norm backward, or the embedding's weight gradient on the first
//! stage — as a copy of that op's cost with the passes' bytes and kernels added, one per
//! (stage, chunk, first microbatch or not).

use std::collections::BTreeMap;

use crate::plan::cost::bf16_optimizer_accumulate;
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::plan::lower::modules::piece_modules;
use crate::plan::lowered::{Bucket, Unit};
use crate::scenario::Scenario;

/// (stage, chunk, the op's own cost, first microbatch) → the cost with the passes added.
pub(super) type HpGradCosts = BTreeMap<(u32, u32, CostId, bool), CostId>;

/// Parameter tensors per tensor-parallel rank in a unit (each is one `add_` of
/// `update_hp_grads`): a layer's weight matrices, their biases and its two norms' weights
/// (and biases); an embedding table, the output layer; the final norm.
pub fn unit_tensors(s: &Scenario, unit: Unit) -> u64 {
    let m = &s.model;
    let bias = u64::from(m.has_bias());
    let norm = 1 + bias;
    match unit {
        Unit::WordEmbedding | Unit::PosEmbedding | Unit::OutputLayer => 1,
        Unit::FinalNorm => norm,
        Unit::Layer(_) => {
            let matrices =
                (piece_modules(m, 1, Piece::Attn, 0).len() + piece_modules(m, 1, Piece::Mlp, 0).len()) as u64;
            matrices * (1 + bias) + 2 * norm
        }
        // The rank's local experts, each its own matrices.
        Unit::Experts(_) => m.moe.as_ref().map_or(0, |e| (e.experts / s.parallel.ep.max(1)) as u64 * m.mlp_matrices()),
    }
}

/// Bytes per element of `BF16_Optimizer`'s gradient buffer: 4 (fp32) unless it accumulates
/// in bf16 ([`crate::framework::Framework::bf16_optimizer`]).
pub fn hp_buffer_bytes(s: &Scenario) -> u64 {
    s.training.framework.bf16_optimizer(s).map_or(4, |d| d.bytes())
}

/// The accumulation costs of every (stage, chunk), appended to `costs`, for the two ops a
/// chunk's backward can end with. Empty unless the framework runs `BF16_Optimizer`.
pub(super) fn hp_grad_costs(
    s: &Scenario,
    buckets: &[Vec<Bucket>],
    costs: &mut Vec<ComputeCost>,
    cost_ids: &BTreeMap<(Piece, Phase), CostId>,
) -> HpGradCosts {
    let mut out = HpGradCosts::new();
    if !s.training.framework.accumulates_hp_grads(s) {
        return out;
    }
    let hp_bytes = hp_buffer_bytes(s);
    let ends = [cost_ids[&(Piece::Embed, Phase::BackwardWeight)], cost_ids[&(Piece::AttnIn, Phase::BackwardInput)]];
    for (stage, stage_buckets) in buckets.iter().enumerate() {
        for chunk in 0..s.parallel.vpp {
            let of_chunk = || stage_buckets.iter().filter(move |b| b.chunk == chunk);
            let params: u64 = of_chunk().map(|b| b.params).sum();
            let tensors: u64 = of_chunk().flat_map(|b| b.units.iter()).map(|u| unit_tensors(s, *u)).sum();
            for base in ends {
                for first in [true, false] {
                    let extra = bf16_optimizer_accumulate(params, tensors, hp_bytes, first);
                    let mut c = costs[base as usize].clone();
                    c.mem_bytes += extra.mem_bytes;
                    c.kernels = c.kernels.saturating_add(extra.kernels);
                    out.insert((stage as u32, chunk, base, first), costs.len() as CostId);
                    costs.push(c);
                }
            }
        }
    }
    out
}

impl<'p, 'a> StageLowering<'p, 'a> {
    /// Charges the accumulation passes of (chunk, mb) to the backward's last compute op.
    pub(super) fn charge_hp_grads(&mut self, chunk: u32, mb: u32) {
        let Some(id) = self.last_compute else { return };
        if let OpKind::Compute(op) = &mut self.e.ops[id as usize].kind
            && let Some(c) = self.pl.hp_grad_cost_ids.get(&(self.stage, chunk, op.cost, mb == 0))
        {
            op.cost = *c;
        }
    }
}
