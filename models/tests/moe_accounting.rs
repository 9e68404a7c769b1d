//! Mixture-of-experts, latent-attention and multi-token-prediction accounting against the
//! published parameter counts (models/tests/data/moe_published_params.csv), and the
//! per-rank split of experts over expert parallelism.

use strata_models::ModelSpec;
use strata_models::accounting::params::{
    attention_params, layer_expert_params, param_counts, stage_params, total_params,
};
use strata_models::parallel::ParallelConfig;

fn preset(name: &str) -> ModelSpec {
    ModelSpec::preset(name).unwrap()
}

fn published() -> Vec<(String, f64, f64)> {
    include_str!("data/moe_published_params.csv")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

#[test]
fn totals_and_active_counts_match_the_published_figures() {
    let rows = published();
    assert_eq!(rows.len(), 4);
    for (name, total_b, active_b) in rows {
        let c = param_counts(&preset(&name));
        // Published to one decimal in billions: ours must round to the same figure.
        assert_eq!(format!("{:.1}", c.total as f64 / 1e9), format!("{total_b:.1}"), "{name} total");
        assert_eq!(format!("{:.1}", c.active as f64 / 1e9), format!("{active_b:.1}"), "{name} active");
    }
}

#[test]
fn deepseek_v3_mla_and_mtp_follow_their_shapes() {
    let m = preset("deepseek-v3");
    let (sharded, replicated) = attention_params(&m);
    // q down 7168·1536 + norm 1536, q up 1536·128·192, kv down 7168·576 + norm 512,
    // kv up 512·128·256, output 128·128·7168.
    assert_eq!(replicated, 7168 * 1536 + 1536 + 7168 * 576 + 512);
    assert_eq!(sharded, 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168);
    assert_eq!(format!("{:.1}", (sharded + replicated) as f64 / 1e6), "187.1");
    // 3 dense layers, 58 with 256 routed experts of 3·7168·2048.
    assert_eq!(layer_expert_params(&m, 2), 0);
    assert_eq!(layer_expert_params(&m, 3), 256 * 3 * 7168 * 2048);
    let c = param_counts(&m);
    // The MTP module: DeepSeek quotes 11.5B unique parameters; ours is its MoE layer (11.51B)
    // plus the 2h·h projection and three norms, 11.61B — within 1%.
    assert!((c.mtp as f64 / 11.5e9 - 1.0).abs() < 0.01, "mtp {}", c.mtp);
    // The checkpoint: main + MTP + the MTP module's own copies of embedding and head, which
    // Hugging Face quotes as 685B (ours 684.5B).
    let copies = 2 * 129_280u64 * 7168;
    let checkpoint = (c.total + c.mtp + copies) as f64;
    assert!((checkpoint / 685e9 - 1.0).abs() < 0.002, "{checkpoint}");
    assert_eq!(total_params(&m), c.total + c.mtp);
}

#[test]
fn a_dense_model_has_all_its_parameters_active() {
    for name in ["llama3-8b", "gpt3-175b"] {
        let c = param_counts(&preset(name));
        assert_eq!((c.active, c.mtp), (c.total, 0), "{name}");
    }
}

#[test]
fn experts_split_over_ep_and_stages_sum_to_the_total() {
    for name in ["mixtral-8x7b", "deepseek-v3", "tiny-moe", "tiny-moe-gpt"] {
        let m = preset(name);
        let e = m.moe.as_ref().unwrap().experts;
        for (tp, pp, ep) in [(1, 1, 1), (2, 2, 2), (1, 4, 8), (1, 16, 64)] {
            if !e.is_multiple_of(ep) || m.layers < pp || !m.kv_heads.is_multiple_of(tp) {
                continue;
            }
            let p = ParallelConfig { tp, pp, ep, dp: 64, ..Default::default() };
            let stages = stage_params(&m, &p);
            let sum: u64 = stages.iter().map(|s| s.stage_total).sum();
            assert_eq!(sum, total_params(&m), "{name} tp{tp} pp{pp} ep{ep}");
            // Experts per rank: E/ep of each MoE layer on the stage.
            let moe_layers: u64 =
                (0..m.layers).filter(|l| m.is_moe_layer(*l)).count() as u64 + if m.mtp_layers > 0 { 1 } else { 0 };
            let experts: u64 = stages.iter().map(|s| s.expert_params).sum();
            assert_eq!(experts * ep as u64, moe_layers * layer_expert_params(&m, m.layers - 1), "{name} ep{ep}");
        }
    }
}

#[test]
fn deepseek_v3_fits_its_published_layout_per_rank() {
    // PP16, EP64, no TP (arXiv 2412.19437 §3.2): the heaviest stage holds about 4 MoE layers
    // of 256/64 = 4 experts each plus the dense parts.
    let m = preset("deepseek-v3");
    let p = ParallelConfig { tp: 1, pp: 16, dp: 128, ep: 64, global_batch: 1920, ..Default::default() };
    let stages = stage_params(&m, &p);
    let max = stages.iter().map(|s| s.per_rank()).max().unwrap();
    // Under 671B / 16 stages (42B): experts are split 64 ways.
    assert!(max < 3_000_000_000, "{max}");
    assert!(stages.iter().all(|s| s.expert_params > 0 || s.stage == 0));
}
