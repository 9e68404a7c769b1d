//! The plan's execution semantics, in one place: a state machine over a plan that every
//! backend drives.
//!
//! The rules (see also [`crate::plan::ir`]):
//! - ops of one [`Stream`] start in program order; an op starts once its stream's *gate* —
//!   the nearest earlier op of the stream that is neither a `Send` nor a `Free` — is done,
//!   and every op in its `deps` is done;
//! - a `Send` only posts its message and a `Free` never holds up its stream: a free is
//!   posted as soon as its stream reaches it (the op before it has started) and takes
//!   effect when its deps are done;
//! - the k-th collective a rank issues on a group meets the k-th of every other member
//!   ([`Rendezvous`]);
//! - a send meets the receive of its peer with the same (kind, microbatch, virtual stage),
//!   first with first ([`pair_messages`]).
//!
//! What it costs to run an op, when a transfer ends and what data moves is the backend's:
//! the verifier finishes every op at once (`plan::verify`, its deadlock proof), the
//! simulator in simulated time (`strata_sim::engine`), the CPU executor for real
//! (`strata_runtime::exec`). Each one asks the same [`Cursor`] which ops may start and tells
//! it which are done; none keeps its own copy of these rules.
//!
//! - [`ProgramGraph`]: a program compiled once — stream lists, gates, dependency counts and
//!   the reverse edges, so finishing an op touches only its dependents;
//! - [`Cursor`]: one actor's progress through its program;
//! - [`ActorMap`]: who executes — one actor per rank, or one per pipeline stage standing for
//!   its tp·dp ranks (legal when every rank of a stage runs the stage's program, since its TP
//!   and DP groups lie inside the stage and move in lockstep);
//! - [`Rendezvous`] and [`pair_messages`]: matching of collectives and messages;
//! - [`Turn`]: the CPU executor's round on a rank's one thread (one compute op, then post
//!   every ready communication, then finish every one whose data arrived);
//! - [`staging`]: what the CPU executor copies around a collective beside it.

mod actors;
mod rendezvous;
mod staging;

pub use actors::{ActorMap, MessageError, pair_messages};
pub use rendezvous::{Arrival, Rendezvous};
pub use staging::{Staging, staging};

use crate::plan::ir::{OpKind, Program, Stream};

/// "No op".
pub const NONE: u32 = u32::MAX;

/// Why a program cannot be executed at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("op #{op}: {reason}")]
pub struct GraphError {
    pub op: u32,
    pub reason: String,
}

/// What an op is to the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpClass {
    /// Holds up its stream until done (compute, alloc, collective, receive).
    Gating,
    /// Posted, then done on delivery; the stream moves on at once.
    Send,
    /// Posted when its stream reaches it, done when its deps are.
    Free,
}

/// One program compiled for execution.
#[derive(Clone, Debug)]
pub struct ProgramGraph {
    pub class: Vec<OpClass>,
    pub stream: Vec<Stream>,
    /// Op indices of each stream, in program order.
    pub streams: [Vec<u32>; 4],
    pub ndeps: Vec<u32>,
    /// The op of the same stream that must be done before op i starts (the nearest earlier
    /// gating op), or [`NONE`].
    pub gate: Vec<u32>,
    /// Dependents of op i: `dependents[dependents_at[i]..dependents_at[i + 1]]`.
    dependents_at: Vec<u32>,
    dependents: Vec<u32>,
}

impl ProgramGraph {
    /// Compiles a program; deps must point to earlier ops.
    pub fn new(program: &Program) -> Result<ProgramGraph, GraphError> {
        let ops = &program.ops;
        let n = ops.len();
        if n >= NONE as usize {
            return Err(GraphError { op: 0, reason: format!("{n} ops: more than a program may hold") });
        }
        let mut streams: [Vec<u32>; 4] = Default::default();
        let mut class = Vec::with_capacity(n);
        let mut ndeps = Vec::with_capacity(n);
        let mut count = vec![0u32; n + 1];
        let mut gate = Vec::with_capacity(n);
        let mut last_gate = [NONE; 4];
        for (i, op) in ops.iter().enumerate() {
            let s = op.stream.index();
            streams[s].push(i as u32);
            let c = match op.kind {
                OpKind::Send(_) => OpClass::Send,
                OpKind::Free { .. } => OpClass::Free,
                _ => OpClass::Gating,
            };
            class.push(c);
            gate.push(last_gate[s]);
            if c == OpClass::Gating {
                last_gate[s] = i as u32;
            }
            ndeps.push(op.deps.len() as u32);
            for &d in &op.deps {
                if d as usize >= i {
                    return Err(GraphError {
                        op: i as u32,
                        reason: format!("depends on op #{d}, which is not earlier in the program"),
                    });
                }
                count[d as usize] += 1;
            }
        }
        // Reverse edges as a CSR: prefix sums of the counts, then fill.
        let mut dependents_at = vec![0u32; n + 1];
        for i in 0..n {
            dependents_at[i + 1] = dependents_at[i] + count[i];
        }
        let mut fill = dependents_at.clone();
        let mut dependents = vec![0u32; dependents_at[n] as usize];
        for (i, op) in ops.iter().enumerate() {
            for &d in &op.deps {
                let slot = &mut fill[d as usize];
                dependents[*slot as usize] = i as u32;
                *slot += 1;
            }
        }
        let stream = ops.iter().map(|o| o.stream).collect();
        Ok(ProgramGraph { class, stream, streams, ndeps, gate, dependents_at, dependents })
    }

