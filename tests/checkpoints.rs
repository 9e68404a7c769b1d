//! End-to-end tests of `strata train`'s checkpoints, traces and failures through the
//! binary: every corruption of a checkpoint exits 2 naming the file; a fresh run refuses a
//! used directory; a changed setting needs `--allow-changed`; a divergence exits 1 naming
//! step, rank and tensor; `--ranks N` sizes cpu-local; `trace merge` gives one Perfetto
//! file; a failed write exits 1 naming the path.

use std::path::{Path, PathBuf};
use std::process::Output;

use strata_runtime::checkpoint::fnv1a64;

mod support;
use support::{SCENARIO, fails, s, stderr, strata};

fn tmp(name: &str) -> PathBuf {
    support::tmp_in("ckpt-cli", name)
}

fn train(dir: &Path, steps: &str, extra: &[&str]) -> Output {
    let mut args = vec!["train", SCENARIO, "--steps", steps, "--checkpoint-dir", s(dir)];
    args.extend_from_slice(extra);
    strata(&args)
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("step-000002/manifest.json")).unwrap()).unwrap()
}

fn save_manifest(dir: &Path, m: &serde_json::Value) {
    std::fs::write(dir.join("step-000002/manifest.json"), serde_json::to_vec_pretty(m).unwrap()).unwrap();
}

/// Rewrites rank `rank`'s shard with `edit` and fixes its size and checksum in the manifest.
fn edit_shard(dir: &Path, rank: usize, edit: impl Fn(&mut Vec<u8>)) {
    let path = dir.join(format!("step-000002/rank-{rank:05}.bin"));
    let mut b = std::fs::read(&path).unwrap();
    edit(&mut b);
    std::fs::write(&path, &b).unwrap();
    let mut m = manifest(dir);
    m["shards"][rank]["bytes"] = b.len().into();
    m["shards"][rank]["fnv1a64"] = format!("{:016x}", fnv1a64(&b)).into();
    save_manifest(dir, &m);
}

fn header_len(b: &[u8]) -> usize {
    u32::from_le_bytes([b[16], b[17], b[18], b[19]]) as usize
}

