#!/usr/bin/env bash
# MPI checks of the runtime (feature `mpi`), for CI. Needs OpenMPI and libclang:
#   apt-get install -y --no-install-recommends libopenmpi-dev openmpi-bin libclang-dev
# Run from the repository root: bash runtime/ci/mpi-check.sh
#
# 1. the MPI message encoding round-trips (unit test);
# 2. two splits as 4-process jobs give the 1-rank loss curve over 20 steps within 2e-6
#    nats, and bit-for-bit the losses of the same split on threads;
# 3. a 4-process job stopped after step 3 and resumed from its checkpoint gives the
#    uninterrupted job's losses bit for bit;
# 4. a fresh job into a used checkpoint directory exits 2 naming --resume/--overwrite;
#    --overwrite starts afresh; a resume removes a partial step directory;
# 5. a job whose rank 2 is killed at step 5, under strata-mpi-restart --restarts 1, is
#    relaunched from the step-3 checkpoint and gives the uninterrupted job's losses bit
#    for bit;
# 6. a rank that panics ends the 4-process job with an error naming it within 30 s;
# 7. the NCCL bootstrap (features cuda,mpi) carries rank 0's id to all 4 ranks, and a
#    corrupt frame ends the job with exit 2 naming the rank, without a hang.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

cargo test --release -p strata-runtime --features mpi --lib comm::mpi
cargo build --release -p strata-runtime --features mpi --bin strata-mpi-train --bin strata-mpi-restart
BIN=target/release/strata-mpi-train
RESTART=target/release/strata-mpi-restart
S=scenarios/tiny-gpt-cpu.toml
FOUR=(--set cluster.gpus_per_node=4 --set training.dtype=fp32)

echo "== MPI split 1: TP(2)-PP(2)-DP(1), 1F1B, ZeRO-1"
timeout 300 mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 \
  --steps 20 --check-single 2e-6 --check-threads

echo "== MPI split 2: TP(1)-PP(2)-DP(2), GPipe, ZeRO-3"
timeout 300 mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.tp=1 --set parallel.dp=2 \
  --set parallel.zero=3 --set parallel.schedule=gpipe --steps 20 --check-single 2e-6 --check-threads

echo "== MPI checkpoint: stop after step 3, resume to step 6"
T=$(mktemp -d)
mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 6 --out "$T/whole" >/dev/null
mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 3 --checkpoint-dir "$T/ck" >/dev/null
mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 6 --checkpoint-dir "$T/ck" --resume \
  --out "$T/resumed" >/dev/null
# Steps 3..5 (columns step and loss, all digits) must be equal.
if ! diff <(tail -n +5 "$T/whole/loss.csv" | cut -d, -f1,2) <(tail -n +2 "$T/resumed/loss.csv" | cut -d, -f1,2); then
  echo "FAILED: the resumed MPI job's losses differ from the uninterrupted job's"
  exit 1
fi
echo "== MPI checkpoint directory: refuse a used one, --overwrite, partial step directories"
set +e
out=$(mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 3 --checkpoint-dir "$T/ck" 2>&1)
status=$?
set -e
if [ "$status" -ne 2 ] || ! grep -q "is not empty" <<<"$out" || ! grep -q -- "--overwrite" <<<"$out"; then
  echo "$out"
  echo "FAILED: a fresh MPI job into a used checkpoint directory must exit 2 naming --resume/--overwrite (exit $status)"
  exit 1
fi
mkdir -p "$T/ck/step-000099" && touch "$T/ck/step-000099/rank-0.tmp"
out=$(mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 7 --checkpoint-dir "$T/ck" --resume 2>&1)
# mpirun interleaves the ranks' stdout and stderr at any byte, so the message's two halves
# may arrive on different lines: look for each.
if [ -e "$T/ck/step-000099" ] || ! grep -q "removed" <<<"$out" || ! grep -q "step-000099 (a partial" <<<"$out"; then
  echo "$out"
  echo "FAILED: a resumed MPI job must remove the partial step directory"
  exit 1
fi
mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 2 --checkpoint-dir "$T/ck" --overwrite >/dev/null
if [ "$(ls "$T/ck")" != "step-000002" ]; then
  ls "$T/ck"
  echo "FAILED: --overwrite must leave only the new run's checkpoint"
  exit 1
fi

echo "== MPI restart: rank 2 killed at step 5, relaunched from the step-3 checkpoint"
mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 8 --out "$T/whole8" >/dev/null
set +e
out=$(timeout 300 "$RESTART" --restarts 1 -- mpirun -np 4 "$BIN" "$S" "${FOUR[@]}" --set parallel.dp=1 --steps 8 \
  --checkpoint-dir "$T/rck" --checkpoint-every 3 --inject kill:rank=2,step=5 --timeout 10 --out "$T/restarted" 2>&1)
status=$?
set -e
# The wrapper's lines are its own writes, but mpirun's output may split them: grep each part.
if [ "$status" -ne 0 ] || ! grep -q "attempt 0 exited with status" <<<"$out" || ! grep -q "restart 1 of 1" <<<"$out" \
  || ! grep -q "done after 1 restart" <<<"$out"; then
  echo "$out"
  echo "FAILED: the killed MPI job must be relaunched once and finish (exit $status)"
  exit 1
fi
# The relaunched attempt ran steps 3..7: they must equal the uninterrupted job's, all digits.
if ! diff <(tail -n +5 "$T/whole8/loss.csv" | cut -d, -f1,2) <(tail -n +2 "$T/restarted/loss.csv" | cut -d, -f1,2); then
  echo "FAILED: the relaunched MPI job's losses differ from the uninterrupted job's"
  exit 1
fi
rm -rf "$T"

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
echo "== the NCCL bootstrap over MPI (features cuda,mpi; no GPU needed): rank 0's id reaches all"
cargo build --release -p strata-runtime --features cuda,mpi --example nccl_bootstrap
NB=target/release/examples/nccl_bootstrap
out=$(timeout 60 mpirun -np 4 "$NB" 2>&1)
grep -q "4 of 4 ranks hold rank 0's NCCL id" <<<"$out" || { echo "$out"; echo "FAILED: the id did not reach every rank"; exit 1; }

echo "== a corrupt id frame ends the job naming the rank, exit 2, no hang"
set +e
out=$(timeout 60 mpirun -np 4 "$NB" --corrupt 2 2>&1)
status=$?
set -e
if [ "$status" -ne 2 ] || ! grep -q "rank 2: the NCCL id frame is corrupt" <<<"$out"; then
  echo "$out"
  echo "FAILED: expected exit 2 naming rank 2 (exit status $status; 124 is a hang)"
  exit 1
fi
echo "MPI checks: 9 passed, 0 failed"
