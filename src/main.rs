//! `strata`: plan, simulate and run 3D-parallel + ZeRO LLM training.
//!
//! The CLI is thin: one module per subcommand under `cmd/`, each turning arguments into
//! calls on the library crates and their results into text or `--json`. Errors are values;
//! a user never sees a panic: bad input exits with code 2 and one message that says what
//! to do, a failed run (a rank died, a job diverged, a write failed) with code 1.

mod cmd;
mod common;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Plan, simulate and run 3D-parallel (data × tensor × pipeline) + ZeRO training of
/// large language models.
///
/// A scenario file (TOML) describes a job: the model, the cluster, the parallel split and
/// the training settings. Strata tells you what it costs (`inspect`), lowers it to per-rank
/// programs (`plan`), simulates a step on the cluster (`simulate`), searches the best
/// split (`search`), writes its launch files for Megatron-LM, DeepSpeed or torchtitan
/// (`export`), trains it for real on CPU ranks (`train`), and compares predicted with
/// measured (`report`).
///
/// With no subcommand, Strata runs its main job on the embedded default scenario: it
/// calibrates this machine, searches the splits of a small GPT on the local CPU "cluster",
/// trains the best ones for real and writes the predicted-vs-measured report (out/main/).
#[derive(Parser, Debug)]
#[command(name = "strata", version, about, long_about, propagate_version = true)]
#[command(
    after_help = "Examples:\n  strata inspect scenarios/gpt3-175b-1024xa100.toml\n  strata inspect scenarios/gpt3-175b-1024xa100.toml --set parallel.tp=4 --set parallel.pp=16\n  strata plan scenarios/tiny-gpt-cpu.toml --rank 3\n  strata presets"
)]
struct Cli {
    /// The main job only (`strata --no-wait`): never wait for a quiet machine before
    /// measuring (also: STRATA_NO_WAIT=1). Without it the job waits at most 60 s in all.
    #[arg(long)]
    no_wait: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// What a job costs before anything runs: parameters, FLOPs, memory per stage.
    Inspect(cmd::inspect::Args),
    /// Lower a scenario to per-rank programs and print one rank's ops (or the whole plan as JSON).
    Plan(cmd::plan::Args),
    /// Check a saved plan (JSON): group consistency, send/receive matching, no deadlock, buffer lifetimes.
    Verify(cmd::verify::Args),
    /// List the built-in models, GPUs and clusters.
    Presets(cmd::presets::Args),
    /// Train the scenario's plan for real on CPU ranks: loss curve, measured trace, peak memory.
    Train(cmd::train::Args),
    /// nccl-tests in simulation: time, algbw and busbw of one collective over message sizes.
    Collbench(cmd::collbench::Args),
    /// Search the fastest split that fits: enumerate, screen memory, estimate, simulate the best.
    Search(cmd::search::Args),
    /// Simulate one training step: step time, throughput, MFU, breakdown, memory, fits.
    Simulate(cmd::simulate::Args),
    /// Write a split's launch files for Megatron-LM, DeepSpeed or torchtitan (checked against the framework's rules).
    Export(cmd::export::Args),
    /// Build the predicted-vs-measured report (HTML, plots, tables, traces) from a results directory.
    Report(cmd::report::Args),
    /// Measure this machine (GEMMs, the model's pieces, the communicator, shared cores, the copies around a collective) and write the hardware profile the simulator reads.
    Calibrate(cmd::calibrate::Args),
    /// The model's CUDA kernels: compile them with NVRTC (no GPU needed), or check each against the CPU reference on a GPU (--check).
    Kernels(cmd::kernels::Args),
    /// Write this machine as a cluster TOML: GPUs and their NVLink peers (feature cuda), RDMA ports → NICs (feature ibverbs), nodes from Slurm / Open MPI.
    Probe(cmd::probe::Args),
    /// Run plans both ways (simulated with a calibrated profile, and trained for real) and write the report's inputs and the report.
    Compare(cmd::compare::Args),
    /// A Monte Carlo of a multi-week run under failures: goodput, time to train, lost GPU-hours by cause, and the best checkpoint interval beside Young's and Daly's.
    Goodput(cmd::goodput::Args),
    /// Work with Chrome/Perfetto trace files: `strata trace merge PRED MEASURED -o OUT` puts the predicted and the measured trace of one plan in one file.
    Trace(cmd::trace::Args),
}

fn main() -> ExitCode {
    common::end_quietly_on_broken_pipe();
    let cli = Cli::parse();
    if cli.no_wait && cli.command.is_some() {
        eprintln!(
            "error: --no-wait before a subcommand applies to the main job only; `strata compare` takes its own --no-wait"
        );
        return ExitCode::from(2);
    }
    let result = match cli.command {
        None => cmd::main_job::run(cli.no_wait),
        Some(Command::Inspect(a)) => cmd::inspect::run(a),
        Some(Command::Plan(a)) => cmd::plan::run(a),
        Some(Command::Verify(a)) => cmd::verify::run(a),
        Some(Command::Presets(a)) => cmd::presets::run(a),
        Some(Command::Train(a)) => cmd::train::run(a),
        Some(Command::Collbench(a)) => cmd::collbench::run(a),
        Some(Command::Report(a)) => cmd::report::run(a),
        Some(Command::Export(a)) => cmd::export::run(a),
        Some(Command::Simulate(a)) => cmd::simulate::run(a),
        Some(Command::Search(a)) => cmd::search::run(a),
        Some(Command::Calibrate(a)) => cmd::calibrate::run(a),
        Some(Command::Kernels(a)) => cmd::kernels::run(a),
        Some(Command::Probe(a)) => cmd::probe::run(a),
        Some(Command::Compare(a)) => cmd::compare::run(a),
        Some(Command::Goodput(a)) => cmd::goodput::run(a),
        Some(Command::Trace(a)) => cmd::trace::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", common::error_text(&e));
            ExitCode::from(common::exit_code(&e))
        }
    }
}
