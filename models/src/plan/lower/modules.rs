//! DeepSpeed ZeRO-3's per-module parameter fetches
//! ([`crate::framework::mechanics`]): each weight-bearing sub-module of a layer (QKV or
//! q/k/v, the attention projection, FC1/FC2 or gate/up/down) is all-gathered on its own
//! before the piece that runs it; on each fetch the modules that follow in the pass are
//! prefetched while the queued elements are under `min(prefetch_bucket, max_live − live)`;
//! a module is released after its piece (after its weight gradient in backward); a full
//! recomputation's gather is kept for the backward that follows it only where DeepSpeed's
//! reuse distance keeps it, else released and gathered again for the backward (the
//! recomputation's walk counts the backward occurrences it passes against the prefetch
//! budget, as the coordinator's queue pops them). Parameters at or under the persistence threshold (norms, biases) stay whole
//! and are never gathered.
//!
//! A gather is issued when the host reaches the fetching module's pre-hook: modelled as
//! after the compute op before the previous one (the host launches one module's kernels
//! and runs the next hook while they execute). Each gathered buffer's `Alloc` waits for
//! the releases the lowering already counted, so at run time the live gathered elements
//! never exceed what the lowering allowed.

use std::collections::BTreeMap;

use crate::accounting::memory::state_bytes_per_param;
use crate::framework::mechanics::Zero3Mechanics;
use crate::model::ModelSpec;
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;

/// The weight-bearing modules a layer piece runs, as element counts per tensor-parallel
/// rank, in execution order (forward). Parameters at or under the persistence threshold
/// are left out. Only `Attn` and `Mlp` carry such modules.
pub fn piece_modules(m: &ModelSpec, tp: u32, piece: Piece, persist: u64) -> Vec<u64> {
    gathered_modules(m, tp, piece, persist).into_iter().map(|(elements, _)| elements).collect()
}

/// Per module of [`piece_modules`] (the same order), how many tensors a fetch gathers: the
/// weight, and the bias where it is above the persistence threshold. DeepSpeed's host work
/// per fetch grows with them (see [`Zero3Mechanics::fetch_host_ns`]).
pub fn piece_module_tensors(m: &ModelSpec, tp: u32, piece: Piece, persist: u64) -> Vec<u64> {
    gathered_modules(m, tp, piece, persist).into_iter().map(|(_, tensors)| tensors).collect()
}

/// (gathered elements, gathered tensors) per weight-bearing module with anything gathered.
fn gathered_modules(m: &ModelSpec, tp: u32, piece: Piece, persist: u64) -> Vec<(u64, u64)> {
    let h = m.hidden as u64;
    let t = tp as u64;
    let (q, kv) = (m.q_dim(), m.kv_dim());
    let f = m.ffn_hidden as u64;
    let bias = m.has_bias();
    // (weight elements, bias elements) per module, before tensor parallelism.
    let shapes: Vec<(u64, u64)> = match piece {
        // HF Llama: q, k, v and o projections; GPT (Megatron-DeepSpeed, HF GPT-2): fused QKV.
        Piece::Attn if m.mlp_matrices() == 3 => vec![(h * q, 0), (h * kv, 0), (h * kv, 0), (q * h, 0)],
        Piece::Attn => vec![(h * (q + 2 * kv), if bias { q + 2 * kv } else { 0 }), (q * h, if bias { h } else { 0 })],
        Piece::Mlp if m.mlp_matrices() == 3 => vec![(h * f, 0), (h * f, 0), (f * h, 0)],
        Piece::Mlp => vec![(h * f, if bias { f } else { 0 }), (f * h, if bias { h } else { 0 })],
        _ => vec![],
    };
    shapes
        .into_iter()
        .map(|(w, b)| {
            // The row-parallel bias (projection, FC2) is replicated; the count is per rank.
            let gathered = [w / t, b.div_ceil(t)].into_iter().filter(|n| *n > persist);
            gathered.fold((0, 0), |(e, k), n| (e + n, k + 1))
        })
        .filter(|(elements, _)| *elements > 0)
        .collect()
}

/// Which pass a gather serves: a full recomputation's gather is reused by its backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Pass {
    Forward,
    Backward,
}

