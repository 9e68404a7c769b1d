//! Collectives as link loads: for an algorithm NCCL chose, how many bytes cross each link
//! per byte of the collective's progress (the coefficients a_{c,l} of the max-min solver).
//!
//! Channels: NCCL runs `nc` channels; channel c carries 1/nc of the data, uses graph
//! channel c mod nG (nG = the graph's channel count) and so NIC rail `rails[(c mod nG) mod
//! #rails]`, where `rails` are the distinct NICs of the communicator's GPUs on a node. A
//! channel enters and leaves every node through that same NIC index (crossNic = 0), so
//! inter-node ring edges stay on one rail. Channel c is also its own hash lane (QP) for
//! static routing.
//!
//! Per algorithm, S = the collective's bytes (nccl-tests' S), n ranks, on each used link:
//! - Ring (all-reduce 2(n−1)/n, all-gather / reduce-scatter (n−1)/n, broadcast 1) / nc per
//!   ring edge of channel c; nodes in communicator order, GPUs inside a node in local
//!   order rotated to start at the GPU on the channel's rail; each edge is NVLink up + down
//!   inside a node, NIC up + fabric path + NIC down between nodes (NVIDIA/nccl graph/rings).
//! - Tree (double binary tree, NVIDIA/nccl graph/trees.cc): channel c < nG uses tree 0,
//!   the duplicated channels tree 1; every tree edge carries 1/nc each way (reduce up,
//!   broadcast down); inside a node a chain through the local GPUs, 1/nc each way.
//! - NVLS (one node): per GPU NVSwitch port, all-reduce (n+1)/n up and down (ld_reduce
//!   pulls the whole buffer, the multicast store returns it), all-gather 1/n up and 1 down,
//!   reduce-scatter 1 up and 1/n down.
//! - NVLS-tree: NVLS inside each node ((ppn+1)/ppn both ways) plus the tree between nodes
//!   through the channel's head NIC.
//! - PAT (one GPU per node): recursive doubling, step k sends min(2^k, n−2^k)/n to the rank
//!   2^k ahead (Σ = (n−1)/n), split over channels.
//! - Send/recv: 1 on its path; between nodes through PXN: the NIC on the destination's
//!   rail, reached over NVLink from the sender if its own rail differs. Two lanes of ½.
//! - All-to-all: grouped send/recv, 1/n per ordered pair. Above 256 nodes only NVLink and
//!   NIC ports are loaded (the fabric is taken as non-blocking for it).
//!
//! Units: dimensionless (bytes per progress byte).

use std::collections::BTreeMap;

use strata_models::plan::CollKind;

use super::nccl::Algo;
use super::routing::Router;
use super::topology::{ResId, Topology};
use super::{CommKind, CommRequest};

/// Accumulates coefficients; `finish` merges duplicates and sorts by resource.
#[derive(Default)]
struct Acc {
    elems: Vec<(ResId, f64)>,
}

impl Acc {
    fn add(&mut self, r: ResId, a: f64) {
        self.elems.push((r, a));
    }

    fn finish(mut self) -> Vec<(ResId, f64)> {
        self.elems.sort_by_key(|&(r, _)| r);
        let mut out: Vec<(ResId, f64)> = Vec::with_capacity(self.elems.len());
        for (r, a) in self.elems {
            match out.last_mut() {
                Some(last) if last.0 == r => last.1 += a,
                _ => out.push((r, a)),
            }
        }
        out
    }
}

/// A communicator as laid out on nodes.
struct Layout<'a> {
    topo: &'a Topology,
    /// Distinct nodes in communicator order, each with its local GPU indices (ascending).
    nodes: Vec<(u32, Vec<u32>)>,
    rails: Vec<u32>,
}

