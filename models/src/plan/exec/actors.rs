//! Who executes a plan — actors — and how their messages pair up.
//!
//! An actor is one rank, or (*per stage*) one pipeline stage standing for its tp·dp ranks.
//! Standing in is legal when every rank of a stage runs its stage's program (every plan the
//! planner emits): the stage's TP and DP groups lie inside it, so their members move in
//! lockstep, and a TP or DP collective has one member, the stage. Embedding-group and world
//! collectives are matched across the stage actors. A plan with per-rank programs
//! (`Plan::rank_programs`) is always executed rank by rank.

use std::collections::{BTreeMap, VecDeque};

use crate::plan::Plan;
use crate::plan::grid::{Coord, RankGrid};
use crate::plan::ir::{GroupKind, OpKind, P2pKind, Peer, Program};

use super::NONE;

/// The actors of one execution of a plan.
#[derive(Clone, Debug)]
pub struct ActorMap {
    grid: RankGrid,
    per_stage: bool,
    /// The rank each actor is (or stands for: the stage's tp = dp = 0 rank).
    ranks: Vec<u32>,
}

impl ActorMap {
    /// One actor per stage when `per_stage` and the plan allows it, else one per rank.
    pub fn new(plan: &Plan, per_stage: bool) -> ActorMap {
        let grid = plan.grid;
        let per_stage = per_stage && plan.rank_programs.is_empty();
        let ranks = if per_stage {
            (0..grid.pp).map(|pp| grid.rank(Coord { tp: 0, cp: 0, dp: 0, pp })).collect()
        } else {
            (0..grid.ranks()).collect()
        };
        ActorMap { grid, per_stage, ranks }
    }

    pub fn per_stage(&self) -> bool {
        self.per_stage
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// The rank actor `a` is, or stands for.
    #[inline]
    pub fn rank(&self, a: u32) -> u32 {
        self.ranks[a as usize]
    }

    /// The actor that executes `rank`.
    #[inline]
    pub fn actor_of(&self, rank: u32) -> u32 {
        if self.per_stage { self.grid.coord(rank).pp } else { rank }
    }

    /// Ranks an actor stands for.
    pub fn weight(&self) -> u32 {
        if self.per_stage { self.grid.stage_ranks() } else { 1 }
    }

    /// The actor of `a`'s pipeline peer.
    #[inline]
    pub fn peer(&self, a: u32, peer: Peer) -> u32 {
        self.actor_of(self.grid.peer(self.rank(a), peer))
    }

    /// How many instances of a kind of group the actors meet in.
    pub fn group_count(&self, kind: GroupKind) -> u32 {
        match (self.per_stage, kind) {
            (true, GroupKind::Tp | GroupKind::Dp | GroupKind::Cp | GroupKind::Ep | GroupKind::ExpertDp) => self.grid.pp,
            _ => self.grid.group_id(0, kind).0,
        }
    }

    /// Which instance of a kind of group actor `a` meets in.
    pub fn group_slot(&self, a: u32, kind: GroupKind) -> u32 {
        let rank = self.rank(a);
        match (self.per_stage, kind) {
            (true, GroupKind::Tp | GroupKind::Dp | GroupKind::Cp | GroupKind::Ep | GroupKind::ExpertDp) => {
                self.grid.coord(rank).pp
            }
            _ => self.grid.group_id(rank, kind).1,
        }
    }

    /// Actors taking part in one group of a kind (every group of a kind is alike).
    pub fn group_actors(&self, kind: GroupKind) -> u32 {
        match (self.per_stage, kind) {
            (true, GroupKind::Tp | GroupKind::Dp | GroupKind::Cp | GroupKind::Ep | GroupKind::ExpertDp) => 1,
            (true, GroupKind::World) => self.grid.pp,
            // A stage actor is one member of the embedding group, as a rank is.
            _ => self.grid.group_size(kind),
        }
    }

    /// How many identical groups one collective of an actor stands for (per stage: a stage's
    /// TP collective is its dp TP groups at once, a DP collective its tp DP groups).
    pub fn multiplicity(&self, kind: GroupKind) -> u32 {
        let g = self.grid;
        match (self.per_stage, kind) {
            (false, _) | (true, GroupKind::World) => 1,
            (true, GroupKind::Tp) => g.stage_ranks() / g.tp,
            (true, GroupKind::Dp) => g.tp,
            (true, GroupKind::Cp) => g.stage_ranks() / g.cp,
            (true, GroupKind::Ep) => g.stage_ranks() / g.ep,
            (true, GroupKind::ExpertDp) => g.ep,
            (true, GroupKind::Embedding) => g.stage_ranks(),
        }
    }

    /// How many identical transfers one message of an actor stands for.
    pub fn message_multiplicity(&self) -> u32 {
        self.weight()
    }
}

/// A message that cannot be paired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageError {
    /// Actor `from`'s send `op` has no receive on actor `to`.
    NeverReceived { from: u32, op: u32, to: u32 },
    /// Actor `to`'s receive `op` has no send on actor `from`.
    NeverSent { to: u32, op: u32, from: u32 },
    /// The pair's sizes differ.
    Size { to: u32, recv: u32, recv_bytes: u64, from: u32, send: u32, send_bytes: u64 },
}

type Key = (u32, u32, P2pKind, u32, u32);

/// Pairs every send with its receive: same (receiver, sender, kind, microbatch, virtual
/// stage), first in program order with first. A receive without a send is reported before
/// a send without a receive (actors in order, ops in program order). Returns, per actor and op, the partner op on
/// the peer actor ([`NONE`] for ops that are not messages). `program(a)` is actor `a`'s
/// program.
pub fn pair_messages<'p>(
    actors: &ActorMap,
    program: impl Fn(u32) -> &'p Program,
) -> Result<Vec<Vec<u32>>, MessageError> {
    let n = actors.len() as u32;
    let mut sends: BTreeMap<Key, VecDeque<(u32, u64)>> = BTreeMap::new();
    let mut partner: Vec<Vec<u32>> = (0..n).map(|a| vec![NONE; program(a).ops.len()]).collect();
    for a in 0..n {
        for (oi, op) in program(a).ops.iter().enumerate() {
            if let OpKind::Send(p) = &op.kind {
                let to = actors.peer(a, p.peer);
                sends.entry((to, a, p.kind, p.mb, p.vstage)).or_default().push_back((oi as u32, p.bytes));
            }
        }
    }
    for b in 0..n {
        for (oi, op) in program(b).ops.iter().enumerate() {
            if let OpKind::Recv(p) = &op.kind {
                let from = actors.peer(b, p.peer);
                let Some((send, send_bytes)) =
                    sends.get_mut(&(b, from, p.kind, p.mb, p.vstage)).and_then(|q| q.pop_front())
                else {
                    return Err(MessageError::NeverSent { to: b, op: oi as u32, from });
                };
                if send_bytes != p.bytes {
                    return Err(MessageError::Size {
                        to: b,
                        recv: oi as u32,
                        recv_bytes: p.bytes,
                        from,
                        send,
                        send_bytes,
                    });
                }
                partner[b as usize][oi] = send;
                partner[from as usize][send as usize] = oi as u32;
            }
        }
    }
    if let Some(((to, from, ..), q)) = sends.iter().find(|(_, q)| !q.is_empty()) {
        return Err(MessageError::NeverReceived { from: *from, op: q[0].0, to: *to });
    }
    Ok(partner)
}
