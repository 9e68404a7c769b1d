//! The screening estimate's mixture-of-experts and context-parallel terms, per rank and
//! microbatch (the parent module adds them to a layer's passes).
//!
//! **MoE layer** (expert tensor parallelism 1, as the rank grid cuts it; a rank's tokens
//! T = b·s/(cp·tp), split over tp as sequence parallelism does): the router's gate GEMM
//! (T × E × h), the dispatch and combine all-to-alls over the ep ranks (T·k token copies of h
//! elements each; fp8 dispatch under fp8 training at (1 + 4/128)/2 of bf16, DeepEP's count),
//! the local experts as one grouped GEMM (E/ep experts of T·k·ep/E rows each, balanced;
//! `ComputeModel::grouped_s`), the shared experts as a dense MLP over the rank's tokens. The
//! experts' compute and the all-to-all bytes are scaled by the expected most loaded rank's
//! load (the mean over 8 seeded draws of `crate::router` at the model's Gini): the group waits
//! for it. Backward: dgrad and wgrad GEMMs, the two all-to-alls again. Under
//! `moe_a2a_overlap` a forward and a backward run merged, so the pair's four all-to-alls
//! are hidden under the MoE layer's compute of both passes, only the excess exposed.
//!
//! **Context parallelism** (cp > 1): every piece's cost is the full sequence's / cp (with
//! TE's load-balanced chunks each rank holds 1/cp of the queries, whose causal attention
//! covers 1/cp of the score matrix), plus the exchange: ring — cp − 1 steps of the rank's
//! K/V chunk (2·(s/cp)·b·g·d bytes, g = kv heads/tp; dK/dV too in backward, twice that), each
//! hidden under one step of attention compute, only the excess exposed; all-gather — the K/V
//! all-gather forward and the dK/dV reduce-scatter backward, exposed; Ulysses — all-to-alls of
//! Q/K/V and of the output each way, exposed.

use std::collections::BTreeMap;

use strata_models::model::Activation;
use strata_models::parallel::CpComm;
use strata_models::plan::{CollKind, Gemm};
use strata_models::{Dtype, Scenario};

use super::Estimator;
use crate::net::CommKind;
use crate::router::RouterLoads;

/// One MoE layer's time per rank and microbatch, split as the passes are.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MoeLayer {
    pub f: f64,
    pub b: f64,
    pub w: f64,
}

/// Expected max-over-ranks load ÷ balanced, by (experts, ep, Gini bits, capacity bits).
pub(super) type LoadCache = BTreeMap<(u32, u32, u64, u64), f64>;

fn expected_max_load(cache: &mut LoadCache, s: &Scenario) -> f64 {
    let (m, p) = (&s.model, &s.parallel);
    let Some(moe) = &m.moe else { return 1.0 };
    let gini = crate::router::model_gini(m).unwrap_or(0.0);
    let cap = moe.capacity_factor.unwrap_or(0.0);
    let key = (moe.experts, p.ep, gini.to_bits(), cap.to_bits());
    *cache.entry(key).or_insert_with(|| {
        let grid = strata_models::plan::RankGrid::new(1, p.ep.max(1), 1, p.ep.max(1)).with_cp_ep(1, p.ep.max(1));
        let mut loads = RouterLoads::with(moe.experts, gini, moe.capacity_factor, 0x5eed, grid);
        (0..8).map(|mb| loads.rank_loads(0, 0, mb).1).sum::<f64>() / 8.0
    })
}

