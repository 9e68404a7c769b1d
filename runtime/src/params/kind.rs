//! The parameter tensors of the GPT and Llama families (and of mixture-of-experts layers:
//! the router gate and the routed experts): names, unsharded shapes, which a model holds,
//! how each is cut over the tensor-parallel group, initialisation and weight decay.
//!
//! Linear weights are stored (in, out), so y = x·W. Column-parallel tensors (QKV, FC1 and
//! their biases) are cut along the output dimension, QKV as three blocks [Q | K | V] (Q
//! heads·d wide, K and V kv_heads·d each) so that every rank holds whole query heads and
//! the key/value heads they read; a SwiGLU FC1 as two blocks [gate | up] of f each, so that
//! rank r holds gate and up columns of the same r-th t-th (Megatron-LM's fused `linear_fc1`
//! is sharded the same way: each rank's output is [gate_r | up_r]). Row-parallel tensors
//! (attention projection, FC2) and the vocabulary tables along their first dimension.
//!
//! Llama holds no biases, no position table and no norm β (RMSNorm), and has its own
//! output layer `out_w` (V, h), vocabulary-parallel like `wte`.
//!
//! Initialisation (GPT-2 / nanoGPT): N(0, 0.02) for matrices and tables, N(0, 0.02/√(2L))
//! for the residual projections, zeros for biases and LayerNorm β, ones for γ. Normal
//! draws use the Box–Muller transform on a ChaCha8 stream per tensor.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::shard::ShardDims;

/// Standard deviation of GPT-2's weight initialisation.
pub const INIT_STD: f32 = 0.02;

/// Every parameter tensor of the GPT and Llama families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ParamKind {
    Wte,
    Wpe,
    Ln1W,
    Ln1B,
    QkvW,
    QkvB,
    ProjW,
    ProjB,
    Ln2W,
    Ln2B,
    Fc1W,
    Fc1B,
    Fc2W,
    Fc2B,
    LnfW,
    LnfB,
    /// A MoE layer's router gate (h, E), replicated.
    RouterW,
    /// One routed expert's FC1 (h, f), FC1 bias (f), FC2 (f, h), FC2 bias (h): whole on its
    /// expert-parallel rank (expert-tp 1). A Llama (SwiGLU) expert's FC1 is (h, 2f) as
    /// [gate | up], and it has no biases.
    ExpFc1W,
    ExpFc1B,
    ExpFc2W,
    ExpFc2B,
    /// The untied output layer (V, h) (Llama), vocabulary-parallel like `Wte`.
    OutW,
}

/// The tensors of one routed expert, in buffer order.
pub const EXPERT_KINDS: [ParamKind; 4] =
    [ParamKind::ExpFc1W, ParamKind::ExpFc1B, ParamKind::ExpFc2W, ParamKind::ExpFc2B];

/// The tensors of one layer, in buffer order.
pub const LAYER_KINDS: [ParamKind; 12] = [
    ParamKind::Ln1W,
    ParamKind::Ln1B,
    ParamKind::QkvW,
    ParamKind::QkvB,
    ParamKind::ProjW,
    ParamKind::ProjB,
    ParamKind::Ln2W,
    ParamKind::Ln2B,
    ParamKind::Fc1W,
    ParamKind::Fc1B,
    ParamKind::Fc2W,
    ParamKind::Fc2B,
];

/// How a tensor is cut over the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TpSplit {
    /// Every rank holds all of it.
    Replicated,
    /// Rank r holds rows [r·R/t, (r+1)·R/t) (row-parallel weights, vocabulary tables).
    Rows,
    /// The last dimension is blocks (Q, K, V; gate, up; or one); rank r holds the r-th t-th
    /// of every block (column-parallel weights and their biases). The block widths are
    /// [`ParamKind::col_blocks`].
    Cols,
}

pub(crate) enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

