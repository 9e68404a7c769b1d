//! `strata calibrate`: measure the machine the executor runs on and write the hardware
//! profile that makes the simulator predict it.
//!
//! For the CPU backend (`strata_runtime::calibrate` measures, `strata_sim::calibrate` fits):
//! - the GEMMs of the model's pieces at every shape a plan on N ranks can give them (every
//!   tensor-parallel size and micro-batch), timed on every core at once;
//! - the model's pieces as the executor runs them, in one-rank jobs (one per core, at once):
//!   what each costs beside its GEMMs;
//! - the threads communicator: each collective and a pipeline message over every group
//!   size that divides N and a range of sizes, all N ranks at once;
//! - context parallelism ([`cp`]), whatever the scenario's own cp: its split attention
//!   pieces in real jobs (cp 2 and 4, every exchange and tensor-parallel size), and its ring
//!   exchange and all-to-all at the sizes those plans send;
//! - how many cores' worth of compute N busy rank threads share.
//!
//! The profile is for the `cpu-local` cluster: `strata simulate|search|compare --profile
//! FILE` read it.
//!
//! `--backend cuda` (a build with the `cuda` feature) measures GPU 0 and fits a GPU
//! profile: `calibrate_cuda`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use strata_models::hardware::GpuKind;
use strata_models::parallel::{CpComm, ParallelConfig, Recompute};
use strata_models::plan::cost::piece_cost;
use strata_models::plan::{CollKind, Phase, Piece};
use strata_models::{Dtype, Scenario};
use strata_runtime::calibrate::{self as measure, CommOp};
use strata_sim::HardwareProfile;
use strata_sim::calibrate::{CommInJob, CommTiming, GemmTiming, Measurements, PieceTiming, fit};
use strata_sim::profile::CommFitKind;

use crate::common::{self, ScenarioArgs};

mod cp;
use cp::cp_fits;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model whose pieces to measure (its [model] table; the rest is ignored beyond
    /// training settings). Without it, the embedded default scenario.
    #[command(flatten)]
    pub scenario: ScenarioArgs,
    /// What to measure: cpu (the CPU executor on this machine) or cuda (GPU 0: cuBLAS bf16
    /// GEMMs, HBM, the model's attention kernels, fitted into a GPU profile, and NCCL
    /// all-reduce with two GPUs or more; needs a build with the `cuda` feature, NVRTC for
    /// the kernels, NCCL for the all-reduce).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Ranks a job will run (threads sharing this machine's cores) [default: the scenario's
    /// cluster size].
    #[arg(long)]
    pub ranks: Option<u32>,
    /// Where to write the profile (TOML) [default: print it].
    #[arg(long, value_name = "PROFILE.toml")]
    pub out: Option<PathBuf>,
    /// Fewer sizes and repetitions (a few seconds instead of about a minute).
    #[arg(long)]
    pub quick: bool,
    /// Print the measurements and the profile as JSON.
    #[arg(long)]
    pub json: bool,
}

/// How thoroughly to measure.
#[derive(Clone, Copy, Debug)]
pub struct Effort {
    pub gemm_reps: u32,
    /// Communication sizes: every `comm_size_step`-th power of 4 from 4 KiB up to the
    /// model's gradients.
    pub comm_size_step: u32,
    pub comm_reps: u32,
    pub piece_steps: u32,
    /// Fewer piece jobs (recomputation at tp = 1 only).
    pub quick: bool,
    /// Measure the context-parallel pieces and exchanges ([`cp`]) too: what a profile needs
    /// to predict plans with cp > 1 (a loop whose plans have none can leave them out).
    pub cp: bool,
}

impl Effort {
    pub fn new(quick: bool) -> Effort {
        if quick {
            Effort { gemm_reps: 3, comm_size_step: 2, comm_reps: 2, piece_steps: 2, quick, cp: true }
        } else {
            Effort { gemm_reps: 7, comm_size_step: 1, comm_reps: 5, piece_steps: 3, quick, cp: true }
        }
    }

    /// As [`Effort::new`], measuring the context-parallel pieces only if `cp`.
    pub fn for_plans(quick: bool, cp: bool) -> Effort {
        Effort { cp, ..Effort::new(quick) }
    }
}

