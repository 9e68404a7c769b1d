//! `strata-mpi-restart`: the supervisor for ranks as processes (feature `mpi`). It runs a
//! launcher command (`mpirun …` or `srun …` of `strata-mpi-train`) and, when an attempt
//! fails, runs it again resuming from the newest complete checkpoint, up to N times
//! (`strata_runtime::supervise::relaunch` says how the command is rewritten).
//!
//! ```text
//! strata-mpi-restart --restarts N -- mpirun -np 4 strata-mpi-train SCENARIO \
//!     --checkpoint-dir DIR --checkpoint-every K [--inject kill:rank=R,step=S] …
//! ```
//!
//! It prints one line per attempt (its exit status and wall time) and, at the end, the
//! wall time of all attempts. Exit status: the last attempt's (0, 2 for bad input, 1 when
//! it gave up).

use std::process::{Command, ExitCode};
use std::time::Instant;

use strata_runtime::supervise::MAX_RESTARTS;
use strata_runtime::supervise::relaunch::{checkpoint_dir, has_checkpoint, next_command};

const USAGE: &str = "usage: strata-mpi-restart --restarts N -- LAUNCHER… strata-mpi-train SCENARIO --checkpoint-dir DIR [--checkpoint-every K] …";

fn parse() -> Result<(u32, Vec<String>), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sep = args.iter().position(|a| a == "--").ok_or(USAGE.to_string())?;
    let (opts, cmd) = (&args[..sep], args[sep + 1..].to_vec());
    let restarts = match opts {
        [flag, n] if flag == "--restarts" => {
            n.parse::<u32>().map_err(|_| format!("--restarts {n}: not a whole number ≥ 0; {USAGE}"))?
        }
        _ => return Err(USAGE.to_string()),
    };
    if restarts > MAX_RESTARTS {
        return Err(format!("--restarts {restarts} is above the limit of {MAX_RESTARTS}"));
    }
    if cmd.is_empty() {
        return Err(format!("no launcher command after --; {USAGE}"));
    }
    if restarts > 0 && checkpoint_dir(&cmd).is_none() {
        return Err(format!(
            "--restarts {restarts} needs the command's --checkpoint-dir DIR: a restart resumes from the last complete checkpoint, and without a directory there is none"
        ));
    }
    Ok((restarts, cmd))
}

fn main() -> ExitCode {
    let (restarts, mut cmd) = match parse() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let wall = Instant::now();
    for attempt in 0..=restarts {
        let t = Instant::now();
        let status = match Command::new(&cmd[0]).args(&cmd[1..]).status() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot run {}: {e}", cmd[0]);
                return ExitCode::from(2);
            }
        };
        let secs = t.elapsed().as_secs_f64();
        let code = status.code();
        eprintln!(
            "strata-mpi-restart: attempt {attempt} {} after {secs:.2} s",
            code.map_or(format!("ended by {status}"), |c| format!("exited with status {c}"))
        );
        match code {
            Some(0) => {
                eprintln!(
                    "strata-mpi-restart: done after {attempt} restart(s), {:.2} s wall in all",
                    wall.elapsed().as_secs_f64()
                );
                return ExitCode::SUCCESS;
            }
            Some(2) => {
                eprintln!("strata-mpi-restart: bad input (exit 2) is not restarted");
                return ExitCode::from(2);
            }
            _ if attempt == restarts => break,
            _ => {}
        }
        let resume = checkpoint_dir(&cmd).is_some_and(|d| has_checkpoint(&d));
        cmd = next_command(&cmd, resume);
        eprintln!(
            "strata-mpi-restart: restart {} of {restarts}: {}",
            attempt + 1,
            if resume {
                "every rank resumes from the newest complete checkpoint"
            } else {
                "no complete checkpoint yet; starting afresh"
            }
        );
    }
    eprintln!("strata-mpi-restart: gave up after {restarts} restart(s)");
    ExitCode::from(1)
}
