//! Tests of the framework rules: each rule fires on the split it names and only there, the
//! defaults per cluster, and scenario loading rejects an unrunnable split naming the rule.

use super::*;
use crate::scenario::ScenarioError;

fn scenario(framework: &str, parallel: &str) -> Result<Scenario, ScenarioError> {
    let batch = if parallel.contains("global_batch") { "" } else { "global_batch = 1536\n" };
    let text = format!(
        "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = 128\n\
         [parallel]\n{batch}{parallel}\n[training]\nframework = \"{framework}\"\n"
    );
    Scenario::from_toml(&text, "t.toml", "t", &[])
}

/// The split under Strata's executor (which runs everything), checked against `fw`.
fn rules_of(fw: Framework, parallel: &str) -> Vec<&'static str> {
    let s = scenario("strata", parallel).expect("a valid split");
    fw.violations(&s).into_iter().map(|v| v.rule).collect()
}

#[test]
fn every_rule_fires_on_its_split() {
    let cases: [(Framework, &str, &str); 9] = [
        (Framework::Megatron, "tp = 8\npp = 1\nzero = 2", "megatron-zero"),
        (Framework::Megatron, "tp = 8\npp = 8\nschedule = \"gpipe\"", "megatron-schedule"),
        (Framework::Megatron, "tp = 8\npp = 8\nschedule = \"zb-h1\"", "megatron-schedule"),
        (Framework::DeepSpeed, "tp = 8\npp = 2\nzero = 2", "deepspeed-zero-pp"),
        (Framework::DeepSpeed, "tp = 8\npp = 8\nvpp = 2\nschedule = \"interleaved\"", "deepspeed-schedule"),
        (Framework::DeepSpeed, "tp = 8\npp = 8\nsequence_parallel = true", "deepspeed-sp"),
        (Framework::DeepSpeed, "tp = 8\npp = 1\nzero = 3", "deepspeed-autotp-zero3"),
        (Framework::Torchtitan, "tp = 8\npp = 8\nzero = 1\nsequence_parallel = true", "torchtitan-zero"),
        (
            Framework::Torchtitan,
            "tp = 8\npp = 8\nschedule = \"zb-h2\"\nsequence_parallel = true",
            "torchtitan-schedule",
        ),
    ];
    for (fw, split, rule) in cases {
        let got = rules_of(fw, split);
        assert_eq!(got, vec![rule], "{fw:?} on {split:?}");
    }
    assert_eq!(rules_of(Framework::Torchtitan, "tp = 8\npp = 8"), vec!["torchtitan-tp-sp"]);
}

#[test]
fn the_common_splits_run_where_they_should() {
    // Megatron's own GPT-3 split runs under Megatron-LM; with SP on, torchtitan too.
    let sp = "tp = 8\npp = 8\nvpp = 3\nschedule = \"interleaved\"\nzero = 1\nsequence_parallel = true";
    assert_eq!(Framework::runners(&scenario("strata", sp).unwrap()), vec![Framework::Megatron]);
    // Pure ZeRO-3 data parallelism: DeepSpeed and torchtitan, not Megatron-LM.
    let z3 = "tp = 1\npp = 1\nzero = 3\nglobal_batch = 2048";
    assert_eq!(Framework::runners(&scenario("strata", z3).unwrap()), vec![Framework::DeepSpeed, Framework::Torchtitan]);
    // A pipeline schedule only Strata runs.
    let zb = "tp = 8\npp = 8\nschedule = \"zb-h1\"\nzero = 1";
    assert!(Framework::runners(&scenario("strata", zb).unwrap()).is_empty());
    assert!(Framework::Strata.violations(&scenario("strata", zb).unwrap()).is_empty());
}

#[test]
fn loading_an_unrunnable_split_names_the_rule_and_the_way_out() {
    let e = scenario("deepspeed", "tp = 8\npp = 2\nzero = 2").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("deepspeed-zero-pp") || text.contains("PipelineEngine"), "{text}");
    assert!(text.contains("zero = 1"), "{text}");
    match e {
        ScenarioError::Invalid { config: Some(c), .. } => assert!(c.has("deepspeed-zero-pp")),
        other => panic!("expected an invalid split, got {other:?}"),
    }
}

