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
    return {"raised": err, "after": y.sum().item(), "num_ooms": ct.memory_stats()["num_ooms"],
            "torch_class": ct.stats()["torch_out_of_memory_error"]}


def counts_and_doubles(x, calls):
    """x * 2 + 1, counting its calls. It writes an input: its first call
    runs plainly only, and the second warms it up in the pool."""
    calls.add_(1)
    return x * 2 + 1


class CountsAndDoubles(torch.nn.Module):
    """counts_and_doubles of two buffers: static inputs, so the warmup's
    only pool allocation is the output, inside the launch (DYNAMIC inputs
    first get placeholders in the pool, before it)."""

    def __init__(self, x, calls):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("calls", calls)

    def forward(self):
        return counts_and_doubles(self.x, self.calls)


def graph_state():
    from cgtree.torch._backend import _segments
    s = ct.stats()
    return {"recordings": s["recordings"], "replays": s["replays"], "graphs_plain": s["graphs_plain"],
            "out_of_memory": sum(g.info["out_of_memory"] for g in _segments),
            "pool_alloc_retries": ct.memory_stats()["pool_alloc_retries"]}


def compiled(empty_first, static):
    """A compiled graph of a 64 MiB input and output. Its first call runs
    plainly; then the device fills up until 32 MiB stay free, and the second
    call warms the graph up in the pool, which must grow by 64 MiB for the
    output (static: the module's buffers) or by 64 MiB for the input's
    placeholder and 64 MiB for the output (a function of two tensors).
    Before the device fills, eager code frees 240 MiB in blocks of 8 MiB, which the
    front cache keeps (the driver sees them in use, so only cgtree can give
    them back), as PyTorch's caching allocator would keep them for reuse.
    empty_first: the eager caches are emptied before the device fills, so
    nothing can make room (a true out of memory)."""
    x, calls = torch.ones(1 << 24, device="cuda"), torch.zeros(1, device="cuda")
    if static:
        f = torch.compile(CountsAndDoubles(x, calls), backend="cgtree")
    else:
        fn = torch.compile(counts_and_doubles, backend="cgtree")

        def f():
            return fn(x, calls)
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
    give_back = fill_device(32 * MiB)
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
    "compiled_true_oom": lambda: compiled(True, True),
    "compiled_cache_holds_room": lambda: compiled(False, True),
    "compiled_cache_holds_room_for_a_placeholder": lambda: compiled(False, False),
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
