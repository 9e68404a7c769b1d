//! One expert (the plan's `Experts`, one of a rank's local experts; and `SharedExperts`)
//! over the m rows it received, the dense MLP's kernels without tensor parallelism
//! (expert-tp 1), in the model's activation:
//!
//! - GELU (GPT family): y = GELU(x·W1 + b1)·W2 + b2, W1 (h, f);
//! - SwiGLU (Llama family: Mixtral, Qwen3, DeepSeek experts): W1 (h, 2f) is the fused
//!   [gate | up] of the dense Llama MLP, y = (SiLU(x·W_gate) ⊙ x·W_up)·W2, no biases.
//!
//! Which one an expert is follows from its tensors: FC1 2f wide is [gate | up], and empty
//! biases are absent ones. Backward: dW2 += aᵀ·dy, db2 += Σ dy, da = dy·W2ᵀ, dh = act'(h)·da
//! (GELU', or SwiGLU's [d_gate | d_up]), dW1 += xᵀ·dh, db1 += Σ dh, dx = dh·W1ᵀ.

use crate::kernels::{add_bias, col_sum_into, gelu_backward, gelu_forward};
use crate::llama::{swiglu_backward, swiglu_forward};
use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::moe::ExpertTensors;

/// What one expert keeps for its backward: its input rows, FC1's output, the activation's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertActs {
    pub x: Vec<f32>,  // (m, h)
    pub h1: Vec<f32>, // (m, f), or (m, 2f) [gate | up] under SwiGLU
    pub a: Vec<f32>,  // (m, f)
}

/// FC1's width for an expert of width `f` whose FC1 holds `fc1_len` elements over `h`
/// inputs: f (GELU) or 2f (SwiGLU's [gate | up]).
fn fc1_width(fc1_len: usize, h: usize, f: usize) -> usize {
    let w = fc1_len / h;
    assert!(fc1_len == h * w && (w == f || w == 2 * f), "an expert FC1 of {fc1_len} elements for h {h}, f {f}");
    w
}

/// The expert over `x` (m, h); returns y (m, h) and its saved tensors.
pub fn expert_forward(p: &ExpertTensors<&[f32]>, h: usize, f: usize, x: Vec<f32>) -> (Vec<f32>, ExpertActs) {
    let m = x.len() / h;
    let w1 = fc1_width(p.fc1_w.len(), h, f);
    let mut h1 = vec![0.0f32; m * w1];
    matmul(MatRef::new(&x, m, h), MatRef::new(p.fc1_w, h, w1), MatMut::new(&mut h1, m, w1), Transpose::Nn, 1.0, 0.0);
    if !p.fc1_b.is_empty() {
        add_bias(&mut h1, p.fc1_b);
    }
    let mut a = vec![0.0f32; m * f];
    if w1 == f {
        gelu_forward(&h1, &mut a);
    } else if m > 0 {
        swiglu_forward(&h1, &mut a, f);
    }
    let mut y = vec![0.0f32; m * h];
    matmul(MatRef::new(&a, m, f), MatRef::new(p.fc2_w, f, h), MatMut::new(&mut y, m, h), Transpose::Nn, 1.0, 0.0);
    if !p.fc2_b.is_empty() {
        add_bias(&mut y, p.fc2_b);
    }
    (y, ExpertActs { x, h1, a })
}

/// The expert's backward from dy (m, h): accumulates its weight gradients into `g` and
/// returns dx (m, h) ([`expert_backward_input`] then [`expert_backward_weight`]).
pub fn expert_backward(
    p: &ExpertTensors<&[f32]>,
    g: &mut ExpertTensors<&mut [f32]>,
    h: usize,
    f: usize,
    acts: &ExpertActs,
    dy: &[f32],
) -> Vec<f32> {
    let (dx, dh) = expert_backward_input(p, h, f, acts, dy);
    expert_backward_weight(g, h, f, acts, dy, &dh);
    dx
}

/// The input half: da = dy·W2ᵀ, dh = act'(h)·da, dx = dh·W1ᵀ; returns (dx (m, h), dh (m, f)
/// or (m, 2f) under SwiGLU).
pub fn expert_backward_input(
    p: &ExpertTensors<&[f32]>,
    h: usize,
    f: usize,
    acts: &ExpertActs,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let m = dy.len() / h;
    let w1 = fc1_width(p.fc1_w.len(), h, f);
    let mut da = vec![0.0f32; m * f];
    matmul(MatRef::new(dy, m, h), MatRef::new(p.fc2_w, f, h), MatMut::new(&mut da, m, f), Transpose::Nt, 1.0, 0.0);
    let mut dh = vec![0.0f32; m * w1];
    if w1 == f {
        gelu_backward(&acts.h1, &da, &mut dh);
    } else if m > 0 {
        swiglu_backward(&acts.h1, &da, &mut dh, f);
    }
    let mut dx = vec![0.0f32; m * h];
    matmul(MatRef::new(&dh, m, w1), MatRef::new(p.fc1_w, h, w1), MatMut::new(&mut dx, m, h), Transpose::Nt, 1.0, 0.0);
    (dx, dh)
}

/// The weight half: dW2 += aᵀ·dy, db2 += Σ dy, dW1 += xᵀ·dh, db1 += Σ dh (biases only
/// where the expert has them).
pub fn expert_backward_weight(
    g: &mut ExpertTensors<&mut [f32]>,
    h: usize,
    f: usize,
    acts: &ExpertActs,
    dy: &[f32],
    dh: &[f32],
) {
    let m = dy.len() / h;
    let w1 = fc1_width(g.fc1_w.len(), h, f);
    matmul(MatRef::new(&acts.a, m, f), MatRef::new(dy, m, h), MatMut::new(g.fc2_w, f, h), Transpose::Tn, 1.0, 1.0);
    if !g.fc2_b.is_empty() {
        col_sum_into(g.fc2_b, dy);
    }
    matmul(MatRef::new(&acts.x, m, h), MatRef::new(dh, m, w1), MatMut::new(g.fc1_w, h, w1), Transpose::Tn, 1.0, 1.0);
    if !g.fc1_b.is_empty() {
        col_sum_into(g.fc1_b, dh);
    }
}
