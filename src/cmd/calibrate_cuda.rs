//! `strata calibrate --backend cuda` (a build with the `cuda` feature): measure GPU 0 and fit
//! the GPU profile the simulator reads. Measured: cuBLAS bf16 GEMMs at every shape a plan
//! of the scenario's model on one node gives them plus a sweep; HBM (a device-to-device
//! copy) and the model's element-wise kernel; the model's fused causal attention kernels at
//! the plan's shapes plus a sequence sweep (these two need NVRTC, skipped with a note
//! without it). `strata_sim::gpu_fit` fits them with the published microbenchmarks' own
//! fits; the residuals are printed, and the fit beside the built-in profile of the GPU.
//! With two GPUs or more, NCCL all-reduce bus bandwidth (1 MiB to 1 GiB) is measured and
//! set beside the simulator's NCCL model (residuals; nothing is fitted to it). Last, a
//! one-rank plan trains a few steps on the CUDA executor and each of its compute ops' CUDA-event
//! time becomes the profile's measured-op table (`compute.ops`, as the CPU calibration's
//! pieces do): the plan's own shapes at their measured times.

use anyhow::bail;
use strata_runtime::cuda::{self, kernels, measure, nccl_bench};
use strata_sim::HardwareProfile;
use strata_sim::gpu_fit::{self, AllReduceRate, AttentionRate, GemmRate, GpuFit, GpuMeasurements};

use super::calibrate::{Args, gemm_shapes};
use crate::common::{self, RunFailure};

/// The sweep beside the plan's shapes: square and wide tiles, short to long k.
const SWEEP_MN: &[(u64, u64)] = &[(2048, 2048), (4096, 4096), (8192, 8192), (16384, 8192)];
const SWEEP_K: &[u64] = &[128, 512, 2048, 8192];
/// NCCL all-reduce sizes (bytes), 1 MiB to 1 GiB.
const NCCL_SIZES: &[u64] = &[1 << 20, 16 << 20, 256 << 20, 1 << 30];
/// Attention sweep: the FlashAttention papers' setting, 16k tokens of 16 heads.
const ATTN_SEQS: &[u64] = &[512, 1024, 2048, 4096, 8192];

