//! strata-models: what is trained and on what.
//!
//! Plain data and pure functions, no notion of time: transformer specs ([`model`]), the
//! accelerator catalog ([`hardware`]), clusters ([`cluster`]), the parallel split and its
//! rules ([`parallel`]), the frameworks that run splits and their rules ([`framework`]),
//! scenario files ([`scenario`]), launch files for the frameworks ([`export`]), parameter / FLOP / memory accounting ([`accounting`]), and
//! the plan IR that both backends consume ([`plan`]).

pub mod accounting;
pub mod cluster;
pub mod export;
pub mod faults;
pub mod framework;
pub mod hardware;
pub mod limits;
pub mod model;
pub mod parallel;
pub mod plan;
pub mod scenario;
pub mod trace;

pub use cluster::{ClusterSpec, Fabric, Routing};
pub use framework::Framework;
pub use hardware::{GpuKind, GpuSpec};
pub use model::{Activation, Family, ModelSpec};
pub use parallel::{ConfigError, ParallelConfig, Recompute, Schedule, Violation};
pub use scenario::{Dtype, Scenario, ScenarioError, TrainingConfig};
