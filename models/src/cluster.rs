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
//! `nic_efficiency` is the share of a NIC's line rate that NCCL's network transport gets:
//! 1.0 for InfiniBand or RoCE with GPUDirect RDMA, where NCCL's own tuning factors already
//! hold; less for a transport that does not reach line rate, such as AWS EFA through the
//! aws-ofi-nccl plugin ([`EFA_2022_NIC_EFFICIENCY`]).
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
    /// Share of `nic_gbps` that NCCL's network transport reaches, in (0, 1]; 1.0 for
    /// InfiniBand / RoCE with GPUDirect RDMA. Plans saved before the key existed read 1.0.
    #[serde(default = "full_line_rate")]
    pub nic_efficiency: f64,
}

fn full_line_rate() -> f64 {
    1.0
}

/// The share of line rate NCCL reached over AWS EFA (aws-ofi-nccl, 2021–22 software) on
/// p4d/p4dn nodes (8 A100, 4 × 100 Gb/s EFA): fitted by `sim/examples/fit_efa.rs` to
/// nccl-tests `all_reduce_perf` at 1 GiB on 2, 3 and 4 nodes (NVIDIA/nccl issue #527, 2022:
/// busbw 57.2, 31.8 and 29.6 GB/s), with the simulator's own NCCL model at each candidate:
/// NCCL plans for the line rate EFA reports and the links deliver the share. Residuals
/// +1.4% (2 nodes, NCCL's tree), −3.1% (3) and +3.8% (4 nodes, ring). Earlier EFA software
/// reached 50–60% of one 100 Gb/s NIC at 8–32 p3dn nodes (aws-ofi-nccl issue #19, 2019), in
/// line with it. Newer EFA generations and plugins are faster: measure yours
/// (`strata collbench --fit LOG`).
pub const EFA_2022_NIC_EFFICIENCY: f64 = 0.62;

/// The least `nic_efficiency` a cluster may have (docs/limits.md): 1% of line rate.
pub const MIN_NIC_EFFICIENCY: f64 = 0.01;

/// Names of the built-in cluster presets.
pub const CLUSTER_PRESETS: &[&str] =
    &["dgx-a100", "dgx-h100", "dgx-h200", "dgx-h800", "dgx-b200", "aws-p4d", "cpu-local"];

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
            nic_efficiency: 1.0,
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
            // AWS p4d.24xlarge: 8 A100-40GB on NVSwitch, 4 × 100 Gb/s EFA, in an AWS Clos
            // network (modelled as a full-bisection fat-tree with adaptive routing: EFA's SRD
            // sprays packets over paths). EFA reaches a share of line rate only.
            "aws-p4d" => ClusterSpec {
                nic_efficiency: EFA_2022_NIC_EFFICIENCY,
                ..c(GpuKind::A100_40gb, 8, 4, 100.0, Fabric::FatTree, 64)
            },
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
        if !(self.nic_efficiency >= MIN_NIC_EFFICIENCY && self.nic_efficiency <= 1.0) {
            bad.push(format!(
                "cluster.nic_efficiency = {}: it is the share of the NIC's line rate NCCL reaches, in \
                 [{MIN_NIC_EFFICIENCY}, 1] (1.0 for InfiniBand or RoCE; 0.62 for AWS EFA in 2022)",
                self.nic_efficiency
            ));
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

    #[test]
    fn nic_efficiency_is_a_share_of_line_rate_and_old_plans_read_full_rate() {
        let mut c = ClusterSpec::preset("aws-p4d").unwrap();
        assert_eq!((c.gpu, c.nics_per_node, c.nic_gbps, c.nic_efficiency), (GpuKind::A100_40gb, 4, 100.0, 0.62));
        for bad in [0.0, 1e-15, 1.5, f64::NAN, f64::INFINITY] {
            c.nic_efficiency = bad;
            let e = c.check().unwrap_err();
            assert!(e.contains("cluster.nic_efficiency") && e.contains("[0.01, 1]"), "{bad}: {e}");
        }
        // A cluster serialised before the key existed reads as full line rate.
        let mut v = serde_json::to_value(ClusterSpec::preset("dgx-a100").unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("nic_efficiency");
        let back: ClusterSpec = serde_json::from_value(v).unwrap();
        assert_eq!(back.nic_efficiency, 1.0);
    }
}
