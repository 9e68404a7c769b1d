//! Interleaved 1F1B on the multi-rank driver: `vpp` model chunks per rank, each with its
//! own layers, parameters, gradients and optimizer state (`layout::rank_state`, from the
//! CPU executor's chunk layouts), pipeline messages keyed by virtual stage (`comm`). A
//! pp2·vpp2 and a tp2·pp2·vpp2 split of the tiny GPT train to the single rank's losses, and
//! pp2·vpp2 with full recomputation (each chunk's layers recomputed from their saved
//! inputs) to the single rank's without it.

use super::tests::{LOSS_TOL_NATS, TP_LOSS_TOL_NATS, plan_of, run_plan, worst};
use crate::cuda::exec::layout::rank_state;

const TINY: &str = include_str!("../../../../../scenarios/tiny-gpt-cpu.toml");

fn losses(sets: &[&str]) -> Vec<f64> {
    run_plan(plan_of(TINY, sets), false).steps.iter().map(|s| s.loss).collect()
}

#[test]
fn interleaved_chunks_hold_their_own_layers() {
    let p = plan_of(TINY, &["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=\"interleaved\""]);
    // tiny GPT: 4 layers over 2 stages × 2 chunks, one each; stage 0 holds layers 0 and 2.
    let chunks = rank_state(&p, 0).unwrap();
    assert_eq!(chunks.len(), 2);
    let layers = |c: usize| {
        let mut l: Vec<usize> = chunks[c].layout.entries().iter().filter_map(|e| e.layer).collect();
        l.dedup();
        l
    };
    assert_eq!((layers(0), layers(1)), (vec![0], vec![2]));
}

#[test]
fn interleaved_splits_match_the_single_rank_losses() {
    let single = losses(&[]);
    let vpp = ["parallel.vpp=2", "parallel.schedule=\"interleaved\""];
    for (split, tol) in
        [(&["parallel.pp=2"][..], LOSS_TOL_NATS), (&["parallel.tp=2", "parallel.pp=2"], TP_LOSS_TOL_NATS)]
    {
        let sets: Vec<&str> = split.iter().chain(&vpp).copied().collect();
        let got = losses(&sets);
        let d = worst(&got, &single);
        eprintln!("{sets:?}: {got:?} (single {single:?}), worst {d:.3e} nats");
        assert!(d <= tol, "{sets:?}: {got:?} against the single rank's {single:?} ({d:.3e} nats)");
    }
}

#[test]
fn interleaved_chunks_with_full_recomputation_match_the_single_rank_losses() {
    let single = losses(&[]);
    let sets = ["parallel.pp=2", "parallel.vpp=2", "parallel.schedule=\"interleaved\"", "parallel.recompute=\"full\""];
    let got = losses(&sets);
    let d = worst(&got, &single);
    eprintln!("{sets:?}: {got:?} (single {single:?}), worst {d:.3e} nats");
    assert!(d <= LOSS_TOL_NATS, "{sets:?}: {got:?} against the single rank's {single:?} ({d:.3e} nats)");
}
