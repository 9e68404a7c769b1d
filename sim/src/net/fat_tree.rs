//! The folded-Clos fabrics of InfiniBand clusters: one ideal switch, a k-ary fat-tree
//! (Al-Fares et al. 2008) and the rail-optimised fabric of NVIDIA DGX SuperPODs, all built
//! of radix-k switches (k = `cluster.switch_radix`, h = k/2):
//! - leaves: each serves at most h NIC ports and has h uplinks. *Fat-tree* fills leaves
//!   with consecutive NIC ports (node-major); *rail-optimised* (NVIDIA DGX SuperPOD) gives
//!   every scalable unit of `nodes_per_unit` nodes one leaf per rail (more if a unit has
//!   more than h nodes, so that no leaf exceeds its radix); *single switch* is one ideal leaf;
//! - two tiers while there are at most k leaves: ⌈L·h/k⌉ spines, each leaf's h uplinks dealt
//!   round-robin over them (1 SU of 8 rails → 8 leaves + 4 spines, 4 SU → 32 + 16, as in the
//!   SuperPOD reference architecture);
//! - three tiers beyond: pods of h leaves and h spines (each leaf one link to each pod
//!   spine), spine j of every pod linked to core group j of ⌈pods/2⌉ cores (16 SU → 128
//!   leaves, 128 spines, 64 cores; 64 SU → 512/512/256, as the SuperPOD tables); at most k
//!   pods, i.e. k³/4 NIC ports;
//! - `oversubscription` o divides the capacity of every link above the leaf by o (the tiers
//!   above the leaf carry 1/o of what the ports below can offer);
//! - every IB link runs at the NIC's effective rate; each switch traversed adds
//!   `switch_latency_ns`.
//!
//! For adaptive routing the fabric also has *trunks*: one resource per leaf for all of its
//! uplinks (and one for all links down into it), one per pod for all spine→core links (and
//! core→spine), each of summed capacity.
//!
//! Routes go up to the lowest common tier, then down. Static: at each switch one of its
//! equal-cost links by the seeded hash ([`super::routing::ecmp`]); the core goes down to
//! the spine at the same position in the destination pod. Adaptive: [leaf-up trunk,
//! (pod-up trunk, pod-down trunk), leaf-down trunk].
//!
//! Units: bytes/s, ns.

use petgraph::graph::NodeIndex;
use strata_models::{ClusterSpec, Fabric, Routing};

use super::NetError;
use super::routing::{ecmp, salts};
use super::topology::{FabricTopology, ResId, ResKind, Route, Tier, Vertex, Wiring};

/// A leaf switch and its links.
#[derive(Clone, Debug, Default)]
pub struct Leaf {
    pub pod: u32,
    /// Uplinks grouped by the spine they reach: (spine, up resources, matching down resources).
    pub up: Vec<(u32, Vec<ResId>, Vec<ResId>)>,
    pub up_trunk: ResId,
    pub down_trunk: ResId,
}

/// A spine switch and its uplinks (three tiers only).
#[derive(Clone, Debug, Default)]
pub struct Spine {
    pub pod: u32,
    /// Position j inside its pod: it links to core group j.
    pub pos: u32,
    /// Uplinks grouped by core: (core, up resources, matching down resources).
    pub up: Vec<(u32, Vec<ResId>, Vec<ResId>)>,
}

/// A pod of leaves and spines (three tiers only).
#[derive(Clone, Debug, Default)]
pub struct Pod {
    pub first_spine: u32,
    pub up_trunk: ResId,
    pub down_trunk: ResId,
}