/// Message sizes to measure: powers of 4 from 4 KiB (every `step`-th) up to the largest
/// buffer a plan of the model moves (all its fp32 gradients), which is always included.
pub fn comm_sizes(s: &Scenario, step: u32) -> Vec<u64> {
    let largest = (strata_models::accounting::params::total_params(&s.model) * 4).clamp(1 << 20, 256 << 20);
    let mut sizes: Vec<u64> =
        (0..).map(|i| 4096u64 << (2 * i)).take_while(|b| *b < largest).step_by(step.max(1) as usize).collect();
    sizes.push(largest.next_multiple_of(4096));
    sizes
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.backend.as_str() {
        "cpu" => {}
        #[cfg(feature = "cuda")]
        "cuda" => return super::calibrate_cuda::run(&args),
        #[cfg(not(feature = "cuda"))]
        "cuda" => match super::gpu::require_gpus(
            "strata calibrate --backend cuda",
            "strata calibrate --backend cpu calibrates the CPU executor",
        )? {},
        other => bail!("--backend {other:?}: use cpu (or cuda, in a build with the `cuda` feature)"),
    }
    let s = args.scenario.load()?;
    let ranks = args.ranks.unwrap_or(s.cluster.gpus() as u32);
    if !(1..=64).contains(&ranks) {
        bail!("--ranks {ranks}: calibrate for 1 to 64 rank threads on this machine");
    }
    let effort = Effort::new(args.quick);
    let quiet = args.json;
    let (profile, m) = calibrate(&s, ranks, effort, &mut |line| {
        if !quiet {
            eprintln!("{line}");
        }
    })?;
    let text = profile_text(&profile, &s, ranks);
    match &args.out {
        Some(path) => {
            common::write_file(path, &text)?;
        }
        None if !args.json => print!("{text}"),
        None => {}
    }
    if args.json {
        return common::print_json(&serde_json::json!({ "measurements": m, "profile": profile }));
    }
    if let Some(path) = &args.out {
        println!("{}", summary(&profile));
        println!("wrote {} (use it with --profile {})", path.display(), path.display());
    }
    Ok(())
}

