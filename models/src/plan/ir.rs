//! The plan IR: one training step, rank by rank, as ordered ops on streams.
//!
//! This is the contract between `models` (which lowers a scenario to a plan), `sim` (which
//! costs it) and `runtime` (which executes it). A [`Program`] is the op list of one rank.
//! Groups and peers are *relative* (the rank's TP group, its next pipeline stage), so every
//! rank of a pipeline stage runs the same program: a plan stores one program per stage, not
//! one per rank.
//!
//! Execution semantics (both backends implement exactly these):
//! - ops of one [`Stream`] start in program order, each after the previous op of its stream
//!   is done and after every op in its `deps` is done;
//! - `Compute`, `Alloc` take time (or none) and then are done;
//! - a `Collective` starts when every member of its group has reached it (members issue the
//!   same sequence of collectives on a group) and is done when the transfer ends;
//! - a `Send` only *posts* its message: the next op of its stream may start at once; the
//!   send is done when the message is delivered, which starts when the matching `Recv` (same
//!   peer, kind, microbatch, virtual stage) is posted too; a `Recv` is done on delivery;
//! - a `Free` never holds up its stream: it is posted when its stream reaches it (the op
//!   before it has started) and takes effect (is done) when every op in its `deps` is done.
//!
//! Conventions:
//! - bytes of a collective follow nccl-tests: the total buffer S (for all-gather and
//!   reduce-scatter, the per-rank count × group size);
//! - FLOPs are counted as 2·m·n·k per GEMM;
//! - buffer sizes are per rank, in bytes.
//!
//! Everything here is plain serde data; a plan saved as JSON loads back equal.

use serde::{Deserialize, Serialize};

use crate::scenario::Dtype;

/// Index of an op within its program.
pub type OpId = u32;
/// Index of a buffer within its program.
pub type BufId = u32;
/// Index into [`crate::plan::Plan::costs`].
pub type CostId = u32;

/// Where an op runs on its rank. Each stream is an in-order queue (a CUDA stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stream {
    Compute,
    /// Tensor-parallel collectives.
    Tp,
    /// Data-parallel (and ZeRO, embedding-group, world) collectives.
    Dp,
    /// Pipeline sends and receives.
    Pp,
}

impl Stream {
    pub const ALL: [Stream; 4] = [Stream::Compute, Stream::Tp, Stream::Dp, Stream::Pp];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn key(self) -> &'static str {
        match self {
            Stream::Compute => "compute",
            Stream::Tp => "tp",
            Stream::Dp => "dp",
            Stream::Pp => "pp",
        }
    }
}

/// A piece of the model: the unit a `Compute` op runs. Per transformer layer, in forward
/// order: `AttnIn` (a = LN1(r)), `Attn` (QKV, attention core, output projection; partial
/// sum under TP), `MlpIn` (r += attention output; m = LN2(r)), `Mlp` (FC1, activation, FC2;
/// partial sum under TP), `LayerOut` (r += MLP output). Around the layers: `Embed` on the
/// first stage, `FinalNorm`, `Logits` (output layer and per-token loss statistics) and
/// `Loss` on the last, and the `Optimizer` step.
///
/// With context parallelism (cp > 1) `Attn` is split around the exchange of keys and
/// values: `AttnQkv` (the QKV projection and rotary positions of the rank's sequence
/// chunks), `AttnCore` (softmax attention; under ring attention one op per ring step,
/// `ComputeOp::step` = 0 … cp − 1, step i attending to the K/V chunks received i steps
/// earlier, the last merging the partial results), `AttnProj` (the output projection;
/// partial sum under TP).
///
/// In a mixture-of-experts layer `Mlp` is replaced by `Router` (the gate GEMM, scores,
/// top-k, and the permutation of this rank's tokens into per-destination order), the
/// expert-parallel all-to-all dispatch, `Experts` (the grouped GEMMs of this rank's local
/// experts over the tokens they received), the all-to-all combine, and `SharedExperts`
/// (the shared experts' dense MLP over this rank's tokens, absent without shared experts);
/// `LayerOut` then un-permutes, weights by the router's probabilities, adds the shared
/// output and the residual.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Piece {
    Embed,
    AttnIn,
    Attn,
    AttnQkv,
    AttnCore,
    AttnProj,
    MlpIn,
    Mlp,
    Router,
    Experts,
    SharedExperts,
    /// A multi-token-prediction module's input (DeepSeek-V3 §2.2, Megatron-core's
    /// `MultiTokenPredictionLayer`): RMSNorm of the previous depth's hidden state and of
    /// the embedding of the tokens `depth` ahead, their concatenation, and the 2h → h
    /// projection `eh_proj`; `layer` is the module's layer index, model.layers + depth.
    MtpProj,
    LayerOut,
    FinalNorm,
    Logits,
    Loss,
    Optimizer,
}

