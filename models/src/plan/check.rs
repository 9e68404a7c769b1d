//! The checked plan: a [`Plan`] whose shape is proven sound before anything indexes it.
//!
//! A plan that comes from [`crate::plan::lower`] is well formed by construction; a plan read
//! from JSON may have been edited by hand. [`CheckedPlan::new`] checks every index and size
//! that the verifier, the simulator and the runtime rely on, in one pass over the ops
//! (O(ops + deps + buffer references) time, O(largest program) memory), and names the field,
//! its value and the rule when one fails. What it proves:
//!
//! - **grid**: `tp`, `dp`, `pp`, `gpus_per_node` are each ≥ 1, and
//!   ranks = tp · dp · pp ≤ [`MAX_RANKS`] = 2^20 (computed in u64, so it cannot wrap).
//!   A million ranks is ~50× the largest jobs trained today, and keeps every per-rank table
//!   a consumer builds (a `Vec` per rank) in memory;
//! - **scenario**: the embedded scenario's `parallel.tp`/`dp`/`pp` and
//!   `cluster.gpus_per_node` equal the grid's, and the scenario passes its own validation
//!   (the planner only lowers valid scenarios);
//! - **programs**: `grid.pp ≤ programs.len() ≤ grid.pp + rank_programs.len()` — the first
//!   `pp` programs are the stages' (what the planner emits: exactly `pp`), the rest exist
//!   only for ranks that run a program of their own; `buckets.len() == grid.pp`;
//! - **rank_programs**: every key is a rank (< ranks) and every value a program index
//!   (< programs.len());
//! - **ops**: a program has at most [`MAX_OPS_PER_PROGRAM`] = 2^23 ops (~8.4 M; the planner
//!   emits ~10^4–10^5 per stage for a 405B job). Each op's `deps` are earlier ops; a compute
//!   op's cost id indexes `costs`; a buffer id is below the program's op count (each buffer
//!   needs its own `Alloc`, and the planner numbers buffers from 0); each buffer is
//!   allocated at most once, every buffer an op uses or frees was allocated at an earlier
//!   op, and it is freed at most once;
//! - **bytes**: every `Alloc`, collective and send/receive size is at most
//!   [`MAX_BYTES`] = 2^40 (1 TiB) — ~7× the memory of the largest GPU, per rank. With the op
//!   limit, any sum of a program's sizes stays below 2^63, so no consumer's byte total can
//!   overflow a u64.
//!
//! What it leaves to [`crate::plan::verify`]: happens-before between a buffer's allocation,
//! uses and free, matching of sends, receives and collectives, and deadlock.

use std::ops::Deref;

use crate::plan::Plan;
use crate::plan::ir::{BufId, Op, OpKind, Program};
use crate::plan::verify::VerifyError;

/// Most ranks a plan may have: 2^20.
pub const MAX_RANKS: u64 = 1 << 20;
/// Most ops one program may have: 2^23.
pub const MAX_OPS_PER_PROGRAM: usize = 1 << 23;
/// Largest buffer, collective or message, bytes: 2^40 (1 TiB).
pub const MAX_BYTES: u64 = 1 << 40;

