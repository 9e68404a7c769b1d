//! Why a plan could not be simulated: one error type for the engine, the program tables and
//! [`crate::simulate()`], so none of them imports another for it.

use crate::net::NetError;

/// Why a plan could not be simulated.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("plan program {program} op #{op}: {reason}")]
    InvalidPlan { program: usize, op: u32, reason: String },
    #[error("the plan deadlocks at {rank}: {ops_left} ops never run; {stuck}")]
    Deadlock { rank: String, ops_left: u64, stuck: String },
    #[error(
        "full mode simulates every rank; {ranks} ranks is over its limit of {limit}: use symmetric mode, \
         which simulates one rank per pipeline stage"
    )]
    TooLarge { ranks: u32, limit: u32 },
    #[error(
        "full mode simulates every rank's ops; {ops} ops over all ranks is over its work budget of {limit} \
         (2^26): use symmetric mode, or fewer microbatches or layers"
    )]
    OverBudget { ops: u64, limit: u64 },
    #[error(transparent)]
    Network(#[from] NetError),
    #[error(
        "symmetric mode runs one rank per pipeline stage, so it cannot see a slow rank or a degraded or \
         downed link ({what}); use --mode full or --mode auto"
    )]
    WhatIfSymmetric { what: String },
    #[error(
        "what-ifs (slow ranks, degraded or downed links) need full mode, which simulates every rank; \
         {ranks} ranks is over its limit of {limit}: simulate a smaller cluster with the same split"
    )]
    WhatIfTooLarge { ranks: u32, limit: u32 },
    #[error("the fabric is disconnected by the what-ifs: {0}")]
    Disconnected(String),
    #[error(
        "the simulated step is not physical: {0}; the scenario is past what the simulator models \
         (see docs/limits.md)"
    )]
    Insane(String),
    #[error(
        "the hardware profile {profile} describes a {profile_gpu} but the cluster has {cluster_gpu}s; \
         pass a profile of the cluster's GPU"
    )]
    ProfileMismatch { profile: String, profile_gpu: String, cluster_gpu: String },
}
