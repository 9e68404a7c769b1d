//! Several jobs on one cluster: how much each slows down when they share the fabric.
//!
//! Every job is one lowered plan placed on nodes of the shared cluster ([`JobSpec`]). All
//! jobs' programs run at once in one simulated time ([`crate::engine::run_jobs`]) on one
//! fabric network ([`crate::net::FabricNetwork`]: NCCL's algorithms as flows, max-min
//! sharing), each job's ranks mapped onto its nodes' GPUs ([`view`]), so their collectives
//! meet on the links they share, and static ECMP hashes and routes see every job's flows.
//! Each job is then simulated alone on the same placement, the same fabric and the same
//! seed (the other jobs' nodes idle), and the report gives per job
//!
//!   slowdown = T_together / T_alone  (≥ 1 up to the engine's event order),
//!
//! with both steps' breakdowns, so the extra time shows where it went (exposed TP / DP / PP
//! communication, bubble). Jobs start their step at the same instant, t = 0.
//!
//! Full mode only: symmetric mode stands one stage for identical groups of one job and
//! cannot see another job's flows. So a multi-job run obeys the full mode's limits over all
//! jobs together ([`FULL_MODE_RANKS_MAX`] ranks, [`FULL_MODE_OPS_MAX`] ops). GPU clusters
//! only: the CPU executor's shared cores model one process, not several jobs.
//!
//! Units: seconds in the report, as [`SimReport`]; the engine's are integer nanoseconds.

use serde::{Deserialize, Serialize};
use strata_models::ClusterSpec;
use strata_models::plan::Plan;

use crate::breakdown::Breakdown;
use crate::engine::{self, EngineConfig, JobRun, Mode, Outcome};
use crate::error::SimError;
use crate::net::NetworkKind;
use crate::profile::HardwareProfile;
use crate::program::ProgramTable;
use crate::simulate::{FULL_MODE_OPS_MAX, FULL_MODE_RANKS_MAX, ProfileTimer, SimOptions, SimReport};

pub mod view;

/// One job to place: its plan and the nodes of the shared cluster it runs on.
#[derive(Clone, Debug)]
pub struct JobSpec<'a> {
    pub name: String,
    pub plan: &'a Plan,
    /// Node indices of the shared cluster, in the order the job's ranks fill them.
    pub nodes: Vec<u32>,
}

/// Why a multi-job run could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error("job {job}: {message}")]
    Placement { job: String, message: String },
    #[error("{0}")]
    Unsupported(String),
    #[error("job {job}: {source}")]
    Sim { job: String, source: Box<SimError> },
    #[error(transparent)]
    Shared(#[from] SimError),
}

/// One step of one job, alone or with the others.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobStep {
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    /// Of the job's rank that finishes last; sums to `step_time_s`.
    pub breakdown_s: Breakdown,
    pub last_rank: u32,
    pub fits: bool,
    pub events: u64,
}

impl JobStep {
    fn of(r: &SimReport) -> JobStep {
        JobStep {
            step_time_s: r.step_time_s,
            tokens_per_s: r.tokens_per_s,
            mfu: r.mfu,
            breakdown_s: r.breakdown_s.clone(),
            last_rank: r.last_rank,
            fits: r.fits,
            events: r.events,
        }
    }
}

/// One job's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub name: String,
    pub scenario: String,
    pub nodes: Vec<u32>,
    pub gpus: u64,
    pub alone: JobStep,
    pub together: JobStep,
    /// T_together / T_alone.
    pub slowdown: f64,
}

/// What a multi-job run gives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobsReport {
    pub cluster: ClusterSpec,
    pub network: String,
    pub profile: String,
    pub mode: Mode,
    pub seed: u64,
    pub jobs: Vec<JobResult>,
}

