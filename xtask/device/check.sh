#!/usr/bin/env bash
# The one script a lent GPU machine runs (`cargo xtask device-check` prepares the binary and
# prints how to launch it). No Rust and no network there: the CUDA libraries are those of
# the machine's Python environment. The steps' timeouts are bounds, not durations; a failed
# step is reported and the next one still runs. STRATA_CHECK_BUDGET (seconds, default 520)
# caps the whole run: a step gets at most what is left of it, and none starts with under 5 s
# left, so the lease's minutes are never spent past the budget.
# Only a few files come back from a lent machine: every step's log goes to a work folder,
# packed at the end (also on an early exit) into $OUT/logs.tgz beside summary.txt and
# table.txt.
# Usage: bash xtask/device/check.sh [BINARY]
set -uo pipefail
BIN="${1:-target/device/strata}"
OUT="${OUT:-/tmp/strata-device}"
BUDGET="${STRATA_CHECK_BUDGET:-520}"
mkdir -p "$OUT"
LOGS="$(mktemp -d /tmp/strata-check.XXXXXX)"
pack() {
  cp "$LOGS/summary.txt" "$OUT/" 2>/dev/null
  [ -s "$LOGS/table.txt" ] && cp "$LOGS/table.txt" "$OUT/"
  tar -czf "$OUT/logs.tgz" -C "$LOGS" --exclude=.lib . 2>/dev/null
}
trap pack EXIT
export RUST_BACKTRACE=1
NV="$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])')"
SHIM="$LOGS/.lib"; mkdir -p "$SHIM"
# cudarc looks for libnccl.so; the pip wheel ships only libnccl.so.2.
for f in "$NV"/nccl/lib/libnccl.so.2 "$NV"/cu13/lib/libnccl.so.2; do [ -e "$f" ] && ln -sf "$f" "$SHIM/libnccl.so"; done
LIBS="$(find "$NV" -maxdepth 3 -type d -name lib | sort | tr '\n' ':')"
export LD_LIBRARY_PATH="$SHIM:$LIBS${LD_LIBRARY_PATH:-}"
status() { printf '%-44s %s\n' "$1" "$2" | tee -a "$LOGS/summary.txt"; }
run() { # run NAME SECONDS command… (stdout to NAME.out, stderr to NAME.err in the logs)
  local name="$1" secs="$2"; shift 2
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 5 ]; then status "$name" "skipped: the budget of $BUDGET s is spent"; return 124; fi
  [ "$secs" -gt "$left" ] && secs=$left
  local t0=$SECONDS
  timeout "$secs" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err"
  local rc=$?
  status "$name" "exit $rc in $((SECONDS - t0)) s"
  return $rc
}
: >"$LOGS/summary.txt"
{ nvidia-smi; echo; uname -a; ldd --version | head -1; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH";
  ls -l "$SHIM"; ldd "$BIN"; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)';
  python3 -m pip list 2>/dev/null | grep -i -E "^nvidia|^torch "; } >"$LOGS/env.txt" 2>&1
# Most telling first, so a budget cut drops the least. Presets, the simulations and the CPU
# runs of the tiny models take under 0.4 s each on a 2-core host.
run devices 5 "$BIN" presets >/dev/null
run kernels 80 "$BIN" kernels --check --json
# The tensor-core attention (head_dim 64 and 128) runs only where its kernel checks passed;
# otherwise every later step runs the scalar kernels (STRATA_ATTENTION=scalar), and says so.
if python3 -c 'import json,sys; k=json.load(open(sys.argv[1])); sys.exit(0 if [c for c in k["checks"] if "_tc" in c["kernel"]] and all(c["passed"] for c in k["checks"] if "_tc" in c["kernel"]) else 1)' "$LOGS/kernels.out" 2>/dev/null; then
  status attention "tensor-core kernels (their checks passed)"
else
  export STRATA_ATTENTION=scalar
  status attention "scalar kernels: the tensor-core checks failed or did not run"
fi
# The CUDA executor against the CPU executor on the tiny GPT first: same weights, data and
# plan (bf16 storage on the GPU, fp32 on the CPU); the table prints the largest loss gap.
run tiny-cuda 35 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --json
run tiny-cpu 10 "$BIN" train scenarios/tiny-gpt-1xh200.toml --set 'cluster.preset="cpu-local"' --set cluster.nics_per_node=0 --json
# The NCCL path of one process driving the node's GPUs (--all-gpus): on a one-GPU machine a
# one-rank job, so libnccl loads, its communicators initialise and the step runs through the
# NCCL executor — the single rank's losses again.
run tiny-nccl-all-gpus 30 "$BIN" train scenarios/tiny-gpt-1xh200.toml --backend cuda --all-gpus --json
# The step predicted with the built-in (published-fit) profile, then trained for real.
run predicted-builtin 5 "$BIN" simulate scenarios/gpt2-124m-1xh200.toml --json
run train-1rank 75 "$BIN" train scenarios/gpt2-124m-1xh200.toml --backend cuda --steps 20 --json --out "$LOGS/train-1rank"
# The same step with the scalar attention kernels, for the table's comparison.
[ -z "${STRATA_ATTENTION:-}" ] && STRATA_ATTENTION=scalar run train-scalar-attn 40 "$BIN" train scenarios/gpt2-124m-1xh200.toml --backend cuda --steps 5 --json
run pytorch-eager 80 python3 xtask/device/torch_gpt2.py --steps 20 --batch 8 --seq 1024
# The tiny Llama (RMSNorm, SwiGLU, RoPE, 4 query heads sharing 2 key/value heads, untied
# output layer) the same way: the CUDA executor's Llama pieces against the CPU executor.
run tiny-llama-cuda 30 "$BIN" train scenarios/tiny-llama-1xh200.toml --backend cuda --json
run tiny-llama-cpu 10 "$BIN" train scenarios/tiny-llama-1xh200.toml --set 'cluster.preset="cpu-local"' --set cluster.nics_per_node=0 --json
run calibrate 70 "$BIN" calibrate scenarios/gpt2-124m-1xh200.toml --backend cuda --out "$OUT/h200-measured.toml" --json
# The step predicted with the measured profile, beside the built-in one.
if [ -s "$OUT/h200-measured.toml" ]; then
  run predicted-measured 5 "$BIN" simulate scenarios/gpt2-124m-1xh200.toml --profile "$OUT/h200-measured.toml" --json
fi
# Predicted against measured through compare --backend cuda (with that profile): its report
# inputs land in the logs (build the report anywhere with `strata report compare`).
if [ -s "$OUT/h200-measured.toml" ]; then
  run compare-cuda 45 "$BIN" compare scenarios/gpt2-124m-1xh200.toml --backend cuda --profile "$OUT/h200-measured.toml" --steps 5 --out "$LOGS/compare"
fi
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
run probe 15 "$BIN" probe --out "$OUT/cluster.toml" --json
python3 xtask/device/table.py "$LOGS" | tee "$LOGS/table.txt"
