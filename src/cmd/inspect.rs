//! `strata inspect`: what a job costs before anything is simulated — parameters, FLOPs and
//! tokens per step, and the analytic memory of each pipeline stage against the GPU: first
//! the lines the framework's own formula counts (states in its layout, activations), then
//! what Strata models on top (transient working sets, CUDA context, NCCL buffers, allocator
//! slack, from the GPU's built-in profile).

use serde::Serialize;
use strata_models::accounting::states::{self, PerParam};
use strata_models::accounting::{flops, memory, params};
use strata_models::{Scenario, plan};

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
    /// The plan's buffers plus the process overheads, analytically.
    total_bytes: f64,
    /// The peak `strata simulate` reports for this stage (the lowered plan's buffers over
    /// its simulated timeline, plus the same overheads); `None` when the plan could not be
    /// simulated.
    simulated_bytes: Option<u64>,
    /// By the simulated peak where there is one, else the analytic total.
    fits: bool,
}

impl StageReport {
    /// The bytes the verdict is decided by.
    fn need(&self) -> f64 {
        self.simulated_bytes.map_or(self.total_bytes, |b| b as f64)
    }
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
    /// Parameters a token passes through (top-k experts, not all of them); the main model's.
    active_params: u64,
    /// Of `total_params`, the multi-token-prediction modules'.
    mtp_params: u64,
    tokens_per_step: u64,
    model_flops_per_step: f64,
    hardware_flops_per_step: f64,
    gpu_memory_bytes: u64,
    stages: Vec<StageReport>,
    /// What `fits` is decided by: "simulated plan" (the verdict `strata simulate` gives) or
    /// "analytic estimate" (the plan could not be simulated; `simulation_error` says why).
    fits_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    simulation_error: Option<String>,
    fits: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let s = args.scenario.load()?;
    let report = build(&s);
    if args.json {
        common::print_json(&report)?;
    } else {
        print!("{}", text(&report));
    }
    if !report.fits {
        let over = report.stages.iter().filter(|st| !st.fits).count();
        return Err(common::OutOfMemoryVerdict(format!(
            "the plan does not fit in GPU memory: {over} of {} stages over, by the {} (exit code 3)",
            report.stages.len(),
            report.fits_by
        ))
        .into());
    }
    Ok(())
}

