//! `cargo xtask`: the project's automation, needing nothing but cargo.
//!
//! - `ci` — what CI runs: format check, clippy with `-D warnings`, the test suite, and the
//!   `cuda` feature's build on a machine without CUDA;
//! - `bench` — the speed and memory targets of the issues, each measured in its own
//!   process (so peak memory is that benchmark's alone), printed as figures.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench(args.get(1).map(String::as_str)),
        Some("bench-one") => bench_one(args.get(1).map(String::as_str).unwrap_or_default()),
        _ => {
            eprintln!(
                "usage: cargo xtask <command>\n\n  ci            format check, clippy -D warnings, tests, cuda build check\n  bench [NAME]  run the benchmarks (all, or one of: {})",
                BENCHES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
            );
            bail!("no command given")
        }
    }
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO")).args(args).status().context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

fn ci() -> anyhow::Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    cargo(&["test", "--release", "--workspace"])?;
    Ok(())
}

/// (name, what it measures).
const BENCHES: &[(&str, &str)] =
    &[("plan-405b", "lower Llama-3 405B on 16,384 H100 (TP 8, PP 16, DP 128, interleaved)")];

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
            match peak_rss_bytes() {
                Some(b) => println!("   peak memory: {:.1} MB (target < 500 MB)", b as f64 / 1e6),
                None => println!("   peak memory: unavailable (no /proc/self/status)"),
            }
            Ok(())
        }
        other => bail!("unknown benchmark {other:?}"),
    }
}
