//! The stream scheduler of one rank: a greedy interleaving of its four streams on one
//! thread that keeps the IR's semantics (see the module comment of `exec`).

use std::time::{Duration, Instant};

use strata_models::plan::{AllocOp, BufId, Op, OpId, OpKind, P2pKind, P2pOp, Stream};
use strata_models::trace::Span;

use super::pool::{BufKey, Slot};
use super::{ExecError, RankExec, StepReport, T};
use crate::comm::collective::Pending;
use crate::comm::threads::POLL;
use crate::comm::{Payload, Tag};

/// An op that was started and is not done yet.
pub(super) enum Flight {
    /// A collective.
    Coll {
        pending: Pending,
    },
    Send {
        tag: Tag,
        peer: u32,
        key: BufKey,
    },
    Recv {
        tag: Tag,
        peer: u32,
        key: BufKey,
    },
    Free {
        buf: BufId,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Posted,
    Done,
}

impl RankExec {
    /// Runs one step of the program.
    pub fn step(&mut self, step: u32) -> Result<StepReport, ExecError> {
        self.step = step;
        self.loss_sum = 0.0;
        self.grad_norm = None;
        self.clip_scale = 1.0;
        self.adamw.lr = self.lr_at(step);
        self.load_batches(step)?;
        let plan = self.plan.clone();
        let ops = &plan.program(self.rank).ops;
        let record = self.cfg.trace_step == Some(step);
        let mut streams: [Vec<OpId>; 4] = Default::default();
        for (i, op) in ops.iter().enumerate() {
            streams[op.stream.index()].push(i as OpId);
        }
        let mut state = vec![State::Waiting; ops.len()];
        let mut started_ns = vec![0u64; ops.len()];
        let mut cursor = [0usize; 4];
        let mut flights: Vec<(OpId, Flight)> = Vec::new();
        let mut done = 0;
        let (mut spans, mut samples) = (Vec::new(), Vec::new());
        if record {
            // Every rank starts the traced step together, so that each rank's times, counted
            // from its own start, share one origin (up to the barrier's skew).
            self.barrier()?;
        }
        let t0 = Instant::now();
        let ns = |t0: Instant| t0.elapsed().as_nanos() as u64;
        // Thread CPU time, on the traced step only (a clock read per op and finish).
        let cpu = |on: bool| if on { crate::cputime::thread_ns() } else { None };
        let (cpu_step0, received0) = (cpu(record), self.mailbox.received());
        let mut op_cpu = vec![0u64; if cpu_step0.is_some() { ops.len() } else { 0 }];
        let mut charge = |id: OpId, c0: Option<u64>| {
            if let (Some(a), Some(b)) = (c0, cpu(c0.is_some())) {
                op_cpu[id as usize] += b.saturating_sub(a);
            }
        };
        let mut idle = Duration::ZERO;
        let mut inbox_seen = 0usize;
        self.last_total = u64::MAX;
        self.measure(0, record.then_some(&mut samples));
        while done < ops.len() {
            let mut progress = false;
            for s in Stream::ALL {
                let list = &streams[s.index()];
                while let Some(&id) = list.get(cursor[s.index()]) {
                    let c = cursor[s.index()];
                    let op = &ops[id as usize];
                    let prev_ok = c == 0 || {
                        let p = list[c - 1] as usize;
                        state[p] == State::Done || matches!(ops[p].kind, OpKind::Send(_) | OpKind::Free { .. })
                    };
                    let deps_ok = matches!(op.kind, OpKind::Free { .. })
                        || op.deps.iter().all(|d| state[*d as usize] == State::Done);
                    if !(prev_ok && deps_ok) {
                        break;
                    }
                    started_ns[id as usize] = ns(t0);
                    let c0 = cpu(cpu_step0.is_some());
                    let started = self.start(id, op)?;
                    charge(id, c0);
                    match started {
                        Some(Flight::Free { buf }) if op.deps.iter().all(|d| state[*d as usize] == State::Done) => {
                            // Its deps are done already: the free takes effect at once.
                            let c0 = cpu(cpu_step0.is_some());
                            self.free(buf);
                            charge(id, c0);
                            state[id as usize] = State::Done;
                            done += 1;
                            if record {
                                spans.push(self.span(op, id, started_ns[id as usize], ns(t0)));
                            }
                        }
                        Some(f) => {
                            state[id as usize] = State::Posted;
                            flights.push((id, f));
                        }
                        None => {
                            state[id as usize] = State::Done;
                            done += 1;
                            if record {
                                spans.push(self.span(op, id, started_ns[id as usize], ns(t0)));
                            }
                            // A free whose deps just completed takes effect now, not after
                            // the rest of the stream's run (the plan frees it here).
                            let mut i = 0;
                            while i < flights.len() {
                                let (fid, Flight::Free { buf }) = flights[i] else {
                                    i += 1;
                                    continue;
                                };
                                if !ops[fid as usize].deps.iter().all(|d| state[*d as usize] == State::Done) {
                                    i += 1;
                                    continue;
                                }
                                let c0 = cpu(cpu_step0.is_some());
                                self.free(buf);
                                charge(fid, c0);
                                flights.swap_remove(i);
                                state[fid as usize] = State::Done;
                                done += 1;
                                if record {
                                    spans.push(self.span(&ops[fid as usize], fid, started_ns[fid as usize], ns(t0)));
                                }
                            }
                        }
                    }
                    self.measure(ns(t0), record.then_some(&mut samples));
                    cursor[s.index()] += 1;
                    progress = true;
                    if matches!(op.kind, OpKind::Compute(_)) {
                        // Between two pieces of work, let the other streams post what became
                        // ready and the mailbox finish what arrived, as a GPU's communication
                        // streams run beside its compute stream; a run of compute ops must
                        // not hold the collectives back until it ends.
                        break;
                    }
                }
            }
            self.mailbox.drain()?;
            // Received messages are real memory until a collective combines them: measure
            // while they wait (the finish below consumes them before its own measurement).
            let inbox = self.mailbox.inbox_bytes();
            if inbox > inbox_seen {
                self.measure(ns(t0), record.then_some(&mut samples));
            }
            inbox_seen = inbox;
            let mut i = 0;
            while i < flights.len() {
                let (id, _) = flights[i];
                let c0 = cpu(cpu_step0.is_some());
                if self.try_finish(&mut flights[i].1, &ops[id as usize], |d| state[d as usize] == State::Done)? {
                    // Only the call that finishes it is the op's work; the checks before it
                    // are the loop's.
                    charge(id, c0);
                    flights.swap_remove(i);
                    state[id as usize] = State::Done;
                    done += 1;
                    progress = true;
                    if record {
                        spans.push(self.span(&ops[id as usize], id, started_ns[id as usize], ns(t0)));
                    }
                    self.measure(ns(t0), record.then_some(&mut samples));
                } else {
                    i += 1;
                }
            }
            if progress {
                idle = Duration::ZERO;
            } else if !self.mailbox.poll(POLL)? {
                idle += POLL;
                if idle >= self.cfg.recv_timeout {
                    return Err(self.stalled(ops, &flights, &cursor, &streams, idle));
                }
            }
        }
        self.check_step_end();
        let step_cpu = match (cpu_step0, cpu(cpu_step0.is_some())) {
            (Some(a), Some(b)) => Some(super::StepCpu {
                step_ns: b.saturating_sub(a),
                ops: op_cpu.iter().enumerate().map(|(i, c)| (i as u32, *c)).collect(),
                messages: self.mailbox.received() - received0,
            }),
            _ => None,
        };
        let loss_sum = self.reports_loss().then_some(self.loss_sum);
        Ok(StepReport {
            step,
            loss_sum,
            grad_norm: self.grad_norm,
            spans,
            memory: if record { samples } else { vec![] },
            cpu: step_cpu,
        })
    }

