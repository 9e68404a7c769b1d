//! Ranks that run on CPU threads: one thread per rank, and cores shared among ranks.
//!
//! **One thread per rank** (the CPU executor, `strata_runtime::exec`). A rank interleaves
//! its four streams on one thread that does one *task* at a time, to its end:
//! - a compute op;
//! - posting a communication op: the CPU work of copying its contribution out
//!   ([`crate::net::Network::host_work`]'s `post_ns`; a message, which hands over a pointer, costs ~0),
//!   after which the collective arrives at its rendezvous or the message is offered;
//! - finishing one: after the transfer ended (the network's latency), the CPU work of
//!   combining what arrived (`finish_ns`), after which the op is done.
//!
//! The thread serves its streams in the executor's loop order ([`Turn`], the shared
//! statement of it), round after round: the
//! compute stream's next op if it is ready (one op); then every ready op of the tp, dp and
//! pp streams, in that order, posted one task each; then every communication whose transfer
//! ended, finished in the order they ended; then compute again. A kind with nothing to do
//! is skipped. So while a rank computes, none of its communication is posted or completed —
//! a transfer that ends is only *noticed*, and finished when the thread comes round to it —
//! but between two compute ops the thread always serves its communication. Serving waits
//! until every event of the instant has been handled (the engine's work list is empty), so
//! an op made ready at the same instant is seen, as in the executor's loop.
//!
//! **Shared cores** (`shared_cores` = c > 0): the tasks running at an instant — n ranks'
//! worth (an actor counts for the ranks it stands for) — share c cores by processor
//! sharing: each runs at min(1, c/n) of its full speed, so its time stretches by
//! max(1, n/c). A rank waiting for a peer runs no task and leaves its share to the others.
//! Every running task is re-timed when n changes (work left kept in full-speed ns, ends
//! rounded up to integer ns).
//!
//! **Memory.** A communication adds nothing to a rank's memory beyond the plan's buffers:
//! the executor's collectives read the other members' contributions where they are.

use strata_models::plan::exec::Turn;

use super::{Engine, Stream};

/// What a rank's thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Task {
    Compute,
    /// Posting a communication op.
    Post,
    /// Finishing a communication op whose transfer ended (`class`: its slowdown class).
    Finish {
        class: usize,
    },
}

impl Engine<'_> {
    /// One thread per rank: whether stream `s` of actor `ai` may start ops now. The compute
    /// stream may when the thread is free and its round is at compute; the others only when
    /// the thread serves them.
    pub(super) fn thread_may_start(&mut self, ai: u32, s: usize) -> bool {
        if self.actors[ai as usize].running.is_some() {
            return false; // the task's end serves the thread again
        }
        let a = &self.actors[ai as usize];
        if (s == Stream::Compute.index() && a.turn == Turn::Compute) || self.posting == Some(ai) {
            return true;
        }
        self.queue_serve(ai);
        false
    }

    /// Asks for actor `ai`'s thread to be served once the instant's work list is empty.
    pub(super) fn queue_serve(&mut self, ai: u32) {
        let a = &mut self.actors[ai as usize];
        if !a.queued {
            a.queued = true;
            self.serve.push_back(ai);
        }
    }

    /// The thread of actor `ai` is free (or may be): it takes up its round where it left
    /// it — one compute op, then the posts, then the finishes — skipping a kind with
    /// nothing to do, until a task runs or a whole round found nothing.
    pub(super) fn serve_thread(&mut self, ai: u32) {
        self.actors[ai as usize].queued = false;
        for _ in 0..4 {
            if self.actors[ai as usize].running.is_some() {
                return;
            }
            let turn = self.actors[ai as usize].turn;
            match turn {
                Turn::Compute => {
                    // A compute op that starts turns the thread to posting (`start_task`).
                    self.advance(ai, Stream::Compute.index());
                    if self.actors[ai as usize].running.is_none() {
                        self.actors[ai as usize].turn = Turn::Post;
                    }
                }
                Turn::Post => {
                    self.posting = Some(ai);
                    for s in Turn::POST_STREAMS {
                        self.advance(ai, s.index());
                        if self.actors[ai as usize].running.is_some() {
                            break;
                        }
                    }
                    self.posting = None;
                    if self.actors[ai as usize].running.is_none() {
                        self.actors[ai as usize].turn = Turn::Finish;
                    }
                }
                Turn::Finish => {
                    while self.actors[ai as usize].running.is_none() {
                        let Some((op, class, finish_ns)) = self.actors[ai as usize].noticed.pop_front() else {
                            break;
                        };
                        if finish_ns > 0 {
                            self.start_task(ai, op, finish_ns as f64, Task::Finish { class });
                        } else {
                            self.comm_off(ai, class);
                            self.complete(ai, op);
                        }
                    }
                    if self.actors[ai as usize].running.is_none() {
                        self.actors[ai as usize].turn = Turn::Compute;
                    }
                }
            }
        }
    }

    /// A transfer of actor `ai` ended. With one thread per rank the thread finishes it when
    /// free; otherwise it is done now.
    pub(super) fn transfer_done(&mut self, ai: u32, op: u32, class: usize, finish_ns: u64) {
        if self.cfg.one_thread_per_rank {
            self.actors[ai as usize].noticed.push_back((op, class, finish_ns));
            self.queue_serve(ai);
            return;
        }
        self.comm_off(ai, class);
        self.complete(ai, op);
    }

    /// How much a task stretches because ranks share cores: max(1, busy / cores).
    pub(super) fn share(&self) -> f64 {
        let cores = self.cfg.shared_cores;
        if cores > 0.0 && self.busy as f64 > cores { self.busy as f64 / cores } else { 1.0 }
    }

    /// The number of busy ranks changed: re-time every running task.
    pub(super) fn reshare(&mut self) {
        for ai in 0..self.actors.len() as u32 {
            if self.actors[ai as usize].running.is_some() {
                self.retime(ai);
            }
        }
    }
}
