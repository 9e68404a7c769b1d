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
//! - **ZB-H2** (same paper, §2.2 and Figure 3): stage i runs min(2(p−i)−1, m) warm-up
//!   forwards, then for each microbatch its input-gradient pass, the weight passes pending
//!   beyond 2i, and the next forward; the rest of the weight passes at the end. Every stage
//!   holds up to 2p − 1 microbatches, and no stage idles between its first and last pass:
//!   the paper's bubble (p−1)(T_F + T_B − 2T_W) is 0 with T_F = T_B = T_W, once the
//!   optimizer step no longer synchronises the stages. Under a flush (one step, as
//!   simulated here) the last stage still starts (p−1)·T_F late: the step's bubble is
//!   (p−1)·max(T_F, T_F + T_B − 2T_W) against ZB-H1's (p−1)·max(T_F, T_F + T_B − T_W), the
//!   same at T_F = T_B = T_W (at twice the memory), smaller where T_B > T_W.
//!
//! Non-zero-bubble schedules run the backward as one pass (`Pass::Backward`: input and
//! weight gradients back to back).
//!
//! A schedule is its table function and a [`Spec`] beside it (whether it is chunked, its
//! in-flight count and bubble as closed forms, its label); everything else — memory
//! accounting, lowering, the search space and its estimate — asks the [`Schedule`]
//! methods defined here. The tests (`schedule/tests.rs`) check every closed form against
//! the tables.

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
    (schedule.spec().table)(pp, vpp, m, stage)
}

/// Everything a consumer needs about a schedule besides its table, defined beside the
/// table so that memory accounting, the search estimate and lowering never match on
/// schedule names. Closed forms here are checked against the tables in `schedule/tests.rs`.
pub struct Spec {
    /// The table of one stage: (pp, vpp, m, stage) → slots.
    table: fn(u32, u32, u32, u32) -> Vec<Slot>,
    /// Whether the table runs several model chunks per stage. Such a schedule needs
    /// vpp ≥ 2, a pipeline (pp ≥ 2) and m a multiple of pp (its groups of p microbatches);
    /// every other schedule needs vpp = 1.
    pub chunked: bool,
    /// Microbatch-chunks whose activations one stage holds at its peak, from a forward to
    /// the pass that frees them (the backward, or the weight pass when split): a closed form
    /// of the table's peak, (pp, vpp, m, stage) → count.
    in_flight: fn(u32, u32, u32, u32) -> u64,
    /// Microbatches whose embedding buffers (first stage) or output-layer buffers (last
    /// stage) are alive at once: (pp, vpp, m, stage) → count. With one chunk this is the
    /// table's peak; interleaved keeps 1F1B's count (min(p − i, m)), as memory accounting
    /// always has, though its table holds more first-chunk microbatches during warm-up.
    edge_in_flight: fn(u32, u32, u32, u32) -> u64,
    /// The bubble the search estimate adds to m · max_i X_i.
    bubble: Bubble,
    /// Short name in search labels; chunked schedules append vpp (`int2`).
    pub label: &'static str,
    /// What running this split under Megatron-LM takes beyond the stock arguments.
    pub megatron_note: Option<&'static str>,
}

/// Closed forms of a schedule's bubble under a flush, in per-stage pass times.
#[derive(Clone, Copy, Debug)]
enum Bubble {
    /// (p−1)/v · mean_i (F_i + B_i + W_i): every stage idles while the first microbatch
    /// fills the pipeline and the last drains it (Narayanan et al. SC'21).
    Fill,
    /// (p−1) · max(0, mean_i (F_i + B_i − W_i)): deferred weight passes fill the drain
    /// (ZB-H1, Qi et al.). Exact for T_W ≤ T_B; the table takes (p−1)·T_F where T_W > T_B
    /// (the last stage's late start), which this form, kept so estimates do not move,
    /// leaves out.
    DeferredW,
    /// (p−1) · max(mean_i F_i, mean_i (F_i + B_i − 2·W_i)): twice the weight passes fill
    /// the drain, but under a flush the last stage still waits (p−1)·T_F for its first
    /// forward (ZB-H2).
    DeferredTwoW,
}

