"""One phase of the donated-buffer hunts (python/tests/test_torch_cache_hunt_sim.py,
bench/donated_cache_probe.py): a small MLP compiled afresh after a Dynamo
reset, trained two or three steps under one setting of
torch._functorch.config.donated_buffer, in a process that shares its
Inductor cache directory with the phases before it.

kind: "plain" (the flag on, loss.backward(): a backward compiled with
donated buffers), "retain-off" (the flag off, backward(retain_graph=True)
then backward()), "retain-on" (the same with the flag on: the first
backward retains, so AOTAutograd compiles it without donation). ckpt:
activation checkpointing of the first block (non-reentrant). Returns the
largest difference of the second backward's gradients from twice the
first's (0.0 for "plain"), or "raised" where PyTorch refused."""
import torch
from torch.utils.checkpoint import checkpoint


class MLP(torch.nn.Module):
    def __init__(self, ckpt):
        super().__init__()
        self.l1, self.l2, self.l3 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)
        self.ckpt = ckpt

    def block(self, h):
        return torch.tanh(self.l2(torch.relu(self.l1(h))))

    def forward(self, x):
        h = checkpoint(self.block, x, use_reentrant=False) if self.ckpt else self.block(x)
        return self.l3(h * h.sigmoid())


def phase(backend, kind, ckpt=False, device="cpu", steps=2):
    """backend: what torch.compile takes (cgtree's compile_graph, "inductor", "cgtree")."""
    torch._dynamo.reset()
    torch._functorch.config.donated_buffer = kind != "retain-off"
    torch.manual_seed(0)
    m = MLP(ckpt).to(device)
    f = torch.compile(m, backend=backend)
    x = torch.randn(16, 32, device=device)
    worst = 0.0
    for _ in range(steps):
        for p in m.parameters():
            p.grad = None
        loss = f(x).square().sum()
        if kind == "plain":
            loss.backward()
            continue
        try:
            loss.backward(retain_graph=True)
        except RuntimeError:
            return "raised"
        first = [p.grad.clone() for p in m.parameters()]
        loss.backward()
        worst = max([worst] + [float((p.grad - 2 * g).abs().max()) for p, g in zip(m.parameters(), first)])
    return worst
