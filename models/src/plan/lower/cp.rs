//! Context-parallel attention (cp > 1): with each rank holding s/cp tokens of every
//! sequence (2·cp chunks, rank r holding chunks r and 2·cp − 1 − r), a layer's `Attn` runs
//! as `AttnQkv` → the exchange of keys and values over the `Cp` group → `AttnCore` →
//! `AttnProj`, in one of Transformer Engine's three ways (`parallel.cp_comm`,
//! `context_parallel.py`):
//! - **ring** (`AttnFuncWithCPAndKVP2P`): cp core steps; while step i attends to the K/V
//!   chunk it holds, `RingExchange` i + 1 passes that chunk to the next rank and receives
//!   the previous rank's into the other of two buffers (TE's double buffer). Backward runs
//!   the steps again: the K/V circulate as in forward, and after each step the dK/dV
//!   accumulated for the chunk held are passed on, the cp-th pass bringing them home — about
//!   twice the forward's bytes;
//! - **all-gather** (`AttnFuncWithCPAndKVAllGather`): all-gather K/V, one core; backward
//!   re-gathers K/V and reduce-scatters dK/dV;
//! - **Ulysses** (`AttnFuncWithCPAndQKVOA2A`): all-to-all Q/K/V from sequence to head
//!   sharding (step 0), one core over all s tokens with (a/t)/cp heads, all-to-all of the
//!   output back (step 1); backward the two reversed.
//!
//! Exchanges run on the `Tp` stream; their purposes are `CollPurpose::Cp` with `step` the
//! ring step (1 … cp − 1 for K/V; cp + 1 … 2·cp for the dK/dV passes of backward), 0 and 1
//! for the all-gather and the reduce-scatter, 0 and 1 for Ulysses' Q/K/V and output.
//! Their buffers are named `cp ROLE L<layer> mb<mb>` (ROLE: `kv0`, `kv1`, `dkv0`, `dkv1`,
//! `kv-all`, `dkv-all`, `qkv-heads`, `out-heads`, `dout-heads`, `dqkv-heads`), the names the
//! CPU executor binds its storage by. Heads are split by tp first, so every size here is of the rank's a/t heads and kv/t K/V
//! heads.

use std::collections::BTreeMap;

use crate::parallel::{CpComm, Recompute};
use crate::plan::cost::cp_piece_cost;
use crate::plan::ir::*;
use crate::plan::lower::StageLowering;
use crate::scenario::{Scenario, ScenarioError};

/// What the lowering of a context-parallel attention needs of the split: the sequence cut
/// into 2·cp chunks (ring, all-gather) or cp slices with whole heads per rank (Ulysses), and
/// fused attention under selective recomputation (Transformer Engine's context parallelism
/// runs fused kernels only; re-running an unfused core would need its exchange again).
pub(super) fn check(s: &Scenario) -> Result<(), ScenarioError> {
    let p = &s.parallel;
    if p.cp <= 1 {
        return Ok(());
    }
    let m = &s.model;
    let mut bad = Vec::new();
    let chunks = 2 * p.cp as u64;
    if !(m.seq_len as u64).is_multiple_of(chunks) {
        bad.push(format!(
            "model.seq_len = {} is not divisible by 2 · parallel.cp = {chunks}: context parallelism cuts each sequence into 2·cp load-balanced chunks",
            m.seq_len
        ));
    }
    if p.cp_comm == CpComm::Ulysses {
        for (key, heads) in [("heads", m.heads), ("kv_heads", m.kv_heads)] {
            if !(heads / p.tp.max(1)).is_multiple_of(p.cp) {
                bad.push(format!(
                    "parallel.cp_comm = \"ulysses\" needs model.{key} / tp = {heads} / {} divisible by parallel.cp = {}: each rank attends whole heads",
                    p.tp, p.cp
                ));
            }
        }
    }
    if p.recompute == Recompute::Selective && !s.training.flash_attention {
        bad.push(format!(
            "parallel.recompute = \"selective\" with parallel.cp = {} needs training.flash_attention = true: context-parallel attention runs fused kernels (Transformer Engine)",
            p.cp
        ));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ScenarioError::Invalid { origin: s.name.clone(), message: bad.join("\n"), config: None })
    }
}

