//! MPI communicator (feature `mpi`): one process per rank over OpenMPI, launched by
//! `mpirun -np N` or `srun`; the ranks may sit on many hosts.
//!
//! A message is one MPI point-to-point message on `MPI_COMM_WORLD` whose bytes carry the
//! tag and the payload (little-endian; see `encode`). A receiver thread per process takes
//! every incoming message (`MPI_Mprobe` + `MPI_Mrecv`, any source) and queues it, so a send
//! (`MPI_Send`) always finds its receiver draining and never waits on the receiving rank's
//! program; the rank's own thread only sends. This needs `MPI_THREAD_MULTIPLE`, which
//! [`init`] asks for and checks. Collectives come from `comm::collective`, identical to the
//! threads backend, so an MPI job reproduces the in-process losses bit for bit.
//!
//! Failure: a failing rank sends `Abort` to every other rank (they stop with an error
//! naming it) and then aborts the job (`MPI_Abort`); a process that dies outright is
//! reported by `mpirun`, which ends the job.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::topology::{Communicator as _, SimpleCommunicator};
use mpi::traits::MatchedReceiveVec;
use strata_models::plan::{GroupKind, P2pKind};

use super::{CommError, Communicator, Message, Payload, Tag};

/// Initialises MPI with `MPI_THREAD_MULTIPLE`. Keep the `Universe` alive until every
/// [`MpiComm`] is dropped (dropping it finalises MPI).
pub fn init() -> Result<Universe, String> {
    let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
        .ok_or("MPI was already initialised in this process")?;
    if threading != mpi::Threading::Multiple {
        return Err(format!(
            "the MPI library offers {threading:?} threading, and the runtime's receiver thread needs Multiple; use an OpenMPI built with thread support (Debian's openmpi-bin is)"
        ));
    }
    Ok(universe)
}

/// This process's rank of an MPI job.
pub struct MpiComm {
    rank: u32,
    size: u32,
    rx: Receiver<Message>,
    receiver: Option<JoinHandle<()>>,
    /// Set by `abort`: the job is failing, so the receiver keeps receiving to the end.
    aborted: AtomicBool,
}

const SHUTDOWN: u32 = 99;

fn group_code(g: GroupKind) -> u32 {
    match g {
        GroupKind::Tp => 0,
        GroupKind::Dp => 1,
        GroupKind::Embedding => 2,
        GroupKind::World => 3,
        GroupKind::Cp => 4,
        GroupKind::Ep => 5,
        GroupKind::ExpertDp => 6,
    }
}

fn kind_code(k: P2pKind) -> u32 {
    match k {
        P2pKind::Activation => 0,
        P2pKind::Gradient => 1,
    }
}

/// [tag variant, a, b, c, d (u64)] [payload kind, length (u64)] [payload bytes].
fn encode(tag: Option<Tag>, payload: &Payload) -> Vec<u8> {
    let (v, a, b, c, d): (u32, u32, u32, u32, u64) = match tag {
        Some(Tag::Coll { group, implicit, seq }) => (0, group_code(group), u32::from(implicit), 0, seq),
        Some(Tag::P2p { step, kind, mb, vstage }) => (1, step, kind_code(kind), mb, vstage as u64),
        Some(Tag::Ack { step, kind, mb, vstage }) => (2, step, kind_code(kind), mb, vstage as u64),
        Some(Tag::Control { step, what }) => (3, step, what, 0, 0),
        Some(Tag::Abort) => (4, 0, 0, 0, 0),
        None => (SHUTDOWN, 0, 0, 0, 0),
    };
    let mut out = Vec::with_capacity(36 + payload.bytes());
    for x in [v, a, b, c] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&d.to_le_bytes());
    let (pk, len) = match payload {
        Payload::F32(_) | Payload::Shared { .. } => (0u32, payload.bytes() / 4),
        Payload::F64(x) => (1, x.len()),
        Payload::Text(s) => (2, s.len()),
        Payload::Empty => (3, 0),
    };
    out.extend_from_slice(&pk.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
    match payload {
        Payload::F32(_) | Payload::Shared { .. } => {
            let x = payload.as_f32().expect("f32 data");
            x.iter().for_each(|f| out.extend_from_slice(&f.to_le_bytes()))
        }
        Payload::F64(x) => x.iter().for_each(|f| out.extend_from_slice(&f.to_le_bytes())),
        Payload::Text(s) => out.extend_from_slice(s.as_bytes()),
        Payload::Empty => {}
    }
    out
}

