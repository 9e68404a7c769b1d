//! The parallel configuration: how one training step is split over the GPUs, and the rules
//! that make a split possible.
//!
//! ranks = tp · cp · dp · pp (Megatron-LM's order: tensor-parallel ranks fastest, then
//! context, data, pipeline); expert-parallel groups of ep ranks are cut from a stage's
//! tp · cp · dp ranks (rules in `moe_cp`). The global batch B is cut into microbatches of `micro_batch` sequences; each
//! data-parallel replica runs m = B / (micro_batch · dp) of them per step through its
//! pipeline of pp stages, each stage holding `vpp` model chunks (interleaved 1F1B when
//! vpp > 1, Narayanan et al. SC'21 §2.2). ZeRO stage 1/2/3 shards optimizer state /
//! gradients / parameters over the data-parallel group (Rajbhandari et al. SC'20).
//!
//! Every rule is checked in [`ParallelConfig::validate`], and every violation is reported
//! with the values involved and the rule, e.g. "parallel.tp = 3 does not divide
//! model.heads = 32".

use serde::{Deserialize, Serialize};

use crate::cluster::ClusterSpec;
use crate::model::ModelSpec;
use crate::plan::grid::Pipeline;

/// Pipeline schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al. 2019).
    #[serde(rename = "gpipe")]
    Gpipe,
    /// One-forward-one-backward (PipeDream-Flush; Narayanan et al. 2021).
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Interleaved 1F1B over `vpp` model chunks per stage (Narayanan et al. SC'21).
    #[serde(rename = "interleaved")]
    Interleaved,
    /// Zero-bubble H1: backward split into input-gradient (B) and weight-gradient (W) passes,
    /// W deferred to fill the cool-down bubble at 1F1B's memory (Qi et al. 2023).
    #[serde(rename = "zb-h1")]
    ZbH1,
    /// Zero-bubble H2: ZB-H1 with up to 2p − 1 microbatches in flight, so that no stage idles
    /// between its first and last pass (Qi et al. 2023).
    #[serde(rename = "zb-h2")]
    ZbH2,
}

impl Schedule {
    pub const ALL: [Schedule; 5] =
        [Schedule::Gpipe, Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZbH1, Schedule::ZbH2];

    pub fn key(self) -> &'static str {
        match self {
            Schedule::Gpipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
            Schedule::ZbH1 => "zb-h1",
            Schedule::ZbH2 => "zb-h2",
        }
    }
}

/// Activation recomputation (Korthikanti et al. 2022).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recompute {
    /// Keep every activation.
    None,
    /// Recompute only the attention core (QKᵀ, softmax, dropout, ·V) in backward.
    Selective,
    /// Keep only each layer's input; recompute the whole layer in backward.
    Full,
}

impl Recompute {
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    pub fn key(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// How context-parallel ranks share attention over the sequence (Transformer Engine's
/// `cp_comm_type`). Each rank holds 2·cp-chunked, load-balanced slices of the sequence
/// (rank r holds chunks r and 2·cp − 1 − r).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CpComm {
    /// Ring attention (TE `p2p`, Megatron-LM's default): cp − 1 steps, each passing the
    /// K/V chunk to the next rank of the ring while attending to the one received.
    #[default]
    Ring,
    /// All-gather K/V before attention, reduce-scatter dK/dV after (TE `allgather`; Llama 3).
    AllGather,
    /// DeepSpeed-Ulysses (TE `a2a`): all-to-all Q/K/V from sequence to head sharding and
    /// the output back; needs heads and kv heads divisible by cp.
    Ulysses,
}

impl CpComm {
    pub const ALL: [CpComm; 3] = [CpComm::Ring, CpComm::AllGather, CpComm::Ulysses];

