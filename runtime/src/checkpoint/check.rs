//! What a resume checks before any rank starts: the manifest against the job (model,
//! split, seed, data, the training settings unless a change is allowed), every shard entry
//! (a plain file name inside the step directory, each rank once), and every shard's bytes
//! (checksum, header, sizes, finite values). Each failure names the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use strata_models::Scenario;

use super::{CheckpointError, Manifest, ShardEntry, VERSION, corrupt, decode, read_shard};

/// Training settings a checkpoint does not pin: the run's length and the seed (the seed
/// is checked on its own, as part of the job's identity).
const UNPINNED: &[&str] = &["steps", "seed"];

/// The settings that change how a run trains, as `training.KEY` → value: every key of the
/// scenario's `[training]` table but `steps` and `seed`. A setting added to the table is
/// recorded (and checked on resume) without a change here.
pub fn recorded_settings(scenario: &Scenario) -> BTreeMap<String, serde_json::Value> {
    let Ok(serde_json::Value::Object(map)) = serde_json::to_value(&scenario.training) else {
        return BTreeMap::new();
    };
    map.into_iter()
        .filter(|(k, _)| !UNPINNED.contains(&k.as_str()))
        .map(|(k, v)| (format!("training.{k}"), v))
        .collect()
}

/// The `--allow-changed` keys, each as `training.KEY` (a bare `lr` means `training.lr`);
/// a key no checkpoint records is an error that lists the keys.
pub fn allowed_changes(scenario: &Scenario, keys: &[String]) -> Result<Vec<String>, CheckpointError> {
    let known = recorded_settings(scenario);
    keys.iter()
        .map(|k| {
            let full = if k.starts_with("training.") { k.clone() } else { format!("training.{k}") };
            if known.contains_key(&full) {
                Ok(full)
            } else {
                let keys = known.keys().cloned().collect::<Vec<_>>().join(", ");
                Err(CheckpointError::UnknownSetting { key: k.clone(), keys })
            }
        })
        .collect()
}

/// Whether a manifest's `file` is a plain file name: not empty, not `.` or `..`, no path
/// separator, no drive or NUL — so the shard it names lies inside the step directory.
fn plain_file_name(f: &str) -> bool {
    !f.is_empty() && f != "." && f != ".." && !f.contains(['/', '\\', ':', '\0']) && f.len() <= 255
}

/// The path of a shard entry's file, refused unless its name is a plain file name.
pub(super) fn shard_path(sdir: &Path, entry: &ShardEntry) -> Result<PathBuf, CheckpointError> {
    if !plain_file_name(&entry.file) {
        return Err(corrupt(
            &sdir.join("manifest.json"),
            format!(
                "the shard of rank {} is listed as {:?}, which is not a plain file name inside the checkpoint directory",
                entry.rank, entry.file
            ),
        ));
    }
    Ok(sdir.join(&entry.file))
}

/// Checks a manifest against the job about to resume; names every field that differs.
/// `allowed` are the `training.*` settings the user allows to differ ([`allowed_changes`]).
pub fn check_manifest(
    sdir: &Path,
    m: &Manifest,
    scenario: &Scenario,
    data: &str,
    allowed: &[String],
) -> Result<(), CheckpointError> {
    let mut bad = Vec::new();
    if m.format != VERSION {
        bad.push(format!("format {} (this build reads {VERSION})", m.format));
    }
    if m.model != scenario.model {
        bad.push(format!("model {:?} vs the scenario's {:?}", m.model, scenario.model));
    }
    let (a, b) = (&m.split, &scenario.parallel);
    for (key, x, y) in [
        ("tp", a.tp, b.tp),
        ("cp", a.cp, b.cp),
        ("pp", a.pp, b.pp),
        ("dp", a.dp, b.dp),
        ("vpp", a.vpp, b.vpp),
        ("micro_batch", a.micro_batch, b.micro_batch),
        ("global_batch", a.global_batch, b.global_batch),
        ("zero", a.zero as u32, b.zero as u32),
    ] {
        if x != y {
            bad.push(format!("parallel.{key} = {x} in the checkpoint, {y} in the scenario"));
        }
    }
    if a != b && bad.is_empty() {
        bad.push("the parallel settings (schedule, recomputation, sequence parallelism or cp_comm) differ".into());
    }
    if m.seed != scenario.training.seed {
        bad.push(format!("training.seed = {} in the checkpoint, {} in the scenario", m.seed, scenario.training.seed));
    }
    if m.data != data {
        bad.push(format!("data \"{}\" in the checkpoint, \"{data}\" now", m.data));
    }
    if !bad.is_empty() {
        return Err(CheckpointError::Mismatch { path: sdir.to_path_buf(), what: bad.join("; ") });
    }
    check_entries(sdir, m, scenario.parallel.ranks())?;
    // Checkpoints written before the settings were recorded have none to compare.
    if m.training.is_empty() {
        return Ok(());
    }
    let now = recorded_settings(scenario);
    let null = serde_json::Value::Null;
    let mut changed = Vec::new();
    for key in m.training.keys().chain(now.keys().filter(|k| !m.training.contains_key(*k))) {
        let (old, new) = (m.training.get(key).unwrap_or(&null), now.get(key).unwrap_or(&null));
        if old != new && !allowed.contains(key) {
            changed.push(format!("{key} = {old} in the checkpoint, {new} now (--allow-changed {key})"));
        }
    }
    if changed.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::Changed { path: sdir.to_path_buf(), what: changed.join("; ") })
    }
}

/// Every rank of the job listed once, each under a plain file name.
fn check_entries(sdir: &Path, m: &Manifest, ranks: u64) -> Result<(), CheckpointError> {
    let mpath = sdir.join("manifest.json");
    // The job's ranks are bounded by the plan (checked limits), so this is small.
    let mut seen = vec![false; ranks as usize];
    for e in &m.shards {
        shard_path(sdir, e)?;
        if u64::from(e.rank) >= ranks {
            return Err(corrupt(&mpath, format!("it lists a shard of rank {}, but the job has {ranks} ranks", e.rank)));
        }
        match seen.get_mut(e.rank as usize) {
            Some(s) if *s => return Err(corrupt(&mpath, format!("rank {} is listed twice", e.rank))),
            Some(s) => *s = true,
            None => {}
        }
    }
    let missing: Vec<String> =
        seen.iter().enumerate().filter(|(_, s)| !**s).take(5).map(|(r, _)| r.to_string()).collect();
    if !missing.is_empty() {
        return Err(corrupt(&mpath, format!("no shard listed for rank {}", missing.join(", "))));
    }
    Ok(())
}

/// Verifies every shard of a checkpoint before any rank starts: its checksum, its header
/// (the rank and step the manifest lists it for, array sizes that match the file) and that
/// every value is finite (a checkpoint never holds NaN or infinity).
pub fn verify_all(sdir: &Path, m: &Manifest) -> Result<(), CheckpointError> {
    for s in &m.shards {
        let (path, bytes) = read_shard(sdir, m, s.rank)?;
        let d = decode(&bytes).map_err(|what| corrupt(&path, what))?;
        if d.header.rank != s.rank || d.header.step != m.step {
            return Err(corrupt(
                &path,
                format!(
                    "it holds the shard of rank {} at step {}, the manifest lists it for rank {} at step {}",
                    d.header.rank, d.header.step, s.rank, m.step
                ),
            ));
        }
        for (name, values) in d.arrays() {
            if let Some(i) = values.iter().position(|x| !x.is_finite()) {
                return Err(corrupt(&path, format!("array {name} holds {} at element {i}", values[i])));
            }
        }
    }
    Ok(())
}