#[test]
fn every_checkpoint_corruption_exits_2_naming_the_file() {
    let base = tmp("base");
    let out = train(&base, "2", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    type Corrupt = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Corrupt, &str)> = vec![
        (
            "missing shard",
            Box::new(|d| std::fs::remove_file(d.join("step-000002/rank-00003.bin")).unwrap()),
            "rank-00003.bin",
        ),
        (
            "shard replaced by a directory",
            Box::new(|d| {
                std::fs::remove_file(d.join("step-000002/rank-00004.bin")).unwrap();
                std::fs::create_dir(d.join("step-000002/rank-00004.bin")).unwrap();
            }),
            "rank-00004.bin",
        ),
        (
            "manifest's step edited",
            Box::new(|d| {
                let mut m = manifest(d);
                m["step"] = 5.into();
                save_manifest(d, &m);
            }),
            "manifest.json",
        ),
        (
            "two shard entries swapped",
            Box::new(|d| {
                let mut m = manifest(d);
                for k in ["file", "bytes", "fnv1a64"] {
                    let (a, b) = (m["shards"][0][k].clone(), m["shards"][1][k].clone());
                    m["shards"][0][k] = b;
                    m["shards"][1][k] = a;
                }
                save_manifest(d, &m);
            }),
            "rank-00001.bin",
        ),
        (
            "bad header, checksum fixed",
            Box::new(|d| {
                edit_shard(d, 0, |b| {
                    let n = header_len(b);
                    b[20..20 + n].fill(b'x');
                })
            }),
            "rank-00000.bin",
        ),
        (
            "header length past the end, checksum fixed",
            Box::new(|d| edit_shard(d, 0, |b| b[16..20].fill(0xff))),
            "rank-00000.bin",
        ),
        (
            "NaN parameter, checksum fixed",
            Box::new(|d| {
                edit_shard(d, 2, |b| {
                    let at = 20 + header_len(b);
                    b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
                })
            }),
            "rank-00002.bin",
        ),
        (
            "a flipped byte",
            Box::new(|d| {
                let p = d.join("step-000002/rank-00005.bin");
                let mut b = std::fs::read(&p).unwrap();
                let mid = b.len() / 2;
                b[mid] ^= 1;
                std::fs::write(&p, b).unwrap();
            }),
            "rank-00005.bin",
        ),
    ];
    for (i, (name, corrupt, file)) in cases.iter().enumerate() {
        let d = tmp(&format!("case{i}"));
        copy_dir(&base, &d);
        corrupt(&d);
        let out = train(&d, "3", &["--resume"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        fails(&out, 2, &[file, "corrupt"]);
    }
    // A manifest's file names stay inside the step directory.
    for (i, file) in ["../../etc/passwd", "/etc/passwd", "sub/rank-00003.bin", ".."].iter().enumerate() {
        let d = tmp(&format!("path{i}"));
        copy_dir(&base, &d);
        let mut m = manifest(&d);
        m["shards"][3]["file"] = (*file).into();
        save_manifest(&d, &m);
        fails(&train(&d, "3", &["--resume"]), 2, &["manifest.json", file, "not a plain file name"]);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn a_used_directory_needs_resume_or_overwrite_and_changes_need_allow_changed() {
    let d = tmp("used");
    assert!(train(&d, "2", &[]).status.success());
    fails(&train(&d, "2", &[]), 2, &[s(&d), "not empty", "--resume", "--overwrite"]);
    fails(
        &train(&d, "3", &["--resume", "--set", "training.lr=2e-3"]),
        2,
        &["training.lr = 0.001 in the checkpoint, 0.002 now", "--allow-changed training.lr"],
    );
    fails(&train(&d, "3", &["--resume", "--allow-changed", "bogus"]), 2, &["--allow-changed bogus", "training.lr"]);
    let ok = train(&d, "3", &["--resume", "--set", "training.lr=2e-3", "--allow-changed", "training.lr"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let ok = train(&d, "1", &["--overwrite"]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["step-000001"]);
}

#[test]
fn a_divergence_exits_1_naming_step_rank_and_tensor() {
    let d = tmp("nan");
    let out = train(&d, "12", &["--set", "training.lr=1e3", "--checkpoint-every", "1"]);
    fails(&out, 1, &["training diverged at step", "rank ", "NaN", "the last good checkpoint is"]);
    let err = stderr(&out);
    let step: u32 = err.split("at step ").nth(1).and_then(|t| t.split(':').next()).unwrap().parse().unwrap();
    assert!(d.join(format!("step-{step:06}/manifest.json")).is_file(), "{err}");
    assert!(!d.join(format!("step-{:06}", step + 1)).exists(), "{err}");
}

#[test]
fn ranks_size_cpu_local_and_the_traces_merge_into_one_perfetto_file() {
    let out_dir = tmp("out2");
    let out = strata(&["train", SCENARIO, "--ranks", "2", "--steps", "1", "--out", s(&out_dir)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("on 2 CPU ranks"));
    let measured = out_dir.join("trace.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&measured).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().is_some_and(|e| !e.is_empty()), "trace.json is not a Perfetto trace");
    assert!(out_dir.join("measured-trace.json").is_file());
    let split = ["--set", "cluster.gpus_per_node=2", "--set", "parallel.tp=1", "--set", "parallel.pp=1"];
    let predicted = out_dir.join("predicted.json");
    let mut args = vec!["simulate", SCENARIO, "--full", "--trace", s(&predicted)];
    args.extend_from_slice(&split);
    args.extend_from_slice(&["--set", "parallel.dp=2", "--set", "parallel.vpp=1", "--set", "training.dtype=fp32"]);
    let sim = strata(&args);
    assert!(sim.status.success(), "{}", stderr(&sim));
    let merged = out_dir.join("merged.json");
    let m = strata(&["trace", "merge", s(&predicted), s(&measured), "-o", s(&merged)]);
    assert!(m.status.success(), "{}", stderr(&m));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    let names: Vec<(u64, String)> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    let mut pids: Vec<u64> = names.iter().map(|(p, _)| *p).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "{names:?}");
    for want in ["predicted rank 0", "predicted rank 1", "measured rank 0", "measured rank 1"] {
        assert!(names.iter().any(|(_, n)| n.starts_with(want)), "no {want:?} in {names:?}");
    }
    fails(&strata(&["trace", "merge", s(&measured), s(&predicted), "-o", s(&merged)]), 2, &["predicted (simulated)"]);
}

#[test]
fn a_failed_write_exits_1_naming_the_path_and_bad_input_exits_2() {
    let dir = tmp("io");
    std::fs::create_dir_all(&dir).unwrap();
    fails(&strata(&["simulate", SCENARIO, "--trace", s(&dir)]), 1, &["cannot write", s(&dir)]);
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let under = file.join("out");
    fails(&strata(&["train", SCENARIO, "--steps", "1", "--out", s(&under)]), 1, &[s(&under)]);
    fails(&train(&file.join("ck"), "1", &[]), 1, &[s(&file)]);
    fails(&strata(&["plan", "no/such/scenario.toml"]), 2, &["no/such/scenario.toml"]);
}
