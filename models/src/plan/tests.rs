//! Tests of the lowering and the verifier over many configurations.

use crate::parallel::{Recompute, Schedule};
use crate::plan::*;
use crate::scenario::Scenario;

/// A tiny-gpt scenario on a one-node CPU cluster of tp·pp·dp ranks.
pub(crate) fn tiny(
    tp: u32,
    pp: u32,
    dp: u32,
    vpp: u32,
    schedule: Schedule,
    zero: u8,
    recompute: Recompute,
    sp: bool,
    m: u32,
) -> Scenario {
    let text = format!(
        r#"
[model]
preset = "tiny-gpt-deep"
[cluster]
preset = "cpu-local"
gpus_per_node = {gpus}
[parallel]
tp = {tp}
pp = {pp}
dp = {dp}
vpp = {vpp}
schedule = "{sched}"
micro_batch = 1
global_batch = {gb}
zero = {zero}
recompute = "{rc}"
sequence_parallel = {sp}
grad_bucket_mb = 0.05
"#,
        gpus = tp * pp * dp,
        sched = schedule.key(),
        gb = m * dp,
        rc = recompute.key(),
    );
    Scenario::from_toml(&text, "test", "test", &[]).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_schedule_zero_and_recompute_lowers_and_verifies() {
    let mut n = 0;
    for (tp, pp, dp) in [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2), (1, 4, 2), (2, 4, 1)] {
        for schedule in Schedule::ALL {
            let vpp = if schedule == Schedule::Interleaved { 2 } else { 1 };
            if schedule == Schedule::Interleaved && pp < 2 {
                continue;
            }
            for zero in 0..=3 {
                for recompute in Recompute::ALL {
                    for sp in [false, true] {
                        if sp && tp < 2 {
                            continue;
                        }
                        let s = tiny(tp, pp, dp, vpp, schedule, zero, recompute, sp, 2 * pp);
                        let plan = lower(&s).unwrap();
                        verify(&plan).unwrap_or_else(|e| {
                            panic!("tp{tp} pp{pp} dp{dp} {schedule:?} zero{zero} {recompute:?} sp{sp}: {e}")
                        });
                        n += 1;
                    }
                }
            }
        }
    }
    assert!(n > 300, "{n} configurations");
}
