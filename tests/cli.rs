//! End-to-end tests of the `strata` binary: the commands work, and bad input gets exit
//! code 2 with one clear message — never a panic.

use std::path::PathBuf;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Asserts a bad-input failure: exit code 2, no panic, a message containing every word.
fn rejects(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "message lacks {w:?}: {err}");
    }
}

#[test]
fn the_default_job_runs() {
    // The real main job, without waiting for a quiet machine (a loaded CI host would wait
    // up to its 60 s budget); what ran on a busy machine is marked, not hidden.
    let out = strata(&["--no-wait"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("not waiting for a quiet machine"), "{stderr}");
    assert!(stdout.contains("report:") && stdout.contains("(0 s of it waiting for a quiet machine)"), "{stdout}");
}

#[test]
fn inspect_json_has_the_figures() {
    let out = strata(&["inspect", "scenarios/gpt3-175b-1024xa100.toml", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ranks"], 1024);
    assert_eq!(v["total_params"], 174_615_846_912u64);
    assert_eq!(v["stages"].as_array().unwrap().len(), 8);
    assert_eq!(v["fits"], true);
    let over = strata(&[
        "inspect",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=128",
        "--set",
        "parallel.schedule=1f1b",
        "--set",
        "parallel.vpp=1",
    ]);
    let text = String::from_utf8_lossy(&over.stdout);
    assert!(over.status.code() == Some(3) && text.contains("Does not fit: stage 0 needs"), "{text}");
    assert!(String::from_utf8_lossy(&over.stderr).contains("by the simulated plan"));
}

#[test]
fn missing_file() {
    rejects(&strata(&["inspect", "no/such/file.toml"]), &["cannot read scenario no/such/file.toml"]);
}

#[test]
fn malformed_toml() {
    let p = tmp("bad.toml");
    std::fs::write(&p, "[model\npreset = ").unwrap();
    rejects(&strata(&["inspect", p.to_str().unwrap()]), &["is not valid", "line 1"]);
}

#[test]
fn unknown_key_names_key_and_line() {
    let p = tmp("unknown.toml");
    std::fs::write(
        &p,
        "[model]\npreset = \"tiny-gpt\"\nlayer = 3\n[cluster]\npreset = \"cpu-local\"\n[parallel]\nglobal_batch = 8\n",
    )
    .unwrap();
    rejects(&strata(&["inspect", p.to_str().unwrap()]), &["unknown field `layer`", "line 3"]);
}

#[test]
fn impossible_split_names_the_rule() {
    rejects(
        &strata(&["inspect", "scenarios/gpt3-175b-1024xa100.toml", "--set", "parallel.tp=5"]),
        &["parallel.tp = 5 does not divide model.heads = 96"],
    );
    rejects(&strata(&["inspect", "--set", "parallel.zero=5"]), &["parallel.zero = 5"]);
    rejects(&strata(&["inspect", "--set", "parallel"]), &["KEY=VALUE"]);
}

#[test]
fn plan_then_verify_and_a_corrupt_plan() {
    let p = tmp("plan.json");
    let out = strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--out", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ok = strata(&["verify", p.to_str().unwrap()]);
    assert!(ok.status.success() && String::from_utf8_lossy(&ok.stdout).contains("is valid"));
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    rejects(&strata(&["verify", p.to_str().unwrap()]), &["is not a Strata plan"]);
    rejects(
        &strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--rank", "99"]),
        &["--rank 99 is out of range", "8 ranks"],
    );
}

/// Hand-edited plans: each exits 2 with a message that names the bad value, never a panic
/// (and never an out-of-memory abort from a grid too big to allocate).
#[test]
fn hand_edited_plans_are_rejected_by_value() {
    let p = tmp("base-plan.json");
    let out = strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--out", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let base: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let first_compute = |plan: &mut serde_json::Value| -> usize {
        let ops = plan["programs"][1]["ops"].as_array().unwrap();
        ops.iter().position(|o| o["kind"].get("compute").is_some()).unwrap()
    };
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &[&str]); 7] = [
        ("tp-zero", |v| v["grid"]["tp"] = 0.into(), &["grid.tp = 0", "at least 1"]),
        ("pp-zero", |v| v["grid"]["pp"] = 0.into(), &["grid.pp = 0", "at least 1"]),
        ("pp-billion", |v| v["grid"]["pp"] = 1_000_000_000.into(), &["pp = 1000000000", "4000000000 ranks", "limit"]),
        (
            "fewer-programs",
            |v| drop(v["programs"].as_array_mut().unwrap().pop()),
            &["programs.len() = 1", "grid.pp = 2"],
        ),
        ("no-programs", |v| v["programs"] = serde_json::json!([]), &["programs.len() = 0", "grid.pp = 2"]),
        (
            "rank-program-missing",
            |v| v["rank_programs"] = serde_json::json!({ "3": 9 }),
            &["rank_programs[3] = 9", "2 programs"],
        ),
        ("cost-out-of-range", |_| {}, &["programs[1].ops[", "kind.compute.cost = 4096", "must index costs"]),
    ];
    for (name, edit, words) in cases {
        let mut plan = base.clone();
        edit(&mut plan);
        if name == "cost-out-of-range" {
            let i = first_compute(&mut plan);
            plan["programs"][1]["ops"][i]["kind"]["compute"]["cost"] = 4096.into();
        }
        let path = tmp(&format!("{name}.json"));
        std::fs::write(&path, plan.to_string()).unwrap();
        let out = strata(&["verify", path.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("{name}: exit {:?}: {}", out.status.code(), err.trim_end());
        assert_eq!(err.lines().count(), 1, "{name}: one message: {err}");
        rejects(&out, words);
        assert!(err.contains("is malformed"), "{name}: {err}");
    }
}

#[test]
fn plan_text_shows_one_op_a_line() {
    let out = strata(&["plan", "scenarios/tiny-gpt-cpu.toml", "--rank", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.starts_with("# TP(2)-PP(2)-DP(2)-rank(2)"), "{text}");
    assert!(text.contains("all-reduce tp") && text.contains("send next act"), "{text}");
}

#[test]
fn collbench_prints_nccl_tests_rows() {
    let out = strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "8", "--min", "1M", "--max", "1G", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["op"].as_str(), v["ranks"].as_u64(), v["cluster"]["name"].as_str()),
        (Some("all_reduce"), Some(8), Some("dgx-h100"))
    );
    assert!(v["units"]["busbw_GBps"].as_str().is_some_and(|u| u.contains("bytes")), "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 11);
    for key in ["size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "algorithm", "protocol"] {
        assert!(rows[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(rows[10]["size_bytes"], 1u64 << 30);
    rejects(
        &strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "8", "--op", "allreduce"]),
        &["--op \"allreduce\""],
    );
    rejects(&strata(&["collbench", "--cluster", "dgx-x", "--ranks", "8"]), &["neither a preset", "dgx-h100"]);
    rejects(
        &strata(&["collbench", "--cluster", "dgx-h100", "--ranks", "8", "--max", "lots"]),
        &["\"lots\" is not a number"],
    );
}

/// An nccl-tests all_reduce_perf log of `ranks` ranks with (size, out-of-place busbw) rows.
fn nccl_tests_log(ranks: u32, rows: &[(u64, f64)]) -> String {
    let mut t = String::from("# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 2(factor)\n");
    t += "# Collective test starting: all_reduce_perf\n";
    for r in 0..ranks {
        t += &format!(
            "#  Rank {r:3} Group  0 Pid {} on node{} device  {} [0x10] NVIDIA A100-SXM4-40GB\n",
            100 + r,
            r / 8,
            r % 8
        );
    }
    t += "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
    for (size, busbw) in rows {
        let alg = busbw / 1.9375;
        t += &format!(
            "{size:>12} {:>12}     float     sum      -1  1000.0  {alg:.2}  {busbw:.2}      0  1000.0  {alg:.2}  {busbw:.2}      0\n",
            size / 4
        );
    }
    t
}

#[test]
fn collbench_fits_nic_efficiency_to_a_real_nccl_tests_log() {
    // Four p4d nodes over EFA: about 30 GB/s busbw at large sizes (NVIDIA/nccl#527 measured
    // 29.6 at 1 GiB), far under the NICs' 50 GB/s a node. The 1 MiB row is latency-bound and
    // below --fit-min, so it is not used.
    let log = tmp("p4d-allreduce.log");
    std::fs::write(&log, nccl_tests_log(32, &[(1 << 20, 2.1), (256 << 20, 28.9), (512 << 20, 29.3), (1 << 30, 29.6)]))
        .unwrap();
    let path = log.to_str().unwrap();
    let out = strata(&["collbench", "--cluster", "aws-p4d", "--fit", path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["op"].as_str(), v["ranks"].as_u64(), v["nodes"].as_u64()), (Some("all_reduce"), Some(32), Some(4)));
    let e = v["nic_efficiency"].as_f64().unwrap();
    assert!((0.5..0.7).contains(&e), "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{v}");
    for r in rows {
        assert!(r["residual_pct"].as_f64().unwrap().abs() < 5.0, "{v}");
    }
    // The text output says what to write.
    let out = strata(&["collbench", "--cluster", "aws-p4d", "--fit", path]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("nic_efficiency = {e:.2}")) && text.contains("[cluster] table"), "{text}");
    // Bad input: a --ranks the log contradicts, a one-node log, a log with no data, no file.
    rejects(
        &strata(&["collbench", "--cluster", "aws-p4d", "--fit", path, "--ranks", "16"]),
        &["--ranks 16", "32 ranks"],
    );
    rejects(&strata(&["collbench", "--cluster", "aws-p4d", "--fit", path, "--op", "all_gather"]), &["all_reduce_perf"]);
    let one = tmp("one-node.log");
    std::fs::write(&one, nccl_tests_log(8, &[(1 << 30, 230.0)])).unwrap();
    rejects(
        &strata(&["collbench", "--cluster", "aws-p4d", "--fit", one.to_str().unwrap()]),
        &["one node", "nothing to fit"],
    );
    let empty = tmp("empty.log");
    std::fs::write(&empty, "# nothing\n").unwrap();
    rejects(
        &strata(&["collbench", "--cluster", "aws-p4d", "--fit", empty.to_str().unwrap()]),
        &["no nccl-tests data line"],
    );
    rejects(&strata(&["collbench", "--cluster", "aws-p4d", "--fit", "/nonexistent/log"]), &["cannot open"]);
    rejects(&strata(&["collbench", "--cluster", "aws-p4d", "--fit", path, "--algo", "ring"]), &["drop --algo"]);
}

#[test]
fn an_out_of_memory_verdict_prints_the_report_and_exits_3() {
    let out = strata(&[
        "simulate",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--set",
        "parallel.global_batch=512",
        "--set",
        "parallel.recompute=none",
        "--set",
        "parallel.micro_batch=4",
        "--set",
        "training.flash_attention=false",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["fits"], false);
    assert!(err.contains("does not fit") && err.contains("stage"), "{err}");
}

#[test]
fn simulate_reports_the_keys_scripts_rely_on_and_writes_a_trace() {
    let trace = tmp("trace.json");
    let out = strata(&[
        "simulate",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--set",
        "parallel.global_batch=256",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "step_time_s",
        "tokens_per_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "breakdown_s",
        "peak_memory_bytes",
        "fits",
        "seed",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for key in ["compute", "tp_exposed", "dp_exposed", "pp_exposed", "bubble", "optimizer"] {
        assert!(v["breakdown_s"].get(key).is_some(), "missing breakdown_s.{key}");
    }
    assert_eq!(v["peak_memory_bytes"].as_array().unwrap().len(), 8);
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(t["traceEvents"].as_array().unwrap().len() > 1000);
    // Same scenario and seed: the same bytes.
    let again =
        strata(&["simulate", "scenarios/gpt3-175b-1024xa100.toml", "--set", "parallel.global_batch=256", "--json"]);
    assert_eq!(out.stdout, again.stdout);
    let oom = strata(&[
        "simulate",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=128",
        "--set",
        "parallel.schedule=1f1b",
        "--set",
        "parallel.vpp=1",
    ]);
    let text = String::from_utf8_lossy(&oom.stdout);
    assert!(oom.status.code() == Some(3) && text.contains("DOES NOT FIT: stage 0"), "{text}");
}

#[test]
fn search_writes_the_winner_and_answers_infeasible_requests() {
    let dir = tmp("search-out");
    let out = strata(&[
        "search",
        "scenarios/tiny-gpt-cpu.toml",
        "--splits-only",
        "--simulate",
        "4",
        "--out",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["valid"].as_u64().unwrap() > 10 && !v["top"].as_array().unwrap().is_empty());
    for f in ["best.toml", "plan.json", "candidates.csv"] {
        assert!(dir.join(f).exists(), "missing {f}");
    }
    // A CPU cluster's winner runs on Strata's own executor: no framework's launch files
    // (tests/export.rs checks a GPU winner's).
    assert!(!dir.join("megatron-args.txt").exists());
    let best = strata(&["inspect", dir.join("best.toml").to_str().unwrap()]);
    assert!(best.status.success(), "{}", String::from_utf8_lossy(&best.stderr));
    let none = strata(&[
        "search",
        "--set",
        "model.preset=llama3-405b",
        "--set",
        "model.vocab=128256",
        "--set",
        "cluster.preset=dgx-a100",
        "--set",
        "cluster.gpus_per_node=8",
        "--set",
        "parallel.tp=8",
        "--set",
        "parallel.pp=1",
        "--set",
        "parallel.dp=1",
        "--set",
        "parallel.global_batch=8",
        "--set",
        "training.dtype=bf16",
        "--splits-only",
    ]);
    let text = String::from_utf8_lossy(&none.stdout);
    assert!(
        none.status.success() && text.contains("Nothing fits") && text.contains("short"),
        "{text}{}",
        String::from_utf8_lossy(&none.stderr)
    );
}

#[test]
fn train_writes_its_outputs_and_refuses_bad_input() {
    let dir = tmp("train-out");
    let out = strata(&[
        "train",
        "scenarios/tiny-gpt-cpu.toml",
        "--ranks",
        "8",
        "--steps",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let loss = std::fs::read_to_string(dir.join("loss.csv")).unwrap();
    assert!(loss.starts_with("step,loss,tokens_per_s"), "{loss}");
    assert_eq!(loss.lines().count(), 3);
    // --ranks sizes cpu-local (tests/checkpoints.rs trains --ranks 2); zero ranks is refused.
    rejects(&strata(&["train", "scenarios/tiny-gpt-cpu.toml", "--ranks", "0", "--steps", "1"]), &["--ranks 0"]);
    rejects(
        &strata(&["train", "scenarios/tiny-gpt-cpu.toml", "--ranks", "8", "--data", "no/such/corpus.txt"]),
        &["no/such/corpus.txt"],
    );
    rejects(&strata(&["train", "scenarios/gpt3-175b-1024xa100.toml", "--ranks", "1024", "--steps", "1"]), &["cpu"]);
    // One process for all GPUs is a CUDA run's.
    rejects(&strata(&["train", "scenarios/tiny-gpt-cpu.toml", "--all-gpus", "--steps", "1"]), &["--backend cuda"]);
}

#[test]
fn ranks_size_a_one_gpu_scenario_before_its_split_is_checked() {
    // A one-GPU scenario asked for tp 2 · pp 2 on 8 ranks: the cluster is sized to the ranks
    // first, so the split is valid (as `cargo xtask device-check` runs it on one H200).
    let one = "scenarios/tiny-gpt-1xh200.toml";
    let cpu = ["--set", "cluster.preset=\"cpu-local\"", "--set", "cluster.nics_per_node=0"];
    for split in [
        &["--set", "parallel.tp=2", "--set", "parallel.pp=2", "--ranks", "8"][..],
        &["--set", "parallel.tp=2", "--ranks", "2"],
    ] {
        let mut args = vec!["train", one, "--steps", "1"];
        args.extend(cpu);
        args.extend(split);
        let out = strata(&args);
        assert!(out.status.success(), "{split:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Without --ranks the one-GPU cluster still refuses the split, naming it.
    let mut args = vec!["train", one, "--steps", "1", "--set", "parallel.tp=2"];
    args.extend(cpu);
    rejects(&strata(&args), &["parallel.tp"]);
}

#[test]
fn calibrate_compare_and_report_refuse_bad_input() {
    rejects(&strata(&["compare", "--steps", "0"]), &["--steps 0", "at least one step"]);
    rejects(&strata(&["compare", "--plan", "bogus"]), &["bogus", "KEY=VALUE"]);
    rejects(&strata(&["compare", "--plan", "tp=3"]), &["parallel.tp", "heads"]);
    rejects(&strata(&["compare", "--set", "cluster.preset=dgx-a100"]), &["cpu-local"]);
    rejects(&strata(&["calibrate", "--ranks", "0"]), &["--ranks 0"]);
    rejects(&strata(&["calibrate", "--backend", "cuda"]), &["cuda", "--backend cpu"]);
    rejects(&strata(&["report", "/nonexistent/strata-report"]), &["not found", "strata compare"]);
}
