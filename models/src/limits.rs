//! Limits: the largest (and smallest) value of every size a scenario can set, in one place.
//!
//! As TigerBeetle keeps them: every count and size has a documented bound, checked when a
//! scenario is loaded (and when the search builds a candidate), so nothing downstream can
//! overflow, allocate without bound or run without end. A value outside its range is
//! refused with exit code 2 and a message naming the key, the value and the limit. The
//! bounds are generous — each is well above the largest job trained today — and chosen so
//! that every product the accounting and the planner form fits a `u64` with room to spare
//! (e.g. hidden · ffn_hidden · layers · 16 bytes < 2^55).
//!
//! | key | min | max | why the max |
//! |---|---|---|---|
//! | `model.layers` | 1 | 4,096 | 30× Llama-3 405B's 126 |
//! | `model.hidden` | 1 | 131,072 (2^17) | 5× GPT-1T's 25,600 |
//! | `model.heads`, `model.kv_heads` | 1 | 4,096 | 25× GPT-1T's 160 |
//! | `model.head_dim` (absent = hidden / heads) | 1 | 4,096 | 16× Qwen3's 128; heads · head_dim ≤ 2^17 as `model.hidden` |
//! | `model.ffn_hidden` | 1 | 524,288 (2^19) | 5× GPT-1T's 102,400 |
//! | `model.moe.experts` | 1 | 4,096 | 16× DeepSeek-V3's 256 |
//! | `model.moe.experts · expert_ffn_hidden` | 1 | 8,388,608 (2^23) | 8× Llama 4 Maverick's 128 · 8192 |
//! | `model.moe.shared_experts · shared_ffn_hidden` | 0 | 524,288 (2^19) | as `model.ffn_hidden` |
//! | `model.moe.capacity_factor` | > 0 | 64 | finite; Switch uses 1–2 |
//! | `model.mtp_layers` | 0 | 16 | DeepSeek-V3 trains with 1 |
//! | `parallel.ep` | 1 | tp · cp · dp | divides it and the experts |
//! | `model.vocab` | 1 | 4,194,304 (2^22) | 16× Gemma's 256k |
//! | `model.seq_len` | 1 | 1,048,576 (2^20) | million-token contexts |
//! | `model.moe.experts`, `model.moe.top_k` | 1 | 1,024 | 4× DeepSeek-V3's 256 routed experts |
//! | `model.moe.expert_ffn_hidden`, `shared_ffn_hidden` | 1 (shared: 0) | 524,288 (2^19) | as `model.ffn_hidden` |
//! | `model.moe.shared_experts` | 0 | 64 | DeepSeek-V3 has 1, DeepSeekMoE 16B 2 |
//! | `model.moe.dense_layers` | 0 | `model.layers` | |
//! | `model.mla.q_lora_rank`, `kv_lora_rank` | 0 (kv: 1) | 131,072 (2^17) | as `model.hidden` |
//! | `model.mla.*_head_dim` | 1 | 4,096 | 32× DeepSeek-V3's 128 |
//! | `model.mtp_layers` | 0 | 16 | DeepSeek-V3 has 1 |
//! | `cluster.nodes` | 1 | 131,072 (2^17) | with ≤ 2^17 GPUs in all |
//! | `cluster.gpus_per_node` | 1 | 576 | an NVL576 NVLink domain |
//! | nodes · gpus_per_node | 1 | 131,072 (2^17) | 8× a 16k-GPU job; one step of Llama-3 405B on 2^17 GPUs simulates in ~2 s (2^20 took 30 s and 3 GB) |
//! | `cluster.nics_per_node` | 0 | 64 | 8× a DGX's 8 |
//! | nodes · nics_per_node | 0 | 262,144 (2^18) | NIC ports the fabric wires |
//! | `cluster.nic_gbps` | 0.001 (0 without NICs) | 1,000,000 | 1 Mb/s .. 1 Pb/s, finite |
//! | `cluster.oversubscription` | 1 | 1,024 | finite |
//! | `cluster.nic_efficiency` | 0.01 | 1 | share of line rate NCCL reaches |
//! | `cluster.switch_radix` | 4 (even) | 4,096 | 64× a QM9700's 64 ports |
//! | `cluster.nodes_per_unit` | 1 | 131,072 | as `cluster.nodes` |
//! | `cluster.switch_latency_ns` | 0 | 1,000,000 | 1 ms |
//! | `parallel.tp`, `parallel.pp`, `parallel.dp`, `parallel.cp`, `parallel.ep` | 1 | 131,072 | ≤ the GPUs anyway |
//! | `parallel.vpp` | 1 | 128 | model chunks per stage |
//! | `parallel.micro_batch` | 1 | 4,096 | sequences per microbatch |
//! | `parallel.global_batch` | 1 | 16,777,216 (2^24) | sequences per step |
//! | micro_batch · seq_len | 1 | 4,194,304 (2^22) | tokens in one microbatch |
//! | `parallel.grad_bucket_mb` | > 0 | 1,048,576 | 1 TiB, finite |
//! | `training.steps`, `training.warmup_steps` | 1 / 0 | 10,000,000 | |
//! | `training.lr`, `weight_decay`, `grad_clip` | | | finite |
//! | `faults.slow` rank | 0 | GPUs − 1 | a rank of the cluster |
//! | `faults.slow` factor | > 0 | 100 | a rank 100× slower is dead: a failure, not a straggler |
//! | `faults.degrade` factor | > 0 | 1 | a fraction of the link's bandwidth (down: `faults.down`) |
//! | entries of `faults.slow`, `degrade`, `down` | 0 | 4,096 | each; link names ≤ 64 characters, checked against the wired fabric |
//! | `faults.failures.*.mtbf_hours` | 1 s (1/3600 h) | 10^9 h | past any component's life; finite |
//! | `faults.failures.*.shape` (Weibull) | 0.1 | 10 | extreme infant mortality .. sharp wear-out |
//! | `faults.failures.checkpoint.{write,read,staging}_gbps` | 0.001 | 1,000,000 | 1 MB/s .. 1 PB/s |
//! | `faults.failures.checkpoint.save_s`, `interval_s`, `faults.failures.restart.*_s` | 0 (interval 0.001) | 1,000,000 s | 11.6 days |
//! | `strata goodput --trials` | 1 | 100,000 | 1,000 × 30 days runs in seconds |
//! | `strata goodput --days` | > 0 | 3,650 | ten years of training |
//! | `strata goodput --interval` entries | 1 | 256 | a sweep's points |
//!
//! **Work budget.** Plan, simulate and search cost time and memory in proportion to the ops
//! of the lowered plan, about one op group per layer and microbatch on every stage:
//! microbatches · layers ≤ [`MAX_LAYER_PASSES`] = 2^16 (GPT-3 175B at global batch 1536
//! needs 9,216). A scenario over it is refused before anything is lowered, naming both
//! figures. The planner's output is then proven by `plan::check` (every buffer and message
//! ≤ 1 TiB), so `plan` never writes a size that `verify` or `simulate` would refuse.
//! The search cuts candidates over the work budget (counted under the rule `work-budget`)
//! and keeps at most [`MAX_SEARCH_CANDIDATES`] = 2^18 valid ones (the rest counted under
//! `search-budget`); both counts are printed with the other rejected rules. The simulator
//! refuses a step past its clock's horizon (2^62 ns) and any report that breaks physics
//! (`strata_sim::sanity`).

