#!/usr/bin/env bash
# The one script a lent GPU machine runs (`cargo xtask device-check` prepares the binary and
# prints how to launch it). No Rust and no network there: the CUDA libraries are those of
# the machine's Python environment. About 8 minutes: the steps' timeouts sum to 535 s (they
# are bounds, not measured durations, except where a step says what it took on a 2-core
# host); a failed step is reported and the next one still runs.
# Full logs under $OUT.
# Usage: bash xtask/device/check.sh [BINARY]
set -uo pipefail
BIN="${1:-target/device/strata}"
OUT="${OUT:-/tmp/strata-device}"
mkdir -p "$OUT"
NV="$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')"
SHIM="$OUT/.lib"; mkdir -p "$SHIM"
# cudarc looks for libnccl.so; the pip wheel ships only libnccl.so.2.
for f in "$NV"/nccl/lib/libnccl.so.2; do [ -e "$f" ] && ln -sf "$f" "$SHIM/libnccl.so"; done
LIBS="$(find "$NV" -maxdepth 3 -type d -name lib | sort | tr '\n' ':')"
export LD_LIBRARY_PATH="$SHIM:$LIBS${LD_LIBRARY_PATH:-}"
status() { printf '%-44s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }
run() { # run NAME SECONDS command… (stdout to $OUT/NAME.out, stderr to $OUT/NAME.err)
  local name="$1" secs="$2"; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  local rc=$?
  status "$name" "exit $rc in $((SECONDS - t0)) s"
  return $rc
}
: >"$OUT/summary.txt"
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
# presets, the simulations and the CPU runs of the tiny models: under 0.4 s each on a 2-core host.
run devices 5 "$BIN" presets >/dev/null
run kernels 80 "$BIN" kernels --check --json
run probe 15 "$BIN" probe --out "$OUT/cluster.toml" --json
# The CUDA executor against the CPU executor on the tiny GPT first: same weights, data and
# plan (bf16 storage on the GPU, fp32 on the CPU); the table prints the largest loss gap.
run tiny-cuda 35 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --json
run tiny-cpu 10 "$BIN" train scenarios/tiny-gpt-1xh200.toml --set 'cluster.preset="cpu-local"' --set cluster.nics_per_node=0 --json
# Eight ranks of the same tiny GPT (tp 2 · pp 2 · dp 2) on this one GPU through the
# shared-GPU communicator: the same global batch, so its losses are the single rank's above.
run tiny-tp2pp2dp2 30 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --set parallel.tp=2 --set parallel.pp=2 --ranks 8 --json
# Two data-parallel ranks of it under ZeRO-3 (each unit's parameters gathered before its
# forward and backward, each microbatch's gradient buckets reduce-scattered into the
# shards): the single rank's losses again (bit for bit on the host stand-in).
run tiny-dp2-zero3 20 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --set parallel.zero=3 --set 'training.framework="strata"' --ranks 2 --json
# Full activation recomputation (the layers' forward again into the plan's recompute
# buffers) and interleaved 1F1B (pp 2 · vpp 2: two model chunks per rank): both train to
# the single rank's losses above (bit for bit on the host stand-in).
run tiny-recompute-full 25 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --set 'parallel.recompute="full"' --json
run tiny-pp2vpp2 25 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --set parallel.pp=2 --set parallel.vpp=2 --set 'parallel.schedule="interleaved"' --ranks 2 --json
# Two tensor-parallel ranks with sequence parallelism (norms and residual on each rank's
# half of the sequence between all-gathers and reduce-scatters, the norms' gradients
# summed over tp): the single rank's losses within tp's bound (host stand-in: 5.4e-5 nats
# over 3 steps, bound 2e-4).
run tiny-tp2-sp 20 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --set parallel.tp=2 --set parallel.sequence_parallel=true --ranks 2 --json
# The tiny Llama (RMSNorm, SwiGLU, RoPE, 4 query heads sharing 2 key/value heads, untied
# output layer) the same way: the CUDA executor's Llama pieces against the CPU executor.
run tiny-llama-cuda 30 "$BIN" train scenarios/tiny-llama-1xh200.toml --backend cuda --json
run tiny-llama-cpu 10 "$BIN" train scenarios/tiny-llama-1xh200.toml --set 'cluster.preset="cpu-local"' --set cluster.nics_per_node=0 --json
run calibrate 70 "$BIN" calibrate scenarios/gpt2-124m-1xh200.toml --backend cuda --out "$OUT/h200-measured.toml" --json
# The step predicted with the measured profile, beside the built-in (published-fit) one.
run predicted-builtin 5 "$BIN" simulate scenarios/gpt2-124m-1xh200.toml --json
if [ -s "$OUT/h200-measured.toml" ]; then
  run predicted-measured 5 "$BIN" simulate scenarios/gpt2-124m-1xh200.toml --profile "$OUT/h200-measured.toml" --json
fi
run train-1rank 75 "$BIN" train scenarios/gpt2-124m-1xh200.toml --backend cuda --steps 20 --json --out "$OUT/train-1rank"
run pytorch-eager 80 python3 xtask/device/torch_gpt2.py --steps 20 --batch 8 --seq 1024
python3 xtask/device/table.py "$OUT" | tee "$OUT/table.txt"
