//! Pipeline schedules as tables: for each pipeline stage, the ordered passes it runs —
//! (microbatch, model chunk, pass) — before any op is emitted.
//!
//! - **GPipe** (Huang et al. 2019): all m forwards, then all m backwards. Bubble (p−1)/m,
//!   m microbatches in flight.
//! - **1F1B** (PipeDream-Flush, Narayanan et al. 2021): stage i runs min(p−i−1, m) warm-up
//!   forwards, then alternates one forward and one backward, then drains the remaining
//!   backwards. Bubble (p−1)/m, at most p−i microbatches in flight.
//! - **Interleaved 1F1B** (Narayanan et al. SC'21 §2.2, Megatron-LM's
//!   `forward_backward_pipelining_with_interleaving`): v chunks per stage; forward k runs
//!   microbatch ⌊k/(p·v)⌋·p + k mod p on chunk ⌊(k mod p·v)/p⌋ (backwards take the chunks
//!   in reverse); warm-up (p−i−1)·2 + (v−1)·p passes (all of them when m = p). Bubble
//!   (p−1)/(v·m).
//! - **ZB-H1** (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B's order of
//!   forwards and input-gradient passes (B), with each weight-gradient pass (W) deferred
//!   until stage i has more than i of them pending, the rest at the end. With
//!   T_F = T_B = T_W the bubble is (p−1)/(3m) and no stage holds more than p microbatches,
//!   1F1B's peak.
//!
//! Non-zero-bubble schedules run the backward as one pass (`Pass::Backward`: input and
//! weight gradients back to back).

use serde::{Deserialize, Serialize};

use crate::parallel::Schedule;

/// What a table slot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pass {
    Forward,
    /// Input and weight gradients together.
    Backward,
    /// Input gradients only (ZB's B).
    BackwardInput,
    /// Weight gradients only (ZB's W).
    BackwardWeight,
}

/// Where in the schedule a slot falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    WarmUp,
    Steady,
    CoolDown,
}

/// One entry of a stage's schedule table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub mb: u32,
    pub chunk: u32,
    pub pass: Pass,
    pub phase: Stage,
}

/// The schedule table of pipeline stage `stage` of `pp`, with `vpp` chunks and `m`
/// microbatches. The caller has validated the configuration (interleaving needs m a
/// multiple of pp).
pub fn table(schedule: Schedule, pp: u32, vpp: u32, m: u32, stage: u32) -> Vec<Slot> {
    assert!(stage < pp && m > 0 && vpp > 0, "schedule table of stage {stage} of {pp}, m = {m}, v = {vpp}");
    match schedule {
        Schedule::Gpipe => gpipe(m),
        Schedule::OneFOneB => one_f_one_b(pp, m, stage),
        Schedule::Interleaved => interleaved(pp, vpp, m, stage),
        Schedule::ZbH1 => zb_h1(pp, m, stage),
    }
}

fn slot(mb: u32, chunk: u32, pass: Pass, phase: Stage) -> Slot {
    Slot { mb, chunk, pass, phase }
}

fn gpipe(m: u32) -> Vec<Slot> {
    let fwd = (0..m).map(|j| slot(j, 0, Pass::Forward, Stage::WarmUp));
    let bwd = (0..m).map(|j| slot(j, 0, Pass::Backward, Stage::CoolDown));
    fwd.chain(bwd).collect()
}

fn one_f_one_b(pp: u32, m: u32, stage: u32) -> Vec<Slot> {
    let warm = (pp - stage - 1).min(m);
    let mut t: Vec<Slot> = (0..warm).map(|j| slot(j, 0, Pass::Forward, Stage::WarmUp)).collect();
    for k in 0..m - warm {
        t.push(slot(warm + k, 0, Pass::Forward, Stage::Steady));
        t.push(slot(k, 0, Pass::Backward, Stage::Steady));
    }
    t.extend((m - warm..m).map(|j| slot(j, 0, Pass::Backward, Stage::CoolDown)));
    t
}

