//! Fits a cluster's `nic_efficiency` (the share of NIC line rate NCCL's network transport
//! reaches) to nccl-tests bus bandwidths measured across nodes: the published rows of
//! `sim/data/nic_nccl_tests.csv` ([`fit`]; `cargo run --release -p strata-sim --example
//! fit_efa` reproduces the AWS EFA figure) or a user's own log ([`parse_nccl_tests`],
//! [`fit_log`]; `strata collbench --fit LOG`).
//!
//! For each candidate efficiency in 0.01 steps the rows are simulated on the fabric network
//! with NCCL's default algorithm choice; the fit is the candidate with the least sum of
//! squared log residuals (log(model / measured)), so a row 10% fast weighs as one 10% slow,
//! and among equal ones (sizes where the NICs do not bind) the largest. NCCL's topology
//! search and tuning keep the line rate, as NCCL does with the speed EFA reports; the links
//! deliver the share (`node.rs`). InfiniBand and RoCE keep 1.0: NCCL's own tuning factors
//! already give their measured busbw.

use strata_models::ClusterSpec;
use strata_models::limits::{EXCERPT_CHARS, excerpt};

use super::NetworkKind;
use super::collbench::{BenchOp, sweep_cluster};
use super::nccl::NcclEnv;

/// The measured rows, embedded.
pub const NIC_NCCL_TESTS_CSV: &str = include_str!("../../data/nic_nccl_tests.csv");

/// One measured all-reduce across nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct NicRow {
    pub preset: String,
    pub nodes: u32,
    pub bytes: u64,
    pub busbw_gbps: f64,
    pub source: String,
}

/// Parses the CSV (comment lines start with `#`; the header names the columns).
pub fn rows(csv: &str) -> Result<Vec<NicRow>, String> {
    let mut out = Vec::new();
    let mut lines = csv.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
    let header = lines.next().ok_or("no header line")?;
    if header.trim() != "preset,nodes,bytes,busbw_GBps,source" {
        return Err(format!("unexpected header {header:?}"));
    }
    for (i, line) in lines.enumerate() {
        let mut f = line.splitn(5, ',');
        let mut next = |what: &str| f.next().map(str::trim).ok_or(format!("row {}: no {what}", i + 1));
        let preset = next("preset")?.to_string();
        let nodes = next("nodes")?.parse::<u32>().map_err(|e| format!("row {}: nodes: {e}", i + 1))?;
        let bytes = next("bytes")?.parse::<u64>().map_err(|e| format!("row {}: bytes: {e}", i + 1))?;
        let busbw_gbps = next("busbw")?.parse::<f64>().map_err(|e| format!("row {}: busbw: {e}", i + 1))?;
        let source = next("source")?.trim_matches('"').to_string();
        if nodes < 2 || bytes == 0 || !(busbw_gbps.is_finite() && busbw_gbps > 0.0) {
            return Err(format!(
                "row {}: {nodes} nodes, {bytes} B, {busbw_gbps} GB/s is not an inter-node rate",
                i + 1
            ));
        }
        out.push(NicRow { preset, nodes, bytes, busbw_gbps, source });
    }
    Ok(out)
}

/// The simulated busbw of `op` over the first `ranks` GPUs of `cluster` at `bytes`, with the
/// cluster's NICs at `efficiency`.
pub fn simulated_busbw(
    cluster: &ClusterSpec,
    op: BenchOp,
    ranks: u32,
    bytes: u64,
    efficiency: f64,
) -> Result<f64, String> {
    let mut c = cluster.clone();
    c.nic_efficiency = efficiency;
    let out = sweep_cluster(&c, 0, NetworkKind::Fabric, &NcclEnv::default(), op, ranks, bytes, bytes)
        .map_err(|e| e.to_string())?;
    out.first().map(|r| r.busbw_gbps).ok_or_else(|| "the simulated sweep returned no row".into())
}

/// The simulated busbw of `row` on its preset at `efficiency`.
pub fn model_busbw(row: &NicRow, efficiency: f64) -> Result<f64, String> {
    let mut c = ClusterSpec::preset(&row.preset).ok_or_else(|| format!("no cluster preset {}", row.preset))?;
    c.nodes = row.nodes;
    simulated_busbw(&c, BenchOp::AllReduce, row.nodes * c.gpus_per_node, row.bytes, efficiency)
}

/// The candidate efficiencies, 0.01 apart (`MIN_NIC_EFFICIENCY` up to 1).
fn candidates() -> impl Iterator<Item = f64> {
    (1..=100u32).map(|step| step as f64 / 100.0)
}

