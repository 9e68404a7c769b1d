//! One simulated training step: a plan in, a report (and optionally a trace) out.
//!
//! [`simulate`] costs every compute op with the GPU's [`HardwareProfile`]
//! ([`crate::compute`]), runs the programs through the event engine ([`crate::engine`])
//! against the default network of the scenario's cluster ([`default_network`]), and
//! reports:
//! - step time T (the last rank's finish), tokens/s = B·s / T;
//! - model TFLOP/s per GPU = F_model / (T · N) with F_model from
//!   `strata_models::accounting::flops::step_flops(..).model` (Korthikanti's model FLOPs,
//!   no recomputation); hardware TFLOP/s per GPU from what the plan executes (its compute
//!   ops' FLOPs summed over all ranks, recomputation included);
//! - MFU = model TFLOP/s / the GPU's dense peak for the training dtype (catalog), HFU the
//!   same with hardware FLOPs;
//! - the breakdown of the last rank's step ([`crate::breakdown`]);
//! - memory per stage and the out-of-memory verdicts ([`crate::memory`]).
//!
//! Units: seconds and TFLOP/s (1e12 FLOP/s) in the report, bytes for memory.

use serde::{Deserialize, Serialize};
use strata_models::accounting::flops::step_flops;
use strata_models::plan::{ComputeCost, ComputeOp, OpKind, Piece, Plan};
use strata_models::trace::{MemSample, Span, Trace, TraceSource};
use strata_models::{Dtype, Recompute, Scenario};

use crate::breakdown::{BUBBLE, Breakdown, breakdown_ns, to_seconds};
use crate::compute::ComputeModel;
use crate::engine::{self, EngineConfig, Mode, Outcome};
pub use crate::error::SimError;
use crate::memory::{OutOfMemory, StageMemory, stage_memory, verdicts};
use crate::net::{self, Network, NetworkKind};
use crate::profile::HardwareProfile;
use crate::program::{ComputeTimer, ProgramTable};

/// Full mode keeps per-op state for every rank: at most this many ranks.
pub const FULL_MODE_RANKS_MAX: u32 = 4096;

/// Full mode's work budget: ops over all ranks (GPT-3 175B on 1,024 GPUs runs 35 M).
pub const FULL_MODE_OPS_MAX: u64 = 1 << 26;

/// How to simulate.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub mode: Mode,
    /// Seeds the engine's generator (and the network's, through [`default_network`]).
    pub seed: u64,
    /// The GPU's profile; `None` takes the built-in one of the cluster's GPU.
    pub profile: Option<HardwareProfile>,
    /// Record the trace (spans of every op, memory samples).
    pub trace: bool,
    /// Random spread of compute times, ± this fraction (0: deterministic costs).
    pub jitter: f64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions { mode: Mode::Auto, seed: 0, profile: None, trace: false, jitter: 0.0 }
    }
}

/// What one simulated step gives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub scenario: String,
    pub mode: Mode,
    /// Why `mode` is not the one asked for, or is approximate ([`crate::mode::resolve`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_note: Option<String>,
    pub network: String,
    pub profile: String,
    pub seed: u64,
    pub gpus: u64,
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub model_tflops_per_gpu: f64,
    pub hardware_tflops_per_gpu: f64,
    pub mfu: f64,
    pub hfu: f64,
    /// Of the rank that finishes last; sums to `step_time_s`.
    pub breakdown_s: Breakdown,
    pub last_rank: u32,
    pub last_stage: u32,
    /// With step what-ifs: the rank that waited on its peers longest (the breakdown's
    /// bubble) and its breakdown, so the report shows who waited for the straggler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub most_waiting: Option<RankBreakdown>,
    /// Per pipeline stage: the most any rank of the stage holds.
    pub peak_memory_bytes: Vec<u64>,
    pub memory: Vec<StageMemory>,
    pub fits: bool,
    pub out_of_memory: Vec<OutOfMemory>,
    /// Engine events processed (timer events, network completions, op completions).
    pub events: u64,
    /// The timeline, when asked for (not part of the JSON report).
    #[serde(skip)]
    pub trace: Option<Trace>,
}

