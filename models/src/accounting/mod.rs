//! Accounting: what a training step costs before anything is simulated — parameters
//! ([`params`]), FLOPs ([`flops`]), the model states each framework keeps per parameter
//! ([`states`]) and memory per stage ([`memory`]) — from the published closed forms and the
//! frameworks' own arithmetic, generalised to grouped-query attention and SwiGLU.

pub mod flops;
pub mod memory;
pub mod params;
pub mod states;