    pub fn key(self) -> &'static str {
        match self {
            CpComm::Ring => "ring",
            CpComm::AllGather => "all-gather",
            CpComm::Ulysses => "ulysses",
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(v: &u32) -> bool {
    *v == 1
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_default_cp_comm(c: &CpComm) -> bool {
    *c == CpComm::Ring
}

/// How a step is split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    /// Context-parallel ranks: each holds 1/cp of every sequence (Megatron-LM's
    /// `--context-parallel-size`). ranks = tp · cp · dp · pp.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub cp: u32,
    /// Expert-parallel ranks: each MoE layer's experts are split over ep ranks of one
    /// pipeline stage (Megatron-LM's `--expert-model-parallel-size`; experts are not
    /// tensor-parallel, `--expert-tensor-parallel-size 1`); ep divides tp · cp · dp.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ep: u32,
    /// How context-parallel ranks exchange keys and values.
    #[serde(default, skip_serializing_if = "is_default_cp_comm")]
    pub cp_comm: CpComm,
    /// Model chunks per pipeline rank.
    pub vpp: u32,
    pub schedule: Schedule,
    /// Sequences per microbatch (b).
    pub micro_batch: u32,
    /// Sequences per step over all replicas (B).
    pub global_batch: u32,
    /// ZeRO stage, 0..=3.
    pub zero: u8,
    pub recompute: Recompute,
    pub sequence_parallel: bool,
    /// Data-parallel gradient bucket size, MiB (Megatron/PyTorch DDP `bucket_cap_mb`).
    pub grad_bucket_mb: f64,
    /// Overlap the data-parallel gradient reduction with backward.
    pub overlap_grad_reduce: bool,
    /// Overlap ZeRO parameter all-gathers with compute (prefetch the next layer).
    pub overlap_param_gather: bool,
    /// Run each steady-state backward with the next forward merged into one program
    /// segment by segment, so that the expert-parallel all-to-alls of one microbatch run
    /// under the other's compute (Megatron-core's `--overlap-moe-expert-parallel-comm`,
    /// the "combined 1F1B" of DeepSeek's DualPipe). Needs a MoE model with ep > 1.
    #[serde(default, skip_serializing_if = "is_false")]
    pub moe_a2a_overlap: bool,
    /// Overlap the sequence-parallel all-gathers and reduce-scatters with the GEMMs next to
    /// them (Megatron-LM's `--tp-comm-overlap`: Transformer Engine's userbuffers, the GEMM
    /// cut into tp chunks while the neighbouring chunk moves). `None` (the default) is
    /// "auto", resolved by [`crate::scenario::Scenario::tp_comm_overlap`]. A timing
    /// property of the backend: the plan's ops and their data dependencies are the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_comm_overlap: Option<bool>,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            tp: 1,
            pp: 1,
            dp: 1,
            cp: 1,
            ep: 1,
            cp_comm: CpComm::Ring,
            vpp: 1,
            schedule: Schedule::OneFOneB,
            micro_batch: 1,
            global_batch: 1,
            zero: 0,
            recompute: Recompute::None,
            sequence_parallel: false,
            grad_bucket_mb: 40.0,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            moe_a2a_overlap: false,
            tp_comm_overlap: None,
        }
    }
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Short rule id, stable for tests and scripts (`tp-divides-heads`).
    pub rule: &'static str,
    /// The values and the rule, in words.
    pub message: String,
}

/// Every rule a configuration broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .violations.iter().map(|v| v.message.as_str()).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    pub violations: Vec<Violation>,
}

impl ConfigError {
    pub fn has(&self, rule: &str) -> bool {
        self.violations.iter().any(|v| v.rule == rule)
    }
}

impl ParallelConfig {
    /// Microbatches per replica per step: m = B / (b · dp). Only meaningful once valid.
    pub fn microbatches(&self) -> u32 {
        // In u64: micro_batch · dp can pass u32::MAX; the quotient is at most global_batch.
        (self.global_batch as u64 / (self.micro_batch as u64 * self.dp as u64).max(1)) as u32
    }

    /// Ranks in the grid: tp · cp · dp · pp.
    pub fn ranks(&self) -> u64 {
        self.tp as u64 * self.cp as u64 * self.pp as u64 * self.dp as u64
    }

    /// Ranks of one pipeline stage, tp · cp · dp: the ranks an expert-parallel group is cut
    /// from.
    pub fn stage_ranks(&self) -> u64 {
        self.tp as u64 * self.cp as u64 * self.dp as u64
    }

    /// Ranks that hold replicas of one dense parameter shard and reduce its gradient:
    /// cp · dp (Megatron-LM's data-parallel group with context parallelism).
    pub fn grad_ranks(&self) -> u64 {
        self.cp as u64 * self.dp as u64
    }

    /// Ranks that hold replicas of one expert and reduce its gradient: tp · cp · dp / ep
    /// (Megatron-core's expert-data-parallel group).
    pub fn expert_dp(&self) -> u64 {
        self.stage_ranks() / self.ep.max(1) as u64
    }

