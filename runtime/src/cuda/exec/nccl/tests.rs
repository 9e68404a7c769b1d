//! The NCCL driver without a GPU: every rank of a tp2·pp2·dp2 plan (ZeRO-0 and ZeRO-1; with
//! sequence parallelism, its all-gathers and reduce-scatters) and of a tp2·dp4 ZeRO-3 plan
//! runs a step on the host stand-in against a fake NCCL that records its calls, and the
//! logs are checked as NCCL would match them — every member's calls on each communicator
//! in the same order serving the same plan op with the same counts, every send paired with
//! its receive — and against the plan (the elements of each collective, the bytes of each
//! message). A swap of two collectives on one rank fails the check; an NCCL error, an
//! asynchronous error and a silent peer end the step naming the rank.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_models::Scenario;
use strata_models::plan::{CollPurpose, GroupKind, OpId, OpKind, Plan, Stream, TpSite};

use super::{Call, CommKey, Nccl, NcclDt, NcclRank};
use crate::cuda::exec::device::Device;
use crate::cuda::exec::host::HostDevice;
use crate::cuda::exec::rank::{GpuRank, check_plan};
use crate::cuda::nccl_comm::NcclFailure;
use crate::exec::ExecConfig;

/// A fake NCCL: records every call; optionally fails the n-th call or reports an
/// asynchronous error.
#[derive(Default)]
struct Recorder {
    rank: u32,
    log: Vec<(OpId, Call)>,
    fail_call: Option<(usize, u32)>,
    async_code: u32,
    aborted: bool,
}

impl<D: Device> Nccl<D> for Recorder {
    fn call(&mut self, _gpu: &D, _s: Stream, op: OpId, call: Call) -> Result<(), NcclFailure> {
        if let Some((n, code)) = self.fail_call
            && self.log.len() == n
        {
            return Err(NcclFailure::Error { rank: self.rank, what: format!("op #{op}"), code });
        }
        self.log.push((op, call));
        Ok(())
    }
    fn async_error(&mut self) -> u32 {
        self.async_code
    }
    fn abort(&mut self) {
        self.aborted = true;
    }
}

fn plan(zero: u32) -> Plan {
    plan_with(zero, &["parallel.pp=2", "parallel.dp=2"])
}

/// The tiny GPT at tp = 2 on eight GPUs, `dims` laying out pp and dp.
fn plan_with(zero: u32, dims: &[&str]) -> Plan {
    let sets: Vec<String> = [
        "cluster.preset=\"dgx-h200\"",
        "cluster.nodes=1",
        "cluster.nics_per_node=1",
        "cluster.gpus_per_node=8",
        "parallel.tp=2",
        "parallel.micro_batch=1",
        "parallel.global_batch=8",
        "model.seq_len=16",
        "training.dtype=\"bf16\"",
        "training.flash_attention=true",
    ]
    .iter()
    .chain(dims)
    .map(|s| s.to_string())
    .chain([format!("parallel.zero={zero}")])
    .collect();
    let text = include_str!("../../../../../scenarios/tiny-gpt-cpu.toml");
    strata_models::plan::lower(&Scenario::from_toml(text, "tiny", "tiny", &sets).unwrap()).unwrap()
}

fn rank_of(p: &Arc<Plan>, r: u32, nccl: Recorder) -> NcclRank<HostDevice, Recorder> {
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let g = GpuRank::for_rank(p.clone(), r, HostDevice::new(80 << 30), Arc::new(corpus), ExecConfig::default())
        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
    NcclRank::new(g, nccl, Duration::from_secs(5))
}

/// Every rank's call log for one step; `swap` swaps the first two collectives of that rank.
fn logs(p: &Arc<Plan>, swap: Option<u32>) -> Vec<Vec<(OpId, Call)>> {
    logs_in(p, swap, false)
}

fn logs_in(p: &Arc<Plan>, swap: Option<u32>, schedule_order: bool) -> Vec<Vec<(OpId, Call)>> {
    (0..p.grid.ranks())
        .map(|r| {
            let mut nr = rank_of(p, r, Recorder { rank: r, ..Recorder::default() });
            nr.swap_first_two = swap == Some(r);
            nr.schedule_order = schedule_order;
            nr.step(0).unwrap_or_else(|e| panic!("rank {r}: {e}"));
            nr.nccl.log
        })
        .collect()
}

