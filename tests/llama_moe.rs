//! The shipped tiny Llama-family MoE scenario through the binary: `strata train` runs it
//! on 8 CPU ranks (tp 2 with sequence parallelism · pp 2 · dp 2, ep 2, SwiGLU routed and
//! shared experts) and the model learns.

mod support;
use support::{tmp_in, trains_and_learns};

#[test]
fn the_shipped_tiny_llama_moe_scenario_trains() {
    let dir = tmp_in("llama-moe", "train");
    trains_and_learns("scenarios/tiny-llama-moe-cpu.toml", &dir);
}
