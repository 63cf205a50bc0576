#!/usr/bin/env python3
"""python_overhead.py — what a replayed Tree.run costs from Python, beyond the C cgt_run.

For each configuration, one tree (the simulator by default; --backend cuda on a
GPU) runs the same program two ways:

  Python:  steps x (t.step_begin(); runs_per_step x t.run(seg, args))
  C:       the same loop inside the extension (Tree._c_run_steps): cgt_step_begin and
           cgt_run of the same tree, the same segment and the same arguments, which
           the C side converts to cgt_arg once, before timing

After warmup and recording every timed run is a replay (checked: the replay count
grows by exactly steps x runs_per_step). Both loops replay the same recorded
nodes, so libcgtree's work and the simulated kernels are identical; the
difference per run is the binding: the method call, reading the arguments,
building the returned tuple of Values and freeing it (the Python loop drops it,
as a caller that keeps no result does), plus the Python loop's own iteration.
In the chained configuration the Python side also builds the args tuple (v, s)
and indexes the result, which any Python caller of a chain does. Both sides
time each step and drain the stream between steps, outside the timed part (on
CUDA this keeps the launch queue from filling; figures are host time). On CUDA
the segments enqueue no kernel (an output allocation only: the graph launch
is the replay's device work), and the Python-kernel configuration is skipped. The figure is
min(Python) - min(C) over `reps` alternating repetitions of ns / run: the minimum
is the repetition least disturbed by other processes (timeit's rule), which on a
shared machine matters more than anything measured here; the medians are
printed too.

Target (issue 11): <= 1.5 us per run. `--max-us X` exits 1 if a configuration's
overhead exceeds X.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

import cgtree


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def empty_kernel():
    pass


def make_segment(t, n_inputs, kernel):
    def launch(l):
        out = l.alloc(256)
        if kernel:
            cgtree.sim_launch(l.stream, empty_kernel)
        l.set_output(0, out, 256)

    return t.segment("measured", launch, n_inputs, 1)


def producer(t):
    def launch(l):
        out = l.alloc(256)
        l.set_output(0, out, 256)

    return t.segment("producer", launch, 0, 1)


def py_loop(t, seg, args, steps, k):
    run, step_begin, sync, r, clock = t.run, t.step_begin, t.sync, range(k), time.perf_counter_ns
    ns = 0
    for _ in range(steps):
        t0 = clock()
        step_begin()
        for _ in r:
            run(seg, args)
        ns += clock() - t0
        sync()
    return ns


def py_chain_loop(t, first, seg, s, steps, k):
    run, step_begin, sync, r, clock = t.run, t.step_begin, t.sync, range(k), time.perf_counter_ns
    ns = 0
    for _ in range(steps):
        t0 = clock()
        step_begin()
        v = run(first, ())[0]
        for _ in r:
            v = run(seg, (v, s))[0]
        ns += clock() - t0
        sync()
    return ns


CONFIGS = [
    ("2S", "2 STATIC, empty segment", 2, False, None),
    ("1S+1D", "1 STATIC + 1 DYNAMIC (placeholder copy)", 2, False, "dynamic"),
    ("1V+1S", "chain: 1 VALUE (previous output) + 1 STATIC", 2, False, "chain"),
    ("2S+kernel", "2 STATIC, one Python simulator kernel (runs on both sides)", 2, True, None),
]


def caller_memory(backend):
    """Two 256-byte caller buffers on the tree's device (numpy on the simulator; torch or cupy on CUDA)."""
    if backend == "sim":
        return np.ones(64, np.float32), np.ones(64, np.float32)
    try:
        import torch
        return torch.ones(64, device="cuda"), torch.ones(64, device="cuda")
    except ImportError:
        import cupy
        return cupy.ones(64, cupy.float32), cupy.ones(64, cupy.float32)


def measure(config, backend, steps, k, reps):
    name, what, n_inputs, kernel, special = config
    t = cgtree.Tree(backend=backend)
    seg = make_segment(t, n_inputs, kernel)
    first = producer(t)
    x, y = caller_memory(backend)
    a = cgtree.static(x)
    b = cgtree.dynamic(y) if special == "dynamic" else cgtree.static(y)
    if special == "chain":
        def python():
            return py_chain_loop(t, first, seg, a, steps, k)

        def c():
            return t._c_run_steps(seg, (a, a), steps, k, chain=0, first=first)
    else:
        args = (a, b)

        def python():
            return py_loop(t, seg, args, steps, k)

        def c():
            return t._c_run_steps(seg, args, steps, k)
    python()
    python()  # warmup, recording, and a first replayed pass
    c()
    py_ns, c_ns = [], []
    for _ in range(reps):
        before = t.stats()["replays"]
        py_ns.append(python() / (steps * k))
        c_ns.append(c() / (steps * k))
        per_rep = steps * k + (steps if special == "chain" else 0)
        replays = t.stats()["replays"] - before
        if replays != 2 * per_rep:
            sys.exit(f"python_overhead: {name}: {replays} replays in a repetition, expected {2 * per_rep}")
    return name, what, min(py_ns), min(c_ns), statistics.median(py_ns), statistics.median(c_ns)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["sim", "cuda"], default="sim")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--runs-per-step", type=int, default=100)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--max-us", type=float, default=None, help="exit 1 if an overhead exceeds this")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.reps = 10, 3
    where = "the simulator" if a.backend == "sim" else "CUDA (host time)"
    print(f"cgtree {cgtree.__version__} python_overhead on {where}; {cpu_name()} ({os.cpu_count()} cores), "
          f"Python {platform.python_version()}, numpy {np.__version__}")
    print(f"{a.steps} steps x {a.runs_per_step} replayed runs per repetition, {a.reps} alternating repetitions; "
          f"ns per run")
    print(f"{'config':<11} {'python':>7} {'C':>7} {'overhead':>9}   {'(medians:':>9} {'python':>7} {'C':>7})  what")
    worst = 0.0
    for config in CONFIGS:
        if config[3] and a.backend != "sim":
            continue  # Python kernels exist on the simulator only
        name, what, py, c, py_med, c_med = measure(config, a.backend, a.steps, a.runs_per_step, a.reps)
        diff = py - c
        worst = max(worst, diff)
        print(f"{name:<11} {py:7.0f} {c:7.0f} {diff:9.0f}   {'':>9} {py_med:7.0f} {c_med:7.0f}   {what}")
    print(f"worst overhead: {worst / 1000:.3f} us per run (target <= 1.5 us)")
    if a.max_us is not None and worst > a.max_us * 1000:
        print(f"FAIL: above {a.max_us} us")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
