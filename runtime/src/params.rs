//! Parameters of one model chunk in ONE flat f32 buffer, with a fixed documented order,
//! per-tensor views, seeded initialisation and tensor-parallel sharding.
//!
//! A chunk is what one pipeline rank runs for one virtual stage: optionally the embedding
//! (first chunk), a run of consecutive layers, optionally the head (last chunk). Its flat
//! buffer holds, in this order (shapes are this tp rank's; t = tp size, D = (a/t)·d,
//! F = f/t, linear weights stored (in, out) so that y = x·W):
//!
//! ```text
//! embedding  wte (V/t, h)   wpe (s, h)
//! layer ℓ    ln1_w (h)  ln1_b (h)  qkv_w (h, 3D)  qkv_b (3D)  proj_w (D, h)  proj_b (h)
//!            ln2_w (h)  ln2_b (h)  fc1_w (h, F)   fc1_b (F)   fc2_w (F, h)   fc2_b (h)
//! head       lnf_w (h)  lnf_b (h)  [wte (V/t, h): only when the chunk has no embedding]
//! ```
//!
//! The output layer is tied to the word embedding. When one chunk holds both ends it uses
//! the single `wte`; when they are in different chunks the head keeps its own copy
//! (Megatron-LM's "embedding group"), initialised identically, and the caller all-reduces
//! the two copies' gradients. Gradients and the optimizer's moments use the same layout,
//! so a ZeRO shard is just an (offset, size) range of it.
//!
//! Initialisation (GPT-2 / nanoGPT): matrices and tables ~ N(0, 0.02), the residual
//! projections (`proj_w`, `fc2_w`) ~ N(0, 0.02/√(2·layers)), biases and LayerNorm β zero,
//! LayerNorm γ one. Every tensor is drawn in its *unsharded* shape from its own ChaCha8
//! stream, keyed by (seed, global layer, tensor), and then sliced to this rank's shard, so
//! every tp/pp split starts from exactly the same model.

use std::ops::Range;

use strata_models::ModelSpec;

use crate::error::RuntimeError;
use crate::shard::{ShardDims, TpRank};

mod kind;

pub use kind::{INIT_STD, LAYER_KINDS, ParamKind, TpSplit};
use kind::{Init, local_shape, normal_vec, stream_id};

/// Which part of the model a chunk holds. `layers` are global layer indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkSpec {
    pub embedding: bool,
    pub layers: Range<usize>,
    pub head: bool,
}

impl ChunkSpec {
    /// The whole model in one chunk (no pipeline parallelism).
    pub fn whole(model: &ModelSpec) -> ChunkSpec {
        ChunkSpec { embedding: true, layers: 0..model.layers as usize, head: true }
    }
}

/// One tensor's place in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamEntry {
    pub kind: ParamKind,
    /// Global layer index, for per-layer tensors.
    pub layer: Option<usize>,
    /// First element in the flat buffer.
    pub offset: usize,
    /// This rank's shape.
    pub shape: Vec<usize>,
    /// The unsharded shape.
    pub full_shape: Vec<usize>,
    /// The head's copy of a word embedding that lives in another chunk.
    pub tied_copy: bool,
}

impl ParamEntry {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }

    /// "layers.3.qkv_w", "wte", "head.wte".
    pub fn name(&self) -> String {
        match (self.layer, self.tied_copy) {
            (Some(l), _) => format!("layers.{l}.{}", self.kind.name()),
            (None, true) => format!("head.{}", self.kind.name()),
            (None, false) => self.kind.name().to_string(),
        }
    }
}

/// Views of the tensors of one layer; `S` is `&[f32]` (parameters) or `&mut [f32]` (gradients).
#[derive(Debug)]
pub struct LayerTensors<S> {
    pub ln1_w: S,  // (h)
    pub ln1_b: S,  // (h)
    pub qkv_w: S,  // (h, 3*D)
    pub qkv_b: S,  // (3*D)
    pub proj_w: S, // (D, h)
    pub proj_b: S, // (h)
    pub ln2_w: S,  // (h)
    pub ln2_b: S,  // (h)
    pub fc1_w: S,  // (h, F)
    pub fc1_b: S,  // (F)
    pub fc2_w: S,  // (F, h)
    pub fc2_b: S,  // (h)
}