use crate::cluster::ClusterSpec;
use crate::model::ModelSpec;
use crate::parallel::ParallelConfig;
use crate::scenario::{Scenario, TrainingConfig};

pub const MAX_LAYERS: u64 = 4096;
pub const MAX_HIDDEN: u64 = 1 << 17;
pub const MAX_HEADS: u64 = 4096;
/// The largest explicit `model.head_dim`.
pub const MAX_HEAD_DIM: u64 = 4096;
pub const MAX_FFN_HIDDEN: u64 = 1 << 19;
/// experts · expert_ffn_hidden: all routed experts' width in one layer (8× Llama 4
/// Maverick's 128 · 8192 = 2^20), so a MoE model's parameters stay within the dense bound.
pub const MAX_ROUTED_WIDTH: u64 = 1 << 23;
/// The router's capacity factor (Switch Transformer uses 1–2).
pub const MAX_CAPACITY_FACTOR: f64 = 64.0;
pub const MAX_VOCAB: u64 = 1 << 22;
pub const MAX_SEQ_LEN: u64 = 1 << 20;
pub const MAX_EXPERTS: u64 = 1024;
pub const MAX_SHARED_EXPERTS: u64 = 64;
pub const MAX_MLA_HEAD_DIM: u64 = 4096;
pub const MAX_MTP_LAYERS: u64 = 16;
pub const MAX_NODES: u64 = 1 << 17;
pub const MAX_GPUS_PER_NODE: u64 = 576;
pub const MAX_GPUS: u64 = 1 << 17;
pub const MAX_NICS_PER_NODE: u64 = 64;
pub const MAX_NIC_PORTS: u64 = 1 << 18;
pub const MIN_NIC_GBPS: f64 = 1e-3;
pub const MAX_NIC_GBPS: f64 = 1e6;
pub const MAX_OVERSUBSCRIPTION: f64 = 1024.0;
pub const MAX_SWITCH_RADIX: u64 = 4096;
pub const MAX_SWITCH_LATENCY_NS: u64 = 1_000_000;
pub const MAX_GRID_DIMENSION: u64 = MAX_GPUS;
pub const MAX_VPP: u64 = 128;
pub const MAX_MICRO_BATCH: u64 = 4096;
pub const MAX_GLOBAL_BATCH: u64 = 1 << 24;
pub const MAX_MICROBATCH_TOKENS: u64 = 1 << 22;
pub const MAX_GRAD_BUCKET_MB: f64 = 1_048_576.0;
pub const MAX_STEPS: u64 = 10_000_000;
/// Microbatches · layers: the work budget of plan, simulate and search.
pub const MAX_LAYER_PASSES: u64 = 1 << 16;
/// `[faults.failures]`: per-unit MTBF, hours (1 s .. 10^9 h, past any component's life).
pub const MIN_FAILURE_MTBF_HOURS: f64 = 1.0 / 3600.0;
pub const MAX_FAILURE_MTBF_HOURS: f64 = 1e9;
/// Weibull shape k: 0.1 (extreme infant mortality) .. 10 (sharp wear-out).
pub const MIN_WEIBULL_SHAPE: f64 = 0.1;
pub const MAX_WEIBULL_SHAPE: f64 = 10.0;
/// Storage and staging bandwidth, GB/s: 1 MB/s .. 1 PB/s.
pub const MIN_STORAGE_GBPS: f64 = 1e-3;
pub const MAX_STORAGE_GBPS: f64 = 1e6;
/// Any checkpoint or restart time, or interval, seconds: at most 10^6 s (11.6 days).
pub const MAX_FAILURE_SECONDS: f64 = 1e6;
/// `strata goodput`: trials, days of failure-free training, intervals per sweep.
pub const MAX_GOODPUT_TRIALS: u64 = 100_000;
pub const MAX_GOODPUT_DAYS: f64 = 3650.0;
pub const MAX_GOODPUT_INTERVALS: usize = 256;
/// Valid candidates one search keeps (the rest are counted under `search-budget`).
pub const MAX_SEARCH_CANDIDATES: u64 = 1 << 18;
/// `[[job]]` tables in one multi-job file (`scenario::jobs`).
pub const MAX_JOBS: usize = 64;
/// Characters of a job's name.
pub const MAX_JOB_NAME: usize = 64;

