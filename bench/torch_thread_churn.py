"""bench/torch_thread_churn.py: a thread per request, and what cgtree holds after N requests.

    python3 bench/torch_thread_churn.py [--requests 40] [--every 10] [--keep] [--out FILE.jsonl]

Each request runs on a thread of its own: four calls of a torch.compile'd
MLP (2 layers of 1024, batch 64, under no_grad: warm-up, recording,
replays), and hands its output back to the caller, which drops it. The
model is compiled on the main thread first (Dynamo's tracing is not
thread-safe). After every --every requests it prints the trees alive and
freed (cgtree.torch.stats()), the device memory cgtree holds
(memory_stats()'s reserved_bytes.all.current, of which the trees' pools
pool_reserved) and the device memory in use (cudaMemGetInfo's total less
free), after cgtree.torch.empty_cache().

--keep holds each request thread's dict of trees, so that no tree is ever
freed: what cgtree did before it freed the trees of threads that exited
(python/_torch_ext/tree_close.c). Run both, each in its own process, and
compare.
"""
import argparse
import json
import sys
import threading
import time

import cgtree.torch as ct  # first: cgtree's allocator, before CUDA starts
import torch
from cgtree.torch import _install


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--keep", action="store_true", help="hold every thread's trees (no tree is freed)")
    ap.add_argument("--out", default="", help="append one JSON line per report")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    model = model.cuda().eval()
    cg = torch.compile(model, backend="cgtree")
    x = torch.randn(64, 1024, device="cuda")
    with torch.no_grad():
        want = model(x)
        cg(x)
    kept, handed = [], []

    def request():
        with torch.no_grad():
            for _ in range(4):
                y = cg(x)
        if a.keep:
            kept.append(_install._thread_trees())
        handed.append(y)

    mode = "trees kept (before)" if a.keep else "trees of exited threads freed"
    print("%s, %s" % (mode, torch.cuda.get_device_name()))
    print("| requests | trees alive | trees freed | cgtree reserved MiB | of which trees' pools MiB | device used MiB |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for i in range(1, a.requests + 1):
        t = threading.Thread(target=request)
        t.start()
        t.join()
        y = handed.pop()
        worst = max(worst, (y - want).abs().max().item())
        del y
        if i % a.every:
            continue
        time.sleep(0.05)  # the exited threads' thread-local state goes a little after join()
        ct.empty_cache()
        torch.cuda.synchronize()
        s, m = ct.stats(), ct.memory_stats()
        free, total = torch.cuda.mem_get_info()
        row = {"mode": "keep" if a.keep else "free", "requests": i, "trees": s["trees"],
               "trees_freed": s["trees_freed"], "reserved_mib": m["reserved_bytes.all.current"] / 2**20,
               "pool_reserved_mib": m["pool_reserved"] / 2**20, "device_used_mib": (total - free) / 2**20}
        print("| %d | %d | %d | %.1f | %.1f | %.1f |" % (i, row["trees"], row["trees_freed"], row["reserved_mib"],
                                                       row["pool_reserved_mib"], row["device_used_mib"]))
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    print("largest difference from eager over all requests: %.3g" % worst)
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
