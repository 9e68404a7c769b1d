//! strata-runtime: a GPT trained for real under a plan.

pub mod kernels;
pub mod matmul;
pub mod tensor;

#[cfg(test)]
mod gradcheck;
