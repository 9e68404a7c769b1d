//! Step what-ifs against closed forms: a straggler in a pure data-parallel and a pure
//! pipeline job (idealised compute, free communication), a degraded link on the only path
//! of a transfer, and a downed spine under adaptive and static routing.

mod common;

use common::{FreeNetwork, LayerTimer};
use strata_models::faults::SlowRank;
use strata_models::{ClusterSpec, Fabric, GpuKind, Routing};
use strata_sim::net::collbench::{BenchOp, sweep};
use strata_sim::net::faults::LinkFaults;
use strata_sim::net::nccl::{Algo, NcclEnv};
use strata_sim::net::{FabricNetwork, Network};
use strata_sim::simulate::simulate_timed;
use strata_sim::{HardwareProfile, Mode, SimOptions, SimReport};

const UNIT_NS: u64 = 1_000_000;
const LAYERS: u32 = 8;

fn scenario(tp: u32, pp: u32, dp: u32, schedule: &str, m: u32) -> String {
    format!(
        "[model]\nfamily = \"gpt\"\nlayers = {LAYERS}\nhidden = 64\nheads = 4\nvocab = 256\nseq_len = 64\n\
         [cluster]\npreset = \"dgx-a100\"\nnodes = 1\ngpus_per_node = {}\n\
         [parallel]\ntp = {tp}\npp = {pp}\ndp = {dp}\nschedule = \"{schedule}\"\nmicro_batch = 1\nglobal_batch = {}\n",
        tp * pp * dp,
        m * dp
    )
}

/// One step with free communication and layer pieces of F = B = W = 1 ms, rank `slow` at `f`.
fn run(text: &str, slow: Option<(u32, f64)>) -> SimReport {
    let mut s = common::scenario(text);
    s.faults.slow = slow.map(|(rank, factor)| SlowRank { rank, factor }).into_iter().collect();
    s.validate().unwrap();
    let plan = strata_models::plan::lower(&s).unwrap();
    let t = LayerTimer { f: UNIT_NS, b: UNIT_NS, w: UNIT_NS };
    let profile = HardwareProfile::builtin(GpuKind::A100_80gb);
    simulate_timed(&plan, &SimOptions::default(), &mut FreeNetwork::default(), &t, &profile).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs()
}

/// Pure data parallelism, compute-bound, communication free: every rank waits for the
/// slowest at the gradient all-reduce, so T(f) = f · T(1); the other ranks' extra time is
/// all waiting on peers (the breakdown's bubble), (f − 1) · T(1).
#[test]
fn a_straggler_slows_data_parallel_by_its_factor() {
    let text = scenario(1, 1, 8, "1f1b", 4);
    let base = run(&text, None);
    assert_eq!(base.mode, Mode::Symmetric);
    let t1 = base.step_time_s;
    assert!(close(t1, 4.0 * LAYERS as f64 * 3e-3), "T(1) = m·L·(F+B+W): {t1}");
    for f in [1.1, 1.3, 2.0, 0.5] {
        let r = run(&text, Some((5, f)));
        assert_eq!(r.mode, Mode::Full);
        assert!(r.mode_note.as_deref().is_some_and(|n| n.contains("rank 5 compute")), "{:?}", r.mode_note);
        let want = t1 * f.max(1.0);
        assert!(close(r.step_time_s, want), "f = {f}: {} s, closed form {want} s", r.step_time_s);
        if f > 1.0 {
            assert_ne!(r.last_rank, 5, "all ranks end at the all-reduce; the lowest is reported");
            assert!(close(r.breakdown_s.bubble, (f - 1.0) * t1), "f = {f}: waiting {}", r.breakdown_s.bubble);
        }
    }
}

/// Pure pipeline, GPipe, p stages, m microbatches, a stage's passes F (forward) and B
/// (backward): with one stage f times slower (f ≥ 1) it is the bottleneck. Its forwards
/// run back to back after the p − 1 other stages' share of the fill, and so do its
/// backwards: T = (p − 1 + m·f)·(F + B) (f = 1 gives the flush form (m + p − 1)(F + B)).
/// 1F1B interleaves forwards and backwards, so the fast stages' slack absorbs part of it:
/// the slow stage's own work m·f·(F + B) ≤ T ≤ the GPipe form.
#[test]
fn a_straggler_stage_is_the_pipelines_bottleneck() {
    let (p, m) = (4u32, 8u32);
    let per_stage = (LAYERS / p) as f64 * 3e-3; // F + B (B = input + weight gradients), s
    for schedule in ["gpipe", "1f1b"] {
        let text = scenario(1, p, 1, schedule, m);
        let base = run(&text, None).step_time_s;
        assert!(close(base, (m + p - 1) as f64 * per_stage), "{schedule}: {base}");
        for f in [1.1, 1.3, 2.0] {
            let got = run(&text, Some((2, f))).step_time_s;
            let gpipe = ((p - 1) as f64 + m as f64 * f) * per_stage;
            println!("{schedule} f = {f}: {got:.6} s (GPipe closed form {gpipe:.6} s, fault-free {base:.6} s)");
            if schedule == "gpipe" {
                assert!(close(got, gpipe), "{schedule} f = {f}: {got} s, closed form {gpipe} s");
            } else {
                let own = m as f64 * f * per_stage;
                assert!(got >= own * (1.0 - 1e-9) && got <= gpipe * (1.0 + 1e-9), "{schedule} f = {f}: {got} s");
            }
        }
    }
}