/// Checks that every job's nodes exist, are its own and hold exactly its ranks.
fn check_placement(cluster: &ClusterSpec, jobs: &[JobSpec<'_>]) -> Result<(), JobsError> {
    let mut owner: Vec<Option<usize>> = vec![None; cluster.nodes as usize];
    for (j, job) in jobs.iter().enumerate() {
        let bad = |message: String| JobsError::Placement { job: job.name.clone(), message };
        let c = &job.plan.scenario.cluster;
        if c.gpu != cluster.gpu || c.gpus_per_node != cluster.gpus_per_node {
            return Err(bad(format!(
                "its scenario's cluster has {} × {} per node, the shared cluster {} × {}",
                c.gpus_per_node,
                c.gpu.key(),
                cluster.gpus_per_node,
                cluster.gpu.key()
            )));
        }
        let ranks = job.plan.grid.ranks() as u64;
        let gpus = job.nodes.len() as u64 * cluster.gpus_per_node as u64;
        if ranks != gpus {
            return Err(bad(format!(
                "its plan has {ranks} ranks but its {} nodes hold {gpus} GPUs; place it on {} nodes",
                job.nodes.len(),
                ranks.div_ceil(cluster.gpus_per_node as u64)
            )));
        }
        for &n in &job.nodes {
            let slot = owner.get_mut(n as usize).ok_or_else(|| {
                bad(format!("node {n} is outside the cluster (nodes 0-{})", cluster.nodes.saturating_sub(1)))
            })?;
            if let Some(other) = *slot {
                let with = if other == j { "itself".to_string() } else { format!("job {}", jobs[other].name) };
                return Err(bad(format!("node {n} is placed twice (overlaps {with})")));
            }
            *slot = Some(j);
        }
    }
    Ok(())
}

/// A job compiled for the engine: every rank's program.
struct Compiled {
    tables: Vec<ProgramTable>,
    table_program: Vec<usize>,
}

fn compile(plan: &Plan, timer: &ProfileTimer) -> Result<Compiled, SimError> {
    let mut used: Vec<usize> = (0..plan.grid.ranks()).map(|r| plan.program_index(r)).collect();
    used.sort_unstable();
    used.dedup();
    let tables =
        used.iter().map(|&p| ProgramTable::new(plan, p, &plan.programs[p], timer)).collect::<Result<Vec<_>, _>>()?;
    Ok(Compiled { tables, table_program: used })
}

/// Runs the jobs `which` (indices into `jobs`) together on a fresh fabric.
fn run_together(
    cluster: &ClusterSpec,
    jobs: &[JobSpec<'_>],
    compiled: &[Compiled],
    which: &[usize],
    cfg: &EngineConfig,
) -> Result<Vec<Outcome>, SimError> {
    let fabric = crate::net::build(cluster, cfg.seed, NetworkKind::Fabric)?;
    let mut shared = view::Shared::new(fabric, which.len());
    let mut views: Vec<view::JobNet> = which
        .iter()
        .enumerate()
        .map(|(k, &j)| shared.view(k, view::gpus_of(&jobs[j].nodes, cluster.gpus_per_node)))
        .collect();
    let runs = which
        .iter()
        .zip(views.iter_mut())
        .map(|(&j, view)| JobRun {
            plan: jobs[j].plan,
            tables: compiled[j].tables.clone(),
            table_program: compiled[j].table_program.clone(),
            cfg: cfg.clone(),
            net: view,
        })
        .collect();
    engine::run_jobs(runs, &mut shared)
}

/// Simulates one step of every job together on `cluster`'s fabric, and each alone.
pub fn simulate_jobs(
    cluster: &ClusterSpec,
    jobs: &[JobSpec<'_>],
    options: &SimOptions,
) -> Result<JobsReport, JobsError> {
    if jobs.is_empty() {
        return Err(JobsError::Unsupported("no jobs to simulate: add a [[job]] table".into()));
    }
    check_placement(cluster, jobs)?;
    let profile = options.profile.clone().unwrap_or_else(|| HardwareProfile::builtin(cluster.gpu));
    if profile.gpu != cluster.gpu {
        return Err(SimError::ProfileMismatch {
            profile: profile.name.clone(),
            profile_gpu: profile.gpu.key().into(),
            cluster_gpu: cluster.gpu.key().into(),
        }
        .into());
    }
    if profile.execution.shared_cores > 0.0 || profile.network.is_some() {
        return Err(JobsError::Unsupported(format!(
            "profile {} models the CPU executor (shared cores or a measured network); several jobs run on a GPU cluster's fabric",
            profile.name
        )));
    }
    let ranks: u64 = jobs.iter().map(|j| j.plan.grid.ranks() as u64).sum();
    if ranks > FULL_MODE_RANKS_MAX as u64 {
        return Err(SimError::TooLarge { ranks: ranks.min(u32::MAX as u64) as u32, limit: FULL_MODE_RANKS_MAX }.into());
    }
    let ops: u64 = jobs
        .iter()
        .flat_map(|j| (0..j.plan.grid.ranks()).map(|r| j.plan.programs[j.plan.program_index(r)].ops.len() as u64))
        .sum();
    if ops > FULL_MODE_OPS_MAX {
        return Err(SimError::OverBudget { ops, limit: FULL_MODE_OPS_MAX }.into());
    }
    let compiled = jobs
        .iter()
        .map(|j| compile(j.plan, &ProfileTimer::new(&profile, j.plan)).map_err(|e| sim_err(j, e)))
        .collect::<Result<Vec<_>, _>>()?;
    let o = &profile.overlap;
    let cfg = EngineConfig {
        mode: Mode::Full,
        seed: options.seed,
        slowdown: [o.tp_slowdown, o.dp_slowdown, o.pp_slowdown],
        jitter: options.jitter,
        record_memory: false,
        one_thread_per_rank: profile.execution.one_thread_per_rank,
        staging_ns_per_byte: profile.execution.staging_ns_per_byte(),
        shared_cores: 0.0,
        // Multi-job files refuse [faults]: no job has a straggler.
        slow: Vec::new(),
    };
    let options = SimOptions { mode: Mode::Full, trace: false, ..options.clone() };
    let all: Vec<usize> = (0..jobs.len()).collect();
    let together = run_together(cluster, jobs, &compiled, &all, &cfg)?;
    let mut results = Vec::with_capacity(jobs.len());
    for ((j, job), out) in jobs.iter().enumerate().zip(together) {
        let with = checked(job, &options, &profile, out)?;
        let alone = run_together(cluster, jobs, &compiled, &[j], &cfg).map_err(|e| sim_err(job, e))?;
        let alone = alone.into_iter().next().ok_or_else(|| sim_err(job, SimError::Insane("no outcome".into())))?;
        let alone = checked(job, &options, &profile, alone)?;
        results.push(JobResult {
            name: job.name.clone(),
            scenario: job.plan.scenario.name.clone(),
            nodes: job.nodes.clone(),
            gpus: with.gpus,
            slowdown: with.step_time_s / alone.step_time_s,
            alone: JobStep::of(&alone),
            together: JobStep::of(&with),
        });
    }
    Ok(JobsReport {
        cluster: cluster.clone(),
        network: "fabric".into(),
        profile: profile.name.clone(),
        mode: Mode::Full,
        seed: options.seed,
        jobs: results,
    })
}

fn sim_err(job: &JobSpec<'_>, source: SimError) -> JobsError {
    JobsError::Sim { job: job.name.clone(), source: Box::new(source) }
}

/// A job's report from its outcome, held to the simulator's sanity checks.
fn checked(
    job: &JobSpec<'_>,
    options: &SimOptions,
    profile: &HardwareProfile,
    out: Outcome,
) -> Result<SimReport, JobsError> {
    if out.makespan_ns >= crate::sanity::HORIZON_NS {
        return Err(sim_err(
            job,
            SimError::Insane(format!("the step would end at {} ns, past 2^62 ns", out.makespan_ns)),
        ));
    }
    let report = crate::simulate::report(job.plan, options, profile, "fabric", out);
    crate::sanity::check(&report, job.plan.scenario.cluster.gpu != strata_models::GpuKind::Cpu)
        .map_err(|m| sim_err(job, SimError::Insane(m)))?;
    Ok(report)
}

#[cfg(test)]
mod tests;
