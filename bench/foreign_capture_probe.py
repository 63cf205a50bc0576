"""What one thread's CUDA calls do to a capture another thread has open.

torch.cuda.graph captures in CUDA's global mode by default: while it is
open, "potentially unsafe" calls from any other thread that has not
switched itself to relaxed mode are refused, and some calls (synchronising
the whole device, for one) conflict with any open capture. cgtree makes
such calls on its own: it frees an exited thread's tree at the next segment
call, and its allocator synchronises the device and trims the driver's pool
before it retries an allocation that failed. This probe finds out, call by
call, which of them leave another thread's capture whole:

  thread B: with torch.cuda.graph(g): y = x * 2; <wait for A>; z = y + 1
            then replays g and checks z
  thread A: one operation (below) while B's capture is open

Each operation runs in a process of its own (a broken capture must not
leak into the next), the raw CUDA calls through cuda-python, the
allocators' through PyTorch and cgtree. One JSON line per operation: what
the operation returned or raised, and what became of B's capture ("ok",
"WRONG" when its replay gave other numbers, or its error).

    python3 bench/foreign_capture_probe.py              # every operation
    python3 bench/foreign_capture_probe.py --op device_sync
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import threading

# Each call in the caller's mode (global, as every thread starts) and, with _relaxed, in relaxed mode.
CALLS = ["stream_sync", "stream_query", "event_query", "event_sync", "event_record", "capture_info", "device_sync",
         "free", "malloc", "pool_trim", "pool_attribute", "malloc_free_async", "legacy_malloc_free_async",
         "graph_launch", "graph_exec_destroy", "stream_destroy", "event_destroy"]
RAW = ["none"] + [c + m for c in CALLS for m in ("", "_relaxed", "_thread_local")]
NATIVE = ["torch_empty_cache", "torch_alloc_new", "torch_oom", "torch_ro_replay"]
CGTREE = ["cgtree_replay", "cgtree_alloc_miss", "cgtree_alloc_new", "cgtree_empty_cache_no_orphan",
          "cgtree_empty_cache", "cgtree_segment_call_closes_orphan", "cgtree_oom"]


def rt():
    try:
        from cuda.bindings import runtime
    except ImportError:
        from cuda import cudart as runtime
    return runtime


def ok(err):
    return str(err).split(".")[-1]


def in_mode(fn, mode="Relaxed"):
    """Runs fn with this thread in the capture mode named (Relaxed, ThreadLocal); fn's result."""
    r = rt()
    err, old = r.cudaThreadExchangeStreamCaptureMode(getattr(r.cudaStreamCaptureMode, "cudaStreamCaptureMode" + mode))
    try:
        return fn()
    finally:
        r.cudaThreadExchangeStreamCaptureMode(old)


def raw_op(op):
    """Sets op up (before B's capture) and returns the call to make during it."""
    r = rt()
    err, s = r.cudaStreamCreateWithFlags(r.cudaStreamNonBlocking)
    err, e = r.cudaEventCreate()
    r.cudaEventRecord(e, s)
    err, p = r.cudaMalloc(1 << 20)
    err, pool = r.cudaDeviceGetDefaultMemPool(0)
    err, q = r.cudaMallocAsync(1 << 20, s)
    r.cudaFreeAsync(q, s)
    r.cudaStreamSynchronize(s)
    err, graph = r.cudaGraphCreate(0)
    err, node = r.cudaGraphAddEmptyNode(graph, None, 0)
    err, gexec = r.cudaGraphInstantiate(graph, 0)

    def malloc_free_async(stream):
        err, q = r.cudaMallocAsync(1 << 20, stream)
        return [ok(err), ok(r.cudaFreeAsync(q, stream)[0]), ok(r.cudaStreamSynchronize(stream)[0])]

    calls = {
        "none": lambda: [],
        "stream_sync": lambda: [ok(r.cudaStreamSynchronize(s)[0])],
        "stream_query": lambda: [ok(r.cudaStreamQuery(s)[0])],
        "event_query": lambda: [ok(r.cudaEventQuery(e)[0])],
        "event_sync": lambda: [ok(r.cudaEventSynchronize(e)[0])],
        "event_record": lambda: [ok(r.cudaEventRecord(e, s)[0])],
        "capture_info": lambda: [ok(r.cudaStreamGetCaptureInfo(s)[0])],
        "device_sync": lambda: [ok(r.cudaDeviceSynchronize()[0])],
        "free": lambda: [ok(r.cudaFree(p)[0])],
        "malloc": lambda: [ok(r.cudaMalloc(1 << 20)[0])],
        "pool_trim": lambda: [ok(r.cudaMemPoolTrimTo(pool, 0)[0])],
        "pool_attribute": lambda: [ok(r.cudaMemPoolGetAttribute(
            pool, r.cudaMemPoolAttr.cudaMemPoolAttrReservedMemCurrent)[0])],
        "malloc_free_async": lambda: malloc_free_async(s),
        "legacy_malloc_free_async": lambda: malloc_free_async(0),
        "graph_launch": lambda: [ok(r.cudaGraphLaunch(gexec, s)[0]), ok(r.cudaStreamSynchronize(s)[0])],
        "graph_exec_destroy": lambda: [ok(r.cudaGraphExecDestroy(gexec)[0]), ok(r.cudaGraphDestroy(graph)[0])],
        "stream_destroy": lambda: [ok(r.cudaStreamDestroy(s)[0])],
        "event_destroy": lambda: [ok(r.cudaEventDestroy(e)[0])],
    }
    for suffix, mode in (("_relaxed", "Relaxed"), ("_thread_local", "ThreadLocal")):
        if op.endswith(suffix):
            plain = calls[op[:-len(suffix)]]
            return lambda: in_mode(plain, mode)
    return calls[op]


