//! `strata simulate`: one training step of a scenario through the discrete-event simulator
//! — step time, throughput, MFU, where the time goes, memory per stage and whether it
//! fits — and optionally its timeline as a Chrome/Perfetto trace.

use std::path::PathBuf;

use strata_models::plan;
use strata_sim::net::{self, NetworkKind};
use strata_sim::{HardwareProfile, Mode, SimOptions, SimReport};

use crate::common::{self, ScenarioArgs};

/// Options shared by the commands that simulate (simulate, search, compare).
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Network model: auto (the profile's measured network when it has one, else fabric),
    /// fabric (NCCL's algorithms as flows on the fat-tree, max-min sharing), closed-form (per
    /// link class, no contention) or calibrated (the profile's measured latency and bandwidth
    /// per collective, from strata calibrate).
    #[arg(long, default_value = "auto", value_parser = ["auto", "fabric", "closed-form", "calibrated"])]
    pub network: String,
    /// A hardware profile (TOML) instead of the built-in one of the cluster's GPU, e.g. one
    /// written by `strata calibrate`.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Seed of the simulator's randomness (static-routing hashes, jitter).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SimArgs {
    /// The chosen network; `None` for auto (what the profile implies).
    pub fn network_kind(&self) -> Option<NetworkKind> {
        match self.network.as_str() {
            "closed-form" => Some(NetworkKind::ClosedForm),
            "fabric" => Some(NetworkKind::Fabric),
            "calibrated" => Some(NetworkKind::Calibrated),
            _ => None,
        }
    }

    pub fn profile(&self) -> anyhow::Result<Option<HardwareProfile>> {
        self.profile.as_ref().map(|p| HardwareProfile::load(p).map_err(anyhow::Error::from)).transpose()
    }
}

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  strata simulate scenarios/gpt3-175b-1024xa100.toml --trace out/trace.json\n  strata simulate scenarios/gpt3-175b-1024xa100.toml --slow rank=17:1.3\n  strata simulate scenarios/gpt3-175b-1024xa100.toml --list-links spine3\n  strata simulate scenarios/gpt3-175b-1024xa100.toml --set cluster.routing=static --down spine3 --degrade link=leaf0-spine1:0.5\n  strata simulate scenarios/two-jobs-fat-tree.toml\n  strata simulate scenarios/two-jobs-fat-tree.toml --set cluster.routing=adaptive --set 'job.a.nodes=\"0-7\"' --set 'job.b.nodes=\"8-15\"'\n\nWhat-ifs (--slow, --degrade, --down, or a [faults] table in the scenario) run full mode: every rank is simulated, and synchronous training waits for the slowest. A rank, link or factor that does not exist or is out of range exits with code 2 naming it. A multi-job file (one with [[job]] tables, each a scenario placed on nodes of the file's shared [cluster]) runs every job at once on one fabric in full mode, then each alone on the same nodes, and reports each job's step time alone and together and its slowdown. --set reaches the shared cluster as cluster.KEY=VALUE and a job as job.NAME.KEY=VALUE."
)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    #[command(flatten)]
    pub sim: SimArgs,
    /// How many ranks to simulate: `symmetric` runs one rank per pipeline stage and counts
    /// the identical groups beside it; `full` runs every rank (slower, at most 4,096);
    /// `auto` (the default) runs symmetric where that is exact on the cluster's fabric and
    /// full where it is not (static routing, oversubscribed fat-tree / leaf-spine tiers),
    /// and the report says which it chose and why.
    #[arg(long, value_enum, default_value = "auto")]
    pub mode: ModeArg,
    /// Shorthand for `--mode full`.
    #[arg(long, conflicts_with = "mode")]
    pub full: bool,
    /// Write the step's timeline as Chrome/Perfetto JSON (open it in ui.perfetto.dev).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub what_if: crate::cmd::whatif::WhatIfArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(path) = &args.scenario.scenario
        && super::jobs::is_jobs_file(path)
    {
        if args.what_if.any() {
            anyhow::bail!(
                "{}: --slow, --degrade, --down and --list-links apply to one scenario, not to a multi-job file; simulate a job's scenario with them",
                path.display()
            );
        }
        return super::jobs::run(&args, path);
    }
    let mut s = args.scenario.load()?;
    let seed = args.sim.seed.unwrap_or(s.training.seed);
    if let Some(filter) = &args.what_if.list_links {
        return crate::cmd::whatif::list(&s, seed, filter, args.what_if.limit, args.json);
    }
    args.what_if.apply(&mut s)?;
    let plan = plan::lower(&s)?;
    let options = SimOptions {
        mode: if args.full { Mode::Full } else { args.mode.into() },
        seed,
        profile: args.sim.profile()?,
        trace: args.trace.is_some(),
        jitter: 0.0,
    };
    let profile = strata_sim::simulate::profile_of(&plan, &options);
    let links = net::faults::LinkFaults::of(&s.faults);
    let mut network = net::build_faulted(&s.cluster, seed, args.sim.network_kind(), &profile, &links)?;
    let report = strata_sim::simulate_with(&plan, &options, network.as_mut())?;
    if let (Some(path), Some(trace)) = (&args.trace, &report.trace) {
        let json = strata_reports::chrome_trace_json(&plan, trace);
        common::write_file(path, json)?;
        if !args.json {
            eprintln!("trace: {} (open it in ui.perfetto.dev)", path.display());
        }
    }
    if args.json {
        common::print_json(&report)?;
    } else {
        print!("{}", text(&report, &s));
    }
    if !report.fits {
        let over = &report.out_of_memory;
        let worst = over.iter().max_by_key(|o| (o.over_bytes, std::cmp::Reverse(o.stage)));
        let worst = worst.map(|o| format!("; the worst, {o}")).unwrap_or_default();
        let msg = format!(
            "the plan does not fit in GPU memory: {} of {} stages over{worst} (exit code 3)",
            over.len(),
            report.memory.len()
        );
        return Err(common::OutOfMemoryVerdict(msg).into());
    }
    Ok(())
}