fn build(s: &Scenario) -> Report<'_> {
    let p = &s.parallel;
    let f = flops::scenario_step_flops(s);
    let hbm = s.cluster.gpu.spec().hbm_bytes;
    let stage_params = params::stage_params(&s.model, p);
    let mem = strata_sim::HardwareProfile::builtin(s.cluster.gpu).memory;
    // The verdict `strata simulate` gives: the plan's own buffers over its timeline (one
    // rank per stage is enough for memory), so that the two commands agree on "fits".
    // Step what-ifs change time, not memory: the memory run is the fault-free one.
    let mut fault_free = s.clone();
    (fault_free.faults.slow, fault_free.faults.degrade, fault_free.faults.down) = (vec![], vec![], vec![]);
    let simulated = plan::lower(&fault_free).map_err(|e| e.to_string()).and_then(|plan| {
        let o = strata_sim::SimOptions { mode: strata_sim::Mode::Symmetric, ..Default::default() };
        strata_sim::simulate(&plan, &o).map_err(|e| e.to_string())
    });
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
            let sim = simulated.as_ref().ok().and_then(|r| r.memory.iter().find(|x| x.stage == m.stage));
            let simulated_bytes = sim.map(|x| x.peak_bytes);
            StageReport {
                stage: m.stage,
                layers: sp.layers,
                params_per_rank: sp.per_rank(),
                framework_formula_bytes: m.framework_formula_bytes(),
                memory: m,
                strata_extra: extra,
                total_bytes: total,
                simulated_bytes,
                fits: sim.map_or(total <= hbm as f64, |x| x.peak_bytes <= x.capacity_bytes),
            }
        })
        .collect();
    let fits = stages.iter().all(|st| st.fits);
    Report {
        scenario: s,
        ranks: p.ranks(),
        microbatches: p.microbatches(),
        total_params: params::total_params(&s.model),
        active_params: params::param_counts(&s.model).active,
        mtp_params: params::param_counts(&s.model).mtp,
        tokens_per_step: s.tokens_per_step(),
        model_flops_per_step: f.model,
        hardware_flops_per_step: f.hardware,
        gpu_memory_bytes: hbm,
        stages,
        fits_by: if simulated.is_ok() { "simulated plan" } else { "analytic estimate" },
        simulation_error: simulated.err(),
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
        "Model     {}: {:?}, {} layers, hidden {}, {} heads ({} kv){}, ffn {}, vocab {}, seq {}, {:?} — {} parameters",
        m.name,
        m.family,
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        // Said only where the model sets it apart from hidden / heads (Qwen3: 64 × 128 over 4,096).
        m.head_dim.map(|d| format!(" of {d} channels (q width {})", m.q_dim())).unwrap_or_default(),
        m.ffn_hidden,
        m.vocab,
        m.seq_len,
        m.activation,
        common::count(r.total_params as f64)
    );
    if let Some(e) = &m.moe {
        let _ = writeln!(
            o,
            "Experts   {} routed of width {}, top-{} ({:?} router){}, dense first layers {}, {} — {} active parameters per token",
            e.experts,
            e.expert_ffn_hidden,
            e.top_k,
            e.score,
            if e.shared_experts > 0 {
                format!(", {} shared of width {}", e.shared_experts, e.shared_ffn_hidden)
            } else {
                String::new()
            },
            e.dense_layers,
            e.capacity_factor.map_or("dropless".to_string(), |c| format!("capacity factor {c}")),
            common::count(r.active_params as f64)
        );
    }
    if let Some(a) = &m.mla {
        let _ = writeln!(
            o,
            "Attention latent (MLA): q rank {}, kv rank {}, per head {} + {} rotary query/key and {} value channels",
            a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        );
    }
    if m.mtp_layers > 0 {
        let _ = writeln!(
            o,
            "MTP       {} multi-token-prediction module(s): {} parameters of the total",
            m.mtp_layers,
            common::count(r.mtp_params as f64)
        );
    }
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
        "Split     TP({}){}-PP({})-DP({}){}, {} schedule{}, {} microbatches of {} = global batch {}, ZeRO-{}, recompute {}, sequence parallel {}",
        p.tp,
        if p.cp > 1 { format!("-CP({}, {})", p.cp, p.cp_comm.key()) } else { String::new() },
        p.pp,
        p.dp,
        if p.ep > 1 { format!("-EP({}) over expert-dp {}", p.ep, p.expert_dp()) } else { String::new() },
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
        "\nMemory per GPU by pipeline stage (analytic; GPU has {}). Framework {}: {:.2} bytes per parameter at {} (weights {}, gradients {}, optimizer {}; whole + sharded/dp), gradients reduced in {}",
        common::bytes(r.gpu_memory_bytes as f64),
        s.training.framework.name(),
        layout.per_param(p.grad_ranks() as u32),
        if p.cp > 1 { format!("cp · dp {}", p.grad_ranks()) } else { format!("dp {}", p.dp) },
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
        "{:>5} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}  fits",
        "stage", "transient", "CUDA context", "NCCL", "allocator", "total", "simulated"
    );
    for st in &r.stages {
        let x = &st.strata_extra;
        let _ = writeln!(
            o,
            "{:>5} {:>10} {:>12} {:>10} {:>10} {:>10} {:>10}  {}",
            st.stage,
            common::bytes(x.transient_bytes),
            common::bytes(x.cuda_context_bytes),
            common::bytes(x.nccl_bytes),
            common::bytes(x.allocator_slack_bytes),
            common::bytes(st.total_bytes),
            st.simulated_bytes.map_or("-".to_string(), |b| common::bytes(b as f64)),
            if st.fits { "yes" } else { "NO" }
        );
    }
    match &r.simulation_error {
        None => {
            let _ = writeln!(
                o,
                "  fits: by the simulated plan's peak, the figure `strata simulate` reports (total is the analytic estimate)"
            );
        }
        Some(e) => {
            let _ = writeln!(o, "  fits: by the analytic estimate; the plan could not be simulated: {e}");
        }
    }
    // A job that does not fit has a stage that does not.
    if !r.fits
        && let Some(worst) = r.stages.iter().filter(|st| !st.fits).max_by(|a, b| a.need().total_cmp(&b.need()))
    {
        let _ = writeln!(
            o,
            "\nDoes not fit: stage {} needs {} more than the GPU's {}. Try more pipeline stages, a higher ZeRO stage, recompute = \"selective\" or \"full\", or a smaller micro_batch.",
            worst.stage,
            common::bytes(worst.need() - r.gpu_memory_bytes as f64),
            common::bytes(r.gpu_memory_bytes as f64)
        );
    }
    o
}
