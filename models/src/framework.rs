//! The training framework a plan is meant for (`training.framework`), and the parallel
//! combinations each one can run.
//!
//! A split is only useful if something runs it. Strata's own executor runs every split the
//! plan IR expresses; Megatron-LM, DeepSpeed and torchtitan each run a subset, and a split
//! outside it is rejected here with a rule id (as [`crate::parallel`]'s rules are) and what
//! would run instead. The rules are read from each framework's source (versions and paths
//! in `docs/frameworks.md`):
//!
//! | rule | framework | what the framework does |
//! |---|---|---|
//! | `megatron-zero` | Megatron-LM | `--use-distributed-optimizer` shards the optimizer state only (ZeRO-1); there is no ZeRO-2/3 beside the pipeline |
//! | `megatron-schedule` | Megatron-LM | pipelines run 1F1B or interleaved 1F1B (`megatron/core/pipeline_parallel/schedules.py`); no GPipe, no zero-bubble in mainline |
//! | `deepspeed-zero-pp` | DeepSpeed | `PipelineEngine.__init__` asserts ZeRO stage < 2 (`runtime/pipe/engine.py`) |
//! | `deepspeed-schedule` | DeepSpeed | `PipelineEngine` runs its `TrainSchedule` (1F1B); no interleaving, no zero-bubble |
//! | `deepspeed-sp` | DeepSpeed | no Megatron-style sequence parallelism (its `sequence_parallel_size` is Ulysses, another thing) |
//! | `deepspeed-autotp-zero3` | DeepSpeed | AutoTP training combines with ZeRO stages 0–2 only (deepspeed.ai/tutorials/autotp-training) |
//! | `torchtitan-zero` | torchtitan | data parallelism is DDP (ZeRO-0) or FSDP2 (ZeRO-2 without, ZeRO-3 with reshard after forward); no optimizer-only sharding |
//! | `torchtitan-schedule` | torchtitan | `torch.distributed.pipelining` has GPipe, 1F1B, Interleaved1F1B; its zero-bubble schedules are interleaved or V-shaped, not ZB-H1/H2 |
//! | `torchtitan-tp-sp` | torchtitan | its tensor-parallel plan always shards norms and dropout along the sequence (sequence parallelism on) |
//! | `megatron-tp-comm-overlap-sp` | Megatron-LM | `--tp-comm-overlap` asserts sequence parallelism (`arguments.py`: "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"); with tp = 1 there is nothing to overlap |
//! | `deepspeed-tp-comm-overlap` | DeepSpeed | AutoTP runs its all-reduces whole; no collective/GEMM overlap |
//! | `torchtitan-async-tp` | torchtitan | `parallelism.enable_async_tensor_parallel` needs tensor parallelism (tp > 1) |
//! | `strata-tp-comm-overlap` | Strata | Strata's executors run every collective whole, after the GEMM that feeds it |
//!
//! The rules of expert and context parallelism, latent attention and multi-token prediction
//! are in [`moe_cp`].
//!
//! The memory each framework allocates (fp32 main gradients in Megatron-LM, DeepSpeed's
//! estimators) and the dtype it reduces gradients in are modelled in
//! [`crate::accounting`]; this module is the one list of which framework exists and what
//! it runs.

use serde::{Deserialize, Serialize};

use crate::parallel::{ConfigError, Schedule, Violation};
use crate::scenario::Scenario;

/// The framework that runs a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// NVIDIA Megatron-LM / megatron-core (the default on GPU clusters).
    Megatron,
    /// Microsoft DeepSpeed (ZeRO, its PipelineEngine, AutoTP).
    #[serde(rename = "deepspeed")]
    DeepSpeed,
    /// PyTorch torchtitan (FSDP2, DTensor tensor parallelism, torch.distributed.pipelining).
    Torchtitan,
    /// Strata's own executor (the default on CPU clusters): runs every split the plan IR
    /// expresses, with the ZeRO paper's memory.
    Strata,
}

impl Framework {
    /// Every framework, the external ones first.
    pub const ALL: [Framework; 4] =
        [Framework::Megatron, Framework::DeepSpeed, Framework::Torchtitan, Framework::Strata];
    /// The frameworks people train with outside Strata: what `--framework any` searches.
    pub const EXTERNAL: [Framework; 3] = [Framework::Megatron, Framework::DeepSpeed, Framework::Torchtitan];

