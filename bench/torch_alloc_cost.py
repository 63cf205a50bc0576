#!/usr/bin/env python3
"""What one eager allocation costs: PyTorch's caching allocator against cgtree's.

    python3 bench/torch_alloc_cost.py                 # both, side by side
    python3 bench/torch_alloc_cost.py --mode native   # one process, one allocator
    python3 bench/torch_alloc_cost.py --mode cgtree

Once `import cgtree.torch` has installed cgtree's allocator, every CUDA
allocation outside a graph recording goes to python/_torch_ext/eager.c: a
front cache for same-stream reuse over the driver's stream-ordered pool.
This measures, in one process per allocator (an allocator is chosen for
the process before CUDA starts):

  (a) `torch.empty(n, dtype=uint8, device="cuda")` then `del`, on the
      default stream, for n in 256 B, 64 KiB, 1 MiB, 16 MiB: microseconds
      per allocation and free, the median of --repeats loops; and the same
      through torch.cuda.caching_allocator_alloc / caching_allocator_delete
      (the current allocator with less of PyTorch's Python and dispatcher
      around it), where that works; and `torch.empty` then `del` again
      on a side stream (torch.cuda.Stream(), current for the loop), where
      cgtree's allocator asks CUDA whether the stream captures at every
      allocation (cudaStreamGetCaptureInfo: eager.c, "Captures that are
      not ours"), which it never asks of the legacy default stream;
  (b) the `cond` example of bench/torch_compare.py (a 256x256 torch.cond on
      a device predicate) compiled with plain torch.compile (Inductor):
      milliseconds per call, the median of --repeats loops, and allocations
      per call (native: torch.cuda.memory_stats' allocation.all.allocated;
      cgtree: cgtree.torch.memory_stats' eager_allocations, and how many of
      them the front cache served).

Each child prints one JSON line per figure ({"mode", "figure", "bytes"?,
"value", "unit"}); the parent runs both children and prints a table.
About 30-60 s on an H100, most of it Inductor compiling `cond` twice.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = [256, 64 << 10, 1 << 20, 16 << 20]
MODES = ["native", "cgtree"]


def emit(mode, figure, value, unit, **extra):
    print(json.dumps(dict(mode=mode, figure=figure, value=value, unit=unit, **extra)), flush=True)


def time_loop(fn, iters, repeats):
    """Median over repeats of the seconds one call of fn takes."""
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per.append((time.perf_counter() - t0) / iters)
    return statistics.median(per)


def alloc_figures(torch, mode, ct):
    """(allocations so far, front-cache hits so far or None) of this process."""
    if mode == "cgtree":
        m = ct.memory_stats()
        return m["eager_allocations"], m["front_cache_hits"]
    return torch.cuda.memory_stats()["allocation.all.allocated"], None


WARM = 50  # untimed allocations before each timed loop


def time_empty_del(torch, n, iters, repeats):
    """Microseconds per torch.empty(n bytes) then del on the current stream, after WARM untimed."""
    dev = torch.device("cuda")

    def alloc_free():
        t = torch.empty(n, dtype=torch.uint8, device=dev)
        del t

    for _ in range(WARM):
        alloc_free()
    torch.cuda.synchronize()
    return round(time_loop(alloc_free, iters, repeats) * 1e6, 3)


def bench_empty(torch, mode, iters, repeats, ct=None):
    for n in SIZES:
        emit(mode, "empty_del_us", time_empty_del(torch, n, iters, repeats), "us", bytes=n)

        def raw_alloc_free():
            torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(n))

        try:
            raw_alloc_free()
        except (RuntimeError, AttributeError) as e:  # not every PyTorch serves it under a pluggable allocator
            emit(mode, "raw_alloc_free_us", None, "us", bytes=n, error=str(e)[:120])
            continue
        emit(mode, "raw_alloc_free_us", round(time_loop(raw_alloc_free, iters, repeats) * 1e6, 3), "us", bytes=n)
        torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        for n in SIZES:
            m0 = ct.memory_stats() if ct else None
            emit(mode, "empty_del_side_stream_us", time_empty_del(torch, n, iters, repeats), "us", bytes=n)
            if ct:  # where the side stream's allocations (the untimed ones too) came from
                m1 = ct.memory_stats()
                for k in ("front_cache_hits", "driver_allocations", "capture_allocations"):
                    emit(mode, "side_stream_" + k + "_per_alloc",
                         round((m1[k] - m0[k]) / (iters * repeats + WARM), 3), "allocations", bytes=n)
    torch.cuda.synchronize()


def bench_cond(torch, mode, ct, calls, repeats):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_compare import make_cond

    dev = torch.device("cuda")
    fn, step, _ = make_cond(torch, dev)
    cfn = torch.compile(fn)  # plain Inductor in both modes: only the allocator differs
    i = [0]

    def one_call():
        step(cfn, i[0])
        i[0] += 1

    with torch.no_grad():
        for _ in range(20):  # compile, then warm
            one_call()
        torch.cuda.synchronize()
        a0, h0 = alloc_figures(torch, mode, ct)
        per_call = time_loop(one_call, calls, repeats)
        torch.cuda.synchronize()
        a1, h1 = alloc_figures(torch, mode, ct)
    n = calls * repeats
    emit(mode, "cond_ms_per_call", round(per_call * 1e3, 4), "ms")
    emit(mode, "cond_allocs_per_call", round((a1 - a0) / n, 2), "allocations")
    if h0 is not None:
        emit(mode, "cond_front_hits_per_call", round((h1 - h0) / n, 2), "allocations")


def child(mode, iters, calls, repeats):
    ct = None
    if mode == "cgtree":
        import cgtree.torch as ct  # before CUDA starts: installs the allocator
    import torch

    if mode == "cgtree" and not ct.installed():
        raise SystemExit("cgtree.torch did not install its allocator")
    torch.cuda.init()
    emit(mode, "device", torch.cuda.get_device_name(), "name")
    bench_empty(torch, mode, iters, repeats, ct)
    bench_cond(torch, mode, ct, calls, repeats)


def table(rows):
    """One line per figure, the modes side by side."""
    figures = {}
    for r in rows:
        if r["figure"] == "device":
            print("%s: %s" % (r["mode"], r["value"]))
            continue
        key = (r["figure"], r.get("bytes"))
        figures.setdefault(key, {})[r["mode"]] = r["value"]
    print("%-26s %10s %14s %14s" % ("figure", "bytes", "native", "cgtree"))
    for (figure, n), by_mode in figures.items():
        cells = ["-" if by_mode.get(m) is None else str(by_mode[m]) for m in MODES]
        print("%-26s %10s %14s %14s" % (figure, "" if n is None else n, cells[0][:14], cells[1][:14]))


def parent(args):
    rows = []
    for mode in MODES:
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--iters", str(args.iters),
               "--calls", str(args.calls), "--repeats", str(args.repeats)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-4000:])
            raise SystemExit("the %s child failed (exit %d)" % (mode, p.returncode))
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                print(line)
                rows.append(json.loads(line))
    table(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=MODES, help="run one allocator in this process (default: both, as children)")
    ap.add_argument("--iters", type=int, default=2000, help="allocations and frees per timed loop")
    ap.add_argument("--calls", type=int, default=200, help="calls of cond per timed loop")
    ap.add_argument("--repeats", type=int, default=5, help="timed loops; the median is reported")
    args = ap.parse_args()
    if args.mode:
        child(args.mode, args.iters, args.calls, args.repeats)
    else:
        parent(args)


if __name__ == "__main__":
    main()
