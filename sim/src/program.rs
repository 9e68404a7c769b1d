//! A plan program compiled for execution: the tables the event engine walks instead of the
//! plan's op list.
//!
//! For every op: a compact description ([`OpInfo`], with a compute op's duration already
//! costed), its stream, the count of its `deps`, the ops that depend on it (a reverse-edge
//! CSR, so finishing an op touches only its dependents), and its *gate*: the previous op of
//! its stream that must be done before it starts. Stream order makes an op wait for the
//! previous op of its stream, but `Send` and `Free` never hold up their stream (a send is
//! only posted, a free takes effect later), so they are transparent: the gate is the
//! nearest earlier op of the stream that is neither.
//!
//! Programs are checked here only as far as execution needs (deps point backwards, costs
//! and buffers exist); `strata_models::plan::verify` proves the rest.

use strata_models::plan::{CollKind, ComputeCost, ComputeOp, GroupKind, OpKind, Peer, Piece, Plan, Program, Stream};

use crate::simulate::SimError;

/// "No op".
pub const NONE: u32 = u32::MAX;

/// How long a compute op takes before any slowdown.
pub trait ComputeTimer {
    fn duration_ns(&self, op: &ComputeOp, cost: &ComputeCost) -> u64;
}

/// What the engine needs to know of an op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OpInfo {
    Compute { ns: u64, optimizer: bool },
    Collective { group: GroupKind, kind: CollKind, bytes: u64 },
    Send { peer: Peer, bytes: u64 },
    Recv { peer: Peer, bytes: u64 },
    Alloc { bytes: u64 },
    Free { bytes: u64 },
}

impl OpInfo {
    /// Ops that hold up their stream until they are done.
    pub fn gates(&self) -> bool {
        !matches!(self, OpInfo::Send { .. } | OpInfo::Free { .. })
    }
}

/// One program, compiled.
#[derive(Clone, Debug)]
pub struct ProgramTable {
    pub info: Vec<OpInfo>,
    pub stream: Vec<Stream>,
    /// Op indices of each stream, in program order.
    pub streams: [Vec<u32>; 4],
    pub ndeps: Vec<u32>,
    /// Dependents of op i: `dependents[dependents_at[i]..dependents_at[i + 1]]`.
    pub dependents_at: Vec<u32>,
    pub dependents: Vec<u32>,
    /// The op of the same stream that must be done before op i starts, or [`NONE`].
    pub gate: Vec<u32>,
    /// FLOPs of the program's compute ops.
    pub flops: f64,
}

impl ProgramTable {
    pub fn new(plan: &Plan, index: usize, program: &Program, timer: &dyn ComputeTimer) -> Result<Self, SimError> {
        let ops = &program.ops;
        let n = ops.len();
        let bad = |i: usize, reason: String| SimError::InvalidPlan { program: index, op: i as u32, reason };
        let mut buf_bytes: Vec<u64> = Vec::new();
        let mut info = Vec::with_capacity(n);
        let mut flops = 0.0;
        for (i, op) in ops.iter().enumerate() {
            info.push(match &op.kind {
                OpKind::Compute(c) => {
                    let cost = plan
                        .costs
                        .get(c.cost as usize)
                        .ok_or_else(|| bad(i, format!("cost id {} is out of range", c.cost)))?;
                    flops += cost.flops as f64;
                    OpInfo::Compute { ns: timer.duration_ns(c, cost), optimizer: c.piece == Piece::Optimizer }
                }
                OpKind::Collective(c) => OpInfo::Collective { group: c.group, kind: c.kind, bytes: c.bytes },
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
        let mut streams: [Vec<u32>; 4] = Default::default();
        let mut gate = vec![NONE; n];
        let mut last_gate = [NONE; 4];
        let mut ndeps = vec![0u32; n];
        let mut count = vec![0u32; n + 1];
        for (i, op) in ops.iter().enumerate() {
            let s = op.stream.index();
            streams[s].push(i as u32);
            gate[i] = last_gate[s];
            if info[i].gates() {
                last_gate[s] = i as u32;
            }
            ndeps[i] = op.deps.len() as u32;
            for &d in &op.deps {
                if d as usize >= i {
                    return Err(bad(i, format!("depends on op #{d}, which is not earlier in the program")));
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
        Ok(ProgramTable { info, stream, streams, ndeps, dependents_at, dependents, gate, flops })
    }

    pub fn len(&self) -> usize {
        self.info.len()
    }

    pub fn is_empty(&self) -> bool {
        self.info.is_empty()
    }

    pub fn dependents_of(&self, op: u32) -> &[u32] {
        &self.dependents[self.dependents_at[op as usize] as usize..self.dependents_at[op as usize + 1] as usize]
    }
}
