//! Collectives: which tensor each plan collective moves (from its `CollPurpose`), where the
//! result goes, and the end of step — gradient norm, clipping and the AdamW step.

use std::ops::Range;

use strata_models::plan::{
    BufId, CollKind, CollPurpose, CollectiveOp, GroupKind, Op, OpId, OpKind, Phase, Piece, TpSite, Unit,
};

use super::engine::Flight;
use super::pool::BufKey;
use super::units::{read_segment, write_segment};
use super::{ExecError, RankExec, T};
use crate::comm::Payload;
use crate::comm::collective::Pending;
use crate::kernels::sum_of_squares;
use crate::optim::{clip_scale, scale_in_place};
use crate::params::{ParamKind, TpSplit};

fn f32s(p: Payload) -> Vec<f32> {
    match p {
        Payload::F32(v) => v,
        other => panic!("expected f32 data, got {other:?}"),
    }
}

impl RankExec {
    pub(super) fn post_collective(&mut self, _id: OpId, c: &CollectiveOp, bufs: &[BufId]) -> Result<Flight, ExecError> {
        match c.purpose {
            CollPurpose::GradNorm => return Ok(Flight::Coll { pending: self.post_grad_norm()? }),
            CollPurpose::SpReplicatedGrads => return Ok(Flight::Coll { pending: self.post_sp_reduce()? }),
            CollPurpose::Moe { mb, layer, .. } => return Ok(Flight::Coll { pending: self.post_moe(layer, mb)? }),
            _ => {}
        }
        let data =
            if matches!(c.purpose, CollPurpose::Cp { .. }) { self.cp_coll_input(c) } else { self.coll_input(c, bufs) };
        let g = self.groups[&c.group].clone();
        Ok(Flight::Coll { pending: self.mailbox.post(&g, c.kind, false, Payload::F32(data))? })
    }

    pub(super) fn finish_collective(&mut self, f: &mut Flight, op: &Op) -> Result<bool, ExecError> {
        let (Flight::Coll { pending }, OpKind::Collective(c)) = (f, &op.kind) else {
            unreachable!("a collective flight belongs to a collective op")
        };
        if let CollPurpose::Moe { mb, layer, .. } = c.purpose {
            let Some(blocks) = self.mailbox.try_finish_blocks(pending) else { return Ok(false) };
            self.finish_moe(layer, mb, blocks);
            return Ok(true);
        }
        let Some(out) = self.mailbox.try_finish(pending) else { return Ok(false) };
        if c.purpose == CollPurpose::SpReplicatedGrads {
            self.apply_sp_reduce(out);
            return Ok(true);
        }
        if c.purpose == CollPurpose::GradNorm {
            let Payload::F64(total) = out else { panic!("the gradient norm is reduced in f64") };
            self.grad_norm = Some(total[0].sqrt());
            self.clip_scale = clip_scale(total[0], self.clip);
            return Ok(true);
        }
        if matches!(c.purpose, CollPurpose::Cp { .. }) {
            self.cp_coll_output(c, f32s(out));
        } else {
            self.coll_output(c, &op.bufs, f32s(out));
        }
        Ok(true)
    }

    fn bucket_pos(&self, chunk: u32, index: u32) -> usize {
        self.chunks[chunk as usize].buckets.iter().position(|b| b.index == index).expect("bucket of the chunk")
    }

    /// The chunk that holds this rank's copy of the word table.
    fn word_chunk(&self) -> u32 {
        self.chunks
            .iter()
            .position(|c| c.buckets.iter().any(|b| b.units.iter().any(|(u, _)| *u == Unit::WordEmbedding)))
            .expect("a tied-embedding all-reduce on a stage without the word table") as u32
    }

    fn saved_input(&self, piece: Piece, layer: u32, mb: u32) -> Vec<f32> {
        let key = (layer, mb);
        if piece == Piece::SharedExperts {
            return self.moe_saved_input(layer, mb);
        }
        let acts = self.rc_acts.get(&key).or_else(|| self.acts.get(&key)).expect("saved activations");
        if piece == Piece::Mlp { acts.m.to_vec() } else { acts.a.to_vec() }
    }