/// What peers must agree on for one call: its kind, count, type, root, and the plan
/// purpose of the op it serves.
fn signature(p: &Plan, rank: u32, op: OpId, c: &Call) -> String {
    let purpose = match &p.program(rank).ops[op as usize].kind {
        OpKind::Collective(c) => format!("{:?}", c.purpose),
        // A message is the same from either end: not its direction.
        OpKind::Send(m) | OpKind::Recv(m) => {
            format!("{:?} of mb {} at vstage {}, {} B", m.kind, m.mb, m.vstage, m.bytes)
        }
        other => format!("{other:?}"),
    };
    let shape = match *c {
        Call::AllReduce { count, dt, .. } => format!("all-reduce {count}×{dt:?}"),
        Call::AllGather { count, dt, .. } => format!("all-gather {count}×{dt:?}"),
        Call::ReduceScatter { count, dt, .. } => format!("reduce-scatter {count}×{dt:?}"),
        Call::Reduce { count, dt, root, .. } => format!("reduce {count}×{dt:?} to {root}"),
        Call::Broadcast { count, dt, root, .. } => format!("broadcast {count}×{dt:?} from {root}"),
        Call::Send { count, dt, .. } | Call::Recv { count, dt, .. } => format!("{count}×{dt:?}"),
        Call::GroupStart | Call::GroupEnd => String::new(),
    };
    format!("{shape} for {purpose}")
}

