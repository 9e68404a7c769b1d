//! The plan: a training step lowered to per-rank programs.
//!
//! [`ir`] defines the op types (the contract with the backends), [`grid`] the rank grid,
//! [`schedule`] the pipeline tables, [`cost`] what each model piece costs, [`lower`] the
//! lowering itself; [`check`] proves the shape of a plan read from outside (every index in
//! range, every size bounded) and [`verify`] its communication and buffer lifetimes.

pub mod check;
pub mod cost;
pub mod grid;
pub mod ir;
pub mod lower;
pub mod schedule;
pub mod text;
pub mod verify;

pub use check::{CheckedPlan, PlanError};
pub use grid::{Coord, RankGrid};
pub use ir::*;
pub use lower::{Bucket, Plan, Planner, Unit, lower, unit_params};
pub use verify::{VerifyError, VerifyReport, verify};

#[cfg(test)]
mod tests;
