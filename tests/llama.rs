//! The shipped tiny Llama scenario through the binary: `strata train` runs it on 8 CPU
//! ranks (tp 2 · pp 2 · dp 2, ZeRO-1) and writes its outputs; context parallelism with
//! Llama, which the CPU executor does not run, and a tp that does not divide the key/value
//! heads exit 2 naming the key.

mod support;
use support::{fails, strata, tmp_in, trains_and_learns};

const SCENARIO: &str = "scenarios/tiny-llama-cpu.toml";

#[test]
fn the_shipped_tiny_llama_scenario_trains_and_writes_its_outputs() {
    let dir = tmp_in("llama", "train");
    trains_and_learns(SCENARIO, &dir);
    for f in ["trace.json", "memory.json", "plan.json"] {
        assert!(dir.join(f).exists(), "missing {f}");
    }
}

#[test]
fn cp_and_a_tp_past_the_kv_heads_exit_2_naming_the_key() {
    let cp = strata(&["train", SCENARIO, "--steps", "1", "--set", "parallel.dp=1", "--set", "parallel.cp=2"]);
    fails(&cp, 2, &["parallel.cp = 2", "Llama"]);
    let tp = strata(&["train", SCENARIO, "--steps", "1", "--set", "parallel.tp=4", "--set", "parallel.dp=1"]);
    fails(&tp, 2, &["model.kv_heads = 2"]);
}