    /// The data this rank contributes.
    fn coll_input(&mut self, c: &CollectiveOp, _bufs: &[BufId]) -> Vec<f32> {
        match c.purpose {
            CollPurpose::Tp { site, piece, phase, mb, chunk, layer } => match (site, phase) {
                (TpSite::Reduce, Phase::BackwardInput) => self.take(chunk, mb, T::DPart),
                (TpSite::Reduce, _) => self.take(chunk, mb, T::Out),
                (TpSite::Gather, Phase::BackwardWeight) => self.take(chunk, mb, T::Dr),
                (TpSite::Gather, Phase::BackwardInput) => self.flight[&(chunk, mb, T::Dr)].clone(),
                // A MoE layer's router reads the same rows after the shared experts' gather.
                (TpSite::Gather, _) if piece == Piece::SharedExperts => self.flight[&(chunk, mb, T::X)].clone(),
                (TpSite::Gather, _) => self.take(chunk, mb, T::X),
                (TpSite::GatherSaved, _) if piece == Piece::Logits => self.heads[&mb].hn.to_vec(),
                (TpSite::GatherSaved, _) => self.saved_input(piece, layer, mb),
                (TpSite::LossStats, _) => self.take(chunk, mb, T::Stats),
            },
            CollPurpose::GradBucket { chunk, bucket, mb } | CollPurpose::ExpertGradBucket { chunk, bucket, mb } => {
                let ch = &self.chunks[chunk as usize];
                let b = &ch.buckets[self.bucket_pos(chunk, bucket)];
                let src = if self.zero < 2 { &ch.grads } else { &self.grad_buckets[&(chunk, bucket, mb)] };
                read_segment(b, src, 0..b.len)
            }
            CollPurpose::ParamBucket { chunk, bucket } => {
                let ch = &self.chunks[chunk as usize];
                let b = &ch.buckets[self.bucket_pos(chunk, bucket)];
                read_segment(b, &ch.params, b.owned.clone())
            }
            CollPurpose::ParamGather { chunk, bucket, .. } => {
                self.chunks[chunk as usize].param_shards[self.bucket_pos(chunk, bucket)].clone()
            }
            CollPurpose::TiedEmbeddingGrad => {
                let chunk = self.word_chunk();
                let bi = self.bucket_of(chunk, Unit::WordEmbedding);
                let ch = &self.chunks[chunk as usize];
                let b = &ch.buckets[bi];
                if self.zero < 2 { read_segment(b, &ch.grads, b.owned.clone()) } else { ch.grad_shards[bi].clone() }
            }
            CollPurpose::GradNorm | CollPurpose::SpReplicatedGrads => {
                unreachable!("posted by post_grad_norm / post_sp_reduce")
            }
            CollPurpose::Cp { .. } => unreachable!("posted by cp_coll_input"),
            CollPurpose::Moe { .. } => unreachable!("posted by post_moe"),
        }
    }