/// The candidate with the least sum of squared log residuals of `model(e)` against `measured`.
fn least_log_squares(measured: &[f64], mut model: impl FnMut(f64) -> Result<Vec<f64>, String>) -> Result<f64, String> {
    let mut best: Option<(f64, f64)> = None;
    for e in candidates() {
        let m = model(e)?;
        let sse: f64 = m.iter().zip(measured).map(|(m, x)| (m / x).ln().powi(2)).sum();
        // Ties (sizes where the NICs do not bind) keep the largest candidate: no shortfall
        // the measurements cannot show.
        if best.is_none_or(|(_, b)| sse <= b) {
            best = Some((e, sse));
        }
    }
    best.map(|(e, _)| e).ok_or_else(|| "no candidate".into())
}

/// A fitted efficiency and each row's (measured, model) busbw there.
#[derive(Clone, Debug)]
pub struct NicFit {
    pub efficiency: f64,
    pub residuals: Vec<(NicRow, f64)>,
}

/// Fits one efficiency to `rows` (all of one preset).
pub fn fit(rows: &[NicRow]) -> Result<NicFit, String> {
    if rows.is_empty() {
        return Err("no rows to fit".into());
    }
    let measured: Vec<f64> = rows.iter().map(|r| r.busbw_gbps).collect();
    let efficiency = least_log_squares(&measured, |e| rows.iter().map(|r| model_busbw(r, e)).collect())?;
    let residuals = rows.iter().map(|r| Ok((r.clone(), model_busbw(r, efficiency)?))).collect::<Result<_, String>>()?;
    Ok(NicFit { efficiency, residuals })
}

/// One size of an nccl-tests log: the out-of-place bus bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogRow {
    pub bytes: u64,
    pub busbw_gbps: f64,
}

/// What an nccl-tests log says: its operation (from "# Collective test starting: X_perf",
/// printed by nccl-tests 2.13 and later), its ranks (the "#  Rank N Group …" lines) and its
/// rows.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclTestsLog {
    pub op: Option<BenchOp>,
    pub ranks: Option<u32>,
    pub rows: Vec<LogRow>,
}

/// The most rows a log may hold (nccl-tests sweeps 8 B to 8 GiB in ×2 steps: 31).
pub const MAX_LOG_ROWS: usize = 4096;

/// Reads nccl-tests output (`all_reduce_perf -b 8 -e 8G -f 2 …`), with or without mpirun's
/// `[1,0]<stdout>:` prefixes. A data line is the size and element count, the type and the
/// reduction (and the root, in newer versions), then out-of-place and in-place columns of
/// time, algbw, busbw and errors: the out-of-place busbw is the sixth column from the end.
pub fn parse_nccl_tests(text: &str) -> Result<NcclTestsLog, String> {
    let mut op = None;
    let mut ranks: u32 = 0;
    let mut rows = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = match raw.find("<stdout>:") {
            Some(i) => &raw[i + "<stdout>:".len()..],
            None => raw,
        }
        .trim();
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim();
            if let Some(name) = rest.strip_prefix("Collective test starting:") {
                let key = name.trim().trim_end_matches("_perf");
                op = Some(BenchOp::from_key(key).ok_or_else(|| {
                    format!("line {}: the log runs {:?}, which collbench does not model", n + 1, name.trim())
                })?);
            } else if rest.starts_with("Rank ") && rest.contains("Group") {
                ranks = ranks.saturating_add(1);
            }
            continue;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        let numeric = |s: &str| s.parse::<u64>().is_ok();
        if t.len() < 12 || !numeric(t[0]) || !numeric(t[1]) {
            continue;
        }
        let bytes: u64 = t[0].parse().map_err(|e| format!("line {}: size {:?}: {e}", n + 1, t[0]))?;
        let busbw = t[t.len() - 6];
        let busbw_gbps: f64 = busbw.parse().map_err(|_| {
            format!("line {}: out-of-place busbw {busbw:?} is not a number: {}", n + 1, excerpt(line, EXCERPT_CHARS))
        })?;
        if bytes == 0 || !(busbw_gbps.is_finite() && busbw_gbps >= 0.0) {
            return Err(format!("line {}: {bytes} B at {busbw_gbps} GB/s is not a measurement", n + 1));
        }
        if rows.len() == MAX_LOG_ROWS {
            return Err(format!("the log has more than {MAX_LOG_ROWS} rows (see docs/limits.md)"));
        }
        rows.push(LogRow { bytes, busbw_gbps });
    }
    if rows.is_empty() {
        return Err("no nccl-tests data line found (size, count, type, redop, …, time, algbw, busbw)".into());
    }
    Ok(NcclTestsLog { op, ranks: (ranks > 0).then_some(ranks), rows })
}

