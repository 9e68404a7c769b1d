//! Tests of the max-min solver: closed-form shares, bounds and weights, removals, and
//! incremental solves equal to solves from scratch.

use super::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn two_flows_on_one_link_get_half_each() {
    let mut m = MaxMin::new();
    let l = m.add_constraint(100e9);
    let a = m.add_var(0, 1e9, 1e12, 1.0, &[(l, 1.0)]);
    let b = m.add_var(0, 1e9, 1e12, 1.0, &[(l, 1.0)]);
    m.solve(0);
    assert_eq!((m.rate(a), m.rate(b)), (50e9, 50e9));
    // 1 GB at 50 GB/s = 20 ms; both finish together, lower id first.
    assert_eq!(m.pop_completed(20_000_000), Some(a));
    m.remove_var(a);
    assert_eq!(m.pop_completed(20_000_000), Some(b));
}

#[test]
fn bounds_and_weights_and_private_links() {
    let mut m = MaxMin::new();
    let shared = m.add_constraint(90.0);
    let private = m.add_constraint(20.0);
    let a = m.add_var(0, 1.0, 1e9, 1.0, &[(shared, 1.0), (private, 1.0)]);
    let b = m.add_var(0, 1.0, 1e9, 2.0, &[(shared, 1.0)]);
    m.solve(0);
    // a is held to 20 by its private link; b takes the rest.
    assert_eq!((m.rate(a), m.rate(b)), (20.0, 70.0));
    let c = m.add_var(0, 1.0, 1e9, 1.0, &[(shared, 1.0)]);
    m.solve(0);
    // Weighted: b gets twice c, a still 20 → c = 70/3.
    assert!((m.rate(b) - 140.0 / 3.0).abs() < 1e-9 && (m.rate(c) - 70.0 / 3.0).abs() < 1e-9);
}

#[test]
fn a_removed_variable_is_never_reported() {
    let mut m = MaxMin::new();
    let l = m.add_constraint(1e9);
    let a = m.add_var(0, 1e6, 1e12, 1.0, &[(l, 1.0)]);
    let _b = m.add_var(0, 1e9, 1e3, 1.0, &[]);
    m.solve(0);
    assert_eq!(m.next_completion(), Some((1_000_000, a)));
    m.remove_var(a);
    m.solve(10);
    // b alone: 1e9 bytes at 1e3 B/s.
    assert_eq!(m.next_completion(), Some((1_000_000_000_000_000, 1)));
    assert_eq!(m.pop_completed(2_000_000), None);
}

#[test]
fn finishing_flow_speeds_up_the_other_lazily() {
    let mut m = MaxMin::new();
    let l = m.add_constraint(1e9);
    let a = m.add_var(0, 1e9, 1e12, 1.0, &[(l, 1.0)]);
    let b = m.add_var(0, 0.5e9, 1e12, 1.0, &[(l, 1.0)]);
    m.solve(0);
    assert_eq!(m.next_completion(), Some((1_000_000_000, b)));
    assert_eq!(m.pop_completed(1_000_000_000), Some(b));
    m.remove_var(b);
    m.solve(1_000_000_000);
    // a moved 0.5 GB in the first second, then has the link alone: done at 1.5 s.
    assert_eq!(m.next_completion(), Some((1_500_000_000, a)));
}

/// (bound, weight, elements) of a random variable.
type Spec = (f64, f64, Vec<(CnstId, f64)>);

/// A random instance: constraints, then a sequence of adds and removes.
#[test]
fn incremental_equals_from_scratch_on_random_sets() {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    for _case in 0..40 {
        let mut inc = MaxMin::new();
        let n_c = rng.random_range(1..12);
        let caps: Vec<f64> = (0..n_c).map(|_| rng.random_range(1.0..100.0)).collect();
        for &c in &caps {
            inc.add_constraint(c);
        }
        let mut specs: Vec<Option<Spec>> = Vec::new();
        let mut slots: Vec<VarId> = Vec::new();
        for step in 0..30u64 {
            let live: Vec<usize> = (0..specs.len()).filter(|&i| specs[i].is_some()).collect();
            if !live.is_empty() && rng.random_range(0..3) == 0 {
                let i = live[rng.random_range(0..live.len())];
                inc.remove_var(slots[i]);
                specs[i] = None;
            } else {
                let k = rng.random_range(1..4);
                let elems: Vec<(CnstId, f64)> =
                    (0..k).map(|_| (rng.random_range(0..n_c) as CnstId, rng.random_range(0.1..3.0))).collect();
                let bound = rng.random_range(1.0..200.0);
                let w = rng.random_range(0.5..2.0);
                slots.push(inc.add_var(step, 1e3, bound, w, &elems));
                specs.push(Some((bound, w, elems)));
            }
            inc.solve(step);
            let mut scratch = MaxMin::new();
            for &c in &caps {
                scratch.add_constraint(c);
            }
            let ids: Vec<Option<VarId>> =
                specs.iter().map(|s| s.as_ref().map(|(b, w, e)| scratch.add_var(step, 1e3, *b, *w, e))).collect();
            scratch.solve_all(step);
            for (i, id) in ids.iter().enumerate() {
                if let Some(id) = id {
                    let (x, y) = (inc.rate(slots[i]), scratch.rate(*id));
                    assert!((x - y).abs() <= 1e-9 * y.max(1.0), "var {i}: {x} vs {y}");
                }
            }
            // Feasibility and max-min optimality, checked independently of the solver.
            check_feasible_and_saturated(&inc, &caps);
        }
    }
}

fn check_feasible_and_saturated(m: &MaxMin, caps: &[f64]) {
    let mut load = vec![0.0; caps.len()];
    for v in m.vars.iter().filter(|v| v.active) {
        for &(c, a) in &v.elems {
            load[c as usize] += a * v.rate;
        }
    }
    for (c, &cap) in caps.iter().enumerate() {
        assert!(load[c] <= cap * (1.0 + 1e-9), "constraint {c} over: {} > {cap}", load[c]);
    }
    // Weighted max-min: a variable below its bound has a bottleneck, a full constraint
    // on which no other variable has a larger rate per unit weight.
    for v in m.vars.iter().filter(|v| v.active) {
        let at_bound = v.rate >= v.bound * (1.0 - 1e-9);
        let level = v.rate / v.weight;
        let bottleneck = v.elems.iter().any(|&(c, _)| {
            let full = load[c as usize] >= caps[c as usize] * (1.0 - 1e-9);
            let top = m.cnsts[c as usize]
                .vars
                .iter()
                .all(|&(u, _)| m.vars[u as usize].rate / m.vars[u as usize].weight <= level * (1.0 + 1e-9));
            full && top
        });
        assert!(at_bound || bottleneck, "variable has no bottleneck: {v:?}");
    }
}