    /// Waits until every rank reached this point (an all-reduce on the world group, outside
    /// the plan's sequence of collectives).
    fn barrier(&mut self) -> Result<(), ExecError> {
        let world = self.groups[&strata_models::plan::GroupKind::World].clone();
        let pending =
            self.mailbox.post(&world, strata_models::plan::CollKind::AllReduce, true, Payload::F32(vec![0.0]))?;
        let start = Instant::now();
        while self.mailbox.try_finish(&pending).is_none() {
            if start.elapsed() >= self.cfg.recv_timeout {
                return Err(ExecError::Stalled {
                    rank: self.rank,
                    step: self.step,
                    secs: start.elapsed().as_secs_f64(),
                    waiting: format!(
                        "the barrier before the traced step, from rank(s) {:?}",
                        self.mailbox.missing(&pending)
                    ),
                });
            }
            self.mailbox.poll(POLL)?;
        }
        Ok(())
    }

    fn span(&self, op: &Op, id: OpId, start_ns: u64, end_ns: u64) -> Span {
        Span { rank: self.rank, stream: op.stream, op: id, start_ns, end_ns }
    }

    /// Every transient buffer of the step was freed and every tensor consumed.
    fn check_step_end(&self) {
        let leftover: Vec<_> = self.pool.live.values().filter(|s| !s.key.persistent()).map(|s| s.key).collect();
        assert!(leftover.is_empty(), "rank {}: buffers alive after the step: {leftover:?}", self.rank);
        assert!(
            self.flight.is_empty(),
            "rank {}: tensors left between pieces after the step: {:?}",
            self.rank,
            self.flight.keys().collect::<Vec<_>>()
        );
    }

