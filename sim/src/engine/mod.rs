//! The discrete-event engine: executes a plan's programs in simulated time, with exactly
//! the plan IR's semantics (`strata_models::plan::ir`).
//!
//! **Time and order.** Time is an integer number of nanoseconds. Timer events (a compute op
//! ending) sit in a binary heap ordered by (time, sequence number), so events at the same
//! instant keep the order they were scheduled in; the network is asked for its next
//! completion and advanced to it when that comes first (ties: network first). Everything
//! an event sets off at the same instant — ops finishing, streams moving on, collectives
//! and transfers starting — runs from a FIFO work list before time moves. The step is a
//! pure function of (state, event): no clocks, no I/O, no hash-map iteration; all
//! randomness (optional compute jitter) comes from one ChaCha8 generator seeded with
//! [`EngineConfig::seed`].
//!
//! **Execution.** The rules are the plan's, in one place: `strata_models::plan::exec`. Each
//! actor's [`Cursor`] says which ops of its four streams may start (gates, deps, posted
//! frees) and hears which are done; collectives meet at the shared [`Rendezvous`]; sends
//! and receives are paired before the run by [`pair_messages`]. What the engine adds is
//! time: a compute op runs for its costed time; an alloc is done at once; a free frees its
//! bytes when it takes effect; a collective, once its group is complete, is handed to the
//! [`Network`] as one [`CommRequest`] with the members' global ranks; a message's transfer
//! starts when both its send and its receive are posted, and both are done on delivery.
//!
//! **Modes.** *Full*: one actor per rank. *Symmetric*: one actor per pipeline stage
//! ([`ActorMap`]), standing for the tp·dp ranks of the stage. A stage's TP collective is
//! one request with `multiplicity` = dp (the dp identical TP groups of the stage run at
//! once), its DP collective `multiplicity` = tp, its pipeline transfers tp·dp.
//!
//! **Stragglers** ([`EngineConfig::slow`], full mode): a slow rank's compute ops take
//! factor × their costed time; everything that waits for them waits longer.
//!
//! **Router imbalance** (a MoE model, [`crate::router`]): a rank's `Experts` ops take its
//! load ÷ balanced × their costed time, a dispatch or combine moves its group's most loaded
//! rank's bytes; symmetric mode's actor takes the stage's most loaded rank.
//!
//! **Interference.** While a TP, DP or pipeline transfer involving an actor is in flight,
//! its compute runs slower by (1 + Σ_busy (factor − 1)) (NCCL kernels take SMs and HBM
//! bandwidth); a running compute op is re-timed whenever that factor changes.
//!
//! **Shared cores** (`shared_cores` = c > 0, the CPU executor: every rank a thread of one
//! process). The ranks computing at an instant, n of them (an actor counts for the ranks it
//! stands for), share c cores by processor sharing: each runs at min(1, c/n) of its speed,
//! so its compute time stretches by max(1, n/c). Ranks waiting on communication leave their
//! cores to the others (a pipeline bubble is not idle hardware). Every running compute op
//! is re-timed when n changes; times stay integer nanoseconds (work left is kept in
//! full-speed ns and the end rounded up).
//!
//! **One thread per rank** (`one_thread_per_rank`, the CPU executor): see [`thread`]. A
//! rank's streams share one thread that runs compute, and — when the network says so
//! ([`Network::host_work`]) — the CPU work of posting and finishing its communication,
//! one task at a time, compute first.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use strata_models::plan::exec::{ActorMap, Cursor, MessageError, Next, OpState, Rendezvous, Turn, Wake, pair_messages};
use strata_models::plan::{GroupKind, Peer, Plan, Stream};

use crate::error::SimError;
use crate::memory::Timeline;
use crate::net::{CommKind, CommRequest, Network};
use crate::program::{OpInfo, ProgramTable};
use crate::router::RouterLoads;

mod jobs;
mod rendezvous;
mod thread;

pub use jobs::{JobRun, SharedNetwork, run_jobs};

use thread::Task;

/// One actor per pipeline stage (symmetric, the identical groups beside it counted as
/// copies), one per rank (full), or whichever is exact on the fabric (auto).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Symmetric,
    Full,
    /// Resolved before the engine runs ([`crate::mode`]), which only sees the other two.
    Auto,
}

