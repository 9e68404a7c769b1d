//! Tests of the export writers: whole files for a few splits (snapshots in `snapshots/`,
//! `UPDATE_EXPECT=1` rewrites them), the units and rules that were wrong before (bucket in
//! elements, Llama's rotary base and dropout, `CUDA_DEVICE_MAX_CONNECTIONS`), every
//! setting a target drops, and the errors.

use super::*;
use crate::scenario::Scenario;

fn scenario(model: &str, cluster: &str, nodes: u32, parallel: &str, training: &str) -> Scenario {
    let text = format!(
        "name = \"t\"\n[model]\npreset = \"{model}\"\n[cluster]\npreset = \"{cluster}\"\nnodes = {nodes}\n[parallel]\n{parallel}\n[training]\nframework = \"strata\"\n{training}\n"
    );
    Scenario::from_toml(&text, "test", "t", &[]).unwrap()
}

fn gpt3_interleaved() -> Scenario {
    scenario(
        "gpt3-175b",
        "dgx-a100",
        128,
        "tp = 8\npp = 8\ndp = 16\nschedule = \"interleaved\"\nvpp = 3\nglobal_batch = 1536\nzero = 1\nrecompute = \"selective\"\nsequence_parallel = true",
        "",
    )
}

fn llama405_1f1b() -> Scenario {
    scenario(
        "llama3-405b",
        "dgx-h100",
        2048,
        "tp = 8\npp = 16\ndp = 128\nglobal_batch = 2048\nzero = 1\nrecompute = \"full\"\nsequence_parallel = true",
        "flash_attention = true",
    )
}

fn llama8b(parallel: &str) -> Scenario {
    scenario("llama3-8b", "dgx-a100", 1, parallel, "flash_attention = true")
}

fn file<'a>(e: &'a Export, name: &str) -> &'a str {
    &e.files.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no {name}")).text
}

fn snapshot(e: &Export) -> String {
    let mut o = String::new();
    for f in &e.files {
        o.push_str(&format!("==> {} <==\n{}", f.name, f.text));
    }
    for d in &e.dropped {
        o.push_str(&format!("dropped: {d}\n"));
    }
    o
}

#[test]
fn megatron_gpt3_interleaved() {
    let e = export(&gpt3_interleaved(), Framework::Megatron, false).unwrap();
    expect_test::expect_file!["snapshots/megatron-gpt3-interleaved.txt"].assert_eq(&snapshot(&e));
}

#[test]
fn megatron_llama3_405b_uneven_layout() {
    let e = export(&llama405_1f1b(), Framework::Megatron, false).unwrap();
    expect_test::expect_file!["snapshots/megatron-llama3-405b.txt"].assert_eq(&snapshot(&e));
    // 126 layers over 16 stages: the two end stages hold 7, the rest 8, as the plan splits them.
    let args = file(&e, "megatron-args.txt");
    assert!(args.contains(&format!("--pipeline-model-parallel-layout Et*7|{}t*7L\n", "t*8|".repeat(14))), "{args}");
    assert!(!args.contains("--num-layers-per-virtual-pipeline-stage"));
}

#[test]
fn deepspeed_gpt3_pipeline() {
    let s = scenario(
        "gpt3-175b",
        "dgx-a100",
        128,
        "tp = 8\npp = 8\ndp = 16\nglobal_batch = 1536\nzero = 1\nrecompute = \"full\"\nsequence_parallel = false",
        "",
    );
    let e = export(&s, Framework::DeepSpeed, false).unwrap();
    expect_test::expect_file!["snapshots/deepspeed-gpt3-pp8.txt"].assert_eq(&snapshot(&e));
    let c: serde_json::Value = serde_json::from_str(file(&e, "deepspeed.json")).unwrap();
    // DeepSpeed's batch assertion on the data-parallel world.
    assert_eq!(c["train_batch_size"], 1536);
    assert_eq!(
        c["train_micro_batch_size_per_gpu"].as_u64().unwrap() * c["gradient_accumulation_steps"].as_u64().unwrap() * 16,
        1536
    );
    assert_eq!(c["tensor_parallel"], serde_json::json!({ "autotp_size": 8 }));
    assert!(c["pipeline"].get("partition_method").is_none());
    let ac = &c["activation_checkpointing"];
    assert_eq!(ac["contiguous_memory_optimization"], false);
    assert_eq!(ac["number_checkpoints"], 12);
}

#[test]
fn torchtitan_llama3_8b_fsdp() {
    let e = export(&llama8b("dp = 8\nglobal_batch = 64\nzero = 3\nrecompute = \"full\""), Framework::Torchtitan, false)
        .unwrap();
    expect_test::expect_file!["snapshots/torchtitan-llama3-8b-zero3.txt"].assert_eq(&snapshot(&e));
}

