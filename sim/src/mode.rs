//! Which engine mode is exact on a plan's fabric: the resolution of [`Mode::Auto`].
//!
//! Symmetric mode runs one actor per pipeline stage and counts the identical groups beside
//! each of its collectives as copies spread evenly over each switch tier. That is exact when
//! the copies really spread evenly and do not meet other stages' traffic; it misses two
//! effects full mode (every rank) sees:
//! - **static routing**: ECMP hashes put several flows on one uplink while others idle, so
//!   the slowest ring link is slower than the average;
//! - **oversubscribed tiers** on fabrics whose data-parallel rings cross them: the stages'
//!   reductions overlap in time on the shared core links.
//!
//! Measured at 256–1,024 GPUs (GPT-3 175B tp8/tp4 · pp8 on 512 and 1,024 A100, Llama-3 8B
//! tp2 · pp2 · dp64 on 256 H100; the worst of symmetric ÷ full − 1 per setting; the table
//! in `README.md` has every setting):
//!
//! | fabric | 1:1 static | 1:1 adaptive | 2:1 static | 2:1 adaptive | 4:1 static | 4:1 adaptive |
//! |---|---|---|---|---|---|---|
//! | rail-optimized | −0.81% | 0.00% | −1.71% | −0.15% | −3.36% | −0.48% |
//! | fat-tree | −5.85% | 0.00% | −18.07% | −2.29% | −36.76% | −9.96% |
//! | leaf-spine | −2.89% | 0.00% | −7.86% | −0.36% | −20.44% | −2.79% |
//!
//! So symmetric mode is used where it was within 1% of full — a single switch, adaptive
//! routing on a non-blocking fabric, a rail-optimized fabric with adaptive routing at any
//! oversubscription or static routing without — and full mode elsewhere, up to
//! [`crate::simulate::FULL_MODE_RANKS_MAX`] ranks. Past that, symmetric mode runs and the
//! report says it is approximate.
//!
//! **Router imbalance** (a MoE model with skew > 0 and ep > 1, `crate::router`) makes the
//! ranks of a stage differ too: each rank's experts get their own load per microbatch.
//! Symmetric mode runs every `Experts` op at the stage's most loaded EP rank for that layer
//! and microbatch — an upper bound of the full run, which sums each rank's own ops between
//! two all-to-alls of its group (a layer's weight gradients and the next layer's input
//! gradients) and lets several EP groups of a stage draw apart. So `Auto` runs full mode for
//! such a plan within full mode's limits ([`with_router`]) and says so; past them, or
//! forced, symmetric mode runs and the note says it is an upper bound.
//!
//! Step what-ifs (a slow rank, a degraded or downed link, `[faults]`) make the ranks of a
//! stage differ, so a run with any of them is full mode ([`with_what_ifs`]): `Auto` says
//! so in the note, a forced `Symmetric` is refused.

use strata_models::{ClusterSpec, Fabric, Routing};

use crate::engine::Mode;
use crate::error::SimError;

/// Why symmetric mode is not exact on a cluster, or `None` where it is.
pub fn symmetric_inexact(c: &ClusterSpec) -> Option<String> {
    let blocking = c.oversubscription > 1.0;
    let exact = match c.fabric {
        Fabric::SingleSwitch => true,
        Fabric::RailOptimized => c.routing == Routing::Adaptive || !blocking,
        _ => c.routing == Routing::Adaptive && !blocking,
    };
    if exact || c.nodes <= 1 {
        return None;
    }
    let fabric = match c.fabric {
        Fabric::SingleSwitch => "single-switch",
        Fabric::FatTree => "fat-tree",
        Fabric::RailOptimized => "rail-optimized",
        Fabric::LeafSpine => "leaf-spine",
    };
    let routing = match c.routing {
        Routing::Static => "static",
        Routing::Adaptive => "adaptive",
    };
    Some(format!(
        "symmetric mode is not exact on a {}:1 {fabric} fabric with {routing} routing (it misses ECMP collisions and the stages' contention on shared links; the README tabulates the measured errors)",
        c.oversubscription
    ))
}

/// The mode a run uses and, when it is not the one asked for or is approximate, why.
/// `fabric` says whether the network is the flow-level fabric (the other network models
/// have no contention between groups, so symmetric mode is exact on them).
pub fn resolve(asked: Mode, c: &ClusterSpec, ranks: u32, full_limit: u32, fabric: bool) -> (Mode, Option<String>) {
    match asked {
        Mode::Symmetric | Mode::Full => (asked, None),
        Mode::Auto => match symmetric_inexact(c).filter(|_| fabric) {
            None => (Mode::Symmetric, None),
            Some(why) if ranks <= full_limit => (Mode::Full, Some(format!("full mode: {why}"))),
            Some(why) => (
                Mode::Symmetric,
                Some(format!(
                    "symmetric mode, approximate: {why}, and full mode is limited to {full_limit} ranks (this plan has {ranks})"
                )),
            ),
        },
    }
}

