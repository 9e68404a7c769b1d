//! `strata report DIR`: build the predicted-vs-measured report (HTML with inline SVG plots,
//! the tables behind them as CSV, PNG and SVG plots, Chrome/Perfetto traces) from a
//! directory of results written by `strata compare` (or by hand, see strata-reports).

use std::path::PathBuf;

use crate::common;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A results directory: comparisons.json and/or landscape.csv, plans/<name>/….
    pub dir: PathBuf,
    /// Where to write the report (default: DIR/report).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the list of files written and the accuracy figures as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Written<'a> {
    html: &'a PathBuf,
    csv: &'a [PathBuf],
    png: &'a [PathBuf],
    svg: &'a [PathBuf],
    traces: &'a [PathBuf],
    accuracy: &'a strata_reports::Accuracy,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| args.dir.join("report"));
    let files = strata_reports::build_report(&args.dir, &out)?;
    if args.json {
        return common::print_json(&Written {
            html: &files.html,
            csv: &files.csv,
            png: &files.png,
            svg: &files.svg,
            traces: &files.traces,
            accuracy: &files.accuracy,
        });
    }
    println!(
        "report: {} ({} plots, {} tables, {} traces)",
        files.html.display(),
        files.svg.len(),
        files.csv.len(),
        files.traces.len()
    );
    Ok(())
}
