//! `strata compare`: run plans both ways — simulated with a hardware profile, and trained
//! for real on CPU ranks for a few steps — and write everything `strata report` needs
//! (`strata_reports::save_inputs`), then the report itself.
//!
//! The plans are the scenario's own split, the splits given with `--plan`, or the best
//! `--search K` of a search over the scenario's model and cluster (whose landscape then
//! goes into the report too). Without `--profile`, the machine is calibrated first
//! (`strata calibrate --quick`) and the profile is written beside the results.
//!
//! Per plan: the simulated step (every rank, with its timeline) gives the prediction; the
//! real run's first `--warmup` steps are left out and the rest are the measured steps (the
//! report takes their median); the last step is traced. Both timelines and the plan go
//! into `PlanComparison::from_traces`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use strata_models::Scenario;
use strata_models::plan::{Plan, lower, verify};
use strata_models::trace::Trace;
use strata_reports::{
    ComparisonSet, LandscapeCell, PlanComparison, ReportInputs, SearchLandscape, build_report, save_inputs,
};
use strata_runtime::calibrate::CpuMeter;
use strata_runtime::data::Corpus;
use strata_runtime::exec::ExecConfig;
use strata_runtime::train::{TrainOptions, synthetic_corpus, train_threads};
use strata_sim::net::{self, NetworkKind};
use strata_sim::search::{self, SearchOptions, SearchResult, SearchSpace};
use strata_sim::{HardwareProfile, Mode, SimOptions};