/// The logs as NCCL would match them, and against the plan.
fn check(p: &Plan, logs: &[Vec<(OpId, Call)>]) -> Result<(), String> {
    let n = p.grid.ranks();
    for (r, log) in logs.iter().enumerate() {
        let mut open = false;
        for (_, c) in log {
            match c {
                Call::GroupStart if open => return Err(format!("rank {r}: a group inside a group")),
                Call::GroupStart => open = true,
                Call::GroupEnd if !open => return Err(format!("rank {r}: a group end without a start")),
                Call::GroupEnd => open = false,
                _ => {}
            }
        }
        if open {
            return Err(format!("rank {r}: a group never ended"));
        }
    }
    // Collectives: each group instance's members issue the same sequence on its communicator.
    for kind in super::GROUP_KINDS {
        for r in 0..n {
            let members = p.grid.group(r, kind);
            if members[0] != r || members.len() < 2 {
                continue;
            }
            let seq = |m: u32| -> Vec<String> {
                logs[m as usize]
                    .iter()
                    .filter(|(_, c)| c.comm() == Some(CommKey::Group(kind)))
                    .map(|(op, c)| signature(p, m, *op, c))
                    .collect()
            };
            let first = seq(r);
            for &m in &members[1..] {
                let other = seq(m);
                if let Some(i) = (0..first.len().max(other.len())).find(|&i| first.get(i) != other.get(i)) {
                    return Err(format!(
                        "{kind:?} group {members:?}: call {i} is {:?} on rank {r} but {:?} on rank {m}",
                        first.get(i),
                        other.get(i)
                    ));
                }
            }
        }
    }
    // Pipeline messages: a's sends to b, in order, are b's receives from a.
    for a in 0..n {
        for b in 0..n {
            let sends: Vec<String> = logs[a as usize]
                .iter()
                .filter(|(_, c)| matches!(c, Call::Send { peer, .. } if *peer == b))
                .map(|(op, c)| signature(p, a, *op, c))
                .collect();
            let recvs: Vec<String> = logs[b as usize]
                .iter()
                .filter(|(_, c)| matches!(c, Call::Recv { peer, .. } if *peer == a))
                .map(|(op, c)| signature(p, b, *op, c))
                .collect();
            if sends != recvs {
                return Err(format!("rank {a} → {b}: sends {sends:?}, receives {recvs:?}"));
            }
        }
    }
    // The host blocks at the gradient norm (its sum is read back): every call a rank made
    // before it must meet a peer's call made before the peer's, or the job would stall
    // there. Per communicator and per message direction, the counts before it agree.
    let norm_at =
        |m: u32| logs[m as usize].iter().position(|(_, c)| matches!(c, Call::AllReduce { dt: NcclDt::F64, .. }));
    let before = |m: u32, f: &dyn Fn(&Call) -> bool| {
        let end = norm_at(m).unwrap_or(logs[m as usize].len());
        logs[m as usize][..end].iter().filter(|(_, c)| f(c)).count()
    };
    for kind in super::GROUP_KINDS {
        for r in 0..n {
            let members = p.grid.group(r, kind);
            let on = |c: &Call| c.comm() == Some(CommKey::Group(kind));
            let counts: Vec<usize> = members.iter().map(|&m| before(m, &on)).collect();
            if counts.iter().any(|&c| c != counts[0]) {
                return Err(format!("{kind:?} group {members:?}: {counts:?} calls before each one's gradient norm"));
            }
        }
    }
    for a in 0..n {
        for b in 0..n {
            let sends = before(a, &|c| matches!(c, Call::Send { peer, .. } if *peer == b));
            let recvs = before(b, &|c| matches!(c, Call::Recv { peer, .. } if *peer == a));
            if sends != recvs {
                return Err(format!("rank {a} → {b}: {sends} sends but {recvs} receives before the gradient norms"));
            }
        }
    }
    // The plan: every collective on a group of two or more and every message is served,
    // with the plan's elements (all-gathers: per member × members) and message bytes.
    for (r, log) in logs.iter().enumerate() {
        let r = r as u32;
        for (id, op) in p.program(r).ops.iter().enumerate() {
            let calls: Vec<&Call> =
                log.iter().filter(|(o, c)| *o == id as u32 && c.comm().is_some()).map(|x| &x.1).collect();
            match &op.kind {
                OpKind::Collective(c) if p.grid.group(r, c.group).len() > 1 => {
                    let size = p.grid.group(r, c.group).len();
                    let elems: usize = calls
                        .iter()
                        .map(|k| match **k {
                            Call::AllGather { count, .. } | Call::ReduceScatter { count, .. } => count * size,
                            Call::AllReduce { count, .. }
                            | Call::Reduce { count, .. }
                            | Call::Broadcast { count, .. } => count,
                            _ => usize::MAX / 4,
                        })
                        .sum();
                    let want = match c.purpose {
                        // The plan counts the norm's one fp32 partial; the driver sums it in f64.
                        CollPurpose::GradNorm => 1,
                        // Counted in fp32 by the plan whatever its dtype.
                        CollPurpose::Tp { site: TpSite::LossStats, .. } => (c.bytes / 4) as usize,
                        // In the plan's dtype (the tensor-parallel partials travel in fp32 here).
                        _ => (c.bytes / c.dtype.bytes()) as usize,
                    };
                    if calls.is_empty() || elems != want {
                        return Err(format!(
                            "rank {r} op #{id} ({:?}): {elems} elements in NCCL calls, the plan's {want}",
                            c.purpose
                        ));
                    }
                    if calls.iter().any(|k| k.comm() != Some(CommKey::Group(c.group))) {
                        return Err(format!("rank {r} op #{id}: a call off the {:?} communicator", c.group));
                    }
                }
                OpKind::Send(m) | OpKind::Recv(m) => {
                    let one = calls.len() == 1 && calls[0].bytes() as u64 == m.bytes;
                    if !one || calls[0].comm() != Some(CommKey::P2p) {
                        return Err(format!("rank {r} op #{id}: {calls:?} for a message of {} bytes", m.bytes));
                    }
                }
                _ if !calls.is_empty() => return Err(format!("rank {r} op #{id} ({:?}) made NCCL calls", op.kind)),
                _ => {}
            }
        }
    }
    Ok(())
}