/// Appends the costs of the context-parallel pieces (cp > 1) and maps them; returns the
/// cost ids of a later ring step of the core, per phase.
pub(super) fn costs(
    s: &Scenario,
    costs: &mut Vec<ComputeCost>,
    cost_ids: &mut BTreeMap<(Piece, Phase), CostId>,
    host_ns: &mut Vec<u64>,
) -> BTreeMap<Phase, CostId> {
    let p = &s.parallel;
    let mut later = BTreeMap::new();
    if p.cp <= 1 {
        return later;
    }
    let (dtype, flash) = (s.training.storage_dtype(), s.training.flash_attention);
    let mut push = |c: ComputeCost| {
        costs.push(c);
        if !host_ns.is_empty() {
            host_ns.push(0);
        }
        (costs.len() - 1) as CostId
    };
    for piece in [Piece::AttnQkv, Piece::AttnCore, Piece::AttnProj] {
        for phase in [Phase::Forward, Phase::BackwardInput, Phase::BackwardWeight, Phase::Recompute] {
            let id = push(cp_piece_cost(&s.model, p, dtype, flash, piece, phase, 0));
            cost_ids.insert((piece, phase), id);
        }
    }
    if p.cp_comm == CpComm::Ring {
        for phase in [Phase::Forward, Phase::BackwardInput, Phase::Recompute] {
            later.insert(phase, push(cp_piece_cost(&s.model, p, dtype, flash, Piece::AttnCore, phase, 1)));
        }
    }
    later
}

impl<'p, 'a> StageLowering<'p, 'a> {
    pub(super) fn cp(&self) -> u32 {
        self.s().parallel.cp
    }

    /// Bytes of the rank's keys and values of one microbatch: b·(s/cp)·2·(kv/t)·e.
    fn kv_bytes(&self) -> u64 {
        let s = self.s();
        self.rank_tokens() * 2 * (s.model.kv_dim() / s.parallel.tp as u64) * self.dtype().bytes()
    }

    /// Bytes of the rank's Q, K, V (Ulysses' first all-to-all) and of its attention output.
    fn qkv_out_bytes(&self) -> (u64, u64) {
        let s = self.s();
        let (t, e) = (s.parallel.tp as u64, self.dtype().bytes());
        let q = s.model.q_dim() / t;
        let qkv = q + 2 * s.model.kv_dim() / t;
        (self.rank_tokens() * qkv * e, self.rank_tokens() * q * e)
    }

    fn core(
        &mut self,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        step: u32,
        deps: &[OpId],
        bufs: &[BufId],
    ) -> OpId {
        let cost = if step == 0 { self.pl.cost(Piece::AttnCore, phase) } else { self.pl.ring_step_cost_ids[&phase] };
        let op = ComputeOp { piece: Piece::AttnCore, phase, mb, chunk, layer, step, cost };
        self.compute_step(op, deps, bufs)
    }

    #[allow(clippy::too_many_arguments)]
    fn cp_coll(
        &mut self,
        deps: &[OpId],
        bufs: &[BufId],
        kind: CollKind,
        bytes: u64,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        step: u32,
    ) -> OpId {
        let purpose = CollPurpose::Cp { phase, mb, chunk, layer, step };
        self.collective(Stream::Tp, deps, bufs, kind, GroupKind::Cp, bytes, purpose)
    }

    fn transient(&mut self, bytes: u64, name: String) -> (BufId, OpId) {
        self.e.alloc(Stream::Compute, &[], BufClass::Activations, bytes, name)
    }

