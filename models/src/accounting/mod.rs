//! Accounting: what a training step costs before anything is simulated — parameters
//! ([`params`]), FLOPs ([`flops`]) and memory per stage ([`memory`]) — from the published
//! closed forms, generalised to grouped-query attention and SwiGLU.

pub mod flops;
pub mod memory;
pub mod params;
