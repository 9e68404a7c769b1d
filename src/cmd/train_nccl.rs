//! `mpirun -n N strata train --backend cuda …`: one process per GPU, their collectives and
//! pipeline messages through NCCL (`strata_runtime::cuda::exec::nccl`). A process started
//! by an MPI launcher as one of N > 1 ([`mpi_world`]) trains its rank of the plan on its
//! node's GPU (the launcher's local rank), the NCCL id broadcast over MPI from rank 0; the
//! cluster is sized to N ranks unless `--ranks` says otherwise, and N must equal
//! tp · pp · dp. Rank 0 prints the loss per step (the job's, gathered) and writes `--out`
//! with its own rank's trace and memory; a failing rank prints an error naming itself and
//! ends the job (`MPI_Abort`: exit 2 for bad input, 1 for a failed run), so no peer waits. Needs a build with `--features cuda,mpi`; a build without MPI
//! says so (exit 2).

use std::sync::Arc;

use strata_models::plan::Plan;
use strata_runtime::data::Corpus;
use strata_runtime::train::TrainOptions;

use super::train::Args;

/// The job size an MPI launcher gave this process (Open MPI's, MPICH/PMI's or PMIx's
/// variable), if it was started by one.
pub fn mpi_world(env: impl Fn(&str) -> Option<String>) -> Option<u32> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"].iter().find_map(|v| env(v)?.trim().parse().ok())
}

/// Trains this process's rank of `plan` (a job of `world` processes).
#[cfg(feature = "mpi")]
pub fn run(args: &Args, plan: Arc<Plan>, corpus: Corpus, opts: &TrainOptions, world: u32) -> anyhow::Result<()> {
    use std::time::Duration;
    use strata_runtime::cuda::exec::nccl_gpu::MpiBootstrap;
    use strata_runtime::cuda::exec::train_nccl::train_nccl;
    use strata_runtime::cuda::nccl_comm::Bootstrap;
    use strata_runtime::train::{StepRecord, TrainError};

    use crate::common;

    let _universe = strata_runtime::comm::mpi::init().map_err(|e| anyhow::anyhow!("starting MPI: {e}"))?;
    let mut boot = MpiBootstrap::world();
    let rank = boot.rank();
    if boot.size() != world {
        anyhow::bail!("the launcher says {world} processes but MPI_COMM_WORLD has {}", boot.size());
    }
    let quiet = args.json || rank != 0;
    let mut progress = |r: &StepRecord| {
        if !quiet {
            println!("step {:>5}  loss {:.4}  {:>10.0} tokens/s", r.step, r.loss, r.tokens_per_s);
        }
    };
    let timeout = Duration::from_secs(args.timeout.max(1));
    let run = train_nccl(plan.clone(), Arc::new(corpus), &mut boot, opts, timeout, Some(&mut progress));
    let (result, gpu) = match run {
        Ok(r) => r,
        Err(e) => {
            // This rank ends the job: returning would leave its peers waiting in MPI (or
            // NCCL) forever. Bad input exits 2, a failed run 1, as everywhere.
            let code = match e {
                TrainError::Setup(_) | TrainError::Checkpoint(_) => 2,
                _ => 1,
            };
            eprintln!("error: rank {rank}: {e}");
            boot.abort(code)
        }
    };
    if rank != 0 {
        return Ok(());
    }
    if let Some(dir) = &args.out {
        super::train_cuda::write_run(dir, &plan, &result)?;
    }
    if args.json {
        return common::print_json(&serde_json::json!({
            "scenario": plan.scenario.name, "backend": "cuda", "processes": world, "gpu": gpu,
            "steps": result.steps, "memory": result.memory,
        }));
    }
    println!("{world} processes, one GPU each (rank 0: {gpu}); rank 0's trace and memory");
    super::train::summary(&result, args.out.as_deref());
    Ok(())
}

/// A build without MPI cannot join the job: exit 2, naming the build that can.
#[cfg(not(feature = "mpi"))]
pub fn run(_: &Args, _: Arc<Plan>, _: Corpus, _: &TrainOptions, world: u32) -> anyhow::Result<()> {
    anyhow::bail!(
        "started by an MPI launcher as one of {world} processes, but this strata was built without MPI: one process \
         per GPU needs `cargo build --release --features cuda,mpi` (libopenmpi-dev); or run one process, every rank \
         on one GPU (strata train --backend cuda without mpirun)"
    )
}

#[cfg(test)]
mod tests {
    use super::mpi_world;

    #[test]
    fn the_job_size_comes_from_the_mpi_launcher() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        assert_eq!(mpi_world(env(&[("OMPI_COMM_WORLD_SIZE", "8")])), Some(8));
        assert_eq!(mpi_world(env(&[("PMI_SIZE", "4")])), Some(4));
        assert_eq!(
            mpi_world(env(&[("SLURM_NTASKS", "4")])),
            None,
            "srun without MPI's PMI is not a job of processes here"
        );
        assert_eq!(mpi_world(env(&[])), None);
    }
}