#[test]
fn defaults_are_megatron_on_gpus_and_strata_on_cpus() {
    let s = scenario("megatron", "tp = 8\npp = 8").unwrap();
    assert_eq!(s.training.framework, Framework::Megatron);
    let text = "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = 128\n[parallel]\ntp = 8\npp = 8\nglobal_batch = 1536\n";
    assert_eq!(Scenario::from_toml(text, "t", "t", &[]).unwrap().training.framework, Framework::Megatron);
    let cpu = "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 8\n";
    assert_eq!(Scenario::from_toml(cpu, "t", "t", &[]).unwrap().training.framework, Framework::Strata);
    for f in Framework::ALL {
        assert_eq!(Framework::from_key(f.key()), Some(f));
    }
}

#[test]
fn an_unknown_framework_is_a_parse_error_naming_the_key() {
    let e = scenario("colossalai", "tp = 8\npp = 8").unwrap_err().to_string();
    assert!(e.contains("colossalai"), "{e}");
}

/// A Mixtral 8x7B split on 8 DGX H100 nodes under Strata's executor, checked against `fw`.
fn moe_rules(fw: Framework, model: &str, parallel: &str, training: &str) -> Vec<&'static str> {
    let text = format!(
        "[model]\npreset = \"{model}\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 8\n\
         [parallel]\nglobal_batch = 64\n{parallel}\n[training]\nframework = \"strata\"\n{training}\n"
    );
    let s = Scenario::from_toml(&text, "t.toml", "t", &[]).expect("a valid split");
    fw.violations(&s).into_iter().map(|v| v.rule).collect()
}

#[test]
fn moe_and_cp_rules_fire_on_their_splits() {
    let ring = "tp = 1\npp = 1\ncp = 8\nep = 8";
    let ulysses = "tp = 1\npp = 1\ncp = 8\nep = 8\ncp_comm = \"ulysses\"";
    assert_eq!(moe_rules(Framework::Megatron, "mixtral-8x7b", ring, ""), Vec::<&str>::new());
    assert_eq!(
        moe_rules(Framework::Megatron, "mixtral-8x7b", ring, "flash_attention = false"),
        vec!["megatron-cp-unfused"]
    );
    assert_eq!(moe_rules(Framework::DeepSpeed, "mixtral-8x7b", ring, ""), vec!["deepspeed-cp-ring"]);
    assert_eq!(moe_rules(Framework::DeepSpeed, "mixtral-8x7b", ulysses, ""), Vec::<&str>::new());
    // ep 8 over dp 1 (the experts split over the cp ranks): DeepSpeed-MoE cuts them from dp.
    let cut = moe_rules(Framework::DeepSpeed, "mixtral-8x7b", "tp = 4\nsequence_parallel = true\ncp = 4\nep = 8", "");
    assert!(cut.contains(&"deepspeed-ep-dp"), "{cut:?}");
    assert_eq!(moe_rules(Framework::Torchtitan, "mixtral-8x7b", ulysses, ""), vec!["torchtitan-cp-ulysses"]);
    // ep 64 over DDP (zero 0): only cp·tp = 1 to carve from; FSDP2 (zero 2) carves from dp.
    let ep64 = "tp = 1\npp = 1\nep = 8";
    assert_eq!(moe_rules(Framework::Torchtitan, "mixtral-8x7b", ep64, ""), vec!["torchtitan-ep-shard"]);
    assert_eq!(moe_rules(Framework::Torchtitan, "mixtral-8x7b", &format!("{ep64}\nzero = 2"), ""), Vec::<&str>::new());
    // DeepSeek-V3 (MLA, MTP): Megatron-LM runs it; DeepSpeed does not.
    let ds = "tp = 1\npp = 8\nep = 8";
    assert_eq!(moe_rules(Framework::Megatron, "deepseek-v3", ds, ""), Vec::<&str>::new());
    assert_eq!(moe_rules(Framework::DeepSpeed, "deepseek-v3", ds, ""), vec!["deepspeed-mla"]);
}