/// A fit of one cluster's efficiency to one log: the efficiency and each fitted row's
/// (row, simulated busbw there).
#[derive(Clone, Debug)]
pub struct LogFit {
    pub efficiency: f64,
    pub residuals: Vec<(LogRow, f64)>,
}

/// Fits `cluster`'s `nic_efficiency` to the log's rows of at least `min_bytes` (the
/// bandwidth-bound sizes; the latency of small messages is not the NIC's rate) for `op`
/// over the first `ranks` GPUs. The ranks must span more than one node.
pub fn fit_log(
    cluster: &ClusterSpec,
    op: BenchOp,
    ranks: u32,
    rows: &[LogRow],
    min_bytes: u64,
) -> Result<LogFit, String> {
    if ranks <= cluster.gpus_per_node {
        return Err(format!(
            "{ranks} ranks fit in one node of {} GPUs: the NICs carry none of it, so there is nothing to fit",
            cluster.gpus_per_node
        ));
    }
    let used: Vec<LogRow> = rows.iter().copied().filter(|r| r.bytes >= min_bytes && r.busbw_gbps > 0.0).collect();
    if used.is_empty() {
        return Err(format!("no row of at least {min_bytes} bytes with a positive busbw to fit"));
    }
    let measured: Vec<f64> = used.iter().map(|r| r.busbw_gbps).collect();
    let sim = |e: f64| used.iter().map(|r| simulated_busbw(cluster, op, ranks, r.bytes, e)).collect();
    let efficiency = least_log_squares(&measured, &sim)?;
    let model: Vec<f64> = sim(efficiency)?;
    Ok(LogFit { efficiency, residuals: used.into_iter().zip(model).collect() })
}

