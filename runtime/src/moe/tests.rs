//! The MoE MLP against finite differences (input, router, experts, shared expert; softmax
//! and sigmoid scores) and expert parallelism over threads (ep = 2, 4, 8) against one rank
//! holding every expert: outputs and input gradients bit-identical, weight gradients within
//! f32 rounding of the summation order.

use std::sync::Arc;
use std::thread;

use strata_models::model::RouterScore;
use strata_models::plan::GroupKind;

use super::*;
use crate::comm::Communicator;
use crate::comm::collective::{Group, Mailbox};
use crate::comm::threads::{AbortFlag, ThreadComm};
use crate::gradcheck::{Probe, check_directional, seeded_vec};

const H: usize = 8;
const E: usize = 8;
const K: usize = 2;
const F: usize = 12;
const FS: usize = 10;

fn dims(score: RouterScore, ep_rank: usize, ep_size: usize) -> MoeDims {
    MoeDims { hidden: H, experts: E, top_k: K, ffn: F, shared_ffn: FS, score, ep_rank, ep_size }
}

fn expert_len(f: usize) -> usize {
    2 * H * f + f + H
}

/// Elements of the flat buffer holding the router, `n` experts and the shared expert.
fn flat_len(n: usize) -> usize {
    H * E + n * expert_len(F) + expert_len(FS)
}

fn split_expert(buf: &[f32], f: usize) -> (ExpertTensors<&[f32]>, &[f32]) {
    let (fc1_w, r) = buf.split_at(H * f);
    let (fc1_b, r) = r.split_at(f);
    let (fc2_w, r) = r.split_at(f * H);
    let (fc2_b, r) = r.split_at(H);
    (ExpertTensors { fc1_w, fc1_b, fc2_w, fc2_b }, r)
}

fn split_expert_mut(buf: &mut [f32], f: usize) -> (ExpertTensors<&mut [f32]>, &mut [f32]) {
    let (fc1_w, r) = buf.split_at_mut(H * f);
    let (fc1_b, r) = r.split_at_mut(f);
    let (fc2_w, r) = r.split_at_mut(f * H);
    let (fc2_b, r) = r.split_at_mut(H);
    (ExpertTensors { fc1_w, fc1_b, fc2_w, fc2_b }, r)
}

/// Views of a flat buffer of the router, `n` experts and the shared expert.
fn views(buf: &[f32], n: usize) -> MoeParams<'_> {
    let (router_w, mut rest) = buf.split_at(H * E);
    let mut experts = Vec::new();
    for _ in 0..n {
        let (e, r) = split_expert(rest, F);
        experts.push(e);
        rest = r;
    }
    let (shared, _) = split_expert(rest, FS);
    MoeTensors { router_w, experts, shared: Some(shared) }
}

fn views_mut(buf: &mut [f32], n: usize) -> MoeGrads<'_> {
    let (router_w, mut rest) = buf.split_at_mut(H * E);
    let mut experts = Vec::new();
    for _ in 0..n {
        let (e, r) = split_expert_mut(rest, F);
        experts.push(e);
        rest = r;
    }
    let (shared, _) = split_expert_mut(rest, FS);
    MoeTensors { router_w, experts, shared: Some(shared) }
}

/// The smallest gap, over tokens, between the k-th and (k+1)-th largest router logits:
/// finite differences are valid only while no perturbation flips a selection.
fn selection_margin(router_w: &[f32], x: &[f32]) -> f32 {
    let t = x.len() / H;
    (0..t)
        .map(|tok| {
            let mut l: Vec<f32> = (0..E).map(|e| (0..H).map(|i| x[tok * H + i] * router_w[i * E + e]).sum()).collect();
            l.sort_by(|a, b| b.total_cmp(a));
            l[K - 1] - l[K]
        })
        .fold(f32::INFINITY, f32::min)
}

#[test]
fn moe_mlp_backward_matches_finite_differences() {
    for (score, first_seed) in [(RouterScore::Softmax, 11u64), (RouterScore::Sigmoid, 12)] {
        let d = dims(score, 0, 1);
        let t = 6;
        // A ±5e-3 step on every coordinate moves a logit by at most 5e-3 · 8 · 1 = 0.04
        // (inputs and weights below 1), so a gap of 0.1 between the k-th and (k+1)-th
        // logits keeps every selection: take the first seed from `first_seed` (in steps of
        // 2) whose routing has that margin.
        let (seed, params, x) = (0..50)
            .map(|i| first_seed + 2 * i)
            .map(|seed| (seed, seeded_vec(flat_len(E), seed, 0.5), seeded_vec(t * H, seed + 100, 1.0)))
            .find(|(_, p, x)| selection_margin(&p[..H * E], x) > 0.1)
            .expect("a seed with a top-k margin of 0.1");
        let probe = Probe::new(t * H, seed);
        let loss = |p: &[f32], x: &[f32]| {
            let (out, _) = moe_forward(&d, &views(p, E), x, &mut Alone).unwrap();
            probe.loss(&out)
        };
        let (_, acts) = moe_forward(&d, &views(&params, E), &x, &mut Alone).unwrap();
        let mut grads = vec![0.0f32; flat_len(E)];
        let dx = moe_backward(&d, &views(&params, E), &acts, &probe.weights, &mut views_mut(&mut grads, E), &mut Alone)
            .unwrap();
        check_directional(&format!("moe dx {score:?}"), &x, &dx, seed, |x| loss(&params, x));
        check_directional(&format!("moe params {score:?}"), &params, &grads, seed + 1, |p| loss(p, &x));
        // The router alone (its gradient is small beside the experts').
        let router = |w: &[f32]| {
            let mut p = params.clone();
            p[..H * E].copy_from_slice(w);
            loss(&p, &x)
        };
        check_directional(&format!("router {score:?}"), &params[..H * E], &grads[..H * E], seed + 2, router);
    }
}

