//! strata-reports: showing it — Chrome/Perfetto traces, CSV, plots (PNG and SVG) and the
//! self-contained HTML report that holds predictions against measurements.
//!
//! The CLI converts simulator and runtime results into the plain data of [`inputs`]
//! (or writes them in the directory layout of [`input_dir`]), then calls
//! [`build_report`]. [`chrome_trace`] writes any [`strata_models::trace::Trace`] for
//! ui.perfetto.dev; [`trace_merge`] puts a predicted and a measured one in one file. Every output is deterministic: the same inputs give the same bytes.

pub mod accuracy;
pub mod chrome_trace;
pub mod error;
pub mod html;
pub mod input_dir;
pub mod inputs;
pub mod op_kinds;
pub mod plots;
pub mod report;
pub mod table;
pub mod trace_merge;

pub use accuracy::{Accuracy, accuracy, kendall_tau_b};
pub use chrome_trace::chrome_trace_json;
pub use error::ReportError;
pub use input_dir::{load_inputs, save_inputs};
pub use inputs::{
    ComparisonSet, LandscapeCell, PlanComparison, RankBytes, ReportInputs, ScenarioSummary, SearchLandscape, Timelines,
};
pub use op_kinds::{OpCategory, OpKindKey, OpTime, op_seconds, op_times};
pub use report::{ReportFiles, ReportSource, build_report};
pub use trace_merge::merge_traces;
