//! A mixture-of-experts MLP on one expert-parallel rank, with hand-written backward
//! (Megatron-core's `MoELayer` with the all-to-all token dispatcher, expert-tp 1): the
//! pieces the plan names `Router`, `Experts`, `SharedExperts`, with the dispatch and
//! combine all-to-alls between them done through an [`Exchange`].
//!
//! Forward, with x (T, h) this rank's tokens, E experts of which this rank holds E/ep
//! (experts [r·E/ep, (r+1)·E/ep) on ep rank r), k experts per token:
//!
//! ```text
//! Router        l = x·Wr (T, E); s = exp(l − max l) (softmax) or σ(l) (sigmoid);
//!               top-k of s per token (ties: lower index); w = s_sel / Σ s_sel
//!               (Mixtral's softmax over the selected logits; DeepSeek-V3's normalised
//!               sigmoid); rows (token, slot) grouped by destination rank and local expert
//! dispatch      all-to-all-v of the counts per local expert and the rows behind them
//! Experts       per local expert: y = GELU(x_e·W1 + b1)·W2 + b2 (GPT), or SwiGLU
//!               (SiLU(x_e·W_gate) ⊙ x_e·W_up)·W2 without biases (Llama), over the rows it
//!               received (every source's, in source order)
//! combine       all-to-all-v of the outputs back, in the order they came
//! LayerOut      out[t] = Σ_slot w[t, slot]·y[t, slot] + shared(x)[t]
//! SharedExperts shared(x) = the same expert MLP (GELU or SwiGLU) over all T tokens
//! ```
//!
//! Backward runs in reverse: dw[t, slot] = ⟨dout[t], y[t, slot]⟩ and dy = w·dout go back to
//! the experts (the combine's gradient all-to-all), the experts' backward gives their
//! weight gradients and dx rows, which come back (the dispatch's gradient all-to-all) and
//! sum per token; the router's backward adds dl·Wrᵀ. Routing is dropless (no capacity
//! factor) and carries no auxiliary load-balancing loss; both are left out of this executor.
//! Weight gradients accumulate (`+=`), as the dense pieces' do. [`ops`] holds the layer
//! cut at its all-to-alls, as the plan's ops call it; [`moe_forward`] and [`moe_backward`]
//! chain those pieces through an [`Exchange`] (the reference trainer's and the tests' form).

mod experts;
pub mod ops;
mod router;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_swiglu;

pub use experts::{ExpertActs, expert_backward, expert_backward_input, expert_backward_weight, expert_forward};
pub use ops::{ExpertsActs, ExpertsGrads};
pub use router::{Routing, router_backward, router_backward_input, router_backward_weight, router_forward};
use strata_models::model::RouterScore;

use crate::comm::CommError;
use crate::comm::collective::{Group, Mailbox};

/// Shapes of a MoE MLP on one expert-parallel rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeDims {
    pub hidden: usize,
    /// Routed experts E.
    pub experts: usize,
    pub top_k: usize,
    /// One routed expert's width.
    pub ffn: usize,
    /// The shared expert's width (0: none).
    pub shared_ffn: usize,
    pub score: RouterScore,
    /// This rank's place in its expert-parallel group (rank, size); size divides E.
    pub ep_rank: usize,
    pub ep_size: usize,
}

impl MoeDims {
    /// Experts this rank holds.
    pub fn local(&self) -> usize {
        self.experts / self.ep_size
    }

    /// The global index of this rank's first expert.
    pub fn first_local(&self) -> usize {
        self.ep_rank * self.local()
    }
}

/// One expert's (or the shared expert's) tensors; `S` is `&[f32]` or `&mut [f32]`.
#[derive(Debug)]
pub struct ExpertTensors<S> {
    pub fc1_w: S, // (h, f)
    pub fc1_b: S, // (f)
    pub fc2_w: S, // (f, h)
    pub fc2_b: S, // (h)
}

/// The MoE MLP's tensors on one rank: the router (replicated), the local experts, the
/// shared expert.
#[derive(Debug)]
pub struct MoeTensors<S> {
    pub router_w: S, // (h, E)
    pub experts: Vec<ExpertTensors<S>>,
    pub shared: Option<ExpertTensors<S>>,
}

pub type MoeParams<'a> = MoeTensors<&'a [f32]>;
pub type MoeGrads<'a> = MoeTensors<&'a mut [f32]>;

