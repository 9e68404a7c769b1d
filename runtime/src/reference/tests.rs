//! The reference trainer learns, is deterministic, and its recompute modes and gradient
//! accumulation change nothing but memory.

use strata_models::{Activation, Family, ModelSpec, Recompute};

use super::*;
use crate::data::MarkovSource;

fn model(vocab: u32) -> ModelSpec {
    ModelSpec {
        name: "reference-test".into(),
        family: Family::Gpt,
        layers: 2,
        hidden: 32,
        heads: 2,
        kv_heads: 2,
        head_dim: None,
        ffn_hidden: 128,
        vocab,
        seq_len: 16,
        activation: Activation::Gelu,
        dropout: 0.0,
        rope_base: 500_000.0,
        moe: None,
        mla: None,
        mtp_layers: 0,
    }
}

fn config(seed: u64, recompute: Recompute) -> TrainConfig {
    TrainConfig {
        seed,
        micro: Micro { batch: 8, seq: 16 },
        microbatches: 2,
        adamw: AdamWConfig { lr: 1e-2, weight_decay: 0.0, ..AdamWConfig::default() },
        grad_clip: 1.0,
        recompute,
    }
}

#[test]
fn loss_falls_to_the_entropy_rate_of_a_markov_source() {
    let src = MarkovSource::new(32, 3, 11).unwrap();
    let h = src.entropy_rate_nats();
    let corpus = src.corpus(200_000, 12);
    let cfg = config(0, Recompute::None);
    let mut trainer = ReferenceTrainer::new(&model(32), cfg.clone()).unwrap();
    // 150 steps at lr 1e-2, then 100 at 2e-3 to settle (a two-step schedule).
    let mut losses = trainer.train(&corpus, 150).unwrap();
    trainer.set_lr(2e-3);
    let tail: Vec<f64> = (150..250u64)
        .map(|n| {
            let batches: Vec<Batch> = (0..2).map(|k| corpus.batch(n * 2 + k, cfg.micro).unwrap()).collect();
            trainer.step(&batches).unwrap().loss
        })
        .collect();
    losses.extend(tail);
    let ln_v = 32f64.ln();
    // Initial weights ~ N(0, 0.02) give near-uniform predictions: loss ≈ ln V.
    assert!((losses[0] - ln_v).abs() < 0.05, "first loss {} vs ln V = {ln_v}", losses[0]);
    // Held out: 16 batches (2,048 targets) of a fresh sample of the same source, scored
    // against the true model on the very same targets, which removes the sampling noise.
    // No model beats the truth in expectation (Gibbs' inequality); a model that learned the
    // transition table comes within 0.1 nats of it.
    let held_out = src.corpus(20_000, 99);
    let (mut eval, mut truth) = (0.0, 0.0);
    for i in 0..16 {
        let b = held_out.batch(i, cfg.micro).unwrap();
        eval += trainer.eval_loss(&b).unwrap() / 16.0;
        truth += src.cross_entropy_nats(&b.inputs, &b.targets) / 16.0;
    }
    assert!((truth - h).abs() < 0.1, "the held-out sample's entropy {truth} strays from the rate {h}");
    assert!(eval > truth - 0.03, "held-out loss {eval} beats the true model's {truth}: the loss or the data is wrong");
    assert!(
        eval < truth + 0.1,
        "held-out loss {eval} did not approach the true model's {truth} (H = {h}, first loss {})",
        losses[0]
    );
}

#[test]
fn same_seed_same_losses_bit_for_bit() {
    let corpus = MarkovSource::new(32, 3, 1).unwrap().corpus(20_000, 2);
    let run =
        |seed| ReferenceTrainer::new(&model(32), config(seed, Recompute::None)).unwrap().train(&corpus, 4).unwrap();
    let (a, b) = (run(5), run(5));
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_ne!(a, run(6), "a different seed must give different losses");
}

#[test]
fn recompute_modes_give_bit_identical_training() {
    let corpus = MarkovSource::new(32, 3, 3).unwrap().corpus(20_000, 4);
    let mut runs = [Recompute::None, Recompute::Selective, Recompute::Full].map(|r| {
        let mut t = ReferenceTrainer::new(&model(32), config(1, r)).unwrap();
        let losses = t.train(&corpus, 3).unwrap();
        (losses, t.params().to_vec())
    });
    let none = std::mem::take(&mut runs[0]);
    assert_eq!(runs[1], none, "selective recompute changed the training");
    assert_eq!(runs[2], none, "full recompute changed the training");
}

#[test]
fn gradient_accumulation_equals_one_big_microbatch() {
    // Two microbatches of 4 sequences and one of 8 read the same sequences (batch index ·
    // b + j), so the step must agree up to the f32 summation order of the gradients.
    let corpus = MarkovSource::new(32, 3, 5).unwrap().corpus(20_000, 6);
    let mut cfg = config(2, Recompute::None);
    cfg.micro.batch = 4;
    let mut split = ReferenceTrainer::new(&model(32), cfg.clone()).unwrap();
    cfg.micro.batch = 8;
    cfg.microbatches = 1;
    let mut whole = ReferenceTrainer::new(&model(32), cfg).unwrap();
    let (a, b) = (split.train(&corpus, 1).unwrap(), whole.train(&corpus, 1).unwrap());
    assert!((a[0] - b[0]).abs() < 1e-6, "losses {} vs {}", a[0], b[0]);
    let err = split.grads().iter().zip(whole.grads()).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    let scale = whole.grads().iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(err < 1e-5 * scale, "gradients differ by {err} (max {scale})");
}

#[test]
fn bad_settings_and_batches_are_errors_that_name_the_values() {
    let mut cfg = config(0, Recompute::None);
    cfg.micro.seq = 17;
    let e = ReferenceTrainer::new(&model(32), cfg).err().unwrap().to_string();
    assert!(e.contains("seq = 17") && e.contains("model.seq_len = 16"), "{e}");
    let mut t = ReferenceTrainer::new(&model(32), config(0, Recompute::None)).unwrap();
    // A byte corpus has 256 ids; this model only 32.
    let corpus = Corpus::new((0..1000).map(|i| (i * 37 % 256) as u32).collect(), 256, "bytes").unwrap();
    let e = t.train(&corpus, 1).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary of 32"), "{e}");
    let e = t.step(&[]).unwrap_err().to_string();
    assert!(e.contains("0 microbatches given") && e.contains("asks for 2"), "{e}");
}
