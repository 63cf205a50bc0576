#!/usr/bin/env bash
# bench/gpu_check.sh — the GPU acceptance pass, sized for one device call
# (under 10 minutes on an H100): build everything with CUDA and the Python
# package, run every C suite (the CUDA suite included), the CUDA suite under
# compute-sanitizer memcheck, the Python GPU tests, the torch.compile
# backend's tests, and the GPU soak of the differential fuzz with whatever
# time is left. From the repository root, with .deps carried:
#
#   OUT=/some/dir bash bench/gpu_check.sh [SECONDS [STAGES]]
#
# SECONDS: total budget (default 560). STAGES: a comma-separated subset of
# tests,memcheck,python,torch,soak,demo,pip,bench (default all but demo, pip
# and bench); demo runs `cgtree demo --defer` on the GPU; pip runs `pip install
# --no-build-isolation .` (meson-python carried as wheels in .whl) and the
# Python demo from the installed package; bench runs
# bench/run_gpu.sh, bench/python_overhead.py --backend cuda and the
# torch.compile comparison of the branch example. MEMCHECK_STEPS (default
# 40) and SOAK_STEPS (default 10000) set the fuzz steps of those stages.
#
# Files under $OUT: machine.txt build.log testlog.txt sanitizer.log
# pytest.log pytest-sim.log torch.log soak.log summary.txt (the summary is printed last).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
budget=${1:-560}
stages=,${2:-tests,memcheck,python,torch,soak},
want() { case $stages in *,$1,*) return 0 ;; esac; return 1; }
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
sum=$OUT/summary.txt
: > "$sum"
note() { echo "$*" | tee -a "$sum"; }

. bench/gpu_env.sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -2
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1; date -u; } > "$OUT/machine.txt" 2>&1
note "machine: $(head -1 "$OUT/machine.txt")"

# gpu_env.sh points pkg-config at a sysroot under /tmp/deps, so the system's
# python .pc names headers there: link the real header directories in.
pyinc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ -d "$pyinc" ] && [ ! -e "/tmp/deps/usr/include/$(basename "$pyinc")" ]; then
  mkdir -p /tmp/deps/usr/include && ln -s "$pyinc" "/tmp/deps/usr/include/$(basename "$pyinc")"
fi

B=build-gpu
BLOG=/tmp/gpu_check_build.log
if [ ! -f $B/build.ninja ]; then
  meson setup $B -Dcuda=enabled -Dgpu_arch=9.0 -Dpython=enabled --buildtype=debugoptimized > "$BLOG" 2>&1 ||
    { tail -30 "$BLOG"; exit 1; }
fi
ninja -C $B >> "$BLOG" 2>&1 || { grep -E "error|FAILED" -A3 "$BLOG" | head -40; exit 1; }
note "build: ok ($(( $(date +%s) - start )) s); $(grep -E 'NCCL' "$BLOG" | head -1 | tr -s ' ')"

# 1. Every C suite but the install-and-consume one (CPU-only, CI runs it).
if want tests; then
timeout 240 meson test -C $B --print-errorlogs --num-processes 8 --no-suite consumers > /dev/null 2>&1
note "meson test rc=$?"
cp $B/meson-logs/testlog.txt "$OUT/testlog.txt"
grep -E "^ *[0-9]+/[0-9]+ " "$OUT/testlog.txt" | sed 's/^/  /' | tee -a "$sum"
grep -hE "^\[  (PASSED|FAILED|SKIPPED) *\]" "$OUT/testlog.txt" | sort | uniq -c | sed 's/^/  /' | tee -a "$sum"
grep -hE "^\[  FAILED  \] [a-z]|^\[  ERROR   \]" "$OUT/testlog.txt" | head -20 | tee -a "$sum"
fi

# 2. The CUDA suite under memcheck (a shorter fuzz).
if want memcheck; then
CGT_FUZZ_STEPS=${MEMCHECK_STEPS:-40} CGT_LOG=error timeout 280 compute-sanitizer --tool memcheck --leak-check full \
  --report-api-errors no --error-exitcode 3 $B/test/test_cuda > "$OUT/sanitizer.log" 2>&1
note "memcheck rc=$? $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$OUT/sanitizer.log" | tr '\n' ' ')"
grep -E "^\[  (PASSED|FAILED) " "$OUT/sanitizer.log" | head -5 | tee -a "$sum"
fi

