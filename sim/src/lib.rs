//! strata-sim: how long a plan takes on a cluster.
//!
//! The deterministic discrete-event simulator. Filled in by the simulator issues.
