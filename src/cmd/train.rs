//! `strata train`: train a scenario's plan for real on CPU ranks (threads of this process),
//! printing loss and tokens/s per step, and writing the loss curve, a measured trace and
//! the measured peak memory per rank.
//!
//! The scenario's split is lowered to a plan, verified, and every rank runs its program
//! (`strata_runtime::train`). Data: a seeded Markov corpus whose entropy rate (the best
//! loss any model can reach) is printed, or the bytes of `--data FILE`.
//!
//! On a CPU cluster `--ranks N` sizes the local cluster to N ranks ([`size_cluster`]).
//! The ranks run under the supervisor (`strata_runtime::supervise`): with `--restarts N` a
//! failed attempt is restarted from the last complete checkpoint, up to N times, and
//! `--inject` injects faults (`kill:`, `hang:`, `slow:`) to prove it. Every run reports
//! its attempts and its measured goodput.
//!
//! Exit codes: 2 for bad input (a scenario, a checkpoint that cannot be used, a refused
//! checkpoint directory or changed setting, an `--inject` that does not fit the job), 1 for
//! a run that failed (a rank died with no restarts left, the loss or a gradient became NaN
//! or infinite, a write failed).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use strata_models::hardware::GpuKind;
use strata_models::plan::{lower, verify};
use strata_models::scenario::Dtype;
use strata_runtime::checkpoint;
use strata_runtime::data::Corpus;
use strata_runtime::exec::ExecConfig;
use strata_runtime::supervise::{
    Attempt, Goodput, Injection, SuperviseError, SuperviseOptions, SupervisedRun, train_supervised,
};
use strata_runtime::train::{
    CheckpointOptions, RankMemory, StepRecord, TrainError, TrainOptions, TrainResult, synthetic_corpus, write_outputs,
};

