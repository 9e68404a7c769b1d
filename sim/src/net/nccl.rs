//! NCCL's own cost model, pinned to NVIDIA/nccl v2.30.7 (master 5067397, 2026-06-11).
//!
//! A port of `ncclTopoTuneModel` and `ncclTopoGetAlgoTime` (src/graph/tuning.cc) and of the
//! selection in `topoGetAlgoInfo` (src/enqueue.cc). For each collective, algorithm and
//! protocol it fills a latency (µs) and an algorithm bandwidth (GB/s); a collective of
//! `nBytes` takes
//!
//!   time_us = lat · latCount + nBytes / (1000 · bw)        (latCount = 1: one op)
//!
//! and NCCL runs the (algorithm, protocol) of least time, scanning algorithms in NCCL's
//! index order (Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT) and protocols
//! (LL, LL128, Simple), keeping the first strict minimum. Then it shrinks the channel
//! count for small messages: `while nBytes < nc·nThreads·threadThreshold: nc--`.
//!
//! Bus bandwidth per algorithm (graph `nChannels × bw`, bw = bwIntra if nNodes ≤ 2 else
//! bwInter), then the refinements: Ring LL min(llMaxBw, ½·busBw); Ring LL128
//! min(0.92·busBw, nCh·perChMaxRingLL128); Tree AllReduce min(0.92·busBw, nCh·perChMaxTree);
//! Tree LL min(busBw/3.8, llMaxBw); Tree LL128 min(busBw·(7/9 on one node, else 120/128),
//! nCh·perChMaxTreeLL128); PAT ×0.75; NVLS/NVLSTree per-channel
//! min(bwIntra·nvlsEff·(nCh−1)/nCh·(2 for AllReduce, else (ppn−1)/ppn), bwInter·(2 for a
//! 2-node NVLSTree), perChMaxNVLSTree). busBw → algBw: ×nRanks/nSteps for Ring/NVLS/NVLSTree,
//! ×½ for Tree; non-ring AllGather/ReduceScatter are not converted.
//!
//! Latency: base + Ring (nSteps − nInter)·max(intraLat, netOverhead) + nInter·interLat;
//! Tree 2·((ppn−1)·intraLat + log2(nNodes)·interLat); NVLS intraLat (+ interLat);
//! NVLSTree intraLat + 2·log2(nNodes)·interLat; PAT log2(nNodes)·interLat/3.5 + 2.8·nRanks.
//! At run time: Tree AllReduce bw × treeCorrectionFactor\[proto\]\[log2(nBytes/64)\], and Ring
//! Simple multi-node AllReduce latency ×1.4 (×1.9 before Ampere) once
//! nBytes/(nChannels·nRanks) ≥ 64 (the "plateau effect").
//!
//! Enable rules kept: CollNet (SHARP) is off, so NVLS runs on one node only and CollNet
//! algorithms never; NVLSTree needs ≥ 2 nodes; PAT only for AllGather/ReduceScatter,
//! Simple, and only when nNodes == nRanks; Broadcast/Reduce are ring-only; LL128 on (DGX
//! GPUs and NICs share PCIe switches); NVLS needs ≥ 2 channels and ≥ 2 local ranks.
//!
//! Units: µs and GB/s (1e9 B/s) inside, as NCCL; [`Selection`] also carries ns.

use super::nccl_graph::{GraphBw, Graphs};
use super::node::{Arch, CommShape, CpuVendor};

/// NCCL's algorithms, in its index order (the order matters for ties).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algo {
    Tree,
    Ring,
    CollNetDirect,
    CollNetChain,
    Nvls,
    NvlsTree,
    Pat,
}

pub const ALGOS: [Algo; 7] =
    [Algo::Tree, Algo::Ring, Algo::CollNetDirect, Algo::CollNetChain, Algo::Nvls, Algo::NvlsTree, Algo::Pat];

impl Algo {
    /// The name used in reports: "tree", "ring", "nvls", "nvls-tree", "pat", …
    pub fn key(self) -> &'static str {
        match self {
            Algo::Tree => "tree",
            Algo::Ring => "ring",
            Algo::CollNetDirect => "collnet-direct",
            Algo::CollNetChain => "collnet-chain",
            Algo::Nvls => "nvls",
            Algo::NvlsTree => "nvls-tree",
            Algo::Pat => "pat",
        }
    }
}

