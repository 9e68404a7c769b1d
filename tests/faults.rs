//! `strata simulate`'s what-ifs end to end: bad ranks, links and factors exit 2 naming the
//! value; a forced symmetric mode and a network without links are refused; the fabric's
//! names list (filtered, capped, JSON); a report with what-ifs is byte-identical run to
//! run; a straggler slows the step; a cut NIC cable is refused naming the pair.

use std::process::{Command, Output};

/// Llama 3 8B on two DGX A100 nodes (16 GPUs, TP2 · PP2 · DP4), a short step.
const BASE: &[&str] = &[
    "simulate",
    "scenarios/llama3-8b-8xa100-40gb.toml",
    "--set",
    "cluster.nodes=2",
    "--set",
    "parallel.dp=4",
    "--set",
    "parallel.global_batch=8",
];

fn run(extra: &[&str]) -> Output {
    let mut args: Vec<&str> = BASE.to_vec();
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_strata")).args(&args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_what_ifs_exit_2_naming_the_value() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--slow", "rank=16:1.3"], &["rank 16 does not exist", "16 GPUs"]),
        (&["--slow", "rank=3:0"], &["rank 3 factor = 0", "(0, 100]"]),
        (&["--slow", "rank=3:-1.5"], &["factor = -1.5"]),
        (&["--slow", "rank=3:NaN"], &["factor = NaN"]),
        (&["--slow", "rank=3:1e9"], &["factor = 1000000000"]),
        (&["--slow", "rank=x:1.3"], &["rank \"x\"", "--slow rank=RANK:FACTOR"]),
        (&["--slow", "rank=3:1.1", "--slow", "rank=3:1.2"], &["rank 3 is listed twice"]),
        (&["--degrade", "link=leaf9-spine0:0.5"], &["\"leaf9-spine0\"", "--list-links"]),
        (&["--degrade", "link=node0/nic0-leaf0:0"], &["node0/nic0-leaf0 factor = 0", "(0, 1]"]),
        (&["--degrade", "link=node0/nic0-leaf0:1.5"], &["factor = 1.5"]),
        (&["--degrade", "link=node0/nic0-leaf0"], &["--degrade link=NAME:FACTOR"]),
        (&["--down", "spine77"], &["faults.down", "\"spine77\""]),
        (&["--slow", "rank=3:1.3", "--mode", "symmetric"], &["symmetric mode", "--mode full"]),
        (&["--down", "leaf0-spine0", "--network", "closed-form"], &["need the fabric network"]),
    ];
    for (extra, words) in cases {
        let o = run(extra);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {e}");
        for w in *words {
            assert!(e.contains(w), "{extra:?}: {w:?} not in {e}");
        }
        assert!(e.len() < 1000 && !e.contains("panicked"), "{extra:?}: {e}");
    }
}

#[test]
fn list_links_filters_caps_and_speaks_json() {
    let o = run(&["--list-links", "nic", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Two nodes of 8 NICs: 16 NIC cables.
    assert_eq!(v["matched"], 16);
    let names: Vec<&str> = v["names"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"node1/nic7-leaf7"), "{names:?}");
    let o = run(&["--list-links", "--limit", "3"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("  ")).count(), 3, "{text}");
    assert!(text.contains("more of"), "{text}");
}

fn step_s(o: &Output) -> f64 {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["step_time_s"].as_f64().unwrap()
}

#[test]
fn what_ifs_are_deterministic_and_a_straggler_slows_the_step() {
    let what = ["--json", "--slow", "rank=5:1.3", "--degrade", "link=node1/nic2-leaf2:0.5"];
    let a = run(&what);
    let b = run(&what);
    assert_eq!(a.stdout, b.stdout, "byte-identical reports");
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["mode"], "full");
    assert!(v["mode_note"].as_str().is_some_and(|n| n.contains("rank 5 compute ×1.3")), "{v}");
    let clean = step_s(&run(&["--json", "--full"]));
    let slow = step_s(&a);
    // The straggler stretches its stage's compute by 1.3; the pipeline's bubble (two
    // microbatches on two stages) absorbs part of it, and no step grows by more than f.
    assert!(slow > clean * 1.05 && slow <= clean * 1.3 + 1e-9, "clean {clean} s, rank 5 at 1.3: {slow} s");
}

#[test]
fn a_cut_nic_cable_is_refused_naming_the_pair() {
    let o = run(&["--down", "node1/nic0-leaf0"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("no path survives") && e.contains("node1/nic0-leaf0") && e.contains("rank"), "{e}");
}
