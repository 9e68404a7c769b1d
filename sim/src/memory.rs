//! The memory model: the timeline of a rank's live buffers, what the process holds beside
//! them, and the verdict whether a stage fits its GPU.
//!
//! The plan's `Alloc` / `Free` ops drive the timeline of live bytes A(t); its peak A* is
//! what the plan itself needs (the runtime allocates the same buffers). On top a process
//! holds
//!
//!   M = C_ctx + C_nccl + (1 + f) · A*
//!
//! - C_ctx: the CUDA context with its kernel images and library workspaces (profile);
//! - C_nccl: NCCL's connection buffers, per communicator the rank uses: a collective
//!   communicator (tp, dp, embedding, world — each one it issues a collective on, with more
//!   than one member) connects `nccl_channels` rings to 2 peers, a point-to-point peer
//!   `nccl_p2p_channels`; each connection holds `nccl_buffer_mib` (NCCL's Simple 4 MiB +
//!   LL128 4.69 MiB + LL 0.5 MiB per channel and peer, init.cc of v2.30.7);
//! - f: the caching allocator's slack (fragmentation and block rounding), a fraction of A*.
//!
//! A stage fits when M ≤ the GPU's memory as `nvidia-smi` reports it (the catalog's
//! `hbm_bytes`); otherwise the verdict names the stage and the bytes over.
//!
//! Units: bytes (u64), time in ns.

use serde::{Deserialize, Serialize};
use strata_models::plan::{GroupKind, OpKind, Plan, Program};

use crate::profile::{HardwareProfile, MemoryParams};

const MIB: f64 = 1024.0 * 1024.0;

/// Live bytes of one rank over time.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub live_bytes: u64,
    pub peak_bytes: u64,
    /// (t_ns, live bytes from t on), one sample per instant; empty unless recording.
    pub samples: Vec<(u64, u64)>,
    record: bool,
}

impl Timeline {
    pub fn new(record: bool) -> Timeline {
        Timeline { record, ..Timeline::default() }
    }

    pub fn alloc(&mut self, t_ns: u64, bytes: u64) {
        self.live_bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
        self.sample(t_ns);
    }

    pub fn free(&mut self, t_ns: u64, bytes: u64) {
        debug_assert!(self.live_bytes >= bytes, "free of {bytes} with {} live", self.live_bytes);
        self.live_bytes = self.live_bytes.saturating_sub(bytes);
        self.sample(t_ns);
    }

    fn sample(&mut self, t_ns: u64) {
        if !self.record {
            return;
        }
        match self.samples.last_mut() {
            Some(last) if last.0 == t_ns => last.1 = self.live_bytes,
            _ => self.samples.push((t_ns, self.live_bytes)),
        }
    }
}

/// A stage's memory at its peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageMemory {
    pub stage: u32,
    /// Peak of the plan's live buffers, A*.
    pub buffers_bytes: u64,
    pub cuda_context_bytes: u64,
    pub nccl_bytes: u64,
    pub fragmentation_bytes: u64,
    /// M: everything above.
    pub peak_bytes: u64,
    pub capacity_bytes: u64,
}

/// A stage that does not fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutOfMemory {
    pub stage: u32,
    pub peak_bytes: u64,
    pub capacity_bytes: u64,
    pub over_bytes: u64,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "stage {} needs {:.2} GiB but its GPUs have {:.2} GiB: {:.2} GiB over",
            self.stage,
            gib(self.peak_bytes),
            gib(self.capacity_bytes),
            gib(self.over_bytes)
        )
    }
}

/// C_nccl of a rank on `collectives` collective communicators (each `nccl_channels` rings
/// to 2 peers) and `p2p_peers` point-to-point peers (each `nccl_p2p_channels`), bytes:
/// (2 · collectives · nccl_channels + p2p_peers · nccl_p2p_channels) · nccl_buffer_mib.
pub fn nccl_buffer_bytes(m: &MemoryParams, collectives: u32, p2p_peers: u32) -> f64 {
    let connections = collectives as f64 * m.nccl_channels as f64 * 2.0 + p2p_peers as f64 * m.nccl_p2p_channels as f64;
    connections * m.nccl_buffer_mib * MIB
}

/// NCCL buffer bytes of a rank running `program`: its collective communicators and its
/// point-to-point peers.
pub fn nccl_bytes(plan: &Plan, program: &Program, profile: &HardwareProfile) -> u64 {
    let g = plan.grid;
    let mut used = [false; GroupKind::ALL.len()];
    let mut p2p = false;
    for op in &program.ops {
        match &op.kind {
            OpKind::Collective(c) if g.group_size(c.group) > 1 => used[c.group.index()] = true,
            OpKind::Send(_) | OpKind::Recv(_) => p2p = true,
            _ => {}
        }
    }
    let comms = used.iter().filter(|u| **u).count() as u32;
    // A pipeline stage talks to its two neighbours (one when they are the same stage).
    let peers = if p2p { if g.pp > 2 { 2 } else { 1 } } else { 0 };
    nccl_buffer_bytes(&profile.memory, comms, peers).round() as u64
}

/// The memory of one stage at the peak `buffers_bytes` of its live buffers.
pub fn stage_memory(
    plan: &Plan,
    stage: u32,
    program: &Program,
    buffers_bytes: u64,
    profile: &HardwareProfile,
) -> StageMemory {
    let m = &profile.memory;
    let cuda_context_bytes = (m.cuda_context_mib * MIB).round() as u64;
    let nccl = nccl_bytes(plan, program, profile);
    let fragmentation_bytes = (buffers_bytes as f64 * m.allocator_fragmentation).round() as u64;
    StageMemory {
        stage,
        buffers_bytes,
        cuda_context_bytes,
        nccl_bytes: nccl,
        fragmentation_bytes,
        peak_bytes: buffers_bytes + cuda_context_bytes + nccl + fragmentation_bytes,
        capacity_bytes: plan.scenario.cluster.gpu.spec().hbm_bytes,
    }
}

/// Stages that do not fit, in stage order.
pub fn verdicts(stages: &[StageMemory]) -> Vec<OutOfMemory> {
    stages
        .iter()
        .filter(|s| s.peak_bytes > s.capacity_bytes)
        .map(|s| OutOfMemory {
            stage: s.stage,
            peak_bytes: s.peak_bytes,
            capacity_bytes: s.capacity_bytes,
            over_bytes: s.peak_bytes - s.capacity_bytes,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_keeps_its_peak_and_one_sample_per_instant() {
        let mut t = Timeline::new(true);
        t.alloc(0, 10);
        t.alloc(0, 5);
        t.free(3, 10);
        t.alloc(4, 2);
        assert_eq!((t.live_bytes, t.peak_bytes), (7, 15));
        assert_eq!(t.samples, vec![(0, 15), (3, 5), (4, 7)]);
    }

    #[test]
    fn verdicts_name_the_stage_and_the_bytes_over() {
        let s = |stage, peak_bytes| StageMemory {
            stage,
            buffers_bytes: 0,
            cuda_context_bytes: 0,
            nccl_bytes: 0,
            fragmentation_bytes: 0,
            peak_bytes,
            capacity_bytes: 100,
        };
        let v = verdicts(&[s(0, 100), s(1, 130)]);
        assert_eq!(v, vec![OutOfMemory { stage: 1, peak_bytes: 130, capacity_bytes: 100, over_bytes: 30 }]);
        assert!(v[0].to_string().contains("stage 1"));
    }
}
