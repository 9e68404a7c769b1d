//! Checkpoints, sharded like the optimizer state: each rank writes its own shard.
//!
//! Layout of a checkpoint directory:
//!
//! ```text
//! DIR/step-000012/rank-00000.bin … rank-NNNNN.bin    one shard per rank
//! DIR/step-000012/manifest.json                      written last, by rank 0
//! ```
//!
//! A shard holds exactly the state that crosses a step boundary on its rank — its
//! parameters as it holds them (whole units under ZeRO 0–2, its owned parts under ZeRO-3),
//! the AdamW moments and step counts of its owned pieces, and the step reached (the data
//! position: step n reads batches from (n·dp + d)·m on, so nothing else is needed; there is
//! no dropout RNG). Gradients are zero between steps and are not written.
//!
//! Atomic: a shard is written to `rank-r.tmp`, fsynced and renamed; once every rank
//! reported its shard's FNV-1a-64 checksum, rank 0 writes `manifest.json` the same way and
//! fsyncs the directory. A checkpoint without a manifest does not exist for `--resume`, so a
//! write killed midway leaves the previous one in force; such partial step directories are
//! removed when a run starts and after every complete checkpoint ([`dir`]).
//!
//! Resuming checks the manifest against the scenario (model, split, seed, data, and the
//! training settings unless a change is allowed, [`check`]) and every shard — its name, its
//! checksum, its header (rank, step, array sizes) and that every value is finite — before
//! any rank starts. Every way a checkpoint can be unusable is a [`CheckpointError`] that
//! names the file; only a failed *write* is an I/O error ([`CheckpointError::Io`]).
//!
//! Shard format (little-endian): `STRATA-CKPT\0`, u32 version, u32 header length, a JSON
//! header (rank, step, array names and lengths, AdamW step counts), then the f32 arrays.

pub mod check;
pub mod dir;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_models::{ModelSpec, ParallelConfig, Scenario};
use thiserror::Error;

use crate::exec::RankExec;

pub use check::{allowed_changes, check_manifest, recorded_settings, verify_all};
pub use dir::{Start, prepare, prune};

const MAGIC: &[u8; 12] = b"STRATA-CKPT\0";
const VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum CheckpointError {
    /// A write or a directory operation failed: the run failed, not its input (exit 1).
    #[error("checkpoint I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {path} is corrupt: {what}; delete that checkpoint directory to resume from an earlier one")]
    Corrupt { path: PathBuf, what: String },
    #[error("checkpoint {path} does not match the scenario: {what}; resume with the scenario it was written with")]
    Mismatch { path: PathBuf, what: String },
    #[error(
        "checkpoint {path} was written with other training settings: {what}; resume with the settings it was written with, or pass --allow-changed KEY for each change you mean (repeatable)"
    )]
    Changed { path: PathBuf, what: String },
    #[error("--allow-changed {key}: not a setting a checkpoint records; the keys are {keys}")]
    UnknownSetting { key: String, keys: String },
    #[error(
        "checkpoint directory {dir} is not empty (it holds {what}); pass --resume to continue that run, or --overwrite to delete its checkpoints and start afresh"
    )]
    NotEmpty { dir: PathBuf, what: String },
    #[error(
        "--overwrite: {dir} holds entries that are not Strata checkpoints ({what}); nothing was deleted; choose an empty directory or move them away"
    )]
    Foreign { dir: PathBuf, what: String },
    #[error(
        "no checkpoint to resume from in {0} (no step-* directory with a manifest.json); run without --resume first"
    )]
    NoneFound(PathBuf),
    #[error("checkpoint write of rank {rank} at step {step} killed midway (fault injection)")]
    Injected { rank: u32, step: u32 },
}

impl CheckpointError {
    /// Whether the error is a failed write (the run failed) rather than an unusable
    /// checkpoint or a refused setting (bad input).
    pub fn is_io(&self) -> bool {
        matches!(self, CheckpointError::Io { .. } | CheckpointError::Injected { .. })
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

fn corrupt(path: &Path, what: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt { path: path.to_path_buf(), what: what.into() }
}

/// One shard as listed in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub rank: u32,
    /// The shard's file name inside the step directory (a plain name, never a path).
    pub file: String,
    pub bytes: u64,
    pub fnv1a64: String,
}

/// What a resume checks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub scenario: String,
    pub model: ModelSpec,
    pub split: ParallelConfig,
    pub seed: u64,
    /// The training data (its name), so a resume reads the same stream.
    pub data: String,
    /// Steps completed: a resume runs step `step` next.
    pub step: u32,
    /// The settings that change training (`training.lr`, …; see [`recorded_settings`]).
    /// Absent in checkpoints written before they were recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub training: BTreeMap<String, serde_json::Value>,
    pub shards: Vec<ShardEntry>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    rank: u32,
    step: u32,
    arrays: Vec<(String, usize)>,
    adam_steps: Vec<u64>,
}