    /// Puts the result where the next op reads it.
    fn coll_output(&mut self, c: &CollectiveOp, bufs: &[BufId], out: Vec<f32>) {
        match c.purpose {
            CollPurpose::Tp { site, piece, phase, mb, chunk, .. } => {
                let dst = match (site, phase) {
                    (TpSite::Reduce, Phase::BackwardInput) => T::DRed,
                    (TpSite::Reduce, _) if piece == Piece::Embed => T::R,
                    (TpSite::Reduce, _) => T::Red,
                    (TpSite::Gather, Phase::BackwardInput | Phase::BackwardWeight) => T::DFull,
                    (TpSite::Gather, _) => T::XFull,
                    (TpSite::GatherSaved, _) => T::Saved,
                    (TpSite::LossStats, _) => T::StatsAll,
                };
                self.put(chunk, mb, dst, out);
            }
            CollPurpose::GradBucket { chunk, bucket, .. } | CollPurpose::ExpertGradBucket { chunk, bucket, .. } => {
                let bi = self.bucket_pos(chunk, bucket);
                let zero = self.zero;
                let ch = &mut self.chunks[chunk as usize];
                let b = &ch.buckets[bi];
                match zero {
                    0 => write_segment(b, &mut ch.grads, 0..b.len, &out),
                    // An all-reduced bucket (DeepSpeed's BF16_Optimizer) comes back whole.
                    1 if c.kind == CollKind::AllReduce => write_segment(b, &mut ch.grads, 0..b.len, &out),
                    1 => write_segment(b, &mut ch.grads, b.owned.clone(), &out),
                    _ => ch.grad_shards[bi].iter_mut().zip(&out).for_each(|(s, x)| *s += x),
                }
            }
            CollPurpose::ParamBucket { chunk, bucket } => {
                let bi = self.bucket_pos(chunk, bucket);
                let ch = &mut self.chunks[chunk as usize];
                let b = &ch.buckets[bi];
                write_segment(b, &mut ch.params, 0..b.len, &out);
            }
            CollPurpose::ParamGather { chunk, bucket, .. } => {
                let b = &self.chunks[chunk as usize].buckets[self.bucket_pos(chunk, bucket)];
                let mut at = 0;
                let units = b
                    .units
                    .iter()
                    .map(|(u, r)| {
                        at += r.len();
                        (*u, out[at - r.len()..at].to_vec())
                    })
                    .collect();
                let buf = *bufs
                    .iter()
                    .find(|x| matches!(self.pool.key(**x), Some(BufKey::Gathered { .. })))
                    .expect("a parameter gather names its gathered buffer");
                self.gathered.insert(buf, units);
            }
            CollPurpose::TiedEmbeddingGrad => {
                let chunk = self.word_chunk();
                let bi = self.bucket_of(chunk, Unit::WordEmbedding);
                let zero = self.zero;
                let ch = &mut self.chunks[chunk as usize];
                if zero < 2 {
                    let b = &ch.buckets[bi];
                    write_segment(b, &mut ch.grads, b.owned.clone(), &out);
                } else {
                    ch.grad_shards[bi] = out;
                }
            }
            CollPurpose::GradNorm | CollPurpose::SpReplicatedGrads => unreachable!("finished in finish_collective"),
            CollPurpose::Cp { .. } => unreachable!("finished by cp_coll_output"),
            CollPurpose::Moe { .. } => unreachable!("finished by finish_moe"),
        }
    }

    /// The owned gradient of optimizer piece `pi` of chunk `ci`.
    fn piece_grads(&mut self, ci: usize, pi: usize) -> &mut [f32] {
        let zero = self.zero;
        let c = &mut self.chunks[ci];
        let o = &c.opt[pi];
        if zero < 2 {
            &mut c.grads.get_mut(&o.unit).expect("held unit")[o.in_unit.clone()]
        } else {
            &mut c.grad_shards[o.bucket][o.in_shard.clone()]
        }
    }

    /// (chunk, piece, range inside the piece) of every layout entry that `keep` selects,
    /// over this rank's owned gradients, in a fixed order.
    fn owned_entry_ranges(
        &self,
        keep: impl Fn(&crate::params::ParamEntry) -> bool,
    ) -> Vec<(usize, usize, Range<usize>)> {
        let mut out = Vec::new();
        for (ci, c) in self.chunks.iter().enumerate() {
            for (pi, o) in c.opt.iter().enumerate() {
                let start = c.buckets[o.bucket].unit_offset(o.unit) + o.in_unit.start;
                let end = start + o.in_unit.len();
                for e in c.layout.entries().iter().filter(|e| keep(e)) {
                    let (lo, hi) = (e.offset.max(start), (e.offset + e.len()).min(end));
                    if lo < hi {
                        out.push((ci, pi, lo - start..hi - start));
                    }
                }
            }
        }
        out
    }

    /// Sequence parallelism: the replicated tensors' gradients, all-reduced over tp.
    fn sp_ranges(&self) -> Vec<(usize, usize, Range<usize>)> {
        self.owned_entry_ranges(|e| {
            e.kind.split() == TpSplit::Replicated && e.kind != ParamKind::Wpe && !e.kind.is_expert()
        })
    }

