//! The CUDA executor's memory beyond the plan's buffers, by name: every block of a rank's
//! pool is held under an account (`pool`), either a plan buffer's name or one of the
//! executor's own accounts below, so the measured peak splits exactly into the plan's
//! predicted peak and named terms — nothing is left over:
//!
//! `measured = context + peak_reserved = plan peak + Σ breakdown`, where the breakdown, at
//! the instant the pool's blocks in use first reached their high-water mark, is
//!
//! | name | what | sign |
//! |---|---|---|
//! | `grads-fp32` | gradients kept in fp32 where the plan's framework keeps fewer bytes: the kernels accumulate weight gradients over microbatches in fp32 (Megatron-LM's main gradients, 4 B, which that plan predicts), so under Strata's ZeRO-paper layout (2 B, reduced in bf16) a chunk's gradients and ZeRO-2/3's full-gradient buckets hold 2 B more per element | ≥ 0 |
//! | `plan-sizes` | the executor's block for every other plan buffer, less the plan's bytes: saved state carved at 256 B offsets (`saved`), the head's logits kept in bf16 where the plan counts Megatron-LM's fp32 copy for the loss (`head_buffer_bytes`; tiny GPT: 13,312 B against 20,480 B a microbatch), ZeRO shards of exactly the owned part where the plan rounds each bucket's shard up | either |
//! | `comm-scratch` | the shared-GPU communicator's scratch (`shared`; NCCL's buffers are outside the pool) | ≥ 0 |
//! | `workspace` | tensors between pieces (`pieces`' workspace, kept output gradients, reduced partial sums, gathered loss statistics, received messages); the plan predicts a pass's share in its `work c… mb…` buffer, which binds no block, so that share shows here and again, negated, in `plan-peak-offset` | ≥ 0 |
//! | `batch` | the step's token ids and per-token losses | ≥ 0 |
//! | `grad-norm` | the gradient norm's partial sums | ≥ 0 |
//! | `messages-in-flight` | pipeline messages copied into the receiver's pool, not yet received | ≥ 0 |
//! | `pool-rounding` | every block's 512 B class less its request (PyTorch's `round_size`) | < 512 B per block |
//! | `plan-peak-offset` | the plan's buffers live at the pool's peak less the plan's own peak (they fall at different instants) | ≤ 0 |
//! | `pool-reserve` | reserved beyond the blocks in use, at the two high-water marks: large blocks' whole 2 MiB segments, cached free blocks | ≥ 0 |
//! | `context` | the CUDA context (the device's bytes in use before the first block; the host stand-in's 512 MiB) | ≥ 0 |
//! | `unnamed: …` | a block under a name this table does not know (a bug: the tests refuse it) | — |
//!
//! Measured on the host stand-in, tiny GPT (`multi/tests_memory.rs`, every rank), bytes in
//! use at the pool's peak against the plan's peak, rank 0:
//!
//! | split | in use | plan | the difference |
//! |---|---|---|---|
//! | dp2 ZeRO-1 | 3,013,632 | 2,344,704 | grads-fp32 434,944 + comm-scratch 402,176 (the reduce-scatter's) + pool-rounding 1,024 + batch 768 − plan-peak-offset 169,984 |
//! | dp2 ZeRO-2 | 3,935,744 | 2,927,488 | grads-fp32 1,021,824 (the shard and two microbatches' full-gradient buckets) − plan-sizes 11,264 + pool-rounding 2,048 + batch 768 − plan-peak-offset 5,120 |
//! | dp2 ZeRO-3 | 2,830,336 | 2,317,824 | grads-fp32 550,144 − plan-peak-offset 40,192 − plan-sizes 3,072 + pool-rounding 2,816 + workspace 2,048 + batch 768 |
//! | tp2·pp2 | 1,179,136 | 1,179,520 | workspace 12,288 − plan-peak-offset 12,288 − plan-sizes 3,584 + pool-rounding 1,664 + batch 1,536 |
//!
//! Before this accounting the pool rounded every request over 1 MiB to a 2 MiB class (it
//! took PyTorch's segment rounding for its block rounding): 792,064 B more in use under
//! each ZeRO stage, the optimizer state's 1,304,832 B in a 2,097,152 B block (3,805,696,
//! 4,727,808 and 3,622,400 B in use). That segment now shows under `pool-reserve`, with the
//! cached free blocks (ZeRO-1: 1,223,168 B), and the stand-in's 512 MiB context under
//! `context`.

use std::collections::BTreeMap;

use super::pool::{ByAccount, PoolStats};
use crate::exec::pool::BufKey;

/// Accounts of what the executor holds beside the plan's buffers.
pub const WORKSPACE: &str = "workspace";
pub const COMM_SCRATCH: &str = "comm-scratch";
pub const BATCH: &str = "batch";
pub const GRAD_NORM: &str = "grad-norm";
pub const MESSAGES: &str = "messages-in-flight";
/// Terms of the breakdown derived from the accounts.
pub const GRADS_FP32: &str = "grads-fp32";
pub const PLAN_SIZES: &str = "plan-sizes";
pub const ROUNDING: &str = "pool-rounding";
pub const PLAN_PEAK_OFFSET: &str = "plan-peak-offset";
pub const RESERVE: &str = "pool-reserve";
pub const CONTEXT: &str = "context";
pub const UNNAMED: &str = "unnamed: ";

