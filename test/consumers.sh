#!/usr/bin/env bash
# consumers.sh SOURCE_ROOT [CUDA_FEATURE] — cgtree as its users get it.
#
# Builds cgtree (library only) from SOURCE_ROOT, installs it to a custom
# prefix under a temporary directory (--prefix=DIR --libdir=lib, as README
# says), checks what was installed (every document of docs/ included), then
# builds and runs test/consumers/consumer.c four ways:
#   (a) pkg-config, shared: PKG_CONFIG_PATH=DIR/lib/pkgconfig and
#       cc $(pkg-config --cflags --libs cgtree), with an rpath;
#   (b) pkg-config, static: cc $(pkg-config --cflags --libs cgtree-static);
#       ldd must show no libcgtree.so, and it runs with no library path;
#       with CUDA, README's nvcc line builds examples/gpu.cu the same way
#       (it runs, or exits 77 without a GPU);
#   (c) a Meson project with cgtree as a subproject and
#       dependency('cgtree', fallback: ['cgtree']); it also checks that the
#       subproject built nothing but the library (no tests, benchmarks,
#       command or kernels);
#   (d) CMake: find_package(cgtree CONFIG) and cgtree::cgtree.
# Each consumer must print "consumer: cgtree <version>, 3 runs, 1 replays, ok".
# Exits 77 (skipped) only where cmake is missing, after (a) to (c) passed.
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

step "build and install cgtree (library only) to a custom prefix"
root=$tmp/prefix
if ! { meson setup "$tmp/lib-build" "$src" --prefix="$root" --libdir=lib -Dcuda="$cuda" \
         -Dtests=false -Dbench=false -Dtools=false -Dexamples=false >"$tmp/setup.log" 2>&1 &&
       ninja -C "$tmp/lib-build" >"$tmp/build.log" 2>&1 &&
       meson install -C "$tmp/lib-build" --no-rebuild >"$tmp/install.log" 2>&1; }; then
  cat "$tmp"/*.log | tail -40
  echo "FAIL: could not build and install cgtree"
  exit 1
fi
libdir=$root/lib
for f in include/cgtree.h include/cgtree_sim.h share/licenses/cgtree/LICENSE share/doc/cgtree/README.md; do
  [ -s "$root/$f" ] || fail "not installed (or empty): $f"
done
for doc in "$src"/docs/*.md; do
  [ -s "$root/share/doc/cgtree/${doc##*/}" ] || fail "not installed: share/doc/cgtree/${doc##*/}"
done
for f in libcgtree.so libcgtree.so.0 "libcgtree.so.$version" libcgtree.a cmake/cgtree/cgtreeConfig.cmake \
         cmake/cgtree/cgtreeConfigVersion.cmake pkgconfig/cgtree.pc pkgconfig/cgtree-static.pc; do
  [ -e "$libdir/$f" ] || fail "not installed: \$libdir/$f"
done
[ -e "$root/bin/cgtree" ] && fail "bin/cgtree installed although -Dtools=false"
echo "installed under $root"
export PKG_CONFIG_PATH=$libdir/pkgconfig

step "(a) pkg-config, shared library"
flags=$(pkg-config --cflags --libs cgtree)
echo "pkg-config --cflags --libs cgtree: $flags"
# shellcheck disable=SC2086
if $cc -std=c11 -Wall -Wextra -Werror "$src/test/consumers/consumer.c" $flags \
     -Wl,-rpath,"$(pkg-config --variable=libdir cgtree)" -o "$tmp/consumer-pc"; then
  check_run "(a) pkg-config, shared" "$tmp/consumer-pc"
  ldd "$tmp/consumer-pc" | grep -q "libcgtree.so.0 => $libdir/" ||
    fail "(a) the program does not load $libdir/libcgtree.so.0: $(ldd "$tmp/consumer-pc")"
else
  fail "(a) pkg-config, shared: compile or link failed"
fi

step "(b) pkg-config, static library"
flags=$(pkg-config --cflags --libs cgtree-static)
echo "pkg-config --cflags --libs cgtree-static: $flags"
# shellcheck disable=SC2086
if $cc -std=c11 -Wall -Wextra -Werror "$src/test/consumers/consumer.c" $flags -o "$tmp/consumer-static"; then
  check_run "(b) pkg-config, static" "$tmp/consumer-static"
  if ldd "$tmp/consumer-static" | grep -q libcgtree; then
    fail "(b) the static link loads libcgtree.so: $(ldd "$tmp/consumer-static" | grep libcgtree)"
  fi
else
  fail "(b) pkg-config, static: compile or link failed"
fi

# README's line for .cu files, on README's own CUDA program, where CUDA is built in.
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ "$cuda" = enabled ] && [ -x "$nvcc" ]; then
  step "(b') nvcc with cgtree-static: examples/gpu.cu"
  # shellcheck disable=SC2086
  if "$nvcc" "$src/examples/gpu.cu" $flags -o "$tmp/gpu-static"; then
    out=$("$tmp/gpu-static" 2>&1)
    rc=$?
    echo "$out (exit $rc)"
    if [ $rc -eq 77 ] || { [ $rc -eq 0 ] && [ "$out" = "$(cat "$src/examples/gpu.expected")" ]; }; then
      echo "ok: (b') nvcc"
    else
      fail "(b') examples/gpu.cu built with nvcc: exit $rc"
    fi
  else
    fail "(b') nvcc could not build examples/gpu.cu with cgtree-static"
  fi
fi

step "(c) Meson subproject with dependency('cgtree', fallback: ['cgtree'])"
proj=$tmp/meson-consumer
mkdir -p "$proj/subprojects"
cp "$src/test/consumers/meson/meson.build" "$src/test/consumers/consumer.c" "$proj/"
copy_source "$proj/subprojects/cgtree"
if PKG_CONFIG_PATH= meson setup "$proj/build" "$proj" --force-fallback-for=cgtree -Dcgtree:cuda="$cuda" \
     >"$tmp/sub-setup.log" 2>&1 && ninja -C "$proj/build" >"$tmp/sub-build.log" 2>&1; then
  check_run "(c) Meson subproject" "$proj/build/consumer"
  # The subproject must have built the library and nothing else.
  targets=$(cd "$proj/build" && meson introspect --targets | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    if t["subproject"] == "cgtree":
        print(t["name"])' | sort | tr '\n' ' ')
  echo "subproject targets: $targets"
  [ "$targets" = "cgtree cgtree " ] || fail "(c) the subproject built more than the library: $targets"
  ntests=$(cd "$proj/build" && meson introspect --tests | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  [ "$ntests" = 0 ] || fail "(c) the subproject registered $ntests tests"
else
  tail -40 "$tmp"/sub-*.log
  fail "(c) Meson subproject: setup or build failed"
fi

step "(d) CMake find_package(cgtree CONFIG)"
if ! command -v cmake >/dev/null 2>&1; then
  echo "cmake not found: (d) skipped"
  [ $failures -eq 0 ] && exit 77
  exit 1
fi
if cmake -S "$src/test/consumers/cmake" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$root" \
     -DCMAKE_C_COMPILER="$cc" >"$tmp/cmake.log" 2>&1 && cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1; then
  check_run "(d) CMake" "$tmp/cmake-build/consumer"
else
  tail -40 "$tmp/cmake.log"
  fail "(d) CMake: configure or build failed"
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
  { cat "$tmp/cmake-old.log"; fail "(d) find_package(cgtree 0.99) was not refused"; }

echo
if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all consumers built and ran"
