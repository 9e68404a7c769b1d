//! The expert-parallel all-to-all and the context-parallel ring exchange on the fabric:
//! pairwise flows in the max-min solver that contend with data-parallel traffic on the same
//! NICs (closed forms), a ring step's time, and a check against DeepEP's measured EP8
//! intranode and EP16–64 internode bandwidths (sim/data/deepep_alltoall.csv) with residuals.

use strata_models::ClusterSpec;
use strata_models::plan::CollKind;
use strata_sim::net::faults::LinkFaults;
use strata_sim::net::topology::ResKind;
use strata_sim::net::{ClosedFormNetwork, CommKind, CommRequest, FabricNetwork, NcclEnv, Network};

fn cluster(nodes: u32) -> ClusterSpec {
    let mut c = ClusterSpec::preset("dgx-h100").unwrap();
    c.nodes = nodes;
    c
}

fn coll(kind: CollKind, ranks: Vec<u32>, bytes: u64) -> CommRequest {
    CommRequest { kind: CommKind::Collective(kind), ranks, bytes, multiplicity: 1 }
}

/// Starts every request at 0 and runs to the end: each one's completion, ns.
fn run(net: &mut dyn Network, reqs: &[CommRequest]) -> Vec<u64> {
    let ids: Vec<u64> = reqs.iter().map(|r| net.start(0, r)).collect();
    let mut done = vec![0u64; reqs.len()];
    while let Some(t) = net.next_completion_ns() {
        for id in net.advance(t) {
            let i = ids.iter().position(|&x| x == id).unwrap();
            done[i] = t;
        }
    }
    done
}

/// One direction's capacity of a resource kind (every one of the kind is alike here), B/s.
fn cap(net: &FabricNetwork, kind: ResKind) -> f64 {
    net.topology().resources.iter().find(|r| r.kind == kind).unwrap().cap_bytes_per_s
}

/// An all-to-all over 2 nodes × 8 GPUs: each ordered pair carries S/16; under PXN the flows
/// to remote GPU j leave through NIC j, so every NIC sends 8 · S/16 = S/2 — the bottleneck
/// (NVLink carries 14/16 · S at ~8× the NIC's rate). With an all-reduce of S_d between GPU g
/// of each node on every rail g at once, each NIC also carries S_d (ring of two: 2(n−1)/n =
/// 1): max-min shares the NIC, the all-to-all (which ends last) finishes when the NIC has sent
/// both, (S/2 + S_d)/C after the latencies, and each slows the other.
#[test]
fn an_all_to_all_contends_with_data_parallel_traffic_on_the_nics() {
    let c = cluster(2);
    let s: u64 = 1 << 30;
    let sd: u64 = 256 << 20;
    let a2a = coll(CollKind::AllToAll, (0..16).collect(), s);
    let ars: Vec<CommRequest> = (0..8).map(|g| coll(CollKind::AllReduce, vec![g, 8 + g], sd)).collect();
    let fresh = || FabricNetwork::new(&c, 1, NcclEnv::default()).unwrap();
    let nic = cap(&fresh(), ResKind::NicUp);
    let alone = run(&mut fresh(), std::slice::from_ref(&a2a))[0];
    let want = (s as f64 / 2.0) / nic * 1e9;
    assert!((alone as f64 / want - 1.0).abs() < 0.01, "alone {alone} ns, closed form {want:.0} ns");
    let ar_alone = run(&mut fresh(), &ars[..1])[0];
    let mut all = vec![a2a.clone()];
    all.extend(ars.iter().cloned());
    let done = run(&mut fresh(), &all);
    let both = (s as f64 / 2.0 + sd as f64) / nic * 1e9;
    assert!(
        (done[0] as f64 / both - 1.0).abs() < 0.01,
        "with the all-reduces {} ns, closed form {both:.0} ns",
        done[0]
    );
    assert!(done[0] as f64 > 1.3 * alone as f64);
    assert!(done[1..].iter().all(|&t| t as f64 > 1.2 * ar_alone as f64), "{done:?} vs {ar_alone}");
    // Inside one node the all-to-all is NVLink-bound: each GPU sends 7/8 of S.
    let one = cluster(1);
    let mut net = FabricNetwork::new(&one, 1, NcclEnv::default()).unwrap();
    let nv = cap(&net, ResKind::NvlinkUp);
    let t = run(&mut net, &[coll(CollKind::AllToAll, (0..8).collect(), s)])[0];
    let want = 7.0 / 8.0 * s as f64 / nv * 1e9;
    assert!((t as f64 / want - 1.0).abs() < 0.01, "{t} vs {want:.0}");
    // The closed-form network costs it the same way (node-level bytes over NVLink / NICs).
    let mut cf = ClosedFormNetwork::new(&c, NcclEnv::default()).unwrap();
    let t_cf = run(&mut cf, std::slice::from_ref(&a2a))[0];
    assert!((t_cf as f64 / alone as f64 - 1.0).abs() < 0.1, "closed form {t_cf} vs fabric {alone}");
}

