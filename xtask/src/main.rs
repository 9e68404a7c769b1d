//! `cargo xtask`: the project's automation, needing nothing but cargo.
//!
//! - `ci` — what CI runs, exactly: it runs `.ci/run`, the one list of CI steps (toolchain,
//!   system packages, format check, clippy with `-D warnings` with and without the `cuda`
//!   feature, the test suite, the main job, its report in headless Chromium, the MPI
//!   jobs). Steps live only in that script, so the two cannot drift apart;
//! - `bench` — the speed and memory targets of the issues, each measured in its own
//!   process (so peak memory is that benchmark's alone), printed as figures;
//! - `interop` — every `strata export` of a matrix of splits loaded by its framework's own
//!   code (DeepSpeed's `DeepSpeedConfig`, megatron-core's config classes, torchtitan's
//!   `ConfigManager`) in a cached virtualenv ([`interop`]);
//! - `fuzz --minutes N` — the long fuzz campaign (`tests/fuzz/`): mutated scenarios and
//!   plans through inspect / plan / verify / simulate / search for N minutes, every outcome
//!   classified; fails on any panic, hang, nonsense figure or internal-reason refusal;
//! - `validate` — predicted against measured on this machine: calibrate, run a dozen splits
//!   both ways, print the step-time and memory errors and the ranking's Kendall τ
//!   ([`validate`]);
//! - `device-check` — the cuda binary built and stripped for a lent GPU machine, and the one
//!   command to run there ([`device`]);
//! - `validate --published [--json]` — the simulator against published training runs: the
//!   fit and check sets of `xtask/data/published.toml`, MAPE per group, and what each
//!   framework mechanic changes on the check set ([`validate_published`]).

mod device;
mod interop;
mod validate;
mod validate_published;

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(args.get(1).map(String::as_str)),
        Some("bench-one") => bench_one(args.get(1).map(String::as_str).unwrap_or_default()),
        Some("validate") if args.get(1).map(String::as_str) == Some("--published") => {
            validate_published::validate_published(&validate_published::Options::parse(&args[2..])?)
        }
        Some("validate") => validate::validate(),
        Some("interop") => interop::interop(),
        Some("fuzz") => fuzz(&args[1..]),
        Some("device-check") => device::device_check(),
        other => {
            let help = matches!(other, Some("help" | "--help" | "-h"));
            let usage = format!(
                "usage: cargo xtask <command>\n\n  ci            run .ci/run, CI's steps: format, clippy (also --features cuda), tests, the main job, its report in Chromium, MPI\n  bench [NAME]  run the benchmarks (all, or one of: {})\n  interop       export a matrix of splits to Megatron-LM, DeepSpeed and torchtitan and load every file with the framework's own code (virtualenv at $STRATA_INTEROP_VENV, default ~/.cache/strata/interop-venv; skipped without python3 unless CI=true)\n  validate      calibrate this machine, run a dozen CPU splits both ways, print predicted vs measured\n  validate --published [--json] [--rows TEXT] [--no-ablations]\n                simulate the published runs of xtask/data/published.toml (fit and check sets): per-row predicted vs published, MAPE per group, and the check set with each framework mechanic off; --rows keeps the rows whose group or name contains TEXT, --no-ablations skips the mechanic-off runs\n  fuzz [--minutes N] [--seed S] [--threads T]\n                the long fuzz campaign (default 10 minutes, 2 threads): mutated scenarios and plans, every outcome classified\n  device-check  build the cuda binary for a lent GPU machine and print the one command to run there (xtask/device/check.sh)",
                BENCHES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            );
            if help {
                println!("{usage}");
                return Ok(());
            }
            // A usage error, not a failure of the tool: no backtrace, exit code 2.
            match other {
                Some(cmd) => eprintln!("cargo xtask: unknown command `{cmd}`\n\n{usage}"),
                None => eprintln!("cargo xtask: no command given\n\n{usage}"),
            }
            std::process::exit(2)
        }
    }
}

