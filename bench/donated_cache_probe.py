#!/usr/bin/env python3
"""Does a backward compiled with donated buffers come back, from
Inductor's caches, to a program that retains its graph?

    python3 bench/donated_cache_probe.py [--backends inductor,cgtree]

AOTAutograd's donated buffers (torch._functorch.config.donated_buffer, on
by default) let Inductor's backward reuse a saved activation's memory once
it has read it, so a backward compiled that way must run once: PyTorch
checks at each backward that retains or creates a graph, and raises. The
check reads the flag as it is at the backward and the graph's donated
indices as AOTAutograd saw them; the compiled code comes from Inductor's
FX graph cache, whose key (PyTorch 2.11) has neither. So the question is
whether a program can get, from that cache, a backward that reuses the
activations a second backward reads, and no error: silently wrong
gradients. Each scenario is a sequence of phases, each phase a process of
its own (or one process, where the scenario says so), sharing one fresh
cache directory (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) made for the
scenario; the scenarios run at once. A phase compiles an MLP (the same
shapes in every phase: python/tests/donation_phase.py, which the CPU test
python/tests/test_torch_cache_hunt_sim.py runs too) and trains three steps:

- plain: the flag on, `loss.backward()` (a backward compiled with donation);
- retain-off: the flag off, `loss.backward(retain_graph=True)` then
  `loss.backward()`: the second backward's gradients must be twice the first;
- retain-on: the same with the flag on, the default (the first backward
  retains, so AOTAutograd compiles it lazily without donation).

The table says, per backend and scenario, what the last phase gave: "2x"
(right), "raised" (PyTorch's error) or "WRONG" with the largest
difference from twice the first gradients.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))

SCENARIOS = {
    "retain-off alone": [["retain-off"]],
    "plain, then retain-off (two processes)": [["plain"], ["retain-off"]],
    "plain, then retain-on (two processes)": [["plain"], ["retain-on"]],
    "plain, then retain-off (one process, reset between)": [["plain", "retain-off"]],
}


def phase(backend, kind):
    """One phase in this process (python/tests/donation_phase.py, on the GPU): its result dict."""
    from donation_phase import phase as run_phase

    worst = run_phase(backend, kind, device="cuda", steps=3)
    if kind == "plain" or worst == "raised":
        return {"kind": kind, "result": "ran" if kind == "plain" else "raised"}
    return {"kind": kind, "result": "2x" if worst == 0 else "WRONG", "max_diff": worst}


def child(backend, kinds):
    if backend == "cgtree":
        __import__("cgtree.torch")  # its allocator, before CUDA starts
    for k in kinds:
        print("RESULT " + json.dumps(phase(backend, k)), flush=True)


def run_scenario(backend, phases):
    """Runs the phases with one fresh cache directory; the last result."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(d, "triton"))
        last = None
        for kinds in phases:
            p = subprocess.run([sys.executable, __file__, "--child", backend] + kinds, env=env,
                               capture_output=True, text=True, timeout=600)
            results = [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
            if len(results) != len(kinds):
                return {"result": "process failed rc=%d: %s" % (p.returncode, p.stderr.strip().splitlines()[-1:])}
            last = results[-1]
        return last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="inductor,cgtree")
    ap.add_argument("--child", nargs="+")
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1:])
    runs = [(b, name) for b in a.backends.split(",") for name in SCENARIOS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(runs)) as pool:  # each its own caches
        results = list(pool.map(lambda r: run_scenario(r[0], SCENARIOS[r[1]]), runs))
    print("| backend | scenario | last phase | max diff from 2x |")
    print("| --- | --- | --- | ---: |")
    for (backend, name), r in zip(runs, results):
        print("| %s | %s | %s | %s |" % (backend, name, r["result"], r.get("max_diff", "")))


if __name__ == "__main__":
    main()