/// NCCL's protocols, in its index order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Ll,
    Ll128,
    Simple,
}

pub const PROTOS: [Proto; 3] = [Proto::Ll, Proto::Ll128, Proto::Simple];

impl Proto {
    /// "LL", "LL128", "Simple", as NCCL prints them.
    pub fn key(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

/// The collectives NCCL tunes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllReduce,
}

/// The environment a user would set (`NCCL_ALGO`, `NCCL_PROTO`, `NCCL_NVLS_ENABLE`).
#[derive(Clone, Debug, PartialEq)]
pub struct NcclEnv {
    /// Algorithms allowed (all by default; CollNet is off regardless).
    pub algos: Vec<Algo>,
    /// Protocols allowed (all by default).
    pub protos: Vec<Proto>,
    /// `NCCL_NVLS_ENABLE`: NVLS and NVLSTree (default on).
    pub nvls_enable: bool,
}

impl Default for NcclEnv {
    fn default() -> NcclEnv {
        NcclEnv { algos: ALGOS.to_vec(), protos: PROTOS.to_vec(), nvls_enable: true }
    }
}

impl NcclEnv {
    /// `NCCL_ALGO=<algo>`: only that algorithm.
    pub fn only_algo(algo: Algo) -> NcclEnv {
        NcclEnv { algos: vec![algo], ..NcclEnv::default() }
    }
}

// tuning.cc constants, µs; rows Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT;
// columns LL, LL128, Simple.
const BASE_LAT_US: [[f64; 3]; 7] =
    [[6.8, 14.0, 8.4], [6.6, 14.0, 8.4], [0.0; 3], [0.0; 3], [0.0; 3], [0.0; 3], [8.0, 8.0, 8.0]];
const HW_NVLINK: usize = 0;
const HW_PCI: usize = 1;
const HW_NET: usize = 2;
const HW_LAT_US: [[[f64; 3]; 7]; 3] = [
    [
        [0.6, 1.25, 4.0],
        [0.6, 1.9, 3.4],
        [0.0, 0.0, 3.7],
        [0.0, 0.0, 2.8],
        [0.0, 0.0, 25.0],
        [0.0, 0.0, 25.0],
        [0.0, 0.0, 4.0],
    ],
    [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0.0, 0.0, 3.7], [0.0, 0.0, 2.8], [0.0; 3], [0.0; 3], [0.0, 0.0, 4.0]],
    [
        [5.0, 8.5, 14.0],
        [2.7, 4.0, 14.0],
        [0.0, 0.0, 31.0],
        [0.0, 0.0, 30.0],
        [0.0, 0.0, 18.0],
        [0.0, 0.0, 20.9],
        [0.0, 0.0, 14.0],
    ],
];
// Rows: Volta-N1 / Intel-N2 / Intel-N4; Ampere-N1 / AMD-N2 / AMD-N4; Hopper-N1; Blackwell-N1.
const LL_MAX_BW: [[f64; 3]; 4] =
    [[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [2.0 * 141.0, 2.0 * 45.0, 2.0 * 35.0]];
const PER_CH_MAX_RING_LL128: [[f64; 3]; 4] =
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 36.7], [40.0, 40.0, 40.0]];
const PER_CH_MAX_TREE_LL128: [[f64; 3]; 4] =
    [[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]];
const PER_CH_MAX_TREE: [[f64; 3]; 4] = [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]];
const PER_CH_MAX_NVLS_TREE: [[f64; 3]; 4] =
    [[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]];
const NVLS_EFFICIENCY: [f64; 4] = [0.0, 0.0, 0.85, 0.74];
const TREE_CORRECTION: [[f64; 24]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0,
        1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0,
        1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9,
        0.9, 0.9,
    ],
];
/// Bytes of work per thread before adding channels: LL, LL128, Simple (comm.h).
const THREAD_THRESHOLD: [u64; 3] = [8, 8, 64];
/// `NCCL_LL_MAX_NTHREADS`, `NCCL_LL128_MAX_NTHREADS`, `NCCL_SIMPLE_MAX_NTHREADS`.
const MAX_THREADS: [u64; 3] = [512, 640, 512];
/// `PCI_BW`: a ring slower than this uses 256 Simple threads.
const PCI_BW_GB_PER_S: f64 = 12.0;
const MAX_CHANNELS: u32 = 64;