/// Runs `f(rank, mailbox)` on `n` threads and returns their results in rank order.
fn on_ranks<T: Send + 'static>(n: u32, f: impl Fn(u32, &mut Mailbox) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let handles: Vec<_> = ThreadComm::group(n, &AbortFlag::default())
        .into_iter()
        .map(|c| {
            let f = f.clone();
            thread::spawn(move || {
                let r = c.rank();
                let mut mb = Mailbox::new(Box::new(c));
                f(r, &mut mb)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The local slice of the full flat buffer for ep rank `r` of `ep`: the router, experts
/// [r·E/ep, (r+1)·E/ep) and the shared expert.
fn local_slice(full: &[f32], r: usize, ep: usize) -> Vec<f32> {
    let n = E / ep;
    let mut out = full[..H * E].to_vec();
    let at = H * E + r * n * expert_len(F);
    out.extend_from_slice(&full[at..at + n * expert_len(F)]);
    out.extend_from_slice(&full[H * E + E * expert_len(F)..]);
    out
}

#[test]
fn expert_parallel_ranks_match_one_rank_holding_every_expert() {
    for ep in [2usize, 4, 8] {
        let full = seeded_vec(flat_len(E), 7, 0.5);
        let t = 5;
        let xs: Vec<Vec<f32>> = (0..ep).map(|r| seeded_vec(t * H, 200 + r as u64, 1.0)).collect();
        let douts: Vec<Vec<f32>> = (0..ep).map(|r| seeded_vec(t * H, 300 + r as u64, 1.0)).collect();
        // One rank: every expert, each rank's tokens in turn, gradients accumulated.
        let d1 = dims(RouterScore::Softmax, 0, 1);
        let mut ref_grads = vec![0.0f32; flat_len(E)];
        let mut ref_out = Vec::new();
        for (x, dout) in xs.iter().zip(&douts) {
            let (out, acts) = moe_forward(&d1, &views(&full, E), x, &mut Alone).unwrap();
            let dx = moe_backward(&d1, &views(&full, E), &acts, dout, &mut views_mut(&mut ref_grads, E), &mut Alone)
                .unwrap();
            ref_out.push((out, dx));
        }
        let (full2, xs2, douts2) = (Arc::new(full.clone()), Arc::new(xs), Arc::new(douts));
        let got = on_ranks(ep as u32, move |r, mb| {
            let r = r as usize;
            let d = dims(RouterScore::Softmax, r, ep);
            let local = local_slice(&full2, r, ep);
            let n = E / ep;
            let group = Group { kind: GroupKind::Ep, members: (0..ep as u32).collect(), position: r };
            let mut ex = MailboxExchange { mailbox: mb, group };
            let (out, acts) = moe_forward(&d, &views(&local, n), &xs2[r], &mut ex).unwrap();
            let mut g = vec![0.0f32; local.len()];
            let dx =
                moe_backward(&d, &views(&local, n), &acts, &douts2[r], &mut views_mut(&mut g, n), &mut ex).unwrap();
            (out, dx, g)
        });
        let close = |a: &[f32], b: &[f32], what: &str| {
            // Against the tensor's largest entry: the expert gradients sum the same rows in
            // another order (by source rank), so they differ by f32 rounding only.
            let scale = b.iter().map(|y| y.abs()).fold(0.0f32, f32::max).max(1e-12);
            let max_abs = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            if std::env::var_os("GRADCHECK_VERBOSE").is_some() {
                eprintln!("ep {ep}: {what}: max |Δ| {max_abs:.2e}, of the largest entry {:.2e}", max_abs / scale);
            }
            assert!(max_abs <= 1e-5 * scale, "ep {ep}: {what} differs by {max_abs:e} (largest entry {scale:e})");
        };
        let mut router = vec![0.0f32; H * E];
        let mut shared = vec![0.0f32; expert_len(FS)];
        for (r, (out, dx, g)) in got.iter().enumerate() {
            // Each token's rows meet the same weights in the same order on either side.
            assert_eq!(out, &ref_out[r].0, "ep {ep}: rank {r}'s output");
            assert_eq!(dx, &ref_out[r].1, "ep {ep}: rank {r}'s input gradient");
            // Local experts' gradients are the reference's for those experts.
            let n = E / ep;
            let at = H * E + r * n * expert_len(F);
            close(&g[H * E..H * E + n * expert_len(F)], &ref_grads[at..at + n * expert_len(F)], "expert gradients");
            // Replicated router and shared expert: the reference's are the sum over ranks
            // (what the data-parallel reduction forms).
            router.iter_mut().zip(&g[..H * E]).for_each(|(a, b)| *a += b);
            shared.iter_mut().zip(&g[H * E + n * expert_len(F)..]).for_each(|(a, b)| *a += b);
        }
        close(&router, &ref_grads[..H * E], "summed router gradient");
        close(&shared, &ref_grads[H * E + E * expert_len(F)..], "summed shared-expert gradient");
    }
}
