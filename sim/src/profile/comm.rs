//! A profile's `[network]`: the executor's communicator as `strata calibrate` measured it,
//! one line per collective kind and group size ([`crate::net::CalibratedNetwork`] reads it).
//!
//! Two kinds are optional, for profiles written before they were measured: all-to-all
//! (context parallelism's Ulysses exchange, a MoE layer's dispatch and combine) falls back
//! to all-gather's line, and the ring exchange (ring attention's K/V and dK/dV passes) to a
//! pipeline message's ([`CommFitKind::fallback`]).

use serde::{Deserialize, Serialize};

/// The communicator as measured: one line per collective kind and group size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkParams {
    /// What was measured, one line.
    pub source: String,
    pub links: Vec<CommFit>,
}

/// What a calibrated communication moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CommFitKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    AllToAll,
    SendRecv,
    /// One step of a ring: every member passes a block to the next and takes the previous
    /// one's (a copy of S bytes on the receiving thread).
    RingExchange,
}

impl CommFitKind {
    pub const ALL: [CommFitKind; 7] = [
        CommFitKind::AllReduce,
        CommFitKind::ReduceScatter,
        CommFitKind::AllGather,
        CommFitKind::Broadcast,
        CommFitKind::AllToAll,
        CommFitKind::SendRecv,
        CommFitKind::RingExchange,
    ];

    pub fn key(self) -> &'static str {
        match self {
            CommFitKind::AllReduce => "all-reduce",
            CommFitKind::ReduceScatter => "reduce-scatter",
            CommFitKind::AllGather => "all-gather",
            CommFitKind::Broadcast => "broadcast",
            CommFitKind::AllToAll => "all-to-all",
            CommFitKind::SendRecv => "send-recv",
            CommFitKind::RingExchange => "ring-exchange",
        }
    }

    /// The kind whose lines stand in when a profile has none of this kind (the optional
    /// kinds); `None` for a kind every profile with a network must have.
    pub fn fallback(self) -> Option<CommFitKind> {
        match self {
            CommFitKind::AllToAll => Some(CommFitKind::AllGather),
            CommFitKind::RingExchange => Some(CommFitKind::SendRecv),
            _ => None,
        }
    }
}

/// One communication kind over `ranks` ranks on the executor's communicator: the delay
/// from the last member's post until the others notice it (a thread waking up), and the CPU
/// work each member does on its own thread — posting its contribution (copies to the
/// others) and combining what it received (the sum, the concatenation) — at each measured
/// size S (nccl-tests' S). Work between sizes is interpolated linearly in S, and beyond the
/// measured range extrapolated from the nearest two sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommFit {
    pub kind: CommFitKind,
    pub ranks: u32,
    pub latency_us: f64,
    /// Measured sizes, ascending.
    pub bytes: Vec<u64>,
    /// CPU work of one member posting, µs, at each size.
    pub post_us: Vec<f64>,
    /// CPU work of one member combining, µs, at each size.
    pub finish_us: Vec<f64>,
}
