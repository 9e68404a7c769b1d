//! One module per subcommand.

pub mod calibrate;
pub mod collbench;
pub mod compare;
#[cfg(feature = "cuda")]
pub mod compare_cuda;
pub mod export;
pub mod goodput;
pub mod goodput_text;
pub mod gpu;
pub mod inspect;
pub mod jobs;
pub mod kernels;
pub mod main_job;
pub mod plan;
pub mod presets;
pub mod quiet;
pub mod report;
pub mod search;
pub mod search_ties;
pub mod simulate;
pub mod trace;
pub mod train;
#[cfg(feature = "cuda")]
pub mod train_cuda;
pub mod verify;
pub mod whatif;
