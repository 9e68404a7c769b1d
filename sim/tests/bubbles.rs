//! Pipeline bubbles against their closed forms: with every stage doing the same work and
//! communication free, the simulated idle time of the last rank over its busy time is
//! (p−1)/m for GPipe and 1F1B, (p−1)/(v·m) for interleaved 1F1B and (p−1)/(3m) for ZB-H1
//! with T_F = T_B = T_W (formulas.md; Narayanan et al. SC'21, Qi et al. 2023). ZB-H2 keeps
//! every stage busy from its first pass to its last, so under the step's flush only the last
//! stage's late start is left: (p−1)·max(T_F, T_F + T_B − 2T_W) per stage's layers.

mod common;

use common::{FreeNetwork, LayerTimer};
use strata_models::GpuKind;
use strata_sim::simulate::simulate_timed;
use strata_sim::{HardwareProfile, SimOptions};

const LAYERS: u32 = 48;
const UNIT_NS: u64 = 1_000_000;

fn scenario(schedule: &str, p: u32, v: u32, m: u32) -> String {
    format!(
        "[model]\nfamily = \"gpt\"\nlayers = {LAYERS}\nhidden = 64\nheads = 4\nvocab = 256\nseq_len = 64\n\
         [cluster]\npreset = \"dgx-a100\"\ngpus_per_node = {p}\n\
         [parallel]\ntp = 1\npp = {p}\ndp = 1\nvpp = {v}\nschedule = \"{schedule}\"\nmicro_batch = 1\nglobal_batch = {m}\n"
    )
}

/// (step, idle of the last rank as the breakdown reports it, ideal busy time), in ns.
fn run(schedule: &str, p: u32, v: u32, m: u32, t: &LayerTimer) -> (u64, u64, u64) {
    let plan = common::plan(&scenario(schedule, p, v, m));
    let profile = HardwareProfile::builtin(GpuKind::A100_80gb);
    let r = simulate_timed(&plan, &SimOptions::default(), &mut FreeNetwork::default(), t, &profile).unwrap();
    let step = (r.step_time_s * 1e9).round() as u64;
    let b = &r.breakdown_s;
    assert_eq!(b.tp_exposed + b.dp_exposed + b.pp_exposed, 0.0, "{schedule} p={p} v={v} m={m}: comm is free");
    let idle = (b.bubble * 1e9).round() as u64;
    let ideal = m as u64 * (LAYERS / p) as u64 * (t.f + t.b + t.w);
    (step, idle, ideal)
}

#[test]
fn gpipe_and_1f1b_bubble_is_p_minus_1_over_m() {
    let t = LayerTimer { f: UNIT_NS, b: UNIT_NS, w: UNIT_NS };
    let mut table = Vec::new();
    for (p, m) in [(2, 4), (4, 4), (4, 8), (4, 12), (8, 8), (8, 16), (8, 32)] {
        for schedule in ["gpipe", "1f1b"] {
            let (step, idle, ideal) = run(schedule, p, 1, m, &t);
            table.push(format!(
                "{schedule:>6} p={p} m={m:>2}: {:.4} (formula {:.4})",
                (step - ideal) as f64 / ideal as f64,
                (p - 1) as f64 / m as f64
            ));
            // (step − ideal) / ideal = (p − 1) / m, exactly, in integers.
            assert_eq!((step - ideal) * m as u64, ideal * (p as u64 - 1), "{schedule} p={p} m={m}");
            assert_eq!(idle, step - ideal, "{schedule} p={p} m={m}: every idle ns is bubble");
        }
    }
    println!("{}", table.join("\n"));
}

#[test]
fn interleaved_bubble_is_p_minus_1_over_v_m() {
    let t = LayerTimer { f: UNIT_NS, b: UNIT_NS, w: UNIT_NS };
    let mut table = Vec::new();
    for (p, v, m) in [(2, 2, 4), (4, 2, 4), (4, 2, 8), (4, 3, 8), (4, 4, 12), (8, 2, 16), (2, 3, 2), (8, 3, 8)] {
        let (step, idle, ideal) = run("interleaved", p, v, m, &t);
        table.push(format!(
            "interleaved p={p} v={v} m={m:>2}: {:.4} (formula {:.4})",
            (step - ideal) as f64 / ideal as f64,
            (p - 1) as f64 / (v * m) as f64
        ));
        assert_eq!((step - ideal) * (v * m) as u64, ideal * (p as u64 - 1), "p={p} v={v} m={m}");
        assert_eq!(idle, step - ideal);
    }
    println!("{}", table.join("\n"));
}

#[test]
fn zb_h1_bubble_is_p_minus_1_over_3m_and_below_1f1b() {
    let t = LayerTimer { f: UNIT_NS, b: UNIT_NS, w: UNIT_NS };
    let mut table = Vec::new();
    for (p, m) in [(2, 4), (4, 4), (4, 8), (8, 16), (8, 32)] {
        let (zb, idle, ideal) = run("zb-h1", p, 1, m, &t);
        let (one, _, _) = run("1f1b", p, 1, m, &t);
        table.push(format!(
            "zb-h1 p={p} m={m:>2}: {:.4} (formula {:.4}; 1f1b {:.4})",
            (zb - ideal) as f64 / ideal as f64,
            (p - 1) as f64 / (3 * m) as f64,
            (one - ideal) as f64 / ideal as f64
        ));
        assert_eq!((zb - ideal) * 3 * m as u64, ideal * (p as u64 - 1), "p={p} m={m}");
        assert_eq!(idle, zb - ideal);
        assert!(zb < one, "p={p} m={m}: zb-h1 {zb} ns is not below 1f1b {one} ns");
    }
    println!("{}", table.join("\n"));
}

#[test]
fn zb_h2_bubble_is_the_last_stages_late_start_and_at_most_zb_h1() {
    let mut table = Vec::new();
    // (T_F, T_B, T_W) in units: equal, and input gradients twice the weight gradients.
    for (f, b, w) in [(1, 1, 1), (1, 2, 1)] {
        let t = LayerTimer { f: f * UNIT_NS, b: b * UNIT_NS, w: w * UNIT_NS };
        for (p, m) in [(2, 4), (4, 8), (4, 12), (8, 16), (8, 32)] {
            let (zb2, idle, ideal) = run("zb-h2", p, 1, m, &t);
            let (zb1, _, _) = run("zb-h1", p, 1, m, &t);
            let stage_layers = (LAYERS / p) as u64;
            let formula = (p as u64 - 1) * stage_layers * t.f.max(t.f + t.b - 2 * t.w);
            table.push(format!(
                "zb-h2 t=({f},{b},{w}) p={p} m={m:>2}: {:.4} (formula {:.4}; zb-h1 {:.4})",
                (zb2 - ideal) as f64 / ideal as f64,
                formula as f64 / ideal as f64,
                (zb1 - ideal) as f64 / ideal as f64
            ));
            assert_eq!(zb2 - ideal, formula, "t=({f},{b},{w}) p={p} m={m}");
            assert_eq!(idle, zb2 - ideal);
            assert!(zb2 <= zb1, "t=({f},{b},{w}) p={p} m={m}: zb-h2 {zb2} ns above zb-h1 {zb1} ns");
            if b > w {
                assert!(zb2 < zb1, "t=({f},{b},{w}) p={p} m={m}: zb-h2 {zb2} ns not below zb-h1 {zb1} ns");
            }
        }
    }
    println!("{}", table.join("\n"));
}
