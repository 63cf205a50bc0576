#!/bin/sh
# cli_test.sh — the `cgtree` command seen from outside: exit codes, usage on
# bad flags, the one-line error for a backend that is not there, and the key
# lines of demo, dot, info and --json on the simulator.
#
# usage: cli_test.sh path/to/cgtree       exit 0 if every check passes, else 1
set -u

bin=${1:?usage: cli_test.sh path/to/cgtree}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cgtree-cli.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
steps=6 # enough for warm-up, recording and replays on both branches

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run EXPECTED_RC ARGS...: runs the binary, keeps stdout/stderr in $tmp.
run() {
  want=$1
  shift
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  got=$?
  if [ "$got" -ne "$want" ]; then
    fail "cgtree $* exited $got, wanted $want"
    sed 's/^/  stderr: /' "$tmp/err" | head -5
  fi
}

has() { # has FILE PATTERN: a fixed string somewhere in out/err
  grep -qF -- "$2" "$tmp/$1" || fail "cgtree $last: no '$2' in $1"
}
lacks() {
  if grep -qF -- "$2" "$tmp/$1"; then fail "cgtree $last: '$2' in $1"; fi
}

# --- version and help
last="--version"
run 0 --version
grep -Eq '^cgtree [0-9]+\.[0-9]+\.[0-9]+$' "$tmp/out" || fail "--version printed '$(cat "$tmp/out")'"
for h in --help help -h; do
  last=$h
  run 0 "$h"
  has out "usage: cgtree"
done

# --- bad command lines: one line saying what is wrong plus a hint, on
# stderr, exit 2 (not the whole help, which would bury the one line)
for args in "" "bogus" "demo --bogus" "demo --steps 0" "demo --steps x" "demo --steps" \
  "demo --workload nope" "demo --backend tpu" "demo --backend" "demo extra" "dot --json" \
  "dot a.dot b.dot" "info --bogus" "--version extra"; do
  last="$args"
  # shellcheck disable=SC2086 # word splitting is the point
  run 2 $args
  [ "$(wc -l <"$tmp/err")" -eq 2 ] || fail "cgtree $args: $(wc -l <"$tmp/err") lines on stderr, wanted 2"
  head -1 "$tmp/err" | grep -q '^cgtree: ' || fail "cgtree $args: the first line does not say what is wrong"
  has err "Try 'cgtree help' for usage."
  lacks err "usage: cgtree"
  [ -s "$tmp/out" ] && fail "cgtree $args wrote to stdout on a usage error"
done

# --- info
last=info
run 0 info
has out "cgtree "
has out "backends: sim, cuda ("
cuda_available=0
grep -qF "cuda (available)" "$tmp/out" && cuda_available=1
# No driver at all: the reason says so, not "driver version is insufficient".
if grep -qF "driver: none found" "$tmp/out" && grep -qF "cuda (built" "$tmp/out"; then
  has out "no NVIDIA driver is installed"
  lacks out "insufficient"
fi

# --- a backend that is not there: one line on stderr, exit 1
if [ "$cuda_available" -eq 0 ]; then
  last="demo --backend cuda"
  run 1 demo --backend cuda --steps 2
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "--backend cuda without a GPU: $(wc -l <"$tmp/err") lines on stderr"
  has err "not available"
  [ -s "$tmp/out" ] && fail "--backend cuda without a GPU wrote to stdout"
  last="dot --backend cuda"
  run 1 dot --backend cuda
fi

# --- the demo on the simulator, every workload choice
for w in branchy chain all; do
  last="demo --backend sim --workload $w"
  run 0 demo --backend sim --workload "$w" --steps $steps
  has out "CPU simulation (not GPU time)"
  has out "outputs: bit-equal in every mode at every step"
  has out "tree mode grew"
  has out "[RECORDED] replays="
  grep -Eq '^  mode .*speedup' "$tmp/out" && fail "$last: a speedup column on the simulator"
  lacks out "DIFFERS"
  for m in eager separate tree; do
    grep -Eq "^  $m +[0-9.]+ (us|ms|s) " "$tmp/out" || fail "$last: no row for mode $m"
  done
  case $w in
  all) has out "branchy:" && has out "chain:" ;;
  *) has out "$w:" ;;
  esac
done
last="demo --backend auto"
run 0 demo --workload chain --steps 2
has out "auto"