/// A ring step: every member sends S to the next at once. Inside a node each block crosses
/// one NVLink (S/C_nvlink); a context-parallel group on one rail across nodes sends through
/// its NIC (S/C_nic); two rings on the same NICs halve each other's rate.
#[test]
fn a_ring_exchange_is_one_block_over_one_link_per_member() {
    let s: u64 = 1 << 30; // the latency (12–25 µs) is under 1% of it
    let c = cluster(4);
    let fresh = || FabricNetwork::new(&c, 1, NcclEnv::default()).unwrap();
    let (nv, nic) = (cap(&fresh(), ResKind::NvlinkUp), cap(&fresh(), ResKind::NicUp));
    let intra = run(&mut fresh(), &[coll(CollKind::RingExchange, vec![0, 1, 2, 3], s)])[0];
    assert!((intra as f64 / (s as f64 / nv * 1e9) - 1.0).abs() < 0.02, "{intra}");
    let ring = coll(CollKind::RingExchange, vec![0, 8, 16, 24], s);
    let inter = run(&mut fresh(), std::slice::from_ref(&ring))[0];
    assert!((inter as f64 / (s as f64 / nic * 1e9) - 1.0).abs() < 0.02, "{inter}");
    let two = run(&mut fresh(), &[ring.clone(), ring.clone()])[1];
    assert!((two as f64 / (2.0 * s as f64 / nic * 1e9) - 1.0).abs() < 0.02, "{two}");
    // The closed-form network costs a step the same way: latency + S / link.
    let mut cf = ClosedFormNetwork::new(&c, NcclEnv::default()).unwrap();
    let t_cf = run(&mut cf, &[ring])[0];
    assert!((t_cf as f64 / inter as f64 - 1.0).abs() < 0.05, "closed form {t_cf} vs fabric {inter}");
}

/// DeepEP's figures against the fabric's all-to-all on an H800 node: an H100 with 8 of its 18
/// NVLink4 links (400 GB/s bidirectional, the H800 datasheet), 8 × 400 Gb/s CX7. Uniform
/// routing stands for DeepEP's random top-8; the volumes are DeepEP's benchmark's (derived
/// from its shapes as its tests count bytes). Prints each row's model figure and residual.
#[test]
fn deepep_bandwidths_against_the_fabric() {
    let text = include_str!("../data/deepep_alltoall.csv");
    let (tokens, hidden) = (4096.0, 7168.0);
    let mut worst: f64 = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("ep,")) {
        let f: Vec<&str> = line.split(',').collect();
        let (ep, nodes): (u32, u32) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        let measured: f64 = f[4].parse().unwrap();
        let bytes = if f[2] == "dispatch" { hidden * 2.0 * (1.0 + 4.0 / 128.0) / 2.0 } else { hidden * 2.0 };
        let c = cluster(nodes);
        let degrade: Vec<(String, f64)> =
            (0..nodes).flat_map(|n| (0..8).map(move |g| (format!("node{n}/gpu{g}-nvswitch"), 8.0 / 18.0))).collect();
        let mut net =
            FabricNetwork::with_faults(&c, 1, NcclEnv::default(), &LinkFaults { degrade, down: vec![] }).unwrap();
        let n = ep as f64;
        let (counted, s) = if f[3] == "nvlink" {
            // Top-4 of 8 groups, a group per GPU: a token reaches 4 ranks; a rank receives as
            // many tokens × 4, its own included — the all-to-all's whole per-rank buffer.
            let s = tokens * 4.0 * bytes;
            (s, s)
        } else {
            // One copy per remote target node: a token's ≤ 4 nodes, its own among them with
            // probability min(4, N)/N. In a uniform all-to-all a rank sends (n − 8)/n of S
            // off its node.
            let nn = nodes as f64;
            let v = tokens * bytes * nn.min(4.0) * (nn - 1.0) / nn;
            (v, v * n / (n - 8.0))
        };
        let t = run(&mut net, &[coll(CollKind::AllToAll, (0..ep).collect(), s.round() as u64)])[0];
        let model = counted / (t as f64 * 1e-9) / 1e9;
        let residual = model / measured - 1.0;
        println!(
            "EP{ep:<3} {:<8} {:<6} measured {measured:>5.0} GB/s  model {model:>6.1} GB/s  residual {:+.1}%",
            f[2],
            f[3],
            100.0 * residual
        );
        worst = worst.max(residual.abs());
    }
    // The check, not a fit: the model is optimistic inside a node (DeepEP's NVLink kernels
    // reach ~85% of what uniform flows at the effective NVLink rate give) and within the
    // spread of DeepEP's own EP16–64 figures across nodes.
    assert!(worst < 0.30, "worst residual {:.1}%", 100.0 * worst);
}
