//! The plan's streams as CUDA streams: the order in which one host thread enqueues a
//! rank's ops, and which CUDA events each op's stream waits on first.
//!
//! Ops of one plan stream run in program order on one CUDA stream, so a dependency on an
//! earlier op of the same stream needs nothing. A dependency on another stream becomes a
//! wait on the end event of that op — unless the stream already knows it is done: each
//! stream carries a vector clock (for every stream, how many of its ops are known to have
//! ended), a wait merges the clock of the awaited op, and a dependency the clock already
//! covers is dropped. Of the dependencies left, only the latest per stream is kept, and one
//! that another kept wait already implies is dropped, so no wait is redundant.
//!
//! A `Free` runs nothing on a stream: its buffer's block goes back to the device pool with
//! a *fence*, the end events of its dependencies, which the block's next user waits on
//! (`pool`). A dependency on a free stands for the free's own dependencies.
//!
//! The enqueue order comes from the plan's shared semantics ([`Cursor`]): the host takes
//! every op that may start, stream by stream, and counts it done once enqueued (the GPU
//! then enforces the order through streams and events). Every wait therefore names an op
//! enqueued earlier, so the GPU cannot deadlock on the waits themselves.

use strata_models::plan::exec::{Cursor, Next, OpClass, ProgramGraph, Wake};
use strata_models::plan::{OpId, Program, Stream};

/// One op as the host enqueues it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueue {
    pub op: OpId,
    /// The CUDA stream (the plan's stream); a free is on none.
    pub stream: Option<Stream>,
    /// Ops of other streams whose end events the stream waits on before this op (for a
    /// free: its fence, the end events of its dependencies).
    pub waits: Vec<OpId>,
}

/// A rank's program as CUDA work.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub order: Vec<Enqueue>,
    /// Whether op i's end event is waited on (by a stream or as a fence).
    pub awaited: Vec<bool>,
}

type Clock = [u32; 4];

fn merge(a: &mut Clock, b: &Clock) {
    for i in 0..4 {
        a[i] = a[i].max(b[i]);
    }
}

impl Schedule {
    /// The schedule of `program` (compiled as `graph`).
    pub fn new(program: &Program, graph: &ProgramGraph) -> Schedule {
        let n = graph.len();
        // Position of each op on its stream, counting only ops that run on it (not frees).
        let mut pos = vec![0u32; n];
        for list in &graph.streams {
            let mut k = 0;
            for &op in list {
                pos[op as usize] = k;
                if graph.class[op as usize] != OpClass::Free {
                    k += 1;
                }
            }
        }
        let mut cur = Cursor::new(graph);
        let mut stream_clock: [Clock; 4] = [[0; 4]; 4];
        let mut after: Vec<Clock> = vec![[0; 4]; n];
        // What a dependency on op i stands for: itself, or a free's dependencies.
        let mut stands_for: Vec<Vec<OpId>> = vec![Vec::new(); n];
        let mut awaited = vec![false; n];
        let mut order = Vec::with_capacity(n);
        let mut ready_frees: Vec<OpId> = Vec::new();
        while cur.remaining() > 0 {
            let mut moved = false;
            for s in Stream::ALL {
                loop {
                    let op = match cur.next(graph, s) {
                        Next::Blocked | Next::End => break,
                        Next::Free { op, ready } => {
                            moved = true;
                            if ready {
                                ready_frees.push(op);
                            }
                            continue;
                        }
                        Next::Start(op) => op,
                    };
                    moved = true;
                    let si = s.index();
                    let deps = Self::expand(&program.ops[op as usize].deps, &stands_for);
                    let waits = Self::minimal(&deps, &stream_clock[si], graph, &pos, &after, Some(s));
                    for &w in &waits {
                        awaited[w as usize] = true;
                        merge(&mut stream_clock[si], &after[w as usize]);
                    }
                    stream_clock[si][si] = pos[op as usize] + 1;
                    after[op as usize] = stream_clock[si];
                    stands_for[op as usize] = vec![op];
                    order.push(Enqueue { op, stream: Some(s), waits });
                    cur.complete(graph, op, |w| {
                        if let Wake::Free(f) = w {
                            ready_frees.push(f)
                        }
                    });
                    while let Some(f) = ready_frees.pop() {
                        let deps = Self::expand(&program.ops[f as usize].deps, &stands_for);
                        let fence = Self::minimal(&deps, &[0; 4], graph, &pos, &after, None);
                        for &w in &fence {
                            awaited[w as usize] = true;
                        }
                        stands_for[f as usize] = fence.clone();
                        order.push(Enqueue { op: f, stream: None, waits: fence });
                        cur.complete(graph, f, |w| {
                            if let Wake::Free(g) = w {
                                ready_frees.push(g)
                            }
                        });
                    }
                }
            }
            // A verified program always moves; a stuck one would loop forever.
            assert!(moved, "the program cannot run to its end (a plan that passed verify always does)");
        }
        Schedule { order, awaited }
    }