/// Why a plan is malformed: the field, its value and the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("grid.{field} = {value}: every grid dimension must be at least 1")]
    GridDimension { field: &'static str, value: u32 },
    #[error("grid tp = {tp}, dp = {dp}, pp = {pp} is {ranks} ranks: more than the limit of {MAX_RANKS} (2^20) ranks")]
    TooManyRanks { tp: u32, dp: u32, pp: u32, ranks: u64 },
    #[error(
        "scenario.{field} = {scenario} but grid.{grid_field} = {grid}: the embedded scenario must describe the plan's grid"
    )]
    ScenarioGrid { field: &'static str, grid_field: &'static str, scenario: u32, grid: u32 },
    #[error("the embedded scenario is invalid: {message}")]
    Scenario { message: String },
    #[error(
        "programs.len() = {programs} with grid.pp = {pp} and rank_programs.len() = {rank_programs}: a plan needs one program per pipeline stage, plus at most one per rank_programs entry"
    )]
    ProgramCount { programs: usize, pp: u32, rank_programs: usize },
    #[error("buckets.len() = {buckets} with grid.pp = {pp}: a plan needs one bucket list per pipeline stage")]
    BucketCount { buckets: usize, pp: u32 },
    #[error("rank_programs has key {rank}, which is not a rank of the grid ({ranks} ranks)")]
    RankProgramRank { rank: u32, ranks: u64 },
    #[error("rank_programs[{rank}] = {program}: there is no such program ({programs} programs)")]
    RankProgramIndex { rank: u32, program: u32, programs: usize },
    #[error("programs[{program}] has {ops} ops: more than the limit of {MAX_OPS_PER_PROGRAM} (2^23) per program")]
    TooManyOps { program: usize, ops: usize },
    #[error("programs[{program}].ops[{op}].{field} = {value}: {rule}")]
    Op { program: usize, op: usize, field: &'static str, value: u64, rule: String },
}

/// The verifier reports a malformed plan as a `structure` failure of the whole plan.
impl From<PlanError> for VerifyError {
    fn from(e: PlanError) -> VerifyError {
        VerifyError { location: "plan".to_string(), reason: e.to_string(), kind: "structure" }
    }
}

/// A plan that passed [`check`]: every index in it is in range. Dereferences to the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedPlan(Plan);

impl CheckedPlan {
    /// Checks a plan (see the module comment for the rules).
    pub fn new(plan: Plan) -> Result<CheckedPlan, PlanError> {
        check(&plan)?;
        Ok(CheckedPlan(plan))
    }

    pub fn into_inner(self) -> Plan {
        self.0
    }
}

impl Deref for CheckedPlan {
    type Target = Plan;

    fn deref(&self) -> &Plan {
        &self.0
    }
}

/// Checks a borrowed plan; [`CheckedPlan::new`] is the owning form.
pub fn check(plan: &Plan) -> Result<(), PlanError> {
    let ranks = check_grid(plan)?;
    check_scenario(plan)?;
    let (pp, programs) = (plan.grid.pp, plan.programs.len());
    let extra = plan.rank_programs.len();
    if programs < pp as usize || programs - pp as usize > extra {
        return Err(PlanError::ProgramCount { programs, pp, rank_programs: extra });
    }
    if plan.buckets.len() != pp as usize {
        return Err(PlanError::BucketCount { buckets: plan.buckets.len(), pp });
    }
    for (&rank, &program) in &plan.rank_programs {
        if u64::from(rank) >= ranks {
            return Err(PlanError::RankProgramRank { rank, ranks });
        }
        if program as usize >= programs {
            return Err(PlanError::RankProgramIndex { rank, program, programs });
        }
    }
    for (pi, program) in plan.programs.iter().enumerate() {
        check_program(plan, pi, program)?;
    }
    Ok(())
}

/// Grid dimensions and the rank limit; returns the number of ranks.
fn check_grid(plan: &Plan) -> Result<u64, PlanError> {
    let g = plan.grid;
    for (field, value) in [("tp", g.tp), ("dp", g.dp), ("pp", g.pp), ("gpus_per_node", g.gpus_per_node)] {
        if value == 0 {
            return Err(PlanError::GridDimension { field, value });
        }
    }
    // Each factor is < 2^32, so the product of two fits a u64; the third saturates (and
    // u64::MAX is over the limit too).
    let ranks = (u64::from(g.tp) * u64::from(g.dp)).saturating_mul(u64::from(g.pp));
    if ranks > MAX_RANKS {
        return Err(PlanError::TooManyRanks { tp: g.tp, dp: g.dp, pp: g.pp, ranks });
    }
    Ok(ranks)
}