/// Where in the step a fetch happens, for the trace that follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Walk {
    Forward,
    /// A full recomputation's forward, inside the backward.
    Recompute,
    Backward,
    /// The backward of a layer whose forward was just recomputed.
    BackwardRecomputed,
}

impl Walk {
    fn pass(self) -> Pass {
        if self == Walk::Forward { Pass::Forward } else { Pass::Backward }
    }
}

/// One gathered module: (layer, piece, module index, mb, pass).
type ModKey = (u32, Piece, usize, u32, Pass);

/// Per-stage state of the module fetches.
#[derive(Default)]
pub(super) struct ModuleState {
    /// Gathered and not yet released: key → (gather op, buffer, elements).
    live: BTreeMap<ModKey, (OpId, BufId, u64)>,
    live_elems: u64,
    /// Frees emitted since the last gather's `Alloc` (which waits on them).
    released: Vec<OpId>,
}

impl<'p, 'a> StageLowering<'p, 'a> {
    /// DeepSpeed's ZeRO-3 mechanics when the plan gathers per module.
    pub(super) fn per_module(&self) -> Option<Zero3Mechanics> {
        if self.zero() < 3 {
            return None;
        }
        match self.s().training.framework.zero3_gathering(self.s()) {
            crate::framework::mechanics::Gathering::PerModule(m) => Some(m),
            crate::framework::mechanics::Gathering::PerUnit => None,
        }
    }

    fn modules(&self, piece: Piece, mech: &Zero3Mechanics) -> Vec<u64> {
        let s = self.s();
        piece_modules(&s.model, s.parallel.tp, piece, mech.persistence_threshold)
    }

    /// The (layer, piece, repeat) entries that follow (layer, piece) in DeepSpeed's module
    /// trace of this chunk's pass. A full recomputation re-runs each layer's forward (Attn,
    /// Mlp) just before its backward (Mlp, Attn); a *repeat* entry is such a backward
    /// occurrence seen from the recomputation, which the coordinator's queue pops (and
    /// counts against its prefetch budget) even when the module is still gathered.
    fn successors(&self, chunk: u32, layer: u32, piece: Piece, walk: Walk) -> Vec<(u32, Piece, bool)> {
        let layers = self.layers(chunk);
        let mut out = Vec::new();
        let recomputed = |out: &mut Vec<(u32, Piece, bool)>, l: u32| {
            out.extend([
                (l, Piece::Attn, false),
                (l, Piece::Mlp, false),
                (l, Piece::Mlp, true),
                (l, Piece::Attn, true),
            ]);
        };
        match walk {
            Walk::Forward => {
                if piece == Piece::Attn {
                    out.push((layer, Piece::Mlp, false));
                }
                for l in layer + 1..layers.end {
                    out.push((l, Piece::Attn, false));
                    out.push((l, Piece::Mlp, false));
                }
            }
            Walk::Recompute | Walk::BackwardRecomputed => {
                if walk == Walk::Recompute {
                    if piece == Piece::Attn {
                        out.push((layer, Piece::Mlp, false));
                    }
                    out.extend([(layer, Piece::Mlp, true), (layer, Piece::Attn, true)]);
                } else if piece == Piece::Mlp {
                    // Kept from the recomputation, it is popped now: counted.
                    out.push((layer, Piece::Attn, true));
                }
                for l in (layers.start..layer).rev() {
                    recomputed(&mut out, l);
                }
            }
            Walk::Backward => {
                if piece == Piece::Mlp {
                    out.push((layer, Piece::Attn, false));
                }
                for l in (layers.start..layer).rev() {
                    out.push((l, Piece::Mlp, false));
                    out.push((l, Piece::Attn, false));
                }
            }
        }
        out
    }

    fn gather_module(&mut self, key: ModKey, elems: u64, issue: &[OpId]) {
        let bytes = elems * state_bytes_per_param(self.dtype()).0;
        let (layer, piece, idx, mb, pass) = key;
        let chunk = self.chunk_of(layer);
        let wait = std::mem::take(&mut self.modules.released);
        let name = format!("gathered L{layer} {} m{idx} mb{mb}", piece.key());
        let (buf, _) = self.e.alloc(Stream::Dp, &wait, BufClass::Params, bytes, name);
        let bucket = self.unit_bucket[&(chunk, crate::plan::lowered::Unit::Layer(layer))];
        let phase = if pass == Pass::Forward { Phase::Forward } else { Phase::BackwardInput };
        let purpose = CollPurpose::ParamGather { chunk, bucket: self.buckets()[bucket].index, mb, phase };
        let shard = self.params_buf(chunk);
        let op = self.collective(Stream::Dp, issue, &[buf, shard], CollKind::AllGather, GroupKind::Dp, bytes, purpose);
        self.dp_ops.push(op);
        self.modules.live.insert(key, (op, buf, elems));
        self.modules.live_elems += elems;
    }

