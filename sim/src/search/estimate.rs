//! The screening estimate: a closed-form step time for a candidate, in microseconds of
//! arithmetic, used to decide which candidates deserve a full simulation.
//!
//! Per microbatch and pipeline stage i, with the simulator's compute model for every piece
//! and the closed-form network for every collective:
//!
//! - F_i, B_i, W_i: the stage's forward, input-gradient and weight-gradient time (its layers,
//!   plus the embedding on the first stage and the head on the last), tensor-parallel
//!   collectives included (in backward only the part not hidden under weight gradients),
//!   recomputation in B;
//! - pipeline: T_pipe = m · max_i X_i + bubble, X_i = F_i + B_i + W_i; the bubble is the
//!   schedule's closed form in (F_i, B_i, W_i)
//!   ([`strata_models::parallel::Schedule::bubble`]: (p−1)/v · mean_i X_i for GPipe, 1F1B
//!   and interleaved, Narayanan et al.; (p−1) · mean_i (F_i + B_i − W_i) for ZB-H1, Qi et
//!   al.); pipeline messages add 2·(p·v − 1) transfers on the critical path;
//! - data parallelism (gradients in the framework's reduction dtype): the gradient
//!   reduction overlaps the last microbatch's backward (or every microbatch's under
//!   ZeRO-2/3) and only what does not fit under it is exposed, plus the last bucket; ZeRO-1/2's parameter all-gather overlaps the first forward when asked;
//!   ZeRO-3's per-unit gathers overlap each unit's compute;
//! - the optimizer step.
//!
//! Collectives are costed by the closed-form network, or by the profile's measured one when
//! it has one. Shared cores and one-thread ranks (the CPU executor) are left to the
//! simulation.
//!
//! Mixture-of-experts layers (router, all-to-alls, grouped experts, shared experts, router
//! imbalance) and context parallelism (every piece / cp, the K/V exchange) are costed in
//! `estimate/moe_cp.rs`; expert gradients reduce over the expert-data-parallel group (tp·cp·dp/ep
//! ranks), dense ones over the cp·dp ranks of the data-parallel group.
//!
//! The estimate ranks candidates; it is not the prediction. `search` simulates the best
//! estimated candidates in full and ranks by the simulation.

use std::collections::BTreeMap;

use strata_models::Scenario;
use strata_models::accounting::memory::state_bytes_per_param;
use strata_models::accounting::params::{layer_params, stage_params};
use strata_models::accounting::states::scenario_layout;
use strata_models::parallel::Recompute;
use strata_models::plan::cost::{bf16_optimizer_accumulate, optimizer_cost, piece_cost};
use strata_models::plan::schedule::PassTimes;
use strata_models::plan::{CollKind, Phase, Piece, TpSite, Unit, hp_buffer_bytes, unit_tensors};

use crate::compute::ComputeModel;
use crate::net::closed_form::ClosedFormNetwork;
use crate::net::{CalibratedNetwork, CommKind, CommRequest, NcclEnv, NetError};
use crate::profile::HardwareProfile;

mod moe_cp;

/// The network the estimate asks: closed form, or the profile's measured one.
enum EstimateNet {
    ClosedForm(ClosedFormNetwork),
    Calibrated(CalibratedNetwork),
}

/// Caches what many candidates share: collective times by (kind, group ranks, bytes).
pub struct Estimator {
    net: EstimateNet,
    compute: ComputeModel,
    /// The profile's `overlap.tp_slowdown`, for `--tp-comm-overlap`'s GEMMs.
    tp_slowdown: f64,
    comm: BTreeMap<(u8, u32, u32, u64), f64>,
    loads: moe_cp::LoadCache,
}

fn kind_id(k: CommKind) -> u8 {
    match k {
        CommKind::Collective(CollKind::AllReduce) => 0,
        CommKind::Collective(CollKind::ReduceScatter) => 1,
        CommKind::Collective(CollKind::AllGather) => 2,
        CommKind::Collective(CollKind::Broadcast) => 3,
        CommKind::Collective(CollKind::AllToAll) => 4,
        CommKind::SendRecv => 5,
        CommKind::Collective(CollKind::RingExchange) => 6,
    }
}