/// Measures this machine for `ranks` rank threads running the model of `s`, and fits the
/// profile. `log` sees one line per phase.
pub fn calibrate(
    s: &Scenario,
    ranks: u32,
    effort: Effort,
    log: &mut dyn FnMut(String),
) -> anyhow::Result<(HardwareProfile, Measurements)> {
    let cores = measure::host_cores();
    let t0 = Instant::now();
    let meter = measure::CpuMeter::now();
    let shapes = gemm_shapes_with(s, ranks, effort.cp);
    log(format!("calibrate: {} GEMM shapes on {cores} threads at once", shapes.len()));
    let gemms = measure::time_gemms(&shapes, cores, effort.gemm_reps);
    let jobs = piece_jobs(s, ranks, effort)?;
    log(format!("calibrate: the pieces of {} in {} jobs (every tensor-parallel size)", s.model.name, jobs.len()));
    let job_samples = measure::time_jobs(&jobs, cores, effort.piece_steps).map_err(anyhow::Error::msg)?;
    let ops = job_samples.pieces.len();
    let groups: Vec<u32> = (2..=ranks).filter(|g| ranks.is_multiple_of(*g)).collect();
    log(format!("calibrate: the threads communicator, {ranks} ranks, groups of {groups:?}"));
    let mut comm = if groups.is_empty() {
        Vec::new()
    } else {
        measure::time_comm(&measure::KINDS, ranks, &groups, &comm_sizes(s, effort.comm_size_step), effort.comm_reps)
            .map_err(|e| anyhow::anyhow!("measuring the communicator: {e}"))?
    };
    // Context parallelism's ring exchange and all-to-all, at the sizes its plans send (and
    // the smallest and largest of the general sizes, so the lines span them too).
    let (cp_groups, mut cp_bytes) = if effort.cp {
        cp::cp_messages(s, ranks, &tensor_parallel_sizes(s, ranks), &micro_batches(s))
    } else {
        (Vec::new(), Vec::new())
    };
    if !cp_groups.is_empty() {
        let general = comm_sizes(s, effort.comm_size_step);
        cp_bytes.extend(general.first().into_iter().chain(general.last()));
        cp_bytes.sort_unstable();
        cp_bytes.dedup();
        log(format!("calibrate: ring exchange and all-to-all, groups of {cp_groups:?}, {} sizes", cp_bytes.len()));
        let cp = measure::time_comm(&measure::CP_KINDS, ranks, &cp_groups, &cp_bytes, effort.comm_reps)
            .map_err(|e| anyhow::anyhow!("measuring the communicator: {e}"))?;
        comm.extend(cp);
    }
    log(format!("calibrate: compute shared by {ranks} rank threads"));
    let shared = measure::shared_cores(ranks, sharing_shape(s));
    // The copies around the largest message a plan moves (every gradient, fp32), capped.
    let staged = comm_sizes(s, effort.comm_size_step).last().copied().unwrap_or(1 << 20).min(STAGING_BYTES_MAX);
    log(format!("calibrate: the executor's copies around a collective, {} MB by {ranks} threads", staged >> 20));
    let staging = measure::staging_rates(ranks, staged);
    let m = Measurements {
        gemms: gemms.iter().map(|g| GemmTiming { m: g.m, n: g.n, k: g.k, seconds: g.seconds }).collect(),
        pieces: job_samples
            .pieces
            .into_iter()
            .map(|p| PieceTiming { piece: p.piece, phase: p.phase, cost: p.cost, seconds: p.seconds })
            .collect(),
        comm_in_jobs: job_samples
            .comm
            .iter()
            .map(|c| CommInJob { kind: fit_kind(c.op), ranks: c.ranks, bytes: c.bytes, cpu_s: c.cpu_s })
            .collect(),
        loop_cpu: job_samples.loop_cpu,
        comm: comm
            .iter()
            .map(|c| CommTiming {
                kind: fit_kind(c.op),
                ranks: c.ranks,
                bytes: c.bytes,
                post_s: c.post_s,
                finish_s: c.finish_s,
                latency_s: c.latency_s,
            })
            .collect(),
        shared_cores: shared,
        staging_ns_per_byte: [staging.message, staging.tensors, staging.copy],
        source: format!(
            "strata calibrate --backend cpu --ranks {ranks}: {cores} cores, model {} ({} GEMM shapes, {} ops, {} \
             communication samples)",
            s.model.name,
            gemms.len(),
            ops,
            comm.len()
        ),
    };
    let mut profile = fit(&m);
    if groups.is_empty() {
        profile.network = None;
    }
    log(piece_fit_quality(&profile, &m));
    profile.check().map_err(|e| anyhow::anyhow!("the fitted profile is not valid: {e}"))?;
    log(format!("calibrate: done in {:.1} s", t0.elapsed().as_secs_f64()));
    if let Some(l) = meter.and_then(|m| m.foreign_share()).filter(|l| *l > 0.1) {
        log(format!(
            "calibrate: warning: other processes took {:.0}% of the CPU meanwhile; the profile is of a loaded machine \
             (calibrate again when it is quiet)",
            100.0 * l
        ));
    }
    Ok((profile, m))
}

fn fit_kind(op: CommOp) -> CommFitKind {
    match op {
        CommOp::Collective(CollKind::AllReduce) => CommFitKind::AllReduce,
        CommOp::Collective(CollKind::ReduceScatter) => CommFitKind::ReduceScatter,
        CommOp::Collective(CollKind::AllGather) => CommFitKind::AllGather,
        CommOp::Collective(CollKind::Broadcast) => CommFitKind::Broadcast,
        CommOp::Collective(CollKind::AllToAll) => CommFitKind::AllToAll,
        CommOp::Collective(CollKind::RingExchange) => CommFitKind::RingExchange,
        CommOp::SendRecv => CommFitKind::SendRecv,
    }
}

