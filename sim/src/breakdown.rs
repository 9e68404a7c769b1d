//! Where a rank's step time went: compute, exposed communication, pipeline bubble,
//! optimizer.
//!
//! The rank's compute stream is busy or idle at every instant of [0, finish]. Busy time is
//! `compute`, or `optimizer` for the optimizer step. Each idle gap ends when the next
//! compute op can start, so the gap is charged to what that op waited for: the dependency
//! (or stream predecessor) that finished last — its *blocker* — and, through the chain of
//! blockers, to
//! - a collective's or message's transfer time → `tp_exposed` (tp stream), `dp_exposed`
//!   (dp stream: gradient and parameter buckets, tied embeddings, gradient norm) or
//!   `pp_exposed` (pipeline sends and receives);
//! - the time a collective waited for the other members of its group, or a receive for its
//!   send (or a send for its receive) → `bubble`: waiting for a peer stage's work;
//! - before such an op itself started, whatever held *it* up (its own blocker), and so on.
//!
//! A compute op paced by the host beyond its device time (`OpInfo::Compute::host`) charges
//! that share of its run to `host_bound`.
//!
//! Three causes get lines of their own, whatever stream their collectives are on: a MoE
//! layer's dispatch and combine (`CollPurpose::Moe`) → `ep_exposed` for their transfer time
//! and `moe_imbalance` for the time a rank waits at them for its EP group (the most loaded
//! rank, `crate::router`) — in a MoE plan, a wait at any group within the stage (tp, cp,
//! dp, ep, expert-dp: ranks that run one program and differ only by their experts' loads,
//! absent a straggler what-if) is imbalance; context parallelism's exchanges (`CollPurpose::Cp`) →
//! `cp_exposed`. An `Experts` op that ran above its balanced time charges that part
//! (`ActorRun::imbalance`) to `moe_imbalance` too: the most loaded rank computes it, the
//! others wait for it, and symmetric mode's actor stands for the most loaded.
//!
//! Idle time after the last compute op is charged the same way to the op that ends last.
//! A rank that runs on one thread (the CPU executor) may start an op after its blocker
//! ended because the thread was busy posting or finishing other communication; that wait
//! is charged to the communication whose work ended last in it.
//! The pieces partition [0, finish], so the components sum to the rank's step time exactly.
//!
//! Units: nanoseconds inside, seconds in [`Breakdown`].

use serde::{Deserialize, Serialize};
use strata_models::plan::{CollPurpose, GroupKind, OpKind, Program, Stream};

use crate::engine::ActorRun;
use crate::program::{NONE, OpInfo, ProgramTable};

/// A step's time by cause, seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    pub compute: f64,
    pub tp_exposed: f64,
    pub dp_exposed: f64,
    pub pp_exposed: f64,
    pub bubble: f64,
    pub optimizer: f64,
    /// Expert-parallel all-to-all (dispatch and combine) not hidden behind compute.
    #[serde(default)]
    pub ep_exposed: f64,
    /// Context-parallel exchange (ring K/V steps, all-gather, Ulysses all-to-all) exposed.
    #[serde(default)]
    pub cp_exposed: f64,
    /// Router imbalance: the time past the balanced share spent on (or waiting for) the
    /// most loaded expert-parallel rank.
    #[serde(default)]
    pub moe_imbalance: f64,
    /// Compute ops paced by the framework's host work beyond their device time (DeepSpeed
    /// ZeRO-3's module hooks and fetch loops): the device idles, waiting for launches.
    #[serde(default)]
    pub host_bound: f64,
}

impl Breakdown {
    pub fn total(&self) -> f64 {
        self.compute
            + self.tp_exposed
            + self.dp_exposed
            + self.pp_exposed
            + self.bubble
            + self.optimizer
            + self.ep_exposed
            + self.cp_exposed
            + self.moe_imbalance
            + self.host_bound
    }
}

const COMPUTE: usize = 0;
const TP: usize = 1;
const DP: usize = 2;
const PP: usize = 3;
pub(crate) const BUBBLE: usize = 4;
const OPTIMIZER: usize = 5;
const EP: usize = 6;
const CP: usize = 7;
const IMBALANCE: usize = 8;
const HOST: usize = 9;
/// The number of causes.
pub const CAUSES: usize = 10;

/// Nanoseconds by cause; sums to `run.finish_ns`.
pub fn breakdown_ns(run: &ActorRun, table: &ProgramTable, program: &Program) -> [u64; CAUSES] {
    let mut acc = [0u64; CAUSES];
    let mut busy_until = 0u64;
    for &op in &table.streams[Stream::Compute.index()] {
        let o = op as usize;
        let OpInfo::Compute { optimizer, host, .. } = table.info[o] else { continue };
        let (start, end) = (run.start_ns[o], run.end_ns[o]);
        if start > busy_until {
            let b = blocker(run, table, program, op);
            charge(run, table, program, b, busy_until, start, &mut acc);
        }
        let ran = end - start;
        let over = match run.imbalance.binary_search_by_key(&op, |&(o, _)| o) {
            Ok(i) => ((ran as f64 * run.imbalance[i].1).round() as u64).min(ran),
            Err(_) => 0,
        };
        acc[IMBALANCE] += over;
        let paced = ((ran - over) as f64 * host).round() as u64;
        acc[HOST] += paced;
        acc[if optimizer { OPTIMIZER } else { COMPUTE }] += ran - over - paced;
        busy_until = busy_until.max(end);
    }
    if run.finish_ns > busy_until {
        // The op that ends last (the first of them in program order).
        let last = (0..table.len()).max_by_key(|&i| (run.end_ns[i], std::cmp::Reverse(i))).expect("non-empty");
        charge(run, table, program, last as u32, busy_until, run.finish_ns, &mut acc);
    }
    debug_assert_eq!(acc.iter().sum::<u64>(), run.finish_ns);
    acc
}

