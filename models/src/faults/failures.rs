//! Failure processes of a long run (`[faults.failures]`): what `strata goodput` draws from.

use serde::{Deserialize, Serialize};

/// Failure rates, checkpoint and restart costs. Empty: the published defaults apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureSpec {}

impl FailureSpec {
    /// Nothing set (so a written-back scenario omits the table).
    pub fn is_default(&self) -> bool {
        *self == FailureSpec::default()
    }
}