impl Piece {
    pub fn key(self) -> &'static str {
        match self {
            Piece::Embed => "embed",
            Piece::AttnIn => "attn-in",
            Piece::Attn => "attn",
            Piece::AttnQkv => "attn-qkv",
            Piece::AttnCore => "attn-core",
            Piece::AttnProj => "attn-proj",
            Piece::MlpIn => "mlp-in",
            Piece::Mlp => "mlp",
            Piece::Router => "router",
            Piece::Experts => "experts",
            Piece::SharedExperts => "shared-experts",
            Piece::MtpProj => "mtp-proj",
            Piece::LayerOut => "layer-out",
            Piece::FinalNorm => "final-norm",
            Piece::Logits => "logits",
            Piece::Loss => "loss",
            Piece::Optimizer => "optimizer",
        }
    }

    /// Pieces that belong to a transformer layer (carry a layer index).
    pub fn in_layer(self) -> bool {
        matches!(
            self,
            Piece::AttnIn
                | Piece::Attn
                | Piece::AttnQkv
                | Piece::AttnCore
                | Piece::AttnProj
                | Piece::MlpIn
                | Piece::Mlp
                | Piece::Router
                | Piece::Experts
                | Piece::SharedExperts
                | Piece::MtpProj
                | Piece::LayerOut
        )
    }
}

/// Which pass of a piece an op runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Forward,
    /// Gradient with respect to the piece's input (ZB's "B").
    BackwardInput,
    /// Gradient with respect to the piece's weights (ZB's "W").
    BackwardWeight,
    /// Forward re-run in backward (activation recomputation).
    Recompute,
    /// The optimizer update.
    Step,
}

impl Phase {
    pub fn key(self) -> &'static str {
        match self {
            Phase::Forward => "fwd",
            Phase::BackwardInput => "bwd-in",
            Phase::BackwardWeight => "bwd-w",
            Phase::Recompute => "recompute",
            Phase::Step => "step",
        }
    }
}

/// One GEMM (or a batch of identical ones): C(m,n) = A(m,k)·B(k,n), 2·m·n·k·batch FLOPs.
/// `fp8`: the operands are fp8 (Transformer Engine's linear layers under
/// `training.dtype = "fp8"`), run at the GPU's fp8 rate; absent = the training dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Gemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp8: bool,
}

impl Gemm {
    pub fn flops(&self) -> u64 {
        2 * self.m * self.n * self.k * self.batch
    }
}

/// The attention core of one piece: softmax(Q·Kᵀ/√d)·V over `batch_heads` independent
/// (seq_q × seq_k) problems. Informational: its GEMMs are in `ComputeCost::gemms` and the
/// bytes of its softmax, masking and dropout in `ComputeCost::mem_bytes`, so a cost model
/// that uses only those counts everything once. With `fused` (FlashAttention-style kernels)
/// the core runs as one kernel that never stores the scores; a hardware profile with a
/// fitted attention kernel then costs it from this shape instead of from the GEMMs
/// (sim/src/compute.rs). Absent in plan files written before the flag (read as unfused).
/// The shape is what the kernel attends, which can be less than the GEMMs' block: a later
/// ring-attention step lists its whole (s/cp)² block but attends half its keys unmasked
/// (`plan/cost/cp.rs`); `causal` masks within the shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttnShape {
    pub batch_heads: u64,
    pub seq_q: u64,
    pub seq_k: u64,
    pub head_dim: u64,
    pub causal: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fused: bool,
}

/// What a compute op costs, in hardware-independent terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ComputeCost {
    /// Total FLOPs executed (GEMMs and element-wise work).
    pub flops: u64,
    /// The matrix multiplications, with their shapes (for tile and wave quantisation).
    pub gemms: Vec<Gemm>,
    /// Softmax-attention core, if the piece has one.
    pub attention: Option<AttnShape>,
    /// Bytes read and written by the memory-bound (element-wise) work, excluding GEMM
    /// operands.
    pub mem_bytes: u64,
    /// Number of kernels launched (for launch overhead).
    pub kernels: u32,
}

