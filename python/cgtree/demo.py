"""python -m cgtree demo — a small program with a host-side branch, run through a tree.

Every step runs segment `scale` (y = 2x), then, by a data-dependent host `if`,
either `inc` (z = y + 1) or `dec` (z = y - 1), then `square` (out = z * z):
the tree grows scale -> (inc | dec) -> square, records each branch once, and
replays from then on. Every step's output is checked against numpy.

On a GPU (CUDA backend, with PyTorch installed) the segments launch PyTorch
ops on the launch's stream; otherwise they run on the CPU simulator as
Python kernels (cgtree.sim_launch). `python -m cgtree info` says which.
"""
import argparse
import time

import cgtree

N = 1024


def _sim_ops():
    import numpy as np

    def f32(ptr):
        return cgtree.host_array(ptr, np.float32, N)

    def kernel(op, dst, src):
        a = f32(src)
        f32(dst)[:] = {"scale": lambda: a * 2, "inc": lambda: a + 1, "dec": lambda: a - 1, "square": lambda: a * a}[op]()

    def enqueue(l, op, dst, src):
        cgtree.sim_launch(l.stream, kernel, op, dst, src)

    return enqueue


def _torch_ops():
    import torch

    class Raw:
        def __init__(self, ptr):
            self.__cuda_array_interface__ = {"shape": (N,), "typestr": "<f4", "data": (ptr, False), "version": 2,
                                             "strides": None}

    def enqueue(l, op, dst, src):
        with torch.cuda.stream(torch.cuda.ExternalStream(l.stream)):
            a, out = torch.as_tensor(Raw(src), device="cuda"), torch.as_tensor(Raw(dst), device="cuda")
            if op == "scale":
                torch.mul(a, 2.0, out=out)
            elif op == "inc":
                torch.add(a, 1.0, out=out)
            elif op == "dec":
                torch.sub(a, 1.0, out=out)
            else:
                torch.mul(a, a, out=out)

    return enqueue


def _segment(t, op, enqueue):
    def launch(l):
        src, nbytes = l.input(0)
        out = l.alloc(nbytes)
        enqueue(l, op, out, src)
        l.set_output(0, out, nbytes)

    return t.segment(op, launch, 1, 1)


def _tree_lines(nodes):
    children = {}
    for n in nodes:
        children.setdefault(n["parent"], []).append(n)
    lines = []

    def walk(parent, prefix):
        kids = children.get(parent, [])
        for i, n in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(f"{prefix}{'└── ' if last else '├── '}#{n['id']} {n['segment_name']} [{n['state']}] "
                         f"replays={n['replays']}")
            walk(n["id"], prefix + ("    " if last else "│   "))

    walk(0, "  ")
    return lines


def demo(backend="auto", steps=200):
    import numpy as np

    t = cgtree.Tree(backend=backend)
    enqueue, where = None, "the CPU simulator (Python kernels)"
    if t.backend == "cuda":
        try:
            enqueue, where = _torch_ops(), "the GPU (PyTorch ops on the launch stream)"
        except ImportError:
            print("CUDA is here but PyTorch is not: running on the simulator instead")
            t = cgtree.Tree(backend="sim")
    if enqueue is None:
        enqueue = _sim_ops()
    print(f"cgtree {cgtree.__version__} Python demo on {where}")
    segs = {op: _segment(t, op, enqueue) for op in ("scale", "inc", "dec", "square")}
    x_host = np.arange(N, dtype=np.float32) / N
    if t.backend == "cuda":
        import torch
        x = torch.from_numpy(x_host).cuda()
    else:
        x = x_host
    xs = cgtree.static(x)
    start = time.perf_counter()
    for step in range(steps):
        t.step_begin()
        (y,) = t.run(segs["scale"], (xs,))
        branch = "inc" if step % 3 else "dec"  # the host-side `if`
        (z,) = t.run(segs[branch], (y,))
        y.release()
        (out,) = t.run(segs["square"], (z,))
        z.release()
        if t.backend == "cuda":
            import torch
            got = torch.from_dlpack(out.view("float32", (N,))).cpu().numpy()
        else:
            got = out.view("float32", (N,))
        want = (x_host * 2 + (1 if branch == "inc" else -1)) ** 2
        if not np.array_equal(got, want):
            print(f"step {step}: wrong output")
            return 1
    t.sync()
    elapsed = time.perf_counter() - start
    s = t.stats()
    print(f"{steps} steps, 3 segment runs each, every output checked against numpy: all equal")
    print(f"replays {s['replays']}, recordings {s['recordings']}, warmups {s['warmups']}, "
          f"checkpoint restores {s['checkpoint_restores']}, pool peak {s['pool_peak_bytes']} bytes")
    print(f"{elapsed / steps * 1e6:.1f} us per checked step (host clock, including the checks)")
    print("the tree:")
    print("\n".join(_tree_lines(t.nodes())))
    return 0


def info():
    print(f"cgtree {cgtree.__version__} (Python package at {cgtree.__file__})")
    print(f"CUDA available: {cgtree.cuda_available()}; Tree() picks: {cgtree.Tree().backend}")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m cgtree")
    sub = ap.add_subparsers(dest="cmd")
    d = sub.add_parser("demo", help="run the demo program (GPU if present, else the simulator)")
    d.add_argument("--backend", choices=["auto", "sim", "cuda"], default="auto")
    d.add_argument("--steps", type=int, default=200)
    sub.add_parser("info", help="version and backends")
    a = ap.parse_args(argv)
    if a.cmd == "demo":
        return demo(a.backend, a.steps)
    if a.cmd == "info":
        return info()
    ap.print_help()
    return 2
