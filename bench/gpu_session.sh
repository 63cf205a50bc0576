#!/usr/bin/env bash
# bench/gpu_session.sh — everything one lent GPU machine does for us, in one
# call: build with CUDA, run every suite, run the CUDA suite again under
# compute-sanitizer (memcheck, racecheck), then the benchmarks and the demo.
# Results go to $OUT (at most 8 files come back). Usage, from the repo root:
#   bash bench/gpu_session.sh [tests|demo|bench|all|soak]
# soak (not part of all): the differential fuzz for 10,000 steps on the GPU
# (test/soak.sh cuda), log in $OUT/soak.log.
set -u
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. bench/gpu_env.sh
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -2; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if [ ! -f build-gpu/build.ninja ]; then
  meson setup build-gpu -Dcuda=enabled -Dgpu_arch=9.0 --buildtype=debugoptimized > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C build-gpu >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build ok"

if [ "$what" = tests ] || [ "$what" = all ]; then
  meson test -C build-gpu --print-errorlogs > "$OUT/tests.log" 2>&1
  echo "meson test rc=$?"
  grep -E "^ *[0-9]+/[0-9]+ |^Ok:|^Fail:|^Skipped:" "$OUT/tests.log"
  grep -hE "^\[  (PASSED|FAILED|SKIPPED) *\]|^\[  ERROR   \]|^\[   LINE   \]" build-gpu/meson-logs/testlog.txt | sort | uniq -c | head -40
  cp build-gpu/meson-logs/testlog.txt "$OUT/testlog.txt"
  {
    echo "== compute-sanitizer --tool memcheck"
    CGT_FUZZ_STEPS=300 CGT_LOG=error timeout 240 compute-sanitizer --tool memcheck --leak-check full --report-api-errors no --error-exitcode 3 build-gpu/test/test_cuda 2>&1 | grep -vE "^\[ +(RUN|OK) +\]"
    echo "memcheck rc=${PIPESTATUS[0]}"
    echo "== compute-sanitizer --tool racecheck"
    CGT_FUZZ_STEPS=100 CGT_LOG=error timeout 200 compute-sanitizer --tool racecheck --error-exitcode 3 build-gpu/test/test_cuda 2>&1 | grep -vE "^\[ +(RUN|OK) +\]"
    echo "racecheck rc=${PIPESTATUS[0]}"
  } > "$OUT/sanitizer.log" 2>&1
  grep -E "rc=|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|PASSED|FAILED" "$OUT/sanitizer.log" | head -20
fi

if [ "$what" = soak ]; then
  CGT_SOAK_BUILD=build-gpu bash test/soak.sh cuda > "$OUT/soak.log" 2>&1
  echo "soak rc=$?"
  grep -E "^soak:|^fuzz |FAILED|ERROR" "$OUT/soak.log" | cut -c1-200
fi

if [ "$what" = demo ] || [ "$what" = bench ] || [ "$what" = all ]; then
  build-gpu/tools/cgtree info > "$OUT/demo.txt" 2>&1
  build-gpu/tools/cgtree demo --backend cuda >> "$OUT/demo.txt" 2>&1
  echo "demo rc=$?"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  if [ -f bench/run_gpu.sh ]; then
    bash bench/run_gpu.sh
  fi
fi
[ -f "$OUT/demo.txt" ] && tail -60 "$OUT/demo.txt"
true