pub(crate) fn cargo(args: &[&str]) -> anyhow::Result<()> {
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO")).args(args).status().context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The long fuzz campaign: `tests/fuzz/`'s ignored test, in release mode, for N minutes.
fn fuzz(args: &[String]) -> anyhow::Result<()> {
    let mut env: Vec<(&str, String)> = vec![("STRATA_FUZZ_MINUTES", "10".into())];
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let key = match flag.as_str() {
            "--minutes" => "STRATA_FUZZ_MINUTES",
            "--seed" => "STRATA_FUZZ_SEED",
            "--threads" => "STRATA_FUZZ_THREADS",
            other => bail!(
                "cargo xtask fuzz: unknown flag {other}; usage: cargo xtask fuzz [--minutes N] [--seed S] [--threads T]"
            ),
        };
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        if value.parse::<u64>().is_err() {
            bail!("{flag} {value}: expected a whole number");
        }
        env.retain(|(k, _)| *k != key);
        env.push((key, value.clone()));
    }
    let test =
        ["test", "--release", "-p", "strata", "--test", "fuzz", "fuzz_long_campaign", "--", "--ignored", "--nocapture"];
    eprintln!(
        "$ {} cargo {}",
        env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
        test.join(" ")
    );
    let status = Command::new(env!("CARGO")).args(test).envs(env).status().context("running cargo")?;
    if !status.success() {
        bail!("the fuzz campaign failed ({status}); its failures are listed above");
    }
    Ok(())
}

/// Runs `.ci/run`, the single source of CI's steps (it installs system packages with
/// apt-get where there is one, as CI's machine needs).
fn ci() -> anyhow::Result<()> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/run");
    eprintln!("$ bash {}", script.display());
    let status = Command::new("bash").arg(&script).status().context("running .ci/run with bash")?;
    if !status.success() {
        bail!(".ci/run failed ({status})");
    }
    Ok(())
}

/// (name, what it measures).
const BENCHES: &[(&str, &str)] = &[
    ("plan-405b", "lower Llama-3 405B on 16,384 H100 (TP 8, PP 16, DP 128, interleaved)"),
    ("sim-gpt3", "simulate one step of GPT-3 175B on 1,024 A100 (TP 8, PP 8, DP 16)"),
    ("sim-405b", "simulate one step of Llama-3 405B (seq 8192) on 16,384 H100, rail-optimised 3-tier fabric"),
    ("flow-solver", "the fabric's max-min solver under 128 concurrent DP reduce-scatters on 2,048 nodes"),
    ("search-gpt3", "search GPT-3 175B on 1,024 A100-80GB, global batch 1536"),
    ("train-cpu", "train a GPT-2-small-shaped model on 1 and 2 CPU ranks against the GEMM crate's rate"),
];

fn bench(only: Option<&str>) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating xtask")?;
    for (name, what) in BENCHES {
        if only.is_some_and(|o| o != *name) {
            continue;
        }
        println!("== {name}: {what}");
        let status = Command::new(&exe).args(["bench-one", name]).status().context("running a benchmark")?;
        if !status.success() {
            bail!("benchmark {name} failed ({status})");
        }
    }
    Ok(())
}

/// Peak resident memory of this process so far, bytes (Linux `VmHWM`).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn print_peak() {
    match peak_rss_bytes() {
        Some(b) => println!("   peak memory of the process: {:.1} MB", b as f64 / 1e6),
        None => println!("   peak memory: unavailable (no /proc/self/status)"),
    }
}

