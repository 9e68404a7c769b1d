//! One fuzz case run in process — what `inspect`, `plan`, `verify`, `simulate` and (for a
//! sample) `search` do with it — and its outcome classified as the findings are.
//!
//! An outcome is **ok** (every command accepted it and every figure is sane), **refused**
//! (an error a user can act on: exit 2, a message of at most [`MAX_MESSAGE`] characters),
//! or a failure: **panic** (caught by `catch_unwind`), **hang** (over the time budget),
//! **nonsense** (accepted, but a figure breaks physics or its definition), **internal**
//! (refused for a reason that is the tool's, not the input's: a plan the planner emitted that
//! the checker, the verifier or the simulator rejects; a deadlock the verifier denies), or
//! **long-message** (an error quoting too much of its input). Aborts (unbounded
//! allocation) take the whole process down, so a campaign that finishes had none.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use strata_models::accounting::{flops, memory, params};
use strata_models::plan::{self, Plan, check::CheckedPlan};
use strata_models::{GpuKind, Scenario};
use strata_sim::search::{self, SearchOptions};
use strata_sim::simulate::{SimError, SimOptions};

thread_local! {
    /// Where the last panic on this thread happened (set by the campaign's panic hook).
    pub static PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The longest error message a user may be shown, characters.
pub const MAX_MESSAGE: usize = 4000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Ok,
    Refused,
    Panic,
    Hang,
    Nonsense,
    Internal,
    LongMessage,
}

impl Class {
    pub fn failed(self) -> bool {
        !matches!(self, Class::Ok | Class::Refused)
    }
}

/// What to run.
pub enum Input {
    /// Scenario text and its overrides.
    Scenario { text: String, overrides: Vec<String>, search: bool },
    /// A plan file's text.
    Plan(String),
}

/// How heavy a case may be: cases over the bound are loaded and inspected but not lowered
/// (the bounded CI campaign keeps its time; the long campaign lowers everything).
#[derive(Clone, Copy)]
pub struct Budget {
    pub max_layer_passes: u64,
    pub hang: Duration,
}

/// A case's outcome and why.
pub struct Outcome {
    pub class: Class,
    pub why: String,
    pub lowered: bool,
}

fn refused(message: String) -> Outcome {
    if message.chars().count() > MAX_MESSAGE {
        return Outcome {
            class: Class::LongMessage,
            why: format!("{} chars", message.chars().count()),
            lowered: false,
        };
    }
    Outcome { class: Class::Refused, why: message, lowered: false }
}

fn failure(class: Class, why: String) -> Outcome {
    Outcome { class, why, lowered: false }
}

/// Runs one case.
pub fn run(input: &Input, budget: Budget) -> Outcome {
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| match input {
        Input::Scenario { text, overrides, search } => scenario_case(text, overrides, *search, budget),
        Input::Plan(text) => plan_case(text),
    }));
    let mut out = match result {
        Ok(o) => o,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = PANIC_AT.with(|p| p.borrow().clone());
            failure(Class::Panic, format!("{msg} at {at}"))
        }
    };
    if start.elapsed() > budget.hang && !out.class.failed() {
        out = failure(Class::Hang, format!("{:.1} s", start.elapsed().as_secs_f64()));
    }
    out
}

fn scenario_case(text: &str, overrides: &[String], search: bool, budget: Budget) -> Outcome {
    let s = match Scenario::from_toml(text, "fuzz.toml", "fuzz", overrides) {
        Ok(s) => s,
        Err(e) => return refused(e.to_string()),
    };
    if let Err(why) = inspect(&s) {
        return failure(Class::Nonsense, format!("inspect: {why}"));
    }
    let p = &s.parallel;
    let passes = p.microbatches() as u64 * s.model.layers as u64;
    if passes > budget.max_layer_passes {
        return Outcome { class: Class::Ok, why: String::new(), lowered: false };
    }
    let plan = match plan::lower(&s) {
        Ok(plan) => plan,
        Err(e) => return refused(e.to_string()),
    };
    // What `plan --out` writes, `verify` and `simulate` read back.
    let plan: Plan = match serde_json::to_string(&plan).map(|t| serde_json::from_str(&t)) {
        Ok(Ok(plan)) => plan,
        other => return failure(Class::Internal, format!("plan JSON round trip: {:?}", other.err())),
    };
    let plan = match CheckedPlan::new(plan) {
        Ok(p) => p,
        Err(e) => return failure(Class::Internal, format!("check refuses the planner's plan: {e}")),
    };
    if let Err(e) = plan::verify(&plan) {
        return failure(Class::Internal, format!("verify refuses the planner's plan: {e}"));
    }
    match strata_sim::simulate(&plan, &SimOptions::default()) {
        Ok(r) => {
            if let Err(why) = strata_sim::sanity::check(&r, s.cluster.gpu != GpuKind::Cpu) {
                return failure(Class::Nonsense, format!("simulate: {why}"));
            }
        }
        Err(e @ (SimError::Deadlock { .. } | SimError::InvalidPlan { .. } | SimError::Insane(_))) => {
            return failure(Class::Internal, format!("simulate: {e}"));
        }
        Err(e) => return refused(e.to_string()),
    }
    if search && let Some(out) = search_case(&s) {
        return out;
    }
    Outcome { class: Class::Ok, why: String::new(), lowered: true }
}

