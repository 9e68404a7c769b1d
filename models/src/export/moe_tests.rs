//! Tests of the exports of mixtures of experts, latent attention, context parallelism and
//! fp8: the flags and keys each framework names them by (every Megatron-LM flag checked
//! against Megatron-LM's own flag list, `xtask/interop/megatron-flags.txt`).

use super::*;
use crate::scenario::Scenario;

fn scenario(model: &str, nodes: u32, parallel: &str, training: &str) -> Scenario {
    let text = format!(
        "name = \"t\"\n[model]\npreset = \"{model}\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = {nodes}\n[parallel]\n{parallel}\n[training]\nflash_attention = true\n{training}\n"
    );
    Scenario::from_toml(&text, "test", "t", &[]).unwrap()
}

/// DeepSeek-V3's layout (arXiv 2412.19437 §3.2): PP16, EP64, ZeRO-1 data parallelism, no TP.
fn deepseek(training: &str) -> Scenario {
    scenario("deepseek-v3", 256, "tp = 1\npp = 16\nep = 64\nzero = 1\nglobal_batch = 15360", training)
}

fn file<'a>(e: &'a Export, name: &str) -> &'a str {
    &e.files.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no {name}")).text
}

#[test]
fn megatron_names_moe_mla_mtp_cp_and_fp8_with_its_own_flags() {
    let e = export(&deepseek("framework = \"megatron\"\ndtype = \"fp8\""), Framework::Megatron, false).unwrap();
    let args = file(&e, "megatron-args.txt");
    for line in [
        "--num-experts 256",
        "--moe-router-topk 8",
        "--moe-ffn-hidden-size 2048",
        "--moe-shared-expert-intermediate-size 2048",
        "--moe-layer-freq ([0]*3+[1]*58)",
        "--moe-router-score-function sigmoid",
        "--moe-grouped-gemm",
        "--moe-token-dispatcher-type alltoall",
        "--expert-model-parallel-size 64",
        "--expert-tensor-parallel-size 1",
        "--multi-latent-attention",
        "--q-lora-rank 1536",
        "--kv-lora-rank 512",
        "--qk-head-dim 128",
        "--qk-pos-emb-head-dim 64",
        "--v-head-dim 128",
        "--mtp-num-layers 1",
        "--ffn-hidden-size 18432",
        "--fp8-format hybrid",
        "--fp8-recipe delayed",
        "--bf16",
    ] {
        assert!(args.lines().any(|l| l == line), "missing {line:?} in\n{args}");
    }
    // Dropless: no capacity factor.
    assert!(!args.contains("--moe-expert-capacity-factor"));
    // Every flag is one of Megatron-LM's (core_v0.16.1 arguments.py).
    let known: Vec<&str> = include_str!("../../../xtask/interop/megatron-flags.txt").lines().collect();
    for flag in args.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(known.contains(&flag), "{flag} is not a Megatron-LM flag");
    }
    // Context parallelism and a capacity factor on Mixtral.
    let mut s = scenario(
        "mixtral-8x7b",
        8,
        "tp = 2\nsequence_parallel = true\npp = 1\ncp = 4\ncp_comm = \"all-gather\"\nep = 8\nglobal_batch = 64",
        "",
    );
    s.model.moe.as_mut().unwrap().capacity_factor = Some(1.25);
    let e = export(&s, Framework::Megatron, false).unwrap();
    let args = file(&e, "megatron-args.txt");
    for line in ["--context-parallel-size 4", "--cp-comm-type allgather", "--moe-expert-capacity-factor 1.25"] {
        assert!(args.lines().any(|l| l == line), "missing {line:?}");
    }
    assert!(!args.contains("--moe-layer-freq") && !args.contains("--multi-latent-attention"));
    assert!(file(&e, "megatron-launch.sh").contains("CUDA_DEVICE_MAX_CONNECTIONS=1"));
}

