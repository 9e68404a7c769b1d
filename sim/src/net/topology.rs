//! The cluster as a directed graph (petgraph): GPUs, NVSwitch and NICs inside each node,
//! and the InfiniBand switch fabric between nodes. Every physical link is full duplex and
//! appears as two directed edges; each directed edge owns a *resource* (a capacity in
//! bytes/s that the flow solver shares out) and a latency.
//!
//! Inside a node: GPU ⇄ NVSwitch at the GPU's effective NVLink bandwidth; NIC ⇄ leaf at the
//! NIC's effective bandwidth (min of NIC and PCIe, see [`super::node`]). GPUs reach their
//! NIC through a zero-cost attachment edge (the PCIe limit is folded into the NIC port).
//!
//! The fabric is a folded Clos of radix-k switches (k = `cluster.switch_radix`, h = k/2):
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
//! For adaptive routing the topology also defines *trunks*: one resource per leaf for all of
//! its uplinks (and one for all links down into it), one per pod for all spine→core links
//! (and core→spine), each of summed capacity.
//!
//! Units: bytes/s, ns.

use petgraph::graph::{DiGraph, NodeIndex};
use strata_models::{ClusterSpec, Fabric};

use super::NetError;
use super::node::NodeNet;

/// Index of a resource (a directed link or a trunk) in [`Topology::resources`].
pub type ResId = u32;

/// A vertex of the cluster graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vertex {
    Gpu { node: u32, local: u32 },
    NvSwitch { node: u32 },
    Nic { node: u32, rail: u32 },
    Leaf(u32),
    Spine(u32),
    Core(u32),
}

/// A direction between two switch tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Leaf → spine.
    LeafUp,
    /// Spine → leaf.
    LeafDown,
    /// Spine → core.
    SpineUp,
    /// Core → spine.
    SpineDown,
}

/// What a resource is; decides how symmetric copies share it (see `fabric`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResKind {
    NvlinkUp,
    NvlinkDown,
    NicUp,
    NicDown,
    /// A physical switch-to-switch link.
    Fabric(Tier),
    /// A folded bundle of parallel uplinks or downlinks (adaptive routing): a leaf's, or a
    /// pod's spines'.
    Trunk(Tier),
}

impl ResKind {
    /// Node-local resources and NIC ports belong to one node; the rest is the shared fabric.
    pub fn is_fabric(self) -> bool {
        matches!(self, ResKind::Fabric(_) | ResKind::Trunk(_))
    }
}

/// A capacity the flow solver shares out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resource {
    pub cap_bytes_per_s: f64,
    pub kind: ResKind,
}

/// Edge weight: the resource a directed link owns (none for GPU–NIC attachments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub res: Option<ResId>,
    pub latency_ns: u64,
}

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

/// The cluster graph and its resources.
#[derive(Clone, Debug)]
pub struct Topology {
    pub graph: DiGraph<Vertex, Link>,
    pub resources: Vec<Resource>,
    pub node: NodeNet,
    pub nodes: u32,
    /// Switch tiers above the NICs: 1 (one leaf layer), 2 or 3.
    pub tiers: u32,
    pub switch_latency_ns: u64,
    pub leaves: Vec<Leaf>,
    pub spines: Vec<Spine>,
    pub pods: Vec<Pod>,
    /// Leaf of each NIC port, by endpoint `node · nics_per_node + rail`.
    pub leaf_of_endpoint: Vec<u32>,
    gpu_up: Vec<ResId>,
    gpu_down: Vec<ResId>,
    nic_up: Vec<ResId>,
    nic_down: Vec<ResId>,
    gpu_vertex: Vec<NodeIndex>,
    nic_vertex: Vec<NodeIndex>,
    /// Resources per kind, for [`Topology::count`].
    kind_counts: Vec<(ResKind, usize)>,
}

impl Topology {
    /// Builds the topology of `cluster`.
    pub fn new(cluster: &ClusterSpec) -> Result<Topology, NetError> {
        let node = NodeNet::from_cluster(cluster)?;
        let mut b = Builder::new(node, cluster.nodes, cluster.switch_latency_ns);
        b.nodes_inside();
        if cluster.nodes > 1 || cluster.nics_per_node > 0 {
            b.fabric(cluster)?;
        }
        let mut counts: std::collections::BTreeMap<ResKind, usize> = std::collections::BTreeMap::new();
        for r in &b.t.resources {
            *counts.entry(r.kind).or_default() += 1;
        }
        b.t.kind_counts = counts.into_iter().collect();
        Ok(b.t)
    }

