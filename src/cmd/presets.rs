//! `strata presets`: the built-in models, GPUs and clusters a scenario can name.

use serde::Serialize;
use strata_models::cluster::CLUSTER_PRESETS;
use strata_models::hardware::GPU_KINDS;
use strata_models::model::MODEL_PRESETS;
use strata_models::{ClusterSpec, GpuSpec, ModelSpec};

use crate::common;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the catalog as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Catalog {
    models: Vec<ModelSpec>,
    gpus: Vec<GpuSpec>,
    clusters: Vec<ClusterSpec>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = Catalog {
        models: MODEL_PRESETS.iter().filter_map(|n| ModelSpec::preset(n)).collect(),
        gpus: GPU_KINDS.iter().map(|k| k.spec()).collect(),
        clusters: CLUSTER_PRESETS.iter().filter_map(|n| ClusterSpec::preset(n)).collect(),
    };
    if args.json {
        return common::print_json(&catalog);
    }
    println!("Models ([model] preset = \"…\"):");
    for m in &catalog.models {
        println!(
            "  {:<14} {:?}, {:>3} layers, hidden {:>5}, {:>3} heads ({:>3} kv){}, ffn {:>6}, vocab {:>6}, seq {:>5} — {} parameters",
            m.name,
            m.family,
            m.layers,
            m.hidden,
            m.heads,
            m.kv_heads,
            m.head_dim.map(|d| format!(" of {d}")).unwrap_or_default(),
            m.ffn_hidden,
            m.vocab,
            m.seq_len,
            common::count(strata_models::accounting::params::total_params(m) as f64)
        );
    }
    println!("\nGPUs ([cluster] gpu = \"…\"):");
    for g in &catalog.gpus {
        println!(
            "  {:<10} {:<16} {:>7.1} TFLOP/s bf16, {:>6.1} fp32, {:>10} HBM at {:>5.0} GB/s, NVLink {:>4.0} GB/s per direction, {} SMs",
            g.kind.key(),
            g.name,
            g.bf16_tflops,
            g.fp32_tflops,
            common::bytes(g.hbm_bytes as f64),
            g.hbm_bw_bytes_per_s / 1e9,
            g.nvlink_bw_bytes_per_s / 1e9,
            g.sm_count
        );
    }
    println!("\nClusters ([cluster] preset = \"…\"; set nodes = N to scale):");
    for c in &catalog.clusters {
        let share = if c.nic_efficiency < 1.0 {
            format!(" (NCCL reaches {:.0}% of it)", c.nic_efficiency * 100.0)
        } else {
            String::new()
        };
        println!(
            "  {:<10} {} × {} per node, {} NICs × {} Gb/s{share}, {:?} fabric, {:?} routing",
            c.name, c.gpus_per_node, c.gpu, c.nics_per_node, c.nic_gbps, c.fabric, c.routing
        );
    }
    Ok(())
}
