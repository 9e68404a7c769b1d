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
//! Atomic: a shard is written to `rank-r.bin.tmp`, fsynced and renamed; once every rank
//! reported its shard's FNV-1a-64 checksum, rank 0 writes `manifest.json` the same way and
//! fsyncs the directory. A checkpoint without a manifest does not exist for `--resume`, so a
//! write killed midway leaves the previous one in force. Resuming checks the manifest
//! against the scenario (model, split, seed, data) and every shard against its checksum;
//! a mismatch or a corrupt shard is an error that names the field or the file.
//!
//! Shard format (little-endian): `STRATA-CKPT\0`, u32 version, u32 header length, a JSON
//! header (rank, step, array names and lengths, AdamW step counts), then the f32 arrays.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_models::{ModelSpec, ParallelConfig, Scenario};
use thiserror::Error;

use crate::exec::RankExec;

const MAGIC: &[u8; 12] = b"STRATA-CKPT\0";
const VERSION: u32 = 1;

#[derive(Debug, Error)]
pub enum CheckpointError {
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
        "no checkpoint to resume from in {0} (no step-* directory with a manifest.json); run without --resume first"
    )]
    NoneFound(PathBuf),
    #[error("checkpoint write of rank {rank} at step {step} killed midway (fault injection)")]
    Injected { rank: u32, step: u32 },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io { path: path.to_path_buf(), source }
}

/// One shard as listed in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub rank: u32,
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
    let json = serde_json::to_vec(&header).expect("a header serialises");
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
        shards,
    }
}

/// Rank 0's last act: the manifest, atomically, then the directory synced.
pub fn write_manifest(dir: &Path, m: &Manifest) -> Result<(), CheckpointError> {
    let sdir = step_dir(dir, m.step);
    let json = serde_json::to_vec_pretty(m).expect("a manifest serialises");
    write_atomic(&sdir.join("manifest.json"), &json, false)?;
    sync_dir(&sdir)?;
    sync_dir(dir)
}

/// The newest checkpoint in `dir` that has a manifest, and its manifest.
pub fn latest(dir: &Path) -> Result<(PathBuf, Manifest), CheckpointError> {
    let mut steps: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("step-")))
            .filter(|p| p.join("manifest.json").is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    steps.sort();
    let sdir = steps.pop().ok_or_else(|| CheckpointError::NoneFound(dir.to_path_buf()))?;
    let path = sdir.join("manifest.json");
    let text = fs::read(&path).map_err(io(&path))?;
    let m: Manifest = serde_json::from_slice(&text)
        .map_err(|e| CheckpointError::Corrupt { path: path.clone(), what: format!("manifest is not valid: {e}") })?;
    Ok((sdir, m))
}

/// Checks a manifest against the job about to resume; names every field that differs.
pub fn check_manifest(sdir: &Path, m: &Manifest, scenario: &Scenario, data: &str) -> Result<(), CheckpointError> {
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
        bad.push("the parallel settings (schedule, recomputation or sequence parallelism) differ".into());
    }
    if m.seed != scenario.training.seed {
        bad.push(format!("training.seed = {} in the checkpoint, {} in the scenario", m.seed, scenario.training.seed));
    }
    if m.data != data {
        bad.push(format!("data \"{}\" in the checkpoint, \"{data}\" now", m.data));
    }
    if m.shards.len() as u64 != scenario.parallel.ranks() {
        bad.push(format!("{} shards for {} ranks", m.shards.len(), scenario.parallel.ranks()));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::Mismatch { path: sdir.to_path_buf(), what: bad.join("; ") })
    }
}

/// Reads and verifies rank `rank`'s shard against the manifest.
fn read_shard(sdir: &Path, m: &Manifest, rank: u32) -> Result<Vec<u8>, CheckpointError> {
    let entry = m.shards.iter().find(|s| s.rank == rank).ok_or_else(|| CheckpointError::Corrupt {
        path: sdir.join("manifest.json"),
        what: format!("no shard listed for rank {rank}"),
    })?;
    let path = sdir.join(&entry.file);
    let bytes = fs::read(&path).map_err(io(&path))?;
    let sum = format!("{:016x}", fnv1a64(&bytes));
    if bytes.len() as u64 != entry.bytes || sum != entry.fnv1a64 {
        return Err(CheckpointError::Corrupt {
            path,
            what: format!(
                "{} bytes with checksum {sum}, the manifest says {} bytes with checksum {}",
                bytes.len(),
                entry.bytes,
                entry.fnv1a64
            ),
        });
    }
    Ok(bytes)
}

/// Verifies every shard of a checkpoint (before any rank starts).
pub fn verify_all(sdir: &Path, m: &Manifest) -> Result<(), CheckpointError> {
    for s in &m.shards {
        read_shard(sdir, m, s.rank)?;
    }
    Ok(())
}

/// Restores a rank's state from its shard; returns the step to run next.
pub fn load_shard(exec: &mut RankExec, sdir: &Path, m: &Manifest) -> Result<u32, CheckpointError> {
    let bytes = read_shard(sdir, m, exec.rank)?;
    let path = sdir.join(shard_name(exec.rank));
    let corrupt = |what: &str| CheckpointError::Corrupt { path: path.clone(), what: what.to_string() };
    if bytes.len() < 20 || &bytes[..12] != MAGIC {
        return Err(corrupt("not a Strata checkpoint shard"));
    }
    let hlen = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes")) as usize;
    let header: Header = bytes
        .get(20..20 + hlen)
        .and_then(|h| serde_json::from_slice(h).ok())
        .ok_or_else(|| corrupt("unreadable header"))?;
    let mut at = 20 + hlen;
    let mut next = |n: usize| -> Result<Vec<f32>, CheckpointError> {
        let raw = bytes.get(at..at + 4 * n).ok_or_else(|| corrupt("truncated data"))?;
        at += 4 * n;
        Ok(raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    };
    let mut arrays = header.arrays.iter();
    let mut adam_steps = header.adam_steps.iter();
    let mut take = |want: usize| -> Result<Vec<f32>, CheckpointError> {
        let (name, len) = arrays.next().ok_or_else(|| corrupt("fewer arrays than this rank holds"))?;
        if *len != want {
            return Err(corrupt(&format!("array {name} has {len} elements, this rank holds {want}")));
        }
        next(want)
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
            o.adamw.step = *adam_steps.next().ok_or_else(|| corrupt("missing AdamW step counts"))?;
        }
        c.grads.values_mut().for_each(|g| g.fill(0.0));
        c.grad_shards.iter_mut().for_each(|g| g.fill(0.0));
    }
    if header.rank != exec.rank || header.step != m.step {
        return Err(corrupt(&format!("shard of rank {} at step {}", header.rank, header.step)));
    }
    Ok(m.step)
}

/// Keeps the newest `keep` complete checkpoints and deletes older step directories.
pub fn prune(dir: &Path, keep: usize) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    let mut steps: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("step-")))
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    steps.sort();
    let n = steps.len().saturating_sub(keep);
    for old in &steps[..n] {
        let _ = fs::remove_dir_all(old);
    }
}
