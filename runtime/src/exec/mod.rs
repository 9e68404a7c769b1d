//! The plan interpreter: one rank runs its program of a lowered [`Plan`], for real.
//!
//! A rank takes `plan.program(rank)` and executes it with the IR's semantics
//! (`strata_models::plan::ir`): `Compute` ops run the model piece (`compute.rs`),
//! collectives and sends/receives go to the communicator (`coll.rs`), `Alloc`/`Free` open
//! and drop the storage of a plan buffer ([`pool`]).
//!
//! **Streams on one thread.** The four streams of a rank run on its one thread in the
//! executor's round (`engine.rs`, [`strata_models::plan::exec::Turn`]): one compute op,
//! then every communication op that may start is posted, then every posted op whose data
//! arrived is finished. Which ops may start — gates, deps, posted frees — is decided by the
//! plan's shared execution semantics ([`strata_models::plan::exec::Cursor`]), the same
//! state machine the verifier and the simulator drive. Collectives and receives are
//! *posted* (non-blocking), so a rank never sits in a receive while another of its streams
//! could move: whatever order the verifier proved deadlock-free for concurrent streams is
//! also deadlock-free here. A send is done when its receiver acknowledges taking the
//! message; a `Free` takes effect when its deps are done. Compute runs to completion when
//! started.
//!
//! **What each ZeRO stage really holds** (per unit: a layer, a table, the final norm):
//! ZeRO-0 full parameters, gradients and optimizer state, buckets all-reduced; ZeRO-1 the
//! optimizer state of the owned part of each bucket only, buckets reduce-scattered into it
//! and the updated parts all-gathered (`ParamBucket`); ZeRO-2 also only the owned part of
//! the gradients, with a transient full bucket per microbatch reduce-scattered at once;
//! ZeRO-3 also only the owned part of the parameters, each unit all-gathered into a
//! transient buffer before a piece uses it (`ParamGather`) and dropped after.
//!
//! **Mixture-of-experts layers** (`moe.rs`). A MoE layer's attention, norms, router gate
//! and shared experts are its `Unit::Layer`, replicated over the data-parallel group like a
//! dense layer; its E/ep routed experts are `Unit::Experts`, held whole by each rank of
//! the expert-parallel group (`Ep`, ep consecutive ranks of a stage, carved from its
//! data-parallel ranks) and replicated over the expert-data-parallel group (`ExpertDp`,
//! the ranks holding the same experts). Expert buckets follow the same ZeRO stages over
//! `ExpertDp` instead of `Dp`: ZeRO-0 all-reduces them, ZeRO-1 reduce-scatters into the
//! owned part and all-gathers it after the step, ZeRO-2 keeps only the owned gradient
//! (`ExpertGradBucket`, `ParamBucket` on `ExpertDp`); ZeRO-3 with experts is refused by
//! the plan's rules. The gradient norm counts each expert once: under ZeRO-0 on
//! expert-dp rank 0 only, under ZeRO ≥ 1 each owner its part. The dispatch and combine
//! are all-to-all-v's on `Ep` whose counts the router decides (the plan's bytes are the
//! balanced expectation); the tokens an ep rank routes come from its own data-parallel
//! replica, so the loss and gradient scale below hold unchanged.
//!
//! **Sequence-parallel replicated gradients.** Under sequence parallelism each tp rank's
//! gradients of replicated tensors (LayerNorms, the row-parallel biases, the final norm)
//! are partial sums over its rows; the plan's `SpReplicatedGrads` all-reduce sums them over
//! the tp group once per step, on the owned gradients, before the gradient norm. The
//! position table is excluded: its gradient comes from the gathered full gradient and is
//! already complete on every rank.
//!
//! **Loss and gradient scale.** Microbatch k of data-parallel replica d in step n reads
//! batch (n·dp + d)·m + k of the corpus, so the global batch is the one a single rank
//! reads with dp·m microbatches. The loss gradient is scaled by 1/(m·dp·b·s) and the
//! data-parallel reductions sum, so every split computes the single rank's mean gradient.
//! With context parallelism the cp ranks of a replica read the same batch and keep
//! chunks r and 2·cp − 1 − r of each sequence (b·s/cp tokens, at their original
//! positions); each reports the mean loss over its tokens (the trainer averages the
//! m·dp·cp means, equal token counts), and the gradients reduce over the cp·dp ranks of
//! the data-parallel group, which ZeRO also shards over (`cp.rs`).

