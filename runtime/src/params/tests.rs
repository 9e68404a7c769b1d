//! The flat layout: sizes in closed form, order, views, split-independent initialisation,
//! sharding round trips, and the de-duplicated gradient norm.

use strata_models::ModelSpec;

use super::*;

fn tiny() -> ModelSpec {
    ModelSpec::preset("tiny-gpt").expect("preset")
}

fn layout(model: &ModelSpec, rank: usize, t: usize, chunk: ChunkSpec) -> ParamLayout {
    ParamLayout::new(model, TpRank::new(rank, t).unwrap(), chunk).unwrap()
}

#[test]
fn whole_model_size_is_the_closed_form() {
    // V·h + s·h + L·(4h² + 2hf + 9h + f) + 2h for the GPT family.
    let m = tiny();
    let (v, s, h, f, l) = (256, 64, 64, 256, 4);
    let full = layout(&m, 0, 1, ChunkSpec::whole(&m));
    assert_eq!(full.len(), v * h + s * h + l * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h);
    // On t ranks the split tensors shrink by t and the replicated ones do not.
    let r1 = layout(&m, 1, 2, ChunkSpec::whole(&m));
    let replicated = s * h + l * (6 * h) + 2 * h;
    assert_eq!(r1.len(), (full.len() - replicated) / 2 + replicated);
}

#[test]
fn order_and_names_are_the_documented_ones() {
    let m = tiny();
    let names: Vec<String> = layout(&m, 0, 1, ChunkSpec::whole(&m)).entries().iter().map(ParamEntry::name).collect();
    let layer0 =
        ["ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b", "ln2_w", "ln2_b", "fc1_w", "fc1_b", "fc2_w", "fc2_b"];
    assert_eq!(&names[..2], &["wte", "wpe"]);
    for (i, n) in layer0.iter().enumerate() {
        assert_eq!(names[2 + i], format!("layers.0.{n}"));
    }
    assert_eq!(&names[names.len() - 2..], &["lnf_w", "lnf_b"]);
    // A last-stage chunk without the embedding keeps a tied copy at the very end.
    let last = layout(&m, 0, 1, ChunkSpec { embedding: false, layers: 2..4, head: true });
    let names: Vec<String> = last.entries().iter().map(ParamEntry::name).collect();
    assert_eq!(names[0], "layers.2.ln1_w");
    assert_eq!(names.last().map(String::as_str), Some("head.wte"));
}

#[test]
fn views_point_at_their_entries() {
    let m = tiny();
    let l = layout(&m, 1, 2, ChunkSpec::whole(&m));
    let buf: Vec<f32> = (0..l.len()).map(|i| i as f32).collect();
    let find = |name: &str| l.entries().iter().find(|e| e.name() == name).unwrap().clone();
    let view = l.layer(&buf, 1);
    let e = find("layers.1.qkv_w");
    assert_eq!((view.qkv_w[0], view.qkv_w.len()), (e.offset as f32, 64 * 96));
    assert_eq!(view.fc2_b[0], find("layers.1.fc2_b").offset as f32);
    let head = l.head(&buf);
    assert_eq!(head.wte.as_ptr(), l.embedding(&buf).wte.as_ptr(), "one chunk holds one tied table");
    assert_eq!(head.lnf_w[0], find("lnf_w").offset as f32);
    let mut grads = buf.clone();
    l.head_mut(&mut grads).wte[0] = -1.0;
    l.layer_mut(&mut grads, 3).fc2_b[0] = -2.0;
    assert_eq!(grads[0], -1.0);
    assert_eq!(grads[find("layers.3.fc2_b").offset], -2.0);
}

#[test]
fn initialisation_follows_gpt2_and_is_the_same_for_every_split() {
    let m = tiny();
    let full_layout = layout(&m, 0, 1, ChunkSpec::whole(&m));
    let full = full_layout.init(7);
    let stats = |name: &str| {
        let e = full_layout.entries().iter().find(|e| e.name() == name).unwrap();
        let x = &full[e.range()];
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64;
        (mean, var.sqrt())
    };
    // 16,384 samples: the sample std is within 2% of the true one with overwhelming odds.
    let (mean, std) = stats("wte");
    assert!(mean.abs() < 1e-3 && (std - 0.02).abs() < 4e-4, "wte N(0, 0.02): mean {mean}, std {std}");
    let (_, std) = stats("layers.2.fc2_w");
    let want = 0.02 / (2.0f64 * 4.0).sqrt();
    assert!((std - want).abs() < 0.02 * want, "residual projection std {std}, want {want}");
    assert_eq!(stats("layers.0.ln1_w"), (1.0, 0.0));
    assert_eq!(stats("layers.0.qkv_b"), (0.0, 0.0));
    assert_ne!(full, full_layout.init(8), "the seed matters");
    // Every tp rank and every pipeline chunk initialises exactly its part of the full model.
    for t in [2, 4] {
        for r in 0..t {
            let l = layout(&m, r, t, ChunkSpec::whole(&m));
            assert_eq!(l.init(7), l.shard_from(&full_layout, &full), "tp rank {r} of {t}");
        }
    }
    let last = layout(&m, 0, 1, ChunkSpec { embedding: false, layers: 2..4, head: true });
    let last_init = last.init(7);
    let wte = full_layout.entries()[0].range();
    assert_eq!(last.head(&last_init).wte, &full[wte], "the tied copy starts equal to the embedding");
    assert_eq!(last.layer(&last_init, 0).qkv_w, full_layout.layer(&full, 2).qkv_w);
}

