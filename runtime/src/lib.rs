//! strata-runtime: a GPT or Llama model trained for real under a plan.
//!
//! This crate holds the CPU numerical core of the executor: f32 tensors, one GEMM wrapper,
//! hand-written forward and backward passes of the GPT and Llama families cut into the pieces the plan
//! IR names, each working on a Megatron-LM tensor-parallel shard, AdamW on ZeRO shards, a
//! single-rank reference trainer built from the same pieces, and training data.
//!
//! Module map:
//! - [`tensor`], [`matmul`], [`kernels`], [`attention`]: buffers and numerical kernels;
//!   [`llama`]: the Llama block's (RMSNorm, SwiGLU, RoPE, grouped-query key/value sharing);
//! - [`shard`]: what tensor-parallel rank r of t holds ([`shard::ShardDims`]);
//! - [`params`]: the flat per-chunk parameter buffer, its fixed order, views, init, sharding;
//! - [`embed`], [`layer`], [`head`]: the model pieces and what each saves for backward;
//!   [`moe`]: a mixture-of-experts MLP (router, experts, shared expert) on one
//!   expert-parallel rank with its dispatch and combine all-to-alls (not yet driven by the
//!   plan interpreter);
//! - [`optim`]: AdamW on an (offset, size) ZeRO shard, gradient clipping in two halves;
//! - [`reference`]: the single-rank trainer, the oracle for parallel runs;
//! - [`data`]: a Markov corpus of known entropy rate and a byte-level text loader;
//! - [`comm`]: the `Communicator` trait (in-process threads; MPI behind the `mpi`
//!   feature) and deterministic non-blocking collectives over it;
//! - [`exec`]: the plan interpreter — one rank runs its program of a `Plan`, its streams
//!   interleaved on one thread, `Alloc`/`Free` bound to real storage;
//! - [`train`]: a whole job — [`train::train_threads`] (ranks as threads) or
//!   [`train::run_rank`] per MPI process — returning the loss curve, the measured trace
//!   and peak memory per rank ([`train::TrainResult`]);
//! - [`supervise`]: a run that survives a dead rank — restarts every rank from the last
//!   complete checkpoint, injected faults (`kill:`, `hang:`, `slow:`), measured goodput;
//! - [`checkpoint`]: per-rank shards with a manifest, atomic writes, bit-identical resume;
//! - [`bench`](mod@bench): the training-speed benchmark against the GEMM kernel's own rate;
//! - [`calibrate`]: measurements of this machine (GEMMs, pieces, the communicator, shared
//!   cores) that `strata calibrate` fits into a hardware profile; [`cputime`]: a thread's
//!   CPU time, which the traced step records per op;
//! - `cuda` (feature `cuda`): the GPUs the driver sees, their peers, cuBLAS GEMM timing on
//!   them, the model's NVRTC kernels, and the CUDA executor of one-GPU plans (`cuda::exec`);
//! - [`probe`]: this machine as a cluster (GPUs, RDMA ports behind `ibverbs`, the launcher's
//!   environment) for `strata probe`.
//!
//! Running a plan (what `strata train` does, and what `strata compare` can do):
//!
//! ```text
//! let plan = Arc::new(strata_models::plan::lower(&scenario)?);
//! let (corpus, name, _entropy) = train::synthetic_corpus(scenario.model.vocab, scenario.training.seed)?;
//! let opts = TrainOptions { steps, data_name: name, checkpoint: None,
//!                           exec: ExecConfig { trace_step: Some(steps - 1), ..Default::default() }, faults: vec![] };
//! let r = train::train_threads(plan, Arc::new(corpus), &opts, None)?;
//! r.losses();   r.trace /* Option<strata_models::trace::Trace>, source Measured */;   r.memory /* per rank */
//! ```
//!
//! How a plan's `Compute` op maps to a call (`strata_models::plan::{Piece, Phase}`):
//!
//! ```text
//! Embed      Forward         embed::embed_forward            → partial (T,h); caller reduces
//!            BackwardWeight  embed::embed_backward           ← full dR (T,h)
//! AttnIn     Forward         layer::attn_in_forward          rows: T or T/t (sequence parallel)
//!            BackwardInput   layer::attn_in_backward
//! Attn       Forward         layer::attn_forward             → partial (T,h); caller reduces
//!            Recompute       layer::attn_recompute_probs     (selective) or attn_forward (full)
//!            BackwardInput   layer::attn_backward_input      → partial da (T,h); caller reduces
//!            BackwardWeight  layer::attn_backward_weight
//! MlpIn      Forward         layer::mlp_in_forward           rows: T or T/t
//!            BackwardInput   layer::mlp_in_backward
//! Mlp        Forward         layer::mlp_forward              → partial (T,h); caller reduces
//!            BackwardInput   layer::mlp_backward_input       → partial dm (T,h); caller reduces
//!            BackwardWeight  layer::mlp_backward_weight
//! LayerOut   Forward         layer::layer_out_forward        rows: T or T/t
//!            BackwardInput   layer::layer_out_backward
//! FinalNorm  Forward         head::final_norm_forward        rows: T or T/t
//!            BackwardInput   head::final_norm_backward
//! Logits     Forward         head::logits_forward            → stats (T,3); caller all-gathers
//!            BackwardInput   head::logits_backward_input     → partial dhn (T,h); caller reduces
//!            BackwardWeight  head::logits_backward_weight
//! Loss       Forward         head::loss_forward              ← gathered stats (t,T,3)
//! Optimizer  Step            optim::AdamW::update            (after params::ParamLayout::grad_sq_sum,
//!                                                             optim::clip_scale, optim::scale_in_place)
//! ```
//!
//! `Recompute` of the other pieces (full recomputation) is their `Forward` again, from the
//! layer input kept in `layer::LayerActs::r_in`. `parity.rs` (a test) runs a whole chunk on
//! t = 2 and 4 shards with the collectives done by hand: a worked example of the data flow.
//!
//! Invariants: f32 only; no threads inside a rank (each rank is one thread); the same
//! inputs give bit-identical outputs; weight gradients accumulate (`+=`) over microbatches
//! and are zeroed by the caller once per step; shape errors in the pieces are caller bugs
//! and panic with the sizes, while user inputs (model specs, settings, token ids, files)
//! are checked and reported as [`error::RuntimeError`] / [`data::DataError`] values.

pub mod attention;
pub mod attention_cp;
pub mod bench;
pub mod calibrate;
pub mod checkpoint;
pub mod comm;
pub mod cputime;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod embed;
pub mod error;
pub mod exec;
pub mod head;
pub mod kernels;
pub mod layer;
pub mod llama;
pub mod matmul;
pub mod micro;
pub mod moe;
pub mod optim;
pub mod params;
pub mod probe;
pub mod reference;
pub mod shard;
pub mod supervise;
pub mod tensor;
pub mod train;

pub use error::RuntimeError;

#[cfg(test)]
mod gradcheck;
#[cfg(test)]
mod parity;
