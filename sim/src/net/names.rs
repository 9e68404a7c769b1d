//! Stable, human-readable names of a fabric's links and switches, for what-ifs
//! (`--degrade link=NAME:F`, `--down NAME`) and `strata simulate --list-links`.
//!
//! Names come from the cluster graph ([`Topology`]), the same for every fabric:
//! - switches: `leaf2`, `spine7`, `core5` (the fabric's own numbering, [`Vertex`]);
//! - a link is its two ends, lower tier first: `node3/gpu2-nvswitch` (NVLink),
//!   `node3/nic0-leaf2` (a NIC port's cable), `leaf2-spine7`, `spine7-core1`;
//! - parallel links between the same two switches are `leaf2-spine7#0`, `leaf2-spine7#1`, …
//!   in wiring order, and the bare `leaf2-spine7` names the whole bundle.
//!
//! A link is full duplex: a name stands for both directions (two resources, the up one and
//! the down one that [`Wiring::duplex`](super::topology::Wiring::duplex) hands out next). A
//! switch stands for every link that touches it. Adaptive routing's trunks (bundles the
//! solver shares as one) have no name: they follow their member links
//! ([`super::faults`]). Names are a function of the cluster alone, so a scenario's what-ifs
//! mean the same links on every run.

use std::collections::BTreeMap;

use petgraph::visit::EdgeRef;

use super::topology::{ResId, ResKind, Tier, Topology, Vertex};

/// A named link or switch.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Named {
    pub name: String,
    /// "switch", "nvlink", "nic", "leaf-spine" or "spine-core".
    pub kind: &'static str,
    /// Bandwidth of one direction, GB/s (a switch: 0).
    pub gb_per_s: f64,
    /// The resources it stands for: both directions of each link.
    #[serde(skip)]
    pub res: Vec<ResId>,
}

/// A vertex's name.
pub fn vertex_name(v: &Vertex) -> String {
    match *v {
        Vertex::Gpu { node, local } => format!("node{node}/gpu{local}"),
        Vertex::NvSwitch { node } => format!("node{node}/nvswitch"),
        Vertex::Nic { node, rail } => format!("node{node}/nic{rail}"),
        Vertex::Leaf(i) => format!("leaf{i}"),
        Vertex::Spine(i) => format!("spine{i}"),
        Vertex::Core(i) => format!("core{i}"),
    }
}

fn link_kind(k: ResKind) -> Option<&'static str> {
    Some(match k {
        ResKind::NvlinkUp => "nvlink",
        ResKind::NicUp => "nic",
        ResKind::Fabric(Tier::LeafUp) => "leaf-spine",
        ResKind::Fabric(Tier::SpineUp) => "spine-core",
        _ => return None,
    })
}

