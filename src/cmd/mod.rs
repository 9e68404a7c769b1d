//! One module per subcommand.

pub mod collbench;
pub mod inspect;
pub mod plan;
pub mod presets;
pub mod report;
pub mod search;
pub mod simulate;
pub mod train;
pub mod verify;