    /// The virtual pipeline: pp stages of vpp chunks ([`Pipeline`] maps chunks to virtual
    /// stages and back).
    pub fn pipeline(&self) -> Pipeline {
        Pipeline { pp: self.pp, vpp: self.vpp }
    }

    /// The layers of virtual stage `vstage` (model chunk `vstage / pp` of pipeline stage
    /// `vstage % pp`). The l layers are split as evenly as pp · vpp chunks allow; when they do
    /// not divide, the chunks at the two ends of the pipeline — which also carry the
    /// embedding and the output layer — get one layer fewer, alternately first and last, as
    /// the Llama 3 report does for 126 layers over 16 stages.
    pub fn chunk_layers(&self, model: &ModelSpec, vstage: u32) -> std::ops::Range<u32> {
        let v = self.pipeline().vstages();
        assert!(vstage < v, "virtual stage {vstage} of {v}");
        let q = model.layers / v;
        let short = if model.layers.is_multiple_of(v) { 0 } else { v - model.layers % v };
        // Chunk i is short if it is among the first ⌈short/2⌉ or the last ⌊short/2⌋ chunks.
        let is_short = |i: u32| i < short.div_ceil(2) || i >= v - short / 2;
        let len = |i: u32| if short == 0 { q } else { q + 1 - u32::from(is_short(i)) };
        let start: u32 = (0..vstage).map(len).sum();
        start..start + len(vstage)
    }

    /// Layers held by pipeline stage `stage` over all its chunks.
    pub fn stage_layers(&self, model: &ModelSpec, stage: u32) -> u32 {
        (0..self.vpp).map(|c| self.chunk_layers(model, self.pipeline().vstage(c, stage)).len() as u32).sum()
    }

