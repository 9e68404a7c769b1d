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

use std::path::Path;
use std::time::Instant;

use crate::cmd::calibrate::{self, Effort};
use crate::cmd::compare::{self, LoopConfig};
use crate::common::ScenarioArgs;

/// Where the main job writes.
pub const OUT: &str = "out/main";
/// Splits trained for real: the best of this many (tp, pp) cells.
pub const PLANS: usize = 6;

pub fn run() -> anyhow::Result<()> {
    let start = Instant::now();
    let base = ScenarioArgs::default().load()?;
    let out = Path::new(OUT);
    std::fs::create_dir_all(out)?;
    let ranks = base.parallel.ranks() as u32;
    eprintln!(
        "strata: the main job — {} on {ranks} CPU ranks: calibrate this machine, search, train the best splits, report",
        base.model.name
    );
    let mut log = |line: String| eprintln!("{line}");
    compare::wait_quiet(std::time::Duration::from_secs(60));
    let (profile, _) = calibrate::calibrate(&base, ranks, Effort::new(true), &mut log)?;
    let profile_path = out.join("profile.toml");
    std::fs::write(&profile_path, calibrate::profile_text(&profile, &base, ranks))?;
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
    let (inputs, _) = compare::compare(&cfg, &mut log)?;
    let files = compare::write(out, &inputs)?;
    print!("{}", compare::table(&inputs.comparisons));
    println!("profile: {} (measured on this machine)", profile_path.display());
    println!("report:  {}", files.html.display());
    println!("done in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}