    /// The forward (or recomputation) of a context-parallel attention; returns `AttnProj`.
    pub(super) fn cp_attention(
        &mut self,
        phase: Phase,
        mb: u32,
        chunk: u32,
        layer: u32,
        wait: &[OpId],
        bufs: &[BufId],
    ) -> OpId {
        let qkv = self.compute(Piece::AttnQkv, phase, mb, chunk, layer, wait, bufs);
        let act = bufs[0];
        let cp = self.cp();
        let mut core = Vec::new();
        match self.s().parallel.cp_comm {
            CpComm::Ring => {
                let kv = self.kv_bytes();
                let rx: Vec<(BufId, OpId)> =
                    (0..(cp - 1).min(2)).map(|i| self.transient(kv, format!("cp kv{i} L{layer} mb{mb}"))).collect();
                let mut exchange = vec![None; cp as usize];
                for i in 0..cp {
                    if i + 1 < cp {
                        // Receives step i + 1's K/V into the buffer step i − 1 read.
                        let (buf, alloc) = rx[(i % 2) as usize];
                        let mut d = vec![qkv, alloc];
                        if i >= 2 {
                            d.push(core[(i - 1) as usize]);
                        }
                        let op =
                            self.cp_coll(&d, &[act, buf], CollKind::RingExchange, kv, phase, mb, chunk, layer, i + 1);
                        exchange[(i + 1) as usize] = Some(op);
                    }
                    let mut b = bufs.to_vec();
                    let d: Vec<OpId> = exchange[i as usize].into_iter().collect();
                    if i > 0 {
                        b.push(rx[((i - 1) % 2) as usize].0);
                    }
                    core.push(self.core(phase, mb, chunk, layer, i, &d, &b));
                }
                let last = *core.last().expect("cp > 1 steps");
                for (buf, _) in rx {
                    self.e.free(Stream::Compute, &[last], buf);
                }
                self.compute(Piece::AttnProj, phase, mb, chunk, layer, &[], bufs)
            }
            CpComm::AllGather => {
                let full = self.kv_bytes() * cp as u64;
                let (buf, alloc) = self.transient(full, format!("cp kv-all L{layer} mb{mb}"));
                let g = self.cp_coll(&[qkv, alloc], &[act, buf], CollKind::AllGather, full, phase, mb, chunk, layer, 0);
                let mut b = bufs.to_vec();
                b.push(buf);
                let c = self.core(phase, mb, chunk, layer, 0, &[g], &b);
                self.e.free(Stream::Compute, &[c], buf);
                self.compute(Piece::AttnProj, phase, mb, chunk, layer, &[], bufs)
            }
            CpComm::Ulysses => {
                let (qkv_b, out_b) = self.qkv_out_bytes();
                let (heads, a0) = self.transient(qkv_b, format!("cp qkv-heads L{layer} mb{mb}"));
                let x = self.cp_coll(&[qkv, a0], &[act, heads], CollKind::AllToAll, qkv_b, phase, mb, chunk, layer, 0);
                let (out, a1) = self.transient(out_b, format!("cp out-heads L{layer} mb{mb}"));
                let mut b = bufs.to_vec();
                b.extend([heads, out]);
                let c = self.core(phase, mb, chunk, layer, 0, &[x], &b);
                let y = self.cp_coll(&[c, a1], &[act, out], CollKind::AllToAll, out_b, phase, mb, chunk, layer, 1);
                self.e.free(Stream::Compute, &[c], heads);
                let proj = self.compute(Piece::AttnProj, phase, mb, chunk, layer, &[y], bufs);
                self.e.free(Stream::Compute, &[proj], out);
                proj
            }
        }
    }

