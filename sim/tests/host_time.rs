//! Host time beside device time (`Plan::host_ns`: DeepSpeed ZeRO-3's module hooks and
//! fetch loops). The host runs ahead of the device, so an op costs whichever is longer:
//! host time that fits inside the device time changes nothing; host time beyond it sets
//! the pace, op by op, and the breakdown charges it to `host_bound`, not to compute.

use strata_models::Scenario;
use strata_models::plan::{OpKind, Plan, lower};
use strata_sim::simulate::{SimOptions, simulate};

fn plan(dp: u32) -> Plan {
    let text = format!(
        "[model]\npreset = \"llama3-8b\"\nlayers = 4\nseq_len = 2048\n[cluster]\npreset = \"dgx-h100\"\nnodes = {}\n\
         [parallel]\ntp = 1\npp = 1\ndp = {dp}\nmicro_batch = 1\nglobal_batch = {dp}\nzero = 3\n\
         [training]\nframework = \"deepspeed\"\n",
        dp.div_ceil(8)
    );
    lower(&Scenario::from_toml(&text, "host", "host", &[]).unwrap()).unwrap()
}

fn step(p: &Plan) -> f64 {
    report(p).step_time_s
}

fn report(p: &Plan) -> strata_sim::SimReport {
    simulate(p, &SimOptions::default()).unwrap()
}

/// The plan with every host time set by `f` (cost ids that carry none stay at none).
fn with_host(p: &Plan, f: impl Fn(u64) -> u64) -> Plan {
    let mut q = p.clone();
    for h in q.host_ns.iter_mut().filter(|h| **h > 0) {
        *h = f(*h);
    }
    q
}

/// Host-charged compute ops of one step.
fn host_ops(p: &Plan) -> u64 {
    p.programs[0].ops.iter().filter(|o| matches!(&o.kind, OpKind::Compute(c) if p.host_ns(c.cost) > 0)).count() as u64
}

#[test]
fn host_time_within_the_device_time_costs_nothing() {
    let p = plan(16);
    assert!(!p.host_ns.is_empty());
    let none = with_host(&p, |_| 0);
    // Llama 3 8B's layer pieces take milliseconds on an H100; a microsecond of host time
    // per op hides under them.
    let hidden = report(&with_host(&p, |_| 1_000));
    assert_eq!(hidden.step_time_s, step(&none));
    assert_eq!(hidden.breakdown_s.host_bound, 0.0, "nothing is host-bound");
}

#[test]
fn host_time_beyond_the_device_time_sets_the_pace() {
    let p = plan(16);
    let none = step(&with_host(&p, |_| 0));
    // 100 ms of host time per hooked piece: the step is at least that for every one of them.
    let slow = with_host(&p, |_| 100_000_000);
    let floor = host_ops(&p) as f64 * 0.1;
    let t = step(&slow);
    assert!(t >= floor && t > none, "{t} s against a floor of {floor} s (no host time: {none} s)");
    // And not the sum of both: the hooked ops' device time (about a quarter of this small
    // step; the 128k-vocabulary head, the optimizer and the gathers are the rest) hides
    // under the host's. Added instead, the excess over the floor would be ≈ 0.98 of `none`.
    let excess = (t - floor) / none;
    // The breakdown names it: what the host added is host-bound time, not compute.
    let b = report(&slow).breakdown_s;
    assert!(b.host_bound >= t - none && b.host_bound <= floor, "host-bound {} s in a {t} s step", b.host_bound);
    assert!((b.total() - t).abs() < 1e-6, "the causes sum to the step: {b:?}");
    assert!(
        excess < 0.85,
        "{t} s: host and device time added, not overlapped ({excess:.2} of {none} s over the floor)"
    );
}
