//! Lowering: a validated scenario becomes one program per pipeline stage.
//!
//! The stage's schedule table ([`crate::plan::schedule`]) is walked in order and each slot
//! emits its ops:
//! - **forward** of (microbatch, chunk): receive the activation (or embed), then per layer
//!   `AttnIn`, `Attn`, `MlpIn`, `Mlp`, `LayerOut`, with Megatron-LM's tensor-parallel
//!   collectives between them — an all-reduce of the partial output of `Attn` and `Mlp`, or
//!   with sequence parallelism an all-gather of the normed input before them and a
//!   reduce-scatter after; then send the activation on, or run the head (`FinalNorm`,
//!   `Logits`, the loss-statistics all-gather, `Loss`);
//! - **backward**: the same pieces in reverse, each collective replaced by its dual (the
//!   all-reduce of the partial input gradient; under sequence parallelism an all-gather of
//!   the incoming gradient and of the saved input for the weight gradient, and a
//!   reduce-scatter of the input gradient); recomputation first (the attention core, or the
//!   whole layer forward with its collectives); weight gradients inline, or in a later slot
//!   for ZB-H1;
//! - **data parallelism**: gradient buckets (whole units in backward order, up to
//!   `grad_bucket_mb`) reduced on the `dp` stream as soon as their last gradient is
//!   computed: all-reduce (ZeRO-0) or reduce-scatter (ZeRO ≥ 1) after the last microbatch,
//!   every microbatch for ZeRO-2/3; ZeRO-1/2 all-gather the updated shards (at the start of
//!   the step, overlapped with the forward, when `overlap_param_gather`); ZeRO-3 all-gathers
//!   each unit before its forward and its backward, prefetching one unit ahead;
//! - **end of step**: tied-embedding gradient all-reduce between first and last stage, the
//!   global gradient-norm all-reduce, the optimizer step;
//! - **memory**: `Alloc`/`Free` for every buffer — persistent parameters, gradients and
//!   optimizer state; per (layer, microbatch) saved activations sized by
//!   [`crate::accounting::memory::layer_activation_bytes`]; recomputation working sets;
//!   pipeline message buffers; ZeRO's gathered parameters and full gradient buckets.
//!
//! Semantics the backends share: ops of one stream run in order; a `Send` only posts its
//! message — the stream moves on at once, and ops that list the send in `deps` wait for its
//! delivery; a transfer starts when both its send and its receive are posted; a `Free`
//! never holds up its stream — it takes effect once the ops in its `deps` are done.
//!
//! The lowering is split by concept: `units` counts a unit's parameters, `buckets` packs
//! units into gradient buckets, `emit` appends ops, `forward` and `backward` lower the
//! passes (`moe` a mixture-of-experts layer's MLP half, `mtp` multi-token prediction), `overlap` the merge of a steady-state backward with the next
//! forward under `moe_a2a_overlap`, `zero` the data-parallel parameter and gradient traffic, `hp_grads` DeepSpeed
//! `BF16_Optimizer`'s per-microbatch fp32 gradient accumulation, `step` the end of the
//! step. `StageLowering` carries one stage's state through them, one `impl` block per file.

mod backward;
mod buckets;
mod cp;
mod emit;
mod forward;
mod hp_grads;
mod modules;
mod moe;
mod mtp;
mod overlap;
mod pipe;
mod step;
mod units;
mod zero;

use std::collections::{BTreeMap, VecDeque};

use crate::accounting::memory::{pass_workspace_bytes, state_bytes_per_param};
use crate::accounting::states::scenario_layout;
use crate::plan::cost::{optimizer_cost, piece_cost, vocab_parallel_cross_entropy};
use crate::plan::grid::RankGrid;
use crate::plan::ir::*;
// The plan types lived here before the lowering was split; `plan::lower::Plan` still names them.
pub use crate::plan::lowered::{Bucket, Plan, Unit};
use crate::plan::schedule::{self, Pass};
use crate::scenario::{Scenario, ScenarioError};