/// Same scenario, same what-ifs, same seed: the same report, to the byte.
#[test]
fn what_ifs_are_deterministic() {
    let text = scenario(2, 2, 2, "1f1b", 4);
    let a = serde_json::to_string(&run(&text, Some((3, 1.3)))).unwrap();
    let b = serde_json::to_string(&run(&text, Some((3, 1.3)))).unwrap();
    assert_eq!(a, b);
}

fn cluster(nodes: u32, gpus: u32, nics: u32, fabric: Fabric, routing: Routing) -> ClusterSpec {
    let mut c = ClusterSpec::preset("dgx-h100").unwrap();
    (c.nodes, c.gpus_per_node, c.nics_per_node, c.fabric, c.routing) = (nodes, gpus, nics, fabric, routing);
    c
}

fn busbw(c: &ClusterSpec, f: &LinkFaults, op: BenchOp, ranks: &[u32], bytes: u64, seed: u64) -> f64 {
    let mut net = FabricNetwork::with_faults(c, seed, NcclEnv::only_algo(Algo::Ring), f).unwrap();
    let bw = sweep(&mut net, 0, op, ranks, bytes, bytes)[0].busbw_gbps;
    assert!(net.broken().is_none(), "{:?}", net.broken());
    bw
}

/// Two nodes of one GPU and one NIC on one leaf: a send/receive's only path is NIC → leaf →
/// NIC, bound by the NIC (B = 48 GB/s effective NDR). Degrading node 0's NIC cable to 0.5
/// halves the transfer's bandwidth (large messages, where latency is negligible).
#[test]
fn a_degraded_link_on_the_only_path_halves_the_flow() {
    let c = cluster(2, 1, 1, Fabric::LeafSpine, Routing::Adaptive);
    let s = 16u64 << 30;
    let clean = busbw(&c, &LinkFaults::default(), BenchOp::Sendrecv, &[0, 1], s, 0);
    let half = LinkFaults { degrade: vec![("node0/nic0-leaf0".into(), 0.5)], down: vec![] };
    let got = busbw(&c, &half, BenchOp::Sendrecv, &[0, 1], s, 0);
    assert!((got / clean - 0.5).abs() < 1e-4, "clean {clean} GB/s, degraded {got} GB/s");
}

/// Ring all-reduce over 16 one-GPU nodes on a radix-8 leaf-spine (4 leaves of 4 nodes, 2
/// spines, 2 links from each leaf to each spine), every ring edge off its leaf (F = 4 per
/// leaf): busbw = min(B_nccl, B, U·B/F) with U a leaf's surviving uplinks (U = 4 → NIC
/// bound; spine 1 down → U = 2, busbw = B/2 under adaptive routing). Static routing over
/// the surviving links puts the 4·channels flows on 2 uplinks by the hash: never faster.
#[test]
fn a_downed_spine_reroutes_adaptive_by_the_closed_form_and_static_collides() {
    let n = 16u32;
    let ring: Vec<u32> = (0..n).map(|i| (i % 4) * 4 + i / 4).collect();
    let s = 8u64 << 30;
    let spine = LinkFaults { degrade: vec![], down: vec!["spine1".into()] };
    let mut c = cluster(n, 1, 1, Fabric::LeafSpine, Routing::Adaptive);
    c.switch_radix = 8;
    let clean = busbw(&c, &LinkFaults::default(), BenchOp::AllReduce, &ring, s, 0);
    let down = busbw(&c, &spine, BenchOp::AllReduce, &ring, s, 0);
    let b = 48.0;
    assert!(clean > 0.9 * b, "NIC-bound without faults: {clean}");
    assert!((down - b / 2.0).abs() / (b / 2.0) < 2e-3, "spine down: {down} GB/s, closed form {} GB/s", b / 2.0);
    c.routing = Routing::Static;
    for seed in 0..4 {
        let st = busbw(&c, &spine, BenchOp::AllReduce, &ring, s, seed);
        println!("seed {seed}: adaptive {down:.2} GB/s, static {st:.2} GB/s (clean adaptive {clean:.2})");
        assert!(st <= down * (1.0 + 1e-9), "seed {seed}: static {st} > adaptive {down}");
    }
}
