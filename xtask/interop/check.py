"""Loads Strata's exports with each framework's own code (`cargo xtask interop` runs this).

Usage: python check.py MANIFEST.json

The manifest lists exports: {"target", "dir", "command", "tp", "pp", "dp", "gpu", "lossy"}. For each
one this prints one line — ok or FAIL, the command that wrote it, and what the parser
made of it — and exits 1 if any export was rejected.

- deepspeed: `deepspeed.runtime.config.DeepSpeedConfig(path, mpu)` on a one-process gloo
  group, with an mpu that reports the export's data-parallel size (so `_batch_assertion`
  checks train_batch_size = micro × accumulation × dp), then
  `deepspeed.checkpointing.configure` when the config has an activation_checkpointing section.
- megatron: every flag must be one of Megatron-LM's (megatron-flags.txt, generated from its
  arguments.py by megatron_flags.py; megatron-core's wheel has no megatron/training); the
  flags then become megatron-core's TransformerConfig (its __post_init__ checks, with
  ModelParallelConfig's), DistributedDataParallelConfig and OptimizerConfig, as
  megatron/training's core_transformer_config_from_args maps them; the few checks of
  validate_args that do not live in megatron-core (batch divisibility, layers over stages,
  --overlap-param-gather's requirements, CUDA_DEVICE_MAX_CONNECTIONS) are restated here.
- torchtitan: torchtitan.config.ConfigManager parses the TOML (unknown keys and wrong
  types are errors), the flavor must be one its model package registers, ParallelDims
  validates the degrees against the world size,
  torch.distributed.pipelining's get_schedule_class resolves the schedule, and the batch and
  stage checks of torchtitan's train.py / distributed/pipeline_parallel.py are restated.
"""

import json
import os
import shlex
import sys
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cuda")  # parse on CPU without JIT-building ops
HERE = os.path.dirname(os.path.abspath(__file__))


class FakeMpu:
    """What DeepSpeed asks of a model-parallel unit, for one process standing in for a grid."""

    def __init__(self, tp, pp, dp):
        self.tp, self.pp, self.dp = tp, pp, dp

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return 0

    def get_data_parallel_group(self):
        return None

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_rank(self):
        return 0

    def get_model_parallel_group(self):
        return None

    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_pipeline_model_parallel_world_size(self):
        return self.pp


def init_dist():
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", rank=0, world_size=1, auto_mpi_discovery=False, verbose=False)


def check_deepspeed(e):
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig

    init_dist()
    path = os.path.join(e["dir"], "deepspeed.json")
    mpu = FakeMpu(e["tp"], e["pp"], e["dp"])
    c = DeepSpeedConfig(path, mpu=mpu)
    raw = json.load(open(path))
    if "activation_checkpointing" in raw:
        deepspeed.checkpointing.configure(mpu, deepspeed_config=path)
    z = c.zero_config
    return (
        f"DeepSpeedConfig: world {c.world_size}, train_batch_size {c.train_batch_size} = micro {c.train_micro_batch_size_per_gpu}"
        f" × accumulation {c.gradient_accumulation_steps} × dp {c.world_size}; zero stage {int(c.zero_optimization_stage)},"
        f" reduce_bucket_size {int(z.reduce_bucket_size)}, overlap_comm {z.overlap_comm}; bf16 {c.bfloat16_config.enabled};"
        f" communication_data_type {c.communication_data_type}; autotp_size {c.tensor_parallel_config.autotp_size};"
        f" activation checkpointing {'configured' if 'activation_checkpointing' in raw else 'off'}"
    )


def megatron_args(path):
    """The flags of megatron-args.txt: {flag: [values]} in order, and the flag list."""
    tokens = []
    for line in open(path):
        if not line.lstrip().startswith("#"):
            tokens += shlex.split(line)
    args, order = {}, []
    for tok in tokens:
        if tok.startswith("--"):
            if tok in args:
                raise ValueError(f"{tok} given twice")
            args[tok] = []
            order.append(tok)
        elif order:
            args[order[-1]].append(tok)
        else:
            raise ValueError(f"value {tok!r} before any flag")
    return args, order


