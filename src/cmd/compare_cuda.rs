//! `strata compare --backend cuda`: the scenario's plan simulated with the GPU's profile
//! (`--profile`, else the built-in one of the cluster's GPU) and trained on one GPU by the
//! CUDA executor — the warm-up steps left out, the last step traced from CUDA events — into
//! the same report inputs and report as on CPU (`compare::write`).
//! One plan, one GPU: `--plan`, `--search` and `--runs` > 1 are the CPU path's (exit 2).

use std::sync::Arc;

use anyhow::{Context, bail};
use strata_models::hardware::GpuKind;
use strata_reports::{ComparisonSet, PlanComparison, ReportInputs};
use strata_runtime::cuda::exec::train::train_cuda;
use strata_runtime::train::synthetic_corpus;
use strata_sim::HardwareProfile;

use super::compare::{Args, LoopConfig, predict, table, write};
use crate::common::{self, RunFailure};

pub fn run(args: Args, ordinal: usize) -> anyhow::Result<()> {
    if !args.plan.is_empty() || args.search.is_some() || args.runs > 1 {
        bail!(
            "--plan, --search and --runs > 1 are not available with --backend cuda yet (one plan on one GPU); use --backend cpu"
        );
    }
    if args.steps == 0 {
        bail!("--steps 0: measure at least one step");
    }
    let s = args.scenario.load()?;
    if s.cluster.gpu == GpuKind::Cpu {
        bail!(
            "--backend cuda compares a GPU cluster's plan, but the scenario's cluster is cpu-local; use a GPU scenario, e.g. scenarios/gpt2-124m-1xh200.toml"
        );
    }
    let profile = args.sim.profile()?.unwrap_or_else(|| HardwareProfile::builtin(s.cluster.gpu));
    let cfg = LoopConfig {
        title: format!("{} on one {} (CUDA executor)", s.model.name, s.cluster.gpu.key()),
        plans: vec![s.clone()],
        profile,
        network: args.sim.network_kind(),
        steps: args.steps,
        warmup: args.warmup,
        runs: 1,
        landscape: None,
        retries: 0,
    };
    let (trace, plan) = predict(&s, &cfg)?;
    strata_runtime::cuda::exec::rank::check_plan(&plan).map_err(anyhow::Error::new)?;
    common::create_dir(&args.out)?;
    let (corpus, _, _) = synthetic_corpus(s.model.vocab, s.training.seed)?;
    let opts = super::compare::measure_options(&cfg);
    let (r, gpu) = train_cuda(Arc::new(plan.clone()), ordinal, Arc::new(corpus), &opts, None)
        .map_err(|e| RunFailure(format!("training {} on GPU {ordinal}: {e}", s.name)))?;
    let seconds: Vec<f64> = r.steps.iter().skip(cfg.warmup as usize).map(|x| x.seconds).collect();
    let measured = r.trace.context("the GPU run recorded no trace")?;
    let p = PlanComparison::from_traces(&s.name, plan, trace, measured, seconds);
    if !args.json {
        eprintln!(
            "{}: predicted {:.4} s, measured {:.4} s ({:+.1}%) on GPU {ordinal} ({gpu})",
            p.name,
            p.predicted_step_s,
            p.measured_step_s(),
            100.0 * p.step_error()
        );
    }
    let inputs =
        ReportInputs { title: cfg.title.clone(), comparisons: ComparisonSet { plans: vec![p] }, landscape: None };
    let files = write(&args.out, &inputs)?;
    if args.json {
        return common::print_json(&serde_json::json!({
            "accuracy": files.accuracy,
            "report": files.html,
            "gpu": gpu,
            "plans": inputs.comparisons.plans.iter().map(PlanComparison::without_timelines).collect::<Vec<_>>(),
            "memory": r.memory,
        }));
    }
    print!("{}", table(&inputs.comparisons));
    for m in &r.memory {
        if let Some(line) = super::train::overhead_line(&m.peaks) {
            println!("rank {} peak memory: {line}", m.rank);
        }
    }
    println!("report: {}", files.html.display());
    Ok(())
}
