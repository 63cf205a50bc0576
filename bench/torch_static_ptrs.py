#!/usr/bin/env python3
"""What confirming the STATIC inputs' data pointers costs, per call, on this
host: N `tensor.data_ptr()` calls (what the hot path did before) against one
call of PyTorch's check `torch._C._tensors_data_ptrs_at_indices_equal`
(what it does now, see docs/torch.md "STATIC pointers"). PyTorch only, no
cgtree; needs a GPU.

    python3 bench/torch_static_ptrs.py [N]      (default N = 64)
"""
import sys
import time

import torch


def per_call_us(fn, reps=2000):
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps * 1e6)
    return best


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    dev = torch.device("cuda")
    params = [torch.nn.Parameter(torch.zeros(16, device=dev)) for _ in range(n)]
    args = params + [torch.zeros(4, device=dev), 7]  # a DYNAMIC tensor and an int, as Dynamo passes them
    ptrs = [p.data_ptr() for p in params] + [0, 0]
    idx = list(range(n))
    check = torch._C._tensors_data_ptrs_at_indices_equal
    assert check(args, ptrs, idx)
    data_ptr = torch.Tensor.data_ptr
    one_by_one = per_call_us(lambda: [data_ptr(p) for p in params])
    batched = per_call_us(lambda: check(list(args), ptrs, idx))
    print("host: %s; torch %s" % (torch.cuda.get_device_name(), torch.__version__))
    print("%d Parameters: data_ptr() one by one %.2f us, one check %.2f us (best of 5 x 2000 calls)"
          % (n, one_by_one, batched))


if __name__ == "__main__":
    main()
