//! `cluster.nic_efficiency` through a whole step: a data-parallel job across nodes slows
//! as its NICs deliver less, only where the network carries its traffic, and at 1.0 it is
//! the cluster without the key. NCCL's choices stay those of the line rate.

use strata_models::Scenario;
use strata_models::plan::lower;
use strata_sim::{SimOptions, simulate};

fn step(text: &str, overrides: &[String]) -> (f64, f64) {
    let s = Scenario::from_toml(text, "test", "test", overrides).unwrap_or_else(|e| panic!("{e}"));
    let r = simulate(&lower(&s).unwrap(), &SimOptions::default()).unwrap();
    (r.step_time_s, r.breakdown_s.dp_exposed)
}

const ZERO3: &str = "[model]\npreset = \"gpt2-350m\"\nlayers = 8\nhidden = 2048\nheads = 16\nkv_heads = 16\n\
                     ffn_hidden = 8192\nseq_len = 1024\n[cluster]\npreset = \"aws-p4d\"\nnodes = 4\n[parallel]\n\
                     tp = 1\npp = 1\ndp = 32\nmicro_batch = 4\nglobal_batch = 128\nzero = 3\n[training]\n\
                     framework = \"deepspeed\"\n";

#[test]
fn a_data_parallel_step_across_nodes_slows_as_the_nics_deliver_less() {
    let at = |e: f64| step(ZERO3, &[format!("cluster.nic_efficiency={e}")]);
    let (full, full_dp) = at(1.0);
    let (p4d, p4d_dp) = step(ZERO3, &[]);
    let (half, half_dp) = at(0.5);
    let (quarter, quarter_dp) = at(0.25);
    println!(
        "step {full:.4} / {p4d:.4} / {half:.4} / {quarter:.4} s, DP exposed {full_dp:.4} / {p4d_dp:.4} / {half_dp:.4} / {quarter_dp:.4} s"
    );
    assert!(full < p4d && p4d < half && half < quarter, "{full} {p4d} {half} {quarter}");
    assert!(full_dp < p4d_dp && p4d_dp < half_dp && half_dp < quarter_dp);
    // The preset's own value is the 0.62 the fit gives, so naming it changes nothing.
    assert_eq!(step(ZERO3, &["cluster.nic_efficiency=0.62".into()]).0, p4d);
}

#[test]
fn one_node_and_full_efficiency_are_untouched() {
    // On one node nothing crosses a NIC: the share does not matter.
    let one = |e: f64| {
        step(
            ZERO3,
            &[
                "cluster.nodes=1".into(),
                "parallel.dp=8".into(),
                "parallel.global_batch=32".into(),
                format!("cluster.nic_efficiency={e}"),
            ],
        )
        .0
    };
    assert_eq!(one(1.0), one(0.3));
    // An InfiniBand preset reads 1.0 when the key is absent: the same step to the bit.
    let ib = ZERO3.replace("preset = \"aws-p4d\"", "preset = \"dgx-a100\"");
    assert_eq!(step(&ib, &[]).0, step(&ib, &["cluster.nic_efficiency=1.0".into()]).0);
}
