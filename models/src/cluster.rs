//! Cluster specifications: how many nodes, what is in a node, and how nodes are wired.
//!
//! A node is `gpus_per_node` GPUs on an NVLink/NVSwitch domain with `nics_per_node`
//! InfiniBand NICs, one per rail (local GPU index i uses NIC i mod nics). Nodes hang off a
//! fabric: a single switch, a k-ary fat-tree (Al-Fares et al. 2008), or a rail-optimised
//! SuperPOD-style fabric (NVIDIA DGX SuperPOD reference architecture: scalable units of 32
//! nodes, one leaf per rail per unit, spine and core tiers), or a two-tier leaf–spine
//! fabric without rails (every NIC of a node on one leaf). `oversubscription` is the ratio
//! of downlink to uplink capacity at each switch tier above the leaf (1.0 = full bisection).
//!
//! Units: NIC speed in Gb/s as vendors quote it (HDR 200, NDR 400); latency in ns.

use serde::{Deserialize, Serialize};

use crate::hardware::GpuKind;

/// How nodes are connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fabric {
    /// Every NIC on one (ideal, non-blocking) switch.
    SingleSwitch,
    /// A k-ary fat-tree of identical switches (k = `switch_radix`).
    FatTree,
    /// Rail-optimised leaf/spine/core fabric in scalable units.
    RailOptimized,
    /// Two-tier leaf–spine without rails: all NICs of a node on one leaf.
    LeafSpine,
}

/// How a switch picks among equal-cost uplinks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// Per-packet adaptive routing: parallel uplinks behave as one trunk.
    Adaptive,
    /// Static hash-based ECMP: each flow is pinned to one uplink by a seeded hash.
    Static,
}

/// A cluster of identical nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub name: String,
    pub gpu: GpuKind,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub nics_per_node: u32,
    /// Line rate of one NIC, Gb/s.
    pub nic_gbps: f64,
    pub fabric: Fabric,
    pub oversubscription: f64,
    pub routing: Routing,
    /// Ports per fabric switch (40 for HDR QM8700, 64 for NDR QM9700).
    pub switch_radix: u32,
    /// Nodes per scalable unit of a rail-optimised fabric.
    pub nodes_per_unit: u32,
    /// Port-to-port latency of one switch hop, ns.
    pub switch_latency_ns: u64,
}

/// Names of the built-in cluster presets.
pub const CLUSTER_PRESETS: &[&str] = &["dgx-a100", "dgx-h100", "dgx-h200", "dgx-h800", "dgx-b200", "cpu-local"];

impl ClusterSpec {
    /// A built-in cluster by name (one node; set `nodes` to scale it), or `None`.
    pub fn preset(name: &str) -> Option<ClusterSpec> {
        let c = |gpu, gpus_per_node, nics, nic_gbps, fabric, radix| ClusterSpec {
            name: name.to_string(),
            gpu,
            nodes: 1,
            gpus_per_node,
            nics_per_node: nics,
            nic_gbps,
            fabric,
            oversubscription: 1.0,
            routing: Routing::Adaptive,
            switch_radix: radix,
            nodes_per_unit: 32,
            switch_latency_ns: 200,
        };
        Some(match name {
            // DGX A100: 8 A100-80GB, 8 ConnectX-6 HDR 200 Gb/s compute NICs, QM8700 switches.
            // DGX A100 SuperPOD scalable units hold 20 nodes (QM8700's 40 ports: 20 down, 20 up).
            "dgx-a100" => {
                ClusterSpec { nodes_per_unit: 20, ..c(GpuKind::A100_80gb, 8, 8, 200.0, Fabric::RailOptimized, 40) }
            }
            // DGX H100 / H200: 8 GPUs, 8 ConnectX-7 NDR 400 Gb/s, QM9700 switches.
            "dgx-h100" => c(GpuKind::H100Sxm, 8, 8, 400.0, Fabric::RailOptimized, 64),
            "dgx-h200" => c(GpuKind::H200Sxm, 8, 8, 400.0, Fabric::RailOptimized, 64),
            // HGX H800 as DeepSeek-V3 ran it (arXiv 2412.19437 §3.1): 8 GPUs on NVLink/NVSwitch,
            // 8 InfiniBand NICs of 400 Gb/s (50 GB/s), one per GPU.
            "dgx-h800" => c(GpuKind::H800Sxm, 8, 8, 400.0, Fabric::RailOptimized, 64),
            "dgx-b200" => c(GpuKind::B200, 8, 8, 400.0, Fabric::RailOptimized, 64),
            // This machine: CPU ranks in one process or one host, no fabric.
            "cpu-local" => c(GpuKind::Cpu, 8, 0, 0.0, Fabric::SingleSwitch, 64),
            _ => return None,
        })
    }

    /// Total accelerators.
    pub fn gpus(&self) -> u64 {
        self.nodes as u64 * self.gpus_per_node as u64
    }

    /// Structural checks that do not depend on the model or split.
    pub fn check(&self) -> Result<(), String> {
        let mut bad = Vec::new();
        if self.nodes == 0 {
            bad.push("cluster.nodes = 0: a cluster needs at least one node".to_string());
        }
        if self.gpus_per_node == 0 {
            bad.push("cluster.gpus_per_node = 0: a node needs at least one GPU".to_string());
        }
        if self.nodes > 1 && self.nics_per_node == 0 {
            bad.push(format!(
                "cluster.nics_per_node = 0 with cluster.nodes = {}: nodes need NICs to talk to each other",
                self.nodes
            ));
        }
        if self.nics_per_node > 0 && !(self.nic_gbps > 0.0 && self.nic_gbps.is_finite()) {
            bad.push(format!("cluster.nic_gbps = {}: a NIC needs a positive speed (HDR 200, NDR 400)", self.nic_gbps));
        }
        if !(self.oversubscription >= 1.0 && self.oversubscription.is_finite()) {
            bad.push(format!(
                "cluster.oversubscription = {}: it is downlink over uplink capacity, 1.0 (full bisection) or more",
                self.oversubscription
            ));
        }
        if self.switch_radix < 4 || !self.switch_radix.is_multiple_of(2) {
            bad.push(format!(
                "cluster.switch_radix = {}: it must be an even number of ports, at least 4",
                self.switch_radix
            ));
        }
        if self.nodes_per_unit == 0 {
            bad.push("cluster.nodes_per_unit = 0: a scalable unit holds at least one node".to_string());
        }
        if bad.is_empty()
            && let Err(e) = crate::limits::check_cluster(self)
        {
            bad.push(e);
        }
        if bad.is_empty() { Ok(()) } else { Err(bad.join("\n")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_exist_and_check() {
        for name in CLUSTER_PRESETS {
            let c = ClusterSpec::preset(name).unwrap();
            c.check().unwrap();
            assert_eq!(c.gpus(), 8);
        }
        assert!(ClusterSpec::preset("tpu-pod").is_none());
    }

    #[test]
    fn multi_node_without_nics_is_rejected() {
        let mut c = ClusterSpec::preset("cpu-local").unwrap();
        c.nodes = 2;
        assert!(c.check().unwrap_err().contains("cluster.nics_per_node = 0"));
    }
}
