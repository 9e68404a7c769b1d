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

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::accounting::memory::{has_dropout, layer_activation_bytes, layer_activation_parts, state_bytes_per_param};
use crate::accounting::params::{embedding_params, layer_params};
use crate::parallel::Recompute;
use crate::plan::cost::{optimizer_cost, piece_cost};
use crate::plan::grid::RankGrid;
use crate::plan::ir::*;
use crate::plan::schedule::{self, Pass};
use crate::scenario::{Scenario, ScenarioError};

/// A group of parameters that moves together under ZeRO: a layer, or an embedding piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unit {
    /// The vocabulary-parallel word embedding (on the first stage, and its tied copy on the
    /// last stage when pp > 1). Always a bucket of its own, so both copies shard alike.
    WordEmbedding,
    /// Learned position embeddings (GPT).
    PosEmbedding,
    Layer(u32),
    FinalNorm,
    /// An untied output layer (Llama).
    OutputLayer,
}

/// A gradient bucket: consecutive units of one model chunk, in backward order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub chunk: u32,
    pub index: u32,
    pub units: Vec<Unit>,
    /// Parameters per rank in the bucket, before ZeRO sharding.
    pub params: u64,
}

/// The lowered step: one program per pipeline stage, shared by every rank of the stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub scenario: Scenario,
    pub grid: RankGrid,
    pub costs: Vec<ComputeCost>,
    /// Gradient buckets per stage (outer) in emission order.
    pub buckets: Vec<Vec<Bucket>>,
    /// Distinct programs; the first `pp` are the stages' programs.
    pub programs: Vec<Program>,
    /// Ranks that run a program other than their stage's: rank → index into `programs`.
    /// Empty for every plan the planner emits (all ranks of a stage are alike); used by
    /// tools and tests that edit one rank.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rank_programs: BTreeMap<u32, u32>,
}

impl Plan {
    /// Index into `programs` of the program `rank` runs.
    pub fn program_index(&self, rank: u32) -> usize {
        match self.rank_programs.get(&rank) {
            Some(i) => *i as usize,
            None => self.grid.coord(rank).pp as usize,
        }
    }

    /// The program rank `rank` runs.
    pub fn program(&self, rank: u32) -> &Program {
        &self.programs[self.program_index(rank)]
    }

    /// Gives `rank` a program of its own (a copy of its current one) and returns it for
    /// editing.
    pub fn program_of_rank_mut(&mut self, rank: u32) -> &mut Program {
        let current = self.program_index(rank);
        if !self.rank_programs.contains_key(&rank) {
            self.programs.push(self.programs[current].clone());
            self.rank_programs.insert(rank, (self.programs.len() - 1) as u32);
        }
        let i = self.rank_programs[&rank] as usize;
        &mut self.programs[i]
    }

    pub fn cost(&self, id: CostId) -> &ComputeCost {
        &self.costs[id as usize]
    }

    /// Total ops over all distinct programs.
    pub fn op_count(&self) -> usize {
        self.programs.iter().map(|p| p.ops.len()).sum()
    }
}

/// Parameters per tensor-parallel rank in a unit.
pub fn unit_params(s: &Scenario, unit: Unit) -> u64 {
    let m = &s.model;
    let t = s.parallel.tp as u64;
    let (word, pos) = embedding_params(m);
    match unit {
        Unit::WordEmbedding | Unit::OutputLayer => word / t,
        Unit::PosEmbedding => pos,
        Unit::Layer(_) => layer_params(m).per_rank(s.parallel.tp),
        Unit::FinalNorm => m.norm_params(),
    }
}

/// Builds programs for a scenario; `program(stage)` lowers one stage on demand, so a
/// caller that needs a few stages of a 16,384-GPU plan pays only for those.
pub struct Planner<'a> {
    s: &'a Scenario,
    grid: RankGrid,
    costs: Vec<ComputeCost>,
    cost_ids: BTreeMap<(Piece, Phase), CostId>,
    buckets: Vec<Vec<Bucket>>,
}

impl<'a> Planner<'a> {
    pub fn new(s: &'a Scenario) -> Result<Planner<'a>, ScenarioError> {
        s.validate()?;
        let p = &s.parallel;
        let grid = RankGrid::new(p.tp, p.dp, p.pp, s.cluster.gpus_per_node);
        let mut costs = Vec::new();
        let mut cost_ids = BTreeMap::new();
        use Piece::*;
        for piece in [Embed, AttnIn, Attn, MlpIn, Mlp, LayerOut, FinalNorm, Logits, Loss] {
            for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight, Phase::Recompute] {
                cost_ids.insert((piece, phase), costs.len() as CostId);
                costs.push(piece_cost(&s.model, p, s.training.dtype, s.training.flash_attention, piece, phase));
            }
        }
        let buckets = (0..p.pp).map(|stage| stage_buckets(s, stage)).collect::<Vec<_>>();
        for b in &buckets {
            let params: u64 = b.iter().map(|b| b.params).sum();
            let shard = if p.zero >= 1 { params.div_ceil(p.dp as u64) } else { params };
            costs.push(optimizer_cost(shard, state_bytes_per_param(s.training.dtype).1));
        }
        Ok(Planner { s, grid, costs, cost_ids, buckets })
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
            buckets: self.buckets,
            programs,
            rank_programs: BTreeMap::new(),
        }
    }

    fn cost(&self, piece: Piece, phase: Phase) -> CostId {
        self.cost_ids[&(piece, phase)]
    }

    fn optimizer_cost(&self, stage: u32) -> CostId {
        // Optimizer costs follow the 36 piece costs, one per stage.
        (9 * 4 + stage) as CostId
    }
}

/// Lowers a scenario to its full plan.
pub fn lower(s: &Scenario) -> Result<Plan, ScenarioError> {
    Ok(Planner::new(s)?.plan())
}

