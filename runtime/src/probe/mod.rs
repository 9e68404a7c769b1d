//! What this machine is, as a cluster: `strata probe`'s discovery and the cluster TOML it
//! writes (a `[cluster]` table that `strata_models::scenario::load_cluster` reads back).
//!
//! - GPUs (feature `cuda`, a driver present): model, memory, SMs, compute capability from the
//!   driver's attributes, the catalog's [`GpuKind`] the name maps to, and the peers each
//!   reaches directly (`crate::cuda::peers`);
//! - RDMA ports (feature `ibverbs`, [`rdma`]): state, link layer, active speed and width →
//!   Gb/s; the largest group of active ports of one link layer and rate is the node's NICs;
//! - nodes and ranks per node from the launcher's environment ([`launch`]).
//!
//! What is missing is a reason, not a failure: without a GPU the file describes the CPU host
//! (`gpu = "cpu"`, one rank per core), without an RDMA device it has no NICs. What one node
//! cannot see — the fabric between nodes, its switches and oversubscription — is written
//! with defaults and said so in the file.

pub mod launch;
pub mod rdma;

use serde::Serialize;
use strata_models::cluster::{ClusterSpec, EFA_2022_NIC_EFFICIENCY, Fabric, Routing};
use strata_models::hardware::GpuKind;

use rdma::{LinkLayer, RdmaPort};

/// One GPU as found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub ordinal: usize,
    /// The driver's name (`NVIDIA H200`).
    pub name: String,
    /// The catalog entry the name maps to, if any.
    pub kind: Option<GpuKind>,
    pub memory_bytes: u64,
    pub sms: u32,
    pub compute_capability: (u32, u32),
    /// GPUs this one reaches with peer access, and of those, over NVLink (access with
    /// native atomics).
    pub peers: Vec<usize>,
    pub nvlink_peers: Vec<usize>,
    /// Why the peers could not be read (then both lists are empty).
    pub peer_error: Option<String>,
}

/// Everything probe found, and why what is absent is absent.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Machine {
    pub hostname: String,
    /// Hardware threads of this host.
    pub cpus: u32,
    /// The GPUs, or why there are none (no driver, no GPU, built without CUDA).
    pub gpus: Result<Vec<Gpu>, String>,
    /// The RDMA ports, or why there are none.
    pub rdma: Result<Vec<RdmaPort>, String>,
    /// The launcher's job shape; `Ok(None)` outside a launcher.
    pub launch: Result<Option<launch::Launch>, String>,
}

/// The catalog entry of a driver's GPU name: the SXM boards Strata's catalog holds
/// (`NVIDIA H100 80GB HBM3` is the H100 SXM5; PCIe and NVL boards have other clocks and
/// links and are not mapped).
pub fn catalog_kind(name: &str) -> Option<GpuKind> {
    let n = name.to_ascii_uppercase();
    let not = |s: &str| !n.contains(s);
    if n.contains("B200") {
        Some(GpuKind::B200)
    } else if n.contains("H200") && not("NVL") && not("GH200") {
        Some(GpuKind::H200Sxm)
    } else if n.contains("H100") && (n.contains("SXM") || n.contains("HBM3")) && not("NVL") && not("PCIE") {
        Some(GpuKind::H100Sxm)
    } else if n.contains("A100") && n.contains("SXM") {
        if n.contains("40GB") {
            Some(GpuKind::A100_40gb)
        } else if n.contains("80GB") {
            Some(GpuKind::A100_80gb)
        } else {
            None
        }
    } else {
        None
    }
}

/// Looks at this machine: GPUs, RDMA ports, the launcher's environment.
pub fn probe() -> Machine {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    Machine { hostname, cpus, gpus: gpus(), rdma: rdma::ports(), launch: launch::from_env(&|k| std::env::var(k).ok()) }
}