use crate::common::{self, RunFailure, ScenarioArgs};

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  strata train scenarios/tiny-gpt-cpu.toml --ranks 8 --out out/train\n  strata train scenarios/tiny-gpt-cpu.toml --steps 20 --checkpoint-dir ck --checkpoint-every 5\n  strata train scenarios/tiny-gpt-cpu.toml --steps 40 --checkpoint-dir ck --resume\n  strata train scenarios/tiny-gpt-cpu.toml --steps 12 --checkpoint-dir ck --checkpoint-every 5 --restarts 2 --inject kill:rank=3,step=7 --timeout 2\n  strata train scenarios/tiny-gpt-cpu.toml --steps 4 --inject slow:rank=1,factor=2 --out out/slow\n\nA run under --restarts N survives a dead rank: the failure is named (the rank and why: killed, panic, stall past --timeout), partial checkpoint directories are removed, and every rank restarts from the newest complete checkpoint (verified first), up to N times; the loss curve equals the uninterrupted run's bit for bit. Every run prints its measured goodput: the time in steps that count over the wall time."
)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// Where the plan runs: cpu (CPU ranks, threads of this process) or cuda (a build with
    /// `--features cuda`: a GPT plan of a GPU cluster scenario, bf16, any tp · pp · dp
    /// without sequence parallelism, ZeRO-0 to 3 — e.g. scenarios/gpt2-124m-1xh200.toml —
    /// every rank on GPU 0; or, launched as `mpirun -n N strata train --backend cuda …` by
    /// a build with `--features cuda,mpi`, one process per GPU through NCCL, N = tp · pp ·
    /// dp; or, with --all-gpus, this one process driving every GPU of the node; otherwise
    /// it says what is missing).
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda")]
    pub backend: String,
    /// With --backend cuda: this process drives every GPU of its node, one rank of the plan
    /// per GPU (rank i on GPU i, each on its own thread, their collectives and pipeline
    /// messages through NCCL, which it needs: libnccl on LD_LIBRARY_PATH), instead of every
    /// rank on GPU 0. No mpirun: the cluster is sized to the visible GPUs unless --ranks
    /// says otherwise, and tp · pp · dp must equal them (CUDA_VISIBLE_DEVICES picks them).
    #[arg(long)]
    pub all_gpus: bool,
    /// Ranks to run, as threads of this process. On a CPU cluster (cpu-local) it sizes the
    /// cluster to N ranks and derives dp = N / (tp · pp); when tp · pp does not divide N and
    /// neither was set with --set, the split becomes tp = pp = 1, dp = N (a note says so).
    /// With --backend cuda the cluster is sized the same way and all N ranks share one GPU
    /// (one GPU each with --all-gpus).
    #[arg(long, value_name = "N")]
    pub ranks: Option<u32>,
    /// Steps to train [default: training.steps of the scenario].
    #[arg(long)]
    pub steps: Option<u32>,
    /// Train on the bytes of this text file (vocabulary 256) instead of the synthetic
    /// Markov corpus.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Write sharded checkpoints here (one file per rank and a manifest per checkpoint).
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every K steps; 0 = only after the last step.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub checkpoint_every: u32,
    /// Resume from the newest checkpoint in --checkpoint-dir (bit-identical to not stopping).
    /// A changed training setting (training.lr, weight_decay, grad_clip, warmup_steps, …)
    /// is refused unless --allow-changed names it.
    #[arg(long, requires = "checkpoint_dir")]
    pub resume: bool,
    /// Start afresh in a --checkpoint-dir that holds checkpoints: delete them first (only
    /// Strata's step-* directories; anything else there makes it refuse). Without it, a fresh
    /// run refuses a non-empty checkpoint directory.
    #[arg(long, requires = "checkpoint_dir", conflicts_with = "resume")]
    pub overwrite: bool,
    /// With --resume, allow this training setting to differ from the checkpoint's, e.g.
    /// `--allow-changed training.lr`. Repeatable.
    #[arg(long = "allow-changed", value_name = "KEY", requires = "resume")]
    pub allow_changed: Vec<String>,
    /// Write loss.csv, trace.json (the measured trace of the last step, Chrome/Perfetto
    /// format: open it in ui.perfetto.dev), measured-trace.json (the same trace as Strata's
    /// data, for `strata trace merge` and the report's inputs), memory.json (peak bytes per
    /// rank, measured and predicted) and plan.json (the plan the trace refers to).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Stop the job when no rank made progress for this many seconds (a dead peer). Under
    /// `mpirun … --backend cuda` (or --all-gpus): the longest a rank waits for a step's NCCL
    /// work or for its peers at the gradient norm before it ends the job naming itself; under
    /// mpirun also for NCCL's communicator set-up (every peer must join).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub timeout: u64,
    /// Restart a failed attempt up to N times, every rank from the newest complete
    /// checkpoint (from step 0 when none was written yet). Needs --checkpoint-dir: without
    /// one, the run refuses to start rather than redo every step after each failure (set
    /// --checkpoint-every K so that a failure loses at most K steps). A divergence, a bad
    /// setup or an unusable checkpoint is not restarted: it would recur.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub restarts: u32,
    /// Inject a fault (repeatable): kill:rank=R,step=S (rank R vanishes at the start of
    /// step S, as a killed process does), hang:rank=R,step=S (it stops talking; noticed
    /// after --timeout), slow:rank=R,factor=F (its compute is F times slower, 1 ≤ F ≤ 100:
    /// it sleeps (F − 1) × each compute op's duration, and its partners wait; with more
    /// rank threads than cores a sleeping rank frees its core for the others, so the step
    /// barely grows). A kill or hang fires in the first attempt only (one per run); a slow
    /// rank stays slow after a restart.
    #[arg(long, value_name = "SPEC")]
    pub inject: Vec<String>,
    /// Print the result as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    scenario: &'a str,
    ranks: u32,
    data: &'a str,
    entropy_rate_nats: Option<f64>,
    start_step: u32,
    steps: &'a [StepRecord],
    memory: &'a [RankMemory],
    attempts: &'a [Attempt],
    goodput: &'a Goodput,
}

