//! The rail-optimised fat-tree behind the fabric trait gives the numbers it gave before the
//! trait existed: completion times, to the nanosecond, of collectives and transfers on
//! every fat-tree shape (one switch, k-ary fat-tree, rail-optimised in two and three
//! tiers), with adaptive and static routing, alone and contending.
//!
//! The expected values below were produced by the pre-trait topology (commit 6cd20a4,
//! where leaves, spines and routing were one hard-wired leaf → spine → core builder); a
//! change here means a changed fabric, not a refactor.

use strata_models::plan::CollKind;
use strata_models::{ClusterSpec, Fabric, Routing};
use strata_sim::net::{CommKind, CommRequest, FabricNetwork, NcclEnv, Network};

fn cluster(preset: &str, nodes: u32, fabric: Fabric, routing: Routing, oversubscription: f64) -> ClusterSpec {
    let mut c = ClusterSpec::preset(preset).unwrap();
    c.nodes = nodes;
    c.fabric = fabric;
    c.routing = routing;
    c.oversubscription = oversubscription;
    c
}

fn coll(kind: CollKind, ranks: Vec<u32>, bytes: u64) -> CommRequest {
    CommRequest { kind: CommKind::Collective(kind), ranks, bytes, multiplicity: 1 }
}

/// Starts every (start ns, request) and runs to the end: completion ns of each, by id.
fn run(c: &ClusterSpec, seed: u64, reqs: &[(u64, CommRequest)]) -> Vec<u64> {
    let mut net = FabricNetwork::new(c, seed, NcclEnv::default()).unwrap();
    let mut done = vec![0u64; reqs.len()];
    for (t0, req) in reqs {
        while let Some(t) = net.next_completion_ns().filter(|&t| t <= *t0) {
            for id in net.advance(t) {
                done[id as usize] = t;
            }
        }
        net.start(*t0, req);
    }
    while let Some(t) = net.next_completion_ns() {
        for id in net.advance(t) {
            done[id as usize] = t;
        }
    }
    done
}

/// A fixed mix on one cluster: DP all-reduces per rail, node-local all-gathers, cross-node
/// reduce-scatters, send/recv pairs and an all-to-all, started 50 µs apart.
fn mix(nodes: u32) -> Vec<(u64, CommRequest)> {
    let mut reqs = Vec::new();
    let mut t = 0u64;
    let mut push = |req: CommRequest| {
        reqs.push((t, req));
        t += 50_000;
    };
    for rail in [0u32, 3, 5] {
        push(coll(CollKind::AllReduce, (0..nodes).map(|n| n * 8 + rail).collect(), 64 << 20));
    }
    push(coll(CollKind::AllGather, (0..8).collect(), 32 << 20));
    push(coll(CollKind::ReduceScatter, (0..nodes.min(24) * 8).collect(), 256 << 20));
    push(coll(CollKind::AllReduce, (0..nodes * 8).collect(), 1 << 30));
    for i in 0..6u32 {
        let (a, b) = (i * 8 + i % 8, (nodes - 1 - i) * 8 + (i + 3) % 8);
        push(CommRequest { kind: CommKind::SendRecv, ranks: vec![a, b], bytes: 16 << 20, multiplicity: 1 });
    }
    push(coll(CollKind::AllToAll, (0..16).map(|n| n * 8 + 1).collect(), 8 << 20));
    push(CommRequest {
        kind: CommKind::Collective(CollKind::AllReduce),
        ranks: (0..nodes).map(|n| n * 8 + 7).collect(),
        bytes: 128 << 20,
        multiplicity: 4,
    });
    reqs
}

#[test]
fn fat_tree_completions_are_unchanged() {
    use Fabric::*;
    use Routing::*;
    let cases: Vec<(&str, ClusterSpec, u64)> = vec![
        ("rail 64 adaptive", cluster("dgx-h100", 64, RailOptimized, Adaptive, 1.0), 0),
        ("rail 64 static 2:1", cluster("dgx-h100", 64, RailOptimized, Static, 2.0), 7),
        ("rail 512 static", cluster("dgx-h100", 512, RailOptimized, Static, 1.0), 3),
        ("rail 512 adaptive 4:1", cluster("dgx-h100", 512, RailOptimized, Adaptive, 4.0), 3),
        ("a100 rail 40 static", cluster("dgx-a100", 40, RailOptimized, Static, 1.0), 11),
        ("fat-tree k16 32 static", cluster("dgx-a100", 32, FatTree, Static, 1.0), 5),
        ("fat-tree k16 32 adaptive", cluster("dgx-a100", 32, FatTree, Adaptive, 1.0), 5),
        ("single switch 32", cluster("dgx-h100", 32, SingleSwitch, Static, 1.0), 1),
    ];
    let mut got = String::new();
    for (name, mut c, seed) in cases {
        if c.fabric == FatTree {
            c.switch_radix = 16;
        }
        let done = run(&c, seed, &mix(c.nodes));
        got += &format!("{name}: {done:?}\n");
    }
    print!("{got}");
    assert_eq!(got, EXPECTED);
}

/// Completion ns of each request of [`mix`], by id, per case.
const EXPECTED: &str = "\
rail 64 adaptive: [3995069, 3768194, 4080435, 263757, 8580603, 12988671, 938297, 743271, 1585790, 855749, 1203963, 1750424, 806578, 7521872]
rail 64 static 2:1: [3995069, 3768194, 4080435, 263757, 8580603, 12988671, 1159561, 743271, 1585790, 855749, 1203963, 1750424, 806578, 7521872]
rail 512 static: [4039522, 3819194, 4120804, 263757, 8574638, 13000512, 929998, 733040, 1575559, 845518, 1071271, 1744277, 804255, 7515405]
rail 512 adaptive 4:1: [4039522, 3819194, 4120804, 263757, 8574638, 13000512, 929998, 733040, 1575559, 845518, 1071271, 1744277, 804255, 7515405]
a100 rail 40 static: [8019052, 8075059, 8131066, 304535, 16455092, 27081922, 1069310, 1125528, 1181745, 1237962, 1294180, 1350397, 988390, 15184893]
fat-tree k16 32 static: [14565646, 14628348, 14669735, 304535, 28051394, 53523546, 1065894, 1122111, 1178329, 1233993, 1370155, 1671380, 1045929, 22515295]
fat-tree k16 32 adaptive: [7784089, 7709884, 7767097, 304535, 16604495, 26804642, 1069760, 1125977, 1182195, 1237577, 1289693, 1577045, 988390, 14800296]
single switch 32: [4118877, 3849282, 3991203, 263757, 8638200, 13025567, 873510, 756053, 1144561, 868797, 916465, 1728124, 807011, 7624063]
";
