//! The report's inputs: plain data, decoupled from the simulator's and the runtime's own
//! types (the CLI converts into them).
//!
//! A [`ComparisonSet`] holds one [`PlanComparison`] per plan that was both simulated and
//! measured: its scenario in brief, the predicted step time and every measured step time
//! (the report uses their median), peak memory per rank, seconds per op kind, and — when
//! available — both timelines with the plan they refer to. A [`SearchLandscape`] holds the
//! search's throughput over (tp, pp). Times are seconds (`_s`) or nanoseconds (`_ns`),
//! memory is bytes.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use strata_models::Scenario;
use strata_models::plan::Plan;
use strata_models::trace::{MemSample, Trace};

use crate::error::ReportError;
use crate::op_kinds::{OpTime, op_times};

/// Everything one report shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportInputs {
    /// Heading of the report, e.g. `tiny-gpt on 8 CPU ranks`.
    pub title: String,
    pub comparisons: ComparisonSet,
    pub landscape: Option<SearchLandscape>,
}

/// Plans run both ways.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ComparisonSet {
    pub plans: Vec<PlanComparison>,
}

/// The parallel configuration of a plan, in brief (Megatron-LM's names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSummary {
    pub model: String,
    pub cluster: String,
    pub ranks: u32,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub vpp: u32,
    pub schedule: String,
    pub micro_batch: u32,
    pub global_batch: u32,
    pub zero: u8,
    pub recompute: String,
    pub sequence_parallel: bool,
    /// Tokens per step over all replicas (global batch × sequence length).
    pub tokens_per_step: u64,
}

impl ScenarioSummary {
    pub fn from_scenario(s: &Scenario) -> ScenarioSummary {
        let p = &s.parallel;
        ScenarioSummary {
            model: s.model.name.clone(),
            cluster: s.cluster.name.clone(),
            ranks: p.tp * p.pp * p.dp,
            tp: p.tp,
            pp: p.pp,
            dp: p.dp,
            vpp: p.vpp,
            schedule: p.schedule.key().to_string(),
            micro_batch: p.micro_batch,
            global_batch: p.global_batch,
            zero: p.zero,
            recompute: p.recompute.key().to_string(),
            sequence_parallel: p.sequence_parallel,
            tokens_per_step: s.tokens_per_step(),
        }
    }

    /// `tp2 pp2 dp2 1f1b mb2 z1` (vpp, recompute and sp only when set).
    pub fn short(&self) -> String {
        let mut s = format!("tp{} pp{} dp{}", self.tp, self.pp, self.dp);
        if self.vpp > 1 {
            s += &format!(" vpp{}", self.vpp);
        }
        s += &format!(" {} mb{} z{}", self.schedule, self.micro_batch, self.zero);
        if self.recompute != "none" && !self.recompute.is_empty() {
            s += &format!(" rc-{}", self.recompute);
        }
        if self.sequence_parallel {
            s += " sp";
        }
        s
    }
}

/// Bytes of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankBytes {
    pub rank: u32,
    pub bytes: u64,
}

/// The timelines behind a comparison: optional, large, stored in files of their own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timelines {
    /// The plan the traces' op ids refer to; needed to name the ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_trace: Option<Trace>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_trace: Option<Trace>,
    /// Allocated bytes over time, sorted by (rank, time). When empty, the trace's own
    /// memory samples are used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub predicted_memory: Vec<MemSample>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured_memory: Vec<MemSample>,
}

impl Timelines {
    pub fn is_empty(&self) -> bool {
        self.plan.is_none()
            && self.predicted_trace.is_none()
            && self.measured_trace.is_none()
            && self.predicted_memory.is_empty()
            && self.measured_memory.is_empty()
    }

    /// Predicted memory samples: the explicit timeline, else the predicted trace's.
    pub fn predicted_memory(&self) -> &[MemSample] {
        memory_or_trace(&self.predicted_memory, self.predicted_trace.as_ref())
    }

    pub fn measured_memory(&self) -> &[MemSample] {
        memory_or_trace(&self.measured_memory, self.measured_trace.as_ref())
    }
}

