//! Several jobs in one simulated time: one engine per job, one network under all of them.
//!
//! Each job keeps its own engine (its plan, actors, rendezvous, timer heap and generator),
//! and talks to the network through its own view ([`JobRun::net`]), which maps the job's
//! ranks onto the cluster's GPUs and forwards to the one shared network, so the jobs'
//! flows share links. [`run_jobs`] interleaves the engines by time with the single-job
//! rule of [`super::run`], over all of them: everything the instant sets off runs first
//! (every engine's work list, in job order); then the earliest of the shared network's next
//! instant and every engine's next timer event happens, the network first at a tie and the
//! lower job first between engines. The network's completions go to the jobs that started
//! them, in the network's (time, id) order. With one job this is exactly [`super::run`]'s
//! loop, so a job alone through `run_jobs` gives the same outcome as through `run` on the
//! same network (a test holds it).
//!
//! Every job runs in full mode (one actor per rank): symmetric mode stands one stage for
//! identical groups of the same job, which says nothing about another job's flows.

use std::cmp::Reverse;

use crate::error::SimError;
use crate::net::{CommId, Network};
use crate::program::ProgramTable;
use strata_models::plan::Plan;

use super::{CommRec, Engine, EngineConfig, Mode, Outcome, Work};

/// The network under several jobs, as the driver sees it.
pub trait SharedNetwork {
    /// The next instant at which the shared network must be advanced.
    fn next_completion_ns(&self) -> Option<u64>;
    /// Advances it to `now_ns` and returns the completed requests as (job, the job's own
    /// id), in completion order.
    fn advance(&mut self, now_ns: u64) -> Vec<(usize, CommId)>;
}

/// One job of a multi-job run.
pub struct JobRun<'a> {
    pub plan: &'a Plan,
    /// `tables[i]` compiles `plan.programs[table_program[i]]`; every rank's program.
    pub tables: Vec<ProgramTable>,
    pub table_program: Vec<usize>,
    /// The mode is forced to full.
    pub cfg: EngineConfig,
    /// The job's view of the shared network: its ranks, its request ids.
    pub net: &'a mut dyn Network,
}

/// Runs one step of every job at once; the outcomes in job order.
pub fn run_jobs(jobs: Vec<JobRun<'_>>, shared: &mut dyn SharedNetwork) -> Result<Vec<Outcome>, SimError> {
    let mut engines = Vec::with_capacity(jobs.len());
    let mut programs = Vec::with_capacity(jobs.len());
    for j in jobs {
        let cfg = EngineConfig { mode: Mode::Full, ..j.cfg };
        let mut e = Engine::new(j.plan, j.tables, &j.table_program, cfg, j.net)?;
        for a in 0..e.actors.len() as u32 {
            for s in 0..4 {
                e.work.push_back(Work::Advance(a, s));
            }
        }
        engines.push(e);
        programs.push(j.table_program);
    }
    loop {
        for e in engines.iter_mut() {
            e.drain();
        }
        let te = engines.iter().enumerate().filter_map(|(j, e)| e.heap.peek().map(|Reverse(ev)| (ev.0, j))).min();
        match (te, shared.next_completion_ns()) {
            (None, None) => break,
            (Some((te, _)), Some(tn)) if tn <= te => network_step(&mut engines, shared, tn),
            (None, Some(tn)) => network_step(&mut engines, shared, tn),
            (Some((_, j)), _) => {
                let e = &mut engines[j];
                let Some(Reverse((t, _, actor, epoch))) = e.heap.pop() else { continue };
                e.events += 1;
                e.now = t;
                e.timer(actor, epoch);
            }
        }
    }
    for e in &engines {
        e.check_finished()?;
    }
    Ok(engines.into_iter().zip(programs).map(|(e, p)| e.outcome(p)).collect())
}

/// The shared network reaches `t`: each job hears of its own completions, in order.
fn network_step(engines: &mut [Engine<'_>], shared: &mut dyn SharedNetwork, t: u64) {
    let mut done: Vec<Vec<CommId>> = vec![Vec::new(); engines.len()];
    for (j, id) in shared.advance(t) {
        done[j].push(id);
    }
    for (e, ids) in engines.iter_mut().zip(done) {
        if !ids.is_empty() {
            debug_assert!(t >= e.now, "network completion at {t} before now {}", e.now);
            e.now = e.now.max(t);
            e.deliver(ids);
        }
    }
}

impl<'a> Engine<'a> {
    /// The network finished these requests (at `self.now`): their members' transfers are done.
    pub(super) fn deliver(&mut self, done: Vec<CommId>) {
        for id in done {
            self.events += 1;
            let rec = self.comms.get_mut(id as usize).map(|r| std::mem::replace(r, CommRec::Empty));
            match rec {
                Some(CommRec::One { class, actor, op, finish_ns }) => self.transfer_done(actor, op, class, finish_ns),
                Some(CommRec::Many { class, members, finish_ns }) => {
                    for (a, op) in members {
                        self.transfer_done(a, op, class, finish_ns);
                    }
                }
                Some(CommRec::P2p { send, recv, finish_ns }) => {
                    self.transfer_done(send.0, send.1, 2, 0);
                    self.transfer_done(recv.0, recv.1, 2, finish_ns);
                }
                Some(CommRec::Empty) | None => debug_assert!(false, "unknown communication {id}"),
            }
        }
    }

    /// What the run produced, once it is over.
    pub(super) fn outcome(mut self, table_program: Vec<usize>) -> Outcome {
        let mut actors = Vec::with_capacity(self.actors.len());
        let mut makespan_ns = 0;
        for mut a in self.actors.drain(..) {
            a.imbalance.sort_by_key(|&(op, _)| op);
            let finish_ns = a.end_ns.iter().copied().max().unwrap_or(0);
            makespan_ns = makespan_ns.max(finish_ns);
            actors.push(super::ActorRun {
                rank: a.rank,
                stage: a.stage,
                table: a.table as usize,
                start_ns: a.start_ns,
                end_ns: a.end_ns,
                xfer_ns: a.xfer_ns,
                finish_ns,
                memory: a.memory,
                imbalance: a.imbalance,
            });
        }
        let mode = self.cfg.mode;
        Outcome {
            tables: std::mem::take(&mut self.tables),
            table_program,
            actors,
            makespan_ns,
            events: self.events,
            mode,
        }
    }
}
