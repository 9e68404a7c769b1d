//! Physical sanity over many scenarios: every fabric × schedule × ZeRO stage × recompute
//! × dtype of a small GPU job simulates to a report with 0 ≤ MFU ≤ 1, HFU ≥ MFU, a
//! breakdown that sums to the step time and finite times — and a report that breaks one
//! rule is refused with the figure named.

use strata_models::Scenario;
use strata_models::plan::lower;
use strata_sim::sanity;
use strata_sim::simulate::{SimOptions, simulate};

fn scenario(fabric: &str, schedule: &str, zero: u8, recompute: &str, dtype: &str, gpu: &str) -> Scenario {
    let vpp = if schedule == "interleaved" { 2 } else { 1 };
    let text = format!(
        "[model]\npreset = \"gpt2-124m\"\nlayers = 8\n\
         [cluster]\ngpu = \"{gpu}\"\nnodes = 4\ngpus_per_node = 4\nnics_per_node = 4\nnic_gbps = 200\n\
         fabric = \"{fabric}\"\nswitch_radix = 8\nnodes_per_unit = 2\noversubscription = 2.0\n\
         [parallel]\ntp = 2\npp = 2\ndp = 4\nvpp = {vpp}\nschedule = \"{schedule}\"\nmicro_batch = 1\n\
         global_batch = 16\nzero = {zero}\nrecompute = \"{recompute}\"\n\
         [training]\ndtype = \"{dtype}\"\nframework = \"strata\"\n"
    );
    Scenario::from_toml(&text, "sanity", "sanity", &[]).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_report_over_many_scenarios_is_physical() {
    let mut n = 0;
    for fabric in ["single-switch", "fat-tree", "rail-optimized", "leaf-spine"] {
        for schedule in ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"] {
            for (zero, recompute, dtype, gpu) in [
                (0, "none", "bf16", "a100-80gb"),
                (1, "selective", "fp16", "h100-sxm"),
                (3, "full", "fp32", "b200"),
                (2, "none", "bf16", "h200-sxm"),
            ] {
                let s = scenario(fabric, schedule, zero, recompute, dtype, gpu);
                let plan = lower(&s).unwrap();
                let r = simulate(&plan, &SimOptions::default()).unwrap_or_else(|e| panic!("{fabric} {schedule}: {e}"));
                sanity::check(&r, true).unwrap_or_else(|e| panic!("{fabric} {schedule} zero {zero}: {e}"));
                assert!(r.mfu > 0.0 && r.mfu <= 1.0 && r.hfu >= r.mfu * (1.0 - 1e-6));
                let sum = r.breakdown_s.total();
                assert!((sum - r.step_time_s).abs() <= 1e-6 * r.step_time_s + 1e-9, "{sum} vs {}", r.step_time_s);
                n += 1;
            }
        }
    }
    assert_eq!(n, 80);
}

#[test]
fn a_report_that_breaks_physics_is_refused_naming_the_figure() {
    let s = scenario("fat-tree", "1f1b", 1, "none", "bf16", "h100-sxm");
    let good = simulate(&lower(&s).unwrap(), &SimOptions::default()).unwrap();
    sanity::check(&good, true).unwrap();
    let broken = |f: &dyn Fn(&mut strata_sim::SimReport)| {
        let mut r = good.clone();
        f(&mut r);
        sanity::check(&r, true).unwrap_err()
    };
    assert!(broken(&|r| r.mfu = 31.9).contains("mfu = 31.9"));
    assert!(broken(&|r| r.hfu = r.mfu / 2.0).contains("hfu"));
    assert!(broken(&|r| r.breakdown_s.bubble += 1.0).contains("breakdown"));
    assert!(broken(&|r| r.step_time_s = f64::INFINITY).contains("step_time_s = inf"));
    assert!(broken(&|r| r.tokens_per_s = f64::NAN).contains("tokens_per_s"));
    // A CPU rank's peak is nominal: MFU over 1 is then no error.
    let mut r = good.clone();
    r.mfu = 2.0;
    r.hfu = 2.0;
    assert!(sanity::check(&r, false).is_ok());
}