/// How well the fitted piece model (what serves shapes that were not measured) reproduces
/// the ops measured: the median and the 90th percentile of |predicted / measured − 1| over
/// distinct (piece, phase, cost), each measured as its median time.
fn piece_fit_quality(p: &HardwareProfile, m: &Measurements) -> String {
    // Without the table of measured ops: the model that serves the shapes not measured.
    let mut p = p.clone();
    p.compute.ops.clear();
    let model = strata_sim::compute::ComputeModel::new(&p, Dtype::Fp32);
    // (piece, phase, cost) → its measured times; the cost's Debug text is its identity.
    let mut by: std::collections::BTreeMap<String, (&PieceTiming, Vec<f64>)> = Default::default();
    for s in &m.pieces {
        let key = format!("{:?} {:?} {:?}", s.piece, s.phase, s.cost);
        by.entry(key).or_insert((s, Vec::new())).1.push(s.seconds);
    }
    let mut errors: Vec<f64> = by
        .values()
        .filter_map(|(s, times)| {
            let mut t = times.clone();
            t.sort_by(f64::total_cmp);
            let measured = t[t.len() / 2];
            (measured > 20e-6).then(|| (model.op_cost_s(s.piece, s.phase, &s.cost) / measured - 1.0).abs())
        })
        .collect();
    if errors.is_empty() {
        return "calibrate: no compute op long enough to judge the fit".into();
    }
    errors.sort_by(f64::total_cmp);
    format!(
        "calibrate: {} distinct ops measured; the piece model (for other shapes) reproduces them to {:.1}% \
         (median), {:.1}% (90th percentile)",
        errors.len(),
        100.0 * errors[errors.len() / 2],
        100.0 * errors[errors.len() * 9 / 10]
    )
}

/// Micro-batch sizes a plan of `s` may use.
fn micro_batches(s: &Scenario) -> Vec<u32> {
    [1, 2, 4, 8].into_iter().filter(|b| *b <= s.parallel.global_batch.max(1)).collect()
}

/// The largest message whose copies [`measure::staging_rates`] times, per rank thread
/// (beyond it the rate per byte no longer changes, and the threads' buffers stay within memory).
const STAGING_BYTES_MAX: u64 = 32 << 20;

/// The GEMM whose working set stands for a rank's in [`measure::shared_cores`]: the MLP's
/// forward GEMM with the most work, without tensor parallelism, at the scenario's own
/// micro-batch (the job being calibrated for).
fn sharing_shape(s: &Scenario) -> (usize, usize, usize) {
    let p = ParallelConfig { tp: 1, cp: 1, micro_batch: s.parallel.micro_batch.max(1), ..s.parallel.clone() };
    piece_cost(&s.model, &p, Dtype::Fp32, s.training.flash_attention, Piece::Mlp, Phase::Forward)
        .gemms
        .iter()
        .map(|g| (g.m as usize, g.n as usize, g.k as usize))
        .max_by_key(|(m, n, k)| m * n * k)
        .unwrap_or((256, 256, 256))
}

/// Every GEMM (m, n, k) a plan of the model on `ranks` ranks can run: every tensor-parallel
/// size that divides the ranks and the heads, every micro-batch; context-parallel pieces at
/// the scenario's own cp only (what `calibrate --backend cuda` times).
#[cfg(feature = "cuda")]
pub fn gemm_shapes(s: &Scenario, ranks: u32) -> Vec<(u64, u64, u64)> {
    gemm_shapes_with(s, ranks, false)
}

/// [`gemm_shapes`], with `all_cp` the context-parallel pieces of every cp and exchange that
/// calibration measures ([`cp::cp_sizes`]).
fn gemm_shapes_with(s: &Scenario, ranks: u32, all_cp: bool) -> Vec<(u64, u64, u64)> {
    let mut shapes = std::collections::BTreeSet::new();
    let m = &s.model;
    for tp in tensor_parallel_sizes(s, ranks) {
        for mb in micro_batches(s) {
            use Piece::*;
            // Context-parallel splits run the split attention pieces on s/cp tokens (the core's
            // shape following the exchange); every split runs the unsplit ones.
            let (cps, comms) = if all_cp {
                (cp::cp_sizes(s, ranks), CpComm::ALL.to_vec())
            } else {
                (vec![s.parallel.cp], vec![s.parallel.cp_comm])
            };
            let cps = cps.into_iter().filter(|c| *c > 1 && cp_fits(s, ranks, tp, *c));
            let splits = std::iter::once((1, CpComm::Ring))
                .chain(cps.flat_map(|c| comms.iter().map(move |x| (c, *x))).collect::<Vec<_>>());
            for (cp, cp_comm) in splits {
                let p = ParallelConfig { tp, cp, cp_comm, micro_batch: mb, ..s.parallel.clone() };
                let pieces: &[Piece] = if cp == 1 {
                    &[Embed, AttnIn, Attn, MlpIn, Mlp, LayerOut, FinalNorm, Logits, Loss]
                } else {
                    &[Embed, AttnIn, AttnQkv, AttnCore, AttnProj, MlpIn, Mlp, LayerOut, FinalNorm, Logits, Loss]
                };
                for &piece in pieces {
                    for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight, Phase::Recompute] {
                        let c = piece_cost(m, &p, Dtype::Fp32, s.training.flash_attention, piece, phase);
                        shapes.extend(c.gemms.iter().map(|g| (g.m, g.n, g.k)));
                    }
                }
            }
        }
    }
    shapes.into_iter().collect()
}