use buckets::stage_buckets;
use emit::Emitter;
pub use hp_grads::{hp_buffer_bytes, unit_tensors};
use modules::ModuleState;
pub use modules::{piece_module_tensors, piece_modules};
pub use units::unit_params;
use zero::BucketState;

/// Builds programs for a scenario; `program(stage)` lowers one stage on demand, so a
/// caller that needs a few stages of a 16,384-GPU plan pays only for those.
pub struct Planner<'a> {
    s: &'a Scenario,
    grid: RankGrid,
    costs: Vec<ComputeCost>,
    cost_ids: BTreeMap<(Piece, Phase), CostId>,
    buckets: Vec<Vec<Bucket>>,
    /// Host nanoseconds per cost id (DeepSpeed ZeRO-3's per-module hooks), empty if none.
    host_ns: Vec<u64>,
    /// (piece, phase) → the cost id of that piece with its modules' host time.
    host_cost_ids: BTreeMap<(Piece, Phase), CostId>,
    /// phase → the cost id of a mixture-of-experts layer's `LayerOut` (empty when dense).
    moe_out_ids: BTreeMap<Phase, CostId>,
    /// Context parallelism under ring attention: phase → the cost of a later ring step of
    /// the attention core (step 0 is `cost_ids[(AttnCore, phase)]`).
    ring_step_cost_ids: BTreeMap<Phase, CostId>,
    /// DeepSpeed `BF16_Optimizer`: the costs of a backward's last op with the fp32
    /// accumulation passes added (`hp_grads`), empty for other frameworks.
    hp_grad_cost_ids: hp_grads::HpGradCosts,
}

impl<'a> Planner<'a> {
    pub fn new(s: &'a Scenario) -> Result<Planner<'a>, ScenarioError> {
        s.validate()?;
        let p = &s.parallel;
        cp::check(s)?;
        let grid = RankGrid::new(p.tp, p.dp, p.pp, s.cluster.gpus_per_node).with_cp_ep(p.cp, p.ep);
        let mut costs = Vec::new();
        let mut cost_ids = BTreeMap::new();
        use Piece::*;
        for piece in [Embed, AttnIn, Attn, MlpIn, Mlp, LayerOut, FinalNorm, Logits, Loss] {
            for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight, Phase::Recompute] {
                cost_ids.insert((piece, phase), costs.len() as CostId);
                costs.push(piece_cost(
                    &s.model,
                    p,
                    // The training dtype: under fp8 the linear GEMMs are marked fp8.
                    s.training.dtype,
                    s.training.flash_attention,
                    piece,
                    phase,
                ));
            }
        }
        if s.training.framework.vocab_parallel_cross_entropy() {
            let ce = vocab_parallel_cross_entropy(&s.model, p, s.training.dtype);
            let mut set = |piece, phase, bytes: u64, kernels: u32, add: bool| {
                let c = &mut costs[cost_ids[&(piece, phase)] as usize];
                c.mem_bytes = if add { c.mem_bytes + bytes } else { bytes };
                c.kernels = if add { c.kernels + kernels } else { kernels };
            };
            set(Logits, Phase::Forward, ce.logits_fwd_bytes, ce.logits_fwd_kernels, false);
            set(Loss, Phase::Forward, ce.loss_fwd_bytes, ce.loss_fwd_kernels, true);
            set(Logits, Phase::BackwardInput, ce.logits_bwd_bytes, ce.logits_bwd_kernels, false);
        }
        let buckets = (0..p.pp).map(|stage| stage_buckets(s, stage)).collect::<Vec<_>>();
        for b in &buckets {
            let (dense, expert) = moe::split_params(b.iter());
            // ZeRO shards dense state over the data-parallel group (cp · dp ranks), expert
            // state over the expert-data-parallel group.
            let shard = if s.zero_stage() >= 1 {
                dense.div_ceil(p.grad_ranks()) + expert.div_ceil(p.expert_dp().max(1))
            } else {
                dense + expert
            };
            costs.push(optimizer_cost(shard, state_bytes_per_param(s.training.storage_dtype()).1));
        }
        let moe_out_ids = moe::moe_costs(s, &mut costs, &mut cost_ids);
        mtp::mtp_costs(s, &mut costs, &mut cost_ids);
        // DeepSpeed ZeRO-3: every hooked module of a piece costs host time in each pass that
        // runs it (forward, recomputation, backward) — its hooks, and per fetch the Python
        // views over the partition group's ranks — charged to the piece as a copy of its
        // cost with the host time beside it. (A backward whose module the reuse distance kept
        // gathered fetches nothing; it is charged as one that does.)
        let mut host_ns = Vec::new();
        let mut host_cost_ids = BTreeMap::new();
        if let (3, crate::framework::mechanics::Gathering::PerModule(mech)) =
            (p.zero, s.training.framework.zero3_gathering(s))
        {
            host_ns = vec![0; costs.len()];
            for piece in [Attn, Mlp] {
                let hooked = piece_modules(&s.model, p.tp, piece, 0).len() as u64;
                let fetches: u64 = piece_module_tensors(&s.model, p.tp, piece, mech.persistence_threshold)
                    .into_iter()
                    .map(|tensors| mech.fetch_host_ns(p.grad_ranks(), tensors))
                    .sum();
                for phase in [Phase::Forward, Phase::BackwardInput, Phase::Recompute] {
                    let base = cost_ids[&(piece, phase)];
                    host_cost_ids.insert((piece, phase), costs.len() as CostId);
                    costs.push(costs[base as usize].clone());
                    host_ns.push(hooked * mech.host_ns_per_module + fetches);
                }
            }
        }
        let ring_step_cost_ids = cp::costs(s, &mut costs, &mut cost_ids, &mut host_ns);
        let hp_grad_cost_ids = hp_grads::hp_grad_costs(s, &buckets, &mut costs, &cost_ids);
        Ok(Planner {
            s,
            grid,
            costs,
            cost_ids,
            buckets,
            host_ns,
            host_cost_ids,
            moe_out_ids,
            ring_step_cost_ids,
            hp_grad_cost_ids,
        })
    }

