//! The search space: every parallel configuration of a model on a cluster for a global
//! batch, each either valid or rejected with the rule it breaks.
//!
//! Dimensions: tp (divisors of the GPUs per node), pp (divisors of GPUs / tp), dp (the rest),
//! the schedule (every one in `Schedule::ALL`; a chunked one, interleaved, with every vpp
//! that splits the layers evenly, up to 8), micro_batch (powers of two up to 16 that divide the replica's batch),
//! ZeRO 0–3, recomputation none / selective / full, sequence parallelism (when tp > 1), the
//! gradient bucket size, and whether gradient reduction and parameter all-gathers overlap
//! compute (only where they can matter: dp > 1, ZeRO ≥ 1), and the framework (the base
//! scenario's, or several: a valid split becomes one candidate per framework that runs it,
//! and is counted by rule under each that cannot). Three more where they can matter:
//! expert parallelism ep (divisors of a MoE model's experts that divide the stage's
//! tp·cp·dp ranks; 1 for a dense model), context parallelism cp with its exchange (powers
//! of two that leave every rank ≥ 4,096 tokens of a sequence of ≥ 8,192, s divisible by
//! 2·cp — TE's load-balanced chunks — and Ulysses only where tp·cp divides the heads and
//! kv heads; ring, all-gather, Ulysses), and fp8 (bf16 and fp8 linear layers, where the base
//! scenario asks `training.dtype = "fp8"` on a GPU with fp8 tensor cores: precision changes
//! the numerics, so the search never picks it unasked), and for a MoE model with ep > 1
//! whether the expert all-to-alls overlap another microbatch's compute
//! (`moe_a2a_overlap`, where the framework runs it and the schedule keeps its pace with
//! merged passes, `Schedule::merge_keeps_pace`: pp = 1, interleaved, ZB-H2). Everything else — the model, the
//! cluster, the global batch, fused attention — comes from the base scenario.
//!
//! Enumeration is a plain nested loop in a fixed order, so the candidate list (and every
//! index into it) is the same on every run.

use std::collections::BTreeMap;

use serde::Serialize;
use strata_models::parallel::{CpComm, ParallelConfig, Recompute, Schedule};
use strata_models::{Dtype, Framework, Scenario, limits};

/// What the search varies. `SearchSpace::full` is the default; tests narrow it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchSpace {
    pub tp: Vec<u32>,
    pub pp: Vec<u32>,
    pub micro_batch: Vec<u32>,
    /// Schedules without chunks, plus chunked ones (whose vpp values are in `vpp`).
    pub schedules: Vec<Schedule>,
    pub vpp: Vec<u32>,
    pub zero: Vec<u8>,
    pub recompute: Vec<Recompute>,
    pub sequence_parallel: Vec<bool>,
    pub grad_bucket_mb: Vec<f64>,
    pub overlap_grad_reduce: Vec<bool>,
    pub overlap_param_gather: Vec<bool>,
    /// The frameworks a split may run under: the base scenario's, or several
    /// (`--framework any`: the external ones), each candidate naming its own.
    pub frameworks: Vec<Framework>,
    /// Expert-parallel sizes (a MoE model's; `[1]` for a dense one).
    pub ep: Vec<u32>,
    /// Context-parallel sizes (`[1]` below 8,192 tokens).
    pub cp: Vec<u32>,
    /// How a cp > 1 candidate exchanges keys and values.
    pub cp_comm: Vec<CpComm>,
    /// Whether the linear layers run in fp8 (`[false]` unless the base asks fp8 on a GPU
    /// that has it).
    pub fp8: Vec<bool>,
    /// Whether a steady-state backward is merged with the next forward to hide the expert
    /// all-to-alls (`[false]` for a dense model; only varied where ep > 1).
    pub moe_a2a_overlap: Vec<bool>,
}

/// Tokens of a sequence each context-parallel rank keeps at least, and the shortest
/// sequence context parallelism is searched for.
const CP_MIN_TOKENS: u32 = 4096;
const CP_MIN_SEQ: u32 = 8192;

fn divisors(n: u64) -> Vec<u32> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).map(|d| d as u32).collect()
}