mod coll;
mod compute;
pub mod cp;
mod engine;
mod finite;
mod memory;
mod moe;
pub mod pool;
pub mod units;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use strata_models::Recompute;
use strata_models::plan::exec::ProgramGraph;
use strata_models::plan::{BufId, Coord, GroupKind, Plan, Unit};
use strata_models::trace::{MemSample, Span};
use thiserror::Error;

use crate::comm::CommError;
use crate::comm::collective::{Group, Mailbox};
use crate::data::{Batch, Corpus};
use crate::error::RuntimeError;
use crate::head::HeadActs;
use crate::layer::LayerActs;
use crate::micro::Micro;
use crate::optim::{AdamW, AdamWConfig, ZeroShard};
use crate::params::ParamLayout;
use pool::{BufKey, Pool};
use units::{BucketInfo, UnitVecs, read_segment, split_units};

/// Why a rank stopped.
#[derive(Debug, Error)]
pub enum ExecError {
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Nothing moved for the receive timeout.
    #[error("rank {rank} made no progress for {secs:.0} s in step {step}; waiting for: {waiting}")]
    Stalled { rank: u32, step: u32, secs: f64, waiting: String },
}

/// Settings of a rank's execution that are not in the plan.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// Give up when nothing moved for this long (a peer died without a word).
    pub recv_timeout: Duration,
    /// Record spans and memory samples (the measured trace) of this step.
    pub trace_step: Option<u32>,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig { recv_timeout: Duration::from_secs(120), trace_step: None }
    }
}

/// A tensor passed between the pieces of one microbatch (`workspace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum T {
    /// The residual stream (Tl, h).
    R,
    /// A piece's input as its rank holds it: a, m or hn (Tl, h).
    X,
    /// The same, all-gathered (T, h) (sequence parallelism).
    XFull,
    /// A partial output before its tensor-parallel reduction.
    Out,
    /// The reduced output.
    Red,
    /// The residual gradient (Tl, h).
    Dr,
    /// The residual gradient all-gathered (T, h).
    DFull,
    /// A partial input gradient before its reduction.
    DPart,
    /// The reduced input gradient.
    DRed,
    /// A saved input gathered again for a weight gradient.
    Saved,
    /// Per-token loss statistics (T, 3), and gathered over tp (t, T, 3).
    Stats,
    StatsAll,
    /// A MoE layer's routed input gradient under tensor parallelism (Tl, h), which
    /// `MlpIn`'s backward adds to the shared experts' reduced one.
    MoeDx,
}

/// One model chunk on this rank.
pub(crate) struct Chunk {
    pub(crate) layout: ParamLayout,
    pub(crate) buckets: Vec<BucketInfo>,
    /// Full parameters per unit (ZeRO 0–2).
    pub(crate) params: UnitVecs,
    /// ZeRO-3: the owned part of each bucket's parameters, by bucket position.
    pub(crate) param_shards: Vec<Vec<f32>>,
    /// Full gradients per unit (ZeRO 0–1).
    pub(crate) grads: UnitVecs,
    /// ZeRO-2/3: the owned part of each bucket's reduced gradient, by bucket position.
    pub(crate) grad_shards: Vec<Vec<f32>>,
    /// AdamW over each owned piece, with where it sits.
    pub(crate) opt: Vec<OptPiece>,
}

/// An owned, contiguous piece of one unit, stepped by one AdamW.
pub(crate) struct OptPiece {
    /// Position of the bucket in `Chunk::buckets`.
    pub(crate) bucket: usize,
    pub(crate) unit: Unit,
    /// Range inside the unit.
    pub(crate) in_unit: std::ops::Range<usize>,
    /// Range inside the bucket's owned part (ZeRO shards).
    pub(crate) in_shard: std::ops::Range<usize>,
    pub(crate) adamw: AdamW,
}

/// What one step of one rank produced.
#[derive(Clone, Debug, Default)]
pub struct StepReport {
    pub step: u32,
    /// Σ over this rank's microbatches of their mean loss, if this rank reports the loss
    /// (tp rank 0 of the last stage); `None` otherwise.
    pub loss_sum: Option<f64>,
    /// The global gradient norm before clipping (when clipping is on).
    pub grad_norm: Option<f64>,
    /// A gradient this rank found non-finite at the optimizer step (the tensor's name and
    /// the value); the step then left every parameter as it was.
    pub nonfinite_grad: Option<(String, f64)>,
    pub spans: Vec<Span>,
    pub memory: Vec<MemSample>,
    /// The traced step's CPU time (where the platform reports thread CPU time).
    pub cpu: Option<StepCpu>,
}

