//! What NCCL's topology search would report for a communicator: per algorithm graph,
//! `nChannels` and the per-channel bandwidths `bwIntra` / `bwInter` (GB/s).
//!
//! A stand-in for NVIDIA/nccl v2.30.7 src/graph/search.cc (`ncclTopoCompute`), reduced to
//! the capacities that decide its outcome on NVSwitch nodes with one NIC per rail:
//! - candidate speeds come from NCCL's speed arrays (intra-node arrays when the
//!   communicator is on one node, inter-node arrays otherwise; SM80, SM90, SM100 rows);
//! - at speed s a graph fits n(s) channels: on one node ⌊NVLink / s⌋ for rings (each
//!   channel crosses every GPU's NVSwitch port once); across nodes ⌊NIC / s⌋ channels per
//!   NIC used, and at most ⌊NVLink·ppn/(ppn−1) / s⌋ when ppn > 1 (a channel's exit GPU
//!   leaves through PCIe, not NVLink; NCCL likewise inflates `totalBw` by ndevs/(ndevs−1)
//!   for non-ring patterns);
//! - pass 1 walks the speeds downwards from the largest ≤ maxBw (maxBw = NVLink on one
//!   node, the NIC otherwise), keeps the graph with the largest n·s, stops once n·s reaches
//!   `totalBw` or the next speed is ≤ 0.49 of the best; then `ncclTopoDupChannels` (double
//!   the channels, halve the speed, when s ≥ 25 unless ccMin > 80 ∧ s < 50 ∧ n > 4);
//! - pass 2 raises the speed at fixed channel count: both speeds for rings, bwIntra up to
//!   2·bwInter for trees, bwInter up to 2·bwIntra for NVLS;
//! - the tree graph has exactly the ring's channel count (init.cc: min = max = ring);
//! - NVLS (Hopper+, NVSwitch, ≥ 2 local ranks) searches with min = max channels =
//!   min(32, localRanks) on one node, 1..min(32, localRanks) across nodes (one NIC head
//!   per channel).
//!
//! Results this gives (the figures the tests pin): DGX A100 one node ring 12 × 20 GB/s;
//! DGX A100 multi-node ring 8 × 24 (192 GB/s busbw); DGX H100 one node ring 12 × 30,
//! NVLS 8 channels × 50 intra / 60 inter (480 GB/s busbw); DGX H100 multi-node ring 8 × 48.
//! It is not the real recursive search (no PCIe tree, no cross-NIC, no per-GPU paths):
//! where a `NCCL_DEBUG=INFO` "Pattern … nChannels … bw" line of the target cluster is
//! available, pass it in through [`Graphs`] directly.

use super::node::{Arch, CommShape, NodeNet};

/// One graph: channel count and per-channel bandwidths, GB/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphBw {
    pub n_channels: u32,
    pub bw_intra_gb_per_s: f64,
    pub bw_inter_gb_per_s: f64,
}

/// The graphs the tuning model reads (`graphs[NCCL_ALGO_*]`): PAT uses the tree graph,
/// NVLS and NVLS-tree share the NVLS graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Graphs {
    pub ring: GraphBw,
    pub tree: GraphBw,
    /// `None` when NVLS cannot be built (pre-Hopper, no NVSwitch, one local rank).
    pub nvls: Option<GraphBw>,
}

const SPEED_INTRA_SM80: &[f64] = &[40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0];
const SPEED_INTER_SM80: &[f64] =
    &[48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2, 0.24, 0.12];
const SPEED_INTRA_SM90: &[f64] = &[60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0];
const SPEED_INTER_SM90: &[f64] =
    &[48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12];
const SPEED_INTRA_SM100: &[f64] = &[90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0];
const SPEED_INTER_SM100: &[f64] = &[
    96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12,
];

/// `MAXCHANNELS / 2`: the ring search's channel limit.
const RING_MAX_CHANNELS: u32 = 32;
/// `NCCL_MAX_NVLS_ARITY`.
const NVLS_MAX_ARITY: u32 = 32;

#[derive(Clone, Copy, PartialEq)]
enum Pattern {
    Ring,
    Tree,
    Nvls,
}

/// The search's view of a communicator: what limits channels at a given speed.
struct Caps {
    arch: Arch,
    multi_node: bool,
    ppn: u32,
    nvlink: f64,
    nic: f64,
    nics: u32,
}

