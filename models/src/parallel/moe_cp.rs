//! The split rules of expert and context parallelism.
//!
//! | rule | what must hold | source |
//! |---|---|---|
//! | `ep-needs-moe` | ep > 1 only with `model.moe` | Megatron-core `TransformerConfig`: EP > 1 needs `num_moe_experts` |
//! | `ep-divides-experts` | experts % ep = 0 | Megatron-LM `arguments.py`: `num_experts % expert_model_parallel_size == 0` |
//! | `ep-divides-stage` | ep divides tp · cp · dp | Megatron-core `parallel_state`: the expert grid ETP·EP·EDP·PP is the world, with ETP = 1 |
//! | `moe-tp-needs-sp` | MoE with tp > 1 needs sequence parallelism | Megatron-LM `arguments.py`: "When using MoE and tensor parallelism, sequence parallelism must be used." |
//! | `cp-divides-seq` | seq_len % (2·cp) = 0 | Megatron-LM's `get_batch_on_this_cp_rank` cuts each sequence into 2·cp chunks (rank r holds r and 2cp−1−r) |
//! | `tp-divides-shared-ffn` | tp divides shared_experts · shared_ffn_hidden | the shared experts' MLP is column-parallel, as a dense MLP |
//! | `moe-zero3` | no ZeRO-3 with experts | Strata's plan gathers whole units over the data-parallel group, and experts shard over another (a limit of the plan, not of the frameworks) |
//! | `a2a-overlap-needs-ep` | `moe_a2a_overlap` only with a MoE model and ep > 1 | Megatron-core `TransformerConfig`: "overlap_moe_expert_parallel_comm is only supported with expert model parallelism" |
//! | `ulysses-divides-heads` | heads/tp and kv_heads/tp divisible by cp under `cp_comm = "ulysses"` | Transformer Engine `AttnFuncWithCPAndQKVOA2A` asserts heads % cp for Q, K and V; DeepSpeed-Ulysses `heads % sp_size` |

use super::{CpComm, ParallelConfig};
use crate::model::ModelSpec;

impl ParallelConfig {
    /// Reports every broken expert- and context-parallel rule through `bad`.
    pub(super) fn moe_cp_rules(&self, model: &ModelSpec, bad: &mut impl FnMut(&'static str, String)) {
        let p = self;
        match &model.moe {
            None if p.ep > 1 => bad(
                "ep-needs-moe",
                format!(
                    "parallel.ep = {} but the model has no experts (model.moe is absent): expert parallelism splits a mixture of experts; set ep = 1",
                    p.ep
                ),
            ),
            None => {}
            Some(moe) => {
                if moe.experts > 0 && !moe.experts.is_multiple_of(p.ep) {
                    bad(
                        "ep-divides-experts",
                        format!(
                            "parallel.ep = {} does not divide model.moe.experts = {}: each expert-parallel rank holds experts/ep whole experts",
                            p.ep, moe.experts
                        ),
                    );
                }
                if !p.stage_ranks().is_multiple_of(p.ep as u64) {
                    bad(
                        "ep-divides-stage",
                        format!(
                            "parallel.ep = {} does not divide tp · cp · dp = {} · {} · {} = {}: expert-parallel groups are cut from the ranks of one pipeline stage",
                            p.ep,
                            p.tp,
                            p.cp,
                            p.dp,
                            p.stage_ranks()
                        ),
                    );
                }
                if p.tp > 1 && !p.sequence_parallel {
                    bad(
                        "moe-tp-needs-sp",
                        format!(
                            "parallel.tp = {} with sequence_parallel = false and a mixture of experts: Megatron-LM asserts that MoE with tensor parallelism uses sequence parallelism (tokens reach the router split along the sequence); set sequence_parallel = true",
                            p.tp
                        ),
                    );
                }
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
            }
        }
        if p.moe_a2a_overlap && (model.moe.is_none() || p.ep < 2) {
            bad(
                "a2a-overlap-needs-ep",
                format!(
                    "parallel.moe_a2a_overlap = true with parallel.ep = {}{}: the overlap hides expert-parallel all-to-alls, and there are none; set ep > 1 on a MoE model, or moe_a2a_overlap = false",
                    p.ep,
                    if model.moe.is_none() { " and no model.moe" } else { "" }
                ),
            );
        }
        if p.cp > 1 {
            if !model.seq_len.is_multiple_of(2 * p.cp) {
                bad(
                    "cp-divides-seq",
                    format!(
                        "model.seq_len = {} is not divisible by 2 · parallel.cp = 2 · {} = {}: context parallelism cuts each sequence into 2·cp chunks for load balancing",
                        model.seq_len,
                        p.cp,
                        2 * p.cp
                    ),
                );
            }
            if p.cp_comm == CpComm::Ulysses {
                let (heads, kv) = (model.heads / p.tp.max(1), model.kv_heads / p.tp.max(1));
                if !heads.is_multiple_of(p.cp) || !kv.is_multiple_of(p.cp) {
                    bad(
                        "ulysses-divides-heads",
                        format!(
                            "parallel.cp_comm = \"ulysses\" with parallel.cp = {}: the all-to-all gives each rank heads/cp whole heads, but model.heads / tp = {} / {} = {} and model.kv_heads / tp = {} / {} = {} are not both divisible by cp",
                            p.cp, model.heads, p.tp, heads, model.kv_heads, p.tp, kv
                        ),
                    );
                }
            }
        }
    }
}
