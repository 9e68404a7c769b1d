//! Ranks that are threads of one process on shared cores (the CPU executor): processor
//! sharing against its closed form, one thread per rank (no compute/communication overlap
//! within a rank), symmetric against full mode, determinism.

mod common;

use strata_models::GpuKind;
use strata_models::plan::{ComputeCost, ComputeOp, OpKind, Plan, Stream};
use strata_sim::net::{CalibratedNetwork, Network};
use strata_sim::profile::{CommFit, CommFitKind, ExecutionParams, NetworkParams};
use strata_sim::program::ComputeTimer;
use strata_sim::simulate::simulate_timed;
use strata_sim::{HardwareProfile, Mode, SimOptions, SimReport};

/// tiny-gpt on `tp·pp·dp` CPU ranks.
fn cpu_plan(tp: u32, pp: u32, dp: u32, schedule: &str) -> Plan {
    common::plan(&format!(
        "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\ngpus_per_node = {}\n\
         [parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nschedule = \"{schedule}\"\nmicro_batch = 2\nglobal_batch = {}\n",
        tp * pp * dp,
        8 * dp
    ))
}

/// Every compute op takes the same time.
struct Unit(u64);

impl ComputeTimer for Unit {
    fn duration_ns(&self, _op: &ComputeOp, _cost: &ComputeCost) -> u64 {
        self.0
    }
}

fn profile(shared_cores: f64, one_thread_per_rank: bool) -> HardwareProfile {
    let mut p = HardwareProfile::builtin(GpuKind::Cpu);
    p.execution = ExecutionParams { one_thread_per_rank, shared_cores, ..Default::default() };
    p
}

/// A measured-looking communicator: 20 µs to notice, and post / finish work growing with size.
fn threads_network() -> NetworkParams {
    let links = CommFitKind::ALL
        .iter()
        .filter(|k| k.fallback().is_none())
        .flat_map(|&kind| {
            [2, 8].map(|ranks| CommFit {
                kind,
                ranks,
                latency_us: 20.0,
                bytes: vec![1_000, 1_000_000],
                post_us: vec![3.0 * ranks as f64, 300.0 * ranks as f64],
                finish_us: vec![5.0, 500.0],
            })
        })
        .collect();
    NetworkParams { source: "test".into(), links }
}

fn run(plan: &Plan, p: &HardwareProfile, mode: Mode, net: &mut dyn Network) -> SimReport {
    let opts = SimOptions { mode, trace: true, profile: Some(p.clone()), ..SimOptions::default() };
    simulate_timed(plan, &opts, net, &Unit(10_000), p).unwrap()
}

#[test]
fn shared_cores_stretch_compute_by_busy_ranks_over_cores() {
    // Four identical data-parallel ranks, free communication: all four compute at every
    // instant, so each runs at c/4 of its speed when c < 4 cores are shared.
    let plan = cpu_plan(1, 1, 4, "1f1b");
    let step = |cores: f64| {
        let mut net = common::FreeNetwork::default();
        run(&plan, &profile(cores, false), Mode::Full, &mut net).step_time_s
    };
    let alone = step(0.0);
    for (cores, stretch) in [(1.0, 4.0), (2.0, 2.0), (3.0, 4.0 / 3.0), (4.0, 1.0), (16.0, 1.0)] {
        let t = step(cores);
        // Within the nanosecond each op's end is rounded up by.
        assert!((t / alone - stretch).abs() < 1e-4, "{cores} cores: {t} s vs {alone} s alone, want ×{stretch}");
    }
}

#[test]
fn a_rank_on_one_thread_never_finishes_communication_while_it_computes() {
    let plan = cpu_plan(2, 2, 2, "1f1b");
    let p = profile(2.0, true);
    let mut net = CalibratedNetwork::new(&threads_network()).unwrap();
    let r = run(&plan, &p, Mode::Full, &mut net);
    let trace = r.trace.as_ref().unwrap();
    let mut checked = 0;
    for rank in 0..8 {
        let ops = &plan.program(rank).ops;
        let spans: Vec<_> = trace.spans.iter().filter(|s| s.rank == rank).collect();
        let compute: Vec<(u64, u64)> = spans
            .iter()
            .filter(|s| s.stream == Stream::Compute && s.end_ns > s.start_ns)
            .map(|s| (s.start_ns, s.end_ns))
            .collect();
        for s in &spans {
            let comm = matches!(ops[s.op as usize].kind, OpKind::Collective(_) | OpKind::Recv(_));
            if !comm {
                continue;
            }
            // Its work was done by the rank's thread: it ends outside every compute op, and
            // lasts at least the latency and its finish work.
            assert!(
                compute.iter().all(|&(a, b)| !(a < s.end_ns && s.end_ns < b)),
                "rank {rank} op {} ends at {} inside a compute op",
                s.op,
                s.end_ns
            );
            assert!(s.end_ns - s.start_ns >= 25_000, "rank {rank} op {} took {} ns", s.op, s.end_ns - s.start_ns);
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} communication ops checked");
    // Without one thread per rank the same transfers overlap compute: the step is shorter.
    let mut net = CalibratedNetwork::new(&threads_network()).unwrap();
    let overlapped = run(&plan, &profile(2.0, false), Mode::Full, &mut net);
    assert!(overlapped.step_time_s < r.step_time_s, "{} vs {}", overlapped.step_time_s, r.step_time_s);
}

#[test]
fn symmetric_and_full_agree_and_runs_repeat_exactly_on_cpu_ranks() {
    for (tp, pp, dp, schedule) in [(2, 2, 2, "1f1b"), (1, 4, 2, "gpipe"), (4, 2, 1, "zb-h1"), (1, 1, 8, "1f1b")] {
        let plan = cpu_plan(tp, pp, dp, schedule);
        let p = profile(1.9, true);
        let go = |mode| {
            let mut net = CalibratedNetwork::new(&threads_network()).unwrap();
            run(&plan, &p, mode, &mut net)
        };
        let (sym, full) = (go(Mode::Symmetric), go(Mode::Full));
        let what = format!("tp{tp} pp{pp} dp{dp} {schedule}");
        assert_eq!(sym.step_time_s, full.step_time_s, "{what}");
        assert_eq!(sym.breakdown_s, full.breakdown_s, "{what}");
        assert!((full.breakdown_s.total() - full.step_time_s).abs() < 1e-9, "{what}: {:?}", full.breakdown_s);
        let again = go(Mode::Full);
        assert_eq!(
            serde_json::to_vec(full.trace.as_ref().unwrap()).unwrap(),
            serde_json::to_vec(again.trace.as_ref().unwrap()).unwrap(),
            "{what}"
        );
    }
}
