//! Physical sanity of a simulated step, asserted as errors (never panics).
//!
//! Whatever the scenario, a report the simulator returns obeys physics and its own
//! definitions: every time is finite and non-negative and below the clock's horizon
//! ([`HORIZON_NS`], 2^62 ns ≈ 146 years); 0 ≤ MFU ≤ 1 (no GPU runs faster than its
//! datasheet peak — checked where the op times come from a profile of a GPU; a CPU rank's
//! peak is a nominal figure a calibrated host may beat, and tests time ops as they like);
//! HFU ≥ MFU (what is executed includes what the model needs); the
//! breakdown of the last rank sums to the step time (within [`SUM_TOLERANCE`] of it, for
//! rounding of nanoseconds); throughputs are finite. A report that breaks one is refused
//! with [`crate::SimError::Insane`] naming the figure, so no command prints nonsense.

use crate::simulate::SimReport;

/// The simulated clock's horizon: a step that would end later is refused.
pub const HORIZON_NS: u64 = 1 << 62;
/// Relative slack of the breakdown's sum against the step time.
pub const SUM_TOLERANCE: f64 = 1e-6;
/// Relative slack of HFU against MFU (the plan's FLOPs are summed op by op, the model's
/// FLOPs come from a closed form; the two agree to rounding when nothing is recomputed).
pub const HFU_TOLERANCE: f64 = 1e-6;

/// The first rule `r` breaks, as a sentence naming the figure. `peak_bound`: the op times
/// came from a GPU's profile, so MFU ≤ 1 holds too.
pub fn check(r: &SimReport, peak_bound: bool) -> Result<(), String> {
    let b = &r.breakdown_s;
    let figures = [
        ("step_time_s", r.step_time_s),
        ("tokens_per_s", r.tokens_per_s),
        ("model_tflops_per_gpu", r.model_tflops_per_gpu),
        ("hardware_tflops_per_gpu", r.hardware_tflops_per_gpu),
        ("mfu", r.mfu),
        ("hfu", r.hfu),
        ("breakdown_s.compute", b.compute),
        ("breakdown_s.tp_exposed", b.tp_exposed),
        ("breakdown_s.dp_exposed", b.dp_exposed),
        ("breakdown_s.pp_exposed", b.pp_exposed),
        ("breakdown_s.bubble", b.bubble),
        ("breakdown_s.optimizer", b.optimizer),
    ];
    for (name, v) in figures {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("{name} = {v} is not a finite, non-negative number"));
        }
    }
    if r.step_time_s <= 0.0 || r.step_time_s * 1e9 >= HORIZON_NS as f64 {
        return Err(format!("step_time_s = {} is outside (0, 2^62 ns)", r.step_time_s));
    }
    if peak_bound && r.mfu > 1.0 {
        return Err(format!("mfu = {} is over 1: no GPU runs faster than its peak", r.mfu));
    }
    if r.hfu < r.mfu * (1.0 - HFU_TOLERANCE) {
        return Err(format!("hfu = {} is below mfu = {}: executed FLOPs include the model's", r.hfu, r.mfu));
    }
    let sum = b.total();
    if (sum - r.step_time_s).abs() > SUM_TOLERANCE * r.step_time_s + 1e-9 {
        return Err(format!("the breakdown sums to {sum} s, not the step time {} s", r.step_time_s));
    }
    Ok(())
}

/// Ops stuck at the clock's end (times saturate there) ran out of time, not order: not a
/// deadlock.
pub fn past_horizon(ops_left: usize) -> crate::SimError {
    crate::SimError::Insane(format!("the step runs past the clock's horizon of 2^62 ns ({ops_left} ops left)"))
}
