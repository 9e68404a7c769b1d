//! Analytic memory per rank of each pipeline stage: model states and activations.
//!
//! **Model states** as the scenario's framework keeps them ([`crate::accounting::states`]):
//! Megatron-LM's fp32 main gradients (18 B/param, 6 + 12/d with its distributed optimizer),
//! DeepSpeed's estimators, FSDP2's fp32 shards. Strata's own executor keeps the ZeRO paper's
//! figures (Rajbhandari et al. SC'20): mixed-precision Adam keeps 2Ψ bytes of 16-bit
//! weights, 2Ψ of 16-bit gradients and KΨ of fp32 optimizer state (master weights,
//! momentum, variance; K = 12). ZeRO-1 shards the optimizer state over the N_d
//! data-parallel ranks (4Ψ + KΨ/N_d), ZeRO-2 the gradients too (2Ψ + (2 + K)Ψ/N_d), ZeRO-3
//! the weights too ((4 + K)Ψ/N_d). In fp32 training (the CPU executor) weights and
//! gradients take 4 bytes each and K = 8 (momentum and variance; the weights are the
//! master copy).
//!
//! The framework's formula counts states and activations; what Strata models on top — the
//! transient working sets here, and the simulator's CUDA context, NCCL buffers and allocator
//! slack — is kept apart ([`StageMemory::framework_formula_bytes`],
//! [`StageMemory::strata_extra_bytes`]).
//!
//! **Activations** (Korthikanti et al. 2022, §4 and Table 2), bytes per layer and
//! microbatch with 16-bit activations and 1-byte dropout masks: s·b·h·(34 + 5·a·s/h) with
//! no parallelism; tensor parallelism divides the 24·sbh of QKV/MLP internals and the
//! 5·a·s²·b of attention scores by t; sequence parallelism divides the remaining 10·sbh by
//! t too; selective recomputation drops the 5·a·s²·b; full recomputation keeps only the
//! layer input, 2·sbh. The general form below counts the same tensors for any shape
//! (grouped-query attention, SwiGLU, no dropout for Llama) and reproduces Table 2 for GPT.
//!
//! **In flight**: each schedule says how many microbatch-chunks of l/(p·v) layers a stage
//! holds at its peak ([`crate::parallel::Schedule::in_flight`], checked against its table in
//! [`crate::plan::schedule`]): GPipe all m; 1F1B p − i on stage i; interleaved 1F1B
//! (p − i − 1)·2 + (v − 1)·p + 1 (Megatron-LM's warm-up count plus one), which on the first
//! stage is Korthikanti's factor (1 + (p − 1)/(p·v)) over 1F1B. A schedule that splits the
//! backward keeps a microbatch's activations until its deferred weight pass, and from its
//! input-gradient pass on the output gradients that pass reads ([`weight_grad_bytes`]):
//! its peak is taken over the stage's schedule table.

use serde::Serialize;

use crate::accounting::params::stage_params;
use crate::accounting::states::{StateLayout, formula_buffer_bytes, scenario_layout};
use crate::model::ModelSpec;
use crate::parallel::{ParallelConfig, Recompute};
use crate::plan::schedule::Pass;
use crate::scenario::{Dtype, Scenario};

mod moe;
pub use moe::{moe_layer_activation_bytes, moe_weight_grad_bytes};

/// Bytes of model state per parameter: (weights, gradients, optimizer state).
pub fn state_bytes_per_param(dtype: Dtype) -> (u64, u64, u64) {
    match dtype {
        Dtype::Bf16 | Dtype::Fp16 | Dtype::Fp8 => (2, 2, 12),
        Dtype::Fp32 => (4, 4, 8),
    }
}

/// Model-state bytes of Ψ parameters under a ZeRO stage, as the ZeRO paper counts them
/// (Strata's executor): (weights, gradients, optimizer).
pub fn model_state_bytes(psi: u64, dtype: Dtype, zero: u8, dp: u32) -> (f64, f64, f64) {
    let l = crate::accounting::states::layout(crate::framework::Framework::Strata, dtype, zero, false);
    layout_state_bytes(psi, &l, dp)
}

