//! The single-rank reference trainer: the whole GPT or Llama on one thread, built from the same
//! pieces the plan interpreter runs, with t = 1 (every tensor-parallel reduction is the
//! identity). It is the oracle that parallel runs are compared against (llm.c's
//! `train_gpt2.c` role).
//!
//! One step over m microbatches of b sequences of s tokens:
//!
//! ```text
//! g = 0
//! for each microbatch k:   loss_k = CE(model(x_k), y_k)           (mean over b·s tokens)
//!                          g += ∇ loss_k / m                      (grad_scale = 1/(m·b·s))
//! g ← g · min(1, clip / ‖g‖₂)                                     (clip = 0: off)
//! θ ← AdamW(θ, g)
//! loss = (1/m) Σ_k loss_k                                          (nats per token)
//! ```
//!
//! A mixture-of-experts layer runs `runtime::moe`'s MLP with every expert on this rank (an
//! expert-parallel group of one) in place of the dense MLP.
//!
//! Deterministic: the same model, config and seed give bit-identical losses (single-threaded
//! GEMMs, fixed loop orders, seeded initialisation).

use strata_models::{ModelSpec, Recompute};

use crate::data::{Batch, Corpus};
use crate::embed::{check_tokens, embed_backward, embed_forward};
use crate::error::RuntimeError;
use crate::head::{
    HeadActs, STATS, final_norm_backward, final_norm_forward, logits_backward_input, logits_backward_weight,
    logits_forward, loss_forward,
};
use crate::layer::*;
use crate::micro::Micro;
use crate::optim::{AdamW, AdamWConfig, ZeroShard, clip_scale, scale_in_place};
use crate::params::{ChunkSpec, ParamLayout};
use crate::shard::TpRank;

/// What the reference trainer does per step.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// Seeds the initial weights.
    pub seed: u64,
    /// Shape of one microbatch.
    pub micro: Micro,
    /// Microbatches per step (gradient accumulation).
    pub microbatches: usize,
    pub adamw: AdamWConfig,
    /// Largest global gradient norm; 0 turns clipping off.
    pub grad_clip: f32,
    pub recompute: Recompute,
}

/// Results of one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Mean cross-entropy over the step's tokens, nats.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
}

/// The whole model and its optimizer on one rank.
pub struct ReferenceTrainer {
    cfg: TrainConfig,
    layout: ParamLayout,
    params: Vec<f32>, // (layout.len())
    grads: Vec<f32>,  // (layout.len())
    opt: AdamW,
    layers: Vec<LayerActs>,
    /// A MoE layer's MLP activations (`None` in a dense layer).
    moe: Vec<Option<crate::moe::MoeActs>>,
    head: HeadActs,
}