/// `supervisor.json` in --out: every attempt and the goodput.
#[derive(Serialize)]
struct Supervision<'a> {
    attempts: &'a [Attempt],
    goodput: &'a Goodput,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let backend = super::gpu::executor_backend("strata train", &args.backend)?;
    #[cfg(feature = "cuda")]
    if let super::gpu::Backend::Cuda { ordinal } = backend {
        return super::train_cuda::run(args, ordinal);
    }
    let _ = backend;
    if args.all_gpus {
        bail!(
            "--all-gpus drives this node's GPUs, one rank each: it needs --backend cuda (the cpu backend runs ranks as threads already)"
        );
    }
    let mut s = load_sized(&args.scenario, args.ranks, |s| s.cluster.gpu == GpuKind::Cpu)?;
    if s.cluster.gpu != GpuKind::Cpu {
        bail!(
            "strata train runs CPU ranks, but the scenario's cluster has cluster.gpu = \"{}\"; use cluster.preset = \"cpu-local\" with cluster.gpus_per_node = tp · pp · dp",
            s.cluster.gpu.key()
        );
    }
    let ranks = s.parallel.ranks() as u32;
    if let Some(n) = args.ranks.filter(|n| *n != ranks) {
        bail!(
            "--ranks {n} but the scenario splits into tp · cp · pp · dp = {} · {} · {} · {} = {ranks} ranks; pass --ranks {ranks} or change the split (e.g. --set parallel.dp=…)",
            s.parallel.tp,
            s.parallel.cp,
            s.parallel.pp,
            s.parallel.dp
        );
    }
    if s.training.dtype != Dtype::Fp32 {
        eprintln!(
            "note: the CPU executor computes in fp32; planning with training.dtype = \"fp32\" (the scenario says \"{}\")",
            s.training.dtype.key()
        );
        s.training.dtype = Dtype::Fp32;
    }
    let steps = args.steps.unwrap_or(s.training.steps);
    let inject = args.inject.iter().map(|i| Injection::parse(i)).collect::<Result<Vec<_>, _>>()?;
    let sup = SuperviseOptions { restarts: args.restarts, inject };
    let plan = lower(&s)?;
    verify(&plan).context("the plan of this scenario does not verify")?;
    let (corpus, data_name, entropy) = load_corpus(args.data.as_deref(), &s)?;
    if !args.json {
        println!(
            "Training {} on {ranks} CPU ranks ({}), {steps} steps of {} tokens; data {data_name}{}",
            s.name,
            plan.grid,
            s.tokens_per_step(),
            entropy.map_or(String::new(), |h| format!(", entropy rate {h:.4} nats/token (the best loss possible)"))
        );
    }
    let opts = TrainOptions {
        steps,
        data_name: data_name.clone(),
        checkpoint: args.checkpoint_dir.clone().map(|dir| CheckpointOptions {
            dir,
            every: args.checkpoint_every,
            resume: args.resume,
            keep: 2,
            overwrite: args.overwrite,
            allow_changed: args.allow_changed.clone(),
        }),
        exec: ExecConfig { recv_timeout: Duration::from_secs(args.timeout.max(1)), trace_step: steps.checked_sub(1) },
        faults: Vec::new(),
    };
    let bar = progress_bar(steps as u64, args.json);
    let (cb_bar, quiet) = (bar.clone(), args.json);
    let progress = Box::new(move |r: &StepRecord| {
        cb_bar.set_position(r.step as u64 + 1);
        cb_bar.set_message(format!("loss {:.4}", r.loss));
        if !quiet {
            cb_bar.suspend(|| println!("step {:>5}  loss {:.4}  {:>10.0} tokens/s", r.step, r.loss, r.tokens_per_s));
        }
    });
    let plan = Arc::new(plan);
    let log_bar = bar.clone();
    let mut log = move |line: &str| log_bar.suspend(|| eprintln!("supervisor: {line}"));
    let run = train_supervised(plan.clone(), Arc::new(corpus), &opts, &sup, Some(progress), &mut log);
    bar.finish_and_clear();
    let SupervisedRun { result, attempts, goodput } = run.map_err(|e| failure(e, args.checkpoint_dir.as_deref()))?;
    if let Some(dir) = &args.out {
        write_outputs(dir, &plan, &result)
            .map_err(|e| RunFailure(format!("writing the outputs to {}: {e}", dir.display())))?;
        if let Some(trace) = &result.trace {
            common::write_file(&dir.join("trace.json"), strata_reports::chrome_trace_json(&plan, trace))?;
        }
        let sup = Supervision { attempts: &attempts, goodput: &goodput };
        common::write_file(&dir.join("supervisor.json"), serde_json::to_string_pretty(&sup)?)?;
    }
    let report = Report {
        scenario: &s.name,
        ranks,
        data: &data_name,
        entropy_rate_nats: entropy,
        start_step: result.start_step,
        steps: &result.steps,
        memory: &result.memory,
        attempts: &attempts,
        goodput: &goodput,
    };
    if args.json {
        return common::print_json(&report);
    }
    summary(&result, args.out.as_deref());
    attempts_summary(&attempts, &goodput);
    Ok(())
}

