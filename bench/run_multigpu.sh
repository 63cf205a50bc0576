#!/usr/bin/env bash
# bench/run_multigpu.sh — the multi-GPU run, in one go, on a machine with two
# GPUs (made for nvidia-h200-x2). Run from the repository root with $OUT set
# to an empty folder (and .deps carried along when meson, cmocka or uthash
# are missing there: bench/gpu_env.sh unpacks them):
#
#   OUT=/some/dir bash bench/run_multigpu.sh      # ~3-4 minutes
#
# In order: the machine (GPUs, topology, driver, NCCL); a release build with
# -Dcuda=enabled -Dnccl=enabled of the two targets it needs; the multigpu
# test suite (test/test_multigpu: a tree on a non-current device, and
# all-reduce segments replayed against eager on both ranks, the skip branch
# included); dp_train with --debug (path hashes compared across the ranks
# every step; threads, and once processes); then dp_train in the four
# measured configurations, eager and tree, each without and with CPU noise,
# ranks as threads; then, while the time allows, eager and tree with noise
# and ranks as processes; then the table.
#
# Every stage logs and a failing stage does not stop the next ones. Files
# under $OUT (6):
#   machine.txt       GPUs, topology, driver, nvcc, NCCL, CPU
#   build.log         meson + ninja output
#   test_multigpu.log the multigpu suite
#   dp_train.log      every dp_train run's output
#   dp_train.jsonl    one JSON line per dp_train run
#   multigpu.md       the table (also printed at the end)
# Exit status: the number of failed stages.
#
# Knobs (environment): MGPU_STEPS (3000), MGPU_WARMUP (100), MGPU_LAYERS (8),
# MGPU_HIDDEN (512), MGPU_NOISE (busy threads; default 2 x the CPUs),
# MGPU_DUTY (0.5), MGPU_BUILD (build-mgpu).
set -u
cd "$(dirname "$0")/.." || exit 2
if [ -z "${OUT:-}" ]; then
  echo "run_multigpu.sh: set OUT to the folder for the results" >&2
  exit 2
fi
mkdir -p "$OUT"
# NVLink multicast (NVLS) stays off on the lent machines.
export NCCL_NVLS_ENABLE=0
export CGT_LOG=${CGT_LOG:-warn}
unset CGT_MODE
BUILD=${MGPU_BUILD:-build-mgpu}
STEPS=${MGPU_STEPS:-3000}
WARMUP=${MGPU_WARMUP:-100}
LAYERS=${MGPU_LAYERS:-8}
HIDDEN=${MGPU_HIDDEN:-512}
NCPU=$(nproc 2>/dev/null || echo 16)
NOISE=${MGPU_NOISE:-$((2 * NCPU))}
DUTY=${MGPU_DUTY:-0.5}
start=$(date +%s)
failed=0
log=$OUT/dp_train.log
json=$OUT/dp_train.jsonl
md=$OUT/multigpu.md
: > "$log"
: > "$json"
: > "$md"
stage() { echo; echo "=== $* ($(date +%T), $(($(date +%s) - start)) s)"; }

stage "machine"
command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
{
  nvidia-smi -L 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  nvcc --version 2>&1 | tail -2
  grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' /usr/include/nccl.h /usr/local/include/nccl.h \
    /usr/local/cuda/include/nccl.h 2>/dev/null | head -3
  lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\)):'
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE; $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ local changes)')"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

stage "build ($BUILD: release, CUDA, NCCL)"
if [ -d .deps ] && { ! command -v meson >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1 ||
                     [ ! -f /usr/include/uthash.h ] || [ ! -f /usr/include/cmocka.h ]; }; then
  echo "setting up meson/ninja/cmocka/uthash from .deps (bench/gpu_env.sh)"
  # shellcheck disable=SC1091
  . bench/gpu_env.sh