    pub fn grid(&self) -> RankGrid {
        self.grid
    }

    /// The program of one pipeline stage.
    pub fn program(&self, stage: u32) -> Program {
        assert!(stage < self.grid.pp, "stage {stage} of {}", self.grid.pp);
        let mut l = StageLowering::new(self, stage);
        l.lower();
        Program { ops: l.e.ops }
    }

    /// Every stage's program.
    pub fn plan(self) -> Plan {
        let programs = (0..self.grid.pp).map(|s| self.program(s)).collect();
        Plan {
            scenario: self.s.clone(),
            grid: self.grid,
            costs: self.costs,
            host_ns: self.host_ns,
            buckets: self.buckets,
            programs,
            rank_programs: BTreeMap::new(),
        }
    }

    fn cost(&self, piece: Piece, phase: Phase) -> CostId {
        self.cost_ids[&(piece, phase)]
    }

    /// The cost of a piece with its modules' host time, where the framework charges one.
    fn host_cost(&self, piece: Piece, phase: Phase) -> Option<CostId> {
        self.host_cost_ids.get(&(piece, phase)).copied()
    }

    fn optimizer_cost(&self, stage: u32) -> CostId {
        // Optimizer costs follow the 36 piece costs, one per stage.
        (9 * 4 + stage) as CostId
    }
}

/// Lowers a scenario to its full plan, proven by [`crate::plan::check`] (so every buffer
/// and message is within its limit, and `verify` and `simulate` accept what `plan` writes).
pub fn lower(s: &Scenario) -> Result<Plan, ScenarioError> {
    let plan = Planner::new(s)?.plan();
    match crate::plan::check::CheckedPlan::new(plan) {
        Ok(checked) => Ok(checked.into_inner()),
        Err(e) => Err(ScenarioError::Invalid {
            origin: s.name.clone(),
            message: format!("its plan is over a limit: {e} (see docs/limits.md)"),
            config: None,
        }),
    }
}

