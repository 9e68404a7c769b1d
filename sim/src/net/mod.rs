//! The network: how long communication takes, behind one trait.
//!
//! The simulator core hands the network a [`CommRequest`] once every member of a
//! collective (or both ends of a send/receive) has arrived, and asks when requests
//! complete. Implementations go from simplest to richest (dslab-network style): a
//! closed-form model per link class with no contention, and the flow-level fat-tree fabric
//! with max-min fair sharing, where concurrent collectives slow each other down where they
//! share links.
//!
//! Contract for every implementation:
//! - time is integer nanoseconds; `advance(now)` is called with non-decreasing `now`, never
//!   past `next_completion_ns()`;
//! - completions are returned in a deterministic order (by completion time, then by id);
//! - no randomness except from the seed given at construction;
//! - `next_completion_ns()` is the next instant at which the model must be advanced. For the
//!   closed-form model that is always a completion; the fabric model may also report an
//!   internal instant (a collective's latency phase ending and its transfer joining the
//!   link sharing), at which `advance` returns an empty list. A caller that advances to
//!   every reported instant and handles an empty result needs nothing else.
//!
//! Code map: [`node`] (what a node offers the network: effective NVLink / NIC bandwidth,
//! rank placement), [`nccl_graph`] and [`nccl`] (NCCL's topology-search outcome and its
//! tuning model, pinned to v2.30.7), [`closed_form`] (the contention-free model),
//! [`calibrated`] (latency and bandwidth per collective as `strata calibrate` measured them
//! on the CPU executor's communicator),
//! [`topology`] (the cluster as a graph, and [`FabricTopology`](topology::FabricTopology),
//! the trait a switch fabric implements), the fabrics themselves ([`fat_tree`]: one
//! switch, k-ary fat-tree, rail-optimised SuperPOD; [`leaf_spine`]: two tiers without
//! rails), [`routing`] (paths through a fabric,
//! the seeded ECMP hash),
//! [`maxmin`] (the flow-level solver), [`layout`] (collectives as link coefficients),
//! [`fabric`] (the contention-aware model), [`names`] (names of links and switches) and
//! [`faults`] (degraded and downed links on the wired fabric), [`collbench`] (nccl-tests-style sweeps) and
//! [`bench`](mod@bench) (solver throughput).

use strata_models::plan::CollKind;
use strata_models::{ClusterSpec, Fabric};

use crate::profile::HardwareProfile;

pub mod bench;
pub mod calibrated;
pub mod closed_form;
pub mod collbench;
pub mod fabric;
pub mod fat_tree;
pub mod faults;
pub mod layout;
pub mod leaf_spine;
pub mod maxmin;
pub mod names;
pub mod nccl;
pub mod nccl_graph;
pub mod nic_fit;
pub mod node;
pub mod routing;
pub mod topology;
#[cfg(test)]
mod validation;

pub use calibrated::CalibratedNetwork;
pub use closed_form::ClosedFormNetwork;
pub use fabric::FabricNetwork;
pub use nccl::NcclEnv;

/// Identifies one started communication, assigned in start order from 0.
pub type CommId = u64;

/// Communications whose end time is known when they start (the closed-form and the
/// calibrated networks): ids in start order, completions in (time, id) order.
#[derive(Clone, Debug, Default)]
pub struct FixedTimes {
    pending: std::collections::BTreeSet<(u64, CommId)>,
    next_id: CommId,
}

impl FixedTimes {
    /// A new communication that ends at `end_ns`.
    pub fn start(&mut self, end_ns: u64) -> CommId {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert((end_ns, id));
        id
    }

    pub fn next_completion_ns(&self) -> Option<u64> {
        self.pending.first().map(|&(t, _)| t)
    }

    /// The communications that ended by `now_ns`, in order.
    pub fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        let mut done = Vec::new();
        while let Some(&(t, id)) = self.pending.first() {
            if t > now_ns {
                break;
            }
            self.pending.pop_first();
            done.push(id);
        }
        done
    }
}

/// What a request moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CommKind {
    Collective(CollKind),
    /// One point-to-point message from `ranks[0]` to `ranks[1]`.
    SendRecv,
}

