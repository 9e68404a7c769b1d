//! Helpers shared by the simulator's integration tests: scenarios, an idealised compute
//! timer and a network whose communication is free.

#![allow(dead_code)]

use strata_models::Scenario;
use strata_models::plan::{ComputeCost, ComputeOp, Phase, Piece, Plan, lower};
use strata_sim::net::CommChoice;
use strata_sim::net::{CommId, CommKind, CommRequest, Network};
use strata_sim::program::ComputeTimer;

/// Parses scenario text for Strata's own executor, which runs every split the simulator's
/// tests exercise (panics with the error, which names the bad key).
pub fn scenario(text: &str) -> Scenario {
    Scenario::from_toml(text, "test", "test", &["training.framework=strata".into()]).unwrap_or_else(|e| panic!("{e}"))
}

pub fn plan(text: &str) -> Plan {
    lower(&scenario(text)).unwrap_or_else(|e| panic!("{e}"))
}

/// Communication that takes no time: every request completes where it starts.
#[derive(Default)]
pub struct FreeNetwork {
    next: CommId,
    done: Vec<CommId>,
    now: u64,
}

impl Network for FreeNetwork {
    fn name(&self) -> &'static str {
        "free"
    }
    fn start(&mut self, now_ns: u64, _req: &CommRequest) -> CommId {
        self.now = now_ns;
        let id = self.next;
        self.next += 1;
        self.done.push(id);
        id
    }
    fn next_completion_ns(&self) -> Option<u64> {
        (!self.done.is_empty()).then_some(self.now)
    }
    fn advance(&mut self, _now_ns: u64) -> Vec<CommId> {
        std::mem::take(&mut self.done)
    }
    fn choice(&self, _req: &CommRequest) -> CommChoice {
        CommChoice { algorithm: "free".into(), protocol: "none".into(), channels: 0 }
    }
}

/// Every request of a kind takes a fixed time, whatever its size (a test double).
pub struct FixedNetwork {
    pub collective_ns: u64,
    pub p2p_ns: u64,
    next: CommId,
    pending: std::collections::BTreeSet<(u64, CommId)>,
}

impl FixedNetwork {
    pub fn new(collective_ns: u64, p2p_ns: u64) -> FixedNetwork {
        FixedNetwork { collective_ns, p2p_ns, next: 0, pending: Default::default() }
    }
}

impl Network for FixedNetwork {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn start(&mut self, now_ns: u64, req: &CommRequest) -> CommId {
        let id = self.next;
        self.next += 1;
        let t = match req.kind {
            CommKind::SendRecv => self.p2p_ns,
            CommKind::Collective(_) => self.collective_ns,
        };
        self.pending.insert((now_ns + t, id));
        id
    }
    fn next_completion_ns(&self) -> Option<u64> {
        self.pending.first().map(|p| p.0)
    }
    fn advance(&mut self, now_ns: u64) -> Vec<CommId> {
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.pending.first() {
            if t > now_ns {
                break;
            }
            self.pending.pop_first();
            out.push(id);
        }
        out
    }
    fn choice(&self, _req: &CommRequest) -> CommChoice {
        CommChoice { algorithm: "fixed".into(), protocol: "none".into(), channels: 0 }
    }
}

/// Layer pieces only: a layer's forward costs `f`, its input-gradient pass `b`, its
/// weight-gradient pass `w` (all on the `Attn` piece); everything else is free. Stages
/// with equal layer counts then have equal times.
pub struct LayerTimer {
    pub f: u64,
    pub b: u64,
    pub w: u64,
}

impl ComputeTimer for LayerTimer {
    fn duration_ns(&self, op: &ComputeOp, _cost: &ComputeCost) -> u64 {
        match (op.piece, op.phase) {
            (Piece::Attn, Phase::Forward) => self.f,
            (Piece::Attn, Phase::BackwardInput) => self.b,
            (Piece::Attn, Phase::BackwardWeight) => self.w,
            _ => 0,
        }
    }
}

/// FNV-1a, 64 bit: a stable hash of bytes for determinism checks.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}