impl ReferenceTrainer {
    /// Validates the model (GPT or Llama family, `ShardDims::new`) and the config, and
    /// initialises the weights.
    pub fn new(model: &ModelSpec, cfg: TrainConfig) -> Result<ReferenceTrainer, RuntimeError> {
        let layout = ParamLayout::new(model, TpRank::SINGLE, ChunkSpec::whole(model))?;
        let (mb, max_seq) = (cfg.micro, layout.dims().max_seq);
        if mb.batch == 0 || mb.seq == 0 || mb.seq > max_seq || cfg.microbatches == 0 {
            return Err(RuntimeError::BadSetting(format!(
                "micro_batch = {}, seq = {}, microbatches = {}: each must be at least 1 and seq at most model.seq_len = {max_seq}",
                mb.batch, mb.seq, cfg.microbatches
            )));
        }
        if !(cfg.adamw.lr.is_finite() && cfg.adamw.lr > 0.0 && cfg.grad_clip >= 0.0) {
            return Err(RuntimeError::BadSetting(format!(
                "lr = {}, grad_clip = {}: lr must be positive and grad_clip non-negative",
                cfg.adamw.lr, cfg.grad_clip
            )));
        }
        let params = layout.init(cfg.seed);
        let n = layout.len();
        let layers = vec![LayerActs::default(); layout.num_layers()];
        Ok(ReferenceTrainer {
            cfg,
            params,
            grads: vec![0.0; n],
            opt: AdamW::new(ZeroShard::whole(n)),
            layout,
            moe: vec![None; layers.len()],
            layers,
            head: HeadActs::default(),
        })
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// Sets the learning rate of the next steps (schedules are the caller's).
    pub fn set_lr(&mut self, lr: f32) {
        self.cfg.adamw.lr = lr;
    }

    /// Gradients of the last step, after clipping.
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// One optimizer step over `batches` (exactly `microbatches` of them).
    pub fn step(&mut self, batches: &[Batch]) -> Result<StepStats, RuntimeError> {
        let m = self.cfg.microbatches;
        if batches.len() != m {
            return Err(RuntimeError::BatchShape(format!(
                "{} microbatches given, the config asks for {m}",
                batches.len()
            )));
        }
        for b in batches {
            self.check_batch(b)?;
        }
        self.grads.fill(0.0);
        let grad_scale = 1.0 / (m * self.cfg.micro.tokens()) as f32;
        let mut loss = 0.0;
        for b in batches {
            loss += self.forward_backward(b, grad_scale);
        }
        let sq = self.layout.grad_sq_sum(&self.grads, 0..self.grads.len());
        scale_in_place(&mut self.grads, clip_scale(sq, self.cfg.grad_clip));
        let decay = self.layout.decay_ranges();
        self.opt.update(&self.cfg.adamw, &mut self.params, &self.grads, &decay);
        Ok(StepStats { loss: loss / m as f64, grad_norm: sq.sqrt() })
    }

    /// Trains `steps` steps on `corpus`, microbatch k of step n being batch n·m + k, and
    /// returns the loss of every step.
    pub fn train(&mut self, corpus: &Corpus, steps: usize) -> Result<Vec<f64>, RuntimeError> {
        let m = self.cfg.microbatches as u64;
        let mut losses = Vec::with_capacity(steps);
        for n in 0..steps as u64 {
            let batches = (0..m).map(|k| corpus.batch(n * m + k, self.cfg.micro)).collect::<Result<Vec<_>, _>>()?;
            losses.push(self.step(&batches)?.loss);
        }
        Ok(losses)
    }

    /// Mean loss on `batch` without touching gradients or weights.
    pub fn eval_loss(&mut self, batch: &Batch) -> Result<f64, RuntimeError> {
        self.check_batch(batch)?;
        let mut r = self.embed(batch);
        for l in 0..self.layout.num_layers() {
            self.layer_forward(l, &mut r, batch.micro);
        }
        Ok(self.head_forward(&r, &batch.targets))
    }

    fn check_batch(&self, b: &Batch) -> Result<(), RuntimeError> {
        if b.micro != self.cfg.micro || b.inputs.len() != b.micro.tokens() || b.targets.len() != b.micro.tokens() {
            return Err(RuntimeError::BatchShape(format!(
                "a batch of {:?} with {} inputs and {} targets; the trainer runs {:?}",
                b.micro,
                b.inputs.len(),
                b.targets.len(),
                self.cfg.micro
            )));
        }
        check_tokens(&b.inputs, self.layout.dims().vocab_total)?;
        check_tokens(&b.targets, self.layout.dims().vocab_total)
    }

    fn embed(&self, b: &Batch) -> Vec<f32> {
        let mut r = vec![0.0; b.micro.tokens() * self.layout.dims().hidden];
        embed_forward(self.layout.dims(), &self.layout.embedding(&self.params), b.micro, &b.inputs, &mut r);
        r
    }

    /// The five forward pieces of layer `l`; with t = 1 the partial outputs are the sums.
    fn layer_forward(&mut self, l: usize, r: &mut [f32], mb: Micro) {
        let (d, p, acts) = (self.layout.dims(), self.layout.layer(&self.params, l), &mut self.layers[l]);
        let (mut x, mut out) = (vec![0.0; r.len()], vec![0.0; r.len()]);
        attn_in_forward(&p, r, &mut x, acts);
        attn_forward(d, &p, mb, &x, &mut out, acts, self.cfg.recompute);
        mlp_in_forward(&p, r, &out, &mut x, acts);
        if let Some(md) = self.layout.moe().filter(|_| !self.layout.experts_range(l).is_empty()) {
            let mp = self.layout.moe_params(&self.params, l);
            let (out, a) = crate::moe::moe_forward(md, &mp, &x, &mut crate::moe::Alone)
                .unwrap_or_else(|e| unreachable!("a group of one does not fail: {e}"));
            crate::kernels::add_into(r, &out);
            self.moe[l] = Some(a);
        } else {
            mlp_forward(d, &p, &x, &mut out, acts);
            layer_out_forward(&p, r, &out);
        }
    }

    /// The backward pieces of layer `l`, in plan order; dr enters as the gradient of the
    /// layer's output and leaves as the gradient of its input.
    fn layer_backward(&mut self, l: usize, dr: &mut [f32], mb: Micro) {
        let (d, p, acts) = (self.layout.dims(), self.layout.layer(&self.params, l), &mut self.layers[l]);
        let mut partial = vec![0.0; dr.len()];
        if let Some(ma) = self.moe[l].take() {
            let md = self.layout.moe().expect("a MoE layer's shapes");
            let mp = self.layout.moe_params(&self.params, l);
            let mut mg = self.layout.moe_grads(&mut self.grads, l);
            partial = crate::moe::moe_backward(md, &mp, &ma, dr, &mut mg, &mut crate::moe::Alone)
                .unwrap_or_else(|e| unreachable!("a group of one does not fail: {e}"));
        }
        let mut g = self.layout.layer_mut(&mut self.grads, l);
        if self.layout.experts_range(l).is_empty() {
            layer_out_backward(&mut g, dr);
            mlp_backward_input(d, &p, acts, dr, &mut partial);
            mlp_backward_weight(d, acts, &acts.m, &mut g);
        }
        mlp_in_backward(&p, &mut g, acts, &partial, dr);
        attn_backward_input(d, &p, mb, acts, dr, &mut partial);
        attn_backward_weight(d, acts, &acts.a, &mut g);
        attn_in_backward(&p, &mut g, acts, &partial, dr);
    }

    /// FinalNorm, Logits and Loss; returns the mean loss.
    fn head_forward(&mut self, r: &[f32], targets: &[u32]) -> f64 {
        let (d, p) = (self.layout.dims(), self.layout.head(&self.params));
        let mut hn = vec![0.0; r.len()];
        final_norm_forward(&p, r, &mut hn, &mut self.head);
        let mut stats = vec![0.0; targets.len() * STATS];
        logits_forward(d, &p, &hn, targets, &mut self.head, &mut stats);
        loss_forward(&stats, 1, &mut self.head)
    }

    /// Forward and backward of one microbatch; accumulates gradients, returns the loss.
    fn forward_backward(&mut self, b: &Batch, grad_scale: f32) -> f64 {
        let mb = b.micro;
        let mut r = self.embed(b);
        for l in 0..self.layout.num_layers() {
            self.layer_forward(l, &mut r, mb);
            if self.cfg.recompute == Recompute::Full {
                self.layers[l].keep_only_input();
            }
        }
        let loss = self.head_forward(&r, &b.targets);

        let (d, p) = (self.layout.dims(), self.layout.head(&self.params));
        let mut dhn = vec![0.0; r.len()];
        logits_backward_input(d, &p, &mut self.head, &b.targets, grad_scale, &mut dhn);
        let mut g = self.layout.head_mut(&mut self.grads);
        logits_backward_weight(d, &self.head, &self.head.hn, &mut g);
        let mut dr = vec![0.0; r.len()];
        final_norm_backward(&p, &mut g, &self.head, &dhn, &mut dr);
        for l in (0..self.layout.num_layers()).rev() {
            if self.cfg.recompute == Recompute::Full {
                let mut again = self.layers[l].r_in.to_vec();
                self.layer_forward(l, &mut again, mb);
            }
            self.layer_backward(l, &mut dr, mb);
        }
        embed_backward(self.layout.dims(), &mut self.layout.embedding_mut(&mut self.grads), mb, &b.inputs, &dr);
        loss
    }
}

#[cfg(test)]
mod tests;
