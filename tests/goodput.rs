//! `strata goodput` end to end: the figures against Daly's closed form on the command
//! line, the same seed ⇒ the same output on any thread count, the files it writes, and
//! bad input exiting 2 with a message that names the value.

use std::process::{Command, Output};

fn strata(args: &[&str], threads: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .env("RAYON_NUM_THREADS", threads)
        .output()
        .expect("run strata")
}

/// Daly's setting on the tiny scenario: one exponential process of MTBF 3 h, a constant
/// 60 s save and a 600 s restart, 1 s steps.
const DALY: &[&str] = &[
    "goodput",
    "scenarios/tiny-gpt-cpu.toml",
    "--step-time",
    "1",
    "--set",
    "faults.failures.rates=\"none\"",
    "--set",
    "faults.failures.job.mtbf_hours=3.0",
    "--set",
    "faults.failures.checkpoint.save_s=60.0",
    "--set",
    "faults.failures.restart.detect_s=600.0",
    "--set",
    "faults.failures.restart.reschedule_s=0.0",
    "--set",
    "faults.failures.restart.init_s=0.0",
    "--set",
    "faults.failures.restart.load_s=0.0",
];

fn with(extra: &[&str]) -> Vec<String> {
    DALY.iter().chain(extra).map(|s| s.to_string()).collect()
}

fn run(args: &[String], threads: &str) -> Output {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    strata(&a, threads)
}

#[test]
fn daly_figures_from_the_command_line() {
    let out = run(&with(&["--trials", "300", "--json"]), "2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Daly τ_opt for δ = 60 s, M = 3 h: √(2δM)·(1 + ⅓√(δ/2M) + δ/18M) − δ = 1,098.8 s.
    let tau = v["daly_tau_s"].as_f64().unwrap();
    assert!((tau - 1098.77).abs() < 0.05, "{tau}");
    let e = v["daly_efficiency"].as_f64().unwrap();
    assert!((e - 0.8497).abs() < 1e-3, "{e}");
    let best = &v["intervals"][v["best"].as_u64().unwrap() as usize];
    let (lo, hi) = (best["goodput_lo"].as_f64().unwrap(), best["goodput_hi"].as_f64().unwrap());
    assert!(lo - 1e-3 <= e && e <= hi + 2e-3, "MC [{lo}, {hi}] vs Daly {e}");
    assert_eq!(v["intervals"].as_array().unwrap().len(), 17);
}

#[test]
fn same_seed_same_output_on_one_or_two_threads() {
    let args = with(&["--trials", "50", "--seed", "9", "--interval", "5m,20m,1h"]);
    let (a, b) = (run(&args, "1"), run(&args, "2"));
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout);
    let text = String::from_utf8_lossy(&a.stdout);
    assert!(text.contains("seed 9") && text.contains("← best"), "{text}");
    let c = run(&with(&["--trials", "50", "--seed", "10", "--interval", "5m,20m,1h"]), "1");
    assert_ne!(a.stdout, c.stdout);
}

#[test]
fn out_writes_csv_json_and_the_plot() {
    let dir = std::env::temp_dir().join(format!("strata-goodput-{}", std::process::id()));
    let out = run(&with(&["--trials", "20", "--out", dir.to_str().unwrap()]), "2");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in ["goodput.csv", "losses.csv", "goodput.json", "goodput.png", "goodput.svg"] {
        assert!(dir.join(f).metadata().map(|m| m.len() > 0).unwrap_or(false), "{f}");
    }
    let csv = std::fs::read_to_string(dir.join("goodput.csv")).unwrap();
    assert_eq!(csv.lines().count(), 18, "{csv}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_exits_2_naming_the_value() {
    for (extra, word) in [
        (vec!["--days", "0"], "--days"),
        (vec!["--trials", "0"], "--trials"),
        (vec!["--interval", "ten minutes"], "--interval"),
        (vec!["--interval", "0steps"], "--interval"),
        (vec!["--step-time=-1"], "--step-time"),
        (vec!["--set", "faults.failures.job.mtbf_hours=-3"], "faults.failures.job.mtbf_hours"),
        (vec!["--set", "faults.failures.gpu.shape=0.5"], "faults.failures.gpu.shape"),
        (vec!["--set", "faults.failures.checkpoint.mode=\"later\""], "later"),
        (vec!["--set", "faults.failures.restart.detect_s=1e9"], "faults.failures.restart.detect_s"),
        (vec!["--set", "faults.failures.gpus.mtbf_hours=1"], "gpus"),
        // A job that fails every 10 s against a 600 s restart never finishes.
        (vec!["--set", "faults.failures.job.mtbf_hours=0.003"], "cannot make progress"),
    ] {
        let out = run(&with(&extra), "2");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.starts_with("error: ") && !err.contains("panicked"), "{err}");
        assert!(err.contains(word), "{extra:?}: {err}");
    }
}