#[test]
fn deepspeed_says_ulysses_in_its_config_and_moe_and_fp8_in_the_notes() {
    let s = scenario(
        "mixtral-8x7b",
        8,
        "tp = 1\npp = 1\ncp = 4\ncp_comm = \"ulysses\"\nep = 8\nglobal_batch = 64",
        "framework = \"deepspeed\"\ndtype = \"fp8\"",
    );
    let e = export(&s, Framework::DeepSpeed, false).unwrap();
    assert!(e.dropped.is_empty(), "{:?}", e.dropped);
    let c: serde_json::Value = serde_json::from_str(file(&e, "deepspeed.json")).unwrap();
    assert_eq!(c["sequence_parallel_size"], 4);
    assert_eq!(c["bf16"]["enabled"], true);
    let notes = file(&e, "deepspeed-notes.md");
    assert!(notes.contains("num_experts=8, ep_size=8, k=2, drop_tokens=False (dropless)"), "{notes}");
    assert!(notes.contains("DistributedAttention") && notes.contains("fp8_autocast"), "{notes}");
}

#[test]
fn torchtitan_writes_deepseek_v3_with_ep_cp_and_float8() {
    let s = scenario(
        "deepseek-v3",
        256,
        "tp = 1\npp = 16\ncp = 2\nep = 64\nzero = 2\nglobal_batch = 15360",
        "framework = \"torchtitan\"\ndtype = \"fp8\"",
    );
    let e = export(&s, Framework::Torchtitan, true).unwrap();
    let t = file(&e, "torchtitan.toml");
    let doc: toml::Table = toml::from_str(t).unwrap();
    assert_eq!(doc["model"]["name"].as_str(), Some("deepseek_v3"));
    assert_eq!(doc["model"]["flavor"].as_str(), Some("671B"));
    assert_eq!(doc["model"]["converters"].as_array().unwrap()[0].as_str(), Some("quantize.linear.float8"));
    assert_eq!(doc["quantize"]["linear"]["float8"]["recipe_name"].as_str(), Some("tensorwise"));
    let par = &doc["parallelism"];
    assert_eq!(par["context_parallel_degree"].as_integer(), Some(2));
    assert_eq!(par["context_parallel_rotate_method"].as_str(), Some("alltoall"));
    assert_eq!(par["expert_parallel_degree"].as_integer(), Some(64));
    assert_eq!(par["expert_tensor_parallel_degree"].as_integer(), Some(1));
    // The MTP module is the one thing torchtitan's model lacks.
    let dropped: Vec<&str> = e.dropped.iter().map(|d| d.setting.as_str()).collect();
    assert_eq!(dropped, vec!["model.mtp_layers = 1"]);
    // Mixtral has no torchtitan model: named, not silently written as llama3.
    let m = scenario(
        "mixtral-8x7b",
        8,
        "tp = 1\npp = 1\nep = 8\nzero = 2\nglobal_batch = 64",
        "framework = \"torchtitan\"",
    );
    let e = export(&m, Framework::Torchtitan, true).unwrap();
    assert!(e.dropped.iter().any(|d| d.setting.contains("model.moe")), "{:?}", e.dropped);
}

