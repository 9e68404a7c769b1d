//! `strata-mpi-train`: one rank per MPI process (feature `mpi`).
//!
//! ```text
//! mpirun -np 4 strata-mpi-train SCENARIO [--set KEY=VALUE]… [--steps K] [--timeout S]
//!        [--data FILE] [--checkpoint-dir DIR [--checkpoint-every K]
//!        [--resume [--allow-changed KEY]… | --overwrite]] [--out DIR]
//!        [--check-single TOL] [--check-threads] [--inject-panic RANK:STEP] [--inject SPEC]…
//! ```
//!
//! `--inject` takes the specs of `strata train --inject` (`kill:rank=R,step=S`: that
//! process exits at the start of step S without a word, as a killed one does, and the
//! launcher ends the job; `hang:…`; `slow:…`). `strata-mpi-restart` relaunches a failed
//! job from its checkpoint.
//!
//! `--data`, the checkpoint flags and `--out` mean what they mean for `strata train`; across
//! hosts, the checkpoint directory must be shared (every rank writes its own shard, rank 0
//! the manifest), and `--out` is written by rank 0.
//!
//! The checkpoint directory gets the checks `strata train` makes ([`checkpoint::prepare`]):
//! rank 0, before any rank trains, refuses a used directory unless `--resume` (continue
//! it) or `--overwrite` (delete its checkpoints), removes partial step directories, and on
//! a resume verifies the newest checkpoint (scenario, settings, every shard's checksum);
//! every rank learns the verdict by a broadcast, and the job exits 2 (bad input) or 1 (an
//! I/O failure) as one.
//!
//! Every process lowers the scenario (tp · pp · dp must equal the number of processes),
//! runs its rank's program over MPI, and rank 0 prints the loss per step. With
//! `--check-single TOL`, rank 0 then trains the same model on one rank in-process and
//! fails (exit 1) if any step's loss differs by more than TOL nats; with
//! `--check-threads`, it trains the same split on threads and fails unless the losses are
//! bit-identical (the collectives sum in the same fixed order on both backends).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use strata_models::Scenario;
use strata_models::plan::{lower, verify};
use strata_runtime::checkpoint::{self, CheckpointError, Start};
use strata_runtime::comm::Communicator;
use strata_runtime::comm::mpi::{MpiComm, init};
use strata_runtime::data::Corpus;
use strata_runtime::exec::ExecConfig;
use strata_runtime::supervise::inject::{self, Injection};
use strata_runtime::train::{
    CheckpointOptions, Fault, StepRecord, TrainError, TrainOptions, run_rank, synthetic_corpus, train_threads,
    write_outputs,
};

struct Args {
    scenario: String,
    overrides: Vec<String>,
    steps: Option<u32>,
    timeout_s: u64,
    check_single: Option<f64>,
    check_threads: bool,
    /// Fault injection: (rank, step) that panics.
    panic_at: Option<(u32, u32)>,
    inject: Vec<Injection>,
    data: Option<PathBuf>,
    checkpoint_dir: Option<PathBuf>,
    checkpoint_every: u32,
    resume: bool,
    overwrite: bool,
    allow_changed: Vec<String>,
    out: Option<PathBuf>,
}

const USAGE: &str = "usage: mpirun -np N strata-mpi-train SCENARIO [--set KEY=VALUE]... [--steps K] [--timeout SECONDS] [--data FILE] [--checkpoint-dir DIR [--checkpoint-every K] [--resume [--allow-changed KEY]... | --overwrite]] [--out DIR] [--check-single TOL] [--check-threads] [--inject-panic RANK:STEP] [--inject SPEC]...";

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        scenario: String::new(),
        overrides: vec![],
        steps: None,
        timeout_s: 120,
        check_single: None,
        check_threads: false,
        panic_at: None,
        inject: vec![],
        data: None,
        checkpoint_dir: None,
        checkpoint_every: 0,
        resume: false,
        overwrite: false,
        allow_changed: vec![],
        out: None,
    };
    while let Some(x) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value; {USAGE}"));
        match x.as_str() {
            "--set" => a.overrides.push(value("--set")?),
            "--steps" => a.steps = Some(value("--steps")?.parse().map_err(|e| format!("--steps: {e}"))?),
            "--timeout" => a.timeout_s = value("--timeout")?.parse().map_err(|e| format!("--timeout: {e}"))?,
            "--check-single" => {
                a.check_single = Some(value("--check-single")?.parse().map_err(|e| format!("--check-single: {e}"))?)
            }
            "--check-threads" => a.check_threads = true,
            "--data" => a.data = Some(value("--data")?.into()),
            "--checkpoint-dir" => a.checkpoint_dir = Some(value("--checkpoint-dir")?.into()),
            "--checkpoint-every" => {
                a.checkpoint_every =
                    value("--checkpoint-every")?.parse().map_err(|e| format!("--checkpoint-every: {e}"))?
            }
            "--resume" => a.resume = true,
            "--overwrite" => a.overwrite = true,
            "--allow-changed" => a.allow_changed.push(value("--allow-changed")?),
            "--out" => a.out = Some(value("--out")?.into()),
            "--inject-panic" => {
                let v = value("--inject-panic")?;
                let (r, k) = v.split_once(':').ok_or(format!("--inject-panic {v}: expected RANK:STEP"))?;
                let num = |x: &str| x.parse::<u32>().map_err(|e| format!("--inject-panic {v}: {e}"));
                a.panic_at = Some((num(r)?, num(k)?));
            }
            "--inject" => a.inject.push(Injection::parse(&value("--inject")?).map_err(|e| e.to_string())?),
            s if s.starts_with("--") => return Err(format!("unknown option {s}; {USAGE}")),
            s => a.scenario = s.to_string(),
        }
    }
    if a.scenario.is_empty() {
        return Err(USAGE.to_string());
    }
    if a.resume && a.checkpoint_dir.is_none() {
        return Err(format!("--resume needs --checkpoint-dir; {USAGE}"));
    }
    if a.overwrite && a.checkpoint_dir.is_none() {
        return Err(format!("--overwrite needs --checkpoint-dir; {USAGE}"));
    }
    if a.overwrite && a.resume {
        return Err("--overwrite deletes the checkpoints --resume would continue from; give one of them".into());
    }
    if !a.allow_changed.is_empty() && !a.resume {
        return Err(format!("--allow-changed applies to a resume; add --resume; {USAGE}"));
    }
    if a.data.is_some() && (a.check_single.is_some() || a.check_threads) {
        return Err("the checks compare runs on the synthetic corpus; drop --data".into());
    }
    Ok(a)
}

