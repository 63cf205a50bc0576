#!/usr/bin/env python3
"""sim_replay_cost.py — ns per replayed call of a cgtree.torch segment on
the simulator: the hot path's host cost, with no GPU.

A segment of one DYNAMIC input and --static STATIC inputs (the weights),
built with the simulator tests' fake tensors (python/tests/
test_torch_ext_sim.py), is called until it replays, then --calls replayed
calls are timed, --reps times; prints the median and the fastest. The
fake tensors are Python objects, so most of the figure is Python's; it
compares two builds of the extension on one machine (a refactor of
segment.c, say), not cgtree with anything else.

    PYTHONPATH=<a package with the built _torch_ext> python3 bench/sim_replay_cost.py [--static 16]

--shapes N: the segment takes an int as well (a dynamic shape's size, which
keys the variant), and is called with N other sizes first, twice each,
under a recording budget of 4 graphs, before the timed replays of the last
size: a replay's cost after many shapes came and went (the segment keeps
one output template per size, found through a hash index: a linear scan
of them cost a replay 10x at 20,000 shapes). --shapes 0 times the same
segment with one size.
"""
import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
import test_torch_ext_sim as T  # noqa: E402  (the fake tensors and segments of the simulator tests)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--static", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--shapes", type=int, default=None)
    a = ap.parse_args()
    T.X.set_output_mover(T.fake_move_out)
    if a.shapes is not None:
        return shapes(a)
    tree = T.X.Tree(0, backend="sim")
    seg = T.weighted_segment(tree, a.static, "w")
    x = T.FakeTensor(4)
    ws = [T.FakeTensor(4) for _ in range(a.static)]
    report("%d STATIC inputs" % a.static, timed_replays(a, tree, seg, x, *ws), a)


def timed_replays(a, tree, seg, *args):
    """ns per call of a.reps rounds of a.calls calls of seg(*args), after 5
    untimed calls; every timed call must have replayed."""
    for _ in range(5):
        T.call(seg, *args)
    replays0 = tree.stats()["replays"]
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter_ns()
        for _ in range(a.calls):
            T.Generation.generation += 1
            seg(*args)
        times.append((time.perf_counter_ns() - t0) / a.calls)
    replays = tree.stats()["replays"] - replays0
    assert replays == a.reps * a.calls, "every timed call should have replayed (%d)" % replays
    return times


def report(what, times, a):
    print("sim_replay_cost: %s, ns per replayed call, median %.0f, fastest %.0f (%d x %d calls; %s, Python %s)" % (
        what, statistics.median(times), min(times), a.reps, a.calls, platform.processor() or platform.machine(),
        platform.python_version()))


def shapes(a):
    tree = T.X.Tree(0, backend="sim", max_graphs=4)
    g = T.Graph(tree, 1.0, 0.0)

    def scaled(x, k):
        (y,) = g(x)
        T.X.sim_launch(tree.stream, T.k_affine, y.ptr, y.ptr, y.n, float(k), 0.0)
        return (y,)

    seg = T.segment(tree, scaled, kinds=(T.ARG_TENSOR, T.ARG_INT), spans=(16, 0), name="shapes")
    x = T.FakeTensor(4)
    for k in range(2, a.shapes + 2):
        T.call(seg, x, k)
        T.call(seg, x, k)
    last = a.shapes + 2
    report("after %d other shapes" % a.shapes, timed_replays(a, tree, seg, x, last), a)

if __name__ == "__main__":
    main()
