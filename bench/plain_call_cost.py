#!/usr/bin/env python3
"""plain_call_cost.py — what a graph that runs as the plain Inductor graph
pays for being a segment.

A graph cgtree must not record (it restores the generator's state, or it
went plain at run time) is a Segment all the same, plain from the start, so
that its calls mark the tree's steps (python/_torch_ext/seg_plain.c,
seg_call_bypassed). Before, a graph plain by the compile's decision was handed
back to AOTAutograd as Inductor's own callable. This measures, on the CPU
(the simulator's tree; no torch, no GPU), ns per call of:

  direct:   the compiled graph's stand-in, called with one list of its
            arguments as AOTAutograd calls Inductor's callable;
  segment:  the same through a plain Segment of it (the backend's _boxed
            wrapper included), with a new step at every call, as Dynamo's
            generation moves at each call of a compiled model.

The stand-in does nothing, so the difference is the whole cost of the
segment's path; a real graph's plain call (Inductor's wrapper and its
kernel launches) costs tens of microseconds on top of either. Median of
--reps repetitions of --calls calls.

    python3 bench/plain_call_cost.py [--calls 200000] [--reps 7] [--args 4]
"""
import argparse
import platform
import statistics
import time

from cgtree import _torch_ext as X

ARG_TENSOR_STATIC, ARG_INT = 1, 2


class Generation:
    generation = 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--args", type=int, default=4)
    a = ap.parse_args()
    X.init_hot_path(lambda cap: None, lambda device: 0, Generation, object)
    tree = X.Tree(0, backend="sim")

    def compiled(args):  # Inductor's callable takes one list of its arguments
        return ()

    def plain(*args):  # the backend's _boxed wrapper around it
        return compiled(list(args))

    def refuse(*_):
        raise AssertionError("a plain segment launches nothing")

    seg = X.Segment(tree, "plain", plain, refuse, refuse, refuse, refuse, bytes([ARG_INT] * a.args),
                    (0,) * a.args, 0, True, False, plain_reason="bench: plain from the start")
    args = list(range(a.args))

    def direct_loop(n):
        for _ in range(n):
            Generation.generation += 1
            compiled(list(args))

    def segment_loop(n):
        for _ in range(n):
            Generation.generation += 1
            seg(args)

    def empty_loop(n):
        for _ in range(n):
            Generation.generation += 1

    res = {}
    for name, fn in (("empty", empty_loop), ("direct", direct_loop), ("segment", segment_loop)):
        fn(1000)
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter_ns()
            fn(a.calls)
            times.append((time.perf_counter_ns() - t0) / a.calls)
        res[name] = statistics.median(times)
    steps = tree.stats()["step"]
    assert steps >= a.reps * a.calls, "every segment call should have begun a step (%d)" % steps
    assert seg.info["plain_calls"] >= a.reps * a.calls
    print("plain_call_cost: ns per call, %d int arguments, median of %d x %d calls; %s, Python %s"
          % (a.args, a.reps, a.calls, platform.processor() or platform.machine(), platform.python_version()))
    print("| path | ns per call (the loop's own cost taken out) |")
    print("| --- | ---: |")
    for name in ("direct", "segment"):
        print("| %s | %.0f |" % (name, res[name] - res["empty"]))
    print("a plain graph's call costs %.0f ns more as a segment" % (res["segment"] - res["direct"]))


if __name__ == "__main__":
    main()
