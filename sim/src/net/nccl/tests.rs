//! Tests of the NCCL tuner: algorithm, protocol and channel choice, and its latencies
//! against the reference numbers.

use super::*;
use crate::net::nccl_graph::search;
use crate::net::node::NodeNet;
use strata_models::ClusterSpec;

fn tuner(preset: &str, nodes: u32, ranks: &[u32], env: &NcclEnv) -> Tuner {
    let mut c = ClusterSpec::preset(preset).unwrap();
    c.nodes = nodes;
    let node = NodeNet::from_cluster(&c).unwrap();
    let shape = node.shape(ranks);
    Tuner::new(node.arch, node.cpu, shape, search(&node, &shape), env)
}

fn busbw_ar(sel: &Selection, n: u32) -> f64 {
    sel.algbw_gb_per_s * 2.0 * (n - 1) as f64 / n as f64
}

#[test]
fn large_allreduce_on_one_h100_node_is_nvls_then_ring() {
    let ranks: Vec<u32> = (0..8).collect();
    let s = tuner("dgx-h100", 1, &ranks, &NcclEnv::default()).select(Func::AllReduce, 8 << 30);
    assert_eq!((s.algo, s.proto, s.n_channels), (Algo::Nvls, Proto::Simple, 16));
    assert!((busbw_ar(&s, 8) - 480.0).abs() < 1e-6, "{s:?}");
    let env = NcclEnv { nvls_enable: false, ..NcclEnv::default() };
    let s = tuner("dgx-h100", 1, &ranks, &env).select(Func::AllReduce, 8 << 30);
    assert_eq!((s.algo, s.proto), (Algo::Ring, Proto::Simple));
    assert!((busbw_ar(&s, 8) - 360.0).abs() < 1e-6, "{s:?}");
}

#[test]
fn latencies_match_the_reference_worked_numbers() {
    // network-and-collectives.md §1: 128 ranks, ppn = 1, Simple, Intel: Ring AR 3.56 ms,
    // Tree AR 0.20 ms, PAT AG 0.39 ms.
    let ranks: Vec<u32> = (0..128).map(|n| n * 8).collect();
    let t = tuner("dgx-h100", 128, &ranks, &NcclEnv::default());
    let ring = t.lat[func_index(Func::AllReduce)][Algo::Ring as usize][2];
    let tree = t.lat[func_index(Func::AllReduce)][Algo::Tree as usize][2];
    let pat = t.lat[func_index(Func::AllGather)][Algo::Pat as usize][2];
    assert!((ring - 3564.4).abs() < 0.1, "{ring}");
    assert!((tree - 204.4).abs() < 0.1, "{tree}");
    assert!((pat - 394.4).abs() < 0.1, "{pat}");
}

#[test]
fn small_messages_pick_low_latency_protocols_and_fewer_channels() {
    let ranks: Vec<u32> = (0..8).collect();
    let t = tuner("dgx-a100", 1, &ranks, &NcclEnv::default());
    let s = t.select(Func::AllReduce, 1024);
    assert_eq!(s.proto, Proto::Ll);
    assert_eq!(s.n_channels, 1);
    let big = t.select(Func::AllReduce, 1 << 30);
    assert_eq!((big.algo, big.proto, big.n_channels), (Algo::Ring, Proto::Simple, 24));
}

#[test]
fn pat_only_with_one_rank_per_node() {
    let dp: Vec<u32> = (0..16).map(|n| n * 8).collect();
    let t = tuner("dgx-h100", 16, &dp, &NcclEnv::default());
    assert_eq!(t.select(Func::AllGather, 64 << 10).algo, Algo::Pat);
    let full: Vec<u32> = (0..32).collect();
    let t = tuner("dgx-h100", 4, &full, &NcclEnv::default());
    assert_ne!(t.select(Func::AllGather, 64 << 10).algo, Algo::Pat);
    assert!(t.algo_time(Func::AllGather, Algo::Pat, Proto::Simple, 1 << 20).is_none());
    // No NVLS across nodes without SHARP.
    assert!(t.algo_time(Func::AllReduce, Algo::Nvls, Proto::Simple, 1 << 20).is_none());
}

#[test]
fn predict_is_the_tuner_on_the_cluster() {
    let mut c = ClusterSpec::preset("dgx-a100").unwrap();
    c.nodes = 2;
    let ranks: Vec<u32> = (0..16).collect();
    let s = predict(&c, &ranks, Func::AllReduce, 1 << 30, &NcclEnv::default()).unwrap();
    assert_eq!(s, tuner("dgx-a100", 2, &ranks, &NcclEnv::default()).select(Func::AllReduce, 1 << 30));
    assert_eq!((s.algo, s.proto), (Algo::Ring, Proto::Simple));
}

#[test]
fn log2i_is_log2_down() {
    assert_eq!((log2i(0), log2i(1), log2i(2), log2i(3), log2i(1 << 40)), (-1, 0, 1, 1, 40));
}