#[test]
fn sharding_round_trips_and_column_shards_are_whole_heads() {
    let m = tiny();
    let full_layout = layout(&m, 0, 1, ChunkSpec::whole(&m));
    let full: Vec<f32> = (0..full_layout.len()).map(|i| i as f32).collect();
    for t in [2, 4] {
        let mut back = vec![f32::NAN; full.len()];
        for r in 0..t {
            let l = layout(&m, r, t, ChunkSpec::whole(&m));
            let shard = l.shard_from(&full_layout, &full);
            l.gather_into(&shard, &full_layout, &mut back);
            // Rank r's first QKV row holds columns [r·D, (r+1)·D) of each of Q, K and V.
            let (d, q0) = (64 / t, full_layout.layer(&full, 0).qkv_w[0]);
            let row0 = &l.layer(&shard, 0).qkv_w[..3 * d];
            for (g, chunk) in row0.chunks(d).enumerate() {
                assert_eq!(chunk[0], q0 + (g * 64 + r * d) as f32, "rank {r} of {t}, block {g}");
            }
        }
        assert_eq!(back, full, "gathering every shard must rebuild the full buffer (t = {t})");
    }
}

#[test]
fn gradient_norm_counts_every_parameter_once() {
    let m = tiny();
    let full_layout = layout(&m, 0, 1, ChunkSpec::whole(&m));
    let g: Vec<f32> = (0..full_layout.len()).map(|i| ((i % 7) as f32 - 3.0) * 0.1).collect();
    let want = full_layout.grad_sq_sum(&g, 0..g.len());
    assert!((want - crate::kernels::sum_of_squares(&g)).abs() < 1e-9 * want);
    for t in [2, 4] {
        let total: f64 = (0..t)
            .map(|r| {
                let l = layout(&m, r, t, ChunkSpec::whole(&m));
                let shard = l.shard_from(&full_layout, &g);
                // Summed over two ZeRO halves, as a data-parallel group would.
                let n = l.len();
                l.grad_sq_sum(&shard, 0..n / 2) + l.grad_sq_sum(&shard, n / 2..n)
            })
            .sum();
        assert!((total - want).abs() < 1e-9 * want, "t = {t}: {total} vs {want}");
    }
    // Two pipeline chunks with a tied copy on the last one: the copy is not counted.
    let first = layout(&m, 0, 1, ChunkSpec { embedding: true, layers: 0..2, head: false });
    let last = layout(&m, 0, 1, ChunkSpec { embedding: false, layers: 2..4, head: true });
    let (gf, gl) = (first.init(1), last.init(1));
    let whole = full_layout.init(1);
    let split = first.grad_sq_sum(&gf, 0..gf.len()) + last.grad_sq_sum(&gl, 0..gl.len());
    let want = full_layout.grad_sq_sum(&whole, 0..whole.len());
    assert!((split - want).abs() < 1e-9 * want, "{split} vs {want}");
}

#[test]
fn bad_chunks_and_splits_are_errors() {
    let m = tiny();
    let e = ParamLayout::new(&m, TpRank::SINGLE, ChunkSpec { embedding: true, layers: 3..9, head: false }).unwrap_err();
    assert!(e.to_string().contains("3..9") && e.to_string().contains("4 layers"), "{e}");
    let e = ParamLayout::new(&m, TpRank::new(0, 3).unwrap(), ChunkSpec::whole(&m)).unwrap_err();
    assert!(e.to_string().contains("tp = 3"), "{e}");
}