#[test]
fn every_ranks_nccl_calls_match_its_peers_and_the_plan() {
    for zero in [0, 1] {
        let p = Arc::new(plan(zero));
        check_plan(&p).unwrap_or_else(|e| panic!("ZeRO-{zero}: {e}"));
        let logs = logs(&p, None);
        check(&p, &logs).unwrap_or_else(|e| panic!("ZeRO-{zero}: {e}"));
        let count = |f: fn(&Call) -> bool| logs.iter().flatten().filter(|(_, c)| f(c)).count();
        // What the plan asks of NCCL here, every kind of call present.
        assert!(count(|c| matches!(c, Call::AllReduce { comm: CommKey::Group(GroupKind::Tp), .. })) > 0);
        assert!(count(|c| matches!(c, Call::AllGather { .. })) > 0, "the loss statistics");
        assert!(count(|c| matches!(c, Call::Send { .. })) > 0 && count(|c| matches!(c, Call::Recv { .. })) > 0);
        assert!(count(|c| matches!(c, Call::AllReduce { comm: CommKey::Group(GroupKind::Embedding), .. })) > 0);
        assert_eq!(count(|c| matches!(c, Call::AllReduce { dt: NcclDt::F64, .. })), 8, "one norm per rank");
        if zero == 0 {
            assert!(count(|c| matches!(c, Call::AllReduce { comm: CommKey::Group(GroupKind::Dp), .. })) > 0);
        } else {
            assert!(
                count(|c| matches!(c, Call::Reduce { .. })) > 0 && count(|c| matches!(c, Call::Broadcast { .. })) > 0
            );
            assert_eq!(count(|c| matches!(c, Call::AllReduce { comm: CommKey::Group(GroupKind::Dp), .. })), 0);
        }
    }
}

/// DeepSpeed's BF16_Optimizer under ZeRO-1 — and at ZeRO-0 under a pipeline, where the engine
/// picks it too and it partitions as ZeRO-1 does: the gradient buckets all-reduced whole on
/// the dp communicator (no per-owner reduces), the owners' updated parameters still broadcast.
#[test]
fn deepspeed_bf16_optimizer_all_reduces_its_gradient_buckets() {
    for zero in [1, 0] {
        let p = Arc::new(plan_with(zero, &["parallel.pp=2", "parallel.dp=2", "training.framework=\"deepspeed\""]));
        assert_eq!(p.scenario.zero_stage(), 1, "zero {zero}");
        check_plan(&p).unwrap();
        let logs = logs(&p, None);
        check(&p, &logs).unwrap();
        let count = |f: fn(&Call) -> bool| logs.iter().flatten().filter(|(_, c)| f(c)).count();
        assert!(count(|c| matches!(c, Call::AllReduce { comm: CommKey::Group(GroupKind::Dp), .. })) > 0, "zero {zero}");
        assert_eq!(count(|c| matches!(c, Call::Reduce { .. })), 0, "zero {zero}");
        assert!(count(|c| matches!(c, Call::Broadcast { .. })) > 0, "zero {zero}");
    }
}

/// A ZeRO-3 rank (tp 2 · dp 4, uneven shards): each microbatch's full-gradient buckets
/// reduced to their four owners' parts, each unit's parameters broadcast by their owners
/// into the plan's gathered buffers before its forward and again before its backward — one
/// call per owner in one NCCL group, matching the peers' and the plan's elements; and a
/// tp2·pp2·dp2 ZeRO-3 plan's calls, its tied word table's sum among them.
#[test]
fn a_zero_3_ranks_nccl_calls_are_the_plans_gathers_and_reduce_scatters() {
    let p = Arc::new(plan_with(3, &["parallel.pp=1", "parallel.dp=4", "training.framework=\"strata\""]));
    check_plan(&p).unwrap();
    let logs = logs(&p, None);
    check(&p, &logs).unwrap_or_else(|e| panic!("ZeRO-3: {e}"));
    let ops = &p.program(0).ops;
    let purpose = |op: OpId| match &ops[op as usize].kind {
        OpKind::Collective(c) => Some(c.purpose),
        _ => None,
    };
    let on_dp = |c: &Call| c.comm() == Some(CommKey::Group(GroupKind::Dp));
    let gathers = logs[0]
        .iter()
        .filter(|(op, c)| on_dp(c) && matches!(purpose(*op), Some(CollPurpose::ParamGather { .. })))
        .collect::<Vec<_>>();
    let reduces = logs[0]
        .iter()
        .filter(|(op, c)| on_dp(c) && matches!(purpose(*op), Some(CollPurpose::GradBucket { .. })))
        .collect::<Vec<_>>();
    let plan_gathers = ops
        .iter()
        .filter(|o| matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::ParamGather { .. })))
        .count();
    let plan_reduces = ops
        .iter()
        .filter(|o| matches!(&o.kind, OpKind::Collective(c) if matches!(c.purpose, CollPurpose::GradBucket { .. })))
        .count();
    assert!(plan_gathers > 0 && plan_reduces > 0);
    // Four owners each: one broadcast (gathers) or reduce (gradients) per owner, roots 0..4.
    assert_eq!(gathers.len(), 4 * plan_gathers, "{gathers:?}");
    assert_eq!(reduces.len(), 4 * plan_reduces, "{reduces:?}");
    assert!(gathers.iter().all(|(_, c)| matches!(c, Call::Broadcast { dt: NcclDt::Bf16, root, .. } if *root < 4)));
    assert!(reduces.iter().all(|(_, c)| matches!(c, Call::Reduce { dt: NcclDt::F32, root, .. } if *root < 4)));
    // ZeRO-3 gathers per unit, not per bucket after the step.
    assert!(logs[0].iter().all(|(op, _)| !matches!(purpose(*op), Some(CollPurpose::ParamBucket { .. }))));
    // And tp2·pp2·dp2 ZeRO-3: the tied word table's sum across the pipeline on the shards.
    let p = Arc::new(plan_with(3, &["parallel.pp=2", "parallel.dp=2", "training.framework=\"strata\""]));
    check_plan(&p).unwrap();
    let all = super::tests::logs(&p, None);
    check(&p, &all).unwrap_or_else(|e| panic!("tp2·pp2·dp2 ZeRO-3: {e}"));
    let tied = |c: &Call| matches!(c, Call::AllReduce { comm: CommKey::Group(GroupKind::Embedding), .. });
    assert!(all.iter().flatten().any(|(_, c)| tied(c)), "the tied word table's all-reduce");
}