/// Collects "key = value is over the limit of max" lines.
#[derive(Default)]
struct Report(Vec<String>);

impl Report {
    fn int(&mut self, key: &str, value: u64, min: u64, max: u64) {
        if value < min {
            self.0.push(format!("{key} = {value} is below the minimum of {min}"));
        } else if value > max {
            self.0.push(format!("{key} = {value} is over the limit of {max} (see docs/limits.md)"));
        }
    }

    /// A real number in [min, max]: finite, and not below min (a positive min excludes 0).
    fn real(&mut self, key: &str, value: f64, min: f64, max: f64, unit: &str) {
        if !value.is_finite() {
            self.0.push(format!("{key} = {value} must be a finite number in [{min}, {max}]{unit}"));
        } else if value < min {
            self.0.push(format!("{key} = {value} is below the minimum of {min}{unit} (see docs/limits.md)"));
        } else if value > max {
            self.0.push(format!("{key} = {value} is over the limit of {max}{unit} (see docs/limits.md)"));
        }
    }

    fn done(self) -> Result<(), String> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0.join("\n")) }
    }
}

/// The model's sizes within their limits.
pub fn check_model(m: &ModelSpec) -> Result<(), String> {
    let mut r = Report::default();
    r.int("model.layers", m.layers.into(), 1, MAX_LAYERS);
    r.int("model.hidden", m.hidden.into(), 1, MAX_HIDDEN);
    r.int("model.heads", m.heads.into(), 1, MAX_HEADS);
    r.int("model.kv_heads", m.kv_heads.into(), 1, MAX_HEADS);
    if let Some(d) = m.head_dim {
        r.int("model.head_dim", d.into(), 1, MAX_HEAD_DIM);
        r.int("model.heads · head_dim", m.heads as u64 * d as u64, 1, MAX_HIDDEN);
    }
    r.int("model.ffn_hidden", m.ffn_hidden.into(), 1, MAX_FFN_HIDDEN);
    r.int("model.vocab", m.vocab.into(), 1, MAX_VOCAB);
    r.int("model.seq_len", m.seq_len.into(), 1, MAX_SEQ_LEN);
    if let Some(e) = &m.moe {
        r.int("model.moe.experts", e.experts.into(), 1, MAX_EXPERTS);
        r.int("model.moe.top_k", e.top_k.into(), 1, MAX_EXPERTS);
        r.int("model.moe.expert_ffn_hidden", e.expert_ffn_hidden.into(), 1, MAX_FFN_HIDDEN);
        r.int("model.moe.shared_experts", e.shared_experts.into(), 0, MAX_SHARED_EXPERTS);
        r.int("model.moe.shared_ffn_hidden", e.shared_ffn_hidden.into(), 0, MAX_FFN_HIDDEN);
        r.int("model.moe.dense_layers", e.dense_layers.into(), 0, MAX_LAYERS);
        r.int(
            "model.moe.experts · expert_ffn_hidden",
            e.experts as u64 * e.expert_ffn_hidden as u64,
            1,
            MAX_ROUTED_WIDTH,
        );
        if let Some(c) = e.capacity_factor {
            r.real("model.moe.capacity_factor", c, 0.0, MAX_CAPACITY_FACTOR, "");
        }
    }
    if let Some(a) = &m.mla {
        r.int("model.mla.q_lora_rank", a.q_lora_rank.into(), 0, MAX_HIDDEN);
        r.int("model.mla.kv_lora_rank", a.kv_lora_rank.into(), 1, MAX_HIDDEN);
        r.int("model.mla.qk_nope_head_dim", a.qk_nope_head_dim.into(), 1, MAX_MLA_HEAD_DIM);
        r.int("model.mla.qk_rope_head_dim", a.qk_rope_head_dim.into(), 1, MAX_MLA_HEAD_DIM);
        r.int("model.mla.v_head_dim", a.v_head_dim.into(), 1, MAX_MLA_HEAD_DIM);
    }
    r.int("model.mtp_layers", m.mtp_layers.into(), 0, MAX_MTP_LAYERS);
    r.done()
}

