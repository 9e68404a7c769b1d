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
//! A Llama chunk holds the same order without the tensors Llama lacks
//! ([`ParamKind::present`]): `wte`; per layer `ln1_w  qkv_w (h, D + 2·Dkv)  proj_w  ln2_w
//! fc1_w (h, 2F)  fc2_w` (Dkv = (kv_heads/t)·d; FC1's columns [gate | up]); head `lnf_w
//! out_w (V/t, h)`, its own output layer (the plan's `Unit::OutputLayer`). Absent tensors are
//! empty views, which the pieces read as "no bias" and "RMSNorm".
//!
//! A mixture-of-experts layer (`ModelSpec::is_moe_layer`) holds, in place of the dense
//! MLP, its shared experts as `fc1_w (h, Fs)  fc1_b (Fs)  fc2_w (Fs, h)  fc2_b (h)` (Fs =
//! shared_experts · shared_ffn_hidden / t; absent without shared experts), then the router
//! gate `router_w (h, E)` (replicated) — together the plan's `Unit::Layer` — and after them
//! this rank's routed experts (the plan's `Unit::Experts`): experts [r·E/ep, (r+1)·E/ep) on
//! expert-parallel rank r, each `fc1_w (h, fe)  fc1_b (fe)  fc2_w (fe, h)  fc2_b (h)`
//! whole (expert-tp 1); a Llama MoE layer's shared and routed experts are SwiGLU, FC1
//! [gate | up] (h, 2Fs) or (h, 2fe), without biases, as its dense MLP. Each expert is drawn from a stream keyed by its global index, so
//! every ep split holds the same experts.
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
mod moe;

pub use kind::EXPERT_KINDS;
pub use kind::{INIT_STD, LAYER_KINDS, ParamKind, TpSplit};
use kind::{Init, expert_stream_id, local_shape, normal_vec, stream_id};
pub use moe::moe_tensors;

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
    /// A routed expert's tensor: the expert's global index.
    pub expert: Option<usize>,
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

    /// "layers.3.qkv_w", "layers.3.experts.5.fc1_w", "wte", "head.wte".
    pub fn name(&self) -> String {
        if let (Some(l), Some(x)) = (self.layer, self.expert) {
            return format!("layers.{l}.experts.{x}.{}", self.kind.name());
        }
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
    /// A MoE layer's router gate (h, E); empty in a dense layer. In a MoE layer fc1/fc2 are
    /// its shared experts (all empty without them).
    pub router_w: S,
}

/// Views of the embedding tensors.
#[derive(Debug)]
pub struct EmbedTensors<S> {
    pub wte: S, // (V/t, h)
    pub wpe: S, // (s, h)
}

/// Views of the head tensors (final norm and the output layer).
#[derive(Debug)]
pub struct HeadTensors<S> {
    pub lnf_w: S, // (h)
    pub lnf_b: S, // (h); empty under RMSNorm (Llama)
    /// The output layer (V/t, h): the tied word embedding (GPT) or `out_w` (Llama).
    pub wte: S,
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
        [ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, router_w]: [S; 13],
    ) -> Self {
        LayerTensors { ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b, router_w }
    }
}

/// The flat-buffer layout of one chunk on one tensor-parallel rank.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamLayout {
    dims: ShardDims,
    chunk: ChunkSpec,
    model_layers: usize,
    entries: Vec<ParamEntry>,
    /// Per layer of the chunk: its block (`Unit::Layer`) and its routed experts'
    /// (`Unit::Experts`, empty in a dense layer).
    layer_ranges: Vec<Range<usize>>,
    expert_ranges: Vec<Range<usize>>,
    /// Per layer: the 13 tensor sizes of its block (`LayerTensors` order).
    layer_sizes: Vec<[usize; 13]>,
    /// The MoE layers' shapes on this expert-parallel rank (`None`: a dense model).
    moe: Option<crate::moe::MoeDims>,
    /// Start of the head block (the buffer's length without a head).
    head_start: usize,
    len: usize,
}