/// Model-state bytes of Ψ parameters in a framework's layout: (weights, gradients, optimizer).
pub fn layout_state_bytes(psi: u64, l: &StateLayout, dp: u32) -> (f64, f64, f64) {
    let psi = psi as f64;
    (l.weights.bytes_f64(psi, dp), l.grads.bytes_f64(psi, dp), l.optimizer.bytes_f64(psi, dp))
}

/// Whether the model trains with dropout, so that its masks are saved for backward (GPT
/// presets: Megatron's default 0.1; Llama: none; CPU clusters: none).
pub fn has_dropout(m: &ModelSpec) -> bool {
    m.dropout > 0.0
}

/// Activation bytes saved for backward by one transformer layer for one microbatch, split
/// the way Korthikanti's Table 2 splits them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerActivations {
    /// Norm inputs, attention and MLP inputs, dropout masks on the residual path: held whole
    /// by every tp rank unless sequence parallel (Korthikanti's 10·sbh).
    pub replicated: f64,
    /// QKV, attention context, MLP internals: split over tp (Korthikanti's 24·sbh).
    pub sharded: f64,
    /// Attention scores, probabilities and their dropout: split over tp, dropped by selective
    /// recomputation (Korthikanti's 5·a·s²·b).
    pub scores: f64,
}

/// The parts of [`LayerActivations`] before any parallelism or recomputation. With fused
/// (flash) attention the scores are never stored: only the per-row log-sum-exp (fp32).
pub fn layer_activation_parts(m: &ModelSpec, micro_batch: u32, dtype: Dtype, flash: bool) -> LayerActivations {
    let e = dtype.bytes() as f64;
    let sb = m.seq_len as f64 * micro_batch as f64;
    let h = m.hidden as f64;
    let (q, kv) = (m.q_dim() as f64, m.kv_dim() as f64);
    let f = m.ffn_hidden as f64;
    let a = m.heads as f64;
    let s = m.seq_len as f64;
    let mask = if has_dropout(m) { 1.0 } else { 0.0 };
    // LN1 input, QKV input, LN2 input, FC1 input; dropout masks after attention and MLP.
    let replicated = sb * h * (4.0 * e + 2.0 * mask);
    // Q, K, V; attention context (projection input, heads · head_dim wide like Q); MLP
    // internals (2 or 3 tensors of f).
    let mlp_tensors = match m.activation {
        crate::model::Activation::Gelu => 2.0,
        crate::model::Activation::Swiglu => 3.0,
    };
    let sharded = sb * e * (q + 2.0 * kv + q + mlp_tensors * f);
    // Softmax output, and with dropout its mask and output.
    let scores = if flash { a * sb * 4.0 } else { a * s * sb * (e + mask * (1.0 + e)) };
    LayerActivations { replicated, sharded, scores }
}

/// Activation bytes one tp rank saves per layer and microbatch.
pub fn layer_activation_bytes(
    m: &ModelSpec,
    micro_batch: u32,
    dtype: Dtype,
    tp: u32,
    sp: bool,
    recompute: Recompute,
    flash: bool,
) -> f64 {
    let t = tp.max(1) as f64;
    let parts = layer_activation_parts(m, micro_batch, dtype, flash);
    let replicated = if sp { parts.replicated / t } else { parts.replicated };
    match recompute {
        Recompute::None => replicated + parts.sharded / t + parts.scores / t,
        Recompute::Selective => replicated + parts.sharded / t,
        Recompute::Full => layer_input_bytes(m, micro_batch, dtype, tp, sp),
    }
}

/// The output gradients one layer's weight passes read, per microbatch and tp rank, bytes:
/// those of QKV ((q + 2·kv)/t, q = heads · head_dim), the attention projection (h), FC1 (f/t, twice for SwiGLU)
/// and FC2 (h) for every token — the projection's and FC2's whole rows even under sequence
/// parallelism (their inputs are gathered). ZB-H1 keeps them from a layer's input-gradient
/// pass to its deferred weight pass (Qi et al. 2023).
pub fn weight_grad_bytes(m: &ModelSpec, micro_batch: u32, dtype: Dtype, tp: u32) -> f64 {
    piece_weight_grad_bytes(m, micro_batch, dtype, tp, false) + piece_weight_grad_bytes(m, micro_batch, dtype, tp, true)
}

