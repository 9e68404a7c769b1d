//! Block attention against the single-rank attention: the same outputs and gradients when
//! the sequence is cut into 2·cp chunks over cp ranks, and finite differences.

use super::*;
use crate::attention::{AttnShape, attention_backward, attention_forward};
use crate::gradcheck::{Probe, check_directional, seeded_vec};

const SH: AttnShape = AttnShape { batch: 2, seq: 16, heads: 2, head_dim: 3 };
const HS: Heads = Heads { batch: 2, heads: 2, head_dim: 3 };

fn view(qkv: &[f32], seq: usize, block: usize) -> View<'_> {
    let d = HS.channels();
    View { data: qkv, seq, stride: 3 * d, off: block * d }
}

/// Rows of (batch·seq, width) `x` at `pos` of every sequence.
fn rows_at(x: &[f32], seq: usize, width: usize, pos: &[u32]) -> Vec<f32> {
    let mut out = Vec::new();
    for b in 0..HS.batch {
        for &p in pos {
            let r = (b * seq + p as usize) * width;
            out.extend_from_slice(&x[r..r + width]);
        }
    }
    out
}

/// Rank r's attention output over cp ranks: its queries against every rank's keys.
fn cp_forward(qkv: &[f32], cp: usize, r: usize) -> (Vec<f32>, Vec<f32>) {
    let (s, d) = (SH.seq, HS.channels());
    let sl = s / cp;
    let pos_q = cp_positions(s, cp, r);
    let mine = rows_at(qkv, s, 3 * d, &pos_q);
    let mut o = vec![0.0; HS.batch * sl * d];
    let mut lse = vec![f32::NEG_INFINITY; HS.batch * HS.heads * sl];
    for j in 0..cp {
        let pos_k = cp_positions(s, cp, j);
        let theirs = rows_at(qkv, s, 3 * d, &pos_k);
        let (mut o2, mut l2) = (vec![0.0; o.len()], vec![0.0; lse.len()]);
        let (q, k, v) = (view(&mine, sl, 0), view(&theirs, sl, 1), view(&theirs, sl, 2));
        block_forward(&HS, q, k, v, &pos_q, &pos_k, &mut o2, &mut l2);
        merge(&HS, sl, &mut o, &mut lse, &o2, &l2);
    }
    (o, lse)
}

#[test]
fn positions_are_the_load_balanced_chunks() {
    assert_eq!(cp_positions(8, 2, 0), vec![0, 1, 6, 7]);
    assert_eq!(cp_positions(8, 2, 1), vec![2, 3, 4, 5]);
    assert_eq!(cp_positions(16, 4, 3), vec![6, 7, 8, 9]);
    assert_eq!(cp_positions(4, 1, 0), vec![0, 1, 2, 3]);
}

#[test]
fn blocks_over_cp_ranks_give_the_single_rank_output() {
    let qkv = seeded_vec(SH.tokens() * 3 * SH.channels(), 11, 1.0);
    let mut full = vec![0.0; SH.tokens() * SH.channels()];
    attention_forward(&SH, &qkv, &mut full, None);
    for cp in [1, 2, 4] {
        for r in 0..cp {
            let (o, _) = cp_forward(&qkv, cp, r);
            let want = rows_at(&full, SH.seq, SH.channels(), &cp_positions(SH.seq, cp, r));
            let err = o.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(err < 1e-6, "cp {cp} rank {r}: max |Δ| {err}");
        }
    }
}

