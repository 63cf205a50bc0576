"""The model of the data-parallel runs: python/tests/ddp_worker.py (the
test's ranks) and bench/torch_ddp.py (the benchmark's) train the same MLP.

A class of a file of ours, not torch.nn.Sequential: Dynamo starts no frame
in torch's own files, and DDP's forward calls the wrapped module's, so a
wrapped Sequential would run eagerly, uncompiled. Import this module only
after cgtree.torch where cgtree runs (it imports torch).
"""
import torch


class MLP(torch.nn.Module):
    """depth Linear+ReLU layers, width wide, and a Linear head."""

    def __init__(self, width, depth):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)