fn bench_one(name: &str) -> anyhow::Result<()> {
    match name {
        "plan-405b" => {
            let text = include_str!("../../scenarios/llama3-405b-16384xh100.toml");
            let s = strata_models::Scenario::from_toml(text, "llama3-405b-16384xh100", "llama3-405b", &[])?;
            let start = Instant::now();
            let plan = strata_models::plan::lower(&s)?;
            let built = start.elapsed();
            let start = Instant::now();
            let report = strata_models::plan::verify(&plan)?;
            let verified = start.elapsed();
            println!(
                "   ranks {}, programs {}, ops {} ({} per stage on average)",
                plan.grid.ranks(),
                plan.programs.len(),
                plan.op_count(),
                plan.op_count() / plan.programs.len()
            );
            println!("   plan build time: {:.3} s (target < 1 s)", built.as_secs_f64());
            println!(
                "   verify time: {:.3} s ({} collectives, {} messages matched)",
                verified.as_secs_f64(),
                report.collectives_matched,
                report.messages_matched
            );
            print_peak();
            Ok(())
        }
        "sim-gpt3" => {
            let b = strata_sim::bench::simulate_gpt3_175b(3);
            println!("   plan: {} ops, lowered in {:.3} s", b.ops, b.lower_wall_s);
            println!(
                "   simulation wall time: {:.3} s (target < 0.5 s), {} events, {:.2} M events/s",
                b.simulate_wall_s,
                b.events,
                b.events_per_s / 1e6
            );
            println!("   simulated step {:.2} s, MFU {:.1}%", b.step_time_s, 100.0 * b.mfu);
            print_peak();
            Ok(())
        }
        "sim-405b" => {
            let text = include_str!("../../scenarios/llama3-405b-16384xh100.toml");
            let s = strata_models::Scenario::from_toml(text, "llama3-405b-16384xh100", "llama3-405b", &[])?;
            let start = Instant::now();
            let plan = strata_models::plan::lower(&s)?;
            let lowered = start.elapsed().as_secs_f64();
            let start = Instant::now();
            let r = strata_sim::simulate(&plan, &strata_sim::SimOptions::default())?;
            let simulated = start.elapsed().as_secs_f64();
            println!(
                "   network {}, {} GPUs on {} nodes, fabric {:?} ({} routing)",
                r.network,
                r.gpus,
                s.cluster.nodes,
                s.cluster.fabric,
                format!("{:?}", s.cluster.routing).to_lowercase()
            );
            println!(
                "   lowered in {lowered:.3} s; simulated in {simulated:.3} s; total {:.3} s (target < 2 s); {} events, {:.2} M events/s",
                lowered + simulated,
                r.events,
                r.events as f64 / simulated / 1e6
            );
            println!(
                "   simulated step {:.2} s, {:.2} M tokens/s, MFU {:.1}%",
                r.step_time_s,
                r.tokens_per_s / 1e6,
                100.0 * r.mfu
            );
            print_peak();
            Ok(())
        }
        "flow-solver" => {
            for routing in [strata_models::Routing::Adaptive, strata_models::Routing::Static] {
                for b in strata_sim::net::bench::dp_collectives(3, routing) {
                    println!(
                        "   {:<48} {:>8} events in {:.3} s: {:>9.0} events/s; {} solves, {:.1} variables and {:.1} elements per solve",
                        b.name, b.events, b.wall_s, b.events_per_s, b.solves, b.vars_per_solve, b.elems_per_solve
                    );
                }
            }
            print_peak();
            Ok(())
        }
        "search-gpt3" => {
            let text = include_str!("../../scenarios/gpt3-175b-1024xa100.toml");
            let s = strata_models::Scenario::from_toml(text, "gpt3-175b-1024xa100", "gpt3", &[])?;
            let opts = strata_sim::search::SearchOptions::new(&s);
            let start = Instant::now();
            let r = strata_sim::search::search(&s, &opts, &|_, _, _| {})?;
            let wall = start.elapsed().as_secs_f64();
            let invalid: u64 = r.invalid.values().sum();
            println!(
                "   enumerated {}: {} duplicates, {} invalid, {} valid; screened out (memory) {}; estimated {}; simulated {} ({} out of memory)",
                r.enumerated,
                r.duplicates,
                invalid,
                r.valid,
                r.out_of_memory_analytic,
                r.estimated,
                r.simulated,
                r.out_of_memory_simulated
            );
            println!(
                "   wall time {wall:.2} s (target < 60 s): {:.0} configurations/s ({:.0} valid/s)",
                r.enumerated as f64 / wall,
                r.valid as f64 / wall
            );
            if let Some(best) = r.best() {
                let rep = best.report.as_ref().expect("ranked candidates are simulated");
                println!(
                    "   best: {} — {:.3} s per step, {:.0} tokens/s, MFU {:.1}%",
                    best.label,
                    rep.step_time_s,
                    rep.tokens_per_s,
                    100.0 * rep.mfu
                );
            }
            print_peak();
            Ok(())
        }
        "train-cpu" => {
            let c = strata_runtime::bench::BenchConfig::default();
            println!(
                "   model: {} layers, hidden {}, {} heads, sequence {}, {} sequences per step",
                c.layers, c.hidden, c.heads, c.seq, c.global_batch
            );
            strata_runtime::bench::run(&c, |r| {
                println!(
                    "   {:<10} {} rank(s): step {:.2} s, {:.0} tokens/s, {:.1} GFLOP/s achieved vs {:.1} GFLOP/s GEMM alone = {:.0}% (target ≥ 60%)",
                    r.split, r.ranks, r.step_s, r.tokens_per_s, r.achieved_gflops, r.gemm_gflops, 100.0 * r.efficiency
                );
            })
            .map_err(|e| anyhow::anyhow!(e))?;
            print_peak();
            Ok(())
        }
        other => bail!("unknown benchmark {other:?}"),
    }
}
