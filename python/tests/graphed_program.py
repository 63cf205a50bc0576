"""The training program python/tests/test_torch_graphed.py runs under
cgtree.torch.make_graphed_callables, plain Inductor and eager in its own
process, and under torch.cuda.make_graphed_callables in a fresh one (this
file run as a script: no cgtree import, so PyTorch's own allocator serves
PyTorch's own graphs):

    python3 python/tests/graphed_program.py OUT.pt
"""
import sys

import torch

DEV = "cuda"


def modules(seed=0):
    """Two Linear/ReLU modules chained: a (32 -> 64) then b (64 -> 1)."""
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).to(DEV)
    b = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 1)).to(DEV)
    return a, b


def samples():
    """sample_args: a's input needs no grad, b's (a's output) does."""
    return (torch.randn(16, 32, device=DEV),), (torch.randn(16, 64, device=DEV, requires_grad=True),)


def data(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(16, 32, generator=g).to(DEV) for _ in range(n)]


def train(a, b, fa, fb, xs, lr=0.1):
    """SGD steps through fa then fb; (losses, every parameter) on the CPU."""
    params = list(a.parameters()) + list(b.parameters())
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for x in xs:
        opt.zero_grad()
        loss = (fb(fa(x)) - 1).square().mean()  # a target away from 0: gradients of order 1
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses).cpu(), [p.detach().cpu().clone() for p in params]


def pytorch_graphed():
    a, b = modules()
    ga, gb = torch.cuda.make_graphed_callables((a, b), samples())
    return train(a, b, ga, gb, data())


if __name__ == "__main__":
    losses, params = pytorch_graphed()
    torch.save({"losses": losses, "params": params}, sys.argv[1])
    print("SAVED", sys.argv[1])
