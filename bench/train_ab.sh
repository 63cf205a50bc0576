#!/bin/bash
# bench/train_ab.sh — the MLP training step under cgtree at another commit
# against the working tree, on one machine, the two and reduce-overhead
# interleaved round by round (a fresh process each), so that host speed,
# which moves from machine to machine, cancels.
#
#   here:            rm -rf old && mkdir old && git archive REV | tar -x -C old
#   on the GPU:      bash bench/train_ab.sh old [ROUNDS]      (.deps carried)
#
# Prints one line per round: which code, its ms/step. Logs under $OUT.
set -u
OUT=${OUT:-/tmp/out}
old=${1:?usage: bench/train_ab.sh OLD_TREE [ROUNDS]}
rounds=${2:-3}
mkdir -p "$OUT"
bash bench/torch_gpu.sh none > "$OUT/ab-build-new.log" 2>&1; echo "new build rc=$?"
rm -rf /tmp/pkg_new && cp -r /tmp/cgtree_pkg /tmp/pkg_new && rm -rf /tmp/build-torch
(cd "$old" && ln -sfn "$OLDPWD/.deps" .deps && bash bench/torch_gpu.sh none) > "$OUT/ab-build-old.log" 2>&1
echo "old build rc=$?"
rm -rf /tmp/pkg_old && cp -r /tmp/cgtree_pkg /tmp/pkg_old && rm -rf /tmp/build-torch
. bench/gpu_env.sh
for i in $(seq "$rounds"); do
  for v in old new ro; do
    if [ $v = ro ]; then pkg=/tmp/pkg_new; modes=reduce-overhead; else pkg=/tmp/pkg_$v; modes=cgtree; fi
    PYTHONPATH=$pkg:$PYTHONPATH timeout 100 python3 bench/torch_train.py --models mlp --rounds 1 --modes $modes \
      --optimizer compiled-none --out "$OUT/ab.jsonl" > "$OUT/ab-$v-$i.log" 2>&1
    echo "$v $i rc=$? $(grep ROUND "$OUT/ab-$v-$i.log")"
  done
done