/// Where a rank's thread spent its CPU time in the traced step: each op's own work (a
/// compute op's run; a communication's post and its completion; bookkeeping), and the
/// whole step, whose remainder is the interpreter's loop — noticing messages, checking
/// what can start or finish, measuring memory.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepCpu {
    /// Thread CPU time of the whole step, ns.
    pub step_ns: u64,
    /// (op, CPU ns of its own work), every op of the program once.
    pub ops: Vec<(u32, u64)>,
    /// Messages the rank received during the step.
    pub messages: u64,
}

/// Peak bytes of one rank, measured and predicted, at the same instants.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MemoryPeaks {
    /// Peak of everything measured (plan buffers + workspace + comm).
    pub measured_bytes: u64,
    /// Peak of the plan buffers' measured bytes only.
    pub measured_plan_bytes: u64,
    /// Peak of the plan's predicted bytes of the live buffers.
    pub predicted_bytes: u64,
    /// Peak measured bytes per class (`params`, `grads`, …, `workspace`, `comm`).
    pub by_class: BTreeMap<String, u64>,
    /// Peak predicted bytes per class of the plan's buffers.
    pub predicted_by_class: BTreeMap<String, u64>,
    /// The CUDA executor: `measured_bytes − predicted_bytes`, term by term, each named
    /// (`cuda::exec::overhead`; its values sum to the difference). Empty on CPU.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overhead_bytes: BTreeMap<String, i64>,
}

/// One rank of a job: its state and its program.
pub struct RankExec {
    pub(crate) plan: Arc<Plan>,
    pub(crate) rank: u32,
    pub(crate) coord: Coord,
    cfg: ExecConfig,
    micro: Micro,
    m: u32,
    tp: usize,
    sp: bool,
    pub(crate) zero: u8,
    recompute: Recompute,
    flash: bool,
    grad_scale: f32,
    pub(crate) adamw: AdamWConfig,
    base_lr: f32,
    warmup: u32,
    clip: f32,
    pub(crate) chunks: Vec<Chunk>,
    groups: BTreeMap<GroupKind, Group>,
    pub(crate) mailbox: Mailbox,
    pool: Pool,
    live_keys: BTreeSet<BufKey>,
    corpus: Arc<Corpus>,
    // Storage bound to plan buffers.
    acts: BTreeMap<(u32, u32), LayerActs>,
    rc_acts: BTreeMap<(u32, u32), LayerActs>,
    heads: BTreeMap<u32, HeadActs>,
    msgs: BTreeMap<BufKey, Vec<f32>>,
    msg_held: BTreeMap<BufKey, usize>,
    gathered: BTreeMap<BufId, UnitVecs>,
    grad_buckets: BTreeMap<(u32, u32, u32), UnitVecs>,
    flight: BTreeMap<(u32, u32, T), Vec<f32>>,
    batches: Vec<Batch>,
    /// Context-parallel ranks (1 without) and the original positions of this rank's rows
    /// of a sequence ([`crate::attention_cp::cp_positions`]).
    cp: usize,
    positions: Vec<u32>,
    /// Context parallelism: the storage of the exchange buffers (`cp ROLE L.. mb..`) and
    /// the tensors between the attention pieces.
    cp_store: BTreeMap<(u32, u32, cp::CpRole), Vec<f32>>,
    cp_work: BTreeMap<(u32, u32), cp::CpWork>,
    /// A MoE layer's MLP state per (layer, mb), between its ops (`moe.rs`).
    moe: BTreeMap<(u32, u32), moe::MoeState>,
    // Per step.
    step: u32,
    loss_sum: f64,
    grad_norm: Option<f64>,
    /// The first gradient found non-finite at the optimizer step (its name and value).
    nonfinite_grad: Option<(String, f64)>,
    clip_scale: f32,
    // Measurement.
    peaks: MemoryPeaks,
    last_total: u64,
    /// The rank's program compiled for the shared execution semantics.
    graph: Arc<ProgramGraph>,
    /// Fault injection of a slow rank: each compute op is followed by a sleep of
    /// (factor − 1) × its measured duration (1: none; see [`RankExec::slow_compute`]).
    compute_slowdown: f64,
    /// The sleep a slow rank still owes, seconds (negative: it overslept).
    slow_debt_s: f64,
}

