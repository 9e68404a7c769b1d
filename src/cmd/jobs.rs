//! `strata simulate jobs.toml` on a multi-job file: several jobs on one cluster's fabric,
//! each job's step alone and with the others, and its slowdown.
//!
//! `simulate` hands a file with `[[job]]` tables here (`strata_models::scenario::jobs`
//! reads it); the simulation is `strata_sim::jobs::simulate_jobs`: full mode, the fabric
//! network, every job starting its step at t = 0.

use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use strata_models::plan;
use strata_models::scenario::jobs::{self, JobsFile};
use strata_sim::SimOptions;
use strata_sim::breakdown::Breakdown;
use strata_sim::jobs::{JobSpec, JobsReport};

use crate::cmd::simulate::{Args, ModeArg};
use crate::common;

/// Whether `path` is a multi-job file (an unreadable one is left to the scenario loader).
pub fn is_jobs_file(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| jobs::is_jobs_file(&t))
}

pub fn run(args: &Args, path: &Path) -> anyhow::Result<()> {
    if args.mode == ModeArg::Symmetric {
        anyhow::bail!(
            "--mode symmetric: a multi-job file runs in full mode (symmetric mode stands one stage for its job's identical groups and cannot see the other jobs' flows); drop --mode"
        );
    }
    if !matches!(args.sim.network.as_str(), "auto" | "fabric") {
        anyhow::bail!(
            "--network {}: a multi-job file runs on the fabric network, where the jobs' flows share links; drop --network",
            args.sim.network
        );
    }
    if args.trace.is_some() {
        anyhow::bail!("--trace is not available for a multi-job file; simulate one job's scenario to get its trace");
    }
    let file = jobs::load(path, &args.scenario.overrides)?;
    let plans = file
        .jobs
        .iter()
        .map(|j| plan::lower(&j.scenario).with_context(|| format!("job {}", j.name)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let specs: Vec<JobSpec<'_>> = file
        .jobs
        .iter()
        .zip(&plans)
        .map(|(j, p)| JobSpec { name: j.name.clone(), plan: p, nodes: j.nodes.clone() })
        .collect();
    let seed = args.sim.seed.unwrap_or(file.jobs[0].scenario.training.seed);
    let options = SimOptions { seed, profile: args.sim.profile()?, ..SimOptions::default() };
    let report = strata_sim::jobs::simulate_jobs(&file.cluster, &specs, &options)?;
    if args.json {
        common::print_json(&report)?;
    } else {
        print!("{}", text(&report, &file));
    }
    let over: Vec<&str> =
        report.jobs.iter().filter(|j| !j.alone.fits || !j.together.fits).map(|j| j.name.as_str()).collect();
    if !over.is_empty() {
        let msg = format!("jobs {} do not fit in GPU memory (exit code 3)", over.join(", "));
        return Err(common::OutOfMemoryVerdict(msg).into());
    }
    Ok(())
}

/// Nodes as ranges: 0-7, or 0,2,4 (at most 8 parts shown).
fn ranges(nodes: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let mut j = i;
        while j + 1 < nodes.len() && nodes[j + 1] == nodes[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", nodes[i], nodes[j]) } else { nodes[i].to_string() });
        i = j + 1;
    }
    if parts.len() > 8 {
        let n = parts.len();
        parts.truncate(7);
        parts.push(format!("… ({n} ranges)"));
    }
    parts.join(",")
}

fn parts(b: &Breakdown) -> [(&'static str, f64); 6] {
    [
        ("compute", b.compute),
        ("tp exposed", b.tp_exposed),
        ("dp exposed", b.dp_exposed),
        ("pp exposed", b.pp_exposed),
        ("bubble", b.bubble),
        ("optimizer", b.optimizer),
    ]
}

/// A value's serde name (`fat-tree`, `static`).
fn kebab<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The report as text.
pub fn text(r: &JobsReport, file: &JobsFile) -> String {
    let c = &r.cluster;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}: {} jobs on {} nodes × {} {} ({}, {}:1 oversubscribed, {} routing)",
        file.name,
        r.jobs.len(),
        c.nodes,
        c.gpus_per_node,
        c.gpu,
        kebab(&c.fabric),
        c.oversubscription,
        kebab(&c.routing)
    );
    let _ = writeln!(
        o,
        "simulated ({} network, {} profile, full mode, seed {}); each job also alone on the same nodes\n",
        r.network, r.profile, r.seed
    );
    let _ = writeln!(
        o,
        "{:<10} {:<24} {:<18} {:>5}  {:>10}  {:>10}  {:>8}",
        "job", "split", "nodes", "GPUs", "alone s", "together s", "slowdown"
    );
    for (j, job) in r.jobs.iter().zip(&file.jobs) {
        let p = &job.scenario.parallel;
        let split = format!("{} TP{}-PP{}-DP{}", job.scenario.model.name, p.tp, p.pp, p.dp);
        let _ = writeln!(
            o,
            "{:<10} {:<24} {:<18} {:>5}  {:>10.4}  {:>10.4}  {:>7.3}×",
            j.name,
            split,
            ranges(&j.nodes),
            j.gpus,
            j.alone.step_time_s,
            j.together.step_time_s,
            j.slowdown
        );
    }
    let _ = writeln!(o, "\nwhere the extra time went (the last rank's step, together − alone, s):");
    for j in &r.jobs {
        let alone = parts(&j.alone.breakdown_s);
        let with = parts(&j.together.breakdown_s);
        let diffs: Vec<String> = alone
            .iter()
            .zip(with)
            .filter(|((_, a), (_, w))| (w - a).abs() >= 5e-5)
            .map(|((name, a), (_, w))| format!("{name} {:+.4}", w - a))
            .collect();
        let d = if diffs.is_empty() { "nothing".to_string() } else { diffs.join(", ") };
        let _ = writeln!(o, "  {:<10} {d}", j.name);
    }
    for job in &file.jobs {
        if let Some(note) = &job.note {
            let _ = writeln!(o, "note: job {}: {note}", job.name);
        }
    }
    o
}
