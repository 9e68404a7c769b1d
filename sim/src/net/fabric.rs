//! The fabric network: NCCL's choice laid onto the topology as one max-min variable per
//! active collective (network-and-collectives.md §6.1).
//!
//! A request of S bytes starts at t₀. NCCL's tuning model ([`super::nccl`]) picks
//! (algorithm, protocol, channels) and predicts t = α + S/B_alg. The request then
//! 1. waits its latency α (NCCL's latency term, µs → ns, rounded up), and
//! 2. joins the solver as a variable of S progress bytes with rate bound B_alg (NCCL's
//!    algorithm bandwidth, so protocol and SM limits stay in) and coefficients a_l =
//!    bytes on link l per progress byte ([`super::layout`]). It completes when its bytes
//!    are done.
//!
//! Alone on an idle fabric with adaptive routing the links do not bind below B_alg for the
//! layouts NCCL's bandwidths come from (checked for the DGX shapes in the validation tests),
//! so the time is NCCL's α + S/B_alg to the ns; with static routing a collective's own
//! channels can collide on an uplink and run slower, as on a real fabric. Concurrent
//! requests slow each other exactly where their coefficients share a link. Send/recv and
//! all-to-all are not tuned by NCCL: α = baseLat + hwLat of Ring/Simple (11.8 µs over
//! NVLink, 22.4 µs over the network, as SimAI's per-flow delay), plus the path's switch
//! latency for send/recv; their rate is bounded by the links (send/recv also by one NIC or
//! the GPU's NVLink).
//!
//! Multiplicity m: a request stands for m identical copies on other GPUs. Each copy has its
//! own GPUs, NVLinks and NIC ports, so those coefficients count once. In the switch fabric
//! the copies are taken to be spread evenly over each tier (leaf uplinks, leaf downlinks,
//! spine uplinks, spine downlinks; trunks likewise): if one copy uses u of a tier's N links,
//! m copies overlap max(1, m·u/N)-fold there, and the coefficients on that tier are
//! multiplied by that factor. Rail-aligned copies (a DP group and its twins on the other
//! rails, or in other units) thus do not overlap until the tier is full; copies that in
//! truth crowd onto the same spine links are under-counted, so check symmetric mode against
//! full mode at a smaller scale. The rate bound and the weight stay those of one copy, so
//! each copy gets one fair share.
//!
//! Units: ns (u64) at the interface, bytes and bytes/s inside.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use strata_models::ClusterSpec;
use strata_models::plan::CollKind;

use super::faults::LinkFaults;
use super::layout::{self, Plan};
use super::maxmin::{CnstId, MaxMin, SolverStats, VarId};
use super::nccl::{Algo, Func, NcclEnv, Selection, Tuner};
use super::nccl_graph::{self, Graphs};
use super::node::CommShape;
use super::routing::Router;
use super::topology::{ResId, ResKind, Topology};
use super::{CommChoice, CommId, CommKind, CommRequest, NetError, Network};

/// NCCL's Ring/Simple base + hop latency for p2p, µs (tuning.cc): NVLink, network.
const P2P_LATENCY_US: [f64; 2] = [8.4 + 3.4, 8.4 + 14.0];

/// The NCCL function that tunes a request, `None` for the untuned (send/recv, all-to-all).
fn tuned(kind: CommKind) -> Option<Func> {
    Some(match kind {
        CommKind::Collective(CollKind::AllReduce) => Func::AllReduce,
        CommKind::Collective(CollKind::AllGather) => Func::AllGather,
        CommKind::Collective(CollKind::ReduceScatter) => Func::ReduceScatter,
        CommKind::Collective(CollKind::Broadcast) => Func::Broadcast,
        CommKind::Collective(CollKind::AllToAll | CollKind::RingExchange) | CommKind::SendRecv => return None,
    })
}

/// How a started request is carried.
#[derive(Clone, Debug)]
struct Comm {
    bytes: u64,
    bound_bytes_per_s: f64,
    elems: Arc<[(ResId, f64)]>,
    multiplicity: u32,
    var: Option<VarId>,
}

/// Key of the layout cache: the request's shape and the plan.
type LayoutKey = (CommKind, Vec<u32>, u8, u32, u32);

