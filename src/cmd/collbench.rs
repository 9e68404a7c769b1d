//! `strata collbench`: nccl-tests in simulation — sweep message sizes for one collective
//! over N ranks of a cluster and print time, algorithm and bus bandwidth per size, with the
//! algorithm and protocol NCCL's tuning model picks.

use std::path::Path;

use anyhow::{Context, bail};
use strata_models::ClusterSpec;
use strata_sim::net::NetworkKind;
use strata_sim::net::collbench::{self, BenchOp};
use strata_sim::net::nccl::{ALGOS, Algo, NcclEnv, PROTOS, Proto};

use crate::common;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A cluster preset (dgx-a100, dgx-h100, …) or a TOML file with a [cluster] table.
    #[arg(long)]
    pub cluster: String,
    /// Nodes of the cluster (default: as many as the ranks need).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// all_reduce | all_gather | reduce_scatter | alltoall | sendrecv
    #[arg(long, default_value = "all_reduce")]
    pub op: String,
    /// Ranks taking part (the first N GPUs of the cluster).
    #[arg(long)]
    pub ranks: u32,
    /// Smallest message, bytes (suffixes K, M, G are powers of 1024, as nccl-tests reads them).
    #[arg(long, default_value = "8")]
    pub min: String,
    /// Largest message.
    #[arg(long, default_value = "8G")]
    pub max: String,
    /// Network model: fabric (NCCL's choice on the fat-tree, max-min sharing) or closed-form.
    #[arg(long, default_value = "fabric")]
    pub network: String,
    /// Force an algorithm as NCCL_ALGO does: ring, tree, nvls, nvlstree, pat.
    #[arg(long)]
    pub algo: Option<String>,
    /// Force a protocol as NCCL_PROTO does: LL, LL128, Simple.
    #[arg(long)]
    pub proto: Option<String>,
    /// Disable NVLink SHARP (NCCL_NVLS_ENABLE=0).
    #[arg(long)]
    pub no_nvls: bool,
    /// Seed of the fabric's static-routing hashes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parses `8`, `64K`, `8M`, `8G` (powers of 1024).
fn size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 =
        num.parse().with_context(|| format!("size {text:?} is not a number of bytes (like 8, 64K, 8M, 8G)"))?;
    n.checked_mul(mult).filter(|b| *b > 0).with_context(|| format!("size {text:?} must be between 1 byte and 2^64"))
}

fn cluster(args: &Args) -> anyhow::Result<ClusterSpec> {
    let mut c = match ClusterSpec::preset(&args.cluster) {
        Some(c) => c,
        None if Path::new(&args.cluster).exists() => strata_models::scenario::load_cluster(Path::new(&args.cluster))?,
        None => bail!(
            "--cluster {:?} is neither a preset ({}) nor a file",
            args.cluster,
            strata_models::cluster::CLUSTER_PRESETS.join(", ")
        ),
    };
    c.nodes = match args.nodes {
        Some(n) => n,
        None if Path::new(&args.cluster).exists() => c.nodes.max(args.ranks.div_ceil(c.gpus_per_node)),
        None => args.ranks.div_ceil(c.gpus_per_node).max(1),
    };
    c.check().map_err(|e| anyhow::anyhow!(e))?;
    Ok(c)
}

fn env(args: &Args) -> anyhow::Result<NcclEnv> {
    let mut env = NcclEnv::default();
    if let Some(a) = &args.algo {
        let algo = ALGOS.iter().copied().find(|x| x.key().eq_ignore_ascii_case(a)).with_context(|| {
            format!("--algo {a:?} is not an NCCL algorithm; known: {}", ALGOS.map(Algo::key).join(", "))
        })?;
        env.algos = vec![algo];
    }
    if let Some(p) = &args.proto {
        let proto = PROTOS.iter().copied().find(|x| x.key().eq_ignore_ascii_case(p)).with_context(|| {
            format!("--proto {p:?} is not an NCCL protocol; known: {}", PROTOS.map(Proto::key).join(", "))
        })?;
        env.protos = vec![proto];
    }
    env.nvls_enable = !args.no_nvls;
    Ok(env)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let op = BenchOp::from_key(&args.op).with_context(|| {
        format!("--op {:?} is not one of all_reduce, all_gather, reduce_scatter, alltoall, sendrecv", args.op)
    })?;
    let (min, max) = (size(&args.min)?, size(&args.max)?);
    if min > max {
        bail!("--min {} is larger than --max {}", args.min, args.max);
    }
    if args.ranks < 2 {
        bail!("--ranks {}: a collective needs at least 2 ranks", args.ranks);
    }
    let kind = match args.network.as_str() {
        "fabric" => NetworkKind::Fabric,
        "closed-form" => NetworkKind::ClosedForm,
        other => bail!("--network {other:?}: use fabric or closed-form"),
    };
    let c = cluster(&args)?;
    let rows = collbench::sweep_cluster(&c, args.seed, kind, &env(&args)?, op, args.ranks, min, max)?;
    if args.json {
        return common::print_json(&rows);
    }
    println!(
        "# cluster {}: {} nodes × {} {}, {} NICs × {} Gb/s, {:?}",
        c.name, c.nodes, c.gpus_per_node, c.gpu, c.nics_per_node, c.nic_gbps, c.fabric
    );
    print!("{}", collbench::format_table(op, args.ranks, &rows));
    Ok(())
}