impl SearchSpace {
    /// The whole space for a base scenario's model and cluster.
    pub fn full(base: &Scenario) -> SearchSpace {
        let gpus = base.cluster.gpus();
        let gpn = base.cluster.gpus_per_node as u64;
        SearchSpace {
            tp: divisors(gpn),
            pp: divisors(gpus).into_iter().filter(|p| *p <= base.model.layers).collect(),
            micro_batch: vec![1, 2, 4, 8, 16],
            schedules: Schedule::ALL.to_vec(),
            vpp: vec![2, 3, 4, 6, 8],
            zero: vec![0, 1, 2, 3],
            recompute: Recompute::ALL.to_vec(),
            sequence_parallel: vec![false, true],
            grad_bucket_mb: vec![10.0, 40.0, 160.0],
            overlap_grad_reduce: vec![true, false],
            overlap_param_gather: vec![true, false],
            frameworks: vec![base.training.framework],
            ep: match &base.model.moe {
                Some(moe) => divisors(moe.experts as u64).into_iter().filter(|e| *e as u64 <= gpus).collect(),
                None => vec![1],
            },
            cp: std::iter::once(1)
                .chain(
                    (1..=20)
                        .map(|i| 1u32 << i)
                        .take_while(|c| base.model.seq_len >= CP_MIN_SEQ && base.model.seq_len / c >= CP_MIN_TOKENS)
                        .filter(|c| (*c as u64) <= gpus),
                )
                .collect(),
            cp_comm: CpComm::ALL.to_vec(),
            fp8: if base.training.dtype == Dtype::Fp8
                && crate::profile::HardwareProfile::builtin(base.cluster.gpu).compute.fp8_tflops.is_some()
            {
                vec![false, true]
            } else {
                vec![false]
            },
            moe_a2a_overlap: if base.model.moe.is_some() { vec![false, true] } else { vec![false] },
        }
    }

    /// Only the split and schedule dimensions (tp, pp, micro_batch, schedule, vpp, ZeRO,
    /// recomputation, sequence parallel); the rest as in the base scenario.
    pub fn splits(base: &Scenario) -> SearchSpace {
        let p = &base.parallel;
        SearchSpace {
            grad_bucket_mb: vec![p.grad_bucket_mb],
            overlap_grad_reduce: vec![p.overlap_grad_reduce],
            overlap_param_gather: vec![p.overlap_param_gather],
            ..SearchSpace::full(base)
        }
    }
}

/// The outcome of enumeration.
#[derive(Clone, Debug, Default)]
pub struct Enumeration {
    /// Valid candidates, in enumeration order.
    pub valid: Vec<Scenario>,
    /// Combinations the rules reject, counted by rule id (`tp-divides-heads`, …).
    pub invalid: BTreeMap<&'static str, u64>,
    /// Valid splits a framework of the space cannot run, counted by its rule id
    /// (`megatron-zero`, …), once per (split, framework).
    pub unrunnable: BTreeMap<&'static str, u64>,
    /// Combinations skipped as duplicates of another (an option that cannot matter for this
    /// split, e.g. overlapping a data-parallel reduction when dp = 1).
    pub duplicates: u64,
}

impl Enumeration {
    pub fn enumerated(&self) -> u64 {
        self.valid.len() as u64
            + self.invalid.values().sum::<u64>()
            + self.unrunnable.values().sum::<u64>()
            + self.duplicates
    }
}

