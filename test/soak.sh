#!/usr/bin/env bash
# test/soak.sh — the long differential fuzz (TREE = SEPARATE = EAGER, bit for
# bit), not part of CI: the same suites CI runs, with a much larger fuzz
# budget spread over the same tests in the same shares (test/fuzz.c).
#
#   bash test/soak.sh                 # simulator: 1,000,000 steps, build/test/test_tree
#   bash test/soak.sh cuda            # GPU: 10,000 steps, build-cuda/test/test_cuda
#                                     # (CGT_SOAK_BUILD=dir: another build directory)
#   bash test/soak.sh evict           # simulator, 1,000,000 steps, every tree under a recording
#                                     # budget of CGT_FUZZ_BUDGET graphs (default 3): eviction on
#   CGT_FUZZ_STEPS=N bash test/soak.sh [cuda|evict]   # another budget
#
# Build first (README). Prints every fuzz test's totals, the wall time, and
# exits with the suite's status. A failure names test, seed and step;
# CGT_FUZZ_SEED=<seed> with the same CGT_FUZZ_STEPS reruns that seed alone.
set -u
cd "$(dirname "$0")/.."
what=${1:-sim}
case "$what" in
  sim) bin=build/test/test_tree; steps=${CGT_FUZZ_STEPS:-1000000} ;;
  cuda) bin=${CGT_SOAK_BUILD:-build-cuda}/test/test_cuda; steps=${CGT_FUZZ_STEPS:-10000} ;;
  evict) bin=build/test/test_tree; steps=${CGT_FUZZ_STEPS:-1000000}; export CGT_FUZZ_BUDGET=${CGT_FUZZ_BUDGET:-3} ;;
  *) echo "usage: bash test/soak.sh [sim|cuda|evict]" >&2; exit 2 ;;
esac
if [ ! -x "$bin" ]; then
  echo "$bin is missing: build it first (see README.md)" >&2
  exit 2
fi
echo "soak: $bin with CGT_FUZZ_STEPS=$steps${CGT_FUZZ_BUDGET:+ CGT_FUZZ_BUDGET=$CGT_FUZZ_BUDGET}, started $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
start=$(date +%s)
CGT_LOG=error CGT_FUZZ_STEPS=$steps "$bin"
rc=$?
end=$(date +%s)
echo "soak: exit status $rc after $((end - start)) s wall"
exit $rc
