//! Paths between two NIC ports, whatever the fabric: the fabric's route (its
//! [`FabricTopology::route`]) between the source's NIC port and the destination's, interned
//! and cached; and the seeded ECMP hash that fabrics with static routing share.
//!
//! - *Static* (OpenSM-style hash ECMP): at every switch with several equal-cost uplinks (or
//!   several parallel links toward the next switch) one link is chosen by [`ecmp`], a hash
//!   of (switch salt, source port, destination port, lane). Salts come from a ChaCha8
//!   stream seeded with the network's seed ([`salts`]), so which flows collide is fixed by
//!   the seed. The lane is the NCCL channel (each channel is its own QP, so its own hash).
//! - *Adaptive* (per-packet adaptive routing, NCCL's default on IB): parallel links toward
//!   the next tier act as one trunk of summed capacity, so the lane does not matter and the
//!   router caches one path per (source, destination).
//!
//! - *Links down* (a what-if, [`super::faults`]): under static routing a flow whose hashed
//!   path crosses a down link is hashed again with its lane moved by [`REHASH_STRIDE`] (up
//!   to [`REHASH_TRIES`] times), else takes a shortest surviving path (breadth-first, in
//!   edge order); flows whose paths survive keep them. Under adaptive routing the trunks
//!   already hold only what survives. A path left with a down link is caught by the
//!   network, which refuses the run naming the pair.
//!
//! Path = [NIC up of the source, the fabric's route…, NIC down of the destination].
//! Latency of a path = switches traversed × `switch_latency_ns`. Paths are interned
//! (`Box<[ResId]>`) in first-use order and cached per (source, destination, lane) in a
//! `BTreeMap`.

use std::collections::BTreeMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[cfg(doc)]
use super::topology::FabricTopology;
use petgraph::Direction;
use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;

use super::topology::{ResId, Route, Topology};

/// Index of an interned path.
pub type PathId = u32;

/// An interned path: resources in order, and its latency.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    pub res: Box<[ResId]>,
    pub latency_ns: u64,
}

/// Routes NIC-to-NIC flows through a topology's fabric and caches the results.
#[derive(Clone, Debug)]
pub struct Router {
    lanes_matter: bool,
    cache: BTreeMap<(u32, u32, u32), PathId>,
    paths: Vec<Path>,
}

/// splitmix64's finaliser: a fixed, well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Static ECMP: which of `n` equal-cost links a switch with `salt` gives the flow
/// (`src` → `dst` endpoints, `lane`).
pub fn ecmp(salt: u64, src: u32, dst: u32, lane: u32, n: usize) -> usize {
    debug_assert!(n > 0);
    let h = mix(salt ^ mix(((src as u64) << 32) | dst as u64) ^ mix(lane as u64 + 1));
    (h % n as u64) as usize
}

/// Per-switch hash salts from the stream seeded with `seed`: one vector per entry of
/// `switches` (a tier's switch count), drawn in that order.
pub fn salts(seed: u64, switches: &[usize]) -> Vec<Vec<u64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    switches.iter().map(|&n| (0..n).map(|_| rng.random::<u64>()).collect()).collect()
}

/// Lane offset between re-hashes of a flow whose path crosses a down link.
pub const REHASH_STRIDE: u32 = 1 << 16;

/// Re-hashes tried before the shortest surviving path.
pub const REHASH_TRIES: u32 = 64;

/// The fabric's route, or — when it crosses a down link under static routing — the first
/// re-hashed one that survives, else a shortest surviving one, else the fabric's own.
fn surviving(topo: &Topology, src: u32, dst: u32, lane: u32, lanes_matter: bool) -> Route {
    let crosses = |r: &Route| r.res.iter().any(|&x| topo.is_down(x));
    let first = topo.fabric().route(src, dst, lane);
    if topo.down.is_empty() || !lanes_matter || !crosses(&first) {
        return first;
    }
    for k in 1..=REHASH_TRIES {
        let r = topo.fabric().route(src, dst, lane.wrapping_add(k.wrapping_mul(REHASH_STRIDE)));
        if !crosses(&r) {
            return r;
        }
    }
    shortest_surviving(topo, src, dst).unwrap_or(first)
}

/// Breadth-first from the source port's switch to the destination port's over switch
/// links that are up (edges in the graph's order, so the result is fixed).
fn shortest_surviving(topo: &Topology, src: u32, dst: u32) -> Option<Route> {
    let g = &topo.graph;
    let from = g.edges(topo.nic_vertex(src)).find(|e| e.weight().res == Some(topo.nic_up(src)))?.target();
    let to = g
        .edges_directed(topo.nic_vertex(dst), Direction::Incoming)
        .find(|e| e.weight().res == Some(topo.nic_down(dst)))?
        .source();
    let mut prev: BTreeMap<NodeIndex, (NodeIndex, ResId)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(v) = queue.pop_front() {
        if v == to {
            let mut res = Vec::new();
            let mut at = to;
            while at != from {
                let (p, r) = prev[&at];
                res.push(r);
                at = p;
            }
            res.reverse();
            let switches = res.len() as u32 + 1;
            return Some(Route { res, switches });
        }
        for e in g.edges(v) {
            let Some(r) = e.weight().res else { continue };
            let w = e.target();
            if topo.resources[r as usize].kind.is_fabric() && !topo.is_down(r) && w != from && !prev.contains_key(&w) {
                prev.insert(w, (v, r));
                queue.push_back(w);
            }
        }
    }
    None
}

impl Router {
    /// A router for `topo`'s fabric.
    pub fn new(topo: &Topology) -> Router {
        Router { lanes_matter: topo.fabric().lanes_matter(), cache: BTreeMap::new(), paths: Vec::new() }
    }

    /// An interned path by id.
    pub fn path(&self, id: PathId) -> &Path {
        &self.paths[id as usize]
    }

    /// Number of distinct paths interned so far.
    pub fn interned(&self) -> usize {
        self.paths.len()
    }

    /// The path from NIC port `src` to NIC port `dst` (endpoints, distinct) for `lane`.
    pub fn route(&mut self, topo: &Topology, src: u32, dst: u32, lane: u32) -> PathId {
        let lane = if self.lanes_matter { lane } else { 0 };
        if let Some(&id) = self.cache.get(&(src, dst, lane)) {
            return id;
        }
        let route = surviving(topo, src, dst, lane, self.lanes_matter);
        let mut res = Vec::with_capacity(route.res.len() + 2);
        res.push(topo.nic_up(src));
        res.extend_from_slice(&route.res);
        res.push(topo.nic_down(dst));
        let id = self.paths.len() as PathId;
        let latency_ns = route.switches as u64 * topo.switch_latency_ns;
        self.paths.push(Path { res: res.into_boxed_slice(), latency_ns });
        self.cache.insert((src, dst, lane), id);
        id
    }
}
