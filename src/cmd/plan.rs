//! `strata plan`: lower a scenario to per-rank programs; print one rank's ops as text, or
//! the whole plan as JSON (which `strata verify` checks and the backends load).

use std::path::PathBuf;

use anyhow::Context;
use strata_models::plan;

use crate::common::{self, ScenarioArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// The rank whose program to print (0-based; ranks are ordered tp-cp-dp-pp).
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Print the whole plan as JSON instead.
    #[arg(long)]
    pub json: bool,
    /// Write the whole plan as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let s = args.scenario.load()?;
    let plan = plan::lower(&s)?;
    if args.rank >= plan.grid.ranks() {
        anyhow::bail!(
            "--rank {} is out of range: the plan has {} ranks (0..{})",
            args.rank,
            plan.grid.ranks(),
            plan.grid.ranks() - 1
        );
    }
    if let Some(path) = &args.out {
        let text = serde_json::to_string(&plan).context("serialising the plan")?;
        common::write_file(path, text)?;
        eprintln!("wrote {} ({} programs, {} ops)", path.display(), plan.programs.len(), plan.op_count());
    }
    if args.json {
        println!("{}", serde_json::to_string(&plan).context("serialising the plan")?);
    } else if args.out.is_none() {
        print!("{}", plan::text::program_text(&plan, args.rank));
    }
    Ok(())
}
