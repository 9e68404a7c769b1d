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
//! - no randomness except from the seed given at construction.

use strata_models::plan::CollKind;

/// Identifies one started communication, assigned in start order from 0.
pub type CommId = u64;

/// What a request moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
}