/// A slow rank sleeps once it owes this much (see `RankExec::slow_down`).
const SLOW_SLEEP_MIN: Duration = Duration::from_millis(1);

impl RankExec {
    /// Builds rank `rank` of `plan`: its layouts, buckets and freshly initialised state
    /// (seeded from the scenario, identical for every split).
    pub fn new(
        plan: Arc<Plan>,
        rank: u32,
        mailbox: Mailbox,
        corpus: Arc<Corpus>,
        cfg: ExecConfig,
    ) -> Result<RankExec, RuntimeError> {
        let s = &plan.scenario;
        let p = &s.parallel;
        let grid = plan.grid;
        if rank >= grid.ranks() || mailbox.size() != grid.ranks() || mailbox.rank() != rank {
            return Err(RuntimeError::BadSetting(format!(
                "rank {rank} with a communicator of {} ranks (rank {}) for a plan of {} = {grid} ranks",
                mailbox.size(),
                mailbox.rank(),
                grid.ranks()
            )));
        }
        if corpus.vocab() > s.model.vocab as usize {
            return Err(RuntimeError::BadSetting(format!(
                "the training data has {} token ids but model.vocab = {}; use a model with vocab ≥ {}",
                corpus.vocab(),
                s.model.vocab,
                corpus.vocab()
            )));
        }
        if p.cp > 1 && s.model.family == strata_models::Family::Llama {
            return Err(RuntimeError::UnsupportedModel {
                model: s.model.name.clone(),
                reason: format!(
                    "parallel.cp = {} with model.family = Llama: the context-parallel attention pieces run GPT blocks only (rotary positions and grouped-query attention under cp are not implemented); use cp = 1",
                    p.cp
                ),
            });
        }
        let graph =
            Arc::new(ProgramGraph::new(plan.program(rank)).map_err(|e| {
                RuntimeError::BadSetting(format!("the plan's program for rank {rank} cannot run: {e}"))
            })?);
        let coord = grid.coord(rank);
        // Under context parallelism a rank holds s/cp tokens of each sequence (its two
        // load-balanced chunks, in that order, `load_batches`).
        let cp = p.cp.max(1) as usize;
        let micro = Micro { batch: p.micro_batch as usize, seq: s.model.seq_len as usize / cp };
        let positions = crate::attention_cp::cp_positions(s.model.seq_len as usize, cp, coord.cp as usize);
        // Lowering checked that tp divides seq_len under sequence parallelism.
        let sp = plan.sequence_parallel();
        debug_assert!(
            !sp || micro.tokens().is_multiple_of(p.tp as usize),
            "{} tokens over tp = {}",
            micro.tokens(),
            p.tp
        );
        let seed = s.training.seed;
        // The stage the framework runs (DeepSpeed's BF16_Optimizer partitions at stage 0 under a pipeline).
        let zero = s.zero_stage();
        let chunks = units::chunk_layouts(&plan, rank)?
            .into_iter()
            .map(|(layout, buckets)| new_chunk(layout, buckets, seed, zero))
            .collect();
        use GroupKind::{Cp, Dp, Embedding, Ep, ExpertDp, Tp, World};
        let groups = [Tp, Dp, Cp, Ep, ExpertDp, Embedding, World]
            .into_iter()
            .map(|k| {
                let g = Group { kind: k, members: grid.group(rank, k), position: grid.position(rank, k) as usize };
                (k, g)
            })
            .collect();
        let t = &s.training;
        let m = p.microbatches();
        // Lowering validated the scenario: lr is positive and finite, grad_clip non-negative.
        let adamw = AdamWConfig { lr: t.lr as f32, weight_decay: t.weight_decay as f32, ..AdamWConfig::default() };
        debug_assert!(
            t.lr > 0.0 && t.lr.is_finite() && t.grad_clip >= 0.0,
            "lr = {}, grad_clip = {}",
            t.lr,
            t.grad_clip
        );
        Ok(RankExec {
            coord,
            cfg,
            micro,
            m,
            tp: p.tp as usize,
            sp,
            zero,
            recompute: p.recompute,
            flash: t.flash_attention,
            grad_scale: 1.0 / (m as usize * p.dp as usize * cp * micro.tokens()) as f32,
            base_lr: adamw.lr,
            adamw,
            warmup: t.warmup_steps,
            clip: t.grad_clip as f32,
            chunks,
            groups,
            mailbox,
            pool: Pool::default(),
            live_keys: BTreeSet::new(),
            corpus,
            acts: BTreeMap::new(),
            rc_acts: BTreeMap::new(),
            heads: BTreeMap::new(),
            msgs: BTreeMap::new(),
            msg_held: BTreeMap::new(),
            gathered: BTreeMap::new(),
            grad_buckets: BTreeMap::new(),
            flight: BTreeMap::new(),
            batches: Vec::new(),
            cp,
            positions,
            cp_store: BTreeMap::new(),
            cp_work: BTreeMap::new(),
            moe: BTreeMap::new(),
            step: 0,
            loss_sum: 0.0,
            grad_norm: None,
            nonfinite_grad: None,
            clip_scale: 1.0,
            peaks: MemoryPeaks::default(),
            last_total: u64::MAX,
            graph,
            compute_slowdown: 1.0,
            slow_debt_s: 0.0,
            plan,
            rank,
        })
    }