/// Units of each chunk of a stage in backward order, packed into buckets.
fn stage_buckets(s: &Scenario, stage: u32) -> Vec<Bucket> {
    let m = &s.model;
    let p = &s.parallel;
    let last_vs = p.pp * p.vpp - 1;
    let grad_bytes = state_bytes_per_param(s.training.dtype).1;
    let cap = (p.grad_bucket_mb * 1024.0 * 1024.0) as u64;
    let mut out = Vec::new();
    for chunk in 0..p.vpp {
        let vs = chunk * p.pp + stage;
        let mut units = Vec::new();
        if vs == last_vs {
            if m.tied_embeddings() {
                if p.pp > 1 {
                    units.push(Unit::WordEmbedding);
                }
            } else {
                units.push(Unit::OutputLayer);
            }
            units.push(Unit::FinalNorm);
        }
        units.extend(p.chunk_layers(m, vs).rev().map(Unit::Layer));
        if vs == 0 {
            if m.learned_positions() {
                units.push(Unit::PosEmbedding);
            }
            units.push(Unit::WordEmbedding);
        }
        let mut current: Vec<Unit> = Vec::new();
        let mut current_params = 0u64;
        let mut index = 0;
        let flush = |units: &mut Vec<Unit>, params: &mut u64, index: &mut u32, out: &mut Vec<Bucket>| {
            if !units.is_empty() {
                out.push(Bucket { chunk, index: *index, units: std::mem::take(units), params: *params });
                *index += 1;
                *params = 0;
            }
        };
        for u in units {
            let params = unit_params(s, u);
            let alone = u == Unit::WordEmbedding || p.zero >= 3;
            if alone || (current_params + params) * grad_bytes > cap {
                flush(&mut current, &mut current_params, &mut index, &mut out);
            }
            current.push(u);
            current_params += params;
            if alone {
                flush(&mut current, &mut current_params, &mut index, &mut out);
            }
        }
        flush(&mut current, &mut current_params, &mut index, &mut out);
    }
    out
}

/// Appends ops and hands out buffer ids.
struct Emitter {
    ops: Vec<Op>,
    next_buf: BufId,
}

impl Emitter {
    fn op(&mut self, stream: Stream, deps: &[OpId], bufs: &[BufId], kind: OpKind) -> OpId {
        let id = self.ops.len() as OpId;
        // A dependency on an earlier op of the same stream is implied by stream order, except
        // on a send or a free, which the stream moves past before they complete, and except
        // for a free's own deps (it waits for nothing else).
        let is_free = matches!(kind, OpKind::Free { .. });
        let mut deps: Vec<OpId> = deps
            .iter()
            .copied()
            .filter(|d| {
                let o = &self.ops[*d as usize];
                is_free || o.stream != stream || matches!(o.kind, OpKind::Send(_) | OpKind::Free { .. })
            })
            .collect();
        deps.sort_unstable();
        deps.dedup();
        self.ops.push(Op { stream, deps, bufs: bufs.to_vec(), kind });
        id
    }

    fn alloc(&mut self, stream: Stream, deps: &[OpId], class: BufClass, bytes: u64, name: String) -> (BufId, OpId) {
        let buf = self.next_buf;
        self.next_buf += 1;
        let op = self.op(stream, deps, &[], OpKind::Alloc(AllocOp { buf, class, bytes, name }));
        (buf, op)
    }

    fn free(&mut self, stream: Stream, deps: &[OpId], buf: BufId) -> OpId {
        self.op(stream, deps, &[], OpKind::Free { buf })
    }
}

