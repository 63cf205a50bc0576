#!/usr/bin/env python3
"""What a random graph's launch costs on the host beside the graph itself
(python/cgtree/torch/_rng.py): the pieces of the prelaunch function, each
timed alone over many calls on the current GPU.

    python3 bench/rng_prelaunch_cost.py

Prints µs per call of: an empty torch.cuda.CUDAGraph's replay (no random
offsets: its launch alone); the replay of one that recorded a draw (the
generator's two writes, its advance and the launch); entering and leaving
torch.cuda.stream(s); Stream.wait_stream (one event); and cgtree's whole
prelaunch call.
"""
import time

import cgtree.torch  # noqa: F401  (installs the allocator first)
import torch

from cgtree.torch import _rng


def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / n * 1e6


def main():
    side = _rng.side_stream(0)
    s = torch.cuda.Stream()
    empty = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(s):
        empty.capture_begin(capture_error_mode="relaxed")
        empty.capture_end()
    drawn = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        x = torch.zeros(4096, device="cuda")
        drawn.capture_begin(capture_error_mode="relaxed")
        y = torch.rand_like(x)
        drawn.capture_end()
    draws = _rng.RandomDraws(0, lambda: s)
    draws.brackets[0] = drawn
    rows = [
        ("empty graph replay (launch only)", lambda: empty.replay()),
        ("replay of a graph that draws (two writes, advance, launch)", lambda: drawn.replay()),
        ("with torch.cuda.stream(s): pass", lambda: torch.cuda.stream(s).__enter__() or None),
        ("Stream.wait_stream (event record + wait)", lambda: side.wait_stream(s)),
        ("cgtree's prelaunch on the tree's stream", lambda: draws.prelaunch(0, False)),
        ("cgtree's prelaunch on the caller's (legacy) stream", lambda: draws.prelaunch(0, True)),
    ]
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    for name, fn in rows:
        if name.startswith("with"):
            def fn(s=s):
                with torch.cuda.stream(s):
                    pass
        print("%-62s %7.2f us" % (name, per_call(fn)))
    del y


if __name__ == "__main__":
    main()
