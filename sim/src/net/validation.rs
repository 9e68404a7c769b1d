//! Validation of the network models: published nccl-tests bus bandwidths, closed-form
//! oracles of sharing and routing, determinism.
//!
//! Ground truth (shared/reference/comm_ground_truth.csv, copied here with its sources):
//! each predicted large-message busbw must be within 10% of the published figure.

use strata_models::plan::CollKind;
use strata_models::{ClusterSpec, Fabric, GpuKind, Routing};

use super::collbench::{BenchOp, sweep_cluster};
use super::fabric::FabricNetwork;
use super::nccl::{Algo, Func, NcclEnv, Proto, Tuner};
use super::nccl_graph;
use super::node::NodeNet;
use super::{CommKind, CommRequest, Network, NetworkKind};

/// One published figure.
struct Truth {
    what: &'static str,
    preset: &'static str,
    nodes: u32,
    ranks: u32,
    nvls: bool,
    busbw_gbps: f64,
    /// Divide the predicted busbw by this many NICs (per-NIC rows).
    per: f64,
    source: &'static str,
}

/// comm_ground_truth.csv rows used (busbw GB/s at large messages).
const TRUTH: &[Truth] = &[
    Truth {
        what: "DGX A100 8-GPU all-reduce",
        preset: "dgx-a100",
        nodes: 1,
        ranks: 8,
        nvls: true,
        busbw_gbps: 230.0,
        per: 1.0,
        source: "NVIDIA/nccl-tests#149 (sjeaugey): ~230 GB/s at 8G",
    },
    Truth {
        what: "A100 8x80GB all-reduce (user)",
        preset: "dgx-a100",
        nodes: 1,
        ranks: 8,
        nvls: true,
        busbw_gbps: 232.54,
        per: 1.0,
        source: "NVIDIA/nccl-tests#175 (user lcw2)",
    },
    Truth {
        what: "DGX A100 2 nodes, 8x HDR, ring all-reduce",
        preset: "dgx-a100",
        nodes: 2,
        ranks: 16,
        nvls: true,
        busbw_gbps: 192.0,
        per: 1.0,
        source: "NVIDIA/nccl#812 (AddyLaddy): 192 GB/s, >= 2 nodes",
    },
    Truth {
        what: "DGX A100 4 nodes, 8x HDR, ring all-reduce",
        preset: "dgx-a100",
        nodes: 4,
        ranks: 32,
        nvls: true,
        busbw_gbps: 192.0,
        per: 1.0,
        source: "NVIDIA/nccl#812 (AddyLaddy): 192 GB/s, >= 2 nodes",
    },
    Truth {
        what: "DGX H100 8-GPU all-reduce, NVLS",
        preset: "dgx-h100",
        nodes: 1,
        ranks: 8,
        nvls: true,
        busbw_gbps: 480.0,
        per: 1.0,
        source: "NVIDIA/nccl-tests#212 (sjeaugey): ~480 (algbw ~275)",
    },
    Truth {
        what: "H100 8-GPU all-reduce",
        preset: "dgx-h100",
        nodes: 1,
        ranks: 8,
        nvls: true,
        busbw_gbps: 476.0,
        per: 1.0,
        source: "NVIDIA/nccl-tests#290 (AddyLaddy)",
    },
    Truth {
        what: "H200 8-GPU all-reduce",
        preset: "dgx-h200",
        nodes: 1,
        ranks: 8,
        nvls: true,
        busbw_gbps: 475.0,
        per: 1.0,
        source: "NVIDIA/nccl-tests#272 (user, NCCL 2.20.3)",
    },
    Truth {
        what: "DGX H100 8-GPU all-reduce, ring (NVLS off)",
        preset: "dgx-h100",
        nodes: 1,
        ranks: 8,
        nvls: false,
        busbw_gbps: 370.0,
        per: 1.0,
        source: "NVIDIA/nccl-tests#212 (sjeaugey) ~370; NVIDIA/nccl#1455 365-370",
    },
    Truth {
        what: "H100 + CX-7 NDR, per NIC (4 nodes, ring all-reduce / 8 NICs)",
        preset: "dgx-h100",
        nodes: 4,
        ranks: 32,
        nvls: true,
        busbw_gbps: 47.0,
        per: 8.0,
        source: "NVIDIA/nccl-tests#290 and #267 (AddyLaddy): 46-48 per NIC",
    },
];

