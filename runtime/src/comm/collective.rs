//! Deterministic, non-blocking collectives over any [`Communicator`].
//!
//! A collective on a group of n members (in group order, as `RankGrid::group` lists them):
//!
//! ```text
//! all-reduce      member p sends x_p to every other member;  y = x_0 + x_1 + … + x_{n−1}
//! reduce-scatter  member p sends part j of x_p to member j;   y_p = Σ_j (part p of x_j), j = 0…n−1
//! all-gather      member p sends x_p to every other member;  y = x_0 ‖ x_1 ‖ … ‖ x_{n−1}
//! broadcast       member 0 sends x_0 to every other member;   y = x_0
//! all-to-all      member p sends block j of x_p to member j;  y_p = block p of x_0 ‖ … ‖ block p of x_{n−1}
//! ```
//!
//! An all-to-all's blocks are equal parts of the input ([`Mailbox::post`]) or any sizes
//! ([`Mailbox::post_all_to_all_v`], returned by sender with [`Mailbox::try_finish_blocks`]).
//!
//! Sums run in group order on every member, so every member gets the same bits, and so do
//! repeated runs. Parts of a reduce-scatter are [`ZeroShard::split`]'s near-equal
//! contiguous ranges (equal when n divides the length). Worked example, all-reduce on a
//! group [4, 6] of ranks: rank 4 is member 0, rank 6 member 1; both compute x₄ + x₆.
//!
//! A collective is *posted* (contributions sent, no waiting) and later *finished* once
//! every contribution has arrived ([`Mailbox::try_finish`]). Messages that arrive before
//! their op is posted wait in the mailbox, keyed by (tag, sender).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use strata_models::plan::{CollKind, GroupKind};

use super::{CommError, Communicator, Message, Payload, Tag};
use crate::optim::ZeroShard;

/// A process group as one member sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub kind: GroupKind,
    /// Ranks in group order.
    pub members: Vec<u32>,
    /// This rank's index in `members`.
    pub position: usize,
}

impl Group {
    pub fn size(&self) -> usize {
        self.members.len()
    }
}

/// A posted collective.
#[derive(Clone, Debug)]
pub struct Pending {
    tag: Tag,
    kind: CollKind,
    members: Vec<u32>,
    position: usize,
    /// This member's own contribution (its part, for a reduce-scatter).
    own: Payload,
    /// Length of the input, for a reduce-scatter's part sizes.
    len: usize,
}

/// Part `j` of `n` of a buffer of `len` elements.
pub fn part(len: usize, j: usize, n: usize) -> std::ops::Range<usize> {
    ZeroShard::split(len, j, n).expect("part index inside its group").range()
}

/// One rank's communicator plus the messages that arrived before their op was posted.
pub struct Mailbox {
    comm: Box<dyn Communicator>,
    inbox: BTreeMap<(Tag, u32), Payload>,
    inbox_bytes: usize,
    /// Messages filed so far.
    received: u64,
    /// Collectives posted so far per (group kind, implicit): the next sequence number.
    seq: BTreeMap<(GroupKind, bool), u64>,
}

fn f32s<'a>(p: &'a Payload, what: &str) -> &'a [f32] {
    p.as_f32().unwrap_or_else(|| panic!("{what}: expected f32 data, got {p:?}"))
}

impl Mailbox {
    pub fn new(comm: Box<dyn Communicator>) -> Mailbox {
        Mailbox { comm, inbox: BTreeMap::new(), inbox_bytes: 0, received: 0, seq: BTreeMap::new() }
    }

    pub fn rank(&self) -> u32 {
        self.comm.rank()
    }

    pub fn size(&self) -> u32 {
        self.comm.size()
    }

    pub fn comm(&self) -> &dyn Communicator {
        self.comm.as_ref()
    }

    /// Bytes of messages received but not yet taken by an op.
    pub fn inbox_bytes(&self) -> usize {
        self.inbox_bytes
    }

    pub fn send(&self, to: u32, tag: Tag, payload: Payload) -> Result<(), CommError> {
        self.comm.send(to, tag, payload)
    }