/// The cluster's sizes within their limits.
pub fn check_cluster(c: &ClusterSpec) -> Result<(), String> {
    let mut r = Report::default();
    r.int("cluster.nodes", c.nodes.into(), 1, MAX_NODES);
    r.int("cluster.gpus_per_node", c.gpus_per_node.into(), 1, MAX_GPUS_PER_NODE);
    r.int("cluster.nics_per_node", c.nics_per_node.into(), 0, MAX_NICS_PER_NODE);
    r.int("cluster.switch_radix", c.switch_radix.into(), 4, MAX_SWITCH_RADIX);
    r.int("cluster.nodes_per_unit", c.nodes_per_unit.into(), 1, MAX_NODES);
    r.int("cluster.switch_latency_ns", c.switch_latency_ns, 0, MAX_SWITCH_LATENCY_NS);
    if c.nics_per_node > 0 {
        r.real("cluster.nic_gbps", c.nic_gbps, MIN_NIC_GBPS, MAX_NIC_GBPS, " Gb/s");
    } else {
        // Unused without NICs, but written into plans (JSON has no infinity).
        r.real("cluster.nic_gbps", c.nic_gbps, 0.0, MAX_NIC_GBPS, " Gb/s");
    }
    r.real("cluster.oversubscription", c.oversubscription, 1.0, MAX_OVERSUBSCRIPTION, "");
    if r.0.is_empty() {
        let gpus = c.nodes as u64 * c.gpus_per_node as u64;
        if gpus > MAX_GPUS {
            r.0.push(format!(
                "cluster.nodes · gpus_per_node = {} · {} = {gpus} GPUs is over the limit of {MAX_GPUS} (2^17; see docs/limits.md)",
                c.nodes, c.gpus_per_node
            ));
        }
        let ports = c.nodes as u64 * c.nics_per_node as u64;
        if ports > MAX_NIC_PORTS {
            r.0.push(format!(
                "cluster.nodes · nics_per_node = {} · {} = {ports} NIC ports is over the limit of {MAX_NIC_PORTS} (2^18; see docs/limits.md)",
                c.nodes, c.nics_per_node
            ));
        }
    }
    r.done()
}

