//! A two-tier leaf–spine fabric without rails: every NIC of a node on the same leaf, as
//! Ethernet or InfiniBand clusters are cabled when they are not rail-optimised.
//!
//! Built of radix-k switches (k = `cluster.switch_radix`, h = k/2), n = `cluster.nics_per_node`:
//! - a leaf has h ports down and h uplinks; it holds q = ⌊h/n⌋ whole nodes, node i on leaf
//!   ⌊i/q⌋ (consecutive nodes share a leaf, so a ring in node order leaves a leaf once);
//!   L = ⌈nodes/q⌉ leaves;
//! - every leaf links to every one of S spines with p parallel links, S·p = h: p is the
//!   largest divisor of h with L·p ≤ k (a spine has k ports), so the spines are as few as
//!   the radix allows and every leaf–spine pair looks the same. Two tiers hold at most k
//!   leaves, k·q nodes;
//! - `oversubscription` o divides the capacity of every leaf–spine link by o, as in the
//!   fat-tree fabrics: a leaf's uplinks offer h·B/o for the h·B its ports can send (B the
//!   NIC's effective bandwidth);
//! - one leaf (L = 1) is a single switch: no spines.
//!
//! Routes: between ports on one leaf, through the leaf (1 switch); else leaf → spine → leaf
//! (3 switches). Static routing: the source leaf picks one of its h uplinks by the seeded
//! ECMP hash ([`super::routing::ecmp`], salt of the leaf), which fixes the spine; the spine
//! picks one of its p links down to the destination leaf (salt of the spine). Adaptive
//! routing: the leaf's uplinks form one trunk of h·B/o, the links down into a leaf another.
//!
//! Closed form (one flow per port, adaptive): if F of a leaf's ports send off the leaf at
//! once, each gets min(B, h·B/(o·F)).
//!
//! Units: bytes/s, ns.

use strata_models::{ClusterSpec, Routing};

use super::NetError;
use super::routing::{ecmp, salts};
use super::topology::{FabricTopology, ResId, ResKind, Route, Tier, Vertex, Wiring};

/// A leaf–spine fabric.
#[derive(Clone, Debug)]
pub struct LeafSpine {
    pub routing: Routing,
    /// Whole nodes per leaf, q.
    pub nodes_per_leaf: u32,
    pub leaves: u32,
    pub spines: u32,
    /// Parallel links from each leaf to each spine, p.
    pub links_per_pair: u32,
    nics_per_node: u32,
    /// Leaf → spine link i of (leaf l, spine s) at `(l·S + s)·p + i`; `down` likewise
    /// spine → leaf.
    up: Vec<ResId>,
    down: Vec<ResId>,
    up_trunk: Vec<ResId>,
    down_trunk: Vec<ResId>,
    leaf_salt: Vec<u64>,
    spine_salt: Vec<u64>,
}

impl FabricTopology for LeafSpine {
    fn name(&self) -> &'static str {
        "leaf-spine"
    }

    fn route(&self, src: u32, dst: u32, lane: u32) -> Route {
        let (sl, dl) = (self.leaf_of(src), self.leaf_of(dst));
        if sl == dl {
            return Route { res: Vec::new(), switches: 1 };
        }
        let res = match self.routing {
            Routing::Adaptive => vec![self.up_trunk[sl as usize], self.down_trunk[dl as usize]],
            Routing::Static => {
                let (s, p) = (self.spines, self.links_per_pair);
                // Uplink j of the leaf: the round-robin deal puts it on spine j mod S.
                let j = ecmp(self.leaf_salt[sl as usize], src, dst, lane, (s * p) as usize) as u32;
                let (spine, i) = (j % s, j / s);
                let d = ecmp(self.spine_salt[spine as usize], src, dst, lane, p as usize) as u32;
                vec![self.up[self.link(sl, spine, i)], self.down[self.link(dl, spine, d)]]
            }
        };
        Route { res, switches: 3 }
    }

    fn lanes_matter(&self) -> bool {
        self.routing == Routing::Static
    }

    fn trunks(&self) -> Vec<(ResId, Vec<ResId>)> {
        let per_leaf = (self.spines * self.links_per_pair) as usize;
        let members = |v: &[ResId], l: usize| v[l * per_leaf..(l + 1) * per_leaf].to_vec();
        let up = self.up_trunk.iter().enumerate().map(|(l, &t)| (t, members(&self.up, l)));
        up.chain(self.down_trunk.iter().enumerate().map(|(l, &t)| (t, members(&self.down, l)))).collect()
    }
}

