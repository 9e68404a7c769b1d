//! The cluster as a directed graph (petgraph): GPUs, NVSwitch and NICs inside each node,
//! and a switch fabric between the NIC ports behind one trait, [`FabricTopology`]. Every
//! physical link is full duplex and appears as two directed edges; each directed edge owns
//! a *resource* (a capacity in bytes/s that the flow solver shares out) and a latency.
//!
//! Shared by every fabric (this module): inside a node, GPU ⇄ NVSwitch at the GPU's
//! effective NVLink bandwidth; GPUs reach their NIC through a zero-cost attachment edge (the
//! PCIe limit is folded into the NIC port); NIC ⇄ first switch at the NIC's effective
//! bandwidth (min of NIC and PCIe, see [`super::node`]), cabled by the fabric with
//! [`Wiring::attach_nic`]. NIC ports are *endpoints*, numbered `node · nics_per_node +
//! rail`.
//!
//! A fabric (each in its own module, e.g. [`super::fat_tree`]) adds its switches and
//! switch-to-switch links through [`Wiring`] and answers `route(src, dst, lane)`: the
//! resources strictly between the source NIC port and the destination NIC port, and how many
//! switches the path crosses (each adds `switch_latency_ns`). The router
//! ([`super::routing`]) puts the two NIC ports around it, interns and caches the path; the
//! solver only ever sees resources. A cluster without NIC ports has no fabric.
//!
//! Units: bytes/s, ns.

use petgraph::graph::{DiGraph, NodeIndex};
use strata_models::ClusterSpec;

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

/// The switch part of a path between two NIC ports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Route {
    /// Resources in order after the source's NIC port and before the destination's (empty
    /// when both ports hang off one switch).
    pub res: Vec<ResId>,
    /// Switches traversed (≥ 1 between distinct ports).
    pub switches: u32,
}

/// A switch fabric between NIC ports: its switches and links (added to the graph through
/// [`Wiring`] when it is built), and its routes.
///
/// Contract: `route` is a pure function of its arguments and of what the fabric was built
/// from (cluster and seed), so the same seed gives the same paths; `src != dst` are
/// endpoints of the cluster; when `lanes_matter()` is false the route does not depend on
/// `lane` (the router then caches it once per pair).
pub trait FabricTopology: std::fmt::Debug + Send + Sync {
    /// The fabric's name as a scenario writes it (`cluster.fabric`).
    fn name(&self) -> &'static str;
    /// The route from NIC port `src` to NIC port `dst` for hash lane `lane` (an NCCL
    /// channel: each is its own QP, so its own ECMP hash).
    fn route(&self, src: u32, dst: u32, lane: u32) -> Route;
    /// Whether `lane` can change a route: true under static ECMP, false under adaptive
    /// routing, where parallel links act as one trunk.
    fn lanes_matter(&self) -> bool;
    /// Each trunk resource and the physical link resources it folds (so a what-if on a link
    /// reaches the trunks adaptive routing uses, [`super::faults`]). None by default.
    fn trunks(&self) -> Vec<(ResId, Vec<ResId>)> {
        Vec::new()
    }
}

/// The fabric of a cluster without NIC ports (one node): nothing to route.
#[derive(Debug)]
struct Detached;

impl FabricTopology for Detached {
    fn name(&self) -> &'static str {
        "none"
    }

    fn route(&self, src: u32, dst: u32, _lane: u32) -> Route {
        unreachable!("route {src} → {dst} on a cluster without NIC ports")
    }

    fn lanes_matter(&self) -> bool {
        false
    }
}

/// The cluster graph and its resources.
#[derive(Debug)]
pub struct Topology {
    pub graph: DiGraph<Vertex, Link>,
    pub resources: Vec<Resource>,
    pub node: NodeNet,
    pub nodes: u32,
    pub switch_latency_ns: u64,
    fabric: Box<dyn FabricTopology>,
    gpu_up: Vec<ResId>,
    gpu_down: Vec<ResId>,
    nic_up: Vec<ResId>,
    nic_down: Vec<ResId>,
    gpu_vertex: Vec<NodeIndex>,
    nic_vertex: Vec<NodeIndex>,
    /// Resources per kind, for [`Topology::count`].
    kind_counts: Vec<(ResKind, usize)>,
    /// Resources that are down (a what-if, [`super::faults`]); empty when none is.
    pub down: Vec<bool>,
}

impl Topology {
    /// Builds the topology of `cluster` with the fabric it names; `seed` salts the
    /// fabric's static hashes.
    pub fn new(cluster: &ClusterSpec, seed: u64) -> Result<Topology, NetError> {
        let mut t = Topology::inside_nodes(cluster)?;
        if cluster.nodes > 1 || cluster.nics_per_node > 0 {
            t.fabric = super::wire_fabric(cluster, seed, &mut Wiring { t: &mut t })?;
            debug_assert_eq!(t.nic_up.len(), t.nic_vertex.len(), "{}: every NIC port is cabled", t.fabric.name());
        }
        t.count_kinds();
        Ok(t)
    }

    /// The nodes of `cluster` without a fabric: GPUs, NVSwitch, NIC ports (for fabric
    /// builders and their tests; [`Topology::new`] is the way to a whole topology).
    pub fn inside_nodes(cluster: &ClusterSpec) -> Result<Topology, NetError> {
        cluster.check().map_err(NetError::Cluster)?;
        let node = NodeNet::from_cluster(cluster)?;
        let mut t = Topology {
            graph: DiGraph::new(),
            resources: Vec::new(),
            node,
            nodes: cluster.nodes,
            switch_latency_ns: cluster.switch_latency_ns,
            fabric: Box::new(Detached),
            gpu_up: Vec::new(),
            gpu_down: Vec::new(),
            nic_up: Vec::new(),
            nic_down: Vec::new(),
            gpu_vertex: Vec::new(),
            nic_vertex: Vec::new(),
            kind_counts: Vec::new(),
            down: Vec::new(),
        };
        t.wire_nodes();
        Ok(t)
    }