/// The inverse of [`encode`]; `None` for the receiver's shutdown message.
fn decode(from: u32, bytes: &[u8]) -> Option<Message> {
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let (v, a, b, c, d) = (u32_at(0), u32_at(4), u32_at(8), u32_at(12), u64_at(16));
    // The inverse of `group_code` (context- and expert-parallel groups included).
    let group = |x: u32| {
        [
            GroupKind::Tp,
            GroupKind::Dp,
            GroupKind::Embedding,
            GroupKind::World,
            GroupKind::Cp,
            GroupKind::Ep,
            GroupKind::ExpertDp,
        ][x as usize]
    };
    let kind = |x: u32| if x == 0 { P2pKind::Activation } else { P2pKind::Gradient };
    let tag = match v {
        0 => Tag::Coll { group: group(a), implicit: b != 0, seq: d },
        1 => Tag::P2p { step: a, kind: kind(b), mb: c, vstage: d as u32 },
        2 => Tag::Ack { step: a, kind: kind(b), mb: c, vstage: d as u32 },
        3 => Tag::Control { step: a, what: b },
        4 => Tag::Abort,
        _ => return None,
    };
    let (pk, len, body) = (u32_at(24), u64_at(28) as usize, &bytes[36..]);
    let payload = match pk {
        0 => Payload::F32(body.chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().expect("4"))).collect()),
        1 => Payload::F64(body.chunks_exact(8).map(|x| f64::from_le_bytes(x.try_into().expect("8"))).collect()),
        2 => Payload::Text(String::from_utf8_lossy(body).into_owned()),
        _ => Payload::Empty,
    };
    debug_assert!(
        matches!(&payload, Payload::Empty) || payload.bytes() == len * if pk == 2 { 1 } else { 4 * (pk as usize + 1) }
    );
    Some(Message { from, tag, payload })
}

impl MpiComm {
    /// This process's end of `MPI_COMM_WORLD` (after [`init`]).
    pub fn world() -> MpiComm {
        let w = SimpleCommunicator::world();
        let (rank, size) = (w.rank() as u32, w.size() as u32);
        let (tx, rx) = channel();
        let receiver = std::thread::Builder::new()
            .name("mpi-receiver".into())
            .spawn(move || {
                let w = SimpleCommunicator::world();
                loop {
                    let (bytes, status) = w.any_process().matched_probe().matched_receive_vec::<u8>();
                    match decode(status.source_rank() as u32, &bytes) {
                        // Once the communicator is gone (a failed job), messages are
                        // received and dropped, so that peers' blocking sends complete.
                        Some(m) => {
                            let _ = tx.send(m);
                        }
                        None => return,
                    }
                }
            })
            .expect("spawning the MPI receiver thread");
        MpiComm { rank, size, rx, receiver: Some(receiver), aborted: AtomicBool::new(false) }
    }
}

impl Drop for MpiComm {
    /// Stops the receiver thread (a message to itself) before MPI is finalised — unless the
    /// job failed (this rank aborted it, or received a peer's abort): then it keeps
    /// receiving until `MPI_Abort` ends the process, so that a peer's blocking send to this
    /// rank completes and the peer gets to report the failure.
    fn drop(&mut self) {
        if self.aborted.load(Ordering::Relaxed) {
            return;
        }
        if let Some(h) = self.receiver.take() {
            let w = SimpleCommunicator::world();
            w.process_at_rank(self.rank as i32).send(&encode(None, &Payload::Empty)[..]);
            let _ = h.join();
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn send(&self, to: u32, tag: Tag, payload: Payload) -> Result<(), CommError> {
        assert!(to != self.rank && to < self.size, "rank {} sends to rank {to} of {}", self.rank, self.size);
        SimpleCommunicator::world().process_at_rank(to as i32).send(&encode(Some(tag), &payload)[..]);
        Ok(())
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Option<Message>, CommError> {
        match self.rx.recv_timeout(timeout) {
            Ok(Message { from, tag: Tag::Abort, payload }) => {
                // The job has failed: this rank too must keep draining its messages until
                // `MPI_Abort` ends it (see `Drop`). Were its receiver thread stopped, a
                // peer still inside a blocking `MPI_Send` to it (a rendezvous-sized
                // payload) would never return, never see the abort and never report it.
                self.aborted.store(true, Ordering::Relaxed);
                let reason = match payload {
                    Payload::Text(t) => t,
                    _ => "aborted".into(),
                };
                Err(CommError::RankFailed { rank: from, reason })
            }
            Ok(m) => Ok(Some(m)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                Err(CommError::Transport { rank: self.rank, what: "the MPI receiver thread stopped".into() })
            }
        }
    }

    fn abort(&self, reason: &str) {
        self.aborted.store(true, Ordering::Relaxed);
        for to in (0..self.size).filter(|r| *r != self.rank) {
            let _ = self.send(to, Tag::Abort, Payload::Text(reason.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_bytes() {
        let cases = [
            (Tag::Coll { group: GroupKind::Embedding, implicit: true, seq: 1 << 40 }, Payload::F32(vec![1.5, -2.0])),
            (Tag::P2p { step: 3, kind: P2pKind::Gradient, mb: 7, vstage: 5 }, Payload::F64(vec![0.25])),
            (Tag::Control { step: 9, what: 2 }, Payload::Text("shard ✓".into())),
            (Tag::Abort, Payload::Empty),
        ];
        for (tag, payload) in cases {
            let m = decode(4, &encode(Some(tag), &payload)).unwrap();
            assert_eq!(m, Message { from: 4, tag, payload });
        }
        assert!(decode(0, &encode(None, &Payload::Empty)).is_none());
    }
}
