"""Out-of-memory scenarios python/tests/test_torch_oom.py runs, each in a
process of its own: one fills the device, and a failure could end the
process's CUDA context. Each prints one line of JSON, what it saw:

    python3 python/tests/oom_program.py SCENARIO
"""
import json
import sys

import torch

import cgtree.torch as ct

MiB = 1 << 20


def fill_device(leave):
    """Device memory taken outside PyTorch and cgtree (cudaMalloc, through
    CuPy) until `leave` bytes stay free; a function that gives it back."""
    import cupy
    free, _ = cupy.cuda.runtime.memGetInfo()
    p = cupy.cuda.runtime.malloc(free - leave)
    return lambda: cupy.cuda.runtime.free(p)


def raised(fn):
    """(type name, message) of what fn() raised, or None."""
    try:
        fn()
    except Exception as e:
        return type(e).__name__, str(e)
    return None


def eager():
    """An eager allocation larger than the device."""
    err = raised(lambda: torch.empty(1 << 46, dtype=torch.uint8, device="cuda"))
    y = torch.ones(4, device="cuda") * 2  # CUDA still works
    return {"raised": err, "after": y.sum().item(), "num_ooms": ct.memory_stats()["num_ooms"]}


class CountsAndDoubles(torch.nn.Module):
    """x * 2 + 1 of a 256 MiB buffer, counting its calls in another. Its
    buffers are static inputs (no placeholder in the pool), and it writes
    one: its first call runs plainly only, and the second warms it up in
    the pool, whose only allocation is the output, inside the launch."""

    def __init__(self):
        super().__init__()
        self.register_buffer("x", torch.ones(1 << 26, device="cuda"))
        self.register_buffer("calls", torch.zeros(1, device="cuda"))

    def forward(self):
        self.calls.add_(1)
        return self.x * 2 + 1


def graph_state():
    from cgtree.torch._backend import _segments
    s = ct.stats()
    return {"recordings": s["recordings"], "replays": s["replays"], "graphs_plain": s["graphs_plain"],
            "out_of_memory": sum(g.info["out_of_memory"] for g in _segments),
            "pool_alloc_retries": ct.memory_stats()["pool_alloc_retries"]}


def compiled(empty_first):
    """A compiled graph with a 256 MiB output. Its first call runs plainly;
    then the device fills up until 128 MiB stay free, and the second call
    warms the graph up in the pool, which must grow by 256 MiB. Before the
    device fills, eager code frees 240 MiB in blocks of 8 MiB, which the
    front cache keeps (the driver sees them in use, so only cgtree can give
    them back), as PyTorch's caching allocator would keep them for reuse.
    empty_first: the eager caches are emptied before the device fills, so
    nothing can make room (a true out of memory)."""
    f = torch.compile(CountsAndDoubles(), backend="cgtree")
    y = f()
    first = y[:2].tolist()
    del y
    ct.empty_cache()  # what the driver's pool kept goes back to the device
    blocks = [torch.empty(8 * MiB, dtype=torch.uint8, device="cuda") for _ in range(30)]
    del blocks
    torch.cuda.synchronize()
    if empty_first:
        ct.empty_cache()
    front = ct.memory_stats()["front_cache_bytes"]
    give_back = fill_device(128 * MiB)
    err = raised(f)
    when_full = graph_state()
    when_full["front_cache_mib_before"] = front >> 20
    when_full["front_cache_mib"] = ct.memory_stats()["front_cache_bytes"] >> 20
    give_back()
    results = []
    for _ in range(4):
        y = f()
        results.append([y[:2].tolist(), y[-1].item()])
        del y
    return {"first": first, "raised": err, "when_full": when_full, "results": results, "end": graph_state()}


SCENARIOS = {
    "eager": eager,
    "compiled_true_oom": lambda: compiled(True),
    "compiled_cache_holds_room": lambda: compiled(False),
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
