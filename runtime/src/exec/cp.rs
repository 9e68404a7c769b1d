//! Context parallelism on CPU ranks: the `AttnQkv`, `AttnCore`, `AttnProj` pieces and the
//! `Cp` collectives between them (`strata_models::plan::lower::cp` emits them).
//!
//! Rank r of the cp group holds chunks r and 2·cp − 1 − r of every sequence (the data side
//! cuts them, `RankExec::load_batches`; their positions feed the position table and the
//! causal mask, [`crate::attention_cp::cp_positions`]). Keys and values travel as one
//! block per rank: its K (T_l × D) followed by its V (T_l × D), T_l = b·s/cp rows.
//! - **ring**: at step i the rank holds the block of rank r − i (its own at 0), received by
//!   `RingExchange` i into buffer `kv((i − 1) mod 2)`; each step's partial output is merged
//!   by log-sum-exp into the running one. Backward re-circulates the blocks; the dK/dV of
//!   the block held are added to what the previous ranks accumulated (`dkv(i mod 2)`) and
//!   passed on, the cp-th pass bringing each rank its own. dQ stays local.
//! - **all-gather**: every rank's block gathered (`kv-all`), one core over them; backward
//!   re-gathers, and reduce-scatters the blocks' dK/dV (`dkv-all`) to their owners.
//! - **Ulysses**: all-to-all of Q/K/V from sequence to head sharding (group j of a/t/cp
//!   heads to rank j; `qkv-heads` holds, per source rank, its T_l rows of this rank's heads),
//!   the core over all s tokens, all-to-all of the output back; backward the reverse.
//!
//! What the pieces pass each other that is not a plan buffer (dctx, dq, the reduced dK/dV,
//! Ulysses' ctx and dqkv in sequence layout) lives in `CpWork`, measured as workspace.

use strata_models::parallel::CpComm;
use strata_models::plan::{BufId, CollKind, CollPurpose, CollectiveOp, ComputeOp, Phase, Piece};

use super::{RankExec, T};
use crate::attention_cp::{Heads, View, block_backward, block_forward, cp_positions, merge};
use crate::kernels::{add_bias, col_sum_into};
use crate::layer::LayerActs;
use crate::matmul::{MatMut, MatRef, Transpose, matmul};

/// The plan buffer a context-parallel exchange fills, from its name `cp ROLE L.. mb..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpRole {
    Kv(u8),
    Dkv(u8),
    KvAll,
    DkvAll,
    QkvHeads,
    OutHeads,
    DoutHeads,
    DqkvHeads,
}

impl CpRole {
    pub fn parse(s: &str) -> Option<CpRole> {
        Some(match s {
            "kv0" => CpRole::Kv(0),
            "kv1" => CpRole::Kv(1),
            "dkv0" => CpRole::Dkv(0),
            "dkv1" => CpRole::Dkv(1),
            "kv-all" => CpRole::KvAll,
            "dkv-all" => CpRole::DkvAll,
            "qkv-heads" => CpRole::QkvHeads,
            "out-heads" => CpRole::OutHeads,
            "dout-heads" => CpRole::DoutHeads,
            "dqkv-heads" => CpRole::DqkvHeads,
            _ => return None,
        })
    }
}

/// Tensors between the context-parallel pieces of one (layer, microbatch).
#[derive(Clone, Debug, Default)]
pub(crate) struct CpWork {
    dctx: Vec<f32>,
    dq: Vec<f32>,
    dkv: Vec<f32>,
    ctx: Vec<f32>,
    dqkv: Vec<f32>,
}

impl CpWork {
    pub(crate) fn bytes(&self) -> u64 {
        [&self.dctx, &self.dq, &self.dkv, &self.ctx, &self.dqkv].iter().map(|v| v.len() as u64 * 4).sum()
    }
}

/// y(T, n) = x(T, k)·W(k, n).
fn linear(x: &[f32], w: &[f32], y: &mut [f32], k: usize, n: usize) {
    let t = x.len() / k;
    matmul(MatRef::new(x, t, k), MatRef::new(w, k, n), MatMut::new(y, t, n), Transpose::Nn, 1.0, 0.0);
}

