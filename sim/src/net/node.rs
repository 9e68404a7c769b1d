//! What a node offers the network: rank placement and effective link bandwidths.
//!
//! Placement is contiguous: global rank r lives on node ⌊r / gpus_per_node⌋ as local GPU
//! r mod gpus_per_node, and talks to the fabric through NIC (rail) local mod nics_per_node.
//!
//! Bandwidths are the *effective* figures NCCL's topology code assigns (NVIDIA/nccl
//! v2.30.7, src/graph/topo.h and topo.cc), not datasheet line rates, because those are
//! what NCCL's tuning model and the measured nccl-tests bus bandwidths are built on:
//! - NVLink per GPU per direction = links × per-link bandwidth: A100 12 × 20.0, H100/H200
//!   18 × 20.6 (= 370.8 GB/s, the "≈370 GB/s NVLink4 ring ceiling" of nccl-tests#212),
//!   B200 18 × 40.1 GB/s (`SM80/SM90/SM100_NVLINK_BW`);
//! - a NIC's path to its GPU is min(NIC, PCIe): NIC speed / 8 (topo.cc: Gb/s ÷ 8000 → GB/s)
//!   and PCIe x16 Gen4 24 GB/s (A100), Gen5 48 GB/s (Hopper, Blackwell). So NDR 400 Gb/s is
//!   48 GB/s (the "46–48 GB/s per NIC" of nccl-tests#290) and HDR 200 Gb/s is 24 GB/s
//!   (8 × 24 = 192 GB/s DGX A100 multi-node busbw, nccl#812). NCCL's search and tuning see
//!   that figure; the links deliver it × the cluster's `nic_efficiency` (1.0 on InfiniBand /
//!   RoCE; AWS EFA reaches a share of its line rate:
//!   `strata_models::cluster::EFA_2022_NIC_EFFICIENCY`), which is what the fabric's link
//!   capacities and the closed form use.
//!
//! Assumed host CPUs (they select NCCL's multi-node LL ceiling and network post overhead):
//! DGX A100 has AMD EPYC 7742, DGX H100/H200/B200 have Intel Xeon (DGX user guides).
//!
//! Units: GB/s = 1e9 bytes/s (`_gb_per_s`), counts are plain integers.

use strata_models::{ClusterSpec, GpuKind};

use super::NetError;

/// GPU generation, as NCCL indexes its tuning tables (`compCapIndex`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// Pre-Ampere row of the tables; also used for CPU ranks.
    Volta,
    Ampere,
    Hopper,
    Blackwell,
}

impl Arch {
    /// Row index in NCCL's per-generation tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// CUDA compute capability ×10, as NCCL compares it (`minCompCap`).
    pub fn comp_cap(self) -> u32 {
        match self {
            Arch::Volta => 70,
            Arch::Ampere => 80,
            Arch::Hopper => 90,
            Arch::Blackwell => 100,
        }
    }
}

/// Host CPU vendor, as NCCL's tuning distinguishes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpuVendor {
    Intel,
    Amd,
}

/// A node as the network model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeNet {
    pub arch: Arch,
    pub cpu: CpuVendor,
    /// GPUs reach each other through NVSwitch (all DGX/HGX presets); false for CPU ranks.
    pub nvswitch: bool,
    pub gpus_per_node: u32,
    pub nics_per_node: u32,
    /// Effective NVLink bandwidth of one GPU, one direction.
    pub nvlink_gb_per_s: f64,
    /// Effective bandwidth of one NIC (min of the NIC and its PCIe path), one direction: the
    /// figure NCCL's topology search and tuning see.
    pub nic_gb_per_s: f64,
    /// The share of `nic_gb_per_s` the NIC's transport delivers (the cluster's
    /// `nic_efficiency`; [`NodeNet::nic_delivered_gb_per_s`]).
    pub nic_efficiency: f64,
}

impl NodeNet {
    /// The node of `cluster`, with the effective constants of the module doc.
    pub fn from_cluster(cluster: &ClusterSpec) -> Result<NodeNet, NetError> {
        cluster.check().map_err(NetError::Cluster)?;
        let (arch, cpu, nvswitch, nvlink_gb_per_s, pcie_gb_per_s) = match cluster.gpu {
            GpuKind::A100_40gb | GpuKind::A100_80gb => (Arch::Ampere, CpuVendor::Amd, true, 12.0 * 20.0, 24.0),
            GpuKind::H100Sxm | GpuKind::H200Sxm => (Arch::Hopper, CpuVendor::Intel, true, 18.0 * 20.6, 48.0),
            // H800: the same NVLink4 links, 8 of them (DeepSeek-V3 measures 160 GB/s).
            GpuKind::H800Sxm => (Arch::Hopper, CpuVendor::Intel, true, 8.0 * 20.6, 48.0),
            GpuKind::B200 => (Arch::Blackwell, CpuVendor::Intel, true, 18.0 * 40.1, 48.0),
            // CPU ranks: the catalog's nominal figure, shared-memory class, no NVSwitch.
            GpuKind::Cpu => {
                let bw = cluster.gpu.spec().nvlink_bw_bytes_per_s / 1e9;
                (Arch::Volta, CpuVendor::Intel, false, bw, bw)
            }
        };
        let nic_gb_per_s = (cluster.nic_gbps / 8.0).min(pcie_gb_per_s);
        Ok(NodeNet {
            arch,
            cpu,
            nvswitch,
            gpus_per_node: cluster.gpus_per_node,
            nics_per_node: cluster.nics_per_node,
            nvlink_gb_per_s,
            nic_gb_per_s,
            nic_efficiency: cluster.nic_efficiency,
        })
    }

