#!/usr/bin/env bash
# test/sanitize.sh — the CPU suites under AddressSanitizer + UBSan, then
# under valgrind (memcheck, leaks). Both builds are debug builds, so the tree
# also walks its invariants after every state change. Run from the repo root:
#   bash test/sanitize.sh            # both
#   bash test/sanitize.sh asan       # one
set -eu
what=${1:-all}
if [ "$what" = all ] || [ "$what" = asan ]; then
  [ -d build-asan ] || meson setup build-asan -Dcuda=disabled -Dbench=false --buildtype=debug \
    -Db_sanitize=address,undefined -Db_lundef=false
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
    meson test -C build-asan --no-suite consumers --print-errorlogs --timeout-multiplier 4
fi
if [ "$what" = all ] || [ "$what" = valgrind ]; then
  [ -d build-vg ] || meson setup build-vg -Dcuda=disabled -Dbench=false --buildtype=debug
  # The differential fuzz runs a tenth of its steps under valgrind.
  # Suites run through scripts (cli, abi's symbols.py, examples' checker,
  # consumers): valgrind would check the shell or Python, not us. consumers
  # builds other libraries and tests packaging, not memory (ASan skips it too).
  CGT_FUZZ_STEPS=${CGT_FUZZ_STEPS:-2000} meson test -C build-vg --no-suite cli --no-suite abi --no-suite examples \
    --no-suite consumers --print-errorlogs --timeout-multiplier 20 \
    --wrapper 'valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect -q'
fi