/// A communication among global ranks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CommRequest {
    pub kind: CommKind,
    /// Global ranks in group order (for `SendRecv`: source, destination).
    pub ranks: Vec<u32>,
    /// nccl-tests' S: the whole buffer (per-rank count × n for all-gather / reduce-scatter);
    /// the message size for `SendRecv`.
    pub bytes: u64,
    /// How many identical, symmetric copies of this request run at once (symmetric mode:
    /// one simulated group stands for `multiplicity` real ones). 1 in full simulation.
    pub multiplicity: u32,
}

/// How an implementation carries a request (for reports and collbench).
#[derive(Clone, Debug, PartialEq)]
pub struct CommChoice {
    /// "ring", "tree", "nvls", "pat", "direct", "p2p" …
    pub algorithm: String,
    /// "LL", "LL128", "Simple".
    pub protocol: String,
    pub channels: u32,
}

/// CPU work one member of a communication does on its own thread (nanoseconds at full
/// speed): posting its contribution, and finishing (combining the others') after the
/// transfer. For communicators that move data with the ranks' cores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostWork {
    pub post_ns: u64,
    pub finish_ns: u64,
}

/// A network model.
pub trait Network {
    /// Short name for reports ("closed-form", "fabric").
    fn name(&self) -> &'static str;
    /// Starts a request at `now_ns` and returns its id.
    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId;
    /// The earliest completion time among active requests, if any.
    fn next_completion_ns(&self) -> Option<u64>;
    /// Moves the model to `now_ns` (≤ `next_completion_ns()`) and returns the requests that
    /// completed at or before it.
    fn advance(&mut self, now_ns: u64) -> Vec<CommId>;
    /// The algorithm, protocol and channels the request would use.
    fn choice(&self, req: &CommRequest) -> CommChoice;
    /// The CPU work each member spends on the request, when the ranks' own threads move the
    /// data (the CPU executor's communicator); the engine then runs it like compute, on
    /// ranks that run one thread each. `None` (the default): the transfer needs no work of
    /// the rank's thread (GPU collectives run on their own streams).
    fn host_work(&self, _req: &CommRequest) -> Option<HostWork> {
        None
    }
    /// Why the step cannot run on this network, if it cannot: a communication that needed
    /// a link that is down (a what-if). The engine runs to the end; the caller asks after.
    fn broken(&self) -> Option<String> {
        None
    }
}

/// Which [`Network`] implementation to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkKind {
    /// [`ClosedFormNetwork`]: per link class latency + bytes / bandwidth, no contention.
    ClosedForm,
    /// [`FabricNetwork`]: NCCL's choice laid onto the fabric, max-min link sharing.
    Fabric,
    /// [`CalibratedNetwork`]: the hardware profile's measured latency and bandwidth per
    /// collective kind and group size (needs a profile with a `[network]` table).
    Calibrated,
}

impl NetworkKind {
    /// The network a profile implies: its measured one when it carries a `[network]` table
    /// (a host calibrated with `strata calibrate`), else the fat-tree fabric.
    pub fn default_for(profile: &HardwareProfile) -> NetworkKind {
        if profile.network.is_some() { NetworkKind::Calibrated } else { NetworkKind::Fabric }
    }
}

/// Why a network could not be built for a cluster.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum NetError {
    #[error("invalid cluster for the network model: {0}")]
    Cluster(String),
    #[error(
        "the fabric cannot hold {endpoints} NIC ports with switch radix {radix}: at most {max} fit in \
         three tiers; raise cluster.switch_radix or use fewer nodes"
    )]
    TooLarge { endpoints: u64, radix: u32, max: u64 },
    #[error(
        "{key}: no link or switch is named \"{name}\" in this {fabric} fabric ({count} names, e.g. {examples}); \
         list them with strata simulate SCENARIO --list-links [FILTER]"
    )]
    UnknownLink { key: String, name: String, fabric: String, count: usize, examples: String },
}

