//! Tidy: the workspace's conventions, checked over its source tree (as rust-analyzer's
//! `tidy` test does), so a convention that holds today keeps holding.
//!
//! Over every `.rs` file under `src/`, `models/`, `sim/`, `runtime/`, `reports/` and
//! `xtask/` (build outputs under `target/` excluded):
//! 1. the file opens with a `//!` comment: what it models, or what it tests;
//! 2. `sim/src` uses no `HashMap` or `HashSet` (iteration order would leak into float
//!    sums and event order; use `BTreeMap`/`BTreeSet` or a `Vec`);
//! 3. the CLI's code (`src/`, up to its first `#[cfg(test)]` line; comments skipped) has no
//!    `.unwrap()` or `.expect(`: bad input is an error value that exits 2, never a panic;
//! 4. a source file is at most [`MAX_LINES`] lines, its inline test module included (a big
//!    test module moves to a sibling `tests.rs`). Test-only files — under a `tests/`
//!    directory or named `tests.rs` — are exempt.

use std::path::{Path, PathBuf};

/// Longest source file, lines: short enough to read whole.
const MAX_LINES: usize = 600;

/// Files allowed over [`MAX_LINES`] for now, each with the reason. Remove an entry when its
/// file is split.
const LONG_FILES_ALLOWED: &[(&str, &str)] = &[];

/// Files of `sim/src` allowed a hash container for now, each with the reason.
const HASH_ALLOWED: &[(&str, &str)] = &[];

const ROOTS: &[&str] = &["src", "models", "sim", "runtime", "reports", "xtask"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under the roots, as (path relative to the workspace, text), sorted.
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    for r in ROOTS {
        walk(&root().join(r), &mut paths);
    }
    paths.sort();
    let files: Vec<(String, String)> = paths
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root()).expect("under the root").to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {rel}: {e}"));
            (rel, text)
        })
        .collect();
    assert!(files.len() > 100, "found only {} source files: is the walk broken?", files.len());
    files
}

fn is_test_only(path: &str) -> bool {
    path.split('/').any(|part| part == "tests") || path.ends_with("/tests.rs")
}

/// The text before the first `#[cfg(test)]` line: the code a user's input runs through.
fn non_test_part(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().take_while(|(_, l)| l.trim() != "#[cfg(test)]").map(|(i, l)| (i + 1, l))
}

/// Fails with every offence at once, one a line.
fn report(rule: &str, offences: Vec<String>) {
    assert!(offences.is_empty(), "{rule}:\n  {}", offences.join("\n  "));
}

#[test]
fn every_file_opens_with_a_module_comment() {
    let offences = sources()
        .into_iter()
        .filter(|(_, text)| !text.starts_with("//!"))
        .map(|(path, text)| format!("{path}: starts with {:?}", text.lines().next().unwrap_or_default()))
        .collect();
    report("files that do not open with a `//!` comment", offences);
}

#[test]
fn the_simulator_has_no_hash_containers() {
    let mut offences = Vec::new();
    for (path, text) in sources() {
        if !path.starts_with("sim/src/") || HASH_ALLOWED.iter().any(|(p, _)| *p == path) {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            if line.contains("HashMap") || line.contains("HashSet") {
                offences.push(format!("{path}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    report("hash containers in sim/src (use BTreeMap, BTreeSet or a Vec)", offences);
    // An allowance for a file that no longer needs it is stale.
    for (path, _) in HASH_ALLOWED {
        let text = std::fs::read_to_string(root().join(path)).unwrap_or_default();
        assert!(text.contains("HashMap") || text.contains("HashSet"), "{path} no longer needs its allowance");
    }
}

#[test]
fn the_cli_never_unwraps() {
    let mut offences = Vec::new();
    for (path, text) in sources() {
        if !path.starts_with("src/") {
            continue;
        }
        for (n, line) in non_test_part(&text) {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if code.contains(".unwrap()") || code.contains(".expect(") {
                offences.push(format!("{path}:{n}: {}", code));
            }
        }
    }
    report("`.unwrap()` / `.expect(` in the CLI (return an error instead)", offences);
}

#[test]
fn source_files_are_short() {
    let mut offences = Vec::new();
    for (path, text) in sources() {
        let lines = text.lines().count();
        if is_test_only(&path) || lines <= MAX_LINES || LONG_FILES_ALLOWED.iter().any(|(p, _)| *p == path) {
            continue;
        }
        offences.push(format!("{path}: {lines} lines"));
    }
    report(&format!("source files over {MAX_LINES} lines (split by concept, or move tests out)"), offences);
    for (path, why) in LONG_FILES_ALLOWED {
        let lines = std::fs::read_to_string(root().join(path)).map(|t| t.lines().count()).unwrap_or(0);
        assert!(lines > MAX_LINES, "{path} ({why}) is {lines} lines now: remove its allowance");
    }
}

#[test]
fn the_rules_see_what_they_check() {
    // The helpers themselves: a test module ends the non-test part, and test-only paths
    // are recognised.
    let text = "//! x\nfn a() {}\n#[cfg(test)]\nmod tests { fn b() { x.unwrap(); } }\n";
    assert_eq!(non_test_part(text).count(), 2);
    assert!(is_test_only("models/tests/plan.rs") && is_test_only("models/src/scenario/tests.rs"));
    assert!(!is_test_only("models/src/scenario.rs"));
}