    /// Makes this rank's compute `factor` times slower (fault injection of a straggler):
    /// after its compute ops it sleeps (factor − 1) × their measured duration, holding its
    /// compute stream, so that partners that wait on its results wait longer. The sleep
    /// is inside the ops' spans in a measured trace. `factor` ≥ 1 (the caller checks).
    pub fn slow_compute(&mut self, factor: f64) {
        debug_assert!(factor >= 1.0 && factor.is_finite(), "slowdown {factor}");
        self.compute_slowdown = factor;
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Peak memory so far.
    pub fn peaks(&self) -> &MemoryPeaks {
        &self.peaks
    }

    /// The learning rate of step `step`: linear warm-up to the peak over `warmup_steps`.
    pub fn lr_at(&self, step: u32) -> f32 {
        if self.warmup == 0 {
            self.base_lr
        } else {
            self.base_lr * ((step + 1).min(self.warmup) as f32 / self.warmup as f32)
        }
    }

    /// Whether this rank reports the loss: tp rank 0 of the last pipeline stage.
    pub fn reports_loss(&self) -> bool {
        let g = self.plan.grid;
        self.coord.pp == g.pp - 1 && self.coord.tp == 0
    }

    fn vstage(&self, chunk: u32) -> u32 {
        self.plan.pipeline().vstage(chunk, self.coord.pp)
    }

    /// This rank's rows of a (T, h)-shaped buffer of `len` elements (sequence parallelism).
    fn my_rows(&self, len: usize) -> std::ops::Range<usize> {
        let per = len / self.tp;
        self.coord.tp as usize * per..(self.coord.tp as usize + 1) * per
    }

    // ---- flight tensors ---------------------------------------------------------------

    fn put(&mut self, chunk: u32, mb: u32, t: T, v: Vec<f32>) {
        let old = self.flight.insert((chunk, mb, t), v);
        assert!(old.is_none(), "rank {}: {t:?} of chunk {chunk} mb {mb} produced twice", self.rank);
    }

    fn take(&mut self, chunk: u32, mb: u32, t: T) -> Vec<f32> {
        self.flight.remove(&(chunk, mb, t)).unwrap_or_else(|| {
            panic!("rank {}: {t:?} of chunk {chunk} mb {mb} is needed but no earlier op produced it", self.rank)
        })
    }

    fn has(&self, chunk: u32, mb: u32, t: T) -> bool {
        self.flight.contains_key(&(chunk, mb, t))
    }

    /// Where a partial output lands before the consumer takes it: reduced, or as is at t = 1.
    fn reduced(&self, partial: T) -> T {
        match (partial, self.tp > 1) {
            (T::Out, true) => T::Red,
            (T::DPart, true) => T::DRed,
            (T::Stats, true) => T::StatsAll,
            (t, _) => t,
        }
    }

    /// Where a piece input is read: gathered under sequence parallelism.
    fn gathered_input(&self) -> T {
        if self.sp { T::XFull } else { T::X }
    }

    // ---- parameters and gradients -----------------------------------------------------

    fn bucket_of(&self, chunk: u32, unit: Unit) -> usize {
        self.chunks[chunk as usize]
            .buckets
            .iter()
            .position(|b| b.units.iter().any(|(u, _)| *u == unit))
            .unwrap_or_else(|| panic!("unit {unit:?} is in no bucket of chunk {chunk}"))
    }

    /// The parameters of `unit`: held (ZeRO 0–2), or gathered into one of `bufs` (ZeRO-3).
    fn param_unit(&self, chunk: u32, unit: Unit, bufs: &[BufId]) -> &[f32] {
        if self.zero < 3 {
            return &self.chunks[chunk as usize].params[&unit];
        }
        bufs.iter()
            .filter_map(|b| self.gathered.get(b))
            .find_map(|g| g.get(&unit))
            .unwrap_or_else(|| panic!("rank {}: unit {unit:?} of chunk {chunk} is used but not gathered", self.rank))
    }

    /// Takes out the gradient accumulator of `unit` for microbatch `mb` (ZeRO-2/3 keep one
    /// per microbatch); give it back with [`RankExec::put_grad`].
    fn take_grad(&mut self, chunk: u32, unit: Unit, mb: u32) -> Vec<f32> {
        if self.zero < 2 {
            return self.chunks[chunk as usize].grads.remove(&unit).expect("gradients of a held unit");
        }
        let b = self.chunks[chunk as usize].buckets[self.bucket_of(chunk, unit)].index;
        self.grad_buckets
            .get_mut(&(chunk, b, mb))
            .and_then(|g| g.remove(&unit))
            .unwrap_or_else(|| panic!("rank {}: no gradient bucket for {unit:?} of chunk {chunk} mb {mb}", self.rank))
    }

    fn put_grad(&mut self, chunk: u32, unit: Unit, mb: u32, g: Vec<f32>) {
        if self.zero < 2 {
            self.chunks[chunk as usize].grads.insert(unit, g);
        } else {
            let b = self.chunks[chunk as usize].buckets[self.bucket_of(chunk, unit)].index;
            self.grad_buckets.get_mut(&(chunk, b, mb)).expect("taken from here").insert(unit, g);
        }
    }

    fn batch(&self, mb: u32) -> &Batch {
        &self.batches[mb as usize]
    }

    /// Loads this replica's microbatches of step `step` (under context parallelism the
    /// rows of this rank's two chunks of each sequence).
    fn load_batches(&mut self, step: u32) -> Result<(), RuntimeError> {
        let (dp, d, m) = (self.plan.grid.dp as u64, self.coord.dp as u64, self.m as u64);
        let full = Micro { seq: self.micro.seq * self.cp, ..self.micro };
        self.batches =
            (0..m).map(|k| self.corpus.batch((step as u64 * dp + d) * m + k, full)).collect::<Result<Vec<_>, _>>()?;
        if self.cp > 1 {
            let rows = |x: &[u32]| -> Vec<u32> {
                x.chunks_exact(full.seq).flat_map(|s| self.positions.iter().map(|&p| s[p as usize])).collect()
            };
            for b in &mut self.batches {
                *b = Batch { micro: self.micro, inputs: rows(&b.inputs), targets: rows(&b.targets) };
            }
        }
        for b in &self.batches {
            crate::embed::check_tokens(&b.inputs, self.plan.vocab() as usize)?;
        }
        Ok(())
    }
}

/// A chunk's freshly initialised state under ZeRO stage `zero`.
fn new_chunk(layout: ParamLayout, buckets: Vec<BucketInfo>, seed: u64, zero: u8) -> Chunk {
    let flat = layout.init(seed);
    let full = split_units(&buckets, &flat);
    let zeros = |u: &UnitVecs| u.iter().map(|(k, v)| (*k, vec![0.0; v.len()])).collect::<UnitVecs>();
    let mut opt = Vec::new();
    for (bi, b) in buckets.iter().enumerate() {
        let mut at = 0;
        for (unit, in_unit) in b.pieces(b.owned.clone()) {
            let n = in_unit.len();
            let offset = b.unit_offset(unit) + in_unit.start;
            opt.push(OptPiece {
                bucket: bi,
                unit,
                in_unit,
                in_shard: at..at + n,
                adamw: AdamW::new(ZeroShard { offset, size: n }),
            });
            at += n;
        }
    }
    let shards = |src: &UnitVecs| buckets.iter().map(|b| read_segment(b, src, b.owned.clone())).collect::<Vec<_>>();
    let (params, param_shards) = if zero >= 3 { (UnitVecs::new(), shards(&full)) } else { (full.clone(), Vec::new()) };
    let (grads, grad_shards) = if zero >= 2 {
        (UnitVecs::new(), buckets.iter().map(|b| vec![0.0; b.owned.len()]).collect())
    } else {
        (zeros(&full), Vec::new())
    };
    Chunk { layout, buckets, params, param_shards, grads, grad_shards, opt }
}
