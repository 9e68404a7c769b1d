//! The configuration search: for a model on a cluster, which split trains fastest and fits?
//!
//! 1. **Enumerate** the space ([`space`]): every combination is valid or rejected with the
//!    rule it breaks, and a valid split becomes a candidate for each searched framework that
//!    runs it (the base scenario's framework, or several with `--framework any`); the
//!    frameworks that cannot are counted by rule.
//! 2. **Screen memory** with the analytic model plus the simulator's process overheads
//!    (CUDA context, NCCL buffers, allocator slack): a candidate clearly over the GPU's
//!    memory (by more than the 5% the analytic model may differ from the plan's own
//!    Alloc/Free peak) is rejected with its shortfall.
//! 3. **Estimate** every survivor's step time in closed form ([`estimate`]).
//! 4. **Simulate** in full the best estimated candidates (`simulate_top` that fit, in
//!    estimate order; all of them when `exhaustive`), plus the base scenario's own split, in
//!    parallel with rayon. The ranking is by simulated tokens/s, ties broken by the
//!    candidate's label, so it does not depend on thread count or completion order.
//!
//! When nothing fits, the answer is the candidate with the smallest memory shortfall.

pub mod estimate;
pub mod space;

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;
use strata_models::accounting::memory::stage_memory;
use strata_models::plan::lower;
use strata_models::{Framework, Scenario};

use crate::compute::ComputeModel;
use crate::engine::Mode;
use crate::memory::nccl_buffer_bytes;
use crate::net::{self, NetworkKind};
use crate::profile::HardwareProfile;
use crate::simulate::{SimError, SimOptions, SimReport, simulate_with};
pub use space::{Enumeration, SearchSpace, enumerate, label};

/// How to search.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    pub space: SearchSpace,
    /// Fitting candidates to simulate in full, best estimates first.
    pub simulate_top: usize,
    /// Simulate every candidate that passes the memory screen.
    pub exhaustive: bool,
    /// `None`: the network the profile implies ([`NetworkKind::default_for`]).
    pub network: Option<NetworkKind>,
    pub seed: u64,
    pub profile: Option<HardwareProfile>,
}

impl SearchOptions {
    pub fn new(base: &Scenario) -> SearchOptions {
        SearchOptions {
            space: SearchSpace::full(base),
            simulate_top: 64,
            exhaustive: false,
            network: None,
            seed: base.training.seed,
            profile: None,
        }
    }
}

/// What happened to one candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Rejected by the analytic memory screen.
    OutOfMemoryAnalytic,
    /// Estimated only (not among the best estimates).
    Estimated,
    /// Simulated; `fits` says whether the simulated memory fits.
    Simulated,
}

/// One candidate that passed validation.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub label: String,
    /// The framework that runs it (its memory is that framework's).
    pub framework: Framework,
    #[serde(skip)]
    pub scenario: Scenario,
    pub status: Status,
    /// Analytic memory of the fullest stage, with the process overheads.
    pub memory_estimate_bytes: f64,
    pub estimate_step_s: Option<f64>,
    pub report: Option<SimReport>,
}

impl Candidate {
    pub fn fits(&self) -> bool {
        self.report.as_ref().is_some_and(|r| r.fits)
    }

    pub fn tokens_per_s(&self) -> Option<f64> {
        self.report.as_ref().filter(|r| r.fits).map(|r| r.tokens_per_s)
    }
}

/// The smallest memory shortfall when nothing fits.
#[derive(Clone, Debug, Serialize)]
pub struct Shortfall {
    pub label: String,
    pub needed_bytes: f64,
    pub available_bytes: f64,
}

