//! Tests of scenario loading: presets, derived values, overrides and the messages of
//! invalid scenarios.

use super::*;

const GPT3: &str = r#"
name = "gpt3"
[model]
preset = "gpt3-175b"
[cluster]
preset = "dgx-a100"
nodes = 128
[parallel]
tp = 8
pp = 8
global_batch = 1536
schedule = "1f1b"
recompute = "selective"
sequence_parallel = true
"#;

#[test]
fn presets_resolve_and_dp_is_derived() {
    let s = Scenario::from_toml(GPT3, "t", "t", &[]).unwrap();
    assert_eq!(s.parallel.dp, 16);
    assert_eq!(s.model.layers, 96);
    assert_eq!(s.cluster.gpus(), 1024);
    assert_eq!(s.training.dtype, Dtype::Bf16);
}

#[test]
fn unknown_keys_name_the_key_and_line() {
    let text = GPT3.replace("tp = 8", "tp = 8\ntensor_parallel = 8");
    let e = Scenario::from_toml(&text, "t.toml", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("tensor_parallel") && e.contains("line 10"), "{e}");
}

#[test]
fn overrides_parse_values_and_bare_words() {
    let s = Scenario::from_toml(
        GPT3,
        "t",
        "t",
        &[
            "parallel.tp=4".into(),
            "parallel.schedule=gpipe".into(),
            "parallel.dp=32".into(),
            "training.framework=torchtitan".into(),
            "parallel.sequence_parallel=true".into(),
        ],
    )
    .unwrap();
    assert_eq!((s.parallel.tp, s.parallel.dp, s.parallel.schedule), (4, 32, Schedule::Gpipe));
    let e = Scenario::from_toml(GPT3, "t", "t", &["parallel.bogus=1".into()]).unwrap_err().to_string();
    assert!(e.contains("bogus"), "{e}");
    let e = Scenario::from_toml(GPT3, "t", "t", &["parallel.tp".into()]).unwrap_err().to_string();
    assert!(e.contains("KEY=VALUE"), "{e}");
    let e = Scenario::from_toml(GPT3, "t", "t", &["parallel.tp=four".into()]).unwrap_err().to_string();
    assert!(e.contains("four") || e.contains("invalid type"), "{e}");
}

#[test]
fn impossible_splits_name_the_rule() {
    let e = Scenario::from_toml(GPT3, "t", "t", &["parallel.dp=3".into()]).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("8 · 1 · 3 · 8 = 192"), "{text}");
    match e {
        ScenarioError::Invalid { config: Some(c), .. } => assert!(c.has("grid-equals-gpus")),
        other => panic!("wrong error {other:?}"),
    }
}

#[test]
fn unknown_presets_list_the_known_ones() {
    let e = Scenario::from_toml("[model]\npreset = \"gpt9\"", "t", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("gpt9") && e.contains("llama3-8b"), "{e}");
    let e = Scenario::from_toml(&GPT3.replace("a100-80gb", "x").replace("dgx-a100", "dgx-z"), "t", "t", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("dgx-z") && e.contains("dgx-h100"), "{e}");
}

#[test]
fn missing_keys_say_what_to_set() {
    let e = Scenario::from_toml("[model]\nlayers = 2\n", "t", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("model.family") && e.contains("preset"), "{e}");
}

#[test]
fn to_toml_round_trips() {
    let s = Scenario::from_toml(GPT3, "t", "t", &[]).unwrap();
    let back = Scenario::from_toml(&s.to_toml(), "t", "t", &[]).unwrap();
    assert_eq!(s, back);
}

#[test]
fn dropout_follows_the_family_except_on_cpu_ranks() {
    let gpt3 = Scenario::from_toml(GPT3, "t", "t", &[]).unwrap();
    assert_eq!(gpt3.model.dropout, 0.1);
    let cpu = "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\n[parallel]\nglobal_batch = 8\n";
    // The CPU executor has no dropout: its plans hold no masks unless asked to.
    assert_eq!(Scenario::from_toml(cpu, "t", "t", &[]).unwrap().model.dropout, 0.0);
    let asked = Scenario::from_toml(cpu, "t", "t", &["model.dropout=0.2".into()]).unwrap();
    assert_eq!(asked.model.dropout, 0.2);
    let e = Scenario::from_toml(cpu, "t", "t", &["model.dropout=1.5".into()]).unwrap_err().to_string();
    assert!(e.contains("model.dropout = 1.5"), "{e}");
}

#[test]
fn fabric_names_parse_and_unknown_ones_list_the_known() {
    let s = Scenario::from_toml(GPT3, "t", "t", &["cluster.fabric=leaf-spine".into()]).unwrap();
    assert_eq!(s.cluster.fabric, Fabric::LeafSpine);
    let text = GPT3.replace("nodes = 128", "nodes = 128\nfabric = \"dragonfly\"");
    let e = Scenario::from_toml(&text, "t.toml", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("dragonfly") && e.contains("rail-optimized") && e.contains("leaf-spine"), "{e}");
    let e = Scenario::from_toml(GPT3, "t", "t", &["cluster.fabric=torus".into()]).unwrap_err().to_string();
    assert!(e.contains("torus") && e.contains("leaf-spine"), "{e}");
}

#[test]
fn moe_keys_lay_over_the_presets_and_round_trip() {
    let text = "[model]\npreset = \"mixtral-8x7b\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 8\n[parallel]\ntp = 1\npp = 4\nep = 8\nglobal_batch = 64\n";
    let s = Scenario::from_toml(text, "t", "t", &["model.moe.top_k=1".into()]).unwrap();
    let moe = s.model.moe.as_ref().unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.expert_ffn_hidden), (8, 1, 14336));
    let s = Scenario::from_toml(text, "t", "t", &["model.moe.capacity_factor=1.5".into()]).unwrap();
    assert_eq!(s.model.moe.as_ref().unwrap().capacity_factor, Some(1.5));
    // Written back and read again: the same scenario, experts and all.
    let again = Scenario::from_toml(&s.to_toml(), "t", "t", &[]).unwrap();
    assert_eq!(again, s);
    let ds = "[model]\npreset = \"deepseek-v3\"\n[cluster]\npreset = \"dgx-h800\"\nnodes = 256\n[parallel]\npp = 16\nep = 64\nglobal_batch = 1920\n[training]\ndtype = \"fp8\"\n";
    let d = Scenario::from_toml(ds, "t", "t", &["model.mla.q_lora_rank=0".into()]).unwrap();
    assert_eq!(d.model.mla.as_ref().unwrap().q_lora_rank, 0);
    assert_eq!(Scenario::from_toml(&d.to_toml(), "t", "t", &[]).unwrap(), d);
    // A dense preset given experts must say the required keys.
    let dense = "[model]\npreset = \"tiny-llama\"\nmoe = { top_k = 2 }\n[cluster]\npreset = \"cpu-local\"\n[parallel]\nglobal_batch = 8\n";
    let e = Scenario::from_toml(dense, "t", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("model.moe.experts is missing"), "{e}");
}
