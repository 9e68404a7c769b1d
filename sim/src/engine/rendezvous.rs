//! Rendezvous: where the members of a communication meet before it starts.
//!
//! - **Collectives.** Members of a group issue the same sequence of collectives on it, so
//!   the k-th collective an actor issues on a group meets the k-th of every other member.
//!   Each group keeps a queue of open instances indexed by sequence number (relative to
//!   the oldest open one); an instance starts — one [`CommRequest`] with the members'
//!   global ranks — when its last member arrives. In symmetric mode a stage's TP and DP
//!   groups have one member (the stage actor), so they start at once, with `multiplicity`
//!   = dp (a TP collective stands for the dp identical groups of the stage) or tp (a DP
//!   collective for tp).
//! - **Messages.** A send and its receive are paired before the run, by (receiver, sender,
//!   kind, microbatch, virtual stage), first with first; at run time the transfer starts
//!   when the second of the pair is posted.

use std::collections::{BTreeMap, VecDeque};

use strata_models::plan::{CollKind, GroupKind, OpKind, P2pKind, Stream};

use super::{CommRec, Engine, Mode, POSTED, class_of, dir};
use crate::net::{CommKind, CommRequest};
use crate::program::OpInfo;
use crate::simulate::SimError;

#[derive(Default)]
pub(super) struct Instance {
    arrived: u32,
    members: Vec<(u32, u32)>,
}

pub(super) struct GroupState {
    /// Actors that take part.
    pub(super) total: u32,
    /// Sequence number of `pending[0]`.
    pub(super) base: u32,
    pub(super) pending: VecDeque<Instance>,
    pub(super) req: Option<CommRequest>,
}