/// The contention-aware fabric model.
pub struct FabricNetwork {
    topo: Topology,
    router: Router,
    solver: MaxMin,
    env: NcclEnv,
    /// Solver constraint of each resource, created on first use (`u32::MAX`: none yet).
    res_cnst: Vec<CnstId>,
    tuners: BTreeMap<CommShape, Arc<Tuner>>,
    layouts: BTreeMap<LayoutKey, Arc<[(ResId, f64)]>>,
    /// Requests not yet completed.
    comms: BTreeMap<CommId, Comm>,
    /// Request carried by each solver slot.
    var_comm: Vec<CommId>,
    /// Requests in their latency phase: (activation ns, id).
    pending: BTreeSet<(u64, CommId)>,
    next_id: CommId,
    /// The first communication that had to cross a link that is down (no path survived).
    broken: Option<String>,
}

impl FabricNetwork {
    /// The fabric of `cluster`; `seed` salts static routing.
    pub fn new(cluster: &ClusterSpec, seed: u64, env: NcclEnv) -> Result<FabricNetwork, NetError> {
        FabricNetwork::with_faults(cluster, seed, env, &LinkFaults::default())
    }

    /// The fabric of `cluster` with link what-ifs applied ([`super::faults`]).
    pub fn with_faults(
        cluster: &ClusterSpec,
        seed: u64,
        env: NcclEnv,
        faults: &LinkFaults,
    ) -> Result<FabricNetwork, NetError> {
        let mut topo = Topology::new(cluster, seed)?;
        super::faults::apply(&mut topo, faults)?;
        let router = Router::new(&topo);
        let n_res = topo.resources.len();
        Ok(FabricNetwork {
            topo,
            router,
            solver: MaxMin::new(),
            env,
            res_cnst: vec![u32::MAX; n_res],
            tuners: BTreeMap::new(),
            layouts: BTreeMap::new(),
            comms: BTreeMap::new(),
            var_comm: Vec::new(),
            pending: BTreeSet::new(),
            next_id: 0,
            broken: None,
        })
    }

    /// The topology (for reports and tests).
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Solver counters (for benchmarks).
    pub fn solver_stats(&self) -> SolverStats {
        self.solver.stats
    }

    /// Current progress rate of a started request, bytes/s (0 in its latency phase or done).
    pub fn rate_bytes_per_s(&self, id: CommId) -> f64 {
        self.comms.get(&id).and_then(|c| c.var).map_or(0.0, |v| self.solver.rate(v))
    }

    /// Uses `graphs` for every communicator shaped like `ranks`, in place of the search
    /// stand-in: for calibration from a real cluster's `NCCL_DEBUG=INFO` graph lines.
    pub fn override_graphs(&mut self, ranks: &[u32], graphs: Graphs) {
        let shape = self.topo.node.shape(ranks);
        let node = &self.topo.node;
        self.tuners.insert(shape, Arc::new(Tuner::new(node.arch, node.cpu, shape, graphs, &self.env)));
    }

    fn tuner(&mut self, ranks: &[u32]) -> Arc<Tuner> {
        let shape = self.topo.node.shape(ranks);
        if let Some(t) = self.tuners.get(&shape) {
            return t.clone();
        }
        let node = &self.topo.node;
        let graphs = nccl_graph::search(node, &shape);
        let t = Arc::new(Tuner::new(node.arch, node.cpu, shape, graphs, &self.env));
        self.tuners.insert(shape, t.clone());
        t
    }

    /// NCCL's selection for a tuned collective, or `None` for send/recv and all-to-all.
    fn selection(&mut self, req: &CommRequest) -> Option<(Selection, u32)> {
        let func = tuned(req.kind)?;
        let tuner = self.tuner(&req.ranks);
        let sel = tuner.select(func, req.bytes);
        let g = tuner.graphs();
        let graph_channels = match sel.algo {
            Algo::Ring => g.ring.n_channels,
            Algo::Nvls | Algo::NvlsTree => g.nvls.map_or(1, |n| n.n_channels),
            _ => g.tree.n_channels,
        };
        Some((sel, graph_channels))
    }