/// A piece of the model for one microbatch and model chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ComputeOp {
    pub piece: Piece,
    pub phase: Phase,
    /// Microbatch index within the step (0 for the optimizer).
    pub mb: u32,
    /// Model chunk on this stage (0..vpp); the virtual stage is chunk · pp + stage.
    pub chunk: u32,
    /// Global layer index for layer pieces, 0 otherwise.
    pub layer: u32,
    /// Ring step of an `AttnCore` under ring context parallelism (0 … cp − 1), else 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub step: u32,
    pub cost: CostId,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Collective operations (NCCL's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    AllToAll,
    /// Every member sends `bytes` to the next member of its group (in group order, the
    /// last to the first) and receives as much from the previous: one step of ring
    /// attention (Transformer Engine's batched send/recv of the K/V chunk).
    RingExchange,
}

impl CollKind {
    pub fn key(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all-reduce",
            CollKind::ReduceScatter => "reduce-scatter",
            CollKind::AllGather => "all-gather",
            CollKind::Broadcast => "broadcast",
            CollKind::AllToAll => "all-to-all",
            CollKind::RingExchange => "ring-exchange",
        }
    }

    /// nccl-tests' bus-bandwidth factor for a group of n: busbw = algbw · factor.
    pub fn bus_factor(self, n: u64) -> f64 {
        let n = n.max(1) as f64;
        match self {
            CollKind::AllReduce => 2.0 * (n - 1.0) / n,
            CollKind::ReduceScatter | CollKind::AllGather | CollKind::AllToAll => (n - 1.0) / n,
            CollKind::Broadcast | CollKind::RingExchange => 1.0,
        }
    }
}

/// Which group of the rank grid a collective runs on, relative to the issuing rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupKind {
    /// The rank's tensor-parallel group (same dp and pp coordinates).
    Tp,
    /// The rank's data-parallel group (same tp and pp coordinates; with context
    /// parallelism its cp · dp ranks, Megatron-LM's data-parallel group with context
    /// parallel); dense gradients reduce and ZeRO shards over it.
    Dp,
    /// The rank's context-parallel group (same tp, dp and pp coordinates).
    Cp,
    /// The rank's expert-parallel group: the ep consecutive ranks of its stage that split
    /// each MoE layer's experts (see [`crate::plan::grid::RankGrid`]).
    Ep,
    /// The ranks of its stage that hold the same experts: expert gradients reduce (and
    /// ZeRO shards expert state) over them.
    ExpertDp,
    /// First and last pipeline stage with the same tp and dp coordinates: the two copies of
    /// a tied input/output embedding.
    Embedding,
    /// Every rank (global gradient norm).
    World,
}

impl GroupKind {
    /// Every kind, in declaration order ([`GroupKind::index`]).
    pub const ALL: [GroupKind; 7] = [
        GroupKind::Tp,
        GroupKind::Dp,
        GroupKind::Cp,
        GroupKind::Ep,
        GroupKind::ExpertDp,
        GroupKind::Embedding,
        GroupKind::World,
    ];

    /// Position in [`GroupKind::ALL`]: the index of per-kind tables.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn key(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Dp => "dp",
            GroupKind::Cp => "cp",
            GroupKind::Ep => "ep",
            GroupKind::ExpertDp => "expert-dp",
            GroupKind::Embedding => "embedding",
            GroupKind::World => "world",
        }
    }
}

/// Where a tensor-parallel collective sits relative to its piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TpSite {
    /// Reduce the piece's partial-sum output (all-reduce, or reduce-scatter under sequence
    /// parallelism). In backward: the partial input gradient.
    Reduce,
    /// Gather the piece's input before it runs (sequence parallelism); in backward, gather
    /// the incoming output gradient.
    Gather,
    /// Gather the piece's saved, sequence-sharded input again for its weight gradient.
    GatherSaved,
    /// Gather per-token loss statistics across the vocabulary shards.
    LossStats,
}

