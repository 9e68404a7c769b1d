//! `strata collbench`: nccl-tests in simulation — sweep message sizes for one collective
//! over N ranks of a cluster and print time, algorithm and bus bandwidth per size, with the
//! algorithm and protocol NCCL's tuning model picks.
//!
//! `--algo` / `--proto` force a choice as NCCL_ALGO / NCCL_PROTO do. Where NCCL could not
//! run the forced one (NVLS on a GPU without NVLink SHARP, tree for an all-gather, …), the
//! model falls back as NCCL would; collbench refuses that (exit 2, naming the sizes and
//! what ran instead) unless `--allow-fallback`, which keeps the rows and says so.
//!
//! `--json` prints one object: `cluster`, `op`, `ranks`, `network`, the forced `algo` and
//! `proto`, `fallbacks` (sizes that did not run what was forced), `units`, and `rows`
//! (`size_bytes`, `time_us`, `algbw_GBps`, `busbw_GBps`, `algorithm`, `protocol`).
//!
//! `--fit LOG` reads a real nccl-tests run across nodes and fits the cluster's
//! `nic_efficiency` (the share of NIC line rate NCCL reaches) to its bandwidth-bound sizes
//! (`strata_sim::net::nic_fit`): it prints the figure, each size's measured and simulated
//! busbw, and the line to put in the cluster's TOML.

use std::path::Path;

use anyhow::{Context, bail};
use strata_models::ClusterSpec;
use strata_sim::net::NetworkKind;
use strata_sim::net::collbench::{self, BenchOp, BenchRow};
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
    /// Ranks taking part (the first N GPUs of the cluster); with --fit, the log's when it
    /// lists them.
    #[arg(long, required_unless_present = "fit")]
    pub ranks: Option<u32>,
    /// Smallest message, bytes (suffixes K, M, G are powers of 1024, as nccl-tests reads them).
    #[arg(long, default_value = "8")]
    pub min: String,
    /// Largest message.
    #[arg(long, default_value = "8G")]
    pub max: String,
    /// Network model: fabric (NCCL's choice on the fat-tree, max-min sharing) or closed-form.
    #[arg(long, default_value = "fabric")]
    pub network: String,
    /// Force an algorithm as NCCL_ALGO does: ring, tree, nvls, nvls-tree, pat, collnet-direct,
    /// collnet-chain (case and dashes do not matter: nvlstree, NVLS_TREE are nvls-tree).
    #[arg(long)]
    pub algo: Option<String>,
    /// Force a protocol as NCCL_PROTO does: LL, LL128, Simple.
    #[arg(long)]
    pub proto: Option<String>,
    /// Disable NVLink SHARP (NCCL_NVLS_ENABLE=0).
    #[arg(long)]
    pub no_nvls: bool,
    /// Where NCCL cannot run the forced --algo/--proto, show what it falls back to (with a
    /// note) instead of refusing.
    #[arg(long)]
    pub allow_fallback: bool,
    /// Seed of the fabric's static-routing hashes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fit the cluster's nic_efficiency to a real nccl-tests log across nodes (its stdout,
    /// mpirun prefixes allowed): the ranks and operation come from the log where it names
    /// them (else --ranks, --op), and sizes from --fit-min up count. Prints the figure to set
    /// as `nic_efficiency` in the cluster's TOML, and each size's measured and simulated busbw.
    #[arg(long, value_name = "LOG")]
    pub fit: Option<std::path::PathBuf>,
    /// The smallest size --fit uses (smaller messages are bound by latency, not the NIC).
    #[arg(long, default_value = "64M")]
    pub fit_min: String,
    /// Print the rows as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The largest nccl-tests log `--fit` reads (docs/limits.md).
pub const MAX_FIT_LOG_BYTES: u64 = 16 << 20;

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

fn cluster(args: &Args, ranks: u32) -> anyhow::Result<ClusterSpec> {
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
        None if Path::new(&args.cluster).exists() => c.nodes.max(ranks.div_ceil(c.gpus_per_node)),
        None => ranks.div_ceil(c.gpus_per_node).max(1),
    };
    c.check().map_err(|e| anyhow::anyhow!(e))?;
    Ok(c)
}

/// A name as NCCL_ALGO / NCCL_PROTO read it: case, `-` and `_` do not matter.
fn loose(name: &str) -> String {
    name.chars().filter(|c| !matches!(c, '-' | '_')).collect::<String>().to_ascii_lowercase()
}

/// `--algo`: the names help prints, and the same without dashes (nvlstree).
pub fn parse_algo(a: &str) -> anyhow::Result<Algo> {
    ALGOS
        .iter()
        .copied()
        .find(|x| loose(x.key()) == loose(a))
        .with_context(|| format!("--algo {a:?} is not an NCCL algorithm; known: {}", ALGOS.map(Algo::key).join(", ")))
}