/// The output gradients of one piece's two GEMMs, per microbatch and tp rank, bytes: the
/// attention's (QKV and projection) or the MLP's (FC1 and FC2) share of
/// [`weight_grad_bytes`]. Without a split backward they live from the piece's input-gradient
/// pass through its weight pass, which follows at once: autograd holds a linear layer's
/// output gradient for both products (Megatron-LM's `LinearWithGradAccumulationAndAsync
/// Communication.backward`), and Strata's executors drop them after the weight pass.
pub fn piece_weight_grad_bytes(m: &ModelSpec, micro_batch: u32, dtype: Dtype, tp: u32, mlp: bool) -> f64 {
    let t = tp.max(1) as f64;
    let tokens = m.seq_len as f64 * micro_batch as f64;
    let wide = if mlp {
        m.ffn_hidden as f64 / t * if m.activation == crate::model::Activation::Swiglu { 2.0 } else { 1.0 }
    } else {
        (m.q_dim() as f64 + 2.0 * m.kv_dim() as f64) / t
    };
    tokens * (wide + m.hidden as f64) * dtype.bytes() as f64
}

/// The tensors passed between one pass's pieces at their largest, per microbatch and tp
/// rank, bytes, in units of one whole microbatch's activation (T·h·e, T = b·s tokens) and
/// of a rank's part of it (T_l·h·e: T/t under sequence parallelism, else T):
/// - forward: the residual stream (T_l) and a piece's normed input, gathered whole under
///   sequence parallelism (T);
/// - backward: the residual gradient (T_l), a piece's partial input gradient before its
///   tensor-parallel reduction (T) and, under sequence parallelism, the piece's saved input
///   gathered again for its weight gradient (T; Megatron-LM gathers it into its global
///   memory buffer, `LinearWithGradAccumulationAndAsyncCommunication.backward`); under full
///   recomputation at least the residual gradient beside the recomputed forward's own
///   (T_l + T_l + T);
/// - a split backward's input pass: the residual gradient and the partial input gradient
///   (T_l + T), or the recomputation's as above; its weight pass: the re-gathered input
///   under sequence parallelism (T), else nothing.
///
/// The lowering holds this per pass ("work c… mb…", from the pass's start to its last
/// compute); the CPU executor measures the pass's in-flight tensors under it.
pub fn pass_workspace_bytes(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype, pass: Pass) -> u64 {
    let sp = p.sequence_parallel;
    let whole = p.micro_batch as u64 * m.seq_len as u64 * m.hidden as u64 * dtype.bytes();
    let part = if sp { whole / p.tp.max(1) as u64 } else { whole };
    let regathered = if sp { whole } else { 0 };
    let recomputed = if p.recompute == Recompute::Full { part + part + whole } else { 0 };
    match pass {
        Pass::Forward => part + whole,
        Pass::BackwardInput => (part + whole).max(recomputed),
        Pass::Backward => (part + whole + regathered).max(recomputed),
        Pass::BackwardWeight => regathered,
    }
}

/// The head's buffer per microbatch and tp rank, bytes: the final norm's input and output
/// (2·e·s·b·h; ÷ t under sequence parallelism) and the fp32 logits of the rank's vocabulary
/// shard (4·s·b·⌈v/t⌉), held from the head's forward to its backward. The lowering allocates
/// exactly this ("head mb…"); the stage estimate counts it per microbatch held.
pub fn head_buffer_bytes(m: &ModelSpec, micro_batch: u32, dtype: Dtype, tp: u32, sp: bool) -> u64 {
    let t = tp.max(1) as u64;
    let sb = micro_batch as u64 * m.seq_len as u64;
    let sbh = sb * m.hidden as u64;
    let norm = 2 * dtype.bytes() * if sp { sbh / t } else { sbh };
    let logits = 4 * sb * (m.vocab as u64).div_ceil(t);
    norm + logits
}

