//! `model.head_dim`: a head width apart from h / heads (Qwen3: 64 heads of 128 over
//! h = 4,096). Set to h / heads it changes nothing — the same plan, FLOPs, memory and
//! parameters as leaving it out; set apart from it, parameters, FLOPs, the plan's pieces and
//! its buffers follow the closed forms with q = heads · head_dim, kv = kv_heads · head_dim;
//! bad values are refused naming them.

mod common;
use common::program_order_peak;
use strata_models::accounting::flops::{
    attention_core_forward_flops_per_token, attention_linear_forward_flops_per_token, scenario_step_flops,
};
use strata_models::accounting::memory::{layer_activation_parts, stage_memory};
use strata_models::accounting::params::{attention_params, param_counts};
use strata_models::plan::cost::piece_cost;
use strata_models::plan::*;
use strata_models::scenario::Dtype;
use strata_models::{ModelSpec, Scenario};

/// A small Llama (h 32, 8 query heads, 2 kv heads) with an optional head width, on CPU ranks.
fn toy(head_dim: Option<u32>, split: &str) -> Scenario {
    let hd = head_dim.map(|d| format!("head_dim = {d}\n")).unwrap_or_default();
    let text = format!(
        "[model]\nfamily = \"llama\"\nlayers = 4\nhidden = 32\nheads = 8\nkv_heads = 4\n{hd}ffn_hidden = 64\nvocab = 32\nseq_len = 16\n\
         [cluster]\npreset = \"cpu-local\"\ngpus_per_node = 8\n\
         [parallel]\n{split}\n\
         [training]\nflash_attention = true\n"
    );
    Scenario::from_toml(&text, "head-dim", "head-dim", &[]).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

const SPLITS: &[&str] = &[
    "tp = 2\npp = 2\ndp = 2\nmicro_batch = 2\nglobal_batch = 8\nsequence_parallel = true",
    "tp = 2\ncp = 2\ncp_comm = \"ulysses\"\npp = 2\ndp = 1\nglobal_batch = 4\nzero = 1",
    "tp = 1\ncp = 2\ncp_comm = \"ring\"\npp = 2\ndp = 2\nglobal_batch = 4\nrecompute = \"full\"",
    "tp = 2\npp = 2\ndp = 2\nglobal_batch = 8\nschedule = \"zb-h1\"\nzero = 3",
];

/// FLOPs of every compute op of the plan, summed over all ranks.
fn plan_flops(plan: &Plan) -> f64 {
    let per_stage = plan.grid.stage_ranks() as f64;
    plan.programs
        .iter()
        .flat_map(|p| &p.ops)
        .filter_map(|op| match &op.kind {
            OpKind::Compute(c) => Some(plan.costs[c.cost as usize].flops as f64 * per_stage),
            _ => None,
        })
        .sum()
}

#[test]
fn head_dim_equal_to_h_over_heads_changes_nothing() {
    // h / heads = 32 / 8 = 4: the same programs, costs, FLOPs and memory, op for op.
    for split in SPLITS {
        let (a, b) = (toy(None, split), toy(Some(4), split));
        let (pa, pb) = (lower(&a).unwrap(), lower(&b).unwrap());
        assert_eq!(
            serde_json::to_string(&pa.programs).unwrap(),
            serde_json::to_string(&pb.programs).unwrap(),
            "{split}"
        );
        assert_eq!(serde_json::to_string(&pa.costs).unwrap(), serde_json::to_string(&pb.costs).unwrap(), "{split}");
        assert_eq!(scenario_step_flops(&a), scenario_step_flops(&b));
        assert_eq!(format!("{:?}", stage_memory(&a)), format!("{:?}", stage_memory(&b)));
    }
    for name in ["gpt3-175b", "llama3-405b", "mixtral-8x7b"] {
        let m = ModelSpec::preset(name).unwrap();
        let explicit = ModelSpec { head_dim: Some(m.hidden / m.heads), ..m.clone() };
        assert_eq!(param_counts(&m), param_counts(&explicit), "{name}");
        assert_eq!(attention_linear_forward_flops_per_token(&m), attention_linear_forward_flops_per_token(&explicit));
    }
}

#[test]
fn an_explicit_head_dim_follows_the_closed_forms() {
    // h 32, a 8, kv 4, d 8: q = a·d = 64 ≠ h, kv width 4·8 = 32.
    let (h, a, kv, d, s) = (32u64, 8u64, 4u64, 8u64, 16u64);
    let m = toy(Some(8), SPLITS[0]).model;
    assert_eq!((m.head_dim(), m.q_dim(), m.kv_dim()), (d, a * d, kv * d));
    // Q, K, V and O; no biases in the Llama family.
    let attn = h * (a * d + 2 * kv * d) + a * d * h;
    assert_eq!(attention_params(&m), (attn, 0));
    assert_eq!(attention_linear_forward_flops_per_token(&m), 2 * attn);
    assert_eq!(attention_core_forward_flops_per_token(&m), 2 * s * a * (d + d));
    // Against the default width (d = h/a = 4): parameters differ by the attention alone.
    let narrow = ModelSpec { head_dim: None, ..m.clone() };
    let attn4 = h * (h + 2 * kv * 4) + h * h;
    assert_eq!(param_counts(&m).total - param_counts(&narrow).total, m.layers as u64 * (attn - attn4));
    // Saved activations: Q, K, V and the attention output (q wide) per token, bf16.
    let parts = layer_activation_parts(&m, 1, Dtype::Bf16, true);
    let parts4 = layer_activation_parts(&narrow, 1, Dtype::Bf16, true);
    assert_eq!(parts.sharded - parts4.sharded, (s * 2 * ((a * d + 2 * kv * d + a * d) - (h + 2 * kv * 4 + h))) as f64);
}

#[test]
fn the_plans_pieces_read_the_head_width() {
    let s = toy(Some(8), SPLITS[0]);
    let (m, p) = (&s.model, &s.parallel);
    let (h, t, tokens) = (32u64, 2u64, 2 * 16u64);
    let (q_t, kv_t) = (64 / t, 32 / t);
    let f = piece_cost(m, p, Dtype::Bf16, true, Piece::Attn, Phase::Forward);
    let shapes: Vec<(u64, u64, u64)> = f.gemms.iter().filter(|g| g.batch == 1).map(|g| (g.m, g.n, g.k)).collect();
    assert_eq!(shapes, vec![(tokens, q_t + 2 * kv_t, h), (tokens, h, q_t)]);
    let core = f.attention.unwrap();
    assert_eq!((core.batch_heads, core.head_dim), (2 * 8 / t, 8));
    // Context-parallel pieces: the same widths.
    let c = toy(Some(8), SPLITS[1]);
    let qkv = piece_cost(&c.model, &c.parallel, Dtype::Bf16, true, Piece::AttnQkv, Phase::Forward);
    assert_eq!((qkv.gemms[0].n, qkv.gemms[0].k), (q_t + 2 * kv_t, h));
    let proj = piece_cost(&c.model, &c.parallel, Dtype::Bf16, true, Piece::AttnProj, Phase::Forward);
    assert_eq!((proj.gemms[0].n, proj.gemms[0].k), (h, q_t));
    // Every split: the plan's FLOPs over all ranks are the step's, and its Alloc/Free peak
    // is the analytic memory (Ulysses' head-layout buffers q wide).
    for split in SPLITS {
        let s = toy(Some(8), split);
        let plan = lower(&s).unwrap();
        verify(&plan).unwrap();
        assert_eq!(plan_flops(&plan), scenario_step_flops(&s).hardware, "{split}");
        let narrow = lower(&toy(None, split)).unwrap();
        assert!(plan_flops(&plan) > plan_flops(&narrow), "{split}");
        // The plan's Alloc/Free peak against the analytic memory: as close as with the
        // default width (ZeRO-3's gathers on this toy put both some way apart).
        let n = toy(None, split);
        let pairs = |plan: &Plan, s: &Scenario| -> Vec<f64> {
            plan.programs
                .iter()
                .zip(&stage_memory(s))
                .map(|(p, m)| program_order_peak(p) as f64 / m.total_bytes())
                .collect()
        };
        for (stage, (wide, def)) in pairs(&plan, &s).into_iter().zip(pairs(&narrow, &n)).enumerate() {
            assert!(
                (wide - 1.0).abs() <= (def - 1.0).abs() + 0.02,
                "{split} stage {stage}: plan/analytic {wide} (default width {def})"
            );
        }
    }
}

#[test]
fn qwen3_preset_counts_its_query_width() {
    // Qwen3-235B-A22B: q width 64·128 = 8,192 over h = 4,096. With h/heads = 64 channels
    // per head its attention would lose h·(8192 − 4096) + 2·h·4·(128 − 64) + (8192 − 4096)·h
    // parameters a layer, some 15% of the active count.
    let m = ModelSpec::preset("qwen3-235b-a22b").unwrap();
    let (h, l) = (4096u64, 94u64);
    assert_eq!((m.head_dim(), m.q_dim(), m.kv_dim()), (128, 8192, 512));
    let lost = h * (8192 - 4096) + 2 * h * 4 * (128 - 64) + (8192 - 4096) * h;
    let narrow = ModelSpec { head_dim: None, ..m.clone() };
    let (c, n) = (param_counts(&m), param_counts(&narrow));
    assert_eq!(c.active - n.active, l * lost);
    assert_eq!(c.total - n.total, l * lost);
    assert!((c.active - n.active) as f64 / c.active as f64 > 0.14);
}

#[test]
fn bad_head_widths_are_refused_naming_the_value() {
    let refused = |extra: &str| {
        let text = format!(
            "[model]\npreset = \"tiny-llama\"\n{extra}\n[cluster]\npreset = \"cpu-local\"\ngpus_per_node = 1\n[parallel]\nglobal_batch = 1\n"
        );
        Scenario::from_toml(&text, "bad", "bad", &[]).map(|_| ()).unwrap_err().to_string()
    };
    let e = refused("head_dim = 0");
    assert!(e.contains("model.head_dim = 0"), "{e}");
    let e = refused("head_dim = 5000");
    assert!(e.contains("model.head_dim = 5000") && e.contains("docs/limits.md"), "{e}");
    let e = refused("heads = 4096\nkv_heads = 4096\nhead_dim = 64");
    assert!(e.contains("model.heads · head_dim = 262144"), "{e}");
    // Latent attention sets its own widths.
    let text = "[model]\npreset = \"deepseek-v3\"\nhead_dim = 128\n[cluster]\npreset = \"dgx-h100\"\nnodes = 1\n[parallel]\nglobal_batch = 1\n";
    let e = Scenario::from_toml(text, "bad", "bad", &[]).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("model.head_dim = 128 with model.mla"), "{e}");
    // With head_dim set, h need not divide by heads (Qwen3 does, but it need not).
    let ok = "[model]\npreset = \"tiny-llama\"\nheads = 6\nkv_heads = 2\nhead_dim = 16\n[cluster]\npreset = \"cpu-local\"\ngpus_per_node = 1\n[parallel]\nglobal_batch = 1\n";
    let s = Scenario::from_toml(ok, "ok", "ok", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.model.q_dim(), 96);
}
