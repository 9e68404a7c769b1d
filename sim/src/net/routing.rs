//! Paths through the fabric between two NIC ports: up to the lowest common tier, then down.
//!
//! - *Static* (OpenSM-style hash ECMP): at every switch with several equal-cost uplinks (or
//!   several parallel links toward the next switch) one link is chosen by a hash of
//!   (switch salt, source port, destination port, lane). Salts come from a ChaCha8 stream
//!   seeded with the network's seed, so which flows collide is fixed by the seed. The lane
//!   is the NCCL channel (each channel is its own QP, so its own hash).
//! - *Adaptive* (per-packet adaptive routing, NCCL's default on IB): the parallel uplinks of
//!   a leaf (or of a pod's spines) toward the next tier act as one trunk of summed
//!   capacity, so a path is [NIC up, leaf-up trunk, (pod-up trunk, pod-down trunk),
//!   leaf-down trunk, NIC down] and the lane does not matter.
//!
//! Paths are interned (`Box<[ResId]>`) and cached per (source, destination, lane); the cache
//! is only ever looked up, never iterated, so its hash order cannot reach a result.
//! Latency of a path = switches traversed × `switch_latency_ns`.

use std::collections::HashMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use strata_models::Routing;

use super::topology::{ResId, Topology};

/// Index of an interned path.
pub type PathId = u32;

/// An interned path: resources in order, and its latency.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    pub res: Box<[ResId]>,
    pub latency_ns: u64,
}

/// Routes NIC-to-NIC flows and caches the results.
#[derive(Clone, Debug)]
pub struct Router {
    mode: Routing,
    leaf_salt: Vec<u64>,
    spine_salt: Vec<u64>,
    core_salt: Vec<u64>,
    cache: HashMap<(u32, u32, u32), PathId>,
    paths: Vec<Path>,
}

/// splitmix64's finaliser: a fixed, well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn pick(salt: u64, src: u32, dst: u32, lane: u32, n: usize) -> usize {
    debug_assert!(n > 0);
    let h = mix(salt ^ mix(((src as u64) << 32) | dst as u64) ^ mix(lane as u64 + 1));
    (h % n as u64) as usize
}

impl Router {
    /// A router for `topo` in `mode`; `seed` salts the static hash.
    pub fn new(topo: &Topology, mode: Routing, seed: u64) -> Router {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut salts = |n: usize| (0..n).map(|_| rng.random::<u64>()).collect::<Vec<u64>>();
        let n_cores = topo.spines.iter().flat_map(|s| s.up.iter().map(|g| g.0 + 1)).max().unwrap_or(0) as usize;
        let leaf_salt = salts(topo.leaves.len());
        let n_spines = topo.leaves.iter().flat_map(|l| l.up.iter().map(|g| g.0 + 1)).max().unwrap_or(0) as usize;
        let spine_salt = salts(n_spines);
        let core_salt = salts(n_cores);
        Router { mode, leaf_salt, spine_salt, core_salt, cache: HashMap::new(), paths: Vec::new() }
    }

    /// The routing mode.
    pub fn mode(&self) -> Routing {
        self.mode
    }

    /// An interned path by id.
    pub fn path(&self, id: PathId) -> &Path {
        &self.paths[id as usize]
    }

    /// Number of distinct paths interned so far.
    pub fn interned(&self) -> usize {
        self.paths.len()
    }

    /// The path from NIC port `src` to NIC port `dst` (endpoints) for `lane`.
    pub fn route(&mut self, topo: &Topology, src: u32, dst: u32, lane: u32) -> PathId {
        let lane = if self.mode == Routing::Adaptive { 0 } else { lane };
        if let Some(&id) = self.cache.get(&(src, dst, lane)) {
            return id;
        }
        let (res, switches) = match self.mode {
            Routing::Adaptive => adaptive(topo, src, dst),
            Routing::Static => self.hashed(topo, src, dst, lane),
        };
        let id = self.paths.len() as PathId;
        self.paths.push(Path { res: res.into_boxed_slice(), latency_ns: switches * topo.switch_latency_ns });
        self.cache.insert((src, dst, lane), id);
        id
    }

