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

use crate::plan::ir::*;
use crate::plan::lower::Plan;

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
    // Every index below is in range only on a checked plan.
    crate::plan::check::check(plan)?;
    // Structure first (the execution relies on it), then communication and deadlock (the
    // most telling failure when a message or collective is missing), then lifetimes.
    for (pi, program) in plan.programs.iter().enumerate() {
        check_structure(plan, pi, program)?;
    }
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

/// Dependencies point backwards and cost ids exist.
fn check_structure(plan: &Plan, pi: usize, program: &Program) -> Result<(), VerifyError> {
    for (i, op) in program.ops.iter().enumerate() {
        if let Some(d) = op.deps.iter().find(|d| **d as usize >= i) {
            return Err(err(
                "structure",
                program_location(plan, pi, i),
                format!("depends on op #{d}, which is not earlier in the program"),
            ));
        }
        if let OpKind::Compute(c) = &op.kind
            && c.cost as usize >= plan.costs.len()
        {
            return Err(err(
                "structure",
                program_location(plan, pi, i),
                format!("cost id {} is out of range ({} costs)", c.cost, plan.costs.len()),
            ));
        }
    }
    Ok(())
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
            if d >= i {
                return Err(err(
                    "structure",
                    loc(i),
                    format!("depends on op #{d}, which is not earlier in the program"),
                ));
            }
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
        match &op.kind {
            OpKind::Alloc(a) if alloc_at.insert(a.buf, i).is_some() => {
                return Err(err("structure", loc(i), format!("buffer b{} is allocated twice", a.buf)));
            }
            OpKind::Free { buf } => {
                if !alloc_at.contains_key(buf) {
                    return Err(err(
                        "lifetime",
                        loc(i),
                        format!("frees buffer b{buf}, which was never allocated before it"),
                    ));
                }
                if free_at.insert(*buf, i).is_some() {
                    return Err(err("lifetime", loc(i), format!("frees buffer b{buf} a second time")));
                }
            }
            OpKind::Compute(c) if c.cost as usize >= plan.costs.len() => {
                return Err(err(
                    "structure",
                    loc(i),
                    format!("cost id {} is out of range ({} costs)", c.cost, plan.costs.len()),
                ));
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

/// An actor of the abstract execution: a rank, or a stage standing for its ranks.
struct Actor {
    program: usize,
    rank: u32,
    /// Next op index per stream (into `streams[s]`).
    cursor: [usize; 4],
    done: Vec<bool>,
    remaining: usize,
}

type Tag = (P2pKind, u32, u32);

/// Runs the plan abstractly. Returns (actors, collectives matched, messages matched).
fn execute(plan: &Plan) -> Result<(u32, u64, u64), VerifyError> {
    let grid = plan.grid;
    let per_rank = !plan.rank_programs.is_empty();
    if per_rank && grid.ranks() > 4096 {
        return Err(err(
            "structure",
            "plan".into(),
            format!("per-rank programs on {} ranks: too many to execute rank by rank (limit 4096)", grid.ranks()),
        ));
    }
    // Actors and their ranks.
    let actor_ranks: Vec<u32> = if per_rank {
        (0..grid.ranks()).collect()
    } else {
        (0..grid.pp).map(|pp| grid.rank(crate::plan::grid::Coord { tp: 0, dp: 0, pp })).collect()
    };
    let actor_of_rank = |r: u32| -> usize { if per_rank { r as usize } else { grid.coord(r).pp as usize } };
    let streams: Vec<[Vec<usize>; 4]> = plan
        .programs
        .iter()
        .map(|p| {
            let mut s: [Vec<usize>; 4] = Default::default();
            for (i, op) in p.ops.iter().enumerate() {
                s[op.stream.index()].push(i);
            }
            s
        })
        .collect();
    let mut actors: Vec<Actor> = actor_ranks
        .iter()
        .map(|&rank| {
            let program = plan.program_index(rank);
            let n = plan.programs[program].ops.len();
            Actor { program, rank, cursor: [0; 4], done: vec![false; n], remaining: n }
        })
        .collect();
    // Messages in flight: (to actor, from actor, tag) → queue of (send op, bytes).
    let mut mail: BTreeMap<(usize, usize, Tag), VecDeque<(usize, u64)>> = BTreeMap::new();
    // Collective arrivals per group instance: (kind, group id) → per member, queue of (actor, op).
    let mut arrivals: BTreeMap<(GroupKind, u32), BTreeMap<usize, VecDeque<usize>>> = BTreeMap::new();
    let mut collectives = 0u64;
    let mut messages = 0u64;
    // Posted frees waiting for their deps: (actor, op).
    let mut pending_frees: Vec<(usize, usize)> = Vec::new();
    let location = |a: &Actor, op: usize| {
        format!("{} op #{op} ({})", grid.label(a.rank), describe(plan, &plan.programs[a.program].ops[op]))
    };

    // Group members of an actor's group, as actors (collapsed to stages when not per rank).
    let members = |rank: u32, kind: GroupKind| -> Vec<usize> {
        if per_rank {
            grid.group(rank, kind).into_iter().map(|r| r as usize).collect()
        } else {
            match kind {
                GroupKind::Tp | GroupKind::Dp => vec![grid.coord(rank).pp as usize],
                _ => {
                    let mut v: Vec<usize> = grid.group(rank, kind).into_iter().map(actor_of_rank).collect();
                    v.dedup();
                    v
                }
            }
        }
    };

    loop {
        let mut progressed = false;
        for ai in 0..actors.len() {
            for st in 0..4 {
                loop {
                    let a = &actors[ai];
                    let Some(&oi) = streams[a.program][st].get(a.cursor[st]) else { break };
                    let op = &plan.programs[a.program].ops[oi];
                    if let OpKind::Free { .. } = op.kind {
                        // A free is posted at once and takes effect when its deps are done.
                        pending_frees.push((ai, oi));
                        actors[ai].cursor[st] += 1;
                        progressed = true;
                        continue;
                    }
                    if !op.deps.iter().all(|d| a.done[*d as usize]) {
                        break;
                    }
                    // The previous op of the stream must be done (a send or a free only posted).
                    if let Some(prev) = (a.cursor[st] > 0).then(|| streams[a.program][st][a.cursor[st] - 1]) {
                        let prev_op = &plan.programs[a.program].ops[prev];
                        if !a.done[prev] && !matches!(prev_op.kind, OpKind::Send(_) | OpKind::Free { .. }) {
                            break;
                        }
                    }
                    match &op.kind {
                        OpKind::Compute(_) | OpKind::Alloc(_) | OpKind::Free { .. } => {
                            let a = &mut actors[ai];
                            a.done[oi] = true;
                            a.remaining -= 1;
                            a.cursor[st] += 1;
                        }
                        OpKind::Send(p) => {
                            let to = actor_of_rank(grid.peer(a.rank, p.peer));
                            mail.entry((to, ai, (p.kind, p.mb, p.vstage))).or_default().push_back((oi, p.bytes));
                            actors[ai].cursor[st] += 1;
                        }
                        OpKind::Recv(p) => {
                            let from = actor_of_rank(grid.peer(a.rank, p.peer));
                            let key = (ai, from, (p.kind, p.mb, p.vstage));
                            let Some((send_op, bytes)) = mail.get_mut(&key).and_then(|q| q.pop_front()) else { break };
                            if bytes != p.bytes {
                                return Err(err(
                                    "mismatch",
                                    location(&actors[ai], oi),
                                    format!(
                                        "receives {} bytes but {} sends {bytes}",
                                        p.bytes,
                                        location(&actors[from], send_op)
                                    ),
                                ));
                            }
                            messages += 1;
                            let s = &mut actors[from];
                            s.done[send_op] = true;
                            s.remaining -= 1;
                            let a = &mut actors[ai];
                            a.done[oi] = true;
                            a.remaining -= 1;
                            a.cursor[st] += 1;
                        }
                        OpKind::Collective(c) => {
                            let group = members(a.rank, c.group);
                            let gid = grid.group_id(a.rank, c.group).1;
                            let key = (
                                c.group,
                                if per_rank || !matches!(c.group, GroupKind::Tp | GroupKind::Dp) {
                                    gid
                                } else {
                                    u32::MAX - a.program as u32
                                },
                            );
                            let inst = arrivals.entry(key).or_default();
                            inst.entry(ai).or_default().push_back(oi);
                            actors[ai].cursor[st] += 1;
                            // Complete if every member has an arrival pending.
                            let inst = &arrivals[&key];
                            if group.iter().all(|m| inst.get(m).is_some_and(|q| !q.is_empty())) {
                                let heads: Vec<(usize, usize)> = group.iter().map(|m| (*m, inst[m][0])).collect();
                                let (a0, o0) = heads[0];
                                let c0 = collective_of(plan, &actors[a0], o0);
                                for &(am, om) in &heads[1..] {
                                    let cm = collective_of(plan, &actors[am], om);
                                    if (cm.kind, cm.bytes, cm.dtype, cm.purpose)
                                        != (c0.kind, c0.bytes, c0.dtype, c0.purpose)
                                    {
                                        return Err(err(
                                            "mismatch",
                                            location(&actors[am], om),
                                            format!(
                                                "issues {} of {} on its {} group where {} issues {} of {} ({})",
                                                cm.kind.key(),
                                                crate::plan::text::bytes(cm.bytes),
                                                cm.group.key(),
                                                location(&actors[a0], o0),
                                                c0.kind.key(),
                                                crate::plan::text::bytes(c0.bytes),
                                                purpose_key(&c0.purpose)
                                            ),
                                        ));
                                    }
                                }
                                let inst = arrivals.get_mut(&key).expect("present");
                                for &(am, om) in &heads {
                                    inst.get_mut(&am).expect("member").pop_front();
                                    actors[am].done[om] = true;
                                    actors[am].remaining -= 1;
                                }
                                collectives += 1;
                            }
                        }
                    }
                    progressed = true;
                }
            }
        }
        pending_frees.retain(|&(ai, oi)| {
            let a = &mut actors[ai];
            let op = &plan.programs[a.program].ops[oi];
            if op.deps.iter().all(|d| a.done[*d as usize]) {
                a.done[oi] = true;
                a.remaining -= 1;
                progressed = true;
                false
            } else {
                true
            }
        });
        if !progressed {
            break;
        }
    }
    // A message whose receiver's program has no receive for it at all is the root cause of
    // whatever else is stuck.
    for ((to, from, tag), q) in &mail {
        let Some((send_op, _)) = q.front() else { continue };
        let receiver = &actors[*to];
        let sender_rank = actors[*from].rank;
        let has_recv = plan.programs[receiver.program].ops.iter().any(|o| match &o.kind {
            OpKind::Recv(p) => {
                (p.kind, p.mb, p.vstage) == *tag && actor_of_rank(grid.peer(receiver.rank, p.peer)) == *from
            }
            _ => false,
        });
        if !has_recv {
            return Err(err(
                "unmatched",
                location(&actors[*from], *send_op),
                format!(
                    "is never received: {} has no matching receive from {}",
                    grid.label(receiver.rank),
                    grid.label(sender_rank)
                ),
            ));
        }
    }
    if let Some(a) = actors.iter().find(|a| a.remaining > 0) {
        // Name the first blocked head op of each stream of the first stuck actor.
        let mut stuck = Vec::new();
        for (st, (ops, cursor)) in streams[a.program].iter().zip(a.cursor).enumerate() {
            if let Some(&oi) = ops.get(cursor) {
                stuck.push(format!(
                    "{} waits at #{oi} ({})",
                    Stream::ALL[st].key(),
                    describe(plan, &plan.programs[a.program].ops[oi])
                ));
            }
        }
        let first = streams[a.program].iter().zip(a.cursor).filter_map(|(s, c)| s.get(c).copied()).min().unwrap_or(0);
        return Err(err(
            "deadlock",
            location(a, first),
            format!("the plan can deadlock: {} ops never run; {}", a.remaining, stuck.join("; ")),
        ));
    }
    if let Some((key, q)) = mail.iter().find(|(_, q)| !q.is_empty()) {
        let (to, from, _) = key;
        return Err(err(
            "unmatched",
            location(&actors[*from], q[0].0),
            format!("is never received by {}", grid.label(actors[*to].rank)),
        ));
    }
    Ok((actors.len() as u32, collectives, messages))
}

fn collective_of(plan: &Plan, a: &Actor, op: usize) -> CollectiveOp {
    match &plan.programs[a.program].ops[op].kind {
        OpKind::Collective(c) => *c,
        _ => unreachable!("arrivals hold collectives only"),
    }
}

fn purpose_key(p: &CollPurpose) -> String {
    format!("{p:?}")
}