impl Caps {
    fn speeds(&self) -> &'static [f64] {
        match (self.arch, self.multi_node) {
            (Arch::Blackwell, false) => SPEED_INTRA_SM100,
            (Arch::Blackwell, true) => SPEED_INTER_SM100,
            (Arch::Hopper, false) => SPEED_INTRA_SM90,
            (Arch::Hopper, true) => SPEED_INTER_SM90,
            (_, false) => SPEED_INTRA_SM80,
            (_, true) => SPEED_INTER_SM80,
        }
    }

    /// NVLink budget per GPU for a pattern (NCCL's `totalBw`, inflated for non-rings).
    fn nvlink_budget(&self, pattern: Pattern) -> f64 {
        let spread = self.ppn > 1 && (self.multi_node || pattern != Pattern::Ring);
        if spread { self.nvlink * self.ppn as f64 / (self.ppn as f64 - 1.0) } else { self.nvlink }
    }

    fn max_bw(&self) -> f64 {
        if self.multi_node { self.nic } else { self.nvlink }
    }

    fn total_bw(&self, pattern: Pattern) -> f64 {
        if self.multi_node && self.ppn <= 1 { self.nic * self.nics as f64 } else { self.nvlink_budget(pattern) }
    }

    /// Channels that fit at speed `s` (intra and inter speed equal).
    fn fits(&self, pattern: Pattern, s: f64) -> u32 {
        let by_nvlink = if self.ppn > 1 || !self.multi_node {
            (self.nvlink_budget(pattern) / s + 1e-9).floor() as u32
        } else {
            u32::MAX
        };
        let by_nic = if self.multi_node { self.nics * (self.nic / s + 1e-9).floor() as u32 } else { u32::MAX };
        by_nvlink.min(by_nic)
    }
}

/// Pass 1: the best (channels, speed) with channels in [min_ch, max_ch].
fn pass1(caps: &Caps, pattern: Pattern, min_ch: u32, max_ch: u32) -> Option<(u32, f64)> {
    let speeds = caps.speeds();
    let (max_bw, total_bw) = (caps.max_bw(), caps.total_bw(pattern));
    let mut i = 0;
    while i + 1 < speeds.len() && (speeds[i] > max_bw || speeds[i] * min_ch as f64 > total_bw) {
        i += 1;
    }
    let mut best: Option<(u32, f64)> = None;
    loop {
        let s = speeds[i];
        let n = caps.fits(pattern, s).min(max_ch);
        if n >= min_ch.max(1) && best.is_none_or(|(bn, bs)| n as f64 * s > bn as f64 * bs) {
            best = Some((n, s));
        }
        if let Some((bn, bs)) = best
            && (bn as f64 * bs >= total_bw || bn == max_ch)
        {
            break;
        }
        let next_ok = best.is_none_or(|(_, bs)| i + 1 < speeds.len() && speeds[i + 1] / bs > 0.49);
        if i + 1 >= speeds.len() || !next_ok {
            break;
        }
        i += 1;
    }
    best
}

/// `ncclTopoDupChannels`.
fn dup_channels(arch: Arch, n: u32, s: f64, max_ch: u32) -> (u32, f64) {
    if s < 25.0 || (arch.comp_cap() > 80 && s < 50.0 && n > 4) {
        return (n, s);
    }
    let dup = (n * 2).min(max_ch);
    (dup, s / dup.div_ceil(n) as f64)
}

fn ring_graph(caps: &Caps) -> GraphBw {
    let Some((n, s)) = pass1(caps, Pattern::Ring, 1, RING_MAX_CHANNELS) else {
        // NCCL's "falling back to simple order": one channel at 0.1 GB/s.
        return GraphBw { n_channels: 1, bw_intra_gb_per_s: 0.1, bw_inter_gb_per_s: 0.1 };
    };
    let (n, mut s) = dup_channels(caps.arch, n, s, RING_MAX_CHANNELS);
    // Pass 2: a higher speed at the same channel count.
    for &faster in caps.speeds().iter().rev() {
        if faster > s && faster <= caps.max_bw() && caps.fits(Pattern::Ring, faster) >= n {
            s = faster;
        }
    }
    GraphBw { n_channels: n, bw_intra_gb_per_s: s, bw_inter_gb_per_s: s }
}

