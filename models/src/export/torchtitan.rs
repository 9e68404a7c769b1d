//! torchtitan: `torchtitan.toml`, a job config for torchtitan v0.2.2 (the last release with
//! TOML job configs; `torchtitan/config/job_config.py`), which its `ConfigManager` parses.
//!
//! - `[parallelism]`: ZeRO-0 is DDP (`data_parallel_replicate_degree = dp`), ZeRO-2 and
//!   ZeRO-3 are FSDP2 (`data_parallel_shard_degree = dp`, `fsdp_reshard_after_forward`
//!   `"never"` / `"always"`); tensor, pipeline degrees; the schedule by its
//!   `torch.distributed.pipelining` name (`GPipe`, `1F1B`, `Interleaved1F1B`); the plan's
//!   layer split as `module_fqns_per_model_part` (torchtitan's llama3 module names);
//! - `[training]`: `local_batch_size` is a replica's batch per optimizer step under a
//!   pipeline (its microbatches are `pipeline_parallel_microbatch_size`), a microbatch
//!   otherwise (torchtitan accumulates `global / (local × dp)` of them);
//! - `[activation_checkpoint]` mode;
//! - `parallel.tp_comm_overlap = true`: `enable_async_tensor_parallel` (Inductor's
//!   micro-pipelined tensor parallelism), which only takes effect compiled, so `[compile]
//!   enable = true` beside it;
//! - mixed precision: bf16 parameters, fp32 reduction (the only reduce dtype v0.2.2 has).
//!
//! - context parallelism: `context_parallel_degree` with `context_parallel_rotate_method`
//!   `"alltoall"` for ring attention (K/V shards passed round) or `"allgather"` (K/V
//!   gathered whole); expert parallelism: `expert_parallel_degree` with
//!   `expert_tensor_parallel_degree = 1`;
//! - fp8: `[model] converters = ["quantize.linear.float8"]` and `[quantize.linear.float8]
//!   recipe_name = "tensorwise"` — torchao's float8 linear layers, with per-tensor *dynamic*
//!   scaling (torchao has no delayed scaling any more) and no cached fp8 weights, which the
//!   file says in a comment; the GEMMs that run in fp8 are the same linear layers.
//!
//! DeepSeek-V3 is torchtitan's `deepseek_v3` model, flavor `671B` (without its
//! multi-token-prediction module, which torchtitan does not build); Qwen3-235B-A22B its
//! `qwen3` model, flavor `235B-A22B` (`torchtitan/models/qwen3/__init__.py`: `head_dim`
//! 128, `qk_norm`, rope θ 5·10^6 where Hugging Face's config says 10^6, and no
//! `pipelining_fn`, so no pipeline). Other mixtures of experts have no torchtitan model
//! here; a head width apart from h / heads neither (llama3 derives it as dim / n_heads).
//!
//! torchtitan builds its models by name and flavor, not by dimensions: a Llama shape that
//! is not one of its llama3 flavors, a GPT model, or a tokenizer other than Llama 3's
//! cannot be written, nor can a gradient-bucket size (FSDP2 reduces per layer).

use std::fmt::Write as _;

use super::{Dropped, File};
use crate::model::{Family, ModelSpec};
use crate::parallel::{CpComm, Recompute, Schedule};
use crate::scenario::{Dtype, Scenario};

/// torchtitan v0.2.2's llama3 flavors (`torchtitan/models/llama3/__init__.py`): name,
/// layers, dim, heads, kv heads, FFN width (from `ffn_dim_multiplier` and `multiple_of`).
/// All use rope θ = 500,000 and the Llama 3 tokenizer (128,256 ids).
pub const LLAMA3_FLAVORS: &[(&str, u32, u32, u32, u32, u32)] =
    &[("8B", 32, 4096, 32, 8, 14336), ("70B", 80, 8192, 64, 8, 28672), ("405B", 126, 16384, 128, 8, 53248)];

/// The Llama 3 tokenizer's vocabulary.
pub const LLAMA3_VOCAB: u32 = 128_256;

