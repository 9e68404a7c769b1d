//! `strata goodput`: a Monte Carlo of a multi-week run. The scenario's step is simulated
//! once; `sim::goodput` then runs the job for `--days` of failure-free training against
//! seeded failures (`[faults.failures]`, Llama 3's published rates by default) at a sweep
//! of checkpoint intervals, and this module prints goodput, the time to train with its
//! confidence interval, lost GPU-hours by cause, Young's and Daly's intervals beside the
//! best one found, and writes CSV and the goodput-vs-interval plot.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use strata_models::limits::{MAX_GOODPUT_DAYS, MAX_GOODPUT_INTERVALS, MAX_GOODPUT_TRIALS};
use strata_models::plan;
use strata_sim::SimOptions;
use strata_sim::goodput::{self, GoodputResult, Inputs, McOptions};

use super::goodput_text::text;
use super::simulate::SimArgs;
use crate::common::{self, ScenarioArgs};

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:
  strata goodput scenarios/llama3-405b-16384xh100.toml
  strata goodput scenarios/llama3-405b-16384xh100.toml --days 54 --trials 2000 --out out/goodput
  strata goodput scenarios/llama3-405b-16384xh100.toml --interval 5m,30m,2h
  strata goodput scenarios/llama3-405b-16384xh100.toml --set faults.failures.checkpoint.mode=async
  strata goodput scenarios/llama3-405b-16384xh100.toml --set faults.failures.gpu.distribution=weibull \\
      --set faults.failures.gpu.shape=0.8
  # Daly's setting: one exponential process and constant costs
  strata goodput scenarios/tiny-gpt-cpu.toml --step-time 1 --set faults.failures.rates=none \\
      --set faults.failures.job.mtbf_hours=3 --set faults.failures.checkpoint.save_s=60 \\
      --set faults.failures.restart.detect_s=600 --set faults.failures.restart.reschedule_s=0 \\
      --set faults.failures.restart.init_s=0 --set faults.failures.restart.load_s=0

Failures, checkpoint and restart costs come from the scenario's [faults.failures] table;
every key is optional and defaults to a published figure (docs/goodput.md lists them with
their sources). A failure at any moment loses the work since the last durable checkpoint.")]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Network model, hardware profile and seed of the step's simulation; the seed (default:
    /// the scenario's training.seed) also seeds the Monte Carlo.
    #[command(flatten)]
    pub sim: SimArgs,
    /// Failure-free training time to run, days (the work; the wall time is what it takes).
    #[arg(long, default_value_t = 30.0, conflicts_with = "steps")]
    pub days: f64,
    /// The work as a number of training steps instead of days.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Independent runs of the job; each tries every interval on the same failures.
    #[arg(long, default_value_t = 1000)]
    pub trials: u64,
    /// Checkpoint intervals to try: a comma list of durations of training (`90s`, `10m`,
    /// `1.5h`) or step counts (`500steps`). Default: 17 intervals from ¼ to 4 × Daly's τ_opt,
    /// and the scenario's own `checkpoint.interval_s`.
    #[arg(long, value_name = "LIST")]
    pub interval: Option<String>,
    /// The step time in seconds, instead of simulating the scenario's step.
    #[arg(long, value_name = "SECONDS")]
    pub step_time: Option<f64>,
    /// Write goodput.csv, losses.csv and the plot goodput.png / goodput.svg here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the inputs and the figures as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct JsonOut<'a> {
    scenario: &'a str,
    inputs: &'a Inputs,
    #[serde(flatten)]
    result: &'a GoodputResult,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_args(&args)?;
    let s = args.scenario.load()?;
    let seed = args.sim.seed.unwrap_or(s.training.seed);
    let step_s = match args.step_time {
        Some(t) => t,
        None => simulate_step(&s, &args.sim, seed)?,
    };
    let work_s = match args.steps {
        Some(n) => n as f64 * step_s,
        None => args.days * 86_400.0,
    };
    let inputs = Inputs::of(&s, step_s, work_s);
    let m = inputs.job_mtbf_s();
    let best_daly = inputs.daly_efficiency(inputs.daly_tau_s());
    if best_daly < 1.0 / goodput::mc::WALL_CAP_FACTOR as f64 {
        bail!(
            "the job cannot make progress: its MTBF ({:.3} h) is too short against a restart of {:.0} s and a save \
             of {:.1} s (Daly's best efficiency {:.4}); lower the failure rates in [faults.failures] or the costs",
            m / 3600.0,
            inputs.restart.total_s(),
            inputs.save.block_s(),
            best_daly
        );
    }
    let intervals = intervals(&args, &inputs)?;
    let opts = McOptions { trials: args.trials as u32, seed, intervals_steps: intervals };
    let bar = progress_bar(args.trials, args.json)?;
    let result = goodput::monte_carlo(&inputs, &opts, &|done| bar.set_position(done));
    bar.finish_and_clear();
    let written = match &args.out {
        Some(dir) => write_out(dir, &s.name, &inputs, &result)?,
        None => Vec::new(),
    };
    if args.json {
        return common::print_json(&JsonOut { scenario: &s.name, inputs: &inputs, result: &result });
    }
    print!("{}", text(&s, &inputs, &result));
    if let Some(dir) = &args.out {
        println!("\nwrote {}: {}", dir.display(), written.join(", "));
    }
    Ok(())
}