use crate::cmd::calibrate::{self, Effort};
use crate::cmd::quiet::{self, QuietWait, Waited};
use crate::cmd::simulate::SimArgs;
use crate::common::{self, RunFailure, ScenarioArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Where the plan runs: cpu (CPU ranks, threads of this process) or cuda (one GPU of a
    /// build with `--features cuda`: the scenario's one-rank plan, simulated with the GPU's
    /// profile and trained by the CUDA executor; otherwise it says what is missing).
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda")]
    pub backend: String,
    #[command(flatten)]
    pub sim: SimArgs,
    /// A split to run, as comma-separated parallel keys: `tp=2,pp=2,dp=2,schedule=1f1b,
    /// micro_batch=2,zero=1` (the rest from the scenario). Repeatable.
    #[arg(long, value_name = "KEY=VALUE,…")]
    pub plan: Vec<String>,
    /// Search the scenario's model and cluster and run the best K splits (one per tensor-
    /// and pipeline-parallel size); the report gets the search landscape.
    #[arg(long, value_name = "K")]
    pub search: Option<usize>,
    /// Measured steps per plan and run (the median of all runs' steps is the measurement).
    #[arg(long, default_value_t = 3)]
    pub steps: u32,
    /// Runs per plan, each starting its rank threads afresh.
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// Steps run first and left out (allocation, caches).
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Results directory: comparisons.json, landscape.csv, plans/…, the profile, and the
    /// report in DIR/report (an earlier run's results there are replaced).
    #[arg(long, value_name = "DIR", default_value = "out/compare")]
    pub out: PathBuf,
    /// Print the accuracy figures and every plan's numbers as JSON.
    #[arg(long)]
    pub json: bool,
    /// Measure a plan again (up to this many times) when other processes took more than
    /// a tenth of the machine's CPU while it trained, after waiting for the machine to be
    /// quiet (within --max-wait).
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
    /// Seconds this run may wait for a quiet machine, every wait together; then it measures
    /// anyway and marks the plans measured on a busy machine.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub max_wait: u64,
    /// Never wait for a quiet machine (also: STRATA_NO_WAIT=1).
    #[arg(long)]
    pub no_wait: bool,
}

/// What one loop run is: plans, how to predict them, how long to measure.
pub struct LoopConfig {
    pub title: String,
    pub plans: Vec<Scenario>,
    pub profile: HardwareProfile,
    pub network: Option<NetworkKind>,
    pub steps: u32,
    pub warmup: u32,
    /// Runs per plan (each with its warm-up); their measured steps are pooled.
    pub runs: u32,
    pub landscape: Option<SearchLandscape>,
    /// Re-measurements allowed per plan when other processes loaded the machine.
    pub retries: u32,
}

/// Above this share of the machine's CPU taken by other processes, a measurement is loaded.
pub use crate::cmd::quiet::LOADED;

pub fn run(args: Args) -> anyhow::Result<()> {
    let backend = super::gpu::executor_backend("strata compare", &args.backend)?;
    #[cfg(feature = "cuda")]
    if let super::gpu::Backend::Cuda { ordinal } = backend {
        return super::compare_cuda::run(args, ordinal);
    }
    let _ = backend;
    // With --plan or --search the plans bring their own splits, so the scenario's need not
    // fit its cluster (`--set cluster.gpus_per_node=2 --plan tp=2,pp=1,dp=1` must not be
    // refused for the default's tp 2 · pp 2 · dp 2); every plan is checked in full.
    let base = if args.plan.is_empty() && args.search.is_none() {
        args.scenario.load()?
    } else {
        args.scenario.load_for_search()?
    };
    let ranks = base.cluster.gpus();
    calibrate::require_cpu(&base)?;
    if args.steps == 0 {
        bail!("--steps 0: measure at least one step");
    }
    if args.plan.is_empty() && args.search == Some(0) {
        bail!("--search 0 runs no plan; give K ≥ 1");
    }
    let mut plans = Vec::new();
    for spec in &args.plan {
        plans.push(with_split(&base, spec)?);
    }
    let quiet = args.json;
    let mut log = |line: String| {
        if !quiet {
            eprintln!("{line}");
        }
    };
    common::create_dir(&args.out)?;
    let profile = match args.sim.profile()? {
        Some(p) => p,
        None => {
            let ranks = ranks as u32;
            // The context-parallel pieces where a plan has cp, or the search may pick it.
            let searched = args.search.is_some() && SearchSpace::full(&base).cp.iter().any(|c| *c > 1);
            let cp = searched || base.parallel.cp > 1 || plans.iter().any(|p: &Scenario| p.parallel.cp > 1);
            let (p, _) = calibrate::calibrate(&base, ranks, Effort::for_plans(true, cp), &mut log)?;
            let path = args.out.join("profile.toml");
            common::write_file(&path, calibrate::profile_text(&p, &base, ranks))?;
            log(format!("compare: calibrated this machine; profile in {}", path.display()));
            p
        }
    };
    let mut landscape = None;
    if let Some(k) = args.search {
        let (result, top) = search_top(&base, &profile, args.sim.network_kind(), k, &mut log)?;
        landscape = Some(landscape_of(&result));
        plans.extend(top);
    }
    if plans.is_empty() {
        if args.search.is_some() {
            bail!("the search found no split of {} that fits {ranks} CPU ranks", base.model.name);
        }
        plans.push(base.clone());
    }
    let cfg = LoopConfig {
        title: format!("{} on {ranks} CPU ranks", base.model.name),
        plans,
        profile,
        network: args.sim.network_kind(),
        steps: args.steps,
        warmup: args.warmup,
        runs: args.runs,
        landscape,
        retries: args.retries,
    };
    let mut wait = QuietWait::new(Duration::from_secs(args.max_wait), args.no_wait);
    let (inputs, loads) = compare(&cfg, &mut wait, &mut log)?;
    let files = write(&args.out, &inputs)?;
    if args.json {
        return common::print_json(&serde_json::json!({
            "accuracy": files.accuracy,
            "report": files.html,
            "plans": inputs.comparisons.plans.iter().map(PlanComparison::without_timelines).collect::<Vec<_>>(),
            "foreign_cpu_share": loads,
        }));
    }
    print!("{}", table(&inputs.comparisons));
    for note in quiet::busy_notes(inputs.comparisons.plans.iter().map(|p| p.name.as_str()), &loads) {
        println!("{note}");
    }
    println!("report: {}", files.html.display());
    Ok(())
}

/// The base scenario with a split given as `tp=2,pp=2,…` (keys of the `[parallel]` table).
pub fn with_split(base: &Scenario, spec: &str) -> anyhow::Result<Scenario> {
    let mut sets = Vec::new();
    for kv in spec.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--plan {spec:?}: {kv:?} is not KEY=VALUE (e.g. tp=2,pp=2,dp=2,zero=1)");
        };
        let key = match k.trim() {
            "mb" => "micro_batch",
            "sp" => "sequence_parallel",
            other => other,
        };
        sets.push(format!("parallel.{key}={}", v.trim()));
    }
    let text = base.to_toml();
    let mut s = Scenario::from_toml(&text, &format!("--plan {spec}"), &base.name, &sets)?;
    if s.parallel.ranks() != base.cluster.gpus() {
        bail!(
            "--plan {spec:?} has tp · cp · pp · dp = {} ranks but the cluster has {}; keep the product",
            s.parallel.ranks(),
            base.cluster.gpus()
        );
    }
    // The search's label names every split key, cp and its exchange among them.
    s.name = search::label(&s.parallel);
    Ok(s)
}