/// What `inspect` prints, checked: counts that did not wrap, finite sizes and FLOPs.
fn inspect(s: &Scenario) -> Result<(), String> {
    let m = &s.model;
    let total = params::total_params(m);
    let h = m.hidden as f64;
    let f = m.ffn_hidden as f64;
    // A lower bound in f64: the dense MLP alone has 2·h·f parameters per dense layer (a MoE
    // layer's MLP is its experts, of their own width; `ffn_hidden` does not size it).
    let mlp = m.dense_layers() as f64 * 2.0 * h * f;
    if (total as f64) < mlp * 0.999 || total == 0 {
        return Err(format!("total parameters {total} below the dense MLP's {mlp}"));
    }
    let fl = flops::scenario_step_flops(s);
    if !(fl.model.is_finite() && fl.model > 0.0 && fl.hardware >= fl.model) {
        return Err(format!("step FLOPs model {} hardware {}", fl.model, fl.hardware));
    }
    let stages = memory::stage_memory(s);
    if stages.len() != s.parallel.pp as usize {
        return Err(format!("{} stages of memory for pp = {}", stages.len(), s.parallel.pp));
    }
    for st in &stages {
        let t = st.total_bytes();
        if !(t.is_finite() && t > 0.0) {
            return Err(format!("stage {} memory {t}", st.stage));
        }
    }
    let sp = params::stage_params(m, &s.parallel);
    if sp.iter().map(|x| x.stage_total as f64).sum::<f64>() < total as f64 * 0.999 {
        return Err("stage parameters do not add up to the model's".into());
    }
    Ok(())
}

/// A search over a small space around the scenario (its cluster, its model).
fn search_case(s: &Scenario) -> Option<Outcome> {
    if s.cluster.gpus() > 64 {
        return None;
    }
    let mut opts = SearchOptions::new(s);
    let sp = &mut opts.space;
    sp.tp.retain(|t| *t <= 2);
    sp.pp.retain(|p| *p <= 2);
    sp.micro_batch = vec![1, 2];
    sp.vpp = vec![2];
    sp.zero = vec![0, 1];
    sp.recompute.truncate(1);
    sp.sequence_parallel = vec![false];
    sp.grad_bucket_mb = vec![40.0];
    sp.overlap_grad_reduce = vec![true];
    sp.overlap_param_gather = vec![true];
    opts.simulate_top = 2;
    match search::search(s, &opts, &|_, _, _| {}) {
        Ok(r) => {
            for c in &r.candidates {
                if let Some(rep) = &c.report
                    && let Err(why) = strata_sim::sanity::check(rep, s.cluster.gpu != GpuKind::Cpu)
                {
                    return Some(failure(Class::Nonsense, format!("search {}: {why}", c.label)));
                }
            }
            None
        }
        Err(e @ (SimError::Deadlock { .. } | SimError::InvalidPlan { .. } | SimError::Insane(_))) => {
            Some(failure(Class::Internal, format!("search: {e}")))
        }
        Err(e) => Some(refused(e.to_string())),
    }
}

/// A (mutated) plan file through `verify` and `simulate`.
fn plan_case(text: &str) -> Outcome {
    let plan: Plan = match serde_json::from_str(text) {
        Ok(p) => p,
        Err(e) => return refused(e.to_string()),
    };
    let plan = match CheckedPlan::new(plan) {
        Ok(p) => p,
        Err(e) => return refused(e.to_string()),
    };
    if let Err(e) = plan::verify(&plan) {
        return refused(e.to_string());
    }
    match strata_sim::simulate(&plan, &SimOptions::default()) {
        Ok(r) => match strata_sim::sanity::check(&r, plan.scenario.cluster.gpu != GpuKind::Cpu) {
            Ok(()) => Outcome { class: Class::Ok, why: String::new(), lowered: true },
            Err(why) => failure(Class::Nonsense, format!("simulate: {why}")),
        },
        // The verifier proved the plan deadlock-free: a deadlock now contradicts it.
        Err(e @ SimError::Deadlock { .. }) => failure(Class::Internal, format!("simulate after verify: {e}")),
        Err(e) => refused(e.to_string()),
    }
}