/// The outcome of a search.
#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    pub enumerated: u64,
    pub duplicates: u64,
    /// Invalid combinations by rule.
    pub invalid: BTreeMap<&'static str, u64>,
    /// The frameworks searched.
    pub frameworks: Vec<Framework>,
    /// Valid splits a searched framework cannot run, by rule (once per split and framework).
    pub unrunnable: BTreeMap<&'static str, u64>,
    pub valid: u64,
    pub out_of_memory_analytic: u64,
    pub estimated: u64,
    pub simulated: u64,
    pub out_of_memory_simulated: u64,
    /// Every valid candidate, in enumeration order.
    pub candidates: Vec<Candidate>,
    /// Indices into `candidates` of the simulated, fitting ones, best first.
    pub ranking: Vec<usize>,
    /// Index of the base scenario's own split among the candidates, if it is in the space.
    pub base: Option<usize>,
    /// Set when nothing fits.
    pub infeasible: Option<Shortfall>,
}

impl SearchResult {
    pub fn best(&self) -> Option<&Candidate> {
        self.ranking.first().map(|i| &self.candidates[*i])
    }
}

/// Search phases, for progress reporting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Screening,
    Simulating,
}

/// Runs the search. `progress(phase, done, total)` is called as work completes (from
/// several threads).
pub fn search(
    base: &Scenario,
    opts: &SearchOptions,
    progress: &(dyn Fn(Progress, u64, u64) + Sync),
) -> Result<SearchResult, SimError> {
    let profile = opts.profile.clone().unwrap_or_else(|| HardwareProfile::builtin(base.cluster.gpu));
    let e = enumerate(base, &opts.space);
    let hbm = base.cluster.gpu.spec().hbm_bytes as f64;
    let mem = &profile.memory;
    let mib = 1024.0 * 1024.0;
    // Communicators a rank may hold (tp, dp, embedding, world, two pipeline peers).
    let overhead = mem.cuda_context_mib * mib + nccl_buffer_bytes(mem, 4, 2);
    let total = e.valid.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let screened: Vec<(f64, Option<f64>)> = e
        .valid
        .par_iter()
        .map_init(
            || estimate::Estimator::new(base, ComputeModel::new(&profile, base.training.storage_dtype()), &profile),
            |est, s| {
                let need = stage_memory(s).iter().map(|st| st.total_bytes()).fold(0.0, f64::max)
                    * (1.0 + mem.allocator_fragmentation)
                    + overhead;
                let estimate = if need > hbm * 1.05 { None } else { est.as_mut().ok().map(|est| est.step_s(s)) };
                let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if d.is_multiple_of(256) || d == total {
                    progress(Progress::Screening, d, total);
                }
                (need, estimate)
            },
        )
        .collect();
    let mut candidates: Vec<Candidate> = e
        .valid
        .iter()
        .zip(&screened)
        .map(|(s, (need, est))| Candidate {
            label: {
                let fp8 = if s.training.dtype == strata_models::Dtype::Fp8 { " fp8" } else { "" };
                if opts.space.frameworks.len() > 1 {
                    format!("{}{fp8} {}", label(&s.parallel), s.training.framework.key())
                } else {
                    format!("{}{fp8}", label(&s.parallel))
                }
            },
            framework: s.training.framework,
            scenario: s.clone(),
            status: if est.is_some() { Status::Estimated } else { Status::OutOfMemoryAnalytic },
            memory_estimate_bytes: *need,
            estimate_step_s: *est,
            report: None,
        })
        .collect();
    let base_index =
        candidates.iter().position(|c| c.scenario.parallel == base.parallel && c.framework == base.training.framework);

    // Order of full simulation: best estimates first (ties by label, then index).
    let mut order: Vec<usize> = (0..candidates.len()).filter(|i| candidates[*i].estimate_step_s.is_some()).collect();
    order.sort_by(|a, b| {
        let (ca, cb) = (&candidates[*a], &candidates[*b]);
        ca.estimate_step_s
            .unwrap()
            .total_cmp(&cb.estimate_step_s.unwrap())
            .then_with(|| ca.label.cmp(&cb.label))
            .then(a.cmp(b))
    });
    let sim_one = |i: usize| -> Result<SimReport, SimError> {
        let s = &candidates[i].scenario;
        let plan = lower(s).map_err(|e| SimError::InvalidPlan { program: 0, op: 0, reason: e.to_string() })?;
        let mut network = net::build_for(&s.cluster, opts.seed, opts.network, &profile)?;
        let o = SimOptions {
            // Symmetric where it is exact on the fabric, else every rank (crate::mode).
            mode: Mode::Auto,
            seed: opts.seed,
            profile: Some(profile.clone()),
            trace: false,
            jitter: 0.0,
        };
        simulate_with(&plan, &o, network.as_mut())
    };
    // Simulate in rounds of the remaining need until `simulate_top` fitting results exist,
    // so the set simulated depends only on the estimates, never on timing.
    let want = if opts.exhaustive { usize::MAX } else { opts.simulate_top.max(1) };
    let mut next = 0;
    let mut fitting = 0usize;
    let mut reports: BTreeMap<usize, SimReport> = BTreeMap::new();
    // The base scenario's own split is always simulated, so the winner is at least as good.
    let mut batch: Vec<usize> = base_index.into_iter().filter(|i| candidates[*i].estimate_step_s.is_some()).collect();
    let sim_total = (if opts.exhaustive { order.len() } else { order.len().min(want) } + batch.len()) as u64;
    let sim_done = std::sync::atomic::AtomicU64::new(0);
    loop {
        let missing = want.saturating_sub(fitting);
        while batch.len() < missing && next < order.len() {
            if !reports.contains_key(&order[next]) && !batch.contains(&order[next]) {
                batch.push(order[next]);
            }
            next += 1;
        }
        if batch.is_empty() {
            break;
        }
        let results: Vec<(usize, Result<SimReport, SimError>)> = batch
            .par_iter()
            .map(|&i| {
                let r = sim_one(i);
                let d = sim_done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(Progress::Simulating, d, sim_total.max(d));
                (i, r)
            })
            .collect();
        batch.clear();
        for (i, r) in results {
            let r = r?;
            if r.fits {
                fitting += 1;
            }
            reports.insert(i, r);
        }
    }
    let simulated = reports.len() as u64;
    let mut oom_sim = 0;
    for (i, r) in reports {
        if !r.fits {
            oom_sim += 1;
        }
        candidates[i].status = Status::Simulated;
        candidates[i].report = Some(r);
    }
    let mut ranking: Vec<usize> = (0..candidates.len()).filter(|i| candidates[*i].fits()).collect();
    ranking.sort_by(|a, b| {
        let (ca, cb) = (&candidates[*a], &candidates[*b]);
        cb.tokens_per_s()
            .unwrap()
            .total_cmp(&ca.tokens_per_s().unwrap())
            .then_with(|| ca.label.cmp(&cb.label))
            .then(a.cmp(b))
    });
    let infeasible = if ranking.is_empty() {
        candidates
            .iter()
            .map(|c| {
                let needed = match &c.report {
                    Some(r) => r.memory.iter().map(|m| m.peak_bytes as f64).fold(0.0, f64::max),
                    None => c.memory_estimate_bytes,
                };
                (needed, c)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.label.cmp(&b.1.label)))
            .map(|(needed, c)| Shortfall { label: c.label.clone(), needed_bytes: needed, available_bytes: hbm })
    } else {
        None
    };
    Ok(SearchResult {
        enumerated: e.enumerated(),
        duplicates: e.duplicates,
        invalid: e.invalid.clone(),
        frameworks: opts.space.frameworks.clone(),
        unrunnable: e.unrunnable.clone(),
        valid: e.valid.len() as u64,
        out_of_memory_analytic: candidates.iter().filter(|c| c.status == Status::OutOfMemoryAnalytic).count() as u64,
        estimated: candidates.iter().filter(|c| c.estimate_step_s.is_some()).count() as u64,
        simulated,
        out_of_memory_simulated: oom_sim,
        candidates,
        ranking,
        base: base_index,
        infeasible,
    })
}
