//! Megatron-LM: `megatron-args.txt` (every `pretrain_gpt.py` argument the split needs, one
//! per line) and `megatron-launch.sh` (the environment Megatron-LM asserts, and `torchrun`).
//!
//! Names and units are Megatron-LM's own (core_v0.16–0.19, `megatron/training/arguments.py`
//! and megatron-core's `TransformerConfig`; `docs/frameworks.md` §1):
//! - shape: GQA needs `--group-query-attention` beside `--num-query-groups` (the count is
//!   ignored without it); Llama is `--swiglu --normalization RMSNorm --disable-bias-linear
//!   --untie-embeddings-and-output-weights --position-embedding-type rope --rotary-base`;
//!   dropout is written out because Megatron's default is 0.1, which Llama does not use;
//! - the vocabulary is padded to a multiple of `--make-vocab-size-divisible-by` × tp: the
//!   divisor is chosen so that the padded size is the scenario's own vocabulary (the one the
//!   plan counts), and the mock-data tokenizer (`NullTokenizer`, which adds an end-of-document
//!   token) gets `--vocab-size` one less;
//! - `--ddp-bucket-size` counts parameters (elements), not bytes;
//! - layers that do not split evenly over the virtual stages go into
//!   `--pipeline-model-parallel-layout`, stage by stage, exactly as the plan splits them
//!   (Megatron's default would give every stage the same count);
//! - `--attention-backend flash` with `training.flash_attention`, else `unfused` (scores
//!   stored, as the plan's activation memory counts them);
//! - `CUDA_DEVICE_MAX_CONNECTIONS=1`, which `validate_args` asserts when tp > 1 or cp > 1 on
//!   GPUs before Blackwell;
//! - mixtures of experts (megatron-core `MoELayer`): `--num-experts --moe-router-topk
//!   --moe-ffn-hidden-size`, `--moe-shared-expert-intermediate-size` (all shared experts'
//!   width together), `--moe-layer-freq ([0]*d+[1]*(l-d))` for dense first layers,
//!   `--moe-router-score-function`, `--moe-aux-loss-coeff`, `--moe-expert-capacity-factor`
//!   (absent = dropless), `--expert-model-parallel-size` with `--expert-tensor-parallel-size
//!   1` (Strata's experts are not tensor-parallel), `--moe-grouped-gemm` and the all-to-all
//!   dispatcher; latent attention `--multi-latent-attention --q-lora-rank --kv-lora-rank
//!   --qk-head-dim --qk-pos-emb-head-dim --v-head-dim`; `--mtp-num-layers`;
//! - `parallel.moe_a2a_overlap`: `--overlap-moe-expert-parallel-comm` (megatron-core's
//!   combined 1F1B; it refuses `--moe-shared-expert-overlap`, which is not exported);
//! - `parallel.tp_comm_overlap` (resolved by `Scenario::tp_comm_overlap`: on by default for
//!   sequence-parallel runs on Hopper and newer): `--tp-comm-overlap`, Transformer Engine's
//!   userbuffer overlap of the sequence-parallel all-gathers and reduce-scatters with the
//!   GEMMs beside them (the default per-GEMM methods of its `tp_comm_overlap_cfg`);
//! - context parallelism: `--context-parallel-size --cp-comm-type p2p|allgather|a2a`;
//! - fp8: `--fp8-format hybrid --fp8-recipe delayed` (Transformer Engine's delayed scaling,
//!   E4M3 forward and E5M2 backward) beside `--bf16`, without `--fp8-param-gather` (the bf16
//!   weights are kept, as the memory model counts).

use std::fmt::Write as _;

use super::{Dropped, File, bucket_elements, even_split, vstage_layers};
use crate::hardware::GpuKind;
use crate::model::{Activation, Family, RouterScore};
use crate::parallel::{CpComm, Recompute};
use crate::scenario::{Dtype, Scenario};

