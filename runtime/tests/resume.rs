//! Checkpoints: a resumed run is bit-identical to an uninterrupted one, a checkpoint write
//! killed midway leaves the previous checkpoint in force, and a corrupt shard or a
//! checkpoint of another job is refused with a message naming the file or the field.

mod common;

use std::path::{Path, PathBuf};

use strata_runtime::checkpoint;
use strata_runtime::train::{CheckpointOptions, Fault, TrainError, TrainOptions};

const SPLIT: &[&str] = &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=1"];

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn with_ckpt(steps: u32, dir: &Path, every: u32, resume: bool) -> TrainOptions {
    let mut o = common::options(steps);
    o.checkpoint = Some(CheckpointOptions {
        dir: dir.to_path_buf(),
        every,
        resume,
        keep: 3,
        overwrite: false,
        allow_changed: Vec::new(),
    });
    o
}

fn bits(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn resume_is_bit_identical_to_an_uninterrupted_run() {
    for (name, split) in [
        ("zero1", SPLIT),
        ("zero3-sp", &["parallel.tp=2", "parallel.dp=4", "parallel.zero=3", "parallel.sequence_parallel=true"][..]),
    ] {
        let whole = common::train(split, &common::options(6)).unwrap().losses();
        let d = dir(name);
        let first = common::train(split, &with_ckpt(3, &d, 0, false)).unwrap();
        assert_eq!(bits(&first.losses()), bits(&whole[..3]), "{name}: the first half differs");
        let rest = common::train(split, &with_ckpt(6, &d, 0, true)).unwrap();
        assert_eq!(rest.start_step, 3, "{name}");
        assert_eq!(bits(&rest.losses()), bits(&whole[3..]), "{name}: resumed losses differ from the uninterrupted run");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn a_checkpoint_write_killed_midway_leaves_the_previous_one_loadable() {
    let whole = common::train(SPLIT, &common::options(6)).unwrap().losses();
    let d = dir("killed");
    // Checkpoints after steps 2 and 4; rank 3's write after step 4 dies halfway.
    let mut opts = with_ckpt(6, &d, 2, false);
    opts.faults = vec![Fault::KillCheckpointWrite { rank: 3, step: 3 }];
    let e = common::train(SPLIT, &opts).unwrap_err().to_string();
    assert!(e.contains("rank 3") && e.contains("killed midway"), "{e}");
    assert!(d.join("step-000004/rank-00003.tmp").exists(), "the torn write is left behind");
    assert!(!d.join("step-000004/manifest.json").exists(), "a torn checkpoint must not get a manifest");
    let (sdir, m) = checkpoint::latest(&d).unwrap();
    assert_eq!((m.step, sdir.file_name().unwrap().to_str().unwrap()), (2, "step-000002"));
    let rest = common::train(SPLIT, &with_ckpt(6, &d, 2, true)).unwrap();
    assert_eq!(rest.start_step, 2);
    assert_eq!(bits(&rest.losses()), bits(&whole[2..]));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_corrupt_shard_or_another_jobs_checkpoint_is_refused_by_name() {
    let d = dir("corrupt");
    common::train(SPLIT, &with_ckpt(2, &d, 0, false)).unwrap();
    // Another split: the manifest says so, naming the field.
    let e = common::train(
        &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=2"],
        &with_ckpt(4, &d, 0, true),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, TrainError::Checkpoint(_)) && msg.contains("parallel.zero = 1 in the checkpoint"), "{msg}");
    // One flipped byte in rank 2's shard.
    let shard = d.join("step-000002/rank-00002.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    let e = common::train(SPLIT, &with_ckpt(4, &d, 0, true)).unwrap_err().to_string();
    assert!(e.contains("rank-00002.bin") && e.contains("corrupt"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
    let e = common::train(SPLIT, &with_ckpt(4, &d, 0, true)).unwrap_err().to_string();
    assert!(e.contains("no checkpoint to resume from"), "{e}");
}

#[test]
fn a_divergence_stops_the_run_naming_step_rank_and_tensor_and_keeps_the_last_good_checkpoint() {
    let split = &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=1", "training.lr=1e3"];
    let d = dir("diverged");
    let e = common::train(split, &with_ckpt(12, &d, 1, false)).unwrap_err();
    let msg = e.to_string();
    let TrainError::Diverged { step, tensor, value, .. } = e else { panic!("not a divergence: {msg}") };
    assert!(!value.is_finite(), "{msg}");
    assert!(msg.contains(&format!("step {step}")) && msg.contains("rank ") && msg.contains(&tensor), "{msg}");
    // Steps 0..step completed and were checkpointed; the diverged step was not.
    let (_, m) = checkpoint::latest(&d).unwrap();
    assert_eq!(m.step, step, "{msg}");
    assert!(!checkpoint::step_dir(&d, step + 1).exists(), "a step directory for the diverged step is left: {msg}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_resume_refuses_a_changed_setting_unless_allowed() {
    let d = dir("changed");
    common::train(SPLIT, &with_ckpt(2, &d, 0, false)).unwrap();
    let mut changed = SPLIT.to_vec();
    changed.extend(["training.lr=2e-3", "training.weight_decay=0.5"]);
    let e = common::train(&changed, &with_ckpt(3, &d, 0, true)).unwrap_err().to_string();
    for w in
        ["training.lr = 0.001 in the checkpoint, 0.002 now", "training.weight_decay", "--allow-changed training.lr"]
    {
        assert!(e.contains(w), "lacks {w:?}: {e}");
    }
    let mut opts = with_ckpt(3, &d, 0, true);
    if let Some(ck) = opts.checkpoint.as_mut() {
        ck.allow_changed = vec!["training.lr".into(), "weight_decay".into()];
    }
    assert_eq!(common::train(&changed, &opts).unwrap().start_step, 2);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_fresh_run_refuses_a_used_directory_and_overwrite_clears_only_checkpoints() {
    let d = dir("fresh");
    common::train(SPLIT, &with_ckpt(2, &d, 1, false)).unwrap();
    std::fs::create_dir_all(d.join("step-000007")).unwrap();
    std::fs::write(d.join("step-000007/rank-00000.tmp"), b"torn").unwrap();
    let e = common::train(SPLIT, &with_ckpt(2, &d, 0, false)).unwrap_err().to_string();
    assert!(e.contains("not empty") && e.contains("--resume") && e.contains("--overwrite"), "{e}");
    // A resume removes the partial step directory.
    assert_eq!(common::train(SPLIT, &with_ckpt(3, &d, 0, true)).unwrap().start_step, 2);
    assert!(!d.join("step-000007").exists());
    let mut opts = with_ckpt(1, &d, 0, false);
    if let Some(ck) = opts.checkpoint.as_mut() {
        ck.overwrite = true;
    }
    std::fs::write(d.join("notes.txt"), b"mine").unwrap();
    let e = common::train(SPLIT, &opts).unwrap_err().to_string();
    assert!(e.contains("notes.txt") && e.contains("nothing was deleted"), "{e}");
    assert!(d.join("step-000003/manifest.json").is_file());
    std::fs::remove_file(d.join("notes.txt")).unwrap();
    common::train(SPLIT, &opts).unwrap();
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["step-000001"], "--overwrite leaves only the new run's checkpoint");
    std::fs::remove_dir_all(&d).unwrap();
}