    /// Checks every rule against the model and the cluster. All violations are returned,
    /// not just the first, so a user fixes a scenario in one pass.
    pub fn validate(&self, model: &ModelSpec, cluster: &ClusterSpec) -> Result<(), ConfigError> {
        let p = self;
        let zeros: Vec<Violation> = [
            ("tp", p.tp),
            ("pp", p.pp),
            ("dp", p.dp),
            ("cp", p.cp),
            ("ep", p.ep),
            ("vpp", p.vpp),
            ("micro_batch", p.micro_batch),
            ("global_batch", p.global_batch),
        ]
        .into_iter()
        .filter(|(_, x)| *x == 0)
        .map(|(key, _)| Violation { rule: "positive", message: format!("parallel.{key} = 0: it must be at least 1") })
        .collect();
        if !zeros.is_empty() {
            return Err(ConfigError { violations: zeros });
        }
        if let Err(message) = crate::limits::check_parallel(p) {
            return Err(ConfigError { violations: vec![Violation { rule: "limit", message }] });
        }
        let mut v = Vec::new();
        let mut bad = |rule: &'static str, message: String| v.push(Violation { rule, message });
        let gpus = cluster.gpus();
        if p.ranks() != gpus {
            bad(
                "grid-equals-gpus",
                format!(
                    "parallel.tp · cp · dp · pp = {} · {} · {} · {} = {} but the cluster has {} GPUs ({} nodes × {}): the grid must use every GPU exactly once",
                    p.tp,
                    p.cp,
                    p.dp,
                    p.pp,
                    p.ranks(),
                    gpus,
                    cluster.nodes,
                    cluster.gpus_per_node
                ),
            );
        }
        if !model.heads.is_multiple_of(p.tp) {
            bad(
                "tp-divides-heads",
                format!(
                    "parallel.tp = {} does not divide model.heads = {}: tensor parallelism gives each rank heads/tp whole heads",
                    p.tp, model.heads
                ),
            );
        }
        if !model.kv_heads.is_multiple_of(p.tp) {
            bad(
                "tp-divides-kv-heads",
                format!(
                    "parallel.tp = {} does not divide model.kv_heads = {}: each rank needs kv_heads/tp whole key/value heads",
                    p.tp, model.kv_heads
                ),
            );
        }
        if !model.ffn_hidden.is_multiple_of(p.tp) {
            bad(
                "tp-divides-ffn",
                format!(
                    "parallel.tp = {} does not divide model.ffn_hidden = {}: the column-parallel MLP splits ffn_hidden over tp",
                    p.tp, model.ffn_hidden
                ),
            );
        }
        if p.tp > cluster.gpus_per_node && cluster.gpus_per_node > 0 {
            bad(
                "tp-within-node",
                format!(
                    "parallel.tp = {} exceeds cluster.gpus_per_node = {}: tensor-parallel groups must stay inside one NVLink domain",
                    p.tp, cluster.gpus_per_node
                ),
            );
        }
        if model.layers < p.pipeline().vstages() {
            bad(
                "layers-split",
                format!(
                    "model.layers = {} cannot fill pp · vpp = {} · {} = {} model chunks: every chunk needs at least one layer",
                    model.layers,
                    p.pp,
                    p.vpp,
                    p.pipeline().vstages()
                ),
            );
        }
        if !(p.global_batch as u64).is_multiple_of(p.micro_batch as u64 * p.dp as u64) {
            bad(
                "batch-divisible",
                format!(
                    "parallel.global_batch = {} is not divisible by micro_batch · dp = {} · {} = {}",
                    p.global_batch,
                    p.micro_batch,
                    p.dp,
                    p.micro_batch as u64 * p.dp as u64
                ),
            );
        }
        let m = p.microbatches();
        // A chunked schedule (interleaving) needs chunks, a pipeline and groups of pp
        // microbatches; every other schedule runs one chunk per stage.
        let s = p.schedule;
        if s.chunked() {
            if p.vpp < 2 {
                bad(
                    "interleaved-needs-vpp",
                    format!(
                        "parallel.schedule = \"{}\" with parallel.vpp = {}: interleaving needs vpp ≥ 2 model chunks per stage",
                        s.key(),
                        p.vpp
                    ),
                );
            }
            if p.pp < 2 {
                bad(
                    "interleaved-needs-pp",
                    format!(
                        "parallel.schedule = \"{}\" with parallel.pp = {}: interleaving needs a pipeline (pp ≥ 2)",
                        s.key(),
                        p.pp
                    ),
                );
            }
            if m > 0 && !m.is_multiple_of(p.pp) {
                bad(
                    "interleaved-microbatches",
                    format!(
                        "parallel.schedule = \"{}\" needs microbatches divisible by pp: global_batch / (micro_batch · dp) = {} / ({} · {}) = {} is not a multiple of pp = {}",
                        s.key(),
                        p.global_batch,
                        p.micro_batch,
                        p.dp,
                        m,
                        p.pp
                    ),
                );
            }
        } else if p.vpp != 1 {
            let chunked: Vec<String> =
                Schedule::ALL.iter().filter(|c| c.chunked()).map(|c| format!("\"{}\"", c.key())).collect();
            bad(
                "vpp-needs-interleaved",
                format!(
                    "parallel.vpp = {} with parallel.schedule = \"{}\": model chunks (vpp > 1) need schedule = {}",
                    p.vpp,
                    s.key(),
                    chunked.join(" or ")
                ),
            );
        }
        if p.zero > 3 {
            bad(
                "zero-stage",
                format!(
                    "parallel.zero = {}: ZeRO stages are 0 (off), 1 (optimizer), 2 (+gradients), 3 (+parameters)",
                    p.zero
                ),
            );
        }
        if p.sequence_parallel && p.tp < 2 {
            bad("sp-needs-tp", "parallel.sequence_parallel = true with parallel.tp = 1: sequence parallelism splits along the tensor-parallel group, so it needs tp ≥ 2".to_string());
        }
        if p.sequence_parallel && !model.seq_len.is_multiple_of(p.tp * p.cp) {
            bad(
                "sp-divides-seq",
                format!(
                    "parallel.sequence_parallel = true but parallel.tp · cp = {} · {} does not divide model.seq_len = {}: each tensor-parallel rank keeps seq_len/(cp · tp) tokens",
                    p.tp, p.cp, model.seq_len
                ),
            );
        }
        p.moe_cp_rules(model, &mut bad);
        if !(p.grad_bucket_mb > 0.0 && p.grad_bucket_mb.is_finite()) {
            bad(
                "bucket-positive",
                format!(
                    "parallel.grad_bucket_mb = {}: the gradient bucket must be a positive number of MiB",
                    p.grad_bucket_mb
                ),
            );
        }
        if v.is_empty() { Ok(()) } else { Err(ConfigError { violations: v }) }
    }
}

mod moe_cp;

#[cfg(test)]
mod tests;