    /// NVLink resource from a GPU into the NVSwitch.
    pub fn nvlink_up(&self, node: u32, local: u32) -> ResId {
        self.gpu_up[(node * self.node.gpus_per_node + local) as usize]
    }

    /// NVLink resource from the NVSwitch into a GPU.
    pub fn nvlink_down(&self, node: u32, local: u32) -> ResId {
        self.gpu_down[(node * self.node.gpus_per_node + local) as usize]
    }

    /// Endpoint index of a NIC port.
    pub fn endpoint(&self, node: u32, rail: u32) -> u32 {
        node * self.node.nics_per_node + rail
    }

    /// NIC → leaf resource of an endpoint.
    pub fn nic_up(&self, endpoint: u32) -> ResId {
        self.nic_up[endpoint as usize]
    }

    /// Leaf → NIC resource of an endpoint.
    pub fn nic_down(&self, endpoint: u32) -> ResId {
        self.nic_down[endpoint as usize]
    }

    /// How many resources there are of `kind` (the size of a switch tier).
    pub fn count(&self, kind: ResKind) -> usize {
        self.kind_counts.iter().find(|(k, _)| *k == kind).map_or(0, |&(_, n)| n)
    }

    /// Graph vertex of a GPU.
    pub fn gpu_vertex(&self, node: u32, local: u32) -> NodeIndex {
        self.gpu_vertex[(node * self.node.gpus_per_node + local) as usize]
    }

    /// Graph vertex of a NIC port.
    pub fn nic_vertex(&self, endpoint: u32) -> NodeIndex {
        self.nic_vertex[endpoint as usize]
    }
}

struct Builder {
    t: Topology,
    cap_nic: f64,
    leaf_vertex: Vec<NodeIndex>,
    spine_vertex: Vec<NodeIndex>,
}

impl Builder {
    fn new(node: NodeNet, nodes: u32, switch_latency_ns: u64) -> Builder {
        let cap_nic = node.nic_gb_per_s * 1e9;
        Builder {
            t: Topology {
                graph: DiGraph::new(),
                resources: Vec::new(),
                node,
                nodes,
                tiers: 0,
                switch_latency_ns,
                leaves: Vec::new(),
                spines: Vec::new(),
                pods: Vec::new(),
                leaf_of_endpoint: Vec::new(),
                gpu_up: Vec::new(),
                gpu_down: Vec::new(),
                nic_up: Vec::new(),
                nic_down: Vec::new(),
                gpu_vertex: Vec::new(),
                nic_vertex: Vec::new(),
                kind_counts: Vec::new(),
            },
            cap_nic,
            leaf_vertex: Vec::new(),
            spine_vertex: Vec::new(),
        }
    }

    fn resource(&mut self, cap_bytes_per_s: f64, kind: ResKind) -> ResId {
        assert!(cap_bytes_per_s > 0.0 && cap_bytes_per_s.is_finite(), "capacity {cap_bytes_per_s}");
        self.t.resources.push(Resource { cap_bytes_per_s, kind });
        (self.t.resources.len() - 1) as ResId
    }

    /// A full-duplex link a ⇄ b: returns (a→b, b→a) resources.
    fn duplex(&mut self, a: NodeIndex, b: NodeIndex, cap: f64, kinds: (ResKind, ResKind), lat: u64) -> (ResId, ResId) {
        let up = self.resource(cap, kinds.0);
        let down = self.resource(cap, kinds.1);
        self.t.graph.add_edge(a, b, Link { res: Some(up), latency_ns: lat });
        self.t.graph.add_edge(b, a, Link { res: Some(down), latency_ns: lat });
        (up, down)
    }