/// A single-switch, fat-tree or rail-optimised fabric.
#[derive(Clone, Debug)]
pub struct FatTree {
    pub fabric: Fabric,
    pub routing: Routing,
    /// Switch tiers above the NICs: 1 (one leaf layer), 2 or 3.
    pub tiers: u32,
    pub leaves: Vec<Leaf>,
    pub spines: Vec<Spine>,
    pub pods: Vec<Pod>,
    /// Leaf of each NIC port, by endpoint.
    pub leaf_of_endpoint: Vec<u32>,
    leaf_salt: Vec<u64>,
    spine_salt: Vec<u64>,
    core_salt: Vec<u64>,
}

impl FabricTopology for FatTree {
    fn name(&self) -> &'static str {
        match self.fabric {
            Fabric::SingleSwitch => "single-switch",
            Fabric::FatTree => "fat-tree",
            _ => "rail-optimized",
        }
    }

    fn route(&self, src: u32, dst: u32, lane: u32) -> Route {
        let (sl, dl) = (self.leaf_of_endpoint[src as usize], self.leaf_of_endpoint[dst as usize]);
        if sl == dl || self.tiers == 1 {
            return Route { res: Vec::new(), switches: 1 };
        }
        match self.routing {
            Routing::Adaptive => self.adaptive(sl, dl),
            Routing::Static => self.hashed(sl, dl, src, dst, lane),
        }
    }

    fn lanes_matter(&self) -> bool {
        self.routing == Routing::Static
    }

    fn trunks(&self) -> Vec<(ResId, Vec<ResId>)> {
        let mut out = Vec::new();
        for l in self.leaves.iter().filter(|l| !l.up.is_empty()) {
            out.push((l.up_trunk, l.up.iter().flat_map(|g| g.1.iter().copied()).collect()));
            out.push((l.down_trunk, l.up.iter().flat_map(|g| g.2.iter().copied()).collect()));
        }
        for (p, pod) in self.pods.iter().enumerate() {
            let spines = || self.spines.iter().filter(|s| s.pod as usize == p);
            out.push((pod.up_trunk, spines().flat_map(|s| s.up.iter().flat_map(|g| g.1.iter().copied())).collect()));
            out.push((pod.down_trunk, spines().flat_map(|s| s.up.iter().flat_map(|g| g.2.iter().copied())).collect()));
        }
        out
    }
}

impl FatTree {
    /// Wires the fabric `cluster.fabric` (single switch, fat-tree or rail-optimised) onto
    /// `w`; `seed` salts the static hash.
    pub fn wire(cluster: &ClusterSpec, seed: u64, w: &mut Wiring) -> Result<FatTree, NetError> {
        let mut f = FatTree {
            fabric: cluster.fabric,
            routing: cluster.routing,
            tiers: 0,
            leaves: Vec::new(),
            spines: Vec::new(),
            pods: Vec::new(),
            leaf_of_endpoint: Vec::new(),
            leaf_salt: Vec::new(),
            spine_salt: Vec::new(),
            core_salt: Vec::new(),
        };
        Builder { f: &mut f, w, leaf_vertex: Vec::new(), spine_vertex: Vec::new() }.fabric(cluster)?;
        let n_spines = f.leaves.iter().flat_map(|l| l.up.iter().map(|g| g.0 + 1)).max().unwrap_or(0) as usize;
        let n_cores = f.spines.iter().flat_map(|s| s.up.iter().map(|g| g.0 + 1)).max().unwrap_or(0) as usize;
        let mut s = salts(seed, &[f.leaves.len(), n_spines, n_cores]).into_iter();
        (f.leaf_salt, f.spine_salt, f.core_salt) = (s.next().unwrap(), s.next().unwrap(), s.next().unwrap());
        Ok(f)
    }