fn cluster(preset: &str, nodes: u32) -> ClusterSpec {
    let mut c = ClusterSpec::preset(preset).unwrap();
    c.nodes = nodes;
    c
}

fn all_reduce(ranks: Vec<u32>, bytes: u64) -> CommRequest {
    CommRequest { kind: CommKind::Collective(CollKind::AllReduce), ranks, bytes, multiplicity: 1 }
}

fn send(a: u32, b: u32, bytes: u64) -> CommRequest {
    CommRequest { kind: CommKind::SendRecv, ranks: vec![a, b], bytes, multiplicity: 1 }
}

/// Runs until everything started has completed; returns (completion ns, id) in order.
fn drain(net: &mut dyn Network) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    while let Some(t) = net.next_completion_ns() {
        out.extend(net.advance(t).into_iter().map(|id| (t, id)));
    }
    out
}

#[test]
fn ground_truth_busbw_within_ten_percent() {
    let mut report = String::new();
    for t in TRUTH {
        let env = NcclEnv { nvls_enable: t.nvls, ..NcclEnv::default() };
        let c = cluster(t.preset, t.nodes);
        let rows =
            sweep_cluster(&c, 0, NetworkKind::Fabric, &env, BenchOp::AllReduce, t.ranks, 8 << 30, 8 << 30).unwrap();
        let got = rows[0].busbw_gbps / t.per;
        let err = (got - t.busbw_gbps) / t.busbw_gbps;
        report +=
            &format!("{:<58} {:>7.1} vs {:>7.1} ({:+.1}%)  [{}]\n", t.what, got, t.busbw_gbps, err * 100.0, t.source);
        assert!(err.abs() <= 0.10, "{}: predicted {got:.1} GB/s, published {} ({})", t.what, t.busbw_gbps, t.source);
    }
    println!("{report}");
}

#[test]
fn closed_form_matches_the_nvlink_and_nic_rows_it_can_express() {
    // No NVLS in the closed form: its rows are the ring ones.
    for (preset, nodes, ranks, want) in
        [("dgx-a100", 1, 8, 230.0), ("dgx-a100", 2, 16, 192.0), ("dgx-h100", 1, 8, 370.0)]
    {
        let c = cluster(preset, nodes);
        let rows = sweep_cluster(
            &c,
            0,
            NetworkKind::ClosedForm,
            &NcclEnv::default(),
            BenchOp::AllReduce,
            ranks,
            8 << 30,
            8 << 30,
        )
        .unwrap();
        let err = (rows[0].busbw_gbps - want) / want;
        assert!(err.abs() <= 0.10, "{preset} x{nodes}: {} vs {want}", rows[0].busbw_gbps);
    }
}

