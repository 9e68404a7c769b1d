//! The rules a mixture-of-experts split must keep for the plan to lower it (Megatron-core's
//! `MoELayer` with `--expert-tensor-parallel-size 1`): expert parallelism needs experts and
//! cuts its groups from a stage's ranks, every expert-parallel rank holds the same number
//! of whole experts, a tensor-parallel MoE layer runs under sequence parallelism (the
//! router and the token dispatcher see each rank's own tokens), and the router's top-k is
//! within the experts; the MoE sizes are within their limits (`crate::limits`). ZeRO-3
//! with experts is refused: the plan gathers whole units over
//! the data-parallel group, and experts shard over a different one.

use crate::model::ModelSpec;
use crate::parallel::{ParallelConfig, Violation};

/// The MoE rules of the plan that `moe_cp` (the split's expert and context rules) and the
/// model's own check (sizes, top-k, widths) leave: the shared experts' width splits over
/// tp, and ZeRO-3 is not planned with experts.
pub(super) fn violations(p: &ParallelConfig, model: &ModelSpec) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut bad = |rule: &'static str, message: String| v.push(Violation { rule, message });
    let Some(moe) = &model.moe else {
        return v;
    };
    let shared = moe.shared_experts as u64 * moe.shared_ffn_hidden as u64;
    if p.tp > 0 && !shared.is_multiple_of(p.tp as u64) {
        bad(
            "tp-divides-shared-ffn",
            format!(
                "parallel.tp = {} does not divide model.moe.shared_experts · shared_ffn_hidden = {shared}: the shared experts' MLP is column-parallel",
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
