//! End-to-end: the binary under `training.framework` — `inspect` shows the framework's
//! formula apart from what Strata adds, `search --framework` keeps to the splits a framework
//! runs (`any` names the one that runs the winner) and still takes a scenario whose own split
//! its framework cannot run.

use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

const LLAMA8: &str = "scenarios/llama3-8b-8xa100-40gb.toml";

#[test]
fn inspect_separates_the_framework_formula_from_strata_overheads() {
    let v = json(&strata(&["inspect", "scenarios/gpt3-175b-1024xa100.toml", "--json"]));
    let st = &v["stages"][0];
    // Megatron-LM, distributed optimizer at dp 16: 2 + 4 + 12/16 bytes per parameter.
    let params = st["params"].as_f64().unwrap();
    let states = st["weights_bytes"].as_f64().unwrap()
        + st["grads_bytes"].as_f64().unwrap()
        + st["optimizer_bytes"].as_f64().unwrap();
    assert!((states / params - 6.75).abs() < 1e-9, "{}", states / params);
    let formula = st["framework_formula_bytes"].as_f64().unwrap();
    let extra = &st["strata_extra"];
    assert!(extra["cuda_context_bytes"].as_f64().unwrap() > 0.0 && extra["nccl_bytes"].as_f64().unwrap() > 0.0);
    assert!(st["total_bytes"].as_f64().unwrap() > formula);
    let text = String::from_utf8_lossy(&strata(&["inspect", "scenarios/gpt3-175b-1024xa100.toml"]).stdout).to_string();
    assert!(text.contains("Framework Megatron-LM") && text.contains("gradients reduced in fp32"), "{text}");
    assert!(text.contains("by the framework's formula") && text.contains("what Strata models beyond it"), "{text}");
}

#[test]
fn search_any_names_the_framework_and_counts_unrunnable_splits_by_rule() {
    let v = json(&strata(&["search", LLAMA8, "--framework", "any", "--splits-only", "--simulate", "4", "--json"]));
    assert_eq!(v["frameworks"], serde_json::json!(["megatron", "deepspeed", "torchtitan"]));
    for rule in ["megatron-zero", "deepspeed-zero-pp", "torchtitan-zero"] {
        assert!(v["unrunnable"][rule].as_u64().unwrap() > 0, "{rule}: {}", v["unrunnable"]);
    }
    let winner = &v["top"][0];
    assert_eq!(winner["framework"], v["winner_memory"]["framework"]);
    assert!(v["winner_memory"]["formula_bytes"].as_f64().unwrap() > 0.0);
}

#[test]
fn search_keeps_to_one_framework_and_takes_a_split_it_cannot_run() {
    // zero = 2 is no Megatron-LM split, but the search does not need the scenario's own split.
    let v = json(&strata(&[
        "search",
        LLAMA8,
        "--set",
        "parallel.zero=2",
        "--framework",
        "deepspeed",
        "--splits-only",
        "--simulate",
        "2",
        "--json",
    ]));
    assert_eq!(v["frameworks"], serde_json::json!(["deepspeed"]));
    assert!(v["candidates"].as_array().unwrap().iter().all(|c| c["framework"] == "deepspeed"));
    assert!(v["unrunnable"]["deepspeed-sp"].as_u64().unwrap() > 0);
    let v =
        json(&strata(&["search", LLAMA8, "--set", "parallel.zero=2", "--splits-only", "--simulate", "2", "--json"]));
    assert_eq!(v["frameworks"], serde_json::json!(["megatron"]));
    let out = strata(&["search", LLAMA8, "--framework", "bogus"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--framework bogus") && err.contains("\"torchtitan\""), "{err}");
}

#[test]
fn simulate_names_deepspeed_zero3_host_bound_time() {
    // Llama 3 8B under DeepSpeed ZeRO-3 over 512 H100 at one 4k-token microbatch: every
    // module fetch builds two views per rank of the group in Python, longer than the
    // module's kernels, so the GPU waits for the host; the report says so.
    let sets = [
        "--set",
        "cluster.gpu=\"h100-sxm\"",
        "--set",
        "cluster.nodes=64",
        "--set",
        "model.seq_len=4096",
        "--set",
        "parallel.tp=1",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=512",
        "--set",
        "parallel.micro_batch=1",
        "--set",
        "parallel.global_batch=1024",
        "--set",
        "parallel.zero=3",
        "--set",
        "parallel.sequence_parallel=false",
        "--set",
        "training.framework=\"deepspeed\"",
    ];
    let mut args = vec!["simulate", LLAMA8, "--json"];
    args.extend(sets);
    let v = json(&strata(&args));
    let b = &v["breakdown_s"];
    let host = b["host_bound"].as_f64().unwrap();
    let step = v["step_time_s"].as_f64().unwrap();
    assert!(host > 0.2 * step, "host-bound {host} s of {step} s");
    args.retain(|a| *a != "--json");
    let text = String::from_utf8_lossy(&strata(&args).stdout).to_string();
    assert!(text.contains("host-bound") && text.contains("DeepSpeed's host work"), "{text}");
    // Over 16 ranks the same fetches hide under the device: no host-bound time.
    let small: Vec<&str> = args
        .iter()
        .map(|a| match *a {
            "cluster.nodes=64" => "cluster.nodes=2",
            "parallel.dp=512" => "parallel.dp=16",
            "parallel.global_batch=1024" => "parallel.global_batch=32",
            a => a,
        })
        .chain(["--json"])
        .collect();
    let v = json(&strata(&small));
    assert_eq!(v["breakdown_s"]["host_bound"].as_f64().unwrap(), 0.0);
}