fn parse_proto(p: &str) -> anyhow::Result<Proto> {
    PROTOS
        .iter()
        .copied()
        .find(|x| loose(x.key()) == loose(p))
        .with_context(|| format!("--proto {p:?} is not an NCCL protocol; known: {}", PROTOS.map(Proto::key).join(", ")))
}

fn env(args: &Args) -> anyhow::Result<NcclEnv> {
    let mut env = NcclEnv::default();
    if let Some(a) = &args.algo {
        env.algos = vec![parse_algo(a)?];
    }
    if let Some(p) = &args.proto {
        env.protos = vec![parse_proto(p)?];
    }
    env.nvls_enable = !args.no_nvls;
    Ok(env)
}

/// When NCCL runs an algorithm (the rules of its tuner, in words), for a refusal's message.
fn algo_rule(a: Algo) -> &'static str {
    match a {
        Algo::Nvls => {
            "NVLS needs NVLink SHARP (NVSwitch nodes of H100 class or newer) and NCCL_NVLS_ENABLE (no --no-nvls)"
        }
        Algo::NvlsTree => {
            "NVLSTree needs NVLink SHARP (H100-class NVSwitch nodes), NCCL_NVLS_ENABLE and more than one node"
        }
        Algo::Tree => "tree runs all-reduce only",
        Algo::Pat => "PAT runs all-gather and reduce-scatter with one GPU per node",
        Algo::CollNetDirect | Algo::CollNetChain => "CollNet needs in-network reduction (SHARP switches), which is off",
        Algo::Ring => "ring runs every collective; only point-to-point operations (alltoall, sendrecv) do not use it",
    }
}

