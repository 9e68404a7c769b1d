//! strata-sim: how long a plan takes on a cluster.
//!
//! A deterministic discrete-event simulator: the event engine ([`engine`]) runs a plan's
//! programs ([`program`]) with the plan IR's semantics; the compute model ([`compute`])
//! costs each compute op from the GPU's hardware profile ([`profile`]); the memory model
//! ([`memory`]) follows the plan's buffers; the network sits behind one trait
//! ([`net::Network`]). [`simulate()`] puts them together and reports step time, throughput,
//! MFU, the breakdown ([`breakdown`]) and memory; [`bench`] times the engine;
//! [`calibrate`] fits a hardware profile to what `strata calibrate` measured;
//! [`gpu_fit`] fits a GPU profile to what `strata calibrate --backend cuda` measured.

pub mod bench;
pub mod breakdown;
pub mod calibrate;
pub mod compute;
pub mod engine;
pub mod error;
pub mod goodput;
pub mod gpu_fit;
pub mod jobs;
pub mod memory;
pub mod microbench;
pub mod mode;
pub mod net;
pub mod profile;
pub mod program;
pub mod router;
pub mod sanity;
pub mod search;
pub mod simulate;
pub mod tp_overlap;

pub use engine::Mode;
pub use profile::HardwareProfile;
pub use simulate::{SimError, SimOptions, SimReport, default_network, simulate, simulate_with};
