//! The rules a mixture-of-experts split must keep for the plan to lower it (Megatron-core's
//! `MoELayer` with `--expert-tensor-parallel-size 1`): expert parallelism needs experts and
//! cuts its groups from a stage's ranks, every expert-parallel rank holds the same number
//! of whole experts, a tensor-parallel MoE layer runs under sequence parallelism (the
//! router and the token dispatcher see each rank's own tokens), and the router's top-k is
//! within the experts; the MoE sizes are within their limits (`crate::limits`). ZeRO-3
//! with experts is refused: the plan gathers whole units over
//! the data-parallel group, and experts shard over a different one.

use crate::limits::{MAX_CAPACITY_FACTOR, MAX_EXPERTS, MAX_FFN_HIDDEN, MAX_MTP_LAYERS, MAX_ROUTED_WIDTH};
use crate::model::ModelSpec;
use crate::parallel::{ParallelConfig, Violation};

/// Every MoE rule `p` breaks with `model`, each naming its values.
pub(super) fn violations(p: &ParallelConfig, model: &ModelSpec) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut bad = |rule: &'static str, message: String| v.push(Violation { rule, message });
    if p.ep == 0 {
        bad("positive", "parallel.ep = 0: it must be at least 1".to_string());
        return v;
    }
    if model.mtp_layers as u64 > MAX_MTP_LAYERS {
        bad(
            "limit",
            format!(
                "model.mtp_layers = {} is over the limit of {MAX_MTP_LAYERS} (see docs/limits.md)",
                model.mtp_layers
            ),
        );
    }
    let Some(moe) = &model.moe else {
        if p.ep > 1 {
            bad(
                "ep-needs-moe",
                format!(
                    "parallel.ep = {}: expert parallelism splits a mixture of experts, and the model has none (set [model.moe])",
                    p.ep
                ),
            );
        }
        return v;
    };
    if moe.experts == 0 || moe.top_k == 0 || moe.expert_ffn_hidden == 0 {
        bad(
            "moe-positive",
            format!(
                "model.moe: experts = {}, top_k = {}, expert_ffn_hidden = {}: each must be at least 1",
                moe.experts, moe.top_k, moe.expert_ffn_hidden
            ),
        );
        return v;
    }
    let routed = moe.experts as u64 * moe.expert_ffn_hidden as u64;
    let shared = moe.shared_experts as u64 * moe.shared_ffn_hidden as u64;
    let cf_ok = moe.capacity_factor.is_none_or(|c| c > 0.0 && c <= MAX_CAPACITY_FACTOR);
    if moe.experts as u64 > MAX_EXPERTS || routed > MAX_ROUTED_WIDTH || shared > MAX_FFN_HIDDEN || !cf_ok {
        bad(
            "limit",
            format!(
                "model.moe: experts = {} (at most {MAX_EXPERTS}), experts · expert_ffn_hidden = {routed} (at most {MAX_ROUTED_WIDTH}), shared_experts · shared_ffn_hidden = {shared} (at most {MAX_FFN_HIDDEN}), capacity_factor = {:?} (above 0, at most {MAX_CAPACITY_FACTOR}): over a limit (see docs/limits.md)",
                moe.experts, moe.capacity_factor
            ),
        );
        return v;
    }
    if moe.top_k > moe.experts {
        bad(
            "moe-top-k",
            format!(
                "model.moe.top_k = {} exceeds model.moe.experts = {}: a token picks k distinct experts",
                moe.top_k, moe.experts
            ),
        );
    }
    if moe.shared_experts > 0 && moe.shared_ffn_hidden == 0 {
        bad(
            "moe-shared-width",
            format!(
                "model.moe.shared_experts = {} with shared_ffn_hidden = 0: a shared expert needs a width",
                moe.shared_experts
            ),
        );
    }
    if !shared.is_multiple_of(p.tp as u64) {
        bad(
            "tp-divides-shared-ffn",
            format!(
                "parallel.tp = {} does not divide model.moe.shared_experts · shared_ffn_hidden = {shared}: the shared experts' MLP is column-parallel",
                p.tp
            ),
        );
    }
    let stage = p.stage_ranks();
    if !stage.is_multiple_of(p.ep as u64) {
        bad(
            "ep-divides-stage",
            format!(
                "parallel.ep = {} does not divide tp · cp · dp = {} · {} · {} = {stage}: expert-parallel groups are cut from one pipeline stage's ranks",
                p.ep, p.tp, p.cp, p.dp
            ),
        );
    }
    if !moe.experts.is_multiple_of(p.ep) {
        bad(
            "ep-divides-experts",
            format!(
                "parallel.ep = {} does not divide model.moe.experts = {}: every expert-parallel rank holds experts/ep whole experts",
                p.ep, moe.experts
            ),
        );
    }
    if p.tp > 1 && !p.sequence_parallel {
        bad(
            "moe-tp-needs-sp",
            format!(
                "parallel.tp = {} with a mixture of experts and parallel.sequence_parallel = false: a tensor-parallel MoE layer routes each rank's own tokens, so it needs sequence parallelism (Megatron-LM's --sequence-parallel with --num-experts)",
                p.tp
            ),
        );
    }
    if p.zero >= 3 {
        bad(
            "moe-zero3",
            format!(
                "parallel.zero = {} with a mixture of experts: ZeRO-3 is not planned for experts (use zero ≤ 2, as Megatron-LM's distributed optimizer does)",
                p.zero
            ),
        );
    }
    v
}
