//! Context parallelism through the binary: every exchange plans, verifies, simulates and
//! trains on CPU ranks; a split the lowering cannot cut exits 2 naming the rule.

mod support;
use support::strata;

const TINY: &str = "scenarios/tiny-gpt-cpu.toml";

fn cp_split(cp: u32, comm: &str) -> Vec<String> {
    // tiny-gpt-cpu has 8 ranks: tp 2 · cp · pp 2 · dp = 8.
    let dp = 8 / (2 * cp * 2);
    [
        "parallel.tp=2".to_string(),
        format!("parallel.cp={cp}"),
        format!("parallel.cp_comm={comm}"),
        format!("parallel.dp={dp}"),
    ]
    .into_iter()
    .flat_map(|s| ["--set".to_string(), s])
    .collect()
}

#[test]
fn every_exchange_plans_verifies_and_simulates() {
    for comm in ["ring", "all-gather", "ulysses"] {
        let sets = cp_split(2, comm);
        let plan = std::env::temp_dir().join(format!("strata-cp-{}-{comm}.json", std::process::id()));
        let mut args = vec!["plan", TINY, "--out", plan.to_str().unwrap()];
        args.extend(sets.iter().map(String::as_str));
        let out = strata(&args);
        assert!(out.status.success(), "{comm}: {}", String::from_utf8_lossy(&out.stderr));
        let out = strata(&["verify", plan.to_str().unwrap()]);
        assert!(out.status.success(), "{comm}: {}", String::from_utf8_lossy(&out.stderr));
        let mut args = vec!["simulate", TINY];
        args.extend(sets.iter().map(String::as_str));
        let out = strata(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{comm}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains(&format!("TP(2)-CP(2, {comm})-PP(2)-DP(1)")), "{text}");
        let _ = std::fs::remove_file(plan);
    }
}

#[test]
fn a_cp_split_trains_on_cpu_ranks() {
    let mut args = vec!["train", TINY, "--steps", "2"];
    let sets = cp_split(2, "ring");
    args.extend(sets.iter().map(String::as_str));
    let out = strata(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("step"), "{text}");
}

#[test]
fn splits_the_lowering_cannot_cut_exit_2_naming_the_rule() {
    // Ulysses over 8 ranks needs heads / tp = 4 divisible by 8.
    let out = strata(&[
        "simulate",
        TINY,
        "--set",
        "parallel.tp=1",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=1",
        "--set",
        "parallel.cp=8",
        "--set",
        "parallel.cp_comm=ulysses",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked") && err.contains("ulysses") && err.contains("heads"), "{err}");
    // The sequence of 64 does not cut into 2·cp chunks of cp = 8 with seq 60.
    let out = strata(&[
        "simulate",
        TINY,
        "--set",
        "parallel.tp=1",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=1",
        "--set",
        "parallel.cp=8",
        "--set",
        "model.seq_len=60",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("seq_len = 60") && err.contains("2 · parallel.cp"), "{err}");
}
