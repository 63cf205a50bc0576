#!/usr/bin/env python3
"""How many bytes outside the pool a torch.compile(backend="cgtree") program
holds after its warm-up calls that it did not hold before the first call,
and whether that changes from step to step (the early_exit example of
bench/torch_compare.py). Needs a GPU and the package built with CUDA (e.g.
PYTHONPATH=/tmp/cgtree_pkg after bench/torch_gpu.sh).

    python3 bench/torch_eager_residue.py
"""
import os
import sys

import cgtree.torch as ct  # noqa: F401 - first: installs the allocator
import torch
from cgtree import _torch_ext as X

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_compare as tc  # noqa: E402


def _describe(o):
    if isinstance(o, dict):
        keys = [k for k in list(o)[:6] if isinstance(k, str)]
        return "dict(%s)" % ",".join(keys)
    if isinstance(o, (list, tuple)):
        return "%s[%d]" % (type(o).__name__, len(o))
    name = getattr(o, "__qualname__", None) or getattr(o, "__name__", None)
    return "%s%s" % (type(o).__name__, " " + name if isinstance(name, str) else "")


def holders(addr):
    """Who refers to the real tensors over a block: two levels of
    gc.get_referrers, described by type (a debugging aid)."""
    import gc
    out = []
    for t in gc.get_objects():
        try:
            if not (type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_cuda and t.data_ptr() == addr):
                continue
        except Exception:  # noqa: BLE001 - fake and meta tensors
            continue
        for r in gc.get_referrers(t):
            if r is out:
                continue
            up = [_describe(q) for q in gc.get_referrers(r)[:4] if q is not out]
            out.append("%s <- %s" % (_describe(r), ", ".join(up)))
    return "referrers: " + ("; ".join(out[:4]) if out else "no Python tensor object (a C++ reference)")


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    fn, step, _ = tc.make_early_exit(torch, dev)
    torch.cuda.synchronize()
    base = X.alloc_figures()["eager_in_use"]
    start = X.eager_serial()
    from cgtree.torch._backend import _segments
    cfn = torch.compile(fn, backend="cgtree")
    marks = []  # (serial at the start of step i, the graphs first called in it)
    with torch.no_grad():
        for i in range(24):
            before = {id(sg): sg.info["calls"] for sg in _segments}
            serial = X.eager_serial()
            step(cfn, i)
            marks.append((i, serial, [sg.info["name"] for sg in _segments if before.get(id(sg), 0) == 0]))
        torch.cuda.synchronize()
        print("after warm-up: %d bytes more outside the pool" % (X.alloc_figures()["eager_in_use"] - base))
        held = sorted(X.eager_held(start), key=lambda x: x[1])
        for size, serial, addr in held:
            at = [m for m in marks if m[1] <= serial]
            where = "step %d (graphs first called in it: %s)" % (at[-1][0], at[-1][2]) if at else "compile"
            print("  held: %d bytes, allocated in %s; %s" % (size, where, holders(addr)))
        for i in range(24, 28):
            out = step(cfn, i)
            torch.cuda.synchronize()
            f = X.alloc_figures()
            print("step %d: %d bytes more outside the pool, %d in the pool" % (i, f["eager_in_use"] - base,
                                                                                 f["pool_in_use"]))
            del out


if __name__ == "__main__":
    main()
