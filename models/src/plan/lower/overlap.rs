//! `parallel.moe_a2a_overlap`: a steady-state backward and the forward that follows it in
//! the schedule table merged into one program, segment by segment, as Megatron-core's
//! combined 1F1B (`--overlap-moe-expert-parallel-comm`) and DeepSeek's DualPipe run a
//! backward chunk of one microbatch with a forward chunk of another.
//!
//! Each pass is lowered as usual; then its ops are cut into segments, one after each
//! expert-parallel all-to-all (dispatch, combine or their gradients), and the two passes'
//! segments are laid out alternately, the backward's first. Within a MoE layer pair this
//! gives Megatron-core's order: the backward's combine runs under the forward's attention,
//! the forward's dispatch under the backward's experts, the backward's dispatch under the
//! forward's experts, the forward's combine under the backward's attention. The
//! all-to-alls stay on their stream and the pieces on the compute stream; what overlaps is
//! decided by the programs' order and deps alone, so the verifier, the simulator and the
//! executors run the merged program unchanged.
//!
//! The two passes are independent: a backward never reads a later forward of the same
//! step (a microbatch's backward follows its own forward), so no backward op depends on
//! the forward's. A forward op may depend on a backward op emitted before it (a pending
//! synchronous reduction, say): a forward segment is laid out only once every backward op
//! it depends on is, otherwise the next backward segment goes first. Each pass keeps its
//! own order, so every dependency still points to an earlier op.
//!
//! Pairs are (backward, forward) adjacent in the steady state: in 1F1B, B(k) with
//! F(k + w + 1) for w warm-up forwards — the pairing Megatron-core gets by running one
//! extra warm-up forward before combining each forward with the next backward; the forward's
//! activations are allocated while the backward's are still alive, which the memory
//! timeline shows.

use std::ops::Range;

use crate::plan::ir::*;
use crate::plan::schedule::{Pass, Slot, Stage};

/// The (backward, forward) slot pairs of a stage's table to merge, as slot indices: a
/// steady-state backward (whole or input half) and the steady-state forward right after it,
/// or after the weight passes that follow it (ZB), which then go with the backward.
pub(super) fn pairs(table: &[Slot]) -> Vec<(usize, usize)> {
    let backward = |s: &Slot| matches!(s.pass, Pass::Backward | Pass::BackwardInput) && s.phase == Stage::Steady;
    let forward = |s: &Slot| s.pass == Pass::Forward && s.phase == Stage::Steady;
    let mut out = Vec::new();
    let mut i = 0;
    while i < table.len() {
        if backward(&table[i]) {
            let mut j = i + 1;
            while j < table.len() && table[j].pass == Pass::BackwardWeight {
                j += 1;
            }
            if j < table.len() && forward(&table[j]) {
                out.push((i, j));
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// A merged pair's ops in the program as lowered: the backward's (with the weight passes
/// after it) `b0..f0`, then the forward's `f0..f1`.
#[derive(Clone, Copy, Debug)]
pub(super) struct PairOps {
    pub b0: usize,
    pub f0: usize,
    pub f1: usize,
}

/// Reorders `ops` so that each pair's two passes are interleaved, renumbering every
/// dependency. `pairs` are disjoint and in program order.
pub(super) fn interleave(ops: Vec<Op>, pairs: &[PairOps]) -> Vec<Op> {
    if pairs.is_empty() {
        return ops;
    }
    let n = ops.len();
    let mut order = Vec::with_capacity(n);
    let mut next = 0;
    for p in pairs {
        debug_assert!(next <= p.b0 && p.b0 <= p.f0 && p.f0 <= p.f1 && p.f1 <= n, "pair {p:?}");
        order.extend(next..p.b0);
        merge(&ops, p, &mut order);
        next = p.f1;
    }
    order.extend(next..n);
    let mut new_id = vec![0 as OpId; n];
    for (new, &old) in order.iter().enumerate() {
        new_id[old] = new as OpId;
    }
    let mut slots: Vec<Option<Op>> = ops.into_iter().map(Some).collect();
    order
        .iter()
        .map(|&old| {
            let mut op = slots[old].take().expect("each op is placed once");
            for d in &mut op.deps {
                *d = new_id[*d as usize];
            }
            op.deps.sort_unstable();
            op
        })
        .collect()
}

/// Whether `op` is an expert-parallel all-to-all (a segment ends after it).
fn is_moe_a2a(op: &Op) -> bool {
    matches!(&op.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::Moe { .. }))
}

/// `range` cut after each expert-parallel all-to-all.
fn segments(ops: &[Op], range: Range<usize>) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = range.start;
    for i in range.clone() {
        if is_moe_a2a(&ops[i]) {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < range.end {
        out.push(start..range.end);
    }
    out
}

/// Appends one pair's ops to `order`: backward and forward segments alternately, the
/// backward's first; a forward segment waits until every backward op it depends on is
/// laid out.
fn merge(ops: &[Op], p: &PairOps, order: &mut Vec<usize>) {
    let bs = segments(ops, p.b0..p.f0);
    let fs = segments(ops, p.f0..p.f1);
    let (mut bi, mut fi) = (0, 0);
    // Backward ops below this index are laid out.
    let mut b_done = p.b0;
    let ready = |seg: &Range<usize>, b_done: usize| {
        seg.clone()
            .all(|i| ops[i].deps.iter().all(|&d| (d as usize) < p.b0 || (d as usize) >= p.f0 || (d as usize) < b_done))
    };
    let mut backward_turn = true;
    while bi < bs.len() || fi < fs.len() {
        let take_forward = fi < fs.len() && (!backward_turn || bi == bs.len()) && ready(&fs[fi], b_done);
        if take_forward {
            order.extend(fs[fi].clone());
            fi += 1;
            backward_turn = true;
        } else if bi < bs.len() {
            order.extend(bs[bi].clone());
            b_done = bs[bi].end;
            bi += 1;
            backward_turn = false;
        } else {
            // Every backward op is laid out, so the forward segment is ready.
            order.extend(fs[fi].clone());
            fi += 1;
        }
    }
}
