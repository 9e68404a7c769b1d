//! Which framework runs expert parallelism, context parallelism, latent attention and
//! multi-token prediction, as rules of [`super::Framework::violations`].
//!
//! | rule | framework | what the framework does |
//! |---|---|---|
//! | `megatron-cp-unfused` | Megatron-LM | context parallelism runs in Transformer Engine's fused/flash attention only: `get_attention_backend` disables `UnfusedDotProductAttention` under CP |
//! | `deepspeed-cp-ring` | DeepSpeed | its sequence parallelism (`sequence_parallel_size`) is DeepSpeed-Ulysses, an all-to-all to head sharding; no ring or all-gather attention |
//! | `deepspeed-ep-dp` | DeepSpeed | DeepSpeed-MoE cuts expert-parallel groups from the data-parallel ranks (`utils/groups.py` asserts the data-parallel world divisible by `ep_size`) |
//! | `deepspeed-mla` | DeepSpeed | Megatron-DeepSpeed's models (the DeepSpeed pipeline/MoE path) have no latent attention or multi-token prediction |
//! | `torchtitan-cp-ulysses` | torchtitan | `context_parallel_rotate_method` is `allgather` or `alltoall`, both ring attention over K/V shards; no Ulysses head all-to-all |
//! | `torchtitan-ep-shard` | torchtitan | EP is carved out of dp_shard · cp · tp (ETP = 1; `parallel_dims.py`): with DDP (zero = 0) only cp · tp are there to carve from |
//! | `megatron-a2a-overlap` | Megatron-LM | `--overlap-moe-expert-parallel-comm` (megatron-core `TransformerConfig`): with pp > 1 it needs the interleaved schedule ("virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1"), no full recomputation, at most one MTP layer |
//! | `deepspeed-a2a-overlap` | DeepSpeed | DeepSpeed-MoE issues each all-to-all inside its own layer's forward or backward; no schedule runs a forward and a backward together |
//! | `torchtitan-a2a-overlap` | torchtitan | it overlaps a forward with a backward only inside its DualPipeV schedule (`pipeline_parallel_schedule = "DualPipeV"`), which Strata does not plan |
//! | `strata-cpu-mla` | Strata on CPU | the CPU executor runs multi-head (GQA) attention and no MTP modules; latent attention and MTP are costed and simulated on GPU clusters only |
//!
//! Everything else runs where [`crate::parallel`]'s rules allow it: Megatron-LM all of MoE
//! (`--num-experts`, EP, shared experts, `--multi-latent-attention`, `--mtp-num-layers`) and
//! CP with `--cp-comm-type p2p|allgather|a2a`; DeepSpeed-MoE with EP and Ulysses CP;
//! torchtitan EP and ring CP, and its DeepSeek-V3 model's MLA; fp8 on every GPU framework
//! (Transformer Engine under Megatron-LM and DeepSpeed, torchao float8 under torchtitan) —
//! where the GPU has fp8 (`fp8-needs-hardware`, checked with the split).

use super::Framework;
use crate::hardware::GpuKind;
use crate::parallel::CpComm;
use crate::scenario::Scenario;