impl ParamLayout {
    /// The layout of `chunk` of `model` on tensor-parallel rank `tp` (a MoE model's experts
    /// all on this rank).
    pub fn new(model: &ModelSpec, tp: TpRank, chunk: ChunkSpec) -> Result<ParamLayout, RuntimeError> {
        Self::with_ep(model, tp, (0, 1), chunk)
    }

    /// The layout of `chunk` on tensor-parallel rank `tp` and expert-parallel rank
    /// `ep = (rank, size)` (size divides the experts; validation checked it).
    pub fn with_ep(
        model: &ModelSpec,
        tp: TpRank,
        ep: (usize, usize),
        chunk: ChunkSpec,
    ) -> Result<ParamLayout, RuntimeError> {
        let dims = ShardDims::new(model, tp)?;
        let moe = model.moe.as_ref().map(|s| crate::moe::MoeDims {
            hidden: model.hidden as usize,
            experts: s.experts as usize,
            top_k: s.top_k as usize,
            ffn: s.expert_ffn_hidden as usize,
            shared_ffn: (s.shared_experts * s.shared_ffn_hidden) as usize / tp.size,
            score: s.score,
            ep_rank: ep.0,
            ep_size: ep.1,
        });
        if let Some(d) = &moe
            && (ep.1 == 0 || !d.experts.is_multiple_of(ep.1) || ep.0 >= ep.1)
        {
            return Err(RuntimeError::BadSetting(format!(
                "expert-parallel rank {} of {} for {} experts: ep must divide the experts",
                ep.0, ep.1, d.experts
            )));
        }
        let model_layers = model.layers as usize;
        if chunk.layers.start > chunk.layers.end || chunk.layers.end > model_layers {
            return Err(RuntimeError::BadSetting(format!(
                "chunk layers {:?} are not a range inside the model's {model_layers} layers",
                chunk.layers
            )));
        }
        let mut entries: Vec<ParamEntry> = Vec::new();
        let (e_all, fe) = moe.map_or((0, 0), |d| (d.experts, d.ffn));
        let push = |entries: &mut Vec<ParamEntry>,
                    kind: ParamKind,
                    layer: Option<usize>,
                    tied_copy: bool,
                    f: usize,
                    expert: Option<usize>| {
            let full_shape = kind.full_shape(&dims, f, e_all, fe);
            let shape = local_shape(&full_shape, kind.split(), tp.size);
            let offset = entries.last().map_or(0, |e| e.offset + e.len());
            entries.push(ParamEntry { kind, layer, offset, shape, full_shape, tied_copy, expert });
        };
        if chunk.embedding {
            push(&mut entries, ParamKind::Wte, None, false, 0, None);
            if ParamKind::Wpe.present(&dims) {
                push(&mut entries, ParamKind::Wpe, None, false, 0, None);
            }
        }
        let full_ffn = dims.ffn * tp.size;
        for l in chunk.layers.clone() {
            let moe_layer = model.is_moe_layer(l as u32).then_some(moe).flatten();
            let f = moe_layer.map_or(full_ffn, |d| d.shared_ffn * tp.size);
            for kind in LAYER_KINDS {
                let mlp = matches!(kind, ParamKind::Fc1W | ParamKind::Fc1B | ParamKind::Fc2W | ParamKind::Fc2B);
                if !(mlp && f == 0) && kind.present(&dims) {
                    push(&mut entries, kind, Some(l), false, f, None);
                }
            }
            if let Some(d) = moe_layer {
                push(&mut entries, ParamKind::RouterW, Some(l), false, 0, None);
                for x in d.first_local()..d.first_local() + d.local() {
                    for kind in EXPERT_KINDS.into_iter().filter(|k| k.present(&dims)) {
                        push(&mut entries, kind, Some(l), false, 0, Some(x));
                    }
                }
            }
        }
        let head_start = entries.last().map_or(0, |e| e.offset + e.len());
        if chunk.head {
            push(&mut entries, ParamKind::LnfW, None, false, 0, None);
            if ParamKind::LnfB.present(&dims) {
                push(&mut entries, ParamKind::LnfB, None, false, 0, None);
            }
            if ParamKind::OutW.present(&dims) {
                push(&mut entries, ParamKind::OutW, None, false, 0, None);
            } else if !chunk.embedding {
                push(&mut entries, ParamKind::Wte, None, true, 0, None);
            }
        }
        let len = entries.last().map_or(0, |e| e.offset + e.len());
        let span = |pick: &dyn Fn(&ParamEntry) -> bool| {
            let hits: Vec<&ParamEntry> = entries.iter().filter(|e| pick(e)).collect();
            hits.first().map_or(0..0, |a| a.offset..hits.last().map_or(a.offset, |z| z.offset + z.len()))
        };
        let mut layer_ranges = Vec::new();
        let mut expert_ranges = Vec::new();
        let mut layer_sizes = Vec::new();
        for l in chunk.layers.clone() {
            layer_ranges.push(span(&|e| e.layer == Some(l) && e.expert.is_none()));
            expert_ranges.push(span(&|e| e.layer == Some(l) && e.expert.is_some()));
            let mut sizes = [0usize; 13];
            for e in entries.iter().filter(|e| e.layer == Some(l) && e.expert.is_none()) {
                let i = LAYER_KINDS.iter().position(|k| *k == e.kind).unwrap_or(12);
                sizes[i] = e.len();
            }
            layer_sizes.push(sizes);
        }
        // Blocks are told apart by their length (`layer_block`): a dense and a MoE layer of
        // one chunk must differ in it.
        if layer_sizes
            .iter()
            .any(|a| layer_sizes.iter().any(|b| a != b && a.iter().sum::<usize>() == b.iter().sum::<usize>()))
        {
            return Err(RuntimeError::UnsupportedModel {
                model: model.name.clone(),
                reason: "a dense layer and a MoE layer hold the same number of parameters; the executor tells their blocks apart by length".into(),
            });
        }
        Ok(ParamLayout {
            dims,
            chunk,
            model_layers,
            entries,
            layer_ranges,
            expert_ranges,
            layer_sizes,
            moe,
            head_start,
            len,
        })
    }