/// The engine modes on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Auto,
    Symmetric,
    Full,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Auto => Mode::Auto,
            ModeArg::Symmetric => Mode::Symmetric,
            ModeArg::Full => Mode::Full,
        }
    }
}

/// The report as text.
pub fn text(r: &SimReport, s: &strata_models::Scenario) -> String {
    use std::fmt::Write;
    let p = &s.parallel;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} on {} × {}: TP({}){}{}-PP({})-DP({}), {}{}, mb {} × {} microbatches, ZeRO-{}{}, recompute {}, SP {}{}",
        s.model.name,
        s.cluster.gpus(),
        s.cluster.gpu,
        p.tp,
        if p.cp > 1 { format!("-CP({}, {})", p.cp, p.cp_comm.key()) } else { String::new() },
        if p.ep > 1 { format!("-EP({})", p.ep) } else { String::new() },
        p.pp,
        p.dp,
        p.schedule.key(),
        if p.vpp > 1 { format!(" (vpp {})", p.vpp) } else { String::new() },
        p.micro_batch,
        p.microbatches(),
        p.zero,
        if s.zero_stage() != p.zero {
            " (DeepSpeed runs BF16_Optimizer here: ZeRO-1's partition, bf16 gradient accumulation)"
        } else {
            ""
        },
        p.recompute.key(),
        if p.sequence_parallel { "on" } else { "off" },
        if s.training.dtype == strata_models::Dtype::Fp8 { ", fp8" } else { "" }
    );
    let _ = writeln!(
        o,
        "simulated ({} network, {} profile, {:?} mode, seed {}, {} events)\n",
        r.network, r.profile, r.mode, r.seed, r.events
    );
    if let Some(note) = &r.mode_note {
        let _ = writeln!(o, "  ({note})");
    }
    let what_ifs = !s.faults.step_is_fault_free();
    if what_ifs {
        let _ = writeln!(o, "what-ifs: {}\n", strata_sim::simulate::what_ifs(&s.faults));
    }
    let _ = writeln!(o, "step time        {:>10.4} s", r.step_time_s);
    let _ = writeln!(o, "throughput       {:>10} tokens/s", common::count(r.tokens_per_s));
    // CPU ranks run at GFLOP/s; say so rather than print 0.0 TFLOP/s.
    let (scale, unit) = if r.hardware_tflops_per_gpu < 1.0 { (1e3, "GFLOP/s") } else { (1.0, "TFLOP/s") };
    let _ = writeln!(o, "model {unit}    {:>10.1} per GPU (MFU {:.1}%)", r.model_tflops_per_gpu * scale, 100.0 * r.mfu);
    let _ =
        writeln!(o, "hardware {unit} {:>10.1} per GPU (HFU {:.1}%)", r.hardware_tflops_per_gpu * scale, 100.0 * r.hfu);
    let b = &r.breakdown_s;
    let _ = writeln!(o, "\nwhere the time goes (rank {}, stage {}, the last to finish):", r.last_rank, r.last_stage);
    // The expert and context-parallel lines only where the model has experts / the split cp.
    let moe = s.model.moe.is_some();
    let cp = s.parallel.cp > 1;
    for (name, v, shown) in [
        ("compute", b.compute, true),
        ("tensor-parallel exposed", b.tp_exposed, true),
        ("data-parallel exposed", b.dp_exposed, true),
        ("pipeline transfers exposed", b.pp_exposed, true),
        ("expert all-to-all exposed", b.ep_exposed, moe),
        ("context-parallel exposed", b.cp_exposed, cp),
        ("MoE imbalance", b.moe_imbalance, moe),
        ("host-bound", b.host_bound, b.host_bound > 0.0),
        (if what_ifs { "bubble, waiting on peers" } else { "pipeline bubble" }, b.bubble, true),
        ("optimizer", b.optimizer, true),
    ] {
        if shown {
            let _ = writeln!(o, "  {name:<27} {v:>10.4} s {:>6.1}%", 100.0 * v / r.step_time_s.max(f64::MIN_POSITIVE));
        }
    }
    if b.host_bound > 0.0 {
        let _ = writeln!(
            o,
            "  (host-bound: the GPU waits for {}'s host work — ZeRO-3's module hooks and per-rank fetch views)",
            s.training.framework.name()
        );
    }
    if moe && let Some(g) = strata_sim::router::model_gini(&s.model) {
        let _ = writeln!(o, "  (router imbalance: Gini {g} of tokens over experts, drawn per layer and microbatch)");
    }
    if let Some(w) = &r.most_waiting {
        let b = &w.breakdown_s;
        let _ = writeln!(
            o,
            "the rank that waited longest on its peers: rank {} (stage {}): waiting {:.4} s, compute {:.4} s, exposed TP {:.4} / DP {:.4} / PP {:.4} s",
            w.rank, w.stage, b.bubble, b.compute, b.tp_exposed, b.dp_exposed, b.pp_exposed
        );
    }
    let _ = writeln!(o, "\nmemory per GPU (peak of buffers + CUDA context + NCCL + allocator slack):");
    for m in &r.memory {
        let _ = writeln!(
            o,
            "  stage {:>3}: {:>10} of {:>10}  (buffers {}, context {}, NCCL {}, slack {})",
            m.stage,
            common::bytes(m.peak_bytes as f64),
            common::bytes(m.capacity_bytes as f64),
            common::bytes(m.buffers_bytes as f64),
            common::bytes(m.cuda_context_bytes as f64),
            common::bytes(m.nccl_bytes as f64),
            common::bytes(m.fragmentation_bytes as f64)
        );
    }
    if r.fits {
        let _ = writeln!(o, "fits: yes");
    } else {
        for oom in &r.out_of_memory {
            let _ = writeln!(o, "DOES NOT FIT: {oom}");
        }
    }
    o
}