/// The exit status of a run that did not finish: 1 for a run that failed, 2 for bad input.
/// The training text: `--data FILE` in sequences of the model's length, or the synthetic
/// corpus (with its entropy rate, the best loss possible); and its name for the banner.
pub(super) fn load_corpus(
    data: Option<&Path>,
    s: &strata_models::Scenario,
) -> anyhow::Result<(Corpus, String, Option<f64>)> {
    Ok(match data {
        Some(path) => {
            let c = Corpus::from_text_file(path, s.model.seq_len as usize)?;
            let name = format!("{} ({} bytes)", path.display(), c.len());
            (c, name, None)
        }
        None => {
            let (c, name, h) = synthetic_corpus(s.model.vocab, s.training.seed)?;
            (c, name, Some(h))
        }
    })
}

fn failure(e: SuperviseError, checkpoint_dir: Option<&Path>) -> anyhow::Error {
    let (e, gave_up) = match e {
        SuperviseError::Failed { error, attempts, restarts } => {
            let gave_up = if attempts.len() as u32 > restarts && restarts > 0 {
                format!("; gave up after {restarts} restart(s)")
            } else {
                String::new()
            };
            (error, gave_up)
        }
        other => return anyhow::Error::new(other),
    };
    match e {
        TrainError::RankFailed { .. } | TrainError::RankExited { .. } => {
            anyhow::Error::new(RunFailure(format!("{e}{gave_up}")))
        }
        TrainError::Diverged { .. } => {
            let last = match checkpoint_dir.map(checkpoint::latest) {
                Some(Ok((p, _))) => format!("; the last good checkpoint is {}", p.display()),
                Some(Err(_)) => "; no checkpoint was written before it".to_string(),
                None => String::new(),
            };
            anyhow::Error::new(RunFailure(format!("{e}{last}")))
        }
        TrainError::Checkpoint(c) if c.is_io() => anyhow::Error::new(RunFailure(format!("{c}{gave_up}"))),
        other => anyhow::Error::new(other),
    }
}

fn attempts_summary(attempts: &[Attempt], goodput: &Goodput) {
    if attempts.len() > 1 {
        println!("Attempts:");
        for a in attempts {
            let why = a.failure.as_ref().map_or("completed".to_string(), |f| {
                let rank = f.rank.map_or(String::new(), |r| format!(" (rank {r})"));
                format!("failed: {}{rank}", f.cause)
            });
            println!(
                "  attempt {}: steps {}..{} in {:.2} s, {why}; {} step(s) lost{}",
                a.attempt,
                a.start_step,
                a.start_step + a.steps_done,
                a.seconds,
                a.steps_lost,
                a.restart_seconds.map_or(String::new(), |r| format!(", {r:.2} s to restart"))
            );
        }
    }
    println!("{}", goodput.line());
}

pub(super) fn progress_bar(len: u64, json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} step {pos}/{len}  {msg}  [{elapsed} < {eta}]")
    {
        bar.set_style(style);
    }
    bar
}

pub(super) fn summary(r: &TrainResult, out: Option<&Path>) {
    if let (Some(first), Some(last)) = (r.steps.first(), r.steps.last()) {
        let n = r.steps.len() as f64;
        let tps = r.steps.iter().map(|s| s.tokens_per_s).sum::<f64>() / n;
        println!(
            "\nLoss {:.4} → {:.4} over steps {}..{}; {:.0} tokens/s on average",
            first.loss, last.loss, first.step, last.step, tps
        );
    }
    println!("Peak memory per rank (measured plan buffers + workspace; the plan's prediction at the same instants):");
    for m in &r.memory {
        println!(
            "  rank {:>3}: {:>10} measured ({} in plan buffers), {:>10} predicted",
            m.rank,
            common::bytes(m.peaks.measured_bytes as f64),
            common::bytes(m.peaks.measured_plan_bytes as f64),
            common::bytes(m.peaks.predicted_bytes as f64)
        );
        if let Some(line) = overhead_line(&m.peaks) {
            println!("            {line}");
        }
    }
    if let Some(dir) = out {
        println!(
            "Wrote {}/loss.csv, trace.json (open it in ui.perfetto.dev), measured-trace.json, memory.json, plan.json",
            dir.display()
        );
    }
}