/// The peak of a split-backward schedule over its table, in units of one microbatch-layer's activations
/// (`act`) and deferred output gradients (`wgrad`): max over the passes of
/// live·act + pending·wgrad, with a microbatch live from its forward to its weight pass and
/// pending from its input-gradient pass to its weight pass.
fn split_backward_peak(p: &ParallelConfig, stage: u32, act: f64, wgrad: f64) -> f64 {
    let (mut live, mut pending, mut peak) = (0.0, 0.0, 0.0f64);
    for slot in crate::plan::schedule::table(p.schedule, p.pp, p.vpp, p.microbatches(), stage) {
        use crate::plan::schedule::Pass;
        match slot.pass {
            Pass::Forward => live += 1.0,
            Pass::BackwardInput => pending += 1.0,
            Pass::Backward | Pass::BackwardWeight => {}
        }
        peak = peak.max(live * act + pending * wgrad);
        if matches!(slot.pass, Pass::Backward | Pass::BackwardWeight) {
            live -= 1.0;
            if slot.pass == Pass::BackwardWeight {
                pending -= 1.0;
            }
        }
    }
    peak
}

/// The residual-stream input of a layer (what full recomputation keeps, and what a pipeline
/// stage sends): s·b·h elements, split over tp under sequence parallelism.
pub fn layer_input_bytes(m: &ModelSpec, micro_batch: u32, dtype: Dtype, tp: u32, sp: bool) -> f64 {
    let b = m.seq_len as f64 * micro_batch as f64 * m.hidden as f64 * dtype.bytes() as f64;
    if sp { b / tp.max(1) as f64 } else { b }
}

/// The largest buffers one context-parallel attention holds beside the saved activations
/// (cp > 1; 0 otherwise), bytes, with kv = b·(s/cp)·2·(kv/t)·e the rank's keys and values:
/// ring attention's two K/V receive buffers and, in backward, two dK/dV buffers (4·kv);
/// all-gather's gathered K/V and, in backward, the full dK/dV (2·cp·kv); Ulysses' Q/K/V and
/// output in head layout (b·(s/cp)·(2·q + 2·kv)/t·e, q = heads · head_dim). The lowering allocates exactly these.
pub fn cp_exchange_bytes(s: &Scenario) -> u64 {
    let (m, p) = (&s.model, &s.parallel);
    if p.cp <= 1 {
        return 0;
    }
    let (t, e) = (p.tp.max(1) as u64, s.training.storage_dtype().bytes());
    let tokens = p.micro_batch as u64 * m.seq_len as u64 / p.cp as u64;
    let kv = tokens * 2 * (m.kv_dim() / t) * e;
    match p.cp_comm {
        crate::parallel::CpComm::Ring => (2.min(p.cp as u64 - 1) + 2) * kv,
        crate::parallel::CpComm::AllGather => 2 * p.cp as u64 * kv,
        crate::parallel::CpComm::Ulysses => tokens * (2 * m.q_dim() / t) * e + kv,
    }
}

/// Whether a layer's attention saves only each row's log-sum-exp (fp32, a·s·b·4 bytes) and
/// not its probabilities: with fused attention, and always under context parallelism, whose
/// block attention keeps the log-sum-exp to merge blocks and recomputes each block's
/// probabilities in the backward (Transformer Engine's fused kernels; the CPU executor's
/// `attention_cp`). The activations of the plan and of the analytic model both ask this.
pub fn saves_lse_only(s: &Scenario) -> bool {
    s.training.flash_attention || s.parallel.cp > 1
}

/// What a context-parallel layer saves beyond its s/cp share of the activations, bytes per
/// microbatch: under Ulysses the attention output in head layout (b·(s/cp)·q/t·e) that the
/// core's backward reads beside the projection's sequence-layout input (TE's
/// `AttnFuncWithCPAndQKVOA2A` saves both; its Q/K/V in head layout replace those in sequence
/// layout). Nothing under full recomputation, which keeps the layer input only.
pub fn cp_saved_extra_bytes(s: &Scenario) -> u64 {
    let (m, p) = (&s.model, &s.parallel);
    if p.cp <= 1 || p.cp_comm != crate::parallel::CpComm::Ulysses || p.recompute == Recompute::Full {
        return 0;
    }
    let tokens = p.micro_batch as u64 * m.seq_len as u64 / p.cp as u64;
    tokens * (m.q_dim() / p.tp.max(1) as u64) * s.training.storage_dtype().bytes()
}

