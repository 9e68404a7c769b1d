//! End-to-end tests of the `strata` binary: the commands work, and bad input gets exit
//! code 2 with one clear message — never a panic.

use std::path::PathBuf;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Asserts a bad-input failure: exit code 2, no panic, a message containing every word.
fn rejects(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "message lacks {w:?}: {err}");
    }
}

#[test]
fn the_default_job_runs() {
    let out = strata(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn inspect_json_has_the_figures() {
    let out = strata(&["inspect", "scenarios/gpt3-175b-1024xa100.toml", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ranks"], 1024);
    assert_eq!(v["total_params"], 174_615_846_912u64);
    assert_eq!(v["stages"].as_array().unwrap().len(), 8);
    assert_eq!(v["fits"], true);
    let over = strata(&[
        "inspect",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=128",
        "--set",
        "parallel.schedule=1f1b",
        "--set",
        "parallel.vpp=1",
    ]);
    let text = String::from_utf8_lossy(&over.stdout);
    assert!(over.status.success() && text.contains("Does not fit: stage 0 needs"), "{text}");
}

#[test]
fn missing_file() {
    rejects(&strata(&["inspect", "no/such/file.toml"]), &["cannot read scenario no/such/file.toml"]);
}

#[test]
fn malformed_toml() {
    let p = tmp("bad.toml");
    std::fs::write(&p, "[model\npreset = ").unwrap();
    rejects(&strata(&["inspect", p.to_str().unwrap()]), &["is not valid", "line 1"]);
}

#[test]
fn unknown_key_names_key_and_line() {
    let p = tmp("unknown.toml");
    std::fs::write(
        &p,
        "[model]\npreset = \"tiny-gpt\"\nlayer = 3\n[cluster]\npreset = \"cpu-local\"\n[parallel]\nglobal_batch = 8\n",
    )
    .unwrap();
    rejects(&strata(&["inspect", p.to_str().unwrap()]), &["unknown field `layer`", "line 3"]);
}

#[test]
fn impossible_split_names_the_rule() {
    rejects(
        &strata(&["inspect", "scenarios/gpt3-175b-1024xa100.toml", "--set", "parallel.tp=5"]),
        &["parallel.tp = 5 does not divide model.heads = 96"],
    );
    rejects(&strata(&["inspect", "--set", "parallel.zero=5"]), &["parallel.zero = 5"]);
    rejects(&strata(&["inspect", "--set", "parallel"]), &["KEY=VALUE"]);
}

#[test]
fn plan_then_verify_and_a_corrupt_plan() {
    let p = tmp("plan.json");
    let out = strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--out", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ok = strata(&["verify", p.to_str().unwrap()]);
    assert!(ok.status.success() && String::from_utf8_lossy(&ok.stdout).contains("is valid"));
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    rejects(&strata(&["verify", p.to_str().unwrap()]), &["is not a Strata plan"]);
    rejects(
        &strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--rank", "99"]),
        &["--rank 99 is out of range", "8 ranks"],
    );
}

#[test]
fn plan_text_shows_one_op_a_line() {
    let out = strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--rank", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.starts_with("# TP(2)-PP(2)-DP(2)-rank(2)"), "{text}");
    assert!(text.contains("all-reduce tp") && text.contains("send next act"), "{text}");
}

#[test]
fn collbench_prints_nccl_tests_rows() {
    let out = strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "8", "--min", "1M", "--max", "1G", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 11);
    for key in ["size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "algorithm", "protocol"] {
        assert!(rows[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(rows[10]["size_bytes"], 1u64 << 30);
    rejects(
        &strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "8", "--op", "allreduce"]),
        &["--op \"allreduce\""],
    );
    rejects(&strata(&["collbench", "--cluster", "dgx-x", "--ranks", "8"]), &["neither a preset", "dgx-h100"]);
    rejects(
        &strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "8", "--max", "lots"]),
        &["\"lots\" is not a number"],
    );
}
