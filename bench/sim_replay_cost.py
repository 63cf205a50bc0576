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
    a = ap.parse_args()
    T.X.set_output_mover(T.fake_move_out)
    tree = T.X.Tree(0, backend="sim")
    seg = T.weighted_segment(tree, a.static, "w")
    x = T.FakeTensor(4)
    ws = [T.FakeTensor(4) for _ in range(a.static)]
    for _ in range(5):
        T.call(seg, x, *ws)
    replays0 = tree.stats()["replays"]
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter_ns()
        for _ in range(a.calls):
            T.Generation.generation += 1
            seg(x, *ws)
        times.append((time.perf_counter_ns() - t0) / a.calls)
    replays = tree.stats()["replays"] - replays0
    assert replays == a.reps * a.calls, "every timed call should have replayed (%d)" % replays
    print("sim_replay_cost: %d STATIC inputs, ns per replayed call, median %.0f, fastest %.0f (%d x %d calls; %s, "
          "Python %s)" % (a.static, statistics.median(times), min(times), a.reps, a.calls,
                          platform.processor() or platform.machine(), platform.python_version()))


if __name__ == "__main__":
    main()
