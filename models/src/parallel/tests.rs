//! Tests of the split rules: each fires with its values, and all are reported together.

use super::*;

fn gpt3() -> (ModelSpec, ClusterSpec) {
    let m = ModelSpec::preset("gpt3-175b").unwrap();
    let mut c = ClusterSpec::preset("dgx-a100").unwrap();
    c.nodes = 128;
    (m, c)
}

fn good() -> ParallelConfig {
    ParallelConfig { tp: 8, pp: 8, dp: 16, vpp: 1, global_batch: 1536, ..Default::default() }
}

fn rejects(p: ParallelConfig, rule: &str, words: &[&str]) {
    let (m, c) = gpt3();
    let e = p.validate(&m, &c).expect_err("must be rejected");
    assert!(e.has(rule), "expected rule {rule}, got {e}");
    let text = e.to_string();
    for w in words {
        assert!(text.contains(w), "message lacks {w:?}: {text}");
    }
}

#[test]
fn the_megatron_split_is_valid() {
    let (m, c) = gpt3();
    good().validate(&m, &c).unwrap();
    assert_eq!(good().microbatches(), 96);
}

#[test]
fn every_rule_is_enforced_with_its_values() {
    rejects(ParallelConfig { tp: 0, ..good() }, "positive", &["parallel.tp = 0"]);
    rejects(ParallelConfig { dp: 8, ..good() }, "grid-equals-gpus", &["8 · 1 · 8 · 8 = 512", "1024 GPUs"]);
    let (mut m, c) = gpt3();
    m.heads = 100;
    let e = ParallelConfig { ..good() }.validate(&m, &c).unwrap_err();
    assert!(e.has("tp-divides-heads") && e.to_string().contains("model.heads = 100"));
    m.heads = 96;
    m.kv_heads = 12;
    let e = ParallelConfig { tp: 8, ..good() }.validate(&m, &c);
    assert!(e.is_err() && e.unwrap_err().has("tp-divides-kv-heads"));
    m.kv_heads = 96;
    m.ffn_hidden = 49150;
    assert!(good().validate(&m, &c).unwrap_err().has("tp-divides-ffn"));
    rejects(
        ParallelConfig { tp: 16, pp: 4, dp: 16, ..good() },
        "tp-within-node",
        &["parallel.tp = 16", "gpus_per_node = 8"],
    );
    rejects(ParallelConfig { tp: 1, pp: 128, dp: 8, ..good() }, "layers-split", &["model.layers = 96", "128 · 1"]);
    rejects(
        ParallelConfig { global_batch: 1000, ..good() },
        "batch-divisible",
        &["global_batch = 1000", "1 · 16 = 16"],
    );
    rejects(
        ParallelConfig { schedule: Schedule::Interleaved, vpp: 1, ..good() },
        "interleaved-needs-vpp",
        &["vpp = 1"],
    );
    rejects(
        ParallelConfig { schedule: Schedule::Interleaved, vpp: 2, global_batch: 16 * 12, ..good() },
        "interleaved-microbatches",
        &["= 12 is not a multiple of pp = 8"],
    );
    rejects(ParallelConfig { vpp: 2, ..good() }, "vpp-needs-interleaved", &["parallel.vpp = 2"]);
    rejects(ParallelConfig { zero: 4, ..good() }, "zero-stage", &["parallel.zero = 4"]);
    rejects(ParallelConfig { tp: 1, pp: 8, dp: 128, sequence_parallel: true, ..good() }, "sp-needs-tp", &["tp = 1"]);
    rejects(ParallelConfig { grad_bucket_mb: 0.0, ..good() }, "bucket-positive", &["grad_bucket_mb = 0"]);
    let (mut m, c) = gpt3();
    m.seq_len = 2044;
    let e = ParallelConfig { sequence_parallel: true, ..good() }.validate(&m, &c).unwrap_err();
    assert!(e.has("sp-divides-seq"));
    let e = ParallelConfig { schedule: Schedule::Interleaved, vpp: 2, pp: 1, dp: 128, ..good() }
        .validate(&m, &c)
        .unwrap_err();
    assert!(e.has("interleaved-needs-pp"));
}