    /// Fetches the modules `piece` of `layer` runs in this pass, prefetching what follows.
    /// Returns the deps and buffers of the piece's compute op.
    pub(super) fn fetch_modules(
        &mut self,
        chunk: u32,
        layer: u32,
        piece: Piece,
        mb: u32,
        walk: Walk,
    ) -> (Vec<OpId>, Vec<BufId>) {
        let Some(mech) = self.per_module() else { return (vec![], vec![]) };
        let pass = walk.pass();
        let issue: Vec<OpId> = self.recent_compute.front().copied().into_iter().collect();
        let mods = self.modules(piece, &mech);
        let (mut deps, mut bufs) = (Vec::new(), Vec::new());
        for (i, elems) in mods.iter().enumerate() {
            let key = (layer, piece, i, mb, pass);
            if !self.modules.live.contains_key(&key) {
                self.gather_module(key, *elems, &issue);
            }
            let (op, buf, _) = self.modules.live[&key];
            deps.push(op);
            bufs.push(buf);
        }
        // Prefetch along the trace while under min(bucket, max_live − live) elements.
        let budget = mech.prefetch_bucket.min(mech.max_live.saturating_sub(self.modules.live_elems));
        let mut queued = 0u64;
        'trace: for (l, p, repeat) in self.successors(chunk, layer, piece, walk) {
            for (i, elems) in self.modules(p, &mech).into_iter().enumerate() {
                if queued >= budget {
                    break 'trace;
                }
                let key = (l, p, i, mb, pass);
                if !self.modules.live.contains_key(&key) {
                    self.gather_module(key, elems, &issue);
                    queued += elems;
                } else if repeat && mech.queue_counts_gathered {
                    queued += elems;
                }
            }
        }
        (deps, bufs)
    }

    /// Releases the modules of (layer, piece) after `after`.
    pub(super) fn release_modules(&mut self, layer: u32, piece: Piece, mb: u32, pass: Pass, after: OpId) {
        self.release_where(layer, piece, mb, pass, after, |_| true);
    }

    /// After a piece's full recomputation: releases the modules DeepSpeed's reuse distance
    /// does not keep for the layer's backward
    /// ([`crate::framework::mechanics::Zero3Mechanics::kept_for_backward`]).
    pub(super) fn release_recomputed(&mut self, layer: u32, piece: Piece, mb: u32, after: OpId) {
        let Some(mech) = self.per_module() else { return };
        let attn = self.modules(Piece::Attn, &mech);
        let mut all = attn.clone();
        if !self.s().model.is_moe_layer(layer) {
            all.extend(self.modules(Piece::Mlp, &mech));
        }
        let kept = mech.kept_for_backward(&all);
        let offset = if piece == Piece::Attn { 0 } else { attn.len() };
        self.release_where(layer, piece, mb, Pass::Backward, after, |i| !kept.get(offset + i).copied().unwrap_or(true));
    }

    fn release_where(
        &mut self,
        layer: u32,
        piece: Piece,
        mb: u32,
        pass: Pass,
        after: OpId,
        release: impl Fn(usize) -> bool,
    ) {
        let keys: Vec<ModKey> = self
            .modules
            .live
            .keys()
            .filter(|k| k.0 == layer && k.1 == piece && k.3 == mb && k.4 == pass && release(k.2))
            .copied()
            .collect();
        for k in keys {
            let (_, buf, elems) = self.modules.live.remove(&k).expect("listed");
            let f = self.e.free(Stream::Compute, &[after], buf);
            self.modules.released.push(f);
            self.modules.live_elems -= elems;
        }
    }

    /// The chunk of this stage that holds `layer`.
    fn chunk_of(&self, layer: u32) -> u32 {
        (0..self.s().parallel.vpp).find(|c| self.layers(*c).contains(&layer)).expect("a layer of this stage")
    }
}