/// Jobs that run every piece of the model at the shapes plans give it: for every
/// tensor-parallel size t that divides the ranks (t ranks, one stage, one replica) and every
/// micro-batch, without recomputation; and with selective recomputation (sequence parallel
/// when t > 1) — at every micro-batch, or `quick`, at a middle one. Full recomputation
/// re-runs forward pieces, which these measure. Every layer of the model (`quick`: four),
/// so that the ranks' working sets load the caches as a real job does.
fn piece_jobs(s: &Scenario, ranks: u32, effort: Effort) -> anyhow::Result<Vec<Scenario>> {
    let quick = effort.quick;
    let mbs = micro_batches(s);
    let mid = mbs[mbs.len() / 2];
    let m = &s.model;
    let mut jobs = Vec::new();
    for tp in tensor_parallel_sizes(s, ranks) {
        // A tensor-parallel MoE layer runs only with sequence parallelism (the router takes
        // the sequence-split tokens), so its jobs without recomputation use it too.
        let moe_sp = m.moe.is_some() && tp > 1;
        let mut runs: Vec<(u32, Recompute, bool)> = mbs.iter().map(|&mb| (mb, Recompute::None, moe_sp)).collect();
        for &mb in mbs.iter().filter(|mb| !quick || **mb == mid) {
            runs.push((mb, Recompute::Selective, tp > 1));
        }
        for (mb, recompute, sp) in runs {
            let mut j = s.clone();
            j.name = format!("calibrate-tp{tp}-mb{mb}-{}{}", recompute.key(), if sp { "-sp" } else { "" });
            j.model.layers = if quick { m.layers.min(4) } else { m.layers };
            j.cluster.nodes = 1;
            j.cluster.gpus_per_node = tp;
            j.training.dtype = Dtype::Fp32;
            j.parallel = ParallelConfig {
                tp,
                pp: 1,
                dp: 1,
                vpp: 1,
                schedule: strata_models::parallel::Schedule::OneFOneB,
                micro_batch: mb,
                global_batch: 2 * mb,
                zero: 0,
                recompute,
                sequence_parallel: sp,
                cp: 1,
                ep: 1,
                ..s.parallel.clone()
            };
            j.validate().context("a calibration job of this model")?;
            jobs.push(j);
        }
    }
    // Context-parallel jobs (cp 2, 4 and the scenario's; every exchange and tp beside it),
    // for the split attention pieces and their exchanges.
    if effort.cp {
        jobs.extend(cp::cp_jobs(s, ranks, &tensor_parallel_sizes(s, ranks), mid, quick));
    }
    // Data-parallel jobs (the whole model, one replica per rank), for what its gradient
    // collectives cost inside a job: all-reduce (ZeRO-0), reduce-scatter and all-gather
    // (ZeRO-1), over every data-parallel size.
    for dp in (2..=ranks).filter(|d| ranks.is_multiple_of(*d)) {
        for zero in [0, 1] {
            let mut j = s.clone();
            j.name = format!("calibrate-dp{dp}-z{zero}");
            j.cluster.nodes = 1;
            j.cluster.gpus_per_node = dp;
            j.training.dtype = Dtype::Fp32;
            j.parallel = ParallelConfig {
                tp: 1,
                pp: 1,
                dp,
                vpp: 1,
                schedule: strata_models::parallel::Schedule::OneFOneB,
                micro_batch: mbs[0],
                global_batch: mbs[0] * dp,
                zero,
                recompute: Recompute::None,
                sequence_parallel: false,
                cp: 1,
                ep: 1,
                ..s.parallel.clone()
            };
            j.validate().context("a calibration job of this model")?;
            jobs.push(j);
        }
    }
    Ok(jobs)
}