    fn stalled(
        &self,
        ops: &[Op],
        flights: &[(OpId, Flight)],
        cursor: &[usize; 4],
        streams: &[Vec<OpId>; 4],
        idle: Duration,
    ) -> ExecError {
        let mut waiting: Vec<String> = flights
            .iter()
            .map(|(id, f)| {
                let what = strata_models::plan::text::op_line(&self.plan, &ops[*id as usize]);
                match f {
                    Flight::Coll { pending } => {
                        format!("op #{id} ({what}) from rank(s) {:?}", self.mailbox.missing(pending))
                    }
                    Flight::Recv { peer, .. } | Flight::Send { peer, .. } => {
                        format!("op #{id} ({what}) from rank {peer}")
                    }
                    Flight::Free { .. } => format!("op #{id} ({what})"),
                }
            })
            .collect();
        for s in Stream::ALL {
            if let Some(id) = streams[s.index()].get(cursor[s.index()]) {
                waiting.push(format!("stream {} blocked at op #{id}", s.key()));
            }
        }
        ExecError::Stalled { rank: self.rank, step: self.step, secs: idle.as_secs_f64(), waiting: waiting.join("; ") }
    }

    /// Starts an op: runs it (`None`: done) or posts it (`Some`: in flight).
    fn start(&mut self, id: OpId, op: &Op) -> Result<Option<Flight>, ExecError> {
        Ok(match &op.kind {
            OpKind::Compute(c) => {
                self.compute(c, &op.bufs)?;
                None
            }
            OpKind::Alloc(a) => {
                self.alloc(a)?;
                None
            }
            OpKind::Free { buf } => Some(Flight::Free { buf: *buf }),
            OpKind::Collective(c) => Some(self.post_collective(id, c, &op.bufs)?),
            OpKind::Send(p) => Some(self.post_send(p, &op.bufs)?),
            OpKind::Recv(p) => {
                let (tag, peer, key) = self.p2p_ids(p, &op.bufs);
                Some(Flight::Recv { tag, peer, key })
            }
        })
    }

    /// Finishes a posted op if it can; true when done.
    fn try_finish(&mut self, f: &mut Flight, op: &Op, is_done: impl Fn(OpId) -> bool) -> Result<bool, ExecError> {
        match f {
            Flight::Free { buf } => {
                if !op.deps.iter().all(|d| is_done(*d)) {
                    return Ok(false);
                }
                self.free(*buf);
                Ok(true)
            }
            Flight::Send { tag, peer, key } => {
                let Tag::P2p { step, kind, mb, vstage } = *tag else { unreachable!("sends carry p2p tags") };
                if self.mailbox.take(Tag::Ack { step, kind, mb, vstage }, *peer).is_none() {
                    return Ok(false);
                }
                self.msg_held.remove(key);
                Ok(true)
            }
            Flight::Recv { tag, peer, key } => {
                let Some(payload) = self.mailbox.take(*tag, *peer) else { return Ok(false) };
                let Payload::F32(v) = payload else { panic!("pipeline messages carry f32 data") };
                self.msgs.insert(*key, v);
                let Tag::P2p { step, kind, mb, vstage } = *tag else { unreachable!("receives carry p2p tags") };
                self.mailbox.send(*peer, Tag::Ack { step, kind, mb, vstage }, Payload::Empty)?;
                Ok(true)
            }
            Flight::Coll { .. } => self.finish_collective(f, op),
        }
    }

