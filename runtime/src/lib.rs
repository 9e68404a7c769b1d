//! strata-runtime: a GPT trained for real under a plan.

pub mod attention;
pub mod embed;
pub mod error;
pub mod head;
pub mod kernels;
pub mod layer;
pub mod matmul;
pub mod optim;
pub mod params;
pub mod shard;
pub mod tensor;

#[cfg(test)]
mod gradcheck;
