"""A whole training step compiled with compiled autograd on, run by each
backend of PROBE_ORDER (default cgtree,inductor) on copies of one model, in
one process: the largest difference of the losses and of each gradient
against the first run's, step by step.

It shows that compiled autograd's graph is not bit-reproducible from one
compile to the next, with plain Inductor alone: on fresh caches
(`bash bench/torch_gpu.sh autograd` gives every run its own empty Inductor
and Triton cache directories) two Inductor compiles of it may differ in the
last bit of a gradient, so test_torch_training.py compares cgtree with
Inductor there to a stated tolerance, not bit for bit."""
import copy
import os
import sys

import cgtree.torch as ct
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from whole_step import compiled_whole_step  # noqa: E402  (the GPU test's step: python/tests/whole_step.py)

torch._dynamo.config.compiled_autograd = True
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).cuda()
g = torch.Generator().manual_seed(1)
xs = [torch.randn(16, 128, generator=g).cuda() for _ in range(6)]
order = os.environ.get("PROBE_ORDER", "cgtree,inductor").split(",")
runs = []
for backend in order:
    m = copy.deepcopy(model)
    torch._dynamo.reset()
    step, _ = compiled_whole_step(m, backend)
    out = []
    for x in xs:
        loss = step(x).detach().clone()
        out.append((loss, [p.grad.clone() for p in m.parameters()]))
    runs.append(out)
print("ORDER", order, "cgtree replays", ct.stats().get("replays", 0))
for i in range(len(xs)):
    a = runs[0][i]
    row = []
    for r in runs[1:]:
        b = r[i]
        row.append("loss %.1e grads %s" % ((a[0] - b[0]).abs().max().item(),
                                          " ".join("%.1e" % (u - v).abs().max().item() for u, v in zip(a[1], b[1]))))
    print(i, " | ".join(row))