fi
built=1
rm -rf "$BUILD"
if ! { meson setup "$BUILD" -Dcuda=enabled -Dnccl=enabled -Dgpu_arch=9.0 --buildtype=release &&
       timeout 300 ninja -C "$BUILD" test/test_multigpu bench/dp_train; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  echo "run_multigpu.sh: the build failed (build.log)"
  failed=$((failed + 1))
  built=0
fi
grep -E "NCCL|CUDA backend|Library nccl|nccl.h" "$OUT/build.log" | head -8

if [ $built = 1 ]; then
  stage "test_multigpu (2 GPUs)"
  timeout 150 "$BUILD/test/test_multigpu" > "$OUT/test_multigpu.log" 2>&1
  rc=$?
  grep -E "^\[ *(PASSED|FAILED|SKIPPED|  OK|ERROR|  LINE) *\]|rank|skipped|timed out" "$OUT/test_multigpu.log" | head -30
  echo "test_multigpu rc=$rc"
  [ $rc -eq 0 ] || failed=$((failed + 1))

  # One dp_train run. A run that hangs (a collective that never completes)
  # is stopped after 100 s; after two such runs, or past 480 s in all, the
  # remaining runs are skipped so that the whole call stays in its limit.
  hangs=0
  dp() {  # label, then dp_train arguments
    local label=$1
    shift
    if [ $hangs -ge 2 ] || [ $(($(date +%s) - start)) -gt 480 ]; then
      echo "dp_train $label: skipped ($hangs runs hung, $(($(date +%s) - start)) s gone)"
      failed=$((failed + 1))
      return
    fi
    echo "--- dp_train $label: $*" >> "$log"
    timeout 100 "$BUILD/bench/dp_train" --label "$label" --layers "$LAYERS" --hidden "$HIDDEN" --timeout 90 "$@" \
      >> "$log" 2>&1
    local rc=$?
    echo "--- exit $rc" >> "$log"
    echo "dp_train $label: exit $rc"
    [ $rc -eq 3 ] || [ $rc -eq 124 ] && hangs=$((hangs + 1))
    [ $rc -eq 0 ] || failed=$((failed + 1))
  }

  stage "dp_train --debug (path hashes compared across ranks every step)"
  dp debug-tree --mode tree --steps 300 --warmup 20 --debug
  dp debug-eager --mode eager --steps 300 --warmup 20 --debug
  dp debug-tree-procs --mode tree --procs --steps 200 --warmup 20 --debug
  grep -E "^dp_train|weights|spread|dp_train:" "$log" | tail -n 12

  for cfg in "eager 0" "tree 0" "eager $NOISE" "tree $NOISE"; do
    set -- $cfg
    stage "dp_train: $1, noise $2 threads"
    dp "$1-noise$2" --mode "$1" --noise "$2" --noise-duty "$DUTY" --steps "$STEPS" --warmup "$WARMUP" --json "$json"
    grep -A8 "^dp_train $1-noise$2:" "$log" | head -9
  done

  # Ranks as processes (one per GPU, as torchrun starts them), with noise,
  # while the time allows (the whole script should stay near 4 minutes).
  for m in eager tree; do
    if [ $(($(date +%s) - start)) -lt "${MGPU_PROCS_UNTIL_S:-180}" ]; then
      stage "dp_train: $m, processes, noise $NOISE threads"
      dp "$m-procs-noise$NOISE" --mode "$m" --procs --noise "$NOISE" --noise-duty "$DUTY" --steps "$STEPS" \
        --warmup "$WARMUP" --json "$json"
      grep -A8 "^dp_train $m-procs-noise$NOISE:" "$log" | head -9
    else
      echo "dp_train $m with processes: skipped, $(($(date +%s) - start)) s are gone"
    fi
  done
fi

stage "table"
python3 - "$json" > "$md" 2>>"$log" <<'EOF' || { echo "table: FAILED"; failed=$((failed + 1)); }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    print("(no dp_train results)")
    sys.exit(1)
r0 = rows[0]
print(f"## Multi-GPU: dp_train, {r0['ranks']} ranks on {r0['device']}, NCCL {r0['nccl']}")
print()
print(f"{r0['layers']} layers of {r0['hidden']}x{r0['hidden']} fp32 (batch {r0['hidden']}), {r0['steps']} measured steps "
      f"after {r0['warmup']} warmup, {r0['skipped']} skip steps in all; noise = busy host threads at "
      f"{r0['noise_duty']*100:.0f}% of every {r0['noise_period_us']} us. Times in us.")
print()
print("| mode | ranks as | noise threads | rank | step p50 | step p99 | step mean | all-reduce p50 | all-reduce p99 | wait p50 | wait p99 | wait mean | step-end spread p50 | spread p99 | spread max | ok |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    for p in r["per_rank"]:
        print(f"| {r['mode']} | {r.get('rank_kind', 'threads')} | {r['noise_threads']} | {p['rank']} | {p['step_p50_us']:.1f} | {p['step_p99_us']:.1f} | "
              f"{p['step_mean_us']:.1f} | {p['allreduce_p50_us']:.1f} | {p['allreduce_p99_us']:.1f} | "
              f"{p['wait_p50_us']:.1f} | {p['wait_p99_us']:.1f} | {p['wait_mean_us']:.1f} | "
              f"{r['spread_p50_us']:.1f} | {r['spread_p99_us']:.1f} | {r['spread_max_us']:.1f} | {'yes' if r['ok'] else 'NO'} |")
sums = {r["weights_fnv1a"] for r in rows}
print()
print(f"Final weights (fnv1a of rank 0's, equal on every rank in each run): "
      f"{'identical in all ' + str(len(rows)) + ' runs' if len(sums) == 1 else 'DIFFER between runs: ' + ', '.join(sorted(sums))}.")
sys.exit(0 if len(sums) == 1 and all(r["ok"] for r in rows) else 1)
EOF
cat "$md"
echo
echo "run_multigpu.sh: $failed stage(s) failed in $(($(date +%s) - start)) s; files in $OUT: machine.txt build.log test_multigpu.log dp_train.log dp_train.jsonl multigpu.md"
exit $failed