    /// Waits up to `timeout` for one message and files it; true if one came.
    pub fn poll(&mut self, timeout: Duration) -> Result<bool, CommError> {
        match self.comm.recv_timeout(timeout)? {
            Some(m) => {
                self.file(m);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Files every message already waiting, without blocking.
    pub fn drain(&mut self) -> Result<(), CommError> {
        while self.poll(Duration::ZERO)? {}
        Ok(())
    }

    /// Messages received so far (each one a wake-up of a waiting rank).
    pub fn received(&self) -> u64 {
        self.received
    }

    fn file(&mut self, m: Message) {
        self.received += 1;
        self.inbox_bytes += m.payload.owned_bytes();
        let old = self.inbox.insert((m.tag, m.from), m.payload);
        assert!(old.is_none(), "rank {} got two messages {:?} from rank {}", self.rank(), m.tag, m.from);
    }

    /// Takes the message `tag` from `from`, if it arrived.
    pub fn take(&mut self, tag: Tag, from: u32) -> Option<Payload> {
        let p = self.inbox.remove(&(tag, from))?;
        self.inbox_bytes -= p.owned_bytes();
        Some(p)
    }

    pub fn has(&self, tag: Tag, from: u32) -> bool {
        self.inbox.contains_key(&(tag, from))
    }

    /// Posts a collective: sends this member's contributions and returns the handle that
    /// [`Mailbox::try_finish`] completes. `data` is the input (this member's part, for an
    /// all-gather). f64 data is allowed for all-reduce only.
    pub fn post(&mut self, group: &Group, kind: CollKind, implicit: bool, data: Payload) -> Result<Pending, CommError> {
        let seq = self.seq.entry((group.kind, implicit)).or_insert(0);
        let tag = Tag::Coll { group: group.kind, implicit, seq: *seq };
        *seq += 1;
        let (n, me) = (group.size(), group.position);
        debug_assert_eq!(group.members[me], self.rank());
        // f32 contributions are shared, not copied: every member reads the sender's buffer.
        let data = match data {
            Payload::F32(v) => Payload::share(Arc::new(v)),
            Payload::F64(v) => {
                assert_eq!(kind, CollKind::AllReduce, "f64 data only for all-reduce");
                Payload::F64(v)
            }
            other @ Payload::Shared { .. } => other,
            other => panic!("collective data must be numbers, got {other:?}"),
        };
        let len = match &data {
            Payload::F64(v) => v.len(),
            other => f32s(other, "a collective").len(),
        };
        let own = match kind {
            CollKind::AllReduce | CollKind::AllGather => {
                for (j, &to) in group.members.iter().enumerate() {
                    if j != me {
                        self.comm.send(to, tag, data.clone())?;
                    }
                }
                data
            }
            // All-to-all of equal parts (context parallelism's Ulysses): part j of the data
            // goes to member j, as a reduce-scatter sends it; the result concatenates the
            // parts received, in member order, as an all-gather does.
            CollKind::ReduceScatter | CollKind::AllToAll => {
                let Payload::Shared { data: x, range } = data else { unreachable!("f32 data is shared above") };
                let view = |j: usize| {
                    let r = part(len, j, n);
                    Payload::Shared { data: x.clone(), range: range.start + r.start..range.start + r.end }
                };
                for (j, &to) in group.members.iter().enumerate() {
                    if j != me {
                        self.comm.send(to, tag, view(j))?;
                    }
                }
                view(me)
            }
            CollKind::Broadcast => {
                if me == 0 {
                    for &to in &group.members[1..] {
                        self.comm.send(to, tag, data.clone())?;
                    }
                }
                data
            }
            CollKind::RingExchange => {
                let to = group.members[(me + 1) % n];
                if to != self.rank() {
                    self.comm.send(to, tag, data.clone())?;
                }
                data
            }
        };
        Ok(Pending { tag, kind, members: group.members.clone(), position: me, own, len })
    }

    /// Posts an all-to-all with blocks of any sizes (MPI's `Alltoallv`; the expert-parallel
    /// dispatch and combine of a MoE layer, whose counts the router decides): `blocks[j]`
    /// goes to member j, and [`Mailbox::try_finish_blocks`] returns the block each member
    /// sent this one. A message carries its own length (in process, and in the MPI
    /// backend's encoding), so no separate exchange of counts is needed. Empty blocks are
    /// sent too: every member hears from every other one.
    pub fn post_all_to_all_v(
        &mut self,
        group: &Group,
        implicit: bool,
        blocks: Vec<Vec<f32>>,
    ) -> Result<Pending, CommError> {
        if blocks.len() != group.size() {
            return Err(CommError::Transport {
                rank: self.rank(),
                what: format!("all-to-all-v with {} blocks on a group of {}", blocks.len(), group.size()),
            });
        }
        let seq = self.seq.entry((group.kind, implicit)).or_insert(0);
        let tag = Tag::Coll { group: group.kind, implicit, seq: *seq };
        *seq += 1;
        let mut flat = Vec::with_capacity(blocks.iter().map(Vec::len).sum());
        let mut ranges = Vec::with_capacity(blocks.len());
        for b in &blocks {
            ranges.push(flat.len()..flat.len() + b.len());
            flat.extend_from_slice(b);
        }
        let len = flat.len();
        self.send_blocks(group, tag, Arc::new(flat), ranges, len)
    }

    /// Sends block `ranges[j]` of `x` to member j and keeps one's own.
    fn send_blocks(
        &mut self,
        group: &Group,
        tag: Tag,
        x: Arc<Vec<f32>>,
        ranges: Vec<std::ops::Range<usize>>,
        len: usize,
    ) -> Result<Pending, CommError> {
        let me = group.position;
        for (j, &to) in group.members.iter().enumerate() {
            if j != me {
                self.comm.send(to, tag, Payload::Shared { data: x.clone(), range: ranges[j].clone() })?;
            }
        }
        let own = Payload::Shared { data: x, range: ranges[me].clone() };
        Ok(Pending { tag, kind: CollKind::AllToAll, members: group.members.clone(), position: me, own, len })
    }

    /// The blocks of a finished all-to-all, by sending member, if every one arrived
    /// (consuming them), else `None`.
    pub fn try_finish_blocks(&mut self, p: &Pending) -> Option<Vec<Vec<f32>>> {
        assert_eq!(p.kind, CollKind::AllToAll, "blocks of an all-to-all");
        if !self.missing(p).is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(p.members.len());
        for (j, &r) in p.members.iter().enumerate() {
            let x = if j == p.position { p.own.clone() } else { self.take(p.tag, r).expect("checked by missing") };
            out.push(f32s(&x, "all-to-all").to_vec());
        }
        Some(out)
    }

    /// Ranks whose contribution to `p` has not arrived yet.
    pub fn missing(&self, p: &Pending) -> Vec<u32> {
        let needed: Vec<usize> = match p.kind {
            CollKind::Broadcast if p.position != 0 => vec![0],
            CollKind::Broadcast => vec![],
            CollKind::RingExchange => {
                let n = p.members.len();
                let prev = (p.position + n - 1) % n;
                if prev == p.position { vec![] } else { vec![prev] }
            }
            _ => (0..p.members.len()).filter(|&j| j != p.position).collect(),
        };
        needed.into_iter().map(|j| p.members[j]).filter(|&r| !self.has(p.tag, r)).collect()
    }

    /// The result of `p` if every contribution is in (consuming them), else `None`.
    pub fn try_finish(&mut self, p: &Pending) -> Option<Payload> {
        if !self.missing(p).is_empty() {
            return None;
        }
        let n = p.members.len();
        if p.kind == CollKind::RingExchange {
            // The previous member's block (one's own in a group of one).
            let prev = (p.position + n - 1) % n;
            if prev == p.position {
                return Some(Payload::F32(f32s(&p.own, "ring exchange").to_vec()));
            }
            let x = self.take(p.tag, p.members[prev]).expect("checked by missing");
            return Some(Payload::F32(f32s(&x, "ring exchange").to_vec()));
        }
        let mut parts: Vec<Payload> = Vec::with_capacity(n);
        for (j, &r) in p.members.iter().enumerate() {
            if j == p.position {
                parts.push(p.own.clone());
            } else if p.kind == CollKind::Broadcast {
                if j == 0 {
                    parts.push(self.take(p.tag, r).expect("checked by missing"));
                }
            } else {
                parts.push(self.take(p.tag, r).expect("checked by missing"));
            }
        }
        Some(match p.kind {
            CollKind::AllReduce | CollKind::ReduceScatter => sum_in_order(parts),
            CollKind::AllGather | CollKind::AllToAll => {
                let mut out = Vec::with_capacity(parts.iter().map(|x| f32s(x, "all-gather").len()).sum());
                for x in &parts {
                    out.extend_from_slice(f32s(x, "all-gather"));
                }
                Payload::F32(out)
            }
            CollKind::Broadcast => Payload::F32(f32s(&parts[0], "broadcast").to_vec()),
            CollKind::RingExchange => unreachable!("finished above"),
        })
        .inspect(|out| {
            if p.kind == CollKind::ReduceScatter {
                debug_assert_eq!(out.bytes() / 4, part(p.len, p.position, n).len());
            }
        })
    }
}

/// x₀ + x₁ + … in the given order, element by element (into a new buffer: the
/// contributions are the senders').
fn sum_in_order(parts: Vec<Payload>) -> Payload {
    let mut it = parts.into_iter();
    match it.next().expect("a group has a member") {
        first @ (Payload::F32(_) | Payload::Shared { .. }) => {
            let mut acc = f32s(&first, "sum").to_vec();
            drop(first);
            for x in it {
                let x = f32s(&x, "sum");
                assert_eq!(x.len(), acc.len(), "contributions of different lengths");
                acc.iter_mut().zip(x).for_each(|(a, b)| *a += b);
            }
            Payload::F32(acc)
        }
        Payload::F64(mut acc) => {
            for x in it {
                let Payload::F64(x) = x else { panic!("mixed f32 and f64 contributions") };
                acc.iter_mut().zip(&x).for_each(|(a, b)| *a += b);
            }
            Payload::F64(acc)
        }
        other => panic!("cannot sum {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::comm::threads::{AbortFlag, ThreadComm};

    /// Runs `f(rank, mailbox)` on `n` threads and returns their results in rank order.
    fn on_ranks<T: Send + 'static>(n: u32, f: impl Fn(u32, &mut Mailbox) -> T + Send + Sync + 'static) -> Vec<T> {
        let f = std::sync::Arc::new(f);
        let handles: Vec<_> = ThreadComm::group(n, &AbortFlag::default())
            .into_iter()
            .map(|c| {
                let f = f.clone();
                thread::spawn(move || {
                    let r = c.rank();
                    let mut mb = Mailbox::new(Box::new(c));
                    f(r, &mut mb)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn finish(mb: &mut Mailbox, p: &Pending) -> Vec<f32> {
        loop {
            if let Some(out) = mb.try_finish(p) {
                return f32s(&out, "test").to_vec();
            }
            mb.poll(Duration::from_secs(5)).unwrap();
        }
    }

    #[test]
    fn collectives_on_subgroups_give_closed_form_results_in_group_order() {
        // 4 ranks, groups [0, 2] and [1, 3] (a dp group of a tp = 2 grid).
        let out = on_ranks(4, |r, mb| {
            let members = if r % 2 == 0 { vec![0, 2] } else { vec![1, 3] };
            let g = Group { kind: GroupKind::Dp, position: (r / 2) as usize, members };
            let x: Vec<f32> = (0..5).map(|i| (10 * r + i) as f32).collect();
            let ar = mb.post(&g, CollKind::AllReduce, false, Payload::F32(x.clone())).unwrap();
            let rs = mb.post(&g, CollKind::ReduceScatter, false, Payload::F32(x.clone())).unwrap();
            let ag = mb.post(&g, CollKind::AllGather, false, Payload::F32(vec![r as f32])).unwrap();
            let bc = mb.post(&g, CollKind::Broadcast, false, Payload::F32(vec![r as f32; 2])).unwrap();
            // Finish in the reverse order of posting: contributions wait in the mailbox.
            let bc = finish(mb, &bc);
            assert_eq!(bc, vec![(r % 2) as f32; 2], "rank {r}: broadcast comes from member 0");
            (finish(mb, &ag), finish(mb, &rs), finish(mb, &ar))
        });
        // Group [0, 2]: x0 = 0..5, x2 = 20..25; sums 20, 22, 24, 26, 28; parts 3 + 2.
        assert_eq!(out[0].2, vec![20.0, 22.0, 24.0, 26.0, 28.0]);
        assert_eq!(out[2].2, out[0].2);
        assert_eq!((out[0].1.clone(), out[2].1.clone()), (vec![20.0, 22.0, 24.0], vec![26.0, 28.0]));
        assert_eq!(out[1].0, vec![1.0, 3.0]);
        assert_eq!(out[3].2, vec![40.0, 42.0, 44.0, 46.0, 48.0]);
    }

    #[test]
    fn all_to_all_v_delivers_each_block_to_its_member_and_equal_all_to_all_concatenates() {
        // Group [1, 2, 3] of 4 ranks (rank 0 is outside): member p sends (p·j) mod 3 copies
        // of 10·p + j to member j — member 0 sends only empty blocks.
        let out = on_ranks(4, |r, mb| {
            if r == 0 {
                return (vec![], vec![]);
            }
            let g = Group { kind: GroupKind::Ep, members: vec![1, 2, 3], position: (r - 1) as usize };
            let p = g.position;
            let blocks: Vec<Vec<f32>> = (0..3).map(|j| vec![(10 * p + j) as f32; (p * j) % 3]).collect();
            let v = mb.post_all_to_all_v(&g, false, blocks).unwrap();
            let eq =
                mb.post(&g, CollKind::AllToAll, false, Payload::F32((0..6).map(|i| (r * 100 + i) as f32).collect()));
            let eq = eq.unwrap();
            let got = loop {
                if let Some(b) = mb.try_finish_blocks(&v) {
                    break b;
                }
                mb.poll(Duration::from_secs(5)).unwrap();
            };
            (got, finish(mb, &eq))
        });
        for p in 0..3usize {
            let (blocks, eq) = &out[p + 1];
            for (src, b) in blocks.iter().enumerate() {
                assert_eq!(b, &vec![(10 * src + p) as f32; (src * p) % 3], "member {p} from {src}");
            }
            // Equal blocks of 2: member p gets elements 2p, 2p+1 of every member's input.
            let want: Vec<f32> = (1..4u32)
                .flat_map(|r| [(r * 100) as f32 + 2.0 * p as f32, (r * 100) as f32 + 2.0 * p as f32 + 1.0])
                .collect();
            assert_eq!(eq, &want);
        }
    }

    #[test]
    fn all_to_all_sends_part_j_to_member_j() {
        // 3 ranks, 2 elements per part: member r receives part r of every member, in order.
        let out = on_ranks(3, |r, mb| {
            let g = Group { kind: GroupKind::Cp, members: vec![0, 1, 2], position: r as usize };
            let x: Vec<f32> = (0..6).map(|i| (10 * r + i) as f32).collect();
            let p = mb.post(&g, CollKind::AllToAll, false, Payload::F32(x)).unwrap();
            finish(mb, &p)
        });
        assert_eq!(out[0], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
        assert_eq!(out[2], vec![4.0, 5.0, 14.0, 15.0, 24.0, 25.0]);
    }

    #[test]
    fn f32_sums_are_bit_identical_on_every_member_and_every_run() {
        let run = || {
            on_ranks(3, |r, mb| {
                let g = Group { kind: GroupKind::World, members: vec![0, 1, 2], position: r as usize };
                // Values whose sum depends on the order in f32.
                let x = vec![[1e8f32, 1.0, -1e8][r as usize]; 4];
                let p = mb.post(&g, CollKind::AllReduce, false, Payload::F32(x)).unwrap();
                finish(mb, &p)
            })
        };
        let a = run();
        // (1e8 + 1) − 1e8 = 0 in f32: group order, not any other.
        assert_eq!(a[0], vec![0.0; 4]);
        assert!(a.iter().all(|x| x == &a[0]));
        assert_eq!(run(), a);
    }
}
