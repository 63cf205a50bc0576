#!/usr/bin/env bash
# bench/defer_check.sh — the deferred-launch (issue 13) figures in one device
# call: a release build of the benchmarks, then bench_workloads on the chain
# S=16 and S=64 and branchy cases (every mode, tree_defer included: its
# "host (defer-one)/S" column is the host cost per fused segment over one
# graph launch, each mode timed in its own stretch of the run; the table
# "one-graph and tree_defer alternating" times the two step by step, which is
# what the host target compares) and dynamic_args. RUNS (default 1) repeats
# bench_workloads on the same machine. From the repository root, .deps carried:
#
#   OUT=/some/dir bash bench/defer_check.sh
#
# Files under $OUT: defer.txt (the tables), defer.jsonl, build.log.
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. bench/gpu_env.sh
B=/tmp/build-defer
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -m1 'Model name'; date -u; } > "$OUT/defer.txt"
if [ ! -f $B/build.ninja ]; then
  meson setup $B -Dcuda=enabled -Dgpu_arch=9.0 -Dtests=false -Dbench=true --buildtype=release > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C $B bench/bench_workloads bench/dynamic_args >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for run in $(seq "${RUNS:-1}"); do
  echo "## run $run" >> "$OUT/defer.txt"
  timeout 240 $B/bench/bench_workloads --backend cuda --cases 16x1,64x1,branchy --reps 5 --record-reps 1 \
    --json "$OUT/defer.jsonl" >> "$OUT/defer.txt" 2>&1
  echo "bench_workloads run $run rc=$?"
done
timeout 60 $B/bench/dynamic_args >> "$OUT/defer.txt" 2>&1
echo "dynamic_args rc=$?"
