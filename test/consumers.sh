#!/usr/bin/env bash
# consumers.sh SOURCE_ROOT [CUDA_FEATURE] — cgtree as its users get it.
#
# Builds cgtree (library only) from SOURCE_ROOT, installs it with
# `meson install --destdir` under a temporary directory, checks what was
# installed, then builds and runs test/consumers/consumer.c three ways:
#   (a) pkg-config: cc $(pkg-config --cflags --libs cgtree), with an rpath;
#   (b) a Meson project with cgtree as a subproject and
#       dependency('cgtree', fallback: ['cgtree']); it also checks that the
#       subproject built nothing but the library (no tests, benchmarks,
#       command or kernels);
#   (c) CMake: find_package(cgtree CONFIG) and cgtree::cgtree.
# Each consumer must print "consumer: cgtree <version>, 3 runs, 1 replays, ok".
# Exits 77 (skipped) only where cmake is missing, after (a) and (b) passed.
set -u
src=$(cd "${1:?usage: consumers.sh SOURCE_ROOT [enabled|disabled]}" && pwd)
cuda=${2:-disabled}
cc=${CC:-cc}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cgtree-consumers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
version=$(sed -n 's/^#define CGT_VERSION_STRING "\(.*\)"/\1/p' "$src/include/cgtree.h")
want="consumer: cgtree $version, 3 runs, 1 replays, ok"
failures=0

step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check_run() { # name program
  local out
  out=$("$2" 2>&1)
  local rc=$?
  echo "$out"
  if [ $rc -ne 0 ] || [ "$out" != "$want" ]; then
    fail "$1: exit $rc, expected the line: $want"
  else
    echo "ok: $1"
  fi
}

# A copy of the source without build directories or git metadata.
copy_source() { # dest
  mkdir -p "$1"
  tar -C "$src" --exclude='./build*' --exclude='./.git' --exclude='./.deps' --exclude='./.whl' -cf - . | tar -C "$1" -xf -
}

step "build and install cgtree (library only) with --destdir"
prefix=/opt/cgtree
dest=$tmp/dest
if ! { meson setup "$tmp/lib-build" "$src" --prefix=$prefix -Dcuda="$cuda" \
         -Dtests=false -Dbench=false -Dtools=false -Dexamples=false >"$tmp/setup.log" 2>&1 &&
       ninja -C "$tmp/lib-build" >"$tmp/build.log" 2>&1 &&
       meson install -C "$tmp/lib-build" --destdir "$dest" --no-rebuild >"$tmp/install.log" 2>&1; }; then
  cat "$tmp"/*.log | tail -40
  echo "FAIL: could not build and install cgtree"
  exit 1
fi
root=$dest$prefix
libdir=$(dirname "$(find "$root" -name 'libcgtree.so.0' | head -1)")
pcdir=$(dirname "$(find "$root" -name cgtree.pc | head -1)")
for f in include/cgtree.h include/cgtree_sim.h share/licenses/cgtree/LICENSE \
         share/doc/cgtree/api.md share/doc/cgtree/design.md share/doc/cgtree/compiler-guide.md; do
  [ -s "$root/$f" ] || fail "not installed (or empty): $f"
done
for f in libcgtree.so libcgtree.so.0 "libcgtree.so.$version" libcgtree.a cmake/cgtree/cgtreeConfig.cmake \
         cmake/cgtree/cgtreeConfigVersion.cmake; do
  [ -e "$libdir/$f" ] || fail "not installed: \$libdir/$f"
done
[ -e "$root/bin/cgtree" ] && fail "bin/cgtree installed although -Dtools=false"
echo "installed under $root (libdir ${libdir#"$root"/})"

step "(a) pkg-config"
flags=$(PKG_CONFIG_PATH=$pcdir PKG_CONFIG_SYSROOT_DIR=$dest pkg-config --cflags --libs cgtree)
echo "pkg-config --cflags --libs cgtree: $flags"
# shellcheck disable=SC2086
if $cc -std=c11 -Wall -Wextra -Werror "$src/test/consumers/consumer.c" $flags -Wl,-rpath,"$libdir" \
     -o "$tmp/consumer-pc"; then
  check_run "(a) pkg-config" "$tmp/consumer-pc"
else
  fail "(a) pkg-config: compile or link failed"
fi

step "(b) Meson subproject with dependency('cgtree', fallback: ['cgtree'])"
proj=$tmp/meson-consumer
mkdir -p "$proj/subprojects"
cp "$src/test/consumers/meson/meson.build" "$src/test/consumers/consumer.c" "$proj/"
copy_source "$proj/subprojects/cgtree"
if PKG_CONFIG_PATH= meson setup "$proj/build" "$proj" --force-fallback-for=cgtree -Dcgtree:cuda="$cuda" \
     >"$tmp/sub-setup.log" 2>&1 && ninja -C "$proj/build" >"$tmp/sub-build.log" 2>&1; then
  check_run "(b) Meson subproject" "$proj/build/consumer"
  # The subproject must have built the library and nothing else.
  targets=$(cd "$proj/build" && meson introspect --targets | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    if t["subproject"] == "cgtree":
        print(t["name"])' | sort | tr '\n' ' ')
  echo "subproject targets: $targets"
  [ "$targets" = "cgtree cgtree " ] || fail "(b) the subproject built more than the library: $targets"
  ntests=$(cd "$proj/build" && meson introspect --tests | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  [ "$ntests" = 0 ] || fail "(b) the subproject registered $ntests tests"
else
  tail -40 "$tmp"/sub-*.log
  fail "(b) Meson subproject: setup or build failed"
fi

step "(c) CMake find_package(cgtree CONFIG)"
if ! command -v cmake >/dev/null 2>&1; then
  echo "cmake not found: (c) skipped"
  [ $failures -eq 0 ] && exit 77
  exit 1
fi
if cmake -S "$src/test/consumers/cmake" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$root" \
     -DCMAKE_C_COMPILER="$cc" >"$tmp/cmake.log" 2>&1 && cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1; then
  check_run "(c) CMake" "$tmp/cmake-build/consumer"
else
  tail -40 "$tmp/cmake.log"
  fail "(c) CMake: configure or build failed"
fi
# A version the package does not satisfy must be refused.
mkdir -p "$tmp/cmake-old"
cat >"$tmp/cmake-old/CMakeLists.txt" <<EOT
cmake_minimum_required(VERSION 3.13)
project(want_newer C)
find_package(cgtree 0.99 CONFIG QUIET)
if(cgtree_FOUND)
  message(FATAL_ERROR "cgtree \${cgtree_VERSION} claimed to satisfy 0.99")
endif()
EOT
cmake -S "$tmp/cmake-old" -B "$tmp/cmake-old/b" -DCMAKE_PREFIX_PATH="$root" >"$tmp/cmake-old.log" 2>&1 ||
  { cat "$tmp/cmake-old.log"; fail "(c) find_package(cgtree 0.99) was not refused"; }

echo
if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all consumers built and ran"
