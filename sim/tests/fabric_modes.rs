//! Symmetric mode (one simulated rank per pipeline stage, its collectives counted with the
//! multiplicity of the identical groups beside it) against full mode (every rank) on the
//! fat-tree fabric: within 1% of step time on every scenario tried, up to 1,024 GPUs —
//! adaptive and static routing, oversubscribed tiers, data-parallel groups spanning units.

use strata_models::Scenario;
use strata_models::plan::lower;
use strata_sim::{Mode, SimOptions, simulate};

fn scenario(text: &str, overrides: &[&str]) -> Scenario {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    Scenario::from_toml(text, "test", "test", &o).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn symmetric_equals_full_within_one_percent() {
    let gpt3 = include_str!("../../scenarios/gpt3-175b-1024xa100.toml");
    let llama8 = "[model]\npreset = \"llama3-8b\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 32\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 256\nzero = 1\nsequence_parallel = true\n[training]\nflash_attention = true\n";
    let cases: Vec<(&str, Scenario)> = vec![
        ("gpt3 1024 adaptive", scenario(gpt3, &["parallel.global_batch=256"])),
        ("gpt3 1024 static", scenario(gpt3, &["parallel.global_batch=256", "cluster.routing=static"])),
        (
            "gpt3 1024 tp4 2:1 oversubscribed",
            scenario(
                gpt3,
                &["parallel.global_batch=256", "parallel.tp=4", "parallel.dp=32", "cluster.oversubscription=2.0"],
            ),
        ),
        ("llama3-8b 256 dp64 zero1", scenario(llama8, &[])),
        (
            "llama3-8b 256 dp64 zero3 static",
            scenario(llama8, &["parallel.zero=3", "cluster.routing=static", "training.framework=strata"]),
        ),
        ("llama3-8b 256 fat-tree", scenario(llama8, &["cluster.fabric=fat-tree", "cluster.switch_radix=16"])),
    ];
    for (name, s) in cases {
        let plan = lower(&s).unwrap();
        let sym = simulate(&plan, &SimOptions { mode: Mode::Symmetric, ..SimOptions::default() }).unwrap();
        let full = simulate(&plan, &SimOptions { mode: Mode::Full, ..SimOptions::default() }).unwrap();
        let err = sym.step_time_s / full.step_time_s - 1.0;
        println!("{name}: symmetric {:.4} s, full {:.4} s ({:+.3}%)", sym.step_time_s, full.step_time_s, 100.0 * err);
        assert!(
            err.abs() < 0.01,
            "{name}: symmetric {} vs full {} ({:+.2}%)",
            sym.step_time_s,
            full.step_time_s,
            100.0 * err
        );
    }
}

/// The fabric is deterministic: same scenario and seed ⇒ the same bytes out, with static
/// routing (whose ECMP hashes come from the seed) included.
#[test]
fn the_fabric_is_deterministic() {
    let gpt3 = include_str!("../../scenarios/gpt3-175b-1024xa100.toml");
    let s = scenario(gpt3, &["parallel.global_batch=256", "cluster.routing=static", "parallel.tp=4", "parallel.dp=32"]);
    let plan = lower(&s).unwrap();
    let run = |seed| {
        let r = simulate(&plan, &SimOptions { seed, trace: true, ..SimOptions::default() }).unwrap();
        (serde_json::to_string(&r).unwrap(), serde_json::to_string(r.trace.as_ref().unwrap()).unwrap())
    };
    let (a, b) = (run(7), run(7));
    assert_eq!(a, b);
    assert!(a.0.contains("\"network\":\"fabric\""), "{}", &a.0[..200]);
}

/// The default mode is exact: on a fabric where symmetric mode is not (static routing on a
/// fat-tree), it runs every rank and says why.
#[test]
fn auto_mode_runs_full_where_symmetric_is_not_exact() {
    let llama8 = "[model]\npreset = \"llama3-8b\"\n[cluster]\npreset = \"dgx-h100\"\nnodes = 32\nfabric = \"fat-tree\"\nrouting = \"static\"\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 256\nzero = 1\nsequence_parallel = true\n[training]\nflash_attention = true\n";
    let plan = lower(&scenario(llama8, &[])).unwrap();
    let auto = simulate(&plan, &SimOptions::default()).unwrap();
    let full = simulate(&plan, &SimOptions { mode: Mode::Full, ..SimOptions::default() }).unwrap();
    assert_eq!(auto.mode, Mode::Full);
    assert!(auto.mode_note.as_deref().is_some_and(|n| n.contains("static routing")), "{:?}", auto.mode_note);
    assert_eq!(auto.step_time_s, full.step_time_s);
    let adaptive = lower(&scenario(&llama8.replace("\"static\"", "\"adaptive\""), &[])).unwrap();
    let r = simulate(&adaptive, &SimOptions::default()).unwrap();
    assert_eq!((r.mode, r.mode_note), (Mode::Symmetric, None));
}