/// Searches the split space of `base` (every candidate simulated) and returns the best
/// split of each (tp, pp), best first, at most `k`.
pub fn search_top(
    base: &Scenario,
    profile: &HardwareProfile,
    network: Option<NetworkKind>,
    k: usize,
    log: &mut dyn FnMut(String),
) -> anyhow::Result<(SearchResult, Vec<Scenario>)> {
    let mut opts = SearchOptions::new(base);
    opts.space = SearchSpace::splits(base);
    opts.exhaustive = true;
    opts.profile = Some(profile.clone());
    opts.network = network;
    let t = Instant::now();
    let r = search::search(base, &opts, &|_, _, _| {})?;
    log(format!(
        "search: {} valid splits, {} simulated in {:.1} s; best {}",
        r.valid,
        r.simulated,
        t.elapsed().as_secs_f64(),
        r.best().map_or("none fits".to_string(), |b| b.label.clone())
    ));
    let mut cells = std::collections::BTreeSet::new();
    let mut top = Vec::new();
    for &i in &r.ranking {
        let c = &r.candidates[i];
        if top.len() < k && cells.insert((c.scenario.parallel.tp, c.scenario.parallel.pp)) {
            let mut s = c.scenario.clone();
            s.name = c.label.clone();
            top.push(s);
        }
    }
    Ok((r, top))
}

/// Best simulated throughput per (tp, pp), or why there is none.
pub fn landscape_of(r: &SearchResult) -> SearchLandscape {
    let mut best: std::collections::BTreeMap<(u32, u32), LandscapeCell> = std::collections::BTreeMap::new();
    for c in &r.candidates {
        let key = (c.scenario.parallel.tp, c.scenario.parallel.pp);
        let cell = best.entry(key).or_insert_with(|| LandscapeCell {
            tp: key.0,
            pp: key.1,
            tokens_per_s: None,
            label: "out of memory".into(),
        });
        if let Some(t) = c.tokens_per_s()
            && cell.tokens_per_s.is_none_or(|b| t > b)
        {
            cell.tokens_per_s = Some(t);
            let p = &c.scenario.parallel;
            cell.label = format!("dp{} {} mb{} z{}", p.dp, p.schedule.key(), p.micro_batch, p.zero);
        }
    }
    SearchLandscape { cells: best.into_values().collect() }
}

