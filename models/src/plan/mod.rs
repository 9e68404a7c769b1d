//! The plan: a training step lowered to per-rank programs.
//!
//! [`ir`] defines the op types (the contract with the backends), [`grid`] the rank grid,
//! [`schedule`] the pipeline tables, [`cost`] what each model piece costs, [`lowered`] the
//! lowered plan the backends consume, [`lower`] the lowering itself; [`check`] proves the
//! shape of a plan read from outside (every index in range, every size bounded),
//! [`verify`] its communication and buffer lifetimes, and [`exec`] is the execution
//! semantics every backend drives.

pub mod check;
pub mod cost;
pub mod exec;
pub mod grid;
pub mod ir;
pub mod lower;
pub mod lowered;
pub mod moe;
pub mod schedule;
pub mod text;
pub mod verify;

pub use check::{CheckedPlan, PlanError};
pub use grid::{Coord, Pipeline, RankGrid};
pub use ir::*;
pub use lower::{Planner, hp_buffer_bytes, lower, unit_params, unit_tensors};
pub use lowered::{Bucket, Plan, Unit};
pub use verify::{VerifyError, VerifyReport, verify};

#[cfg(test)]
mod tests;