    /// Latency (ns), rate bound (bytes/s) and plan of a request.
    fn plan(&mut self, req: &CommRequest) -> (u64, f64, Plan) {
        if let Some((sel, graph_channels)) = self.selection(req) {
            let plan = Plan { algo: sel.algo, channels: sel.n_channels, graph_channels };
            return (sel.latency_ns(), sel.algbw_gb_per_s * 1e9, plan);
        }
        let node = &self.topo.node;
        let shape = node.shape(&req.ranks);
        let multi = shape.n_nodes > 1;
        let mut latency_ns = (P2P_LATENCY_US[multi as usize] * 1e3).ceil() as u64;
        let nvlink = node.nvlink_gb_per_s * 1e9;
        let bound = match req.kind {
            CommKind::SendRecv => {
                let (a, b) = (req.ranks[0], req.ranks[1]);
                if multi && node.nics_per_node > 0 {
                    let rail = node.rail_of_local(node.local_of(b));
                    let (s, d) = (self.topo.endpoint(node.node_of(a), rail), self.topo.endpoint(node.node_of(b), rail));
                    let p = self.router.route(&self.topo, s, d, 0);
                    latency_ns += self.router.path(p).latency_ns;
                    node.nic_delivered_gb_per_s() * 1e9
                } else {
                    nvlink
                }
            }
            // Every member's block crosses one link to the next member at once.
            CommKind::Collective(CollKind::RingExchange) => {
                if multi {
                    node.nic_delivered_gb_per_s() * 1e9
                } else {
                    nvlink
                }
            }
            _ => nvlink * shape.n_ranks as f64,
        };
        let plan = Plan { algo: Algo::Ring, channels: 2, graph_channels: 1 };
        (latency_ns, bound, plan)
    }

    fn coefficients(&mut self, req: &CommRequest, plan: &Plan) -> Arc<[(ResId, f64)]> {
        let key: LayoutKey = (req.kind, req.ranks.clone(), plan.algo as u8, plan.channels, plan.graph_channels);
        if let Some(e) = self.layouts.get(&key) {
            return e.clone();
        }
        let e: Arc<[(ResId, f64)]> = layout::coefficients(&self.topo, &mut self.router, req, plan).into();
        if self.broken.is_none()
            && let Some(&(r, _)) = e.iter().find(|&&(r, _)| self.topo.is_down(r))
        {
            self.broken = Some(self.disconnected(req, r));
        }
        self.layouts.insert(key, e.clone());
        e
    }

    fn cnst(&mut self, r: ResId) -> CnstId {
        let slot = &mut self.res_cnst[r as usize];
        if *slot == u32::MAX {
            *slot = self.solver.add_constraint(self.topo.resources[r as usize].cap_bytes_per_s);
        }
        *slot
    }

    fn activate(&mut self, now_ns: u64, id: CommId) {
        let c = self.comms[&id].clone();
        let scale = self.copy_factors(&c.elems, c.multiplicity);
        let elems: Vec<(CnstId, f64)> = c
            .elems
            .iter()
            .map(|&(r, a)| {
                let kind = self.topo.resources[r as usize].kind;
                let f = scale.iter().find(|(k, _)| *k == kind).map_or(1.0, |&(_, f)| f);
                (self.cnst(r), a * f)
            })
            .collect();
        let var = self.solver.add_var(now_ns, c.bytes as f64, c.bound_bytes_per_s, 1.0, &elems);
        if var as usize >= self.var_comm.len() {
            self.var_comm.resize(var as usize + 1, 0);
        }
        self.var_comm[var as usize] = id;
        if let Some(comm) = self.comms.get_mut(&id) {
            comm.var = Some(var);
        }
    }

    /// Per switch tier, how many copies of a request share each of its links: m copies
    /// spread evenly over a tier of N links, one copy using u of them, overlap
    /// max(1, m·u/N)-fold.
    fn copy_factors(&self, elems: &[(ResId, f64)], multiplicity: u32) -> Vec<(ResKind, f64)> {
        let m = multiplicity.max(1) as f64;
        if m <= 1.0 {
            return Vec::new();
        }
        let mut used: BTreeMap<ResKind, usize> = BTreeMap::new();
        for &(r, _) in elems {
            let kind = self.topo.resources[r as usize].kind;
            if kind.is_fabric() {
                *used.entry(kind).or_default() += 1;
            }
        }
        used.into_iter().map(|(k, u)| (k, (m * u as f64 / self.topo.count(k) as f64).max(1.0))).collect()
    }

