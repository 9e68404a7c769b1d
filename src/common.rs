//! What every subcommand shares: scenario arguments, exit codes, number formatting, JSON.

use std::path::{Path, PathBuf};

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
            Some(path) => {
                refuse_json(path)?;
                Scenario::load(path, &self.overrides)?
            }
            None => Scenario::from_toml(DEFAULT_SCENARIO, "<embedded default>", "default", &self.overrides)?,
        };
        Ok(scenario)
    }

    /// As [`ScenarioArgs::load`], for a search: the scenario's own parallel split need not
    /// be valid (the search replaces it); model, cluster, batch and training must be.
    pub fn load_for_search(&self) -> anyhow::Result<Scenario> {
        let scenario = match &self.scenario {
            Some(path) => {
                refuse_json(path)?;
                Scenario::load_for_search(path, &self.overrides)?
            }
            None => Scenario::from_toml_for_search(DEFAULT_SCENARIO, "<embedded default>", "default", &self.overrides)?,
        };
        Ok(scenario)
    }
}

/// Refuses a JSON file (a saved plan, most likely) where a scenario TOML is expected, with
/// what to do instead — rather than a TOML parse error that quotes the JSON.
fn refuse_json(path: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    let mut head = Vec::new();
    // An unreadable file is left to the scenario loader, which names the OS error.
    let Ok(file) = std::fs::File::open(path) else { return Ok(()) };
    if file.take(4096).read_to_end(&mut head).is_err() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&head);
    // A TOML document never starts with `{` (a table header starts with `[`).
    if !text.trim_start().starts_with('{') {
        return Ok(());
    }
    let p = path.display();
    let what = if text.contains("\"programs\"") || text.contains("\"grid\"") { "a plan (JSON)" } else { "JSON" };
    anyhow::bail!(
        "{p} looks like {what}, but this command takes a scenario (TOML). A plan embeds its scenario: check the plan \
         with `strata verify {p}`, or give the scenario it was lowered from (e.g. `strata simulate \
         scenarios/default.toml`; `strata plan SCENARIO --json > plan.json` makes a plan from one)"
    )
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

/// A write that failed (disk full, permission denied, a path that is a directory): the
/// run failed, not its input, so exit code 1. The message names the path.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}", path.display())]
pub struct WriteFailure {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Writes a file, creating its folder; a failure is a [`WriteFailure`] naming the path.
pub fn write_file(path: &Path, bytes: impl AsRef<[u8]>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_dir(dir)?;
    }
    std::fs::write(path, bytes).map_err(|source| WriteFailure { path: path.to_path_buf(), source })?;
    Ok(())
}

/// Creates a folder and its parents; a failure is a [`WriteFailure`] naming the path.
pub fn create_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| WriteFailure { path: dir.to_path_buf(), source })?;
    Ok(())
}

/// The plan does not fit in GPU memory: the report was printed, and the exit code is 3 so
/// that scripts can tell an out-of-memory verdict from bad input (2) or a failed run (1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OutOfMemoryVerdict(pub String);

/// Exit code for an error: 3 for an out-of-memory verdict ([`OutOfMemoryVerdict`]), 1 for a failed run (a rank died, the job diverged, a write
/// failed — [`RunFailure`], [`WriteFailure`], a report or checkpoint that could not be
/// written), 2 for bad input (everything else: the message says what to change).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if e.chain().any(|c| c.is::<OutOfMemoryVerdict>()) {
        return 3;
    }
    let failed = e.chain().any(|c| {
        c.is::<RunFailure>()
            || c.is::<WriteFailure>()
            || matches!(
                c.downcast_ref::<strata_reports::ReportError>(),
                Some(strata_reports::ReportError::Write { .. })
            )
            || c.downcast_ref::<strata_runtime::checkpoint::CheckpointError>().is_some_and(|c| c.is_io())
    });
    if failed { 1 } else { 2 }
}

/// An error and its causes on one line, as `{:#}` prints them, but without a cause whose
/// text the message before it already ends with (errors that quote their source, like
/// "cannot read scenario x.toml: No such file or directory (os error 2)", would otherwise
/// print the OS error twice).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if text.is_empty() {
            text = c;
        } else if !text.ends_with(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
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