impl ParamKind {
    pub fn name(self) -> &'static str {
        use ParamKind::*;
        match self {
            Wte => "wte",
            Wpe => "wpe",
            Ln1W => "ln1_w",
            Ln1B => "ln1_b",
            QkvW => "qkv_w",
            QkvB => "qkv_b",
            ProjW => "proj_w",
            ProjB => "proj_b",
            Ln2W => "ln2_w",
            Ln2B => "ln2_b",
            Fc1W => "fc1_w",
            Fc1B => "fc1_b",
            Fc2W => "fc2_w",
            Fc2B => "fc2_b",
            LnfW => "lnf_w",
            LnfB => "lnf_b",
            RouterW => "router_w",
            ExpFc1W => "fc1_w",
            ExpFc1B => "fc1_b",
            ExpFc2W => "fc2_w",
            ExpFc2B => "fc2_b",
            OutW => "out_w",
        }
    }

    /// Unsharded shape for a model of hidden h, heads·d = h, vocabulary V, s positions, with
    /// `f` the MLP's width in this layer (FFN f, or a MoE layer's shared experts), `e` the
    /// routed experts and `fe` one routed expert's width.
    pub(crate) fn full_shape(self, d: &ShardDims, f: usize, e: usize, fe: usize) -> Vec<usize> {
        use ParamKind::*;
        let full = d.unsharded();
        let (h, a, v) = (full.hidden, full.attn_channels(), full.vocab);
        let qkv = full.qkv_width();
        let fc1 = if full.llama { 2 * f } else { f };
        match self {
            Wte | OutW => vec![v, h],
            Wpe => vec![full.max_seq, h],
            Ln1W | Ln1B | Ln2W | Ln2B | LnfW | LnfB | ProjB | Fc2B => vec![h],
            QkvW => vec![h, qkv],
            QkvB => vec![qkv],
            ProjW => vec![a, h],
            Fc1W => vec![h, fc1],
            Fc1B => vec![fc1],
            Fc2W => vec![f, h],
            RouterW => vec![h, e],
            ExpFc1W => vec![h, if full.llama { 2 * fe } else { fe }],
            ExpFc1B => vec![fe],
            ExpFc2W => vec![fe, h],
            ExpFc2B => vec![h],
        }
    }

    pub fn split(self) -> TpSplit {
        use ParamKind::*;
        match self {
            Wte | OutW | ProjW | Fc2W => TpSplit::Rows,
            QkvW | QkvB | Fc1W | Fc1B => TpSplit::Cols,
            _ => TpSplit::Replicated,
        }
    }

    /// The unsharded widths of the column blocks of a column-parallel tensor whose last
    /// dimension is `cols`: [Q, K, V] for QKV, [gate, up] for a SwiGLU FC1, else one block.
    pub(crate) fn col_blocks(self, d: &ShardDims, cols: usize) -> Vec<usize> {
        use ParamKind::*;
        let full = d.unsharded();
        match self {
            QkvW | QkvB => vec![full.attn_channels(), full.kv_channels(), full.kv_channels()],
            Fc1W | Fc1B if d.llama => vec![cols / 2, cols / 2],
            _ => vec![cols],
        }
    }

    /// Whether a model of the family `d` describes holds this tensor: Llama has no
    /// biases (its experts' neither), no norm β, no position table, and its own output layer; GPT no `out_w`.
    pub fn present(self, d: &ShardDims) -> bool {
        use ParamKind::*;
        match self {
            Ln1B | Ln2B | LnfB | QkvB | ProjB | Fc1B | Fc2B | ExpFc1B | ExpFc2B | Wpe => !d.llama,
            OutW => d.llama,
            _ => true,
        }
    }

    pub(crate) fn init(self, layers: usize) -> Init {
        use ParamKind::*;
        match self {
            Wte | OutW | Wpe | QkvW | Fc1W | RouterW | ExpFc1W => Init::Normal(INIT_STD),
            ProjW | Fc2W | ExpFc2W => Init::Normal(INIT_STD / (2.0 * layers as f32).sqrt()),
            Ln1W | Ln2W | LnfW => Init::Ones,
            _ => Init::Zeros,
        }
    }

    /// Matrices and tables get weight decay; biases and norm parameters do not (GPT-2).
    pub fn decays(self) -> bool {
        use ParamKind::*;
        matches!(self, Wte | OutW | Wpe | QkvW | ProjW | Fc1W | Fc2W | RouterW | ExpFc1W | ExpFc2W)
    }

    /// A routed expert's tensor (unit `Experts`, reduced over the expert-data-parallel group).
    pub fn is_expert(self) -> bool {
        EXPERT_KINDS.contains(&self)
    }
}

pub(crate) fn local_shape(full: &[usize], split: TpSplit, t: usize) -> Vec<usize> {
    let mut shape = full.to_vec();
    match split {
        TpSplit::Replicated => {}
        TpSplit::Rows => shape[0] /= t,
        TpSplit::Cols => *shape.last_mut().expect("tensors have at least one dimension") /= t,
    }
    shape
}

/// The ChaCha stream of one tensor: tensors outside layers use their kind's index, layer
/// tensors 64 + 64·layer + kind, so no two tensors of a model share a stream.
pub(crate) fn stream_id(kind: ParamKind, layer: Option<usize>) -> u64 {
    match layer {
        None => kind as u64,
        Some(l) => 64 + 64 * l as u64 + kind as u64,
    }
}

/// The ChaCha stream of routed expert `expert` (global index) of `layer`: a space of its
/// own above every layer tensor's, so the expert's weights do not depend on the split.
pub(crate) fn expert_stream_id(kind: ParamKind, layer: usize, expert: usize) -> u64 {
    (1 << 40) + ((layer as u64) << 24) + 8 * expert as u64 + kind as u64 - ParamKind::ExpFc1W as u64
}

/// n draws of N(0, std²) by the Box–Muller transform (rand 0.10 ships no normal distribution).
pub(crate) fn normal_vec(n: usize, std: f32, seed: u64, stream: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        // u1 in (0, 1] keeps ln(u1) finite.
        let u1 = 1.0 - rng.random::<f64>();
        let u2 = rng.random::<f64>();
        let radius = (-2.0 * u1.ln()).sqrt();
        let angle = std::f64::consts::TAU * u2;
        out.push((std as f64 * radius * angle.cos()) as f32);
        out.push((std as f64 * radius * angle.sin()) as f32);
    }
    out.truncate(n);
    out
}