# --- JSON: the whole output is one JSON document, one object per workload
for w in all chain; do
last="demo --json --workload $w"
run 0 demo --backend sim --json --workload $w --steps $steps
if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/out" "$w" <<'EOF' || fail "$last: the output is not one JSON document with the fields"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["cgtree"].count(".") == 2
names = [o["workload"] for o in doc["workloads"]]
assert names == (["branchy", "chain"] if sys.argv[2] == "all" else [sys.argv[2]]), names
for o in doc["workloads"]:
    assert o["timing"] == "cpu_simulation" and o["outputs_bit_equal"] is True
    assert [m["mode"] for m in o["modes"]] == ["eager", "separate", "tree"]
    assert all(m["speedup_vs_eager"] is None for m in o["modes"])
    assert o["nodes"] and all(n["state"] in ("WARMUP", "RECORDED", "EAGER") for n in o["nodes"])
    assert o["modes"][2]["stats"]["replays"] > 0
EOF
fi
done

# --- the demo's one-line legend of its table columns
last="demo legend"
run 0 demo --backend sim --workload chain --steps 2
[ "$(grep -c '^Columns: ' "$tmp/out")" -eq 1 ] || fail "demo: no one-line 'Columns:' legend"
for col in "pool peak =" "graphs =" "replays =" "restores =" "eager nodes ="; do
  has out "$col"
done

# --- progress from the first step whenever stderr is a terminal (script(1)
# gives the demo a terminal; stdout goes to a file)
if command -v script >/dev/null 2>&1; then
  last="demo progress on a terminal"
  script -qec "\"$bin\" demo --backend sim --workload chain --steps 2 >\"$tmp/out\"" /dev/null >"$tmp/tty" 2>&1 </dev/null
  grep -q "running chain, eager mode: step 1/2" "$tmp/tty" || fail "$last: no progress line at the first step"
  lacks out "running chain"
fi

# --- an unknown CGT_LOG value: one warning, then the demo runs as usual
last="CGT_LOG=loud demo"
CGT_LOG=loud "$bin" demo --backend sim --workload chain --steps 2 >"$tmp/out" 2>"$tmp/err" || fail "$last failed"
[ "$(grep -c "CGT_LOG=loud is not error, warn, info or debug; ignored" "$tmp/err")" -eq 1 ] ||
  fail "$last: wanted the warning once on stderr, got: $(cat "$tmp/err")"
has out "tree mode grew"

# --- dot: to stdout, to a file, and from the demo
last="dot"
run 0 dot --backend sim --steps $steps
head -1 "$tmp/out" | grep -q '^digraph' || fail "dot: stdout does not start with a digraph"
last="dot FILE"
run 0 dot --backend sim --workload chain --steps $steps "$tmp/chain.dot"
[ -s "$tmp/out" ] && fail "dot FILE also wrote to stdout"
grep -qs '^digraph' "$tmp/chain.dot" || fail "dot FILE: no digraph in the file"
last="demo --dot FILE"
run 0 demo --backend sim --workload branchy --steps $steps --dot "$tmp/demo.dot"
has out "Graphviz: wrote 1 tree to"
grep -qs '^digraph' "$tmp/demo.dot" || fail "demo --dot: no digraph in the file"
if command -v dot >/dev/null 2>&1; then
  for f in "$tmp/chain.dot" "$tmp/demo.dot"; do
    dot -Tsvg "$f" >/dev/null || fail "dot -Tsvg rejects $f"
  done
fi
# --- --defer: a tree+defer mode, fused spans in the table, the tree and the dot
last="demo --defer"
run 0 demo --backend sim --workload chain --steps $steps --defer
has out "tree+defer"
has out "fused launches"
has out "fused="
last="dot --defer"
run 0 dot --backend sim --workload chain --steps $steps --defer
has out "fused span: 4 nodes"
last="demo without --defer"
run 0 demo --backend sim --workload chain --steps $steps
lacks out "tree+defer"

last="demo --dot to a directory that does not exist"
run 1 demo --backend sim --steps 2 --dot "$tmp/no/such/dir/x.dot"
[ -s "$tmp/out" ] && fail "$last: the demo printed (or ran) before the path was checked"
has err "cannot write"

# --- every column name stands apart (two spaces at least between names)
last="demo --defer column names"
run 0 demo --backend sim --workload chain --steps 2 --defer
cols=$(grep -E '^  mode ' "$tmp/out" | sed -E 's/^ +//; s/  +/|/g')
[ "$cols" = "mode|CPU sim/step|pool peak|vs eager|graphs|replays|restores|eager nodes|fused launches" ] ||
  fail "$last: the header reads '$cols'"

last="dot to a directory that does not exist"
run 1 dot --backend sim --steps 2 "$tmp/no/such/dir/x.dot"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all cgtree CLI checks passed"
exit 0
