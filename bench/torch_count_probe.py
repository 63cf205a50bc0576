#!/usr/bin/env python3
"""Does torch.cuda.memory_allocated count a live output of a CUDA graph replay?

    python3 bench/torch_count_probe.py

The benches compare peak memory as each mode's allocator counts it
(torch.cuda.max_memory_allocated for PyTorch's modes). This checks what
that count sees of reduce-overhead's outputs: a torch.compile'd function
returns a fresh 64 MiB tensor; after warm-up, recording and replays, with
the last call's output alive, it prints how many MiB memory_allocated
counts above its figure before the call, for mode="reduce-overhead" and
for plain Inductor (the reference: its output is an ordinary allocation).
A CUDA graph tree of PyTorch's makes a replay's outputs as storages around
pointers into its pool (torch._C._construct_storage_from_data_pointer),
which the caching allocator does not see allocated; if the count sees 0
MiB for reduce-overhead, its max_memory_allocated leaves out everything
its graphs' outputs hold (activations saved for a backward included).
PyTorch's allocator only: cgtree is not imported.
"""
import json
import os

os.environ.setdefault("CGTREE_TORCH_NO_INSTALL", "1")
import torch  # noqa: E402


def probe(mode):
    n = 16 << 20  # floats: 64 MiB
    x = torch.ones(n, device="cuda")

    def f(x):
        return x * 2 + 1

    cf = torch.compile(f, mode=mode) if mode else torch.compile(f)
    out = None
    for _ in range(6):  # warm-up, recording, replays
        torch.compiler.cudagraph_mark_step_begin()
        out = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = cf(x)
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated()
    ok = bool((out == 3).all())
    return {"mode": mode or "inductor", "output_mib": out.nbytes / 2**20,
            "counted_mib": (after - before) / 2**20, "output_correct": ok,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__}


def main():
    for mode in (None, "reduce-overhead"):
        print(json.dumps(probe(mode)), flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
