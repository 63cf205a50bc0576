#!/usr/bin/env python3
"""Does one more *blocking* CUDA stream slow down work on the legacy default
stream? (A hypothesis for the plain torch.cond graph being slower under
cgtree than plain Inductor: cgtree's default tree stream is a blocking
stream, and the legacy stream synchronises implicitly with every blocking
stream of the context.)

    python3 bench/legacy_stream_cost.py

Plain PyTorch (its own allocator), on the legacy default stream: µs per
iteration of (a) a tiny elementwise op, (b) the same plus .item() (a host
sync, as torch.cond's device predicate does), measured before and after a
blocking stream (cudaStreamCreate, as cgtree's tree makes) exists and has
run work. Prints one JSON line.
"""
import json
import time

import torch


def per_iter_us(fn, n=3000, reps=5):
    best = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) / n * 1e6)
    best.sort()
    return best[len(best) // 2]


def main():
    x = torch.ones(256, 256, device="cuda")

    def op():
        return x + 1

    def op_sync():
        return (x.sum() > 0).item()

    for f in (op, op_sync):
        f()
    before = {"op_us": per_iter_us(op), "op_item_us": per_iter_us(op_sync, n=1000)}
    try:
        from cuda.bindings import runtime as rt  # cuda-python 12.6+
    except ImportError:
        from cuda import cudart as rt

    err, handle = rt.cudaStreamCreate()  # blocking: like cgtree's default tree stream
    assert int(err) == 0, err
    s = torch.cuda.ExternalStream(int(handle))
    with torch.cuda.stream(s):
        (x * 2).sum()
    torch.cuda.synchronize()
    after = {"op_us": per_iter_us(op), "op_item_us": per_iter_us(op_sync, n=1000)}
    print(json.dumps({"device": torch.cuda.get_device_name(), "before": before,
                      "after_one_blocking_stream": after}))


if __name__ == "__main__":
    main()
