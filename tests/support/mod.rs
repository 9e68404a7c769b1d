//! What the end-to-end tests of `strata train` share: running the binary, a fresh temp
//! directory per test, and the check of a refusal (exit code, no panic, the words).
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