fn memory_or_trace<'a>(explicit: &'a [MemSample], trace: Option<&'a Trace>) -> &'a [MemSample] {
    match (explicit.is_empty(), trace) {
        (true, Some(t)) => &t.memory,
        _ => explicit,
    }
}

/// One plan, predicted and measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanComparison {
    /// Unique within the set; also names the plan's files (see [`PlanComparison::slug`]).
    pub name: String,
    pub scenario: ScenarioSummary,
    pub predicted_step_s: f64,
    /// Every measured step, in order (warm-up steps already left out by the caller).
    pub measured_steps_s: Vec<f64>,
    #[serde(default)]
    pub predicted_peak_bytes: Vec<RankBytes>,
    #[serde(default)]
    pub measured_peak_bytes: Vec<RankBytes>,
    #[serde(default)]
    pub ops: Vec<OpTime>,
    #[serde(default, skip_serializing_if = "Timelines::is_empty")]
    pub timelines: Timelines,
}

impl PlanComparison {
    /// A comparison built from the two traces of one step: the predicted step time is the
    /// predicted makespan; peaks, op times and memory come from the traces.
    /// `measured_steps_s` are all measured steps (the measured trace records one of them).
    pub fn from_traces(
        name: &str,
        plan: Plan,
        predicted: Trace,
        measured: Trace,
        measured_steps_s: Vec<f64>,
    ) -> PlanComparison {
        let peaks = |t: &Trace| t.ranks.iter().map(|&rank| RankBytes { rank, bytes: t.peak_bytes(rank) }).collect();
        PlanComparison {
            name: name.to_string(),
            scenario: ScenarioSummary::from_scenario(&plan.scenario),
            predicted_step_s: predicted.makespan_ns() as f64 * 1e-9,
            measured_steps_s,
            predicted_peak_bytes: peaks(&predicted),
            measured_peak_bytes: peaks(&measured),
            ops: op_times(&plan, &predicted, &measured),
            timelines: Timelines {
                plan: Some(plan),
                predicted_trace: Some(predicted),
                measured_trace: Some(measured),
                predicted_memory: Vec::new(),
                measured_memory: Vec::new(),
            },
        }
    }

    /// Median of the measured steps (the mean of the middle two for an even count).
    pub fn measured_step_s(&self) -> f64 {
        median(&self.measured_steps_s)
    }

    /// Signed relative error of the prediction: (predicted − measured) / measured.
    pub fn step_error(&self) -> f64 {
        let m = self.measured_step_s();
        (self.predicted_step_s - m) / m
    }

    /// The name as a file-name-safe word: ASCII letters, digits, `.`, `_` and `-` kept,
    /// anything else becomes `-`.
    pub fn slug(&self) -> String {
        slug(&self.name)
    }

    /// The same comparison without its timelines (what `comparisons.json` stores).
    pub fn without_timelines(&self) -> PlanComparison {
        PlanComparison {
            name: self.name.clone(),
            scenario: self.scenario.clone(),
            predicted_step_s: self.predicted_step_s,
            measured_steps_s: self.measured_steps_s.clone(),
            predicted_peak_bytes: self.predicted_peak_bytes.clone(),
            measured_peak_bytes: self.measured_peak_bytes.clone(),
            ops: self.ops.clone(),
            timelines: Timelines::default(),
        }
    }
}

pub(crate) fn slug(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' }).collect()
}

/// Median of a sample (0 for an empty one); order-independent.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// One (tp, pp) cell of the search: the best throughput found there, or `None` when every
/// configuration ran out of memory or was invalid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LandscapeCell {
    pub tp: u32,
    pub pp: u32,
    pub tokens_per_s: Option<f64>,
    /// What the cell holds: the best configuration (`dp4 mb2 z1`) or why there is none
    /// (`OOM 93 GiB > 80 GiB`).
    pub label: String,
}

/// The search's throughput over tensor- × pipeline-parallel sizes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchLandscape {
    pub cells: Vec<LandscapeCell>,
}