#[test]
fn torchtitan_pipeline_parts_follow_the_plan() {
    let s = scenario(
        "llama3-405b",
        "dgx-h100",
        2048,
        "tp = 8\npp = 16\ndp = 128\nschedule = \"interleaved\"\nvpp = 2\nglobal_batch = 2048\nzero = 3\nsequence_parallel = true",
        "flash_attention = true",
    );
    let e = export(&s, Framework::Torchtitan, false).unwrap();
    let t = file(&e, "torchtitan.toml");
    assert!(t.contains("pipeline_parallel_schedule = \"Interleaved1F1B\"\n"), "{t}");
    assert!(t.contains("[[\"tok_embeddings\", \"layers.0\", \"layers.1\", \"layers.2\"], [\"layers.3\""), "{t}");
    assert!(t.contains("[\"layers.123\", \"layers.124\", \"layers.125\", \"norm\", \"output\"]]"), "{t}");
    // A replica's batch per step under the pipeline; its microbatches are the plan's.
    assert!(t.contains("local_batch_size = 16\n") && t.contains("pipeline_parallel_microbatch_size = 1\n"), "{t}");
    let parsed: toml::Table = toml::from_str(t).unwrap();
    assert_eq!(parsed["parallelism"]["module_fqns_per_model_part"].as_array().unwrap().len(), 32);
}

#[test]
fn the_bucket_is_in_elements_of_the_reduced_dtype() {
    let mut s = gpt3_interleaved();
    s.training.framework = Framework::Megatron;
    // 40 MiB of fp32 main gradients.
    assert_eq!(bucket_elements(&s), 10_485_760);
    assert!(
        file(&export(&s, Framework::Megatron, false).unwrap(), "megatron-args.txt")
            .contains("--ddp-bucket-size 10485760\n")
    );
    let mut bf16 = s.clone();
    bf16.training.grad_reduce_in_bf16 = true;
    assert_eq!(bucket_elements(&bf16), 20_971_520);
    let args = file(&export(&bf16, Framework::Megatron, false).unwrap(), "megatron-args.txt").to_string();
    assert!(args.contains("--ddp-bucket-size 20971520\n") && args.contains("--grad-reduce-in-bf16\n"), "{args}");
}

#[test]
fn llama_gets_its_rotary_base_and_no_dropout() {
    let args = file(&export(&llama405_1f1b(), Framework::Megatron, false).unwrap(), "megatron-args.txt").to_string();
    for want in [
        "--rotary-base 500000\n",
        "--attention-dropout 0\n",
        "--hidden-dropout 0\n",
        "--group-query-attention --num-query-groups 8\n",
        "--swiglu\n",
        "--normalization RMSNorm\n",
        "--untie-embeddings-and-output-weights\n",
        "--position-embedding-type rope\n",
        "--attention-backend flash\n",
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1\n",
        // 128,256 / 8 = 16,032 = 32 · 501: padding to 32 · tp keeps the vocabulary.
        "--make-vocab-size-divisible-by 32\n",
        "--vocab-size 128255\n",
    ] {
        assert!(args.contains(want), "missing {want:?} in\n{args}");
    }
    let mut llama2 = llama405_1f1b();
    llama2.model.rope_base = 10_000.0;
    assert!(
        file(&export(&llama2, Framework::Megatron, false).unwrap(), "megatron-args.txt")
            .contains("--rotary-base 10000\n")
    );
}

#[test]
fn vocab_padding_is_the_models_own() {
    assert_eq!(megatron::vocab_divisor(51_200, 8), 128);
    assert_eq!(megatron::vocab_divisor(128_256, 8), 32);
    assert_eq!(megatron::vocab_divisor(50_257, 1), 1);
    assert_eq!(megatron::vocab_divisor(50_257, 2), 1);
}

#[test]
fn max_connections_only_with_tp_before_blackwell() {
    let launch = |s: &Scenario| file(&export(s, Framework::Megatron, false).unwrap(), "megatron-launch.sh").to_string();
    assert!(launch(&gpt3_interleaved()).contains("\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"));
    let tp1 = llama8b("dp = 8\nglobal_batch = 64\nzero = 1");
    assert!(!launch(&tp1).contains("CUDA_DEVICE_MAX_CONNECTIONS"));
    let b200 = scenario("gpt2-350m", "dgx-b200", 1, "tp = 2\ndp = 4\nglobal_batch = 64\nzero = 1", "");
    assert!(!megatron::needs_max_connections_1(&b200));
    assert!(!launch(&b200).contains("CUDA_DEVICE_MAX_CONNECTIONS"));
}

