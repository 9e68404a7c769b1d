//! The per-rank shapes of a mixture-of-experts layer in the plan (Megatron-core's
//! `MoELayer` with the all-to-all token dispatcher and `--expert-tensor-parallel-size 1`):
//! the tokens a rank routes, the rows its dispatch sends and its local experts receive, the
//! bytes of the dispatch and combine all-to-alls, the parameters of the layer's dense part
//! and of its local experts, and the activations and weight-pass gradients it saves.
//!
//! Tokens per rank T = b·s / cp, ÷ tp under sequence parallelism (the router and the
//! dispatcher see the rank's own sequence shard; a tensor-parallel MoE layer requires
//! sequence parallelism). Each token goes to k experts, so the dispatch sends R = T·k rows
//! of h (all-to-all on the expert-parallel group, k·h·e bytes per token each way, the
//! volume DeepEP and Megatron-core's dispatcher move without de-duplication); with a
//! capacity factor cf each expert takes at most C = ⌈T·k/E · cf⌉ rows from a rank
//! (Megatron-LM's `moe_utils.get_capacity`, `--moe-expert-capacity-factor`; unset =
//! dropless) and R = min(T·k, E·C). The plan carries the balanced
//! expectation: a rank's E/ep local experts receive R rows in all, R/(E/ep) each (the first
//! R mod (E/ep) one row more), and the simulator draws the imbalance.

use crate::accounting::params::attention_params;
use crate::model::{Activation, ModelSpec, MoeSpec};
use crate::parallel::ParallelConfig;
use crate::scenario::Dtype;

/// A MoE layer's shapes on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    /// Routed experts E.
    pub experts: u64,
    pub top_k: u64,
    /// Experts this rank holds: E / ep.
    pub local: u64,
    /// Tokens this rank routes (T).
    pub tokens: u64,
    /// Tokens the shared experts' tensor-parallel GEMMs see: b·s / cp (gathered under SP).
    pub full_tokens: u64,
    /// Rows the dispatch sends (and, balanced, the local experts receive): R.
    pub routed: u64,
    pub h: u64,
    /// One routed expert's width.
    pub f: u64,
    /// The shared experts' width on one tp rank: shared_experts · shared_ffn_hidden / tp.
    pub shared_f_t: u64,
    pub swiglu: bool,
    /// Bytes per activation element.
    pub e: u64,
}

impl MoeShape {
    /// The shape of `m`'s MoE layers under `p`, or `None` for a dense model.
    pub fn new(m: &ModelSpec, p: &ParallelConfig, dtype: Dtype) -> Option<MoeShape> {
        let moe = m.moe.as_ref()?;
        Some(Self::of(m, moe, p, dtype))
    }

    fn of(m: &ModelSpec, moe: &MoeSpec, p: &ParallelConfig, dtype: Dtype) -> MoeShape {
        let full_tokens = p.micro_batch as u64 * m.seq_len as u64 / p.cp.max(1) as u64;
        let tokens = if p.sequence_parallel { full_tokens / p.tp.max(1) as u64 } else { full_tokens };
        let experts = moe.experts.max(1) as u64;
        let top_k = moe.top_k as u64;
        let wanted = tokens * top_k;
        let routed = match moe.capacity_factor {
            Some(cf) if cf > 0.0 => {
                let capacity = (wanted as f64 / experts as f64 * cf).ceil() as u64;
                wanted.min(experts * capacity)
            }
            _ => wanted,
        };
        MoeShape {
            experts,
            top_k,
            local: experts / p.ep.max(1) as u64,
            tokens,
            full_tokens,
            routed,
            h: m.hidden as u64,
            f: moe.expert_ffn_hidden as u64,
            shared_f_t: moe.shared_experts as u64 * moe.shared_ffn_hidden as u64 / p.tp.max(1) as u64,
            swiglu: m.activation == Activation::Swiglu,
            e: dtype.bytes(),
        }
    }

    /// FC1's width of one routed expert: f, or 2f for SwiGLU's gate and up.
    pub fn fc1(&self) -> u64 {
        self.f * if self.swiglu { 2 } else { 1 }
    }

    /// FC1's width of the shared experts on one tp rank.
    pub fn shared_fc1(&self) -> u64 {
        self.shared_f_t * if self.swiglu { 2 } else { 1 }
    }

    /// Rows each local expert receives, balanced (sums to `routed`).
    pub fn expert_rows(&self) -> Vec<u64> {
        let n = self.local.max(1);
        (0..n).map(|i| self.routed / n + u64::from(i < self.routed % n)).collect()
    }

    /// Bytes one rank's dispatch (or combine) all-to-all moves: R rows of h.
    pub fn a2a_bytes(&self) -> u64 {
        self.routed * self.h * self.e
    }

    /// Tensors of the MLP's internals an activation saves: 2 (GELU: FC1 out, activation
    /// out) or 3 (SwiGLU: gate, up, product).
    fn mlp_tensors(&self) -> u64 {
        if self.swiglu { 3 } else { 2 }
    }

    /// Bytes a MoE layer saves beyond its attention half and norms, per rank and microbatch:
    /// the router's fp32 probabilities (T·E·4) and top-k weights and indices (T·k·8), the
    /// permuted tokens the experts read (R·h), the experts' internals (R·2|3·f), the expert
    /// outputs the combine returns, which the probability weighting's backward reads (R·h),
    /// and the shared experts' internals (b·s/cp · 2|3 · f_shared / tp).
    pub fn saved_bytes(&self) -> u64 {
        let router = self.tokens * self.experts * 4 + self.tokens * self.top_k * 8;
        let experts = self.routed * (2 * self.h + self.mlp_tensors() * self.f) * self.e;
        let shared = self.full_tokens * self.mlp_tensors() * self.shared_f_t * self.e;
        router + experts + shared
    }

