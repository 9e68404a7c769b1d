//! What a supervised run records: every attempt, its failure, the steps it lost, and the
//! run's measured goodput.
//!
//! Times are rank 0's wall clock. A step's time is rank 0's `StepRecord::seconds` (its
//! program and the loss reports); the time *restarting* after a failure runs from the end
//! of the failed attempt's last completed step to the start of the next attempt's first
//! step (checkpoint writes after that step, failure detection, teardown, removing partial
//! checkpoints, verifying and loading the checkpoint, building the ranks).
//!
//! ```text
//! goodput = useful / wall
//! useful  = Σ seconds of the steps that count (each step once, from the attempt that kept it)
//! wall    = useful + lost (steps recomputed later) + restarting + other (first start-up,
//!           checkpoint writes between steps, the final gather)
//! ```

use serde::{Deserialize, Serialize};

use crate::train::TrainError;

/// Σ of seconds, +0 when empty (`Iterator::sum` of no floats is −0, which prints as `-0.0`).
pub(crate) fn total(x: impl Iterator<Item = f64>) -> f64 {
    x.fold(0.0, |a, b| a + b)
}

/// Why an attempt ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The rank named as the cause (none for a failed checkpoint write).
    pub rank: Option<u32>,
    /// `killed` (a rank ended without a word), `panic`, `stall` (no progress for the
    /// receive timeout), `checkpoint write`, or `error`.
    pub cause: String,
    pub message: String,
}

impl Failure {
    /// Classifies a failure: the rank it names and why, from the error the job ended with.
    pub fn of(e: &TrainError) -> Failure {
        let (rank, cause) = match e {
            TrainError::RankExited { rank } => (Some(*rank), "killed"),
            TrainError::RankFailed { rank, reason, .. } => (
                Some(*rank),
                // The reasons the executor writes (train.rs, exec::ExecError::Stalled).
                if reason.contains("without a word") || reason.contains("it exited") {
                    "killed"
                } else if reason.contains("panicked") {
                    "panic"
                } else if reason.contains("made no progress") {
                    "stall"
                } else {
                    "error"
                },
            ),
            TrainError::Checkpoint(c) if c.is_io() => (None, "checkpoint write"),
            _ => (None, "error"),
        };
        Failure { rank, cause: cause.to_string(), message: e.to_string() }
    }
}

/// One attempt of a supervised run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// 0 for the first attempt.
    pub attempt: u32,
    /// The step it started at (0, or the checkpoint it resumed from).
    pub start_step: u32,
    /// Steps rank 0 completed in it.
    pub steps_done: u32,
    /// Of those, the steps past the checkpoint the next attempt resumed from (recomputed).
    pub steps_lost: u32,
    /// Wall time of the attempt, from launching its ranks to their end.
    pub seconds: f64,
    /// Σ of its completed steps' times.
    pub step_seconds: f64,
    /// Σ of the lost steps' times.
    pub lost_seconds: f64,
    /// After a failure: the time until the next attempt's first step started.
    pub restart_seconds: Option<f64>,
    /// The faults armed in it (`--inject` specs).
    pub injected: Vec<String>,
    pub failure: Option<Failure>,
}

/// The run's measured goodput (see the module's comment).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub goodput: f64,
    pub wall_seconds: f64,
    pub useful_seconds: f64,
    pub lost_seconds: f64,
    pub restart_seconds: f64,
    pub other_seconds: f64,
    pub restarts: u32,
    pub steps_lost: u32,
}

impl Goodput {
    pub fn of(attempts: &[Attempt], wall_seconds: f64) -> Goodput {
        let sum = |f: fn(&Attempt) -> f64| total(attempts.iter().map(f));
        let lost_seconds = sum(|a| a.lost_seconds);
        let useful_seconds = sum(|a| a.step_seconds) - lost_seconds;
        let restart_seconds = sum(|a| a.restart_seconds.unwrap_or(0.0));
        let other_seconds = (wall_seconds - useful_seconds - lost_seconds - restart_seconds).max(0.0);
        Goodput {
            goodput: if wall_seconds > 0.0 { useful_seconds / wall_seconds } else { 0.0 },
            wall_seconds,
            useful_seconds,
            lost_seconds,
            restart_seconds,
            other_seconds,
            restarts: attempts.iter().filter(|a| a.restart_seconds.is_some()).count() as u32,
            steps_lost: attempts.iter().map(|a| a.steps_lost).sum(),
        }
    }

    /// One line for a person.
    pub fn line(&self) -> String {
        format!(
            "Goodput {:.3}: {:.2} s of {:.2} s wall in steps that count; {:.2} s recomputed ({} step{} lost), {:.2} s restarting ({} restart{}), {:.2} s start-up and checkpoint writes",
            self.goodput,
            self.useful_seconds,
            self.wall_seconds,
            self.lost_seconds,
            self.steps_lost,
            if self.steps_lost == 1 { "" } else { "s" },
            self.restart_seconds,
            self.restarts,
            if self.restarts == 1 { "" } else { "s" },
            self.other_seconds
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(step_seconds: f64, lost_seconds: f64, restart: Option<f64>, lost: u32) -> Attempt {
        Attempt {
            attempt: 0,
            start_step: 0,
            steps_done: 0,
            steps_lost: lost,
            seconds: 0.0,
            step_seconds,
            lost_seconds,
            restart_seconds: restart,
            injected: Vec::new(),
            failure: None,
        }
    }

    #[test]
    fn goodput_counts_each_kept_step_once() {
        // Attempt 0: 7 steps of 1 s, the last 2 recomputed, 3 s to restart; attempt 1: 5 steps.
        let a = [attempt(7.0, 2.0, Some(3.0), 2), attempt(5.0, 0.0, None, 0)];
        let g = Goodput::of(&a, 20.0);
        assert_eq!((g.useful_seconds, g.lost_seconds, g.restart_seconds, g.other_seconds), (10.0, 2.0, 3.0, 5.0));
        assert_eq!(g.goodput, 0.5);
        assert_eq!((g.restarts, g.steps_lost), (1, 2));
        assert!(g.line().contains("2 steps lost") && g.line().contains("(1 restart)"), "{}", g.line());
    }
}