#[cfg(feature = "cuda")]
fn gpus() -> Result<Vec<Gpu>, String> {
    let devices = crate::cuda::devices().map_err(|e| format!("no GPU found: {e}"))?;
    if devices.is_empty() {
        return Err("no GPU found: the CUDA driver sees no GPU on this machine".into());
    }
    let (links, peer_error) = match crate::cuda::peers::peer_links(devices.len()) {
        Ok(l) => (l, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(devices
        .into_iter()
        .map(|d| {
            let from = |l: &&crate::cuda::peers::PeerLink| l.from == d.ordinal;
            Gpu {
                kind: catalog_kind(&d.name),
                peers: links.iter().filter(from).filter(|l| l.access).map(|l| l.to).collect(),
                nvlink_peers: links.iter().filter(from).filter(|l| l.nvlink()).map(|l| l.to).collect(),
                ordinal: d.ordinal,
                name: d.name,
                memory_bytes: d.memory_bytes,
                sms: d.sms,
                compute_capability: d.compute_capability,
                peer_error: peer_error.clone(),
            }
        })
        .collect())
}

#[cfg(not(feature = "cuda"))]
fn gpus() -> Result<Vec<Gpu>, String> {
    Err("built without CUDA: GPUs are read by a build with `--features cuda` (cargo build --release --features \
         cuda)"
        .into())
}

/// The cluster the machine is, the notes that explain its figures, and the file's text.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub cluster: ClusterSpec,
    pub notes: Vec<String>,
}

/// The active ports that are the node's compute NICs: the largest group of one link layer
/// and one rate (ties: the faster); the rest are named in the notes.
fn compute_nics(ports: &[RdmaPort]) -> (Vec<&RdmaPort>, Vec<&RdmaPort>) {
    let active: Vec<&RdmaPort> = ports.iter().filter(|p| p.active() && p.gbps.is_some()).collect();
    let key = |p: &RdmaPort| (p.link_layer == LinkLayer::InfiniBand, p.gbps.unwrap_or(0.0).to_bits());
    let mut best: Option<((bool, u64), usize)> = None;
    for p in &active {
        let n = active.iter().filter(|q| key(q) == key(p)).count();
        let better = match best {
            None => true,
            Some((k, m)) => n > m || (n == m && f64::from_bits(key(p).1) > f64::from_bits(k.1)),
        };
        if better {
            best = Some((key(p), n));
        }
    }
    let Some((k, _)) = best else { return (Vec::new(), ports.iter().collect()) };
    ports.iter().partition(|p| p.active() && p.gbps.is_some() && key(p) == k)
}

/// The largest cluster size a probe writes per node; a host with more cores is written at
/// the limit (models' `MAX_GPUS_PER_NODE`).
fn clamp_per_node(n: u32) -> u32 {
    n.clamp(1, strata_models::limits::MAX_GPUS_PER_NODE as u32)
}

impl Machine {
    /// The cluster this machine is part of. Errors only for what cannot be written as a
    /// cluster: a GPU the catalog does not hold, GPUs of different models, a launcher
    /// environment that does not describe identical nodes.
    pub fn cluster(&self) -> Result<Found, String> {
        let mut notes = Vec::new();
        let launch = self.launch.clone()?;
        let (gpu, per_node, found_gpus) = match &self.gpus {
            Ok(g) if !g.is_empty() => {
                let first = &g[0];
                let kind = first.kind.ok_or_else(|| {
                    format!(
                        "GPU 0 is a {:?}, which is not in Strata's GPU catalog ({}); a cluster file needs one of them",
                        first.name,
                        strata_models::hardware::GPU_KINDS.iter().map(|k| k.key()).collect::<Vec<_>>().join(", ")
                    )
                })?;
                if let Some(other) = g.iter().find(|x| x.name != first.name) {
                    return Err(format!(
                        "GPU {} is a {:?} and GPU {} a {:?}: a cluster node holds GPUs of one model",
                        first.ordinal, first.name, other.ordinal, other.name
                    ));
                }
                let spec = kind.spec();
                let mib = |b: u64| b >> 20;
                notes.push(format!(
                    "{} × {} ({}): {} MiB, {} SMs, compute capability {}.{} (catalog: {} MiB, {} SMs)",
                    g.len(),
                    first.name,
                    kind.key(),
                    mib(first.memory_bytes),
                    first.sms,
                    first.compute_capability.0,
                    first.compute_capability.1,
                    mib(spec.hbm_bytes),
                    spec.sm_count
                ));
                let heuristic = "NVLink = peer access with native atomics, a heuristic";
                if let Some(e) = g.iter().find_map(|x| x.peer_error.as_ref()) {
                    notes.push(format!("the GPUs' peers could not be read: {e}"));
                } else if g.len() > 1 && g.iter().all(|x| x.nvlink_peers.len() + 1 == g.len()) {
                    notes.push(format!("every GPU pair is an NVLink peer ({heuristic})"));
                } else if g.len() > 1 {
                    for x in g {
                        notes.push(format!(
                            "GPU {}: peers {:?}, NVLink peers {:?} ({heuristic})",
                            x.ordinal, x.peers, x.nvlink_peers
                        ));
                    }
                    notes.push(
                        "not every GPU pair is an NVLink peer: the simulator models one NVLink domain per node".into(),
                    );
                }
                (kind, g.len() as u32, true)
            }
            Ok(_) => {
                notes.push("no GPU found: the CUDA driver sees none; the file describes the CPU host".into());
                (GpuKind::Cpu, self.cpus, false)
            }
            Err(e) => {
                notes.push(format!("{e}; the file describes the CPU host"));
                (GpuKind::Cpu, self.cpus, false)
            }
        };
        if !found_gpus {
            notes.push(format!("host {}: {} hardware threads, one CPU rank each", self.hostname, self.cpus));
        }
        let mut per_node = clamp_per_node(per_node);
        let nodes = match &launch {
            Some(l) => {
                notes.push(format!("{} node(s) from {}", l.nodes, l.source));
                if let Some(r) = l.ranks_per_node.filter(|r| *r != per_node) {
                    if found_gpus {
                        notes.push(format!(
                            "the launcher runs {r} rank(s) per node but this node has {per_node} GPU(s); \
                             gpus_per_node is the GPUs"
                        ));
                    } else {
                        per_node = clamp_per_node(r);
                        notes.push(format!("gpus_per_node = {per_node}: the launcher's ranks per node (CPU ranks)"));
                    }
                }
                l.nodes
            }
            None => {
                notes.push("1 node: no Slurm, Open MPI or torchrun environment is set".into());
                1
            }
        };
        let (nics, nic_gbps, nic_efficiency) = match &self.rdma {
            Ok(ports) => {
                let (nics, other) = compute_nics(ports);
                for p in &nics {
                    notes.push(format!("NIC: {}", p.describe()));
                }
                for p in other {
                    notes.push(format!("not counted as a compute NIC: {}", p.describe()));
                }
                if nics.is_empty() {
                    notes.push("no RDMA port is active: the file has no NICs".into());
                }
                // AWS EFA devices are named efa_N (the efa kernel driver) and speak SRD,
                // not InfiniBand: NCCL reaches a share of their line rate only.
                let efa = !nics.is_empty() && nics.iter().all(|p| p.device.starts_with("efa"));
                let efficiency = if efa {
                    notes.push(format!(
                        "the NICs are AWS EFA: nic_efficiency = {EFA_2022_NIC_EFFICIENCY}, the share of line rate \
                         nccl-tests reached over EFA on p4d nodes (2022 software); measure yours with nccl-tests \
                         and `strata collbench --fit LOG`"
                    ));
                    EFA_2022_NIC_EFFICIENCY
                } else {
                    1.0
                };
                (nics.len() as u32, nics.first().and_then(|p| p.gbps).unwrap_or(0.0), efficiency)
            }
            Err(e) => {
                notes.push(format!("{e}; the file has no NICs"));
                (0, 0.0, 1.0)
            }
        };
        let multi = nics > 0;
        if multi {
            notes.push(
                "not visible from one node: the fabric, its switches' radix and latency, oversubscription and \
                 routing; the file has the defaults of a rail-optimised NDR fabric (set them to the real one)"
                    .into(),
            );
        }
        let name = format!("probed-{}", self.hostname);
        let cluster = ClusterSpec {
            name,
            gpu,
            nodes,
            gpus_per_node: per_node,
            nics_per_node: nics,
            nic_gbps,
            fabric: if multi { Fabric::RailOptimized } else { Fabric::SingleSwitch },
            oversubscription: 1.0,
            routing: Routing::Adaptive,
            switch_radix: 64,
            nodes_per_unit: 32,
            switch_latency_ns: 200,
            nic_efficiency,
        };
        cluster.check().map_err(|e| {
            format!("what probe found is not a cluster Strata can load: {e} (found: {})", notes.join("; "))
        })?;
        Ok(Found { cluster, notes })
    }
}

impl Found {
    /// The cluster file: the notes as comments, then a `[cluster]` table with every key.
    pub fn toml(&self) -> String {
        let c = &self.cluster;
        let text = |v: &str| serde_json::to_string(v).unwrap_or_else(|_| "\"probed\"".into());
        let word = |v: serde_json::Value| v.as_str().map(str::to_string).unwrap_or_default();
        let mut out = String::from("# This machine as `strata probe` found it.\n");
        for n in &self.notes {
            out += &format!("# - {}\n", n.replace('\n', " "));
        }
        out += "# Use it as a scenario's [cluster] table, or with `strata collbench --cluster THIS_FILE`.\n";
        out += "[cluster]\n";
        out += &format!("name = {}\n", text(&c.name));
        out += &format!("gpu = {}\n", text(c.gpu.key()));
        out += &format!("nodes = {}\n", c.nodes);
        out += &format!("gpus_per_node = {}\n", c.gpus_per_node);
        out += &format!("nics_per_node = {}\n", c.nics_per_node);
        out += &format!("nic_gbps = {:?}\n", c.nic_gbps);
        out += &format!("fabric = {}\n", text(&word(serde_json::to_value(c.fabric).unwrap_or_default())));
        out += &format!("oversubscription = {:?}\n", c.oversubscription);
        out += &format!("routing = {}\n", text(&word(serde_json::to_value(c.routing).unwrap_or_default())));
        out += &format!("switch_radix = {}\n", c.switch_radix);
        out += &format!("nodes_per_unit = {}\n", c.nodes_per_unit);
        out += &format!("switch_latency_ns = {}\n", c.switch_latency_ns);
        out += &format!("nic_efficiency = {:?}\n", c.nic_efficiency);
        out
    }
}

#[cfg(test)]
mod tests;