/// One rank's breakdown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankBreakdown {
    pub rank: u32,
    pub stage: u32,
    pub breakdown_s: Breakdown,
}

/// The default network model of a scenario's cluster for a hardware profile: the measured
/// network when the profile carries one (a host calibrated with `strata calibrate`), else the
/// fat-tree fabric (NCCL's algorithms as flows, max-min link sharing).
pub fn default_network(
    scenario: &Scenario,
    profile: &HardwareProfile,
    seed: u64,
) -> Result<Box<dyn Network>, SimError> {
    let links = net::faults::LinkFaults::of(&scenario.faults);
    Ok(net::build_faulted(&scenario.cluster, seed, Some(NetworkKind::default_for(profile)), profile, &links)?)
}

/// The profile a simulation uses: the given one, or the built-in one of the cluster's GPU.
pub fn profile_of(plan: &Plan, options: &SimOptions) -> HardwareProfile {
    options.profile.clone().unwrap_or_else(|| HardwareProfile::builtin(plan.scenario.cluster.gpu))
}

/// Simulates one step of `plan` on the default network.
pub fn simulate(plan: &Plan, options: &SimOptions) -> Result<SimReport, SimError> {
    let mut net = default_network(&plan.scenario, &profile_of(plan, options), options.seed)?;
    simulate_with(plan, options, net.as_mut())
}

/// Simulates one step of `plan` on a given network.
pub fn simulate_with(plan: &Plan, options: &SimOptions, net: &mut dyn Network) -> Result<SimReport, SimError> {
    let profile = profile_of(plan, options);
    if profile.gpu != plan.scenario.cluster.gpu {
        return Err(SimError::ProfileMismatch {
            profile: profile.name.clone(),
            profile_gpu: profile.gpu.key().into(),
            cluster_gpu: plan.scenario.cluster.gpu.key().into(),
        });
    }
    let timer = ProfileTimer::new(&profile, plan);
    let report = simulate_timed(plan, options, net, &timer, &profile)?;
    // Op times from a GPU's profile: no GPU beats its datasheet peak.
    let peak_bound = plan.scenario.cluster.gpu != strata_models::GpuKind::Cpu;
    crate::sanity::check(&report, peak_bound).map_err(SimError::Insane)?;
    Ok(report)
}

/// Compute times from a profile: one cost per cost id (or, when the profile measured
/// pieces, per piece and cost), plus the host's per-step overhead on the optimizer step,
/// plus the executor loop's CPU time per op (`execution.loop_us_per_op`), which the thread
/// spends between ops: charged to the compute ops, as (ops / compute ops) × per op each.
pub struct ProfileTimer {
    ns: Vec<u64>,
    /// Set when the profile has measured piece rates: op times then depend on the piece.
    model: Option<ComputeModel>,
    /// The shape model (for pieces whose time is not their cost's alone).
    shapes: ComputeModel,
    step_overhead_ns: u64,
    loop_ns: u64,
    /// Host time per cost id beside the device time (DeepSpeed ZeRO-3's module hooks),
    /// overlapping it.
    host_ns: Vec<u64>,
}

impl ProfileTimer {
    pub fn new(profile: &HardwareProfile, plan: &Plan) -> ProfileTimer {
        let model = ComputeModel::new(profile, plan.scenario.training.storage_dtype());
        let per_op = profile.execution.loop_us_per_op;
        let loop_ns = if per_op > 0.0 {
            let ops: usize = plan.programs.iter().map(|p| p.ops.len()).sum();
            let compute = plan.programs.iter().flat_map(|p| &p.ops).filter(|o| matches!(o.kind, OpKind::Compute(_)));
            (per_op * 1e3 * ops as f64 / compute.count().max(1) as f64).round() as u64
        } else {
            0
        };
        ProfileTimer {
            ns: plan.costs.iter().map(|c| model.cost_ns(c)).collect(),
            model: model.has_piece_rates().then(|| model.clone()),
            shapes: model,
            step_overhead_ns: (profile.host.step_overhead_us * 1e3).round() as u64,
            loop_ns,
            host_ns: plan.host_ns.clone(),
        }
    }
}