impl<'a> Layout<'a> {
    fn new(topo: &'a Topology, ranks: &[u32]) -> Layout<'a> {
        let node = &topo.node;
        let mut nodes: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut index: BTreeMap<u32, usize> = BTreeMap::new();
        for &r in ranks {
            let (n, l) = (node.node_of(r), node.local_of(r));
            let i = *index.entry(n).or_insert_with(|| {
                nodes.push((n, Vec::new()));
                nodes.len() - 1
            });
            nodes[i].1.push(l);
        }
        for (_, locals) in &mut nodes {
            locals.sort_unstable();
        }
        let mut rails: Vec<u32> =
            if node.nics_per_node > 0 { nodes[0].1.iter().map(|&l| node.rail_of_local(l)).collect() } else { vec![0] };
        rails.sort_unstable();
        rails.dedup();
        Layout { topo, nodes, rails }
    }

    fn rail(&self, channel: u32, graph_channels: u32) -> u32 {
        self.rails[((channel % graph_channels.max(1)) as usize) % self.rails.len()]
    }

    /// NVLink hop a → b inside `node`.
    fn nvlink(&self, acc: &mut Acc, node: u32, a: u32, b: u32, coeff: f64) {
        if a != b {
            acc.add(self.topo.nvlink_up(node, a), coeff);
            acc.add(self.topo.nvlink_down(node, b), coeff);
        }
    }

    /// NIC-to-NIC hop between nodes on `rail`.
    fn net(&self, acc: &mut Acc, router: &mut Router, (from, to): (u32, u32), rail: u32, lane: u32, coeff: f64) {
        let (s, d) = (self.topo.endpoint(from, rail), self.topo.endpoint(to, rail));
        let p = router.route(self.topo, s, d, lane);
        for &r in router.path(p).res.iter() {
            acc.add(r, coeff);
        }
    }

    /// Local GPUs of node i rotated to start at the GPU on `rail`.
    fn rotated(&self, i: usize, rail: u32) -> Vec<u32> {
        let locals = &self.nodes[i].1;
        let nics = self.topo.node.nics_per_node.max(1);
        let start = locals.iter().position(|&l| l % nics == rail).unwrap_or(0);
        locals[start..].iter().chain(&locals[..start]).copied().collect()
    }

    fn ring(
        &self,
        acc: &mut Acc,
        router: &mut Router,
        channels: u32,
        graph_channels: u32,
        factor: f64,
        skip_root: bool,
    ) {
        let coeff = factor / channels as f64;
        for c in 0..channels {
            let rail = self.rail(c, graph_channels);
            let seqs: Vec<Vec<u32>> = (0..self.nodes.len()).map(|i| self.rotated(i, rail)).collect();
            let m = seqs.len();
            for i in 0..m {
                let node = self.nodes[i].0;
                for w in seqs[i].windows(2) {
                    self.nvlink(acc, node, w[0], w[1], coeff);
                }
                let next = (i + 1) % m;
                if skip_root && next == 0 {
                    continue;
                }
                if m == 1 {
                    let s = &seqs[0];
                    self.nvlink(acc, node, s[s.len() - 1], s[0], coeff);
                } else {
                    self.net(acc, router, (node, self.nodes[next].0), rail, c, coeff);
                }
            }
        }
    }

    /// Inside-node chain, both directions.
    fn chain(&self, acc: &mut Acc, i: usize, rail: u32, coeff: f64) {
        let seq = self.rotated(i, rail);
        for w in seq.windows(2) {
            self.nvlink(acc, self.nodes[i].0, w[0], w[1], coeff);
            self.nvlink(acc, self.nodes[i].0, w[1], w[0], coeff);
        }
    }

    fn tree(&self, acc: &mut Acc, router: &mut Router, channels: u32, graph_channels: u32, nvls_inside: bool) {
        let coeff = 1.0 / channels as f64;
        let m = self.nodes.len() as u32;
        for c in 0..channels {
            let rail = self.rail(c, graph_channels);
            let which = (c / graph_channels.max(1)) % 2;
            if !nvls_inside {
                for i in 0..self.nodes.len() {
                    self.chain(acc, i, rail, coeff);
                }
            }
            for i in 0..m {
                if let Some(p) = dtree_parent(m, i, which) {
                    let (a, b) = (self.nodes[i as usize].0, self.nodes[p as usize].0);
                    self.net(acc, router, (a, b), rail, c, coeff);
                    self.net(acc, router, (b, a), rail, c, coeff);
                }
            }
        }
        if nvls_inside {
            for (node, locals) in &self.nodes {
                let ppn = locals.len() as f64;
                for &l in locals {
                    acc.add(self.topo.nvlink_up(*node, l), 1.0 + 1.0 / ppn);
                    acc.add(self.topo.nvlink_down(*node, l), 1.0 + 1.0 / ppn);
                }
            }
        }
    }

    fn nvls(&self, acc: &mut Acc, kind: CollKind) {
        let (node, locals) = &self.nodes[0];
        let n = locals.len() as f64;
        let (up, down) = match kind {
            CollKind::AllGather => (1.0 / n, 1.0),
            CollKind::ReduceScatter => (1.0, 1.0 / n),
            _ => ((n + 1.0) / n, (n + 1.0) / n),
        };
        for &l in locals {
            acc.add(self.topo.nvlink_up(*node, l), up);
            acc.add(self.topo.nvlink_down(*node, l), down);
        }
    }

    fn pat(&self, acc: &mut Acc, router: &mut Router, channels: u32, graph_channels: u32) {
        let n = self.nodes.len() as u32;
        let mut d = 1u32;
        while d < n {
            let coeff = d.min(n - d) as f64 / n as f64 / channels as f64;
            for i in 0..n {
                let j = (i + d) % n;
                for c in 0..channels {
                    let rail = self.rail(c, graph_channels);
                    self.net(acc, router, (self.nodes[i as usize].0, self.nodes[j as usize].0), rail, c, coeff);
                }
            }
            d *= 2;
        }
    }

    /// One message src → dst (global ranks) through PXN, `lanes` lanes.
    fn p2p(&self, acc: &mut Acc, router: Option<&mut Router>, src: u32, dst: u32, coeff: f64) {
        let node = &self.topo.node;
        let (na, la, nb, lb) = (node.node_of(src), node.local_of(src), node.node_of(dst), node.local_of(dst));
        if na == nb {
            self.nvlink(acc, na, la, lb, coeff);
            return;
        }
        let rail = node.rail_of_local(lb);
        if node.rail_of_local(la) != rail {
            self.nvlink(acc, na, la, lb, coeff);
        }
        match router {
            Some(router) => {
                for lane in 0..2 {
                    self.net(acc, router, (na, nb), rail, lane, coeff / 2.0);
                }
            }
            None => {
                acc.add(self.topo.nic_up(self.topo.endpoint(na, rail)), coeff);
                acc.add(self.topo.nic_down(self.topo.endpoint(nb, rail)), coeff);
            }
        }
    }
}

/// Parent of node index `i` in tree `which` (0, 1) of NCCL's double binary tree over `n`.
pub fn dtree_parent(n: u32, i: u32, which: u32) -> Option<u32> {
    let btree_parent = |rank: u32| -> Option<u32> {
        if rank == 0 {
            return None;
        }
        let bit = 1u32 << rank.trailing_zeros();
        let up = (rank ^ bit) | (bit << 1);
        Some(if up >= n { rank ^ bit } else { up })
    };
    if which == 0 {
        btree_parent(i)
    } else if n % 2 == 1 {
        btree_parent((i + n - 1) % n).map(|u| (u + 1) % n)
    } else {
        btree_parent(n - 1 - i).map(|u| n - 1 - u)
    }
}

/// Which layout to use and with how many channels.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub algo: Algo,
    pub channels: u32,
    pub graph_channels: u32,
}

