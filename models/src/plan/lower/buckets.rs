//! Gradient-bucket packing: each chunk's units in backward order, packed greedily into
//! buckets of at most `grad_bucket_mb` of gradients (Megatron-LM's and DeepSpeed's
//! buckets). The word embedding is always a bucket of its own, and under ZeRO-3 every unit
//! is, since it is gathered and reduced alone; so is every unit under torchtitan's FSDP2
//! (ZeRO-2/3), which reduce-scatters each `fully_shard` unit as one collective. A
//! mixture-of-experts layer's local experts pack into buckets of their own.

use crate::accounting::memory::state_bytes_per_param;
use crate::plan::lower::unit_params;
use crate::plan::lowered::{Bucket, Unit};
use crate::scenario::Scenario;

/// Units of each chunk of a stage in backward order, packed into buckets.
pub(super) fn stage_buckets(s: &Scenario, stage: u32) -> Vec<Bucket> {
    let m = &s.model;
    let p = &s.parallel;
    let pipe = p.pipeline();
    let grad_bytes = state_bytes_per_param(s.training.storage_dtype()).1;
    let cap = (p.grad_bucket_mb * 1024.0 * 1024.0) as u64;
    let mut out = Vec::new();
    for chunk in 0..p.vpp {
        let vs = pipe.vstage(chunk, stage);
        let mut units = Vec::new();
        if vs == pipe.last_vstage() {
            // Multi-token-prediction modules finish their backward first, deepest first.
            for l in (m.layers..m.layers + m.mtp_layers).rev() {
                if m.is_moe_layer(l) {
                    units.push(Unit::Experts(l));
                }
                units.push(Unit::Layer(l));
            }
            if m.tied_embeddings() {
                if p.pp > 1 {
                    units.push(Unit::WordEmbedding);
                }
            } else {
                units.push(Unit::OutputLayer);
            }
            units.push(Unit::FinalNorm);
        }
        for l in p.chunk_layers(m, vs).rev() {
            // A MoE layer's expert gradients are complete before its attention's.
            if m.is_moe_layer(l) {
                units.push(Unit::Experts(l));
            }
            units.push(Unit::Layer(l));
        }
        if vs == 0 {
            if m.learned_positions() {
                units.push(Unit::PosEmbedding);
            }
            units.push(Unit::WordEmbedding);
        }
        // Dense and expert units pack apart (they reduce over different groups), each
        // greedily in backward order; a bucket takes its index when it is closed.
        let mut current: Vec<Unit> = Vec::new();
        let mut current_params = 0u64;
        let mut experts: Vec<Unit> = Vec::new();
        let mut expert_params = 0u64;
        let mut index = 0;
        let flush = |units: &mut Vec<Unit>, params: &mut u64, index: &mut u32, out: &mut Vec<Bucket>| {
            if !units.is_empty() {
                out.push(Bucket { chunk, index: *index, units: std::mem::take(units), params: *params });
                *index += 1;
                *params = 0;
            }
        };
        for u in units {
            let params = unit_params(s, u);
            if matches!(u, Unit::Experts(_)) {
                if p.zero >= 3 || (expert_params + params) * grad_bytes > cap {
                    flush(&mut experts, &mut expert_params, &mut index, &mut out);
                }
                experts.push(u);
                expert_params += params;
                continue;
            }
            let alone = u == Unit::WordEmbedding || p.zero >= 3 || s.training.framework.reduces_per_unit(s);
            if alone || (current_params + params) * grad_bytes > cap {
                flush(&mut current, &mut current_params, &mut index, &mut out);
            }
            current.push(u);
            current_params += params;
            if alone {
                flush(&mut current, &mut current_params, &mut index, &mut out);
            }
        }
        flush(&mut current, &mut current_params, &mut index, &mut out);
        flush(&mut experts, &mut expert_params, &mut index, &mut out);
    }
    out
}