/// The sizes (first and last) whose rows did not run what was forced, and what ran.
fn fallbacks(args: &Args, ranks: u32, rows: &[BenchRow]) -> anyhow::Result<Vec<String>> {
    let algo = args.algo.as_deref().map(parse_algo).transpose()?;
    let proto = args.proto.as_deref().map(parse_proto).transpose()?;
    let mut out = Vec::new();
    let mut add = |what: String, bad: Vec<&BenchRow>, rule: &str| {
        if let (Some(first), Some(last)) = (bad.first(), bad.last()) {
            let ran: std::collections::BTreeSet<String> =
                bad.iter().map(|r| format!("{}/{}", r.algorithm, r.protocol)).collect();
            out.push(format!(
                "{what} is not possible for {} over {} ranks at {} of {} sizes ({}–{} bytes): {} ran instead ({rule})",
                args.op,
                ranks,
                bad.len(),
                rows.len(),
                first.size_bytes,
                last.size_bytes,
                ran.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    };
    if let Some(a) = algo {
        let bad: Vec<&BenchRow> = rows.iter().filter(|r| r.algorithm != a.key()).collect();
        add(format!("--algo {}", a.key()), bad, algo_rule(a));
    }
    if let Some(p) = proto {
        let bad: Vec<&BenchRow> = rows.iter().filter(|r| r.protocol != p.key()).collect();
        add(format!("--proto {}", p.key()), bad, "not enabled for this algorithm and size");
    }
    Ok(out)
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    let op = BenchOp::from_key(&args.op).with_context(|| {
        format!("--op {:?} is not one of all_reduce, all_gather, reduce_scatter, alltoall, sendrecv", args.op)
    })?;
    if let Some(path) = args.fit.clone() {
        return fit(&mut args, op, &path);
    }
    let ranks = args.ranks.context("--ranks is needed without --fit")?;
    let (min, max) = (size(&args.min)?, size(&args.max)?);
    if min > max {
        bail!("--min {} is larger than --max {}", args.min, args.max);
    }
    if ranks < 2 {
        bail!("--ranks {ranks}: a collective needs at least 2 ranks");
    }
    let kind = match args.network.as_str() {
        "fabric" => NetworkKind::Fabric,
        "closed-form" => NetworkKind::ClosedForm,
        other => bail!("--network {other:?}: use fabric or closed-form"),
    };
    let c = cluster(&args, ranks)?;
    let rows = collbench::sweep_cluster(&c, args.seed, kind, &env(&args)?, op, ranks, min, max)?;
    let fell_back = fallbacks(&args, ranks, &rows)?;
    if !fell_back.is_empty() && !args.allow_fallback {
        bail!("{}; drop the forced choice, or pass --allow-fallback to see what NCCL would run", fell_back.join("; "));
    }
    if args.json {
        return common::print_json(&serde_json::json!({
            "cluster": {
                "name": c.name,
                "gpu": c.gpu.key(),
                "nodes": c.nodes,
                "gpus_per_node": c.gpus_per_node,
                "nics_per_node": c.nics_per_node,
                "nic_Gbps": c.nic_gbps,
                "nic_efficiency": c.nic_efficiency,
                "fabric": format!("{:?}", c.fabric),
            },
            "op": op.key(),
            "ranks": ranks,
            "network": args.network,
            "algo": args.algo.as_deref().map(parse_algo).transpose()?.map(Algo::key),
            "proto": args.proto.as_deref().map(parse_proto).transpose()?.map(Proto::key),
            "nvls_enable": !args.no_nvls,
            "fallbacks": fell_back,
            "units": {
                "size_bytes": "bytes (the whole buffer, as nccl-tests' size)",
                "time_us": "microseconds",
                "algbw_GBps": "GB/s, 1e9 bytes per second: size / time",
                "busbw_GBps": "GB/s, 1e9 bytes per second: algbw × nccl-tests' bus factor",
                "nic_Gbps": "Gb/s, 1e9 bits per second per NIC",
                "nic_efficiency": "share of nic_Gbps NCCL's network transport reaches (1 on InfiniBand / RoCE)",
            },
            "rows": rows,
        }));
    }
    let efficiency =
        if c.nic_efficiency < 1.0 { format!(" at {:.0}% efficiency", c.nic_efficiency * 100.0) } else { String::new() };
    println!(
        "# cluster {}: {} nodes × {} {}, {} NICs × {} Gb/s{efficiency}, {:?}",
        c.name, c.nodes, c.gpus_per_node, c.gpu, c.nics_per_node, c.nic_gbps, c.fabric
    );
    for note in &fell_back {
        println!("# note: {note}");
    }
    print!("{}", collbench::format_table(op, ranks, &rows));
    Ok(())
}

/// `--fit LOG`: the cluster's `nic_efficiency` from a real nccl-tests run across nodes.
fn fit(args: &mut Args, op: BenchOp, path: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    use strata_sim::net::nic_fit;
    if args.algo.is_some() || args.proto.is_some() || args.no_nvls || args.network != "fabric" {
        bail!("--fit fits with NCCL's own choice on the fabric network: drop --algo, --proto, --no-nvls and --network");
    }
    let file = std::fs::File::open(path).with_context(|| format!("--fit {}: cannot open it", path.display()))?;
    let mut text = String::new();
    file.take(MAX_FIT_LOG_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("--fit {}: not a readable text file", path.display()))?;
    if text.len() as u64 > MAX_FIT_LOG_BYTES {
        bail!(
            "--fit {}: the log is over {} MiB, the limit (see docs/limits.md); keep one test's output",
            path.display(),
            MAX_FIT_LOG_BYTES >> 20
        );
    }
    let log = nic_fit::parse_nccl_tests(&text).map_err(|e| anyhow::anyhow!("--fit {}: {e}", path.display()))?;
    let op = match log.op {
        Some(o) if args.op != "all_reduce" && o != op => {
            bail!("--op {} but the log ran {}_perf: drop --op, or give the log of {}_perf", op.key(), o.key(), op.key())
        }
        Some(o) => o,
        None => op,
    };
    let ranks = match (log.ranks, args.ranks) {
        (Some(l), Some(r)) if l != r => {
            bail!("--ranks {r} but the log lists {l} ranks (its \"#  Rank N Group\" lines): drop --ranks")
        }
        (Some(l), _) => l,
        (None, Some(r)) => r,
        (None, None) => bail!("the log lists no \"#  Rank N Group\" lines: say how many ranks ran it with --ranks"),
    };
    args.ranks = Some(ranks);
    let c = cluster(args, ranks)?;
    let min = size(&args.fit_min)?;
    let f = nic_fit::fit_log(&c, op, ranks, &log.rows, min).map_err(|e| anyhow::anyhow!("--fit: {e}"))?;
    let residual = |m: f64, x: f64| (m / x - 1.0) * 100.0;
    if args.json {
        return common::print_json(&serde_json::json!({
            "cluster": c.name,
            "op": op.key(),
            "ranks": ranks,
            "nodes": ranks.div_ceil(c.gpus_per_node),
            "nic_Gbps": c.nic_gbps,
            "nic_efficiency": f.efficiency,
            "fit_min_bytes": min,
            "rows": f.residuals.iter().map(|(r, m)| serde_json::json!({
                "size_bytes": r.bytes,
                "measured_busbw_GBps": r.busbw_gbps,
                "simulated_busbw_GBps": m,
                "residual_pct": residual(*m, r.busbw_gbps),
            })).collect::<Vec<_>>(),
        }));
    }
    println!(
        "# {} over {ranks} ranks ({} nodes of {}, {} NICs × {} Gb/s): {} sizes of at least {min} bytes",
        op.key(),
        ranks.div_ceil(c.gpus_per_node),
        c.name,
        c.nics_per_node,
        c.nic_gbps,
        f.residuals.len()
    );
    println!("#  size_bytes   measured   simulated  residual   (busbw, GB/s)");
    for (r, m) in &f.residuals {
        println!("{:>12} {:>10.2} {:>11.2} {:>+8.1}%", r.bytes, r.busbw_gbps, m, residual(*m, r.busbw_gbps));
    }
    println!("nic_efficiency = {:.2}   # put this line in the cluster's [cluster] table", f.efficiency);
    if f.efficiency >= 1.0 {
        println!("# the log reaches the simulator's full line-rate figure: 1.0 is the most the key takes");
    }
    Ok(())
}
