//! One module per subcommand.

pub mod inspect;
pub mod plan;
pub mod presets;
pub mod verify;
