//! nccl-tests in simulation: sweep message sizes for one collective over N ranks on an
//! idle [`Network`] and report time, algorithm bandwidth and bus bandwidth per size.
//!
//! As NVIDIA/nccl-tests doc/PERFORMANCE.md: S is the whole buffer (per-rank count × n for
//! all-gather / reduce-scatter / all-to-all), algbw = S / t, busbw = algbw × factor with
//! factor 2(n−1)/n for all-reduce, (n−1)/n for all-gather, reduce-scatter and all-to-all, 1
//! for send/recv. Send/recv is nccl-tests' sendrecv: every rank sends S to rank+1 and
//! receives from rank−1 at once; t is when the last one finishes. Sizes go from min to
//! max in ×2 steps. GB/s = 1e9 bytes/s.

use serde::{Deserialize, Serialize};
use strata_models::ClusterSpec;
use strata_models::plan::CollKind;

use super::{CommKind, CommRequest, NcclEnv, NetError, Network, NetworkKind};

/// The operation of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchOp {
    AllReduce,
    AllGather,
    ReduceScatter,
    Alltoall,
    Sendrecv,
}

impl BenchOp {
    /// nccl-tests' binary name without `_perf`.
    pub fn key(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Alltoall => "alltoall",
            BenchOp::Sendrecv => "sendrecv",
        }
    }

    /// Parses "all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv".
    pub fn from_key(key: &str) -> Option<BenchOp> {
        [BenchOp::AllReduce, BenchOp::AllGather, BenchOp::ReduceScatter, BenchOp::Alltoall, BenchOp::Sendrecv]
            .into_iter()
            .find(|op| op.key() == key)
    }

    /// nccl-tests' bus-bandwidth factor for n ranks.
    pub fn bus_factor(self, n: u32) -> f64 {
        let n = n.max(1) as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::Alltoall => (n - 1.0) / n,
            BenchOp::Sendrecv => 1.0,
        }
    }
}

/// One line of a sweep. Bandwidths are GB/s (1e9 bytes per second, as nccl-tests prints
/// them), which JSON spells `algbw_GBps` / `busbw_GBps` so that they cannot be read as the
/// cluster's `nic_gbps` (gigabits per second).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub size_bytes: u64,
    pub time_us: f64,
    /// GB/s (bytes).
    #[serde(rename = "algbw_GBps")]
    pub algbw_gbps: f64,
    /// GB/s (bytes).
    #[serde(rename = "busbw_GBps")]
    pub busbw_gbps: f64,
    pub algorithm: String,
    pub protocol: String,
}

/// Requests that make up one measurement of `op` at `bytes` over `ranks`.
fn requests(op: BenchOp, ranks: &[u32], bytes: u64) -> Vec<CommRequest> {
    let coll = |k| vec![CommRequest { kind: CommKind::Collective(k), ranks: ranks.to_vec(), bytes, multiplicity: 1 }];
    match op {
        BenchOp::AllReduce => coll(CollKind::AllReduce),
        BenchOp::AllGather => coll(CollKind::AllGather),
        BenchOp::ReduceScatter => coll(CollKind::ReduceScatter),
        BenchOp::Alltoall => coll(CollKind::AllToAll),
        BenchOp::Sendrecv => (0..ranks.len())
            .map(|i| CommRequest {
                kind: CommKind::SendRecv,
                ranks: vec![ranks[i], ranks[(i + 1) % ranks.len()]],
                bytes,
                multiplicity: 1,
            })
            .collect(),
    }
}

/// Sweeps `op` over `ranks` on an idle `net`, sizes min..=max in ×2 steps. Time starts at
/// `start_ns` (networks only move forward) and each size runs alone after the previous one.
pub fn sweep(
    net: &mut dyn Network,
    start_ns: u64,
    op: BenchOp,
    ranks: &[u32],
    min_bytes: u64,
    max_bytes: u64,
) -> Vec<BenchRow> {
    assert!(min_bytes > 0 && min_bytes <= max_bytes, "sizes {min_bytes}..{max_bytes}");
    let n = ranks.len() as u32;
    let mut rows = Vec::new();
    let mut now = start_ns;
    let mut size = min_bytes;
    while size <= max_bytes {
        let reqs = requests(op, ranks, size);
        let choice = net.choice(&reqs[0]);
        let ids: Vec<_> = reqs.iter().map(|r| net.start(now, r)).collect();
        let mut left = ids.len();
        let t0 = now;
        while left > 0 {
            let t = net.next_completion_ns().expect("started requests complete");
            left -= net.advance(t).len();
            now = t;
        }
        let time_us = (now - t0) as f64 / 1e3;
        let algbw_gbps = if time_us > 0.0 { size as f64 / (time_us * 1e3) } else { f64::INFINITY };
        rows.push(BenchRow {
            size_bytes: size,
            time_us,
            algbw_gbps,
            busbw_gbps: algbw_gbps * op.bus_factor(n),
            algorithm: choice.algorithm,
            protocol: choice.protocol,
        });
        size = match size.checked_mul(2) {
            Some(s) => s,
            None => break,
        };
    }
    rows
}

