//! `strata probe`: this machine as a cluster TOML (`strata_runtime::probe` finds the GPUs,
//! the RDMA ports and the launcher's job shape). The file is written whenever what was found
//! is a cluster Strata can load — on a machine without a GPU it describes the CPU host —
//! and the exit code then says whether GPUs were found (0) or not (2, "no GPU found" /
//! "built without CUDA", as every `--backend cuda` path answers).

use std::path::PathBuf;

use anyhow::bail;
use strata_runtime::probe;

use crate::common;

/// What `--help` says after the options: where the figures come from, and the exit codes.
const AFTER_HELP: &str = "GPUs are read in a build with `--features cuda`, RDMA ports in one with `--features ibverbs`; \
nodes from SLURM_NNODES / SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE or WORLD_SIZE / \
LOCAL_WORLD_SIZE. What one node cannot see (the fabric, its switches) is written with defaults, and the file's comments \
say what was found and what was assumed.

Exit codes:
  0  GPUs found, the file written (no RDMA device is only a note: one node needs none)
  2  no GPU found, or built without CUDA: the file is still written, describing the
     CPU host (gpu = \"cpu\"); or what was found is not a cluster Strata can load (a GPU
     outside the catalog, two GPU models, several nodes without NICs, a launcher
     variable that is not a count): nothing is written
  1  the file could not be written";

#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// Where to write the cluster TOML [default: print it].
    #[arg(long, value_name = "CLUSTER.toml")]
    pub out: Option<PathBuf>,
    /// Print what was found and the cluster as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let machine = probe::probe();
    let found = machine.cluster().map_err(anyhow::Error::msg)?;
    let text = found.toml();
    match &args.out {
        Some(path) => common::write_file(path, &text)?,
        None if !args.json => print!("{text}"),
        None => {}
    }
    if args.json {
        common::print_json(&serde_json::json!({
            "machine": machine,
            "cluster": found.cluster,
            "notes": found.notes,
            "out": args.out,
        }))?;
    } else if let Some(path) = &args.out {
        for n in &found.notes {
            println!("{n}");
        }
        println!(
            "wrote {} (a [cluster] table; `strata collbench --cluster {}` reads it)",
            path.display(),
            path.display()
        );
    }
    let wrote = match &args.out {
        Some(p) => format!("wrote {}, which describes the CPU host", p.display()),
        None => "the cluster printed describes the CPU host".into(),
    };
    match &machine.gpus {
        Ok(g) if !g.is_empty() => Ok(()),
        Ok(_) => bail!("no GPU found: the CUDA driver sees no GPU on this machine; {wrote}"),
        Err(e) if e.starts_with("built without CUDA") => bail!("strata was {e}; {wrote}"),
        Err(e) => bail!("{e}; {wrote}"),
    }
}
