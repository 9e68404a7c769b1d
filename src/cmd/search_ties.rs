//! The rows of `strata search`'s text table: ranked candidates whose simulated results are
//! exactly equal (step time, throughput, MFU, peak memory) form one row, labelled with the
//! settings they share and, for those that differ, every value (`bucket 10|40|160 MiB`).
//! The JSON and the CSV keep every candidate.

use strata_sim::SimReport;
use strata_sim::search::{Candidate, SearchResult};

/// One row of the table: the report of the first candidate of a tie (whose figures every
/// member shares) and the row's label.
pub struct Row<'a> {
    pub report: &'a SimReport,
    pub label: String,
}

fn same(a: &SimReport, b: &SimReport) -> bool {
    a.step_time_s == b.step_time_s
        && a.tokens_per_s == b.tokens_per_s
        && a.mfu == b.mfu
        && a.peak_memory_bytes == b.peak_memory_bytes
        && a.fits == b.fits
}

/// The first `top` rows of the ranking (simulated candidates only), ties collapsed.
pub fn rows(r: &SearchResult, top: usize) -> Vec<Row<'_>> {
    let mut groups: Vec<Vec<(&Candidate, &SimReport)>> = Vec::new();
    for c in r.ranking.iter().map(|i| &r.candidates[*i]) {
        let Some(rep) = c.report.as_ref() else { continue };
        let n = groups.len();
        match groups.last_mut() {
            Some(g) if g.first().is_some_and(|(_, first)| same(first, rep)) => g.push((c, rep)),
            _ if n == top => break,
            _ => groups.push(vec![(c, rep)]),
        }
    }
    groups
        .into_iter()
        .filter_map(|g| {
            let (_, report) = *g.first()?;
            Some(Row { report, label: label(&g.iter().map(|(c, _)| *c).collect::<Vec<_>>()) })
        })
        .collect()
}

/// The label of a group: the label words every member has, then each setting that differs
/// with all its values (in order for numbers, else in rank order).
fn label(group: &[&Candidate]) -> String {
    let Some(first) = group.first() else { return String::new() };
    if group.len() == 1 {
        return first.label.clone();
    }
    let shared: Vec<&str> = first
        .label
        .split_whitespace()
        .filter(|w| group.iter().all(|c| c.label.split_whitespace().any(|x| x == *w)))
        .collect();
    let mut parts = vec![shared.join(" ")];
    let settings: [Setting; 14] = [
        ("tp", "", |c| c.scenario.parallel.tp.to_string()),
        ("pp", "", |c| c.scenario.parallel.pp.to_string()),
        ("dp", "", |c| c.scenario.parallel.dp.to_string()),
        ("schedule", "", |c| c.scenario.parallel.schedule.key().to_string()),
        ("vpp", "", |c| c.scenario.parallel.vpp.to_string()),
        ("mb", "", |c| c.scenario.parallel.micro_batch.to_string()),
        ("zero", "", |c| c.scenario.parallel.zero.to_string()),
        ("recompute", "", |c| c.scenario.parallel.recompute.key().to_string()),
        ("sp", "", |c| on_off(c.scenario.parallel.sequence_parallel)),
        ("bucket", " MiB", |c| c.scenario.parallel.grad_bucket_mb.to_string()),
        ("overlap grads", "", |c| on_off(c.scenario.parallel.overlap_grad_reduce)),
        ("overlap params", "", |c| on_off(c.scenario.parallel.overlap_param_gather)),
        ("a2a overlap", "", |c| on_off(c.scenario.parallel.moe_a2a_overlap)),
        ("tp overlap", "", |c| on_off(c.scenario.tp_comm_overlap())),
    ];
    for (name, unit, value) in settings {
        let mut values: Vec<String> = Vec::new();
        for c in group {
            let v = value(c);
            if !values.contains(&v) {
                values.push(v);
            }
        }
        if values.iter().all(|v| v.parse::<f64>().is_ok()) {
            values.sort_by(|a, b| a.parse::<f64>().unwrap_or(0.0).total_cmp(&b.parse::<f64>().unwrap_or(0.0)));
        }
        if values.len() > 1 {
            parts.push(format!("{name} {}{unit}", values.join("|")));
        }
    }
    format!("{} ({} tied)", parts.join(", "), group.len())
}

/// A setting of a split: its name in a row, its unit, and its value.
type Setting = (&'static str, &'static str, fn(&Candidate) -> String);

fn on_off(b: bool) -> String {
    if b { "on".into() } else { "off".into() }
}
