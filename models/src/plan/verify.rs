//! The plan verifier: proves a plan is well formed before any backend runs it.
//!
//! 1. **Structure**: dependencies point to earlier ops, cost ids and buffer ids exist, each
//!    buffer is allocated once and freed at most once.
//! 2. **Buffer lifetimes**: with happens-before defined by stream order and `deps` (a
//!    `Send` orders the ops after it on its stream only by its posting, not its delivery),
//!    every buffer's `Alloc` happens before each op that uses it, each use happens before
//!    its `Free`, and buffers never freed are persistent state (parameters, gradients,
//!    optimizer). Computed with per-op vector clocks over the four streams.
//! 3. **Communication and deadlock**: an abstract execution that tracks only who waits for
//!    whom. Ops on a stream start in order once their deps are done; compute, alloc and
//!    free finish at once; a send is posted and finishes when its receive takes it; a
//!    receive waits for the matching send (same peer, kind, microbatch, virtual stage) and
//!    checks its size; a collective waits until every member of its group has issued its
//!    k-th collective on that group, and all k-th collectives must agree in kind, size,
//!    dtype and purpose. If the execution stops with ops left, the plan can deadlock, and
//!    the stuck ops are named; an unreceived send is an error too.
//!
//! When every rank of a stage runs its stage's program (every plan the planner emits),
//! one actor per stage stands for all of its ranks: tensor- and data-parallel groups are
//! inside a stage, so their members are in lockstep. Plans with per-rank programs are
//! executed rank by rank.

use std::collections::{BTreeMap, VecDeque};

use crate::plan::Plan;
use crate::plan::exec::{
    ActorMap, Arrival, Cursor, MessageError, Next, OpState, ProgramGraph, Rendezvous, Wake, pair_messages,
};
use crate::plan::ir::*;

/// What a verified plan looks like.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    pub ranks: u32,
    /// Actors of the abstract execution (stages, or ranks when programs differ per rank).
    pub actors: u32,
    pub programs: u32,
    pub ops: u64,
    pub buffers: u64,
    pub collectives_matched: u64,
    pub messages_matched: u64,
}

/// Why a plan is rejected: the rank, the op and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {reason}")]
pub struct VerifyError {
    /// `TP(2)-PP(2)-DP(1)-rank(3) op #41 (compute attn fwd L1 mb0 c0)` or a program index.
    pub location: String,
    pub reason: String,
    /// Short class of the failure, stable for tests: `structure`, `lifetime`, `unmatched`,
    /// `mismatch`, `deadlock`.
    pub kind: &'static str,
}

fn err(kind: &'static str, location: String, reason: String) -> VerifyError {
    VerifyError { location, reason, kind }
}