/// FNV-1a, 64 bits: a checksum that catches torn writes and flipped bytes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

pub fn step_dir(dir: &Path, step: u32) -> PathBuf {
    dir.join(format!("step-{step:06}"))
}

/// The step a directory name `step-NNNNNN` stands for.
pub(crate) fn step_of(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("step-")?;
    if digits.len() < 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn shard_name(rank: u32) -> String {
    format!("rank-{rank:05}.bin")
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename. With `kill_midway`, writes
/// half of the temp file and stops (fault injection).
fn write_atomic(path: &Path, bytes: &[u8], kill_midway: bool) -> Result<(), CheckpointError> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    if kill_midway {
        f.write_all(&bytes[..bytes.len() / 2]).map_err(io(&tmp))?;
        return Ok(());
    }
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Serialises a rank's state.
fn encode(exec: &RankExec, step: u32) -> Vec<u8> {
    let mut arrays: Vec<(String, &[f32])> = Vec::new();
    let mut adam_steps = Vec::new();
    for (ci, c) in exec.chunks.iter().enumerate() {
        for (u, v) in &c.params {
            arrays.push((format!("c{ci}.params.{u:?}"), v));
        }
        for (bi, v) in c.param_shards.iter().enumerate() {
            arrays.push((format!("c{ci}.param-shard.{bi}"), v));
        }
        for (pi, o) in c.opt.iter().enumerate() {
            arrays.push((format!("c{ci}.adam{pi}.m"), &o.adamw.m));
            arrays.push((format!("c{ci}.adam{pi}.v"), &o.adamw.v));
            adam_steps.push(o.adamw.step);
        }
    }
    let header = Header {
        rank: exec.rank,
        step,
        arrays: arrays.iter().map(|(n, v)| (n.clone(), v.len())).collect(),
        adam_steps,
    };
    // A header of strings and integers always serialises.
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let mut out = Vec::with_capacity(json.len() + 20 + arrays.iter().map(|(_, v)| v.len() * 4).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    for (_, v) in arrays {
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    out
}

/// A shard's header and its arrays' bytes, proven consistent: the magic, the version,
/// a header that parses, and exactly as many bytes as the header's arrays need.
struct Decoded<'a> {
    header: Header,
    data: &'a [u8],
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn decode(bytes: &[u8]) -> Result<Decoded<'_>, String> {
    if bytes.len() < 20 || &bytes[..12] != MAGIC {
        return Err("not a Strata checkpoint shard (no STRATA-CKPT magic)".into());
    }
    let version = le_u32(&bytes[12..16]);
    if version != VERSION {
        return Err(format!("shard format {version}, this build reads {VERSION}"));
    }
    let hlen = le_u32(&bytes[16..20]) as usize;
    let raw = bytes
        .get(20..20usize.saturating_add(hlen))
        .ok_or_else(|| format!("header of {hlen} bytes runs past the end of the file"))?;
    let header: Header = serde_json::from_slice(raw).map_err(|e| format!("unreadable header: {e}"))?;
    let data = &bytes[20 + hlen..];
    let want = header.arrays.iter().try_fold(0usize, |n, (_, len)| n.checked_add(len.checked_mul(4)?));
    if want != Some(data.len()) {
        return Err(format!(
            "the header lists arrays of {} bytes, the file holds {} bytes of data",
            want.map_or("more than 2^64".into(), |w| w.to_string()),
            data.len()
        ));
    }
    Ok(Decoded { header, data })
}

impl Decoded<'_> {
    /// Each array's name and values, in order.
    fn arrays(&self) -> impl Iterator<Item = (&str, Vec<f32>)> + '_ {
        let mut at = 0;
        self.header.arrays.iter().map(move |(name, len)| {
            let raw = &self.data[at..at + 4 * len];
            at += 4 * len;
            (name.as_str(), raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        })
    }
}

/// Writes this rank's shard of the checkpoint after `step` steps; returns its manifest entry.
pub fn write_shard(exec: &RankExec, dir: &Path, step: u32, kill_midway: bool) -> Result<ShardEntry, CheckpointError> {
    let sdir = step_dir(dir, step);
    fs::create_dir_all(&sdir).map_err(io(&sdir))?;
    let bytes = encode(exec, step);
    let path = sdir.join(shard_name(exec.rank));
    write_atomic(&path, &bytes, kill_midway)?;
    if kill_midway {
        return Err(CheckpointError::Injected { rank: exec.rank, step });
    }
    Ok(ShardEntry {
        rank: exec.rank,
        file: shard_name(exec.rank),
        bytes: bytes.len() as u64,
        fnv1a64: format!("{:016x}", fnv1a64(&bytes)),
    })
}

/// The manifest a run of `scenario` on `data` writes after `step` steps.
pub fn manifest(scenario: &Scenario, data: &str, step: u32, mut shards: Vec<ShardEntry>) -> Manifest {
    shards.sort_by_key(|s| s.rank);
    Manifest {
        format: VERSION,
        scenario: scenario.name.clone(),
        model: scenario.model.clone(),
        split: scenario.parallel.clone(),
        seed: scenario.training.seed,
        data: data.to_string(),
        step,
        training: recorded_settings(scenario),
        shards,
    }
}

/// Rank 0's last act: the manifest, atomically, then the directory synced.
pub fn write_manifest(dir: &Path, m: &Manifest) -> Result<(), CheckpointError> {
    let sdir = step_dir(dir, m.step);
    let path = sdir.join("manifest.json");
    let json = serde_json::to_vec_pretty(m)
        .map_err(|e| CheckpointError::Io { path: path.clone(), source: std::io::Error::other(e) })?;
    write_atomic(&path, &json, false)?;
    sync_dir(&sdir)?;
    sync_dir(dir)
}

/// The complete checkpoints (step directories with a manifest) in `dir`, oldest first.
pub(crate) fn complete_steps(dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    let mut steps: Vec<(u32, PathBuf)> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| Some((step_of(p.file_name()?.to_str()?)?, p)))
        .filter(|(_, p)| p.join("manifest.json").is_file())
        .collect();
    steps.sort();
    steps
}

/// The newest checkpoint in `dir` that has a manifest, and its manifest.
pub fn latest(dir: &Path) -> Result<(PathBuf, Manifest), CheckpointError> {
    let (step, sdir) = complete_steps(dir).pop().ok_or_else(|| CheckpointError::NoneFound(dir.to_path_buf()))?;
    let path = sdir.join("manifest.json");
    let text = fs::read(&path).map_err(|e| corrupt(&path, format!("cannot be read: {e}")))?;
    let m: Manifest =
        serde_json::from_slice(&text).map_err(|e| corrupt(&path, format!("manifest is not valid: {e}")))?;
    if m.step != step {
        return Err(corrupt(&path, format!("the manifest says step {}, but it lies in step-{step:06}", m.step)));
    }
    Ok((sdir, m))
}

/// Reads rank `rank`'s shard and checks it against the manifest (size and checksum).
fn read_shard(sdir: &Path, m: &Manifest, rank: u32) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
    let entry = m
        .shards
        .iter()
        .find(|s| s.rank == rank)
        .ok_or_else(|| corrupt(&sdir.join("manifest.json"), format!("no shard listed for rank {rank}")))?;
    let path = check::shard_path(sdir, entry)?;
    let bytes = fs::read(&path).map_err(|e| corrupt(&path, format!("the shard cannot be read: {e}")))?;
    let sum = format!("{:016x}", fnv1a64(&bytes));
    if bytes.len() as u64 != entry.bytes || sum != entry.fnv1a64 {
        return Err(corrupt(
            &path,
            format!(
                "{} bytes with checksum {sum}, the manifest says {} bytes with checksum {}",
                bytes.len(),
                entry.bytes,
                entry.fnv1a64
            ),
        ));
    }
    Ok((path, bytes))
}

