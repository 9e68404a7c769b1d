#!/usr/bin/env bash
# The `cuda` build on a machine without a GPU (CI): every kernel compiles with NVRTC, and
# every --backend cuda path (and `strata probe`) exits 2 with its reason — never a panic.
# Usage: cuda-check.sh STRATA_BINARY NVRTC_LIB_DIR
set -euo pipefail
bin="$1"; nvrtc="$2"
out="$(mktemp -d)"; trap 'rm -rf "$out"' EXIT
fail() { echo "cuda-check: $*" >&2; exit 1; }

expect() { # expect CODE PATTERN -- command…
  local code="$1" pattern="$2"; shift 3
  set +e; "$@" >"$out/stdout" 2>"$out/stderr"; local rc=$?; set -e
  [ "$rc" -eq "$code" ] || { cat "$out/stdout" "$out/stderr"; fail "exit $rc, expected $code: $*"; }
  grep -q -- "$pattern" "$out/stdout" "$out/stderr" || { cat "$out/stdout" "$out/stderr"; fail "no \"$pattern\" in the output of: $*"; }
  if grep -q "panicked" "$out/stderr"; then cat "$out/stderr"; fail "panicked: $*"; fi
}

LD_LIBRARY_PATH="$nvrtc" expect 0 "kernel files compiled for sm_90" -- "$bin" kernels
LD_LIBRARY_PATH="$nvrtc" expect 0 '"ptx_bytes"' -- "$bin" kernels --arch sm_100 --json
LD_LIBRARY_PATH="$nvrtc" expect 2 "use one of" -- "$bin" kernels --arch sm_70
expect 2 "libnvrtc" -- env LD_LIBRARY_PATH= "$bin" kernels
LD_LIBRARY_PATH="$nvrtc" expect 2 "no GPU found" -- "$bin" kernels --check
expect 2 "no GPU found" -- "$bin" train scenarios/tiny-gpt-cpu.toml --backend cuda
expect 2 "no GPU found" -- "$bin" train scenarios/tiny-llama-1xh200.toml --backend cuda
# Started by mpirun as rank 3 of 8 (one process per GPU through NCCL): still no GPU, first.
expect 2 "no GPU found" -- env OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_RANK=3 "$bin" train scenarios/tiny-gpt-1xh200.toml --backend cuda
# One process for all GPUs of the node: still no GPU, first; without --backend cuda, said so.
expect 2 "no GPU found" -- "$bin" train scenarios/tiny-gpt-1xh200.toml --backend cuda --all-gpus
expect 2 "it needs --backend cuda" -- "$bin" train scenarios/tiny-gpt-cpu.toml --all-gpus
expect 2 "no GPU found" -- "$bin" compare scenarios/tiny-gpt-cpu.toml --backend cuda
expect 2 "no GPU found" -- "$bin" calibrate scenarios/tiny-gpt-cpu.toml --backend cuda
expect 2 "no GPU found" -- "$bin" calibrate scenarios/tiny-gpt-cpu.toml --backend cuda --out "$out/gpu.toml"
[ ! -e "$out/gpu.toml" ] || fail "calibrate --backend cuda wrote a profile without a GPU"
# probe: says so, exits 2, and still writes the CPU host as a cluster that loads back.
expect 2 "no GPU found" -- "$bin" probe --out "$out/probe.toml"
grep -q '^gpu = "cpu"' "$out/probe.toml" || { cat "$out/probe.toml"; fail "probe's file does not describe the CPU host"; }
expect 0 "busbw" -- "$bin" collbench --cluster "$out/probe.toml" --ranks 2
echo "cuda-check: 15 of 15 passed"