    pub(super) fn post_sp_reduce(&mut self) -> Result<Pending, ExecError> {
        let mut data = Vec::new();
        for (ci, pi, r) in self.sp_ranges() {
            data.extend_from_slice(&self.piece_grads(ci, pi)[r]);
        }
        let g = self.groups[&GroupKind::Tp].clone();
        Ok(self.mailbox.post(&g, strata_models::plan::CollKind::AllReduce, true, Payload::F32(data))?)
    }

    pub(super) fn apply_sp_reduce(&mut self, out: Payload) {
        let out = f32s(out);
        let mut at = 0;
        for (ci, pi, r) in self.sp_ranges() {
            let n = r.len();
            self.piece_grads(ci, pi)[r].copy_from_slice(&out[at..at + n]);
            at += n;
        }
        assert_eq!(at, out.len());
    }

    /// Σ g² over this rank's owned gradients, every parameter of the model counted once
    /// over the whole job (replicated tensors on tp rank 0, the tied copy never, and under
    /// ZeRO-0 only data-parallel rank 0, since every replica holds the same sums). A routed
    /// expert lives on one rank of each expert-parallel group and is replicated over the
    /// expert-data-parallel group: under ZeRO-0 expert-dp rank 0 counts it, under ZeRO ≥ 1
    /// its owner of each part.
    fn grad_sq_sum(&mut self) -> f64 {
        let first = |k: GroupKind| self.groups.get(&k).is_none_or(|g| g.position == 0);
        let dense = self.zero > 0 || first(GroupKind::Dp);
        let experts = self.zero > 0 || first(GroupKind::ExpertDp);
        let tp0 = self.coord.tp == 0;
        let ranges = self.owned_entry_ranges(|e| {
            !e.tied_copy
                && if e.kind.is_expert() { experts } else { dense && (e.kind.split() != TpSplit::Replicated || tp0) }
        });
        ranges.into_iter().map(|(ci, pi, r)| sum_of_squares(&self.piece_grads(ci, pi)[r])).sum()
    }

    fn post_grad_norm(&mut self) -> Result<Pending, ExecError> {
        let sq = self.grad_sq_sum();
        let g = self.groups[&GroupKind::World].clone();
        Ok(self.mailbox.post(&g, strata_models::plan::CollKind::AllReduce, false, Payload::F64(vec![sq]))?)
    }

    /// Clips and steps every owned piece, then zeroes the gradients for the next step.
    pub(super) fn optimizer_step(&mut self) {
        if let Some(bad) = self.first_nonfinite_grad() {
            // Never step on a NaN or infinity: the parameters stay the last good ones, and
            // the trainer stops the run naming the tensor.
            self.nonfinite_grad = Some(bad);
            for c in &mut self.chunks {
                c.grads.values_mut().for_each(|g| g.fill(0.0));
                c.grad_shards.iter_mut().for_each(|g| g.fill(0.0));
            }
            return;
        }
        let (zero, s, cfg) = (self.zero, self.clip_scale, self.adamw);
        for c in &mut self.chunks {
            let decay = c.layout.decay_ranges();
            for o in c.opt.iter_mut() {
                let g: &mut [f32] = if zero < 2 {
                    &mut c.grads.get_mut(&o.unit).expect("held unit")[o.in_unit.clone()]
                } else {
                    &mut c.grad_shards[o.bucket][o.in_shard.clone()]
                };
                scale_in_place(g, s);
                let p: &mut [f32] = if zero < 3 {
                    &mut c.params.get_mut(&o.unit).expect("held unit")[o.in_unit.clone()]
                } else {
                    &mut c.param_shards[o.bucket][o.in_shard.clone()]
                };
                o.adamw.update(&cfg, p, g, &decay);
            }
            c.grads.values_mut().for_each(|g| g.fill(0.0));
            c.grad_shards.iter_mut().for_each(|g| g.fill(0.0));
        }
    }
}
