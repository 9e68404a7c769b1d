//! The binary on impossible mixture-of-experts, context-parallel and fp8 input: each
//! refused with exit code 2 and a message naming the values and the rule (issue 18).

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

#[test]
fn impossible_moe_cp_and_fp8_splits_exit_2_naming_the_rule() {
    let mixtral = "scenarios/mixtral-8x7b-64xh100.toml";
    let cases: &[(&str, &[&str], &str)] = &[
        (mixtral, &["parallel.ep=16", "parallel.dp=8"], "does not divide model.moe.experts = 8"),
        (mixtral, &["model.moe.top_k=9"], "model.moe.top_k = 9 exceeds model.moe.experts = 8"),
        (mixtral, &["parallel.sequence_parallel=false"], "MoE with tensor parallelism uses sequence parallelism"),
        (mixtral, &["parallel.cp=2", "parallel.dp=4", "model.seq_len=4094"], "2 · parallel.cp = 2 · 2 = 4"),
        (mixtral, &["parallel.cp=8", "parallel.dp=1", "parallel.cp_comm=ulysses"], "model.kv_heads / tp = 8 / 2 = 4"),
        ("scenarios/gpt3-175b-1024xa100.toml", &["training.dtype=fp8"], "no fp8 tensor cores"),
        ("scenarios/tiny-gpt-cpu.toml", &["parallel.ep=2"], "the model has no experts"),
    ];
    for (file, sets, words) in cases {
        let mut args = vec!["inspect", file];
        for s in *sets {
            args.extend(["--set", s]);
        }
        let o = run(&args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(words), "{args:?}: {e}");
    }
}

#[test]
fn the_shipped_moe_scenarios_load() {
    for f in ["scenarios/mixtral-8x7b-64xh100.toml", "scenarios/tiny-moe-cpu.toml"] {
        let o = run(&["inspect", f, "--json"]);
        assert_eq!(o.status.code(), Some(0), "{f}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v["active_params"].as_u64().unwrap() < v["total_params"].as_u64().unwrap(), "{f}");
    }
}