/// NCCL's `log2i` (`log2Down`): ⌊log2 n⌋, −1 for 0.
fn log2i(n: u64) -> i32 {
    if n == 0 { -1 } else { 63 - n.leading_zeros() as i32 }
}

/// What NCCL decides for one collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Selection {
    pub algo: Algo,
    pub proto: Proto,
    /// Channels the kernel runs with (after the small-message shrink).
    pub n_channels: u32,
    /// Latency term, µs, with the run-time corrections.
    pub latency_us: f64,
    /// Algorithm bandwidth, GB/s, with the run-time corrections.
    pub algbw_gb_per_s: f64,
    /// `latency_us + nBytes / (1000 · algbw)`, the estimate NCCL minimised.
    pub time_us: f64,
}

impl Selection {
    /// The latency term in whole ns (rounded up).
    pub fn latency_ns(&self) -> u64 {
        (self.latency_us * 1e3).ceil() as u64
    }

    /// The bandwidth term of `bytes` in whole ns (rounded up).
    pub fn transfer_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 / (self.algbw_gb_per_s * 1e9) * 1e9).ceil() as u64
    }

    /// The whole time in ns: latency and transfer, each rounded up.
    pub fn time_ns(&self, bytes: u64) -> u64 {
        self.latency_ns() + self.transfer_ns(bytes)
    }
}

/// NCCL's cost tables for one communicator shape.
#[derive(Clone, Debug)]
pub struct Tuner {
    shape: CommShape,
    arch: Arch,
    graphs: Graphs,
    /// [func][algo][proto], GB/s (algorithm bandwidth); 0 = disabled.
    bw: [[[f64; 3]; 7]; 5],
    /// [func][algo][proto], µs.
    lat: [[[f64; 3]; 7]; 5],
    /// Runtime channels (`comm->nChannels`).
    comm_channels: u32,
    /// `comm->nvlsChannels`.
    nvls_channels: u32,
    ring_simple_threads: u64,
}

fn func_index(f: Func) -> usize {
    match f {
        Func::Broadcast => 0,
        Func::Reduce => 1,
        Func::AllGather => 2,
        Func::ReduceScatter => 3,
        Func::AllReduce => 4,
    }
}

const FUNCS: [Func; 5] = [Func::Broadcast, Func::Reduce, Func::AllGather, Func::ReduceScatter, Func::AllReduce];

impl Tuner {
    /// `ncclTopoTuneModel` for a communicator of `shape` with `graphs`.
    pub fn new(arch: Arch, cpu: CpuVendor, shape: CommShape, graphs: Graphs, env: &NcclEnv) -> Tuner {
        let mut t = Tuner {
            shape,
            arch,
            graphs,
            bw: [[[0.0; 3]; 7]; 5],
            lat: [[[0.0; 3]; 7]; 5],
            comm_channels: comm_channels(arch, &shape, &graphs.ring),
            nvls_channels: match arch {
                Arch::Blackwell if shape.n_nodes > 1 => 32,
                Arch::Blackwell => 24,
                _ => 16,
            },
            ring_simple_threads: if graphs.ring.bw_intra_gb_per_s * graphs.ring.n_channels as f64 <= PCI_BW_GB_PER_S {
                256
            } else {
                512
            },
        };
        if shape.n_ranks <= 1 {
            return t;
        }
        for f in FUNCS {
            for a in ALGOS {
                for p in PROTOS {
                    let enabled = env.algos.contains(&a) && env.protos.contains(&p) && t.enabled(f, a, p, env);
                    if enabled {
                        let (bw, lat) = t.model(f, a, p, cpu);
                        t.bw[func_index(f)][a as usize][p as usize] = bw;
                        t.lat[func_index(f)][a as usize][p as usize] = lat;
                    }
                }
            }
        }
        t
    }