fn check_scenario(plan: &Plan) -> Result<(), PlanError> {
    let (s, g) = (&plan.scenario, plan.grid);
    for (field, grid_field, scenario, grid) in [
        ("parallel.tp", "tp", s.parallel.tp, g.tp),
        ("parallel.dp", "dp", s.parallel.dp, g.dp),
        ("parallel.pp", "pp", s.parallel.pp, g.pp),
        ("cluster.gpus_per_node", "gpus_per_node", s.cluster.gpus_per_node, g.gpus_per_node),
    ] {
        if scenario != grid {
            return Err(PlanError::ScenarioGrid { field, grid_field, scenario, grid });
        }
    }
    s.validate().map_err(|e| PlanError::Scenario { message: e.to_string() })
}

/// What is known of a buffer at a point of its program (program order).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Buf {
    Unallocated,
    Allocated,
    Freed,
}

fn check_program(plan: &Plan, pi: usize, program: &Program) -> Result<(), PlanError> {
    let ops = &program.ops;
    if ops.len() > MAX_OPS_PER_PROGRAM {
        return Err(PlanError::TooManyOps { program: pi, ops: ops.len() });
    }
    let mut bufs = vec![Buf::Unallocated; ops.len()];
    for (i, op) in ops.iter().enumerate() {
        let fail =
            |field: &'static str, value: u64, rule: String| PlanError::Op { program: pi, op: i, field, value, rule };
        if let Some(&d) = op.deps.iter().find(|d| **d as usize >= i) {
            return Err(fail("deps", d.into(), format!("a dependency must be an earlier op (this is op #{i})")));
        }
        check_sizes(plan, op, &fail)?;
        let slot = |b: BufId, field: &'static str| -> Result<usize, PlanError> {
            if (b as usize) < ops.len() {
                Ok(b as usize)
            } else {
                Err(fail(field, b.into(), format!("a buffer id must be below the program's op count ({})", ops.len())))
            }
        };
        for &b in &op.bufs {
            if bufs[slot(b, "bufs")?] == Buf::Unallocated {
                return Err(fail("bufs", b.into(), "the op uses a buffer that no earlier op allocates".into()));
            }
        }
        match &op.kind {
            OpKind::Alloc(a) => {
                let s = slot(a.buf, "kind.alloc.buf")?;
                if bufs[s] != Buf::Unallocated {
                    return Err(fail("kind.alloc.buf", a.buf.into(), "a buffer is allocated at most once".into()));
                }
                bufs[s] = Buf::Allocated;
            }
            OpKind::Free { buf } => {
                let s = slot(*buf, "kind.free.buf")?;
                match bufs[s] {
                    Buf::Unallocated => {
                        return Err(fail(
                            "kind.free.buf",
                            (*buf).into(),
                            "frees a buffer no earlier op allocates".into(),
                        ));
                    }
                    Buf::Freed => {
                        return Err(fail("kind.free.buf", (*buf).into(), "a buffer is freed at most once".into()));
                    }
                    Buf::Allocated => bufs[s] = Buf::Freed,
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The cost id of a compute op, and the byte sizes of the others.
fn check_sizes(plan: &Plan, op: &Op, fail: &dyn Fn(&'static str, u64, String) -> PlanError) -> Result<(), PlanError> {
    let (field, bytes) = match &op.kind {
        OpKind::Compute(c) => {
            if c.cost as usize >= plan.costs.len() {
                let rule = format!("a cost id must index costs ({} entries)", plan.costs.len());
                return Err(fail("kind.compute.cost", c.cost.into(), rule));
            }
            return Ok(());
        }
        OpKind::Collective(c) => ("kind.collective.bytes", c.bytes),
        OpKind::Send(p) => ("kind.send.bytes", p.bytes),
        OpKind::Recv(p) => ("kind.recv.bytes", p.bytes),
        OpKind::Alloc(a) => ("kind.alloc.bytes", a.bytes),
        OpKind::Free { .. } => return Ok(()),
    };
    if bytes > MAX_BYTES {
        return Err(fail(field, bytes, format!("sizes are at most {MAX_BYTES} bytes (1 TiB)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::{Recompute, Schedule};
    use crate::plan::ir::{ComputeOp, Phase, Piece, Stream};
    use crate::plan::lower;

    /// A 2-stage, 2-way tensor-parallel plan of the tiny model.
    fn plan() -> Plan {
        let s = crate::plan::tests::tiny(2, 2, 1, 1, Schedule::OneFOneB, 1, Recompute::None, false, 4);
        lower(&s).unwrap()
    }

    fn rejects(plan: Plan, words: &[&str]) -> PlanError {
        let e = CheckedPlan::new(plan).unwrap_err();
        for w in words {
            assert!(e.to_string().contains(w), "message lacks {w:?}: {e}");
        }
        e
    }

    #[test]
    fn planner_plans_pass_and_deref_to_the_plan() {
        let p = plan();
        let checked = CheckedPlan::new(p.clone()).unwrap();
        assert_eq!(checked.grid, p.grid);
        assert_eq!(checked.into_inner(), p);
    }

    #[test]
    fn grid_dimensions_are_at_least_one() {
        for field in ["tp", "dp", "pp", "gpus_per_node"] {
            let mut p = plan();
            match field {
                "tp" => p.grid.tp = 0,
                "dp" => p.grid.dp = 0,
                "pp" => p.grid.pp = 0,
                _ => p.grid.gpus_per_node = 0,
            }
            let e = rejects(p, &[&format!("grid.{field} = 0")]);
            assert_eq!(e, PlanError::GridDimension { field, value: 0 });
        }
    }

    #[test]
    fn ranks_are_limited_without_overflow() {
        let mut p = plan();
        p.grid.pp = 1_000_000_000;
        let e = rejects(p, &["2000000000 ranks", "limit"]);
        assert!(matches!(e, PlanError::TooManyRanks { ranks: 2_000_000_000, .. }), "{e}");
        let mut p = plan();
        (p.grid.tp, p.grid.dp, p.grid.pp) = (u32::MAX, u32::MAX, u32::MAX);
        rejects(p, &[&u64::MAX.to_string()]);
        // Exactly at the limit the grid itself is fine (the scenario check fails next).
        let mut p = plan();
        (p.grid.tp, p.grid.dp, p.grid.pp) = (1, 1 << 10, 1 << 10);
        assert!(matches!(CheckedPlan::new(p).unwrap_err(), PlanError::ScenarioGrid { .. }));
    }

    #[test]
    fn the_scenario_describes_the_grid() {
        let mut p = plan();
        p.scenario.parallel.dp = 3;
        rejects(p, &["scenario.parallel.dp = 3", "grid.dp = 1"]);
    }

    #[test]
    fn one_program_per_stage_plus_per_rank_ones() {
        let mut p = plan();
        p.programs.pop();
        rejects(p, &["programs.len() = 1 with grid.pp = 2"]);
        let mut p = plan();
        p.programs.clear();
        rejects(p, &["programs.len() = 0"]);
        let mut p = plan();
        p.programs.push(Program::default());
        rejects(p, &["programs.len() = 3", "rank_programs.len() = 0"]);
        let mut p = plan();
        p.program_of_rank_mut(3);
        CheckedPlan::new(p).unwrap();
        let mut p = plan();
        p.buckets.pop();
        rejects(p, &["buckets.len() = 1"]);
    }

    #[test]
    fn rank_programs_name_ranks_and_programs() {
        let mut p = plan();
        p.rank_programs.insert(1, 7);
        p.programs.push(Program::default());
        let e = rejects(p, &["rank_programs[1] = 7", "3 programs"]);
        assert_eq!(e, PlanError::RankProgramIndex { rank: 1, program: 7, programs: 3 });
        let mut p = plan();
        p.rank_programs.insert(4, 0);
        rejects(p, &["key 4", "4 ranks"]);
    }

    fn op_error(p: Plan) -> (usize, usize, &'static str, u64) {
        match CheckedPlan::new(p).unwrap_err() {
            PlanError::Op { program, op, field, value, .. } => (program, op, field, value),
            e => panic!("not an op error: {e}"),
        }
    }

    #[test]
    fn ops_index_only_what_exists() {
        let mut p = plan();
        let i = p.programs[1].ops.iter().position(|o| matches!(o.kind, OpKind::Compute(_))).unwrap();
        if let OpKind::Compute(c) = &mut p.programs[1].ops[i].kind {
            c.cost = 9999;
        }
        assert_eq!(op_error(p.clone()), (1, i, "kind.compute.cost", 9999));
        rejects(p, &["programs[1].ops[", "cost = 9999", "must index costs"]);

        let mut p = plan();
        p.programs[0].ops[0].deps.push(0);
        assert_eq!(op_error(p), (0, 0, "deps", 0));

        let mut p = plan();
        let n = p.programs[0].ops.len() as u32;
        p.programs[0].ops[3].bufs.push(n);
        assert_eq!(op_error(p), (0, 3, "bufs", n.into()));

        // A use before the buffer's allocation in program order.
        let mut p = plan();
        let (i, buf) = p.programs[0]
            .ops
            .iter()
            .enumerate()
            .find_map(|(i, o)| match &o.kind {
                OpKind::Alloc(a) => Some((i, a.buf)),
                _ => None,
            })
            .unwrap();
        p.programs[0].ops.insert(i, compute_op(buf));
        assert_eq!(op_error(p), (0, i, "bufs", buf.into()));
    }

    fn compute_op(buf: BufId) -> Op {
        let c = ComputeOp { piece: Piece::Embed, phase: Phase::Forward, mb: 0, chunk: 0, layer: 0, step: 0, cost: 0 };
        Op { stream: Stream::Compute, deps: vec![], bufs: vec![buf], kind: OpKind::Compute(c) }
    }

    #[test]
    fn buffers_are_allocated_once_and_freed_once() {
        let mut p = plan();
        let free = p.programs[0].ops.iter().position(|o| matches!(o.kind, OpKind::Free { .. })).unwrap();
        let op = p.programs[0].ops[free].clone();
        p.programs[0].ops.push(op.clone());
        let last = p.programs[0].ops.len() - 1;
        let OpKind::Free { buf } = op.kind else { unreachable!() };
        assert_eq!(op_error(p.clone()), (0, last, "kind.free.buf", buf.into()));
        rejects(p, &["freed at most once"]);

        let mut p = plan();
        let alloc = p.programs[0].ops.iter().position(|o| matches!(o.kind, OpKind::Alloc(_))).unwrap();
        let op = p.programs[0].ops[alloc].clone();
        p.programs[0].ops.push(op);
        rejects(p, &["allocated at most once"]);

        let mut p = plan();
        p.programs[0]
            .ops
            .insert(0, Op { stream: Stream::Compute, deps: vec![], bufs: vec![], kind: OpKind::Free { buf: 0 } });
        assert_eq!(op_error(p), (0, 0, "kind.free.buf", 0));
    }

    #[test]
    fn sizes_are_limited() {
        let mut p = plan();
        let i = p.programs[0].ops.iter().position(|o| matches!(o.kind, OpKind::Collective(_))).unwrap();
        if let OpKind::Collective(c) = &mut p.programs[0].ops[i].kind {
            c.bytes = MAX_BYTES + 1;
        }
        assert_eq!(op_error(p), (0, i, "kind.collective.bytes", MAX_BYTES + 1));
        let mut p = plan();
        let i = p.programs[0].ops.iter().position(|o| matches!(o.kind, OpKind::Send(_))).unwrap();
        if let OpKind::Send(s) = &mut p.programs[0].ops[i].kind {
            s.bytes = u64::MAX;
        }
        assert_eq!(op_error(p), (0, i, "kind.send.bytes", u64::MAX));
        let mut p = plan();
        let i = p.programs[0].ops.iter().position(|o| matches!(o.kind, OpKind::Alloc(_))).unwrap();
        if let OpKind::Alloc(a) = &mut p.programs[0].ops[i].kind {
            a.bytes = MAX_BYTES;
        }
        CheckedPlan::new(p).unwrap();
    }
}
