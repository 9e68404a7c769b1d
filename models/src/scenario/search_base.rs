//! A search's base scenario: everything but the parallel split is checked (the search
//! replaces the split, so the scenario's own need not be valid).

use std::path::Path;

use super::{Scenario, ScenarioError};

/// Whether resolving a scenario checks its parallel split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Split {
    Checked,
    /// A search's base: the split is replaced, so only the rest must be valid.
    Unchecked,
}

impl Scenario {
    /// As [`Scenario::load`], for a search: the model, the cluster, the batch and the
    /// training settings are checked, the parallel split is not (the search replaces it;
    /// [`crate::parallel::ParallelConfig::validate`] tells whether the scenario's own one is valid).
    pub fn load_for_search(path: &Path, overrides: &[String]) -> Result<Scenario, ScenarioError> {
        let origin = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| ScenarioError::Io { path: origin.clone(), source })?;
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Scenario::from_toml_with(&text, &origin, &stem, overrides, Split::Unchecked)
    }

    /// As [`Scenario::from_toml`], for a search (see [`Scenario::load_for_search`]).
    pub fn from_toml_for_search(
        text: &str,
        origin: &str,
        default_name: &str,
        overrides: &[String],
    ) -> Result<Scenario, ScenarioError> {
        Scenario::from_toml_with(text, origin, default_name, overrides, Split::Unchecked)
    }
}