    fn nodes_inside(&mut self) {
        let (gpn, nics) = (self.t.node.gpus_per_node, self.t.node.nics_per_node);
        let nvlink = self.t.node.nvlink_gb_per_s * 1e9;
        for n in 0..self.t.nodes {
            let nvs = self.t.graph.add_node(Vertex::NvSwitch { node: n });
            let mut gpus = Vec::new();
            for l in 0..gpn {
                let g = self.t.graph.add_node(Vertex::Gpu { node: n, local: l });
                let (up, down) = self.duplex(g, nvs, nvlink, (ResKind::NvlinkUp, ResKind::NvlinkDown), 0);
                self.t.gpu_up.push(up);
                self.t.gpu_down.push(down);
                self.t.gpu_vertex.push(g);
                gpus.push(g);
            }
            for r in 0..nics {
                let v = self.t.graph.add_node(Vertex::Nic { node: n, rail: r });
                self.t.nic_vertex.push(v);
                for (l, &g) in gpus.iter().enumerate() {
                    if l as u32 % nics == r {
                        self.t.graph.add_edge(g, v, Link { res: None, latency_ns: 0 });
                        self.t.graph.add_edge(v, g, Link { res: None, latency_ns: 0 });
                    }
                }
            }
        }
    }

    /// Assigns every NIC port to a leaf; returns the leaf count.
    fn assign_leaves(&mut self, cluster: &ClusterSpec, half: u32) -> u32 {
        let (nodes, nics) = (cluster.nodes, cluster.nics_per_node);
        let mut leaf_of = Vec::with_capacity((nodes * nics) as usize);
        let count = match cluster.fabric {
            Fabric::SingleSwitch => {
                leaf_of.resize((nodes * nics) as usize, 0);
                1
            }
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
        };
        self.t.leaf_of_endpoint = leaf_of;
        count
    }

    fn fabric(&mut self, cluster: &ClusterSpec) -> Result<(), NetError> {
        let k = cluster.switch_radix;
        let half = k / 2;
        let n_leaves = self.assign_leaves(cluster, half);
        let lat = cluster.switch_latency_ns;
        self.leaf_vertex = (0..n_leaves).map(|i| self.t.graph.add_node(Vertex::Leaf(i))).collect();
        for e in 0..self.t.leaf_of_endpoint.len() {
            let leaf = self.leaf_vertex[self.t.leaf_of_endpoint[e] as usize];
            let (up, down) =
                self.duplex(self.t.nic_vertex[e], leaf, self.cap_nic, (ResKind::NicUp, ResKind::NicDown), lat);
            self.t.nic_up.push(up);
            self.t.nic_down.push(down);
        }
        self.t.leaves = vec![Leaf::default(); n_leaves as usize];
        let up_cap = self.cap_nic / cluster.oversubscription;
        if n_leaves == 1 || cluster.fabric == Fabric::SingleSwitch {
            self.t.tiers = 1;
        } else if n_leaves <= k {
            self.t.tiers = 2;
            let n_spines = (n_leaves * half).div_ceil(k);
            self.spine_vertex = (0..n_spines).map(|i| self.t.graph.add_node(Vertex::Spine(i))).collect();
            for leaf in 0..n_leaves {
                self.leaf_uplinks(leaf, half, 0, n_spines, up_cap, lat);
            }
        } else {
            let pods = n_leaves.div_ceil(half);
            if pods > k {
                let endpoints = self.t.leaf_of_endpoint.len() as u64;
                return Err(NetError::TooLarge { endpoints, radix: k, max: (k as u64).pow(3) / 4 });
            }
            self.t.tiers = 3;
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
            let (up, down) = self.duplex(a, b, cap, kinds, lat);
            groups[g].1.push(up);
            groups[g].2.push(down);
        }
        self.t.leaves[leaf as usize].up = groups;
    }

