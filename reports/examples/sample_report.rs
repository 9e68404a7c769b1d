//! Writes a sample input directory and the report built from it, from synthetic timelines
//! of eight tiny-GPT plans: `cargo run -p strata-reports --example sample_report -- OUT`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/sample-report".to_string()));
    let inputs = support::sample_inputs(8);
    let dir = out.join("inputs");
    strata_reports::save_inputs(&dir, &inputs)?;
    let files = strata_reports::build_report(&dir, &out.join("report"))?;
    println!("report: {}", files.html.display());
    println!("median step-time error: {:.1}%", 100.0 * files.accuracy.median_abs_step_error);
    Ok(())
}
