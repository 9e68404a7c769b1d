//! What-ifs for one simulated step: slow ranks and degraded links (the entries of
//! `[faults] slow` and `[faults] degrade`).

use serde::{Deserialize, Serialize};

/// A straggler: rank `rank` runs its compute `factor` times slower (1.3 = 30% slower).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowRank {
    pub rank: u32,
    pub factor: f64,
}

/// A link (named as `strata simulate` lists them) that carries `factor` of its bandwidth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFactor {
    pub link: String,
    pub factor: f64,
}