/// dx(T, k) = dy(T, n)·W(k, n)ᵀ.
fn linear_dinput(dy: &[f32], w: &[f32], dx: &mut [f32], k: usize, n: usize) {
    let t = dy.len() / n;
    matmul(MatRef::new(dy, t, n), MatRef::new(w, k, n), MatMut::new(dx, t, k), Transpose::Nt, 1.0, 0.0);
}

/// dW(k, n) += x(T, k)ᵀ·dy(T, n).
fn linear_dweight(x: &[f32], dy: &[f32], dw: &mut [f32], k: usize, n: usize) {
    let t = x.len() / k;
    matmul(MatRef::new(x, t, k), MatRef::new(dy, t, n), MatMut::new(dw, k, n), Transpose::Tn, 1.0, 1.0);
}

/// Columns `cols` of every row of a (rows, width) matrix, as a dense (rows, cols.len()).
fn columns(x: &[f32], width: usize, cols: std::ops::Range<usize>) -> Vec<f32> {
    x.chunks_exact(width).flat_map(|row| row[cols.clone()].iter().copied()).collect()
}

/// Writes dense (rows, cols.len()) `src` into columns `cols` of (rows, width) `dst`.
fn put_columns(dst: &mut [f32], width: usize, cols: std::ops::Range<usize>, src: &[f32]) {
    let w = cols.len();
    for (row, s) in dst.chunks_exact_mut(width).zip(src.chunks_exact(w)) {
        row[cols.clone()].copy_from_slice(s);
    }
}

impl RankExec {
    fn cp_comm(&self) -> CpComm {
        self.plan.scenario.parallel.cp_comm
    }

    fn cp_heads(&self, chunk: u32) -> Heads {
        let d = self.chunks[chunk as usize].layout.dims();
        Heads { batch: self.micro.batch, heads: d.heads, head_dim: d.head_dim }
    }

    /// Positions of the rows cp rank `j` holds.
    fn cp_pos(&self, j: usize) -> Vec<u32> {
        cp_positions(self.micro.seq * self.cp, self.cp, j)
    }

    fn cp_acts(&self, layer: u32, mb: u32) -> &LayerActs {
        let key = (layer, mb);
        self.rc_acts.get(&key).or_else(|| self.acts.get(&key)).expect("a context-parallel layer's activations")
    }

    /// This rank's K and V, as one block: K (T_l × D) then V (T_l × D).
    fn local_kv(qkv: &[f32], dc: usize) -> Vec<f32> {
        let mut kv = columns(qkv, 3 * dc, dc..2 * dc);
        kv.extend(columns(qkv, 3 * dc, 2 * dc..3 * dc));
        kv
    }