impl Engine<'_> {
    /// Pairs every send with its receive: same (receiver, sender, kind, microbatch, virtual
    /// stage), first posted with first posted.
    pub(super) fn match_messages(&mut self) -> Result<(), SimError> {
        type Key = (u32, u32, P2pKind, u32, u32);
        let mut sends: BTreeMap<Key, VecDeque<u32>> = BTreeMap::new();
        for (ai, a) in self.actors.iter().enumerate() {
            let program = &self.plan.programs[self.plan.program_index(a.rank)];
            for (oi, op) in program.ops.iter().enumerate() {
                if let OpKind::Send(p) = &op.kind {
                    let to = a.peer_actor[dir(p.peer)];
                    sends.entry((to, ai as u32, p.kind, p.mb, p.vstage)).or_default().push_back(oi as u32);
                }
            }
        }
        for bi in 0..self.actors.len() {
            let program = &self.plan.programs[self.plan.program_index(self.actors[bi].rank)];
            for (oi, op) in program.ops.iter().enumerate() {
                if let OpKind::Recv(p) = &op.kind {
                    let from = self.actors[bi].peer_actor[dir(p.peer)];
                    let send = sends.get_mut(&(bi as u32, from, p.kind, p.mb, p.vstage)).and_then(|q| q.pop_front());
                    let Some(send) = send else {
                        return Err(SimError::InvalidPlan {
                            program: self.plan.program_index(self.actors[bi].rank),
                            op: oi as u32,
                            reason: format!("receive of {:?} mb{} vs{} has no matching send", p.kind, p.mb, p.vstage),
                        });
                    };
                    self.actors[bi].peer_op[oi] = send;
                    self.actors[from as usize].peer_op[send as usize] = oi as u32;
                }
            }
        }
        if let Some(((to, from, kind, mb, vs), q)) = sends.iter().find(|(_, q)| !q.is_empty()) {
            let a = &self.actors[*from as usize];
            return Err(SimError::InvalidPlan {
                program: self.plan.program_index(a.rank),
                op: q[0],
                reason: format!(
                    "send of {kind:?} mb{mb} vs{vs} is never received by rank {}",
                    self.actors[*to as usize].rank
                ),
            });
        }
        Ok(())
    }

    /// A collective arrives; it starts when its group is complete.
    pub(super) fn arrive(&mut self, ai: u32, op: u32, s: usize, group: GroupKind, kind: CollKind, bytes: u64) {
        let class = class_of(Stream::ALL[s]);
        let k = group as usize;
        let a = &mut self.actors[ai as usize];
        let slot = a.group_slot[k] as usize;
        let seq = a.coll_seq[k];
        a.coll_seq[k] += 1;
        let st = &mut self.groups[k][slot];
        let members = if st.total == 1 {
            None
        } else {
            let idx = (seq - st.base) as usize;
            while st.pending.len() <= idx {
                st.pending.push_back(Instance::default());
            }
            let inst = &mut st.pending[idx];
            inst.arrived += 1;
            inst.members.push((ai, op));
            if inst.arrived < st.total {
                return;
            }
            let members = std::mem::take(&mut inst.members);
            inst.arrived = u32::MAX;
            while st.pending.front().is_some_and(|i| i.arrived == u32::MAX) {
                st.pending.pop_front();
                st.base += 1;
            }
            Some(members)
        };
        if self.groups[k][slot].req.is_none() {
            let req = self.group_request(ai, group);
            self.groups[k][slot].req = Some(req);
        }
        let req = self.groups[k][slot].req.as_mut().expect("just set");
        req.kind = CommKind::Collective(kind);
        req.bytes = bytes;
        let id = self.net.start(self.now, req);
        let work =
            if self.cfg.one_thread_per_rank { self.net.host_work(req).unwrap_or_default() } else { Default::default() };
        let finish_ns = work.finish_ns;
        let now = self.now;
        match members {
            None => {
                self.actors[ai as usize].xfer_ns[op as usize] = now;
                self.record(id, CommRec::One { class, actor: ai, op, finish_ns });
                self.comm_on(ai, class);
            }
            Some(members) => {
                for &(m, mop) in &members {
                    self.actors[m as usize].xfer_ns[mop as usize] = now;
                    self.comm_on(m, class);
                }
                self.record(id, CommRec::Many { class, members, finish_ns });
            }
        }
    }

    /// One thread per rank: the CPU work of posting `op` (a collective or a message), ns.
    pub(super) fn post_work_ns(&mut self, ai: u32, op: u32) -> u64 {
        if !self.cfg.one_thread_per_rank {
            return 0;
        }
        let a = &self.actors[ai as usize];
        let req = match self.tables[a.table as usize].info[op as usize] {
            OpInfo::Collective { group, kind, bytes } => {
                let mut r = self.group_request(ai, group);
                r.kind = CommKind::Collective(kind);
                r.bytes = bytes;
                r
            }
            OpInfo::Send { peer, bytes } => {
                let mut r = self.p2p_req[ai as usize][dir(peer)].clone();
                r.bytes = bytes;
                r
            }
            // A receive posts nothing; its work is in finishing.
            _ => return 0,
        };
        self.net.host_work(&req).map_or(0, |w| w.post_ns)
    }

    /// The request template of actor `ai`'s group of a kind: its members' global ranks and
    /// how many identical copies one request stands for.
    fn group_request(&self, ai: u32, group: GroupKind) -> CommRequest {
        let g = self.plan.grid;
        let rank = self.actors[ai as usize].rank;
        let multiplicity = match (self.cfg.mode, group) {
            (Mode::Full, _) | (Mode::Symmetric, GroupKind::World) => 1,
            (Mode::Symmetric, GroupKind::Tp) => g.dp,
            (Mode::Symmetric, GroupKind::Dp) => g.tp,
            (Mode::Symmetric, GroupKind::Embedding) => g.tp * g.dp,
        };
        CommRequest {
            kind: CommKind::Collective(CollKind::AllReduce),
            ranks: g.group(rank, group),
            bytes: 0,
            multiplicity,
        }
    }

    /// A send or receive is posted; the transfer starts when its partner is posted too.
    pub(super) fn post_message(&mut self, ai: u32, op: u32) {
        let a = &self.actors[ai as usize];
        let t = &self.tables[a.table as usize];
        let (is_send, peer, bytes) = match t.info[op as usize] {
            OpInfo::Send { peer, bytes } => (true, peer, bytes),
            OpInfo::Recv { peer, bytes } => (false, peer, bytes),
            _ => unreachable!("messages only"),
        };
        let bi = a.peer_actor[dir(peer)];
        let pop = a.peer_op[op as usize];
        if self.actors[bi as usize].state[pop as usize] != POSTED {
            return;
        }
        let (send, recv) = if is_send { ((ai, op), (bi, pop)) } else { ((bi, pop), (ai, op)) };
        let sender = &self.actors[send.0 as usize];
        let (send_peer, send_bytes) = match self.tables[sender.table as usize].info[send.1 as usize] {
            OpInfo::Send { peer, bytes } => (peer, bytes),
            _ => unreachable!("the partner of a receive is a send"),
        };
        debug_assert_eq!(send_bytes, bytes, "a message's send and receive sizes differ");
        let req = &mut self.p2p_req[send.0 as usize][dir(send_peer)];
        req.bytes = send_bytes;
        let id = self.net.start(self.now, req);
        let finish_ns =
            if self.cfg.one_thread_per_rank { self.net.host_work(req).map_or(0, |w| w.finish_ns) } else { 0 };
        let now = self.now;
        self.actors[send.0 as usize].xfer_ns[send.1 as usize] = now;
        self.actors[recv.0 as usize].xfer_ns[recv.1 as usize] = now;
        self.record(id, CommRec::P2p { send, recv, finish_ns });
        self.comm_on(send.0, 2);
        self.comm_on(recv.0, 2);
    }
}