/// Per-microbatch times of one stage's passes (any unit): forward, input gradient, weight
/// gradient, over all the stage's chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassTimes {
    pub f: f64,
    pub b: f64,
    pub w: f64,
}

static GPIPE: Spec = Spec {
    table: |_, _, m, _| gpipe(m),
    chunked: false,
    in_flight: |_, _, m, _| m as u64,
    edge_in_flight: |_, _, m, _| m as u64,
    bubble: Bubble::Fill,
    label: "gpipe",
    megatron_note: None,
};

static ONE_F_ONE_B: Spec = Spec {
    table: |pp, _, m, stage| one_f_one_b(pp, m, stage),
    chunked: false,
    in_flight: one_f_one_b_in_flight,
    edge_in_flight: one_f_one_b_in_flight,
    bubble: Bubble::Fill,
    label: "1f1b",
    megatron_note: None,
};

static INTERLEAVED: Spec = Spec {
    table: interleaved,
    chunked: true,
    in_flight: |pp, v, m, stage| {
        let (pp, v, m, i) = (pp as u64, v as u64, m as u64, stage as u64);
        // With m = p Megatron-LM runs every forward before any backward.
        if m == pp { m * v } else { ((pp - i - 1) * 2 + (v - 1) * pp + 1).min(m * v) }
    },
    // The embedding and output-layer buffers are counted as 1F1B counts them.
    edge_in_flight: one_f_one_b_in_flight,
    bubble: Bubble::Fill,
    label: "int",
    megatron_note: None,
};

static ZB_H1: Spec = Spec {
    table: |pp, _, m, stage| zb_h1(pp, m, stage),
    chunked: false,
    // Deferred weight passes keep up to p microbatches on every stage (1F1B's peak).
    in_flight: |pp, _, m, _| pp.min(m) as u64,
    edge_in_flight: |pp, _, m, _| pp.min(m) as u64,
    bubble: Bubble::DeferredW,
    label: "zb-h1",
    megatron_note: Some(
        "ZB-H1 needs the zero-bubble fork of Megatron-LM (sail-sg/zero-bubble-pipeline-parallelism): --zero-bubble-v-schedule is not ZB-H1; use its --enable-zero-bubble.",
    ),
};

static ZB_H2: Spec = Spec {
    table: |pp, _, m, stage| zb_h2(pp, m, stage),
    chunked: false,
    // 2(p − i) − 1 warm-up forwards, then weight passes deferred while 2i are pending: every
    // stage reaches 2p − 1 (Qi et al.'s (2p − 1)·M_B).
    in_flight: |pp, _, m, _| (2 * pp - 1).min(m) as u64,
    edge_in_flight: |pp, _, m, _| (2 * pp - 1).min(m) as u64,
    bubble: Bubble::DeferredTwoW,
    label: "zb-h2",
    megatron_note: Some(
        "ZB-H2 needs the zero-bubble fork of Megatron-LM (sail-sg/zero-bubble-pipeline-parallelism): --enable-zero-bubble with --zero-bubble-max-pending-backward set to 2·pp (its ZB-2P).",
    ),
};

fn one_f_one_b_in_flight(pp: u32, _: u32, m: u32, stage: u32) -> u64 {
    (pp - stage).min(m) as u64
}