impl LeafSpine {
    /// Wires a leaf–spine fabric for `cluster` onto `w`; `seed` salts the static hash.
    /// Errors when the cluster does not fit two tiers of its switches.
    pub fn wire(cluster: &ClusterSpec, seed: u64, w: &mut Wiring) -> Result<LeafSpine, NetError> {
        let (k, n, nodes) = (cluster.switch_radix, cluster.nics_per_node, cluster.nodes);
        let (q, leaves, p) = Self::shape(k, n, nodes, cluster.oversubscription)?;
        let h = k / 2;
        let spines = if leaves > 1 { h / p } else { 0 };
        let lat = cluster.switch_latency_ns;
        let leaf_v: Vec<_> = (0..leaves).map(|l| w.switch(Vertex::Leaf(l))).collect();
        for e in 0..w.endpoints() {
            w.attach_nic(e, leaf_v[(e / n / q) as usize], lat);
        }
        let spine_v: Vec<_> = (0..spines).map(|s| w.switch(Vertex::Spine(s))).collect();
        let cap = w.nic_bytes_per_s() / cluster.oversubscription;
        let kinds = (ResKind::Fabric(Tier::LeafUp), ResKind::Fabric(Tier::LeafDown));
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for &lv in &leaf_v {
            for &sv in &spine_v {
                for _ in 0..p {
                    let (u, d) = w.duplex(lv, sv, cap, kinds, lat);
                    up.push(u);
                    down.push(d);
                }
            }
        }
        let (mut up_trunk, mut down_trunk) = (Vec::new(), Vec::new());
        if spines > 0 {
            for _ in 0..leaves {
                up_trunk.push(w.resource(cap * h as f64, ResKind::Trunk(Tier::LeafUp)));
                down_trunk.push(w.resource(cap * h as f64, ResKind::Trunk(Tier::LeafDown)));
            }
        }
        let mut s = salts(seed, &[leaves as usize, spines as usize]).into_iter();
        let (leaf_salt, spine_salt) = (s.next().unwrap_or_default(), s.next().unwrap_or_default());
        Ok(LeafSpine {
            routing: cluster.routing,
            nodes_per_leaf: q,
            leaves,
            spines,
            links_per_pair: p,
            nics_per_node: n,
            up,
            down,
            up_trunk,
            down_trunk,
            leaf_salt,
            spine_salt,
        })
    }

    /// (nodes per leaf q, leaves L, parallel links per leaf–spine pair p) for radix `k`,
    /// `n` NICs per node and `nodes` nodes, or why they do not fit.
    pub fn shape(k: u32, n: u32, nodes: u32, oversubscription: f64) -> Result<(u32, u32, u32), NetError> {
        let bad = |m: String| Err(NetError::Cluster(m));
        let h = k / 2;
        if nodes == 0 {
            return bad("cluster.nodes = 0: a leaf-spine fabric needs at least one node".into());
        }
        if n == 0 {
            return bad(format!(
                "cluster.nics_per_node = 0 with cluster.nodes = {nodes}: a leaf-spine fabric connects NICs"
            ));
        }
        if h < n {
            return bad(format!(
                "cluster.nics_per_node = {n} does not fit on one leaf of cluster.switch_radix = {k} (a leaf has \
                 k/2 = {h} ports down, and a leaf-spine fabric keeps each node's NICs on one leaf); raise \
                 cluster.switch_radix to at least {} or use fabric = \"rail-optimized\"",
                2 * n
            ));
        }
        if !(oversubscription >= 1.0 && oversubscription.is_finite()) {
            return bad(format!("cluster.oversubscription = {oversubscription}: it must be 1.0 or more"));
        }
        let q = h / n;
        let leaves = nodes.div_ceil(q);
        if leaves > k {
            return bad(format!(
                "cluster.nodes = {nodes} needs {leaves} leaves of {q} nodes, but a two-tier leaf-spine fabric of \
                 cluster.switch_radix = {k} holds at most k = {k} leaves ({} nodes); raise cluster.switch_radix \
                 or use fabric = \"fat-tree\" (three tiers)",
                k * q
            ));
        }
        let p = (1..=h).rev().find(|&p| h.is_multiple_of(p) && leaves * p <= k).expect("p = 1 fits: leaves ≤ k");
        Ok((q, leaves, p))
    }

