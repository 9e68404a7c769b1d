//! End-to-end tests of `strata export`: files written for any split, a split the target
//! cannot run and a setting it cannot express exit with code 2 naming the rule or the
//! setting, `--lossy` warns once per dropped setting, and `search --out` writes the
//! winner's launch files through the same code.

use std::path::PathBuf;
use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().expect("run strata")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("strata-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn rejects(out: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked") && err.starts_with("error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "message lacks {w:?}: {err}");
    }
}

#[test]
fn exports_any_split_to_a_directory() {
    let dir = tmp("megatron");
    let out = strata(&[
        "export",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--to",
        "megatron",
        "--set",
        "parallel.zero=1",
        "--set",
        "parallel.schedule=1f1b",
        "--set",
        "parallel.vpp=1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let args = std::fs::read_to_string(dir.join("megatron-args.txt")).unwrap();
    assert!(args.contains("--tensor-model-parallel-size 8\n") && !args.contains("virtual"), "{args}");
    let launch = std::fs::read_to_string(dir.join("megatron-launch.sh")).unwrap();
    assert!(launch.contains("export CUDA_DEVICE_MAX_CONNECTIONS=1") && launch.contains("pretrain_gpt.py"));
    // Without --out the files are printed; --json gives them as data.
    let out = strata(&[
        "export",
        "scenarios/llama3-405b-16384xh100.toml",
        "--to",
        "megatron",
        "--set",
        "parallel.zero=1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["framework"], "megatron");
    assert_eq!(v["files"][0]["name"], "megatron-args.txt");
    assert!(v["files"][0]["text"].as_str().unwrap().contains("--rotary-base 500000"));
}

#[test]
fn a_split_the_target_cannot_run_exits_2_naming_the_rule() {
    let out = strata(&["export", "scenarios/gpt3-175b-1024xa100.toml", "--to", "deepspeed"]);
    rejects(&out, &["cannot export to DeepSpeed", "[deepspeed-schedule]", "[deepspeed-sp]"]);
    let out = strata(&["export", "scenarios/gpt3-175b-1024xa100.toml", "--to", "megatron", "--set", "parallel.zero=2"]);
    rejects(&out, &["[megatron-zero]", "parallel.zero = 2"]);
    let out = strata(&["export", "scenarios/gpt3-175b-1024xa100.toml", "--to", "torchtitan", "--lossy"]);
    rejects(&out, &["[torchtitan-zero]"]);
    let out = strata(&["export", "scenarios/gpt3-175b-1024xa100.toml", "--to", "fairseq"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_setting_the_target_cannot_express_is_an_error_or_a_warning_with_lossy() {
    let base = [
        "export",
        "scenarios/llama3-405b-16384xh100.toml",
        "--to",
        "torchtitan",
        "--set",
        "parallel.zero=2",
        "--set",
        "model.rope_base=10000",
    ];
    // FSDP2 reduces per unit and so does the plan under torchtitan: the bucket is no loss.
    let refused = strata(&base);
    rejects(&refused, &["--lossy", "model.rope_base = 10000"]);
    assert!(!String::from_utf8_lossy(&refused.stderr).contains("grad_bucket_mb"));
    let dir = tmp("torchtitan");
    let mut lossy = base.to_vec();
    lossy.extend(["--lossy", "--out", dir.to_str().unwrap()]);
    let out = strata(&lossy);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> =
        err.lines().filter(|l| l.starts_with("warning: --lossy: torchtitan export drops ")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("model.rope_base = 10000"), "{err}");
    let toml = std::fs::read_to_string(dir.join("torchtitan.toml")).unwrap();
    assert!(toml.contains("fsdp_reshard_after_forward = \"never\""), "{toml}");
}

#[test]
fn search_writes_the_winners_launch_files() {
    let dir = tmp("search");
    let out = strata(&[
        "search",
        "scenarios/gpt3-175b-1024xa100.toml",
        "--splits-only",
        "--simulate",
        "2",
        "--top",
        "2",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("megatron-args.txt, megatron-launch.sh"), "{text}");
    assert!(dir.join("megatron-args.txt").exists() && !dir.join("deepspeed.json").exists());
}