impl Estimator {
    /// One MoE layer's passes for candidate `s` (zero for a dense model).
    pub(super) fn moe_layer(&mut self, s: &Scenario) -> MoeLayer {
        let (m, p) = (&s.model, &s.parallel);
        let Some(moe) = &m.moe else { return MoeLayer::default() };
        let dtype = s.training.storage_dtype();
        let e = dtype.bytes() as f64;
        let fp8 = s.training.dtype == Dtype::Fp8;
        let (h, f) = (m.hidden as u64, moe.expert_ffn_hidden as u64);
        let tokens = (p.micro_batch as u64 * m.seq_len as u64 / (p.cp * p.tp) as u64).max(1);
        let (experts, k, ep) = (moe.experts.max(1) as u64, moe.top_k as u64, p.ep.max(1) as u64);
        let local = (experts / ep).max(1);
        let rows = (tokens * k * ep).div_ceil(experts);
        let swiglu = m.activation == Activation::Swiglu;
        let up = if swiglu { 2 * f } else { f };
        let g = |m, n, k| Gemm { m, n, k, batch: 1, fp8 };
        let group = |v: [Gemm; 2]| -> Vec<Gemm> { (0..local).flat_map(|_| v).collect() };
        let phi = expected_max_load(&mut self.loads, s);
        let experts_f = phi * self.compute.grouped_s(&group([g(rows, up, h), g(rows, h, f)]));
        let experts_b = phi * self.compute.grouped_s(&group([g(rows, h, up), g(rows, f, h)]));
        let experts_w = phi * self.compute.grouped_s(&group([g(h, up, rows), g(f, h, rows)]));
        // The gate and its gradient stay in bf16 (DeepSeek-V3 §3.3).
        let gate = Gemm { m: tokens, n: experts, k: h, batch: 1, fp8: false };
        let router = self.compute.gemm_s(&gate);
        let copies = (tokens * k) as f64 * h as f64 * phi;
        let a2a = |this: &mut Estimator, bytes: f64| {
            this.comm_s(CommKind::Collective(CollKind::AllToAll), p.ep, 1, bytes.ceil() as u64)
        };
        let dispatch = a2a(self, copies * if fp8 { 1.0 + 4.0 / 128.0 } else { e });
        let combine = a2a(self, copies * e);
        let shared = if moe.shared_experts > 0 {
            let mut sm = m.clone();
            sm.ffn_hidden = moe.shared_experts * moe.shared_ffn_hidden;
            sm.moe = None;
            let cost = |phase| {
                let c = strata_models::plan::cost::piece_cost(
                    &sm,
                    p,
                    dtype,
                    s.training.flash_attention,
                    strata_models::plan::Piece::Mlp,
                    phase,
                );
                self.compute.cost_s(&c) / p.cp as f64
            };
            use strata_models::plan::Phase;
            [cost(Phase::Forward), cost(Phase::BackwardInput), cost(Phase::BackwardWeight)]
        } else {
            [0.0; 3]
        };
        let (f, b, w) = (router + experts_f + shared[0], 2.0 * router + experts_b + shared[1], experts_w + shared[2]);
        if p.moe_a2a_overlap && p.ep > 1 {
            // A backward merged with a forward: the four all-to-alls of the pair run under
            // the two passes' compute, only the excess exposed.
            let excess = (2.0 * (dispatch + combine) - (f + b + w)).max(0.0);
            return MoeLayer { f: f + excess / 2.0, b: b + excess / 2.0, w };
        }
        MoeLayer { f: f + dispatch + combine, b: b + combine + dispatch, w }
    }

    /// The context-parallel exchange one layer exposes, (forward, backward), given the
    /// rank's attention time per microbatch in each (already / cp).
    pub(super) fn cp_exchange(&mut self, s: &Scenario, attn_f: f64, attn_b: f64) -> (f64, f64) {
        let (m, p) = (&s.model, &s.parallel);
        if p.cp <= 1 {
            return (0.0, 0.0);
        }
        let e = s.training.storage_dtype().bytes();
        let (cp, tp) = (p.cp, p.tp);
        let chunk = p.micro_batch as u64 * (m.seq_len / cp) as u64 * m.head_dim() * e;
        let kv = 2 * chunk * (m.kv_heads / tp).max(1) as u64;
        let coll = |this: &mut Estimator, kind, bytes| this.comm_s(CommKind::Collective(kind), cp, tp, bytes);
        match p.cp_comm {
            CpComm::Ring => {
                let steps = (cp - 1) as f64;
                let fwd = coll(self, CollKind::RingExchange, kv);
                let bwd = coll(self, CollKind::RingExchange, 2 * kv);
                (steps * (fwd - attn_f / cp as f64).max(0.0), steps * (bwd - attn_b / cp as f64).max(0.0))
            }
            CpComm::AllGather => {
                let whole = kv * cp as u64;
                (coll(self, CollKind::AllGather, whole), coll(self, CollKind::ReduceScatter, whole))
            }
            CpComm::Ulysses => {
                let qkv = chunk * ((m.heads + 2 * m.kv_heads) / tp).max(1) as u64;
                let out = chunk * (m.heads / tp).max(1) as u64;
                let t = coll(self, CollKind::AllToAll, qkv) + coll(self, CollKind::AllToAll, out);
                (t, t)
            }
        }
    }

    /// MoE layers on pipeline stage `stage` (all its chunks).
    pub(super) fn moe_layers(s: &Scenario, stage: u32) -> u32 {
        let (m, p) = (&s.model, &s.parallel);
        if m.moe.is_none() {
            return 0;
        }
        (0..p.vpp).flat_map(|c| p.chunk_layers(m, p.pipeline().vstage(c, stage))).filter(|&l| m.is_moe_layer(l)).count()
            as u32
    }
}