    /// Leaf of a NIC port.
    pub fn leaf_of(&self, endpoint: u32) -> u32 {
        endpoint / self.nics_per_node / self.nodes_per_leaf
    }

    fn link(&self, leaf: u32, spine: u32, i: u32) -> usize {
        ((leaf * self.spines + spine) * self.links_per_pair + i) as usize
    }
}

#[cfg(test)]
mod tests {
    use strata_models::Fabric;

    use super::*;
    use crate::net::collbench::{BenchOp, sweep};
    use crate::net::nccl::{Func, NcclEnv, Tuner};
    use crate::net::topology::Topology;
    use crate::net::{FabricNetwork, NetworkKind, nccl_graph};

    /// `nodes` nodes of one H100 and one NDR NIC each on a radix-`k` leaf-spine.
    fn cluster(nodes: u32, k: u32, oversubscription: f64, routing: Routing) -> ClusterSpec {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = nodes;
        c.gpus_per_node = 1;
        c.nics_per_node = 1;
        c.fabric = Fabric::LeafSpine;
        c.switch_radix = k;
        c.oversubscription = oversubscription;
        c.routing = routing;
        c
    }

    #[test]
    fn shape_follows_the_documented_rule() {
        // Radix 64, 8 NICs: 4 nodes a leaf; 16 nodes → 4 leaves, 16 links to each of 2 spines.
        assert_eq!(LeafSpine::shape(64, 8, 16, 1.0).unwrap(), (4, 4, 16));
        // 5 leaves: p = 16 would need 80 spine ports; p = 8, S = 4.
        assert_eq!(LeafSpine::shape(64, 8, 17, 1.0).unwrap(), (4, 5, 8));
        // The largest two-tier fabric: k leaves, one link from each leaf to each of h spines.
        assert_eq!(LeafSpine::shape(64, 8, 256, 1.0).unwrap(), (4, 64, 1));
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 17;
        c.fabric = Fabric::LeafSpine;
        let t = Topology::new(&c, 0).unwrap();
        assert_eq!(t.fabric().name(), "leaf-spine");
        let switches = |f: fn(&Vertex) -> bool| t.graph.node_weights().filter(|v| f(v)).count();
        assert_eq!(switches(|v| matches!(v, Vertex::Leaf(_))), 5);
        assert_eq!(switches(|v| matches!(v, Vertex::Spine(_))), 4);
        assert_eq!(t.count(ResKind::Fabric(Tier::LeafUp)), 5 * 32);
        assert_eq!(t.count(ResKind::Trunk(Tier::LeafUp)), 5);
    }

    #[test]
    fn bad_sizes_are_errors_that_name_the_value() {
        let err = |k, n, nodes, o| LeafSpine::shape(k, n, nodes, o).unwrap_err().to_string();
        assert!(err(64, 8, 257, 1.0).contains("cluster.nodes = 257 needs 65 leaves"), "{}", err(64, 8, 257, 1.0));
        assert!(err(8, 8, 2, 1.0).contains("cluster.nics_per_node = 8 does not fit"), "{}", err(8, 8, 2, 1.0));
        assert!(err(64, 8, 0, 1.0).contains("cluster.nodes = 0"));
        assert!(err(64, 0, 4, 1.0).contains("cluster.nics_per_node = 0"));
        assert!(err(64, 8, 4, 0.5).contains("cluster.oversubscription = 0.5"));
        // Through the network builder too, and never a panic.
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.fabric = Fabric::LeafSpine;
        c.nodes = 300;
        let e = crate::net::build(&c, 0, NetworkKind::Fabric).err().unwrap().to_string();
        assert!(e.contains("cluster.nodes = 300"), "{e}");
        c.nodes = 4;
        c.switch_radix = 0;
        let e = crate::net::build(&c, 0, NetworkKind::Fabric).err().unwrap().to_string();
        assert!(e.contains("cluster.switch_radix = 0"), "{e}");
    }