impl Schedule {
    /// What consumers need about this schedule besides its table.
    pub fn spec(self) -> &'static Spec {
        match self {
            Schedule::Gpipe => &GPIPE,
            Schedule::OneFOneB => &ONE_F_ONE_B,
            Schedule::Interleaved => &INTERLEAVED,
            Schedule::ZbH1 => &ZB_H1,
            Schedule::ZbH2 => &ZB_H2,
        }
    }

    /// Whether the schedule runs several model chunks per stage (vpp > 1).
    pub fn chunked(self) -> bool {
        self.spec().chunked
    }

    /// The schedule a scenario that sets vpp > 1 but no schedule gets: the first chunked
    /// one in [`Schedule::ALL`].
    pub fn chunked_default() -> Schedule {
        *Schedule::ALL.iter().find(|s| s.chunked()).expect("a chunked schedule")
    }

    /// Whether the backward is split into input-gradient (B) and weight-gradient (W)
    /// passes: read off a small table (any `BackwardWeight` slot), so it cannot disagree
    /// with the tables lowering walks.
    pub fn splits_backward(self) -> bool {
        let vpp = if self.chunked() { 2 } else { 1 };
        table(self, 2, vpp, 4, 0).iter().any(|s| s.pass == Pass::BackwardWeight)
    }

    /// Microbatch-chunks whose activations stage `stage` holds at its peak (of l/(p·v)
    /// layers each): the peak over the table of forwards minus the passes that free their
    /// activations (backward, or weight pass when split).
    pub fn in_flight(self, pp: u32, vpp: u32, m: u32, stage: u32) -> u64 {
        (self.spec().in_flight)(pp, vpp, m, stage)
    }

    /// Microbatches whose embedding buffers (first stage) or output-layer buffers (last
    /// stage) stage `stage` holds at once.
    pub fn edge_in_flight(self, pp: u32, vpp: u32, m: u32, stage: u32) -> u64 {
        (self.spec().edge_in_flight)(pp, vpp, m, stage)
    }

    /// The pipeline bubble of one step under a flush, in the unit of `stages` (one entry
    /// per stage, per microbatch): what the step takes beyond m · max_i (F_i + B_i + W_i)
    /// when every stage does the same work.
    /// Whether merging each steady-state backward with the next forward
    /// (`parallel.moe_a2a_overlap`) keeps the steady state's pace, read off the tables: a
    /// merged pair's backward waits for the gradient of the next stage's pair of the same
    /// index, so every stage must run at least two more warm-up forwards than the next
    /// (interleaved, ZB-H2). With one more (1F1B, ZB-H1) the pairs chain stage to stage and
    /// the steady state runs at up to half its pace — why megatron-core asks a virtual
    /// pipeline of `--overlap-moe-expert-parallel-comm`.
    pub fn merge_keeps_pace(self, pp: u32, vpp: u32, m: u32) -> bool {
        let warm = |stage| table(self, pp, vpp, m, stage).iter().take_while(|s| s.pass == Pass::Forward).count();
        (0..pp.saturating_sub(1)).all(|s| warm(s) >= warm(s + 1) + 2)
    }

    pub fn bubble(self, pp: u32, vpp: u32, stages: &[PassTimes]) -> f64 {
        let mean = |x: &dyn Fn(&PassTimes) -> f64| stages.iter().map(x).sum::<f64>() / stages.len() as f64;
        match self.spec().bubble {
            Bubble::Fill => (pp as f64 - 1.0) / vpp as f64 * mean(&|t| t.f + t.b + t.w),
            Bubble::DeferredW => (pp as f64 - 1.0) * mean(&|t| t.f + t.b - t.w).max(0.0),
            Bubble::DeferredTwoW => (pp as f64 - 1.0) * mean(&|t| t.f).max(mean(&|t| t.f + t.b - 2.0 * t.w)),
        }
    }

    /// The label of a split's schedule in search output: `1f1b`, `int2`.
    pub fn label(self, vpp: u32) -> String {
        let l = self.spec().label;
        if self.chunked() { format!("{l}{vpp}") } else { l.to_string() }
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

fn zb_h2(pp: u32, m: u32, stage: u32) -> Vec<Slot> {
    let warm = (2 * (pp - stage) - 1).min(m);
    let mut t: Vec<Slot> = (0..warm).map(|j| slot(j, 0, Pass::Forward, Stage::WarmUp)).collect();
    let mut pending = std::collections::VecDeque::new();
    for k in 0..m {
        let phase = if warm + k < m { Stage::Steady } else { Stage::CoolDown };
        t.push(slot(k, 0, Pass::BackwardInput, phase));
        pending.push_back(k);
        while pending.len() > 2 * stage as usize {
            let j = pending.pop_front().expect("non-empty");
            t.push(slot(j, 0, Pass::BackwardWeight, phase));
        }
        if warm + k < m {
            t.push(slot(warm + k, 0, Pass::Forward, Stage::Steady));
        }
    }
    t.extend(pending.into_iter().map(|j| slot(j, 0, Pass::BackwardWeight, Stage::CoolDown)));
    t
}

#[cfg(test)]
pub(crate) mod tests;