/// Enumerates the space around `base`.
pub fn enumerate(base: &Scenario, space: &SearchSpace) -> Enumeration {
    let mut out = Enumeration::default();
    let gpus = base.cluster.gpus();
    let gb = base.parallel.global_batch;
    // (ep, cp_comm, fp8, moe_a2a_overlap) of one split; cp_comm only varies where cp > 1,
    // the all-to-all overlap where ep > 1.
    let extras = |cp: u32| -> Vec<(u32, CpComm, bool, bool)> {
        let comms: Vec<CpComm> = if cp > 1 { space.cp_comm.clone() } else { vec![CpComm::default()] };
        let mut v = Vec::new();
        for &ep in &space.ep {
            let overlaps: &[bool] = if ep > 1 { &space.moe_a2a_overlap } else { &[false] };
            for &comm in &comms {
                for &fp8 in &space.fp8 {
                    for &overlap in overlaps {
                        v.push((ep, comm, fp8, overlap));
                    }
                }
            }
        }
        v
    };
    for &tp in &space.tp {
        for (&pp, &cp) in space.pp.iter().flat_map(|pp| space.cp.iter().map(move |cp| (pp, cp))) {
            let grid = tp as u64 * pp as u64 * cp as u64;
            if grid == 0 || !gpus.is_multiple_of(grid) {
                *out.invalid.entry("grid-equals-gpus").or_default() += 1;
                continue;
            }
            let dp = (gpus / grid) as u32;
            let extras = extras(cp);
            // (schedule, vpp) pairs.
            let mut scheds: Vec<(Schedule, u32)> = Vec::new();
            for &s in &space.schedules {
                if s.chunked() {
                    scheds.extend(
                        space.vpp.iter().filter(|v| base.model.layers.is_multiple_of(pp * **v)).map(|v| (s, *v)),
                    );
                } else {
                    scheds.push((s, 1));
                }
            }
            for &mb in &space.micro_batch {
                for &(schedule, vpp) in &scheds {
                    for &zero in &space.zero {
                        for &recompute in &space.recompute {
                            for &sp in &space.sequence_parallel {
                                if sp && tp == 1 {
                                    // Sequence parallelism needs tp > 1: not a distinct candidate.
                                    out.duplicates += 1;
                                    continue;
                                }
                                for &bucket in &space.grad_bucket_mb {
                                    for &ogr in &space.overlap_grad_reduce {
                                        for &opg in &space.overlap_param_gather {
                                            // Bucketing and overlap only matter with data parallelism,
                                            // parameter all-gathers only under ZeRO.
                                            let bucket_matters = dp > 1;
                                            let gather_matters = dp > 1 && zero >= 1;
                                            if (!bucket_matters
                                                && (bucket != space.grad_bucket_mb[0]
                                                    || ogr != space.overlap_grad_reduce[0]))
                                                || (!gather_matters && opg != space.overlap_param_gather[0])
                                            {
                                                out.duplicates += 1;
                                                continue;
                                            }
                                            for &(ep, cp_comm, fp8, moe_a2a_overlap) in &extras {
                                                let parallel = ParallelConfig {
                                                    tp,
                                                    pp,
                                                    dp,
                                                    cp,
                                                    ep,
                                                    cp_comm,
                                                    vpp,
                                                    schedule,
                                                    micro_batch: mb,
                                                    global_batch: gb,
                                                    zero,
                                                    recompute,
                                                    sequence_parallel: sp,
                                                    grad_bucket_mb: bucket,
                                                    overlap_grad_reduce: ogr,
                                                    overlap_param_gather: opg,
                                                    moe_a2a_overlap,
                                                    // The scenario's choice where the split has
                                                    // sequence-parallel collectives; "auto" otherwise.
                                                    tp_comm_overlap: match base.parallel.tp_comm_overlap {
                                                        Some(true) if tp < 2 || !sp => None,
                                                        o => o,
                                                    },
                                                };
                                                if let Err(e) = parallel.validate(&base.model, &base.cluster) {
                                                    *out.invalid.entry(e.violations[0].rule).or_default() += 1;
                                                    continue;
                                                }
                                                // The overlap only where the schedule leaves a merged
                                                // pair its slack (else it slows the steady state).
                                                if moe_a2a_overlap
                                                    && !schedule.merge_keeps_pace(pp, vpp, parallel.microbatches())
                                                {
                                                    continue;
                                                }
                                                // One candidate per framework that runs the split; a
                                                // framework that cannot is counted by its rule. The work
                                                // budget and the search's own bound (docs/limits.md): cut,
                                                // and counted.
                                                for &framework in &space.frameworks {
                                                    let mut s = Scenario { parallel: parallel.clone(), ..base.clone() };
                                                    s.training.framework = framework;
                                                    s.training.dtype =
                                                        if fp8 { Dtype::Fp8 } else { s.training.storage_dtype() };
                                                    if (1..=2).contains(&s.zero_stage())
                                                        && framework.gathers_in_step()
                                                        && opg != space.overlap_param_gather[0]
                                                    {
                                                        // DeepSpeed gathers ZeRO-1/2's weights in
                                                        // its step: the overlap flag is moot.
                                                        out.duplicates += 1;
                                                    } else if let Some(v) = framework.violations(&s).first() {
                                                        *out.unrunnable.entry(v.rule).or_default() += 1;
                                                    } else if limits::check_work(&s).is_err() {
                                                        *out.invalid.entry("work-budget").or_default() += 1;
                                                    } else if out.valid.len() as u64 >= limits::MAX_SEARCH_CANDIDATES {
                                                        *out.invalid.entry("search-budget").or_default() += 1;
                                                    } else {
                                                        out.valid.push(s);
                                                    }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// A short label of a candidate's split: `tp8 pp8 dp16 1f1b mb1 z1 sel sp` (`cp4 ring`,
/// `ep8` where they are not 1, `a2a-overlap` with `moe_a2a_overlap`).
pub fn label(p: &ParallelConfig) -> String {
    let sched = p.schedule.label(p.vpp);
    let rc = match p.recompute {
        Recompute::None => "none",
        Recompute::Selective => "sel",
        Recompute::Full => "full",
    };
    let mut l = format!(
        "tp{} pp{} dp{} {sched} mb{} z{} {rc}{}",
        p.tp,
        p.pp,
        p.dp,
        p.micro_batch,
        p.zero,
        if p.sequence_parallel { " sp" } else { "" }
    );
    if p.cp > 1 {
        l += &format!(" cp{} {}", p.cp, p.cp_comm.key());
    }
    if p.ep > 1 {
        l += &format!(" ep{}", p.ep);
        if p.moe_a2a_overlap {
            l += " a2a-overlap";
        }
    }
    // The data-parallel knobs, where they matter.
    if p.dp > 1 {
        l += &format!(" b{}", p.grad_bucket_mb);
        if !p.overlap_grad_reduce {
            l += " sync-grads";
        }
        if p.zero >= 1 && !p.overlap_param_gather {
            l += " sync-params";
        }
    }
    l
}
