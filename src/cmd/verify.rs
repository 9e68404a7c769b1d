//! `strata verify`: check a saved plan — group consistency, send/receive matching, no
//! deadlock, buffer lifetimes — and name the rank, op and reason of the first problem.

use std::path::PathBuf;

use anyhow::Context;
use strata_models::plan::{self, CheckedPlan, Plan};

use crate::common;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A plan saved by `strata plan --out FILE` (or `--json`).
    pub plan: PathBuf,
    /// Print the verification summary as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(&args.plan).with_context(|| format!("cannot read plan {}", args.plan.display()))?;
    let plan: Plan = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a Strata plan (JSON from `strata plan --out`)", args.plan.display()))?;
    // A hand-edited plan may index past its tables; check its shape before anything reads it.
    let plan = CheckedPlan::new(plan).with_context(|| format!("plan {} is malformed", args.plan.display()))?;
    let report = plan::verify(&plan).with_context(|| format!("plan {} is invalid", args.plan.display()))?;
    if args.json {
        return common::print_json(&report);
    }
    println!(
        "{} is valid: {} ranks, {} programs, {} ops, {} buffers; {} collectives and {} messages matched; no deadlock",
        args.plan.display(),
        report.ranks,
        report.programs,
        report.ops,
        report.buffers,
        report.collectives_matched,
        report.messages_matched
    );
    Ok(())
}