    fn graph(&self, a: Algo) -> Option<&GraphBw> {
        match a {
            Algo::Ring => Some(&self.graphs.ring),
            Algo::Tree | Algo::Pat => Some(&self.graphs.tree),
            Algo::Nvls | Algo::NvlsTree => self.graphs.nvls.as_ref(),
            Algo::CollNetDirect | Algo::CollNetChain => None,
        }
    }

    /// The combinations tuning.cc and the enable matrix leave on.
    fn enabled(&self, f: Func, a: Algo, p: Proto, env: &NcclEnv) -> bool {
        let s = &self.shape;
        let ring_only = matches!(f, Func::Broadcast | Func::Reduce);
        let ag_rs = matches!(f, Func::AllGather | Func::ReduceScatter);
        let algo_ok = match a {
            Algo::Ring => true,
            Algo::Tree => f == Func::AllReduce,
            Algo::CollNetDirect | Algo::CollNetChain => false,
            Algo::Nvls => {
                s.n_nodes == 1 && (f == Func::AllReduce || ag_rs) && (f == Func::AllReduce || s.local_ranks <= 32)
            }
            Algo::NvlsTree => s.n_nodes > 1 && f == Func::AllReduce,
            Algo::Pat => ag_rs && p == Proto::Simple && s.n_nodes == s.n_ranks,
        };
        let nvls = matches!(a, Algo::Nvls | Algo::NvlsTree);
        let nvls_ok =
            !nvls || (env.nvls_enable && p == Proto::Simple && self.graph(a).is_some_and(|g| g.n_channels >= 2));
        algo_ok && nvls_ok && !(ring_only && a != Algo::Ring)
    }