/// Tensor-parallel sizes a plan of `s` on `ranks` ranks can use.
fn tensor_parallel_sizes(s: &Scenario, ranks: u32) -> Vec<u32> {
    let m = &s.model;
    (1..=ranks)
        .filter(|t| {
            ranks.is_multiple_of(*t)
                && m.heads.is_multiple_of(*t)
                && m.kv_heads.is_multiple_of(*t)
                && m.ffn_hidden.is_multiple_of(*t)
        })
        .collect()
}

/// The profile as TOML, with a header saying what it is.
pub fn profile_text(p: &HardwareProfile, s: &Scenario, ranks: u32) -> String {
    format!(
        "# Hardware profile of this machine for the CPU executor, written by `strata calibrate`.\n\
         # Measured for {ranks} rank threads and the pieces of {} (cluster cpu-local, fp32).\n\
         # Use it with: strata simulate|search|compare --profile THIS_FILE\n{}",
        s.model.name,
        p.to_toml()
    )
}

/// A few lines on what the profile says.
pub fn summary(p: &HardwareProfile) -> String {
    let best = p.compute.gemms.iter().map(|g| g.gflops).fold(0.0, f64::max);
    let mut o = format!(
        "profile {}: GEMMs up to {best:.1} GFLOP/s per rank ({} shapes), {} pieces measured, {:.2} cores shared",
        p.name,
        p.compute.gemms.len(),
        p.compute.pieces.len(),
        p.execution.shared_cores
    );
    if let Some(n) = &p.network {
        let ar: Vec<String> = n
            .links
            .iter()
            .filter(|l| l.kind == CommFitKind::AllReduce)
            .map(|l| {
                let i = l.bytes.len() - 1;
                format!(
                    "{} ranks: {:.0} µs latency, {} in {:.0} + {:.0} µs of CPU",
                    l.ranks,
                    l.latency_us,
                    common::bytes(l.bytes[i] as f64),
                    l.post_us[i],
                    l.finish_us[i]
                )
            })
            .collect();
        o += &format!("\nall-reduce: {}", ar.join("; "));
    }
    o
}

/// The built-in nominal CPU profile is for `cpu` clusters only; a check the loop shares.
pub fn require_cpu(s: &Scenario) -> anyhow::Result<()> {
    if s.cluster.gpu != GpuKind::Cpu {
        bail!(
            "the CPU executor runs cpu-local clusters, but the scenario's cluster has cluster.gpu = \"{}\"; use \
             cluster.preset = \"cpu-local\"",
            s.cluster.gpu.key()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_parallel_gemm_shapes_only_when_asked() {
        let text = "[model]\npreset = \"tiny-gpt\"\n[cluster]\npreset = \"cpu-local\"\ngpus_per_node = 8\n\
                    [parallel]\ntp = 2\npp = 2\ndp = 2\nmicro_batch = 2\nglobal_batch = 16\n";
        let s = Scenario::from_toml(text, "t", "t", &[]).unwrap();
        let (dense, all) = (gemm_shapes_with(&s, 8, false), gemm_shapes_with(&s, 8, true));
        assert!(dense.iter().all(|g| all.contains(g)) && all.len() > dense.len());
        // The ring core's block at tp 2, cp 2, mb 2: (s/cp)² scores over 16-wide heads.
        assert!(all.contains(&(32, 32, 16)) && !dense.contains(&(32, 32, 16)), "{all:?}");
    }

    #[test]
    fn cores_are_shared_with_a_units_working_set_of_the_mlp() {
        // small-gpt (h 256, ffn 1024, s 128) at micro-batch 2 → 256 tokens; the MLP's GEMMs
        // are 256 × 1024 × 256 and 256 × 256 × 1024.
        let s = Scenario::from_toml(common::DEFAULT_SCENARIO, "d", "d", &[]).unwrap();
        let (m, n, k) = sharing_shape(&s);
        assert_eq!((m, n * k), (256, 1024 * 256), "{:?}", (m, n, k));
        let s4 = Scenario::from_toml(common::DEFAULT_SCENARIO, "d", "d", &["parallel.micro_batch=4".into()]).unwrap();
        assert_eq!(sharing_shape(&s4).0, 512);
    }
}