impl ProfileTimer {
    /// The op's device time from the profile (no host time, no per-step extras).
    fn device_ns(&self, op: &ComputeOp, cost: &ComputeCost) -> u64 {
        match &self.model {
            Some(m) => (m.op_cost_s(op.piece, op.phase, cost) * 1e9).ceil() as u64,
            // Experts run as one grouped GEMM: their time is the piece's, not the cost's.
            None if op.piece == Piece::Experts => (self.shapes.piece_cost_s(op.piece, cost) * 1e9).ceil() as u64,
            None => self.ns[op.cost as usize],
        }
    }

    fn host(&self, op: &ComputeOp) -> u64 {
        self.host_ns.get(op.cost as usize).copied().unwrap_or(0)
    }
}

impl ComputeTimer for ProfileTimer {
    fn duration_ns(&self, op: &ComputeOp, cost: &ComputeCost) -> u64 {
        self.timing_ns(op, cost).0
    }

    fn timing_ns(&self, op: &ComputeOp, cost: &ComputeCost) -> (u64, u64) {
        let extra = if op.piece == Piece::Optimizer { self.step_overhead_ns } else { 0 };
        // The host runs ahead of the device (its launches are asynchronous): an op takes
        // its device time or its host time, whichever is longer.
        let (device, host) = (self.device_ns(op, cost), self.host(op));
        (device.max(host) + extra + self.loop_ns, host.saturating_sub(device))
    }
}