/// Knobs of one engine run.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub mode: Mode,
    pub seed: u64,
    /// Compute slowdown factors while a TP / DP / pipeline transfer is in flight.
    pub slowdown: [f64; 3],
    /// Each compute op's time is multiplied by 1 + jitter · U(−1, 1) (0: none).
    pub jitter: f64,
    /// Keep memory samples for the trace.
    pub record_memory: bool,
    /// A rank's streams share one thread: no compute/communication overlap within a rank.
    pub one_thread_per_rank: bool,
    /// Cores shared by all ranks' compute (processor sharing); 0: a device per rank.
    pub shared_cores: f64,
    /// With one thread per rank: CPU ns per byte the executor copies around a collective,
    /// into a fresh message, into fresh per-unit tensors and over held tensors
    /// ([`crate::profile::ExecutionParams::staging_ns_per_byte`]).
    pub staging_ns_per_byte: [f64; 3],
    /// Straggler what-ifs: (rank, factor) stretches every compute op of the rank (full mode).
    pub slow: Vec<(u32, f64)>,
}

#[derive(Clone, Copy, Debug)]
struct Running {
    op: u32,
    /// Work left, in ns at full speed.
    work_ns: f64,
    since_ns: u64,
    factor: f64,
    task: Task,
}

/// One executed program: a rank (full mode) or a stage's representative rank.
#[derive(Clone, Debug)]
pub struct ActorRun {
    pub rank: u32,
    pub stage: u32,
    /// Index into [`Outcome::tables`].
    pub table: usize,
    pub start_ns: Vec<u64>,
    pub end_ns: Vec<u64>,
    /// When a collective's or a message's transfer started (after all members arrived).
    pub xfer_ns: Vec<u64>,
    pub finish_ns: u64,
    pub memory: Timeline,
    /// Router imbalance: per `Experts` op that ran above its balanced time, (op, the
    /// fraction of its time spent on tokens past the balanced share).
    pub imbalance: Vec<(u32, f64)>,
}

/// What a run produced.
pub struct Outcome {
    pub tables: Vec<ProgramTable>,
    /// Which plan program each table compiles.
    pub table_program: Vec<usize>,
    pub actors: Vec<ActorRun>,
    pub makespan_ns: u64,
    /// Timer events, network completions and op completions processed.
    pub events: u64,
    pub mode: Mode,
}

struct Actor {
    table: u32,
    rank: u32,
    stage: u32,
    /// Where the actor is in its program (the shared semantics).
    cur: Cursor,
    start_ns: Vec<u64>,
    end_ns: Vec<u64>,
    xfer_ns: Vec<u64>,
    running: Option<Running>,
    epoch: u32,
    comm_active: [u32; 3],
    memory: Timeline,
    /// Ranks this actor stands for (tp·dp in symmetric mode, else 1).
    weight: u32,
    /// One thread per rank: transfers that ended, to finish when the thread is free, with
    /// (op, slowdown class, finish work ns).
    noticed: VecDeque<(u32, usize, u64)>,
    /// In the engine's serve queue.
    queued: bool,
    /// One thread per rank: which of its three kinds of task the thread turns to next.
    turn: Turn,
    /// Its compute factor (a straggler what-if; 1 otherwise).
    slow: f64,
    /// See [`ActorRun::imbalance`].
    imbalance: Vec<(u32, f64)>,
}

/// A communication in flight; `finish_ns` is each member's finish work (one thread per rank).
enum CommRec {
    Empty,
    One { class: usize, actor: u32, op: u32, finish_ns: u64 },
    Many { class: usize, members: Vec<(u32, u32)>, finish_ns: u64 },
    P2p { send: (u32, u32), recv: (u32, u32), finish_ns: u64 },
}

enum Work {
    Complete(u32, u32),
    Advance(u32, usize),
}

struct Engine<'a> {
    plan: &'a Plan,
    tables: Vec<ProgramTable>,
    map: ActorMap,
    actors: Vec<Actor>,
    rendezvous: Rendezvous,
    /// Per kind of group and group instance: the request its collectives reuse.
    group_req: [Vec<Option<CommRequest>>; GroupKind::ALL.len()],
    /// Per actor and op: the partner op of a send or receive on the peer actor.
    partner: Vec<Vec<u32>>,
    /// Per actor, per direction (Next, Prev): the request of a message it sends.
    p2p_req: Vec<[CommRequest; 2]>,
    comms: Vec<CommRec>,
    heap: BinaryHeap<Reverse<(u64, u64, u32, u32)>>,
    seq: u64,
    now: u64,
    work: VecDeque<Work>,
    net: &'a mut dyn Network,
    rng: ChaCha8Rng,
    cfg: EngineConfig,
    events: u64,
    /// Ranks running a task now (shared cores).
    busy: u32,
    /// One thread per rank: actors to serve once the work list of the instant is empty (so
    /// a ready compute op goes first).
    serve: VecDeque<u32>,
    /// The actor whose non-compute streams are being advanced by its thread.
    posting: Option<u32>,
    /// The experts' loads of a MoE model's router (`None` for a dense model).
    router: Option<RouterLoads>,
}

