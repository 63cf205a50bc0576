#!/usr/bin/env bash
# bench/run_gpu.sh — the whole GPU benchmark run, in one go, on the lent GPU
# machine. Run from the repository root with $OUT set to an empty folder:
#
#   OUT=/some/dir bash bench/run_gpu.sh                 # full run (~3 min on an H200)
#   BENCH_QUICK=1 OUT=/some/dir bash bench/run_gpu.sh   # smoke pass (~2.5 min, mostly torch.compile)
#
# In order: the GPU, driver and runtime versions; a release build with CUDA
# (meson + ninja; when meson, ninja or uthash.h is missing and .deps is
# there, bench/gpu_env.sh sets them up); replay_overhead on the simulator and
# on CUDA; bench_workloads on CUDA (every mode's outputs checked against
# eager before any time is reported; tree_defer included); dynamic_args (the
# DYNAMIC-argument alternatives); compare_torch.py with our JSON lines;
# then the tables. BENCH_BUDGET_S (default 560) caps the whole run: the
# PyTorch stage gets what is left of it.
#
# Three files under $OUT (so that it fits beside bench/gpu_session.sh's):
#   bench_run.log   everything this script printed (the build's own output
#                   only when it fails)
#   bench.jsonl     every JSON line: replay_overhead ("bench":
#                   "replay_overhead"), bench_workloads ("workloads"),
#                   dynamic_args ("dynamic_args"),
#                   compare_torch.py ("torch")
#   bench.md        the machine and every table, the comparison with PyTorch
#                   last (also printed at the end)
#
# Exit status: 0 if every stage passed, else the number of failed stages.
set -u
cd "$(dirname "$0")/.." || exit 2
if [ -z "${OUT:-}" ]; then
  echo "run_gpu.sh: set OUT to the folder for the results" >&2
  exit 2
fi
mkdir -p "$OUT"
QUICK=${BENCH_QUICK:-0}
BUILD=build-gpu-bench
exec > >(tee -a "$OUT/bench_run.log") 2>&1
tee_pid=$!
start=$(date +%s)
# The whole run must fit one 10-minute device call: the last stage gets
# whatever is left of BENCH_BUDGET_S.
budget=${BENCH_BUDGET_S:-560}
left() { local l=$((budget - ($(date +%s) - start))); [ $l -lt 30 ] && l=30; echo $l; }
tmp=$(mktemp -d)
json=$OUT/bench.jsonl
md=$OUT/bench.md
: > "$json"
: > "$md"
unset CGT_MODE
export CGT_LOG=${CGT_LOG:-warn}
failed=0
stage() { echo; echo "=== $* ($(date +%T))"; }

stage "machine"
command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
{
  echo "## Machine"
  echo
  echo '```'
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  nvcc --version 2>/dev/null | tail -2 || echo "nvcc: not found"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)):' || true
  echo "BENCH_QUICK=$QUICK; $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ local changes)')"
  echo '```'
  echo
} > "$tmp/machine.md"
cat "$tmp/machine.md"
cat "$tmp/machine.md" >> "$md"

stage "build ($BUILD, release, CUDA)"
if [ -d .deps ] && { ! command -v meson >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1 ||
                     [ ! -f /usr/include/uthash.h ]; }; then
  echo "setting up meson/ninja/uthash from .deps (bench/gpu_env.sh)"
  # shellcheck disable=SC1091
  . bench/gpu_env.sh
fi
for tool in meson ninja; do
  if ! command -v $tool >/dev/null 2>&1; then
    echo "run_gpu.sh: '$tool' is not on PATH; install it (or carry .deps for bench/gpu_env.sh) and rerun" >&2
    exit 3
  fi
done
rm -rf "$BUILD"
if ! { meson setup "$BUILD" -Dcuda=enabled -Dtests=false -Dbench=true --buildtype=release &&
       timeout 240 ninja -C "$BUILD" bench/replay_overhead bench/bench_workloads bench/dynamic_args; } > "$tmp/build.log" 2>&1; then
  tail -60 "$tmp/build.log"
  echo "run_gpu.sh: the build failed (its output is above)" >&2
  exit 4
fi
grep -iE 'warning|CUDA backend' "$tmp/build.log" | head -20 || true
echo "built: $BUILD/bench/replay_overhead $BUILD/bench/bench_workloads"

stage "replay_overhead (the simulator, then CUDA)"
if [ "$QUICK" = 1 ]; then ro_args=(--quick); else ro_args=(--reps 7 --runs 100000); fi
timeout 90 "$BUILD/bench/replay_overhead" --backend all "${ro_args[@]}" --json "$json" > "$tmp/replay.txt"
rc=$?
cat "$tmp/replay.txt"
{ echo "## replay_overhead"; echo; grep -v '^{' "$tmp/replay.txt"; echo; } >> "$md"
[ $rc -eq 0 ] || { echo "replay_overhead: FAILED (exit $rc)"; failed=$((failed + 1)); }

stage "bench_workloads (CUDA)"
if [ "$QUICK" = 1 ]; then bw_args=(--quick); else bw_args=(); fi
timeout 200 "$BUILD/bench/bench_workloads" --backend cuda "${bw_args[@]}" --json "$json" > "$tmp/workloads.txt"
rc=$?
grep -v '^{' "$tmp/workloads.txt" >> "$md"
[ $rc -eq 0 ] || { echo "bench_workloads: FAILED (exit $rc)"; failed=$((failed + 1)); }

stage "dynamic_args (CUDA: the DYNAMIC-argument alternatives, unfused and fused)"
timeout 60 "$BUILD/bench/dynamic_args" > "$tmp/dynamic.txt"
rc=$?
grep -v '^{' "$tmp/dynamic.txt" | tee -a "$md"
grep '^{' "$tmp/dynamic.txt" >> "$json"
[ $rc -eq 0 ] || { echo "dynamic_args: FAILED (exit $rc)"; failed=$((failed + 1)); }

stage "compare_torch.py (PyTorch eager and CUDAGraph Trees on the same workloads)"
if [ "$QUICK" = 1 ]; then ct_args=(--quick); else ct_args=(); fi
tl=$(($(left) - 15))
echo "(time left for PyTorch: ${tl} s)"
timeout $tl python3 bench/compare_torch.py --ours "$json" --json "$json" --md "$tmp/compare.md" "${ct_args[@]}" \
  > /dev/null
rc=$?
{ echo; cat "$tmp/compare.md" 2>/dev/null || echo "(no comparison with PyTorch)"; } >> "$md"
[ $rc -eq 0 ] || { echo "compare_torch.py: FAILED (exit $rc)"; failed=$((failed + 1)); }

stage "results"
cat "$md"
echo
rm -rf "$tmp"
echo "run_gpu.sh: $failed stage(s) failed in $(($(date +%s) - start)) s; files in $OUT: bench_run.log bench.jsonl bench.md"
exec 1>&- 2>&-
wait $tee_pid 2>/dev/null
exit $failed