    fn hashed(&self, topo: &Topology, src: u32, dst: u32, lane: u32) -> (Vec<ResId>, u64) {
        let (sl, dl) = (topo.leaf_of_endpoint[src as usize], topo.leaf_of_endpoint[dst as usize]);
        let mut res = vec![topo.nic_up(src)];
        if sl == dl || topo.tiers == 1 {
            res.push(topo.nic_down(dst));
            return (res, 1);
        }
        let (s_leaf, d_leaf) = (&topo.leaves[sl as usize], &topo.leaves[dl as usize]);
        let same_pod = topo.tiers == 2 || s_leaf.pod == d_leaf.pod;
        // Leaf uplink: any of the leaf's uplinks (flattened over spines).
        let flat: Vec<(usize, usize)> =
            s_leaf.up.iter().enumerate().flat_map(|(g, grp)| (0..grp.1.len()).map(move |i| (g, i))).collect();
        let (g, i) = flat[pick(self.leaf_salt[sl as usize], src, dst, lane, flat.len())];
        let spine = s_leaf.up[g].0;
        res.push(s_leaf.up[g].1[i]);
        let down_spine = if same_pod {
            spine
        } else {
            let sp = &topo.spines[spine as usize];
            let flat: Vec<(usize, usize)> =
                sp.up.iter().enumerate().flat_map(|(g, grp)| (0..grp.1.len()).map(move |i| (g, i))).collect();
            let (g, i) = flat[pick(self.spine_salt[spine as usize], src, dst, lane, flat.len())];
            let core = sp.up[g].0;
            res.push(sp.up[g].1[i]);
            // Core down to the spine at the same position in the destination pod.
            let target = topo.pods[d_leaf.pod as usize].first_spine + sp.pos;
            let tsp = &topo.spines[target as usize];
            let grp = tsp.up.iter().find(|grp| grp.0 == core).expect("core links every pod's spine j");
            res.push(grp.2[pick(self.core_salt[core as usize], src, dst, lane, grp.2.len())]);
            target
        };
        let grp = d_leaf.up.iter().find(|grp| grp.0 == down_spine).expect("spine links every leaf below it");
        res.push(grp.2[pick(self.spine_salt[down_spine as usize], src, dst, lane, grp.2.len())]);
        res.push(topo.nic_down(dst));
        (res, if same_pod { 3 } else { 5 })
    }
}

fn adaptive(topo: &Topology, src: u32, dst: u32) -> (Vec<ResId>, u64) {
    let (sl, dl) = (topo.leaf_of_endpoint[src as usize], topo.leaf_of_endpoint[dst as usize]);
    let mut res = vec![topo.nic_up(src)];
    if sl == dl || topo.tiers == 1 {
        res.push(topo.nic_down(dst));
        return (res, 1);
    }
    let (s_leaf, d_leaf) = (&topo.leaves[sl as usize], &topo.leaves[dl as usize]);
    res.push(s_leaf.up_trunk);
    let cross_pod = topo.tiers == 3 && s_leaf.pod != d_leaf.pod;
    if cross_pod {
        res.push(topo.pods[s_leaf.pod as usize].up_trunk);
        res.push(topo.pods[d_leaf.pod as usize].down_trunk);
    }
    res.push(d_leaf.down_trunk);
    res.push(topo.nic_down(dst));
    (res, if cross_pod { 5 } else { 3 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use petgraph::visit::EdgeRef;
    use strata_models::{ClusterSpec, Fabric};

    fn topo(nodes: u32) -> Topology {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = nodes;
        c.fabric = Fabric::RailOptimized;
        Topology::new(&c).unwrap()
    }

    /// Static paths are walks in the graph: consecutive resources share a vertex.
    #[test]
    fn static_paths_are_shortest_walks() {
        let t = topo(512);
        let mut r = Router::new(&t, Routing::Static, 1);
        let owner: HashMap<ResId, (usize, usize)> = t
            .graph
            .edge_references()
            .filter_map(|e| e.weight().res.map(|id| (id, (e.source().index(), e.target().index()))))
            .collect();
        for (src, dst, hops) in [(0, 8, 1), (0, 1, 3), (0, t.endpoint(200, 0), 5), (0, t.endpoint(3, 0), 1)] {
            let id = r.route(&t, src, dst, 5);
            let p = r.path(id).clone();
            assert_eq!(p.latency_ns, hops * 200);
            for w in p.res.windows(2) {
                assert_eq!(owner[&w[0]].1, owner[&w[1]].0, "{p:?}");
            }
            let start = owner[&p.res[0]].0;
            let goal = owner[p.res.last().unwrap()].1;
            let goal = petgraph::graph::NodeIndex::new(goal);
            let bfs = petgraph::algo::dijkstra(&t.graph, petgraph::graph::NodeIndex::new(start), Some(goal), |_| 1);
            assert_eq!(bfs[&goal], p.res.len());
        }
    }

    #[test]
    fn paths_are_cached_and_seeded() {
        let t = topo(128);
        let mut a = Router::new(&t, Routing::Static, 7);
        let mut b = Router::new(&t, Routing::Static, 7);
        let (x, y) = (t.endpoint(0, 0), t.endpoint(64, 0));
        let pa: Vec<_> = (0..16)
            .map(|lane| {
                let id = a.route(&t, x, y, lane);
                a.path(id).clone()
            })
            .collect();
        let pb: Vec<_> = (0..16)
            .map(|lane| {
                let id = b.route(&t, x, y, lane);
                b.path(id).clone()
            })
            .collect();
        assert_eq!(pa, pb);
        assert_eq!(a.route(&t, x, y, 3), a.route(&t, x, y, 3));
        let distinct: std::collections::BTreeSet<_> = pa.iter().map(|p| p.res[1]).collect();
        assert!(distinct.len() > 1, "lanes should spread over uplinks");
        let mut ad = Router::new(&t, Routing::Adaptive, 7);
        assert_eq!(ad.route(&t, x, y, 0), ad.route(&t, x, y, 9));
        assert_eq!(ad.path(0).res.len(), 4);
    }
}