fn describe(plan: &Plan, op: &Op) -> String {
    crate::plan::text::op_line(plan, op)
        .split("  after")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Verifies a plan.
pub fn verify(plan: &Plan) -> Result<VerifyReport, VerifyError> {
    // Structure first: deps point backwards, every cost and buffer id exists, each buffer
    // is allocated once and freed at most once (`check`, which every index below relies
    // on); then communication and deadlock (the most telling failure when a message or
    // collective is missing); then lifetimes.
    crate::plan::check::check(plan)?;
    let (actors, collectives, messages) = execute(plan)?;
    let mut buffers = 0u64;
    for (pi, program) in plan.programs.iter().enumerate() {
        buffers += check_program(plan, pi, program)?;
    }
    Ok(VerifyReport {
        ranks: plan.grid.ranks(),
        actors,
        programs: plan.programs.len() as u32,
        ops: plan.programs.iter().map(|p| p.ops.len() as u64).sum(),
        buffers,
        collectives_matched: collectives,
        messages_matched: messages,
    })
}

fn program_location(plan: &Plan, pi: usize, op: usize) -> String {
    // Name a rank that runs this program.
    let rank = (0..plan.grid.ranks()).find(|r| plan.program_index(*r) == pi);
    let who = match rank {
        Some(r) => plan.grid.label(r),
        None => format!("program {pi} (run by no rank)"),
    };
    let what = plan.programs[pi].ops.get(op).map(|o| describe(plan, o)).unwrap_or_default();
    format!("{who} op #{op} ({what})")
}

/// Buffer lifetimes of one program. Returns the number of buffers.
fn check_program(plan: &Plan, pi: usize, program: &Program) -> Result<u64, VerifyError> {
    let ops = &program.ops;
    let loc = |i: usize| program_location(plan, pi, i);
    // Position of each op on its stream, and vector clocks of completed stream prefixes.
    let mut pos = vec![0u32; ops.len()];
    let mut next_pos = [0u32; 4];
    let mut clock: Vec<[u32; 4]> = Vec::with_capacity(ops.len());
    // The clock the next op of each stream inherits: a normal op passes on its completion,
    // a send only its posting (its deps), a free nothing (it never holds up its stream).
    let mut stream_clock = [[0u32; 4]; 4];
    let mut alloc_at: BTreeMap<BufId, usize> = BTreeMap::new();
    let mut free_at: BTreeMap<BufId, usize> = BTreeMap::new();
    let mut uses: BTreeMap<BufId, Vec<usize>> = BTreeMap::new();
    let join = |c: &mut [u32; 4], other: &[u32; 4]| {
        for s in 0..4 {
            c[s] = c[s].max(other[s]);
        }
    };
    for (i, op) in ops.iter().enumerate() {
        let st = op.stream.index();
        pos[i] = next_pos[st];
        next_pos[st] += 1;
        let mut c = stream_clock[st];
        for &d in &op.deps {
            let d = d as usize;
            join(&mut c, &clock[d]);
            let ds = ops[d].stream.index();
            c[ds] = c[ds].max(pos[d] + 1);
        }
        clock.push(c);
        match op.kind {
            OpKind::Free { .. } => {}
            OpKind::Send(_) => stream_clock[st] = c,
            _ => {
                stream_clock[st] = c;
                stream_clock[st][st] = pos[i] + 1;
            }
        }
        // `check` proved each buffer allocated once before use and freed at most once.
        match &op.kind {
            OpKind::Alloc(a) => {
                alloc_at.insert(a.buf, i);
            }
            OpKind::Free { buf } => {
                free_at.insert(*buf, i);
            }
            _ => {}
        }
        for b in &op.bufs {
            uses.entry(*b).or_default().push(i);
        }
    }
    let happens_before = |a: usize, b: usize| clock[b][ops[a].stream.index()] > pos[a];
    for (buf, users) in &uses {
        let Some(&a) = alloc_at.get(buf) else {
            return Err(err("lifetime", loc(users[0]), format!("uses buffer b{buf}, which is never allocated")));
        };
        let name = match &ops[a].kind {
            OpKind::Alloc(al) => al.name.clone(),
            _ => String::new(),
        };
        for &u in users {
            if !happens_before(a, u) {
                return Err(err(
                    "lifetime",
                    loc(u),
                    format!("uses buffer b{buf} ({name}) before its allocation at op #{a} is certain to have happened"),
                ));
            }
            if let Some(&f) = free_at.get(buf)
                && !happens_before(u, f)
            {
                return Err(err(
                    "lifetime",
                    loc(f),
                    format!("frees buffer b{buf} ({name}) while op #{u} may still use it (a live buffer)"),
                ));
            }
        }
    }
    for (buf, &a) in &alloc_at {
        if let Some(&f) = free_at.get(buf)
            && !happens_before(a, f)
        {
            return Err(err("lifetime", loc(f), format!("frees buffer b{buf} before its allocation at op #{a}")));
        }
        if !free_at.contains_key(buf)
            && let OpKind::Alloc(al) = &ops[a].kind
            && !matches!(al.class, BufClass::Params | BufClass::Grads | BufClass::OptimizerState)
        {
            return Err(err(
                "lifetime",
                loc(a),
                format!("buffer b{buf} ({}, {}) is never freed and is not persistent state", al.name, al.class.key()),
            ));
        }
    }
    Ok(alloc_at.len() as u64)
}

/// Runs the plan abstractly on the shared execution semantics ([`crate::plan::exec`]):
/// every op finishes as soon as it may start, so what is left undone can never run.
/// Returns (actors, collectives matched, messages matched).
fn execute(plan: &Plan) -> Result<(u32, u64, u64), VerifyError> {
    let grid = plan.grid;
    if !plan.rank_programs.is_empty() && grid.ranks() > 4096 {
        return Err(err(
            "structure",
            "plan".into(),
            format!("per-rank programs on {} ranks: too many to execute rank by rank (limit 4096)", grid.ranks()),
        ));
    }
    let actors = ActorMap::new(plan, true);
    let n = actors.len() as u32;
    let program_of = |a: u32| plan.program_index(actors.rank(a));
    let program = |a: u32| &plan.programs[program_of(a)];
    let location = |a: u32, op: u32| {
        format!("{} op #{op} ({})", grid.label(actors.rank(a)), describe(plan, &program(a).ops[op as usize]))
    };
    let partner = pair_messages(&actors, program).map_err(|e| match e {
        MessageError::NeverReceived { from, op, to } => err(
            "unmatched",
            location(from, op),
            format!(
                "is never received: {} has no matching receive from {}",
                grid.label(actors.rank(to)),
                grid.label(actors.rank(from))
            ),
        ),
        MessageError::NeverSent { to, op, from } => err(
            "unmatched",
            location(to, op),
            format!("is never sent: {} has no matching send", grid.label(actors.rank(from))),
        ),
        MessageError::Size { to, recv, recv_bytes, from, send, send_bytes } => err(
            "mismatch",
            location(to, recv),
            format!("receives {recv_bytes} bytes but {} sends {send_bytes}", location(from, send)),
        ),
    })?;
    // One compiled graph per program the actors run.
    let mut graphs: BTreeMap<usize, ProgramGraph> = BTreeMap::new();
    for a in 0..n {
        let pi = program_of(a);
        if let std::collections::btree_map::Entry::Vacant(v) = graphs.entry(pi) {
            let g = ProgramGraph::new(&plan.programs[pi])
                .map_err(|e| err("structure", program_location(plan, pi, e.op as usize), e.reason))?;
            v.insert(g);
        }
    }
    let graph = |a: u32| &graphs[&program_of(a)];
    let mut cursors: Vec<Cursor> = (0..n).map(|a| Cursor::new(graph(a))).collect();
    let mut rendezvous = Rendezvous::new(&actors);
    let (mut collectives, mut messages) = (0u64, 0u64);
    // Work: advance (actor, stream), or complete (actor, op).
    let mut work: Work = (0..n).flat_map(|a| Stream::ALL.map(|s| (a, Ok(s)))).collect();
    while let Some((a, w)) = work.pop_front() {
        let s = match w {
            Err(op) => {
                cursors[a as usize].complete(graph(a), op, |wk| work.push_back((a, wake(wk))));
                continue;
            }
            Ok(s) => s,
        };
        loop {
            let op = match cursors[a as usize].next(graph(a), s) {
                Next::Blocked | Next::End => break,
                Next::Free { op, ready } => {
                    if ready {
                        work.push_back((a, Err(op)));
                    }
                    continue;
                }
                Next::Start(op) => op,
            };
            let done = |cursors: &mut Vec<Cursor>, b: u32, o: u32, work: &mut Work| {
                cursors[b as usize].complete(graph(b), o, |wk| work.push_back((b, wake(wk))))
            };
            match &program(a).ops[op as usize].kind {
                OpKind::Compute(_) | OpKind::Alloc(_) | OpKind::Free { .. } => done(&mut cursors, a, op, &mut work),
                OpKind::Send(p) | OpKind::Recv(p) => {
                    let (b, bop) = (actors.peer(a, p.peer), partner[a as usize][op as usize]);
                    if cursors[b as usize].state(bop) == OpState::Posted {
                        messages += 1;
                        done(&mut cursors, a, op, &mut work);
                        done(&mut cursors, b, bop, &mut work);
                    }
                }
                OpKind::Collective(c) => match rendezvous.arrive(a, op, c.group) {
                    Arrival::Waiting => {}
                    Arrival::Alone => {
                        collectives += 1;
                        done(&mut cursors, a, op, &mut work);
                    }
                    Arrival::Complete(mut members) => {
                        // Name the member that differs from the lowest one.
                        members.sort_unstable();
                        let (a0, o0) = members[0];
                        let c0 = collective_of(program(a0), o0);
                        for &(am, om) in &members[1..] {
                            let cm = collective_of(program(am), om);
                            if (cm.kind, cm.bytes, cm.dtype, cm.purpose) != (c0.kind, c0.bytes, c0.dtype, c0.purpose) {
                                return Err(err(
                                    "mismatch",
                                    location(am, om),
                                    format!(
                                        "issues {} of {} on its {} group where {} issues {} of {} ({})",
                                        cm.kind.key(),
                                        crate::plan::text::bytes(cm.bytes),
                                        cm.group.key(),
                                        location(a0, o0),
                                        c0.kind.key(),
                                        crate::plan::text::bytes(c0.bytes),
                                        purpose_key(&c0.purpose)
                                    ),
                                ));
                            }
                        }
                        collectives += 1;
                        for (am, om) in members {
                            done(&mut cursors, am, om, &mut work);
                        }
                    }
                },
            }
        }
    }
    if let Some(a) = (0..n).find(|&a| cursors[a as usize].remaining() > 0) {
        // Name the first blocked head op of each stream of the first stuck actor.
        let c = &cursors[a as usize];
        let heads = c.waiting_at(graph(a));
        let stuck: Vec<String> = Stream::ALL
            .iter()
            .zip(heads)
            .filter_map(|(s, h)| {
                let oi = h?;
                Some(format!("{} waits at #{oi} ({})", s.key(), describe(plan, &program(a).ops[oi as usize])))
            })
            .collect();
        let first = heads.iter().flatten().copied().min().unwrap_or(0);
        return Err(err(
            "deadlock",
            location(a, first),
            format!("the plan can deadlock: {} ops never run; {}", c.remaining(), stuck.join("; ")),
        ));
    }
    Ok((n, collectives, messages))
}

/// The verifier's work list: advance (actor, stream), or complete (actor, op).
type Work = VecDeque<(u32, Result<Stream, u32>)>;

fn wake(w: Wake) -> Result<Stream, u32> {
    match w {
        Wake::Stream(s) => Ok(s),
        Wake::Free(op) => Err(op),
    }
}

fn collective_of(program: &Program, op: u32) -> CollectiveOp {
    match &program.ops[op as usize].kind {
        OpKind::Collective(c) => *c,
        _ => unreachable!("arrivals hold collectives only"),
    }
}

fn purpose_key(p: &CollPurpose) -> String {
    format!("{p:?}")
}