/// Wires the switch fabric that `cluster.fabric` names onto `w`: the one place where a
/// fabric's name (the [`Fabric`] enum, which a scenario's `cluster.fabric` parses into)
/// meets its implementation. Adding a fabric is one file implementing
/// [`FabricTopology`](topology::FabricTopology), its `mod` line above, and its arm here.
fn wire_fabric(
    cluster: &ClusterSpec,
    seed: u64,
    w: &mut topology::Wiring,
) -> Result<Box<dyn topology::FabricTopology>, NetError> {
    Ok(match cluster.fabric {
        Fabric::SingleSwitch | Fabric::FatTree | Fabric::RailOptimized => {
            Box::new(fat_tree::FatTree::wire(cluster, seed, w)?)
        }
        Fabric::LeafSpine => Box::new(leaf_spine::LeafSpine::wire(cluster, seed, w)?),
    })
}

/// Builds the network model of `kind` for `cluster`, with NCCL's default environment.
/// `seed` drives everything random in the model (static ECMP hashing); the same seed gives
/// identical completion times.
///
/// ```
/// use strata_models::{ClusterSpec, Fabric};
/// use strata_sim::net::{self, NetworkKind};
/// let mut cluster = ClusterSpec::preset("dgx-h100").unwrap();
/// cluster.nodes = 4;
/// let net = net::build(&cluster, 7, NetworkKind::Fabric).unwrap();
/// assert_eq!(net.name(), "fabric");
/// ```
pub fn build(cluster: &ClusterSpec, seed: u64, kind: NetworkKind) -> Result<Box<dyn Network + Send>, NetError> {
    build_with(cluster, seed, kind, &NcclEnv::default())
}

/// [`build`] with an explicit NCCL environment (forced algorithm / protocol, NVLS off …).
/// A calibrated network needs a profile: use [`build_for`].
pub fn build_with(
    cluster: &ClusterSpec,
    seed: u64,
    kind: NetworkKind,
    env: &NcclEnv,
) -> Result<Box<dyn Network + Send>, NetError> {
    Ok(match kind {
        NetworkKind::ClosedForm => Box::new(ClosedFormNetwork::new(cluster, env.clone())?),
        NetworkKind::Fabric => Box::new(FabricNetwork::new(cluster, seed, env.clone())?),
        NetworkKind::Calibrated => {
            return Err(NetError::Cluster(
                "the calibrated network is built from a hardware profile; pass one (strata calibrate writes it)".into(),
            ));
        }
    })
}

/// [`build_for`] with link what-ifs ([`faults`]): they need the fabric network, the one
/// model with links; any other is refused.
pub fn build_faulted(
    cluster: &ClusterSpec,
    seed: u64,
    kind: Option<NetworkKind>,
    profile: &HardwareProfile,
    faults: &faults::LinkFaults,
) -> Result<Box<dyn Network + Send>, NetError> {
    if faults.is_empty() {
        return build_for(cluster, seed, kind, profile);
    }
    match kind.unwrap_or_else(|| NetworkKind::default_for(profile)) {
        NetworkKind::Fabric => Ok(Box::new(FabricNetwork::with_faults(cluster, seed, NcclEnv::default(), faults)?)),
        other => Err(NetError::Cluster(format!(
            "degraded or downed links (faults.degrade, faults.down) need the fabric network, which has links; \
             the {other:?} network has none: use --network fabric"
        ))),
    }
}

/// Builds the network of `kind` (`None`: the one the profile implies,
/// [`NetworkKind::default_for`]) for `cluster` and `profile`.
pub fn build_for(
    cluster: &ClusterSpec,
    seed: u64,
    kind: Option<NetworkKind>,
    profile: &HardwareProfile,
) -> Result<Box<dyn Network + Send>, NetError> {
    match kind.unwrap_or_else(|| NetworkKind::default_for(profile)) {
        NetworkKind::Calibrated => match &profile.network {
            Some(p) => Ok(Box::new(CalibratedNetwork::new(p)?)),
            None => Err(NetError::Cluster(format!(
                "hardware profile {} has no [network] table to build the calibrated network from; \
                 measure one with strata calibrate, or choose --network fabric",
                profile.name
            ))),
        },
        other => build(cluster, seed, other),
    }
}