#[test]
fn interleaved_chunks_and_full_recomputation_make_matched_nccl_calls() {
    // vpp 2: messages between virtual stages, both chunks' buckets; full recomputation:
    // the recomputed forward's tensor-parallel sums.
    let vpp = ["parallel.vpp=2", "parallel.schedule=\"interleaved\""];
    for extra in [&vpp[..], &["parallel.recompute=\"full\""]] {
        let p = Arc::new(plan_with(1, &[&["parallel.pp=2", "parallel.dp=2"][..], extra].concat()));
        check_plan(&p).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        let logs = logs(&p, None);
        check(&p, &logs).unwrap_or_else(|e| panic!("{extra:?}: {e}"));
        assert!(logs.iter().all(|l| !l.is_empty()), "{extra:?}: every rank calls NCCL");
    }
}

#[test]
fn two_collectives_swapped_on_one_rank_fail_the_check() {
    let p = Arc::new(plan(0));
    let e = check(&p, &logs(&p, Some(5))).expect_err("a swapped rank must not pass");
    eprintln!("the swapped rank: {e}");
    assert!(e.contains("rank 5"), "{e}");
}

#[test]
fn enqueuing_the_gradient_norm_in_schedule_order_would_stall_the_pipeline() {
    // The last stage's last gradient send comes after its norm in its schedule: a host
    // blocked at the norm would never send it, and stage 0 waits for it before its own.
    let p = Arc::new(plan(0));
    let e = check(&p, &logs_in(&p, None, true)).expect_err("the schedule's order blocks");
    assert!(e.contains("sends but") && e.contains("receives before the gradient norms"), "{e}");
}

#[test]
fn an_nccl_error_an_async_error_and_a_silent_peer_end_the_step_naming_the_rank() {
    let p = Arc::new(plan(0));
    // A call fails (ncclInvalidUsage): the error names the rank, the comms are aborted.
    let mut nr = rank_of(&p, 3, Recorder { rank: 3, fail_call: Some((4, 5)), ..Recorder::default() });
    let e = nr.step(0).expect_err("a failed call").to_string();
    assert!(e.contains("rank 3: NCCL failed during op #") && e.contains("ncclInvalidUsage"), "{e}");
    assert!(nr.nccl.aborted);
    // A peer died: ncclRemoteError asynchronously, at the step's wait.
    let mut nr = rank_of(&p, 6, Recorder { rank: 6, async_code: 6, ..Recorder::default() });
    let e = nr.step(0).expect_err("an async error").to_string();
    assert!(e.contains("rank 6: NCCL failed during") && e.contains("a remote peer failed"), "{e}");
    assert!(nr.nccl.aborted);
    // Nothing ever finishes and NCCL says nothing: the timeout, not a hang.
    let mut nr = rank_of(&p, 1, Recorder { rank: 1, ..Recorder::default() });
    nr.timeout = Duration::from_millis(50);
    nr.rank.gpu.state.borrow_mut().stuck = true;
    let t0 = Instant::now();
    let e = nr.step(0).expect_err("a silent peer").to_string();
    assert!(e.contains("rank 1: ") && e.contains("did not finish within"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5) && nr.nccl.aborted);
}