/// Simulates one step with an explicit compute timer (tests use idealised ones).
pub fn simulate_timed(
    plan: &Plan,
    options: &SimOptions,
    net: &mut dyn Network,
    timer: &dyn ComputeTimer,
    profile: &HardwareProfile,
) -> Result<SimReport, SimError> {
    let g = plan.grid;
    let faults = &plan.scenario.faults;
    let (mode, mode_note) = if faults.step_is_fault_free() {
        let resolved = crate::mode::resolve(
            options.mode,
            &plan.scenario.cluster,
            g.ranks(),
            FULL_MODE_RANKS_MAX,
            net.name() == "fabric",
        );
        // Full mode for router imbalance only where it is within full mode's budgets.
        let full_ops: u64 = (0..g.ranks()).map(|r| plan.programs[plan.program_index(r)].ops.len() as u64).sum();
        let full_fits = g.ranks() <= FULL_MODE_RANKS_MAX && full_ops <= FULL_MODE_OPS_MAX;
        crate::mode::with_router(options.mode, resolved, plan, full_fits)
    } else {
        crate::mode::with_what_ifs(options.mode, &what_ifs(faults), g.ranks(), FULL_MODE_RANKS_MAX)?
    };
    let options = &SimOptions { mode, ..options.clone() };
    let symmetric = mode == Mode::Symmetric && plan.rank_programs.is_empty();
    if !symmetric && g.ranks() > FULL_MODE_RANKS_MAX {
        return Err(SimError::TooLarge { ranks: g.ranks(), limit: FULL_MODE_RANKS_MAX });
    }
    if !symmetric {
        // Full mode keeps per-op state for every rank: a work budget on the ops it runs.
        let ops: u64 = (0..g.ranks()).map(|r| plan.programs[plan.program_index(r)].ops.len() as u64).sum();
        if ops > FULL_MODE_OPS_MAX {
            return Err(SimError::OverBudget { ops, limit: FULL_MODE_OPS_MAX });
        }
    }
    // The programs that run: one per stage, or every distinct one.
    let mut used: Vec<usize> = if symmetric {
        (0..g.pp).map(|pp| plan.program_index(g.rank(strata_models::plan::Coord { tp: 0, cp: 0, dp: 0, pp }))).collect()
    } else {
        (0..g.ranks()).map(|r| plan.program_index(r)).collect()
    };
    used.sort_unstable();
    used.dedup();
    let mut tables =
        used.iter().map(|&p| ProgramTable::new(plan, p, &plan.programs[p], timer)).collect::<Result<Vec<_>, _>>()?;
    if plan.scenario.tp_comm_overlap() {
        // `--tp-comm-overlap`: each overlapped collective charged with what its GEMM leaves.
        let model = ComputeModel::new(profile, plan.scenario.training.storage_dtype());
        crate::tp_overlap::apply(plan, &used, &mut tables, &model, profile.overlap.tp_slowdown);
    }
    let o = &profile.overlap;
    let cfg = EngineConfig {
        mode: options.mode,
        seed: options.seed,
        slowdown: [o.tp_slowdown, o.dp_slowdown, o.pp_slowdown],
        jitter: options.jitter,
        record_memory: options.trace,
        one_thread_per_rank: profile.execution.one_thread_per_rank,
        staging_ns_per_byte: profile.execution.staging_ns_per_byte(),
        shared_cores: profile.execution.shared_cores,
        slow: faults.slow.iter().map(|s| (s.rank, s.factor)).collect(),
    };
    let outcome = engine::run(plan, tables, used, cfg, net)?;
    if let Some(why) = net.broken() {
        return Err(SimError::Disconnected(why));
    }
    if outcome.makespan_ns >= crate::sanity::HORIZON_NS {
        return Err(SimError::Insane(format!(
            "the step would end at {} ns, past the clock's horizon of 2^62 ns",
            outcome.makespan_ns
        )));
    }
    let report = report(plan, options, profile, net.name(), outcome);
    crate::sanity::check(&report, false).map_err(SimError::Insane)?;
    Ok(SimReport { mode_note, ..report })
}

/// The step what-ifs in a few words: "rank 17 compute ×1.3, leaf2-spine7 at 0.5, spine3 down".
pub fn what_ifs(f: &strata_models::faults::Faults) -> String {
    let mut parts: Vec<String> = f.slow.iter().map(|s| format!("rank {} compute ×{}", s.rank, s.factor)).collect();
    parts.extend(f.degrade.iter().map(|d| format!("{} at {}", d.link, d.factor)));
    parts.extend(f.down.iter().map(|d| format!("{d} down")));
    if parts.len() > 6 {
        let more = parts.len() - 6;
        parts.truncate(6);
        parts.push(format!("{more} more"));
    }
    parts.join(", ")
}

