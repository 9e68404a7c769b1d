#!/usr/bin/env python3
"""Figures of the frameworks' own memory arithmetic, for models/tests/data/framework_memory.csv.

Megatron-LM: megatron/training/theoretical_memory_usage.py, read from a Megatron-LM checkout
(path in MEGATRON_TMU, default /tmp/theoretical_memory_usage.py; e.g. `git show d98e8a64dd:megatron/training/theoretical_memory_usage.py` in a clone of github.com/NVIDIA/Megatron-LM), called with a
types.SimpleNamespace of the arguments a launch would pass.
DeepSpeed: deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs and
deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs from the installed package
(pip deepspeed; DS_ACCELERATOR=cuda so importing on a CPU machine builds nothing), with the
parameter count and the largest module of a torch nn.Module built on the meta device the way
Hugging Face builds GPT-2 and Llama (DeepSpeed's model_to_params loop for the largest module).

Run:  DS_ACCELERATOR=cuda python gen_framework_memory.py > framework_memory.csv
Nothing in Strata's build or tests runs this script; the CSV it prints is checked in.
"""
import math
import os
import sys
import types

os.environ.setdefault("DS_ACCELERATOR", "cuda")

MODELS = {
    # name: (family, layers, hidden, heads, kv_heads, ffn, vocab, seq)
    "gpt2-350m": ("gpt", 24, 1024, 16, 16, 4096, 50257, 1024),
    "gpt-22b": ("gpt", 48, 6144, 64, 64, 24576, 51200, 2048),
    "gpt3-175b": ("gpt", 96, 12288, 96, 96, 49152, 51200, 2048),
    "llama3-8b": ("llama", 32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": ("llama", 80, 8192, 64, 8, 28672, 128256, 8192),
}


def load_megatron():
    path = os.environ.get("MEGATRON_TMU", "/tmp/theoretical_memory_usage.py")
    src = open(path).read().replace("from .utils import is_hybrid_model, print_rank_0", "")
    mod = types.ModuleType("tmu")
    mod.is_hybrid_model = lambda args: False
    mod.print_rank_0 = lambda *a, **k: None
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def megatron_args(name, tp, pp, dp, vpp, mb, dist_opt, sp, recompute):
    fam, L, h, a, g, f, V, s = MODELS[name]
    div = 128 * tp
    return types.SimpleNamespace(
        kv_channels=h // a, num_attention_heads=a, hidden_size=h, ffn_hidden_size=f,
        group_query_attention=(g != a), num_query_groups=g, num_experts=None,
        swiglu=(fam == "llama"), moe_shared_expert_intermediate_size=None, mtp_num_layers=None,
        normalization="RMSNorm" if fam == "llama" else "LayerNorm", multi_latent_attention=False,
        padded_vocab_size=math.ceil(V / div) * div,
        untie_embeddings_and_output_weights=(fam == "llama"), moe_latent_size=None,
        moe_router_topk=2, add_bias_linear=(fam == "gpt"), num_layers=L,
        expert_tensor_parallel_size=tp, expert_model_parallel_size=1,
        pipeline_model_parallel_size=pp, tensor_model_parallel_size=tp,
        world_size=tp * pp * dp, data_parallel_size=dp, use_distributed_optimizer=dist_opt,
        seq_length=s, micro_batch_size=mb,
        virtual_pipeline_model_parallel_size=(vpp if vpp > 1 else None),
        sequence_parallel=sp, recompute_granularity=recompute,
    )


# (model, tp, pp, dp, vpp, micro_batch, global_batch, sequence_parallel, recompute)
MEGATRON_SPLITS = [
    ("gpt3-175b", 8, 8, 16, 1, 1, 1536, True, "selective"),
    ("gpt3-175b", 8, 8, 16, 3, 1, 1536, True, "selective"),
    ("gpt3-175b", 4, 8, 32, 6, 2, 1536, True, "selective"),
    ("gpt-22b", 8, 1, 4, 1, 4, 64, True, "selective"),
    ("gpt2-350m", 1, 2, 4, 1, 8, 64, False, "selective"),
    ("llama3-70b", 8, 4, 8, 1, 1, 512, True, "selective"),
    ("llama3-8b", 2, 2, 2, 1, 1, 64, True, "selective"),
]

# (model, gpus per node, nodes)
DEEPSPEED_CASES = [
    ("gpt2-350m", 8, 1),
    ("llama3-8b", 8, 1),
    ("llama3-8b", 8, 8),
    ("gpt3-175b", 8, 64),
    ("llama3-70b", 8, 32),
    ("llama3-70b", 8, 128),
]


def meta_model(name):
    """The module tree Hugging Face builds (GPT2LMHeadModel, LlamaForCausalLM), on meta."""
    import torch
    from torch import nn
    fam, L, h, a, g, f, V, s = MODELS[name]
    kv = g * (h // a)
    with torch.device("meta"):
        if fam == "gpt":
            blocks = nn.ModuleList([nn.ModuleDict({
                "ln_1": nn.LayerNorm(h), "c_attn": nn.Linear(h, 3 * h), "c_proj": nn.Linear(h, h),
                "ln_2": nn.LayerNorm(h), "c_fc": nn.Linear(h, f), "mlp_c_proj": nn.Linear(f, h),
            }) for _ in range(L)])
            m = nn.ModuleDict({"wte": nn.Embedding(V, h), "wpe": nn.Embedding(s, h), "h": blocks,
                               "ln_f": nn.LayerNorm(h)})
            m["lm_head"] = nn.Linear(h, V, bias=False)
            m["lm_head"].weight = m["wte"].weight  # tied
        else:
            blocks = nn.ModuleList([nn.ModuleDict({
                "input_layernorm": nn.RMSNorm(h), "q_proj": nn.Linear(h, h, bias=False),
                "k_proj": nn.Linear(h, kv, bias=False), "v_proj": nn.Linear(h, kv, bias=False),
                "o_proj": nn.Linear(h, h, bias=False), "post_attention_layernorm": nn.RMSNorm(h),
                "gate_proj": nn.Linear(h, f, bias=False), "up_proj": nn.Linear(h, f, bias=False),
                "down_proj": nn.Linear(f, h, bias=False),
            }) for _ in range(L)])
            m = nn.ModuleDict({"embed_tokens": nn.Embedding(V, h), "layers": blocks, "norm": nn.RMSNorm(h),
                               "lm_head": nn.Linear(h, V, bias=False)})
    return m


def deepspeed_params(name):
    from deepspeed.runtime.zero.stage3 import model_to_params
    m = meta_model(name)
    # model_to_params dedups shared tensors by data_ptr, which is 0 for every meta tensor:
    # take its largest-module count and count the (identity-deduplicated) parameters here.
    _, largest = model_to_params(m)
    total = sum(p.numel() for p in m.parameters())
    return total, largest


def main():
    import deepspeed
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    tmu = load_megatron()
    commit = os.environ.get("MEGATRON_COMMIT", "d98e8a64dd")
    print("# Memory figures of the frameworks' own arithmetic (bytes per GPU), produced by")
    print("# models/tests/data/gen_framework_memory.py. Do not edit by hand.")
    print(f"# megatron: Megatron-LM {commit} megatron/training/theoretical_memory_usage.py;")
    print("#   compute_weight_and_optimizer_memory (bf16, fp32 main grads; zero 1 = --use-distributed-optimizer),")
    print("#   activations as report_theoretical_memory picks them (SP formula iff sequence parallel and selective,")
    print("#   else the without-SP formula with its 1.05 factor); num_microbatches = global / (micro * dp);")
    print("#   padded vocab = ceil(V / (128 tp)) * 128 tp; GPT: LayerNorm, bias, tied; Llama: RMSNorm, SwiGLU, GQA, untied.")
    print(f"# deepspeed: DeepSpeed {deepspeed.__version__} estimate_zero2_model_states_mem_needs /")
    print("#   estimate_zero3_model_states_mem_needs (cpu_offload=False), parameters and largest module from")
    print("#   the Hugging Face module tree (GPT2LMHeadModel tied, LlamaForCausalLM untied) on the meta device.")
    print("framework,model,tp,pp,dp,vpp,micro_batch,global_batch,zero,sequence_parallel,recompute,quantity,bytes")
    for (name, tp, pp, dp, vpp, mb, gb, sp, rc) in MEGATRON_SPLITS:
        m = gb // (mb * dp)
        for zero in (0, 1):
            args = megatron_args(name, tp, pp, dp, vpp, mb, zero == 1, sp, rc)
            wo = tmu.compute_weight_and_optimizer_memory(args)
            if sp and rc == "selective":
                act = tmu.compute_activation_memory(args, num_microbatches=m)
            else:
                act = tmu.compute_activation_memory_without_sp(args, num_microbatches=m)
            row = f"megatron,{name},{tp},{pp},{dp},{vpp},{mb},{gb},{zero},{str(sp).lower()},{rc}"
            print(f"{row},weights_optimizer,{wo:.0f}")
            if zero == 0:
                print(f"{row},activations,{act:.0f}")
    for (name, gpn, nodes) in DEEPSPEED_CASES:
        total, largest = deepspeed_params(name)
        n = gpn * nodes
        _, z2 = estimate_zero2_model_states_mem_needs(total, gpn, nodes, cpu_offload=False)
        _, z3, _ = estimate_zero3_model_states_mem_needs(total, largest, gpn, nodes, cpu_offload=False)
        for zero, v in ((2, z2), (3, z3)):
            print(f"deepspeed,{name},1,1,{n},1,1,{n},{zero},false,selective,model_states,{v}")
        print(f"# deepspeed {name}: {total} parameters, largest module {largest}", file=sys.stderr)


if __name__ == "__main__":
    main()