    fn hashed(&self, sl: u32, dl: u32, src: u32, dst: u32, lane: u32) -> Route {
        let mut res = Vec::with_capacity(4);
        let (s_leaf, d_leaf) = (&self.leaves[sl as usize], &self.leaves[dl as usize]);
        let same_pod = self.tiers == 2 || s_leaf.pod == d_leaf.pod;
        // Leaf uplink: any of the leaf's uplinks (flattened over spines).
        let flat: Vec<(usize, usize)> =
            s_leaf.up.iter().enumerate().flat_map(|(g, grp)| (0..grp.1.len()).map(move |i| (g, i))).collect();
        let (g, i) = flat[ecmp(self.leaf_salt[sl as usize], src, dst, lane, flat.len())];
        let spine = s_leaf.up[g].0;
        res.push(s_leaf.up[g].1[i]);
        let down_spine = if same_pod {
            spine
        } else {
            let sp = &self.spines[spine as usize];
            let flat: Vec<(usize, usize)> =
                sp.up.iter().enumerate().flat_map(|(g, grp)| (0..grp.1.len()).map(move |i| (g, i))).collect();
            let (g, i) = flat[ecmp(self.spine_salt[spine as usize], src, dst, lane, flat.len())];
            let core = sp.up[g].0;
            res.push(sp.up[g].1[i]);
            // Core down to the spine at the same position in the destination pod.
            let target = self.pods[d_leaf.pod as usize].first_spine + sp.pos;
            let tsp = &self.spines[target as usize];
            let grp = tsp.up.iter().find(|grp| grp.0 == core).expect("core links every pod's spine j");
            res.push(grp.2[ecmp(self.core_salt[core as usize], src, dst, lane, grp.2.len())]);
            target
        };
        let grp = d_leaf.up.iter().find(|grp| grp.0 == down_spine).expect("spine links every leaf below it");
        res.push(grp.2[ecmp(self.spine_salt[down_spine as usize], src, dst, lane, grp.2.len())]);
        Route { res, switches: if same_pod { 3 } else { 5 } }
    }

    fn adaptive(&self, sl: u32, dl: u32) -> Route {
        let (s_leaf, d_leaf) = (&self.leaves[sl as usize], &self.leaves[dl as usize]);
        let mut res = vec![s_leaf.up_trunk];
        let cross_pod = self.tiers == 3 && s_leaf.pod != d_leaf.pod;
        if cross_pod {
            res.push(self.pods[s_leaf.pod as usize].up_trunk);
            res.push(self.pods[d_leaf.pod as usize].down_trunk);
        }
        res.push(d_leaf.down_trunk);
        Route { res, switches: if cross_pod { 5 } else { 3 } }
    }
}

/// The fabric under construction and the graph it is wired into.
struct Builder<'f, 'w, 't> {
    f: &'f mut FatTree,
    w: &'w mut Wiring<'t>,
    leaf_vertex: Vec<NodeIndex>,
    spine_vertex: Vec<NodeIndex>,
}