#[test]
fn megatron_names_the_expert_all_to_all_overlap_and_refuses_it_without_interleaving() {
    // DeepSeek-V3's layout on the interleaved schedule (m = 16384 / 128 = 128, a multiple of pp).
    let s = scenario(
        "deepseek-v3",
        256,
        "tp = 1\npp = 16\nvpp = 2\nschedule = \"interleaved\"\nep = 64\nzero = 1\nglobal_batch = 16384\nmoe_a2a_overlap = true",
        "framework = \"megatron\"",
    );
    let e = export(&s, Framework::Megatron, false).unwrap();
    let args = file(&e, "megatron-args.txt");
    assert!(args.lines().any(|l| l == "--overlap-moe-expert-parallel-comm"), "{args}");
    assert!(!args.contains("--moe-shared-expert-overlap"), "megatron-core refuses both together");
    let known: Vec<&str> = include_str!("../../../xtask/interop/megatron-flags.txt").lines().collect();
    for flag in args.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(known.contains(&flag), "{flag} is not a Megatron-LM flag");
    }
    // Without it, no flag.
    let off = scenario(
        "deepseek-v3",
        256,
        "tp = 1\npp = 16\nvpp = 2\nschedule = \"interleaved\"\nep = 64\nzero = 1\nglobal_batch = 16384",
        "framework = \"megatron\"",
    );
    let e = export(&off, Framework::Megatron, false).unwrap();
    assert!(!file(&e, "megatron-args.txt").contains("--overlap-moe-expert-parallel-comm"));
    // 1F1B with a pipeline: megatron-core asserts a virtual pipeline.
    let text = "name = \"t\"\n[model]\npreset = \"deepseek-v3\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 256\n\
                [parallel]\ntp = 1\npp = 16\nep = 64\nzero = 1\nglobal_batch = 15360\nmoe_a2a_overlap = true\n\
                [training]\nframework = \"megatron\"\n";
    let err = Scenario::from_toml(text, "test", "t", &[]).unwrap_err().to_string();
    assert!(err.contains("--overlap-moe-expert-parallel-comm") && err.contains("interleaved"), "{err}");
}

#[test]
fn qwen3_exports_its_head_width_as_each_framework_names_it() {
    // Megatron-LM: --kv-channels (its kv_channels, default hidden / heads).
    let s = scenario(
        "qwen3-235b-a22b",
        32,
        "tp = 2\npp = 32\nep = 8\nzero = 1\nglobal_batch = 2048\nsequence_parallel = true",
        "framework = \"megatron\"",
    );
    let e = export(&s, Framework::Megatron, false).unwrap();
    let args = file(&e, "megatron-args.txt");
    for flag in ["--num-attention-heads 64", "--kv-channels 128", "--group-query-attention --num-query-groups 4"] {
        assert!(args.contains(flag), "{flag}:\n{args}");
    }
    // torchtitan v0.2.2: its qwen3 model, flavor 235B-A22B (head_dim 128 there); its flavor's
    // rope θ and its missing pipeline are said, not written.
    let t = scenario(
        "qwen3-235b-a22b",
        32,
        "tp = 2\npp = 2\nep = 8\nzero = 2\nglobal_batch = 2048\nsequence_parallel = true",
        "framework = \"torchtitan\"",
    );
    let e = export(&t, Framework::Torchtitan, true).unwrap();
    let doc: toml::Table = toml::from_str(file(&e, "torchtitan.toml")).unwrap();
    assert_eq!(doc["model"]["name"].as_str(), Some("qwen3"));
    assert_eq!(doc["model"]["flavor"].as_str(), Some("235B-A22B"));
    let dropped: Vec<&str> = e.dropped.iter().map(|d| d.setting.as_str()).collect();
    assert_eq!(dropped, vec!["model.rope_base = 1000000", "parallel.pp = 2"]);
    // A llama3 flavor's shape with a head width apart from dim / n_heads is not that flavor.
    let mut l =
        scenario("llama3-8b", 1, "tp = 8\nglobal_batch = 8\nsequence_parallel = true", "framework = \"torchtitan\"");
    l.model.head_dim = Some(64);
    let e = export(&l, Framework::Torchtitan, true).unwrap();
    assert!(e.dropped.iter().any(|d| d.setting.starts_with("model.head_dim = 64")), "{:?}", e.dropped);
    // DeepSpeed takes the model from the script: the notes give Hugging Face's head_dim.
    let d = scenario(
        "qwen3-235b-a22b",
        32,
        "tp = 1\npp = 1\ndp = 256\nep = 8\nzero = 1\nglobal_batch = 2048",
        "framework = \"deepspeed\"",
    );
    let e = export(&d, Framework::DeepSpeed, false).unwrap();
    assert!(file(&e, "deepspeed-notes.md").contains("head_dim 128"), "{}", file(&e, "deepspeed-notes.md"));
}