#[test]
fn the_cpu_executor_refuses_latent_attention_and_fp8() {
    let cpu = |model: &str, training: &str| {
        let text = format!(
            "[model]\npreset = \"{model}\"\n[cluster]\npreset = \"cpu-local\"\n[parallel]\ntp = 1\npp = 1\nep = 8\nglobal_batch = 8\n[training]\n{training}\n"
        );
        Scenario::from_toml(&text, "t.toml", "t", &[])
    };
    cpu("tiny-moe", "").expect("tiny-moe runs on CPU ranks with ep 8");
    let mut mla = String::from("[model]\npreset = \"tiny-moe\"\nheads = 4\nkv_heads = 4\n");
    mla.push_str(
        "mla = { q_lora_rank = 0, kv_lora_rank = 16, qk_nope_head_dim = 16, qk_rope_head_dim = 8, v_head_dim = 16 }\n",
    );
    mla.push_str("[cluster]\npreset = \"cpu-local\"\n[parallel]\ntp = 1\npp = 1\nep = 8\nglobal_batch = 8\n");
    let e = Scenario::from_toml(&mla, "t.toml", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("strata-cpu-mla") || e.contains("Strata's executor runs multi-head"), "{e}");
    let e = cpu("tiny-moe", "dtype = \"fp8\"").unwrap_err();
    match e {
        ScenarioError::Invalid { config: Some(c), .. } => assert!(c.has("fp8-needs-hardware"), "{c}"),
        other => panic!("expected fp8-needs-hardware, got {other:?}"),
    }
}

/// The split as loaded by `framework` (which checks that framework's rules), turned into
/// the rule ids it breaks.
fn loaded_rules(framework: &str, parallel: &str) -> Vec<&'static str> {
    let mut s = scenario("megatron", &parallel.replace("tp_comm_overlap = true", "")).expect("a valid split");
    s.parallel.tp_comm_overlap = parallel.contains("tp_comm_overlap = true").then_some(true);
    let fw = Framework::from_key(framework).expect("a framework");
    fw.violations(&s).into_iter().map(|v| v.rule).collect()
}

#[test]
fn tp_comm_overlap_rules_fire_where_the_framework_has_no_such_overlap() {
    let sp = "tp = 8\npp = 8\nsequence_parallel = true\ntp_comm_overlap = true";
    assert_eq!(loaded_rules("megatron", sp), Vec::<&str>::new());
    assert_eq!(loaded_rules("megatron", "tp = 8\npp = 8\ntp_comm_overlap = true"), vec!["megatron-tp-comm-overlap-sp"]);
    assert_eq!(loaded_rules("strata", sp), vec!["strata-tp-comm-overlap"]);
    assert_eq!(loaded_rules("torchtitan", sp), Vec::<&str>::new());
    assert_eq!(loaded_rules("torchtitan", "tp = 1\npp = 8\ntp_comm_overlap = true"), vec!["torchtitan-async-tp"]);
    let ds = loaded_rules("deepspeed", "tp = 8\npp = 8\ntp_comm_overlap = true");
    assert_eq!(ds, vec!["deepspeed-tp-comm-overlap"]);
    // Loading a scenario file with it under Strata's executor refuses it, saying what to do.
    let err = scenario("strata", "tp = 8\npp = 8\nsequence_parallel = true\ntp_comm_overlap = true").unwrap_err();
    assert!(err.to_string().contains("tp_comm_overlap = true with training.framework = \"strata\""), "{err}");
    // Unset on A100 (this file's cluster) it is off, so nothing is refused anywhere.
    let s = scenario("megatron", "tp = 8\npp = 8\nsequence_parallel = true").unwrap();
    assert!(!s.tp_comm_overlap());
}
