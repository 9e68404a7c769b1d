//! A plan program compiled for the event engine: the shared execution graph
//! ([`strata_models::plan::exec::ProgramGraph`]: stream lists, gates, deps, dependents)
//! plus what only the simulator needs — a compact description of every op ([`OpInfo`],
//! with a compute op's duration already costed) and the program's FLOPs.
//!
//! Programs are checked here only as far as execution needs (deps point backwards, costs
//! and buffers exist); `strata_models::plan::verify` proves the rest.

use std::ops::Deref;

use strata_models::plan::exec::{ProgramGraph, Staging, staging};
use strata_models::plan::{
    CollKind, CollPurpose, ComputeCost, ComputeOp, GroupKind, OpKind, Peer, Piece, Plan, Program,
};

pub use strata_models::plan::exec::NONE;

use crate::error::SimError;

/// How long a compute op takes before any slowdown.
pub trait ComputeTimer {
    fn duration_ns(&self, op: &ComputeOp, cost: &ComputeCost) -> u64;

    /// [`Self::duration_ns`] and, of it, the part the host sets the pace of beyond the
    /// device's own time (a framework's per-op host work longer than the op's kernels);
    /// none by default.
    fn timing_ns(&self, op: &ComputeOp, cost: &ComputeCost) -> (u64, u64) {
        (self.duration_ns(op, cost), 0)
    }
}

/// What the engine needs to know of an op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OpInfo {
    /// `host`: the share of the op's time that waits on the host beyond its device time
    /// (the host excess of [`ComputeTimer::timing_ns`] ÷ its duration; 0 for most ops).
    Compute {
        ns: u64,
        optimizer: bool,
        host: f64,
    },
    Collective {
        group: GroupKind,
        kind: CollKind,
        bytes: u64,
        /// What the CPU executor copies around it (charged with one thread per rank).
        staging: Staging,
    },
    Send {
        peer: Peer,
        bytes: u64,
    },
    Recv {
        peer: Peer,
        bytes: u64,
    },
    Alloc {
        bytes: u64,
    },
    Free {
        bytes: u64,
    },
}

/// One program, compiled. Dereferences to its [`ProgramGraph`].
#[derive(Clone, Debug)]
pub struct ProgramTable {
    pub graph: ProgramGraph,
    pub info: Vec<OpInfo>,
    /// FLOPs of the program's compute ops.
    pub flops: f64,
    /// Per op, for a MoE model: the (layer, microbatch) whose routing an `Experts` op or a
    /// dispatch/combine all-to-all follows (`crate::router`); empty for a dense model.
    pub moe: Vec<Option<(u32, u32)>>,
}

impl Deref for ProgramTable {
    type Target = ProgramGraph;

    fn deref(&self) -> &ProgramGraph {
        &self.graph
    }
}

impl ProgramTable {
    pub fn new(plan: &Plan, index: usize, program: &Program, timer: &dyn ComputeTimer) -> Result<Self, SimError> {
        let bad = |i: usize, reason: String| SimError::InvalidPlan { program: index, op: i as u32, reason };
        let mut buf_bytes: Vec<u64> = Vec::new();
        let mut info = Vec::with_capacity(program.ops.len());
        let mut flops = 0.0;
        let moe_model = plan.scenario.model.moe.is_some();
        let zero = plan.scenario.zero_stage();
        let mut moe = Vec::new();
        for (i, op) in program.ops.iter().enumerate() {
            if moe_model {
                moe.push(match &op.kind {
                    OpKind::Compute(c) if c.piece == Piece::Experts => Some((c.layer, c.mb)),
                    OpKind::Collective(c) => match c.purpose {
                        CollPurpose::Moe { layer, mb, .. } => Some((layer, mb)),
                        _ => None,
                    },
                    _ => None,
                });
            }
            info.push(match &op.kind {
                OpKind::Compute(c) => {
                    let cost = plan
                        .costs
                        .get(c.cost as usize)
                        .ok_or_else(|| bad(i, format!("cost id {} is out of range", c.cost)))?;
                    flops += cost.flops as f64;
                    let (ns, excess) = timer.timing_ns(c, cost);
                    let excess = excess.min(ns);
                    let host = if excess > 0 { excess as f64 / ns as f64 } else { 0.0 };
                    OpInfo::Compute { ns, optimizer: c.piece == Piece::Optimizer, host }
                }
                OpKind::Collective(c) => OpInfo::Collective {
                    group: c.group,
                    kind: c.kind,
                    bytes: c.bytes,
                    staging: staging(c, zero, plan.grid.group_size(c.group)),
                },
                OpKind::Send(p) => OpInfo::Send { peer: p.peer, bytes: p.bytes },
                OpKind::Recv(p) => OpInfo::Recv { peer: p.peer, bytes: p.bytes },
                OpKind::Alloc(a) => {
                    let b = a.buf as usize;
                    if b >= buf_bytes.len() {
                        buf_bytes.resize(b + 1, u64::MAX);
                    }
                    buf_bytes[b] = a.bytes;
                    OpInfo::Alloc { bytes: a.bytes }
                }
                OpKind::Free { buf } => match buf_bytes.get(*buf as usize) {
                    Some(&bytes) if bytes != u64::MAX => OpInfo::Free { bytes },
                    _ => return Err(bad(i, format!("frees buffer b{buf}, which is not allocated before it"))),
                },
            });
        }
        let graph = ProgramGraph::new(program).map_err(|e| bad(e.op as usize, e.reason))?;
        Ok(ProgramTable { graph, info, flops, moe })
    }
}