    /// (algBw GB/s, latency µs) of one enabled combination.
    fn model(&self, f: Func, a: Algo, p: Proto, cpu: CpuVendor) -> (f64, f64) {
        let s = &self.shape;
        let g = self.graph(a).copied().expect("enabled algorithms have a graph");
        let (n_nodes, n_ranks) = (s.n_nodes, s.n_ranks);
        let cc = self.arch.index();
        let index2 = (n_nodes.min(3) - 1) as usize;
        let index1 = if n_nodes == 1 {
            cc
        } else if cpu == CpuVendor::Amd {
            1
        } else {
            0
        };
        let ll_max_bw = LL_MAX_BW[index1][index2];
        let ppn = s.ppn();
        let n_steps = match f {
            Func::AllReduce => 2 * (n_ranks - 1),
            Func::AllGather | Func::ReduceScatter => n_ranks - 1,
            _ => n_ranks,
        } as f64;
        let nch = g.n_channels as f64;

        let mut bw = if n_nodes <= 2 { g.bw_intra_gb_per_s } else { g.bw_inter_gb_per_s };
        if matches!(a, Algo::Nvls | Algo::NvlsTree) {
            let mut intra = g.bw_intra_gb_per_s * NVLS_EFFICIENCY[cc] * (nch - 1.0) / nch;
            intra *= if f == Func::AllReduce { 2.0 } else { (ppn - 1.0) / ppn };
            let inter = g.bw_inter_gb_per_s * if n_nodes <= 2 && a == Algo::NvlsTree { 2.0 } else { 1.0 };
            let cap = if a == Algo::NvlsTree { PER_CH_MAX_NVLS_TREE[cc][index2] } else { f64::MAX };
            bw = intra.min(inter).min(cap);
        }
        let mut bus = nch * bw;
        if a == Algo::Ring && p == Proto::Ll {
            bus = ll_max_bw.min(bus * 0.5);
        }
        if a == Algo::Ring && p == Proto::Ll128 {
            bus = (bus * 0.92).min(nch * PER_CH_MAX_RING_LL128[cc][index2]);
        }
        if a == Algo::Tree && f == Func::AllReduce {
            bus = (bus * 0.92).min(nch * PER_CH_MAX_TREE[cc][index2]);
        }
        if a == Algo::Tree && p == Proto::Ll {
            bus = (bus / 3.8).min(ll_max_bw);
        }
        if a == Algo::Tree && p == Proto::Ll128 {
            let f128 = if n_nodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 };
            bus = (bus * f128).min(nch * PER_CH_MAX_TREE_LL128[cc][index2]);
        }
        if a == Algo::Pat {
            bus *= 0.75;
        }
        let converts = !(a != Algo::Ring && matches!(f, Func::AllGather | Func::ReduceScatter));
        if converts {
            bus *= if matches!(a, Algo::Ring | Algo::Nvls | Algo::NvlsTree) { n_ranks as f64 / n_steps } else { 0.5 };
        }
        (bus, self.latency(f, a, p, cpu, n_steps))
    }

    fn latency(&self, f: Func, a: Algo, p: Proto, cpu: CpuVendor, n_steps: f64) -> f64 {
        let s = &self.shape;
        let (ai, pi) = (a as usize, p as usize);
        let intra_hw =
            if self.arch == Arch::Volta && !matches!(a, Algo::Nvls | Algo::NvlsTree) { HW_PCI } else { HW_NVLINK };
        let hw = if s.n_nodes == 1 { intra_hw } else { HW_NET };
        let mut intra_lat = HW_LAT_US[intra_hw][ai][pi];
        // With one rank per node latencies are fully exposed: use the tree's network latency.
        // latencyInter is 0 on InfiniBand, so the Simple "flush" term adds nothing.
        let inter_lat = if s.local_ranks == 1 && s.n_nodes == s.n_ranks {
            HW_LAT_US[HW_NET][Algo::Tree as usize][pi]
        } else {
            HW_LAT_US[HW_NET][ai][pi]
        };
        let log2_nodes = log2i(s.n_nodes as u64) as f64;
        let ppn_minus_1 = (s.n_ranks / s.n_nodes - 1) as f64;
        let base = BASE_LAT_US[ai][pi];
        match a {
            Algo::Ring => {
                if matches!(f, Func::Broadcast | Func::Reduce) {
                    // sameChannels graphs (DGX): one hop's latency.
                    base + HW_LAT_US[hw][ai][pi]
                } else {
                    let mut net_overhead = 0.0;
                    if s.n_nodes > 1 {
                        net_overhead = if cpu == CpuVendor::Amd { 2.0 } else { 1.0 };
                        if p == Proto::Simple {
                            net_overhead *= 3.0;
                        }
                    }
                    intra_lat = intra_lat.max(net_overhead);
                    let n_inter = match (s.n_nodes, f) {
                        (1, _) => 0.0,
                        (n, Func::AllReduce) => 2.0 * (n - 1) as f64,
                        (n, _) => (n - 1) as f64,
                    };
                    base + (n_steps - n_inter) * intra_lat + n_inter * inter_lat
                }
            }
            Algo::Tree if f == Func::AllReduce => base + 2.0 * (ppn_minus_1 * intra_lat + log2_nodes * inter_lat),
            Algo::Nvls => intra_lat + if s.n_nodes > 1 { inter_lat } else { 0.0 },
            Algo::NvlsTree => base + intra_lat + 2.0 * log2_nodes * inter_lat,
            Algo::Pat => base + log2_nodes * (inter_lat / 3.5) + s.n_ranks as f64 * 2.8,
            _ => base,
        }
    }

    /// `ncclTopoGetAlgoTime` with one op: (time µs, latency µs, bw GB/s), `None` if off.
    pub fn algo_time(&self, f: Func, a: Algo, p: Proto, n_bytes: u64) -> Option<(f64, f64, f64)> {
        let mut bw = self.bw[func_index(f)][a as usize][p as usize];
        let mut lat = self.lat[func_index(f)][a as usize][p as usize];
        if bw <= 0.0 {
            return None;
        }
        let log_size = log2i(n_bytes >> 6);
        if a == Algo::Tree && f == Func::AllReduce && (0..23).contains(&log_size) {
            bw *= TREE_CORRECTION[p as usize][log_size as usize];
        }
        let plateau = n_bytes / (self.comm_channels as u64 * self.shape.n_ranks as u64) >= 64;
        if a == Algo::Ring && p == Proto::Simple && self.shape.n_nodes > 1 && f == Func::AllReduce && plateau {
            lat *= if self.arch.comp_cap() < 80 { 1.9 } else { 1.4 };
        }
        Some((lat + n_bytes as f64 / (1000.0 * bw), lat, bw))
    }

    /// What NCCL runs for `n_bytes` of `f` (nccl-tests' S: the whole buffer).
    pub fn select(&self, f: Func, n_bytes: u64) -> Selection {
        if self.shape.n_ranks <= 1 {
            let algbw_gb_per_s = f64::INFINITY;
            return Selection {
                algo: Algo::Ring,
                proto: Proto::Simple,
                n_channels: 1,
                latency_us: 0.0,
                algbw_gb_per_s,
                time_us: 0.0,
            };
        }
        let mut best: Option<(f64, Algo, Proto, f64, f64)> = None;
        for a in ALGOS {
            for p in PROTOS {
                if let Some((t, lat, bw)) = self.algo_time(f, a, p, n_bytes)
                    && best.is_none_or(|b| t < b.0)
                {
                    best = Some((t, a, p, lat, bw));
                }
            }
        }
        // Ring Simple is always enabled unless the environment removed it; fall back to the
        // least restricted choice rather than failing.
        let (time_us, algo, proto, latency_us, algbw_gb_per_s) = best.unwrap_or_else(|| {
            let fallback = Tuner::new(self.arch, CpuVendor::Intel, self.shape, self.graphs, &NcclEnv::default());
            let s = fallback.select(f, n_bytes);
            (s.time_us, s.algo, s.proto, s.latency_us, s.algbw_gb_per_s)
        });
        let n_channels = self.channels(algo, proto, n_bytes);
        Selection { algo, proto, n_channels, latency_us, algbw_gb_per_s, time_us }
    }

    /// Channel tuning of `topoGetAlgoInfo`.
    fn channels(&self, a: Algo, p: Proto, n_bytes: u64) -> u32 {
        if matches!(a, Algo::Nvls | Algo::NvlsTree) {
            return if self.shape.n_nodes > 1 && a == Algo::Nvls {
                self.nvls_channels.min(self.comm_channels)
            } else {
                self.nvls_channels
            };
        }
        let mut nc = self.comm_channels as u64;
        // tuning.cc never sets maxThreads for PAT: 0 threads, so no small-message shrink.
        let nt = match (a, p) {
            (Algo::Pat, _) => 0,
            (Algo::Ring, Proto::Simple) => self.ring_simple_threads,
            _ => MAX_THREADS[p as usize],
        };
        let mut threshold = THREAD_THRESHOLD[p as usize];
        if a == Algo::Ring && p == Proto::Ll {
            threshold *= self.shape.n_ranks as u64;
        }
        while n_bytes < nc * nt * threshold && nc >= 2 {
            nc -= 1;
        }
        nc as u32
    }

    /// The runtime channel count (`comm->nChannels`).
    pub fn comm_channels(&self) -> u32 {
        self.comm_channels
    }

    /// The graphs this tuner was built from.
    pub fn graphs(&self) -> &Graphs {
        &self.graphs
    }
}

