#!/bin/bash
# bench/torch_ab.sh — on the GPU machine: one torch benchmark at two trees of
# cgtree, run alternately on one machine (host speed moves between machines
# by a quarter, so compare only within one run).
#
#   mkdir ab_old && git archive <rev> | tar -x -C ab_old     # here, before the device call
#   AB_PASSES=2 bash bench/torch_ab.sh ab_old bench/torch_recurrent.py --modes eager,inductor,cgtree --rounds 3
#
# The other tree (a folder with its own sources, carried as untracked files)
# is built as bench/torch_gpu.sh builds this one, into /tmp/build-ab, its
# package in /tmp/cgtree_pkg_ab; each pass runs the script of each tree
# with its own package, the other tree first. Output lines that are not
# tables are dropped. Remove the folder afterwards: it must not be committed.
set -u
other=${1:?the folder of the other tree}
shift
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -d /tmp/cgtree_pkg ] || bash bench/torch_gpu.sh none > /dev/null
. bench/gpu_env.sh
B=/tmp/build-ab
if [ ! -f $B/build.ninja ]; then
  (cd "$other" && meson setup $B -Dcuda=enabled -Dgpu_arch=9.0 -Dpython=enabled -Dtests=false -Dbench=false \
    -Dtools=false > "$OUT/build-ab.log" 2>&1) || { tail -20 "$OUT/build-ab.log"; exit 1; }
fi
ninja -C $B >> "$OUT/build-ab.log" 2>&1 || { tail -20 "$OUT/build-ab.log"; exit 1; }
P=/tmp/cgtree_pkg_ab
rm -rf $P && mkdir -p $P && cp -r "$other/python/cgtree" $P/ && cp $B/python/*.so $P/cgtree/
for pass in $(seq "${AB_PASSES:-2}"); do
  for tree in "$other" .; do
    pkg=/tmp/cgtree_pkg
    [ "$tree" = . ] || pkg=$P
    echo "== $tree, pass $pass"
    (cd "$tree" && PYTHONPATH=$pkg${PYTHONPATH:+:$PYTHONPATH} timeout "${AB_SECONDS:-200}" python3 "$@" 2>&1 | grep "^|")
  done
done