    #[test]
    fn static_routes_are_walks_over_one_spine() {
        let c = cluster(16, 8, 1.0, Routing::Static);
        let t = Topology::new(&c, 9).unwrap();
        let f = t.fabric();
        // Radix 8: 4 nodes a leaf, 4 leaves, each with 2 links to each of 2 spines.
        assert_eq!(f.route(0, 3, 0), Route { res: vec![], switches: 1 });
        let mut spines = std::collections::BTreeSet::new();
        for lane in 0..32 {
            let r = f.route(1, 14, lane);
            assert_eq!(r.switches, 3);
            let ends = |id: ResId| {
                let e = t.graph.edge_indices().find(|&e| t.graph[e].res == Some(id)).unwrap();
                t.graph.edge_endpoints(e).unwrap()
            };
            let (a, up_end) = ends(r.res[0]);
            let (down_start, b) = ends(r.res[1]);
            assert_eq!(up_end, down_start, "lane {lane}: up and down meet at one spine");
            assert_eq!((t.graph[a], t.graph[b]), (Vertex::Leaf(0), Vertex::Leaf(3)));
            spines.insert(up_end);
        }
        assert_eq!(spines.len(), 2, "lanes spread over both spines");
        assert_eq!(f.route(1, 14, 5), Topology::new(&c, 9).unwrap().fabric().route(1, 14, 5), "seeded");
    }

    /// Ring all-reduce over one GPU per node, 16 nodes on 4 leaves of 4 (radix 8, one NIC
    /// per node), 8 GiB, adaptive routing. Every ring edge carries busbw (2(n−1)/n of the
    /// algbw). Nodes in the order 0, 4, 8, 12, 1, 5, … put every ring neighbour on another
    /// leaf: each leaf sends F = 4 edges up through its trunk of h·B/o = 4·B/o, so
    ///
    ///   busbw = min(B_nccl, B, h·B/(o·F)) = min(B_nccl, B / o),
    ///
    /// B = 48 GB/s (NDR NIC, effective), B_nccl = NCCL's ring busbw for this communicator
    /// (its rate bound). In node order a leaf sends F = 1 edge: min(B_nccl, B, 4·B/o), NIC
    /// bound up to o = 4. Measured time = α + S/algbw, α = NCCL's latency.
    #[test]
    fn ring_busbw_matches_the_uplink_closed_form() {
        let s = 8u64 << 30;
        let (n, b) = (16u32, 48.0);
        let interleaved: Vec<u32> = (0..n).map(|i| (i % 4) * 4 + i / 4).collect();
        let natural: Vec<u32> = (0..n).collect();
        let mut report = String::new();
        for o in [1.0, 2.0, 4.0] {
            for (order, ranks, f) in [("interleaved", &interleaved, 4.0), ("node order", &natural, 1.0)] {
                let c = cluster(n, 8, o, Routing::Adaptive);
                let env = NcclEnv::only_algo(crate::net::nccl::Algo::Ring);
                let mut net = FabricNetwork::new(&c, 0, env.clone()).unwrap();
                let got = sweep(&mut net, 0, BenchOp::AllReduce, ranks, s, s)[0].busbw_gbps;
                let node = &net.topology().node;
                let shape = node.shape(ranks);
                let tuner = Tuner::new(node.arch, node.cpu, shape, nccl_graph::search(node, &shape), &env);
                let sel = tuner.select(Func::AllReduce, s);
                let factor = BenchOp::AllReduce.bus_factor(n);
                let b_nccl = sel.algbw_gb_per_s * factor;
                let want_busbw = b_nccl.min(b).min(4.0 * b / (o * f));
                let t_ns = sel.latency_ns() as f64 + s as f64 / (want_busbw / factor);
                let want = s as f64 / t_ns * factor;
                report +=
                    &format!("o = {o} {order}: busbw {got:.3} GB/s, closed form {want:.3} (B_nccl {b_nccl:.1})\n");
                assert!((got - want).abs() / want < 1e-6, "o = {o} {order}: simulated {got} GB/s, closed form {want}");
            }
        }
        println!("{report}");
    }
}
