//! `strata train --backend cuda`: the plan on one GPU through the CUDA executor
//! (`strata_runtime::cuda::exec`) — every rank of it on that GPU, each on its own streams,
//! through the shared-GPU communicator (`--ranks N` sizes the cluster to N ranks as on
//! the CPU path) — with the CPU path's outputs: the loss curve, the measured trace of the
//! last step from CUDA events, memory.json (measured per rank: its device pool's high-water
//! mark plus the CUDA context; predicted: the plan's live buffers). Checkpoints, restarts
//! and injected faults are the CPU executor's: refused here, exit 2. Started by `mpirun -n
//! N` (N > 1), each process trains one rank on its own GPU through NCCL instead
//! (`train_nccl`); with `--all-gpus`, this one process trains one rank per GPU of the node,
//! each on its own thread through NCCL (`cuda::exec::train_node`), the cluster sized to the
//! visible GPUs unless `--ranks` says otherwise.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use strata_models::hardware::GpuKind;
use strata_models::plan::{lower, verify};
use strata_runtime::cuda::exec::train::train_cuda;
use strata_runtime::cuda::exec::train_node::train_node;
use strata_runtime::exec::ExecConfig;
use strata_runtime::train::{StepRecord, TrainError, TrainOptions, TrainResult, write_outputs};

use super::train::{Args, progress_bar, summary};
use crate::common::{self, RunFailure};

pub fn run(args: Args, ordinal: usize) -> anyhow::Result<()> {
    for (set, what) in [
        (args.checkpoint_dir.is_some(), "--checkpoint-dir"),
        (args.restarts > 0, "--restarts"),
        (!args.inject.is_empty(), "--inject"),
    ] {
        if set {
            bail!(
                "{what} is not available with --backend cuda yet (the CUDA executor trains without checkpoints); use --backend cpu"
            );
        }
    }
    let world = super::train_nccl::mpi_world(|k| std::env::var(k).ok()).filter(|&n| n > 1);
    if let (true, Some(n)) = (args.all_gpus, world) {
        bail!(
            "--all-gpus makes one process drive every GPU of the node, but this one was started by an MPI launcher as \
             one of {n} processes (one GPU each): drop --all-gpus under mpirun, or run strata without mpirun"
        );
    }
    // --all-gpus: the node's GPUs, one rank each.
    let node = args.all_gpus.then(|| strata_runtime::cuda::exec::nccl_gpu::gpu_count() as u32);
    let s = super::train::load_sized(&args.scenario, args.ranks.or(world).or(node), |_| true)?;
    if s.cluster.gpu == GpuKind::Cpu {
        bail!(
            "--backend cuda trains a GPU cluster's plan, but the scenario's cluster is cpu-local; use a GPU scenario, e.g. scenarios/gpt2-124m-1xh200.toml"
        );
    }
    let steps = args.steps.unwrap_or(s.training.steps);
    let plan = lower(&s)?;
    verify(&plan).context("the plan of this scenario does not verify")?;
    strata_runtime::cuda::exec::rank::check_plan(&plan).map_err(anyhow::Error::new)?;
    let (corpus, data_name, entropy) = super::train::load_corpus(args.data.as_deref(), &s)?;
    let rank0 = std::env::var("OMPI_COMM_WORLD_RANK").or_else(|_| std::env::var("PMI_RANK")).map_or(true, |r| r == "0");
    if let Some(n) = world {
        if !args.json && rank0 {
            println!(
                "Training {} on {n} GPUs, one process each through NCCL (tp {} · pp {} · dp {}), {steps} steps of {} \
                 tokens; data {data_name}",
                s.name,
                s.parallel.tp,
                s.parallel.pp,
                s.parallel.dp,
                s.tokens_per_step()
            );
        }
        let exec =
            ExecConfig { recv_timeout: Duration::from_secs(args.timeout.max(1)), trace_step: steps.checked_sub(1) };
        let opts = TrainOptions { steps, data_name, checkpoint: None, exec, faults: Vec::new() };
        return super::train_nccl::run(&args, Arc::new(plan), corpus, &opts, n);
    }
    if let (Some(n), false) = (node, args.json) {
        println!(
            "Training {} on the {n} GPUs of this node, one rank each on its own thread through NCCL (tp {} · pp {} · \
             dp {}), {steps} steps of {} tokens; data {data_name}",
            s.name,
            s.parallel.tp,
            s.parallel.pp,
            s.parallel.dp,
            s.tokens_per_step()
        );
    } else if !args.json {
        println!(
            "Training {} on GPU {ordinal} ({} rank{}: tp {} · pp {} · dp {}), {steps} steps of {} tokens; data {data_name}{}",
            s.name,
            plan.grid.ranks(),
            if plan.grid.ranks() == 1 { "" } else { "s on one GPU" },
            s.parallel.tp,
            s.parallel.pp,
            s.parallel.dp,
            s.tokens_per_step(),
            entropy.map_or(String::new(), |h| format!(", entropy rate {h:.4} nats/token (the best loss possible)"))
        );
    }
    let opts = TrainOptions {
        steps,
        data_name,
        checkpoint: None,
        exec: ExecConfig { recv_timeout: Duration::from_secs(args.timeout.max(1)), trace_step: steps.checked_sub(1) },
        faults: Vec::new(),
    };
    let bar = progress_bar(steps as u64, args.json);
    let quiet = args.json;
    let mut progress = |r: &StepRecord| {
        bar.set_position(r.step as u64 + 1);
        if !quiet {
            bar.suspend(|| println!("step {:>5}  loss {:.4}  {:>10.0} tokens/s", r.step, r.loss, r.tokens_per_s));
        }
    };
    let plan = Arc::new(plan);
    let timeout = Duration::from_secs(args.timeout.max(1));
    let run = match node {
        Some(_) => train_node(plan.clone(), Arc::new(corpus), &opts, timeout, Some(&mut progress)),
        None => train_cuda(plan.clone(), ordinal, Arc::new(corpus), &opts, Some(&mut progress)),
    };
    bar.finish_and_clear();
    let (result, gpu) = run.map_err(|e| match e {
        TrainError::Setup(_) | TrainError::Checkpoint(_) => anyhow::Error::new(e),
        other => anyhow::Error::new(RunFailure(other.to_string())),
    })?;
    if let Some(dir) = &args.out {
        write_run(dir, &plan, &result)?;
    }
    if args.json {
        return common::print_json(&serde_json::json!({
            "scenario": s.name, "backend": "cuda", "gpu": gpu, "gpus": node.unwrap_or(1), "steps": result.steps,
            "memory": result.memory,
        }));
    }
    match node {
        Some(n) => println!("{n} GPUs, one rank each (GPU 0: {gpu}); every rank's trace and memory"),
        None => println!("GPU {ordinal}: {gpu}"),
    }
    summary(&result, args.out.as_deref());
    Ok(())
}

/// A GPU run's outputs under `dir`: the records (`write_outputs`) and the CUDA-event trace
/// as a Chrome trace, when there is one.
pub fn write_run(dir: &std::path::Path, plan: &strata_models::plan::Plan, result: &TrainResult) -> anyhow::Result<()> {
    write_outputs(dir, plan, result)
        .map_err(|e| RunFailure(format!("writing the outputs to {}: {e}", dir.display())))?;
    if let Some(trace) = &result.trace {
        common::write_file(&dir.join("trace.json"), strata_reports::chrome_trace_json(plan, trace))?;
    }
    Ok(())
}