/// The CUDA executor's measured peak as the plan's plus its named terms
/// (`cuda::exec::overhead`), largest first; `None` where there are none (the CPU executor).
pub(super) fn overhead_line(peaks: &strata_runtime::exec::MemoryPeaks) -> Option<String> {
    let mut terms: Vec<_> = peaks.overhead_bytes.iter().filter(|(_, v)| **v != 0).collect();
    terms.sort_by_key(|(k, v)| (std::cmp::Reverse(v.unsigned_abs()), (*k).clone()));
    if terms.is_empty() {
        return None;
    }
    let t: Vec<String> = terms
        .iter()
        .map(|(k, v)| format!("{} {k} {}", if **v < 0 { "−" } else { "+" }, common::bytes(v.unsigned_abs() as f64)))
        .collect();
    Some(format!("measured = predicted {}", t.join(" ")))
}

/// The scenario, sized to `n` ranks ([`size_cluster`]) when `n` is given, `applies` to it
/// and is not already a split of `n` ranks on a cluster of `n` GPUs. The split is checked against the cluster only after
/// the sizing, so `--set parallel.tp=2 --ranks 8` works on a one-GPU scenario (read first
/// as a search reads it: its own split need not fit its cluster yet).
pub(super) fn load_sized(
    args: &ScenarioArgs,
    n: Option<u32>,
    applies: impl Fn(&strata_models::Scenario) -> bool,
) -> anyhow::Result<strata_models::Scenario> {
    let Some(n) = n else { return args.load() };
    let loose = args.load_for_search()?;
    let gpus = u64::from(loose.cluster.nodes) * u64::from(loose.cluster.gpus_per_node);
    if !applies(&loose) || (u64::from(n) == loose.parallel.ranks() && gpus == u64::from(n)) {
        return args.load();
    }
    let mut sized = args.clone();
    sized.overrides.extend(size_cluster(&loose, n, &args.overrides)?);
    sized.load()
}

/// The `--set` overrides that size a CPU cluster to `n` ranks: one node of `n`, dp derived
/// as n / (tp · cp · pp). When tp · cp · pp does not divide `n`, tp, cp and pp fall back to
/// 1 (with a note), unless the user set them, which is an error naming the split.
pub(super) fn size_cluster(s: &strata_models::Scenario, n: u32, user: &[String]) -> anyhow::Result<Vec<String>> {
    if n == 0 {
        bail!("--ranks 0: a job needs at least one rank");
    }
    let p = &s.parallel;
    let set_by_user = |key: &str| user.iter().any(|o| o.split('=').next().is_some_and(|k| k.trim() == key));
    let mut sets = vec!["cluster.nodes=1".to_string(), format!("cluster.gpus_per_node={n}")];
    let (mut tp, mut pp) = (u64::from(p.tp), u64::from(p.pp));
    let mut cp = u64::from(p.cp.max(1));
    if u64::from(n) % (tp * cp * pp) != 0 {
        if set_by_user("parallel.tp") || set_by_user("parallel.pp") || set_by_user("parallel.cp") {
            bail!(
                "--ranks {n}: tp · cp · pp = {tp} · {cp} · {pp} = {} does not divide {n}; pass --ranks a multiple of {} or change parallel.tp / parallel.cp / parallel.pp",
                tp * cp * pp,
                tp * cp * pp
            );
        }
        eprintln!(
            "note: --ranks {n}: the scenario's tp · cp · pp = {tp} · {cp} · {pp} does not divide {n}; training tp = 1, cp = 1, pp = 1, dp = {n}"
        );
        (tp, cp, pp) = (1, 1, 1);
        sets.extend(
            ["parallel.tp=1", "parallel.cp=1", "parallel.pp=1", "parallel.vpp=1", "parallel.schedule=1f1b"]
                .map(String::from),
        );
    }
    sets.push(format!("parallel.dp={}", u64::from(n) / (tp * cp * pp)));
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::overhead_line;

    #[test]
    fn the_overhead_line_names_each_term_largest_first_and_skips_zeros() {
        let mut peaks = strata_runtime::exec::MemoryPeaks::default();
        assert_eq!(overhead_line(&peaks), None, "the CPU executor has no terms");
        peaks.overhead_bytes =
            [("plan-sizes".to_string(), -1024), ("context".into(), 512 << 20), ("batch".into(), 0)].into();
        let line = overhead_line(&peaks).unwrap();
        assert!(line.starts_with("measured = predicted + context "), "{line}");
        assert!(line.contains(" − plan-sizes ") && !line.contains("batch"), "{line}");
    }
}