/// Microbatch-chunks whose activations a stage holds at its peak.
pub fn in_flight(p: &ParallelConfig, stage: u32) -> u64 {
    p.schedule.in_flight(p.pp, p.vpp, p.microbatches(), stage)
}

/// Memory of one rank of a pipeline stage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageMemory {
    pub stage: u32,
    /// Parameters one rank of this stage holds (before ZeRO sharding).
    pub params: u64,
    pub weights_bytes: f64,
    pub grads_bytes: f64,
    pub optimizer_bytes: f64,
    /// Saved activations of the transformer layers at the schedule's peak.
    pub activations_bytes: f64,
    /// Embedding output (first stage) and logits / output-layer buffers (last stage).
    pub embedding_logits_bytes: f64,
    /// Largest transient working set on top (the backward's tensors between pieces and a
    /// piece's output gradients; a recomputed layer under full recomputation; a gathered
    /// layer under ZeRO-3): what Strata models beyond the framework's formula.
    pub transient_bytes: f64,
    /// What the framework's own formula counts beside the states that the plan holds
    /// differently (DeepSpeed ZeRO-3's 4·P_largest: the largest module's 16-bit weights and
    /// gradients gathered whole, where the plan gathers layers, in `transient_bytes`). Not
    /// part of [`StageMemory::total_bytes`].
    pub formula_only_bytes: f64,
}

impl StageMemory {
    /// Weights, gradients and optimizer state.
    pub fn states_bytes(&self) -> f64 {
        self.weights_bytes + self.grads_bytes + self.optimizer_bytes
    }

    /// What the framework's own formula counts: the states (with its own buffer term) and
    /// the activations.
    pub fn framework_formula_bytes(&self) -> f64 {
        self.states_bytes() + self.formula_only_bytes + self.activations_bytes + self.embedding_logits_bytes
    }

    /// What Strata's plan holds beyond the formula's states and activations (the simulator
    /// adds the CUDA context, NCCL buffers and allocator slack on top).
    pub fn strata_extra_bytes(&self) -> f64 {
        self.transient_bytes
    }

    /// The plan's buffers at their peak: states, activations and transients.
    pub fn total_bytes(&self) -> f64 {
        self.weights_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.embedding_logits_bytes
            + self.transient_bytes
    }
}