/// Rank 0's checks of the checkpoint directory before any rank trains (what
/// `train_threads` does for the thread launcher); returns the partial step directories it
/// removed.
fn prepare_checkpoints(a: &Args, s: &Scenario, data: &str) -> Result<Vec<PathBuf>, CheckpointError> {
    let Some(dir) = &a.checkpoint_dir else { return Ok(Vec::new()) };
    let allowed = checkpoint::allowed_changes(s, &a.allow_changed)?;
    let start = match (a.resume, a.overwrite) {
        (true, _) => Start::Resume,
        (false, true) => Start::Overwrite,
        (false, false) => Start::Fresh,
    };
    let removed = checkpoint::prepare(dir, start)?;
    if a.resume {
        let (sdir, m) = checkpoint::latest(dir)?;
        checkpoint::check_manifest(&sdir, &m, s, data, &allowed)?;
        checkpoint::verify_all(&sdir, &m)?;
    }
    Ok(removed)
}

/// Rank 0's verdict on the checkpoint directory, shared with every rank: 0 (go), 1 (an I/O
/// failure) or 2 (bad input), the exit code of the whole job.
fn checkpoint_verdict(a: &Args, s: &Scenario, data: &str, rank: u32) -> u8 {
    use mpi::traits::{Communicator as _, Root as _};
    let mut code = 0u8;
    if rank == 0 {
        match prepare_checkpoints(a, s, data) {
            Ok(removed) => {
                let why = if a.overwrite { "--overwrite" } else { "a partial checkpoint: no manifest" };
                for d in removed {
                    eprintln!("removed {} ({why})", d.display());
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                code = if e.is_io() { 1 } else { 2 };
            }
        }
    }
    mpi::topology::SimpleCommunicator::world().process_at_rank(0).broadcast_into(&mut code);
    code
}

fn options(steps: u32, data: &str, timeout_s: u64) -> TrainOptions {
    TrainOptions {
        steps,
        data_name: data.to_string(),
        checkpoint: None,
        exec: ExecConfig { recv_timeout: Duration::from_secs(timeout_s), trace_step: None },
        faults: Vec::new(),
    }
}

/// Rank 0's checks after the MPI run; returns the failures.
fn checks(a: &Args, s: &Scenario, mpi: &[f64], steps: u32, data: &str) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    let (corpus, _, _) = synthetic_corpus(s.model.vocab, s.training.seed).map_err(|e| e.to_string())?;
    let corpus = Arc::new(corpus);
    if let Some(tol) = a.check_single {
        let mut o = a.overrides.clone();
        for k in [
            "parallel.tp=1",
            "parallel.pp=1",
            "parallel.dp=1",
            "parallel.vpp=1",
            "parallel.schedule=1f1b",
            "parallel.zero=0",
            "parallel.sequence_parallel=false",
            "cluster.nodes=1",
            "cluster.gpus_per_node=1",
        ] {
            o.push(k.to_string());
        }
        let one = Scenario::load(a.scenario.as_ref(), &o).map_err(|e| e.to_string())?;
        let plan = Arc::new(lower(&one).map_err(|e| e.to_string())?);
        let single = train_threads(plan, corpus.clone(), &options(steps, data, a.timeout_s), None)
            .map_err(|e| e.to_string())?
            .losses();
        let diff = single.iter().zip(mpi).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        println!("check: max |loss(MPI) − loss(1 rank)| over {steps} steps = {diff:.3e} nats (tolerance {tol:e})");
        if diff.is_nan() || diff > tol || single.len() != mpi.len() {
            failures.push(format!("the MPI run differs from one rank by {diff:e} > {tol:e}"));
        }
    }
    if a.check_threads {
        let plan = Arc::new(lower(s).map_err(|e| e.to_string())?);
        let threads =
            train_threads(plan, corpus, &options(steps, data, a.timeout_s), None).map_err(|e| e.to_string())?.losses();
        let same = threads.iter().map(|x| x.to_bits()).eq(mpi.iter().map(|x| x.to_bits()));
        println!("check: MPI and threads losses bit-identical: {same}");
        if !same {
            failures.push(format!("MPI losses {mpi:?} differ from the threads' {threads:?}"));
        }
    }
    Ok(failures)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let universe = match init() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let comm = MpiComm::world();
    let (rank, size) = (comm.rank(), comm.size());
    let setup = (|| -> Result<_, String> {
        let s = Scenario::load(a.scenario.as_ref(), &a.overrides).map_err(|e| e.to_string())?;
        if s.parallel.ranks() != size as u64 {
            return Err(format!(
                "the scenario splits into tp · pp · dp = {} ranks but mpirun started {size} processes",
                s.parallel.ranks()
            ));
        }
        let plan = lower(&s).map_err(|e| e.to_string())?;
        verify(&plan).map_err(|e| e.to_string())?;
        let start = match &a.checkpoint_dir {
            Some(d) if a.resume => checkpoint::latest(d).map_or(0, |(_, m)| m.step),
            _ => 0,
        };
        inject::check(&a.inject, size, start, a.steps.unwrap_or(s.training.steps)).map_err(|e| e.to_string())?;
        let (corpus, data) = match &a.data {
            Some(path) => {
                let c = Corpus::from_text_file(path, s.model.seq_len as usize).map_err(|e| e.to_string())?;
                let name = format!("{} ({} bytes)", path.display(), c.len());
                (c, name)
            }
            None => {
                let (c, name, _) = synthetic_corpus(s.model.vocab, s.training.seed).map_err(|e| e.to_string())?;
                (c, name)
            }
        };
        Ok((s, plan, corpus, data))
    })();
    let (s, plan, corpus, data) = match setup {
        Ok(x) => x,
        Err(e) => {
            if rank == 0 {
                eprintln!("error: {e}");
            }
            drop(comm);
            drop(universe);
            return ExitCode::from(2);
        }
    };
    let verdict = checkpoint_verdict(&a, &s, &data, rank);
    if verdict != 0 {
        drop(comm);
        drop(universe);
        return ExitCode::from(verdict);
    }
    let steps = a.steps.unwrap_or(s.training.steps);
    if rank == 0 {
        println!("{}: {size} MPI ranks ({}), {steps} steps", s.name, plan.grid);
    }
    let mut print =
        |r: &StepRecord| println!("step {:>4}  loss {:.6}  {:>9.0} tokens/s", r.step, r.loss, r.tokens_per_s);
    let progress: Option<&mut dyn FnMut(&StepRecord)> = if rank == 0 { Some(&mut print) } else { None };
    let mut opts = options(steps, &data, a.timeout_s);
    opts.faults = a.panic_at.map(|(rank, step)| Fault::Panic { rank, step }).into_iter().collect();
    opts.faults.extend(a.inject.iter().map(Injection::fault));
    opts.checkpoint = a.checkpoint_dir.clone().map(|dir| CheckpointOptions {
        dir,
        every: a.checkpoint_every,
        resume: a.resume,
        keep: 2,
        overwrite: a.overwrite,
        allow_changed: a.allow_changed.clone(),
    });
    if a.out.is_some() {
        opts.exec.trace_step = steps.checked_sub(1);
    }
    let plan = Arc::new(plan);
    let out = run_rank(plan.clone(), Box::new(comm), Arc::new(corpus), &opts, progress);
    let result = match out {
        Ok(r) => r,
        // An injected kill: the process vanishes without a word; the launcher ends the job.
        Err(TrainError::RankExited { .. }) => std::process::exit(137),
        Err(e) => {
            // One write, so that the lines of ranks failing at once do not interleave.
            let line = format!("error on rank {rank}: {e}\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            // Rank 0 reports for the job: once it has, it gives the others a second to print
            // their view and ends the job. The others wait for that (a busy 2-core host can
            // take seconds to let rank 0 notice) and end the job themselves only if rank 0
            // never does — at most 10 s after their own report.
            std::thread::sleep(Duration::from_secs(if rank == 0 { 1 } else { 10 }));
            let w = mpi::topology::SimpleCommunicator::world();
            mpi::topology::Communicator::abort(&w, 1);
        }
    };
    if let (Some(r), Some(dir)) = (&result, &a.out)
        && let Err(e) = write_outputs(dir, &plan, r)
    {
        eprintln!("error: writing the outputs to {}: {e}", dir.display());
        drop(universe);
        return ExitCode::from(1);
    }
    let code = match result {
        Some(r) => match checks(&a, &s, &r.losses(), steps, &data) {
            Ok(f) if f.is_empty() => ExitCode::SUCCESS,
            Ok(f) => {
                eprintln!("FAILED: {}", f.join("; "));
                ExitCode::from(1)
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        None => ExitCode::SUCCESS,
    };
    drop(universe);
    code
}