/// Views of the embedding tensors.
#[derive(Debug)]
pub struct EmbedTensors<S> {
    pub wte: S, // (V/t, h)
    pub wpe: S, // (s, h)
}

/// Views of the head tensors (final norm and the tied output layer).
#[derive(Debug)]
pub struct HeadTensors<S> {
    pub lnf_w: S, // (h)
    pub lnf_b: S, // (h)
    pub wte: S,   // (V/t, h)
}

pub type LayerParams<'a> = LayerTensors<&'a [f32]>;
pub type LayerGrads<'a> = LayerTensors<&'a mut [f32]>;
pub type EmbedParams<'a> = EmbedTensors<&'a [f32]>;
pub type EmbedGrads<'a> = EmbedTensors<&'a mut [f32]>;
pub type HeadParams<'a> = HeadTensors<&'a [f32]>;
pub type HeadGrads<'a> = HeadTensors<&'a mut [f32]>;

fn split<const N: usize>(mut buf: &[f32], sizes: [usize; N]) -> [&[f32]; N] {
    sizes.map(|n| {
        let (head, tail) = buf.split_at(n);
        buf = tail;
        head
    })
}

fn split_mut<const N: usize>(mut buf: &mut [f32], sizes: [usize; N]) -> [&mut [f32]; N] {
    sizes.map(|n| {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(n);
        buf = tail;
        head
    })
}

impl<S> LayerTensors<S> {
    fn from_array(
        [ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b]: [S; 12],
    ) -> Self {
        LayerTensors { ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b }
    }
}

/// The flat-buffer layout of one chunk on one tensor-parallel rank.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamLayout {
    dims: ShardDims,
    chunk: ChunkSpec,
    model_layers: usize,
    entries: Vec<ParamEntry>,
    /// Elements of the embedding block (0 without one).
    embed_len: usize,
    /// Elements of one layer block.
    layer_len: usize,
    len: usize,
}

impl ParamLayout {
    /// The layout of `chunk` of `model` on tensor-parallel rank `tp`.
    pub fn new(model: &ModelSpec, tp: TpRank, chunk: ChunkSpec) -> Result<ParamLayout, RuntimeError> {
        let dims = ShardDims::new(model, tp)?;
        let model_layers = model.layers as usize;
        if chunk.layers.start > chunk.layers.end || chunk.layers.end > model_layers {
            return Err(RuntimeError::BadSetting(format!(
                "chunk layers {:?} are not a range inside the model's {model_layers} layers",
                chunk.layers
            )));
        }
        let mut entries = Vec::new();
        let mut offset = 0;
        let mut push = |kind: ParamKind, layer: Option<usize>, tied_copy: bool| {
            let full_shape = kind.full_shape(&dims);
            let shape = local_shape(&full_shape, kind.split(), tp.size);
            let entry = ParamEntry { kind, layer, offset, shape, full_shape, tied_copy };
            offset += entry.len();
            entries.push(entry);
        };
        if chunk.embedding {
            push(ParamKind::Wte, None, false);
            push(ParamKind::Wpe, None, false);
        }
        for l in chunk.layers.clone() {
            for kind in LAYER_KINDS {
                push(kind, Some(l), false);
            }
        }
        if chunk.head {
            push(ParamKind::LnfW, None, false);
            push(ParamKind::LnfB, None, false);
            if !chunk.embedding {
                push(ParamKind::Wte, None, true);
            }
        }
        let embed_len = if chunk.embedding { entries[0].len() + entries[1].len() } else { 0 };
        let first_layer = if chunk.embedding { 2 } else { 0 };
        let layer_len = if chunk.layers.is_empty() {
            0
        } else {
            entries[first_layer..first_layer + 12].iter().map(ParamEntry::len).sum()
        };
        Ok(ParamLayout { dims, chunk, model_layers, entries, embed_len, layer_len, len: offset })
    }

