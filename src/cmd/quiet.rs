//! Waiting for a quiet machine before measuring: bounded in total for a whole job, said
//! while it waits (what it waits for, the limit, progress), and skippable (`--no-wait`, or
//! `STRATA_NO_WAIT=1` in the environment, for CI and tests).
//!
//! A measurement taken while other processes loaded the machine is not hidden: the callers
//! record the share of the CPU that went elsewhere and mark those plans in the report.

use std::time::{Duration, Instant};

use strata_runtime::calibrate::CpuMeter;

/// Above this share of the machine's CPU taken by other processes, a measurement is loaded.
pub const LOADED: f64 = 0.1;
/// The environment variable that turns the wait off (any value but empty or `0`).
pub const NO_WAIT_ENV: &str = "STRATA_NO_WAIT";
/// The main job's whole budget for waiting, every wait together.
pub const MAIN_JOB_LIMIT: Duration = Duration::from_secs(60);
/// One look at the load: the share of the CPU others took over this long.
const PROBE: Duration = Duration::from_secs(1);
/// How often a wait says it is still waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Whether the environment asks not to wait.
pub fn env_says_no_wait() -> bool {
    std::env::var(NO_WAIT_ENV).is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

/// A job's budget for waiting, spent by every [`QuietWait::wait`] together.
#[derive(Debug)]
pub struct QuietWait {
    limit: Duration,
    spent: Duration,
    enabled: bool,
    announced: bool,
    told_spent: bool,
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Waited {
    /// Other processes took under [`LOADED`] of the CPU over a second.
    Quiet,
    /// The budget ran out while others took this share.
    Busy(f64),
    /// Not waited: waiting is off, the budget was already spent, or the load cannot be
    /// measured on this system.
    Skipped,
}

impl QuietWait {
    /// A budget of `limit` in all; `no_wait` (or [`NO_WAIT_ENV`]) turns waiting off.
    pub fn new(limit: Duration, no_wait: bool) -> QuietWait {
        QuietWait {
            limit,
            spent: Duration::ZERO,
            enabled: !no_wait && !env_says_no_wait(),
            announced: false,
            told_spent: false,
        }
    }

    /// Seconds spent waiting so far.
    pub fn spent(&self) -> Duration {
        self.spent
    }

    /// Waits until other processes leave the machine alone (under [`LOADED`] of its CPU
    /// over a second), for at most what is left of the budget, before `what` (e.g.
    /// "calibrating"). The first wait says what it waits for and the limit; a progress line
    /// follows every 10 s. Once the budget is spent, it returns at once (saying so once).
    pub fn wait(&mut self, what: &str, log: &mut dyn FnMut(String)) -> Waited {
        if !self.enabled {
            if !self.announced {
                self.announced = true;
                log(format!(
                    "not waiting for a quiet machine (--no-wait or {NO_WAIT_ENV}); a measurement taken while other \
                     processes load the machine is marked as such"
                ));
            }
            return Waited::Skipped;
        }
        if self.spent >= self.limit {
            if !self.told_spent {
                self.told_spent = true;
                log(format!(
                    "the {:.0} s budget for waiting for a quiet machine is spent: no more waiting; what is measured \
                     on a busy machine from now on is marked as such",
                    self.limit.as_secs_f64()
                ));
            }
            return Waited::Skipped;
        }
        let start = Instant::now();
        let mut next_progress = PROGRESS_EVERY;
        let mut first = true;
        loop {
            let probe = Instant::now();
            let Some(m) = CpuMeter::now() else { return Waited::Skipped };
            // The last probe may be shorter, so that the budget is never overrun.
            std::thread::sleep(PROBE.min(self.limit.saturating_sub(self.spent)).max(Duration::from_millis(100)));
            let load = m.foreign_share().unwrap_or(0.0);
            self.spent += probe.elapsed();
            if load <= LOADED {
                if !first {
                    log(format!("quiet now, after {:.0} s; {what}", start.elapsed().as_secs_f64()));
                }
                return Waited::Quiet;
            }
            let left = self.limit.saturating_sub(self.spent);
            if left.is_zero() {
                self.told_spent = true;
                log(format!(
                    "the machine stayed busy ({:.0}% of the CPU elsewhere) until the {:.0} s budget for waiting ran \
                     out; no more waiting (what is measured on a busy machine is marked as such)",
                    100.0 * load,
                    self.limit.as_secs_f64()
                ));
                return Waited::Busy(load);
            }
            if first {
                first = false;
                let how = if self.announced { "" } else { " (--no-wait or STRATA_NO_WAIT=1 skips this)" };
                self.announced = true;
                log(format!(
                    "waiting for a quiet machine before {what}: other processes take {:.0}% of the CPU, measuring \
                     wants under {:.0}%; waiting at most {:.0} s more ({:.0} s in all for this job){how}",
                    100.0 * load,
                    100.0 * LOADED,
                    left.as_secs_f64(),
                    self.limit.as_secs_f64()
                ));
            } else if start.elapsed() >= next_progress {
                next_progress += PROGRESS_EVERY;
                log(format!(
                    "  still waiting: {:.0} s so far, other processes take {:.0}% of the CPU; at most {:.0} s left",
                    start.elapsed().as_secs_f64(),
                    100.0 * load,
                    left.as_secs_f64()
                ));
            }
        }
    }
}

/// One line per measurement that ran while other processes took more than [`LOADED`] of
/// the CPU (`loads[i]` belongs to `names[i]`); empty when every one ran on a quiet machine.
pub fn busy_notes<'a>(names: impl IntoIterator<Item = &'a str>, loads: &[Option<f64>]) -> Vec<String> {
    names
        .into_iter()
        .zip(loads)
        .filter_map(|(name, l)| match l {
            Some(l) if *l > LOADED => Some(format!(
                "note: {name} was measured on a busy machine: other processes took {:.0}% of the CPU meanwhile, so \
                 its measured time is pessimistic",
                100.0 * l
            )),
            _ => None,
        })
        .collect()
}

/// The largest share of the CPU other processes took over `loads`, if any was measured.
pub fn worst(loads: &[Option<f64>]) -> Option<f64> {
    loads.iter().flatten().copied().fold(None, |a: Option<f64>, l| Some(a.map_or(l, |a| a.max(l))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_wait_returns_at_once_and_says_so_once() {
        let mut w = QuietWait::new(Duration::from_secs(60), true);
        let mut lines = Vec::new();
        let t = Instant::now();
        assert_eq!(w.wait("calibrating", &mut |l| lines.push(l)), Waited::Skipped);
        assert_eq!(w.wait("training", &mut |l| lines.push(l)), Waited::Skipped);
        assert!(t.elapsed() < Duration::from_millis(500));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("--no-wait"), "{lines:?}");
    }

    #[test]
    fn the_budget_bounds_every_wait_together() {
        // A busy machine or a quiet one: never more than the budget (plus the last probe's
        // bookkeeping), however many waits ask.
        let mut w = QuietWait::new(Duration::from_millis(2500), false);
        let mut lines = Vec::new();
        let t = Instant::now();
        for _ in 0..5 {
            let r = w.wait("measuring", &mut |l| lines.push(l));
            assert!(matches!(r, Waited::Quiet | Waited::Busy(_) | Waited::Skipped), "{r:?}");
        }
        assert!(t.elapsed() < Duration::from_millis(2500 * 5).min(Duration::from_secs(4)), "{:?}", t.elapsed());
        assert!(w.spent() <= Duration::from_millis(2700), "{:?}", w.spent());
        assert!(lines.iter().filter(|l| l.contains("waiting at most")).count() <= 5, "{lines:?}");
        let mut none = QuietWait::new(Duration::ZERO, false);
        let t = Instant::now();
        assert_eq!(none.wait("calibrating", &mut |_| {}), Waited::Skipped);
        assert!(t.elapsed() < Duration::from_millis(200));
    }

    #[test]
    fn busy_plans_get_a_note() {
        let notes = busy_notes(["a", "b", "c"], &[Some(0.05), Some(0.5), None]);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("b was measured on a busy machine") && notes[0].contains("50%"), "{notes:?}");
        assert_eq!(worst(&[Some(0.05), Some(0.5), None]), Some(0.5));
        assert_eq!(worst(&[None]), None);
    }
}
