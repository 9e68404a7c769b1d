//! DeepSpeed: `deepspeed.json`, a config its own `DeepSpeedConfig` accepts as written, and
//! `deepspeed-notes.md`, what belongs in the training script instead (the `PipelineModule`
//! and the checkpointed functions are code, not config keys).
//!
//! Keys as DeepSpeed names them (main edaa7221 / 0.19.x, `docs/frameworks.md` §2):
//! - batch: `train_batch_size` = micro × `gradient_accumulation_steps` × dp, so that
//!   `_batch_assertion` holds on the data-parallel world size;
//! - `zero_optimization`: the stage, `overlap_comm` from `overlap_grad_reduce`, and the
//!   plan's gradient bucket as `reduce_bucket_size` / `allgather_bucket_size` in elements;
//!   under ZeRO-3 without `overlap_param_gather`, `stage3_prefetch_bucket_size = 0` (no
//!   prefetch); the other ZeRO-3 buffers keep DeepSpeed's defaults;
//! - `communication_data_type`: the dtype the plan reduces gradients in;
//! - `tensor_parallel.autotp_size` (AutoTP training; `tp_size` is an inference key);
//! - `activation_checkpointing` only with recomputation, with `number_checkpoints` and
//!   without `contiguous_memory_optimization` (which needs `partition_activations`);
//! - `pipeline.activation_checkpoint_interval = 1` for full recomputation in a pipeline;
//! - `sequence_parallel_size` = cp for DeepSpeed-Ulysses (the only context parallelism
//!   DeepSpeed runs; `deepspeed-cp-ring`), the `DistributedAttention` wrapper in the notes.
//!
//! A mixture of experts (DeepSpeed-MoE's `deepspeed.moe.layer.MoE`, with `ep_size`, `k`,
//! `capacity_factor`, `drop_tokens`) and fp8 (Transformer Engine modules under
//! `fp8_autocast`) are model code, not config keys: the notes say how to build them.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::{Dropped, File, bucket_elements, grad_reduce_bytes};
use crate::parallel::Recompute;
use crate::scenario::{Dtype, Scenario};

/// The files, and the settings they cannot carry (none: what DeepSpeed cannot run is a
/// rule of [`crate::framework`], checked before).
pub fn write(s: &Scenario) -> (Vec<File>, Vec<Dropped>) {
    let text = serde_json::to_string_pretty(&config(s)).unwrap_or_default() + "\n";
    (vec![File { name: "deepspeed.json", text }, File { name: "deepspeed-notes.md", text: notes(s) }], Vec::new())
}