/// Seconds by cause.
pub fn to_seconds(ns: [u64; CAUSES]) -> Breakdown {
    let s = |i: usize| ns[i] as f64 * 1e-9;
    Breakdown {
        compute: s(COMPUTE),
        tp_exposed: s(TP),
        dp_exposed: s(DP),
        pp_exposed: s(PP),
        bubble: s(BUBBLE),
        optimizer: s(OPTIMIZER),
        ep_exposed: s(EP),
        cp_exposed: s(CP),
        moe_imbalance: s(IMBALANCE),
        host_bound: s(HOST),
    }
}

/// The dependency or stream predecessor of `op` that finished last ([`NONE`] if none).
fn blocker(run: &ActorRun, table: &ProgramTable, program: &Program, op: u32) -> u32 {
    let o = op as usize;
    let gate = if matches!(table.info[o], OpInfo::Free { .. }) { NONE } else { table.gate[o] };
    program.ops[o]
        .deps
        .iter()
        .copied()
        .chain((gate != NONE).then_some(gate))
        .max_by_key(|&d| (run.end_ns[d as usize], d))
        .unwrap_or(NONE)
}

/// What held a one-thread rank busy until `w1` after `w0`: the communication op whose
/// work ended last in (w0, w1] (its stream's class), else a wait (bubble).
fn busy_thread_class(run: &ActorRun, table: &ProgramTable, w0: u64, w1: u64) -> usize {
    (0..table.len())
        .filter(|&i| {
            matches!(table.info[i], OpInfo::Collective { .. } | OpInfo::Send { .. } | OpInfo::Recv { .. })
                && run.end_ns[i] > w0
                && run.end_ns[i] <= w1
        })
        .max_by_key(|&i| (run.end_ns[i], std::cmp::Reverse(i)))
        .map_or(BUBBLE, |i| match table.stream[i] {
            Stream::Tp => TP,
            Stream::Pp => PP,
            Stream::Compute | Stream::Dp => DP,
        })
}

/// Charges the window [w0, w1) to what `b` stood for, following blockers back.
fn charge(
    run: &ActorRun,
    table: &ProgramTable,
    program: &Program,
    mut b: u32,
    w0: u64,
    mut w1: u64,
    acc: &mut [u64; CAUSES],
) {
    // Every step either ends the walk or moves to an earlier op, so program length bounds it.
    for _ in 0..=table.len() {
        if w1 <= w0 {
            return;
        }
        if b == NONE {
            break;
        }
        let o = b as usize;
        let class = match table.stream[o] {
            Stream::Tp => TP,
            Stream::Dp => DP,
            Stream::Pp => PP,
            Stream::Compute => COMPUTE,
        };
        match table.info[o] {
            OpInfo::Collective { .. } | OpInfo::Send { .. } | OpInfo::Recv { .. } => {
                let (start, xfer) = (run.start_ns[o], run.xfer_ns[o]);
                let class = if class == COMPUTE { DP } else { class };
                let (class, wait) = match &program.ops[o].kind {
                    OpKind::Collective(c) => {
                        // In a MoE plan the members of a stage's groups run one program and
                        // differ only by their experts' loads: waiting for them is imbalance.
                        let in_stage = !matches!(c.group, GroupKind::Embedding | GroupKind::World);
                        let wait = if in_stage && !table.moe.is_empty() { IMBALANCE } else { BUBBLE };
                        match c.purpose {
                            CollPurpose::Moe { .. } => (EP, wait),
                            CollPurpose::Cp { .. } => (CP, wait),
                            _ => (class, wait),
                        }
                    }
                    _ => (class, BUBBLE),
                };
                let t0 = w0.max(xfer);
                if w1 > t0 {
                    acc[class] += w1 - t0;
                }
                let (a0, a1) = (w0.max(start), xfer.min(w1));
                if a1 > a0 {
                    acc[wait] += a1 - a0;
                }
                w1 = w1.min(start);
                b = blocker(run, table, program, b);
            }
            OpInfo::Alloc { .. } | OpInfo::Free { .. } => {
                let end = run.end_ns[o];
                if w1 > end.max(w0) {
                    // The op waited past its blocker's end: its rank's one thread was busy
                    // with other work — posting or finishing communication (CPU ranks).
                    acc[busy_thread_class(run, table, end.max(w0), w1)] += w1 - end.max(w0);
                }
                w1 = w1.min(end);
                b = blocker(run, table, program, b);
            }
            OpInfo::Compute { .. } => break,
        }
    }
    if w1 > w0 {
        acc[BUBBLE] += w1 - w0;
    }
}