# 3. Python: the package from the build tree.
P=/tmp/cgtree_pkg
rm -rf $P && mkdir -p $P && cp -r python/cgtree $P/ && cp $B/python/*.so $P/cgtree/
export PYTHONPATH=$P${PYTHONPATH:+:$PYTHONPATH}
# The binding's tests; the torch door's are apart: its GPU tests install
# cgtree.torch's allocator when pytest collects them, and its simulator
# tests swap the hot path for fakes, so each group has a process of its own.
if want python; then
# The `cgtree` script exists only where the package was pip-installed (the
# pip stage, CI): its cases are left to them.
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider python/tests --ignore-glob='*test_torch_*' \
  -k "not script and not pip_install" > "$OUT/pytest.log" 2>&1
note "pytest (binding) rc=$? $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -10 | tee -a "$sum"
timeout 60 python3 -m pytest -q -rf -p no:cacheprovider python/tests/test_torch_ext_sim.py \
  > "$OUT/pytest-sim.log" 2>&1
note "pytest (torch door, simulator) rc=$? $(tail -1 "$OUT/pytest-sim.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-sim.log" | head -10 | tee -a "$sum"
fi

# 4. The torch.compile backend (its own process: it swaps the allocator).
t=$(( $(left) - 120 )); [ $t -gt 360 ] && t=360
if want torch && [ $t -gt 30 ]; then
  timeout $t python3 -m pytest -q -rf --tb=short -p no:cacheprovider python/tests/test_torch_backend.py \
    python/tests/test_torch_trust.py python/tests/test_torch_training.py > "$OUT/torch.log" 2>&1
  note "pytest (torch backend) rc=$? $(tail -1 "$OUT/torch.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/torch.log" | head -10 | tee -a "$sum"
elif want torch; then
  note "pytest (torch backend): no time left"
fi

# 5. The GPU soak with the time that is left.
t=$(( $(left) - 10 ))
if want soak && [ $t -gt 30 ]; then
  CGT_FUZZ_STEPS=${SOAK_STEPS:-10000} CGT_LOG=error timeout $t $B/test/test_cuda > "$OUT/soak.log" 2>&1
  note "soak (${SOAK_STEPS:-10000} fuzz steps on CUDA) rc=$? in $(( $(date +%s) - start )) s total"
  grep -E "^fuzz |^\[  (PASSED|FAILED) " "$OUT/soak.log" | head -12 | tee -a "$sum"
fi
# 6. The demo on the GPU, with the deferred-launch mode.
if want demo; then
  { $B/tools/cgtree info; $B/tools/cgtree demo --backend cuda --defer; } > "$OUT/demo.txt" 2>&1
  note "demo rc=$?"
fi

# 7. `pip install .` on the GPU machine (no network: meson-python from .whl).
if want pip; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/pipbuild .whl/*.whl &&
    PYTHONPATH=/tmp/pipbuild:$PYTHONPATH python3 -m pip install -q --no-build-isolation --no-deps \
      --target /tmp/pipinst . > "$OUT/pip.txt" 2>&1
  note "pip install . rc=$?"
  (cd /tmp && PYTHONPATH=/tmp/pipinst python3 -m cgtree demo) >> "$OUT/pip.txt" 2>&1
  note "python -m cgtree demo (pip-installed) rc=$?"; tail -4 "$OUT/pip.txt" | tee -a "$sum"
fi

# 8. Benchmarks: the C workloads (fusion included), the Python overhead on
# CUDA, and the torch.compile comparison of the docs' branch example.
if want bench; then
  python3 bench/python_overhead.py --backend cuda > "$OUT/python_overhead.txt" 2>&1
  note "python_overhead (cuda) rc=$?"; tail -8 "$OUT/python_overhead.txt" | tee -a "$sum"
  t=$(( $(left) - 100 ))
  BENCH_BUDGET_S=$t bash bench/run_gpu.sh > /dev/null 2>&1
  note "run_gpu.sh rc=$?"
  grep -E "^\| (chain|branchy)|defer|one graph" "$OUT/bench.md" | head -30 | tee -a "$sum"
  t=$(( $(left) - 5 ))
  [ $t -gt 30 ] && { timeout $t python3 bench/torch_compare.py --examples branch --modes inductor,cgtree,reduce-overhead \
    > "$OUT/torch_compare.txt" 2>&1; note "torch_compare rc=$?"; tail -8 "$OUT/torch_compare.txt" | tee -a "$sum"; }
fi
note "gpu_check: done in $(( $(date +%s) - start )) s"