/// The DeepSpeed config as JSON.
pub fn config(s: &Scenario) -> Value {
    let p = &s.parallel;
    let t = &s.training;
    let bucket = bucket_elements(s);
    let mut c = serde_json::Map::new();
    c.insert("train_batch_size".into(), json!(p.global_batch));
    c.insert("train_micro_batch_size_per_gpu".into(), json!(p.micro_batch));
    c.insert("gradient_accumulation_steps".into(), json!(p.microbatches()));
    c.insert("gradient_clipping".into(), json!(t.grad_clip));
    c.insert("steps_per_print".into(), json!(10));
    c.insert(
        "optimizer".into(),
        json!({
            "type": "AdamW",
            "params": { "lr": t.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": t.weight_decay }
        }),
    );
    if t.warmup_steps > 0 {
        c.insert(
            "scheduler".into(),
            json!({ "type": "WarmupLR", "params": { "warmup_min_lr": 0.0, "warmup_max_lr": t.lr, "warmup_num_steps": t.warmup_steps } }),
        );
    }
    match t.dtype {
        // DeepSpeed's fp8 comes from Transformer Engine modules in the model code, not the
        // config: the config trains in bf16.
        Dtype::Bf16 | Dtype::Fp8 => {
            c.insert("bf16".into(), json!({ "enabled": true }));
        }
        Dtype::Fp16 => {
            c.insert("fp16".into(), json!({ "enabled": true }));
        }
        Dtype::Fp32 => {}
    }
    c.insert("communication_data_type".into(), json!(if grad_reduce_bytes(s) == 4 { "fp32" } else { t.dtype.key() }));
    if t.dtype == Dtype::Bf16 && p.zero == 1 {
        // ZeRO-1 with bf16 as Strata models it (8 + 12/d bytes per parameter) is DeepSpeed's
        // BF16_Optimizer, which the engine picks only with fp32 gradient accumulation
        // (`_do_optimizer_sanity_check`).
        c.insert("data_types".into(), json!({ "grad_accum_dtype": "fp32" }));
    }
    let mut zero = json!({
        "stage": p.zero,
        "overlap_comm": p.overlap_grad_reduce,
        "contiguous_gradients": true,
        "reduce_scatter": true,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    });
    if p.zero >= 3 && !p.overlap_param_gather {
        zero["stage3_prefetch_bucket_size"] = json!(0);
    }
    c.insert("zero_optimization".into(), zero);
    if p.recompute != Recompute::None {
        c.insert(
            "activation_checkpointing".into(),
            json!({
                "partition_activations": false,
                "contiguous_memory_optimization": false,
                "cpu_checkpointing": false,
                "number_checkpoints": max_stage_layers(s),
                "synchronize_checkpoint_boundary": false,
                "profile": false
            }),
        );
    }
    if p.tp > 1 {
        c.insert("tensor_parallel".into(), json!({ "autotp_size": p.tp }));
    }
    if p.cp > 1 {
        c.insert("sequence_parallel_size".into(), json!(p.cp));
    }
    if p.pp > 1 {
        let mut pipe = json!({ "stages": p.pp });
        if p.recompute == Recompute::Full {
            pipe["activation_checkpoint_interval"] = json!(1);
        }
        c.insert("pipeline".into(), pipe);
    }
    Value::Object(c)
}

fn max_stage_layers(s: &Scenario) -> u32 {
    (0..s.parallel.pp).map(|r| s.parallel.stage_layers(&s.model, r)).max().unwrap_or(0)
}

fn notes(s: &Scenario) -> String {
    let p = &s.parallel;
    let m = &s.model;
    let mut o = format!("# DeepSpeed launch notes for {}\n\n", s.name);
    let _ = writeln!(
        o,
        "`deepspeed.json` holds every setting DeepSpeed reads from its config. These belong in the\ntraining script, because DeepSpeed takes them as code:\n"
    );
    let _ = writeln!(
        o,
        "- World: {} GPUs = tp {} × cp {} × pp {} × dp {}; `deepspeed --num_nodes {} --num_gpus {} train.py --deepspeed_config deepspeed.json`.",
        p.ranks(),
        p.tp,
        p.cp,
        p.pp,
        p.dp,
        s.cluster.nodes,
        s.cluster.gpus_per_node
    );
    if p.pp > 1 {
        let sizes: Vec<String> = (0..p.pp).map(|r| p.stage_layers(m, r).to_string()).collect();
        let _ = writeln!(
            o,
            "- Pipeline: `deepspeed.pipe.PipelineModule(layers=…, num_stages={}, partition_method=\"uniform\")`, run by DeepSpeed's 1F1B `TrainSchedule`; transformer layers per stage as the plan splits them: {} (embedding on the first stage, output layer on the last). A layer list that does not split this way needs `partition_method=\"type:…\"` or explicit parts.",
            p.pp,
            sizes.join(", ")
        );
    }
    if p.tp > 1 {
        let _ = writeln!(
            o,
            "- Tensor parallelism: AutoTP training over {} ranks (`tensor_parallel.autotp_size`); the model is a Hugging Face-style module DeepSpeed can shard.",
            p.tp
        );
    }
    match p.recompute {
        Recompute::None => {}
        Recompute::Selective => {
            let _ = writeln!(
                o,
                "- Selective recomputation: wrap each layer's attention core (QKᵀ, softmax, dropout, ·V) in `deepspeed.checkpointing.checkpoint` and call `deepspeed.checkpointing.configure(mpu, deepspeed_config=\"deepspeed.json\")`."
            );
        }
        Recompute::Full => {
            let _ = writeln!(
                o,
                "- Full recomputation: {}",
                if p.pp > 1 {
                    "`pipeline.activation_checkpoint_interval = 1` checkpoints every layer of the PipelineModule."
                } else {
                    "wrap every transformer layer in `deepspeed.checkpointing.checkpoint` and call `deepspeed.checkpointing.configure(mpu, deepspeed_config=\"deepspeed.json\")`."
                }
            );
        }
    }
    if let Some(e) = &m.moe {
        let capacity = match e.capacity_factor {
            Some(c) => format!("capacity_factor={c}, drop_tokens=True"),
            None => "drop_tokens=False (dropless)".to_string(),
        };
        let _ = writeln!(
            o,
            "- Mixture of experts: the MLP of layers {}..{} is `deepspeed.moe.layer.MoE(hidden_size={}, expert=<the MLP of width {}>, num_experts={}, ep_size={}, k={}, {capacity}{})`; experts are split over ep = {} data-parallel ranks and their gradients reduced over the other dp/ep = {}.",
            e.dense_layers,
            m.layers,
            m.hidden,
            e.expert_ffn_hidden,
            e.experts,
            p.ep,
            e.top_k,
            if e.shared_experts > 0 {
                format!(", use_residual=True (the shared expert of width {})", e.shared_ffn_hidden)
            } else {
                String::new()
            },
            p.ep,
            p.dp / p.ep.max(1)
        );
    }
    if p.cp > 1 {
        let _ = writeln!(
            o,
            "- Context parallelism: DeepSpeed-Ulysses over {} ranks — wrap the attention core in `deepspeed.sequence.layer.DistributedAttention(attn, sequence_process_group)` and feed each rank 1/{} of every sequence (`sequence_parallel_size`).",
            p.cp, p.cp
        );
    }
    if s.training.fp8() {
        let _ = writeln!(
            o,
            "- fp8: build the linear layers from Transformer Engine (`transformer_engine.pytorch.Linear`) and run forward under `te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(fp8_format=Format.HYBRID))`; the config trains in bf16 around it."
        );
    }
    let _ = writeln!(
        o,
        "- Model: {} layers, hidden {}, {} heads ({} key/value){}, FFN {}, vocabulary {}, sequence {}{}.",
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        // DeepSpeed takes the model from the training script: Hugging Face's `head_dim`
        // (Megatron-DeepSpeed's `--kv-channels`) where the head is not hidden / heads wide.
        m.head_dim.map(|d| format!(" of head_dim {d} (Hugging Face config `head_dim`)")).unwrap_or_default(),
        m.ffn_hidden,
        m.vocab,
        m.seq_len,
        if s.training.flash_attention { ", FlashAttention" } else { "" }
    );
    o
}
