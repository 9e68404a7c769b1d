//! The simplest honest network: per link class a latency and a bandwidth, collectives in
//! closed form, no contention between requests.
//!
//! Two classes: NVLink/NVSwitch inside a node (B = the GPU's effective NVLink bandwidth,
//! α = 3.4 µs) and NIC + fabric between nodes (α = 14 µs; α are NCCL v2.30.7's per-hop
//! Ring/Simple hardware latencies for NVLink and NET, tuning.cc). A communicator spanning
//! N > 1 nodes with ppn ranks per node and k NICs in use per node has the ring bottleneck
//!
//!   B = min(k · B_nic, B_nvlink · ppn/(ppn−1))   (a ring crosses each node boundary once
//!                                                  per channel; ppn−1 of ppn GPUs forward)
//!
//! and α = α_net (every ring step waits for its slowest hop). Then, for S bytes over n ranks
//! (S = nccl-tests' whole buffer):
//! - all-reduce, ring:   T = 2(n−1)·α + 2(n−1)/n · S/B
//! - all-reduce, double binary tree (N > 1): T = 2·⌈log2 N⌉·α + 2·(ppn−1)·α_nvlink + 2·S/B
//!   (a node is interior in one tree and a leaf in the other: ≈ 2S per direction);
//!   the smaller of ring and tree is used;
//! - all-gather / reduce-scatter: T = (n−1)·α + (n−1)/n · S/B
//! - broadcast (pipelined ring): T = (n−1)·α + S/B
//! - all-to-all (grouped p2p, PXN spreads inter-node bytes over all NICs of a node):
//!   T = α + max((ppn−1)/n · S / B_nvlink, ppn·(n−ppn)/n · S / (nics·B_nic))
//! - send/recv: T = α + S/B of its class (one NIC between nodes).
//!
//! Requests never contend, so `multiplicity` changes nothing here.
//!
//! Units: ns (u64) outside, seconds and bytes/s inside the formulas.

use strata_models::ClusterSpec;
use strata_models::plan::CollKind;

use super::nccl::NcclEnv;
use super::node::{CommShape, NodeNet};
use super::{CommChoice, CommId, CommKind, CommRequest, FixedTimes, NetError, Network};

/// NCCL's Ring/Simple hop latency over NVLink (tuning.cc hwLat), ns.
pub const NVLINK_LATENCY_NS: u64 = 3_400;
/// NCCL's Ring/Simple hop latency over the network (tuning.cc hwLat), ns.
pub const NET_LATENCY_NS: u64 = 14_000;

/// Closed-form, contention-free network.
#[derive(Clone, Debug)]
pub struct ClosedFormNetwork {
    node: NodeNet,
    /// Pending completions, ordered by (time, id).
    pending: FixedTimes,
}

/// The closed-form answer for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClosedFormCost {
    pub time_ns: u64,
    pub algorithm: &'static str,
}

impl ClosedFormNetwork {
    /// A closed-form network for `cluster`. `_env` is accepted for symmetry with the fabric
    /// model; the closed form has no algorithm choice beyond ring vs tree.
    pub fn new(cluster: &ClusterSpec, _env: NcclEnv) -> Result<ClosedFormNetwork, NetError> {
        Ok(ClosedFormNetwork { node: NodeNet::from_cluster(cluster)?, pending: FixedTimes::default() })
    }

    /// The ring bottleneck bandwidth B of a communicator, bytes/s.
    pub fn ring_bw_bytes_per_s(&self, shape: &CommShape) -> f64 {
        let nvlink = self.node.nvlink_gb_per_s * 1e9;
        if shape.n_nodes <= 1 {
            return nvlink;
        }
        let nic = shape.nics_used as f64 * self.node.nic_delivered_gb_per_s() * 1e9;
        if shape.local_ranks > 1 {
            let ppn = shape.local_ranks as f64;
            nic.min(nvlink * ppn / (ppn - 1.0))
        } else {
            nic
        }
    }

