#!/usr/bin/env python3
"""Host time of DeepSpeed ZeRO-3's per-fetch Python loops, for models/tests/data/zero3_fetch_host.csv.

DeepSpeed 0.19.8 (`runtime/zero/partition_parameters.py`) does, for every module fetch over a
partition group of `world` ranks:
- at launch (`_all_gather_dtype`): `flat.narrow(...)` once per rank, to list each rank's
  partition of the flat all-gather output;
- at wait (`AllGatherCoalescedHandle.wait`): for every gathered tensor, `partitions[rank].narrow(...)`
  once per rank, then one `torch.cat` of those pieces.
This script runs the same loops on tiny host tensors (one element per piece, so the
concatenation copies nothing to speak of): what it times is the Python and dispatcher work,
which is the same whether the tensors live on the host or on a GPU (views are metadata; a
GPU's `torch.cat` adds one kernel launch, a fixed cost counted in the per-module host time).
No NCCL call, no GPU.

Run:  python bench_zero3_fetch_host.py > zero3_fetch_host.csv   (any PyTorch 2.x)
Nothing in Strata's build or tests runs this script; the CSV it prints is checked in.
"""
import platform
import statistics
import sys
import time

import torch

torch.set_grad_enabled(False)


def launch(world, part):
    flat = torch.empty(part * world, dtype=torch.bfloat16)
    parts = []
    for i in range(world):
        parts.append(flat.narrow(0, part * i, part))
    return parts


def wait(parts, world, params):
    off = 0
    for numel, part in params:
        pieces = []
        for r in range(world):
            start = r * part
            if start < numel:
                pieces.append(parts[r].narrow(0, off, min(numel - start, part)))
        torch.cat(pieces)
        off += part


def fetch_us(world, tensors, reps):
    params = [(world, 1)] * tensors
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        wait(launch(world, tensors), world, params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


print(f"# torch {torch.__version__}, Python {platform.python_version()}, {platform.processor() or platform.machine()}")
print("# fetch_us: median host microseconds of one fetch (launch + wait) over a group of `ranks`")
print("ranks,tensors,fetch_us")
for world in [8, 64, 256, 1024, 4096]:
    for tensors in [1, 2, 4]:
        print(f"{world},{tensors},{fetch_us(world, tensors, max(20, 20000 // world)):.1f}", flush=True)
