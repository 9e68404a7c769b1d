//! Throughput of the fabric model: flow-solver events per second of wall time, on the
//! workload the simulator is built for — the data-parallel collectives of Llama-3 405B on
//! 16,384 H100s (TP 8, PP 16, DP 128: 128 DP groups of 128 ranks, one GPU per node each,
//! 2,048 DGX H100 nodes on a three-tier rail-optimised fabric).
//!
//! Each round starts every DP group's reduce-scatter at staggered instants (what gradient
//! bucketing produces) and runs the network until all complete. An event is one start, one
//! latency phase ending (the variable joining the solver) or one completion.
//!
//! Not a test: `cargo xtask bench` calls [`dp_collectives`] in release mode and prints
//! the [`BenchReport`]. Wall time comes from `std::time::Instant` here only.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_models::plan::CollKind;
use strata_models::{ClusterSpec, Fabric, Routing};

use super::fabric::FabricNetwork;
use super::{CommKind, CommRequest, NcclEnv, Network};

/// What a benchmark run measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub name: String,
    pub events: u64,
    pub wall_s: f64,
    pub events_per_s: f64,
    pub solves: u64,
    /// Mean variables per component solve.
    pub vars_per_solve: f64,
    /// Mean elements on binding-capable shared links per component solve (private and
    /// slack links are folded away and cost nothing in a solve).
    pub elems_per_solve: f64,
    pub simulated_ns: u64,
}

/// The DP groups of a tp × pp × dp grid ordered tp-dp-pp (tp fastest, as Megatron-LM).
pub fn dp_groups(tp: u32, dp: u32, pp: u32) -> Vec<Vec<u32>> {
    let mut groups = Vec::new();
    for p in 0..pp {
        for t in 0..tp {
            groups.push((0..dp).map(|d| t + tp * (d + dp * p)).collect());
        }
    }
    groups
}

/// Runs `rounds` rounds of all DP reduce-scatters of Llama-3 405B on 16,384 H100s, in
/// Megatron's rank order (each DP group inside one pod of the fabric: little sharing) and
/// with data parallelism outermost (each DP group spans every pod: all groups of a rail
/// share leaf trunks, all groups share the pod trunks).
pub fn dp_collectives(rounds: u32, routing: Routing) -> Vec<BenchReport> {
    let mut cluster = ClusterSpec::preset("dgx-h100").expect("preset exists");
    cluster.nodes = 2048;
    cluster.fabric = Fabric::RailOptimized;
    cluster.routing = routing;
    let outer: Vec<Vec<u32>> = (0..16u32 * 8)
        .map(|g| {
            let (t, p) = (g % 8, g / 8);
            (0..128).map(|d| t + 8 * (p + 16 * d)).collect()
        })
        .collect();
    vec![
        run(&cluster, &dp_groups(8, 128, 16), rounds, 64 << 20, "llama3-405b dp reduce-scatter, tp-dp-pp order"),
        run(&cluster, &outer, rounds, 64 << 20, "llama3-405b dp reduce-scatter, dp outermost (cross-pod)"),
    ]
}

/// One round: every group starts a reduce-scatter of about `bytes`, 1 µs apart, and the
/// network runs until all complete. Returns the number of events.
fn round(net: &mut FabricNetwork, groups: &[Vec<u32>], bytes: u64, round: u32, now: &mut u64) -> u64 {
    let mut finished = 0;
    for (g, ranks) in groups.iter().enumerate() {
        let req = CommRequest {
            kind: CommKind::Collective(CollKind::ReduceScatter),
            ranks: ranks.clone(),
            // Vary sizes a little so that completions do not all coincide.
            bytes: bytes + ((g as u64 * 7919 + round as u64 * 104_729) % 1024) * 4096,
            multiplicity: 1,
        };
        let t_start = *now + g as u64 * 1_000;
        while let Some(t) = net.next_completion_ns().filter(|&t| t <= t_start) {
            finished += net.advance(t).len();
        }
        net.start(t_start, &req);
    }
    *now += groups.len() as u64 * 1_000;
    while finished < groups.len() {
        let t = net.next_completion_ns().expect("started collectives complete");
        finished += net.advance(t).len();
        *now = t;
    }
    // Start, latency phase ending (joins the solver), completion.
    3 * groups.len() as u64
}

/// Runs one warm-up round (routes and layouts get cached, as in a long simulation), then
/// times `rounds` rounds.
pub fn run(cluster: &ClusterSpec, groups: &[Vec<u32>], rounds: u32, bytes: u64, name: &str) -> BenchReport {
    let mut net = FabricNetwork::new(cluster, 1, NcclEnv::default()).expect("benchmark cluster is valid");
    let mut now = 0u64;
    round(&mut net, groups, bytes, 0, &mut now);
    let before = net.solver_stats();
    let wall = Instant::now();
    let mut events = 0u64;
    for r in 1..=rounds {
        events += round(&mut net, groups, bytes, r, &mut now);
    }
    let wall_s = wall.elapsed().as_secs_f64();
    let stats = net.solver_stats();
    let solves = stats.solves - before.solves;
    BenchReport {
        name: name.to_string(),
        events,
        wall_s,
        events_per_s: events as f64 / wall_s.max(1e-12),
        solves,
        vars_per_solve: (stats.vars_solved - before.vars_solved) as f64 / solves.max(1) as f64,
        elems_per_solve: (stats.elems_solved - before.elems_solved) as f64 / solves.max(1) as f64,
        simulated_ns: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_groups_follow_the_rank_grid() {
        let g = dp_groups(8, 4, 2);
        assert_eq!(g.len(), 16);
        assert_eq!(g[0], vec![0, 8, 16, 24]);
        assert_eq!(g[9], vec![33, 41, 49, 57]);
    }

    #[test]
    fn a_small_run_reports_events() {
        let mut c = ClusterSpec::preset("dgx-h100").unwrap();
        c.nodes = 16;
        let r = run(&c, &dp_groups(8, 4, 4), 1, 1 << 20, "small");
        assert!(r.solves > 0, "{r:?}");
        assert_eq!(r.events, 32 * 3);
    }
}
