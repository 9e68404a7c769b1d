//! One process for a node's GPUs without a GPU: every rank of a plan on its own thread, on
//! its own computing host stand-in, its NCCL a fake that moves the data between the
//! threads' stand-ins ([`Wire`]: each collective summed or gathered in the members' order
//! once all arrived, pipeline messages through mailboxes), bootstrapped through
//! `ThreadBootstrap` — the pp2, dp2, tp2 and tp2·pp2·dp2 splits train as the single rank
//! does (a wire that forgets to add does not), and a rank that fails, panics or never
//! starts ends the job with an error naming it, not a hang.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_models::plan::Plan;

use super::run_node;
use super::wire::{Linked, LinkedDevice, WAIT, Wire};
use crate::cuda::exec::host::HostDevice;
use crate::cuda::exec::multi::tests::{LOSS_TOL_NATS, STEPS, TP_LOSS_TOL_NATS, opts, plan_of, run_plan, worst};
use crate::cuda::exec::nccl::NcclRank;
use crate::cuda::exec::rank::GpuRank;
use crate::cuda::nccl_comm::Bootstrap;
use crate::cuda::node_boot::ThreadBootstrap;
use crate::exec::ExecConfig;
use crate::train::{TrainError, TrainResult};

const TINY: &str = include_str!("../../../../../scenarios/tiny-gpt-cpu.toml");

/// How a rank of the node starts: normally, failing its n-th NCCL call, panicking, or
/// never (an error before any NCCL).
#[derive(Clone, Copy, PartialEq)]
enum Start {
    Ok,
    FailCall(usize),
    Panic,
    Never,
}

/// `STEPS` steps of `p`, one thread per rank through `ThreadBootstrap` and the wire;
/// `rank1` says how rank 1 starts.
fn node(p: Plan, drop_sums: bool, rank1: Start, exec: ExecConfig) -> Result<TrainResult, TrainError> {
    let p = Arc::new(p);
    let wire = Wire::new(p.clone(), drop_sums);
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let corpus = Arc::new(corpus);
    let plan = p.clone();
    let cfg = exec.clone();
    let open = move |boot: &mut ThreadBootstrap| {
        let rank = boot.rank();
        let how = if rank == 1 { rank1 } else { Start::Ok };
        match how {
            Start::Panic => panic!("rank 1's stand-in broke"),
            Start::Never => return Err(TrainError::RankFailed { rank, label: "x".into(), reason: "no GPU".into() }),
            _ => {}
        }
        let dev = LinkedDevice::new(HostDevice::computing(80 << 30), wire.clone(), rank, boot.halt());
        let g = GpuRank::for_rank(plan.clone(), rank, dev, corpus.clone(), cfg.clone())
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let fail_at = if let Start::FailCall(n) = how { Some(n) } else { None };
        let nccl = Linked::new(rank, fail_at);
        Ok(NcclRank::new(g, nccl, WAIT))
    };
    let o = crate::train::TrainOptions { exec, ..opts() };
    run_node(p, &o, WAIT, None, open).map(|r| r.0)
}

fn losses(r: &TrainResult) -> Vec<f64> {
    r.steps.iter().map(|s| s.loss).collect()
}

#[test]
fn splits_trained_by_one_thread_per_rank_match_the_single_rank_losses() {
    let single = losses(&run_plan(plan_of(TINY, &[]), false));
    for sets in [
        &["parallel.dp=2"][..],
        &["parallel.pp=2"],
        &["parallel.tp=2"],
        &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=1"],
    ] {
        let r = node(plan_of(TINY, sets), false, Start::Ok, ExecConfig::default()).unwrap_or_else(|e| panic!("{e}"));
        let split = losses(&r);
        let d = worst(&split, &single);
        eprintln!("{sets:?} on threads: {split:?} (single {single:?}), worst {d:.3e} nats");
        let tol = if sets.iter().any(|s| s.starts_with("parallel.tp=")) { TP_LOSS_TOL_NATS } else { LOSS_TOL_NATS };
        assert_eq!(split.len(), STEPS as usize);
        assert!(d <= tol, "{sets:?}: {split:?} against the single rank's {single:?} ({d:.3e} nats)");
    }
}

#[test]
fn a_wire_that_forgets_to_add_is_caught() {
    let single = losses(&run_plan(plan_of(TINY, &[]), false));
    let r = node(plan_of(TINY, &["parallel.tp=2", "parallel.dp=2"]), true, Start::Ok, ExecConfig::default()).unwrap();
    let d = worst(&losses(&r), &single);
    eprintln!("tp2·dp2 without the sums: {:?}, worst {d:.3e} nats", losses(&r));
    assert!(d > 10.0 * TP_LOSS_TOL_NATS, "dropping the sums went unnoticed: {d:.3e} nats");
}

#[test]
fn every_ranks_memory_and_traced_spans_come_back() {
    let p = plan_of(TINY, &["parallel.pp=2", "parallel.dp=2"]);
    let exec = ExecConfig { trace_step: Some(STEPS - 1), ..ExecConfig::default() };
    let r = node(p, false, Start::Ok, exec).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.memory.iter().map(|m| m.rank).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    let t = r.trace.expect("the traced step");
    assert_eq!((t.step, &t.ranks[..]), (STEPS - 1, &[0, 1, 2, 3][..]));
    for rank in 0..4 {
        assert!(t.spans.iter().any(|s| s.rank == rank), "rank {rank}'s spans");
    }
}

#[test]
fn a_rank_that_fails_panics_or_never_starts_ends_the_job_naming_it() {
    let p = || plan_of(TINY, &["parallel.tp=2", "parallel.pp=2"]);
    for (how, want) in [
        (Start::FailCall(7), "rank 1: NCCL failed during op #"),
        (Start::Panic, "panicked: rank 1's stand-in broke"),
        (Start::Never, "no GPU"),
    ] {
        let t0 = Instant::now();
        let e = node(p(), false, how, ExecConfig::default()).expect_err("a failed rank");
        eprintln!("{e} (after {:.1} s)", t0.elapsed().as_secs_f64());
        let TrainError::RankFailed { rank, reason, .. } = &e else { panic!("{e:?}") };
        assert_eq!(*rank, 1, "{e}");
        assert!(reason.contains(want), "{e}");
    }
}

#[test]
fn a_plan_of_another_size_than_the_nodes_gpus_is_refused_naming_both() {
    let gpus = crate::cuda::exec::nccl_gpu::gpu_count();
    let dp = if gpus == 2 { 4 } else { 2 };
    let p = Arc::new(plan_of(TINY, &[&format!("parallel.dp={dp}")]));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let e = super::train_node(p, Arc::new(corpus), &opts(), Duration::from_secs(5), None).unwrap_err();
    assert!(matches!(e, TrainError::Setup(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains(&format!("the plan has {dp} ranks")) && e.contains(&format!("this node has {gpus} visible")),
        "{e}"
    );
}