/// One stage's lowering in progress: the ops emitted so far and the buffers, pending
/// reductions and gathers the ops still to come depend on. Its methods live in the files
/// of this module by concept (`forward`, `backward`, `zero`, `step`, `emit`).
struct StageLowering<'p, 'a> {
    pl: &'p Planner<'a>,
    stage: u32,
    e: Emitter,
    tp: bool,
    sp: bool,
    last_vs: u32,
    /// (layer, mb) → saved-activation buffer.
    act: BTreeMap<(u32, u32), BufId>,
    /// (layer, mb) → full-recompute working set.
    recompute: BTreeMap<(u32, u32), BufId>,
    /// ZB-H1: the output gradients a layer's deferred weight passes read.
    wgrad: BTreeMap<(u32, u32), BufId>,
    /// mb → embedding / head buffers (only chunk 0 embeds, only the last chunk has the head).
    embed_buf: BTreeMap<u32, BufId>,
    /// Split backward: the embedding's output gradient, from the input pass to the W pass.
    embed_grad: BTreeMap<u32, BufId>,
    head_buf: BTreeMap<u32, BufId>,
    /// (MTP layer, mb) → a multi-token-prediction head's buffer.
    mtp_head_buf: BTreeMap<(u32, u32), BufId>,
    /// (chunk, unit) → index of its bucket.
    unit_bucket: BTreeMap<(u32, Unit), usize>,
    bucket_state: Vec<BucketState>,
    /// ZeRO-1/2: the parameter all-gather each bucket's first use waits for.
    param_ready: BTreeMap<usize, OpId>,
    /// ZeRO-3: frees of gathered units, most recent last (prefetch window).
    gathered_frees: VecDeque<OpId>,
    dp_ops: Vec<OpId>,
    deferred_grad_reduce: Vec<(usize, u32, Vec<OpId>)>,
    /// torchtitan with a pipeline: the last microbatch's bucket reductions (bucket,
    /// microbatch, deps, the accumulated full gradient), issued after the chunk's backward.
    chunk_grad_reduce: Vec<(usize, u32, Vec<OpId>, Option<BufId>)>,
    /// Ops the next compute op must wait for (synchronous ZeRO-2/3 reductions, DeepSpeed's
    /// blocking pipeline sends).
    pending_sync: Vec<OpId>,
    /// DeepSpeed's PipelineEngine: the send of the pass just run, issued in the next pass's
    /// instruction slot (`pipe.rs`), and the last send or receive issued.
    deferred_send: Option<(P2pOp, BufId)>,
    last_p2p: Option<OpId>,
    /// ZeRO-3 gathers issued ahead: (bucket, mb, phase) → (gather op, buffer).
    prefetched: BTreeMap<(usize, u32, Phase), (OpId, BufId)>,
    last_compute: Option<OpId>,
    /// The last two compute ops, oldest first (when DeepSpeed's host reaches a module's hook).
    recent_compute: VecDeque<OpId>,
    /// DeepSpeed ZeRO-3's per-module gathers in flight.
    modules: ModuleState,
    /// Params, grads and optimizer state of each chunk, in that order (`params_buf`,
    /// `grads_buf`).
    persistent: Vec<BufId>,
    /// The `Alloc` op of each persistent buffer (ops on other streams that use it wait on it).
    persistent_alloc: BTreeMap<BufId, OpId>,
}