/// The link coefficients of one copy of `req` laid out as `plan`; resources sorted, merged.
pub fn coefficients(topo: &Topology, router: &mut Router, req: &CommRequest, plan: &Plan) -> Vec<(ResId, f64)> {
    let mut acc = Acc::default();
    let lay = Layout::new(topo, &req.ranks);
    let n = req.ranks.len() as f64;
    let (ch, gch) = (plan.channels.max(1), plan.graph_channels.max(1));
    match req.kind {
        CommKind::SendRecv => lay.p2p(&mut acc, Some(router), req.ranks[0], req.ranks[1], 1.0),
        CommKind::Collective(CollKind::RingExchange) => {
            // Member i sends its whole block to member i + 1 (the last to the first).
            for (i, &s) in req.ranks.iter().enumerate() {
                let d = req.ranks[(i + 1) % req.ranks.len()];
                if s != d {
                    lay.p2p(&mut acc, Some(router), s, d, 1.0);
                }
            }
        }
        CommKind::Collective(CollKind::AllToAll) => {
            let route = lay.nodes.len() <= 256;
            let mut router = route.then_some(router);
            for &s in &req.ranks {
                for &d in &req.ranks {
                    if s != d {
                        lay.p2p(&mut acc, router.as_deref_mut(), s, d, 1.0 / n);
                    }
                }
            }
        }
        CommKind::Collective(kind) => match plan.algo {
            Algo::Nvls => lay.nvls(&mut acc, kind),
            Algo::Tree => lay.tree(&mut acc, router, ch, gch, false),
            Algo::NvlsTree => lay.tree(&mut acc, router, ch, gch, true),
            Algo::Pat => lay.pat(&mut acc, router, ch, gch),
            _ => {
                let (factor, skip_root) = match kind {
                    CollKind::AllReduce => (2.0 * (n - 1.0) / n, false),
                    CollKind::Broadcast => (1.0, true),
                    _ => ((n - 1.0) / n, false),
                };
                lay.ring(&mut acc, router, ch, gch, factor, skip_root);
            }
        },
    }
    acc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtree_matches_nccl_for_small_trees() {
        // ncclGetBtree for 8 ranks: 0 root, 4 → 0, 2/6 → 4, 1/3 → 2, 5/7 → 6.
        let parents: Vec<Option<u32>> = (0..8).map(|i| dtree_parent(8, i, 0)).collect();
        assert_eq!(parents, vec![None, Some(2), Some(4), Some(2), Some(0), Some(6), Some(4), Some(6)]);
        // Mirror tree for even n: rank 7 is the root.
        assert_eq!(dtree_parent(8, 7, 1), None);
        assert_eq!(dtree_parent(8, 3, 1), Some(7));
        // Every node has a path to the root in both trees (n odd: shift).
        for n in [2u32, 3, 5, 6, 7, 12, 13] {
            for which in 0..2 {
                for i in 0..n {
                    let (mut x, mut steps) = (i, 0);
                    while let Some(p) = dtree_parent(n, x, which) {
                        x = p;
                        steps += 1;
                        assert!(steps <= n);
                    }
                }
            }
        }
    }
}