    /// The MoE layers' shapes on this rank (`None` for a dense model).
    pub fn moe(&self) -> Option<&crate::moe::MoeDims> {
        self.moe.as_ref()
    }

    /// The flat range of local layer `local`'s routed experts (empty for a dense layer).
    pub fn experts_range(&self, local: usize) -> Range<usize> {
        self.expert_ranges[local].clone()
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

    /// The flat range of local layer `local`'s block (without its routed experts).
    pub fn layer_range(&self, local: usize) -> Range<usize> {
        assert!(local < self.num_layers(), "layer {local} of a chunk with {} layers", self.num_layers());
        self.layer_ranges[local].clone()
    }

    /// The local layer of a block of `len` elements: blocks are told apart by the caller's
    /// layer; this returns the sizes of the first local layer with that block length.
    fn sizes_of_block(&self, len: usize) -> [usize; 13] {
        *self
            .layer_sizes
            .iter()
            .find(|s| s.iter().sum::<usize>() == len)
            .unwrap_or_else(|| panic!("no layer of this chunk has a block of {len} elements"))
    }

    /// Views of layer `local` (0-based within the chunk) of a parameter buffer.
    pub fn layer<'a>(&self, buf: &'a [f32], local: usize) -> LayerParams<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        LayerTensors::from_array(split(&buf[self.layer_range(local)], self.layer_sizes[local]))
    }

    /// Mutable views of layer `local` of a gradient (or parameter) buffer.
    pub fn layer_mut<'a>(&self, buf: &'a mut [f32], local: usize) -> LayerGrads<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let range = self.layer_range(local);
        LayerTensors::from_array(split_mut(&mut buf[range], self.layer_sizes[local]))
    }

    /// Views of a layer from its own block (the layer's range of the flat buffer held
    /// apart, as the plan interpreter keeps ZeRO units). A dense and a MoE layer's blocks
    /// differ in length, which picks the sizes.
    pub fn layer_block<'a>(&self, block: &'a [f32]) -> LayerParams<'a> {
        LayerTensors::from_array(split(block, self.sizes_of_block(block.len())))
    }

    /// Mutable views of a layer block (see [`ParamLayout::layer_block`]).
    pub fn layer_block_mut<'a>(&self, block: &'a mut [f32]) -> LayerGrads<'a> {
        let sizes = self.sizes_of_block(block.len());
        LayerTensors::from_array(split_mut(block, sizes))
    }

    /// Sizes of `wte` and `wpe` (0 without a position table).
    fn embed_sizes(&self) -> [usize; 2] {
        assert!(self.chunk.embedding, "this chunk holds no embedding");
        let wpe = self.entries.get(1).filter(|e| e.kind == ParamKind::Wpe).map_or(0, ParamEntry::len);
        [self.entries[0].len(), wpe]
    }

    /// Sizes of the head block: `lnf_w`, `lnf_b` (0 under RMSNorm), and the output layer's
    /// own tensor (`out_w`, or the tied copy of `wte`; 0 when the chunk's `wte` serves).
    fn head_sizes(&self) -> [usize; 3] {
        let h = self.dims.hidden;
        let lnf_b = if ParamKind::LnfB.present(&self.dims) { h } else { 0 };
        [h, lnf_b, self.len - self.head_start() - h - lnf_b]
    }

    pub fn embedding<'a>(&self, buf: &'a [f32]) -> EmbedParams<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let embed_len = self.embed_sizes().iter().sum::<usize>();
        let [wte, wpe] = split(&buf[..embed_len], self.embed_sizes());
        EmbedTensors { wte, wpe }
    }

    pub fn embedding_mut<'a>(&self, buf: &'a mut [f32]) -> EmbedGrads<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let sizes = self.embed_sizes();
        let [wte, wpe] = split_mut(&mut buf[..sizes[0] + sizes[1]], sizes);
        EmbedTensors { wte, wpe }
    }

    /// Start of the head block, which ends the buffer.
    fn head_start(&self) -> usize {
        assert!(self.chunk.head, "this chunk holds no head");
        self.head_start
    }

    pub fn head<'a>(&self, buf: &'a [f32]) -> HeadParams<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let sizes = self.head_sizes();
        let [lnf_w, lnf_b, own] = split(&buf[self.head_start()..], sizes);
        let wte = if sizes[2] == 0 { self.embedding(buf).wte } else { own };
        HeadTensors { lnf_w, lnf_b, wte }
    }

    pub fn head_mut<'a>(&self, buf: &'a mut [f32]) -> HeadGrads<'a> {
        assert_eq!(buf.len(), self.len, "buffer does not match the layout");
        let (sizes, start, wte_len) = (self.head_sizes(), self.head_start(), self.dims.vocab * self.dims.hidden);
        let (front, back) = buf.split_at_mut(start);
        let [lnf_w, lnf_b, own] = split_mut(back, sizes);
        let wte = if sizes[2] == 0 { &mut front[..wte_len] } else { own };
        HeadTensors { lnf_w, lnf_b, wte }
    }

    /// A freshly initialised parameter buffer (see the module comment); deterministic in
    /// `seed` and independent of how the model is split.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut buf = vec![0.0f32; self.len];
        for e in &self.entries {
            let full_len: usize = e.full_shape.iter().product();
            let stream = match (e.layer, e.expert) {
                (Some(l), Some(x)) => expert_stream_id(e.kind, l, x),
                _ => stream_id(e.kind, e.layer),
            };
            let full: Vec<f32> = match e.kind.init(self.model_layers) {
                Init::Zeros => vec![0.0; full_len],
                Init::Ones => vec![1.0; full_len],
                Init::Normal(std) => normal_vec(full_len, std, seed, stream),
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
            TpSplit::Cols => {
                // Block g starts at column `starts[g]` and is `widths[g]` wide; rank r holds
                // its r-th t-th.
                let widths = e.kind.col_blocks(&self.dims, cols);
                let starts: Vec<usize> = widths.iter().scan(0, |at, w| Some(std::mem::replace(at, *at + w))).collect();
                (0..rows)
                    .flat_map(|i| {
                        widths.iter().zip(&starts).map(move |(w, s)| {
                            let per = w / t;
                            i * cols + s + r * per..i * cols + s + (r + 1) * per
                        })
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