/// The files, and the settings they cannot carry.
pub fn write(s: &Scenario) -> (Vec<File>, Vec<Dropped>) {
    let (args, dropped) = arguments(s);
    let mut text = format!("# Megatron-LM (pretrain_gpt.py) arguments for {}: one argument per line.\n", s.name);
    text.push_str("# Launch with megatron-launch.sh (it sets the environment these arguments need).\n");
    if let Some(note) = s.parallel.schedule.spec().megatron_note {
        let _ = writeln!(text, "# {note}");
    }
    for a in &args {
        let _ = writeln!(text, "{a}");
    }
    let launch = launch_script(s);
    (vec![File { name: "megatron-args.txt", text }, File { name: "megatron-launch.sh", text: launch }], dropped)
}

/// Whether Megatron-LM asserts `CUDA_DEVICE_MAX_CONNECTIONS=1`: tensor (or context)
/// parallelism on a GPU older than Blackwell (compute capability < 10).
pub fn needs_max_connections_1(s: &Scenario) -> bool {
    (s.parallel.tp > 1 || s.parallel.cp > 1)
        && matches!(
            s.cluster.gpu,
            GpuKind::A100_40gb | GpuKind::A100_80gb | GpuKind::H100Sxm | GpuKind::H200Sxm | GpuKind::H800Sxm
        )
}

/// `--make-vocab-size-divisible-by`: the largest power of two ≤ 128 that pads the
/// vocabulary to itself (V divisible by it × tp), or 1 when V is not a multiple of tp (then
/// Megatron pads to the next multiple of tp, which is what the plan's vocabulary shards
/// hold).
pub fn vocab_divisor(vocab: u32, tp: u32) -> u32 {
    if !vocab.is_multiple_of(tp) {
        return 1;
    }
    let per_rank = vocab / tp;
    (0..=7).rev().map(|k| 1u32 << k).find(|d| per_rank.is_multiple_of(*d)).unwrap_or(1)
}

/// The pipeline layout string (`Et*3|t*4|…|t*3L`): virtual stages in order, `E` the
/// embedding, `t` a decoder layer, `L` the loss.
pub fn layout(s: &Scenario) -> String {
    let stages = vstage_layers(s);
    let last = stages.len() - 1;
    stages
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut x = String::new();
            if i == 0 {
                x.push('E');
            }
            match r.len() {
                0 => {}
                1 => x.push('t'),
                n => {
                    let _ = write!(x, "t*{n}");
                }
            }
            if i == last {
                x.push('L');
            }
            x
        })
        .collect::<Vec<_>>()
        .join("|")
}