pub fn run(args: &Args) -> anyhow::Result<()> {
    let s = args.scenario.load()?;
    let devices = super::gpu::require_gpus(
        "strata calibrate --backend cuda",
        "strata calibrate --backend cpu calibrates the CPU executor",
    )?;
    let d = &devices[0];
    let Some(kind) = strata_runtime::probe::catalog_kind(&d.name) else {
        bail!(
            "GPU 0 is a {:?}, which is not in Strata's GPU catalog: a GPU profile is fitted on top of the catalog GPU's \
             built-in profile (strata presets lists them)",
            d.name
        );
    };
    let log = |line: String| {
        if !args.json {
            eprintln!("{line}");
        }
    };
    let per_node = args.ranks.unwrap_or(s.cluster.gpus_per_node);
    let mut shapes = gemm_shapes(&s, per_node);
    for &(m, n) in SWEEP_MN {
        shapes.extend(SWEEP_K.iter().map(|&k| (m, n, k)));
    }
    shapes.sort_unstable();
    shapes.dedup();
    let reps = if args.quick { 3 } else { 20 };
    log(format!(
        "calibrate: GPU 0 of {}: {} ({}, {} SMs, compute capability {}.{}, {}); {} GEMM shapes ({} of the plans of {})",
        devices.len(),
        d.name,
        kind.key(),
        d.sms,
        d.compute_capability.0,
        d.compute_capability.1,
        common::bytes(d.memory_bytes as f64),
        shapes.len(),
        gemm_shapes(&s, per_node).len(),
        s.model.name
    ));
    let run_failure = |e: cuda::CudaError| RunFailure(e.to_string());
    let gemms = cuda::time_gemms_bf16(0, &shapes, reps).map_err(run_failure)?;
    let mut notes = Vec::new();
    let arch = if kernels::nvrtc_present() {
        Some(measure::arch_of(d.compute_capability).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        notes.push(
            "NVRTC not found: the model's kernels (element-wise, attention) were not timed; install \
             nvidia-cuda-nvrtc 13.0 to measure them"
                .to_string(),
        );
        None
    };
    log("calibrate: HBM (a 1 GiB device-to-device copy, the element-wise add)".into());
    let memory = measure::time_memory(0, arch, 1 << 30, reps).map_err(run_failure)?;
    let (attention, attn_shapes) = match arch {
        Some(arch) => {
            let shapes = attention_shapes(&s, per_node);
            log(format!("calibrate: the model's causal attention kernels at {} shapes", shapes.len()));
            let reps = if args.quick { 2 } else { 5 };
            (measure::time_attention_bf16(0, arch, &shapes, reps).map_err(run_failure)?, shapes.len())
        }
        None => (Vec::new(), 0),
    };
    let all_reduce = if devices.len() < 2 {
        notes.push("one GPU: no NCCL bus bandwidth to measure".into());
        Vec::new()
    } else {
        log(format!("calibrate: NCCL all-reduce over {} GPUs", devices.len()));
        let reps = if args.quick { 2 } else { 5 };
        match nccl_bench::time_all_reduce(devices.len(), NCCL_SIZES, reps) {
            Ok(r) => r,
            Err(e) => {
                notes.push(format!("NCCL all-reduce not measured: {e}"));
                Vec::new()
            }
        }
    };
    if s.cluster.gpu != kind {
        notes.push(format!(
            "the scenario's cluster has {} GPUs and this is a {}: the profile is of this GPU ({} shapes)",
            s.cluster.gpu.key(),
            kind.key(),
            s.model.name
        ));
    }
    let measurements = GpuMeasurements {
        gpu: kind,
        source: format!(
            "strata calibrate --backend cuda on {} ({} SMs, cc {}.{}): {} cuBLAS bf16 GEMMs, a 1 GiB copy, {} \
             attention shapes of {}",
            d.name,
            d.sms,
            d.compute_capability.0,
            d.compute_capability.1,
            gemms.len(),
            attn_shapes,
            s.model.name
        ),
        gemms: gemms.iter().map(|g| GemmRate { m: g.m, n: g.n, k: g.k, tflops: g.tflops }).collect(),
        attention_kernel: "strata-nvrtc".into(),
        attention: attention
            .iter()
            .flat_map(|t| {
                let (f, b) = t.credited_tflops();
                [(false, f), (true, b)].map(|(backward, tflops)| AttentionRate {
                    backward,
                    seq: t.seq,
                    head_dim: t.head_dim,
                    causal: true,
                    tflops,
                })
            })
            .collect(),
        hbm_copy_gb_per_s: Some(memory.copy_gb_per_s),
        elementwise_gb_per_s: memory.elementwise_gb_per_s,
        all_reduce: all_reduce
            .iter()
            .map(|r| AllReduceRate { ranks: r.ranks, bytes: r.bytes, busbw_gbps: r.busbw_gbps })
            .collect(),
    };
    let mut fit = gpu_fit::fit(&measurements).map_err(|e| RunFailure(format!("fitting the GPU profile: {e}")))?;
    // The plan's own ops, timed in training steps of the executor: their measured table.
    let op_steps = if args.quick { 3 } else { OP_STEPS };
    let ops = match arch {
        Some(_) => {
            log(format!("calibrate: the plan's compute ops over {op_steps} training steps of the CUDA executor"));
            match plan_op_timings(&s, op_steps) {
                Ok(t) => t,
                Err(why) => {
                    notes.push(format!("the plan's ops were not timed: {why}"));
                    Vec::new()
                }
            }
        }
        None => Vec::new(),
    };
    if !ops.is_empty() {
        fit.profile.compute.ops = strata_sim::calibrate::measured_ops(&ops);
        notes.push(format!(
            "{} distinct compute ops of the plan measured ({} samples, the last of {op_steps} training steps on GPU 0; \
             the median per op): a plan op of the same shape takes its measured time, others the fitted models",
            fit.profile.compute.ops.len(),
            ops.len()
        ));
    }
    fit.notes.extend(notes);
    let text = profile_text(&fit, d.name.as_str());
    match &args.out {
        Some(path) => common::write_file(path, &text)?,
        None if !args.json => print!("{text}"),
        None => {}
    }
    if args.json {
        return common::print_json(&serde_json::json!({
            "devices": devices,
            "gemms_bf16": gemms,
            "memory": memory,
            "attention": attention,
            "all_reduce": all_reduce,
            "ops_measured": fit.profile.compute.ops.len(),
            "fit": fit,
            "builtin": HardwareProfile::builtin(kind),
        }));
    }
    eprint!("{}", gpu_fit::residual_table(&fit));
    eprintln!("{}", beside_builtin(&fit));
    for n in &fit.notes {
        eprintln!("note: {n}");
    }
    if let Some(path) = &args.out {
        println!("wrote {} (use it with --profile {})", path.display(), path.display());
    }
    Ok(())
}

/// Training steps `calibrate --backend cuda` runs to time the plan's ops (the last traced;
/// the first ones warm the pool and the kernels).
const OP_STEPS: u32 = 4;

/// Every compute op of the scenario's plan as it ran on GPU 0 in the last of `steps`
/// training steps of the CUDA executor (CUDA-event spans). Only a one-rank plan: ranks
/// sharing the GPU would time each other's kernels.
fn plan_op_timings(s: &strata_models::Scenario, steps: u32) -> Result<Vec<strata_sim::calibrate::PieceTiming>, String> {
    use std::sync::Arc;
    use strata_models::plan::OpKind;
    let plan = Arc::new(strata_models::plan::lower(s).map_err(|e| e.to_string())?);
    if plan.grid.ranks() != 1 {
        return Err(format!(
            "the plan has {} ranks, which would share GPU 0 (calibrate a one-rank split to time them)",
            plan.grid.ranks()
        ));
    }
    strata_runtime::cuda::exec::rank::check_plan(&plan).map_err(|e| e.to_string())?;
    let (corpus, _, _) = super::train::load_corpus(None, s).map_err(|e| e.to_string())?;
    let opts = strata_runtime::train::TrainOptions {
        steps,
        data_name: "calibration".into(),
        checkpoint: None,
        exec: strata_runtime::exec::ExecConfig { trace_step: steps.checked_sub(1), ..Default::default() },
        faults: Vec::new(),
    };
    let (result, _) = strata_runtime::cuda::exec::train::train_cuda(plan.clone(), 0, Arc::new(corpus), &opts, None)
        .map_err(|e| e.to_string())?;
    let trace = result.trace.ok_or("the executor recorded no trace")?;
    let ops = &plan.program(0).ops;
    Ok(trace
        .spans
        .iter()
        .filter_map(|span| match &ops.get(span.op as usize)?.kind {
            OpKind::Compute(c) => Some(strata_sim::calibrate::PieceTiming {
                piece: c.piece,
                phase: c.phase,
                cost: plan.cost(c.cost).clone(),
                seconds: span.end_ns.saturating_sub(span.start_ns) as f64 * 1e-9,
            }),
            _ => None,
        })
        .collect())
}

/// Attention shapes: the plan's (the model's sequence and head size, its heads over every
/// tensor-parallel size, the smallest and largest micro-batch), then the sweep at the
/// model's head size.
fn attention_shapes(s: &strata_models::Scenario, per_node: u32) -> Vec<(u64, u64, u64, u64)> {
    let m = &s.model;
    let d = m.head_dim().clamp(1, 256);
    let mut out = std::collections::BTreeSet::new();
    let mbs: Vec<u32> = [1, 8].into_iter().filter(|b| *b <= s.parallel.global_batch.max(1)).collect();
    for tp in (1..=per_node.max(1)).filter(|t| per_node.is_multiple_of(*t) && m.heads.is_multiple_of(*t)) {
        for &mb in &mbs {
            out.insert((u64::from(mb), u64::from(m.seq_len), u64::from(m.heads / tp), d));
        }
    }
    for &seq in ATTN_SEQS {
        out.insert(((16384 / seq).max(1), seq, 16, d));
    }
    out.into_iter().collect()
}

/// The profile as TOML with a header saying what it is.
fn profile_text(f: &GpuFit, device: &str) -> String {
    let mut head = format!(
        "# GPU profile of this machine's {device}, written by `strata calibrate --backend cuda`: what Strata's \
         CUDA executor runs (cuBLAS bf16 GEMMs, its own NVRTC kernels).\n# {}\n",
        f.profile.source
    );
    for n in &f.notes {
        head += &format!("# - {n}\n");
    }
    head += "# Use it with: strata simulate|search|compare --profile THIS_FILE\n";
    head + &f.profile.to_toml()
}

/// The fitted figures beside the built-in (published-fit) profile's.
fn beside_builtin(f: &GpuFit) -> String {
    let (p, b) = (&f.profile.compute, HardwareProfile::builtin(f.profile.gpu).compute);
    let mut o = format!(
        "fit vs built-in {}: gemm_efficiency {:.3} vs {:.3}, gemm_k_half {} vs {}, hbm_gb_per_s {:.0} vs {:.0}, \
         element-wise {:.0} vs {:.0} GB/s; GEMM tile model worst |residual| {:.1}%",
        f.profile.gpu.key(),
        p.gemm_efficiency,
        b.gemm_efficiency,
        p.gemm_k_half,
        b.gemm_k_half,
        p.hbm_gb_per_s,
        b.hbm_gb_per_s,
        p.hbm_gb_per_s * p.elementwise_bw_efficiency,
        b.hbm_gb_per_s * b.elementwise_bw_efficiency,
        100.0 * f.gemm_worst.unwrap_or(0.0)
    );
    if let (Some(a), Some(w)) = (&p.attention, f.attention_worst) {
        o += &format!(
            "\nattention {}: fwd_efficiency {:.4}, bwd_efficiency {:.4}, fwd_seq_half {}, bwd_seq_half {}, \
             causal_seq_extra {}; worst |residual| {:.1}% (built-in: {})",
            a.kernel,
            a.fwd_efficiency,
            a.bwd_efficiency,
            a.fwd_seq_half,
            a.bwd_seq_half,
            a.causal_seq_extra,
            100.0 * w,
            b.attention
                .as_ref()
                .map_or("none".into(), |x| format!("{} {:.3} / {:.3}", x.kernel, x.fwd_efficiency, x.bwd_efficiency))
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_shapes_are_the_plans_then_the_sweep() {
        let path = std::path::Path::new("scenarios/gpt2-124m-1xh200.toml");
        let s = strata_models::Scenario::load(path, &[]).unwrap();
        let shapes = attention_shapes(&s, 1);
        // GPT-2 124M: 12 heads of 64, 1024 tokens, micro-batches 1 and 8; the sweep at d = 64.
        assert!(shapes.contains(&(1, 1024, 12, 64)) && shapes.contains(&(8, 1024, 12, 64)), "{shapes:?}");
        for seq in ATTN_SEQS {
            assert!(shapes.contains(&(16384 / seq, *seq, 16, 64)), "{shapes:?}");
        }
        assert_eq!(shapes.len(), 2 + ATTN_SEQS.len());
        // Two GPUs per node add the tp = 2 shard (6 heads); 12 heads do not divide by 5.
        assert!(attention_shapes(&s, 2).contains(&(8, 1024, 6, 64)));
        assert_eq!(attention_shapes(&s, 5).len(), shapes.len());
    }
}
