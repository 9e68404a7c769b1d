//! Sharding parity, picotron-style: a whole model chunk (embedding, two layers, head) runs
//! on t = 2 and t = 4 tensor-parallel shards in one thread, with the collectives done by
//! hand, with and without sequence parallelism, and every reduced activation, the loss and
//! every gradient must equal the unsharded run.
//!
//! Tolerance: the sharded run sums the same products in a different order (t partial sums
//! of D/t, F/t or V/t terms, then a sum over ranks), so results differ by f32 rounding only:
//! a few ulps per reduction, ≈ 1e-7 relative, grown by the ~20 sequential pieces to at
//! most ~1e-6 (measured: ≤ 1.2e-7). We assert max|sharded − full| ≤ 1e-5·max(1, max|full|)
//! per tensor; a sharding bug (a wrong shard, a bias or position row added t times, a
//! missing reduction) is an O(1) relative error.
//!
//! A second test cuts the model into two pipeline chunks with a tied copy of the word
//! table on the last one. This file is also a worked example of the data flow a plan
//! interpreter implements.

use strata_models::{Activation, Family, ModelSpec, Recompute};

use crate::embed::{embed_backward, embed_forward};
use crate::gradcheck::seeded_vec;
use crate::head::{
    HeadActs, STATS, final_norm_backward, final_norm_forward, logits_backward_input, logits_backward_weight,
    logits_forward, loss_forward,
};
use crate::layer::*;
use crate::micro::Micro;
use crate::params::{ChunkSpec, ParamLayout, TpSplit};
use crate::shard::TpRank;

const MB: Micro = Micro { batch: 2, seq: 6 };
const H: usize = 16;
const TOL: f32 = 1e-5;

fn spec() -> ModelSpec {
    ModelSpec {
        name: "parity".into(),
        family: Family::Gpt,
        layers: 2,
        hidden: H as u32,
        heads: 4,
        kv_heads: 4,
        head_dim: None,
        ffn_hidden: 32,
        vocab: 32,
        seq_len: 6,
        activation: Activation::Gelu,
        dropout: 0.0,
        rope_base: 500_000.0,
        moe: None,
        mla: None,
        mtp_layers: 0,
    }
}

/// One tensor-parallel rank's state.
struct Rank {
    layout: ParamLayout,
    params: Vec<f32>,
    grads: Vec<f32>,
    layers: Vec<LayerActs>,
    head: HeadActs,
}

/// The collectives of one tp group, done by hand on per-rank buffers (rank order).
struct Group {
    t: usize,
    sp: bool,
}

impl Group {
    fn sum(&self, parts: &[Vec<f32>]) -> Vec<f32> {
        let mut out = parts[0].clone();
        for p in &parts[1..] {
            out.iter_mut().zip(p).for_each(|(o, x)| *o += x);
        }
        out
    }

    /// Reduce a partial output: all-reduce, or reduce-scatter to row slices under SP.
    fn reduce(&self, parts: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let total = self.sum(parts);
        (0..self.t).map(|r| if self.sp { self.slice(&total, r) } else { total.clone() }).collect()
    }

    /// Gather a piece input: all-gather of row slices under SP, the identity otherwise.
    fn gather(&self, parts: &[Vec<f32>]) -> Vec<Vec<f32>> {
        if self.sp { vec![parts.concat(); self.t] } else { parts.to_vec() }
    }

    fn slice(&self, x: &[f32], r: usize) -> Vec<f32> {
        let n = x.len() / self.t;
        x[r * n..(r + 1) * n].to_vec()
    }

    /// The full tensor for the trace: rank 0's copy, or the concatenated slices.
    fn full(&self, parts: &[Vec<f32>]) -> Vec<f32> {
        if self.sp { parts.concat() } else { parts[0].clone() }
    }
}

/// Output of one run: (name, full tensor) in execution order, the loss, and each rank's
/// gradient buffer.
struct Run {
    trace: Vec<(String, Vec<f32>)>,
    loss: f64,
    ranks: Vec<Rank>,
}