/// The parallel split's sizes within their limits (each on its own, before any rule
/// multiplies them).
pub fn check_parallel(p: &ParallelConfig) -> Result<(), String> {
    let mut r = Report::default();
    r.int("parallel.tp", p.tp.into(), 1, MAX_GRID_DIMENSION);
    r.int("parallel.pp", p.pp.into(), 1, MAX_GRID_DIMENSION);
    r.int("parallel.dp", p.dp.into(), 1, MAX_GRID_DIMENSION);
    r.int("parallel.cp", p.cp.into(), 1, MAX_GRID_DIMENSION);
    r.int("parallel.ep", p.ep.into(), 1, MAX_GRID_DIMENSION);
    r.int("parallel.vpp", p.vpp.into(), 1, MAX_VPP);
    r.int("parallel.micro_batch", p.micro_batch.into(), 1, MAX_MICRO_BATCH);
    r.int("parallel.global_batch", p.global_batch.into(), 1, MAX_GLOBAL_BATCH);
    // Positive and finite is the split's own rule (`bucket-positive`); here only the top.
    if p.grad_bucket_mb.is_finite() && p.grad_bucket_mb > MAX_GRAD_BUCKET_MB {
        r.real("parallel.grad_bucket_mb", p.grad_bucket_mb, 0.0, MAX_GRAD_BUCKET_MB, " MiB");
    }
    r.done()
}