impl Builder<'_, '_, '_> {
    /// Assigns every NIC port to a leaf; returns the leaf count.
    fn assign_leaves(&mut self, cluster: &ClusterSpec, half: u32) -> u32 {
        let (nodes, nics) = (cluster.nodes, cluster.nics_per_node);
        let mut leaf_of = Vec::with_capacity((nodes * nics) as usize);
        let count = match cluster.fabric {
            Fabric::FatTree => {
                leaf_of.extend((0..nodes * nics).map(|e| e / half));
                (nodes * nics).div_ceil(half)
            }
            Fabric::RailOptimized => {
                let npu = cluster.nodes_per_unit;
                let sub = npu.min(nodes).div_ceil(half);
                for n in 0..nodes {
                    let (unit, pos) = (n / npu, n % npu);
                    for r in 0..nics {
                        leaf_of.push((unit * nics + r) * sub + pos / half);
                    }
                }
                nodes.div_ceil(npu) * nics * sub
            }
            _ => {
                leaf_of.resize((nodes * nics) as usize, 0);
                1
            }
        };
        self.f.leaf_of_endpoint = leaf_of;
        count
    }

    fn fabric(&mut self, cluster: &ClusterSpec) -> Result<(), NetError> {
        let k = cluster.switch_radix;
        let half = k / 2;
        let n_leaves = self.assign_leaves(cluster, half);
        let lat = cluster.switch_latency_ns;
        self.leaf_vertex = (0..n_leaves).map(|i| self.w.switch(Vertex::Leaf(i))).collect();
        for e in 0..self.f.leaf_of_endpoint.len() {
            let leaf = self.leaf_vertex[self.f.leaf_of_endpoint[e] as usize];
            self.w.attach_nic(e as u32, leaf, lat);
        }
        self.f.leaves = vec![Leaf::default(); n_leaves as usize];
        let up_cap = self.w.nic_bytes_per_s() / cluster.oversubscription;
        if n_leaves == 1 || cluster.fabric == Fabric::SingleSwitch {
            self.f.tiers = 1;
        } else if n_leaves <= k {
            self.f.tiers = 2;
            let n_spines = (n_leaves * half).div_ceil(k);
            self.spine_vertex = (0..n_spines).map(|i| self.w.switch(Vertex::Spine(i))).collect();
            for leaf in 0..n_leaves {
                self.leaf_uplinks(leaf, half, 0, n_spines, up_cap, lat);
            }
        } else {
            let pods = n_leaves.div_ceil(half);
            if pods > k {
                let endpoints = self.f.leaf_of_endpoint.len() as u64;
                return Err(NetError::TooLarge { endpoints, radix: k, max: (k as u64).pow(3) / 4 });
            }
            self.f.tiers = 3;
            self.three_tiers(n_leaves, pods, half, up_cap, lat);
        }
        self.trunks(up_cap, half);
        Ok(())
    }

    /// Deals a leaf's `half` uplinks round-robin over spines [first, first + count).
    fn leaf_uplinks(&mut self, leaf: u32, half: u32, first: u32, count: u32, cap: f64, lat: u64) {
        let mut groups: Vec<(u32, Vec<ResId>, Vec<ResId>)> =
            (first..first + count).map(|s| (s, vec![], vec![])).collect();
        for j in 0..half {
            let g = (j % count) as usize;
            let (a, b) = (self.leaf_vertex[leaf as usize], self.spine_vertex[groups[g].0 as usize]);
            let kinds = (ResKind::Fabric(Tier::LeafUp), ResKind::Fabric(Tier::LeafDown));
            let (up, down) = self.w.duplex(a, b, cap, kinds, lat);
            groups[g].1.push(up);
            groups[g].2.push(down);
        }
        self.f.leaves[leaf as usize].up = groups;
    }

    fn three_tiers(&mut self, n_leaves: u32, pods: u32, half: u32, cap: f64, lat: u64) {
        let n_spines = pods * half;
        self.spine_vertex = (0..n_spines).map(|i| self.w.switch(Vertex::Spine(i))).collect();
        let per_group = pods.div_ceil(2);
        let cores: Vec<NodeIndex> = (0..half * per_group).map(|i| self.w.switch(Vertex::Core(i))).collect();
        for leaf in 0..n_leaves {
            let pod = leaf / half;
            self.f.leaves[leaf as usize].pod = pod;
            self.leaf_uplinks(leaf, half, pod * half, half, cap, lat);
        }
        for s in 0..n_spines {
            let (pod, pos) = (s / half, s % half);
            let mut groups: Vec<(u32, Vec<ResId>, Vec<ResId>)> =
                (0..per_group).map(|c| (pos * per_group + c, vec![], vec![])).collect();
            for j in 0..half {
                let g = (j % per_group) as usize;
                let (a, b) = (self.spine_vertex[s as usize], cores[groups[g].0 as usize]);
                let kinds = (ResKind::Fabric(Tier::SpineUp), ResKind::Fabric(Tier::SpineDown));
                let (up, down) = self.w.duplex(a, b, cap, kinds, lat);
                groups[g].1.push(up);
                groups[g].2.push(down);
            }
            self.f.spines.push(Spine { pod, pos, up: groups });
        }
        self.f.pods = (0..pods).map(|p| Pod { first_spine: p * half, ..Pod::default() }).collect();
    }

    /// Trunks for adaptive routing: summed capacity of parallel links toward the next tier.
    fn trunks(&mut self, up_cap: f64, half: u32) {
        let trunk_cap = if self.f.tiers >= 2 { up_cap * half as f64 } else { up_cap };
        for leaf in 0..self.f.leaves.len() {
            self.f.leaves[leaf].up_trunk = self.w.resource(trunk_cap, ResKind::Trunk(Tier::LeafUp));
            self.f.leaves[leaf].down_trunk = self.w.resource(trunk_cap, ResKind::Trunk(Tier::LeafDown));
        }
        for pod in 0..self.f.pods.len() {
            let cap = up_cap * (half * half) as f64;
            self.f.pods[pod].up_trunk = self.w.resource(cap, ResKind::Trunk(Tier::SpineUp));
            self.f.pods[pod].down_trunk = self.w.resource(cap, ResKind::Trunk(Tier::SpineDown));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use petgraph::visit::EdgeRef;

    use super::*;
    use crate::net::routing::Router;
    use crate::net::topology::Topology;

    pub(crate) fn cluster(preset: &str, nodes: u32, fabric: Fabric) -> ClusterSpec {
        let mut c = ClusterSpec::preset(preset).unwrap();
        c.nodes = nodes;
        c.fabric = fabric;
        c.routing = Routing::Adaptive;
        c
    }

    /// The topology of `c` and its fat-tree, built apart so that tests can see both.
    fn build(c: &ClusterSpec) -> Result<(Topology, FatTree), NetError> {
        let mut t = Topology::inside_nodes(c)?;
        let f = FatTree::wire(c, 0, &mut t.wiring())?;
        Ok((t, f))
    }

    fn counts(t: &Topology, f: &FatTree) -> (usize, usize, usize) {
        let cores = t.graph.node_weights().filter(|v| matches!(v, Vertex::Core(_))).count();
        (f.leaves.len(), t.graph.node_weights().filter(|v| matches!(v, Vertex::Spine(_))).count(), cores)
    }

    #[test]
    fn superpod_switch_counts() {
        // DGX H100 SuperPOD reference architecture: 1 SU 8 leaves + 4 spines; 4 SU 32 + 16;
        // 16 SU 128/128/64; 64 SU 512/512/256 (32-node units, 64-port switches).
        let (t, f) = build(&cluster("dgx-h100", 32, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t, &f), f.tiers), ((8, 4, 0), 2));
        let (t, f) = build(&cluster("dgx-h100", 128, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t, &f), f.tiers), ((32, 16, 0), 2));
        let (t, f) = build(&cluster("dgx-h100", 512, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t, &f), f.tiers), ((128, 128, 64), 3));
        let (t, f) = build(&cluster("dgx-h100", 2048, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t, &f), f.tiers), ((512, 512, 256), 3));
    }

    #[test]
    fn rails_share_a_leaf_inside_a_unit() {
        let (t, f) = build(&cluster("dgx-h100", 64, Fabric::RailOptimized)).unwrap();
        let leaf = |n, r| f.leaf_of_endpoint[t.endpoint(n, r) as usize];
        assert_eq!(leaf(0, 3), leaf(31, 3));
        assert_ne!(leaf(0, 3), leaf(0, 4));
        assert_ne!(leaf(0, 3), leaf(32, 3));
    }

    #[test]
    fn k_ary_fat_tree_sizes_and_limit() {
        // k = 8: 2 tiers up to k²/2 = 32 ports, 3 tiers up to k³/4 = 128.
        let mut c = cluster("dgx-h100", 4, Fabric::FatTree);
        c.switch_radix = 8;
        let (t, f) = build(&c).unwrap();
        assert_eq!((counts(&t, &f), f.tiers), ((8, 4, 0), 2));
        c.nodes = 16;
        let (t, f) = build(&c).unwrap();
        assert_eq!((counts(&t, &f), f.tiers), ((32, 32, 16), 3));
        c.nodes = 17;
        assert!(matches!(build(&c), Err(NetError::TooLarge { max: 128, .. })));
        assert!(matches!(Topology::new(&c, 0), Err(NetError::TooLarge { max: 128, .. })));
    }

    #[test]
    fn every_link_is_full_duplex_with_capacity() {
        let mut c = cluster("dgx-a100", 64, Fabric::RailOptimized);
        c.oversubscription = 2.0;
        let (t, f) = build(&c).unwrap();
        for e in t.graph.edge_indices() {
            let (a, b) = t.graph.edge_endpoints(e).unwrap();
            assert!(t.graph.find_edge(b, a).is_some());
        }
        let up = f.leaves[0].up[0].1[0];
        assert_eq!(t.resources[up as usize].cap_bytes_per_s, 12e9);
        assert_eq!(t.resources[t.nic_up(0) as usize].cap_bytes_per_s, 24e9);
    }

    fn topo(nodes: u32, routing: Routing, seed: u64) -> Topology {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = nodes;
        c.fabric = Fabric::RailOptimized;
        c.routing = routing;
        Topology::new(&c, seed).unwrap()
    }

    /// Static paths are walks in the graph: consecutive resources share a vertex.
    #[test]
    fn static_paths_are_shortest_walks() {
        let t = topo(512, Routing::Static, 1);
        let mut r = Router::new(&t);
        let owner: BTreeMap<ResId, (usize, usize)> = t
            .graph
            .edge_references()
            .filter_map(|e| e.weight().res.map(|id| (id, (e.source().index(), e.target().index()))))
            .collect();
        for (src, dst, hops) in [(0, 8, 1), (0, 1, 3), (0, t.endpoint(200, 0), 5), (0, t.endpoint(3, 0), 1)] {
            let id = r.route(&t, src, dst, 5);
            let p = r.path(id).clone();
            assert_eq!(p.latency_ns, hops * 200);
            for w in p.res.windows(2) {
                assert_eq!(owner[&w[0]].1, owner[&w[1]].0, "{p:?}");
            }
            let start = owner[&p.res[0]].0;
            let goal = owner[p.res.last().unwrap()].1;
            let goal = petgraph::graph::NodeIndex::new(goal);
            let bfs = petgraph::algo::dijkstra(&t.graph, petgraph::graph::NodeIndex::new(start), Some(goal), |_| 1);
            assert_eq!(bfs[&goal], p.res.len());
        }
    }

    #[test]
    fn paths_are_cached_and_seeded() {
        let t = topo(128, Routing::Static, 7);
        let mut a = Router::new(&t);
        let mut b = Router::new(&t);
        let (x, y) = (t.endpoint(0, 0), t.endpoint(64, 0));
        let pa: Vec<_> = (0..16)
            .map(|lane| {
                let id = a.route(&t, x, y, lane);
                a.path(id).clone()
            })
            .collect();
        let pb: Vec<_> = (0..16)
            .map(|lane| {
                let id = b.route(&t, x, y, lane);
                b.path(id).clone()
            })
            .collect();
        assert_eq!(pa, pb);
        assert_eq!(a.route(&t, x, y, 3), a.route(&t, x, y, 3));
        let distinct: std::collections::BTreeSet<_> = pa.iter().map(|p| p.res[1]).collect();
        assert!(distinct.len() > 1, "lanes should spread over uplinks");
        let t = topo(128, Routing::Adaptive, 7);
        let mut ad = Router::new(&t);
        assert_eq!(ad.route(&t, x, y, 0), ad.route(&t, x, y, 9));
        assert_eq!(ad.path(0).res.len(), 4);
    }
}