/// A job of one process.
struct Alone;

impl crate::cuda::nccl_comm::Bootstrap for Alone {
    fn rank(&self) -> u32 {
        0
    }
    fn size(&self) -> u32 {
        1
    }
    fn broadcast(&mut self, _: &mut [u8; crate::cuda::nccl_comm::FRAME_BYTES]) -> Result<(), String> {
        Ok(())
    }
    fn all_gather(&mut self, v: &[f64]) -> Result<Vec<f64>, String> {
        Ok(v.to_vec())
    }
}

#[test]
fn one_rank_through_the_nccl_loop_trains_as_the_single_rank_does() {
    use crate::cuda::exec::train::train_on;
    use crate::cuda::exec::train_nccl::train_ranked;
    let sets: Vec<String> = [
        "cluster.preset=\"dgx-h200\"",
        "cluster.nodes=1",
        "cluster.gpus_per_node=1",
        "parallel.tp=1",
        "parallel.pp=1",
        "parallel.dp=1",
        "parallel.micro_batch=1",
        "parallel.global_batch=2",
        "model.seq_len=16",
        "training.dtype=\"bf16\"",
        "training.flash_attention=true",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let text = include_str!("../../../../../scenarios/tiny-gpt-cpu.toml");
    let p = Arc::new(strata_models::plan::lower(&Scenario::from_toml(text, "tiny", "tiny", &sets).unwrap()).unwrap());
    let (corpus, _, _) = crate::train::synthetic_corpus(p.scenario.model.vocab, p.scenario.training.seed).unwrap();
    let corpus = Arc::new(corpus);
    let opts = crate::train::TrainOptions {
        steps: 2,
        data_name: "synthetic".into(),
        checkpoint: None,
        exec: ExecConfig::default(),
        faults: Vec::new(),
    };
    let mk = || {
        GpuRank::for_rank(p.clone(), 0, HostDevice::computing(80 << 30), corpus.clone(), ExecConfig::default()).unwrap()
    };
    let (single, _) = train_on(p.clone(), mk(), &opts, None).unwrap_or_else(|e| panic!("{e}"));
    let nr = NcclRank::new(mk(), Recorder::default(), Duration::from_secs(5));
    let (nccl, _) = train_ranked(p.clone(), nr, &mut Alone, &opts, None).unwrap_or_else(|e| panic!("{e}"));
    let l = |r: &crate::train::TrainResult| r.steps.iter().map(|s| (s.loss, s.grad_norm)).collect::<Vec<_>>();
    assert_eq!(l(&single), l(&nccl));
    assert!(l(&nccl).iter().all(|(x, _)| x.is_finite()) && l(&nccl).len() == 2);
}

#[test]
fn the_host_order_keeps_every_stream_and_dependency_of_the_schedule() {
    for zero in [0, 1] {
        let p = Arc::new(plan(zero));
        let mut moved = 0;
        for r in 0..p.grid.ranks() {
            let nr = rank_of(&p, r, Recorder::default());
            let order = nr.host_order();
            let sched = &nr.rank.sched.order;
            let mut seen = order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..sched.len()).collect::<Vec<_>>(), "rank {r}: a permutation of the schedule");
            let mut at = vec![usize::MAX; p.program(r).ops.len()];
            for (i, &k) in order.iter().enumerate() {
                at[sched[k].op as usize] = i;
            }
            let mut last_on = [None::<usize>; 4];
            for (i, &k) in order.iter().enumerate() {
                let op = &p.program(r).ops[sched[k].op as usize];
                for d in op.deps.iter().chain(&sched[k].waits) {
                    assert!(at[*d as usize] < i, "rank {r}: entry {k} enqueued before its dependency #{d}");
                }
                if let Some(s) = sched[k].stream {
                    assert!(last_on[s.index()].is_none_or(|l| l < k), "rank {r}: stream {s:?} out of schedule order");
                    last_on[s.index()] = Some(k);
                }
            }
            moved += order.iter().enumerate().filter(|(i, k)| *i != **k).count();
        }
        assert!(moved > 0, "ZeRO-{zero}: the norm is deferred somewhere");
    }
}