/// Every kind of group, each with its own table of requests.
const KINDS: [GroupKind; GroupKind::ALL.len()] = GroupKind::ALL;

/// Runs one step of `plan`. `tables[i]` compiles `plan.programs[table_program[i]]`.
pub fn run(
    plan: &Plan,
    tables: Vec<ProgramTable>,
    table_program: Vec<usize>,
    cfg: EngineConfig,
    net: &mut dyn Network,
) -> Result<Outcome, SimError> {
    let mode = if plan.rank_programs.is_empty() { cfg.mode } else { Mode::Full };
    let mut e = Engine::new(plan, tables, &table_program, EngineConfig { mode, ..cfg }, net)?;
    e.execute()?;
    Ok(e.outcome(table_program))
}

impl<'a> Engine<'a> {
    fn new(
        plan: &'a Plan,
        tables: Vec<ProgramTable>,
        table_program: &[usize],
        cfg: EngineConfig,
        net: &'a mut dyn Network,
    ) -> Result<Engine<'a>, SimError> {
        let map = ActorMap::new(plan, cfg.mode == Mode::Symmetric);
        let table_of: BTreeMap<usize, u32> = table_program.iter().enumerate().map(|(t, p)| (*p, t as u32)).collect();
        let mut actors = Vec::with_capacity(map.len());
        for ai in 0..map.len() as u32 {
            let rank = map.rank(ai);
            let program = plan.program_index(rank);
            let table = *table_of.get(&program).ok_or_else(|| SimError::InvalidPlan {
                program,
                op: 0,
                reason: "no compiled table for this program".into(),
            })?;
            let t = &tables[table as usize];
            let n = t.len();
            actors.push(Actor {
                table,
                rank,
                stage: plan.grid.coord(rank).pp,
                cur: Cursor::new(&t.graph),
                start_ns: vec![0; n],
                end_ns: vec![0; n],
                xfer_ns: vec![0; n],
                running: None,
                epoch: 0,
                comm_active: [0; 3],
                memory: Timeline::new(cfg.record_memory),
                weight: map.weight(),
                noticed: VecDeque::new(),
                queued: false,
                turn: Turn::Compute,
                slow: cfg.slow.iter().find(|s| s.0 == rank).map_or(1.0, |s| s.1),
                imbalance: Vec::new(),
            });
        }
        let partner = pair_messages(&map, |a| &plan.programs[plan.program_index(map.rank(a))]).map_err(|e| {
            let (actor, op, reason) = match e {
                MessageError::NeverReceived { from, op, to } => {
                    (from, op, format!("send is never received by rank {}", map.rank(to)))
                }
                MessageError::NeverSent { to, op, from } => {
                    (to, op, format!("receive has no matching send on rank {}", map.rank(from)))
                }
                MessageError::Size { to, recv, recv_bytes, send_bytes, .. } => {
                    (to, recv, format!("receives {recv_bytes} bytes of a message of {send_bytes}"))
                }
            };
            SimError::InvalidPlan { program: plan.program_index(map.rank(actor)), op, reason }
        })?;
        let group_req = KINDS.map(|k| vec![None; map.group_count(k) as usize]);
        let multiplicity = map.message_multiplicity();
        let g = plan.grid;
        let p2p_req = actors
            .iter()
            .map(|a| {
                [Peer::Next, Peer::Prev].map(|p| CommRequest {
                    kind: CommKind::SendRecv,
                    ranks: vec![a.rank, g.peer(a.rank, p)],
                    bytes: 0,
                    multiplicity,
                })
            })
            .collect();
        let rendezvous = Rendezvous::new(&map);
        let router = RouterLoads::new(plan, cfg.seed);
        Ok(Engine {
            plan,
            tables,
            map,
            actors,
            rendezvous,
            group_req,
            partner,
            p2p_req,
            comms: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            work: VecDeque::new(),
            net,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            events: 0,
            busy: 0,
            serve: VecDeque::new(),
            posting: None,
            router,
        })
    }

    fn execute(&mut self) -> Result<(), SimError> {
        for a in 0..self.actors.len() as u32 {
            for s in 0..4 {
                self.work.push_back(Work::Advance(a, s));
            }
        }
        loop {
            self.drain();
            let te = self.heap.peek().map(|Reverse(e)| e.0);
            let tn = self.net.next_completion_ns();
            match (te, tn) {
                (None, None) => break,
                (Some(te), Some(tn)) if tn <= te => self.network_step(tn),
                (None, Some(tn)) => self.network_step(tn),
                _ => {
                    let Reverse((t, _, actor, epoch)) = self.heap.pop().expect("peeked");
                    self.events += 1;
                    self.now = t;
                    self.timer(actor, epoch);
                }
            }
        }
        self.check_finished()
    }

    fn network_step(&mut self, t: u64) {
        debug_assert!(t >= self.now, "network completion at {t} before now {}", self.now);
        self.now = self.now.max(t);
        let done = self.net.advance(t);
        self.deliver(done);
    }

    fn timer(&mut self, actor: u32, epoch: u32) {
        let a = &mut self.actors[actor as usize];
        if a.epoch != epoch {
            return; // re-timed since
        }
        let Some(r) = a.running.take() else { return };
        let weight = a.weight;
        match r.task {
            Task::Compute => self.complete(actor, r.op),
            Task::Post => self.posted(actor, r.op),
            Task::Finish { class } => {
                self.comm_off(actor, class);
                self.complete(actor, r.op);
            }
        }
        if self.cfg.shared_cores > 0.0 {
            self.busy -= weight;
            self.reshare();
        }
        if self.cfg.one_thread_per_rank {
            self.queue_serve(actor);
        }
    }

    fn drain(&mut self) {
        loop {
            while let Some(w) = self.work.pop_front() {
                match w {
                    Work::Complete(a, op) => self.complete(a, op),
                    Work::Advance(a, s) => self.advance(a, s),
                }
            }
            let Some(ai) = self.serve.pop_front() else { return };
            self.serve_thread(ai);
        }
    }

    /// Marks an op done and releases what waited for it.
    fn complete(&mut self, ai: u32, op: u32) {
        self.events += 1;
        let now = self.now;
        let Engine { actors, tables, work, .. } = self;
        let a = &mut actors[ai as usize];
        let t = &tables[a.table as usize];
        a.end_ns[op as usize] = now;
        if let OpInfo::Free { bytes } = t.info[op as usize] {
            a.memory.free(now, bytes);
        }
        a.cur.complete(&t.graph, op, |w| {
            work.push_back(match w {
                Wake::Stream(s) => Work::Advance(ai, s.index()),
                Wake::Free(d) => Work::Complete(ai, d),
            })
        });
    }

    /// Starts every op of stream `s` of actor `ai` that can start now.
    fn advance(&mut self, ai: u32, s: usize) {
        if self.cfg.one_thread_per_rank && !self.thread_may_start(ai, s) {
            return;
        }
        loop {
            let now = self.now;
            let a = &mut self.actors[ai as usize];
            let t = &self.tables[a.table as usize];
            let op = match a.cur.next(&t.graph, Stream::ALL[s]) {
                Next::Blocked | Next::End => return,
                Next::Free { op, ready } => {
                    // Posted as soon as the stream reaches it; done when its deps are.
                    a.start_ns[op as usize] = now;
                    if ready {
                        self.complete(ai, op);
                    }
                    continue;
                }
                Next::Start(op) => op,
            };
            let o = op as usize;
            a.start_ns[o] = now;
            match t.info[o] {
                OpInfo::Compute { ns, .. } => self.start_compute(ai, op, ns),
                OpInfo::Alloc { bytes } => {
                    a.memory.alloc(now, bytes);
                    self.complete(ai, op);
                }
                OpInfo::Collective { .. } | OpInfo::Send { .. } | OpInfo::Recv { .. } => {
                    let post_ns = self.post_work_ns(ai, op);
                    if post_ns > 0 {
                        // The rank's thread copies its contribution out first.
                        self.actors[ai as usize].cur.set_state(op, OpState::Posting);
                        self.start_task(ai, op, post_ns as f64, Task::Post);
                        return;
                    }
                    self.posted(ai, op);
                }
                OpInfo::Free { .. } => unreachable!("frees come as Next::Free"),
            }
        }
    }

    /// A communication op is posted: a collective arrives at its rendezvous, a message is
    /// offered to its partner.
    fn posted(&mut self, ai: u32, op: u32) {
        self.actors[ai as usize].cur.set_state(op, OpState::Posted);
        let a = &self.actors[ai as usize];
        let t = &self.tables[a.table as usize];
        let s = t.stream[op as usize].index();
        match t.info[op as usize] {
            OpInfo::Collective { group, kind, bytes, .. } => self.arrive(ai, op, s, group, kind, bytes),
            OpInfo::Send { .. } | OpInfo::Recv { .. } => self.post_message(ai, op),
            other => unreachable!("only communication is posted, not {other:?}"),
        }
    }

    fn factor(&self, ai: u32) -> f64 {
        let a = &self.actors[ai as usize];
        let overlap = 1.0 + (0..3).filter(|&c| a.comm_active[c] > 0).map(|c| self.cfg.slowdown[c] - 1.0).sum::<f64>();
        overlap * self.share()
    }

    fn start_compute(&mut self, ai: u32, op: u32, ns: u64) {
        let mut work_ns = ns as f64 * self.actors[ai as usize].slow;
        if let Some((load, _)) = self.routed(ai, op) {
            work_ns *= load;
            if load > 1.0 {
                self.actors[ai as usize].imbalance.push((op, (load - 1.0) / load));
            }
        }
        if self.cfg.jitter > 0.0 {
            work_ns *= 1.0 + self.cfg.jitter * self.rng.random_range(-1.0..1.0);
        }
        self.start_task(ai, op, work_ns, Task::Compute);
    }

    /// Runs `work_ns` (at full speed) of `task` for `op` on actor `ai`.
    fn start_task(&mut self, ai: u32, op: u32, work_ns: f64, task: Task) {
        if self.cfg.shared_cores > 0.0 {
            self.busy += self.actors[ai as usize].weight;
            self.reshare();
        }
        let factor = self.factor(ai);
        let a = &mut self.actors[ai as usize];
        debug_assert!(a.running.is_none(), "two tasks at once on rank {}", a.rank);
        if task == Task::Compute {
            a.turn = Turn::Post; // the executor's loop serves communication next
        }
        a.running = Some(Running { op, work_ns, since_ns: self.now, factor, task });
        a.epoch += 1;
        // Saturating (the f64 → u64 cast saturates too): a step past the clock's horizon is
        // refused after the run (`sanity::HORIZON_NS`) instead of wrapping.
        let end = self.now.saturating_add((work_ns * factor).ceil() as u64);
        self.schedule(end, ai);
    }

    fn schedule(&mut self, t: u64, ai: u32) {
        let epoch = self.actors[ai as usize].epoch;
        self.heap.push(Reverse((t, self.seq, ai, epoch)));
        self.seq += 1;
    }

    /// The slowdown of actor `ai` changed: re-time its running compute op.
    fn retime(&mut self, ai: u32) {
        let factor = self.factor(ai);
        let now = self.now;
        let a = &mut self.actors[ai as usize];
        let Some(r) = a.running.as_mut() else { return };
        if r.factor == factor {
            return;
        }
        r.work_ns = (r.work_ns - (now - r.since_ns) as f64 / r.factor).max(0.0);
        r.since_ns = now;
        r.factor = factor;
        a.epoch += 1;
        let end = now.saturating_add((r.work_ns * factor).ceil() as u64);
        self.schedule(end, ai);
    }

    fn comm_on(&mut self, ai: u32, class: usize) {
        let a = &mut self.actors[ai as usize];
        a.comm_active[class] += 1;
        if a.comm_active[class] == 1 && self.cfg.slowdown[class] != 1.0 {
            self.retime(ai);
        }
    }

    fn comm_off(&mut self, ai: u32, class: usize) {
        let a = &mut self.actors[ai as usize];
        a.comm_active[class] -= 1;
        if a.comm_active[class] == 0 && self.cfg.slowdown[class] != 1.0 {
            self.retime(ai);
        }
    }

    fn record(&mut self, id: u64, rec: CommRec) {
        let i = id as usize;
        if i >= self.comms.len() {
            self.comms.resize_with(i + 1, || CommRec::Empty);
        }
        self.comms[i] = rec;
    }

    fn check_finished(&self) -> Result<(), SimError> {
        let Some(a) = self.actors.iter().find(|a| a.cur.remaining() > 0) else { return Ok(()) };
        if self.now >= crate::sanity::HORIZON_NS {
            return Err(crate::sanity::past_horizon(a.cur.remaining())); // out of time, not order
        }
        let t = &self.tables[a.table as usize];
        let program = &self.plan.programs[self.plan.program_index(a.rank)];
        let stuck: Vec<String> = Stream::ALL
            .iter()
            .zip(a.cur.waiting_at(&t.graph))
            .filter_map(|(s, op)| {
                let op = op?;
                let line = strata_models::plan::text::op_line(self.plan, &program.ops[op as usize]);
                Some(format!("{} waits at #{op} ({})", s.key(), line.trim()))
            })
            .collect();
        Err(SimError::Deadlock {
            rank: self.plan.grid.label(a.rank),
            ops_left: a.cur.remaining() as u64,
            stuck: stuck.join("; "),
        })
    }
}