fn run(
    full_layout: &ParamLayout,
    full_params: &[f32],
    t: usize,
    sp: bool,
    tokens: &[u32],
    recompute: Recompute,
) -> Run {
    let model = spec();
    let g = Group { t, sp };
    let mut ranks: Vec<Rank> = (0..t)
        .map(|r| {
            let layout = ParamLayout::new(&model, TpRank::new(r, t).unwrap(), ChunkSpec::whole(&model)).unwrap();
            let params = layout.shard_from(full_layout, full_params);
            let grads = vec![0.0; layout.len()];
            Rank { layout, params, grads, layers: vec![LayerActs::default(); 2], head: HeadActs::default() }
        })
        .collect();
    let (inputs, targets) = (&tokens[..MB.tokens()], &tokens[1..]);
    let tt = MB.tokens();
    let mut trace = Vec::new();
    let each = |ranks: &mut Vec<Rank>, f: &mut dyn FnMut(usize, &mut Rank) -> Vec<f32>| -> Vec<Vec<f32>> {
        ranks.iter_mut().enumerate().map(|(r, rank)| f(r, rank)).collect()
    };

    // Forward.
    let parts = each(&mut ranks, &mut |_, k| {
        let mut out = vec![0.0; tt * H];
        embed_forward(k.layout.dims(), &k.layout.embedding(&k.params), MB, inputs, &mut out);
        out
    });
    let mut res = g.reduce(&parts);
    trace.push(("embed".to_string(), g.full(&res)));
    for l in 0..2 {
        let a = g.gather(&each(&mut ranks, &mut |r, k| {
            let mut a = vec![0.0; res[r].len()];
            attn_in_forward(&k.layout.layer(&k.params, l), &res[r], &mut a, &mut k.layers[l]);
            a
        }));
        trace.push((format!("L{l} a"), a[0].clone()));
        let p = g.reduce(&each(&mut ranks, &mut |r, k| {
            let mut out = vec![0.0; tt * H];
            let (d, p) = (k.layout.dims(), k.layout.layer(&k.params, l));
            attn_forward(d, &p, MB, &a[r], &mut out, &mut k.layers[l], recompute);
            out
        }));
        trace.push((format!("L{l} attn out"), g.full(&p)));
        let m = g.gather(&each(&mut ranks, &mut |r, k| {
            let mut m = vec![0.0; res[r].len()];
            mlp_in_forward(&k.layout.layer(&k.params, l), &mut res[r], &p[r], &mut m, &mut k.layers[l]);
            m
        }));
        trace.push((format!("L{l} m"), m[0].clone()));
        let p2 = g.reduce(&each(&mut ranks, &mut |r, k| {
            let mut out = vec![0.0; tt * H];
            mlp_forward(k.layout.dims(), &k.layout.layer(&k.params, l), &m[r], &mut out, &mut k.layers[l]);
            out
        }));
        for (r, k) in ranks.iter_mut().enumerate() {
            layer_out_forward(&k.layout.layer(&k.params, l), &mut res[r], &p2[r]);
            if sp {
                // Keep only this rank's slice of the gathered inputs (GatherSaved).
                k.layers[l].a.keep_rows(r * tt / t..(r + 1) * tt / t);
                k.layers[l].m.keep_rows(r * tt / t..(r + 1) * tt / t);
            }
        }
        trace.push((format!("L{l} out"), g.full(&res)));
    }
    let hn = g.gather(&each(&mut ranks, &mut |r, k| {
        let mut hn = vec![0.0; res[r].len()];
        final_norm_forward(&k.layout.head(&k.params), &res[r], &mut hn, &mut k.head);
        hn
    }));
    trace.push(("hn".to_string(), hn[0].clone()));
    let stats = each(&mut ranks, &mut |r, k| {
        let mut st = vec![0.0; tt * STATS];
        logits_forward(k.layout.dims(), &k.layout.head(&k.params), &hn[r], targets, &mut k.head, &mut st);
        if sp {
            k.head.hn.keep_rows(r * tt / t..(r + 1) * tt / t);
        }
        st
    });
    let gathered = stats.concat();
    let losses: Vec<f64> = ranks.iter_mut().map(|k| loss_forward(&gathered, t, &mut k.head)).collect();
    assert!(losses.iter().all(|&x| x == losses[0]), "every tp rank computes the same loss");

    // Backward. Saved inputs that were kept as slices are gathered again for the weight halves.
    let regather = |parts: Vec<Vec<f32>>| g.gather(&parts);
    let dhn = g.reduce(&each(&mut ranks, &mut |_, k| {
        let mut dhn = vec![0.0; tt * H];
        logits_backward_input(
            k.layout.dims(),
            &k.layout.head(&k.params),
            &mut k.head,
            targets,
            1.0 / tt as f32,
            &mut dhn,
        );
        dhn
    }));
    let hn_saved = regather(ranks.iter().map(|k| k.head.hn.to_vec()).collect());
    let mut dres = each(&mut ranks, &mut |r, k| {
        let (p, mut gr) = (k.layout.head(&k.params), k.layout.head_mut(&mut k.grads));
        logits_backward_weight(k.layout.dims(), &k.head, &hn_saved[r], &mut gr);
        let mut dr = vec![0.0; dhn[r].len()];
        final_norm_backward(&p, &mut gr, &k.head, &dhn[r], &mut dr);
        dr
    });
    trace.push(("d hn-in".to_string(), g.full(&dres)));
    for l in (0..2).rev() {
        for (r, k) in ranks.iter_mut().enumerate() {
            layer_out_backward(&mut k.layout.layer_mut(&mut k.grads, l), &dres[r]);
        }
        let d_out = g.gather(&dres);
        let dm = g.reduce(&each(&mut ranks, &mut |r, k| {
            let mut dm = vec![0.0; tt * H];
            mlp_backward_input(k.layout.dims(), &k.layout.layer(&k.params, l), &mut k.layers[l], &d_out[r], &mut dm);
            dm
        }));
        let m_saved = regather(ranks.iter().map(|k| k.layers[l].m.to_vec()).collect());
        for (r, k) in ranks.iter_mut().enumerate() {
            let (d, p, mut gr) = (k.layout.dims(), k.layout.layer(&k.params, l), k.layout.layer_mut(&mut k.grads, l));
            mlp_backward_weight(d, &k.layers[l], &m_saved[r], &mut gr);
            mlp_in_backward(&p, &mut gr, &k.layers[l], &dm[r], &mut dres[r]);
        }
        trace.push((format!("L{l} d attn out"), g.full(&dres)));
        let d_out = g.gather(&dres);
        let da = g.reduce(&each(&mut ranks, &mut |r, k| {
            let mut da = vec![0.0; tt * H];
            let (d, p) = (k.layout.dims(), k.layout.layer(&k.params, l));
            attn_backward_input(d, &p, MB, &mut k.layers[l], &d_out[r], &mut da);
            da
        }));
        let a_saved = regather(ranks.iter().map(|k| k.layers[l].a.to_vec()).collect());
        for (r, k) in ranks.iter_mut().enumerate() {
            let (d, p, mut gr) = (k.layout.dims(), k.layout.layer(&k.params, l), k.layout.layer_mut(&mut k.grads, l));
            attn_backward_weight(d, &k.layers[l], &a_saved[r], &mut gr);
            attn_in_backward(&p, &mut gr, &k.layers[l], &da[r], &mut dres[r]);
        }
        trace.push((format!("L{l} d in"), g.full(&dres)));
    }
    let d_embed = g.gather(&dres);
    for (r, k) in ranks.iter_mut().enumerate() {
        embed_backward(k.layout.dims(), &mut k.layout.embedding_mut(&mut k.grads), MB, inputs, &d_embed[r]);
    }
    if sp {
        // Replicated tensors other than the position table saw only their rank's rows:
        // all-reduce their gradients over tp, as Megatron-LM does for sequence parallelism.
        let entries = ranks[0].layout.entries().to_vec();
        for e in entries.iter().filter(|e| e.kind.split() == TpSplit::Replicated && e.kind.name() != "wpe") {
            let total = g.sum(&ranks.iter().map(|k| k.grads[e.range()].to_vec()).collect::<Vec<_>>());
            ranks.iter_mut().for_each(|k| k.grads[e.range()].copy_from_slice(&total));
        }
    }
    Run { trace, loss: losses[0], ranks }
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: sizes differ");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let err = got.iter().zip(want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err <= TOL * scale, "{what}: max |sharded − full| = {err:e} > {TOL:e}·{scale}");
}

