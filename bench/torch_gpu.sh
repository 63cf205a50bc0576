#!/bin/bash
# bench/torch_gpu.sh — on the GPU machine: build cgtree with its Python
# package (CUDA), run the torch backend's pytest cases, then the side-by-side
# benchmark. Logs and results go to $OUT (default /tmp/out).
#
#   bash bench/torch_gpu.sh [tests] [bench] [EXAMPLES]
# meson-python is not needed: the build tree's extensions are copied beside
# the package sources into /tmp/cgtree_pkg, which goes on PYTHONPATH.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
what=${1:-tests,bench}
examples=${2:-branch,early_exit,gpt2}
. bench/gpu_env.sh
B=/tmp/build-torch
if [ ! -f $B/build.ninja ]; then
  meson setup $B -Dcuda=enabled -Dgpu_arch=9.0 -Dpython=enabled -Dtests=false -Dbench=false -Dtools=false \
    --werror > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C $B >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
P=/tmp/cgtree_pkg
rm -rf $P && mkdir -p $P && cp -r python/cgtree $P/ && cp $B/python/*.so $P/cgtree/
export PYTHONPATH=$P${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
python3 -c 'import torch, cgtree._torch_ext; print("torch", torch.__version__, torch.cuda.get_device_name())' 2>&1 | tail -2
if [[ $what == *tests* ]]; then
  python3 -m pytest -q -x -p no:cacheprovider python/tests/test_torch_backend.py python/tests/test_torch_graphs.py \
    > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
fi
if [[ $what == *bench* ]]; then
  python3 bench/torch_compare.py --examples "$examples" --out "$OUT/torch_compare.jsonl" ${BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; sed -n '/^| example/,$p' "$OUT/bench.log"
fi
