//! `strata trace merge PRED.json MEASURED.json -o OUT.json`: the predicted and the measured
//! Chrome/Perfetto trace of one plan in one file, with distinct, named processes
//! (`strata_reports::trace_merge`).

use std::path::PathBuf;

use anyhow::Context;

use crate::common;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: TraceCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum TraceCommand {
    /// Put a predicted trace (`strata simulate --trace FILE`) and a measured one (`strata
    /// train --out DIR` → DIR/trace.json) of the same plan in one Perfetto file: predicted
    /// rank N and measured rank N become separate, named processes.
    Merge {
        /// The predicted (simulated) trace.
        predicted: PathBuf,
        /// The measured trace.
        measured: PathBuf,
        /// Where to write the merged trace.
        #[arg(short, long, value_name = "OUT.json")]
        out: PathBuf,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        TraceCommand::Merge { predicted, measured, out } => {
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p).with_context(|| format!("cannot read {}; pass a trace file", p.display()))
            };
            let (a, b) = (read(&predicted)?, read(&measured)?);
            let merged = strata_reports::merge_traces(
                &predicted.display().to_string(),
                &a,
                &measured.display().to_string(),
                &b,
            )?;
            common::write_file(&out, merged)?;
            eprintln!("merged trace: {} (open it in ui.perfetto.dev)", out.display());
            Ok(())
        }
    }
}