/// Why symmetric mode is not exact for a plan's router imbalance: a skew > 0 over ep > 1
/// ranks. `None` for dense models, balanced routing, or one rank holding every expert.
pub fn router_inexact(plan: &strata_models::plan::Plan) -> Option<String> {
    let gini = crate::router::model_gini(&plan.scenario.model)?;
    let ep = plan.grid.ep;
    (gini > 0.0 && ep > 1).then(|| {
        format!(
            "router imbalance (Gini {gini}) gives each of the {ep} expert-parallel ranks of a group its own load per microbatch, which symmetric mode can only bound by the most loaded"
        )
    })
}

/// The mode after [`resolve`] once router imbalance is counted: `Auto`'s symmetric becomes
/// full where [`router_inexact`] and full mode is within its limits (`full_fits`: ranks and
/// ops); a symmetric run that stays says it is an upper bound.
pub fn with_router(
    asked: Mode,
    resolved: (Mode, Option<String>),
    plan: &strata_models::plan::Plan,
    full_fits: bool,
) -> (Mode, Option<String>) {
    let (mode, note) = resolved;
    let Some(why) = router_inexact(plan).filter(|_| mode == Mode::Symmetric) else { return (mode, note) };
    if asked == Mode::Auto && full_fits {
        return (Mode::Full, Some(format!("full mode: {why}")));
    }
    let bound = format!("symmetric mode, an upper bound: {why}");
    (Mode::Symmetric, Some(note.map_or(bound.clone(), |n| format!("{n}; {bound}"))))
}

/// The mode a run with step what-ifs (`[faults]` slow, degrade, down; described by `what`)
/// uses: full, since they make the ranks of a stage differ; a forced symmetric mode and a
/// plan past full mode's limit are refused.
pub fn with_what_ifs(asked: Mode, what: &str, ranks: u32, full_limit: u32) -> Result<(Mode, Option<String>), SimError> {
    if asked == Mode::Symmetric {
        return Err(SimError::WhatIfSymmetric { what: what.to_string() });
    }
    if ranks > full_limit {
        return Err(SimError::WhatIfTooLarge { ranks, limit: full_limit });
    }
    let note = (asked == Mode::Auto).then(|| {
        format!("full mode: the what-ifs ({what}) make the ranks of a stage differ, which symmetric mode cannot see")
    });
    Ok((Mode::Full, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(fabric: Fabric, over: f64, routing: Routing) -> ClusterSpec {
        let mut c = ClusterSpec::preset("dgx-a100").expect("a preset");
        c.nodes = 128;
        c.fabric = fabric;
        c.oversubscription = over;
        c.routing = routing;
        c
    }

    #[test]
    fn auto_keeps_symmetric_only_where_it_was_measured_exact() {
        use Fabric::*;
        use Routing::*;
        let symmetric = [
            (RailOptimized, 1.0, Static),
            (RailOptimized, 1.0, Adaptive),
            (RailOptimized, 4.0, Adaptive),
            (FatTree, 1.0, Adaptive),
            (LeafSpine, 1.0, Adaptive),
            (SingleSwitch, 1.0, Static),
        ];
        let full =
            [(RailOptimized, 2.0, Static), (FatTree, 1.0, Static), (FatTree, 2.0, Adaptive), (LeafSpine, 2.0, Static)];
        for (f, o, r) in symmetric {
            assert_eq!(resolve(Mode::Auto, &cluster(f, o, r), 1024, 4096, true).0, Mode::Symmetric, "{f:?} {o} {r:?}");
        }
        for (f, o, r) in full {
            let (mode, why) = resolve(Mode::Auto, &cluster(f, o, r), 1024, 4096, true);
            assert_eq!(mode, Mode::Full, "{f:?} {o} {r:?}");
            assert!(why.is_some_and(|w| w.contains("not exact")));
        }
    }

    #[test]
    fn what_ifs_run_full_mode_and_refuse_a_forced_symmetric() {
        let (mode, note) = with_what_ifs(Mode::Auto, "rank 3 ×1.3", 1024, 4096).unwrap();
        assert_eq!(mode, Mode::Full);
        assert!(note.is_some_and(|n| n.contains("rank 3 ×1.3")));
        assert_eq!(with_what_ifs(Mode::Full, "x", 1024, 4096).unwrap(), (Mode::Full, None));
        let e = with_what_ifs(Mode::Symmetric, "x", 1024, 4096).unwrap_err().to_string();
        assert!(e.contains("symmetric mode") && e.contains("--mode full"), "{e}");
        assert!(with_what_ifs(Mode::Auto, "x", 16384, 4096).unwrap_err().to_string().contains("16384 ranks"));
    }

    #[test]
    fn past_the_full_mode_limit_auto_runs_symmetric_and_says_so() {
        let c = cluster(Fabric::FatTree, 2.0, Routing::Static);
        let (mode, why) = resolve(Mode::Auto, &c, 16384, 4096, true);
        assert_eq!(mode, Mode::Symmetric);
        assert!(why.is_some_and(|w| w.contains("approximate") && w.contains("16384")));
        // An explicit mode is kept, and networks without contention are symmetric.
        assert_eq!(resolve(Mode::Symmetric, &c, 1024, 4096, true), (Mode::Symmetric, None));
        assert_eq!(resolve(Mode::Auto, &c, 1024, 4096, false), (Mode::Symmetric, None));
    }
}