#[test]
fn uneven_layers_go_short_at_both_ends() {
    let m = ModelSpec::preset("llama3-405b").unwrap();
    let p = ParallelConfig { tp: 8, pp: 16, dp: 128, vpp: 2, schedule: Schedule::Interleaved, ..Default::default() };
    let sizes: Vec<u32> = (0..32).map(|v| p.chunk_layers(&m, v).len() as u32).collect();
    assert_eq!(sizes.iter().sum::<u32>(), 126);
    assert_eq!((sizes[0], sizes[31]), (3, 3));
    assert!(sizes[1..31].iter().all(|s| *s == 4));
    assert_eq!(p.chunk_layers(&m, 31), 123..126);
    let even = ParallelConfig { pp: 8, vpp: 1, ..p };
    let g = ModelSpec::preset("gpt3-175b").unwrap();
    assert!((0..8).all(|v| even.chunk_layers(&g, v) == (v * 12..(v + 1) * 12)));
}

#[test]
fn all_violations_are_reported_together() {
    let (m, c) = gpt3();
    let e = ParallelConfig { dp: 5, zero: 7, ..good() }.validate(&m, &c).unwrap_err();
    assert!(e.has("grid-equals-gpus") && e.has("zero-stage") && e.has("batch-divisible"), "{e}");
}

fn moe_on(gpus: u32) -> (ModelSpec, ClusterSpec) {
    let m = ModelSpec::preset("mixtral-8x7b").unwrap();
    let mut c = ClusterSpec::preset("dgx-h100").unwrap();
    c.nodes = gpus / 8;
    (m, c)
}

fn moe_rules(p: ParallelConfig, model: &ModelSpec, gpus: u32) -> ConfigError {
    let (_, c) = moe_on(gpus);
    p.validate(model, &c).expect_err("must be rejected")
}

#[test]
fn expert_and_context_rules_name_their_values() {
    let (m, c) = moe_on(64);
    let ok = ParallelConfig { tp: 2, pp: 4, dp: 8, ep: 8, sequence_parallel: true, global_batch: 64, ..good() };
    ok.validate(&m, &c).unwrap();
    let e = moe_rules(ParallelConfig { ep: 16, ..ok.clone() }, &m, 64);
    assert!(e.has("ep-divides-experts") && e.to_string().contains("model.moe.experts = 8"), "{e}");
    let mut m3 = m.clone();
    m3.moe.as_mut().unwrap().experts = 12;
    let e = moe_rules(ParallelConfig { tp: 1, pp: 4, dp: 16, ep: 12, ..ok.clone() }, &m3, 64);
    assert!(e.has("ep-divides-stage") && e.to_string().contains("1 · 1 · 16 = 16"), "{e}");
    let e = moe_rules(ParallelConfig { sequence_parallel: false, ..ok.clone() }, &m, 64);
    assert!(e.has("moe-tp-needs-sp") && e.to_string().contains("parallel.tp = 2"), "{e}");
    let dense = ModelSpec::preset("llama3-8b").unwrap();
    let e = moe_rules(ParallelConfig { ..ok.clone() }, &dense, 64);
    assert!(e.has("ep-needs-moe"), "{e}");
    // Context parallelism: 2·cp chunks; Ulysses needs heads/tp and kv_heads/tp divisible by cp.
    let cp = ParallelConfig { tp: 2, pp: 1, dp: 4, cp: 8, ep: 8, sequence_parallel: true, global_batch: 64, ..good() };
    cp.validate(&m, &c).unwrap();
    let mut odd = m.clone();
    odd.seq_len = 4088;
    let e = moe_rules(cp.clone(), &odd, 64);
    assert!(e.has("cp-divides-seq") && e.to_string().contains("2 · 8 = 16"), "{e}");
    let e = moe_rules(ParallelConfig { cp_comm: CpComm::Ulysses, ..cp.clone() }, &m, 64);
    assert!(e.has("ulysses-divides-heads") && e.to_string().contains("8 / 2 = 4"), "{e}");
    ParallelConfig { cp_comm: CpComm::Ulysses, tp: 1, dp: 8, sequence_parallel: false, ..cp.clone() }
        .validate(&m, &c)
        .unwrap();
    let e = moe_rules(ParallelConfig { cp: 0, ..cp }, &m, 64);
    assert!(e.has("positive") && e.to_string().contains("parallel.cp = 0"), "{e}");
}