/// NCCL's choice and predicted time for `func` of `n_bytes` over global `ranks` of
/// `cluster` (placement contiguous, graphs from [`super::nccl_graph::search`]).
pub fn predict(
    cluster: &strata_models::ClusterSpec,
    ranks: &[u32],
    func: Func,
    n_bytes: u64,
    env: &NcclEnv,
) -> Result<Selection, super::NetError> {
    let node = super::node::NodeNet::from_cluster(cluster)?;
    let shape = node.shape(ranks);
    let graphs = super::nccl_graph::search(&node, &shape);
    Ok(Tuner::new(node.arch, node.cpu, shape, graphs, env).select(func, n_bytes))
}

/// Runtime channels: graph ×2 (connect.cc), ×2 again on Hopper+ multi-node rings faster
/// than 45 GB/s per channel with fewer than 16 channels.
fn comm_channels(arch: Arch, shape: &CommShape, ring: &GraphBw) -> u32 {
    let mut n = (ring.n_channels * 2).min(MAX_CHANNELS);
    if arch >= Arch::Hopper && shape.n_nodes > 1 && ring.bw_intra_gb_per_s > 45.0 && n < 16 {
        n = (n * 2).min(MAX_CHANNELS);
    }
    n
}

#[cfg(test)]
mod tests;
