//! `strata inspect`: what a job costs before anything is simulated — parameters, FLOPs and
//! tokens per step, and the analytic memory of each pipeline stage against the GPU: first
//! the lines the framework's own formula counts (states in its layout, activations), then
//! what Strata models on top (transient working sets, CUDA context, NCCL buffers, allocator
//! slack, from the GPU's built-in profile).

use serde::Serialize;
use strata_models::Scenario;
use strata_models::accounting::states::{self, PerParam};
use strata_models::accounting::{flops, memory, params};

use crate::common::{self, ScenarioArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct StageReport {
    stage: u32,
    layers: u32,
    params_per_rank: u64,
    #[serde(flatten)]
    memory: memory::StageMemory,
    /// What the framework's own formula counts (states, its buffer term, activations).
    framework_formula_bytes: f64,
    /// What Strata models beyond the formula.
    strata_extra: StrataExtra,
    /// The plan's buffers plus the process overheads.
    total_bytes: f64,
    fits: bool,
}

/// What Strata models beyond the framework's formula, bytes.
#[derive(Serialize)]
struct StrataExtra {
    transient_bytes: f64,
    cuda_context_bytes: f64,
    nccl_bytes: f64,
    allocator_slack_bytes: f64,
}

impl StrataExtra {
    fn total(&self) -> f64 {
        self.transient_bytes + self.cuda_context_bytes + self.nccl_bytes + self.allocator_slack_bytes
    }
}

/// NCCL buffers of a rank of `stage`: the communicators its plan uses (tp, dp, the
/// embedding group, the world for the gradient norm) and its pipeline peers, as the
/// simulator counts them.
fn nccl_bytes(s: &Scenario, stage: u32, mem: &strata_sim::profile::MemoryParams) -> f64 {
    let p = &s.parallel;
    let edge = stage == 0 || stage == p.pp - 1;
    let comms = [
        p.tp > 1,
        p.dp > 1,
        s.model.tied_embeddings() && p.pp > 1 && edge,
        p.ranks() > 1 && s.training.grad_clip > 0.0,
    ]
    .iter()
    .filter(|u| **u)
    .count() as u32;
    let peers = match p.pp {
        1 => 0,
        2 => 1,
        _ => 2,
    };
    strata_sim::memory::nccl_buffer_bytes(mem, comms, peers)
}

#[derive(Serialize)]
struct Report<'a> {
    scenario: &'a Scenario,
    ranks: u64,
    microbatches: u32,
    total_params: u64,
    tokens_per_step: u64,
    model_flops_per_step: f64,
    hardware_flops_per_step: f64,
    gpu_memory_bytes: u64,
    stages: Vec<StageReport>,
    fits: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let s = args.scenario.load()?;
    let report = build(&s);
    if args.json {
        return common::print_json(&report);
    }
    print!("{}", text(&report));
    Ok(())
}

fn build(s: &Scenario) -> Report<'_> {
    let p = &s.parallel;
    let f = flops::scenario_step_flops(s);
    let hbm = s.cluster.gpu.spec().hbm_bytes;
    let stage_params = params::stage_params(&s.model, p);
    let mem = strata_sim::HardwareProfile::builtin(s.cluster.gpu).memory;
    let stages: Vec<StageReport> = memory::stage_memory(s)
        .into_iter()
        .zip(&stage_params)
        .map(|(m, sp)| {
            let buffers = m.total_bytes();
            let extra = StrataExtra {
                transient_bytes: m.strata_extra_bytes(),
                cuda_context_bytes: mem.cuda_context_mib * 1024.0 * 1024.0,
                nccl_bytes: nccl_bytes(s, m.stage, &mem),
                allocator_slack_bytes: buffers * mem.allocator_fragmentation,
            };
            let total = buffers - m.strata_extra_bytes() + extra.total();
            StageReport {
                stage: m.stage,
                layers: sp.layers,
                params_per_rank: sp.per_rank(),
                framework_formula_bytes: m.framework_formula_bytes(),
                memory: m,
                strata_extra: extra,
                total_bytes: total,
                fits: total <= hbm as f64,
            }
        })
        .collect();
    let fits = stages.iter().all(|st| st.fits);
    Report {
        scenario: s,
        ranks: p.ranks(),
        microbatches: p.microbatches(),
        total_params: params::total_params(&s.model),
        tokens_per_step: s.tokens_per_step(),
        model_flops_per_step: f.model,
        hardware_flops_per_step: f.hardware,
        gpu_memory_bytes: hbm,
        stages,
        fits,
    }
}

/// `2 + 12/d`, `18`, `16/d`.
fn per_param(p: PerParam) -> String {
    match (p.whole, p.sharded) {
        (w, 0) => w.to_string(),
        (0, s) => format!("{s}/d"),
        (w, s) => format!("{w} + {s}/d"),
    }
}

