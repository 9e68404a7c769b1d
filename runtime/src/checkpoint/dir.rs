//! The checkpoint directory's hygiene: what a run may find there when it starts, and what
//! it leaves behind.
//!
//! - A fresh run refuses a directory that holds anything ([`CheckpointError::NotEmpty`]):
//!   a later `--resume` would otherwise continue the older run.
//! - `--overwrite` deletes the Strata step directories (`step-NNNNNN` holding only
//!   `rank-*.bin`, `rank-*.tmp`, `manifest.json`, `manifest.tmp`) and refuses, deleting
//!   nothing, when the directory holds anything else.
//! - A resume, and every complete checkpoint, removes partial step directories (no
//!   manifest: a write that crashed midway); [`prune`] keeps the newest `keep` complete ones.

use std::fs;
use std::path::{Path, PathBuf};

use super::{CheckpointError, complete_steps, io, step_of};

/// How a run starts in its checkpoint directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A new run: the directory must be empty or absent.
    Fresh,
    /// A new run that deletes the checkpoints already there.
    Overwrite,
    /// Continue from the newest complete checkpoint.
    Resume,
}

/// An entry of a checkpoint directory.
enum Entry {
    /// A step directory of Strata's files; `complete` when it has a manifest.
    Step { path: PathBuf, complete: bool },
    /// Anything else (never deleted).
    Foreign(String),
}

/// A file Strata writes into a step directory.
fn own_file(name: &str) -> bool {
    let shard = name.strip_prefix("rank-").and_then(|r| r.strip_suffix(".bin").or_else(|| r.strip_suffix(".tmp")));
    matches!(name, "manifest.json" | "manifest.tmp")
        || shard.is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

fn entries(dir: &Path) -> Result<Vec<Entry>, CheckpointError> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let (path, name) = (e.path(), e.file_name().to_string_lossy().into_owned());
        let ours = step_of(&name).is_some()
            && path.is_dir()
            && fs::read_dir(&path).map_err(io(&path))?.all(|f| {
                f.is_ok_and(|f| f.file_type().is_ok_and(|t| t.is_file()) && own_file(&f.file_name().to_string_lossy()))
            });
        out.push(if ours {
            let complete = path.join("manifest.json").is_file();
            Entry::Step { path, complete }
        } else {
            Entry::Foreign(name)
        });
    }
    Ok(out)
}

fn remove(path: &Path) -> Result<(), CheckpointError> {
    fs::remove_dir_all(path).map_err(io(path))
}

/// Prepares `dir` for a run that starts as `start` (see the module's comment); creates it
/// when absent. Returns the step directories it removed.
pub fn prepare(dir: &Path, start: Start) -> Result<Vec<PathBuf>, CheckpointError> {
    if !dir.exists() {
        if start == Start::Resume {
            return Err(CheckpointError::NoneFound(dir.to_path_buf()));
        }
        fs::create_dir_all(dir).map_err(io(dir))?;
        return Ok(Vec::new());
    }
    if !dir.is_dir() {
        return Err(CheckpointError::Foreign { dir: dir.to_path_buf(), what: "it is a file, not a directory".into() });
    }
    let found = entries(dir)?;
    let foreign: Vec<&str> =
        found.iter().filter_map(|e| if let Entry::Foreign(n) = e { Some(n.as_str()) } else { None }).collect();
    let (complete, partial) = found.iter().fold((0, 0), |(c, p), e| match e {
        Entry::Step { complete: true, .. } => (c + 1, p),
        Entry::Step { complete: false, .. } => (c, p + 1),
        Entry::Foreign(_) => (c, p),
    });
    let mut removed = Vec::new();
    match start {
        Start::Fresh if !found.is_empty() => {
            let mut what = Vec::new();
            if complete > 0 {
                what.push(plural(complete, "checkpoint", "checkpoints"));
            }
            if partial > 0 {
                what.push(plural(partial, "partial step directory", "partial step directories"));
            }
            if !foreign.is_empty() {
                what.push(format!("{}: {}", plural(foreign.len(), "other entry", "other entries"), excerpt(&foreign)));
            }
            return Err(CheckpointError::NotEmpty { dir: dir.to_path_buf(), what: what.join(", ") });
        }
        Start::Fresh => {}
        Start::Overwrite => {
            if !foreign.is_empty() {
                return Err(CheckpointError::Foreign { dir: dir.to_path_buf(), what: excerpt(&foreign) });
            }
            for e in found {
                if let Entry::Step { path, .. } = e {
                    remove(&path)?;
                    removed.push(path);
                }
            }
        }
        Start::Resume => {
            for e in found {
                if let Entry::Step { path, complete: false } = e {
                    remove(&path)?;
                    removed.push(path);
                }
            }
        }
    }
    Ok(removed)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// At most five names, then a count.
fn excerpt(names: &[&str]) -> String {
    let mut v: Vec<String> = names.iter().take(5).map(|n| format!("{n:?}")).collect();
    if names.len() > 5 {
        v.push(format!("and {} more", names.len() - 5));
    }
    v.join(", ")
}

/// After a complete checkpoint: keeps the newest `keep` complete checkpoints and deletes
/// older ones and every partial step directory. Best effort: a directory that cannot be
/// deleted stays (the next run's start tries again).
pub fn prune(dir: &Path, keep: usize) {
    let steps = complete_steps(dir);
    let n = steps.len().saturating_sub(keep);
    for (_, old) in &steps[..n] {
        let _ = fs::remove_dir_all(old);
    }
    if let Ok(found) = entries(dir) {
        for e in found {
            if let Entry::Step { path, complete: false } = e {
                let _ = fs::remove_dir_all(path);
            }
        }
    }
}
