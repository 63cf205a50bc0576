"""The demo programs of `cgtree demo` (cli.py), run through a tree.

branchy runs segment `scale` (y = 2x), then, by a data-dependent host `if`,
either `inc` (z = y + 1) or `dec` (z = y - 1), then `square` (out = z * z):
the tree grows scale -> (inc | dec) -> square, records each branch once, and
replays from then on. chain runs scale -> inc -> dec -> square every step.
Every step's output is checked against numpy.

On a GPU (CUDA backend, with PyTorch installed) the segments launch PyTorch
ops on the launch's stream; otherwise they run on the CPU simulator as
Python kernels (cgtree.sim_launch). `cgtree info` says which.
"""
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


# Each workload is the list of segments one step runs, given the step number.
# branchy takes a data-dependent host `if` (inc on two steps of three, else
# dec); chain runs the same four segments every step.
WORKLOADS = {
    "branchy": ("scale -> (inc | dec) -> square, a host `if` every step",
                lambda step: ("scale", "inc" if step % 3 else "dec", "square")),
    "chain": ("scale -> inc -> dec -> square, the same path every step",
              lambda step: ("scale", "inc", "dec", "square")),
}
_NUMPY_OPS = {"scale": lambda a: a * 2, "inc": lambda a: a + 1, "dec": lambda a: a - 1, "square": lambda a: a * a}


def _open_tree(backend, defer):
    """The tree and the kernels' enqueue function: PyTorch ops on a GPU, else simulator kernels."""
    t = cgtree.Tree(backend=backend, defer_launch=defer)
    if t.backend == "cuda":
        try:
            return t, _torch_ops(), "the GPU (PyTorch ops on the launch stream)"
        except ImportError:
            if backend == "cuda":
                raise
            t = cgtree.Tree(backend="sim", defer_launch=defer)
            return t, _sim_ops(), "the CPU simulator (CUDA is here, PyTorch is not)"
    return t, _sim_ops(), "the CPU simulator (Python kernels)"


def run_workload(name, backend="auto", steps=200, defer=False):
    """Runs one workload for `steps` steps, checking every output against numpy.

    Returns a dict: workload, description, backend, where, steps, outputs_equal
    (False at the first wrong step, which ends the run), us_per_step, stats,
    nodes, dot. Raises cgtree.Error (NoDevice for a CUDA backend that is not there)."""
    import numpy as np

    description, path = WORKLOADS[name]
    t, enqueue, where = _open_tree(backend, defer)
    with t:
        segs = {op: _segment(t, op, enqueue) for op in _NUMPY_OPS}
        x_host = np.arange(N, dtype=np.float32) / N
        if t.backend == "cuda":
            import torch
            x = torch.from_numpy(x_host).cuda()
        else:
            x = x_host
        xs, equal = cgtree.static(x), True
        start = time.perf_counter()
        for step in range(steps):
            t.step_begin()
            value, want = xs, x_host
            for op in path(step):
                (out,) = t.run(segs[op], (value,))
                if value is not xs:
                    value.release()
                value, want = out, _NUMPY_OPS[op](want)
            if t.backend == "cuda":
                import torch
                got = torch.from_dlpack(value.view("float32", (N,))).cpu().numpy()
            else:
                got = value.view("float32", (N,))
            if not np.array_equal(got, want):
                equal = False
                break
        t.sync()
        elapsed = time.perf_counter() - start
        return {"workload": name, "description": description, "backend": t.backend, "where": where,
                "steps": steps, "outputs_equal": equal, "us_per_step": elapsed / max(steps, 1) * 1e6,
                "stats": t.stats(), "nodes": t.nodes(), "dot": t.dot()}


def print_result(r):
    """The human-readable report of run_workload's result."""
    print(f"{r['workload']}: {r['description']}")
    runs = len(WORKLOADS[r["workload"]][1](0))
    if not r["outputs_equal"]:
        print("  wrong output: a step disagreed with numpy (stopped there)")
        return
    s = r["stats"]
    print(f"  {r['steps']} steps, {runs} segment runs each, every output checked against numpy: all equal")
    print(f"  replays {s['replays']}, recordings {s['recordings']}, warmups {s['warmups']}, "
          f"checkpoint restores {s['checkpoint_restores']}, pool peak {s['pool_peak_bytes']} bytes"
          + (f", fused launches {s['fused_launches']}" if s["fused_launches"] else ""))
    print(f"  {r['us_per_step']:.1f} us per checked step (host clock, including the checks)")
    print("  the tree:")
    print("\n".join(_tree_lines(r["nodes"])))


def demo(backend="auto", steps=200, workload="branchy"):
    """Runs one workload and prints the report; 0 when every output was right, else 1."""
    r = run_workload(workload, backend, steps)
    print(f"cgtree {cgtree.__version__} Python demo on {r['where']}")
    print_result(r)
    return 0 if r["outputs_equal"] else 1
