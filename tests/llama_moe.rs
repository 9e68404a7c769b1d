//! The shipped tiny Llama-family MoE scenario through the binary: `strata train` runs it
//! on 8 CPU ranks (tp 2 with sequence parallelism · pp 2 · dp 2, ep 2, SwiGLU routed and
//! shared experts) and the model learns.

mod support;
use support::{s, strata, tmp_in};

#[test]
fn the_shipped_tiny_llama_moe_scenario_trains() {
    let dir = tmp_in("llama-moe", "train");
    let out = strata(&["train", "scenarios/tiny-llama-moe-cpu.toml", "--steps", "4", "--out", s(&dir)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let loss = std::fs::read_to_string(dir.join("loss.csv")).unwrap();
    let losses: Vec<f64> =
        loss.lines().skip(1).map(|l| l.split(',').nth(1).and_then(|v| v.parse().ok()).unwrap()).collect();
    assert_eq!(losses.len(), 4, "{loss}");
    // A fresh model predicts ln 256 ≈ 5.55 nats per byte, and learns.
    assert!((losses[0] - 256f64.ln()).abs() < 0.1 && losses[3] < losses[0], "{losses:?}");
}