#[test]
fn a_llama_chunk_matches_the_plans_accounting_and_shards_whole_heads_and_glu_halves() {
    let m = ModelSpec::preset("tiny-llama").expect("preset");
    let full_layout = layout(&m, 0, 1, ChunkSpec::whole(&m));
    // wte, per layer ln1_w qkv_w (h, q + 2kv) proj_w ln2_w fc1_w (h, 2f) fc2_w, lnf_w, out_w.
    let (v, h, q, kv, f, l) = (256, 64, 64, 32, 176, 4);
    let per_layer = 2 * h + h * (q + 2 * kv) + q * h + 3 * h * f;
    assert_eq!(full_layout.len(), 2 * v * h + l * per_layer + h);
    assert_eq!(full_layout.len() as u64, strata_models::accounting::params::total_params(&m));
    let names: Vec<String> = full_layout.entries().iter().map(ParamEntry::name).collect();
    assert_eq!(
        &names[..7],
        [
            "wte",
            "layers.0.ln1_w",
            "layers.0.qkv_w",
            "layers.0.proj_w",
            "layers.0.ln2_w",
            "layers.0.fc1_w",
            "layers.0.fc2_w"
        ]
    );
    assert_eq!(&names[names.len() - 2..], ["lnf_w", "out_w"]);
    let full: Vec<f32> = (0..full_layout.len()).map(|i| i as f32).collect();
    let (q0, f0) = (full_layout.layer(&full, 0).qkv_w[0], full_layout.layer(&full, 0).fc1_w[0]);
    let mut back = vec![f32::NAN; full.len()];
    for r in 0..2 {
        let lr = layout(&m, r, 2, ChunkSpec::whole(&m));
        let shard = lr.shard_from(&full_layout, &full);
        lr.gather_into(&shard, &full_layout, &mut back);
        // Rank r's first QKV row: Q columns [r·32, (r+1)·32), then K and V columns
        // [r·16, (r+1)·16) of their blocks (query heads 2r, 2r + 1 and the key/value head r
        // they read).
        let row0 = &lr.layer(&shard, 0).qkv_w[..64];
        assert_eq!(row0[0], q0 + (r * 32) as f32);
        assert_eq!(row0[32], q0 + (q + r * 16) as f32);
        assert_eq!(row0[48], q0 + (q + kv + r * 16) as f32);
        // FC1's first row: gate columns [r·88, (r+1)·88), then the same up columns.
        let fc1 = &lr.layer(&shard, 0).fc1_w[..176];
        assert_eq!((fc1[0], fc1[88]), (f0 + (r * 88) as f32, f0 + (f + r * 88) as f32), "rank {r}");
        assert_eq!(lr.init(3), lr.shard_from(&full_layout, &full_layout.init(3)), "tp rank {r}: the same model");
        // The plan's units: layer, output layer, final norm, word embedding.
        let per_rank = per_layer - (per_layer - 2 * h) / 2;
        assert_eq!(lr.layer_range(0).len(), per_rank);
        assert_eq!(lr.head(&shard).wte.len(), v / 2 * h);
        assert_ne!(lr.head(&shard).wte.as_ptr(), lr.embedding(&shard).wte.as_ptr(), "untied");
        assert!(lr.embedding(&shard).wpe.is_empty() && lr.head(&shard).lnf_b.is_empty());
    }
    assert_eq!(back, full, "gathering both shards rebuilds the full buffer");
}

#[test]
fn a_llama_moe_layout_matches_the_plans_accounting() {
    use strata_models::accounting::params::{layer_expert_params, layer_params_at, total_params};
    let mut m = ModelSpec::preset("tiny-moe").expect("preset");
    let moe = m.moe.as_mut().expect("a MoE preset");
    (moe.shared_experts, moe.shared_ffn_hidden, moe.aux_loss_coeff) = (1, 64, 0.0);
    let whole = layout(&m, 0, 1, ChunkSpec::whole(&m));
    assert_eq!(whole.len() as u64, total_params(&m));
    // Layer 1 (the first MoE layer): shared expert fc1_w (h, 2·64) fc2_w, router, then each
    // SwiGLU expert's fc1_w (h, 2·64) and fc2_w, no biases.
    let names: Vec<String> = whole.entries().iter().filter(|e| e.layer == Some(1)).map(ParamEntry::name).collect();
    assert_eq!(
        &names[4..10],
        [
            "layers.1.fc1_w",
            "layers.1.fc2_w",
            "layers.1.router_w",
            "layers.1.experts.0.fc1_w",
            "layers.1.experts.0.fc2_w",
            "layers.1.experts.1.fc1_w"
        ]
    );
    let fc1 = whole.entries().iter().find(|e| e.name() == "layers.1.experts.0.fc1_w").expect("an expert FC1");
    assert_eq!(fc1.shape, [64, 128]);
    for (tp, ep) in [(1, 1), (2, 2), (1, 4)] {
        for r in 0..tp {
            let lr = ParamLayout::with_ep(&m, TpRank::new(r, tp).unwrap(), (ep - 1, ep), ChunkSpec::whole(&m)).unwrap();
            for l in 0..4 {
                assert_eq!(
                    lr.layer_range(l).len() as u64,
                    layer_params_at(&m, l as u32).per_rank(tp as u32),
                    "layer {l}"
                );
                assert_eq!(
                    lr.experts_range(l).len() as u64,
                    layer_expert_params(&m, l as u32) / ep as u64,
                    "layer {l}"
                );
            }
            let buf = lr.init(0);
            let p = lr.moe_params(&buf, 1);
            assert_eq!(p.experts.len(), 8 / ep);
            assert!(p.experts.iter().all(|e| e.fc1_w.len() == 64 * 128 && e.fc1_b.is_empty() && e.fc2_b.is_empty()));
            let s = p.shared.expect("the shared expert");
            assert_eq!((s.fc1_w.len(), s.fc2_w.len(), s.fc1_b.len()), (64 * 128 / tp, 64 * 64 / tp, 0));
        }
    }
}
