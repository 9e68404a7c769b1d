//! `parallel.moe_a2a_overlap` in the engine: the merged program hides the expert
//! all-to-alls under the other microbatch's compute with no rule of its own in the simulator
//! (it only follows program order and deps). Mixtral 8x7B's shapes, cut to a few layers, on
//! one DGX H100 with the experts over 8 ranks: the exposed all-to-all and the step shrink,
//! the compute stays, and the result is the same bytes on every run.

use strata_models::Scenario;
use strata_models::plan::lower;
use strata_sim::{SimOptions, SimReport, simulate};

fn scenario(pp: u32, schedule: &str, overlap: bool) -> Scenario {
    let (vpp, dp) = (if schedule == "interleaved" { 2 } else { 1 }, 8 / pp);
    let text = format!(
        "[model]\npreset = \"mixtral-8x7b\"\nlayers = 4\nseq_len = 2048\nmoe = {{ skew = 0.0 }}\n\
         [cluster]\npreset = \"dgx-h100\"\nnodes = 1\n\
         [parallel]\ntp = 1\npp = {pp}\ndp = {dp}\nep = {dp}\nvpp = {vpp}\nschedule = \"{schedule}\"\nglobal_batch = {}\n\
         zero = 1\nmoe_a2a_overlap = {overlap}\n[training]\nframework = \"strata\"\n",
        8 * dp
    );
    Scenario::from_toml(&text, "test", "test", &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn run(s: &Scenario) -> SimReport {
    simulate(&lower(s).unwrap(), &SimOptions::default()).unwrap()
}

#[test]
fn merged_passes_hide_the_expert_all_to_all() {
    for (pp, schedule) in [(1, "1f1b"), (2, "interleaved")] {
        let plain = run(&scenario(pp, schedule, false));
        let merged = run(&scenario(pp, schedule, true));
        let (a, b) = (&plain.breakdown_s, &merged.breakdown_s);
        assert!(a.ep_exposed > 0.0, "pp{pp} {schedule}: nothing to hide: {a:?}");
        assert!(b.ep_exposed < 0.5 * a.ep_exposed, "pp{pp} {schedule}: exposed {} vs {}", b.ep_exposed, a.ep_exposed);
        assert!(merged.step_time_s < plain.step_time_s, "{} vs {}", merged.step_time_s, plain.step_time_s);
        // The same ops run: compute differs only by what overlapping changes in the
        // breakdown's attribution, not by work (within 2%).
        assert!((b.compute / a.compute - 1.0).abs() < 0.02, "compute {} vs {}", b.compute, a.compute);
    }
}

#[test]
fn merged_plans_simulate_deterministically() {
    let s = scenario(2, "interleaved", true);
    let (a, b) = (run(&s), run(&s));
    assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
}