    /// The K and V views of a block of T_l rows (`kv_block` layout).
    fn kv_views<'a>(kv: &'a [f32], sl: usize, dc: usize) -> (View<'a>, View<'a>) {
        let half = kv.len() / 2;
        (
            View { data: &kv[..half], seq: sl, stride: dc, off: 0 },
            View { data: &kv[half..], seq: sl, stride: dc, off: 0 },
        )
    }

    /// A forward (or recomputed) context-parallel piece.
    pub(super) fn cp_forward_piece(&mut self, c: &ComputeOp, bufs: &[BufId], acts: &mut LayerActs) {
        let (chunk, mb, layer) = (c.chunk, c.mb, c.layer);
        let hs = self.cp_heads(chunk);
        let (dc, h, sl) = (hs.channels(), self.plan.hidden() as usize, self.micro.seq);
        let t = self.micro.tokens();
        let me = self.coord.cp as usize;
        match c.piece {
            Piece::AttnQkv => {
                let a = self.take(chunk, mb, self.gathered_input());
                let p = self.layer_params(chunk, layer, bufs);
                acts.a.assign(&a, &[t, h]);
                acts.qkv.reset(&[t, 3 * dc]);
                linear(&a, p.qkv_w, &mut acts.qkv, h, 3 * dc);
                add_bias(&mut acts.qkv, p.qkv_b);
                if self.sp {
                    let rows = self.my_rows(t * h);
                    acts.a.keep_rows(rows.start / h..rows.end / h);
                }
                acts.ctx.reset(&[t, dc]);
                acts.lse.reset(&[hs.batch, hs.heads, sl]);
                acts.lse.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
            }
            Piece::AttnCore if self.cp_comm() == CpComm::Ulysses => {
                let qkv_h = self.cp_store.remove(&(layer, mb, CpRole::QkvHeads)).expect("Q/K/V in head layout");
                let hu = Heads { heads: hs.heads / self.cp, ..hs };
                let du = hu.channels();
                let block = t * 3 * du;
                let mut out = vec![0.0f32; self.cp * t * du];
                let mut lse = vec![f32::NEG_INFINITY; self.cp * hs.batch * hu.heads * sl];
                for i in 0..self.cp {
                    let qb = &qkv_h[i * block..(i + 1) * block];
                    let q = View { data: qb, seq: sl, stride: 3 * du, off: 0 };
                    let (oi, li) = (
                        i * t * du..(i + 1) * t * du,
                        i * hs.batch * hu.heads * sl..(i + 1) * hs.batch * hu.heads * sl,
                    );
                    for j in 0..self.cp {
                        let kb = &qkv_h[j * block..(j + 1) * block];
                        let k = View { data: kb, seq: sl, stride: 3 * du, off: du };
                        let v = View { data: kb, seq: sl, stride: 3 * du, off: 2 * du };
                        let (mut o2, mut l2) = (vec![0.0; t * du], vec![0.0; li.len()]);
                        block_forward(&hu, q, k, v, &self.cp_pos(i), &self.cp_pos(j), &mut o2, &mut l2);
                        merge(&hu, sl, &mut out[oi.clone()], &mut lse[li.clone()], &o2, &l2);
                    }
                }
                acts.cp_qkv.assign(&qkv_h, &[qkv_h.len()]);
                acts.cp_out.assign(&out, &[out.len()]);
                acts.lse.assign(&lse, &[lse.len()]);
                // The sequence-layout Q/K/V are not needed again: the head layout is kept.
                acts.qkv.release();
                self.cp_store.insert((layer, mb, CpRole::OutHeads), out);
            }
            Piece::AttnCore => {
                let q = View { data: &acts.qkv, seq: sl, stride: 3 * dc, off: 0 };
                let sources: Vec<usize> = match self.cp_comm() {
                    CpComm::Ring => vec![(me + self.cp - c.step as usize) % self.cp],
                    _ => (0..self.cp).collect(),
                };
                let all = if self.cp_comm() == CpComm::AllGather {
                    self.cp_store.get(&(layer, mb, CpRole::KvAll)).cloned()
                } else {
                    None
                };
                let mut o = std::mem::take(&mut acts.ctx);
                let mut lse = std::mem::take(&mut acts.lse);
                for j in sources {
                    let held: Vec<f32> = match (&all, c.step) {
                        (Some(all), _) => all[j * 2 * t * dc..(j + 1) * 2 * t * dc].to_vec(),
                        (None, 0) => Self::local_kv(&acts.qkv, dc),
                        (None, i) => self.cp_store[&(layer, mb, CpRole::Kv(((i - 1) % 2) as u8))].clone(),
                    };
                    let (k, v) = Self::kv_views(&held, sl, dc);
                    let (mut o2, mut l2) = (vec![0.0; o.len()], vec![0.0; lse.len()]);
                    block_forward(&hs, q, k, v, &self.cp_pos(me), &self.cp_pos(j), &mut o2, &mut l2);
                    merge(&hs, sl, &mut o, &mut lse, &o2, &l2);
                }
                acts.ctx = o;
                acts.lse = lse;
            }
            Piece::AttnProj => {
                if self.cp_comm() == CpComm::Ulysses {
                    let ctx = std::mem::take(&mut self.cp_work.entry((layer, mb)).or_default().ctx);
                    acts.ctx.assign(&ctx, &[t, dc]);
                    self.cp_work.remove(&(layer, mb));
                }
                let mut out = vec![0.0; t * h];
                linear(&acts.ctx, self.layer_params(chunk, layer, bufs).proj_w, &mut out, dc, h);
                self.put(chunk, mb, T::Out, out);
            }
            p => panic!("rank {}: {} is not a context-parallel piece", self.rank, p.key()),
        }
    }

    /// A backward context-parallel piece; `grad` is the layer's gradient accumulator for
    /// the weight halves.
    pub(super) fn cp_backward_piece(
        &mut self,
        c: &ComputeOp,
        bufs: &[BufId],
        acts: &mut LayerActs,
        grad: Option<&mut Vec<f32>>,
    ) {
        let (chunk, mb, layer) = (c.chunk, c.mb, c.layer);
        let hs = self.cp_heads(chunk);
        let (dc, h, sl, t) = (hs.channels(), self.plan.hidden() as usize, self.micro.seq, self.micro.tokens());
        let me = self.coord.cp as usize;
        match (c.piece, c.phase) {
            (Piece::AttnProj, Phase::BackwardInput) => {
                let d_out = if self.sp { self.take(chunk, mb, T::DFull) } else { self.take(chunk, mb, T::Dr) };
                acts.d_proj_out.assign(&d_out, &[t, h]);
                let mut dctx = vec![0.0; t * dc];
                linear_dinput(&d_out, self.layer_params(chunk, layer, bufs).proj_w, &mut dctx, dc, h);
                if !self.sp {
                    self.put(chunk, mb, T::Dr, d_out);
                }
                let w = self.cp_work.entry((layer, mb)).or_default();
                w.dctx = dctx;
                w.dq = vec![0.0; t * dc];
            }
            (Piece::AttnCore, Phase::BackwardInput) if self.cp_comm() == CpComm::Ulysses => {
                let dout = self.cp_store.remove(&(layer, mb, CpRole::DoutHeads)).expect("dO in head layout");
                let hu = Heads { heads: hs.heads / self.cp, ..hs };
                let du = hu.channels();
                let (block, lb) = (t * 3 * du, hs.batch * hu.heads * sl);
                let qkv_h = &acts.cp_qkv;
                let mut dqkv = vec![0.0f32; self.cp * block];
                let mut dq = vec![vec![0.0f32; t * du]; self.cp];
                let (mut dk, mut dv) = (dq.clone(), dq.clone());
                for i in 0..self.cp {
                    let q = View { data: &qkv_h[i * block..(i + 1) * block], seq: sl, stride: 3 * du, off: 0 };
                    let o = &acts.cp_out[i * t * du..(i + 1) * t * du];
                    let (lse, d_o) = (&acts.lse[i * lb..(i + 1) * lb], &dout[i * t * du..(i + 1) * t * du]);
                    for j in 0..self.cp {
                        let kb = &qkv_h[j * block..(j + 1) * block];
                        let k = View { data: kb, seq: sl, stride: 3 * du, off: du };
                        let v = View { data: kb, seq: sl, stride: 3 * du, off: 2 * du };
                        let (pq, pk) = (self.cp_pos(i), self.cp_pos(j));
                        let (dkj, dvj) = (&mut dk[j], &mut dv[j]);
                        block_backward(&hu, q, k, v, &pq, &pk, o, lse, d_o, &mut dq[i], dkj, dvj);
                    }
                }
                for i in 0..self.cp {
                    let b = &mut dqkv[i * block..(i + 1) * block];
                    put_columns(b, 3 * du, 0..du, &dq[i]);
                    put_columns(b, 3 * du, du..2 * du, &dk[i]);
                    put_columns(b, 3 * du, 2 * du..3 * du, &dv[i]);
                }
                self.cp_store.insert((layer, mb, CpRole::DqkvHeads), dqkv);
            }
            (Piece::AttnCore, Phase::BackwardInput) => {
                let q = View { data: &acts.qkv, seq: sl, stride: 3 * dc, off: 0 };
                let mut w = self.cp_work.remove(&(layer, mb)).expect("dctx from the projection's backward");
                match self.cp_comm() {
                    CpComm::Ring => {
                        let i = c.step as usize;
                        let j = (me + self.cp - i) % self.cp;
                        let held: Vec<f32> = if i == 0 {
                            Self::local_kv(&acts.qkv, dc)
                        } else {
                            self.cp_store[&(layer, mb, CpRole::Kv(((i - 1) % 2) as u8))].clone()
                        };
                        let role = CpRole::Dkv((i % 2) as u8);
                        let mut dkv = if i == 0 {
                            vec![0.0; 2 * t * dc]
                        } else {
                            self.cp_store.remove(&(layer, mb, role)).expect("dK/dV passed on")
                        };
                        let (k, v) = Self::kv_views(&held, sl, dc);
                        let (dk, dv) = dkv.split_at_mut(t * dc);
                        block_backward(
                            &hs,
                            q,
                            k,
                            v,
                            &self.cp_pos(me),
                            &self.cp_pos(j),
                            &acts.ctx,
                            &acts.lse,
                            &w.dctx,
                            &mut w.dq,
                            dk,
                            dv,
                        );
                        self.cp_store.insert((layer, mb, role), dkv);
                    }
                    _ => {
                        let all = self.cp_store[&(layer, mb, CpRole::KvAll)].clone();
                        let mut dall = vec![0.0f32; all.len()];
                        for j in 0..self.cp {
                            let blk = j * 2 * t * dc..(j + 1) * 2 * t * dc;
                            let (k, v) = Self::kv_views(&all[blk.clone()], sl, dc);
                            let (dk, dv) = dall[blk].split_at_mut(t * dc);
                            block_backward(
                                &hs,
                                q,
                                k,
                                v,
                                &self.cp_pos(me),
                                &self.cp_pos(j),
                                &acts.ctx,
                                &acts.lse,
                                &w.dctx,
                                &mut w.dq,
                                dk,
                                dv,
                            );
                        }
                        self.cp_store.insert((layer, mb, CpRole::DkvAll), dall);
                    }
                }
                self.cp_work.insert((layer, mb), w);
            }
            (Piece::AttnQkv, Phase::BackwardInput) => {
                let w = self.cp_work.remove(&(layer, mb)).unwrap_or_default();
                let dqkv = match self.cp_comm() {
                    CpComm::Ulysses => w.dqkv,
                    comm => {
                        let dkv = if comm == CpComm::Ring {
                            self.cp_store
                                .remove(&(layer, mb, CpRole::Dkv((self.cp % 2) as u8)))
                                .expect("the rank's dK/dV home")
                        } else {
                            w.dkv
                        };
                        let mut dqkv = vec![0.0f32; t * 3 * dc];
                        put_columns(&mut dqkv, 3 * dc, 0..dc, &w.dq);
                        put_columns(&mut dqkv, 3 * dc, dc..2 * dc, &dkv[..t * dc]);
                        put_columns(&mut dqkv, 3 * dc, 2 * dc..3 * dc, &dkv[t * dc..]);
                        dqkv
                    }
                };
                let mut part = vec![0.0; t * h];
                linear_dinput(&dqkv, self.layer_params(chunk, layer, bufs).qkv_w, &mut part, h, 3 * dc);
                acts.d_qkv.assign(&dqkv, &[t, 3 * dc]);
                self.put(chunk, mb, T::DPart, part);
            }
            (Piece::AttnProj, Phase::BackwardWeight) => {
                let g = grad.expect("layer gradients");
                let layout = &self.chunks[chunk as usize].layout;
                let gv = layout.layer_block_mut(g);
                linear_dweight(&acts.ctx, &acts.d_proj_out, gv.proj_w, dc, h);
                acts.d_proj_out.release();
            }
            (Piece::AttnQkv, Phase::BackwardWeight) => {
                let saved = if self.sp { Some(self.take(chunk, mb, T::Saved)) } else { None };
                let g = grad.expect("layer gradients");
                let layout = &self.chunks[chunk as usize].layout;
                let gv = layout.layer_block_mut(g);
                linear_dweight(saved.as_deref().unwrap_or(&acts.a), &acts.d_qkv, gv.qkv_w, h, 3 * dc);
                col_sum_into(gv.qkv_b, &acts.d_qkv);
                acts.d_qkv.release();
            }
            (p, ph) => panic!("rank {}: {} {} is not a backward context-parallel op", self.rank, p.key(), ph.key()),
        }
    }

    /// The data this rank contributes to a `Cp` collective.
    pub(super) fn cp_coll_input(&mut self, c: &CollectiveOp) -> Vec<f32> {
        let CollPurpose::Cp { phase, mb, layer, step, chunk } = c.purpose else { unreachable!("a Cp collective") };
        let dc = self.cp_heads(chunk).channels();
        let cp = self.cp as u32;
        match (c.kind, phase) {
            (CollKind::RingExchange, _) if step > cp => {
                let i = step - cp - 1;
                self.cp_store.remove(&(layer, mb, CpRole::Dkv((i % 2) as u8))).expect("dK/dV to pass on")
            }
            (CollKind::RingExchange, _) if step == 1 => Self::local_kv(&self.cp_acts(layer, mb).qkv, dc),
            (CollKind::RingExchange, _) => self.cp_store[&(layer, mb, CpRole::Kv(((step - 2) % 2) as u8))].clone(),
            (CollKind::AllGather, _) => Self::local_kv(&self.cp_acts(layer, mb).qkv, dc),
            (CollKind::ReduceScatter, _) => {
                self.cp_store.remove(&(layer, mb, CpRole::DkvAll)).expect("dK/dV of every block")
            }
            (CollKind::AllToAll, Phase::BackwardInput) if step == 1 => {
                let dctx = std::mem::take(&mut self.cp_work.entry((layer, mb)).or_default().dctx);
                self.heads_split(&dctx, dc, 1)
            }
            (CollKind::AllToAll, Phase::BackwardInput) => {
                self.cp_store.remove(&(layer, mb, CpRole::DqkvHeads)).expect("dQ/dK/dV in head layout")
            }
            (CollKind::AllToAll, _) if step == 0 => {
                let qkv = self.cp_acts(layer, mb).qkv.to_vec();
                self.heads_split(&qkv, dc, 3)
            }
            (CollKind::AllToAll, _) => {
                self.cp_store.remove(&(layer, mb, CpRole::OutHeads)).expect("the output in head layout")
            }
            (k, _) => panic!("rank {}: a {} on the cp group", self.rank, k.key()),
        }
    }

    /// A (T_l, blocks·D) sequence-layout tensor cut into cp parts by head group: part j holds
    /// every row's columns of group j in each of the `blocks` D-wide blocks (Q, K, V).
    fn heads_split(&self, x: &[f32], dc: usize, blocks: usize) -> Vec<f32> {
        let du = dc / self.cp;
        let mut out = Vec::with_capacity(x.len());
        for j in 0..self.cp {
            for row in x.chunks_exact(blocks * dc) {
                for b in 0..blocks {
                    out.extend_from_slice(&row[b * dc + j * du..b * dc + (j + 1) * du]);
                }
            }
        }
        out
    }

    /// The inverse of [`RankExec::heads_split`]: cp parts (by head group) back to rows.
    fn heads_join(&self, parts: &[f32], dc: usize, blocks: usize) -> Vec<f32> {
        let du = dc / self.cp;
        let part = parts.len() / self.cp;
        let t = part / (blocks * du);
        let mut out = vec![0.0f32; t * blocks * dc];
        for j in 0..self.cp {
            for (r, src) in parts[j * part..(j + 1) * part].chunks_exact(blocks * du).enumerate() {
                for b in 0..blocks {
                    let dst = r * blocks * dc + b * dc + j * du;
                    out[dst..dst + du].copy_from_slice(&src[b * du..(b + 1) * du]);
                }
            }
        }
        out
    }

    /// Puts a `Cp` collective's result where the next piece reads it.
    pub(super) fn cp_coll_output(&mut self, c: &CollectiveOp, out: Vec<f32>) {
        let CollPurpose::Cp { phase, mb, layer, step, chunk } = c.purpose else { unreachable!("a Cp collective") };
        let dc = self.cp_heads(chunk).channels();
        let cp = self.cp as u32;
        let role = match (c.kind, phase) {
            (CollKind::RingExchange, _) if step > cp => CpRole::Dkv(((step - cp) % 2) as u8),
            (CollKind::RingExchange, _) => CpRole::Kv(((step - 1) % 2) as u8),
            (CollKind::AllGather, _) => CpRole::KvAll,
            (CollKind::ReduceScatter, _) => {
                self.cp_work.entry((layer, mb)).or_default().dkv = out;
                return;
            }
            (CollKind::AllToAll, Phase::BackwardInput) if step == 1 => CpRole::DoutHeads,
            (CollKind::AllToAll, Phase::BackwardInput) => {
                let dqkv = self.heads_join(&out, dc, 3);
                self.cp_work.entry((layer, mb)).or_default().dqkv = dqkv;
                return;
            }
            (CollKind::AllToAll, _) if step == 0 => CpRole::QkvHeads,
            (CollKind::AllToAll, _) => {
                let ctx = self.heads_join(&out, dc, 1);
                self.cp_work.entry((layer, mb)).or_default().ctx = ctx;
                return;
            }
            (k, _) => panic!("rank {}: a {} on the cp group", self.rank, k.key()),
        };
        self.cp_store.insert((layer, mb, role), out);
    }
}
