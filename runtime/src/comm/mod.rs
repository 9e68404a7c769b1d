//! Communicators: how the ranks of a job exchange tensors.
//!
//! One trait, [`Communicator`], moves tagged messages between ranks: `send` posts a
//! message and never waits for the receiver (an eager, buffered send), `recv_timeout`
//! hands over whatever arrived for this rank. Two implementations:
//! - [`threads::ThreadComm`]: one thread per rank in one process, over channels (tests and
//!   the embedded default);
//! - `mpi::MpiComm` (cargo feature `mpi`): one process per rank, over OpenMPI, launched by
//!   `mpirun` or `srun`.
//!
//! Collectives are built once, on top of the trait, in [`collective`]: every member sends
//! its contribution to the members that need it and each member combines what it got in
//! **group order** (member 0 first). So an f32 all-reduce sums x₀ + x₁ + … + x_{n−1} in that
//! order on every member: equal inputs give bit-identical results run after run, on every
//! member, and on both backends (a 4-process MPI job reproduces the threads' losses bit
//! for bit). Collectives are non-blocking — posted, then completed when the last
//! contribution arrives — which lets the plan interpreter keep every stream of a rank
//! moving while one of them waits; blocking MPI collectives on sub-communicators could
//! deadlock plans whose streams the verifier proved safe only when they run concurrently.
//! The price is n·S bytes per member instead of a ring's 2·S: fine for CPU ranks, and the
//! CUDA backend will use NCCL's own collectives.
//!
//! Failure: a rank that fails calls [`Communicator::abort`], which reaches every other
//! rank; receives poll with timeouts, so no rank waits forever on a dead peer.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use strata_models::plan::{GroupKind, P2pKind};
use thiserror::Error;

pub mod collective;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod threads;

/// What a message is, so that the receiver can match it to the op waiting for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tag {
    /// A contribution to the `seq`-th collective this rank posted on its group of `group`
    /// (`implicit`: a collective the runtime adds on its own, see `exec`).
    Coll { group: GroupKind, implicit: bool, seq: u64 },
    /// A pipeline message of step `step`.
    P2p { step: u32, kind: P2pKind, mb: u32, vstage: u32 },
    /// The receiver of a pipeline message took it (the send is done).
    Ack { step: u32, kind: P2pKind, mb: u32, vstage: u32 },
    /// Metrics or checkpoint bookkeeping for rank 0 (outside the plan).
    Control { step: u32, what: u32 },
    /// The sender failed; the payload says why.
    Abort,
}

/// A message body.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    F32(Vec<f32>),
    /// Elements `range` of a buffer the sender shares rather than copies — how a
    /// collective hands its contribution to the other members (as NCCL reads a peer's
    /// buffer over NVLink): in process the receivers read the sender's own allocation; a
    /// backend between processes sends the elements.
    Shared {
        data: Arc<Vec<f32>>,
        range: Range<usize>,
    },
    F64(Vec<f64>),
    Text(String),
    Empty,
}

impl Payload {
    /// Bytes the body carries.
    pub fn bytes(&self) -> usize {
        match self {
            Payload::F32(v) => v.len() * 4,
            Payload::Shared { range, .. } => range.len() * 4,
            Payload::F64(v) => v.len() * 8,
            Payload::Text(s) => s.len(),
            Payload::Empty => 0,
        }
    }

    /// Bytes the receiver holds of its own: a shared view holds none (they stay the
    /// sender's allocation).
    pub fn owned_bytes(&self) -> usize {
        match self {
            Payload::Shared { .. } => 0,
            _ => self.bytes(),
        }
    }

    /// The f32 elements, if the body is f32 data.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Payload::F32(v) => Some(v),
            Payload::Shared { data, range } => Some(&data[range.clone()]),
            _ => None,
        }
    }

    /// A shared view of all of `data`.
    pub fn share(data: Arc<Vec<f32>>) -> Payload {
        let range = 0..data.len();
        Payload::Shared { data, range }
    }
}

/// A message as received.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub from: u32,
    pub tag: Tag,
    pub payload: Payload,
}

/// Why communication failed. Every variant names the rank involved.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum CommError {
    #[error("rank {rank} failed: {reason}")]
    RankFailed { rank: u32, reason: String },
    #[error("rank {rank} has exited; it can no longer receive (a rank died)")]
    PeerGone { rank: u32 },
    #[error("rank {rank}: {what}")]
    Transport { rank: u32, what: String },
}

/// Moves messages between the ranks of one job.
pub trait Communicator: Send {
    /// This rank, 0-based.
    fn rank(&self) -> u32;
    /// Ranks in the job.
    fn size(&self) -> u32;
    /// Posts a message to `to` (≠ this rank). Never waits for the receiver.
    fn send(&self, to: u32, tag: Tag, payload: Payload) -> Result<(), CommError>;
    /// The next message for this rank, waiting at most `timeout`; `Ok(None)` on timeout.
    /// An `Abort` from another rank, or a failure the backend noticed, is an error.
    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, CommError>;
    /// Tells every other rank that this one failed, and why. Best effort; never blocks.
    fn abort(&self, reason: &str);
}
