//! What every subcommand shares: scenario arguments, exit codes, number formatting, JSON.

use std::path::PathBuf;

use anyhow::Context;
use strata_models::Scenario;

/// The embedded default scenario (`scenarios/default.toml`).
pub const DEFAULT_SCENARIO: &str = include_str!("../scenarios/default.toml");

/// A scenario file and its overrides.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ScenarioArgs {
    /// Scenario file (TOML). Without it, the embedded default scenario is used.
    pub scenario: Option<PathBuf>,
    /// Override a scenario key, e.g. `--set parallel.tp=4` or `--set parallel.schedule=1f1b`
    /// (the value is read as TOML; a bare word is a string). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

impl ScenarioArgs {
    /// Reads, overrides and validates the scenario.
    pub fn load(&self) -> anyhow::Result<Scenario> {
        let scenario = match &self.scenario {
            Some(path) => Scenario::load(path, &self.overrides)?,
            None => Scenario::from_toml(DEFAULT_SCENARIO, "<embedded default>", "default", &self.overrides)?,
        };
        Ok(scenario)
    }
}

/// Exit code of a process whose reader went away: 128 + SIGPIPE, what a tool killed by
/// the signal reports.
pub const BROKEN_PIPE_EXIT: i32 = 141;

/// Makes a closed stdout or stderr (`strata plan … | head -1`) end the process quietly
/// with [`BROKEN_PIPE_EXIT`], as the shell's tools do, instead of std's panic "failed
/// printing to stdout: Broken pipe". Every other panic keeps the default hook.
pub fn end_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or_default();
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(BROKEN_PIPE_EXIT);
        }
        default(info)
    }));
}

/// A run that failed for a reason other than bad input (a rank died, a write failed):
/// exit code 1 instead of 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RunFailure(pub String);

/// Exit code for an error: 1 for a failed run, 2 for bad input.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<RunFailure>().is_some() { 1 } else { 2 }
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("serialising the result as JSON")?;
    println!("{text}");
    Ok(())
}

/// Bytes in binary units.
pub fn bytes(b: f64) -> String {
    strata_models::plan::text::bytes(b.max(0.0).round() as u64)
}

/// A count with an SI suffix (1.2 M, 175.0 B).
pub fn count(n: f64) -> String {
    let a = n.abs();
    if a >= 1e12 {
        format!("{:.2} T", n / 1e12)
    } else if a >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} M", n / 1e6)
    } else if a >= 1e3 {
        format!("{:.2} K", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// FLOPs with an SI suffix.
pub fn flops(f: f64) -> String {
    let a = f.abs();
    if a >= 1e18 {
        format!("{:.2} EFLOP", f / 1e18)
    } else if a >= 1e15 {
        format!("{:.2} PFLOP", f / 1e15)
    } else if a >= 1e12 {
        format!("{:.2} TFLOP", f / 1e12)
    } else if a >= 1e9 {
        format!("{:.2} GFLOP", f / 1e9)
    } else {
        format!("{:.2} MFLOP", f / 1e6)
    }
}