/// The terms the executor needs beyond the plan's buffers (each ≥ 0): what a bound on the
/// measured peak allows besides the plan's.
pub const EXECUTOR: [&str; 6] = [GRADS_FP32, COMM_SCRATCH, WORKSPACE, BATCH, GRAD_NORM, MESSAGES];

/// The account of a block asked for under `name`: a plan buffer's own name, or the
/// executor's account of that kind of block (workspace is asked for as such, `pieces::ws`).
pub fn account(name: &str) -> String {
    if BufKey::parse(name).is_some() {
        return name.to_string();
    }
    match name {
        "the shared-GPU communicator's scratch" => COMM_SCRATCH,
        "the step's token ids" | "the step's per-token losses" => BATCH,
        "the gradient norm's partial sums" | "the gradient norm" | "the gradient norm's all-reduce" => GRAD_NORM,
        "a reduced partial sum in bf16" | "the gathered loss statistics" => WORKSPACE,
        "a pipeline message in flight" => MESSAGES,
        _ => return format!("{UNNAMED}{name}"),
    }
    .to_string()
}

/// The measured peak less the plan's, term by term (the table above): `at_peak` the pool's
/// blocks by account at its high-water mark, `predicted` the plan's bytes per buffer name,
/// `plan_peak` the plan's predicted peak. Σ of the terms = `context + peak_reserved −
/// plan_peak`.
pub fn breakdown(
    at_peak: &ByAccount,
    predicted: &BTreeMap<String, u64>,
    plan_peak: u64,
    stats: PoolStats,
    context: u64,
) -> BTreeMap<String, i64> {
    let mut out: BTreeMap<String, i64> = BTreeMap::new();
    let mut add = |k: &str, v: i64| *out.entry(k.to_string()).or_default() += v;
    let mut plan_live = 0i64;
    for (acct, h) in at_peak {
        add(ROUNDING, (h.class - h.requested) as i64);
        let key = BufKey::parse(acct);
        match (key, predicted.get(acct)) {
            (Some(key), Some(&bytes)) => {
                let pred = (bytes * h.blocks) as i64;
                plan_live += pred;
                let term = if matches!(key, BufKey::Grads { .. } | BufKey::GradBucket { .. }) {
                    GRADS_FP32
                } else {
                    PLAN_SIZES
                };
                add(term, h.requested as i64 - pred);
            }
            (Some(_), None) => add(&format!("{UNNAMED}{acct} (not in the plan)"), h.requested as i64),
            (None, _) => add(acct, h.requested as i64),
        }
    }
    add(PLAN_PEAK_OFFSET, plan_live - plan_peak as i64);
    add(RESERVE, (stats.peak_reserved - stats.peak_in_use) as i64);
    add(CONTEXT, context as i64);
    out
}

/// The breakdown as one line: `name value` pairs, largest first.
pub fn describe(b: &BTreeMap<String, i64>) -> String {
    let mut v: Vec<(&String, &i64)> = b.iter().filter(|(_, v)| **v != 0).collect();
    v.sort_by_key(|(k, v)| (std::cmp::Reverse(v.unsigned_abs()), (*k).clone()));
    v.iter().map(|(k, v)| format!("{k} {v:+} B")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::exec::pool::Held;

    #[test]
    fn every_byte_of_the_peak_has_a_name() {
        let held = |blocks, requested, class| Held { blocks, requested, class };
        let at_peak: ByAccount = [
            ("grads c0".to_string(), held(1, 800, 1024)),
            ("act L0 mb0".to_string(), held(1, 300, 512)),
            (COMM_SCRATCH.to_string(), held(2, 900, 1024)),
            ("unnamed: a new buffer".to_string(), held(1, 10, 512)),
        ]
        .into();
        let predicted: BTreeMap<String, u64> = [("grads c0".into(), 400), ("act L0 mb0".into(), 350)].into();
        let stats = PoolStats { peak_in_use: 3072, peak_reserved: 4096, ..PoolStats::default() };
        let b = breakdown(&at_peak, &predicted, 1000, stats, 100);
        assert_eq!(b[GRADS_FP32], 400);
        assert_eq!(b[PLAN_SIZES], -50);
        assert_eq!(b[COMM_SCRATCH], 900);
        assert_eq!(b[ROUNDING], 224 + 212 + 124 + 502);
        assert_eq!(b[PLAN_PEAK_OFFSET], 750 - 1000);
        assert_eq!((b[RESERVE], b[CONTEXT]), (1024, 100));
        assert_eq!(b["unnamed: a new buffer"], 10);
        assert_eq!(b.values().sum::<i64>(), 100 + 4096 - 1000, "measured − plan, exactly");
        assert!(describe(&b).starts_with("pool-rounding +1062 B, pool-reserve +1024 B, comm-scratch +900 B"), "{b:?}");
    }

    #[test]
    fn names_map_to_their_accounts() {
        assert_eq!(account("act L3 mb1"), "act L3 mb1");
        assert_eq!(account("the shared-GPU communicator's scratch"), COMM_SCRATCH);
        assert_eq!(account("the step's token ids"), BATCH);
        assert_eq!(account("something new"), "unnamed: something new");
    }
}