/// A collective alone on an idle fabric takes exactly NCCL's predicted time.
#[test]
fn alone_on_an_idle_fabric_equals_the_nccl_model() {
    let cases: &[(&str, u32, Vec<u32>, Func)] = &[
        ("dgx-a100", 1, (0..8).collect(), Func::AllReduce),
        ("dgx-a100", 2, (0..16).collect(), Func::AllReduce),
        ("dgx-h100", 1, (0..8).collect(), Func::AllReduce),
        ("dgx-h100", 1, (0..8).collect(), Func::AllGather),
        ("dgx-h100", 4, (0..32).collect(), Func::AllReduce),
        ("dgx-h100", 4, (0..32).collect(), Func::ReduceScatter),
        ("dgx-h100", 16, (0..16).map(|n| n * 8 + 3).collect(), Func::AllReduce),
        ("dgx-h100", 16, (0..16).map(|n| n * 8 + 3).collect(), Func::AllGather),
        ("dgx-h100", 64, (0..64).map(|n| n * 8).collect(), Func::AllReduce),
    ];
    for (preset, nodes, ranks, func) in cases {
        let c = cluster(preset, *nodes);
        let node = NodeNet::from_cluster(&c).unwrap();
        let shape = node.shape(ranks);
        let tuner = Tuner::new(node.arch, node.cpu, shape, nccl_graph::search(&node, &shape), &NcclEnv::default());
        let kind = match func {
            Func::AllReduce => CollKind::AllReduce,
            Func::AllGather => CollKind::AllGather,
            _ => CollKind::ReduceScatter,
        };
        let mut size = 8u64;
        while size <= 1 << 32 {
            let mut net = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
            let req =
                CommRequest { kind: CommKind::Collective(kind), ranks: ranks.clone(), bytes: size, multiplicity: 1 };
            net.start(0, &req);
            let got = drain(&mut net)[0].0;
            let sel = tuner.select(*func, size);
            let want = sel.time_ns(size);
            assert!(
                got.abs_diff(want) <= 2,
                "{preset} x{nodes} {func:?} {size} B ({:?}/{:?}): fabric {got} ns, NCCL model {want} ns",
                sel.algo,
                sel.proto
            );
            size *= 4;
        }
    }
}

/// Ring all-reduce alone on a uniform fabric: T = 2(n−1)α + 2(n−1)/n · S/B, with NCCL's
/// per-step latencies (Simple, Intel host: NVLink steps max(3.4, 3·1) µs, network steps
/// 14 µs, base 8.4 µs, ×1.4 plateau) and B = 8 channels × 48 GB/s.
#[test]
fn ring_allreduce_matches_the_closed_form() {
    let mut c = cluster("dgx-h100", 4);
    c.fabric = Fabric::SingleSwitch;
    let env = NcclEnv { algos: vec![Algo::Ring], protos: vec![Proto::Simple], nvls_enable: false };
    let (n, nodes, s) = (32.0f64, 4.0f64, 1u64 << 30);
    let n_inter = 2.0 * (nodes - 1.0);
    let lat_us = 1.4 * (8.4 + (2.0 * (n - 1.0) - n_inter) * 3.4 + n_inter * 14.0);
    let b = 8.0 * 48e9;
    let want = (lat_us * 1e3).ceil() as u64 + (2.0 * (n - 1.0) / n * s as f64 / b * 1e9).ceil() as u64;
    let mut net = FabricNetwork::new(&c, 0, env).unwrap();
    net.start(0, &all_reduce((0..32).collect(), s));
    let got = drain(&mut net)[0].0;
    assert!(got.abs_diff(want) <= 2, "fabric {got} ns, closed form {want} ns");
}

#[test]
fn two_transfers_on_one_nic_take_twice_as_long() {
    let c = cluster("dgx-h100", 2);
    let s = 1u64 << 30;
    let mut alone = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
    alone.start(0, &send(0, 8, s));
    let t1 = drain(&mut alone)[0].0;
    let mut two = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
    two.start(0, &send(0, 8, s));
    two.start(0, &send(0, 8, s));
    let done = drain(&mut two);
    // Latency 22.4 µs + 3 switch-free ns… identical for both: only the transfer doubles.
    let alpha = 22_400 + 200;
    assert_eq!(done.len(), 2);
    assert_eq!(done[0].0, done[1].0);
    assert!((done[0].0 - alpha).abs_diff(2 * (t1 - alpha)) <= 2, "{done:?} vs alone {t1}");
}