impl<'p, 'a> StageLowering<'p, 'a> {
    fn new(pl: &'p Planner<'a>, stage: u32) -> Self {
        let p = &pl.s.parallel;
        let buckets = &pl.buckets[stage as usize];
        let mut unit_bucket = BTreeMap::new();
        for (i, b) in buckets.iter().enumerate() {
            for u in &b.units {
                unit_bucket.insert((b.chunk, *u), i);
            }
        }
        StageLowering {
            pl,
            stage,
            e: Emitter::new(),
            tp: p.tp > 1,
            sp: p.sequence_parallel,
            last_vs: p.pipeline().last_vstage(),
            act: BTreeMap::new(),
            recompute: BTreeMap::new(),
            wgrad: BTreeMap::new(),
            embed_buf: BTreeMap::new(),
            embed_grad: BTreeMap::new(),
            head_buf: BTreeMap::new(),
            mtp_head_buf: BTreeMap::new(),
            unit_bucket,
            bucket_state: buckets.iter().map(|_| BucketState::default()).collect(),
            param_ready: BTreeMap::new(),
            gathered_frees: VecDeque::new(),
            dp_ops: Vec::new(),
            deferred_grad_reduce: Vec::new(),
            chunk_grad_reduce: Vec::new(),
            pending_sync: Vec::new(),
            deferred_send: None,
            last_p2p: None,
            prefetched: BTreeMap::new(),
            last_compute: None,
            recent_compute: VecDeque::new(),
            modules: ModuleState::default(),
            persistent: Vec::new(),
            persistent_alloc: BTreeMap::new(),
        }
    }

