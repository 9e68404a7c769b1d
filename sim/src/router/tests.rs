//! The router's draws: their Gini, determinism, capacity and what EP ranks see.

use super::*;

fn grid(ep: u32, dp: u32) -> RankGrid {
    RankGrid::new(1, dp, 1, 8).with_cp_ep(1, ep)
}

#[test]
fn gini_of_known_vectors() {
    assert_eq!(gini(&[1.0; 8]), 0.0);
    assert!((gini(&[0.0, 0.0, 0.0, 1.0]) - 0.75).abs() < 1e-12);
    // Σ|xi − xj| over ordered pairs of (1, 2, 3) is 8; / (2·9·2) = 2/9.
    assert!((gini(&[3.0, 1.0, 2.0]) - 2.0 / 9.0).abs() < 1e-12);
    // The log-normal's Gini is erf(σ/2).
    assert!((lognormal_sigma(erf(0.5)) - 1.0).abs() < 1e-6);
}

#[test]
fn every_draw_has_the_asked_gini_and_mean_one() {
    for experts in [8, 64, 256] {
        for g in [0.105, 0.24, 0.5] {
            let r = RouterLoads::with(experts, g, None, 7, grid(8, 8));
            for (layer, mb) in [(0, 0), (3, 1), (60, 119)] {
                let x = r.expert_loads(0, layer, mb);
                assert_eq!(x.len(), experts as usize);
                let mean = x.iter().sum::<f64>() / x.len() as f64;
                assert!((mean - 1.0).abs() < 1e-9, "{experts} {g}: mean {mean}");
                assert!((gini(&x) - g).abs() < 1e-9, "{experts} {g}: gini {}", gini(&x));
                assert!(x.iter().all(|v| *v >= 0.0));
            }
        }
    }
    // Balanced: every expert, every rank exactly 1.
    let mut r = RouterLoads::with(64, 0.0, None, 7, grid(8, 8));
    assert_eq!(r.rank_loads(0, 5, 2), (&[1.0; 8][..], 1.0));
}

#[test]
fn draws_depend_on_seed_and_key_only() {
    let mut a = RouterLoads::with(64, 0.2, None, 11, grid(8, 16));
    let mut b = RouterLoads::with(64, 0.2, None, 11, grid(8, 16));
    // Asked in another order, the same key gives the same bytes.
    let later = {
        b.rank_loads(1, 9, 9);
        b.rank_loads(0, 3, 4).0.to_vec()
    };
    assert_eq!(a.rank_loads(0, 3, 4).0.to_vec(), later);
    assert_ne!(a.expert_loads(0, 3, 4), a.expert_loads(0, 3, 5));
    assert_ne!(a.expert_loads(0, 3, 4), a.expert_loads(1, 3, 4));
    assert_ne!(a.expert_loads(0, 3, 4), RouterLoads::with(64, 0.2, None, 12, grid(8, 16)).expert_loads(0, 3, 4));
}

#[test]
fn the_most_loaded_rank_grows_with_skew_and_is_capped_by_capacity() {
    let mean_max = |g: f64, ep: u32, cap: Option<f64>| {
        let mut r = RouterLoads::with(256, g, cap, 3, grid(ep, 64));
        let n = 200;
        (0..n).map(|mb| r.rank_loads(0, 3, mb).1).sum::<f64>() / n as f64
    };
    let (low, mid, high) = (mean_max(0.105, 8, None), mean_max(0.24, 8, None), mean_max(0.5, 8, None));
    assert!(1.0 < low && low < mid && mid < high, "{low} {mid} {high}");
    // More ranks, fewer experts each: the max over ranks is further from the mean.
    assert!(mean_max(0.24, 64, None) > mid);
    // Without capacity the ranks' mean load is the balanced one; with a factor of 1.25 no
    // expert (so no rank) exceeds 1.25, and drops take the mean below 1.
    let mut r = RouterLoads::with(256, 0.5, Some(1.25), 3, grid(8, 64));
    let (ranks, max) = r.rank_loads(0, 3, 0);
    assert!(max <= 1.25 + 1e-12 && ranks.iter().sum::<f64>() / 8.0 < 1.0, "{ranks:?}");
    let mut r = RouterLoads::with(256, 0.5, None, 3, grid(8, 64));
    let (ranks, _) = r.rank_loads(0, 3, 0);
    assert!((ranks.iter().sum::<f64>() / 8.0 - 1.0).abs() < 1e-9);
}

#[test]
fn a_stage_max_covers_every_ep_group_of_the_stage() {
    let mut r = RouterLoads::with(64, 0.3, None, 5, grid(8, 32));
    let each: Vec<f64> = (0..4).map(|g| r.rank_loads(g, 2, 1).1).collect();
    let want = each.iter().copied().fold(0.0, f64::max);
    assert_eq!(r.stage_max(0, 2, 1), want);
    // A rank's load is its position's in its own group.
    let (own, max) = r.of_rank(13, 2, 1);
    assert_eq!(own, r.rank_loads(1, 2, 1).0[5]);
    assert_eq!(max, each[1]);
}

#[test]
fn extreme_skews_stay_finite() {
    for g in [0.99, 1.0, 7.0, -1.0, f64::NAN, f64::INFINITY] {
        let mut r = RouterLoads::with(8, g, None, 1, grid(8, 8));
        let (ranks, max) = r.rank_loads(0, 0, 0);
        assert!(ranks.iter().all(|v| v.is_finite() && *v >= 0.0) && max.is_finite(), "{g}: {ranks:?}");
        let x = r.expert_loads(0, 0, 0);
        assert!((x.iter().sum::<f64>() / 8.0 - 1.0).abs() < 1e-9, "{g}: {x:?}");
    }
    // Near the limit (E − 1)/E one expert takes almost every token.
    let r = RouterLoads::with(8, 0.99, None, 1, grid(8, 8));
    let x = r.expert_loads(0, 0, 0);
    assert!((gini(&x) - 7.0 / 8.0).abs() < 1e-6 && x.iter().copied().fold(0.0, f64::max) > 7.99, "{x:?}");
}