/// 64 nodes in two scalable units: every node of unit 0 sends to its twin in unit 1 on
/// rail 0. The leaf's uplinks carry all of it; at 2:1 they offer half.
#[test]
fn oversubscribed_tier_halves_cross_unit_bandwidth() {
    let rate = |o: f64| {
        let mut c = cluster("dgx-h100", 64);
        c.oversubscription = o;
        let mut net = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
        let ids: Vec<u64> = (0..32).map(|i| net.start(0, &send(i * 8, (i + 32) * 8, 1 << 30))).collect();
        net.advance(net.next_completion_ns().unwrap());
        ids.iter().map(|&id| net.rate_bytes_per_s(id)).collect::<Vec<f64>>()
    };
    let (full, half) = (rate(1.0), rate(2.0));
    for (f, h) in full.iter().zip(&half) {
        assert_eq!(*f, 48e9);
        assert!((h - f / 2.0).abs() < 1e-3, "{h} vs {f}");
    }
}

/// Radix-4 fat-tree, one GPU and NIC per node: leaves of two nodes with two parallel
/// uplinks to one spine. Flows 0→2 and 1→3 leave the same leaf. Under static ECMP with a
/// seed that hashes all their lanes onto one uplink and one downlink they split one link
/// (24 GB/s each); adaptive routing spreads them over the trunk (48 each): exactly 2×.
#[test]
fn static_collision_costs_exactly_the_collision_factor() {
    let mut c = cluster("dgx-h100", 4);
    c.gpus_per_node = 1;
    c.nics_per_node = 1;
    c.fabric = Fabric::FatTree;
    c.switch_radix = 4;
    let s = 1u64 << 30;
    let run = |routing: Routing, seed: u64| {
        let mut c = c.clone();
        c.routing = routing;
        let mut net = FabricNetwork::new(&c, seed, NcclEnv::default()).unwrap();
        net.start(0, &send(0, 2, s));
        net.start(0, &send(1, 3, s));
        drain(&mut net)
    };
    let colliding = (0..10_000u64)
        .find(|&seed| {
            let mut c = c.clone();
            c.routing = Routing::Static;
            let t = super::topology::Topology::new(&c, seed).unwrap();
            let mut r = super::routing::Router::new(&t);
            let paths: Vec<_> = [(0, 2, 0), (0, 2, 1), (1, 3, 0), (1, 3, 1)]
                .iter()
                .map(|&(a, b, lane)| {
                    let id = r.route(&t, a, b, lane);
                    r.path(id).res[1..3].to_vec()
                })
                .collect();
            paths.iter().all(|p| *p == paths[0])
        })
        .expect("some seed collides");
    let adaptive = run(Routing::Adaptive, colliding);
    let fixed = run(Routing::Static, colliding);
    let alpha = 22_400 + 3 * 200;
    for (a, f) in adaptive.iter().zip(&fixed) {
        assert_eq!(a.1, f.1);
        assert!((f.0 - alpha).abs_diff(2 * (a.0 - alpha)) <= 2, "static {f:?} adaptive {a:?}");
    }
}

/// Multiplicity: copies spread evenly over each switch tier. A DP ring over both units of a
/// 64-node cluster (rail 0) loads its two leaves' uplink trunks with 2·63/64 · algBw = 48
/// GB/s; at 8:1 oversubscription a trunk offers 192 GB/s. Eight copies (the other rails)
/// use other leaves: no slowdown. 64 copies use 128 trunk slots of 16: each trunk carries 8
/// copies, 384 GB/s > 192, so each copy runs at half speed.
#[test]
fn multiplicity_counts_copies_on_the_switch_fabric() {
    let mut c = cluster("dgx-h100", 64);
    c.oversubscription = 8.0;
    let rate = |m: u32| {
        let mut net = FabricNetwork::new(&c, 0, NcclEnv::only_algo(Algo::Ring)).unwrap();
        let req = CommRequest {
            kind: CommKind::Collective(CollKind::AllReduce),
            ranks: (0..64).map(|n| n * 8).collect(),
            bytes: 1 << 30,
            multiplicity: m,
        };
        let id = net.start(0, &req);
        net.advance(net.next_completion_ns().unwrap());
        net.rate_bytes_per_s(id)
    };
    // One copy runs at NCCL's algBw: 2 channels × 24 GB/s busbw, × n/(2(n−1)).
    let one = rate(1);
    assert!((one - 48e9 * 64.0 / 126.0).abs() < 1.0, "{one}");
    assert_eq!(rate(8), one);
    assert!((rate(64) / one - 0.5).abs() < 1e-9, "{}", rate(64) / one);
}

