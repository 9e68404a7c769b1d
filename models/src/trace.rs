//! Timelines of a step, simulated or measured, in one format.
//!
//! The simulator and the runtime both record, for each rank they ran, when every op of its
//! program started and ended on its stream, and the rank's allocated bytes over time. The
//! op itself (name, microbatch, bytes, FLOPs) is looked up in the plan, so a trace stays
//! small and the two sources line up op by op. `strata-reports` writes a trace as
//! Chrome/Perfetto JSON (one process per rank, one thread per stream).
//!
//! Times are nanoseconds from the start of the step.

use serde::{Deserialize, Serialize};

use crate::plan::ir::{OpId, Stream};

/// Where a trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceSource {
    Simulated,
    Measured,
}

/// One op's execution on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub rank: u32,
    pub stream: Stream,
    pub op: OpId,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A rank's allocated bytes from `t_ns` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemSample {
    pub rank: u32,
    pub t_ns: u64,
    pub bytes: u64,
}

/// The timeline of one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub source: TraceSource,
    /// The step this trace records (0-based).
    pub step: u32,
    /// Seed of the run (simulator randomness, or the training seed).
    pub seed: u64,
    /// Ranks the trace covers (a symmetric simulation covers one rank per stage).
    pub ranks: Vec<u32>,
    /// Sorted by (rank, stream, start, op).
    pub spans: Vec<Span>,
    /// Sorted by (rank, time).
    pub memory: Vec<MemSample>,
}

impl Trace {
    /// Sorts spans and samples into their canonical order (so equal timelines serialise to
    /// equal bytes).
    pub fn canonicalize(&mut self) {
        self.ranks.sort_unstable();
        self.ranks.dedup();
        self.spans.sort_by_key(|s| (s.rank, s.stream, s.start_ns, s.op, s.end_ns));
        self.memory.sort_by_key(|m| (m.rank, m.t_ns, m.bytes));
    }

    /// Length of the step: the latest end of any span.
    pub fn makespan_ns(&self) -> u64 {
        self.spans.iter().map(|s| s.end_ns).max().unwrap_or(0)
    }

    /// Peak allocated bytes of a rank.
    pub fn peak_bytes(&self, rank: u32) -> u64 {
        self.memory.iter().filter(|m| m.rank == rank).map(|m| m.bytes).max().unwrap_or(0)
    }
}
