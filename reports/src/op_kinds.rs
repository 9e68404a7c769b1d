//! Kinds of ops, as the report groups them: a compute piece in one phase (`attn fwd`,
//! `mlp bwd-in`), a collective on one group (`all-reduce tp`), a pipeline message
//! (`send act`), and the bookkeeping ops (`alloc`, `free`) that take no time.
//!
//! Seconds per kind are summed over a trace's spans and divided by the number of ranks the
//! trace covers: the mean time one rank spends in that kind of op per step. For
//! communication that includes waiting for the peers, as a timeline shows it.
//!
//! This module uses no other module of the crate: [`crate::inputs`] builds on it (an
//! [`OpTime`] row lives here, beside the kinds it is keyed by), never the reverse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_models::plan::{CollKind, GroupKind, Op};
use strata_models::plan::{OpKind, P2pKind, Phase, Piece, Plan};
use strata_models::trace::Trace;

/// Predicted and measured seconds per step spent in one kind of op (mean over ranks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpTime {
    /// `attn fwd`, `mlp bwd-in`, `all-reduce tp`, `send act` …
    pub kind: String,
    pub category: OpCategory,
    pub predicted_s: f64,
    pub measured_s: f64,
}

/// Broad class of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpCategory {
    Compute,
    Collective,
    P2p,
    Memory,
}

impl OpCategory {
    pub fn key(self) -> &'static str {
        match self {
            OpCategory::Compute => "compute",
            OpCategory::Collective => "collective",
            OpCategory::P2p => "p2p",
            OpCategory::Memory => "memory",
        }
    }
}

/// The grouping key of an op; its order is the order of the report's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKindKey {
    Compute { piece: Piece, phase: Phase },
    Collective { kind: CollKind, group: GroupKind },
    P2p { send: bool, kind: P2pKind },
    Alloc,
    Free,
}

impl OpKindKey {
    pub fn of(op: &Op) -> OpKindKey {
        match &op.kind {
            OpKind::Compute(c) => OpKindKey::Compute { piece: c.piece, phase: c.phase },
            OpKind::Collective(c) => OpKindKey::Collective { kind: c.kind, group: c.group },
            OpKind::Send(p) => OpKindKey::P2p { send: true, kind: p.kind },
            OpKind::Recv(p) => OpKindKey::P2p { send: false, kind: p.kind },
            OpKind::Alloc(_) => OpKindKey::Alloc,
            OpKind::Free { .. } => OpKindKey::Free,
        }
    }

    pub fn category(self) -> OpCategory {
        match self {
            OpKindKey::Compute { .. } => OpCategory::Compute,
            OpKindKey::Collective { .. } => OpCategory::Collective,
            OpKindKey::P2p { .. } => OpCategory::P2p,
            OpKindKey::Alloc | OpKindKey::Free => OpCategory::Memory,
        }
    }

    /// `attn fwd`, `all-reduce tp`, `send act`, `alloc`.
    pub fn label(self) -> String {
        match self {
            OpKindKey::Compute { piece, phase } => format!("{} {}", piece.key(), phase.key()),
            OpKindKey::Collective { kind, group } => format!("{} {}", kind.key(), group.key()),
            OpKindKey::P2p { send, kind } => format!("{} {}", if send { "send" } else { "recv" }, p2p_key(kind)),
            OpKindKey::Alloc => "alloc".to_string(),
            OpKindKey::Free => "free".to_string(),
        }
    }
}

pub(crate) fn p2p_key(kind: P2pKind) -> &'static str {
    match kind {
        P2pKind::Activation => "act",
        P2pKind::Gradient => "grad",
    }
}

/// The name of one op in a timeline: `attn fwd L3`, `embed fwd`, `all-reduce tp`,
/// `reduce-scatter dp`, `send act`, `alloc act L3 mb1`, `free`.
pub fn op_name(op: &Op) -> String {
    match &op.kind {
        OpKind::Compute(c) if c.piece.in_layer() => format!("{} {} L{}", c.piece.key(), c.phase.key(), c.layer),
        OpKind::Alloc(a) => format!("alloc {}", a.name),
        _ => OpKindKey::of(op).label(),
    }
}

/// Mean seconds per rank spent in each kind of op that takes time (alloc and free left out).
pub fn op_seconds(plan: &Plan, trace: &Trace) -> BTreeMap<OpKindKey, f64> {
    let mut ns: BTreeMap<OpKindKey, u64> = BTreeMap::new();
    for s in &trace.spans {
        let key = OpKindKey::of(&plan.program(s.rank).ops[s.op as usize]);
        if key.category() != OpCategory::Memory {
            *ns.entry(key).or_default() += s.end_ns - s.start_ns;
        }
    }
    let ranks = trace_ranks(trace).max(1) as f64;
    ns.into_iter().map(|(k, v)| (k, v as f64 * 1e-9 / ranks)).collect()
}

/// Ranks a trace covers: its rank list, or the distinct ranks of its spans.
pub(crate) fn trace_ranks(trace: &Trace) -> usize {
    if !trace.ranks.is_empty() {
        return trace.ranks.len();
    }
    let mut r: Vec<u32> = trace.spans.iter().map(|s| s.rank).collect();
    r.sort_unstable();
    r.dedup();
    r.len()
}

/// Predicted against measured seconds per op kind, over the kinds of either trace.
pub fn op_times(plan: &Plan, predicted: &Trace, measured: &Trace) -> Vec<OpTime> {
    let p = op_seconds(plan, predicted);
    let m = op_seconds(plan, measured);
    let mut keys: Vec<OpKindKey> = p.keys().chain(m.keys()).copied().collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|k| OpTime {
            kind: k.label(),
            category: k.category(),
            predicted_s: p.get(&k).copied().unwrap_or(0.0),
            measured_s: m.get(&k).copied().unwrap_or(0.0),
        })
        .collect()
}