/// Sweeps `op` over the first `n_ranks` ranks of `cluster` on a fresh network of `kind`.
#[allow(clippy::too_many_arguments)]
pub fn sweep_cluster(
    cluster: &ClusterSpec,
    seed: u64,
    kind: NetworkKind,
    env: &NcclEnv,
    op: BenchOp,
    n_ranks: u32,
    min_bytes: u64,
    max_bytes: u64,
) -> Result<Vec<BenchRow>, NetError> {
    let total = cluster.gpus();
    if n_ranks == 0 || n_ranks as u64 > total {
        return Err(NetError::Cluster(format!("collbench over {n_ranks} ranks: the cluster has {total} GPUs")));
    }
    let mut net = super::build_with(cluster, seed, kind, env)?;
    let ranks: Vec<u32> = (0..n_ranks).collect();
    Ok(sweep(net.as_mut(), 0, op, &ranks, min_bytes, max_bytes))
}

/// An nccl-tests-style table of `rows`.
pub fn format_table(op: BenchOp, n_ranks: u32, rows: &[BenchRow]) -> String {
    let mut s = format!("# {}: {} ranks (simulated)\n", op.key(), n_ranks);
    s += &format!(
        "# {:>12} {:>12} {:>10} {:>9} {:>9}  {:<9} {:<6}\n",
        "size", "count", "time", "algbw", "busbw", "algo", "proto"
    );
    s += &format!("# {:>12} {:>12} {:>10} {:>9} {:>9}\n", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)");
    for r in rows {
        s += &format!(
            "  {:>12} {:>12} {:>10.2} {:>9.2} {:>9.2}  {:<9} {:<6}\n",
            r.size_bytes,
            r.size_bytes / 4,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.algorithm,
            r.protocol
        );
    }
    if let Some(big) = rows.last() {
        let avg = rows.iter().map(|r| r.busbw_gbps).sum::<f64>() / rows.len() as f64;
        s += &format!("# Avg bus bandwidth    : {avg:.3}\n# Largest message busbw : {:.3}\n", big.busbw_gbps);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_serialise_and_table_formats() {
        let c = ClusterSpec::preset("dgx-a100").unwrap();
        let rows =
            sweep_cluster(&c, 0, NetworkKind::Fabric, &NcclEnv::default(), BenchOp::AllReduce, 8, 8, 1 << 20).unwrap();
        assert_eq!(rows.len(), 18);
        assert!(rows.windows(2).all(|w| w[1].busbw_gbps > w[0].busbw_gbps));
        let json = serde_json::to_string(&rows[0]).unwrap();
        assert!(json.contains("\"busbw_GBps\"") && json.contains("\"algbw_GBps\""), "{json}");
        let back: BenchRow = serde_json::from_str(&json).unwrap();
        assert_eq!(back, rows[0]);
        let t = format_table(BenchOp::AllReduce, 8, &rows);
        assert!(t.contains("all_reduce") && t.contains("1048576") && t.contains("LL"), "{t}");
        assert_eq!(BenchOp::from_key("sendrecv"), Some(BenchOp::Sendrecv));
    }

    #[test]
    fn sendrecv_moves_every_rank_at_once() {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 2;
        let rows =
            sweep_cluster(&c, 0, NetworkKind::Fabric, &NcclEnv::default(), BenchOp::Sendrecv, 16, 1 << 30, 1 << 30)
                .unwrap();
        // 16 ranks, two nodes: each GPU's NIC carries one 1 GiB stream out: ≈ 48 GB/s.
        let bw = rows[0].busbw_gbps;
        assert!((bw - 48.0).abs() / 48.0 < 0.02, "{bw}");
    }
}
