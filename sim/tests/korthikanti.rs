//! The A100 profile against its calibration set: Korthikanti et al. 2022 ("Reducing
//! Activation Recomputation in Large Transformer Models"), Tables 3–5 — four GPT models
//! trained with tensor parallelism 8, sequence parallelism and selective recomputation on
//! DGX A100 (Selene), and Table 4's per-layer forward / backward times of the 22B model.
//! The published figures are in `tests/data/korthikanti_2022_*.csv`, with their source.

mod common;

use strata_models::plan::{OpKind, Phase, Piece, Plan, lower};
use strata_sim::{SimOptions, simulate};

const TABLES: &str = include_str!("data/korthikanti_2022_tables.csv");
const LAYER_MS: &str = include_str!("data/korthikanti_2022_layer_ms.csv");

/// One row of Tables 3/5 as a scenario: dgx-a100 nodes, tp 8, one pipeline stage per node;
/// unfused attention, as in the paper's runs (Megatron-LM of 2022), whatever the GPU default.
fn row_scenario(model: &str, pp: u32, global_batch: u32, micro_batch: u32, recompute: &str, sp: bool) -> String {
    // Korthikanti's "interleaved m=3" for 175B and 530B; 1F1B otherwise.
    let schedule =
        if model == "175B" || model == "530B" { "schedule = \"interleaved\"\nvpp = 3" } else { "schedule = \"1f1b\"" };
    let preset = match model {
        "22B" => "gpt-22b",
        "175B (GPT-3)" | "175B" => "gpt3-175b",
        "530B (MT-NLG)" | "530B" => "gpt-530b",
        "1T" => "gpt-1t",
        other => panic!("unknown model {other}"),
    };
    format!(
        "name = \"korthikanti-{model}\"\n[model]\npreset = \"{preset}\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = {pp}\n\
         [parallel]\ntp = 8\npp = {pp}\ndp = 1\n{schedule}\nmicro_batch = {micro_batch}\nglobal_batch = {global_batch}\n\
         recompute = \"{recompute}\"\nsequence_parallel = {sp}\n\
         [training]\nflash_attention = false\n"
    )
}

fn short(model: &str) -> &str {
    model.split_whitespace().next().unwrap()
}

#[test]
fn four_iteration_times_within_5_percent() {
    let mut worst: f64 = 0.0;
    let mut lines = Vec::new();
    for line in TABLES.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let model = short(f[0]);
        let (pp, gb, mb): (u32, u32, u32) = (f[5].parse().unwrap(), f[7].parse().unwrap(), f[8].parse().unwrap());
        let published: f64 = f[10].parse().unwrap();
        let plan = lower(&common::scenario(&row_scenario(model, pp, gb, mb, "selective", true))).unwrap();
        let r = simulate(&plan, &SimOptions::default()).unwrap();
        let err = r.step_time_s / published - 1.0;
        worst = worst.max(err.abs());
        lines.push(format!(
            "{model:>5}: predicted {:8.3} s, published {published:6.2} s ({:+.1}%), MFU {:.1}% (published {}), {:?}",
            r.step_time_s,
            100.0 * err,
            100.0 * r.mfu,
            f[12],
            r.breakdown_s
        ));
    }
    println!("{}", lines.join("\n"));
    assert!(worst < 0.05, "worst iteration-time error {:.1}%:\n{}", 100.0 * worst, lines.join("\n"));
}

/// Forward and backward time of layer `layer` (first op start to last op end).
fn layer_ms(plan: &Plan, trace: &strata_models::trace::Trace, layer: u32) -> (f64, f64) {
    let program = &plan.programs[0];
    let (mut f0, mut f1, mut b0, mut b1) = (u64::MAX, 0, u64::MAX, 0);
    for s in trace.spans.iter().filter(|s| s.rank == 0) {
        let OpKind::Compute(c) = &program.ops[s.op as usize].kind else { continue };
        if c.layer != layer || !c.piece.in_layer() && c.piece != Piece::Attn {
            continue;
        }
        if c.phase == Phase::Forward {
            f0 = f0.min(s.start_ns);
            f1 = f1.max(s.end_ns);
        } else {
            b0 = b0.min(s.start_ns);
            b1 = b1.max(s.end_ns);
        }
    }
    ((f1 - f0) as f64 * 1e-6, (b1 - b0) as f64 * 1e-6)
}

#[test]
fn table4_layer_times_of_22b_within_10_percent() {
    let mut worst: f64 = 0.0;
    let mut lines = Vec::new();
    for line in LAYER_MS.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let setting = f[0];
        let (fwd, bwd): (f64, f64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        let sp = setting.contains("sequence parallel");
        let recompute = if setting.contains("full") {
            "full"
        } else if setting.contains("selective") {
            "selective"
        } else {
            "none"
        };
        let plan = lower(&common::scenario(&row_scenario("22B", 1, 4, 4, recompute, sp))).unwrap();
        let r = simulate(&plan, &SimOptions { trace: true, ..SimOptions::default() }).unwrap();
        let (pf, pb) = layer_ms(&plan, r.trace.as_ref().unwrap(), 24);
        let (ef, eb) = (pf / fwd - 1.0, pb / bwd - 1.0);
        worst = worst.max(ef.abs()).max(eb.abs());
        lines.push(format!(
            "{setting:>32}: forward {pf:5.2} ms vs {fwd} ({:+.1}%), backward {pb:5.2} ms vs {bwd} ({:+.1}%)",
            100.0 * ef,
            100.0 * eb
        ));
    }
    println!("{}", lines.join("\n"));
    assert!(worst < 0.10, "worst layer-time error {:.1}%:\n{}", 100.0 * worst, lines.join("\n"));
}
