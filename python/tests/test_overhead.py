"""A replayed run allocates no Python object beyond the tuple and the Values it returns."""
import gc
import sys
import tracemalloc

import numpy as np

import cgtree

RUNS = 200  # per step; loop indices stay below 256, so the loop itself allocates no int objects


def noop_launch(l):
    src, nbytes = l.input(0)
    out = l.alloc(256)
    l.set_output(0, out, 256)
    l.set_output(1, src, nbytes)  # a view of an input: no allocation


def recorded_tree():
    t = cgtree.Tree(backend="sim")
    seg = t.segment("noop", noop_launch, 2, 2)
    args = (cgtree.static(np.ones(64, np.float32)), cgtree.dynamic(np.ones(64, np.float32)))
    for _ in range(2):  # warmup, then recording
        t.step_begin()
        for _ in range(RUNS):
            t.run(seg, args)
    return t, seg, args


def test_replayed_runs_allocate_only_their_results():
    t, seg, args = recorded_tree()
    kept = [None] * RUNS
    run = t.run
    t.step_begin()
    replays = t.stats()["replays"]
    gc.disable()
    try:
        before = sys.getallocatedblocks()
        for i in range(RUNS):
            kept[i] = run(seg, args)
        after = sys.getallocatedblocks()
    finally:
        gc.enable()
    assert t.stats()["replays"] - replays == RUNS
    # Each run returns a 2-tuple (which may come from CPython's tuple free list) of 2 new Values.
    blocks = after - before
    assert 2 * RUNS <= blocks <= 3 * RUNS, f"{blocks} blocks for {RUNS} runs"
    del kept


def test_a_replayed_run_makes_no_transient_allocation():
    t, seg, args = recorded_tree()
    run = t.run
    t.step_begin()
    tracemalloc.start()
    try:
        for i in range(RUNS):
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            r = run(seg, args)
            current, peak = tracemalloc.get_traced_memory()
            assert peak == current, f"run {i}: a transient allocation of {peak - current} bytes"
            assert current - base <= 2 * 64 + 64, f"run {i}: {current - base} bytes kept"
            del r
    finally:
        tracemalloc.stop()


def test_dropping_the_results_of_replays_leaks_nothing():
    t, seg, args = recorded_tree()
    run = t.run
    t.step_begin()
    for i in range(RUNS // 2):
        run(seg, args)
    gc.disable()
    try:
        before = sys.getallocatedblocks()
        for i in range(RUNS // 2):
            run(seg, args)
        after = sys.getallocatedblocks()
    finally:
        gc.enable()
    assert abs(after - before) <= 2


def test_the_overhead_benchmark_runs_and_checks_that_it_times_replays():
    import os
    import subprocess

    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python_overhead.py")
    r = subprocess.run([sys.executable, script, "--quick"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "worst overhead" in r.stdout and "1V+1S" in r.stdout