    /// Why `req` cannot run: the ranks it joins, and the down link its path needs.
    fn disconnected(&self, req: &CommRequest, r: ResId) -> String {
        let node = &self.topo.node;
        let at = |g: u32| format!("rank {g} (node {} GPU {})", node.node_of(g), node.local_of(g));
        let (a, b) = (req.ranks[0], *req.ranks.last().unwrap_or(&req.ranks[0]));
        format!(
            "no path survives for a {:?} among {} ranks from {} to {}: it needs {}, which is down; \
             take fewer links down, or degrade them instead (--degrade link=NAME:FACTOR)",
            req.kind,
            req.ranks.len(),
            at(a),
            at(b),
            super::names::name_of(&self.topo, r)
        )
    }

    /// The next instant with work: a latency phase ending or a transfer completing.
    fn next_event_ns(&self) -> Option<u64> {
        let p = self.pending.first().map(|&(t, _)| t);
        let s = self.solver.next_completion().map(|(t, _)| t);
        match (p, s) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Network for FabricNetwork {
    fn name(&self) -> &'static str {
        "fabric"
    }

    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId {
        debug_assert!(
            self.next_event_ns().is_none_or(|t| t >= now_ns),
            "start at {now_ns} ns with a network event pending at {:?} ns: advance the network first",
            self.next_event_ns()
        );
        let id = self.next_id;
        self.next_id += 1;
        let trivial = req.ranks.len() <= 1 || (req.kind == CommKind::SendRecv && req.ranks[0] == req.ranks[1]);
        let (latency_ns, bound, elems) = if trivial {
            (0, 1.0, Arc::from(Vec::new()))
        } else {
            let (latency_ns, bound, plan) = self.plan(req);
            (latency_ns, bound, self.coefficients(req, &plan))
        };
        let bytes = if trivial { 0 } else { req.bytes };
        self.comms
            .insert(id, Comm { bytes, bound_bytes_per_s: bound, elems, multiplicity: req.multiplicity, var: None });
        self.pending.insert((now_ns.saturating_add(latency_ns), id));
        id
    }

    fn next_completion_ns(&self) -> Option<u64> {
        self.next_event_ns()
    }

    fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        let mut done: Vec<(u64, CommId)> = Vec::new();
        while let Some(t) = self.next_event_ns() {
            if t > now_ns {
                break;
            }
            while let Some(v) = self.solver.pop_completed(t) {
                self.solver.remove_var(v);
                let id = self.var_comm[v as usize];
                self.comms.remove(&id);
                done.push((t, id));
            }
            while let Some(&(ta, id)) = self.pending.first() {
                if ta > t {
                    break;
                }
                self.pending.pop_first();
                if self.comms[&id].bytes == 0 {
                    self.comms.remove(&id);
                    done.push((t, id));
                } else {
                    self.activate(t, id);
                }
            }
            self.solver.solve(t);
        }
        done.sort_unstable();
        done.into_iter().map(|(_, id)| id).collect()
    }

    fn broken(&self) -> Option<String> {
        self.broken.clone()
    }

    fn choice(&self, req: &CommRequest) -> CommChoice {
        let Some(func) = tuned(req.kind) else {
            let algorithm = if req.kind == CommKind::SendRecv { "p2p" } else { "direct" };
            return CommChoice { algorithm: algorithm.into(), protocol: "Simple".into(), channels: 2 };
        };
        let node = &self.topo.node;
        let shape = node.shape(&req.ranks);
        let tuner = match self.tuners.get(&shape) {
            Some(t) => t.clone(),
            None => Arc::new(Tuner::new(node.arch, node.cpu, shape, nccl_graph::search(node, &shape), &self.env)),
        };
        let sel = tuner.select(func, req.bytes);
        CommChoice { algorithm: sel.algo.key().into(), protocol: sel.proto.key().into(), channels: sel.n_channels }
    }
}
