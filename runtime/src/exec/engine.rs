//! The stream scheduler of one rank: the executor's round (one compute op, post what is
//! ready, finish what arrived) on one thread, driving the plan's shared execution
//! semantics (`strata_models::plan::exec`); see the module comment of `exec`.

use std::time::{Duration, Instant};

use strata_models::plan::exec::{Cursor, Next, ProgramGraph, Turn, Wake};
use strata_models::plan::{AllocOp, BufId, Op, OpId, OpKind, P2pKind, P2pOp, Stream};
use strata_models::trace::Span;

use super::pool::{BufKey, Slot};
use super::{ExecError, RankExec, StepReport, T};
use crate::comm::collective::Pending;
use crate::comm::threads::POLL;
use crate::comm::{Payload, Tag};

/// A communication op that was posted and is not done yet.
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
}

/// Per-step bookkeeping of the loop: when each op started, its CPU time, the spans.
struct Books {
    t0: Instant,
    started_ns: Vec<u64>,
    spans: Vec<Span>,
    record: bool,
}

impl Books {
    fn ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }
}

impl RankExec {
    /// Runs one step of the program.
    pub fn step(&mut self, step: u32) -> Result<StepReport, ExecError> {
        self.step = step;
        self.loss_sum = 0.0;
        self.grad_norm = None;
        self.nonfinite_grad = None;
        self.clip_scale = 1.0;
        self.adamw.lr = self.lr_at(step);
        self.load_batches(step)?;
        let plan = self.plan.clone();
        let graph = self.graph.clone();
        let ops = &plan.program(self.rank).ops;
        let record = self.cfg.trace_step == Some(step);
        let mut cur = Cursor::new(&graph);
        let mut flights: Vec<(OpId, Flight)> = Vec::new();
        // Posted frees whose deps are done: they take effect at once.
        let mut frees: Vec<OpId> = Vec::new();
        let mut samples = Vec::new();
        if record {
            // Every rank starts the traced step together, so that each rank's times, counted
            // from its own start, share one origin (up to the barrier's skew).
            self.barrier()?;
        }
        let mut books = Books { t0: Instant::now(), started_ns: vec![0; ops.len()], spans: Vec::new(), record };
        // Thread CPU time, on the traced step only (a clock read per op and finish).
        let cpu = |on: bool| if on { crate::cputime::thread_ns() } else { None };
        let (cpu_step0, received0) = (cpu(record), self.mailbox.received());
        let on = cpu_step0.is_some();
        let mut op_cpu = vec![0u64; if on { ops.len() } else { 0 }];
        let mut charge = |id: OpId, c0: Option<u64>| {
            if let (Some(a), Some(b)) = (c0, cpu(c0.is_some())) {
                op_cpu[id as usize] += b.saturating_sub(a);
            }
        };
        let mut idle = Duration::ZERO;
        let mut inbox_seen = 0usize;
        self.last_total = u64::MAX;
        self.measure(0, record.then_some(&mut samples));
        let mut turn = Turn::Compute;
        while cur.remaining() > 0 {
            let mut progress = false;
            // One round: compute (one compute op), post (every ready communication), finish
            // (every communication whose data arrived).
            for _ in 0..3 {
                let streams: &[Stream] = match turn {
                    Turn::Compute => &[Stream::Compute],
                    Turn::Post => &Turn::POST_STREAMS,
                    Turn::Finish => &[],
                };
                for &s in streams {
                    loop {
                        let id = match cur.next(&graph, s) {
                            Next::Blocked | Next::End => break,
                            Next::Free { op, ready } => {
                                books.started_ns[op as usize] = books.ns();
                                progress = true;
                                if ready {
                                    frees.push(op);
                                    self.take_frees(&graph, &mut cur, &mut frees, ops, &mut books, &mut charge, on);
                                }
                                continue;
                            }
                            Next::Start(op) => op,
                        };
                        progress = true;
                        let op = &ops[id as usize];
                        books.started_ns[id as usize] = books.ns();
                        let c0 = cpu(on);
                        let started = self.start(id, op)?;
                        charge(id, c0);
                        match started {
                            Some(f) => flights.push((id, f)),
                            None => {
                                cur.complete(&graph, id, |w| {
                                    if let Wake::Free(d) = w {
                                        frees.push(d)
                                    }
                                });
                                if record {
                                    let end = books.ns();
                                    books.spans.push(self.span(op, id, books.started_ns[id as usize], end));
                                }
                                // A free whose deps just completed takes effect now, not after
                                // the rest of the stream's run (the plan frees it here).
                                self.take_frees(&graph, &mut cur, &mut frees, ops, &mut books, &mut charge, on);
                            }
                        }
                        self.measure(books.ns(), record.then_some(&mut samples));
                        if matches!(op.kind, OpKind::Compute(_)) {
                            // Between two pieces of work, the other streams post what became
                            // ready and the mailbox finishes what arrived, as a GPU's
                            // communication streams run beside its compute stream.
                            break;
                        }
                    }
                }
                if turn == Turn::Finish {
                    self.mailbox.drain()?;
                    // Received messages are real memory until a collective combines them:
                    // measure while they wait (the finish below consumes them first).
                    let inbox = self.mailbox.inbox_bytes();
                    if inbox > inbox_seen {
                        self.measure(books.ns(), record.then_some(&mut samples));
                    }
                    inbox_seen = inbox;
                    let mut i = 0;
                    while i < flights.len() {
                        let (id, _) = flights[i];
                        let c0 = cpu(on);
                        if self.try_finish(&mut flights[i].1, &ops[id as usize])? {
                            // Only the call that finishes it is the op's work; the checks
                            // before it are the loop's.
                            charge(id, c0);
                            flights.swap_remove(i);
                            cur.complete(&graph, id, |w| {
                                if let Wake::Free(d) = w {
                                    frees.push(d)
                                }
                            });
                            progress = true;
                            if record {
                                let end = books.ns();
                                books.spans.push(self.span(&ops[id as usize], id, books.started_ns[id as usize], end));
                            }
                            self.take_frees(&graph, &mut cur, &mut frees, ops, &mut books, &mut charge, on);
                            self.measure(books.ns(), record.then_some(&mut samples));
                        } else {
                            i += 1;
                        }
                    }
                }
                turn = turn.next();
            }
            if progress {
                idle = Duration::ZERO;
            } else if !self.mailbox.poll(POLL)? {
                idle += POLL;
                if idle >= self.cfg.recv_timeout {
                    return Err(self.stalled(ops, &graph, &cur, &flights, idle));
                }
            }
        }
        self.check_step_end();
        let step_cpu = match (cpu_step0, cpu(on)) {
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
            nonfinite_grad: self.nonfinite_grad.take(),
            spans: books.spans,
            memory: if record { samples } else { vec![] },
            cpu: step_cpu,
        })
    }

    /// Makes every posted free whose deps are done take effect (a free's dependents may
    /// release further frees).
    #[allow(clippy::too_many_arguments)]
    fn take_frees(
        &mut self,
        graph: &ProgramGraph,
        cur: &mut Cursor,
        frees: &mut Vec<OpId>,
        ops: &[Op],
        books: &mut Books,
        charge: &mut impl FnMut(OpId, Option<u64>),
        on: bool,
    ) {
        while let Some(id) = frees.pop() {
            let OpKind::Free { buf } = ops[id as usize].kind else { unreachable!("only frees are woken as frees") };
            let c0 = if on { crate::cputime::thread_ns() } else { None };
            self.free(buf);
            charge(id, c0);
            cur.complete(graph, id, |w| {
                if let Wake::Free(d) = w {
                    frees.push(d)
                }
            });
            if books.record {
                let end = books.ns();
                books.spans.push(self.span(&ops[id as usize], id, books.started_ns[id as usize], end));
            }
        }
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
        graph: &ProgramGraph,
        cur: &Cursor,
        flights: &[(OpId, Flight)],
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
                }
            })
            .collect();
        for (s, at) in Stream::ALL.iter().zip(cur.waiting_at(graph)) {
            if let Some(id) = at {
                waiting.push(format!("stream {} blocked at op #{id}", s.key()));
            }
        }
        ExecError::Stalled { rank: self.rank, step: self.step, secs: idle.as_secs_f64(), waiting: waiting.join("; ") }
    }

    /// A slow rank (fault injection) owes (factor − 1) × each compute op's duration. Owed
    /// time is slept once it reaches `SLOW_SLEEP_MIN` (1 ms), and a sleep that overran is
    /// credited: the OS wakes a sleeper tens of µs late (more on a busy machine), far more
    /// than a small model's op takes, so sleeping after every op would slow the rank by far
    /// more than the factor. Over a step the rank's compute time is the factor × its own.
    fn slow_down(&mut self, op: Duration) {
        self.slow_debt_s += op.as_secs_f64() * (self.compute_slowdown - 1.0);
        if self.slow_debt_s >= super::SLOW_SLEEP_MIN.as_secs_f64() {
            let t = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(self.slow_debt_s));
            self.slow_debt_s -= t.elapsed().as_secs_f64();
        }
    }

    /// Starts an op: runs it (`None`: done) or posts it (`Some`: in flight).
    fn start(&mut self, id: OpId, op: &Op) -> Result<Option<Flight>, ExecError> {
        Ok(match &op.kind {
            OpKind::Compute(c) => {
                let t0 = Instant::now();
                self.compute(c, &op.bufs)?;
                if self.compute_slowdown > 1.0 {
                    self.slow_down(t0.elapsed());
                }
                None
            }
            OpKind::Alloc(a) => {
                self.alloc(a)?;
                None
            }
            OpKind::Free { .. } => unreachable!("frees are posted by the cursor, not started"),
            OpKind::Collective(c) => Some(self.post_collective(id, c, &op.bufs)?),
            OpKind::Send(p) => Some(self.post_send(p, &op.bufs)?),
            OpKind::Recv(p) => {
                let (tag, peer, key) = self.p2p_ids(p, &op.bufs);
                Some(Flight::Recv { tag, peer, key })
            }
        })
    }

    /// Finishes a posted op if it can; true when done.
    fn try_finish(&mut self, f: &mut Flight, op: &Op) -> Result<bool, ExecError> {
        match f {
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
            BufKey::Cp { layer, mb, role } => {
                self.cp_store.remove(&(layer, mb, role));
            }
            // The weight passes drop their output gradients themselves (`exec::compute`).
            BufKey::WeightGrad { .. } => {}
            // A pass's pieces take the tensors they hand on (`RankExec::take`).
            BufKey::Work { .. } => {}
            // The embedding's weight pass takes the gradient (`exec::compute`).
            BufKey::EmbedGrad { .. } => {}
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
