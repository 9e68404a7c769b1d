//! The main job — `strata` (`cargo run --release`) with no arguments: the whole loop on the
//! embedded default scenario (small-gpt on 8 CPU ranks), on this machine, from nothing.
//!
//! 1. calibrate this machine quickly (`strata calibrate --quick`): no profile is shipped,
//!    every run measures the host it runs on;
//! 2. search every split of the model on the local CPU "cluster" with that profile;
//! 3. train the best splits for real — the best of each (tp, pp), the fastest first — for a
//!    warm-up step and three measured steps each;
//! 4. write the predicted-vs-measured report, and say where it is.
//!
//! Everything goes to `out/main/` (the profile, the report's inputs, the report in
//! `out/main/report/report.html`). A few minutes on 2 cores.
//!
//! Measuring wants a quiet machine: before calibrating, and before measuring a loaded plan
//! again, the job waits for other processes to leave the CPU alone — at most
//! [`quiet::MAIN_JOB_LIMIT`] in all, saying so while it waits; `strata --no-wait` (or
//! `STRATA_NO_WAIT=1`) never waits. What was measured on a busy machine is marked (the
//! printed notes and the report's title).

use std::path::Path;
use std::time::Instant;

use strata_runtime::calibrate::CpuMeter;

use crate::cmd::calibrate::{self, Effort};
use crate::cmd::compare::{self, LoopConfig};
use crate::cmd::quiet::{self, QuietWait};
use crate::common::{self, ScenarioArgs};

/// Where the main job writes.
pub const OUT: &str = "out/main";
/// Splits trained for real: the best of this many (tp, pp) cells.
pub const PLANS: usize = 6;

/// Runs the main job; `no_wait` skips every wait for a quiet machine.
pub fn run(no_wait: bool) -> anyhow::Result<()> {
    let start = Instant::now();
    let base = ScenarioArgs::default().load()?;
    let out = Path::new(OUT);
    common::create_dir(out)?;
    let ranks = base.parallel.ranks() as u32;
    eprintln!(
        "strata: the main job — {} on {ranks} CPU ranks: calibrate this machine, search, train the best splits, report",
        base.model.name
    );
    let mut log = |line: String| eprintln!("{line}");
    let mut wait = QuietWait::new(quiet::MAIN_JOB_LIMIT, no_wait);
    wait.wait("calibrating", &mut log);
    let meter = CpuMeter::now();
    // The context-parallel pieces only where the search may pick cp (long sequences).
    let cp = strata_sim::search::SearchSpace::full(&base).cp.iter().any(|c| *c > 1);
    let (profile, _) = calibrate::calibrate(&base, ranks, Effort::for_plans(true, cp), &mut log)?;
    let calibration_load = meter.and_then(|m| m.foreign_share());
    let profile_path = out.join("profile.toml");
    common::write_file(&profile_path, calibrate::profile_text(&profile, &base, ranks))?;
    let (result, plans) = compare::search_top(&base, &profile, None, PLANS, &mut log)?;
    let cfg = LoopConfig {
        title: format!("{} on {ranks} CPU ranks (the main job)", base.model.name),
        plans,
        profile,
        network: None,
        steps: 3,
        warmup: 1,
        runs: 1,
        landscape: Some(compare::landscape_of(&result)),
        retries: 1,
    };
    let (inputs, loads) = compare::compare(&cfg, &mut wait, &mut log)?;
    let files = compare::write(out, &inputs)?;
    print!("{}", compare::table(&inputs.comparisons));
    if let Some(l) = calibration_load.filter(|l| *l > quiet::LOADED) {
        println!(
            "note: the calibration ran on a busy machine (other processes took {:.0}% of the CPU): the profile, and so \
             the predictions, are of a loaded machine",
            100.0 * l
        );
    }
    for note in quiet::busy_notes(inputs.comparisons.plans.iter().map(|p| p.name.as_str()), &loads) {
        println!("{note}");
    }
    println!("profile: {} (measured on this machine)", profile_path.display());
    println!("report:  {}", files.html.display());
    println!(
        "done in {:.0} s ({:.0} s of it waiting for a quiet machine)",
        start.elapsed().as_secs_f64(),
        wait.spent().as_secs_f64()
    );
    Ok(())
}
