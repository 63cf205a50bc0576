#!/usr/bin/env bash
# newcomer.sh [SOURCE_ROOT] — README's commands, run as a newcomer runs them.
#
# Copies the repository (tracked files and untracked ones git does not
# ignore; no build directories) into a clean temporary directory and runs
# there the commands README.md gives, read from README itself so that the
# two cannot drift apart:
#   1. the quick start's first command (build and demo), then README's quick
#      test subset (`meson test -C build --suite quick`; CI runs the full
#      second command elsewhere);
#   2. the Python twin in a fresh venv, as README says to make one:
#      `pip install . && cgtree demo`, then its test command, the whole
#      pytest suite (CI counts its cases from the JUnit report its
#      PYTEST_ADDOPTS asks for; the summary line is printed here);
#   3. "Using the installed library": install to $HOME/opt/cgtree (HOME is a
#      temporary directory here), link a program through pkg-config shared
#      and static (ldd must show no libcgtree.so for the static one) and run
#      both; then CMake find_package and a Meson subproject, as README
#      describes them.
# The apt-get part of the first command runs only when one of its packages
# is missing (CI has installed them already; it needs the network).
# Ends with "newcomer: N passed, N failed"; exits 1 if any check failed.
set -u
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cgtree-newcomer.XXXXXX")
[ "${CGT_NEWCOMER_KEEP:-0}" = 1 ] && echo "newcomer copy: $tmp (kept)" || trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
# check NAME COMMAND: runs COMMAND (a string, as README writes it) with bash,
# its output in $tmp/log/NAME, the tail shown on failure.
check() {
  local name=$1 cmd=$2
  echo "== $name: $cmd"
  local rc=0
  (cd "$tmp/repo" && bash -c "$cmd") >"$tmp/log/$name" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then
    ok "$name"
  else
    tail -25 "$tmp/log/$name"
    bad "$name (exit status $rc)"
  fi
}
line_after() { sed -n "/^$1/{n;p;q}" "$src/README.md"; } # the line after the first match
finish() { echo "newcomer: $passed passed, $failed failed"; [ $failed -eq 0 ]; exit $?; }

mkdir -p "$tmp/repo" "$tmp/log" "$tmp/home"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$tmp/repo" 2>/dev/null)
else
  tar -C "$src" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$tmp/repo" -xf -
fi

# --- 1. the quick start
quick1=$(line_after '# 1\. install, build, and run the demo')
case $quick1 in
*"apt-get install -y "*" && meson setup build"*) ;;
*) bad "README's quick start: no 'apt-get install ... && meson setup build ...' line"; finish ;;
esac
pkgs=${quick1#*apt-get install -y }
pkgs=${pkgs%% && *}
build_and_demo=${quick1#*"apt-get install -y $pkgs && "}
# shellcheck disable=SC2086 # the package list splits into words
if ! dpkg-query -W $pkgs >/dev/null 2>&1; then
  apt=${quick1%% && meson setup*}
  [ "$(id -u)" -eq 0 ] && apt=${apt//sudo /}
  check apt "$apt"
fi
check quick-start "$build_and_demo"
grep -q "demo on the" "$tmp/log/quick-start" || bad "quick-start: the demo did not say where it ran"
quick_tests=$(grep -o 'meson test -C build --suite quick' "$src/README.md" | head -1)
if [ -n "$quick_tests" ]; then check quick-tests "$quick_tests"; else bad "README names no quick test subset"; fi

# --- 2. the Python twin, in the venv README tells a newcomer to make
venv=$(grep -o 'python3 -m venv \.venv && \. \.venv/bin/activate' "$src/README.md" | head -1)
py1=$(line_after '# 1\. install the package')
py2=$(sed -n '/^# 1\. install the package/,/^```$/p' "$src/README.md" | sed -n '/^# 2\. run the tests/{n;p;q}')
if [ -z "$venv" ] || [ -z "$py1" ] || [ -z "$py2" ]; then
  bad "README's Python twin: venv, install or test command not found"
else
  check python-demo "$venv && $py1"
  grep -q "all equal" "$tmp/log/python-demo" || bad "python-demo: the demo did not check its outputs"
  check python-tests "$venv && $py2"
  echo "python-tests: $(tail -1 "$tmp/log/python-tests")" # pytest's summary line
fi

# --- 3. the installed library: README's block, with a program as app.c
install_block=$(sed -n '/^## Using the installed library/,/^## /p' "$src/README.md" | awk '/^```sh$/ {on = 1; next} on && /^```$/ {exit} on')
cp "$src/examples/minimal.c" "$tmp/repo/app.c"
export HOME=$tmp/home
check install-and-link "set -e
$install_block
./app && ./app-static
ldd ./app-static | grep -q libcgtree && { echo 'app-static loads libcgtree.so:'; ldd ./app-static; exit 1; }
ldd ./app | grep -q \"libcgtree.so.0 => $HOME/opt/cgtree/lib/\""
cmake_prefix=$(grep -o '\-DCMAKE_PREFIX_PATH=\$HOME/opt/cgtree' "$src/README.md" | head -1)
if [ -n "$cmake_prefix" ]; then
  check cmake "cmake -S test/consumers/cmake -B $tmp/cmake ${cmake_prefix/\$HOME/$HOME} >/dev/null && cmake --build $tmp/cmake >/dev/null && $tmp/cmake/consumer"
else
  bad "README gives no -DCMAKE_PREFIX_PATH for CMake"
fi
grep -qF "dependency('cgtree', fallback:" "$src/README.md" || bad "README gives no Meson subproject line"
check meson-subproject "mkdir -p $tmp/sub/subprojects && cp test/consumers/meson/meson.build test/consumers/consumer.c $tmp/sub/ &&
  tar --exclude='./build*' --exclude=./.venv --exclude='./app*' -cf - . | tar -C $tmp/sub/subprojects -xf - --one-top-level=cgtree &&
  PKG_CONFIG_PATH= meson setup $tmp/sub/build $tmp/sub --force-fallback-for=cgtree >/dev/null && ninja -C $tmp/sub/build >/dev/null && $tmp/sub/build/consumer"
finish
