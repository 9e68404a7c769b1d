//! The supervisor for ranks as processes (`mpirun` / `srun` of `strata-mpi-train`): a
//! launcher command that fails is run again with `--resume`, up to N times.
//!
//! ```text
//! strata-mpi-restart --restarts N -- mpirun -np 4 strata-mpi-train SCENARIO \
//!     --checkpoint-dir DIR --checkpoint-every K [--inject kill:rank=R,step=S] …
//! ```
//!
//! An attempt that exits 0 ends the run; one that exits 2 (bad input) is not retried (it
//! would fail alike); any other status (1: a rank failed; a launcher's own code or a signal
//! when a process was killed) is a failure. Before a relaunch the command is rewritten:
//! `--overwrite` is dropped, `--resume` added when the checkpoint directory holds a
//! complete checkpoint (`strata-mpi-train` removes partial step directories and verifies
//! it before any rank starts), `--overwrite` instead when none was written yet; and the
//! faults that fire once (`--inject kill:…`, `--inject hang:…`, `--inject-panic`) are
//! dropped, as the thread supervisor arms them in the first attempt only.

use std::path::{Path, PathBuf};

use super::inject::Injection;

/// The checkpoint directory a launcher command names (`--checkpoint-dir DIR`).
pub fn checkpoint_dir(cmd: &[String]) -> Option<PathBuf> {
    cmd.windows(2).find(|w| w[0] == "--checkpoint-dir").map(|w| PathBuf::from(&w[1]))
}

/// The command of the next attempt: resume (`has_checkpoint`) or start afresh, without the
/// faults that fire once.
pub fn next_command(cmd: &[String], has_checkpoint: bool) -> Vec<String> {
    let mut out = Vec::with_capacity(cmd.len() + 1);
    let mut it = cmd.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--resume" | "--overwrite" => {}
            "--inject-panic" => {
                it.next();
            }
            "--inject" => match it.next() {
                Some(spec) if Injection::parse(spec).is_ok_and(|i| i.step().is_some()) => {}
                Some(spec) => out.extend([a.clone(), spec.clone()]),
                None => out.push(a.clone()),
            },
            _ => out.push(a.clone()),
        }
    }
    out.push(if has_checkpoint { "--resume" } else { "--overwrite" }.to_string());
    out
}

/// Whether `dir` holds a complete checkpoint to resume from.
pub fn has_checkpoint(dir: &Path) -> bool {
    crate::checkpoint::latest(dir).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn a_relaunch_resumes_and_drops_the_faults_that_fire_once() {
        let cmd = v("mpirun -np 4 bin S --checkpoint-dir ck --overwrite --inject kill:rank=2,step=5 \
                     --inject slow:rank=1,factor=2 --inject-panic 1:3 --steps 8");
        assert_eq!(checkpoint_dir(&cmd), Some(PathBuf::from("ck")));
        assert_eq!(
            next_command(&cmd, true),
            v("mpirun -np 4 bin S --checkpoint-dir ck --inject slow:rank=1,factor=2 --steps 8 --resume")
        );
        let again = next_command(&next_command(&cmd, false), true);
        assert_eq!(again, v("mpirun -np 4 bin S --checkpoint-dir ck --inject slow:rank=1,factor=2 --steps 8 --resume"));
        assert_eq!(checkpoint_dir(&v("mpirun bin S")), None);
    }
}
