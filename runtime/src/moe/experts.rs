//! One expert (the plan's `Experts`, one of a rank's local experts; and `SharedExperts`)
//! over the m rows it received: y = GELU(x·W1 + b1)·W2 + b2, the dense MLP's kernels
//! without tensor parallelism (expert-tp 1). Backward: dW2 += aᵀ·dy, db2 += Σ dy,
//! da = dy·W2ᵀ, dh = GELU'(h)·da, dW1 += xᵀ·dh, db1 += Σ dh, dx = dh·W1ᵀ.

use crate::kernels::{add_bias, col_sum_into, gelu_backward, gelu_forward};
use crate::matmul::{MatMut, MatRef, Transpose, matmul};
use crate::moe::ExpertTensors;

/// What one expert keeps for its backward: its input rows, FC1's output, GELU's output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertActs {
    pub x: Vec<f32>,  // (m, h)
    pub h1: Vec<f32>, // (m, f)
    pub a: Vec<f32>,  // (m, f)
}

/// The expert over `x` (m, h); returns y (m, h) and its saved tensors.
pub fn expert_forward(p: &ExpertTensors<&[f32]>, h: usize, f: usize, x: Vec<f32>) -> (Vec<f32>, ExpertActs) {
    let m = x.len() / h;
    let mut h1 = vec![0.0f32; m * f];
    matmul(MatRef::new(&x, m, h), MatRef::new(p.fc1_w, h, f), MatMut::new(&mut h1, m, f), Transpose::Nn, 1.0, 0.0);
    add_bias(&mut h1, p.fc1_b);
    let mut a = vec![0.0f32; m * f];
    gelu_forward(&h1, &mut a);
    let mut y = vec![0.0f32; m * h];
    matmul(MatRef::new(&a, m, f), MatRef::new(p.fc2_w, f, h), MatMut::new(&mut y, m, h), Transpose::Nn, 1.0, 0.0);
    add_bias(&mut y, p.fc2_b);
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

/// The input half: da = dy·W2ᵀ, dh = GELU'(h)·da, dx = dh·W1ᵀ; returns (dx (m, h), dh (m, f)).
pub fn expert_backward_input(
    p: &ExpertTensors<&[f32]>,
    h: usize,
    f: usize,
    acts: &ExpertActs,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let m = dy.len() / h;
    let mut da = vec![0.0f32; m * f];
    matmul(MatRef::new(dy, m, h), MatRef::new(p.fc2_w, f, h), MatMut::new(&mut da, m, f), Transpose::Nt, 1.0, 0.0);
    let mut dh = vec![0.0f32; m * f];
    gelu_backward(&acts.h1, &da, &mut dh);
    let mut dx = vec![0.0f32; m * h];
    matmul(MatRef::new(&dh, m, f), MatRef::new(p.fc1_w, h, f), MatMut::new(&mut dx, m, h), Transpose::Nt, 1.0, 0.0);
    (dx, dh)
}

/// The weight half: dW2 += aᵀ·dy, db2 += Σ dy, dW1 += xᵀ·dh, db1 += Σ dh.
pub fn expert_backward_weight(
    g: &mut ExpertTensors<&mut [f32]>,
    h: usize,
    f: usize,
    acts: &ExpertActs,
    dy: &[f32],
    dh: &[f32],
) {
    let m = dy.len() / h;
    matmul(MatRef::new(&acts.a, m, f), MatRef::new(dy, m, h), MatMut::new(g.fc2_w, f, h), Transpose::Tn, 1.0, 1.0);
    col_sum_into(g.fc2_b, dy);
    matmul(MatRef::new(&acts.x, m, h), MatRef::new(dh, m, f), MatMut::new(g.fc1_w, h, f), Transpose::Tn, 1.0, 1.0);
    col_sum_into(g.fc1_b, dh);
}
