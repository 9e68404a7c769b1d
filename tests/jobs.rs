//! `strata simulate` on a multi-job file, end to end: the shipped example reports each
//! job's slowdown (byte-identical on a rerun), and bad placements, unknown job names and
//! options a multi-job run cannot honour exit 2 naming the value.

use std::process::{Command, Output};

const FILE: &str = "scenarios/two-jobs-fat-tree.toml";

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

/// Asserts a bad-input failure: exit code 2, no panic, a message containing every word.
fn rejects(args: &[&str], words: &[&str]) {
    let out = strata(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked") && err.starts_with("error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "message lacks {w:?}: {err}");
    }
}

#[test]
fn the_example_reports_each_jobs_slowdown_deterministically() {
    let a = strata(&["simulate", FILE, "--json"]);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    let b = strata(&["simulate", FILE, "--json"]);
    assert_eq!(a.stdout, b.stdout, "a rerun must print the same report");
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["mode"], "full");
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for j in jobs {
        let (alone, with) =
            (j["alone"]["step_time_s"].as_f64().unwrap(), j["together"]["step_time_s"].as_f64().unwrap());
        let slowdown = j["slowdown"].as_f64().unwrap();
        assert!((slowdown - with / alone).abs() < 1e-12, "{j}");
        // Interleaved on a 4:1 fat-tree: the jobs' DP traffic meets on every leaf's uplinks.
        assert!(slowdown > 1.0 && slowdown < 4.0, "{j}");
        assert_eq!(j["gpus"], 64);
    }
    let text = strata(&["simulate", FILE]);
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(text.status.success());
    assert!(out.contains("slowdown") && out.contains("where the extra time went"), "{out}");
    // Packed, each job on its own leaves: nothing is shared, so nothing slows down.
    let packed = strata(&["simulate", FILE, "--json", "--set", "job.a.nodes=\"0-7\"", "--set", "job.b.nodes=\"8-15\""]);
    let v: serde_json::Value = serde_json::from_slice(&packed.stdout).unwrap();
    for j in v["jobs"].as_array().unwrap() {
        assert_eq!(j["slowdown"].as_f64(), Some(1.0), "{j}");
    }
}

#[test]
fn bad_placements_and_names_exit_2_naming_the_value() {
    rejects(&["simulate", FILE, "--set", "job.b.nodes=\"0-7\""], &["job b", "node 0", "job a", "overlap"]);
    rejects(&["simulate", FILE, "--set", "job.b.nodes=\"9-16\""], &["job b", "node 16", "outside", "0-15"]);
    rejects(&["simulate", FILE, "--set", "job.b.nodes=\"9-12\""], &["job b", "4 nodes", "64", "32 GPUs"]);
    rejects(&["simulate", FILE, "--set", "job.c.nodes=\"1\""], &["unknown job \"c\"", "a, b"]);
    rejects(&["simulate", FILE, "--set", "job.a.gpus=8"], &["job a", "unknown key \"gpus\""]);
    rejects(&["simulate", FILE, "--mode", "symmetric"], &["--mode symmetric", "full mode"]);
    rejects(&["simulate", FILE, "--network", "closed-form"], &["--network closed-form", "fabric"]);
}