#[test]
fn every_dropped_setting_is_named() {
    // torchtitan: a GPT, with everything its TOML cannot say.
    let mut s = scenario(
        "gpt2-350m",
        "dgx-h100",
        1,
        "tp = 2\ndp = 4\nglobal_batch = 64\nzero = 2\nrecompute = \"selective\"\nsequence_parallel = true\noverlap_grad_reduce = false",
        "dtype = \"fp16\"\nflash_attention = false",
    );
    s.training.grad_reduce_in_bf16 = true;
    let err = export(&s, Framework::Torchtitan, false).unwrap_err();
    let ExportError::Inexpressible { dropped, .. } = &err else { panic!("{err}") };
    let settings: Vec<&str> = dropped.iter().map(|d| d.setting.as_str()).collect();
    assert_eq!(
        settings,
        [
            "model.family = \"gpt\"",
            "model.dropout = 0.1",
            "training.flash_attention = false",
            "training.dtype = \"fp16\"",
            "training.grad_reduce_in_bf16 = true",
            "parallel.overlap_grad_reduce = false",
            "parallel.recompute = \"selective\"",
        ]
    );
    let msg = err.to_string();
    assert!(msg.contains("--lossy") && msg.contains("parallel.recompute = \"selective\": "), "{msg}");
    // FSDP2 reduces per unit, and so does the plan under torchtitan: the bucket is no loss.
    assert!(!msg.contains("grad_bucket_mb"), "{msg}");
    let lossy = export(&s, Framework::Torchtitan, true).unwrap();
    assert_eq!(lossy.dropped.len(), 7);
    // A Llama whose shape and tokenizer torchtitan has no flavor for, under ZeRO-3 without prefetch.
    let tiny = scenario(
        "tiny-llama",
        "dgx-h100",
        1,
        "tp = 1\ndp = 8\nglobal_batch = 8\nzero = 3\noverlap_param_gather = false",
        "flash_attention = true",
    );
    let mut tiny = tiny;
    tiny.model.rope_base = 10_000.0;
    let e = export(&tiny, Framework::Torchtitan, true).unwrap();
    let settings: Vec<&str> = e.dropped.iter().map(|d| d.setting.as_str()).collect();
    assert_eq!(
        settings,
        [
            "model shape (layers 4, hidden 64, heads 4, kv_heads 2, ffn_hidden 176)",
            "model.vocab = 256",
            "model.rope_base = 10000",
            "parallel.overlap_param_gather = false",
        ]
    );
    // Megatron: --overlap-param-gather needs --overlap-grad-reduce.
    let mut m = gpt3_interleaved();
    m.parallel.overlap_grad_reduce = false;
    let e = export(&m, Framework::Megatron, true).unwrap();
    assert_eq!(e.dropped.len(), 1);
    assert_eq!(e.dropped[0].setting, "parallel.overlap_param_gather = true");
    assert!(!file(&e, "megatron-args.txt").contains("--overlap-param-gather"));
    assert!(export(&m, Framework::Megatron, false).is_err());
}

#[test]
fn a_split_the_target_cannot_run_names_the_rule() {
    let e = export(&gpt3_interleaved(), Framework::DeepSpeed, true).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("[deepspeed-schedule]") && msg.contains("[deepspeed-sp]"), "{msg}");
    let e = export(&gpt3_interleaved(), Framework::Torchtitan, true).unwrap_err();
    assert!(e.to_string().contains("[torchtitan-zero]"), "{e}");
    let zero2 = llama8b("tp = 2\npp = 2\ndp = 2\nglobal_batch = 64\nzero = 2\nsequence_parallel = true");
    let e = export(&zero2, Framework::Megatron, true).unwrap_err();
    assert!(e.to_string().contains("[megatron-zero]"), "{e}");
    assert!(matches!(export(&zero2, Framework::Strata, true), Err(ExportError::NotATarget(_))));
}

#[test]
fn tp_comm_overlap_is_exported_where_it_is_on() {
    let known: Vec<&str> = include_str!("../../../xtask/interop/megatron-flags.txt").lines().collect();
    assert!(known.contains(&"--tp-comm-overlap"), "Megatron-LM's flag list lacks --tp-comm-overlap");
    // Unset: on for sequence parallelism on H100, off on A100.
    let h100 = export(&llama405_1f1b(), Framework::Megatron, false).unwrap();
    assert!(file(&h100, "megatron-args.txt").contains("--tp-comm-overlap"));
    let a100 = export(&gpt3_interleaved(), Framework::Megatron, false).unwrap();
    assert!(!file(&a100, "megatron-args.txt").contains("--tp-comm-overlap"));
    // Set false on H100: not written.
    let mut off = llama405_1f1b();
    off.parallel.tp_comm_overlap = Some(false);
    let e = export(&off, Framework::Megatron, false).unwrap();
    assert!(!file(&e, "megatron-args.txt").contains("--tp-comm-overlap"));
    // torchtitan: async tensor parallelism, which acts only compiled.
    let mut tt = llama8b("tp = 8\npp = 1\ndp = 1\nglobal_batch = 8\nzero = 2\nsequence_parallel = true");
    tt.parallel.tp_comm_overlap = Some(true);
    let e = export(&tt, Framework::Torchtitan, false).unwrap();
    let t = file(&e, "torchtitan.toml");
    assert!(t.contains("enable_async_tensor_parallel = true") && t.contains("[compile]\nenable = true"), "{t}");
    // Unset under torchtitan: off.
    tt.parallel.tp_comm_overlap = None;
    let e = export(&tt, Framework::Torchtitan, false).unwrap();
    assert!(!file(&e, "torchtitan.toml").contains("async"));
}