/// Analytic memory of every pipeline stage.
pub fn stage_memory(s: &Scenario) -> Vec<StageMemory> {
    let m = &s.model;
    let p = &s.parallel;
    let dtype = s.training.storage_dtype();
    let t = p.tp as f64;
    let b = p.micro_batch;
    // Context parallelism: every activation holds s/cp tokens of a sequence, the core's
    // log-sum-exp too (no probabilities are saved, `saves_lse_only`).
    let c = p.cp.max(1) as f64;
    let sbh = m.seq_len as f64 * b as f64 * m.hidden as f64 / c;
    let flash = saves_lse_only(s);
    let per_layer = layer_activation_bytes(m, b, dtype, p.tp, p.sequence_parallel, p.recompute, flash) / c
        + cp_saved_extra_bytes(s) as f64;
    let layout = scenario_layout(s);
    let formula_only_bytes = formula_buffer_bytes(s);
    // The larger piece's output gradients held through its weight pass: the MLP's where a
    // dense layer has one, else the attention's (a MoE layer's MLP holds its own).
    let dense = (0..m.layers).any(|l| !m.is_moe_layer(l));
    let piece_wgrad = piece_weight_grad_bytes(m, b, dtype, p.tp, false).max(if dense {
        piece_weight_grad_bytes(m, b, dtype, p.tp, true)
    } else {
        0.0
    });
    // The pass's tensors between pieces, at the backward's (the activation peak's) size.
    let pass = if p.schedule.splits_backward() { Pass::BackwardInput } else { Pass::Backward };
    let workspace = pass_workspace_bytes(m, p, dtype, pass) as f64 / c;
    stage_params(m, p)
        .into_iter()
        .map(|sp| {
            let psi = sp.per_rank();
            let (weights_bytes, grads_bytes, optimizer_bytes) = crate::accounting::states::stage_state_bytes(s, &sp);
            // A MoE model's layers save what `moe::moe_stage` counts.
            let moe = (m.moe.is_some() || m.mtp_layers > 0).then(|| moe::moe_stage(s, &sp));
            let per_layer = moe.as_ref().map_or(per_layer, |x| x.per_layer);
            // Layers per microbatch-chunk: the stage's layers over its chunks (uneven splits
            // average out).
            let layers_per_chunk = sp.layers as f64 / p.vpp as f64;
            let activations_bytes = if p.schedule.splits_backward() {
                let wgrad = moe.as_ref().map_or_else(|| weight_grad_bytes(m, b, dtype, p.tp) / c, |x| x.wgrad);
                layers_per_chunk * split_backward_peak(p, sp.stage, per_layer, wgrad)
            } else {
                in_flight(p, sp.stage) as f64 * layers_per_chunk * per_layer
            };
            let first = sp.stage == 0;
            let last = sp.stage == p.pp - 1;
            let mtp_act = moe.as_ref().map_or(0.0, |x| x.mtp_act) * in_flight(p, sp.stage) as f64;
            let activations_bytes = activations_bytes + mtp_act;
            // Microbatches in flight on this stage (for the embedding and logits buffers).
            let mbs_in_flight = p.schedule.edge_in_flight(p.pp, p.vpp, p.microbatches(), sp.stage) as f64;
            let mut embedding_logits_bytes = 0.0;
            if first && has_dropout(m) {
                // Dropout mask on the embedding output, per microbatch in flight.
                let shard = if p.sequence_parallel { t } else { 1.0 };
                embedding_logits_bytes += mbs_in_flight * sbh / shard;
            }
            if last {
                // Final-norm input and output (16-bit), and fp32 logits of the vocabulary shard,
                // held from the head's forward to its backward: one microbatch under 1F1B, all
                // of them under GPipe; a split backward keeps each output-layer input until its
                // deferred weight pass.
                let held = mbs_in_flight;
                embedding_logits_bytes +=
                    held * (head_buffer_bytes(m, b, dtype, p.tp, p.sequence_parallel) / p.cp.max(1) as u64) as f64;
                embedding_logits_bytes += held * moe.as_ref().map_or(0.0, |x| x.mtp_head);
            }
            let mut transient_bytes = cp_exchange_bytes(s) as f64 + workspace;
            if !p.schedule.splits_backward() {
                // One piece's output gradients, from its input pass through its weight pass
                // (`piece_weight_grad_bytes`; a split backward counts them in `wgrad`): the
                // MLP's where a dense layer has one, else the attention's.
                transient_bytes += piece_wgrad / c;
            }
            if p.recompute == Recompute::Full {
                transient_bytes += moe.as_ref().map_or_else(
                    || layer_activation_bytes(m, b, dtype, p.tp, p.sequence_parallel, Recompute::None, flash) / c,
                    |x| x.full_rc,
                );
            } else if p.recompute == Recompute::Selective && !flash {
                transient_bytes += layer_activation_parts(m, b, dtype, false).scores / t / c;
            }
            if p.zero >= 3 {
                use crate::framework::mechanics::Gathering;
                let gathered = match s.training.framework.zero3_gathering(s) {
                    // DeepSpeed: the modules of a piece and those its fetch prefetched.
                    Gathering::PerModule(mech) => {
                        let pieces: Vec<Vec<u64>> = [crate::plan::Piece::Attn, crate::plan::Piece::Mlp]
                            .into_iter()
                            .map(|piece| crate::plan::lower::piece_modules(m, p.tp, piece, mech.persistence_threshold))
                            .collect();
                        mech.pass_peak(&pieces, sp.layers.max(1) as usize) as f64
                    }
                    // One layer's weights gathered whole (plus the next one prefetched).
                    Gathering::PerUnit => {
                        let layer = crate::accounting::params::layer_params(m).per_rank(p.tp) as f64;
                        let prefetch = if p.overlap_param_gather { 2.0 } else { 1.0 };
                        prefetch * layer
                    }
                };
                transient_bytes += gathered * state_bytes_per_param(dtype).0 as f64;
            }
            if p.zero >= 2 {
                // The full gradient of the largest unit, before its reduce-scatter, in the
                // framework's reduction dtype (fp32 for FSDP2).
                let layer = moe
                    .as_ref()
                    .map_or_else(|| crate::accounting::params::layer_params(m).per_rank(p.tp), |x| x.largest_unit);
                let vocab = if first || last { m.vocab as u64 * m.hidden as u64 / p.tp as u64 } else { 0 };
                if s.training.framework.accumulates_unsharded(s) {
                    // torchtitan with a pipeline accumulates every unit's gradient unsharded
                    // until the step's one reduce-scatter (`Framework::accumulates_unsharded`),
                    // allocated by the first backward. A later forward adds its activations on
                    // top; under GPipe none follows, and the first backward has freed one
                    // microbatch's activations by the time they are all allocated.
                    let acc = (psi * layout.grad_reduce.bytes()) as f64;
                    transient_bytes += if p.schedule == crate::parallel::Schedule::Gpipe {
                        (acc - layers_per_chunk * per_layer).max(0.0)
                    } else {
                        acc
                    };
                } else {
                    transient_bytes += (layer.max(vocab) * layout.grad_reduce.bytes()) as f64;
                }
            }
            StageMemory {
                stage: sp.stage,
                params: psi,
                weights_bytes,
                grads_bytes,
                optimizer_bytes,
                activations_bytes,
                embedding_logits_bytes,
                transient_bytes,
                formula_only_bytes,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::Schedule;

    fn gb(x: f64) -> f64 {
        x / 1e9
    }

    /// Korthikanti et al. 2022 Table 2, in units of s·b·h bytes, for a GPT shape.
    fn table2(m: &ModelSpec, t: f64) -> [(bool, Recompute, bool, f64); 6] {
        let a = m.heads as f64;
        let s = m.seq_len as f64;
        let h = m.hidden as f64;
        [
            // (tp > 1, recompute, sp, expected / sbh)
            (false, Recompute::None, false, 34.0 + 5.0 * a * s / h),
            (true, Recompute::None, false, 10.0 + 24.0 / t + 5.0 * a * s / (h * t)),
            (true, Recompute::None, true, 34.0 / t + 5.0 * a * s / (h * t)),
            (true, Recompute::Selective, false, 10.0 + 24.0 / t),
            (true, Recompute::Selective, true, 34.0 / t),
            (false, Recompute::Full, false, 2.0),
        ]
    }

    #[test]
    fn korthikanti_table2_for_four_model_shapes() {
        for name in ["gpt-22b", "gpt3-175b", "gpt-530b", "gpt-1t"] {
            let m = ModelSpec::preset(name).unwrap();
            let sbh = m.seq_len as f64 * 2.0 * m.hidden as f64;
            for (tp_on, rc, sp, expected) in table2(&m, 8.0) {
                let tp = if tp_on { 8 } else { 1 };
                let ours = layer_activation_bytes(&m, 2, Dtype::Bf16, tp, sp, rc, false) / sbh;
                assert!((ours - expected).abs() < 1e-9, "{name} tp{tp} {rc:?} sp={sp}: {ours} vs {expected}");
            }
        }
    }

    #[test]
    fn selective_recompute_saves_70_and_65_percent() {
        // Korthikanti §5: selective recomputation cuts activation memory by 70% for GPT-3
        // and 65% for MT-NLG (tp = 8, with sequence parallelism as in their runs).
        for (name, saving) in [("gpt3-175b", 0.70), ("gpt-530b", 0.65)] {
            let m = ModelSpec::preset(name).unwrap();
            let full = layer_activation_bytes(&m, 1, Dtype::Bf16, 8, true, Recompute::None, false);
            let sel = layer_activation_bytes(&m, 1, Dtype::Bf16, 8, true, Recompute::Selective, false);
            let ours = 1.0 - sel / full;
            assert!((ours - saving).abs() < 0.01, "{name}: {ours:.3} vs {saving}");
        }
    }

    #[test]
    fn zero_table1_all_54_cells() {
        // Rajbhandari et al. SC'20 Table 1 (models/tests/data/zero_sc20_table1.csv):
        // model-state GB per device for Ψ = 7.5 B, 128 B, 1 T at N_d = 1 … 1024, K = 12.
        let text = include_str!("../../tests/data/zero_sc20_table1.csv");
        let mut cells = 0;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split(',').collect();
            let nd: u32 = f[0].parse().unwrap();
            for (i, psi) in [7.5e9, 128e9, 1e12].iter().enumerate() {
                for stage in 1..=3u8 {
                    let published: f64 = f[1 + i * 3 + (stage as usize - 1)].parse().unwrap();
                    let (w, g, o) = model_state_bytes(*psi as u64, Dtype::Bf16, stage, nd);
                    let ours = gb(w + g + o);
                    // The table rounds to 3 significant digits (and 0.12 / 0.47 / 1.88 to 2 decimals).
                    let tol = (published * 0.005).max(0.006);
                    assert!((ours - published).abs() <= tol, "Ψ={psi} N_d={nd} stage {stage}: {ours} vs {published}");
                    cells += 1;
                }
            }
        }
        assert_eq!(cells, 54);
    }

    #[test]
    fn interleaving_multiplies_first_stage_activations_by_korthikanti_factor() {
        let m = ModelSpec::preset("gpt3-175b").unwrap();
        let base = ParallelConfig { tp: 8, pp: 8, dp: 1, global_batch: 64, ..Default::default() };
        let layers = |p: &ParallelConfig| p.chunk_layers(&m, 0).len() as u64;
        let c1 = in_flight(&base, 0) * layers(&base);
        let inter = ParallelConfig { vpp: 3, schedule: Schedule::Interleaved, ..base.clone() };
        let c3 = in_flight(&inter, 0) * layers(&inter);
        let ratio = c3 as f64 / c1 as f64;
        let expected = 1.0 + (8.0 - 1.0) / (8.0 * 3.0);
        assert!((ratio - expected).abs() < 1e-12, "{ratio} vs {expected}");
    }

    #[test]
    fn one_f_one_b_holds_p_minus_i_and_gpipe_holds_m() {
        let p = ParallelConfig { pp: 4, global_batch: 8, ..Default::default() };
        assert_eq!(in_flight(&p, 0), 4);
        assert_eq!(in_flight(&p, 3), 1);
        let g = ParallelConfig { schedule: Schedule::Gpipe, ..p };
        assert_eq!(in_flight(&g, 3), 8);
    }

    /// Qi et al. §2.2: ZB-H2's first stage holds 2p − 1 microbatches' activations where
    /// ZB-H1's holds p, each plus the one deferred weight pass's output gradients it is
    /// about to run.
    #[test]
    fn zb_h2_first_stage_holds_2p_minus_1_microbatches() {
        let text = |schedule: &str| {
            format!(
                "[model]\npreset = \"gpt3-175b\"\n[cluster]\npreset = \"dgx-a100\"\nnodes = 128\n\
                 [parallel]\ntp = 8\npp = 8\ndp = 16\nschedule = \"{schedule}\"\nmicro_batch = 1\n\
                 global_batch = 1536\nzero = 1\nrecompute = \"selective\"\nsequence_parallel = true\n\
                 [training]\nframework = \"strata\"\n"
            )
        };
        let s1 = Scenario::from_toml(&text("zb-h1"), "t", "t", &[]).unwrap();
        let s2 = Scenario::from_toml(&text("zb-h2"), "t", "t", &[]).unwrap();
        let (p, dtype, flash) = (&s2.parallel, s2.training.storage_dtype(), s2.training.flash_attention);
        let act = layer_activation_bytes(&s2.model, 1, dtype, 8, true, Recompute::Selective, flash);
        let wgrad = weight_grad_bytes(&s2.model, 1, dtype, 8);
        let layers = p.stage_layers(&s2.model, 0) as f64;
        let (h1, h2) = (stage_memory(&s1)[0].activations_bytes, stage_memory(&s2)[0].activations_bytes);
        let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
        assert!(close(h1, layers * (8.0 * act + wgrad)), "zb-h1 {h1}");
        assert!(close(h2, layers * (15.0 * act + wgrad)), "zb-h2 {h2}");
    }
}