/// What a collective moves, so the runtime knows which tensor it reduces or gathers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CollPurpose {
    /// Tensor parallelism around a piece.
    Tp { site: TpSite, piece: Piece, phase: Phase, mb: u32, chunk: u32, layer: u32 },
    /// Reduce a gradient bucket over the data-parallel group: all-reduce (ZeRO-0) or
    /// reduce-scatter into the owner's shard (ZeRO ≥ 1). `mb` is the microbatch whose
    /// backward completed it (ZeRO-2/3 reduce every microbatch, ZeRO-0/1 only the last).
    GradBucket { chunk: u32, bucket: u32, mb: u32 },
    /// All-gather updated parameter shards of a bucket after the optimizer step (ZeRO-1/2).
    ParamBucket { chunk: u32, bucket: u32 },
    /// ZeRO-3: gather the full parameters of a bucket before a piece uses them.
    ParamGather { chunk: u32, bucket: u32, mb: u32, phase: Phase },
    /// Sum the gradients of the two copies of a tied embedding (first and last stage).
    TiedEmbeddingGrad,
    /// Sequence parallelism: each tensor-parallel rank computed the gradients of the
    /// replicated tensors (norms, row-parallel biases) from its own slice of the sequence;
    /// all-reduce them over the tensor-parallel group (Megatron-LM's layer-norm grad
    /// all-reduce). Once per step, over the rank's owned gradients.
    SpReplicatedGrads,
    /// Sum of squared gradient norms over all ranks, for clipping.
    GradNorm,
    /// Expert parallelism around a MoE layer's experts (group `Ep`, kind `AllToAll`):
    /// `dispatch` sends each token to its experts' ranks, else the combine brings expert
    /// outputs back. In backward the same two carry the gradients the other way. `bytes`
    /// is the expected volume with tokens spread evenly; the routed counts decide what moves.
    Moe { dispatch: bool, phase: Phase, mb: u32, chunk: u32, layer: u32 },
    /// Context parallelism around attention (group `Cp`): under ring attention the K/V
    /// (and in backward dK/dV) exchange before ring step `step`; under all-gather the K/V
    /// all-gather (forward) and the dK/dV reduce-scatter (backward); under Ulysses the
    /// all-to-all of Q/K/V (`step` 0) and of the output (`step` 1).
    Cp { phase: Phase, mb: u32, chunk: u32, layer: u32, step: u32 },
    /// Reduce a bucket of expert gradients over the expert-data-parallel group (as
    /// `GradBucket` for dense parameters).
    ExpertGradBucket { chunk: u32, bucket: u32, mb: u32 },
}

/// A collective on one of the rank's groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CollectiveOp {
    pub kind: CollKind,
    pub group: GroupKind,
    /// nccl-tests' S: the whole buffer (per-rank count × group size for AG / RS).
    pub bytes: u64,
    pub dtype: Dtype,
    pub purpose: CollPurpose,
}

/// The neighbouring pipeline stage, in ring order (stage pp−1's next is stage 0, which
/// interleaved schedules use to pass a microbatch to the next model chunk).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Peer {
    Next,
    Prev,
}

/// What a point-to-point message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum P2pKind {
    /// Forward activations, sent to the next stage.
    Activation,
    /// Input gradients, sent to the previous stage.
    Gradient,
}

/// A pipeline send or receive. A send on stage s to `Next` matches the receive from `Prev`
/// on stage s+1 (mod pp) with the same tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct P2pOp {
    pub peer: Peer,
    pub kind: P2pKind,
    pub mb: u32,
    /// The virtual stage (chunk · pp + stage) that receives an activation, or that sends a
    /// gradient: the boundary is between `vstage − 1` and `vstage` either way.
    pub vstage: u32,
    pub bytes: u64,
}

/// What a buffer holds (the memory timeline's categories).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BufClass {
    Params,
    Grads,
    OptimizerState,
    Activations,
    Workspace,
    CommBuffer,
}

impl BufClass {
    pub const ALL: [BufClass; 6] = [
        BufClass::Params,
        BufClass::Grads,
        BufClass::OptimizerState,
        BufClass::Activations,
        BufClass::Workspace,
        BufClass::CommBuffer,
    ];

    pub fn key(self) -> &'static str {
        match self {
            BufClass::Params => "params",
            BufClass::Grads => "grads",
            BufClass::OptimizerState => "optimizer",
            BufClass::Activations => "activations",
            BufClass::Workspace => "workspace",
            BufClass::CommBuffer => "comm",
        }
    }
}

/// Allocation of a named buffer. Buffers never freed are persistent (live across steps).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllocOp {
    pub buf: BufId,
    pub class: BufClass,
    pub bytes: u64,
    /// Human-readable name, e.g. `act L3 mb1` — for traces and verifier messages.
    pub name: String,
}

/// What an op does.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    Compute(ComputeOp),
    Collective(CollectiveOp),
    Send(P2pOp),
    Recv(P2pOp),
    Alloc(AllocOp),
    Free { buf: BufId },
}

/// One op of a rank's program.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Op {
    pub stream: Stream,
    /// Earlier ops (of any stream of this rank) that must finish before this one starts.
    /// The previous op of the same stream is implied and not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deps: Vec<OpId>,
    /// Buffers this op reads or writes; each must be allocated and not yet freed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bufs: Vec<BufId>,
    pub kind: OpKind,
}

/// The ops of every rank of one pipeline stage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    pub ops: Vec<Op>,
}