fn interleaved(pp: u32, v: u32, m: u32, stage: u32) -> Vec<Slot> {
    let total = m * v;
    let warm = if m == pp { total } else { ((pp - stage - 1) * 2 + (v - 1) * pp).min(total) };
    let chunk = |k: u32, forward: bool| {
        let c = (k % (pp * v)) / pp;
        if forward { c } else { v - 1 - c }
    };
    let mb = |k: u32| (k / (pp * v)) * pp + k % pp;
    let mut t: Vec<Slot> = (0..warm).map(|k| slot(mb(k), chunk(k, true), Pass::Forward, Stage::WarmUp)).collect();
    for r in 0..total - warm {
        let k = warm + r;
        t.push(slot(mb(k), chunk(k, true), Pass::Forward, Stage::Steady));
        t.push(slot(mb(r), chunk(r, false), Pass::Backward, Stage::Steady));
    }
    t.extend((total - warm..total).map(|r| slot(mb(r), chunk(r, false), Pass::Backward, Stage::CoolDown)));
    t
}

fn zb_h1(pp: u32, m: u32, stage: u32) -> Vec<Slot> {
    let mut t = Vec::with_capacity(3 * m as usize);
    let mut pending = std::collections::VecDeque::new();
    for s in one_f_one_b(pp, m, stage) {
        match s.pass {
            Pass::Forward => t.push(s),
            _ => {
                t.push(Slot { pass: Pass::BackwardInput, ..s });
                pending.push_back(s.mb);
                while pending.len() > stage as usize {
                    let j = pending.pop_front().expect("non-empty");
                    t.push(slot(j, 0, Pass::BackwardWeight, s.phase));
                }
            }
        }
    }
    t.extend(pending.into_iter().map(|j| slot(j, 0, Pass::BackwardWeight, Stage::CoolDown)));
    t
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Executes the tables of all stages with fixed pass times (in units where a full
    /// forward of one microbatch through one stage takes `v` chunk forwards of 1/v) and
    /// returns the makespan, as exact rationals scaled by `v`·3 to stay integral.
    /// Dependencies: a forward needs the same microbatch's forward on the previous virtual
    /// stage; an input-gradient pass the next virtual stage's; a weight pass its own input
    /// pass.
    pub(crate) fn unit_makespan(schedule: Schedule, pp: u32, v: u32, m: u32, tf: u64, tb: u64, tw: u64) -> u64 {
        use std::collections::BTreeMap;
        let tables: Vec<Vec<Slot>> = (0..pp).map(|i| table(schedule, pp, v, m, i)).collect();
        let mut done: BTreeMap<(u8, u32, u32), u64> = BTreeMap::new(); // (pass, mb, vstage) -> finish
        let mut clock = vec![0u64; pp as usize];
        let mut next = vec![0usize; pp as usize];
        let key = |pass: Pass| match pass {
            Pass::Forward => 0u8,
            Pass::Backward | Pass::BackwardInput => 1,
            Pass::BackwardWeight => 2,
        };
        let pipe = crate::plan::grid::Pipeline::new(pp, v);
        let last = pipe.last_vstage();
        loop {
            let mut progressed = false;
            for i in 0..pp as usize {
                let Some(s) = tables[i].get(next[i]) else { continue };
                let vs = pipe.vstage(s.chunk, i as u32);
                let dep = match s.pass {
                    Pass::Forward => (vs > 0).then(|| (0u8, s.mb, vs - 1)),
                    Pass::Backward | Pass::BackwardInput => {
                        Some(if vs < last { (1, s.mb, vs + 1) } else { (0, s.mb, vs) })
                    }
                    Pass::BackwardWeight => Some((1, s.mb, vs)),
                };
                let ready = match dep {
                    None => Some(0),
                    Some(d) => done.get(&d).copied(),
                };
                let own_fwd = if s.pass == Pass::Forward { Some(0) } else { done.get(&(0, s.mb, vs)).copied() };
                if let (Some(r), Some(f)) = (ready, own_fwd) {
                    let dur = match s.pass {
                        Pass::Forward => tf,
                        Pass::Backward => tb + tw,
                        Pass::BackwardInput => tb,
                        Pass::BackwardWeight => tw,
                    };
                    let start = clock[i].max(r).max(f);
                    clock[i] = start + dur;
                    done.insert((key(s.pass), s.mb, vs), clock[i]);
                    next[i] += 1;
                    progressed = true;
                }
            }
            if !progressed {
                assert!(next.iter().zip(&tables).all(|(n, t)| *n == t.len()), "schedule {schedule:?} deadlocks");
                return *clock.iter().max().expect("pp > 0");
            }
        }
    }

    #[test]
    fn every_pass_appears_once_per_microbatch_and_chunk() {
        for (sched, pp, v, m) in [
            (Schedule::Gpipe, 4, 1, 6),
            (Schedule::OneFOneB, 4, 1, 3),
            (Schedule::OneFOneB, 4, 1, 9),
            (Schedule::Interleaved, 4, 2, 8),
            (Schedule::Interleaved, 2, 3, 2),
            (Schedule::ZbH1, 4, 1, 8),
        ] {
            for i in 0..pp {
                let t = table(sched, pp, v, m, i);
                let passes = if sched == Schedule::ZbH1 { 3 } else { 2 };
                assert_eq!(t.len() as u32, m * v * passes, "{sched:?} stage {i}");
                for j in 0..m {
                    for c in 0..v {
                        let fwd = t.iter().position(|s| s.mb == j && s.chunk == c && s.pass == Pass::Forward).unwrap();
                        let bwd = t.iter().position(|s| s.mb == j && s.chunk == c && s.pass != Pass::Forward).unwrap();
                        assert!(fwd < bwd, "{sched:?}: backward of mb {j} chunk {c} before its forward");
                    }
                }
            }
        }
    }

    #[test]
    fn bubbles_match_the_closed_forms() {
        // Times in units of 1/(3v) of a microbatch's stage forward+backward: tf = 1·k, tb = 2·k
        // (or tb = tw = 1·k split), k = 6 / v keeps everything integral.
        for (pp, m) in [(2, 4), (4, 4), (4, 8), (4, 12), (8, 16), (8, 8)] {
            for sched in [Schedule::Gpipe, Schedule::OneFOneB] {
                let span = unit_makespan(sched, pp, 1, m, 6, 6, 6);
                let ideal = 18 * m as u64;
                assert_eq!((span - ideal) * m as u64, ideal * (pp as u64 - 1), "{sched:?} p={pp} m={m}");
            }
            let zb = unit_makespan(Schedule::ZbH1, pp, 1, m, 6, 6, 6);
            let ideal = 18 * m as u64;
            // (p−1)/(3m)
            assert_eq!((zb - ideal) * 3 * m as u64, ideal * (pp as u64 - 1), "zb-h1 p={pp} m={m}");
        }
        for (pp, v, m) in [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 4), (8, 2, 16), (4, 4, 12), (2, 3, 2)] {
            let k = 12 / v as u64;
            let span = unit_makespan(Schedule::Interleaved, pp, v, m, k, k, k);
            let ideal = 36 * m as u64;
            assert_eq!((span - ideal) * (v * m) as u64, ideal * (pp as u64 - 1), "interleaved p={pp} v={v} m={m}");
        }
    }

    #[test]
    fn zb_h1_holds_at_most_p_microbatches() {
        for (pp, m) in [(4, 8), (8, 16), (4, 3)] {
            for i in 0..pp {
                let mut live = 0i32;
                let mut peak = 0;
                for s in table(Schedule::ZbH1, pp, 1, m, i) {
                    match s.pass {
                        Pass::Forward => live += 1,
                        Pass::BackwardWeight => live -= 1,
                        _ => {}
                    }
                    peak = peak.max(live);
                }
                assert!(peak <= pp as i32 && peak <= m as i32, "stage {i}: {peak}");
            }
        }
    }
}