#[test]
fn block_gradients_sum_to_the_single_rank_gradients() {
    let (s, d) = (SH.seq, SH.channels());
    let qkv = seeded_vec(SH.tokens() * 3 * d, 12, 1.0);
    let d_ctx = seeded_vec(SH.tokens() * d, 13, 1.0);
    let mut want = vec![0.0; qkv.len()];
    attention_backward(&SH, &qkv, None, &d_ctx, &mut want);
    for cp in [2, 4] {
        let sl = s / cp;
        // dq, dk, dv of every position, summed over the ranks that computed a part.
        let mut got = vec![0.0f32; qkv.len()];
        for r in 0..cp {
            let pos_q = cp_positions(s, cp, r);
            let mine = rows_at(&qkv, s, 3 * d, &pos_q);
            let (o, lse) = cp_forward(&qkv, cp, r);
            let d_o = rows_at(&d_ctx, s, d, &pos_q);
            let mut dq = vec![0.0; o.len()];
            for j in 0..cp {
                let pos_k = cp_positions(s, cp, j);
                let theirs = rows_at(&qkv, s, 3 * d, &pos_k);
                let (mut dk, mut dv) = (vec![0.0; o.len()], vec![0.0; o.len()]);
                let (q, k, v) = (view(&mine, sl, 0), view(&theirs, sl, 1), view(&theirs, sl, 2));
                block_backward(&HS, q, k, v, &pos_q, &pos_k, &o, &lse, &d_o, &mut dq, &mut dk, &mut dv);
                for b in 0..HS.batch {
                    for (i, &p) in pos_k.iter().enumerate() {
                        let (src, dst) = ((b * sl + i) * d, (b * s + p as usize) * 3 * d);
                        for c in 0..d {
                            got[dst + d + c] += dk[src + c];
                            got[dst + 2 * d + c] += dv[src + c];
                        }
                    }
                }
            }
            for b in 0..HS.batch {
                for (i, &p) in pos_q.iter().enumerate() {
                    let (src, dst) = ((b * sl + i) * d, (b * s + p as usize) * 3 * d);
                    got[dst..dst + d].iter_mut().zip(&dq[src..src + d]).for_each(|(g, x)| *g += x);
                }
            }
        }
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-5, "cp {cp}: max |Δ dqkv| {err}");
    }
}

/// One block with a partial mask (some rows see no key at all) against finite differences
/// of the forward, through q, k and v.
#[test]
fn block_backward_matches_finite_differences() {
    let (sq, sk, d) = (4, 6, HS.channels());
    let pos_q = [1u32, 3, 8, 9];
    let pos_k = [2u32, 3, 4, 5, 6, 7];
    let q0 = seeded_vec(HS.batch * sq * d, 21, 1.0);
    let kv0 = seeded_vec(HS.batch * sk * 2 * d, 22, 1.0);
    let forward = |q: &[f32], kv: &[f32]| {
        let mut o = vec![0.0; HS.batch * sq * d];
        let mut lse = vec![0.0; HS.batch * HS.heads * sq];
        let qv = View { data: q, seq: sq, stride: d, off: 0 };
        let (k, v) =
            (View { data: kv, seq: sk, stride: 2 * d, off: 0 }, View { data: kv, seq: sk, stride: 2 * d, off: d });
        block_forward(&HS, qv, k, v, &pos_q, &pos_k, &mut o, &mut lse);
        (o, lse)
    };
    let (o, lse) = forward(&q0, &kv0);
    // Query 1 sees no key of the block: its output is zero and its lse −∞.
    assert!(lse[0].is_infinite() && o[..d].iter().all(|x| *x == 0.0));
    let probe = Probe::new(o.len(), 23);
    let (mut dq, mut dk, mut dv) = (vec![0.0; o.len()], vec![0.0; HS.batch * sk * d], vec![0.0; HS.batch * sk * d]);
    {
        let qv = View { data: &q0, seq: sq, stride: d, off: 0 };
        let k = View { data: &kv0, seq: sk, stride: 2 * d, off: 0 };
        let v = View { data: &kv0, seq: sk, stride: 2 * d, off: d };
        block_backward(&HS, qv, k, v, &pos_q, &pos_k, &o, &lse, &probe.weights, &mut dq, &mut dk, &mut dv);
    }
    check_directional("block attention dq", &q0, &dq, 31, |x| probe.loss(&forward(x, &kv0).0));
    let mut dkv = vec![0.0; kv0.len()];
    for r in 0..HS.batch * sk {
        dkv[r * 2 * d..r * 2 * d + d].copy_from_slice(&dk[r * d..(r + 1) * d]);
        dkv[r * 2 * d + d..(r + 1) * 2 * d].copy_from_slice(&dv[r * d..(r + 1) * d]);
    }
    check_directional("block attention dk, dv", &kv0, &dkv, 32, |x| probe.loss(&forward(&q0, x).0));
}