    fn expand(deps: &[OpId], stands_for: &[Vec<OpId>]) -> Vec<OpId> {
        let mut out: Vec<OpId> = deps.iter().flat_map(|d| stands_for[*d as usize].iter().copied()).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The waits that make every op of `deps` known done on a stream whose clock is
    /// `clock`: the latest per stream not already covered, less those another implies.
    fn minimal(
        deps: &[OpId],
        clock: &Clock,
        graph: &ProgramGraph,
        pos: &[u32],
        after: &[Clock],
        own: Option<Stream>,
    ) -> Vec<OpId> {
        let mut latest: [Option<OpId>; 4] = [None; 4];
        for &d in deps {
            let t = graph.stream[d as usize];
            if Some(t) == own || clock[t.index()] > pos[d as usize] {
                continue;
            }
            let l = &mut latest[t.index()];
            if l.is_none_or(|x| pos[x as usize] < pos[d as usize]) {
                *l = Some(d);
            }
        }
        let cands: Vec<OpId> = latest.iter().flatten().copied().collect();
        cands
            .iter()
            .copied()
            .filter(|&c| {
                let t = graph.stream[c as usize].index();
                !cands.iter().any(|&o| o != c && after[o as usize][t] > pos[c as usize])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::Scenario;
    use strata_models::plan::OpKind;

    fn program(sets: &[&str]) -> Program {
        let text = include_str!("../../../../scenarios/tiny-gpt-cpu.toml");
        let base = [
            "parallel.tp=1",
            "parallel.pp=1",
            "parallel.dp=1",
            "parallel.zero=0",
            "parallel.global_batch=8",
            "cluster.gpus_per_node=1",
        ];
        let sets: Vec<String> = base.iter().chain(sets).map(|s| s.to_string()).collect();
        let s = Scenario::from_toml(text, "tiny", "tiny", &sets).unwrap();
        let plan = strata_models::plan::lower(&s).unwrap();
        plan.program(0).clone()
    }

    /// Happens-before on the GPU as bitsets: stream order of running ops, plus waits (a
    /// free's fence stands for the free).
    fn reach(p: &Program, s: &Schedule) -> Vec<Vec<u64>> {
        let n = p.ops.len();
        let words = n.div_ceil(64);
        let mut r = vec![vec![0u64; words]; n];
        let mut last: [Option<usize>; 4] = [None; 4];
        for e in &s.order {
            let i = e.op as usize;
            let mut preds: Vec<usize> = e.waits.iter().map(|w| *w as usize).collect();
            if let Some(st) = e.stream {
                preds.extend(last[st.index()]);
                last[st.index()] = Some(i);
            }
            for q in preds {
                r[i][q / 64] |= 1 << (q % 64);
                let row = r[q].clone();
                for (a, b) in r[i].iter_mut().zip(row) {
                    *a |= b;
                }
            }
        }
        r
    }

    fn before(r: &[Vec<u64>], i: usize, d: usize) -> bool {
        r[i][d / 64] >> (d % 64) & 1 == 1
    }

    /// Op `d` is known done where op `i` runs; a free has no end of its own, so its fence
    /// (recursively through frees it depends on) is what `i` must follow.
    fn covered(p: &Program, s: &Schedule, at: &[usize], r: &[Vec<u64>], i: usize, d: usize) -> bool {
        if matches!(p.ops[d].kind, OpKind::Free { .. }) {
            s.order[at[d]].waits.iter().all(|&w| before(r, i, w as usize))
        } else {
            before(r, i, d)
        }
    }

    fn check(sets: &[&str]) -> (Program, Schedule) {
        let p = program(sets);
        let g = ProgramGraph::new(&p).unwrap();
        let s = Schedule::new(&p, &g);
        assert_eq!(s.order.len(), p.ops.len(), "every op enqueued once");
        let r = reach(&p, &s);
        let mut at = vec![usize::MAX; p.ops.len()];
        for (k, e) in s.order.iter().enumerate() {
            at[e.op as usize] = k;
        }
        for (i, op) in p.ops.iter().enumerate() {
            for &d in &op.deps {
                let d = d as usize;
                assert!(at[d] < at[i], "op #{i} enqueued before its dep #{d}");
                assert!(covered(&p, &s, &at, &r, i, d), "op #{i} may run before its dep #{d}");
            }
        }
        // No wait is redundant: dropping any one loses an ordering some dep needs (the
        // first 40 waits, to keep the test quick).
        for (k, e) in s.order.iter().enumerate().filter(|(_, e)| !e.waits.is_empty()).take(40) {
            if e.stream.is_none() {
                continue;
            }
            for w in 0..e.waits.len() {
                let mut t = s.clone();
                t.order[k].waits.remove(w);
                let r2 = reach(&p, &t);
                let lost = p
                    .ops
                    .iter()
                    .enumerate()
                    .any(|(i, op)| op.deps.iter().any(|&d| !covered(&p, &t, &at, &r2, i, d as usize)));
                assert!(lost, "op #{}'s wait on #{} is redundant", e.op, e.waits[w]);
            }
        }
        (p, s)
    }

    #[test]
    fn cross_stream_deps_become_minimal_event_waits_on_one_rank() {
        let (p, s) = check(&[]);
        // One rank still reduces its gradient buckets on the dp stream (groups of one): the
        // first reduction waits for the backward, the later ones know it already.
        let dp: Vec<&Enqueue> = s.order.iter().filter(|e| e.stream == Some(Stream::Dp)).collect();
        assert!(dp.len() >= 2, "{dp:?}");
        assert!(!dp[0].waits.is_empty());
        assert!(dp.iter().flat_map(|e| &e.waits).all(|w| p.ops[*w as usize].stream == Stream::Compute));
        let cross: usize = dp
            .iter()
            .map(|e| p.ops[e.op as usize].deps.iter().filter(|d| p.ops[**d as usize].stream != Stream::Dp).count())
            .sum();
        let waits: usize = dp.iter().map(|e| e.waits.len()).sum();
        assert!(waits < cross, "{waits} waits for {cross} cross-stream deps");
    }

    #[test]
    fn tensor_and_data_parallel_ops_wait_for_the_compute_that_feeds_them() {
        let (p, s) = check(&["parallel.tp=2", "parallel.dp=2", "cluster.gpus_per_node=4"]);
        let tp_waits = s.order.iter().filter(|e| e.stream == Some(Stream::Tp) && !e.waits.is_empty()).count();
        let compute_waits = s.order.iter().filter(|e| e.stream == Some(Stream::Compute) && !e.waits.is_empty()).count();
        assert!(tp_waits > 0 && compute_waits > 0, "{tp_waits} {compute_waits}");
        assert!(p.ops.iter().any(|o| o.stream == Stream::Dp));
        for e in &s.order {
            for &w in &e.waits {
                assert!(s.awaited[w as usize]);
                if let Some(st) = e.stream {
                    assert_ne!(p.ops[w as usize].stream, st, "a wait on the op's own stream");
                }
            }
        }
    }

    #[test]
    fn pipeline_and_zero3_schedules_hold_every_dependency() {
        check(&["parallel.pp=2", "parallel.dp=2", "cluster.gpus_per_node=4"]);
        check(&["parallel.dp=2", "parallel.zero=3", "cluster.gpus_per_node=2"]);
    }
}