def check_megatron(e):
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    known = {l.strip() for l in open(os.path.join(HERE, "megatron-flags.txt")) if l.startswith("--")}
    a, order = megatron_args(os.path.join(e["dir"], "megatron-args.txt"))
    unknown = [f for f in order if f not in known]
    if unknown:
        raise ValueError(f"not Megatron-LM arguments: {', '.join(unknown)}")
    one = lambda f, t=str, d=None: t(a[f][0]) if f in a else d  # noqa: E731
    flag = lambda f: f in a  # noqa: E731
    dtype = torch.bfloat16 if flag("--bf16") else torch.float16 if flag("--fp16") else torch.float32
    tp, pp = one("--tensor-model-parallel-size", int, 1), one("--pipeline-model-parallel-size", int, 1)
    layers = one("--num-layers", int)
    kw = dict(
        num_layers=layers,
        hidden_size=one("--hidden-size", int),
        ffn_hidden_size=one("--ffn-hidden-size", int),
        num_attention_heads=one("--num-attention-heads", int),
        kv_channels=one("--kv-channels", int),
        num_query_groups=one("--num-query-groups", int) if flag("--group-query-attention") else None,
        normalization=one("--normalization", str, "LayerNorm"),
        add_bias_linear=not flag("--disable-bias-linear"),
        gated_linear_unit=flag("--swiglu"),
        activation_func=F.silu if flag("--swiglu") else F.gelu,
        attention_dropout=one("--attention-dropout", float, 0.1),
        hidden_dropout=one("--hidden-dropout", float, 0.1),
        attention_backend=AttnBackend[one("--attention-backend", str, "auto")],
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=flag("--sequence-parallel"),
        pipeline_dtype=dtype,
        params_dtype=dtype,
        bf16=flag("--bf16"),
        fp16=flag("--fp16"),
        recompute_granularity=one("--recompute-granularity"),
        recompute_method=one("--recompute-method"),
        recompute_num_layers=one("--recompute-num-layers", int),
    )
    if flag("--pipeline-model-parallel-layout"):
        kw["pipeline_model_parallel_layout"] = one("--pipeline-model-parallel-layout")
    if flag("--num-layers-per-virtual-pipeline-stage"):
        per = one("--num-layers-per-virtual-pipeline-stage", int)
        # megatron/training/arguments.py: (num_layers // pp) // per, and pp > 2 (or p2p overlap).
        if (layers // pp) % per:
            raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per} does not divide {layers // pp} layers per stage")
        kw["virtual_pipeline_model_parallel_size"] = (layers // pp) // per
    tc = TransformerConfig(**kw)
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=flag("--bf16") and not flag("--grad-reduce-in-bf16"),
        overlap_grad_reduce=flag("--overlap-grad-reduce"),
        overlap_param_gather=flag("--overlap-param-gather"),
        use_distributed_optimizer=flag("--use-distributed-optimizer"),
        bucket_size=one("--ddp-bucket-size", int),
    )
    OptimizerConfig(
        lr=one("--lr", float),
        min_lr=one("--min-lr", float),
        weight_decay=one("--weight-decay", float),
        adam_beta1=one("--adam-beta1", float),
        adam_beta2=one("--adam-beta2", float),
        adam_eps=one("--adam-eps", float),
        clip_grad=one("--clip-grad", float),
        bf16=flag("--bf16"),
        fp16=flag("--fp16"),
        params_dtype=dtype,
        use_distributed_optimizer=flag("--use-distributed-optimizer"),
    )
    # validate_args (megatron/training/arguments.py), which the wheel does not ship.
    dp = e["dp"]
    micro, glob = one("--micro-batch-size", int), one("--global-batch-size", int)
    if glob % (micro * dp):
        raise ValueError(f"global batch {glob} is not divisible by micro batch {micro} × dp {dp}")
    if tc.pipeline_model_parallel_layout is None and layers % pp:
        raise ValueError(f"{layers} layers do not divide over {pp} pipeline stages without a layout")
    if flag("--overlap-param-gather") and not (flag("--use-distributed-optimizer") and flag("--overlap-grad-reduce")):
        raise ValueError("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce")
    launch = open(os.path.join(e["dir"], "megatron-launch.sh")).read()
    needs = tp > 1 and e["gpu"] in ("a100-40gb", "a100-80gb", "h100-sxm", "h200-sxm")
    if needs and "export CUDA_DEVICE_MAX_CONNECTIONS=1" not in launch:
        raise ValueError("tp > 1 before Blackwell: validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1, which the launch script does not set")
    div = one("--make-vocab-size-divisible-by", int, 128) * tp
    vocab = one("--vocab-size", int) + (1 if one("--tokenizer-type") == "NullTokenizer" else 0)
    padded = -(-vocab // div) * div
    return (
        f"{len(order)} Megatron-LM flags; TransformerConfig: layers {tc.num_layers}, hidden {tc.hidden_size}, heads {tc.num_attention_heads}"
        f" (query groups {tc.num_query_groups}), tp {tc.tensor_model_parallel_size}, pp {tc.pipeline_model_parallel_size},"
        f" vpp {tc.virtual_pipeline_model_parallel_size}, sp {tc.sequence_parallel}, recompute {tc.recompute_granularity},"
        f" attention {tc.attention_backend.name}, dropout {tc.hidden_dropout}"
        + (f", layout {tc.pipeline_model_parallel_layout}" if tc.pipeline_model_parallel_layout is not None else "")
        + f"; DDP bucket {ddp.bucket_size} params, fp32 reduce {ddp.grad_reduce_in_fp32}, distributed optimizer {ddp.use_distributed_optimizer};"
        f" padded vocab {padded}; CUDA_DEVICE_MAX_CONNECTIONS {'=1' if needs else 'not needed'}"
    )


def check_torchtitan(e):
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    path = os.path.join(e["dir"], "torchtitan.toml")
    c = ConfigManager().parse_args(["--job.config_file", path])
    p, t = c.parallelism, c.training
    world = e["tp"] * e["pp"] * e["dp"]
    dims = ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=world,
    )
    # The flavor must be one torchtitan's llama3 train spec registers (read from its source:
    # importing the model package pulls in its dataset stack, which parsing does not need).
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    init = os.path.join(os.path.dirname(spec.origin), "models", c.model.name, "__init__.py")
    flavors = set()
    for node in ast.walk(ast.parse(open(init).read())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == f"{c.model.name}_args" for t in node.targets):
            flavors = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    if c.model.flavor not in flavors:
        if not e.get("lossy"):
            raise ValueError(f"flavor {c.model.flavor!r} is not one of torchtitan's {c.model.name} flavors {sorted(flavors)}")
        flavor_note = " (not a torchtitan flavor: dropped by --lossy, to be registered)"
    else:
        flavor_note = ""
    batch_degree = dims.dp_replicate * dims.dp_shard
    # torchtitan/train.py
    if t.global_batch_size % (t.local_batch_size * batch_degree):
        raise ValueError(f"global batch {t.global_batch_size} is not a multiple of local batch {t.local_batch_size} × dp {batch_degree}")
    accumulation = t.global_batch_size // (t.local_batch_size * batch_degree)
    extra = ""
    if dims.pp > 1:
        cls = get_schedule_class(p.pipeline_parallel_schedule)
        single = issubclass(cls, PipelineScheduleSingle)
        parts = p.module_fqns_per_model_part
        stages = len(parts) if parts else dims.pp * (1 if single else 2)
        # torchtitan/distributed/pipeline_parallel.py
        if stages % dims.pp:
            raise ValueError(f"{stages} model parts do not divide over {dims.pp} pipeline ranks")
        per_rank = stages // dims.pp
        if single and per_rank != 1:
            raise ValueError(f"{cls.__name__} runs one stage per rank, the config has {per_rank}")
        if not single and per_rank < 2:
            raise ValueError(f"{cls.__name__} needs at least two stages per rank, the config has {per_rank}")
        if t.local_batch_size % p.pipeline_parallel_microbatch_size:
            raise ValueError(f"local batch {t.local_batch_size} is not a multiple of microbatch {p.pipeline_parallel_microbatch_size}")
        n_micro = t.local_batch_size // p.pipeline_parallel_microbatch_size
        extra = f"; schedule {cls.__name__}, {stages} stages ({per_rank} per rank), {n_micro} microbatches"
    return (
        f"ConfigManager + ParallelDims: world {world} = replicate {dims.dp_replicate} × shard {dims.dp_shard} × tp {dims.tp} × pp {dims.pp};"
        f" model {c.model.name}/{c.model.flavor}{flavor_note}; local batch {t.local_batch_size}, global {t.global_batch_size}, accumulation {accumulation},"
        f" seq {t.seq_len}; reshard {p.fsdp_reshard_after_forward}; AC {c.activation_checkpoint.mode};"
        f" param {t.mixed_precision_param}, reduce {t.mixed_precision_reduce}{extra}"
    )


CHECKS = {"deepspeed": check_deepspeed, "megatron": check_megatron, "torchtitan": check_torchtitan}


def main():
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    entries = json.load(open(sys.argv[1]))
    failed = 0
    for e in entries:
        try:
            said = CHECKS[e["target"]](e)
            print(f"ok    {e['command']}  ->  {said}", flush=True)
        except Exception as x:  # every rejection is reported, then the run fails
            failed += 1
            text = "".join(traceback.format_exception_only(type(x), x)).strip()
            detail = " | ".join(line.strip() for line in text.splitlines() if line.strip())
            print(f"FAIL  {e['command']}  ->  {detail}", flush=True)
    print(f"{len(entries) - failed} of {len(entries)} exports accepted by their frameworks' parsers")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
