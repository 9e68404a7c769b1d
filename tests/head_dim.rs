//! `model.head_dim` through the binary: set to h / heads, GPT-3 175B's simulated step is
//! byte for byte the one without it (19.202083475 s); the Qwen3-235B-A22B preset inspects
//! with its 8,192-wide queries and exports `--kv-channels 128`; bad values exit 2 naming
//! them; the CPU executor refuses a head width it does not implement.

mod support;
use support::{fails, strata};

const GPT3: &str = "scenarios/gpt3-175b-1024xa100.toml";

fn stdout(args: &[&str]) -> String {
    let out = strata(args);
    assert!(out.status.success(), "{args:?}: {}", support::stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn head_dim_equal_to_h_over_heads_simulates_byte_for_byte_the_same() {
    let before = stdout(&["simulate", GPT3, "--json"]);
    // 12,288 / 96 = 128.
    let explicit = stdout(&["simulate", GPT3, "--json", "--set", "model.head_dim=128"]);
    assert_eq!(before, explicit);
    let v: serde_json::Value = serde_json::from_str(&before).unwrap();
    // Pinned before model.head_dim existed (symmetric mode, seed 0); 18.938281782 s before
    // Megatron-LM's vocab-parallel cross-entropy passes were costed, 18.975511062 s before
    // its selective recomputation re-ran the fused attention core.
    assert_eq!(v["step_time_s"].as_f64().unwrap(), 19.202083475000002);
}

#[test]
fn a_wider_head_costs_more_by_its_flops() {
    let narrow = stdout(&["inspect", GPT3, "--json"]);
    let wide = stdout(&["inspect", GPT3, "--json", "--set", "model.head_dim=256"]);
    assert_ne!(narrow, wide);
    let text = stdout(&["inspect", "scenarios/qwen3-235b-a22b-256xh100.toml"]);
    assert!(text.contains("64 heads (4 kv) of 128 channels (q width 8192)"), "{text}");
    assert!(text.contains("235.09 B parameters") && text.contains("22.19 B active"), "{text}");
}

#[test]
fn exports_carry_the_head_width() {
    let dir = support::tmp_in("head-dim", "export");
    let out =
        strata(&["export", "scenarios/qwen3-235b-a22b-256xh100.toml", "--to", "megatron", "--out", support::s(&dir)]);
    assert!(out.status.success(), "{}", support::stderr(&out));
    let args: String = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .collect();
    assert!(args.contains("--kv-channels 128") && args.contains("--num-attention-heads 64"), "{args}");
}

#[test]
fn bad_head_widths_exit_2_naming_the_value() {
    let set = |kv: &str| strata(&["inspect", GPT3, "--set", kv]);
    fails(&set("model.head_dim=0"), 2, &["model.head_dim = 0"]);
    fails(&set("model.head_dim=4097"), 2, &["model.head_dim = 4097", "docs/limits.md"]);
    fails(&set("model.head_dim=-1"), 2, &["head_dim"]);
    // The CPU executor's attention is h / heads wide per head.
    fails(
        &strata(&["train", "scenarios/tiny-gpt-cpu.toml", "--set", "model.head_dim=8", "--steps", "1"]),
        2,
        &["model.head_dim = 8", "not implemented"],
    );
}