/// Same seed, same workload ⇒ identical completion times, with static routing.
#[test]
fn same_seed_same_completions() {
    let mut c = cluster("dgx-h100", 128);
    c.routing = Routing::Static;
    let run = |seed: u64| {
        let mut net = FabricNetwork::new(&c, seed, NcclEnv::default()).unwrap();
        for (g, ranks) in super::bench::dp_groups(8, 16, 8).into_iter().enumerate() {
            let kind = if g % 2 == 0 { CollKind::AllReduce } else { CollKind::ReduceScatter };
            let bytes = (1 << 24) + g as u64 * 4096;
            net.start(g as u64 * 500, &CommRequest { kind: CommKind::Collective(kind), ranks, bytes, multiplicity: 1 });
        }
        drain(&mut net)
    };
    let a = run(11);
    assert_eq!(a.len(), 64);
    assert_eq!(a, run(11));
}

#[test]
fn h100_dgx_preset_uses_nvls_and_cpu_ranks_work() {
    let c = cluster("dgx-h100", 1);
    let net = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
    assert_eq!(net.choice(&all_reduce((0..8).collect(), 1 << 30)).algorithm, "nvls");
    let mut cpu = ClusterSpec::preset("cpu-local").unwrap();
    assert_eq!(cpu.gpu, GpuKind::Cpu);
    cpu.nodes = 1;
    let mut net = FabricNetwork::new(&cpu, 0, NcclEnv::default()).unwrap();
    net.start(0, &all_reduce((0..8).collect(), 1 << 20));
    assert_eq!(drain(&mut net).len(), 1);
}

/// Graphs taken from a real cluster's NCCL log replace the search stand-in.
#[test]
fn overridden_graphs_drive_the_model() {
    use super::nccl_graph::{GraphBw, Graphs};
    let c = cluster("dgx-a100", 1);
    let ranks: Vec<u32> = (0..8).collect();
    let slow = GraphBw { n_channels: 4, bw_intra_gb_per_s: 20.0, bw_inter_gb_per_s: 20.0 };
    let mut net = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
    net.override_graphs(&ranks, Graphs { ring: slow, tree: slow, nvls: None });
    net.start(0, &all_reduce(ranks, 8 << 30));
    let t_ns = drain(&mut net)[0].0;
    let busbw = (8u64 << 30) as f64 / t_ns as f64 * 14.0 / 8.0;
    assert!((busbw - 80.0).abs() < 0.5, "{busbw}");
}

/// Networks can move between threads (the search simulates configurations in parallel).
#[test]
fn networks_are_send() {
    fn send<T: Send>() {}
    send::<FabricNetwork>();
    send::<super::ClosedFormNetwork>();
}

/// NVLS loads each GPU's NVSwitch port with (n+1)/n of the progress rate: two NVLS
/// all-reduces on the same eight GPUs share 370.8 GB/s per port, 164.8 GB/s each
/// instead of NCCL's 274 alone.
#[test]
fn nvls_is_a_per_gpu_nvswitch_constraint() {
    let c = cluster("dgx-h100", 1);
    let mut net = FabricNetwork::new(&c, 0, NcclEnv::default()).unwrap();
    let a = net.start(0, &all_reduce((0..8).collect(), 1 << 30));
    let b = net.start(0, &all_reduce((0..8).collect(), 1 << 30));
    assert_eq!(net.choice(&all_reduce((0..8).collect(), 1 << 30)).algorithm, "nvls");
    net.advance(net.next_completion_ns().unwrap());
    let want = 370.8e9 / (2.0 * 9.0 / 8.0);
    for id in [a, b] {
        assert!((net.rate_bytes_per_s(id) - want).abs() < 1.0, "{}", net.rate_bytes_per_s(id));
    }
}