    /// Elements in the flat buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dims(&self) -> &ShardDims {
        &self.dims
    }

    pub fn chunk(&self) -> &ChunkSpec {
        &self.chunk
    }

    /// Every tensor in buffer order.
    pub fn entries(&self) -> &[ParamEntry] {
        &self.entries
    }

    /// Layers in this chunk.
    pub fn num_layers(&self) -> usize {
        self.chunk.layers.len()
    }

    fn layer_range(&self, local: usize) -> Range<usize> {
        assert!(local < self.num_layers(), "layer {local} of a chunk with {} layers", self.num_layers());
        let start = self.embed_len + local * self.layer_len;
        start..start + self.layer_len
    }

    fn layer_sizes(&self) -> [usize; 12] {
        let d = &self.dims;
        let (h, a3, f) = (d.hidden, 3 * d.attn_channels(), d.ffn);
        [h, h, h * a3, a3, a3 / 3 * h, h, h, h, h * f, f, f * h, h]
    }

    /// Views of layer `local` (0-based within the chunk) of a parameter buffer.
    pub fn layer<'a>(&self, buf: &'a [f32], local: usize) -> LayerParams<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        LayerTensors::from_array(split(&buf[self.layer_range(local)], self.layer_sizes()))
    }

    /// Mutable views of layer `local` of a gradient (or parameter) buffer.
    pub fn layer_mut<'a>(&self, buf: &'a mut [f32], local: usize) -> LayerGrads<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let range = self.layer_range(local);
        LayerTensors::from_array(split_mut(&mut buf[range], self.layer_sizes()))
    }

    /// Elements of one layer's block.
    pub fn layer_len(&self) -> usize {
        self.layer_len
    }

    /// Views of a layer from its own block (`layer_len` elements, the layer's range of the
    /// flat buffer held apart, as the plan interpreter keeps ZeRO units).
    pub fn layer_block<'a>(&self, block: &'a [f32]) -> LayerParams<'a> {
        assert_eq!(block.len(), self.layer_len, "a layer block has {} elements", self.layer_len);
        LayerTensors::from_array(split(block, self.layer_sizes()))
    }

    /// Mutable views of a layer block (see [`ParamLayout::layer_block`]).
    pub fn layer_block_mut<'a>(&self, block: &'a mut [f32]) -> LayerGrads<'a> {
        assert_eq!(block.len(), self.layer_len, "a layer block has {} elements", self.layer_len);
        LayerTensors::from_array(split_mut(block, self.layer_sizes()))
    }

    fn embed_sizes(&self) -> [usize; 2] {
        assert!(self.chunk.embedding, "this chunk holds no embedding");
        [self.entries[0].len(), self.entries[1].len()]
    }

    pub fn embedding<'a>(&self, buf: &'a [f32]) -> EmbedParams<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let [wte, wpe] = split(&buf[..self.embed_len], self.embed_sizes());
        EmbedTensors { wte, wpe }
    }

    pub fn embedding_mut<'a>(&self, buf: &'a mut [f32]) -> EmbedGrads<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let sizes = self.embed_sizes();
        let [wte, wpe] = split_mut(&mut buf[..self.embed_len], sizes);
        EmbedTensors { wte, wpe }
    }

    /// Start of the head block, which ends the buffer.
    fn head_start(&self) -> usize {
        assert!(self.chunk.head, "this chunk holds no head");
        self.embed_len + self.num_layers() * self.layer_len
    }

    pub fn head<'a>(&self, buf: &'a [f32]) -> HeadParams<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let h = self.dims.hidden;
        let [lnf_w, lnf_b, copy] = split(&buf[self.head_start()..], [h, h, self.len - self.head_start() - 2 * h]);
        let wte = if self.chunk.embedding { self.embedding(buf).wte } else { copy };
        HeadTensors { lnf_w, lnf_b, wte }
    }

    pub fn head_mut<'a>(&self, buf: &'a mut [f32]) -> HeadGrads<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let (h, start, wte_len) = (self.dims.hidden, self.head_start(), self.dims.vocab * self.dims.hidden);
        let (front, back) = buf.split_at_mut(start);
        if self.chunk.embedding {
            let [lnf_w, lnf_b] = split_mut(back, [h, h]);
            HeadTensors { lnf_w, lnf_b, wte: &mut front[..wte_len] }
        } else {
            let [lnf_w, lnf_b, wte] = split_mut(back, [h, h, wte_len]);
            HeadTensors { lnf_w, lnf_b, wte }
        }
    }

    /// A freshly initialised parameter buffer (see the module comment); deterministic in
    /// `seed` and independent of how the model is split.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut buf = vec![0.0f32; self.len];
        for e in &self.entries {
            let full_len: usize = e.full_shape.iter().product();
            let full: Vec<f32> = match e.kind.init(self.model_layers) {
                Init::Zeros => vec![0.0; full_len],
                Init::Ones => vec![1.0; full_len],
                Init::Normal(std) => normal_vec(full_len, std, seed, stream_id(e.kind, e.layer)),
            };
            self.scatter_local(e, &full, &mut buf[e.range()]);
        }
        buf
    }

    /// Ranges of the unsharded tensor that make up this rank's shard, in shard order.
    #[allow(clippy::single_range_in_vec_init)] // lists of ranges that may hold just one
    fn local_ranges(&self, e: &ParamEntry) -> Vec<Range<usize>> {
        let TpRank { rank: r, size: t } = self.dims.tp;
        let cols = *e.full_shape.last().unwrap_or(&1);
        let rows = e.full_shape.iter().product::<usize>() / cols.max(1);
        match e.kind.split() {
            TpSplit::Replicated => vec![0..rows * cols],
            TpSplit::Rows => {
                let per = rows / t;
                vec![r * per * cols..(r + 1) * per * cols]
            }
            TpSplit::Cols { groups } => {
                let (block, per) = (cols / groups, cols / groups / t);
                (0..rows)
                    .flat_map(|i| {
                        (0..groups).map(move |g| i * cols + g * block + r * per..i * cols + g * block + (r + 1) * per)
                    })
                    .collect()
            }
        }
    }

    /// Copies this rank's part of the unsharded tensor `full` into `local`.
    fn scatter_local(&self, e: &ParamEntry, full: &[f32], local: &mut [f32]) {
        let mut at = 0;
        for range in self.local_ranges(e) {
            local[at..at + range.len()].copy_from_slice(&full[range.clone()]);
            at += range.len();
        }
        debug_assert_eq!(at, local.len());
    }

    /// Slices an unsharded buffer (laid out by `full`, the same chunk on one rank) into this
    /// rank's shard. Used to start every split from one set of weights and in parity tests.
    pub fn shard_from(&self, full: &ParamLayout, full_buf: &[f32]) -> Vec<f32> {
        assert_eq!(full.dims.tp, TpRank::SINGLE, "the source layout must be unsharded");
        assert_eq!(full.entries.len(), self.entries.len(), "layouts of different chunks");
        let mut buf = vec![0.0f32; self.len];
        for (e, fe) in self.entries.iter().zip(&full.entries) {
            self.scatter_local(e, &full_buf[fe.range()], &mut buf[e.range()]);
        }
        buf
    }

    /// The inverse of [`ParamLayout::shard_from`]: writes this rank's shard `buf` into its
    /// place in an unsharded buffer. Replicated tensors are written by every rank.
    pub fn gather_into(&self, buf: &[f32], full: &ParamLayout, full_buf: &mut [f32]) {
        for (e, fe) in self.entries.iter().zip(&full.entries) {
            let dst = &mut full_buf[fe.range()];
            let mut at = 0;
            for range in self.local_ranges(e) {
                dst[range.clone()].copy_from_slice(&buf[e.offset + at..e.offset + at + range.len()]);
                at += range.len();
            }
        }
    }

    /// The ranges of the flat buffer that get weight decay (matrices and tables), for
    /// `AdamW::update`.
    pub fn decay_ranges(&self) -> Vec<Range<usize>> {
        self.entries.iter().filter(|e| e.kind.decays()).map(ParamEntry::range).collect()
    }

    /// Σ g² over the part `range` of a gradient buffer, counting every parameter of the
    /// whole model once: replicated tensors only on tp rank 0, and the head's tied copy of
    /// the word embedding never (its chunk-mate on the first stage counts it). The caller
    /// all-reduces this over tp, pp and (for ZeRO shards) dp, then clips.
    pub fn grad_sq_sum(&self, grads: &[f32], range: Range<usize>) -> f64 {
        assert!(range.end <= grads.len(), "range {range:?} outside a gradient buffer of {}", grads.len());
        let mut total = 0.0;
        for e in &self.entries {
            let counted = !e.tied_copy && (e.kind.split() != TpSplit::Replicated || self.dims.tp.rank == 0);
            let (lo, hi) = (e.offset.max(range.start), (e.offset + e.len()).min(range.end));
            if counted && lo < hi {
                total += crate::kernels::sum_of_squares(&grads[lo..hi]);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests;