def cgtree_op(op, torch, ct):
    """Sets up cgtree (compiled model warm, an orphaned tree where op needs one)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
    from foreign_capture_program import orphan_a_threads_tree, warm_compiled_model  # the GPU test's program

    cg, x, want = warm_compiled_model()
    if op in ("cgtree_empty_cache", "cgtree_segment_call_closes_orphan"):
        orphan_a_threads_tree(cg, x)
        before = ct.stats()["trees_freed"]

    def replay():  # compared after the capture: a host read (.item()) synchronises, which breaks any capture
        with torch.no_grad():
            y = cg(x).clone()
        return [lambda: "right" if torch.allclose(y, want, rtol=1e-3, atol=1e-3) else "WRONG"]

    def freed():
        return ["trees freed %d" % (ct.stats()["trees_freed"] - before)]

    calls = {
        "cgtree_replay": replay,
        "cgtree_alloc_miss": lambda: [str(tuple(torch.empty(12345, dtype=torch.uint8, device="cuda").shape))],
        "cgtree_alloc_new": lambda: [str(tuple(torch.empty(3 << 28, dtype=torch.uint8, device="cuda").shape))],
        "cgtree_empty_cache_no_orphan": lambda: (ct.empty_cache(), ["capture allocations %d" % ct.memory_stats()[
            "capture_allocations"]])[1],
        "cgtree_empty_cache": lambda: (ct.empty_cache(), freed())[1],
        "cgtree_segment_call_closes_orphan": lambda: replay() + freed(),
        "cgtree_oom": lambda: [str(tuple(torch.empty(1 << 40, dtype=torch.uint8, device="cuda").shape))],
    }
    return calls[op]


def native_op(op, torch):
    keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    del keep  # a cached block for empty_cache to free
    if op == "torch_ro_replay":
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).cuda()
        model.eval()
        ro = torch.compile(model, mode="reduce-overhead")
        x = torch.randn(64, 256, device="cuda")
        with torch.no_grad():
            want = model(x)
            for _ in range(4):
                torch.allclose(ro(x), want, rtol=1e-3, atol=1e-3)

        def replay():
            with torch.no_grad():
                y = ro(x).clone()
            return [lambda: "right" if torch.allclose(y, want, rtol=1e-3, atol=1e-3) else "WRONG"]
        return replay
    calls = {
        "torch_empty_cache": lambda: (torch.cuda.empty_cache(), ["returned"])[1],
        "torch_alloc_new": lambda: [str(tuple(torch.empty(3 << 28, dtype=torch.uint8, device="cuda").shape))],
        "torch_oom": lambda: [str(tuple(torch.empty(1 << 40, dtype=torch.uint8, device="cuda").shape))],
    }
    return calls[op]


def one(op):
    ct = None
    if op in CGTREE:
        import cgtree.torch as ct
    import torch
    torch.cuda.init()
    if op in RAW:
        call = raw_op(op)
    elif op in NATIVE:
        call = native_op(op, torch)
    else:
        call = cgtree_op(op, torch, ct)
    x = torch.ones(1 << 16, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    ready, go_on = threading.Event(), threading.Event()
    out = {"op": op}

    def capture():
        try:
            with torch.cuda.graph(g):
                y = x * 2
                ready.set()
                go_on.wait(120)
                z = y + 1
            for _ in range(2):
                g.replay()
            torch.cuda.synchronize()
            out["capture"] = "ok" if bool((z == 3).all()) else "WRONG"
        except Exception as e:  # noqa: BLE001 (what broke is the finding)
            ready.set()
            out["capture"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:160])

    t = threading.Thread(target=capture)
    t.start()
    ready.wait(120)
    try:
        out["result"] = call()
    except Exception as e:  # noqa: BLE001
        out["result"] = ["%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:160])]
    go_on.set()
    t.join()
    out["result"] = [f() if callable(f) else f for f in out["result"]]  # checks that read the device: after
    try:
        torch.cuda.synchronize()
        out["after"] = "ok"
    except Exception as e:  # noqa: BLE001
        out["after"] = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:160])
    print(json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", help="one operation (default: every one, a process each)")
    ap.add_argument("--ops", help="a comma-separated list of operations (default: every one)")
    ap.add_argument("--jobs", type=int, default=4, help="processes at once (default 4)")
    ap.add_argument("--out", help="append the JSON lines here too")
    a = ap.parse_args()
    if a.op:
        one(a.op)
        return
    ops = a.ops.split(",") if a.ops else RAW + NATIVE + CGTREE

    def run(op):  # a process each, a few at once: a capture is a process's own
        p = subprocess.run([sys.executable, __file__, "--op", op], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ))
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        return lines[-1] if lines else json.dumps({"op": op, "rc": p.returncode, "stderr": p.stderr[-400:]})
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for line in pool.map(run, ops):
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