/// The training settings within their limits.
pub fn check_training(t: &TrainingConfig) -> Result<(), String> {
    let mut r = Report::default();
    r.int("training.steps", t.steps.into(), 0, MAX_STEPS);
    r.int("training.warmup_steps", t.warmup_steps.into(), 0, MAX_STEPS);
    for (key, v) in
        [("training.lr", t.lr), ("training.weight_decay", t.weight_decay), ("training.grad_clip", t.grad_clip)]
    {
        if !v.is_finite() {
            r.0.push(format!("{key} = {v}: it must be a finite number"));
        }
    }
    r.done()
}

/// What the sizes of a whole scenario multiply to: tokens per microbatch and the work
/// budget (microbatches · layers). Assumes the parts passed their own checks.
pub fn check_work(s: &Scenario) -> Result<(), String> {
    let mut r = Report::default();
    let p = &s.parallel;
    let tokens = p.micro_batch as u64 * s.model.seq_len as u64;
    if tokens > MAX_MICROBATCH_TOKENS {
        r.0.push(format!(
            "parallel.micro_batch · model.seq_len = {} · {} = {tokens} tokens per microbatch is over the limit of {MAX_MICROBATCH_TOKENS} (2^22; see docs/limits.md)",
            p.micro_batch, s.model.seq_len
        ));
    }
    let m = p.global_batch as u64 / (p.micro_batch as u64 * p.dp as u64).max(1);
    let passes = m.saturating_mul(s.model.layers.into());
    if passes > MAX_LAYER_PASSES {
        r.0.push(format!(
            "the step runs microbatches · layers = {m} · {} = {passes} layer passes (microbatches = global_batch / (micro_batch · dp) = {} / ({} · {})), over the work budget of {MAX_LAYER_PASSES} (2^16; see docs/limits.md): use fewer microbatches (a larger micro_batch or dp, a smaller global_batch) or fewer layers",
            s.model.layers, p.global_batch, p.micro_batch, p.dp
        ));
    }
    r.done()
}

/// At most `max` characters of `text`, on one line each, with an ellipsis where cut: what
/// an error message may quote of its input. Keeps at most 12 lines.
pub fn excerpt(text: &str, max: usize) -> String {
    const MAX_LINES: usize = 12;
    let mut out: Vec<String> = text
        .lines()
        .take(MAX_LINES)
        .map(|line| {
            if line.chars().count() > max {
                format!("{}…", line.chars().take(max).collect::<String>())
            } else {
                line.to_string()
            }
        })
        .collect();
    if text.lines().nth(MAX_LINES).is_some() {
        out.push("…".to_string());
    }
    out.join("\n")
}

/// How many characters of its input an error message quotes on one line.
pub const EXCERPT_CHARS: usize = 120;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short() {
        let long = "x".repeat(10_000);
        let e = excerpt(&long, EXCERPT_CHARS);
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
        assert!(e.ends_with('…'));
        assert_eq!(excerpt("a\nb", 10), "a\nb");
        let many = "line\n".repeat(100);
        assert_eq!(excerpt(&many, 10).lines().count(), 13);
    }

    #[test]
    fn presets_are_within_the_limits() {
        for name in crate::model::MODEL_PRESETS {
            check_model(&ModelSpec::preset(name).unwrap()).unwrap();
        }
        for name in crate::cluster::CLUSTER_PRESETS {
            check_cluster(&ClusterSpec::preset(name).unwrap()).unwrap();
        }
    }

    #[test]
    fn messages_name_key_value_and_limit() {
        let mut m = ModelSpec::preset("tiny-gpt").unwrap();
        m.layers = 100_000;
        let e = check_model(&m).unwrap_err();
        assert!(e.contains("model.layers = 100000") && e.contains("4096"), "{e}");
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nic_gbps = 5e-324;
        let e = check_cluster(&c).unwrap_err();
        assert!(e.contains("cluster.nic_gbps") && e.contains("0.001"), "{e}");
        c.nic_gbps = 400.0;
        c.switch_radix = 1 << 31;
        assert!(check_cluster(&c).unwrap_err().contains("cluster.switch_radix = 2147483648"));
    }
}