pub(crate) fn report(
    plan: &Plan,
    options: &SimOptions,
    profile: &HardwareProfile,
    network: &str,
    out: Outcome,
) -> SimReport {
    let s = &plan.scenario;
    let g = plan.grid;
    let gpus = g.ranks() as u64;
    let step_ns = out.makespan_ns.max(1);
    let step_time_s = step_ns as f64 * 1e-9;
    let copies = if out.mode == Mode::Symmetric { g.stage_ranks() as f64 } else { 1.0 };
    let hardware_flops: f64 = out.actors.iter().map(|a| out.tables[a.table].flops * copies).sum();
    let model_flops = step_flops(&s.model, s.parallel.global_batch as u64, Recompute::None).model;
    let spec = s.cluster.gpu.spec();
    let peak = match s.training.dtype {
        // fp8 runs quote MFU against the bf16 peak, as torchtitan and Megatron-Bridge do.
        Dtype::Bf16 | Dtype::Fp8 => spec.bf16_tflops,
        Dtype::Fp16 => spec.fp16_tflops,
        Dtype::Fp32 => spec.fp32_tflops,
    } * 1e12;
    let per_gpu = |f: f64| f / (step_time_s * gpus as f64);
    // The last rank to finish (the lowest rank among equals).
    let last = out
        .actors
        .iter()
        .enumerate()
        .max_by_key(|(_, a)| (a.finish_ns, std::cmp::Reverse(a.rank)))
        .map(|(i, _)| i)
        .expect("a plan has ranks");
    let la = &out.actors[last];
    let program = &plan.programs[out.table_program[la.table]];
    let breakdown_s = to_seconds(breakdown_ns(la, &out.tables[la.table], program));
    let most_waiting = (!s.faults.step_is_fault_free()).then(|| most_waiting(plan, &out)).flatten();
    let mut stages: Vec<Option<StageMemory>> = vec![None; g.pp as usize];
    for a in &out.actors {
        let program = &plan.programs[out.table_program[a.table]];
        let m = stage_memory(plan, a.stage, program, a.memory.peak_bytes, profile);
        let slot = &mut stages[a.stage as usize];
        if slot.as_ref().is_none_or(|s| m.peak_bytes > s.peak_bytes) {
            *slot = Some(m);
        }
    }
    let memory: Vec<StageMemory> = stages.into_iter().flatten().collect();
    let out_of_memory = verdicts(&memory);
    let trace = options.trace.then(|| trace(&out, options.seed));
    SimReport {
        scenario: s.name.clone(),
        mode: out.mode,
        mode_note: None,
        network: network.to_string(),
        profile: profile.name.clone(),
        seed: options.seed,
        gpus,
        step_time_s,
        tokens_per_s: s.tokens_per_step() as f64 / step_time_s,
        model_tflops_per_gpu: per_gpu(model_flops) / 1e12,
        hardware_tflops_per_gpu: per_gpu(hardware_flops) / 1e12,
        mfu: per_gpu(model_flops) / peak,
        hfu: per_gpu(hardware_flops) / peak,
        breakdown_s,
        last_rank: la.rank,
        last_stage: la.stage,
        most_waiting,
        peak_memory_bytes: memory.iter().map(|m| m.peak_bytes).collect(),
        fits: out_of_memory.is_empty(),
        memory,
        out_of_memory,
        events: out.events,
        trace,
    }
}

/// The rank with the longest wait on its peers (the lowest rank among equals).
fn most_waiting(plan: &Plan, out: &Outcome) -> Option<RankBreakdown> {
    let mut best: Option<(u64, usize, [u64; crate::breakdown::CAUSES])> = None;
    for (i, a) in out.actors.iter().enumerate() {
        let ns = breakdown_ns(a, &out.tables[a.table], &plan.programs[out.table_program[a.table]]);
        if best.is_none_or(|b| ns[BUBBLE] > b.0) {
            best = Some((ns[BUBBLE], i, ns));
        }
    }
    let (_, i, ns) = best?;
    Some(RankBreakdown { rank: out.actors[i].rank, stage: out.actors[i].stage, breakdown_s: to_seconds(ns) })
}

fn trace(out: &Outcome, seed: u64) -> Trace {
    let mut spans = Vec::new();
    let mut memory = Vec::new();
    for a in &out.actors {
        let t = &out.tables[a.table];
        for op in 0..t.len() {
            spans.push(Span {
                rank: a.rank,
                stream: t.stream[op],
                op: op as u32,
                start_ns: a.start_ns[op],
                end_ns: a.end_ns[op],
            });
        }
        memory.extend(a.memory.samples.iter().map(|&(t_ns, bytes)| MemSample { rank: a.rank, t_ns, bytes }));
    }
    let mut trace = Trace {
        source: TraceSource::Simulated,
        step: 0,
        seed,
        ranks: out.actors.iter().map(|a| a.rank).collect(),
        spans,
        memory,
    };
    trace.canonicalize();
    trace
}