/// Restores a rank's state from its shard; returns the step to run next.
pub fn load_shard(exec: &mut RankExec, sdir: &Path, m: &Manifest) -> Result<u32, CheckpointError> {
    let (path, bytes) = read_shard(sdir, m, exec.rank)?;
    let d = decode(&bytes).map_err(|what| corrupt(&path, what))?;
    if d.header.rank != exec.rank || d.header.step != m.step {
        return Err(corrupt(
            &path,
            format!(
                "it holds the shard of rank {} at step {}, the manifest lists it for rank {} at step {}",
                d.header.rank, d.header.step, exec.rank, m.step
            ),
        ));
    }
    let mut arrays = d.arrays();
    let mut adam_steps = d.header.adam_steps.iter();
    let mut take = |want: usize| -> Result<Vec<f32>, CheckpointError> {
        let (name, v) = arrays.next().ok_or_else(|| corrupt(&path, "fewer arrays than this rank holds"))?;
        if v.len() != want {
            return Err(corrupt(&path, format!("array {name} has {} elements, this rank holds {want}", v.len())));
        }
        Ok(v)
    };
    for c in exec.chunks.iter_mut() {
        for v in c.params.values_mut() {
            *v = take(v.len())?;
        }
        for v in c.param_shards.iter_mut() {
            *v = take(v.len())?;
        }
        for o in c.opt.iter_mut() {
            o.adamw.m = take(o.adamw.m.len())?;
            o.adamw.v = take(o.adamw.v.len())?;
            o.adamw.step = *adam_steps.next().ok_or_else(|| corrupt(&path, "missing AdamW step counts"))?;
        }
        c.grads.values_mut().for_each(|g| g.fill(0.0));
        c.grad_shards.iter_mut().for_each(|g| g.fill(0.0));
    }
    if arrays.next().is_some() {
        return Err(corrupt(&path, "more arrays than this rank holds"));
    }
    Ok(m.step)
}
