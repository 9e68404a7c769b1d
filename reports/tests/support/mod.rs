//! Test support: plans of a tiny GPT, and timelines for them made without the simulator or
//! the runtime (neither writes traces yet), so the report has realistic inputs to draw.
//!
//! The timeline is a small list scheduler over every rank of the plan, with the IR's
//! semantics: ops of a stream in order after their deps; a collective starts when every
//! member of its group has reached it; a send only posts, and the message moves once the
//! matching receive is posted too. Durations are a roofline (FLOPs / rate + bytes /
//! bandwidth + launch) times a deterministic per-op factor, so "measured" differs from
//! "predicted" the way real runs do.

#![allow(dead_code)]

use std::collections::BTreeMap;

use strata_models::Scenario;
use strata_models::plan::{GroupKind, OpKind, P2pKind, Plan, Stream, lower};
use strata_models::trace::{MemSample, Span, Trace, TraceSource};
use strata_reports::{LandscapeCell, PlanComparison, ReportInputs, SearchLandscape};

/// A tiny-gpt-deep scenario (8 layers) on a one-node CPU cluster of tp·pp·dp ranks.
pub fn scenario(tp: u32, pp: u32, dp: u32, vpp: u32, schedule: &str, zero: u8, microbatches: u32) -> Scenario {
    let text = format!(
        r#"
name = "tiny-{tp}-{pp}-{dp}"
[model]
preset = "tiny-gpt-deep"
[cluster]
preset = "cpu-local"
gpus_per_node = {gpus}
[parallel]
tp = {tp}
pp = {pp}
dp = {dp}
vpp = {vpp}
schedule = "{schedule}"
micro_batch = 1
global_batch = {gb}
zero = {zero}
grad_bucket_mb = 0.05
[training]
dtype = "fp32"
"#,
        gpus = tp * pp * dp,
        gb = microbatches * dp,
    );
    Scenario::from_toml(&text, "test", "test", &[]).unwrap_or_else(|e| panic!("{e}"))
}