/// Every physical link, in wiring order (parallel ones numbered), then every switch.
pub fn all(topo: &Topology) -> Vec<Named> {
    let g = &topo.graph;
    let mut links: Vec<(String, &'static str, f64, ResId)> = Vec::new();
    let mut per_pair: BTreeMap<String, u32> = BTreeMap::new();
    for e in g.edge_references() {
        let Some(r) = e.weight().res else { continue };
        let Some(kind) = link_kind(topo.resources[r as usize].kind) else { continue };
        let (a, b) = (vertex_name(&g[e.source()]), vertex_name(&g[e.target()]));
        // Inside a node the far end drops the node prefix: node3/gpu2-nvswitch.
        let b = match (a.split_once('/'), b.split_once('/')) {
            (Some((na, _)), Some((nb, rest))) if na == nb => rest.to_string(),
            _ => b,
        };
        let name = format!("{a}-{b}");
        *per_pair.entry(name.clone()).or_default() += 1;
        links.push((name, kind, topo.resources[r as usize].cap_bytes_per_s / 1e9, r));
    }
    let mut index: BTreeMap<String, u32> = BTreeMap::new();
    let mut out = Vec::with_capacity(links.len());
    for (name, kind, gb_per_s, r) in links {
        // The down direction is the next resource (`Wiring::duplex`).
        let res = vec![r, r + 1];
        let name = if per_pair[&name] > 1 {
            let i = index.entry(name.clone()).or_default();
            *i += 1;
            format!("{name}#{}", *i - 1)
        } else {
            name
        };
        out.push(Named { name, kind, gb_per_s, res });
    }
    let mut switch_res: BTreeMap<u32, Vec<ResId>> = BTreeMap::new();
    for e in g.edge_references() {
        let Some(r) = e.weight().res else { continue };
        for v in [e.source(), e.target()] {
            if matches!(g[v], Vertex::Leaf(_) | Vertex::Spine(_) | Vertex::Core(_)) {
                switch_res.entry(v.index() as u32).or_default().push(r);
            }
        }
    }
    for (v, mut res) in switch_res {
        res.sort_unstable();
        let name = vertex_name(&g[petgraph::graph::NodeIndex::new(v as usize)]);
        out.push(Named { name, kind: "switch", gb_per_s: 0.0, res });
    }
    out
}

/// Looks names up: a link, a bundle of parallel links (the name without `#i`) or a switch.
pub struct Index {
    by_name: BTreeMap<String, Vec<ResId>>,
    /// One example name of each kind, for error messages.
    pub examples: Vec<String>,
    pub count: usize,
}

impl Index {
    pub fn new(topo: &Topology) -> Index {
        let named = all(topo);
        let mut by_name: BTreeMap<String, Vec<ResId>> = BTreeMap::new();
        let mut examples: Vec<(&'static str, String)> = Vec::new();
        for n in &named {
            if !examples.iter().any(|(k, _)| *k == n.kind) {
                examples.push((n.kind, n.name.clone()));
            }
            if let Some((bundle, _)) = n.name.split_once('#') {
                by_name.entry(bundle.to_string()).or_default().extend(&n.res);
            }
            by_name.insert(n.name.clone(), n.res.clone());
        }
        Index { by_name, examples: examples.into_iter().map(|(_, n)| n).collect(), count: named.len() }
    }

    /// The resources a name stands for.
    pub fn get(&self, name: &str) -> Option<&[ResId]> {
        self.by_name.get(name).map(|v| v.as_slice())
    }
}

/// The name of the link that owns resource `r` (either direction), or of the trunk.
pub fn name_of(topo: &Topology, r: ResId) -> String {
    let kind = topo.resources[r as usize].kind;
    if let ResKind::Trunk(t) = kind {
        return format!("a {t:?} trunk (every link of it down)");
    }
    all(topo).into_iter().find(|n| n.kind != "switch" && n.res.contains(&r)).map_or(format!("resource {r}"), |n| n.name)
}

#[cfg(test)]
mod tests {
    use strata_models::{ClusterSpec, Fabric};

    use super::*;

    fn topo(preset: &str, nodes: u32, fabric: Fabric) -> Topology {
        let mut c = ClusterSpec::preset(preset).unwrap();
        c.nodes = nodes;
        c.fabric = fabric;
        Topology::new(&c, 0).unwrap()
    }

    #[test]
    fn names_are_unique_readable_and_cover_every_physical_link() {
        // 1 SU of 32 DGX H100: 8 rail leaves, 4 spines, 8 links per leaf-spine pair.
        let t = topo("dgx-h100", 32, Fabric::RailOptimized);
        let named = all(&t);
        let names: std::collections::BTreeSet<_> = named.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names.len(), named.len(), "names are unique");
        for want in ["node3/gpu2-nvswitch", "node3/nic0-leaf0", "node3/nic5-leaf5", "leaf2-spine3#7", "spine3", "leaf7"]
        {
            assert!(names.contains(want), "{want} missing");
        }
        // Every resource of a physical link is named exactly once; trunks are not.
        let mut covered = vec![0; t.resources.len()];
        for n in named.iter().filter(|n| n.kind != "switch") {
            for &r in &n.res {
                covered[r as usize] += 1;
            }
        }
        for (r, res) in t.resources.iter().enumerate() {
            let want = if matches!(res.kind, ResKind::Trunk(_)) { 0 } else { 1 };
            assert_eq!(covered[r], want, "resource {r} {:?}", res.kind);
        }
        let idx = Index::new(&t);
        assert_eq!(idx.get("leaf2-spine3").unwrap().len(), 16, "a bundle of 8 duplex links");
        assert_eq!(idx.get("spine0").unwrap().len(), 8 * 8 * 2, "every link of the spine");
        assert!(idx.get("leaf2-spine4").is_none());
        // Three tiers have cores; stable across builds.
        let t3 = topo("dgx-a100", 512, Fabric::RailOptimized);
        let idx3 = Index::new(&t3);
        assert!(idx3.get("core0").is_some() && idx3.get("spine0-core0").is_some());
        assert_eq!(all(&t3), all(&topo("dgx-a100", 512, Fabric::RailOptimized)));
    }
}
