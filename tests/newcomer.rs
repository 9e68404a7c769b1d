//! End-to-end tests of what a newcomer runs into first (issue 14): the main job's wait and
//! writes, errors that say a thing once, `simulate PLAN.json`, search on a scenario whose
//! own split is invalid, search ties, and collbench's names, fallbacks and JSON.

use std::path::PathBuf;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-newcomer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Asserts a bad-input failure: exit code 2, no panic, a message containing every word.
fn rejects(out: &Output, words: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "message lacks {w:?}: {err}");
    }
    err
}

#[test]
fn no_wait_belongs_to_the_main_job() {
    rejects(&strata(&["--no-wait", "presets"]), &["--no-wait", "main job"]);
}

#[test]
fn the_main_job_exits_1_naming_a_directory_it_cannot_create() {
    let dir = tmp("main-job-cwd");
    std::fs::create_dir_all(&dir).unwrap();
    // `out` is a file, so out/main cannot be created.
    std::fs::write(dir.join("out"), "not a directory").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_strata")).arg("--no-wait").current_dir(&dir).output().expect("run strata");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write out/main") && !err.contains("panicked"), "{err}");
}

#[test]
fn a_missing_scenario_names_the_os_error_once() {
    let err = rejects(&strata(&["simulate", "no/such/scenario.toml"]), &["cannot read scenario no/such/scenario.toml"]);
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

#[test]
fn simulate_on_a_plan_says_it_wants_a_scenario() {
    let plan = tmp("plan.json");
    let out = strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--json"]);
    assert!(out.status.success());
    std::fs::write(&plan, &out.stdout).unwrap();
    let p = plan.to_str().unwrap();
    for cmd in ["simulate", "inspect", "search"] {
        let err = rejects(&strata(&[cmd, p]), &["looks like a plan (JSON)", "scenario (TOML)", "strata verify"]);
        assert!(err.len() < 600 && !err.contains("\"programs\""), "echoes the file: {err}");
    }
}

#[test]
fn a_missing_global_batch_names_the_key_not_a_preset() {
    let p = tmp("no-batch.toml");
    std::fs::write(&p, "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\n").unwrap();
    let err =
        rejects(&strata(&["search", p.to_str().unwrap()]), &["parallel.global_batch is missing", "global_batch = 512"]);
    assert!(!err.contains("parallel.preset"), "{err}");
}

#[test]
fn search_replaces_an_invalid_split_and_collapses_ties() {
    let dir = tmp("ties");
    let d = dir.to_str().unwrap();
    // 6 sequences: the scenario's own dp 2 · micro-batch 2 does not divide them.
    let args = ["scenarios/tiny-gpt-cpu.toml", "--set", "parallel.global_batch=6"];
    rejects(&strata(&["inspect", args[0], args[1], args[2]]), &["not divisible"]);
    let out = strata(&["search", args[0], args[1], args[2], "--top", "3", "--out", d]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the scenario's own split is not valid"), "{stderr}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    // Buckets 10, 40 and 160 MiB simulate alike here: one row, not three.
    assert!(rows[0].contains("bucket 10|40|160 MiB") && rows[0].contains("tied)"), "{stdout}");
    assert!(!rows.iter().any(|r| r.contains(" b40 ")), "{stdout}");
    // The CSV keeps every candidate of the tie.
    let csv = std::fs::read_to_string(dir.join("candidates.csv")).unwrap();
    let first = rows[0].split_whitespace().nth(1).unwrap();
    assert!(csv.lines().filter(|l| l.starts_with(first)).count() >= 3, "{csv}");
}

#[test]
fn collbench_takes_the_names_its_help_prints() {
    let help = String::from_utf8_lossy(&strata(&["collbench", "--help"]).stdout).into_owned();
    let names = ["ring", "tree", "nvls", "nvls-tree", "pat", "collnet-direct", "collnet-chain"];
    for name in names.iter().chain(&["nvlstree", "NVLS_TREE"]) {
        if names.contains(name) {
            assert!(help.contains(name), "help lacks {name}: {help}");
        }
        let out = strata(&[
            "collbench",
            "--cluster",
            "dgx-h100",
            "--ranks",
            "16",
            "--min",
            "1M",
            "--max",
            "1M",
            "--algo",
            name,
            "--allow-fallback",
        ]);
        assert!(out.status.success(), "--algo {name}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let a = strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "16", "--max", "4M", "--algo", "nvlstree"]);
    let b = strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "16", "--max", "4M", "--algo", "nvls-tree"]);
    assert!(a.status.success() && a.stdout == b.stdout, "{}", String::from_utf8_lossy(&a.stderr));
    assert!(String::from_utf8_lossy(&a.stdout).contains("nvls-tree"));
}

#[test]
fn collbench_refuses_an_impossible_forced_algorithm() {
    // A100 nodes have no NVLink SHARP: NCCL would fall back to another algorithm.
    let base = ["collbench", "--cluster", "dgx-a100", "--ranks", "8", "--max", "1M", "--algo", "nvls"];
    rejects(&strata(&base), &["--algo nvls is not possible", "NVLink SHARP", "--allow-fallback"]);
    let mut allowed = base.to_vec();
    allowed.extend(["--allow-fallback", "--json"]);
    let out = strata(&allowed);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["algo"], "nvls");
    assert!(v["fallbacks"][0].as_str().is_some_and(|n| n.contains("not possible")), "{v}");
    assert!(v["rows"].as_array().unwrap().iter().all(|r| r["algorithm"] != "nvls"), "{v}");
}