/// Runs every plan both ways. Returns the report's inputs and, per plan, the largest share
/// of the machine's CPU that other processes took while it trained (`None` where not
/// measurable). With several runs per plan the runs go round-robin over the plans, so a
/// machine that drifts (a busy host) shifts every plan alike, not the last ones only.
/// A loaded measurement is taken again (up to `cfg.retries` times) only after `wait` found
/// the machine quiet; with the wait's budget spent it stands, and the report's title says
/// the plans were measured on a busy machine.
pub fn compare(
    cfg: &LoopConfig,
    wait: &mut QuietWait,
    log: &mut dyn FnMut(String),
) -> anyhow::Result<(ReportInputs, Vec<Option<f64>>)> {
    let mut corpora: Vec<((u32, u64), Arc<Corpus>)> = Vec::new();
    let mut predicted = Vec::new();
    for s in &cfg.plans {
        let key = (s.model.vocab, s.training.seed);
        if !corpora.iter().any(|(k, _)| *k == key) {
            let (c, _, _) = synthetic_corpus(s.model.vocab, s.training.seed)?;
            corpora.push((key, Arc::new(c)));
        }
        predicted.push(predict(s, cfg)?);
    }
    let n = cfg.plans.len();
    let mut runs: Vec<Vec<Measured>> = vec![Vec::new(); n];
    for round in 0..cfg.runs.max(1) {
        for (i, s) in cfg.plans.iter().enumerate() {
            let corpus = corpora
                .iter()
                .find(|(k, _)| *k == (s.model.vocab, s.training.seed))
                .map(|(_, c)| c.clone())
                .with_context(|| format!("no corpus was made for plan {}", s.name))?;
            let mut attempt = 0;
            let m = loop {
                let meter = CpuMeter::now();
                let m = measure_run(s, cfg, corpus.clone(), &predicted[i].1)?;
                let load = meter.and_then(|m| m.foreign_share());
                if load.is_none_or(|l| l <= LOADED) || attempt >= cfg.retries {
                    break Measured { load, ..m };
                }
                attempt += 1;
                log(format!(
                    "[{}/{n}] {}: other processes took {:.0}% of the CPU while it trained",
                    i + 1,
                    s.name,
                    100.0 * load.unwrap_or(0.0)
                ));
                if wait.wait("measuring it again", log) != Waited::Quiet {
                    log(format!(
                        "[{}/{n}] {}: keeping this measurement, marked as taken on a busy machine",
                        i + 1,
                        s.name
                    ));
                    break Measured { load, ..m };
                }
            };
            if cfg.runs > 1 {
                log(format!(
                    "[{}/{n}] run {}/{}: {} — {:.3} s per step",
                    i + 1,
                    round + 1,
                    cfg.runs,
                    s.name,
                    median(&m.seconds)
                ));
            }
            runs[i].push(m);
        }
    }
    let mut plans = Vec::new();
    let mut loads = Vec::new();
    for (i, ((trace, plan), mut r)) in predicted.into_iter().zip(runs).enumerate() {
        let last = r.pop().context("a plan was measured no times")?;
        let mut seconds: Vec<f64> = r.iter().flat_map(|m| m.seconds.iter().copied()).collect();
        seconds.extend(&last.seconds);
        let load = r
            .iter()
            .chain([&last])
            .filter_map(|m| m.load)
            .fold(None, |a: Option<f64>, l| Some(a.map_or(l, |a| a.max(l))));
        let p = PlanComparison::from_traces(&cfg.plans[i].name, plan, trace, last.trace, seconds);
        log(format!(
            "[{}/{n}] {:<36} predicted {:.3} s, measured {:.3} s ({:+.1}%){}",
            i + 1,
            p.name,
            p.predicted_step_s,
            p.measured_step_s(),
            100.0 * p.step_error(),
            match load {
                Some(l) if l > LOADED => format!("  [other processes took {:.0}% of the CPU]", 100.0 * l),
                _ => String::new(),
            }
        ));
        plans.push(p);
        loads.push(load);
    }
    let title = match quiet::worst(&loads).filter(|l| *l > LOADED) {
        Some(l) => format!(
            "{} — measured on a busy machine (other processes took up to {:.0}% of the CPU)",
            cfg.title,
            100.0 * l
        ),
        None => cfg.title.clone(),
    };
    let inputs = ReportInputs { title, comparisons: ComparisonSet { plans }, landscape: cfg.landscape.clone() };
    Ok((inputs, loads))
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One run of a plan: its measured steps (warm-up left out) and its traced step.
#[derive(Clone)]
struct Measured {
    seconds: Vec<f64>,
    trace: Trace,
    load: Option<f64>,
}

/// One plan, lowered and simulated (every rank, with its timeline).
pub(super) fn predict(s: &Scenario, cfg: &LoopConfig) -> anyhow::Result<(Trace, Plan)> {
    let plan = lower(s)?;
    verify(&plan).with_context(|| format!("the plan of {} does not verify", s.name))?;
    let options = SimOptions {
        mode: Mode::Full,
        seed: s.training.seed,
        profile: Some(cfg.profile.clone()),
        trace: true,
        jitter: 0.0,
    };
    let mut network = net::build_for(&s.cluster, options.seed, cfg.network, &cfg.profile)?;
    let sim = strata_sim::simulate_with(&plan, &options, network.as_mut())?;
    Ok((sim.trace.context("the simulator recorded no trace")?, plan))
}

/// How a measured run trains, on either backend: the warm-up and measured steps on the
/// synthetic corpus, the last step traced.
pub(super) fn measure_options(cfg: &LoopConfig) -> TrainOptions {
    let steps = cfg.warmup + cfg.steps;
    TrainOptions {
        steps,
        data_name: "synthetic".into(),
        checkpoint: None,
        exec: ExecConfig { recv_timeout: Duration::from_secs(300), trace_step: Some(steps - 1) },
        faults: Vec::new(),
    }
}

/// One run of a plan, trained for real: a warm-up, then the measured steps; the last is
/// traced.
fn measure_run(s: &Scenario, cfg: &LoopConfig, corpus: Arc<Corpus>, plan: &Plan) -> anyhow::Result<Measured> {
    let opts = measure_options(cfg);
    let r = train_threads(Arc::new(plan.clone()), corpus, &opts, None)
        .map_err(|e| RunFailure(format!("training {}: {e}", s.name)))?;
    Ok(Measured {
        seconds: r.steps.iter().skip(cfg.warmup as usize).map(|x| x.seconds).collect(),
        trace: r.trace.context("the run recorded no trace")?,
        load: None,
    })
}

/// Writes the inputs and builds the report in `dir/report`, after removing what an earlier
/// run wrote there (only those names: a stale landscape or plan would enter the report).
pub fn write(dir: &Path, inputs: &ReportInputs) -> anyhow::Result<strata_reports::ReportFiles> {
    use strata_reports::input_dir::{COMPARISONS, LANDSCAPE};
    for name in [COMPARISONS, LANDSCAPE] {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RunFailure(format!("removing the earlier {}: {e}", dir.join(name).display())).into());
            }
            _ => {}
        }
    }
    for name in ["plans", "report"] {
        match std::fs::remove_dir_all(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(RunFailure(format!("removing the earlier {}: {e}", dir.join(name).display())).into());
            }
            _ => {}
        }
    }
    save_inputs(dir, inputs).map_err(|e| RunFailure(format!("writing the results: {e}")))?;
    let files = build_report(dir, &dir.join("report")).map_err(|e| RunFailure(format!("building the report: {e}")))?;
    Ok(files)
}

