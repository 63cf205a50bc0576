#!/usr/bin/env bash
# bench/budget_gpu.sh — issue 23's GPU measurements in one device call:
# the recording budget and update in place. From the repository root, with
# .deps carried as for bench/gpu_check.sh:
#
#   OUT=/some/dir bash bench/budget_gpu.sh
#
# Builds a release build with CUDA (build-gpu-budget), then runs, on CUDA:
#   1. the CUDA suite's budget tests and the whole CUDA suite
#      (test/test_cuda: the scenarios of test/budget.c run there too);
#   2. bench/update_cost: capture + update in place against capture + a
#      fresh instantiate, for one segment of 200 kernels (GPT-2-sized in
#      graph nodes), 20 reloads (target: update below 0.5x);
#   3. bench/long_run: 10,000 steps of 64 shapes x 4 paths, unbounded and
#      with max_graphs = 32 (targets: step time within 1.3x, memory flat
#      after warm-up).
# Files under $OUT: budget_run.log (everything printed), budget.jsonl (one
# JSON line per benchmark run). Exit status: the number of failed stages.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/budget_run.log") 2>&1
BUILD=build-gpu-budget
json=$OUT/budget.jsonl
: > "$json"
command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
if [ -d .deps ] && { ! command -v meson >/dev/null 2>&1 || [ ! -f /usr/include/uthash.h ]; }; then
  # shellcheck disable=SC1091
  . bench/gpu_env.sh
fi
export CGT_LOG=${CGT_LOG:-warn}
unset CGT_MODE
failed=0
stage() { echo; echo "=== $* ($(date +%T))"; }

stage "build ($BUILD, release, CUDA)"
nvidia-smi -L 2>/dev/null || true
if ! { meson setup "$BUILD" -Dcuda=enabled -Dbench=true -Dpython=disabled --buildtype=release --wipe 2>/dev/null ||
       meson setup "$BUILD" -Dcuda=enabled -Dbench=true -Dpython=disabled --buildtype=release; } >/dev/null ||
   ! timeout 300 ninja -C "$BUILD" test/test_cuda bench/update_cost bench/long_run > "$OUT/budget_build.log" 2>&1; then
  tail -40 "$OUT/budget_build.log"
  echo "budget_gpu.sh: the build failed"
  exit 100
fi

stage "CUDA suite (test/test_cuda, budget tests included; fuzz at 2,000 steps)"
CGT_LOG=error timeout 300 "$BUILD/test/test_cuda" > "$OUT/budget_test_cuda.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED) |recording budget|budget|FAILED" "$OUT/budget_test_cuda.log" | head -40
[ $rc -eq 0 ] || { echo "test_cuda: FAILED (exit $rc; see budget_test_cuda.log)"; failed=$((failed + 1)); }

stage "update_cost (CUDA: capture + update vs capture + instantiate)"
timeout 120 "$BUILD/bench/update_cost" --backend cuda --kernels 200 --reloads 20 --json "$json"
rc=$?
[ $rc -eq 0 ] || { echo "update_cost: FAILED (exit $rc)"; failed=$((failed + 1)); }

stage "long_run (CUDA: 10,000 steps, unbounded and max_graphs = 32)"
timeout 240 "$BUILD/bench/long_run" --backend cuda --steps 10000 --budget 32 --json "$json"
rc=$?
[ $rc -eq 0 ] || { echo "long_run: FAILED (exit $rc)"; failed=$((failed + 1)); }

stage "done"
echo "budget_gpu.sh: $failed stage(s) failed; files in $OUT: budget_run.log budget.jsonl budget_test_cuda.log"
exit $failed
