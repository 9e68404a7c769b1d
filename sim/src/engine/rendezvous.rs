//! Communication starts: where the engine hands a complete collective or a paired message
//! to the network. Which ops meet is the plan's rule, matched by the shared
//! [`Rendezvous`](strata_models::plan::exec::Rendezvous) (the k-th collective an actor
//! issues on a group meets the k-th of every other member) and
//! [`pair_messages`](strata_models::plan::exec::pair_messages) (before the run, first send
//! with first receive of the same peer pair, kind, microbatch and virtual stage); this file
//! only turns a match into a [`CommRequest`] at the current instant (a MoE dispatch or
//! combine with its group's most loaded rank's bytes, [`Engine::routed`]). In symmetric mode a
//! stage's TP and DP groups have one member (the stage actor), so they start at once, with
//! `multiplicity` = dp (a TP collective stands for the dp identical groups of the stage) or
//! tp (a DP collective for tp).

use strata_models::plan::exec::{Arrival, OpState};
use strata_models::plan::{CollKind, GroupKind, Peer, Stream};

use super::{CommRec, Engine, Mode};
use crate::net::{CommKind, CommRequest};
use crate::program::OpInfo;

impl Engine<'_> {
    /// A collective arrives; it starts when its group is complete.
    pub(super) fn arrive(&mut self, ai: u32, op: u32, s: usize, group: GroupKind, kind: CollKind, bytes: u64) {
        let class = class_of(Stream::ALL[s]);
        let members = match self.rendezvous.arrive(ai, op, group) {
            Arrival::Waiting => return,
            Arrival::Alone => None,
            Arrival::Complete(members) => Some(members),
        };
        // A dispatch or combine moves what its most loaded rank receives (`crate::router`).
        let bytes = match self.routed(ai, op) {
            Some((_, max)) => (bytes as f64 * max).ceil() as u64,
            None => bytes,
        };
        let k = group.index();
        let slot = self.rendezvous.slot(ai, group) as usize;
        if self.group_req[k][slot].is_none() {
            let req = self.group_request(ai, group);
            self.group_req[k][slot] = Some(req);
        }
        let req = self.group_req[k][slot].as_mut().expect("just set");
        req.kind = CommKind::Collective(kind);
        req.bytes = bytes;
        let id = self.net.start(self.now, req);
        let work =
            if self.cfg.one_thread_per_rank { self.net.host_work(req).unwrap_or_default() } else { Default::default() };
        // Finishing also writes the result where the rank's tensors are.
        let finish_ns = work.finish_ns + self.staging_ns(ai, op).1;
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

    /// Router imbalance of op `op` of actor `ai`: (its load ÷ balanced, its EP group's most
    /// loaded rank's), both the stage's most loaded in symmetric mode; `None` if the op
    /// does not follow the routing.
    pub(super) fn routed(&mut self, ai: u32, op: u32) -> Option<(f64, f64)> {
        let a = &self.actors[ai as usize];
        let (layer, mb) = (*self.tables[a.table as usize].moe.get(op as usize)?)?;
        let router = self.router.as_mut()?;
        Some(if self.cfg.mode == Mode::Symmetric {
            let max = router.stage_max(a.stage, layer, mb);
            (max, max)
        } else {
            router.of_rank(a.rank, layer, mb)
        })
    }

    /// One thread per rank: the CPU work of posting `op` (a collective or a message), ns.
    pub(super) fn post_work_ns(&mut self, ai: u32, op: u32) -> u64 {
        if !self.cfg.one_thread_per_rank {
            return 0;
        }
        let a = &self.actors[ai as usize];
        let req = match self.tables[a.table as usize].info[op as usize] {
            OpInfo::Collective { group, kind, bytes, .. } => {
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
        // Posting also copies the message out of the rank's tensors.
        self.net.host_work(&req).map_or(0, |w| w.post_ns) + self.staging_ns(ai, op).0
    }

    /// One thread per rank: CPU ns of the executor's copies around collective `op` of actor
    /// `ai` ([`strata_models::plan::exec::staging`]), (posting, finishing); 0 for other ops.
    fn staging_ns(&self, ai: u32, op: u32) -> (u64, u64) {
        let table = &self.tables[self.actors[ai as usize].table as usize];
        let OpInfo::Collective { staging: s, .. } = table.info[op as usize] else { return (0, 0) };
        if !self.cfg.one_thread_per_rank {
            return (0, 0);
        }
        let [message, tensors, copy] = self.cfg.staging_ns_per_byte;
        let ns = |x: f64| x.round() as u64;
        (ns(s.post_fresh as f64 * message), ns(s.finish_fresh as f64 * tensors + s.finish_copied as f64 * copy))
    }

    /// The request template of actor `ai`'s group of a kind: its members' global ranks and
    /// how many identical copies one request stands for.
    fn group_request(&self, ai: u32, group: GroupKind) -> CommRequest {
        let rank = self.actors[ai as usize].rank;
        CommRequest {
            kind: CommKind::Collective(CollKind::AllReduce),
            ranks: self.plan.grid.group(rank, group),
            bytes: 0,
            multiplicity: self.map.multiplicity(group),
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
        let bi = self.map.peer(ai, peer);
        let pop = self.partner[ai as usize][op as usize];
        if self.actors[bi as usize].cur.state(pop) != OpState::Posted {
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

/// Where a transfer's compute slowdown comes from: 0 tp, 1 dp, 2 pp.
fn class_of(stream: Stream) -> usize {
    match stream {
        Stream::Tp => 0,
        Stream::Pp => 2,
        Stream::Compute | Stream::Dp => 1,
    }
}

fn dir(peer: Peer) -> usize {
    match peer {
        Peer::Next => 0,
        Peer::Prev => 1,
    }
}