/// Predicted against measured, one line per plan, and the accuracy figures.
pub fn table(set: &ComparisonSet) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<40} {:>11} {:>11} {:>8} {:>12} {:>12} {:>8}",
        "plan", "predicted s", "measured s", "error", "pred. peak", "meas. peak", "error"
    );
    for p in &set.plans {
        let peak = |v: &[strata_reports::RankBytes]| v.iter().map(|r| r.bytes).max().unwrap_or(0);
        let (pp, mp) = (peak(&p.predicted_peak_bytes), peak(&p.measured_peak_bytes));
        let _ = writeln!(
            o,
            "{:<40} {:>11.3} {:>11.3} {:>7.1}% {:>12} {:>12} {:>7.1}%",
            p.name,
            p.predicted_step_s,
            p.measured_step_s(),
            100.0 * p.step_error(),
            common::bytes(pp as f64),
            common::bytes(mp as f64),
            100.0 * (pp as f64 / mp.max(1) as f64 - 1.0)
        );
    }
    let a = strata_reports::accuracy(set);
    let _ = writeln!(o, "median step-time error: {:.1}%", 100.0 * a.median_abs_step_error);
    let _ = writeln!(o, "worst step-time error: {:.1}%", 100.0 * a.max_abs_step_error);
    if let Some(m) = a.max_abs_peak_memory_error {
        let _ = writeln!(o, "worst peak-memory error (any rank): {:.1}%", 100.0 * m);
    }
    if let Some(t) = a.kendall_tau {
        let _ = writeln!(o, "Kendall tau (predicted vs measured ranking): {t:.2}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_brings_its_own_split_to_a_resized_cluster() {
        // The default's tp 2 · pp 2 · dp 2 does not fit 2 ranks; the plans' splits do.
        let set = ["cluster.gpus_per_node=2".to_string()];
        assert!(Scenario::from_toml(common::DEFAULT_SCENARIO, "d", "d", &set).is_err());
        let base = Scenario::from_toml_for_search(common::DEFAULT_SCENARIO, "d", "d", &set).unwrap();
        let s = with_split(&base, "tp=2,pp=1,dp=1").unwrap();
        assert_eq!((s.parallel.tp, s.parallel.pp, s.parallel.dp), (2, 1, 1));
        // A plan that keeps the scenario's other keys must still fit, and says which plan.
        let e = with_split(&base, "tp=2").unwrap_err().to_string();
        assert!(e.contains("--plan tp=2") && e.contains("2 GPUs"), "{e}");
    }
}