fn arguments(s: &Scenario) -> (Vec<String>, Vec<Dropped>) {
    let m = &s.model;
    let p = &s.parallel;
    let t = &s.training;
    let mut dropped = Vec::new();
    let mut a: Vec<String> = vec![
        format!("--num-layers {}", m.layers),
        format!("--hidden-size {}", m.hidden),
        format!("--ffn-hidden-size {}", m.ffn_hidden),
        format!("--num-attention-heads {}", m.heads),
        format!("--kv-channels {}", m.head_dim()),
    ];
    if m.kv_heads < m.heads {
        a.push(format!("--group-query-attention --num-query-groups {}", m.kv_heads));
    }
    a.push(format!("--seq-length {}", m.seq_len));
    a.push(format!("--max-position-embeddings {}", m.seq_len));
    if m.activation == Activation::Swiglu {
        a.push("--swiglu".into());
    }
    match m.family {
        Family::Gpt => {
            a.push("--normalization LayerNorm".into());
            a.push("--position-embedding-type learned_absolute".into());
        }
        Family::Llama => {
            a.push("--normalization RMSNorm".into());
            a.push("--disable-bias-linear".into());
            a.push("--untie-embeddings-and-output-weights".into());
            a.push("--position-embedding-type rope".into());
            // Megatron reads an int.
            a.push(format!("--rotary-base {}", m.rope_base.round() as u64));
        }
    }
    a.push(format!("--attention-dropout {}", m.dropout));
    a.push(format!("--hidden-dropout {}", m.dropout));
    a.push(format!("--attention-backend {}", if t.flash_attention { "flash" } else { "unfused" }));
    a.push(format!("--make-vocab-size-divisible-by {}", vocab_divisor(m.vocab, p.tp)));
    // NullTokenizer adds an end-of-document token: V − 1 ids plus EOD is the model's V.
    a.push("--tokenizer-type NullTokenizer".into());
    a.push(format!("--vocab-size {}", m.vocab.saturating_sub(1).max(1)));
    a.push("--mock-data".into());

    if let Some(e) = &m.moe {
        a.push(format!("--num-experts {}", e.experts));
        a.push(format!("--moe-router-topk {}", e.top_k));
        a.push(format!("--moe-ffn-hidden-size {}", e.expert_ffn_hidden));
        if e.shared_experts > 0 {
            a.push(format!(
                "--moe-shared-expert-intermediate-size {}",
                e.shared_experts as u64 * e.shared_ffn_hidden as u64
            ));
        }
        if e.dense_layers > 0 {
            let moe = m.layers.saturating_sub(e.dense_layers);
            a.push(format!("--moe-layer-freq ([0]*{}+[1]*{moe})", e.dense_layers));
        }
        a.push(format!(
            "--moe-router-score-function {}",
            match e.score {
                RouterScore::Softmax => "softmax",
                RouterScore::Sigmoid => "sigmoid",
            }
        ));
        a.push("--moe-router-load-balancing-type aux_loss".into());
        a.push(format!("--moe-aux-loss-coeff {}", e.aux_loss_coeff));
        if let Some(c) = e.capacity_factor {
            a.push(format!("--moe-expert-capacity-factor {c}"));
        }
        a.push("--moe-grouped-gemm".into());
        a.push("--moe-token-dispatcher-type alltoall".into());
        // `skew` is what the simulator draws for routing imbalance; a real run's router
        // decides it, so no flag carries it.
    }
    if let Some(l) = &m.mla {
        a.push("--multi-latent-attention".into());
        if l.q_lora_rank > 0 {
            a.push(format!("--q-lora-rank {}", l.q_lora_rank));
        }
        a.push(format!("--kv-lora-rank {}", l.kv_lora_rank));
        a.push(format!("--qk-head-dim {}", l.qk_nope_head_dim));
        a.push(format!("--qk-pos-emb-head-dim {}", l.qk_rope_head_dim));
        a.push(format!("--v-head-dim {}", l.v_head_dim));
    }
    if m.mtp_layers > 0 {
        a.push(format!("--mtp-num-layers {}", m.mtp_layers));
    }

    a.push(format!("--tensor-model-parallel-size {}", p.tp));
    a.push(format!("--pipeline-model-parallel-size {}", p.pp));
    if p.cp > 1 {
        a.push(format!("--context-parallel-size {}", p.cp));
        a.push(format!(
            "--cp-comm-type {}",
            match p.cp_comm {
                CpComm::Ring => "p2p",
                CpComm::AllGather => "allgather",
                CpComm::Ulysses => "a2a",
            }
        ));
    }
    if m.moe.is_some() {
        a.push(format!("--expert-model-parallel-size {}", p.ep));
        a.push("--expert-tensor-parallel-size 1".into());
    }
    if p.moe_a2a_overlap {
        // A forward and a backward of two microbatches merged, each one's all-to-alls under
        // the other's compute (the framework rule `megatron-a2a-overlap` holds its needs).
        a.push("--overlap-moe-expert-parallel-comm".into());
    }
    if p.pp > 1 && !even_split(s) {
        a.push(format!("--pipeline-model-parallel-layout {}", layout(s)));
    } else if p.schedule.chunked() {
        a.push(format!("--num-layers-per-virtual-pipeline-stage {}", m.layers / p.pipeline().vstages()));
    }
    if p.sequence_parallel {
        a.push("--sequence-parallel".into());
    }
    if s.tp_comm_overlap() {
        a.push("--tp-comm-overlap".into());
    }
    match p.recompute {
        Recompute::None => {}
        Recompute::Selective => a.push("--recompute-granularity selective".into()),
        Recompute::Full => {
            a.push("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1".into())
        }
    }
    if p.zero == 1 {
        a.push("--use-distributed-optimizer".into());
    }
    if p.overlap_grad_reduce {
        a.push("--overlap-grad-reduce".into());
    }
    if p.zero == 1 && p.overlap_param_gather {
        if p.overlap_grad_reduce {
            a.push("--overlap-param-gather".into());
        } else {
            dropped.push(Dropped {
                setting: "parallel.overlap_param_gather = true".into(),
                reason: "Megatron-LM's --overlap-param-gather requires --overlap-grad-reduce (parallel.overlap_grad_reduce = false); parameters are gathered after the optimizer step instead".into(),
            });
        }
    }
    a.push(format!("--ddp-bucket-size {}", bucket_elements(s)));
    if t.grad_reduce_in_bf16 && t.dtype == Dtype::Bf16 {
        a.push("--grad-reduce-in-bf16".into());
    }

    a.push(format!("--micro-batch-size {}", p.micro_batch));
    a.push(format!("--global-batch-size {}", p.global_batch));
    match t.dtype {
        Dtype::Bf16 => a.push("--bf16".into()),
        // Transformer Engine's delayed scaling with E4M3 forward and E5M2 backward.
        Dtype::Fp8 => {
            a.push("--bf16".into());
            a.push("--fp8-format hybrid".into());
            a.push("--fp8-recipe delayed".into());
        }
        Dtype::Fp16 => a.push("--fp16".into()),
        Dtype::Fp32 => {}
    }
    a.push(format!("--train-iters {}", t.steps));
    a.push(format!("--lr {}", t.lr));
    a.push(format!("--min-lr {}", t.lr));
    a.push(format!("--lr-warmup-iters {}", t.warmup_steps));
    a.push("--lr-decay-style constant".into());
    a.push(format!("--weight-decay {}", t.weight_decay));
    a.push(format!("--clip-grad {}", t.grad_clip));
    a.push("--adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8".into());
    a.push(format!("--seed {}", t.seed));
    (a, dropped)
}