fn tree_graph(caps: &Caps, ring: &GraphBw) -> GraphBw {
    let n = ring.n_channels;
    let Some((_, s)) = pass1(caps, Pattern::Tree, n, n) else {
        return GraphBw { n_channels: n, bw_intra_gb_per_s: 0.1, bw_inter_gb_per_s: 0.1 };
    };
    // Pass 2: raise bwIntra (the NVLink chain) up to 2·bwInter.
    let mut intra = s;
    for &faster in caps.speeds().iter().rev() {
        let nvlink_ok = (caps.ppn <= 1 && caps.multi_node)
            || n as f64 * faster <= caps.nvlink_budget(Pattern::Tree) * (1.0 + 1e-12);
        if faster > intra && faster < 2.0 * s + 1e-9 && nvlink_ok {
            intra = faster;
        }
    }
    GraphBw { n_channels: n, bw_intra_gb_per_s: intra, bw_inter_gb_per_s: s }
}

fn nvls_graph(caps: &Caps) -> Option<GraphBw> {
    let max_ch = NVLS_MAX_ARITY.min(caps.ppn);
    let min_ch = if caps.multi_node { 1 } else { max_ch };
    let (n, s) = pass1(caps, Pattern::Nvls, min_ch, max_ch)?;
    // Pass 2: raise bwInter up to 2·bwIntra. On one node nothing limits it but the array.
    let mut inter = s;
    for &faster in caps.speeds().iter().rev() {
        let net_ok = !caps.multi_node || caps.fits(Pattern::Nvls, faster) >= n;
        if faster > inter && faster < 2.0 * s && net_ok {
            inter = faster;
        }
    }
    Some(GraphBw { n_channels: n, bw_intra_gb_per_s: s, bw_inter_gb_per_s: inter })
}

/// The graphs NCCL would find for a communicator of `shape` on nodes like `node`.
pub fn search(node: &NodeNet, shape: &CommShape) -> Graphs {
    let caps = Caps {
        arch: node.arch,
        multi_node: shape.n_nodes > 1,
        ppn: shape.local_ranks,
        nvlink: node.nvlink_gb_per_s,
        nic: node.nic_gb_per_s,
        nics: shape.nics_used.max(1),
    };
    let ring = ring_graph(&caps);
    let tree = tree_graph(&caps, &ring);
    let nvls_ok = node.arch >= Arch::Hopper && node.nvswitch && shape.local_ranks >= 2;
    let nvls = if nvls_ok { nvls_graph(&caps) } else { None };
    Graphs { ring, tree, nvls }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::ClusterSpec;

    fn graphs(preset: &str, nodes: u32, ranks: &[u32]) -> Graphs {
        let mut c = ClusterSpec::preset(preset).unwrap();
        c.nodes = nodes;
        let node = NodeNet::from_cluster(&c).unwrap();
        search(&node, &node.shape(ranks))
    }

    fn g(n: u32, intra: f64, inter: f64) -> GraphBw {
        GraphBw { n_channels: n, bw_intra_gb_per_s: intra, bw_inter_gb_per_s: inter }
    }

    #[test]
    fn dgx_a100_graphs() {
        let one = graphs("dgx-a100", 1, &(0..8).collect::<Vec<_>>());
        assert_eq!(one.ring, g(12, 20.0, 20.0));
        assert_eq!(one.nvls, None);
        let two = graphs("dgx-a100", 2, &(0..16).collect::<Vec<_>>());
        assert_eq!(two.ring, g(8, 24.0, 24.0));
        // Trees may run the NVLink chain faster than the NIC (2-node tree above NIC rate).
        assert_eq!(two.tree, g(8, 30.0, 24.0));
        let dp = graphs("dgx-a100", 4, &[0, 8, 16, 24]);
        assert_eq!(dp.ring, g(1, 24.0, 24.0));
    }

    #[test]
    fn dgx_h100_graphs() {
        let one = graphs("dgx-h100", 1, &(0..8).collect::<Vec<_>>());
        assert_eq!(one.ring, g(12, 30.0, 30.0));
        assert_eq!(one.nvls, Some(g(8, 50.0, 60.0)));
        let multi = graphs("dgx-h100", 4, &(0..32).collect::<Vec<_>>());
        assert_eq!(multi.ring, g(8, 48.0, 48.0));
        assert_eq!(multi.nvls, Some(g(8, 48.0, 48.0)));
        // One GPU per node: one NIC, duplicated into two channels of half speed.
        let dp = graphs("dgx-h100", 4, &[3, 11, 19, 27]);
        assert_eq!(dp.ring, g(2, 24.0, 24.0));
        assert_eq!(dp.nvls, None);
    }
}