    /// What one NIC's transport delivers, GB/s: `nic_gb_per_s` × `nic_efficiency`. The
    /// fabric's link capacities and the closed form run at it, so NCCL plans for the line
    /// rate (as it does on EFA, which reports its line rate) and the links deliver less.
    pub fn nic_delivered_gb_per_s(&self) -> f64 {
        self.nic_gb_per_s * self.nic_efficiency
    }

    /// Node of a global rank.
    pub fn node_of(&self, rank: u32) -> u32 {
        rank / self.gpus_per_node
    }

    /// Local GPU index of a global rank.
    pub fn local_of(&self, rank: u32) -> u32 {
        rank % self.gpus_per_node
    }

    /// NIC index (rail) that a local GPU uses.
    pub fn rail_of_local(&self, local: u32) -> u32 {
        debug_assert!(self.nics_per_node > 0);
        local % self.nics_per_node
    }

    /// The shape of a communicator over `ranks`.
    pub fn shape(&self, ranks: &[u32]) -> CommShape {
        let mut nodes: Vec<u32> = ranks.iter().map(|&r| self.node_of(r)).collect();
        nodes.sort_unstable();
        let mut max_local = 0u32;
        let mut run = 0u32;
        for (i, n) in nodes.iter().enumerate() {
            run = if i > 0 && nodes[i - 1] == *n { run + 1 } else { 1 };
            max_local = max_local.max(run);
        }
        nodes.dedup();
        let mut rails: Vec<u32> = Vec::new();
        if self.nics_per_node > 0 {
            let first = self.node_of(ranks[0]);
            rails = ranks
                .iter()
                .filter(|&&r| self.node_of(r) == first)
                .map(|&r| self.rail_of_local(self.local_of(r)))
                .collect();
            rails.sort_unstable();
            rails.dedup();
        }
        CommShape {
            n_ranks: ranks.len() as u32,
            n_nodes: nodes.len() as u32,
            local_ranks: max_local,
            nics_used: rails.len() as u32,
        }
    }
}

/// The figures of a communicator that NCCL's tuning looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommShape {
    pub n_ranks: u32,
    pub n_nodes: u32,
    /// Most ranks of the communicator on one node (NCCL's `localRanks`).
    pub local_ranks: u32,
    /// Distinct NICs the communicator's GPUs use on one node.
    pub nics_used: u32,
}

impl CommShape {
    /// NCCL's `ppn`: ranks per node, as a float (nRanks / nNodes).
    pub fn ppn(&self) -> f64 {
        self.n_ranks as f64 / self.n_nodes as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_constants_follow_the_cluster() {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        let h = NodeNet::from_cluster(&c).unwrap();
        assert_eq!(h.arch, Arch::Hopper);
        assert!((h.nvlink_gb_per_s - 370.8).abs() < 1e-9);
        assert_eq!(h.nic_gb_per_s, 48.0);
        c = ClusterSpec::preset("dgx-a100").unwrap();
        let a = NodeNet::from_cluster(&c).unwrap();
        assert_eq!(a.nic_gb_per_s, 24.0);
        assert_eq!(a.nvlink_gb_per_s, 240.0);
        assert_eq!(a.cpu, CpuVendor::Amd);
    }

    #[test]
    fn placement_is_contiguous() {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 4;
        c.nics_per_node = 4;
        let n = NodeNet::from_cluster(&c).unwrap();
        assert_eq!((n.node_of(13), n.local_of(13), n.rail_of_local(n.local_of(13))), (1, 5, 1));
        let s = n.shape(&[0, 8, 16, 24]);
        assert_eq!((s.n_ranks, s.n_nodes, s.local_ranks, s.nics_used), (4, 4, 1, 1));
        let s = n.shape(&(0..16).collect::<Vec<_>>());
        assert_eq!((s.n_nodes, s.local_ranks, s.nics_used), (2, 8, 4));
    }
}
