//! What the end-to-end tests of `strata train` share: running the binary, a fresh temp
//! directory per test, the check of a refusal (exit code, no panic, the words), and the
//! check that a shipped tiny scenario trains and learns.
#![allow(dead_code)] // each test crate uses the helpers it needs

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const SCENARIO: &str = "scenarios/tiny-gpt-cpu.toml";

pub fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

/// An empty path `name` under this process's temp directory for test suite `suite`.
pub fn tmp_in(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-{suite}-{}", std::process::id())).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit code `code`, no panic, and a message containing every word.
pub fn fails(out: &Output, code: i32, words: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in words {
        assert!(err.contains(w), "message lacks {w:?}: {err}");
    }
}

/// Trains `scenario` for 4 steps into `dir` and asserts the run succeeds, writes 4 losses,
/// starts at a fresh model's ln 256 ≈ 5.55 nats per byte and learns.
pub fn trains_and_learns(scenario: &str, dir: &Path) {
    let out = strata(&["train", scenario, "--steps", "4", "--out", s(dir)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let loss = std::fs::read_to_string(dir.join("loss.csv")).expect("loss.csv written");
    let losses: Vec<f64> = loss
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).and_then(|v| v.parse().ok()).expect("a loss column"))
        .collect();
    assert_eq!(losses.len(), 4, "{loss}");
    assert!((losses[0] - 256f64.ln()).abs() < 0.1 && losses[3] < losses[0], "{losses:?}");
}
