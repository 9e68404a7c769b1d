//! End-to-end tests of `strata train --restarts N` through the binary: a run whose rank 3
//! is killed at step 7 restarts from the step-5 checkpoint and its loss curve equals the
//! uninterrupted run's bit for bit; without restarts the kill exits 1 naming the rank; a
//! slow rank changes no loss; every bad `--inject` and `--restarts` without a checkpoint
//! directory exits 2 naming the value.

use std::path::PathBuf;

mod support;
use support::{SCENARIO, fails, s, stderr, strata};

fn tmp(name: &str) -> PathBuf {
    support::tmp_in("restarts", name)
}

/// Runs `strata train --json` and returns its report.
fn train_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["train", SCENARIO, "--json", "--timeout", "5"];
    all.extend_from_slice(args);
    let out = strata(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// (step, loss bits) of every step of a report; JSON numbers round-trip f64 exactly.
fn curve(report: &serde_json::Value) -> Vec<(u64, u64)> {
    let steps = report["steps"].as_array().expect("steps");
    steps.iter().map(|r| (r["step"].as_u64().unwrap(), r["loss"].as_f64().unwrap().to_bits())).collect()
}

#[test]
fn a_rank_killed_at_step_7_restarts_from_step_5_bit_for_bit() {
    let whole = train_json(&["--steps", "10"]);
    let ck = tmp("kill");
    let killed = train_json(&[
        "--steps",
        "10",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "5",
        "--restarts",
        "1",
        "--inject",
        "kill:rank=3,step=7",
    ]);
    let want = curve(&whole);
    assert_eq!(want.len(), 10);
    assert_eq!(curve(&killed), want, "the restarted run's losses differ from the uninterrupted run's");
    let a = killed["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 2, "{a:?}");
    // Rank 3 dies at the start of step 7, so rank 0 completed step 6 at most; it may be
    // stopped before it took the last loss reports of step 6 (or 5): the stop races them.
    let done = a[0]["steps_done"].as_u64().unwrap();
    assert!(a[0]["start_step"] == 0 && (5..=7).contains(&done), "{a:?}");
    assert_eq!(
        a[0]["steps_lost"].as_u64(),
        Some(done - 5),
        "the steps past the step-5 checkpoint are recomputed: {a:?}"
    );
    assert_eq!(a[0]["failure"]["rank"].as_u64(), Some(3), "{a:?}");
    assert_eq!(a[0]["failure"]["cause"], "killed", "{a:?}");
    assert_eq!(a[0]["injected"][0], "kill:rank=3,step=7");
    assert_eq!((a[1]["start_step"].as_u64(), a[1]["steps_done"].as_u64()), (Some(5), Some(5)), "{a:?}");
    assert!(a[1]["failure"].is_null() && a[1]["injected"].as_array().unwrap().is_empty(), "{a:?}");
    let g = &killed["goodput"];
    let (good, wall) = (g["goodput"].as_f64().unwrap(), g["wall_seconds"].as_f64().unwrap());
    let parts = ["useful_seconds", "lost_seconds", "restart_seconds", "other_seconds"].map(|k| g[k].as_f64().unwrap());
    assert!(good > 0.0 && good < 1.0, "{g}");
    assert!((parts.iter().sum::<f64>() - wall).abs() < 1e-6 * wall.max(1.0), "the parts add up to the wall: {g}");
    assert!((good - parts[0] / wall).abs() < 1e-12, "{g}");
    assert!((parts[1] > 0.0) == (done > 5) && parts[2] > 0.0, "{g}");
    assert_eq!((g["restarts"].as_u64(), g["steps_lost"].as_u64()), (Some(1), Some(done - 5)), "{g}");
    // The uninterrupted run counts every step: nothing lost, no restart.
    let g = &whole["goodput"];
    assert_eq!((g["restarts"].as_u64(), g["lost_seconds"].as_f64()), (Some(0), Some(0.0)), "{g}");
}

#[test]
fn without_restarts_a_kill_exits_1_naming_the_rank_and_a_hang_is_restarted() {
    let ck = tmp("norestart");
    let out = strata(&[
        "train",
        SCENARIO,
        "--steps",
        "4",
        "--checkpoint-dir",
        s(&ck),
        "--inject",
        "kill:rank=6,step=2",
        "--timeout",
        "5",
    ]);
    fails(&out, 1, &["rank 6 (TP(2)-PP(2)-DP(2)-rank(6)) failed"]);
    // A hang is noticed by the timeout and restarted; it fires in the first attempt only.
    let ck = tmp("hang");
    let out = strata(&[
        "train",
        SCENARIO,
        "--steps",
        "3",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "1",
        "--restarts",
        "1",
        "--inject",
        "hang:rank=5,step=2",
        "--timeout",
        "1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("attempt 0 failed") && err.contains("made no progress for 1 s"), "{err}");
    assert!(err.contains("restart 1 of 1") && err.contains("step-000002"), "{err}");
}

#[test]
fn a_slow_rank_changes_no_loss() {
    let base = curve(&train_json(&["--steps", "2"]));
    let slow = curve(&train_json(&["--steps", "2", "--inject", "slow:rank=1,factor=2"]));
    assert_eq!(slow, base);
}

#[test]
fn bad_injections_and_restarts_without_a_directory_exit_2_naming_the_value() {
    let ck = tmp("bad");
    for (spec, words) in [
        ("kill:rank=8,step=1", &["kill:rank=8,step=1", "rank 8 does not exist", "8 ranks (0–7)"][..]),
        ("kill:rank=1,step=4", &["step 4 is beyond the run", "steps 0–3"]),
        ("slow:rank=1,factor=0", &["factor=0", "1 ≤ F ≤ 100"]),
        ("slow:rank=1,factor=-1", &["factor=-1"]),
        ("kill:rank=1", &["kill:rank=1", "step missing"]),
        ("explode:rank=1,step=1", &["unknown fault \"explode\""]),
    ] {
        let out = strata(&["train", SCENARIO, "--steps", "4", "--checkpoint-dir", s(&ck), "--inject", spec]);
        fails(&out, 2, words);
        assert!(!ck.join("step-000004").exists(), "{spec}: a bad --inject must stop before training");
    }
    fails(
        &strata(&["train", SCENARIO, "--steps", "4", "--restarts", "2"]),
        2,
        &["--restarts 2 needs --checkpoint-dir"],
    );
}

#[test]
fn a_divergence_is_not_restarted() {
    let ck = tmp("nan");
    let out = strata(&[
        "train",
        SCENARIO,
        "--steps",
        "12",
        "--set",
        "training.lr=1e3",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "1",
        "--restarts",
        "3",
    ]);
    fails(&out, 1, &["training diverged at step"]);
    assert!(!stderr(&out).contains("supervisor: attempt"), "{}", stderr(&out));
}
