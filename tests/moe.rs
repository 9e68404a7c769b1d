//! Mixture-of-experts scenarios through the binary: a tiny MoE GPT on 8 CPU ranks plans,
//! its plan verifies and simulates; impossible expert-parallel splits exit 2 naming the
//! rule; the shipped tiny MoE scenario and a tensor-parallel MoE split train on CPU ranks,
//! and a capacity factor, which the executor's dropless routing does not run, exits 2
//! naming the key; calibration runs a tensor-parallel MoE model's jobs (with SP).

use std::path::PathBuf;
use std::process::Output;

mod support;
use support::strata;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Asserts a bad-input failure: exit code 2, no panic, a message containing every word.
fn rejects(out: &Output, words: &[&str]) {
    support::fails(out, 2, words)
}

/// tiny-gpt with 8 experts top-2 (width 128), one shared expert (64), the first layer
/// dense, on 8 CPU ranks: tp 2 (+SP), dp 4, ep 4. (The routed and shared widths per token,
/// 2·128 + 64, exceed the dense ffn_hidden 256, so the model FLOPs of the accounting, not
/// yet MoE-aware, stay below the plan's executed FLOPs and the simulator's sanity check
/// holds.)
fn tiny_moe() -> PathBuf {
    // One file per call: the tests run in parallel threads of one process.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = tmp(&format!("tiny-moe-{n}.toml"));
    std::fs::write(
        &path,
        "[model]\npreset = \"tiny-gpt\"\n[model.moe]\nexperts = 8\ntop_k = 2\nexpert_ffn_hidden = 128\n\
         shared_experts = 1\nshared_ffn_hidden = 64\ndense_layers = 1\n\
         [cluster]\npreset = \"cpu-local\"\ngpus_per_node = 8\n\
         [parallel]\ntp = 2\npp = 1\ndp = 4\nep = 4\nmicro_batch = 2\nglobal_batch = 16\nzero = 1\nsequence_parallel = true\n\
         [training]\nsteps = 2\n",
    )
    .unwrap();
    path
}

#[test]
fn a_moe_plan_verifies_and_simulates() {
    let scenario = tiny_moe();
    let s = scenario.to_str().unwrap();
    let plan = tmp("tiny-moe-plan.json");
    let out = strata(&["plan", s, "--out", plan.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = strata(&["verify", plan.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = strata(&["plan", s]);
    let ops = String::from_utf8_lossy(&text.stdout);
    for piece in ["router", "experts", "shared-experts", "all-to-all"] {
        assert!(ops.contains(piece), "rank 0's program has no {piece}:\n{ops}");
    }
    let out = strata(&["simulate", s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("step time") && text.contains("TP(2)-EP(4)-PP(1)-DP(4)"), "{text}");
}

#[test]
fn impossible_expert_parallel_splits_exit_2_naming_the_rule() {
    let scenario = tiny_moe();
    let s = scenario.to_str().unwrap();
    rejects(&strata(&["plan", s, "--set", "parallel.ep=3"]), &["parallel.ep = 3", "model.moe.experts = 8"]);
    rejects(&strata(&["plan", s, "--set", "parallel.sequence_parallel=false"]), &["sequence parallelism"]);
    rejects(&strata(&["plan", s, "--set", "parallel.zero=3"]), &["ZeRO-3"]);
    rejects(&strata(&["plan", s, "--set", "model.moe.experts=8192"]), &["experts = 8192", "docs/limits.md"]);
    rejects(
        &strata(&["plan", s, "--set", "model.moe.capacity_factor=0"]),
        &["model.moe.capacity_factor = 0", "positive multiple"],
    );
    rejects(&strata(&["plan", s, "--set", "model.mtp_layers=17"]), &["model.mtp_layers = 17", "docs/limits.md"]);
    rejects(
        &strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--set", "parallel.ep=2"]),
        &["parallel.ep = 2", "model.moe is absent"],
    );
}

#[test]
fn a_tensor_parallel_moe_split_trains_and_a_capacity_factor_exits_2() {
    let scenario = tiny_moe();
    let s = scenario.to_str().unwrap();
    let out = strata(&["train", s, "--steps", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let set = ["train", s, "--steps", "1", "--set", "model.moe.capacity_factor=1.25"];
    rejects(&strata(&set), &["model.moe.capacity_factor = 1.25", "dropless"]);
}

#[test]
fn the_shipped_tiny_moe_scenario_trains() {
    let out = strata(&["train", "scenarios/tiny-moe-cpu.toml", "--steps", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("step"), "{text}");
}

#[test]
fn calibrating_a_moe_model_measures_its_tensor_parallel_pieces() {
    // The calibration jobs with tp > 1 must use sequence parallelism for a MoE model, as
    // every MoE plan with tp does (they were refused as impossible jobs before).
    let scenario = tiny_moe();
    let profile = tmp("moe-profile.toml");
    let out = strata(&[
        "calibrate",
        scenario.to_str().unwrap(),
        "--quick",
        "--ranks",
        "4",
        "--out",
        profile.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&profile).unwrap();
    assert!(text.contains("[[compute.ops]]"), "the profile holds no measured ops:\n{text}");
}