    fn s(&self) -> &'a Scenario {
        self.pl.s
    }

    fn zero(&self) -> u8 {
        self.s().zero_stage()
    }

    fn dtype(&self) -> crate::scenario::Dtype {
        self.s().training.storage_dtype()
    }

    fn buckets(&self) -> &'p [Bucket] {
        &self.pl.buckets[self.stage as usize]
    }

    fn vstage(&self, chunk: u32) -> u32 {
        self.s().parallel.pipeline().vstage(chunk, self.stage)
    }

    /// A chunk's persistent parameter buffer (`persistent_state` allocates params, grads,
    /// optimizer state per chunk, in that order).
    fn params_buf(&self, chunk: u32) -> BufId {
        self.persistent[chunk as usize * 3]
    }

    /// A chunk's persistent gradient buffer.
    fn grads_buf(&self, chunk: u32) -> BufId {
        self.persistent[chunk as usize * 3 + 1]
    }

    fn layers(&self, chunk: u32) -> std::ops::Range<u32> {
        self.s().parallel.chunk_layers(&self.s().model, self.vstage(chunk))
    }

    /// Bytes of the residual stream of one microbatch on one rank (a pipeline message;
    /// s/cp tokens of each sequence under context parallelism).
    fn residual_bytes(&self) -> u64 {
        let p = &self.s().parallel;
        let full = self.tensor_bytes();
        if self.sp { full / p.tp as u64 } else { full }
    }

    /// The tensors a pass hands between its pieces, from its start to its last compute
    /// ([`crate::accounting::memory::pass_workspace_bytes`]); none for a pass that has none.
    fn pass_workspace(&mut self, pass: Pass, chunk: u32, mb: u32) -> Option<BufId> {
        let s = self.s();
        let bytes =
            self.per_cp_rank(pass_workspace_bytes(&s.model, &s.parallel, s.training.storage_dtype(), pass) as f64);
        (bytes > 0)
            .then(|| self.e.alloc(Stream::Compute, &[], BufClass::Workspace, bytes, format!("work c{chunk} mb{mb}")).0)
    }

    /// Bytes of a full (b·s·h) activation tensor: the S of a tensor-parallel collective
    /// (b·(s/cp)·h under context parallelism).
    fn tensor_bytes(&self) -> u64 {
        self.rank_tokens() * self.s().model.hidden as u64 * self.dtype().bytes()
    }

    /// Tokens of one microbatch on one rank: b·s, or b·s/cp with context parallelism.
    fn rank_tokens(&self) -> u64 {
        let p = &self.s().parallel;
        p.micro_batch as u64 * self.s().model.seq_len as u64 / p.cp.max(1) as u64
    }

    fn lower(&mut self) {
        let p = self.s().parallel.clone();
        self.persistent_state();
        let table = schedule::table(p.schedule, p.pp, p.vpp, p.microbatches(), self.stage);
        // `moe_a2a_overlap`: the steady-state (backward, forward) pairs to merge, and where
        // their ops fall.
        let merge = if p.moe_a2a_overlap { overlap::pairs(&table) } else { Vec::new() };
        // Where each slot's ops begin, and where the last one's end.
        let mut starts = Vec::with_capacity(table.len() + 1);
        for slot in &table {
            starts.push(self.e.ops.len());
            let work = self.pass_workspace(slot.pass, slot.chunk, slot.mb);
            match slot.pass {
                Pass::Forward => self.forward(slot.chunk, slot.mb),
                Pass::Backward => self.backward(slot.chunk, slot.mb, false),
                Pass::BackwardInput => self.backward(slot.chunk, slot.mb, true),
                Pass::BackwardWeight => self.backward_weight(slot.chunk, slot.mb),
            }
            if let Some(buf) = work {
                let last = self.last_compute.expect("a pass computes");
                self.e.free(Stream::Compute, &[last], buf);
            }
        }
        // DeepSpeed's in-series pipeline: the last slot's deferred send ends that slot.
        self.flush_send();
        starts.push(self.e.ops.len());
        let merged: Vec<overlap::PairOps> =
            merge.iter().map(|&(b, f)| overlap::PairOps { b0: starts[b], f0: starts[f], f1: starts[f + 1] }).collect();
        self.end_of_step();
        self.e.ops = overlap::interleave(std::mem::take(&mut self.e.ops), &merged);
        debug_assert!(self.act.is_empty() && self.recompute.is_empty(), "activation buffers left alive");
    }

    /// The bytes data-parallel gradients are reduced in (per the framework: Megatron-LM's
    /// fp32 main gradients, DeepSpeed's bf16, FSDP2's fp32), per parameter.
    fn grad_reduce_bytes(&self) -> u64 {
        scenario_layout(self.s()).grad_reduce.bytes()
    }

    /// Parameters, gradients and optimizer state, per chunk, for the whole run, in the
    /// framework's layout ([`crate::accounting::states`]).
    fn persistent_state(&mut self) {
        let p = self.s().parallel.clone();
        let layout = scenario_layout(self.s());
        for chunk in 0..p.vpp {
            let (dense, expert) = moe::split_params(self.buckets().iter().filter(|b| b.chunk == chunk));
            // ZeRO shards dense state over the data-parallel group (cp · dp ranks), expert
            // state over the expert-data-parallel group.
            let (shards, edp) = (p.grad_ranks() as u32, p.expert_dp().max(1) as u32);
            let by = |per: crate::accounting::states::PerParam| per.bytes(dense, shards) + per.bytes(expert, edp);
            let weights = by(layout.weights);
            let grads = by(layout.grads);
            let optim = by(layout.optimizer);
            for (class, bytes, what) in [
                (BufClass::Params, weights, "params"),
                (BufClass::Grads, grads, "grads"),
                (BufClass::OptimizerState, optim, "optimizer"),
            ] {
                let (buf, op) = self.e.alloc(Stream::Compute, &[], class, bytes, format!("{what} c{chunk}"));
                self.persistent.push(buf);
                self.persistent_alloc.insert(buf, op);
            }
        }
        // ZeRO-1/2 overlapped: gather the shards the previous step updated, under the forward,
        // in the order the forward needs them (chunks in order, each chunk's buckets — kept in
        // backward order — reversed).
        if (1..=2).contains(&self.zero()) && self.s().training.framework.overlaps_param_gather(self.s()) {
            let mut order: Vec<usize> = (0..self.buckets().len()).collect();
            order.sort_by_key(|i| (self.buckets()[*i].chunk, std::cmp::Reverse(self.buckets()[*i].index)));
            for i in order {
                let op = self.param_bucket_gather(i, &[]);
                self.param_ready.insert(i, op);
            }
        }
    }
}