#[test]
fn sharded_pieces_equal_the_unsharded_model() {
    let model = spec();
    let full_layout = ParamLayout::new(&model, TpRank::SINGLE, ChunkSpec::whole(&model)).unwrap();
    // Random parameters of scale 0.3 rather than GPT-2's 0.02, so every piece matters.
    let full_params = seeded_vec(full_layout.len(), 1, 0.3);
    let tokens: Vec<u32> = (0..MB.tokens() + 1).map(|i| ((i * 7 + 3) % 32) as u32).collect();
    let reference = run(&full_layout, &full_params, 1, false, &tokens, Recompute::None);
    assert!(reference.loss.is_finite() && reference.loss > 0.0);
    for (t, sp, recompute) in [
        (2, false, Recompute::None),
        (4, false, Recompute::Selective),
        (2, true, Recompute::Selective),
        (4, true, Recompute::None),
    ] {
        let case = format!("t = {t}, sequence parallel {sp}, recompute {recompute:?}");
        let sharded = run(&full_layout, &full_params, t, sp, &tokens, recompute);
        assert!(
            (sharded.loss - reference.loss).abs() <= 1e-5 * reference.loss,
            "{case}: loss {} vs {}",
            sharded.loss,
            reference.loss
        );
        for ((name, got), (_, want)) in sharded.trace.iter().zip(&reference.trace) {
            assert_close(&format!("{case}: activation {name}"), got, want);
        }
        // Gradients: shards gathered into the full layout; replicated tensors must agree on
        // every rank.
        let mut gathered = vec![f32::NAN; full_layout.len()];
        for k in &sharded.ranks {
            k.layout.gather_into(&k.grads, &full_layout, &mut gathered);
            for (e, e0) in k.layout.entries().iter().zip(sharded.ranks[0].layout.entries()) {
                if e.kind.split() == TpSplit::Replicated {
                    assert_eq!(
                        &k.grads[e.range()],
                        &sharded.ranks[0].grads[e0.range()],
                        "{case}: {} differs across ranks",
                        e.name()
                    );
                }
            }
        }
        for e in full_layout.entries() {
            assert_close(
                &format!("{case}: gradient {}", e.name()),
                &gathered[e.range()],
                &reference.ranks[0].grads[e.range()],
            );
        }
    }
}

