//! `strata simulate`'s what-ifs: `--slow rank=R:F`, `--degrade link=NAME:F`, `--down NAME`
//! (added to the scenario's `[faults]` table and checked with it), and `--list-links`, the
//! names of the cluster's links and switches, filtered and capped so that a 16k-GPU fabric
//! does not print megabytes unasked.

use std::fmt::Write;

use strata_models::Scenario;
use strata_models::faults::whatif;
use strata_sim::net::names;
use strata_sim::net::topology::Topology;

use crate::common;

/// What-if options of `strata simulate`.
#[derive(clap::Args, Debug, Clone)]
pub struct WhatIfArgs {
    /// A straggler: rank R runs its compute F times as long, e.g. `--slow rank=17:1.3`
    /// (F in (0, 100]). Repeatable; added to the scenario's `[faults] slow`.
    #[arg(long, value_name = "rank=R:F")]
    pub slow: Vec<String>,
    /// A degraded link (or every link of a switch) at F of its bandwidth, F in (0, 1], e.g.
    /// `--degrade link=leaf2-spine3:0.5`. Repeatable; names from `--list-links`.
    #[arg(long, value_name = "link=NAME:F")]
    pub degrade: Vec<String>,
    /// A link or switch that is down, e.g. `--down spine3` or `--down link=node0/nic0-leaf0`;
    /// routing goes around it. Repeatable.
    #[arg(long, value_name = "NAME")]
    pub down: Vec<String>,
    /// List the cluster's link and switch names (those containing FILTER, when given) and
    /// exit; with `--json` as JSON.
    #[arg(long, value_name = "FILTER", num_args = 0..=1, default_missing_value = "")]
    pub list_links: Option<String>,
    /// With `--list-links`: show at most this many names.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub limit: usize,
}

impl WhatIfArgs {
    /// Adds the command-line what-ifs to the scenario's `[faults]` and checks them with it.
    /// Whether any what-if flag was given.
    pub fn any(&self) -> bool {
        !self.slow.is_empty() || !self.degrade.is_empty() || !self.down.is_empty() || self.list_links.is_some()
    }

    pub fn apply(&self, s: &mut Scenario) -> anyhow::Result<()> {
        let bad = |e: String| anyhow::anyhow!(e);
        for spec in &self.slow {
            s.faults.slow.push(whatif::parse_slow(spec).map_err(bad)?);
        }
        for spec in &self.degrade {
            s.faults.degrade.push(whatif::parse_degrade(spec).map_err(bad)?);
        }
        s.faults.down.extend(self.down.iter().map(|d| whatif::parse_down(d)));
        if !(self.slow.is_empty() && self.degrade.is_empty() && self.down.is_empty()) {
            s.validate()?;
        }
        Ok(())
    }
}

/// One listing of names.
#[derive(serde::Serialize)]
struct Listing {
    fabric: String,
    filter: String,
    total: usize,
    matched: usize,
    shown: usize,
    names: Vec<names::Named>,
}

/// Prints the link and switch names of `s`'s cluster that contain `filter`, at most `limit`.
pub fn list(s: &Scenario, seed: u64, filter: &str, limit: usize, json: bool) -> anyhow::Result<()> {
    let topo = Topology::new(&s.cluster, seed)?;
    let all = names::all(&topo);
    let total = all.len();
    let matched: Vec<names::Named> = all.into_iter().filter(|n| n.name.contains(filter)).collect();
    let count = matched.len();
    let shown: Vec<names::Named> = matched.into_iter().take(limit).collect();
    let listing = Listing {
        fabric: topo.fabric().name().to_string(),
        filter: filter.to_string(),
        total,
        matched: count,
        shown: shown.len(),
        names: shown,
    };
    if json {
        return common::print_json(&listing);
    }
    let mut o = String::new();
    let c = &s.cluster;
    let _ = writeln!(
        o,
        "{} fabric of {} nodes × {} GPUs: {total} links and switches",
        listing.fabric, c.nodes, c.gpus_per_node
    );
    for n in &listing.names {
        let bw = if n.kind == "switch" { String::new() } else { format!("{:>8.1} GB/s", n.gb_per_s) };
        let _ = writeln!(o, "  {:<32} {:<11} {bw}", n.name, n.kind);
    }
    if count > listing.shown {
        let _ = writeln!(
            o,
            "… {} more of {count} matching; narrow with --list-links FILTER (e.g. leaf3, spine, node7/) or raise --limit",
            count - listing.shown
        );
    }
    let _ = writeln!(
        o,
        "a bare leafA-spineB names every parallel link of the pair; a switch name, every link that touches it"
    );
    print!("{o}");
    Ok(())
}
