//! strata-sim: how long a plan takes on a cluster.
//!
//! A deterministic discrete-event simulator: the event engine, the compute model
//! ([`compute`]) with its hardware profiles ([`profile`]), the memory timeline, and the
//! network behind one trait ([`net::Network`]).

pub mod compute;
pub mod net;
pub mod profile;
