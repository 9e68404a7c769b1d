//! The CUDA executor's measured memory against the plan's, on the computing host stand-in:
//! for every rank of dp2 ZeRO-1, 2 and 3 and of tp2·pp2 on the tiny GPT, the measured peak
//! is the plan's peak plus named terms (`overhead`) — exactly, with no block under a name
//! the table does not know — and the blocks the pool holds at its high-water mark are
//! within 5% of the plan's peak plus what the executor itself needs (fp32 gradients,
//! communicator scratch, workspace, the batch), its rounding under 512 B a block.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::MultiGpu;
use super::tests::plan_of;
use crate::cuda::exec::host::HostDevice;
use crate::cuda::exec::overhead::{EXECUTOR, GRADS_FP32, ROUNDING, UNNAMED, describe};
use crate::exec::ExecConfig;

const TINY: &str = include_str!("../../../../../scenarios/tiny-gpt-cpu.toml");

/// The bound's relative slack on the plan's peak.
const SLACK: f64 = 0.05;

/// One rank's peaks after a run.
struct Peaks {
    /// The pool's blocks in use at its high-water mark: bytes and blocks.
    in_use: u64,
    blocks: u64,
    /// The plan's predicted peak, and the measured one (pool reserve + context).
    plan: u64,
    measured: u64,
    /// measured − plan, by name.
    terms: BTreeMap<String, i64>,
}

/// Two steps of `sets` on the multi-rank driver; every rank's peaks.
fn run(sets: &[&str]) -> Vec<Peaks> {
    let p = Arc::new(plan_of(TINY, sets));
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let first = HostDevice::computing(80 << 30);
    let devices: Vec<HostDevice> = (0..p.grid.ranks()).map(|_| first.sibling()).collect();
    let mut multi = MultiGpu::new(p, devices, Arc::new(corpus), ExecConfig::default()).unwrap();
    for step in 0..2 {
        multi.step(step).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
    }
    multi
        .ranks
        .iter()
        .map(|r| {
            let pk = r.peaks();
            Peaks {
                in_use: r.pool_stats().peak_in_use,
                blocks: r.pool_at_peak().values().map(|h| h.blocks).sum(),
                plan: pk.predicted_bytes,
                measured: pk.measured_bytes,
                terms: pk.overhead_bytes.clone(),
            }
        })
        .collect()
}

#[test]
fn the_measured_peak_is_the_plans_plus_named_overhead() {
    let strata = "training.framework=\"strata\"";
    for sets in [
        &["parallel.dp=2", "parallel.zero=1", strata][..],
        &["parallel.dp=2", "parallel.zero=2", strata],
        &["parallel.dp=2", "parallel.zero=3", strata],
        &["parallel.tp=2", "parallel.pp=2"],
    ] {
        for (rank, Peaks { in_use, blocks, plan, measured, terms }) in run(sets).into_iter().enumerate() {
            eprintln!(
                "{sets:?} rank {rank}: in use {in_use} B, plan {plan} B, measured {measured} B: {}",
                describe(&terms)
            );
            // Every byte named: the terms sum to measured − plan.
            assert_eq!(terms.values().sum::<i64>(), measured as i64 - plan as i64, "{sets:?} rank {rank}: {terms:?}");
            let unnamed: Vec<_> = terms.keys().filter(|k| k.starts_with(UNNAMED)).collect();
            assert!(unnamed.is_empty(), "{sets:?} rank {rank}: blocks under no known account: {unnamed:?}");
            let rounding = terms.get(ROUNDING).copied().unwrap_or(0);
            assert!((0..512 * blocks as i64).contains(&rounding), "{sets:?} rank {rank}: rounding {rounding} B");
            let executor: i64 = EXECUTOR.iter().filter_map(|k| terms.get(*k)).sum();
            assert!(EXECUTOR.iter().filter_map(|k| terms.get(*k)).all(|v| *v >= 0), "{terms:?}");
            let bound = (1.0 + SLACK) * plan as f64 + executor as f64;
            assert!(
                in_use as f64 <= bound,
                "{sets:?} rank {rank}: {in_use} B in use at the pool's peak, over {bound:.0} B = the plan's \
                 {plan} B + {:.0}% + the executor's own {executor} B ({})",
                100.0 * SLACK,
                describe(&terms)
            );
            // The fp32 gradients are there only where the plan's framework keeps bf16.
            let fp32 = terms.get(GRADS_FP32).copied().unwrap_or(0);
            if sets.contains(&strata) {
                assert!(fp32 > 0, "{sets:?} rank {rank}: Strata's layout keeps bf16 gradients: {terms:?}");
            } else {
                assert!(fp32 <= 0, "{sets:?} rank {rank}: Megatron-LM's fp32 main gradients are the plan's: {terms:?}");
            }
        }
    }
}
