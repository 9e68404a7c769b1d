//! Rendezvous of collectives: members of a group issue the same sequence of collectives on
//! it, so the k-th collective an actor issues on a group meets the k-th of every other
//! member. Each group instance keeps a queue of open instances indexed by sequence number
//! (relative to the oldest open one); an instance is complete when its last member arrives.

use std::collections::VecDeque;

use crate::plan::ir::GroupKind;

use super::ActorMap;

#[derive(Clone, Debug, Default)]
struct Instance {
    arrived: u32,
    /// (actor, op) in arrival order.
    members: Vec<(u32, u32)>,
}

#[derive(Clone, Debug)]
struct Group {
    /// Sequence number of `pending[0]`.
    base: u32,
    pending: VecDeque<Instance>,
}

/// What an arrival at a rendezvous did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The group has one actor: the collective starts at once.
    Alone,
    /// Others have yet to arrive.
    Waiting,
    /// The last member arrived: (actor, op) of every member, in arrival order.
    Complete(Vec<(u32, u32)>),
}

/// The collectives' meeting points of one execution.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    groups: [Vec<Group>; KINDS],
    total: [u32; KINDS],
    /// Per actor and kind of group: its group instance and collectives issued so far.
    slot: Vec<[u32; KINDS]>,
    seq: Vec<[u32; KINDS]>,
}

/// Kinds of group, each with its own table.
const KINDS: usize = GroupKind::ALL.len();

impl Rendezvous {
    pub fn new(actors: &ActorMap) -> Rendezvous {
        let groups = GroupKind::ALL
            .map(|k| (0..actors.group_count(k)).map(|_| Group { base: 0, pending: VecDeque::new() }).collect());
        let slot = (0..actors.len() as u32).map(|a| GroupKind::ALL.map(|k| actors.group_slot(a, k))).collect();
        Rendezvous {
            groups,
            total: GroupKind::ALL.map(|k| actors.group_actors(k)),
            slot,
            seq: vec![[0; KINDS]; actors.len()],
        }
    }

    /// The group instance actor `a` meets in for a kind of group.
    pub fn slot(&self, a: u32, kind: GroupKind) -> u32 {
        self.slot[a as usize][kind.index()]
    }

    /// Actor `a` issues collective `op` on its group of `kind`.
    pub fn arrive(&mut self, a: u32, op: u32, kind: GroupKind) -> Arrival {
        let k = kind.index();
        let seq = self.seq[a as usize][k];
        self.seq[a as usize][k] += 1;
        let total = self.total[k];
        if total == 1 {
            return Arrival::Alone;
        }
        let g = &mut self.groups[k][self.slot[a as usize][k] as usize];
        let idx = (seq - g.base) as usize;
        while g.pending.len() <= idx {
            g.pending.push_back(Instance::default());
        }
        let inst = &mut g.pending[idx];
        inst.arrived += 1;
        inst.members.push((a, op));
        if inst.arrived < total {
            return Arrival::Waiting;
        }
        let members = std::mem::take(&mut inst.members);
        inst.arrived = u32::MAX;
        while g.pending.front().is_some_and(|i| i.arrived == u32::MAX) {
            g.pending.pop_front();
            g.base += 1;
        }
        Arrival::Complete(members)
    }
}