    /// The input-gradient pass of a context-parallel attention (`AttnProj`, the core's
    /// steps, `AttnQkv`, with their exchanges); returns `AttnQkv`'s.
    pub(super) fn cp_attention_backward(
        &mut self,
        mb: u32,
        chunk: u32,
        layer: u32,
        wait: &[OpId],
        bufs: &[BufId],
    ) -> OpId {
        let ph = Phase::BackwardInput;
        let act = bufs[0];
        let cp = self.cp();
        let kv = self.kv_bytes();
        match self.s().parallel.cp_comm {
            CpComm::Ring => {
                self.compute(Piece::AttnProj, ph, mb, chunk, layer, wait, bufs);
                let rx: Vec<(BufId, OpId)> =
                    (0..(cp - 1).min(2)).map(|i| self.transient(kv, format!("cp kv{i} L{layer} mb{mb}"))).collect();
                let dkv: Vec<(BufId, OpId)> =
                    (0..2).map(|i| self.transient(kv, format!("cp dkv{i} L{layer} mb{mb}"))).collect();
                let mut core: Vec<OpId> = Vec::new();
                let mut kv_x = vec![None; cp as usize];
                let mut dkv_x: Vec<Option<OpId>> = vec![None; cp as usize + 1];
                for i in 0..cp {
                    if i + 1 < cp {
                        let (buf, alloc) = rx[(i % 2) as usize];
                        let mut d = vec![alloc];
                        if i >= 2 {
                            d.push(core[(i - 1) as usize]);
                        }
                        let op = self.cp_coll(&d, &[act, buf], CollKind::RingExchange, kv, ph, mb, chunk, layer, i + 1);
                        kv_x[(i + 1) as usize] = Some(op);
                    }
                    // Step i adds to the dK/dV received for the chunk it holds (its own at 0).
                    let mut d: Vec<OpId> = kv_x[i as usize].into_iter().chain(dkv_x[i as usize]).collect();
                    d.push(dkv[0].1);
                    let mut b = bufs.to_vec();
                    if i > 0 {
                        b.push(rx[((i - 1) % 2) as usize].0);
                    }
                    b.push(dkv[(i % 2) as usize].0);
                    let c = self.core(ph, mb, chunk, layer, i, &d, &b);
                    core.push(c);
                    // Pass the accumulated dK/dV on; the cp-th pass brings the rank's own home.
                    let bufs_x = [dkv[(i % 2) as usize].0, dkv[((i + 1) % 2) as usize].0];
                    let d = [c, dkv[1].1];
                    let op = self.cp_coll(&d, &bufs_x, CollKind::RingExchange, kv, ph, mb, chunk, layer, cp + i + 1);
                    dkv_x[(i + 1) as usize] = Some(op);
                }
                let last = *core.last().expect("cp > 1 steps");
                for (buf, _) in rx {
                    self.e.free(Stream::Compute, &[last], buf);
                }
                let home = dkv_x[cp as usize].expect("the last dK/dV pass");
                let mut b = bufs.to_vec();
                b.push(dkv[(cp % 2) as usize].0);
                let op = self.compute(Piece::AttnQkv, ph, mb, chunk, layer, &[home], &b);
                for (buf, _) in dkv {
                    self.e.free(Stream::Compute, &[op], buf);
                }
                op
            }
            CpComm::AllGather => {
                let full = kv * cp as u64;
                // The re-gather of K/V overlaps the projection's backward.
                let (buf, alloc) = self.transient(full, format!("cp kv-all L{layer} mb{mb}"));
                let g = self.cp_coll(&[alloc], &[act, buf], CollKind::AllGather, full, ph, mb, chunk, layer, 0);
                self.compute(Piece::AttnProj, ph, mb, chunk, layer, wait, bufs);
                let (dbuf, dalloc) = self.transient(full, format!("cp dkv-all L{layer} mb{mb}"));
                let mut b = bufs.to_vec();
                b.extend([buf, dbuf]);
                let c = self.core(ph, mb, chunk, layer, 0, &[g, dalloc], &b);
                self.e.free(Stream::Compute, &[c], buf);
                let rs = self.cp_coll(&[c], &[act, dbuf], CollKind::ReduceScatter, full, ph, mb, chunk, layer, 1);
                let op = self.compute(Piece::AttnQkv, ph, mb, chunk, layer, &[rs], bufs);
                self.e.free(Stream::Compute, &[rs], dbuf);
                op
            }
            CpComm::Ulysses => {
                let (qkv_b, out_b) = self.qkv_out_bytes();
                let proj = self.compute(Piece::AttnProj, ph, mb, chunk, layer, wait, bufs);
                let (dout, a1) = self.transient(out_b, format!("cp dout-heads L{layer} mb{mb}"));
                let y = self.cp_coll(&[proj, a1], &[act, dout], CollKind::AllToAll, out_b, ph, mb, chunk, layer, 1);
                let (dqkv, a0) = self.transient(qkv_b, format!("cp dqkv-heads L{layer} mb{mb}"));
                let mut b = bufs.to_vec();
                b.extend([dout, dqkv]);
                let c = self.core(ph, mb, chunk, layer, 0, &[y, a0], &b);
                self.e.free(Stream::Compute, &[c], dout);
                let x = self.cp_coll(&[c], &[act, dqkv], CollKind::AllToAll, qkv_b, ph, mb, chunk, layer, 0);
                let op = self.compute(Piece::AttnQkv, ph, mb, chunk, layer, &[x], bufs);
                self.e.free(Stream::Compute, &[x], dqkv);
                op
            }
        }
    }

    /// The weight pass of a context-parallel attention: the output projection's and QKV's
    /// weight gradients (the core has no parameters); returns the last.
    pub(super) fn cp_attention_weight(
        &mut self,
        mb: u32,
        chunk: u32,
        layer: u32,
        wait: &[OpId],
        bufs: &[BufId],
    ) -> OpId {
        self.compute(Piece::AttnProj, Phase::BackwardWeight, mb, chunk, layer, wait, bufs);
        self.compute(Piece::AttnQkv, Phase::BackwardWeight, mb, chunk, layer, &[], bufs)
    }
}
