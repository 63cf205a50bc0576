#!/usr/bin/env bash
# docs_tables.sh SOURCE_ROOT — README and docs/api.md list what exists.
#
# README's tables and the contract drift from the code unless something
# compares them: every Meson option must be a row of README's Building
# table, every test suite a row of its Tests table, and every environment
# variable the library or cgtree.torch reads a row of docs/api.md's
# Environment table. README's CUDA program must be examples/gpu.cu word for
# word (the CUDA suite runs that file), every relative link in README must
# name a file of the repository, and docs/api.md (the contract) carries no
# dates or issue numbers. Exits 1 naming each difference.
set -u
src=$(cd "${1:?usage: docs_tables.sh SOURCE_ROOT}" && pwd)
cd "$src" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Rows of a Markdown table: the first cell's `name`, between two headings.
rows() { # FILE HEADING
  awk -v h="$2" '$0 == h {on = 1; next} on && /^## / {exit} on' "$1" | sed -n 's/^| `\([^`]*\)`.*/\1/p'
}

build_rows=$(rows README.md "## Building")
for opt in $(sed -n "s/^option('\([^']*\)'.*/\1/p" meson_options.txt); do
  grep -qx "$opt" <<<"$build_rows" || fail "README's Building table has no row for the option '$opt'"
done

test_rows=$(rows README.md "## Tests")
suites=$(grep -ho "suite: *\(\[[^]]*\]\|'[^']*'\)" meson.build ./*/meson.build | grep -o "'[^']*'" | tr -d "'" | sort -u)
for s in $suites; do
  grep -qx "$s" <<<"$test_rows" || fail "README's Tests table has no row for the suite '$s'"
done

env_rows=$(awk '$0 == "## Environment" {on = 1; next} on && /^## / {exit} on' docs/api.md)
vars=$( { grep -ho 'getenv("[A-Z_]*")' lib/*.c | grep -o '[A-Z_]\{4,\}';
          grep -ho 'environ\.get("[A-Z_]*"' python/cgtree/torch/*.py 2>/dev/null | grep -o '[A-Z_]\{4,\}'; } | sort -u)
[ -n "$vars" ] || fail "found no environment variable in the code (the search is broken)"
for v in $vars; do
  grep -qF "\`$v" <<<"$env_rows" || fail "docs/api.md's Environment table has no row for $v"
done

readme_program=$(awk '/^```c$/ {on = 1; next} on && /^```$/ {exit} on' README.md)
[ "$readme_program" = "$(cat examples/gpu.cu)" ] || fail "README's C program is not examples/gpu.cu"

for link in $(grep -o '](\([a-z][^)#]*\)' README.md | sed 's/^](//' | grep -v '^https\?:' | sort -u); do
  [ -e "$link" ] || fail "README links to $link, which is not in the repository"
done
grep -nE '20[0-9]{2}-[0-9]{2}-[0-9]{2}|[Ii]ssue [0-9]|shared/' docs/api.md && fail "docs/api.md names dates, issues or files outside the repository"

[ $failures -eq 0 ] || { echo "$failures difference(s)"; exit 1; }
echo "README's tables, its program and docs/api.md agree with the code"