/// The fit's report: the efficiency, then each row's measured and model busbw.
pub fn report(f: &NicFit) -> String {
    let mut s = format!("nic_efficiency = {:.2}\n", f.efficiency);
    s += "preset      nodes        bytes   measured      model  residual\n";
    for (r, m) in &f.residuals {
        s += &format!(
            "{:<10} {:>6} {:>12} {:>8.2} GB/s {:>6.2} GB/s {:>+8.1}%   {}\n",
            r.preset,
            r.nodes,
            r.bytes,
            r.busbw_gbps,
            m,
            (m / r.busbw_gbps - 1.0) * 100.0,
            r.source
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_models::cluster::EFA_2022_NIC_EFFICIENCY;

    #[test]
    fn the_aws_p4d_preset_carries_the_fitted_efa_efficiency() {
        let rows = rows(NIC_NCCL_TESTS_CSV).unwrap();
        assert!(rows.len() >= 3);
        let f = fit(&rows).unwrap();
        assert_eq!(f.efficiency, EFA_2022_NIC_EFFICIENCY, "{}", report(&f));
        assert_eq!(ClusterSpec::preset("aws-p4d").unwrap().nic_efficiency, EFA_2022_NIC_EFFICIENCY);
        // Every row, NCCL's two-node tree and the rings beyond, within 5%.
        for (r, m) in &f.residuals {
            assert!((m / r.busbw_gbps - 1.0).abs() < 0.05, "{}", report(&f));
        }
        // At line rate the simulator is far faster than EFA measured: the factor matters.
        let full = model_busbw(&rows[2], 1.0).unwrap();
        assert!(full > rows[2].busbw_gbps * 1.4, "{full}");
    }

    /// An nccl-tests 2.13 log as mpirun prints it, 16 ranks on 2 nodes of 8.
    fn log(busbw_at: impl Fn(u64) -> f64) -> String {
        let mut t = String::from("[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824\n");
        t += "[1,0]<stdout>:# Collective test starting: all_reduce_perf\n";
        for r in 0..16 {
            t += &format!(
                "[1,0]<stdout>:#  Rank {r:2} Group  0 Pid  1 on node{} device  {} [0x10] NVIDIA A100\n",
                r / 8,
                r % 8
            );
        }
        t += "[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n";
        let mut size = 8u64;
        while size <= 1 << 30 {
            let b = busbw_at(size);
            t += &format!(
                "[1,0]<stdout>:{size:>12} {:>12}     float     sum      -1   100.0   {:.2}   {b:.2}      0   100.0   {:.2}   {b:.2}      0\n",
                size / 4,
                b / 1.875,
                b / 1.875
            );
            size *= 8;
        }
        t += "[1,0]<stdout>:# Avg bus bandwidth    : 1.0\n";
        t
    }

    #[test]
    fn an_nccl_tests_log_gives_its_op_ranks_and_out_of_place_busbw() {
        let l = parse_nccl_tests(&log(|s| s as f64 / 1e7)).unwrap();
        assert_eq!((l.op, l.ranks, l.rows.len()), (Some(BenchOp::AllReduce), Some(16), 10));
        assert_eq!(l.rows[0], LogRow { bytes: 8, busbw_gbps: 0.0 });
        assert_eq!(l.rows[9].bytes, 1 << 30);
        assert!((l.rows[9].busbw_gbps - 107.37).abs() < 0.01, "{:?}", l.rows[9]);
        // The older format (no root column, no test-starting line) reads the same columns.
        let old = "#  Rank  0 Group  0 Pid 9 on a device  0 [0x10] Tesla\n     1048576        262144   float     sum   1035.3    1.01    1.90  5e-07    643.4    1.63    3.06  5e-07\n";
        let l = parse_nccl_tests(old).unwrap();
        assert_eq!((l.op, l.ranks), (None, Some(1)));
        assert_eq!(l.rows, vec![LogRow { bytes: 1 << 20, busbw_gbps: 1.90 }]);
        assert!(parse_nccl_tests("# nothing here\n").unwrap_err().contains("no nccl-tests data line"));
        let e = parse_nccl_tests("# Collective test starting: hypercube_perf\n").unwrap_err();
        assert!(e.contains("hypercube_perf"), "{e}");
        let bad = "     1048576        262144   float     sum   1035.3    1.01    x.90  5e-07    643.4    1.63    3.06  5e-07\n";
        assert!(parse_nccl_tests(bad).unwrap_err().contains("line 1: out-of-place busbw \"x.90\""));
    }

    #[test]
    fn a_log_at_a_known_share_of_line_rate_fits_back_to_it() {
        // A "measured" log made by the simulator itself at 0.5 of the NICs of 4 dgx-a100
        // nodes (ring: the NICs bind).
        let mut c = ClusterSpec::preset("dgx-a100").unwrap();
        c.nodes = 4;
        let rows: Vec<LogRow> = [64u64 << 20, 256 << 20, 1 << 30]
            .iter()
            .map(|&b| LogRow { bytes: b, busbw_gbps: simulated_busbw(&c, BenchOp::AllReduce, 32, b, 0.5).unwrap() })
            .collect();
        let f = fit_log(&c, BenchOp::AllReduce, 32, &rows, 64 << 20).unwrap();
        assert_eq!(f.efficiency, 0.5);
        for (r, m) in &f.residuals {
            assert!((m / r.busbw_gbps - 1.0).abs() < 1e-9, "{r:?} {m}");
        }
        // Rows below the minimum are not used; one node has nothing to fit.
        assert!(fit_log(&c, BenchOp::AllReduce, 32, &rows, 2 << 30).unwrap_err().contains("no row of at least"));
        // Two nodes (NCCL's tree) at 0.73 fit back to 0.73: NCCL plans for the line rate
        // and the links deliver the share, so every share gives its own busbw.
        c.nodes = 2;
        let at = |e: f64| simulated_busbw(&c, BenchOp::AllReduce, 16, 1 << 30, e).unwrap();
        assert!(at(0.73) < at(0.74));
        let rows = [LogRow { bytes: 1 << 30, busbw_gbps: at(0.73) }];
        assert_eq!(fit_log(&c, BenchOp::AllReduce, 16, &rows, 0).unwrap().efficiency, 0.73);
    }

    #[test]
    fn malformed_rows_are_refused_with_the_row() {
        assert!(rows("").is_err());
        let e = rows("preset,nodes,bytes,busbw_GBps,source\naws-p4d,1,8,1.0,x\n").unwrap_err();
        assert!(e.contains("row 1") && e.contains("not an inter-node rate"), "{e}");
        let e = rows("preset,nodes,bytes,busbw_GBps,source\naws-p4d,two,8,1.0,x\n").unwrap_err();
        assert!(e.contains("nodes"), "{e}");
    }
}