    fn three_tiers(&mut self, n_leaves: u32, pods: u32, half: u32, cap: f64, lat: u64) {
        let n_spines = pods * half;
        self.spine_vertex = (0..n_spines).map(|i| self.t.graph.add_node(Vertex::Spine(i))).collect();
        let per_group = pods.div_ceil(2);
        let cores: Vec<NodeIndex> = (0..half * per_group).map(|i| self.t.graph.add_node(Vertex::Core(i))).collect();
        for leaf in 0..n_leaves {
            let pod = leaf / half;
            self.t.leaves[leaf as usize].pod = pod;
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
                let (up, down) = self.duplex(a, b, cap, kinds, lat);
                groups[g].1.push(up);
                groups[g].2.push(down);
            }
            self.t.spines.push(Spine { pod, pos, up: groups });
        }
        self.t.pods = (0..pods).map(|p| Pod { first_spine: p * half, ..Pod::default() }).collect();
    }

    /// Trunks for adaptive routing: summed capacity of parallel links toward the next tier.
    fn trunks(&mut self, up_cap: f64, half: u32) {
        let trunk_cap = if self.t.tiers >= 2 { up_cap * half as f64 } else { up_cap };
        for leaf in 0..self.t.leaves.len() {
            self.t.leaves[leaf].up_trunk = self.resource(trunk_cap, ResKind::Trunk(Tier::LeafUp));
            self.t.leaves[leaf].down_trunk = self.resource(trunk_cap, ResKind::Trunk(Tier::LeafDown));
        }
        for pod in 0..self.t.pods.len() {
            let cap = up_cap * (half * half) as f64;
            self.t.pods[pod].up_trunk = self.resource(cap, ResKind::Trunk(Tier::SpineUp));
            self.t.pods[pod].down_trunk = self.resource(cap, ResKind::Trunk(Tier::SpineDown));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::Routing;

    pub(crate) fn cluster(preset: &str, nodes: u32, fabric: Fabric) -> ClusterSpec {
        let mut c = ClusterSpec::preset(preset).unwrap();
        c.nodes = nodes;
        c.fabric = fabric;
        c.routing = Routing::Adaptive;
        c
    }

    fn counts(t: &Topology) -> (usize, usize, usize) {
        let cores = t.graph.node_weights().filter(|v| matches!(v, Vertex::Core(_))).count();
        (t.leaves.len(), t.graph.node_weights().filter(|v| matches!(v, Vertex::Spine(_))).count(), cores)
    }

    #[test]
    fn superpod_switch_counts() {
        // DGX H100 SuperPOD reference architecture: 1 SU 8 leaves + 4 spines; 4 SU 32 + 16;
        // 16 SU 128/128/64; 64 SU 512/512/256 (32-node units, 64-port switches).
        let t = Topology::new(&cluster("dgx-h100", 32, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t), t.tiers), ((8, 4, 0), 2));
        let t = Topology::new(&cluster("dgx-h100", 128, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t), t.tiers), ((32, 16, 0), 2));
        let t = Topology::new(&cluster("dgx-h100", 512, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t), t.tiers), ((128, 128, 64), 3));
        let t = Topology::new(&cluster("dgx-h100", 2048, Fabric::RailOptimized)).unwrap();
        assert_eq!((counts(&t), t.tiers), ((512, 512, 256), 3));
    }

    #[test]
    fn rails_share_a_leaf_inside_a_unit() {
        let t = Topology::new(&cluster("dgx-h100", 64, Fabric::RailOptimized)).unwrap();
        let leaf = |n, r| t.leaf_of_endpoint[t.endpoint(n, r) as usize];
        assert_eq!(leaf(0, 3), leaf(31, 3));
        assert_ne!(leaf(0, 3), leaf(0, 4));
        assert_ne!(leaf(0, 3), leaf(32, 3));
    }

    #[test]
    fn k_ary_fat_tree_sizes_and_limit() {
        // k = 8: 2 tiers up to k²/2 = 32 ports, 3 tiers up to k³/4 = 128.
        let mut c = cluster("dgx-h100", 4, Fabric::FatTree);
        c.switch_radix = 8;
        let t = Topology::new(&c).unwrap();
        assert_eq!((counts(&t), t.tiers), ((8, 4, 0), 2));
        c.nodes = 16;
        let t = Topology::new(&c).unwrap();
        assert_eq!((counts(&t), t.tiers), ((32, 32, 16), 3));
        c.nodes = 17;
        assert!(matches!(Topology::new(&c), Err(NetError::TooLarge { max: 128, .. })));
    }

    #[test]
    fn every_link_is_full_duplex_with_capacity() {
        let mut c = cluster("dgx-a100", 64, Fabric::RailOptimized);
        c.oversubscription = 2.0;
        let t = Topology::new(&c).unwrap();
        for e in t.graph.edge_indices() {
            let (a, b) = t.graph.edge_endpoints(e).unwrap();
            assert!(t.graph.find_edge(b, a).is_some());
        }
        let leaf = &t.leaves[0];
        let up = leaf.up[0].1[0];
        assert_eq!(t.resources[up as usize].cap_bytes_per_s, 12e9);
        assert_eq!(t.resources[t.nic_up(0) as usize].cap_bytes_per_s, 24e9);
    }
}
