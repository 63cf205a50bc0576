"""What test_torch_trust.py's test of another thread's capture runs, in a
process of its own: a broken capture leaves PyTorch's default generator
believing it captures, and every later random op of the process fails.

Thread B captures a CUDA graph with torch.cuda.graph (global mode, PyTorch's
default) and waits in the middle of its capture; meanwhile the main thread
replays a cgtree-compiled model (its first call closes an exited thread's
tree), allocates and frees sizes the front cache never held, and empties
cgtree's cache. Prints one line of JSON, what it saw:

    python3 python/tests/foreign_capture_program.py
"""
import json
import threading
import time

import cgtree.torch as ct  # first: cgtree's allocator serves the process
import torch

DEV = "cuda"


def warm_compiled_model():
    """A small model compiled with cgtree, past its warm-up and recording:
    (the compiled model, its input, eager's output)."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(DEV)
    cg = torch.compile(model.eval(), backend="cgtree")
    x = torch.randn(64, 256, device=DEV)
    with torch.no_grad():
        want = model(x)
        for _ in range(4):  # warm-up, recording, replays; the comparison's temporaries front-cached
            torch.testing.assert_close(cg(x), want)
    return cg, x, want


def orphan_a_threads_tree(cg, x):
    """Runs cg on a thread that then exits; returns that thread's trees,
    once orphaned (once its OS thread is gone): the next compiled call or
    empty_cache() closes them."""
    gone = []

    def request():
        with torch.no_grad():
            for _ in range(4):
                cg(x)
        gone.extend(ct._install.thread_trees())

    t = threading.Thread(target=request)
    t.start()
    t.join()
    deadline = time.monotonic() + 10
    while not all(tr.orphaned for tr in gone) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gone and all(tr.orphaned for tr in gone), "the thread's trees were not orphaned"
    return gone


def main():
    cg, x, want = warm_compiled_model()
    orphan_a_threads_tree(cg, x)
    freed_before = ct.stats()["trees_freed"]
    a = torch.ones(1 << 16, device=DEV)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    opened, done = threading.Event(), threading.Event()
    captured = {}

    def capture():
        try:
            with torch.cuda.graph(g):  # capture_error_mode "global", PyTorch's default
                b = a * 2
                opened.set()
                assert done.wait(120)
                captured["c"] = b + 1
        except Exception as e:  # noqa: BLE001 (reported)
            captured["error"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0])
            opened.set()

    b_thread = threading.Thread(target=capture)
    b_thread.start()
    assert opened.wait(120)
    try:
        with torch.no_grad():  # each call begins a step: a copy of each output is kept, read after the capture
            got = [cg(x).clone() for _ in range(2)]
        closed = ct.stats()["trees_freed"] - freed_before
        small = torch.empty(12345, dtype=torch.uint8, device=DEV)  # a size class no block had
        large = torch.empty(40 << 20, dtype=torch.uint8, device=DEV)  # past the front cache: freed to the driver
        del small, large
        ct.empty_cache()
    finally:
        done.set()
        b_thread.join()
    out = {"capture_error": captured.get("error"), "trees_closed_at_the_call": closed}
    if "error" not in captured:
        g.replay()
        torch.cuda.synchronize()
        out["capture_replays_right"] = bool(torch.equal(captured["c"], torch.full_like(a, 3.0)))
    else:
        out["capture_replays_right"] = False
    out["replays_right"] = all(bool(torch.allclose(y, want, rtol=1e-4, atol=1e-5)) for y in got)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