pub fn plan(tp: u32, pp: u32, dp: u32, vpp: u32, schedule: &str, zero: u8, microbatches: u32) -> Plan {
    lower(&scenario(tp, pp, dp, vpp, schedule, zero, microbatches)).unwrap_or_else(|e| panic!("{e}"))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A factor in [1 − spread, 1 + spread], fixed by (seed, rank, op).
fn jitter(seed: u64, rank: u32, op: u32, spread: f64) -> f64 {
    let u = splitmix(seed ^ splitmix((rank as u64) << 32 | op as u64)) as f64 / u64::MAX as f64;
    1.0 + spread * (2.0 * u - 1.0)
}

/// Roofline duration of an op, ns, before jitter.
fn base_ns(plan: &Plan, kind: &OpKind) -> u64 {
    match kind {
        OpKind::Compute(c) => {
            let cost = plan.cost(c.cost);
            20_000 + (cost.flops as f64 / 8e9 * 1e9 + cost.mem_bytes as f64 / 4e9 * 1e9) as u64
        }
        OpKind::Collective(c) => 40_000 + (c.bytes as f64 / 1.5e9 * 1e9) as u64,
        OpKind::Send(p) | OpKind::Recv(p) => 15_000 + (p.bytes as f64 / 2e9 * 1e9) as u64,
        OpKind::Alloc(_) | OpKind::Free { .. } => 0,
    }
}

/// How a source scales and scatters durations.
#[derive(Clone, Copy)]
pub struct Flavour {
    pub source: TraceSource,
    pub seed: u64,
    pub compute_scale: f64,
    pub comm_scale: f64,
    pub spread: f64,
}

pub const PREDICTED: Flavour =
    Flavour { source: TraceSource::Simulated, seed: 0, compute_scale: 1.0, comm_scale: 1.0, spread: 0.0 };

pub fn measured(seed: u64) -> Flavour {
    Flavour { source: TraceSource::Measured, seed, compute_scale: 1.06, comm_scale: 1.25, spread: 0.15 }
}

/// Lays out one step of every rank. Panics if the plan cannot finish (a broken plan).
pub fn timeline(plan: &Plan, f: Flavour) -> Trace {
    let ranks = plan.grid.ranks();
    let progs: Vec<_> = (0..ranks).map(|r| plan.program(r)).collect();
    let dur = |rank: u32, op: u32| -> u64 {
        let kind = &progs[rank as usize].ops[op as usize].kind;
        let scale = match kind {
            OpKind::Compute(_) => f.compute_scale,
            _ => f.comm_scale,
        };
        (base_ns(plan, kind) as f64 * scale * jitter(f.seed, rank, op, f.spread)) as u64
    };
    // Per rank: the ops of each stream, in order; the ordinal of each collective on its group kind.
    let mut queues: Vec<[Vec<u32>; 4]> = Vec::new();
    let mut ordinal: Vec<Vec<u32>> = Vec::new();
    for p in &progs {
        let mut q: [Vec<u32>; 4] = Default::default();
        let mut count: BTreeMap<GroupKind, u32> = BTreeMap::new();
        let mut ord = vec![0; p.ops.len()];
        for (i, op) in p.ops.iter().enumerate() {
            q[op.stream.index()].push(i as u32);
            if let OpKind::Collective(c) = &op.kind {
                let n = count.entry(c.group).or_default();
                ord[i] = *n;
                *n += 1;
            }
        }
        queues.push(q);
        ordinal.push(ord);
    }
    let n = ranks as usize;
    let mut cursor = vec![[0usize; 4]; n];
    let mut free_at = vec![[0u64; 4]; n];
    let mut done: Vec<Vec<Option<u64>>> = progs.iter().map(|p| vec![None; p.ops.len()]).collect();
    let mut begin: Vec<Vec<u64>> = progs.iter().map(|p| vec![0; p.ops.len()]).collect();
    let mut waiting: Vec<Vec<bool>> = progs.iter().map(|p| vec![false; p.ops.len()]).collect();
    // (group kind, group id, ordinal) → arrivals (rank, op, time); a post is (rank, op, time).
    type Arrival = (u32, u32, u64);
    type Post = Option<Arrival>;
    type MsgKey = (u32, u32, u8, u32, u32);
    let mut colls: BTreeMap<(GroupKind, u32, u32), Vec<Arrival>> = BTreeMap::new();
    // (from, to, kind, mb, vstage) → (send (rank, op, posted), recv (rank, op, posted)).
    let mut msgs: BTreeMap<MsgKey, (Post, Post)> = BTreeMap::new();
    let mut pending_frees: Vec<(u32, u32)> = Vec::new();
    loop {
        let mut progress = false;
        pending_frees.retain(|&(r, op)| {
            let (ri, oi) = (r as usize, op as usize);
            let deps: Option<Vec<u64>> = progs[ri].ops[oi].deps.iter().map(|d| done[ri][*d as usize]).collect();
            match deps {
                Some(deps) => {
                    done[ri][oi] = Some(deps.into_iter().fold(begin[ri][oi], u64::max));
                    progress = true;
                    false
                }
                None => true,
            }
        });
        for r in 0..ranks {
            for s in 0..4 {
                loop {
                    let ri = r as usize;
                    let Some(&op) = queues[ri][s].get(cursor[ri][s]) else { break };
                    if waiting[ri][op as usize] {
                        break;
                    }
                    let o = &progs[ri].ops[op as usize];
                    if let OpKind::Free { .. } = o.kind {
                        // A free never holds up its stream; it takes effect once its deps are
                        // done (resolved after the loop).
                        begin[ri][op as usize] = free_at[ri][s];
                        pending_frees.push((r, op));
                        cursor[ri][s] += 1;
                        progress = true;
                        continue;
                    }
                    let Some(deps_done) = o.deps.iter().map(|d| done[ri][*d as usize]).collect::<Option<Vec<u64>>>()
                    else {
                        break;
                    };
                    let ready = deps_done.into_iter().fold(free_at[ri][s], u64::max);
                    progress = true;
                    begin[ri][op as usize] = ready;
                    match &o.kind {
                        OpKind::Compute(_) | OpKind::Alloc(_) => {
                            let end = ready + dur(r, op);
                            done[ri][op as usize] = Some(end);
                            free_at[ri][s] = end;
                            cursor[ri][s] += 1;
                        }
                        OpKind::Free { .. } => unreachable!("frees are posted above"),
                        OpKind::Collective(c) => {
                            waiting[ri][op as usize] = true;
                            let (_, gid) = plan.grid.group_id(r, c.group);
                            let size = plan.grid.group(r, c.group).len();
                            let key = (c.group, gid, ordinal[ri][op as usize]);
                            let arrived = colls.entry(key).or_default();
                            arrived.push((r, op, ready));
                            if arrived.len() == size {
                                let members = colls.remove(&key).expect("just inserted");
                                let start = members.iter().map(|m| m.2).max().expect("a member");
                                let end = start + dur(r, op);
                                for (mr, mop, _) in members {
                                    let (mi, ms) = (mr as usize, progs[mr as usize].ops[mop as usize].stream.index());
                                    done[mi][mop as usize] = Some(end);
                                    waiting[mi][mop as usize] = false;
                                    free_at[mi][ms] = end;
                                    cursor[mi][ms] += 1;
                                }
                            }
                        }
                        OpKind::Send(p) | OpKind::Recv(p) => {
                            let send = matches!(o.kind, OpKind::Send(_));
                            let peer = plan.grid.peer(r, p.peer);
                            let (from, to) = if send { (r, peer) } else { (peer, r) };
                            let kind = u8::from(p.kind == P2pKind::Gradient);
                            let entry = msgs.entry((from, to, kind, p.mb, p.vstage)).or_default();
                            if send {
                                entry.0 = Some((r, op, ready));
                                free_at[ri][s] = ready;
                                cursor[ri][s] += 1;
                            } else {
                                entry.1 = Some((r, op, ready));
                                waiting[ri][op as usize] = true;
                            }
                            if let (Some((sr, sop, sp)), Some((rr, rop, rp))) = *entry {
                                let end = sp.max(rp) + dur(sr, sop);
                                done[sr as usize][sop as usize] = Some(end);
                                done[rr as usize][rop as usize] = Some(end);
                                waiting[rr as usize][rop as usize] = false;
                                let rs = Stream::Pp.index();
                                free_at[rr as usize][rs] = free_at[rr as usize][rs].max(end);
                                cursor[rr as usize][rs] += 1;
                            }
                        }
                    }
                }
            }
        }
        if !progress {
            break;
        }
    }
    let mut spans = Vec::new();
    let mut memory = Vec::new();
    for r in 0..ranks {
        let ri = r as usize;
        let mut sizes: BTreeMap<u32, u64> = BTreeMap::new();
        let mut events: Vec<(u64, i64)> = Vec::new();
        for (i, o) in progs[ri].ops.iter().enumerate() {
            let end = done[ri][i].unwrap_or_else(|| panic!("synthetic timeline stuck: rank {r} op {i}"));
            spans.push(Span { rank: r, stream: o.stream, op: i as u32, start_ns: begin[ri][i], end_ns: end });
            match &o.kind {
                OpKind::Alloc(a) => {
                    sizes.insert(a.buf, a.bytes);
                    events.push((begin[ri][i], a.bytes as i64));
                }
                OpKind::Free { buf } => events.push((end, -(sizes[buf] as i64))),
                _ => {}
            }
        }
        events.sort_by_key(|e| e.0);
        let mut bytes = 0i64;
        for (t, d) in events {
            bytes += d;
            match memory.last_mut() {
                Some(MemSample { rank, t_ns, bytes: b }) if *rank == r && *t_ns == t => *b = bytes as u64,
                _ => memory.push(MemSample { rank: r, t_ns: t, bytes: bytes as u64 }),
            }
        }
    }
    let mut t = Trace { source: f.source, step: 0, seed: f.seed, ranks: (0..ranks).collect(), spans, memory };
    t.canonicalize();
    t
}

/// Keeps the ranks of `t` that `keep` accepts (a symmetric simulation covers one rank per stage).
pub fn only_ranks(mut t: Trace, keep: impl Fn(u32) -> bool) -> Trace {
    t.ranks.retain(|r| keep(*r));
    t.spans.retain(|s| keep(s.rank));
    t.memory.retain(|m| keep(m.rank));
    t
}

/// One plan run both ways: predicted on the first rank of each stage, measured on all.
pub fn comparison(name: &str, plan: Plan, seed: u64) -> PlanComparison {
    let grid = plan.grid;
    let predicted = only_ranks(timeline(&plan, PREDICTED), |r| {
        let c = grid.coord(r);
        c.tp == 0 && c.dp == 0
    });
    let measured = timeline(&plan, measured(seed));
    let m = measured.makespan_ns() as f64 * 1e-9;
    let steps = (0..5).map(|i| m * jitter(seed, 99, i, 0.04)).collect();
    PlanComparison::from_traces(name, plan, predicted, measured, steps)
}

/// Plans of the tiny GPT on 8 ranks (`count` of them, up to 8), and a search landscape.
pub fn sample_inputs(count: usize) -> ReportInputs {
    let configs: [(&str, u32, u32, u32, u32, &str, u8); 8] = [
        ("tp2-pp2-dp2", 2, 2, 2, 1, "1f1b", 1),
        ("tp1-pp2-dp4", 1, 2, 4, 1, "1f1b", 0),
        ("tp2-pp4-dp1", 2, 4, 1, 1, "1f1b", 0),
        ("tp4-pp2-dp1-gpipe", 4, 2, 1, 1, "gpipe", 0),
        ("tp1-pp2-dp4-vpp2", 1, 2, 4, 2, "interleaved", 1),
        ("tp2-pp1-dp4-z2", 2, 1, 4, 1, "1f1b", 2),
        ("tp1-pp1-dp8-z3", 1, 1, 8, 1, "1f1b", 3),
        ("tp1-pp4-dp2-zb", 1, 4, 2, 1, "zb-h1", 1),
    ];
    let plans = configs
        .iter()
        .take(count)
        .enumerate()
        .map(|(i, &(name, tp, pp, dp, vpp, sched, zero))| {
            comparison(name, plan(tp, pp, dp, vpp, sched, zero, 4), i as u64 + 1)
        })
        .collect();
    let mut cells = Vec::new();
    for tp in [1, 2, 4] {
        for pp in [1, 2, 4, 8] {
            let ranks = tp * pp;
            let tokens_per_s = if tp * pp > 16 || (tp == 1 && pp == 1) {
                None
            } else {
                Some(1.0e5 / (1.0 + 0.15 * (tp as f64).ln() + 0.25 * (pp as f64).ln()))
            };
            let label = match tokens_per_s {
                Some(_) => format!("dp{} mb1 z1", 8 / ranks.min(8)),
                None if ranks > 16 => "invalid: > 8 ranks".to_string(),
                None => "OOM 31 GiB > 24 GiB".to_string(),
            };
            cells.push(LandscapeCell { tp, pp, tokens_per_s, label });
        }
    }
    ReportInputs {
        title: "tiny-gpt-deep on 8 CPU ranks: predicted vs measured".to_string(),
        comparisons: strata_reports::ComparisonSet { plans },
        landscape: Some(SearchLandscape { cells }),
    }
}