    pub fn len(&self) -> usize {
        self.class.len()
    }

    pub fn is_empty(&self) -> bool {
        self.class.is_empty()
    }

    #[inline]
    pub fn dependents_of(&self, op: u32) -> &[u32] {
        &self.dependents[self.dependents_at[op as usize] as usize..self.dependents_at[op as usize + 1] as usize]
    }
}

/// Where an op is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OpState {
    Idle,
    /// Started; a communication op whose contribution the rank is still copying out (the
    /// CPU-rank model): not yet offered to its partners.
    Posting,
    /// Started: running, or a communication offered to its partners, or a posted free.
    Posted,
    Done,
}

/// What a stream's next op is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// This op starts now (it is `Posted`); the backend runs or posts it.
    Start(u32),
    /// This free is posted now; `ready`: its deps are done, so it takes effect now (the
    /// backend completes it). Otherwise [`Wake::Free`] says when.
    Free { op: u32, ready: bool },
    /// The head op waits for its gate or its deps.
    Blocked,
    /// The stream has no ops left.
    End,
}

/// What finishing an op released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// This stream may start ops now.
    Stream(Stream),
    /// This posted free's deps are all done: it takes effect now.
    Free(u32),
}

/// One actor's progress through its program.
#[derive(Clone, Debug)]
pub struct Cursor {
    next: [u32; 4],
    /// The gating op each stream waits on, or [`NONE`].
    gate: [u32; 4],
    deps_left: Vec<u32>,
    state: Vec<OpState>,
    remaining: usize,
}

impl Cursor {
    pub fn new(g: &ProgramGraph) -> Cursor {
        Cursor {
            next: [0; 4],
            gate: [NONE; 4],
            deps_left: g.ndeps.clone(),
            state: vec![OpState::Idle; g.len()],
            remaining: g.len(),
        }
    }

    /// Takes the next op of stream `s` if it may start now.
    #[inline]
    pub fn next(&mut self, g: &ProgramGraph, s: Stream) -> Next {
        let si = s.index();
        let Some(&op) = g.streams[si].get(self.next[si] as usize) else { return Next::End };
        let o = op as usize;
        if g.class[o] == OpClass::Free {
            self.next[si] += 1;
            self.state[o] = OpState::Posted;
            return Next::Free { op, ready: self.deps_left[o] == 0 };
        }
        if self.gate[si] != NONE || self.deps_left[o] > 0 {
            return Next::Blocked;
        }
        self.next[si] += 1;
        self.state[o] = OpState::Posted;
        if g.class[o] == OpClass::Gating {
            self.gate[si] = op;
        }
        Next::Start(op)
    }

    /// Marks `op` done; `wake` hears what that released, in a fixed order (dependents in
    /// program order, then the op's own stream).
    #[inline]
    pub fn complete(&mut self, g: &ProgramGraph, op: u32, mut wake: impl FnMut(Wake)) {
        let o = op as usize;
        debug_assert_ne!(self.state[o], OpState::Done, "op #{op} completes twice");
        self.state[o] = OpState::Done;
        self.remaining -= 1;
        for &d in g.dependents_of(op) {
            let left = &mut self.deps_left[d as usize];
            *left -= 1;
            if *left == 0 {
                if g.class[d as usize] == OpClass::Free && self.state[d as usize] == OpState::Posted {
                    wake(Wake::Free(d));
                } else {
                    wake(Wake::Stream(g.stream[d as usize]));
                }
            }
        }
        let s = g.stream[o];
        if self.gate[s.index()] == op {
            self.gate[s.index()] = NONE;
            wake(Wake::Stream(s));
        }
    }

    #[inline]
    pub fn state(&self, op: u32) -> OpState {
        self.state[op as usize]
    }

    /// Sets a started communication op's sub-state (`Posting` ↔ `Posted`).
    #[inline]
    pub fn set_state(&mut self, op: u32, state: OpState) {
        debug_assert!(matches!(state, OpState::Posting | OpState::Posted));
        self.state[op as usize] = state;
    }

    pub fn is_done(&self, op: u32) -> bool {
        self.state[op as usize] == OpState::Done
    }

    /// Ops not done yet.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Where each stream waits, if it has ops left: the started op that holds it up, or
    /// else its next op (for deadlock and stall messages).
    pub fn waiting_at(&self, g: &ProgramGraph) -> [Option<u32>; 4] {
        Stream::ALL.map(|s| {
            let si = s.index();
            if self.gate[si] != NONE {
                return Some(self.gate[si]);
            }
            g.streams[si].get(self.next[si] as usize).copied()
        })
    }
}

/// The CPU executor's round on a rank's one thread: one compute op, then posting every
/// communication op that is ready (tp, dp, pp streams in that order), then finishing every
/// one whose transfer ended, then compute again; a turn with nothing to do is skipped. The
/// executor runs it for real; the simulator's CPU-rank model follows the same round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    Compute,
    Post,
    Finish,
}

impl Turn {
    /// The streams whose ops a `Post` turn starts, in order.
    pub const POST_STREAMS: [Stream; 3] = [Stream::Tp, Stream::Dp, Stream::Pp];

    pub fn next(self) -> Turn {
        match self {
            Turn::Compute => Turn::Post,
            Turn::Post => Turn::Finish,
            Turn::Finish => Turn::Compute,
        }
    }
}

#[cfg(test)]
mod tests;