impl Estimator {
    pub fn new(base: &Scenario, compute: ComputeModel, profile: &HardwareProfile) -> Result<Estimator, NetError> {
        let net = match &profile.network {
            Some(p) => EstimateNet::Calibrated(CalibratedNetwork::new(p)?),
            None => EstimateNet::ClosedForm(ClosedFormNetwork::new(&base.cluster, NcclEnv::default())?),
        };
        Ok(Estimator {
            net,
            compute,
            tp_slowdown: profile.overlap.tp_slowdown,
            comm: BTreeMap::new(),
            loads: BTreeMap::new(),
        })
    }

    /// Seconds of a communication over `n` ranks spaced `stride` apart, starting at rank 0.
    fn comm_s(&mut self, kind: CommKind, n: u32, stride: u32, bytes: u64) -> f64 {
        if n <= 1 || bytes == 0 {
            return 0.0;
        }
        let key = (kind_id(kind), n, stride, bytes);
        if let Some(t) = self.comm.get(&key) {
            return *t;
        }
        let ranks: Vec<u32> = (0..n).map(|i| i * stride).collect();
        let req = CommRequest { kind, ranks, bytes, multiplicity: 1 };
        let ns = match &self.net {
            EstimateNet::ClosedForm(n) => n.cost(&req).time_ns,
            EstimateNet::Calibrated(n) => n.cost_ns(&req),
        };
        let t = ns as f64 * 1e-9;
        self.comm.insert(key, t);
        t
    }