    /// The scenario key (`training.framework = "…"`).
    pub fn key(self) -> &'static str {
        match self {
            Framework::Megatron => "megatron",
            Framework::DeepSpeed => "deepspeed",
            Framework::Torchtitan => "torchtitan",
            Framework::Strata => "strata",
        }
    }

    /// The framework's own name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Megatron => "Megatron-LM",
            Framework::DeepSpeed => "DeepSpeed",
            Framework::Torchtitan => "torchtitan",
            Framework::Strata => "Strata's executor",
        }
    }

    /// Parses a scenario or command-line key.
    pub fn from_key(key: &str) -> Option<Framework> {
        Framework::ALL.into_iter().find(|f| f.key() == key)
    }

    /// The known keys, for messages: `"megatron", "deepspeed", …`.
    pub fn known_keys() -> String {
        Framework::ALL.iter().map(|f| format!("\"{}\"", f.key())).collect::<Vec<_>>().join(", ")
    }

    /// Every rule of this framework the scenario's split breaks, each naming what would run
    /// instead. Assumes the split already passed [`crate::parallel::ParallelConfig::validate`].
    pub fn violations(self, s: &Scenario) -> Vec<Violation> {
        let p = &s.parallel;
        let mut v = Vec::new();
        let mut bad = |rule: &'static str, message: String| v.push(Violation { rule, message });
        let pipelined = p.pp > 1;
        match self {
            Framework::Strata => {
                if p.tp_comm_overlap == Some(true) {
                    bad(
                        "strata-tp-comm-overlap",
                        "parallel.tp_comm_overlap = true with training.framework = \"strata\": Strata's executors run every tensor-parallel collective whole, after the GEMM that feeds it; set tp_comm_overlap = false (or leave it unset), or use framework = \"megatron\"".to_string(),
                    );
                }
            }
            Framework::Megatron => {
                if p.tp_comm_overlap == Some(true) && (p.tp < 2 || !p.sequence_parallel) {
                    bad(
                        "megatron-tp-comm-overlap-sp",
                        format!(
                            "parallel.tp_comm_overlap = true with tp = {} and sequence_parallel = {}: Megatron-LM's --tp-comm-overlap overlaps the sequence-parallel all-gathers and reduce-scatters, and asserts sequence parallelism; set tp > 1 and sequence_parallel = true, or tp_comm_overlap = false",
                            p.tp, p.sequence_parallel
                        ),
                    );
                }
                if p.zero >= 2 {
                    bad(
                        "megatron-zero",
                        format!(
                            "parallel.zero = {} with training.framework = \"megatron\": Megatron-LM's distributed optimizer shards the optimizer state only (ZeRO-1); use zero = 1, or framework = \"deepspeed\" (with pp = 1) or \"torchtitan\" (FSDP2) for ZeRO-{}",
                            p.zero, p.zero
                        ),
                    );
                }
                if pipelined && !matches!(p.schedule, Schedule::OneFOneB | Schedule::Interleaved) {
                    bad(
                        "megatron-schedule",
                        format!(
                            "parallel.schedule = \"{}\" with training.framework = \"megatron\": Megatron-LM pipelines run \"1f1b\" or \"interleaved\"{}",
                            p.schedule.key(),
                            match p.schedule {
                                Schedule::Gpipe => "; GPipe runs under framework = \"torchtitan\"",
                                _ =>
                                    "; the zero-bubble schedules need the sail-sg fork of Megatron-LM or framework = \"strata\"",
                            }
                        ),
                    );
                }
            }
            Framework::DeepSpeed => {
                if p.zero >= 2 && pipelined {
                    bad(
                        "deepspeed-zero-pp",
                        format!(
                            "parallel.zero = {} with parallel.pp = {} and training.framework = \"deepspeed\": DeepSpeed's PipelineEngine asserts ZeRO stage < 2; use zero = 1 with the pipeline, or pp = 1 for ZeRO-{}",
                            p.zero, p.pp, p.zero
                        ),
                    );
                }
                if pipelined && p.schedule != Schedule::OneFOneB {
                    bad(
                        "deepspeed-schedule",
                        format!(
                            "parallel.schedule = \"{}\" with training.framework = \"deepspeed\": DeepSpeed's PipelineEngine runs 1F1B only; use schedule = \"1f1b\" (vpp = 1), or framework = \"megatron\" for interleaving",
                            p.schedule.key()
                        ),
                    );
                }
                if p.sequence_parallel {
                    bad(
                        "deepspeed-sp",
                        "parallel.sequence_parallel = true with training.framework = \"deepspeed\": DeepSpeed has no Megatron-style sequence parallelism (its sequence_parallel_size is Ulysses); set sequence_parallel = false, or use framework = \"megatron\" or \"torchtitan\"".to_string(),
                    );
                }
                if p.tp_comm_overlap == Some(true) {
                    bad(
                        "deepspeed-tp-comm-overlap",
                        "parallel.tp_comm_overlap = true with training.framework = \"deepspeed\": DeepSpeed's AutoTP runs its tensor-parallel all-reduces whole, with no GEMM overlap; set tp_comm_overlap = false (or leave it unset), or use framework = \"megatron\"".to_string(),
                    );
                }
                if p.tp > 1 && p.zero >= 3 {
                    bad(
                        "deepspeed-autotp-zero3",
                        format!(
                            "parallel.tp = {} with parallel.zero = 3 and training.framework = \"deepspeed\": AutoTP training combines with ZeRO stages 0–2 only; use zero ≤ 2, or tp = 1 for ZeRO-3",
                            p.tp
                        ),
                    );
                }
            }
            Framework::Torchtitan => {
                if p.zero == 1 {
                    bad(
                        "torchtitan-zero",
                        "parallel.zero = 1 with training.framework = \"torchtitan\": torchtitan's data parallelism is DDP (zero = 0) or FSDP2 (zero = 2 without, zero = 3 with reshard after forward); use one of those, or framework = \"megatron\" for ZeRO-1".to_string(),
                    );
                }
                if pipelined && matches!(p.schedule, Schedule::ZbH1 | Schedule::ZbH2) {
                    bad(
                        "torchtitan-schedule",
                        format!(
                            "parallel.schedule = \"{}\" with training.framework = \"torchtitan\": torch.distributed.pipelining's zero-bubble schedules (InterleavedZeroBubble, ZBVZeroBubble) are interleaved or V-shaped, not {}; use \"gpipe\", \"1f1b\" or \"interleaved\", or framework = \"strata\"",
                            p.schedule.key(),
                            if p.schedule == Schedule::ZbH1 { "ZB-H1" } else { "ZB-H2" }
                        ),
                    );
                }
                if p.tp_comm_overlap == Some(true) && p.tp < 2 {
                    bad(
                        "torchtitan-async-tp",
                        "parallel.tp_comm_overlap = true with tp = 1 and training.framework = \"torchtitan\": async tensor parallelism overlaps tensor-parallel collectives, and there are none; set tp > 1, or tp_comm_overlap = false".to_string(),
                    );
                }
                if p.tp > 1 && !p.sequence_parallel {
                    bad(
                        "torchtitan-tp-sp",
                        format!(
                            "parallel.tp = {} with sequence_parallel = false and training.framework = \"torchtitan\": torchtitan's tensor parallelism always shards norms along the sequence; set sequence_parallel = true",
                            p.tp
                        ),
                    );
                }
            }
        }
        self.moe_cp_violations(s, &mut bad);
        v
    }

    /// The split's violations of this framework's rules as one error, or `Ok`.
    pub fn check(self, s: &Scenario) -> Result<(), ConfigError> {
        let violations = self.violations(s);
        if violations.is_empty() { Ok(()) } else { Err(ConfigError { violations }) }
    }

    /// The external frameworks that run this split, in [`Framework::EXTERNAL`] order.
    pub fn runners(s: &Scenario) -> Vec<Framework> {
        Framework::EXTERNAL.into_iter().filter(|f| f.violations(s).is_empty()).collect()
    }
}

pub mod mechanics;
mod moe_cp;

#[cfg(test)]
mod tests;