fn layout_of(c: &ClusterSpec, req: &CommRequest, algo: Algo) -> Vec<(super::topology::ResKind, f64, u32)> {
    use super::layout::{Plan, coefficients};
    use super::topology::{ResKind, Topology};
    let t = Topology::new(c, 0).unwrap();
    let mut r = super::routing::Router::new(&t);
    let node = NodeNet::from_cluster(c).unwrap();
    let g = nccl_graph::search(&node, &node.shape(&req.ranks));
    let gch = if algo == Algo::Ring { g.ring.n_channels } else { g.tree.n_channels };
    let plan = Plan { algo, channels: 2 * gch, graph_channels: gch };
    let rail_of_nic = |res: u32| (0..t.nodes * 8).find(|&e| t.nic_up(e) == res || t.nic_down(e) == res).map(|e| e % 8);
    coefficients(&t, &mut r, req, &plan)
        .into_iter()
        .map(|(res, a)| {
            let kind = t.resources[res as usize].kind;
            let rail = if matches!(kind, ResKind::NicUp | ResKind::NicDown) { rail_of_nic(res).unwrap() } else { 99 };
            (kind, a, rail)
        })
        .collect()
}

/// Ring channels enter and leave every node through the same NIC index: inside one
/// scalable unit a multi-node ring never leaves its rail leaves, and a DP group on local
/// GPU 3 only ever uses NIC 3.
#[test]
fn ring_channels_stay_on_their_rail() {
    use super::topology::ResKind;
    let c = cluster("dgx-h100", 4);
    let full = layout_of(&c, &all_reduce((0..32).collect(), 1 << 30), Algo::Ring);
    assert!(full.iter().all(|(k, _, _)| !k.is_fabric()), "a ring inside one unit crossed the spine");
    let rails: std::collections::BTreeSet<u32> =
        full.iter().filter(|(k, _, _)| *k == ResKind::NicUp).map(|(_, _, r)| *r).collect();
    assert_eq!(rails.len(), 8);
    let dp = layout_of(&c, &all_reduce(vec![3, 11, 19, 27], 1 << 30), Algo::Ring);
    assert!(dp.iter().filter(|(k, _, _)| matches!(k, ResKind::NicUp | ResKind::NicDown)).all(|(_, _, r)| *r == 3));
    // Each NIC carries 2(n−1)/n of the progress bytes out and in (all channels on it).
    let nic_out: f64 = dp.iter().filter(|(k, _, _)| *k == ResKind::NicUp).map(|(_, a, _)| a).sum();
    assert!((nic_out - 4.0 * 2.0 * 3.0 / 4.0).abs() < 1e-12, "{nic_out}");
}

