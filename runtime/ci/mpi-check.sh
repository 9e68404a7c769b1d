#!/usr/bin/env bash
# MPI checks of the runtime (feature `mpi`), for CI. Needs OpenMPI and libclang:
#   apt-get install -y --no-install-recommends libopenmpi-dev openmpi-bin libclang-dev
# Run from the repository root: bash runtime/ci/mpi-check.sh
#
# 1. the MPI message encoding round-trips (unit test);
# 2. two splits as 4-process jobs give the 1-rank loss curve over 20 steps within 2e-6
#    nats, and bit-for-bit the losses of the same split on threads;
# 3. a rank that panics ends the 4-process job with an error naming it within 30 s.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

cargo test --release -p strata-runtime --features mpi --lib comm::mpi
cargo build --release -p strata-runtime --features mpi --bin strata-mpi-train
BIN=target/release/strata-mpi-train
S=scenarios/tiny-gpt-cpu.toml
FOUR=(--set cluster.gpus_per_node=4 --set training.dtype=fp32)

echo "== MPI split 1: TP(2)-PP(2)-DP(1), 1F1B, ZeRO-1"
timeout 300 mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 \
  --steps 20 --check-single 2e-6 --check-threads

echo "== MPI split 2: TP(1)-PP(2)-DP(2), GPipe, ZeRO-3"
timeout 300 mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.tp=1 --set parallel.dp=2 \
  --set parallel.zero=3 --set parallel.schedule=gpipe --steps 20 --check-single 2e-6 --check-threads

echo "== MPI failure: rank 2 panics at step 1"
set +e
out=$(RUST_BACKTRACE=0 timeout 30 mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 5 \
  --inject-panic 2:1 2>&1)
status=$?
set -e
if [ "$status" -eq 0 ] || [ "$status" -eq 124 ]; then
  echo "$out"
  echo "FAILED: the job must fail within 30 s (exit status $status)"
  exit 1
fi
if ! grep -q "error on rank 0: rank 2 (TP(2)-PP(2)-DP(1)-rank(2)) failed" <<<"$out"; then
  echo "$out"
  echo "FAILED: rank 0 did not name rank 2"
  exit 1
fi
echo "MPI checks: 4 passed, 0 failed"