fn text(r: &Report) -> String {
    use std::fmt::Write;
    let s = r.scenario;
    let m = &s.model;
    let c = &s.cluster;
    let p = &s.parallel;
    let mut o = String::new();
    let _ = writeln!(o, "Scenario  {}", s.name);
    let _ = writeln!(
        o,
        "Model     {}: {:?}, {} layers, hidden {}, {} heads ({} kv), ffn {}, vocab {}, seq {}, {:?} — {} parameters",
        m.name,
        m.family,
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        m.ffn_hidden,
        m.vocab,
        m.seq_len,
        m.activation,
        common::count(r.total_params as f64)
    );
    let _ = writeln!(
        o,
        "Cluster   {}: {} nodes × {} {} = {} GPUs, {} × {} Gb/s NICs per node, {:?} fabric",
        c.name,
        c.nodes,
        c.gpus_per_node,
        c.gpu,
        c.gpus(),
        c.nics_per_node,
        c.nic_gbps,
        c.fabric
    );
    let _ = writeln!(
        o,
        "Split     TP({})-PP({})-DP({}), {} schedule{}, {} microbatches of {} = global batch {}, ZeRO-{}, recompute {}, sequence parallel {}",
        p.tp,
        p.pp,
        p.dp,
        p.schedule.key(),
        if p.vpp > 1 { format!(" with {} chunks per stage", p.vpp) } else { String::new() },
        r.microbatches,
        p.micro_batch,
        p.global_batch,
        p.zero,
        p.recompute.key(),
        if p.sequence_parallel { "on" } else { "off" }
    );
    let recompute_pct = 100.0 * (r.hardware_flops_per_step / r.model_flops_per_step - 1.0);
    let _ = writeln!(
        o,
        "Compute   {} tokens per step; {} model FLOPs per step, {} executed (+{recompute_pct:.1}% recomputation); {} per GPU",
        common::count(r.tokens_per_step as f64),
        common::flops(r.model_flops_per_step),
        common::flops(r.hardware_flops_per_step),
        common::flops(r.hardware_flops_per_step / r.ranks as f64),
    );
    let layout = states::scenario_layout(s);
    let _ = writeln!(
        o,
        "\nMemory per GPU by pipeline stage (analytic; GPU has {}). Framework {}: {:.2} bytes per parameter at dp {} (weights {}, gradients {}, optimizer {}; whole + sharded/dp), gradients reduced in {}",
        common::bytes(r.gpu_memory_bytes as f64),
        s.training.framework.name(),
        layout.per_param(p.dp),
        p.dp,
        per_param(layout.weights),
        per_param(layout.grads),
        per_param(layout.optimizer),
        layout.grad_reduce.key()
    );
    let _ = writeln!(o, "  by the framework's formula:");
    let _ = writeln!(
        o,
        "{:>5} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}",
        "stage",
        "layers",
        "params",
        "weights",
        "grads",
        "optimizer",
        "formula+",
        "activations",
        "emb/logits",
        "formula"
    );
    for st in &r.stages {
        let mm = &st.memory;
        let _ = writeln!(
            o,
            "{:>5} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10}",
            st.stage,
            st.layers,
            common::count(st.params_per_rank as f64),
            common::bytes(mm.weights_bytes),
            common::bytes(mm.grads_bytes),
            common::bytes(mm.optimizer_bytes),
            common::bytes(mm.formula_only_bytes),
            common::bytes(mm.activations_bytes),
            common::bytes(mm.embedding_logits_bytes),
            common::bytes(st.framework_formula_bytes),
        );
    }
    let _ = writeln!(
        o,
        "  what Strata models beyond it (formula+ above is the formula's own term that the plan holds as transients):"
    );
    let _ = writeln!(
        o,
        "{:>5} {:>10} {:>12} {:>10} {:>10} {:>10}  fits",
        "stage", "transient", "CUDA context", "NCCL", "allocator", "total"
    );
    for st in &r.stages {
        let x = &st.strata_extra;
        let _ = writeln!(
            o,
            "{:>5} {:>10} {:>12} {:>10} {:>10} {:>10}  {}",
            st.stage,
            common::bytes(x.transient_bytes),
            common::bytes(x.cuda_context_bytes),
            common::bytes(x.nccl_bytes),
            common::bytes(x.allocator_slack_bytes),
            common::bytes(st.total_bytes),
            if st.fits { "yes" } else { "NO" }
        );
    }
    // A job that does not fit has a stage that does not.
    if !r.fits
        && let Some(worst) = r.stages.iter().max_by(|a, b| a.total_bytes.total_cmp(&b.total_bytes))
    {
        let _ = writeln!(
            o,
            "\nDoes not fit: stage {} needs {} more than the GPU's {}. Try more pipeline stages, a higher ZeRO stage, recompute = \"selective\" or \"full\", or a smaller micro_batch.",
            worst.stage,
            common::bytes(worst.total_bytes - r.gpu_memory_bytes as f64),
            common::bytes(r.gpu_memory_bytes as f64)
        );
    }
    o
}
