//! A failed rank ends the whole job with an error naming it, within a bounded time — no
//! hang: a panic, a rank that vanishes (as a killed process does), and a rank that hangs
//! (noticed by the receive timeout).

mod common;

use std::time::{Duration, Instant};

use strata_runtime::train::{Fault, TrainError};

const SPLIT: &[&str] = &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=2"];
const BOUND: Duration = Duration::from_secs(30);

fn run_with(fault: Fault, timeout_s: u64) -> (TrainError, Duration) {
    let mut opts = common::options(4);
    opts.faults = vec![fault];
    opts.exec.recv_timeout = Duration::from_secs(timeout_s);
    let t = Instant::now();
    let e = common::train(SPLIT, &opts).expect_err("the job must fail");
    (e, t.elapsed())
}

#[test]
fn a_panicking_rank_is_named_and_the_job_stops() {
    let (e, took) = run_with(Fault::Panic { rank: 3, step: 1 }, 120);
    let msg = e.to_string();
    assert!(matches!(e, TrainError::RankFailed { rank: 3, .. }), "{msg}");
    assert!(msg.contains("rank 3 (TP(2)-PP(2)-DP(2)-rank(3))") && msg.contains("injected fault"), "{msg}");
    assert!(took < BOUND, "took {took:?}");
}

#[test]
fn a_rank_that_vanishes_is_named_and_the_job_stops() {
    let (e, took) = run_with(Fault::Exit { rank: 6, step: 2 }, 120);
    let msg = e.to_string();
    assert!(matches!(e, TrainError::RankFailed { rank: 6, .. }), "{msg}");
    assert!(took < BOUND, "took {took:?}");
}

#[test]
fn a_hung_rank_stops_the_job_at_the_receive_timeout() {
    let (e, took) = run_with(Fault::Silent { rank: 5, step: 1 }, 3);
    let msg = e.to_string();
    assert!(msg.contains("made no progress for 3 s"), "{msg}");
    assert!(took < BOUND, "took {took:?}");
}

#[test]
fn a_model_the_runtime_cannot_run_is_a_setup_error_not_a_rank_failure() {
    let e = common::train(&["model.preset=tiny-moe"], &common::options(1)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, TrainError::Setup(_)), "{msg}");
    // tiny-moe (a Llama-family MoE) trains its aux loss, which the executor's dropless routing refuses.
    assert!(msg.contains("model.moe.aux_loss_coeff = 0.01") && !msg.contains("rank"), "{msg}");
}