    fn alloc(&mut self, a: &AllocOp) -> Result<(), ExecError> {
        let key = BufKey::parse(&a.name).ok_or_else(|| {
            crate::error::RuntimeError::BadSetting(format!(
                "the plan allocates a buffer named \"{}\", which the runtime does not know how to hold",
                a.name
            ))
        })?;
        if key.persistent() && self.pool.live.contains_key(&a.buf) {
            return Ok(()); // allocated in an earlier step; it lives across steps
        }
        if let BufKey::GradBucket { chunk, bucket, mb } = key {
            let c = &self.chunks[chunk as usize];
            let b = c.buckets.iter().find(|b| b.index == bucket).expect("bucket of the chunk");
            let zeros = b.units.iter().map(|(u, r)| (*u, vec![0.0; r.len()])).collect();
            self.grad_buckets.insert((chunk, bucket, mb), zeros);
        }
        self.pool.live.insert(a.buf, Slot { class: a.class, predicted: a.bytes, key });
        self.live_keys.insert(key);
        Ok(())
    }

    fn free(&mut self, buf: BufId) {
        let slot = self
            .pool
            .live
            .remove(&buf)
            .unwrap_or_else(|| panic!("rank {}: free of buffer b{buf}, not live", self.rank));
        self.live_keys.remove(&slot.key);
        match slot.key {
            BufKey::Act { layer, mb } => {
                self.acts.remove(&(layer, mb));
            }
            BufKey::Recompute { layer, mb } => {
                self.rc_acts.remove(&(layer, mb));
            }
            BufKey::Scores { layer, mb } => {
                if let Some(a) = self.rc_acts.get_mut(&(layer, mb)).or_else(|| self.acts.get_mut(&(layer, mb))) {
                    a.probs.release();
                }
            }
            BufKey::Head { mb } => {
                self.heads.remove(&mb);
            }
            BufKey::Msg { .. } => {
                self.msgs.remove(&slot.key);
                self.msg_held.remove(&slot.key);
            }
            BufKey::Gathered { .. } => {
                self.gathered.remove(&buf);
            }
            BufKey::GradBucket { chunk, bucket, mb } => {
                self.grad_buckets.remove(&(chunk, bucket, mb));
            }
            // The weight passes drop their output gradients themselves (`exec::compute`).
            BufKey::WeightGrad { .. } => {}
            BufKey::Embed { .. } | BufKey::Params { .. } | BufKey::Grads { .. } | BufKey::Optimizer { .. } => {}
        }
    }

    /// (tag, peer rank, buffer key) of a pipeline op.
    fn p2p_ids(&self, p: &P2pOp, bufs: &[BufId]) -> (Tag, u32, BufKey) {
        let tag = Tag::P2p { step: self.step, kind: p.kind, mb: p.mb, vstage: p.vstage };
        let peer = self.plan.grid.peer(self.rank, p.peer);
        let key = bufs
            .first()
            .and_then(|b| self.pool.key(*b))
            .unwrap_or_else(|| panic!("rank {}: a pipeline op without its message buffer ({p:?})", self.rank));
        (tag, peer, key)
    }

    fn post_send(&mut self, p: &P2pOp, bufs: &[BufId]) -> Result<Flight, ExecError> {
        let pipe = self.plan.pipeline();
        let (chunk, t) = match p.kind {
            // An activation for virtual stage v leaves v − 1; a gradient leaves v itself.
            P2pKind::Activation => (pipe.chunk_and_stage(p.vstage - 1).0, T::R),
            P2pKind::Gradient => (pipe.chunk_and_stage(p.vstage).0, T::Dr),
        };
        let data = self.take(chunk, p.mb, t);
        let (tag, peer, key) = self.p2p_ids(p, bufs);
        self.msg_held.insert(key, data.len() * 4);
        self.mailbox.send(peer, tag, Payload::F32(data))?;
        Ok(Flight::Send { tag, peer, key })
    }

    /// The received message for (kind, vstage, mb), copied out of its buffer.
    pub(super) fn received(&self, kind: P2pKind, vstage: u32, mb: u32) -> Vec<f32> {
        let key = BufKey::Msg { send: false, kind, vstage, mb };
        self.msgs.get(&key).cloned().unwrap_or_else(|| panic!("rank {}: {key:?} is used before it arrived", self.rank))
    }
}