/// The all-to-all-v a MoE layer needs: `blocks[j]` to member j of the expert-parallel
/// group, returning the block each member sent this one.
pub trait Exchange {
    fn all_to_all_v(&mut self, blocks: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CommError>;
}

/// A group of one (ep = 1): every block is one's own.
pub struct Alone;

impl Exchange for Alone {
    fn all_to_all_v(&mut self, blocks: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CommError> {
        assert_eq!(blocks.len(), 1, "a group of one gets one block");
        Ok(blocks)
    }
}

/// The expert-parallel group over a [`Mailbox`] (threads or MPI), blocking until each
/// all-to-all is in.
pub struct MailboxExchange<'a> {
    pub mailbox: &'a mut Mailbox,
    pub group: Group,
}

impl Exchange for MailboxExchange<'_> {
    fn all_to_all_v(&mut self, blocks: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CommError> {
        let p = self.mailbox.post_all_to_all_v(&self.group, false, blocks)?;
        loop {
            if let Some(out) = self.mailbox.try_finish_blocks(&p) {
                return Ok(out);
            }
            self.mailbox.poll(std::time::Duration::from_millis(50))?;
        }
    }
}

/// Which rows this rank sends where: for each destination rank, for each of its local
/// experts, the (token, slot) pairs routed there in token order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dispatch {
    pub rows: Vec<Vec<Vec<(u32, u32)>>>,
}

impl Dispatch {
    /// Groups the routed rows of `routing` by destination rank and local expert.
    pub fn new(d: &MoeDims, routing: &Routing) -> Dispatch {
        let local = d.local();
        let mut rows = vec![vec![Vec::new(); local]; d.ep_size];
        for (i, &e) in routing.idx.iter().enumerate() {
            let (t, slot) = (i / d.top_k, i % d.top_k);
            rows[e as usize / local][e as usize % local].push((t as u32, slot as u32));
        }
        Dispatch { rows }
    }
}

/// What a MoE MLP keeps from its forward for its backward on one rank.
#[derive(Clone, Debug, Default)]
pub struct MoeActs {
    pub x: Vec<f32>,
    pub routing: Routing,
    pub dispatch: Dispatch,
    pub experts: ExpertsActs,
    /// The combined expert outputs (T·k, h), by (token, slot): the weighting's backward reads them.
    pub y: Vec<f32>,
    pub shared: Option<ExpertActs>,
}

/// The MoE MLP's forward on this rank's tokens `x` (T, h): routes, dispatches, runs the
/// local experts, combines, adds the shared expert. Returns out (T, h) and what backward needs.
pub fn moe_forward(
    d: &MoeDims,
    p: &MoeParams<'_>,
    x: &[f32],
    ex: &mut dyn Exchange,
) -> Result<(Vec<f32>, MoeActs), CommError> {
    let h = d.hidden;
    let routing = router_forward(d, p.router_w, x);
    let (dispatch, sent) = ops::dispatch_send(d, &routing, x);
    let received = ex.all_to_all_v(sent)?;
    let (experts, outs) = ops::experts_forward(d, &p.experts, &received);
    let back = ex.all_to_all_v(outs)?;
    let (y, mut out) = ops::combine(d, &routing, &dispatch, &back);
    let shared = p.shared.as_ref().map(|sp| {
        let (ys, a) = expert_forward(sp, h, d.shared_ffn, x.to_vec());
        crate::kernels::add_into(&mut out, &ys);
        a
    });
    let acts = MoeActs { x: x.to_vec(), routing, dispatch, experts, y, shared };
    Ok((out, acts))
}

/// The MoE MLP's backward: from dout (T, h) returns dx (T, h) and accumulates the weight
/// gradients of the router, the local experts and the shared expert into `g`.
pub fn moe_backward(
    d: &MoeDims,
    p: &MoeParams<'_>,
    acts: &MoeActs,
    dout: &[f32],
    g: &mut MoeGrads<'_>,
    ex: &mut dyn Exchange,
) -> Result<Vec<f32>, CommError> {
    let h = d.hidden;
    let t = dout.len() / h;
    let (dweight, sent) = ops::combine_backward(d, &acts.routing, &acts.dispatch, &acts.y, dout);
    let received = ex.all_to_all_v(sent)?;
    let (eg, dxs) = ops::experts_backward_input(d, &p.experts, &acts.experts, &received);
    let back = ex.all_to_all_v(dxs)?;
    ops::experts_backward_weight(d, &mut g.experts, &acts.experts, &eg);
    let mut dx = ops::uncombine_rows(d, &acts.dispatch, &back, t);
    router_backward(d, p.router_w, &acts.x, &acts.routing, &dweight, &mut dx, g.router_w);
    if let (Some(sp), Some(sg), Some(sa)) = (p.shared.as_ref(), g.shared.as_mut(), acts.shared.as_ref()) {
        let dxs = expert_backward(sp, sg, h, d.shared_ffn, sa, dout);
        crate::kernels::add_into(&mut dx, &dxs);
    }
    Ok(dx)
}
