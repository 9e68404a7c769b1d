//! The plan: a training step lowered to per-rank programs (see [`ir`]).

pub mod ir;

pub use ir::*;