    /// A builder handle on this topology's graph.
    pub fn wiring(&mut self) -> Wiring<'_> {
        Wiring { t: self }
    }

    /// The switch fabric.
    pub fn fabric(&self) -> &dyn FabricTopology {
        self.fabric.as_ref()
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

    /// NIC → switch resource of an endpoint.
    pub fn nic_up(&self, endpoint: u32) -> ResId {
        self.nic_up[endpoint as usize]
    }

    /// Switch → NIC resource of an endpoint.
    pub fn nic_down(&self, endpoint: u32) -> ResId {
        self.nic_down[endpoint as usize]
    }

    /// Whether resource `r` is down (a what-if).
    pub fn is_down(&self, r: ResId) -> bool {
        self.down.get(r as usize).copied().unwrap_or(false)
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

    fn count_kinds(&mut self) {
        let mut counts: std::collections::BTreeMap<ResKind, usize> = std::collections::BTreeMap::new();
        for r in &self.resources {
            *counts.entry(r.kind).or_default() += 1;
        }
        self.kind_counts = counts.into_iter().collect();
    }

    /// GPUs on an NVSwitch and NIC ports, node by node; GPU l uses NIC l mod nics.
    fn wire_nodes(&mut self) {
        let (gpn, nics) = (self.node.gpus_per_node, self.node.nics_per_node);
        let nvlink = self.node.nvlink_gb_per_s * 1e9;
        for n in 0..self.nodes {
            let nvs = self.graph.add_node(Vertex::NvSwitch { node: n });
            let mut gpus = Vec::new();
            for l in 0..gpn {
                let g = self.graph.add_node(Vertex::Gpu { node: n, local: l });
                let (up, down) = self.wiring().duplex(g, nvs, nvlink, (ResKind::NvlinkUp, ResKind::NvlinkDown), 0);
                self.gpu_up.push(up);
                self.gpu_down.push(down);
                self.gpu_vertex.push(g);
                gpus.push(g);
            }
            for r in 0..nics {
                let v = self.graph.add_node(Vertex::Nic { node: n, rail: r });
                self.nic_vertex.push(v);
                for (l, &g) in gpus.iter().enumerate() {
                    if l as u32 % nics == r {
                        self.graph.add_edge(g, v, Link { res: None, latency_ns: 0 });
                        self.graph.add_edge(v, g, Link { res: None, latency_ns: 0 });
                    }
                }
            }
        }
    }
}

/// What a fabric builder may do to the topology: add switches, resources and links, and
/// cable the NIC ports (each exactly once, in endpoint order). Resource ids are handed out
/// in call order, and the solver's float sums follow resource order, so a builder must make
/// its calls in a fixed order.
pub struct Wiring<'a> {
    t: &'a mut Topology,
}

impl Wiring<'_> {
    /// The node the fabric connects (NIC count and effective NIC bandwidth).
    pub fn node(&self) -> &NodeNet {
        &self.t.node
    }

    /// Number of NIC ports (endpoints).
    pub fn endpoints(&self) -> u32 {
        self.t.nic_vertex.len() as u32
    }

    /// Effective bandwidth of one NIC port, bytes/s: the rate every fabric link runs at
    /// before oversubscription.
    pub fn nic_bytes_per_s(&self) -> f64 {
        self.t.node.nic_delivered_gb_per_s() * 1e9
    }

    /// A switch vertex.
    pub fn switch(&mut self, v: Vertex) -> NodeIndex {
        self.t.graph.add_node(v)
    }

    /// A resource with no edge of its own (a trunk).
    pub fn resource(&mut self, cap_bytes_per_s: f64, kind: ResKind) -> ResId {
        assert!(cap_bytes_per_s > 0.0 && cap_bytes_per_s.is_finite(), "capacity {cap_bytes_per_s}");
        self.t.resources.push(Resource { cap_bytes_per_s, kind });
        (self.t.resources.len() - 1) as ResId
    }

    /// A full-duplex link a ⇄ b: returns (a→b, b→a) resources.
    pub fn duplex(
        &mut self,
        a: NodeIndex,
        b: NodeIndex,
        cap_bytes_per_s: f64,
        kinds: (ResKind, ResKind),
        latency_ns: u64,
    ) -> (ResId, ResId) {
        let up = self.resource(cap_bytes_per_s, kinds.0);
        let down = self.resource(cap_bytes_per_s, kinds.1);
        self.t.graph.add_edge(a, b, Link { res: Some(up), latency_ns });
        self.t.graph.add_edge(b, a, Link { res: Some(down), latency_ns });
        (up, down)
    }

    /// Cables NIC port `endpoint` to `switch` at the NIC's effective bandwidth. Ports are
    /// cabled in endpoint order, each once.
    pub fn attach_nic(&mut self, endpoint: u32, switch: NodeIndex, latency_ns: u64) {
        assert_eq!(endpoint as usize, self.t.nic_up.len(), "NIC ports are cabled in endpoint order");
        let nic = self.t.nic_vertex[endpoint as usize];
        let cap = self.nic_bytes_per_s();
        let (up, down) = self.duplex(nic, switch, cap, (ResKind::NicUp, ResKind::NicDown), latency_ns);
        self.t.nic_up.push(up);
        self.t.nic_down.push(down);
    }
}