fn launch_script(s: &Scenario) -> String {
    let c = &s.cluster;
    let mut o = String::from("#!/usr/bin/env bash\n");
    let _ = writeln!(
        o,
        "# Megatron-LM launch for {}: {} node(s) × {} GPU(s). Run it on every node with NODE_RANK,\n# MASTER_ADDR and MASTER_PORT set, and MEGATRON_LM pointing at a Megatron-LM checkout.",
        s.name, c.nodes, c.gpus_per_node
    );
    o.push_str("set -euo pipefail\nset -f  # the pipeline layout holds '*' and '|'\n");
    if needs_max_connections_1(s) {
        let _ = writeln!(
            o,
            "# Tensor parallelism on {} (before Blackwell): Megatron-LM's validate_args asserts this.\nexport CUDA_DEVICE_MAX_CONNECTIONS=1",
            c.gpu.key()
        );
    }
    o.push_str("HERE=\"$(cd \"$(dirname \"$0\")\" && pwd)\"\n");
    o.push_str("ARGS=$(grep -v '^#' \"$HERE/megatron-args.txt\")\n");
    let _ = writeln!(
        o,
        "# shellcheck disable=SC2086\nexec torchrun --nnodes {} --nproc-per-node {} --node-rank \"${{NODE_RANK:-0}}\" \\\n  --master-addr \"${{MASTER_ADDR:-localhost}}\" --master-port \"${{MASTER_PORT:-6000}}\" \\\n  \"${{MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout}}/pretrain_gpt.py\" $ARGS \"$@\"",
        c.nodes, c.gpus_per_node
    );
    o
}
