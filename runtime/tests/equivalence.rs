//! Every parallel split trains the tiny GPT exactly as one rank does: the same loss curve
//! over 20 steps, within f32 rounding.
//!
//! The splits also cover ZeRO without overlap (gradient reductions deferred to the end
//! of the step, parameter gathers after the optimizer), one-layer buckets, and fused
//! attention (no stored probabilities).
//!
//! Why a tolerance and which: a split sums the same products in another order — partial
//! sums over tensor-parallel shards, gradients over data-parallel replicas and
//! microbatches, the tied word table's two copies — so each step's gradients differ from
//! the single rank's by f32 rounding (≈ 1e-7 relative), and AdamW carries the differences
//! into the weights. Measured (release build, this machine): the worst of the 17 splits
//! differs from the single rank by 2.1e-7 nats over 20 steps (≈ 4e-8 relative; tp and
//! tied-embedding splits are the loosest, pure dp and pp ≈ 1.5e-8), so `LOSS_TOL_NATS` =
//! 2e-6 leaves a 10× margin for another CPU's GEMM kernels. A real bug lands far outside:
//! dropping the sequence-parallel reduction of the replicated tensors' gradients (one
//! all-reduce) moves the tp = 4 curve by 3e-4 nats at step 1 and 1e-2 by step 20.

mod common;

/// Largest |loss_split − loss_single| allowed at any of the 20 steps, in nats (the losses
/// are ≈ 5.6 → 4.6 nats; this is ≈ 4e-7 relative).
const LOSS_TOL_NATS: f64 = 2e-6;

const STEPS: u32 = 20;

/// (name, --set overrides) of the splits checked. Each dimension alone, then combined;
/// GPipe, 1F1B, interleaved and ZB-H1; ZeRO 0–3 (ZeRO-1 also as DeepSpeed's whole-bucket all-reduce); sequence parallelism on and off;
/// recomputation none, selective and full.
const SPLITS: &[(&str, &[&str])] = &[
    ("tp4", &["parallel.tp=4"]),
    ("tp4-sp", &["parallel.tp=4", "parallel.sequence_parallel=true"]),
    ("pp4-gpipe", &["parallel.pp=4", "parallel.schedule=gpipe"]),
    ("pp4-1f1b-full-recompute", &["parallel.pp=4", "parallel.recompute=full"]),
    ("dp8-zero0", &["parallel.dp=8", "parallel.zero=0"]),
    ("dp8-zero1", &["parallel.dp=8", "parallel.zero=1"]),
    ("dp8-zero2", &["parallel.dp=8", "parallel.zero=2"]),
    ("dp8-zero3", &["parallel.dp=8", "parallel.zero=3"]),
    // DeepSpeed's BF16_Optimizer: ZeRO-1 gradients all-reduced whole, each owner reading its part.
    (
        "pp2-dp4-zero1-deepspeed-bf16",
        &["parallel.pp=2", "parallel.dp=4", "parallel.zero=1", "training.framework=deepspeed", "training.dtype=bf16"],
    ),
    // At ZeRO-0 under a pipeline DeepSpeed runs BF16_Optimizer too: ZeRO-1's partition.
    (
        "pp2-dp4-zero0-deepspeed-bf16",
        &["parallel.pp=2", "parallel.dp=4", "parallel.zero=0", "training.framework=deepspeed", "training.dtype=bf16"],
    ),
    (
        "tp2-pp2-dp2-1f1b-zero1-sp",
        &["parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.zero=1", "parallel.sequence_parallel=true"],
    ),
    (
        "tp2-pp2-dp2-interleaved-zero2",
        &[
            "parallel.tp=2",
            "parallel.pp=2",
            "parallel.dp=2",
            "parallel.vpp=2",
            "parallel.schedule=interleaved",
            "parallel.zero=2",
        ],
    ),
    (
        "tp4-dp2-zero3-sp-selective",
        &[
            "parallel.tp=4",
            "parallel.dp=2",
            "parallel.zero=3",
            "parallel.sequence_parallel=true",
            "parallel.recompute=selective",
        ],
    ),
    ("pp2-dp4-gpipe-zero2", &["parallel.pp=2", "parallel.dp=4", "parallel.schedule=gpipe", "parallel.zero=2"]),
    ("tp2-pp4-1f1b-zero0", &["parallel.tp=2", "parallel.pp=4"]),
    (
        "tp4-pp2-interleaved-sp",
        &[
            "parallel.tp=4",
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.schedule=interleaved",
            "parallel.sequence_parallel=true",
        ],
    ),
    (
        "tp2-pp2-dp2-zbh1-zero3-full-recompute",
        &[
            "parallel.tp=2",
            "parallel.pp=2",
            "parallel.dp=2",
            "parallel.schedule=zb-h1",
            "parallel.zero=3",
            "parallel.recompute=full",
        ],
    ),
    (
        "tp2-pp2-dp2-zero1-no-overlap-small-buckets-flash",
        &[
            "parallel.tp=2",
            "parallel.pp=2",
            "parallel.dp=2",
            "parallel.zero=1",
            "parallel.overlap_grad_reduce=false",
            "parallel.overlap_param_gather=false",
            "parallel.grad_bucket_mb=0.1",
            "training.flash_attention=true",
        ],
    ),
];

#[test]
fn every_split_gives_the_single_rank_loss_curve() {
    let opts = common::options(STEPS);
    let single = common::train(&[], &opts).unwrap().losses();
    assert_eq!(single.len(), STEPS as usize);
    assert!((single[0] - 256f64.ln()).abs() < 0.1, "first loss {} vs ln 256", single[0]);
    assert!(single[STEPS as usize - 1] < single[0] - 0.3, "the single rank does not learn: {single:?}");
    let mut worst = (0.0f64, "");
    let mut failures = Vec::new();
    for (name, split) in SPLITS {
        let s = common::scenario(split);
        let ranks = s.parallel.ranks();
        let losses = common::train(split, &opts).unwrap_or_else(|e| panic!("{name}: {e}")).losses();
        let diff = losses.iter().zip(&single).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        println!("{name:<40} ranks {ranks}  max |Δloss| over {STEPS} steps = {diff:.3e} nats");
        if diff > worst.0 {
            worst = (diff, name);
        }
        if diff.is_nan() || diff > LOSS_TOL_NATS || losses.len() != single.len() {
            failures.push(format!("{name}: max |Δloss| {diff:e} > {LOSS_TOL_NATS:e} ({losses:?} vs {single:?})"));
        }
    }
    println!("worst split: {} at {:.3e} nats (tolerance {LOSS_TOL_NATS:e})", worst.1, worst.0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The interpreter on one rank against the reference trainer (the oracle built from the
/// same pieces without a plan): the same model, data, batch and optimizer give the same
/// losses bit for bit.
#[test]
fn one_rank_plan_equals_the_reference_trainer() {
    let s = common::scenario(&[]);
    let interp = common::train(&[], &common::options(5)).unwrap().losses();
    let want = common::reference_losses(&s, 5);
    for (step, (a, b)) in interp.iter().zip(&want).enumerate() {
        // The same pieces in the same order on one rank: the same bits.
        assert_eq!(a.to_bits(), b.to_bits(), "step {step}: interpreter {a} vs reference {b}");
    }
}