/// Sequence parallelism through NCCL (tp2·pp2·dp2): every tensor-parallel collective of
/// the plan is one `ncclReduceScatter` or `ncclAllGather` of the rank's (T / tp, h) shard
/// in the plan's elements, none an all-reduce of activations; the replicated gradients'
/// sum is fp32 all-reduces of the plan's count; and the calls match the peers' (`check`).
#[test]
fn a_sequence_parallel_ranks_nccl_calls_are_the_plans_gathers_and_reduce_scatters() {
    use strata_models::plan::CollKind;
    let p = Arc::new(plan_with(0, &["parallel.pp=2", "parallel.dp=2", "parallel.sequence_parallel=true"]));
    check_plan(&p).unwrap();
    let logs = logs(&p, None);
    check(&p, &logs).unwrap_or_else(|e| panic!("sequence parallel: {e}"));
    let (t, h) = (16usize, p.scenario.model.hidden as usize);
    // A first-stage and a last-stage rank (the head's gathers and the final norm's sum).
    for r in [0, p.grid.ranks() - 1] {
        let ops = &p.program(r).ops;
        let on_tp = |c: &Call| c.comm() == Some(CommKey::Group(GroupKind::Tp));
        let (mut gathers, mut scatters, mut sums) = (0, 0, 0);
        for (id, op) in ops.iter().enumerate() {
            let OpKind::Collective(c) = &op.kind else { continue };
            if c.group != GroupKind::Tp {
                continue;
            }
            let calls: Vec<Call> =
                logs[r as usize].iter().filter(|(o, k)| *o == id as u32 && on_tp(k)).map(|x| x.1).collect();
            match (c.purpose, c.kind) {
                (CollPurpose::Tp { site: TpSite::LossStats, .. }, _) => {}
                (CollPurpose::Tp { .. }, CollKind::AllGather) => {
                    assert!(
                        matches!(calls[..], [Call::AllGather { count, dt: NcclDt::Bf16, .. }] if count * 2 == t * h),
                        "rank {r} op #{id} {:?}: {calls:?}",
                        c.purpose
                    );
                    gathers += 1;
                }
                (CollPurpose::Tp { site, .. }, CollKind::ReduceScatter) => {
                    assert_eq!(site, TpSite::Reduce);
                    // The embeddings in bf16, the GEMMs' partial sums in fp32.
                    assert!(
                        matches!(calls[..], [Call::ReduceScatter { count, .. }] if count * 2 == t * h),
                        "rank {r} op #{id} {:?}: {calls:?}",
                        c.purpose
                    );
                    scatters += 1;
                }
                (CollPurpose::SpReplicatedGrads, CollKind::AllReduce) => {
                    let n: usize = calls
                        .iter()
                        .map(|k| match *k {
                            Call::AllReduce { count, dt: NcclDt::F32, .. } => count,
                            other => panic!("rank {r}: {other:?} for the replicated gradients"),
                        })
                        .sum();
                    assert_eq!(n as u64 * 4, c.bytes, "rank {r}: the replicated gradients' elements");
                    sums += 1;
                }
                other => panic!("rank {r} op #{id}: {other:?} on the tp group under sequence parallelism"),
            }
        }
        eprintln!("rank {r}: {gathers} all-gathers, {scatters} reduce-scatters, {sums} replicated-gradient sums");
        assert!(gathers > 0 && scatters > 0 && sums == 1, "rank {r}: {gathers} {scatters} {sums}");
        let all_reduces = logs[r as usize].iter().filter(|(_, k)| on_tp(k) && matches!(k, Call::AllReduce { .. }));
        assert!(
            all_reduces.clone().all(|(o, _)| matches!(&ops[*o as usize].kind,
                OpKind::Collective(c) if c.purpose == CollPurpose::SpReplicatedGrads)),
            "rank {r}: an all-reduce on tp other than the replicated gradients'"
        );
    }
}
