//! `[faults]` of a scenario: what can go wrong, as data. Two halves, read by different
//! tools:
//!
//! - **what-ifs for one step** (`whatif.rs`): slow ranks (a compute factor), degraded links (a
//!   bandwidth factor) and links or switches that are down — `strata simulate` costs the step
//!   with them;
//! - **failure processes for a long run** (`failures.rs`): how often components fail, what a
//!   checkpoint and a restart cost — `strata goodput` turns them into goodput and the best
//!   checkpoint interval.
//!
//! An absent `[faults]` table is the fault-free default, and a scenario written back by
//! `Scenario::to_toml` omits it.

pub mod failures;
pub mod whatif;

use serde::{Deserialize, Serialize};

pub use failures::FailureSpec;
pub use whatif::{LinkFactor, SlowRank};

/// The `[faults]` table.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Straggler ranks: `slow = [{ rank = 17, factor = 1.3 }]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slow: Vec<SlowRank>,
    /// Links that carry a fraction of their bandwidth: `degrade = [{ link = "…", factor = 0.5 }]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degrade: Vec<LinkFactor>,
    /// Links or switches that are down; traffic is rerouted by the fabric's routing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub down: Vec<String>,
    /// Failure rates, checkpoint and restart costs for `strata goodput`.
    #[serde(default, skip_serializing_if = "FailureSpec::is_default")]
    pub failures: FailureSpec,
}

impl Faults {
    /// Nothing set: the table is omitted when the scenario is written back.
    pub fn is_empty(&self) -> bool {
        *self == Faults::default()
    }

    /// No what-if for the step: the simulated step is the fault-free one.
    pub fn step_is_fault_free(&self) -> bool {
        self.slow.is_empty() && self.degrade.is_empty() && self.down.is_empty()
    }

    /// The step what-ifs within their limits on a cluster of `gpus` GPUs
    /// ([`whatif::check`]; link names are checked when the simulator wires the fabric).
    pub fn check_step(&self, gpus: u64) -> Result<(), String> {
        whatif::check(&self.slow, &self.degrade, &self.down, gpus)
    }

    /// The compute factor of `rank` (1 when it is not slow).
    pub fn slow_factor(&self, rank: u32) -> f64 {
        self.slow.iter().find(|s| s.rank == rank).map_or(1.0, |s| s.factor)
    }
}

#[cfg(test)]
mod tests {
    use crate::scenario::Scenario;

    const BASE: &str =
        "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\n[parallel]\ndp = 8\nglobal_batch = 8\n";

    #[test]
    fn absent_table_is_fault_free_and_not_written_back() {
        let s = Scenario::from_toml(BASE, "t", "t", &[]).unwrap();
        assert!(s.faults.is_empty() && s.faults.step_is_fault_free());
        assert!(!s.to_toml().contains("[faults"));
    }

    #[test]
    fn a_table_round_trips_and_unknown_keys_are_refused() {
        let text = format!("{BASE}[faults]\nslow = [{{ rank = 0, factor = 1.5 }}]\ndown = [\"spine0\"]\n");
        let s = Scenario::from_toml(&text, "t", "t", &[]).unwrap();
        assert_eq!(s.faults.slow[0].factor, 1.5);
        let back = Scenario::from_toml(&s.to_toml(), "t", "t", &[]).unwrap();
        assert_eq!(back.faults, s.faults);
        let bad = format!("{BASE}[faults]\nslwo = []\n");
        let e = Scenario::from_toml(&bad, "t", "t", &[]).unwrap_err().to_string();
        assert!(e.contains("slwo"), "{e}");
    }
}