    /// Time and algorithm of a request, alone.
    pub fn cost(&self, req: &CommRequest) -> ClosedFormCost {
        let shape = self.node.shape(&req.ranks);
        let n = shape.n_ranks as f64;
        let s = req.bytes as f64;
        let multi = shape.n_nodes > 1;
        let alpha = if multi { NET_LATENCY_NS } else { NVLINK_LATENCY_NS } as f64 * 1e-9;
        let b = self.ring_bw_bytes_per_s(&shape);
        let secs = |t: f64| (t * 1e9).ceil() as u64;
        if shape.n_ranks <= 1 {
            return ClosedFormCost { time_ns: 0, algorithm: "none" };
        }
        match req.kind {
            CommKind::Collective(CollKind::AllReduce) => {
                let ring = 2.0 * (n - 1.0) * alpha + 2.0 * (n - 1.0) / n * s / b;
                if multi {
                    let ppn = shape.local_ranks as f64;
                    let depth = (shape.n_nodes as f64).log2().ceil();
                    let tree = 2.0 * depth * alpha + 2.0 * (ppn - 1.0) * NVLINK_LATENCY_NS as f64 * 1e-9 + 2.0 * s / b;
                    if tree < ring {
                        return ClosedFormCost { time_ns: secs(tree), algorithm: "tree" };
                    }
                }
                ClosedFormCost { time_ns: secs(ring), algorithm: "ring" }
            }
            CommKind::Collective(CollKind::AllGather | CollKind::ReduceScatter) => {
                ClosedFormCost { time_ns: secs((n - 1.0) * alpha + (n - 1.0) / n * s / b), algorithm: "ring" }
            }
            CommKind::Collective(CollKind::Broadcast) => {
                ClosedFormCost { time_ns: secs((n - 1.0) * alpha + s / b), algorithm: "ring" }
            }
            CommKind::Collective(CollKind::AllToAll) => {
                let ppn = shape.local_ranks as f64;
                let intra = (ppn - 1.0) / n * s / (self.node.nvlink_gb_per_s * 1e9);
                let nics = self.node.nics_per_node.max(1) as f64;
                let inter = if multi {
                    ppn * (n - ppn) / n * s / (nics * self.node.nic_delivered_gb_per_s() * 1e9)
                } else {
                    0.0
                };
                ClosedFormCost { time_ns: secs(alpha + intra.max(inter)), algorithm: "direct" }
            }
            CommKind::SendRecv | CommKind::Collective(CollKind::RingExchange) => {
                let bw = if multi { self.node.nic_delivered_gb_per_s() } else { self.node.nvlink_gb_per_s } * 1e9;
                ClosedFormCost { time_ns: secs(alpha + s / bw), algorithm: "p2p" }
            }
        }
    }
}

impl Network for ClosedFormNetwork {
    fn name(&self) -> &'static str {
        "closed-form"
    }

    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId {
        let end = now_ns + self.cost(req).time_ns;
        self.pending.start(end)
    }

    fn next_completion_ns(&self) -> Option<u64> {
        self.pending.next_completion_ns()
    }

    fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        self.pending.advance(now_ns)
    }

    fn choice(&self, req: &CommRequest) -> CommChoice {
        CommChoice { algorithm: self.cost(req).algorithm.to_string(), protocol: "Simple".to_string(), channels: 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: CommKind, ranks: Vec<u32>, bytes: u64) -> CommRequest {
        CommRequest { kind, ranks, bytes, multiplicity: 1 }
    }

    #[test]
    fn ring_allreduce_is_the_textbook_formula() {
        let c = ClusterSpec::preset("dgx-a100").unwrap();
        let net = ClosedFormNetwork::new(&c, NcclEnv::default()).unwrap();
        let s = 1u64 << 30;
        let r = req(CommKind::Collective(CollKind::AllReduce), (0..8).collect(), s);
        let want = 2.0 * 7.0 * 3.4e-6 + 2.0 * 7.0 / 8.0 * s as f64 / 240e9;
        assert_eq!(net.cost(&r).time_ns, (want * 1e9).ceil() as u64);
    }

    #[test]
    fn requests_do_not_slow_each_other() {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 2;
        let mut net = ClosedFormNetwork::new(&c, NcclEnv::default()).unwrap();
        let r = req(CommKind::SendRecv, vec![0, 8], 1 << 20);
        let alone = net.cost(&r).time_ns;
        let a = net.start(0, &r);
        let b = net.start(0, &r);
        assert_eq!(net.next_completion_ns(), Some(alone));
        assert_eq!(net.advance(alone), vec![a, b]);
        assert_eq!(net.next_completion_ns(), None);
    }

    #[test]
    fn tree_wins_at_scale_ring_at_small_scale() {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 256;
        let net = ClosedFormNetwork::new(&c, NcclEnv::default()).unwrap();
        let dp: Vec<u32> = (0..256).map(|n| n * 8).collect();
        assert_eq!(net.cost(&req(CommKind::Collective(CollKind::AllReduce), dp, 1 << 26)).algorithm, "tree");
        let two: Vec<u32> = (0..16).collect();
        assert_eq!(net.cost(&req(CommKind::Collective(CollKind::AllReduce), two, 1 << 32)).algorithm, "ring");
    }
}