/// Pipeline parity at t = 1: the model cut into two chunks, the first holding the
/// embedding and layer 0, the last layer 1 and the head with its own tied copy of the word
/// table. Activations and gradients cross the boundary as a pipeline send would carry
/// them; the two copies' gradients are summed as the plan's `TiedEmbeddingGrad`
/// all-reduce does. The loss and every gradient but the word table's must equal the
/// one-chunk model bit for bit (the same operations run in the same order); the word
/// table's sums its two contributions in the other order, so it gets the f32 tolerance.
#[test]
fn pipeline_chunks_with_a_tied_copy_equal_the_whole_model() {
    let model = spec();
    let whole = ParamLayout::new(&model, TpRank::SINGLE, ChunkSpec::whole(&model)).unwrap();
    let first =
        ParamLayout::new(&model, TpRank::SINGLE, ChunkSpec { embedding: true, layers: 0..1, head: false }).unwrap();
    let last =
        ParamLayout::new(&model, TpRank::SINGLE, ChunkSpec { embedding: false, layers: 1..2, head: true }).unwrap();
    let (pw, pf, pl) = (whole.init(3), first.init(3), last.init(3));
    // Repeated tokens, so that word-table rows collect several contributions.
    let tokens: Vec<u32> = (0..MB.tokens() + 1).map(|i| ((i * 5 + 1) % 8) as u32).collect();
    let (inputs, targets) = (&tokens[..MB.tokens()], &tokens[1..]);

    // Runs `layers` (local indices) of a chunk forward then, given the output gradient,
    // backward; returns (output, input gradient).
    let layers_fwd = |layout: &ParamLayout, params: &[f32], acts: &mut [LayerActs], r: &mut Vec<f32>| {
        let d = layout.dims();
        for (l, act) in acts.iter_mut().enumerate() {
            let p = layout.layer(params, l);
            let (mut x, mut out) = (vec![0.0; r.len()], vec![0.0; r.len()]);
            attn_in_forward(&p, r, &mut x, act);
            attn_forward(d, &p, MB, &x, &mut out, act, Recompute::None);
            mlp_in_forward(&p, r, &out, &mut x, act);
            mlp_forward(d, &p, &x, &mut out, act);
            layer_out_forward(&p, r, &out);
        }
    };
    let layers_bwd =
        |layout: &ParamLayout, params: &[f32], grads: &mut [f32], acts: &mut [LayerActs], dr: &mut [f32]| {
            let d = layout.dims();
            for (l, act) in acts.iter_mut().enumerate().rev() {
                let (p, mut g) = (layout.layer(params, l), layout.layer_mut(grads, l));
                let mut partial = vec![0.0; dr.len()];
                layer_out_backward(&mut g, dr);
                mlp_backward_input(d, &p, act, dr, &mut partial);
                mlp_backward_weight(d, act, &act.m, &mut g);
                mlp_in_backward(&p, &mut g, act, &partial, dr);
                attn_backward_input(d, &p, MB, act, dr, &mut partial);
                attn_backward_weight(d, act, &act.a, &mut g);
                attn_in_backward(&p, &mut g, act, &partial, dr);
            }
        };
    let head = |layout: &ParamLayout, params: &[f32], grads: &mut [f32], r: &[f32]| {
        let (d, p, mut acts) = (layout.dims(), layout.head(params), HeadActs::default());
        let mut hn = vec![0.0; r.len()];
        final_norm_forward(&p, r, &mut hn, &mut acts);
        let mut stats = vec![0.0; MB.tokens() * STATS];
        logits_forward(d, &p, &hn, targets, &mut acts, &mut stats);
        let loss = loss_forward(&stats, 1, &mut acts);
        let mut dhn = vec![0.0; r.len()];
        logits_backward_input(d, &p, &mut acts, targets, 1.0 / MB.tokens() as f32, &mut dhn);
        let mut g = layout.head_mut(grads);
        logits_backward_weight(d, &acts, &acts.hn, &mut g);
        let mut dr = vec![0.0; r.len()];
        final_norm_backward(&p, &mut g, &acts, &dhn, &mut dr);
        (loss, dr)
    };
    let embed = |layout: &ParamLayout, params: &[f32]| {
        let mut r = vec![0.0; MB.tokens() * H];
        embed_forward(layout.dims(), &layout.embedding(params), MB, inputs, &mut r);
        r
    };

    // The whole model in one chunk.
    let mut gw = vec![0.0; whole.len()];
    let mut acts = vec![LayerActs::default(); 2];
    let mut r = embed(&whole, &pw);
    layers_fwd(&whole, &pw, &mut acts, &mut r);
    let (loss_whole, mut dr) = head(&whole, &pw, &mut gw, &r);
    layers_bwd(&whole, &pw, &mut gw, &mut acts, &mut dr);
    embed_backward(whole.dims(), &mut whole.embedding_mut(&mut gw), MB, inputs, &dr);

    // Two chunks: forward on the first, "send" r, forward + head + backward on the last,
    // "send" dr back, backward on the first.
    let (mut gf, mut gl) = (vec![0.0; first.len()], vec![0.0; last.len()]);
    let (mut acts_f, mut acts_l) = (vec![LayerActs::default()], vec![LayerActs::default()]);
    let mut r = embed(&first, &pf);
    layers_fwd(&first, &pf, &mut acts_f, &mut r);
    layers_fwd(&last, &pl, &mut acts_l, &mut r);
    let (loss_split, mut dr) = head(&last, &pl, &mut gl, &r);
    layers_bwd(&last, &pl, &mut gl, &mut acts_l, &mut dr);
    layers_bwd(&first, &pf, &mut gf, &mut acts_f, &mut dr);
    embed_backward(first.dims(), &mut first.embedding_mut(&mut gf), MB, inputs, &dr);
    // The embedding group's all-reduce of the two word-table copies.
    let tied: Vec<f32> = first.embedding(&gf).wte.iter().zip(last.head(&gl).wte.iter()).map(|(a, b)| a + b).collect();
    first.embedding_mut(&mut gf).wte.copy_from_slice(&tied);
    last.head_mut(&mut gl).wte.copy_from_slice(&tied);

    assert_eq!(loss_split, loss_whole);
    let by_name = |layout: &ParamLayout, g: &[f32]| {
        layout.entries().iter().map(|e| (e.name().replace("head.", ""), g[e.range()].to_vec())).collect::<Vec<_>>()
    };
    let mut split = by_name(&first, &gf);
    split.extend(by_name(&last, &gl));
    for (name, want) in by_name(&whole, &gw) {
        let got = split.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name} missing from the chunks"));
        if name == "wte" {
            assert_close("gradient of wte", &got.1, &want);
        } else {
            assert_eq!(got.1, want, "gradient of {name}");
        }
    }
}