impl ReportInputs {
    /// Checks what the plots rely on; `origin` names the source in errors.
    pub fn validate(&self, origin: &str) -> Result<(), ReportError> {
        let mut slugs = BTreeSet::new();
        for p in &self.comparisons.plans {
            let at = format!("{origin}: plan {:?}", p.name);
            if p.name.trim().is_empty() {
                return Err(ReportError::invalid(origin, "a plan has an empty name; give every plan a name"));
            }
            if !slugs.insert(p.slug()) {
                return Err(ReportError::invalid(
                    at,
                    format!("two plans share the file name {:?}; make the names unique", p.slug()),
                ));
            }
            positive(&at, "predicted_step_s", p.predicted_step_s)?;
            if p.measured_steps_s.is_empty() {
                return Err(ReportError::invalid(at, "measured_steps_s is empty; record at least one measured step"));
            }
            for (i, s) in p.measured_steps_s.iter().enumerate() {
                positive(&at, &format!("measured_steps_s[{i}]"), *s)?;
            }
            for o in &p.ops {
                for (what, v) in [("predicted_s", o.predicted_s), ("measured_s", o.measured_s)] {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(ReportError::invalid(&at, format!("op {:?}: {what} = {v} is not ≥ 0", o.kind)));
                    }
                }
            }
            validate_timelines(&at, &p.slug(), &p.scenario, &p.timelines)?;
        }
        if let Some(l) = &self.landscape {
            let mut seen = BTreeSet::new();
            for c in &l.cells {
                let at = format!("{origin}: landscape cell tp={} pp={}", c.tp, c.pp);
                if c.tp == 0 || c.pp == 0 {
                    return Err(ReportError::invalid(at, "tp and pp must be ≥ 1"));
                }
                if !seen.insert((c.tp, c.pp)) {
                    return Err(ReportError::invalid(at, "appears twice; keep the best configuration of each cell"));
                }
                if let Some(t) = c.tokens_per_s {
                    positive(&at, "tokens_per_s", t)?;
                }
            }
        }
        Ok(())
    }
}

fn positive(at: &str, what: &str, v: f64) -> Result<(), ReportError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ReportError::invalid(at, format!("{what} = {v}; it must be a positive number of seconds")))
    }
}

/// Every span must name an op of its rank's program, so that the trace can be labelled.
fn validate_timelines(at: &str, slug: &str, summary: &ScenarioSummary, t: &Timelines) -> Result<(), ReportError> {
    for (which, trace) in [("predicted", &t.predicted_trace), ("measured", &t.measured_trace)] {
        let Some(trace) = trace else { continue };
        let file = format!("plans/{slug}/{which}-trace.json");
        for s in &trace.spans {
            if s.end_ns < s.start_ns {
                return Err(ReportError::invalid(
                    at,
                    format!("{which} trace ({file}): span of rank {} op {} ends before it starts", s.rank, s.op),
                ));
            }
        }
        let Some(plan) = &t.plan else {
            return Err(ReportError::invalid(
                at,
                format!("has a {which} trace but no plan (plans/{slug}/plan.json); save the plan with it"),
            ));
        };
        let g = &plan.grid;
        if (g.tp, g.pp, g.dp) != (summary.tp, summary.pp, summary.dp) {
            return Err(ReportError::invalid(
                at,
                format!(
                    "its plan (plans/{slug}/plan.json) is {g} but its scenario says tp {} pp {} dp {}; the plan \
                     belongs to another comparison",
                    summary.tp, summary.pp, summary.dp
                ),
            ));
        }
        let ranks = plan.grid.ranks();
        for s in &trace.spans {
            let op = if s.rank < ranks { plan.program(s.rank).ops.get(s.op as usize) } else { None };
            if op.is_none_or(|op| op.stream != s.stream) {
                return Err(ReportError::invalid(
                    at,
                    format!(
                        "{which} trace ({file}): span of rank {} names op {} on stream {}, which the plan ({}) does not \
                         have; the trace belongs to another plan",
                        s.rank,
                        s.op,
                        s.stream.key(),
                        plan.grid
                    ),
                ));
            }
        }
    }
    Ok(())
}