/// The schedule's `torch.distributed.pipelining` class name.
pub fn schedule_name(s: Schedule) -> Option<&'static str> {
    match s {
        Schedule::Gpipe => Some("GPipe"),
        Schedule::OneFOneB => Some("1F1B"),
        Schedule::Interleaved => Some("Interleaved1F1B"),
        Schedule::ZbH1 | Schedule::ZbH2 => None,
    }
}

/// The files, and the settings they cannot carry.
pub fn write(s: &Scenario) -> (Vec<File>, Vec<Dropped>) {
    let m = &s.model;
    let p = &s.parallel;
    let t = &s.training;
    let mut dropped = Vec::new();
    let mut drop = |setting: String, reason: &str| dropped.push(Dropped { setting, reason: reason.to_string() });

    // [model]
    let flavor = LLAMA3_FLAVORS
        .iter()
        .find(|f| (f.1, f.2, f.3, f.4, f.5) == (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden));
    let deepseek = ModelSpec::preset("deepseek-v3")
        .is_some_and(|d| (d.layers, d.hidden, &d.moe, &d.mla) == (m.layers, m.hidden, &m.moe, &m.mla));
    let qwen3 = ModelSpec::preset("qwen3-235b-a22b").is_some_and(|q| {
        (q.layers, q.hidden, q.heads, q.kv_heads, q.head_dim(), &q.moe)
            == (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim(), &m.moe)
    });
    let (model_name, flavor_name) = match (m.family, flavor) {
        _ if deepseek => ("deepseek_v3", "671B".to_string()),
        _ if qwen3 => ("qwen3", "235B-A22B".to_string()),
        _ if m.moe.is_some() || m.mla.is_some() => {
            drop(
                format!("model.moe / model.mla of {}", m.name),
                "torchtitan v0.2.2 builds DeepSeek-V3 (deepseek_v3 671B) and Qwen3-235B-A22B (qwen3 235B-A22B) among mixtures of experts here, not this one; written as llama3 with the scenario's name as the flavor, which torchtitan must be taught",
            );
            ("llama3", m.name.clone())
        }
        (Family::Gpt, _) => {
            drop(
                "model.family = \"gpt\"".into(),
                "torchtitan v0.2.2 has no GPT model (learned positions, LayerNorm, GELU, tied embeddings); written as llama3 with the scenario's name as the flavor, which torchtitan must be taught",
            );
            ("llama3", m.name.clone())
        }
        (Family::Llama, None) => {
            drop(
                format!(
                    "model shape (layers {}, hidden {}, heads {}, kv_heads {}, ffn_hidden {})",
                    m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden
                ),
                "not a torchtitan llama3 flavor (8B, 70B, 405B); written as flavor = the scenario's model name, to be registered in torchtitan/models/llama3/__init__.py",
            );
            ("llama3", m.name.clone())
        }
        (Family::Llama, Some(f)) if m.q_dim() == m.hidden as u64 => ("llama3", f.0.to_string()),
        (Family::Llama, Some(_)) => {
            drop(
                format!("model.head_dim = {} (heads · head_dim = {} ≠ hidden {})", m.head_dim(), m.q_dim(), m.hidden),
                "torchtitan's llama3 derives head_dim = dim / n_heads; written as flavor = the scenario's model name, to be registered in torchtitan/models/llama3/__init__.py",
            );
            ("llama3", m.name.clone())
        }
    };
    if qwen3 {
        if m.rope_base != 5e6 {
            drop(
                format!("model.rope_base = {}", m.rope_base),
                "torchtitan v0.2.2's qwen3 235B-A22B flavor fixes rope_theta = 5000000 (Hugging Face's config.json says 1000000)",
            );
        }
        if p.pp > 1 {
            drop(
                format!("parallel.pp = {}", p.pp),
                "torchtitan v0.2.2's qwen3 train spec has no pipelining_fn: it trains without a pipeline",
            );
        }
    }
    if deepseek && m.mtp_layers > 0 {
        drop(
            format!("model.mtp_layers = {}", m.mtp_layers),
            "torchtitan's deepseek_v3 model has no multi-token-prediction module",
        );
    }
    if m.family == Family::Llama && !deepseek && !qwen3 {
        if m.vocab != LLAMA3_VOCAB {
            drop(
                format!("model.vocab = {}", m.vocab),
                "torchtitan takes the vocabulary from the tokenizer (hf_assets_path); the llama3 flavors use Llama 3's 128,256",
            );
        }
        if m.rope_base != 500_000.0 {
            drop(format!("model.rope_base = {}", m.rope_base), "torchtitan's llama3 flavors fix rope_theta = 500000");
        }
    }
    if m.dropout > 0.0 {
        drop(format!("model.dropout = {}", m.dropout), "torchtitan's models have no dropout");
    }
    if !t.flash_attention {
        drop(
            "training.flash_attention = false".into(),
            "torchtitan's llama3 attention is SDPA (flash or memory-efficient kernels), which never stores the s×s scores",
        );
    }

    // [training]
    let (local, micro) =
        if p.pp > 1 { (p.micro_batch * p.microbatches(), Some(p.micro_batch)) } else { (p.micro_batch, None) };
    let param_dtype = match t.dtype {
        Dtype::Bf16 => "bfloat16",
        // The float8 converter below; parameters are gathered in bf16.
        Dtype::Fp8 => "bfloat16",
        Dtype::Fp32 => "float32",
        Dtype::Fp16 => {
            drop(
                "training.dtype = \"fp16\"".into(),
                "torchtitan's mixed precision is bfloat16 or float32; written as bfloat16",
            );
            "bfloat16"
        }
    };
    if t.grad_reduce_in_bf16 {
        drop(
            "training.grad_reduce_in_bf16 = true".into(),
            "torchtitan v0.2.2's mixed_precision_reduce is float32 only",
        );
    }

    // [parallelism]
    let (replicate, shard, reshard) = match p.zero {
        0 => (p.dp, 1, None),
        2 => (1, p.dp, Some("never")),
        _ => (1, p.dp, Some("always")),
    };
    // FSDP2 (zero 2/3) reduce-scatters per unit, as the plan does under torchtitan, so the
    // bucket size plays no part there; DDP keeps torch's own.
    if p.zero == 0 {
        drop(
            format!("parallel.grad_bucket_mb = {}", p.grad_bucket_mb),
            "torchtitan's DDP keeps torch's bucket size (25 MiB); its TOML has no bucket key",
        );
    }
    if !p.overlap_grad_reduce {
        drop(
            "parallel.overlap_grad_reduce = false".into(),
            "torchtitan always overlaps the gradient reduction with backward",
        );
    }
    if p.zero == 3 && !p.overlap_param_gather {
        drop("parallel.overlap_param_gather = false".into(), "FSDP2 always prefetches the next layer's parameters");
    }
    let ac = match p.recompute {
        Recompute::None => "none",
        Recompute::Full => "full",
        Recompute::Selective => {
            drop(
                "parallel.recompute = \"selective\"".into(),
                "torchtitan's selective checkpointing is per op (it keeps matmul and attention outputs and recomputes the rest) or per layer, not Strata's attention-core recomputation; written as mode = \"selective\", selective_ac_option = \"op\"",
            );
            "selective"
        }
    };

    let mut o = format!(
        "# torchtitan v0.2.2 job config for {}: {} GPUs = dp {} × cp {} × tp {} × pp {}.\n# Run: NGPU={} CONFIG_FILE=torchtitan.toml ./run_train.sh (torchrun over {} node(s) for more).\n\n",
        s.name,
        p.ranks(),
        p.dp,
        p.cp,
        p.tp,
        p.pp,
        s.cluster.gpus_per_node.min(p.ranks() as u32),
        s.cluster.nodes
    );
    let _ = writeln!(o, "[job]\ndescription = {}\n", quote(&format!("strata export of {}", s.name)));
    // torchtitan's download script puts the Llama 3.1 tokenizer under ./assets/hf/<repo>.
    let _ = writeln!(
        o,
        "[model]\nname = \"{model_name}\"\nflavor = {}\nhf_assets_path = {}",
        quote(&flavor_name),
        quote(&if deepseek {
            "./assets/hf/DeepSeek-V3".to_string()
        } else if qwen3 {
            "./assets/hf/Qwen3-235B-A22B".to_string()
        } else {
            format!("./assets/hf/Llama-3.1-{}", flavor.map_or("8B", |f| f.0))
        })
    );
    if t.fp8() {
        o.push_str("converters = [\"quantize.linear.float8\"]\n");
    }
    o.push('\n');
    let _ = writeln!(
        o,
        "[optimizer]\nname = \"AdamW\"\nlr = {}\neps = 1e-8\nweight_decay = {}\n\n[lr_scheduler]\nwarmup_steps = {}\n",
        float(t.lr),
        float(t.weight_decay),
        t.warmup_steps
    );
    let _ = writeln!(
        o,
        "[training]\nlocal_batch_size = {local}\nglobal_batch_size = {}\nseq_len = {}\nmax_norm = {}\nsteps = {}\ndtype = \"float32\"\nmixed_precision_param = \"{param_dtype}\"\nmixed_precision_reduce = \"float32\"\n",
        p.global_batch,
        m.seq_len,
        float(t.grad_clip),
        t.steps
    );
    let _ = writeln!(
        o,
        "[parallelism]\ndata_parallel_replicate_degree = {replicate}\ndata_parallel_shard_degree = {shard}\ntensor_parallel_degree = {}\npipeline_parallel_degree = {}\ncontext_parallel_degree = {}",
        p.tp, p.pp, p.cp
    );
    if p.cp > 1 {
        // The rules already rejected Ulysses.
        let rotate = if p.cp_comm == CpComm::AllGather { "allgather" } else { "alltoall" };
        let _ = writeln!(o, "context_parallel_rotate_method = \"{rotate}\"");
    }
    if m.moe.is_some() {
        let _ = writeln!(o, "expert_parallel_degree = {}\nexpert_tensor_parallel_degree = 1", p.ep);
    }
    if s.tp_comm_overlap() {
        o.push_str("enable_async_tensor_parallel = true\n");
    }
    if let Some(r) = reshard {
        let _ = writeln!(o, "fsdp_reshard_after_forward = \"{r}\"");
    }
    if p.pp > 1 {
        // The rules already rejected schedules torchtitan lacks.
        let _ = writeln!(o, "pipeline_parallel_schedule = \"{}\"", schedule_name(p.schedule).unwrap_or("1F1B"));
        if let Some(b) = micro {
            let _ = writeln!(o, "pipeline_parallel_microbatch_size = {b}");
        }
        let _ = writeln!(o, "module_fqns_per_model_part = {}", model_parts(s));
    }
    if s.tp_comm_overlap() {
        o.push_str("\n# Async tensor parallelism takes effect only under torch.compile.\n[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n");
    }
    let _ = writeln!(o, "\n[activation_checkpoint]\nmode = \"{ac}\"");
    if ac == "selective" {
        o.push_str("selective_ac_option = \"op\"\n");
    }
    if t.fp8() {
        o.push_str("\n# fp8: torchao float8 linear layers with dynamic per-tensor scaling (Strata models\n# Transformer Engine's delayed scaling; the same linear GEMMs run in fp8).\n[quantize.linear.float8]\nrecipe_name = \"tensorwise\"\n");
    }
    (vec![File { name: "torchtitan.toml", text: o }], dropped)
}

/// The plan's layer split as torchtitan module names, one list per virtual stage.
fn model_parts(s: &Scenario) -> String {
    let stages = super::vstage_layers(s);
    let last = stages.len() - 1;
    let parts: Vec<String> = stages
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut names = Vec::new();
            if i == 0 {
                names.push("\"tok_embeddings\"".to_string());
            }
            names.extend(r.clone().map(|l| format!("\"layers.{l}\"")));
            if i == last {
                names.push("\"norm\"".into());
                names.push("\"output\"".into());
            }
            format!("[{}]", names.join(", "))
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn quote(x: &str) -> String {
    format!("\"{}\"", x.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A TOML float (always with a point or exponent).
fn float(x: f64) -> String {
    let t = format!("{x:?}");
    if t.contains('.') || t.contains('e') || t.contains("inf") || t.contains("NaN") { t } else { format!("{t}.0") }
}