impl Framework {
    /// Reports every broken MoE/CP/MLA rule of this framework through `bad`.
    pub(super) fn moe_cp_violations(self, s: &Scenario, bad: &mut impl FnMut(&'static str, String)) {
        let (p, m) = (&s.parallel, &s.model);
        match self {
            Framework::Megatron => {
                if p.moe_a2a_overlap {
                    let mut why = Vec::new();
                    if p.pp > 1 && !p.schedule.chunked() {
                        why.push(format!(
                            "with pp = {} it needs schedule = \"interleaved\" (vpp ≥ 2), not \"{}\"",
                            p.pp,
                            p.schedule.key()
                        ));
                    }
                    if p.recompute == crate::parallel::Recompute::Full {
                        why.push("it refuses recompute = \"full\"".to_string());
                    }
                    if m.mtp_layers > 1 {
                        why.push(format!("it takes at most one MTP layer, not model.mtp_layers = {}", m.mtp_layers));
                    }
                    if !why.is_empty() {
                        bad(
                            "megatron-a2a-overlap",
                            format!(
                                "parallel.moe_a2a_overlap = true with training.framework = \"megatron\": megatron-core's --overlap-moe-expert-parallel-comm refuses this split: {}; or use framework = \"strata\"",
                                why.join(", and ")
                            ),
                        );
                    }
                }
                if p.cp > 1 && !s.training.flash_attention {
                    bad(
                        "megatron-cp-unfused",
                        format!(
                            "parallel.cp = {} with training.flash_attention = false and training.framework = \"megatron\": Transformer Engine runs context parallelism in its fused (flash) attention only; set flash_attention = true",
                            p.cp
                        ),
                    );
                }
            }
            Framework::DeepSpeed => {
                if p.moe_a2a_overlap {
                    bad(
                        "deepspeed-a2a-overlap",
                        "parallel.moe_a2a_overlap = true with training.framework = \"deepspeed\": DeepSpeed-MoE runs each all-to-all inside its own layer's pass, never a forward together with a backward; use framework = \"megatron\" (interleaved schedule) or \"strata\"".to_string(),
                    );
                }
                if p.cp > 1 && p.cp_comm != CpComm::Ulysses {
                    bad(
                        "deepspeed-cp-ring",
                        format!(
                            "parallel.cp = {} with parallel.cp_comm = \"{}\" and training.framework = \"deepspeed\": DeepSpeed's sequence parallelism is Ulysses (an all-to-all to head sharding); use cp_comm = \"ulysses\", or framework = \"megatron\" for ring or all-gather attention",
                            p.cp,
                            p.cp_comm.key()
                        ),
                    );
                }
                if p.ep > 1 && !p.dp.is_multiple_of(p.ep) {
                    bad(
                        "deepspeed-ep-dp",
                        format!(
                            "parallel.ep = {} with parallel.dp = {} and training.framework = \"deepspeed\": DeepSpeed-MoE cuts expert-parallel groups from the data-parallel ranks, so ep must divide dp",
                            p.ep, p.dp
                        ),
                    );
                }
                if m.mla.is_some() || m.mtp_layers > 0 {
                    bad(
                        "deepspeed-mla",
                        "model.mla or model.mtp_layers with training.framework = \"deepspeed\": Megatron-DeepSpeed's models have no latent attention or multi-token prediction; use framework = \"megatron\"".to_string(),
                    );
                }
            }
            Framework::Torchtitan => {
                if p.moe_a2a_overlap {
                    bad(
                        "torchtitan-a2a-overlap",
                        "parallel.moe_a2a_overlap = true with training.framework = \"torchtitan\": torchtitan overlaps a forward with a backward only in its DualPipeV schedule, which Strata does not plan; use framework = \"megatron\" (interleaved schedule) or \"strata\"".to_string(),
                    );
                }
                if p.cp > 1 && p.cp_comm == CpComm::Ulysses {
                    bad(
                        "torchtitan-cp-ulysses",
                        format!(
                            "parallel.cp = {} with parallel.cp_comm = \"ulysses\" and training.framework = \"torchtitan\": torchtitan's context parallelism is ring attention (rotate method allgather or alltoall); use cp_comm = \"ring\" or \"all-gather\", or framework = \"megatron\" or \"deepspeed\" for Ulysses",
                            p.cp
                        ),
                    );
                }
                let shard = if p.zero >= 2 { p.dp } else { 1 };
                let carved = shard as u64 * p.cp as u64 * p.tp as u64;
                if p.ep > 1 && !carved.is_multiple_of(p.ep as u64) {
                    bad(
                        "torchtitan-ep-shard",
                        format!(
                            "parallel.ep = {} with parallel.zero = {} and training.framework = \"torchtitan\": torchtitan carves expert parallelism out of dp_shard · cp · tp = {} · {} · {} = {carved} (dp_shard = dp under FSDP2, zero ≥ 2; 1 under DDP), which ep does not divide; use zero = 2 or 3",
                            p.ep, p.zero, shard, p.cp, p.tp
                        ),
                    );
                }
            }
            Framework::Strata => {
                if s.cluster.gpu == GpuKind::Cpu && (m.mla.is_some() || m.mtp_layers > 0) {
                    bad(
                        "strata-cpu-mla",
                        format!(
                            "model.mla or model.mtp_layers = {} on a CPU cluster: Strata's executor runs multi-head (grouped-query) attention without MTP modules; latent attention and MTP are costed and simulated on GPU clusters",
                            m.mtp_layers
                        ),
                    );
                }
            }
        }
    }
}