/// Double binary trees connect distant node indices: a ring crosses each scalable-unit
/// boundary once, a tree once per tree edge between units, and there are more of those as
/// units multiply. Spine bytes per progress byte, summed over leaf-up and leaf-down trunks:
/// ring 2·U·2(n−1)/n; tree 2 per crossing edge (½ each way per tree, two trunks).
#[test]
fn trees_cross_the_spine() {
    use super::layout::dtree_parent;
    for nodes in [64u32, 256] {
        let c = cluster("dgx-h100", nodes);
        let ranks: Vec<u32> = (0..nodes).map(|n| n * 8).collect();
        let spine = |algo| -> f64 {
            layout_of(&c, &all_reduce(ranks.clone(), 1 << 30), algo)
                .iter()
                .filter(|(k, _, _)| k.is_fabric())
                .map(|(_, a, _)| a)
                .sum()
        };
        let (ring, tree) = (spine(Algo::Ring), spine(Algo::Tree));
        let (n, units) = (nodes as f64, (nodes / 32) as f64);
        assert!((ring - 2.0 * units * 2.0 * (n - 1.0) / n).abs() < 1e-9, "{nodes}: ring {ring}");
        let crossings = (0..2)
            .flat_map(|t| (0..nodes).filter_map(move |i| dtree_parent(nodes, i, t).map(|p| (i, p))))
            .filter(|&(i, p)| i / 32 != p / 32)
            .count();
        assert!((tree - 2.0 * crossings as f64).abs() < 1e-9, "{nodes}: tree {tree}, {crossings} crossings");
        if nodes == 256 {
            assert!(tree > 1.3 * ring, "tree {tree} vs ring {ring}");
        }
    }
}

/// A seeded random mix of collectives and transfers on a 32-node cluster with static
/// routing: every request completes exactly once, never sooner than NCCL's time alone
/// (a rate never exceeds its bound), and a rerun gives the same completions.
#[test]
fn random_mix_completes_once_never_faster_than_alone() {
    use rand::{RngExt, SeedableRng};
    let mut c = cluster("dgx-h100", 32);
    c.routing = Routing::Static;
    c.oversubscription = 2.0;
    let run = || {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut net = FabricNetwork::new(&c, 3, NcclEnv::default()).unwrap();
        let mut started: Vec<(u64, u64, CommRequest)> = Vec::new();
        let mut done: Vec<(u64, u64)> = Vec::new();
        let mut now = 0u64;
        for _ in 0..200 {
            now += rng.random_range(0..200_000u64);
            while let Some(t) = net.next_completion_ns().filter(|&t| t <= now) {
                done.extend(net.advance(t).into_iter().map(|id| (t, id)));
            }
            let bytes = 1u64 << rng.random_range(10..28);
            let req = match rng.random_range(0..4) {
                0 => {
                    let t = rng.random_range(0..8u32);
                    let first = rng.random_range(0..16u32);
                    let ranks = (first..first + 16).map(|n| n * 8 + t).collect();
                    CommRequest { kind: CommKind::Collective(CollKind::AllReduce), ranks, bytes, multiplicity: 1 }
                }
                1 => {
                    let node = rng.random_range(0..32u32);
                    let ranks = (node * 8..node * 8 + 8).collect();
                    CommRequest { kind: CommKind::Collective(CollKind::AllGather), ranks, bytes, multiplicity: 1 }
                }
                2 => {
                    let first = rng.random_range(0..30u32);
                    let ranks = (first * 8..first * 8 + 24).collect();
                    CommRequest { kind: CommKind::Collective(CollKind::ReduceScatter), ranks, bytes, multiplicity: 1 }
                }
                _ => send(rng.random_range(0..256), rng.random_range(0..256), bytes),
            };
            let id = net.start(now, &req);
            started.push((id, now, req));
        }
        done.extend(drain(&mut net));
        (started, done)
    };
    let (started, done) = run();
    assert_eq!(done.len(), started.len());
    let mut ids: Vec<u64> = done.iter().map(|d| d.1).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..started.len() as u64).collect::<Vec<_>>());
    let mut slowed = 0;
    for &(t, id) in &done {
        let (_, t0, req) = &started[id as usize];
        let mut alone = FabricNetwork::new(&c, 3, NcclEnv::default()).unwrap();
        alone.start(0, req);
        let t_alone = drain(&mut alone)[0].0;
        assert!(t - t0 + 1 >= t_alone, "request {id} took {} ns, alone {t_alone} ns", t - t0);
        slowed += (t - t0 > t_alone + t_alone / 100) as usize;
    }
    // The mix must really contend, or the check above proves nothing.
    assert!(slowed >= 10, "only {slowed} requests were slowed by others");
    assert_eq!(run().1, done);
}