/// Per-microbatch state of a gradient bucket (ZB runs input and weight passes of
/// different microbatches interleaved, so completion is tracked per microbatch).
#[derive(Default)]
struct BucketState {
    /// mb → ops that completed a unit's gradient in that microbatch.
    done: BTreeMap<u32, Vec<OpId>>,
    /// mb → ZeRO-2/3's transient full-gradient buffer.
    full_grad: BTreeMap<u32, BufId>,
    /// The reduction of the bucket's last full-gradient buffer: the next one waits for it.
    last_reduce: Option<OpId>,
}

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
    head_buf: BTreeMap<u32, BufId>,
    /// (chunk, unit) → index of its bucket.
    unit_bucket: BTreeMap<(u32, Unit), usize>,
    bucket_state: Vec<BucketState>,
    /// ZeRO-1/2: the parameter all-gather each bucket's first use waits for.
    param_ready: BTreeMap<usize, OpId>,
    /// ZeRO-3: frees of gathered units, most recent last (prefetch window).
    gathered_frees: VecDeque<OpId>,
    dp_ops: Vec<OpId>,
    deferred_grad_reduce: Vec<(usize, u32, Vec<OpId>)>,
    /// Ops the next compute op must wait for (synchronous ZeRO-2/3 reductions).
    pending_sync: Vec<OpId>,
    /// ZeRO-3 gathers issued ahead: (bucket, mb, phase) → (gather op, buffer).
    prefetched: BTreeMap<(usize, u32, Phase), (OpId, BufId)>,
    last_compute: Option<OpId>,
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
            e: Emitter { ops: Vec::new(), next_buf: 0 },
            tp: p.tp > 1,
            sp: p.sequence_parallel,
            last_vs: p.pp * p.vpp - 1,
            act: BTreeMap::new(),
            recompute: BTreeMap::new(),
            wgrad: BTreeMap::new(),
            embed_buf: BTreeMap::new(),
            head_buf: BTreeMap::new(),
            unit_bucket,
            bucket_state: buckets.iter().map(|_| BucketState::default()).collect(),
            param_ready: BTreeMap::new(),
            gathered_frees: VecDeque::new(),
            dp_ops: Vec::new(),
            deferred_grad_reduce: Vec::new(),
            pending_sync: Vec::new(),
            prefetched: BTreeMap::new(),
            last_compute: None,
            persistent: Vec::new(),
            persistent_alloc: BTreeMap::new(),
        }
    }

    fn s(&self) -> &'a Scenario {
        self.pl.s
    }

    fn zero(&self) -> u8 {
        self.s().parallel.zero
    }

    fn dtype(&self) -> crate::scenario::Dtype {
        self.s().training.dtype
    }

    fn buckets(&self) -> &'p [Bucket] {
        &self.pl.buckets[self.stage as usize]
    }

    fn vstage(&self, chunk: u32) -> u32 {
        chunk * self.s().parallel.pp + self.stage
    }

    fn layers(&self, chunk: u32) -> std::ops::Range<u32> {
        self.s().parallel.chunk_layers(&self.s().model, self.vstage(chunk))
    }

    /// Bytes of the residual stream of one microbatch on one rank (a pipeline message).
    fn residual_bytes(&self) -> u64 {
        let m = &self.s().model;
        let p = &self.s().parallel;
        let full = p.micro_batch as u64 * m.seq_len as u64 * m.hidden as u64 * self.dtype().bytes();
        if self.sp { full / p.tp as u64 } else { full }
    }

    /// Bytes of a full (b·s·h) activation tensor: the S of a tensor-parallel collective.
    fn tensor_bytes(&self) -> u64 {
        let m = &self.s().model;
        self.s().parallel.micro_batch as u64 * m.seq_len as u64 * m.hidden as u64 * self.dtype().bytes()
    }

    fn compute(
        &mut self,
        piece: Piece,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        deps: &[OpId],
        bufs: &[BufId],
    ) -> OpId {
        let cost = self.pl.cost(piece, phase);
        let op = ComputeOp { piece, phase, mb, chunk, layer, cost };
        let mut deps = deps.to_vec();
        deps.append(&mut self.pending_sync);
        let id = self.e.op(Stream::Compute, &deps, bufs, OpKind::Compute(op));
        self.last_compute = Some(id);
        id
    }

    fn collective(
        &mut self,
        stream: Stream,
        deps: &[OpId],
        bufs: &[BufId],
        kind: CollKind,
        group: GroupKind,
        bytes: u64,
        purpose: CollPurpose,
    ) -> OpId {
        let c = CollectiveOp { kind, group, bytes, dtype: self.dtype(), purpose };
        let mut deps = deps.to_vec();
        deps.extend(bufs.iter().filter_map(|b| self.persistent_alloc.get(b)));
        self.e.op(stream, &deps, bufs, OpKind::Collective(c))
    }

    /// A tensor-parallel collective after `after`; returns the id the next consumer waits on.
    fn tp_coll(
        &mut self,
        site: TpSite,
        piece: Piece,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        after: OpId,
    ) -> OpId {
        let kind = match site {
            TpSite::Reduce if self.sp => CollKind::ReduceScatter,
            TpSite::Reduce => CollKind::AllReduce,
            TpSite::Gather | TpSite::GatherSaved | TpSite::LossStats => CollKind::AllGather,
        };
        let bytes = match site {
            // Per token: (max, sum of exponentials, target logit) in fp32 from each of t ranks.
            TpSite::LossStats => {
                let m = &self.s().model;
                self.s().parallel.micro_batch as u64 * m.seq_len as u64 * 3 * 4 * self.s().parallel.tp as u64
            }
            _ => self.tensor_bytes(),
        };
        let purpose = CollPurpose::Tp { site, piece, phase, mb, chunk, layer };
        self.collective(Stream::Tp, &[after], &[], kind, GroupKind::Tp, bytes, purpose)
    }

    fn lower(&mut self) {
        let p = self.s().parallel.clone();
        self.persistent_state();
        let table = schedule::table(p.schedule, p.pp, p.vpp, p.microbatches(), self.stage);
        for slot in table {
            match slot.pass {
                Pass::Forward => self.forward(slot.chunk, slot.mb),
                Pass::Backward => self.backward(slot.chunk, slot.mb, false),
                Pass::BackwardInput => self.backward(slot.chunk, slot.mb, true),
                Pass::BackwardWeight => self.backward_weight(slot.chunk, slot.mb),
            }
        }
        self.end_of_step();
        debug_assert!(self.act.is_empty() && self.recompute.is_empty(), "activation buffers left alive");
    }

    /// Parameters, gradients and optimizer state, per chunk, for the whole run.
    fn persistent_state(&mut self) {
        let p = self.s().parallel.clone();
        let (w, g, k) = state_bytes_per_param(self.dtype());
        let dp = p.dp as u64;
        for chunk in 0..p.vpp {
            let params: u64 = self.buckets().iter().filter(|b| b.chunk == chunk).map(|b| b.params).sum();
            let shard = params.div_ceil(dp);
            let weights = if p.zero >= 3 { shard * w } else { params * w };
            let grads = if p.zero >= 2 { shard * g } else { params * g };
            let optim = if p.zero >= 1 { shard * k } else { params * k };
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
        if (1..=2).contains(&p.zero) && p.overlap_param_gather {
            let mut order: Vec<usize> = (0..self.buckets().len()).collect();
            order.sort_by_key(|i| (self.buckets()[*i].chunk, std::cmp::Reverse(self.buckets()[*i].index)));
            for i in order {
                let op = self.param_bucket_gather(i, &[]);
                self.param_ready.insert(i, op);
            }
        }
    }

    fn param_bucket_gather(&mut self, bucket: usize, deps: &[OpId]) -> OpId {
        let b = &self.buckets()[bucket];
        let bytes = b.params * state_bytes_per_param(self.dtype()).0;
        let purpose = CollPurpose::ParamBucket { chunk: b.chunk, bucket: b.index };
        let params = self.persistent[b.chunk as usize * 3];
        let op = self.collective(Stream::Dp, deps, &[params], CollKind::AllGather, GroupKind::Dp, bytes, purpose);
        self.dp_ops.push(op);
        op
    }

    /// Deps a unit's first compute op needs for its parameters: the ZeRO-1/2 all-gather of
    /// its bucket (first use in the step), or the ZeRO-3 gather of the unit itself.
    fn params_for(&mut self, chunk: u32, units: &[Unit], mb: u32, phase: Phase) -> (Vec<OpId>, Vec<BufId>) {
        let mut deps = Vec::new();
        let mut bufs = Vec::new();
        for u in units {
            let Some(&b) = self.unit_bucket.get(&(chunk, *u)) else { continue };
            if let Some(op) = self.param_ready.remove(&b) {
                deps.push(op);
            }
            if self.zero() >= 3 {
                let (op, buf) = match self.prefetched.remove(&(b, mb, phase)) {
                    Some(x) => x,
                    None => self.gather_unit(b, mb, phase),
                };
                deps.push(op);
                bufs.push(buf);
            }
        }
        (deps, bufs)
    }

    /// ZeRO-3 in backward: gather the next layer's parameters now, ahead of this layer's
    /// gradient reduce-scatter on the in-order data-parallel stream, so the gather overlaps
    /// this layer's backward instead of waiting behind its reduction.
    fn prefetch(&mut self, chunk: u32, unit: Unit, mb: u32, phase: Phase) {
        if self.zero() < 3 || !self.s().parallel.overlap_param_gather {
            return;
        }
        if let Some(&b) = self.unit_bucket.get(&(chunk, unit))
            && !self.prefetched.contains_key(&(b, mb, phase))
        {
            let g = self.gather_unit(b, mb, phase);
            self.prefetched.insert((b, mb, phase), g);
        }
    }

    /// ZeRO-3: allocate and all-gather one unit's full parameters, at most `prefetch` ahead.
    fn gather_unit(&mut self, bucket: usize, mb: u32, phase: Phase) -> (OpId, BufId) {
        let b = &self.buckets()[bucket];
        let bytes = b.params * state_bytes_per_param(self.dtype()).0;
        let window = if self.s().parallel.overlap_param_gather { 2 } else { 1 };
        let wait: Vec<OpId> = if self.gathered_frees.len() >= window {
            vec![self.gathered_frees[self.gathered_frees.len() - window]]
        } else {
            vec![]
        };
        let name = format!("gathered c{} b{} mb{mb}", b.chunk, b.index);
        let (buf, _) = self.e.alloc(Stream::Dp, &wait, BufClass::Params, bytes, name);
        let purpose = CollPurpose::ParamGather { chunk: b.chunk, bucket: b.index, mb, phase };
        let shard = self.persistent[b.chunk as usize * 3];
        let op = self.collective(Stream::Dp, &[], &[buf, shard], CollKind::AllGather, GroupKind::Dp, bytes, purpose);
        self.dp_ops.push(op);
        (op, buf)
    }

    fn release_gathered(&mut self, bufs: &[BufId], after: OpId) {
        for b in bufs {
            let f = self.e.free(Stream::Compute, &[after], *b);
            self.gathered_frees.push_back(f);
        }
    }

    fn forward(&mut self, chunk: u32, mb: u32) {
        let vs = self.vstage(chunk);
        let mut deps = Vec::new();
        let mut input_buf = None;
        if vs > 0 {
            let bytes = self.residual_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Pp, &[], BufClass::Activations, bytes, format!("recv act vs{vs} mb{mb}"));
            let p2p = P2pOp { peer: Peer::Prev, kind: P2pKind::Activation, mb, vstage: vs, bytes };
            deps.push(self.e.op(Stream::Pp, &[], &[buf], OpKind::Recv(p2p)));
            input_buf = Some(buf);
        } else {
            let units = if self.s().model.learned_positions() {
                vec![Unit::WordEmbedding, Unit::PosEmbedding]
            } else {
                vec![Unit::WordEmbedding]
            };
            let (pdeps, pbufs) = self.params_for(chunk, &units, mb, Phase::Forward);
            let m = &self.s().model;
            let p = &self.s().parallel;
            let mask = if has_dropout(m) {
                let sbh = p.micro_batch as u64 * m.seq_len as u64 * m.hidden as u64;
                if self.sp { sbh / p.tp as u64 } else { sbh }
            } else {
                0
            };
            // Under ZB the embedding's weight pass runs later from the saved output gradient.
            let saved_grad = if p.schedule.splits_backward() { self.residual_bytes() } else { 0 };
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, mask + saved_grad, format!("embed mb{mb}"));
            self.embed_buf.insert(mb, buf);
            let mut bufs = vec![buf];
            bufs.extend(&pbufs);
            let op = self.compute(Piece::Embed, Phase::Forward, mb, chunk, 0, &pdeps, &bufs);
            self.release_gathered(&pbufs, op);
            if self.tp {
                deps.push(self.tp_coll(TpSite::Reduce, Piece::Embed, Phase::Forward, mb, chunk, 0, op));
            }
        }
        let layers = self.layers(chunk);
        for (i, layer) in layers.clone().enumerate() {
            let bytes = self.layer_act_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("act L{layer} mb{mb}"));
            self.act.insert((layer, mb), buf);
            let first = self.layer_forward(layer, mb, chunk, Phase::Forward, &deps, None);
            deps.clear();
            if i == 0
                && let Some(b) = input_buf.take()
            {
                self.e.free(Stream::Compute, &[first], b);
            }
        }
        if vs == self.last_vs {
            self.head_forward(chunk, mb);
        } else {
            let bytes = self.residual_bytes();
            let after = self.last_compute.expect("a chunk has layers");
            let (buf, _) = self.e.alloc(
                Stream::Pp,
                &[after],
                BufClass::Activations,
                bytes,
                format!("send act vs{} mb{mb}", vs + 1),
            );
            let p2p = P2pOp { peer: Peer::Next, kind: P2pKind::Activation, mb, vstage: vs + 1, bytes };
            let send = self.e.op(Stream::Pp, &[after], &[buf], OpKind::Send(p2p));
            self.e.free(Stream::Pp, &[send], buf);
        }
    }

    /// The output gradients a layer's deferred weight passes read
    /// ([`crate::accounting::memory::weight_grad_bytes`]).
    fn wgrad_bytes(&self) -> u64 {
        let s = self.s();
        crate::accounting::memory::weight_grad_bytes(&s.model, s.parallel.micro_batch, s.training.dtype, s.parallel.tp)
            .ceil() as u64
    }

    fn layer_act_bytes(&self) -> u64 {
        let s = self.s();
        let p = &s.parallel;
        let flash = s.training.flash_attention;
        layer_activation_bytes(&s.model, p.micro_batch, s.training.dtype, p.tp, p.sequence_parallel, p.recompute, flash)
            .ceil() as u64
    }

    /// The five forward pieces of a layer with their tensor-parallel collectives. Returns the
    /// first compute op.
    /// `gathered`: parameters the caller already gathered (ZeRO-3 recomputation reuses the
    /// backward's gather); otherwise this gathers and releases them itself.
    fn layer_forward(
        &mut self,
        layer: u32,
        mb: u32,
        chunk: u32,
        phase: Phase,
        deps: &[OpId],
        gathered: Option<&[BufId]>,
    ) -> OpId {
        let mut bufs = vec![self.act[&(layer, mb)]];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        let (pdeps, pbufs) = match gathered {
            Some(g) => (vec![], g.to_vec()),
            None => self.params_for(chunk, &[Unit::Layer(layer)], mb, phase),
        };
        bufs.extend(&pbufs);
        let mut d: Vec<OpId> = deps.to_vec();
        d.extend(pdeps);
        let first = self.compute(Piece::AttnIn, phase, mb, chunk, layer, &d, &bufs);
        let mut prev = first;
        for (gather_piece, body) in [(Piece::Attn, Piece::MlpIn), (Piece::Mlp, Piece::LayerOut)] {
            let mut wait = Vec::new();
            if self.sp {
                wait.push(self.tp_coll(TpSite::Gather, gather_piece, phase, mb, chunk, layer, prev));
            }
            let op = self.compute(gather_piece, phase, mb, chunk, layer, &wait, &bufs);
            let mut wait = Vec::new();
            if self.tp {
                wait.push(self.tp_coll(TpSite::Reduce, gather_piece, phase, mb, chunk, layer, op));
            }
            prev = self.compute(body, phase, mb, chunk, layer, &wait, &bufs);
        }
        if gathered.is_none() {
            self.release_gathered(&pbufs, prev);
        }
        first
    }

    fn head_forward(&mut self, chunk: u32, mb: u32) {
        let s = self.s();
        let m = &s.model;
        let p = &s.parallel;
        let sbh = p.micro_batch as u64 * m.seq_len as u64 * m.hidden as u64;
        let logits = 4 * p.micro_batch as u64 * m.seq_len as u64 * (m.vocab as u64).div_ceil(p.tp as u64);
        let norm = 2 * self.dtype().bytes() * if self.sp { sbh / p.tp as u64 } else { sbh };
        let (buf, _) = self.e.alloc(Stream::Compute, &[], BufClass::Activations, norm + logits, format!("head mb{mb}"));
        self.head_buf.insert(mb, buf);
        let units = self.head_units();
        let (pdeps, pbufs) = self.params_for(chunk, &units, mb, Phase::Forward);
        let mut bufs = vec![buf];
        bufs.extend(&pbufs);
        let op = self.compute(Piece::FinalNorm, Phase::Forward, mb, chunk, 0, &pdeps, &bufs);
        let wait: Vec<OpId> = if self.sp {
            vec![self.tp_coll(TpSite::Gather, Piece::Logits, Phase::Forward, mb, chunk, 0, op)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Logits, Phase::Forward, mb, chunk, 0, &wait, &bufs);
        let wait: Vec<OpId> = if self.tp {
            vec![self.tp_coll(TpSite::LossStats, Piece::Loss, Phase::Forward, mb, chunk, 0, op)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Loss, Phase::Forward, mb, chunk, 0, &wait, &bufs);
        self.release_gathered(&pbufs, op);
    }

    /// Units the head's pieces use.
    fn head_units(&self) -> Vec<Unit> {
        let m = &self.s().model;
        let out = if m.tied_embeddings() { Unit::WordEmbedding } else { Unit::OutputLayer };
        vec![Unit::FinalNorm, out]
    }

    /// Backward of (chunk, mb): input gradients, and weight gradients too unless `split`.
    fn backward(&mut self, chunk: u32, mb: u32, split: bool) {
        let vs = self.vstage(chunk);
        let mut deps = Vec::new();
        let mut grad_in = None;
        if vs != self.last_vs {
            let bytes = self.residual_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Pp, &[], BufClass::Activations, bytes, format!("recv grad vs{} mb{mb}", vs + 1));
            let p2p = P2pOp { peer: Peer::Next, kind: P2pKind::Gradient, mb, vstage: vs + 1, bytes };
            deps.push(self.e.op(Stream::Pp, &[], &[buf], OpKind::Recv(p2p)));
            grad_in = Some(buf);
        } else {
            self.head_backward(chunk, mb, split);
        }
        let layers: Vec<u32> = self.layers(chunk).rev().collect();
        for (i, layer) in layers.iter().enumerate() {
            let first = self.layer_backward(*layer, mb, chunk, split, &deps);
            deps.clear();
            if i == 0
                && let Some(b) = grad_in.take()
            {
                self.e.free(Stream::Compute, &[first], b);
            }
        }
        if vs > 0 {
            let bytes = self.residual_bytes();
            let after = self.last_compute.expect("a chunk has layers");
            let (buf, _) =
                self.e.alloc(Stream::Pp, &[after], BufClass::Activations, bytes, format!("send grad vs{vs} mb{mb}"));
            let p2p = P2pOp { peer: Peer::Prev, kind: P2pKind::Gradient, mb, vstage: vs, bytes };
            let send = self.e.op(Stream::Pp, &[after], &[buf], OpKind::Send(p2p));
            self.e.free(Stream::Pp, &[send], buf);
        } else if !split {
            self.embed_backward(chunk, mb);
        }
    }

    fn head_backward(&mut self, chunk: u32, mb: u32, split: bool) {
        let buf = self.head_buf[&mb];
        let units = self.head_units();
        let (pdeps, pbufs) = self.params_for(chunk, &units, mb, Phase::BackwardInput);
        let mut bufs = vec![buf];
        bufs.extend(&pbufs);
        self.touch(chunk, &units, mb);
        let saved = if self.sp && !split {
            let after = self.last_compute.expect("the head's forward ran");
            Some(self.tp_coll(TpSite::GatherSaved, Piece::Logits, Phase::BackwardWeight, mb, chunk, 0, after))
        } else {
            None
        };
        let op = self.compute(Piece::Logits, Phase::BackwardInput, mb, chunk, 0, &pdeps, &bufs);
        let wait: Vec<OpId> = if self.tp {
            vec![self.tp_coll(TpSite::Reduce, Piece::Logits, Phase::BackwardInput, mb, chunk, 0, op)]
        } else {
            vec![]
        };
        if !split {
            self.head_weight(chunk, mb, saved);
        }
        let op = self.compute(Piece::FinalNorm, Phase::BackwardInput, mb, chunk, 0, &wait, &bufs);
        self.release_gathered(&pbufs, op);
        self.unit_done(chunk, Unit::FinalNorm, mb, op);
        if !split {
            let b = self.head_buf.remove(&mb).expect("head buffer");
            self.e.free(Stream::Compute, &[op], b);
        }
    }

    fn head_weight(&mut self, chunk: u32, mb: u32, saved: Option<OpId>) {
        let buf = self.head_buf[&mb];
        let wait: Vec<OpId> = match saved {
            Some(op) => vec![op],
            None if self.sp => {
                let after = self.last_compute.expect("after the head's backward");
                vec![self.tp_coll(TpSite::GatherSaved, Piece::Logits, Phase::BackwardWeight, mb, chunk, 0, after)]
            }
            None => vec![],
        };
        let op = self.compute(Piece::Logits, Phase::BackwardWeight, mb, chunk, 0, &wait, &[buf]);
        let tied = self.s().model.tied_embeddings();
        // With one pipeline stage the tied embedding's gradient is completed by the
        // embedding's own backward, which comes later.
        if !tied || self.s().parallel.pp > 1 {
            self.unit_done(chunk, if tied { Unit::WordEmbedding } else { Unit::OutputLayer }, mb, op);
        }
        // Under ZB the weight half runs last; otherwise FinalNorm's backward frees the buffer.
        if self.s().parallel.schedule.splits_backward() {
            let b = self.head_buf.remove(&mb).expect("head buffer");
            self.e.free(Stream::Compute, &[op], b);
        }
    }

    fn layer_backward(&mut self, layer: u32, mb: u32, chunk: u32, split: bool, deps: &[OpId]) -> OpId {
        let p = self.s().parallel.clone();
        let act = self.act[&(layer, mb)];
        let mut first = None;
        let (pdeps, pbufs) = self.params_for(chunk, &[Unit::Layer(layer)], mb, Phase::BackwardInput);
        if layer > self.layers(chunk).start {
            self.prefetch(chunk, Unit::Layer(layer - 1), mb, Phase::BackwardInput);
        }
        let mut d: Vec<OpId> = deps.to_vec();
        d.extend(pdeps);
        if p.recompute == Recompute::Full {
            let s = self.s();
            let bytes = layer_activation_bytes(
                &s.model,
                p.micro_batch,
                s.training.dtype,
                p.tp,
                p.sequence_parallel,
                Recompute::None,
                s.training.flash_attention,
            )
            .ceil() as u64;
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("recompute L{layer} mb{mb}"));
            self.recompute.insert((layer, mb), buf);
            first = Some(self.layer_forward(layer, mb, chunk, Phase::Recompute, &d, Some(&pbufs)));
            d.clear();
        }
        let mut bufs = vec![act];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        if split {
            // ZB-H1 defers the weight passes: the output gradients they read (of QKV, the
            // attention projection, FC1 and FC2) stay alive until then (freed with the layer).
            let bytes = self.wgrad_bytes();
            let (buf, _) =
                self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("wgrad L{layer} mb{mb}"));
            self.wgrad.insert((layer, mb), buf);
            bufs.push(buf);
        }
        bufs.extend(&pbufs);
        self.touch(chunk, &[Unit::Layer(layer)], mb);
        let op = self.compute(Piece::LayerOut, Phase::BackwardInput, mb, chunk, layer, &d, &bufs);
        let first = first.unwrap_or(op);
        let mut prev = op;
        for (piece, norm) in [(Piece::Mlp, Piece::MlpIn), (Piece::Attn, Piece::AttnIn)] {
            let mut wait = Vec::new();
            let mut scores = None;
            // Selective recomputation re-runs the attention core; fused attention already
            // recomputes its scores inside the backward kernel.
            if piece == Piece::Attn && p.recompute == Recompute::Selective && !self.s().training.flash_attention {
                let s = self.s();
                let bytes = (layer_activation_parts(&s.model, p.micro_batch, s.training.dtype, false).scores
                    / p.tp as f64)
                    .ceil() as u64;
                let (buf, _) =
                    self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, format!("scores L{layer} mb{mb}"));
                let mut b = bufs.clone();
                b.push(buf);
                self.compute(Piece::Attn, Phase::Recompute, mb, chunk, layer, &[], &b);
                scores = Some(buf);
            }
            // Under sequence parallelism the saved input is gathered again for the weight
            // gradient; issued before the input-gradient pass, it overlaps it (Megatron-LM).
            let mut saved = None;
            if self.sp {
                wait.push(self.tp_coll(TpSite::Gather, piece, Phase::BackwardInput, mb, chunk, layer, prev));
                if !split {
                    saved =
                        Some(self.tp_coll(TpSite::GatherSaved, piece, Phase::BackwardWeight, mb, chunk, layer, prev));
                }
            }
            let mut b = bufs.clone();
            b.extend(scores);
            let op = self.compute(piece, Phase::BackwardInput, mb, chunk, layer, &wait, &b);
            if let Some(sb) = scores {
                self.e.free(Stream::Compute, &[op], sb);
            }
            let reduce = if self.tp {
                Some(self.tp_coll(TpSite::Reduce, piece, Phase::BackwardInput, mb, chunk, layer, op))
            } else {
                None
            };
            if !split {
                // The weight gradient overlaps the reduction of the input gradient.
                self.piece_weight(piece, layer, mb, chunk, act, saved);
            }
            prev = self.compute(
                norm,
                Phase::BackwardInput,
                mb,
                chunk,
                layer,
                &reduce.into_iter().collect::<Vec<_>>(),
                &bufs,
            );
        }
        self.release_gathered(&pbufs, prev);
        if !split {
            self.layer_done(layer, mb, chunk, prev);
        }
        first
    }

    /// The weight pass of a piece; `saved` is the gather of its saved input if already issued.
    fn piece_weight(&mut self, piece: Piece, layer: u32, mb: u32, chunk: u32, act: BufId, saved: Option<OpId>) -> OpId {
        let wait: Vec<OpId> = match saved {
            Some(op) => vec![op],
            None if self.sp => {
                let after = self.last_compute.expect("weight pass follows an input pass");
                vec![self.tp_coll(TpSite::GatherSaved, piece, Phase::BackwardWeight, mb, chunk, layer, after)]
            }
            None => vec![],
        };
        let mut bufs = vec![act];
        if let Some(b) = self.recompute.get(&(layer, mb)) {
            bufs.push(*b);
        }
        self.compute(piece, Phase::BackwardWeight, mb, chunk, layer, &wait, &bufs)
    }

    /// A layer's backward is complete: free its activations, mark its gradient done.
    fn layer_done(&mut self, layer: u32, mb: u32, chunk: u32, last: OpId) {
        let act = self.act.remove(&(layer, mb)).expect("activation buffer of the layer");
        self.e.free(Stream::Compute, &[last], act);
        if let Some(b) = self.wgrad.remove(&(layer, mb)) {
            self.e.free(Stream::Compute, &[last], b);
        }
        if let Some(b) = self.recompute.remove(&(layer, mb)) {
            self.e.free(Stream::Compute, &[last], b);
        }
        self.unit_done(chunk, Unit::Layer(layer), mb, last);
    }

    /// ZB's W pass of (chunk, mb).
    fn backward_weight(&mut self, chunk: u32, mb: u32) {
        let vs = self.vstage(chunk);
        if vs == self.last_vs {
            self.head_weight(chunk, mb, None);
        }
        let layers: Vec<u32> = self.layers(chunk).rev().collect();
        for layer in layers {
            let act = self.act[&(layer, mb)];
            self.piece_weight(Piece::Mlp, layer, mb, chunk, act, None);
            let op = self.piece_weight(Piece::Attn, layer, mb, chunk, act, None);
            self.layer_done(layer, mb, chunk, op);
        }
        if vs == 0 {
            self.embed_backward(chunk, mb);
        }
    }

    fn embed_backward(&mut self, chunk: u32, mb: u32) {
        let buf = self.embed_buf.remove(&mb).expect("embedding buffer");
        let mut units = vec![Unit::WordEmbedding];
        if self.s().model.learned_positions() {
            units.push(Unit::PosEmbedding);
        }
        self.touch(chunk, &units, mb);
        let wait: Vec<OpId> = if self.sp {
            let after = self.last_compute.expect("after the first layer's backward");
            vec![self.tp_coll(TpSite::Gather, Piece::Embed, Phase::BackwardWeight, mb, chunk, 0, after)]
        } else {
            vec![]
        };
        let op = self.compute(Piece::Embed, Phase::BackwardWeight, mb, chunk, 0, &wait, &[buf]);
        self.e.free(Stream::Compute, &[op], buf);
        for u in units {
            self.unit_done(chunk, u, mb, op);
        }
    }

    /// First gradient work on some units in this microbatch: ZeRO-2/3 need their bucket's
    /// full-gradient buffer.
    fn touch(&mut self, chunk: u32, units: &[Unit], mb: u32) {
        if self.zero() < 2 {
            return;
        }
        for u in units {
            let Some(&b) = self.unit_bucket.get(&(chunk, *u)) else { continue };
            if !self.bucket_state[b].full_grad.contains_key(&mb) {
                let bk = &self.buckets()[b];
                let bytes = bk.params * state_bytes_per_param(self.dtype()).1;
                let name = format!("grad bucket c{} b{} mb{mb}", bk.chunk, bk.index);
                // One full-gradient buffer per bucket at a time, as DeepSpeed's and
                // Megatron-LM's buckets are reused: a microbatch's waits until the previous
                // one's reduction is done, so a rank that runs ahead of its data-parallel
                // peers cannot pile up a buffer per microbatch.
                let after: Vec<OpId> = self.bucket_state[b].last_reduce.into_iter().collect();
                let (buf, _) = self.e.alloc(Stream::Compute, &after, BufClass::Grads, bytes, name);
                self.bucket_state[b].full_grad.insert(mb, buf);
            }
        }
    }

    /// A unit's gradient for this microbatch is complete after `op`.
    fn unit_done(&mut self, chunk: u32, unit: Unit, mb: u32, op: OpId) {
        let Some(&b) = self.unit_bucket.get(&(chunk, unit)) else { return };
        let st = &mut self.bucket_state[b];
        let done = st.done.entry(mb).or_default();
        done.push(op);
        let bucket = &self.pl.buckets[self.stage as usize][b];
        if done.len() < bucket.units.len() {
            return;
        }
        let deps = st.done.remove(&mb).expect("just filled");
        let full = st.full_grad.remove(&mb);
        // Every schedule runs a chunk's backwards in microbatch order, so m − 1 is the last.
        let last = mb + 1 == self.s().parallel.microbatches();
        let zero = self.zero();
        if zero >= 2 || last {
            if !self.s().parallel.overlap_grad_reduce && zero < 2 {
                self.deferred_grad_reduce.push((b, mb, deps));
            } else {
                let op = self.grad_reduce(b, mb, &deps, full);
                if !self.s().parallel.overlap_grad_reduce {
                    // Without overlap the next compute waits for the reduction.
                    self.pending_sync.push(op);
                }
            }
        }
    }

    fn grad_reduce(&mut self, b: usize, mb: u32, deps: &[OpId], full: Option<BufId>) -> OpId {
        let bk = &self.pl.buckets[self.stage as usize][b];
        let bytes = bk.params * state_bytes_per_param(self.dtype()).1;
        let kind = if self.zero() == 0 { CollKind::AllReduce } else { CollKind::ReduceScatter };
        let purpose = CollPurpose::GradBucket { chunk: bk.chunk, bucket: bk.index, mb };
        let grads = self.persistent[bk.chunk as usize * 3 + 1];
        let mut bufs = vec![grads];
        bufs.extend(full);
        let op = self.collective(Stream::Dp, deps, &bufs, kind, GroupKind::Dp, bytes, purpose);
        if let Some(f) = full {
            self.e.free(Stream::Dp, &[op], f);
            self.bucket_state[b].last_reduce = Some(op);
        }
        self.dp_ops.push(op);
        op
    }

    fn end_of_step(&mut self) {
        let p = self.s().parallel.clone();
        let last_compute = self.last_compute.expect("a step computes");
        for (b, mb, deps) in std::mem::take(&mut self.deferred_grad_reduce) {
            let mut d = deps;
            d.push(last_compute);
            self.grad_reduce(b, mb, &d, None);
        }
        let mut sync: Vec<OpId> = self.dp_ops.clone();
        sync.push(last_compute);
        // Tied embeddings: sum the two copies' gradients (the ZeRO shard of them).
        let m = &self.s().model;
        if m.tied_embeddings() && p.pp > 1 && (self.stage == 0 || self.stage == p.pp - 1) {
            let rows = unit_params(self.s(), Unit::WordEmbedding);
            let rows = if p.zero >= 1 { rows.div_ceil(p.dp as u64) } else { rows };
            let bytes = rows * state_bytes_per_param(self.dtype()).1;
            let grads = self.persistent[if self.stage == 0 { 1 } else { (p.vpp as usize - 1) * 3 + 1 }];
            let op = self.collective(
                Stream::Dp,
                &sync,
                &[grads],
                CollKind::AllReduce,
                GroupKind::Embedding,
                bytes,
                CollPurpose::TiedEmbeddingGrad,
            );
            sync.push(op);
        }
        // Sequence parallelism leaves the replicated tensors' gradients partial per tp rank.
        if p.sequence_parallel && p.tp > 1 {
            let m = &self.s().model;
            let per_layer = layer_params(m).replicated;
            let mut params: u64 = (0..p.vpp).map(|c| self.layers(c).len() as u64 * per_layer).sum();
            if self.stage == p.pp - 1 {
                params += m.norm_params();
            }
            let owned = if p.zero >= 1 { params.div_ceil(p.dp as u64) } else { params };
            let bytes = owned * state_bytes_per_param(self.dtype()).1;
            let grads: Vec<BufId> = (0..p.vpp as usize).map(|c| self.persistent[c * 3 + 1]).collect();
            let op = self.collective(
                Stream::Tp,
                &sync,
                &grads,
                CollKind::AllReduce,
                GroupKind::Tp,
                bytes,
                CollPurpose::SpReplicatedGrads,
            );
            sync.push(op);
        }
        if self.s().training.grad_clip > 0.0 {
            let op = self.collective(
                Stream::Dp,
                &sync,
                &[],
                CollKind::AllReduce,
                GroupKind::World,
                4,
                CollPurpose::GradNorm,
            );
            sync.push(op);
        }
        let cost = self.pl.optimizer_cost(self.stage);
        let op = ComputeOp { piece: Piece::Optimizer, phase: Phase::Step, mb: 0, chunk: 0, layer: 0, cost };
        let bufs = self.persistent.clone();
        let step = self.e.op(Stream::Compute, &sync, &bufs, OpKind::Compute(op));
        self.last_compute = Some(step);
        if (1..=2).contains(&p.zero) && !p.overlap_param_gather {
            for i in 0..self.buckets().len() {
                self.param_bucket_gather(i, &[step]);
            }
        }
    }
}