    /// Estimated step time of a candidate, seconds.
    pub fn step_s(&mut self, s: &Scenario) -> f64 {
        let m = &s.model;
        let p = &s.parallel;
        let dtype = s.training.storage_dtype();
        let flash = s.training.flash_attention;
        // The training dtype, so that fp8 runs its linear GEMMs at the fp8 rate; the pieces
        // are one rank's (1/cp of every sequence under context parallelism).
        let train = s.training.dtype;
        let piece = |this: &Estimator, piece, phase| this.compute.cost_s(&piece_cost(m, p, train, flash, piece, phase));
        let e = dtype.bytes();
        let tensor = p.micro_batch as u64 * m.seq_len as u64 * m.hidden as u64 * e / p.cp.max(1) as u64;
        let tp_kind = |k| CommKind::Collective(k);
        // Tensor-parallel collectives of one layer (forward: two reductions, and two gathers
        // under sequence parallelism).
        let (reduce, gather) = if p.sequence_parallel {
            (
                self.comm_s(tp_kind(CollKind::ReduceScatter), p.tp, 1, tensor),
                self.comm_s(tp_kind(CollKind::AllGather), p.tp, 1, tensor),
            )
        } else {
            (self.comm_s(tp_kind(CollKind::AllReduce), p.tp, 1, tensor), 0.0)
        };
        // `--tp-comm-overlap`: each collective Transformer Engine overlaps costs what its GEMM
        // leaves (`crate::tp_overlap`); the others, and all without the flag, stay whole.
        let overlap = s.tp_comm_overlap() && p.tp > 1;
        let slowdown = self.tp_slowdown;
        let site = |this: &Estimator, site: TpSite, piece: Piece, phase: Phase, comm: f64| {
            let Some(first) = crate::tp_overlap::overlapped_gemm(site, piece, phase).filter(|_| overlap) else {
                return comm;
            };
            let c = piece_cost(m, p, train, flash, piece, phase);
            let g = if first { c.gemms.first() } else { c.gemms.last() };
            crate::tp_overlap::exposed_s(comm, g.map_or(0.0, |g| this.compute.gemm_s(g)), p.tp, slowdown)
        };
        let tp_fwd: f64 = [Piece::Attn, Piece::Mlp]
            .iter()
            .map(|&x| {
                site(self, TpSite::Gather, x, Phase::Forward, gather)
                    + site(self, TpSite::Reduce, x, Phase::Forward, reduce)
            })
            .sum();
        let bwd_gather: f64 = [Piece::Attn, Piece::Mlp]
            .iter()
            .map(|&x| site(self, TpSite::Gather, x, Phase::BackwardInput, gather))
            .sum();
        let layer_f: f64 = [Piece::AttnIn, Piece::Attn, Piece::MlpIn, Piece::Mlp, Piece::LayerOut]
            .iter()
            .map(|x| piece(self, *x, Phase::Forward))
            .sum::<f64>()
            + tp_fwd;
        let w_attn = piece(self, Piece::Attn, Phase::BackwardWeight);
        let w_mlp = piece(self, Piece::Mlp, Phase::BackwardWeight);
        let layer_w = w_attn + w_mlp + if p.sequence_parallel { 2.0 * gather } else { 0.0 };
        let recompute = match p.recompute {
            Recompute::None => 0.0,
            Recompute::Selective if !s.training.framework.recomputes_attention_core(s) => 0.0,
            Recompute::Selective => piece(self, Piece::Attn, Phase::Recompute),
            Recompute::Full => layer_f,
        };
        // The backward reductions overlap the weight passes when those run inline.
        let tp_bwd = bwd_gather
            + if p.schedule.splits_backward() {
                2.0 * reduce
            } else {
                (reduce - w_mlp).max(0.0) + (reduce - w_attn).max(0.0)
            };
        let layer_b: f64 = [Piece::LayerOut, Piece::Mlp, Piece::MlpIn, Piece::Attn, Piece::AttnIn]
            .iter()
            .map(|x| piece(self, *x, Phase::BackwardInput))
            .sum::<f64>()
            + tp_bwd
            + recompute;
        let (cp_f, cp_b) = self.cp_exchange(
            s,
            piece(self, Piece::Attn, Phase::Forward),
            piece(self, Piece::Attn, Phase::BackwardInput),
        );
        let (layer_f, layer_b) = (layer_f + cp_f, layer_b + cp_b);
        // A MoE layer runs its router, all-to-alls and experts in place of the dense MLP.
        let moe = self.moe_layer(s);
        let dense_mlp = (
            piece(self, Piece::Mlp, Phase::Forward),
            piece(self, Piece::Mlp, Phase::BackwardInput),
            piece(self, Piece::Mlp, Phase::BackwardWeight),
        );
        let embed_f = piece(self, Piece::Embed, Phase::Forward) + if p.tp > 1 { reduce } else { 0.0 };
        let embed_w = piece(self, Piece::Embed, Phase::BackwardWeight);
        let head_f = piece(self, Piece::FinalNorm, Phase::Forward)
            + piece(self, Piece::Logits, Phase::Forward)
            + piece(self, Piece::Loss, Phase::Forward)
            + gather;
        let head_b = piece(self, Piece::Logits, Phase::BackwardInput)
            + piece(self, Piece::FinalNorm, Phase::BackwardInput)
            + reduce;
        let head_w = piece(self, Piece::Logits, Phase::BackwardWeight);

        // Per stage, per microbatch (all chunks of the stage).
        let stages = p.pp as usize;
        let mut x = Vec::with_capacity(stages);
        let mut times = Vec::with_capacity(stages);
        let mut first_f = 0.0f64;
        let mut last_b = 0.0f64;
        for i in 0..p.pp {
            let layers = p.stage_layers(m, i) as f64;
            let moes = Estimator::moe_layers(s, i) as f64;
            let mut f = layers * layer_f + moes * (moe.f - dense_mlp.0);
            let mut b = layers * layer_b + moes * (moe.b - dense_mlp.1);
            let mut w = layers * layer_w + moes * (moe.w - dense_mlp.2);
            if i == 0 {
                f += embed_f;
                w += embed_w;
            }
            if i == p.pp - 1 {
                f += head_f;
                b += head_b;
                w += head_w;
            }
            // DeepSpeed's BF16_Optimizer: every microbatch's backward ends with its
            // accumulation passes over the stage's parameters (`plan/lower/hp_grads.rs`).
            if s.training.framework.accumulates_hp_grads(s) {
                let params = stage_params(m, p)[i as usize].dense_per_rank();
                let tensors = layers as u64 * unit_tensors(s, Unit::Layer(0)) + 2;
                b += self.compute.cost_s(&bf16_optimizer_accumulate(params, tensors, hp_buffer_bytes(s), false));
            }
            if i == 0 {
                first_f = f;
            }
            last_b = last_b.max(b + w);
            x.push(f + b + w);
            times.push(PassTimes { f, b, w });
        }
        let mb = p.microbatches() as f64;
        let max_x = x.iter().copied().fold(0.0, f64::max);
        let bubble = p.schedule.bubble(p.pp, p.vpp, &times);
        let p2p = self.comm_s(
            CommKind::SendRecv,
            2,
            p.tp * p.cp * p.dp,
            if p.sequence_parallel { tensor / p.tp as u64 } else { tensor },
        );
        // The critical path crosses each of the vpp · pp − 1 virtual-stage boundaries twice
        // (forward and backward).
        let pipe = mb * max_x + bubble + 2.0 * p.pipeline().last_vstage() as f64 * p2p;

        // Data parallelism (the stage with the most parameters): the dense ones, replicated
        // over cp · dp; routed experts reduce over their own group below.
        let psi = stage_params(m, p).iter().map(|sp| sp.dense_per_rank()).max().unwrap_or(0);
        let (w_bytes, opt_g_bytes, _) = state_bytes_per_param(dtype);
        // Gradients travel in the framework's reduction dtype (Megatron-LM's fp32 main
        // gradients, DeepSpeed's bf16, FSDP2's fp32), as the lowering sends them.
        let g_bytes = scenario_layout(s).grad_reduce.bytes();
        let dp_coll = |this: &mut Estimator, kind: CollKind, bytes: u64| {
            // Buckets of the configured size, each a collective of its own.
            let bucket = ((p.grad_bucket_mb * 1024.0 * 1024.0) as u64).max(1);
            let n = bytes.div_ceil(bucket).max(1);
            let per = bytes.div_ceil(n);
            n as f64 * this.comm_s(CommKind::Collective(kind), p.cp * p.dp, p.tp, per)
        };
        // Expert gradients (a MoE model): the stage's local experts, over the ranks of the stage
        // that hold the same experts (tp·cp·dp / ep of them, ep apart).
        let expert_grads = |this: &mut Estimator, kind: CollKind| {
            let Some(moe) = &m.moe else { return 0.0 };
            let up = if m.activation == strata_models::model::Activation::Swiglu { 2 } else { 1 };
            let per_layer =
                (moe.experts / p.ep.max(1)) as u64 * (up + 1) * moe.expert_ffn_hidden as u64 * m.hidden as u64;
            let layers = (0..p.pp).map(|i| Estimator::moe_layers(s, i)).max().unwrap_or(0) as u64;
            let bytes = layers * per_layer * g_bytes;
            let bucket = ((p.grad_bucket_mb * 1024.0 * 1024.0) as u64).max(1);
            let n = bytes.div_ceil(bucket).max(1);
            let group = p.tp * p.cp * p.dp / p.ep.max(1);
            n as f64 * this.comm_s(CommKind::Collective(kind), group, p.ep.max(1), bytes.div_ceil(n))
        };
        let mut exposed = 0.0;
        if p.cp * p.dp > 1 {
            let whole = s.zero_stage() == 0 || s.training.framework.all_reduces_zero1_grads(s);
            let grad_kind = if whole { CollKind::AllReduce } else { CollKind::ReduceScatter };
            let grads = dp_coll(self, grad_kind, psi * g_bytes) + expert_grads(self, grad_kind);
            if p.zero >= 2 {
                // Every microbatch reduce-scatters its gradients, and ZeRO-3 gathers every unit
                // before its forward and its backward: one in-order stream of collectives per
                // microbatch against that microbatch's compute.
                let unit = layer_params(m).per_rank(p.tp) * w_bytes;
                let gathers = if p.zero >= 3 {
                    2.0 * self.comm_s(CommKind::Collective(CollKind::AllGather), p.cp * p.dp, p.tp, unit)
                        * (psi * w_bytes) as f64
                        / unit.max(1) as f64
                } else {
                    0.0
                };
                let overlap = if p.overlap_grad_reduce && p.overlap_param_gather { max_x } else { 0.0 };
                exposed += mb * (grads + gathers - overlap).max(0.0) + grads / mb.max(1.0);
            } else {
                let hidden = if p.overlap_grad_reduce { last_b } else { 0.0 };
                exposed += (grads - hidden).max(0.0) + grads * 0.1;
            }
            if (1..=2).contains(&s.zero_stage()) {
                let gather = dp_coll(self, CollKind::AllGather, psi * w_bytes);
                exposed +=
                    if s.training.framework.overlaps_param_gather(s) { (gather - first_f).max(0.0) } else { gather };
            }
        }
        let shard = if s.zero_stage() >= 1 { psi.div_ceil((p.cp * p.dp) as u64) } else { psi };
        let optimizer = self.compute.cost_s(&optimizer_cost(shard, opt_g_bytes));
        pipe + exposed + optimizer
    }
}