fn check_args(a: &Args) -> anyhow::Result<()> {
    if !(a.days > 0.0 && a.days <= MAX_GOODPUT_DAYS) {
        bail!("--days {} must be a number of days in (0, {MAX_GOODPUT_DAYS}] (see docs/limits.md)", a.days);
    }
    if !(1..=MAX_GOODPUT_TRIALS).contains(&a.trials) {
        bail!("--trials {} must be in [1, {MAX_GOODPUT_TRIALS}] (see docs/limits.md)", a.trials);
    }
    if let Some(t) = a.step_time
        && !(t > 0.0 && t.is_finite() && t <= 1e6)
    {
        bail!("--step-time {t} must be a positive number of seconds, at most 1e6");
    }
    if a.steps == Some(0) {
        bail!("--steps 0: the run needs at least one step");
    }
    Ok(())
}

fn simulate_step(s: &strata_models::Scenario, sim: &SimArgs, seed: u64) -> anyhow::Result<f64> {
    let plan = plan::lower(s)?;
    let options = SimOptions { mode: strata_sim::Mode::Auto, seed, profile: sim.profile()?, trace: false, jitter: 0.0 };
    let profile = strata_sim::simulate::profile_of(&plan, &options);
    let mut network = strata_sim::net::build_for(&s.cluster, seed, sim.network_kind(), &profile)?;
    let report = strata_sim::simulate_with(&plan, &options, network.as_mut())?;
    Ok(report.step_time_s)
}

/// The intervals to try, in whole steps, sorted and without repeats.
fn intervals(args: &Args, inputs: &Inputs) -> anyhow::Result<Vec<u64>> {
    let max_steps = ((inputs.work_s / inputs.step_s).ceil() as u64).max(1);
    let mut steps: Vec<u64> = match &args.interval {
        Some(list) => {
            let items: Vec<&str> = list.split(',').map(str::trim).filter(|x| !x.is_empty()).collect();
            if items.is_empty() || items.len() > MAX_GOODPUT_INTERVALS {
                bail!("--interval {list:?}: give 1 to {MAX_GOODPUT_INTERVALS} intervals, e.g. --interval 10m,30m,1h");
            }
            items.iter().map(|x| parse_interval(x, inputs)).collect::<anyhow::Result<_>>()?
        }
        None => {
            let tau = inputs.daly_tau_s();
            let mut v: Vec<u64> = (0..17).map(|i| inputs.steps_of(tau * 2f64.powf((i as f64 - 8.0) / 4.0))).collect();
            if let Some(t) = inputs.scenario_interval_s {
                v.push(inputs.steps_of(t));
            }
            v
        }
    };
    for k in &mut steps {
        *k = (*k).clamp(1, max_steps);
    }
    steps.sort_unstable();
    steps.dedup();
    Ok(steps)
}

/// `90s`, `10m`, `1.5h`, `500steps` → whole steps.
fn parse_interval(x: &str, inputs: &Inputs) -> anyhow::Result<u64> {
    let bad = || anyhow::anyhow!("--interval {x:?}: write a duration (90s, 10m, 1.5h) or a step count (500steps)");
    if let Some(n) = x.strip_suffix("steps") {
        let n: u64 = n.trim().parse().map_err(|_| bad())?;
        if n == 0 {
            bail!("--interval {x:?}: at least one step");
        }
        return Ok(n);
    }
    let (num, mul) = if let Some(n) = x.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = x.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = x.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(bad());
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(v > 0.0 && v.is_finite() && v * mul <= 1e6) {
        bail!("--interval {x:?}: a positive duration of at most 1e6 s");
    }
    Ok(inputs.steps_of(v * mul))
}

fn progress_bar(len: u64, json: bool) -> anyhow::Result<ProgressBar> {
    if json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return Ok(ProgressBar::hidden());
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} trials ({elapsed})")
            .context("the progress bar's template")?
            .progress_chars("=> "),
    );
    bar.set_message("goodput");
    Ok(bar)
}

fn write_out(dir: &Path, name: &str, inputs: &Inputs, r: &GoodputResult) -> anyhow::Result<Vec<String>> {
    use strata_reports::plots::goodput::{GoodputPlot, GoodputPoint, table};
    common::create_dir(dir)?;
    let fig = GoodputPlot {
        title: format!("Goodput of {name}: {} trials, job MTBF {:.2} h", r.trials, r.job_mtbf_s / 3600.0),
        points: r
            .intervals
            .iter()
            .map(|i| GoodputPoint {
                interval_s: i.interval_s,
                goodput: i.goodput,
                lo: i.goodput_lo,
                hi: i.goodput_hi,
                daly: i.daly_efficiency,
            })
            .collect(),
        daly_tau_s: r.daly_tau_s,
        best_tau_s: r.best().interval_s,
    };
    common::write_file(&dir.join("goodput.csv"), table(&fig).to_csv())?;
    let mut losses = String::from("interval_s,cause,failures,lost_work_gpu_hours,restart_gpu_hours\n");
    for i in &r.intervals {
        losses.push_str(&format!("{},checkpoint,0,{},0\n", i.interval_s, i.checkpoint_gpu_hours));
        for l in &i.losses {
            losses.push_str(&format!(
                "{},{},{},{},{}\n",
                i.interval_s,
                l.cause.key(),
                l.failures,
                l.lost_work_gpu_hours,
                l.restart_gpu_hours
            ));
        }
    }
    common::write_file(&dir.join("losses.csv"), losses)?;
    let json = serde_json::to_string_pretty(&JsonOut { scenario: name, inputs, result: r })?;
    common::write_file(&dir.join("goodput.json"), json)?;
    strata_reports::plots::render(&fig, "goodput", dir)?;
    Ok(["goodput.csv", "losses.csv", "goodput.json", "goodput.png", "goodput.svg"].map(String::from).to_vec())
}
