//! One trial: a job of `work_ns` failure-free compute run against one failure stream at
//! one checkpoint interval, event by event (a failure, the end of an interval, of a save,
//! of a restart), never step by step.
//!
//! The job computes `interval_ns`, saves (blocking `block_ns`), and repeats; the last
//! stretch of work ends the run with no save after it. A failure at any moment — during
//! compute, a save, the wait for the previous asynchronous write, or a restart — loses the
//! compute since the last durable checkpoint (and the part of a save it interrupted), then
//! the job restarts (`restart_ns`, begun again if a failure strikes it) from that
//! checkpoint. A synchronous save is durable when its block ends; an asynchronous one when
//! its background write (`write_ns` after the staging block) ends, and the next save waits
//! for it. Every nanosecond of wall time lands in exactly one account: the work that stayed
//! done, checkpoint blocking, lost work or restart — [`Outcome::accounts_ns`] sums them.

use strata_models::faults::failures::Cause;

use super::stream::FailureStream;

/// A checkpoint's cost in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveNs {
    Sync { block_ns: u64 },
    Async { block_ns: u64, write_ns: u64 },
}

/// What one trial is asked to run.
#[derive(Clone, Copy, Debug)]
pub struct TrialSpec {
    pub work_ns: u64,
    pub interval_ns: u64,
    pub save: SaveNs,
    pub restart_ns: u64,
    /// Give up (the trial is `unfinished`) past this wall time or this many failures.
    pub wall_cap_ns: u64,
    pub failure_cap: usize,
}

/// Where one trial's time went, nanoseconds; per cause in [`Cause::ALL`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub wall_ns: u64,
    /// The work done and kept (= `work_ns` when finished).
    pub kept_ns: u64,
    pub checkpoint_ns: u64,
    pub lost_ns: [u64; 7],
    pub restart_ns: [u64; 7],
    pub failures: [u32; 7],
    pub checkpoints: u32,
    pub unfinished: bool,
}

impl Outcome {
    /// The accounts summed: equals `wall_ns`.
    pub fn accounts_ns(&self) -> u64 {
        self.kept_ns + self.checkpoint_ns + self.lost_ns.iter().sum::<u64>() + self.restart_ns.iter().sum::<u64>()
    }
}

fn idx(c: Cause) -> usize {
    Cause::ALL.iter().position(|&k| k == c).unwrap_or(0)
}

struct Job<'a> {
    spec: TrialSpec,
    stream: &'a mut FailureStream,
    /// Index of the next failure in the stream.
    next: usize,
    t: u64,
    /// Work done since the start of the run that is still held (lost on a failure back to `durable`).
    w: u64,
    durable: u64,
    /// An asynchronous save being written: (durable at, work it holds).
    pending: Option<(u64, u64)>,
    out: Outcome,
}

/// Runs one trial.
pub fn run(spec: TrialSpec, stream: &mut FailureStream) -> Outcome {
    let mut job = Job { spec, stream, next: 0, t: 0, w: 0, durable: 0, pending: None, out: Outcome::default() };
    job.go();
    job.out.wall_ns = job.t;
    job.out.kept_ns = job.w;
    job.out
}

impl Job<'_> {
    fn next_failure(&mut self) -> Option<(u64, Cause)> {
        self.stream.get(self.next).map(|f| (f.t_ns, f.cause))
    }

    fn over_cap(&self) -> bool {
        self.t >= self.spec.wall_cap_ns || self.next >= self.spec.failure_cap
    }

    /// Runs `dur` of something from now; `Some(cause)` when a failure cut it short (the
    /// clock is then at the failure), `None` when it completed.
    fn span(&mut self, dur: u64) -> Option<Cause> {
        let end = self.t.saturating_add(dur);
        match self.next_failure() {
            Some((f, cause)) if f < end => {
                self.t = f;
                self.next += 1;
                self.out.failures[idx(cause)] += 1;
                Some(cause)
            }
            _ => {
                self.t = end;
                None
            }
        }
    }

    fn go(&mut self) {
        let s = self.spec;
        while self.w < s.work_ns {
            if self.over_cap() {
                self.out.unfinished = true;
                return;
            }
            let seg = (s.work_ns - self.w).min(s.interval_ns);
            let start = self.t;
            if let Some(c) = self.span(seg) {
                let done = self.t - start;
                self.fail(c, done);
                continue;
            }
            self.w += seg;
            if self.w >= s.work_ns {
                return;
            }
            if let Some(c) = self.save() {
                self.fail(c, 0);
            }
        }
    }

    /// A save; `Some(cause)` when a failure interrupted it (its spent part is lost work).
    fn save(&mut self) -> Option<Cause> {
        let (block, write) = match self.spec.save {
            SaveNs::Sync { block_ns } => (block_ns, None),
            SaveNs::Async { block_ns, write_ns } => (block_ns, Some(write_ns)),
        };
        if let Some((at, held)) = self.pending {
            if at > self.t {
                let start = self.t;
                if let Some(c) = self.span(at - self.t) {
                    self.lose_partial(c, self.t - start);
                    return Some(c);
                }
                self.out.checkpoint_ns += at - start;
            }
            self.durable = held;
            self.pending = None;
        }
        let start = self.t;
        if let Some(c) = self.span(block) {
            self.lose_partial(c, self.t - start);
            return Some(c);
        }
        self.out.checkpoint_ns += block;
        self.out.checkpoints += 1;
        match write {
            None => self.durable = self.w,
            Some(write_ns) => self.pending = Some((self.t.saturating_add(write_ns), self.w)),
        }
        None
    }

    fn lose_partial(&mut self, c: Cause, spent: u64) {
        self.out.lost_ns[idx(c)] += spent;
    }

    /// A failure of `cause` at the clock, `computed` ns into the current stretch of compute:
    /// back to the last durable checkpoint, then restart.
    fn fail(&mut self, cause: Cause, computed: u64) {
        if let Some((at, held)) = self.pending
            && at <= self.t
        {
            self.durable = held;
        }
        self.pending = None;
        self.out.lost_ns[idx(cause)] += (self.w - self.durable) + computed;
        self.w = self.durable;
        let mut cause = cause;
        loop {
            if self.over_cap() {
                return;
            }
            let start = self.t;
            let hit = self.span(self.spec.restart_ns);
            self.out.restart_ns[idx(cause)] += self.t - start;
            match hit {
                Some(c) => cause = c,
                None => return,
            }
        }
    }
}