    /// The output gradients a MoE layer's deferred weight passes read (ZB): the router's
    /// logits (T·E), the experts' FC1 and FC2 outputs (R·(fc1 + h)) and the shared experts'
    /// (b·s/cp · (fc1_shared + h)).
    pub fn wgrad_bytes(&self) -> u64 {
        let shared = if self.shared_f_t > 0 { self.full_tokens * (self.shared_fc1() + self.h) } else { 0 };
        (self.tokens * self.experts + self.routed * (self.fc1() + self.h) + shared) * self.e
    }
}

/// Parameters of one routed expert: FC1 and FC2 (+ biases for GPT, as the dense MLP).
pub fn expert_params(m: &ModelSpec) -> u64 {
    let Some(moe) = &m.moe else { return 0 };
    let (sharded, replicated) = mlp_params_of_width(m, moe.expert_ffn_hidden as u64);
    sharded + replicated
}

/// (sharded, replicated) parameters of an MLP of width `f` (as `accounting::params::mlp_params`).
fn mlp_params_of_width(m: &ModelSpec, f: u64) -> (u64, u64) {
    if f == 0 {
        return (0, 0);
    }
    let h = m.hidden as u64;
    let weights = m.mlp_matrices() * h * f;
    if m.has_bias() { (weights + (m.mlp_matrices() - 1) * f, h) } else { (weights, 0) }
}

/// The dense part of a MoE layer, as (tensor-parallel sharded, replicated): attention, two
/// norms, the router's h×E gate (replicated on every tp rank, as Megatron-core's
/// `TopKRouter`; its gradient is tensor-parallel reduced under sequence parallelism) and the
/// shared experts (a column-/row-parallel MLP of width shared_experts · shared_ffn_hidden).
pub fn moe_dense_params(m: &ModelSpec) -> (u64, u64) {
    let Some(moe) = &m.moe else { return (0, 0) };
    let (a_s, a_r) = attention_params(m);
    let (s_s, s_r) = mlp_params_of_width(m, moe.shared_experts as u64 * moe.shared_ffn_hidden as u64);
    let router = m.hidden as u64 * moe.experts as u64;
    (a_s + s_s, a_r + s_r + router + 2 * m.norm_params())
}

/// Parameters of the experts one rank holds in a MoE layer: E/ep routed experts.
pub fn local_expert_params(m: &ModelSpec, p: &ParallelConfig) -> u64 {
    let Some(moe) = &m.moe else { return 0 };
    (moe.experts / p.ep.max(1)) as u64 * expert_params(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_moe() -> ModelSpec {
        let mut m = ModelSpec::preset("tiny-llama").unwrap();
        m.moe = Some(MoeSpec {
            experts: 8,
            top_k: 2,
            expert_ffn_hidden: 64,
            shared_experts: 1,
            shared_ffn_hidden: 64,
            dense_layers: 1,
            capacity_factor: None,
            score: Default::default(),
            aux_loss_coeff: 0.0,
            skew: None,
        });
        m
    }

    #[test]
    fn rows_split_exactly_and_capacity_bounds_them() {
        let m = tiny_moe();
        let p = ParallelConfig { ep: 4, micro_batch: 1, ..ParallelConfig::default() };
        let x = MoeShape::new(&m, &p, Dtype::Bf16).unwrap();
        assert_eq!(x.tokens, m.seq_len as u64);
        assert_eq!(x.routed, 2 * x.tokens);
        assert_eq!(x.local, 2);
        assert_eq!(x.expert_rows().iter().sum::<u64>(), x.routed);
        assert_eq!(x.a2a_bytes(), x.routed * m.hidden as u64 * 2);
        // Capacity 0.5: each expert takes ⌈T·2/8 · 0.5⌉ rows, 8 of them.
        let mut m2 = m.clone();
        m2.moe.as_mut().unwrap().capacity_factor = Some(0.5);
        let y = MoeShape::new(&m2, &p, Dtype::Bf16).unwrap();
        let cap = (x.tokens as f64 * 2.0 / 8.0 * 0.5).ceil() as u64;
        assert_eq!(y.routed, 8 * cap);
        assert!(y.routed < x.routed);
        // Under SP with tp 2 a rank routes half the tokens.
        let q = ParallelConfig { tp: 2, sequence_parallel: true, ..p };
        assert_eq!(MoeShape::new(&m, &q, Dtype::Bf16).unwrap().tokens, x.tokens / 2);
    }

    #[test]
    fn parameters_split_into_dense_part_and_local_experts() {
        let m = tiny_moe();
        let h = m.hidden as u64;
        // SwiGLU expert: 3·h·64, no biases (Llama).
        assert_eq!(expert_params(&m), 3 * h * 64);
        let p = ParallelConfig { ep: 2, ..ParallelConfig::default() };
        assert_eq!(local_expert_params(&m, &p), 4 * 3 * h * 64);
        let (s, r) = moe_dense_params(&m);
        let (a_s, a_r) = attention_params(&m);
        assert_eq!(s, a_s + 3 * h * 64);
        assert_eq!(r, a_r + h * 8 + 2 * m.norm_params());
    }
}
