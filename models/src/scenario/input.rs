//! What a scenario's input needs besides its tables: `--set` overrides applied to the
//! document, and the messages about input (a short excerpt of it, what to do about a
//! missing key or an unknown preset).

use super::ScenarioError;

/// Sets `a.b.c = value` in a TOML document.
pub(super) fn apply_override(doc: &mut toml::Table, spec: &str) -> Result<(), ScenarioError> {
    let bad = |reason: String| ScenarioError::BadOverride { spec: short(spec), reason: short(&reason) };
    let (key, value) =
        spec.split_once('=').ok_or_else(|| bad("expected KEY=VALUE, e.g. --set parallel.tp=4".into()))?;
    let key = key.trim();
    let value = value.trim();
    let path: Vec<&str> = key.split('.').collect();
    if path.iter().any(|p| p.is_empty()) {
        return Err(bad(format!("key \"{key}\" has an empty part; write it as section.key, e.g. parallel.tp")));
    }
    // A TOML value if it parses as one (4, 1.5, true, "x", [1, 2]); otherwise a bare string.
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let (last, parents) = path.split_last().expect("split of a non-empty key");
    let mut table = doc;
    for part in parents {
        let entry = table.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| bad(format!("\"{part}\" is a value, not a table")))?;
    }
    table.insert(last.to_string(), parsed);
    Ok(())
}

/// What an error may quote of the input: [`crate::limits::excerpt`].
pub(super) fn short(text: &str) -> String {
    crate::limits::excerpt(text, crate::limits::EXCERPT_CHARS)
}

/// What to do about a missing key: `[model]` and `[cluster]` have presets, `[parallel]`
/// and `[training]` do not.
pub(super) fn missing_hint(section: &str, key: &str) -> String {
    match section {
        "model" | "cluster" => format!(
            "set it, or start from a preset ({section}.preset = \"…\"; `strata presets` lists them)"
        ),
        _ => match key {
            "parallel.global_batch" => {
                "set it in [parallel] (e.g. global_batch = 512, sequences per step) or with --set parallel.global_batch=512"
                    .to_string()
            }
            _ => format!("set it (e.g. --set {key}=…)"),
        },
    }
}

/// A key that neither the table nor its preset gives.
pub(super) fn missing(origin: &str, section: &'static str, key: &str) -> ScenarioError {
    ScenarioError::Missing { origin: origin.to_string(), section, key: format!("{section}.{key}") }
}

/// A preset name not in the catalog.
pub(super) fn unknown_preset(origin: &str, section: &'static str, name: &str, known: &[&str]) -> ScenarioError {
    ScenarioError::UnknownPreset { origin: origin.to_string(), section, name: short(name), known: known.join(", ") }
}
