//! SwiGLU experts (the Llama family's: FC1 (h, 2f) as [gate | up], no biases) against
//! finite differences: one expert alone (input and weights), and the whole MoE MLP with
//! SwiGLU routed and shared experts (input, router, experts).

use strata_models::model::RouterScore;

use super::*;
use crate::gradcheck::{Probe, check_directional, seeded_vec};

const H: usize = 8;
const E: usize = 8;
const K: usize = 2;
const F: usize = 12;
const FS: usize = 10;

/// One SwiGLU expert of width f: fc1_w (h, 2f), fc2_w (f, h).
fn expert_len(f: usize) -> usize {
    3 * H * f
}

fn flat_len(n: usize) -> usize {
    H * E + n * expert_len(F) + expert_len(FS)
}

fn split_expert(buf: &[f32], f: usize) -> (ExpertTensors<&[f32]>, &[f32]) {
    let (fc1_w, r) = buf.split_at(2 * H * f);
    let (fc2_w, r) = r.split_at(f * H);
    (ExpertTensors { fc1_w, fc1_b: &[], fc2_w, fc2_b: &[] }, r)
}

fn split_expert_mut(buf: &mut [f32], f: usize) -> (ExpertTensors<&mut [f32]>, &mut [f32]) {
    let (fc1_w, r) = buf.split_at_mut(2 * H * f);
    let (fc2_w, r) = r.split_at_mut(f * H);
    (ExpertTensors { fc1_w, fc1_b: &mut [], fc2_w, fc2_b: &mut [] }, r)
}

fn views(buf: &[f32]) -> MoeParams<'_> {
    let (router_w, mut rest) = buf.split_at(H * E);
    let mut experts = Vec::new();
    for _ in 0..E {
        let (e, r) = split_expert(rest, F);
        experts.push(e);
        rest = r;
    }
    let (shared, _) = split_expert(rest, FS);
    MoeTensors { router_w, experts, shared: Some(shared) }
}

fn views_mut(buf: &mut [f32]) -> MoeGrads<'_> {
    let (router_w, mut rest) = buf.split_at_mut(H * E);
    let mut experts = Vec::new();
    for _ in 0..E {
        let (e, r) = split_expert_mut(rest, F);
        experts.push(e);
        rest = r;
    }
    let (shared, _) = split_expert_mut(rest, FS);
    MoeTensors { router_w, experts, shared: Some(shared) }
}

#[test]
fn swiglu_expert_backward_matches_finite_differences() {
    let m = 5;
    let (params, x) = (seeded_vec(expert_len(F), 31, 0.5), seeded_vec(m * H, 32, 1.0));
    let probe = Probe::new(m * H, 33);
    let loss = |p: &[f32], x: &[f32]| probe.loss(&expert_forward(&split_expert(p, F).0, H, F, x.to_vec()).0);
    let (_, acts) = expert_forward(&split_expert(&params, F).0, H, F, x.clone());
    assert_eq!((acts.h1.len(), acts.a.len()), (m * 2 * F, m * F), "SwiGLU keeps [gate | up] and the product");
    let mut grads = vec![0.0f32; expert_len(F)];
    let dx = expert_backward(
        &split_expert(&params, F).0,
        &mut split_expert_mut(&mut grads, F).0,
        H,
        F,
        &acts,
        &probe.weights,
    );
    check_directional("swiglu expert dx", &x, &dx, 34, |x| loss(&params, x));
    check_directional("swiglu expert params", &params, &grads, 35, |p| loss(p, &x));
    // The gate half alone (W1's first f columns of every row), where SiLU' enters.
    let gate: Vec<usize> = (0..H).flat_map(|i| (0..F).map(move |j| i * 2 * F + j)).collect();
    let pick = |v: &[f32]| gate.iter().map(|&i| v[i]).collect::<Vec<f32>>();
    let with_gate = |g: &[f32]| {
        let mut p = params.clone();
        gate.iter().zip(g).for_each(|(&i, &v)| p[i] = v);
        loss(&p, &x)
    };
    check_directional("swiglu expert gate", &pick(&params), &pick(&grads), 36, with_gate);
    // An expert with no rows (none routed to it) computes nothing and adds no gradient.
    let (y, a0) = expert_forward(&split_expert(&params, F).0, H, F, Vec::new());
    let mut g0 = vec![0.0f32; expert_len(F)];
    let dx0 = expert_backward(&split_expert(&params, F).0, &mut split_expert_mut(&mut g0, F).0, H, F, &a0, &[]);
    assert!(y.is_empty() && dx0.is_empty() && g0.iter().all(|&v| v == 0.0));
}

#[test]
fn swiglu_moe_mlp_backward_matches_finite_differences() {
    let d = MoeDims {
        hidden: H,
        experts: E,
        top_k: K,
        ffn: F,
        shared_ffn: FS,
        score: RouterScore::Softmax,
        ep_rank: 0,
        ep_size: 1,
    };
    let t = 6;
    // As in `tests.rs`: a seed whose top-k margin (0.1) no ±5e-3 step can close.
    let margin = |router_w: &[f32], x: &[f32]| {
        (0..t)
            .map(|tok| {
                let mut l: Vec<f32> =
                    (0..E).map(|e| (0..H).map(|i| x[tok * H + i] * router_w[i * E + e]).sum()).collect();
                l.sort_by(|a, b| b.total_cmp(a));
                l[K - 1] - l[K]
            })
            .fold(f32::INFINITY, f32::min)
    };
    let (seed, params, x) = (0..50u64)
        .map(|i| 41 + 2 * i)
        .map(|seed| (seed, seeded_vec(flat_len(E), seed, 0.5), seeded_vec(t * H, seed + 100, 1.0)))
        .find(|(_, p, x)| margin(&p[..H * E], x) > 0.1)
        .expect("a seed with a top-k margin of 0.1");
    let probe = Probe::new(t * H, seed);
    let loss = |p: &[f32], x: &[f32]| probe.loss(&moe_forward(&d, &views(p), x, &mut Alone).unwrap().0);
    let (_, acts) = moe_forward(&d, &views(&params), &x, &mut Alone).unwrap();
    let mut grads = vec![0.0f32; flat_len(E)];
    let dx = moe_backward(&d, &views(&params), &acts, &probe.weights, &mut views_mut(&mut grads), &mut Alone).unwrap();
    check_directional("swiglu moe dx", &x, &dx, seed, |x| loss(&params, x));
    check_directional("swiglu moe params", &params, &grads, seed + 1, |p| loss(p, &x));
    let router = |w: &[f32]| {
        let mut p = params.clone();
        p[..H * E].copy_from_slice(w);
        loss(&p, &x)
    };
    check_directional("swiglu router", &params[..H * E], &grads[..H * E], seed + 2, router);
}
