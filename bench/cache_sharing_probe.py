"""bench/cache_sharing_probe.py — does cgtree's backend share plain Inductor's
FX graph cache entries for common training models? (CPU; torch needed.)

For each of ten small models: plain Inductor trains two steps, then, after
a Dynamo reset in the same process and cache directory, cgtree's backend
(compile_graph, graphs run plainly: CGTREE_TORCH_NO_INSTALL=1) trains the
same two steps. Printed per model: [hits, misses] of Inductor's FX graph
cache for plain Inductor, then for cgtree; [[0, 2], [2, 0]] means cgtree's
forward and backward both came from plain Inductor's entries (the rule in
docs/torch.md, "Inductor's own FX graph cache"); a miss on cgtree's side is
a graph cgtree keys apart.

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) CGTREE_TORCH_NO_INSTALL=1 \\
        PYTHONPATH=<the package> python3 bench/cache_sharing_probe.py
"""
import json

import torch
from torch._dynamo.utils import counters

from cgtree.torch import _backend


class Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.o = torch.nn.Linear(32, 32)

    def forward(self, x):
        q, k, v = (t.view(4, 8, 2, 16).transpose(1, 2) for t in self.qkv(self.ln(x)).chunk(3, -1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (x + self.o(a.transpose(1, 2).reshape(4, 8, 32))).sum(-1)


class TransposedWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 32))
        self.b = torch.nn.Parameter(torch.randn(64))

    def forward(self, x):
        return torch.tanh(x @ self.w.t() + self.b).sum(-1)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.e = torch.nn.Embedding(50, 32)

    def forward(self, i):
        return torch.nn.functional.gelu(self.e(i)) @ self.e.weight.t()


class Dropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.b(torch.nn.functional.dropout(torch.relu(self.a(x)), 0.2, training=True))


def models():
    nn = torch.nn
    yield "mlp", nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)), \
        torch.randn(16, 32)
    yield "ln_gelu", nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 1)), \
        torch.randn(16, 32)
    yield "attn", Attn(), torch.randn(4, 8, 32)
    yield "conv", nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                                nn.Linear(8 * 6 * 6, 1)), torch.randn(4, 3, 8, 8)
    yield "emb", nn.Sequential(nn.Embedding(100, 32), nn.Linear(32, 1)), torch.randint(0, 100, (16,))
    yield "transposed_weight", TransposedWeight(), torch.randn(16, 32)
    yield "tied", Tied(), torch.randint(0, 50, (16,))
    yield "dropout", Dropout(), torch.randn(16, 32)
    yield "gru_cell", nn.GRUCell(32, 32), torch.randn(8, 32)
    yield "bn_silu", nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.SiLU(), nn.Linear(64, 1)), \
        torch.randn(16, 32)


def run(backend, m, x):
    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(m, backend=backend)
    for _ in range(2):
        m.zero_grad()
        torch.manual_seed(0)
        f(x).float().square().sum().backward()
    return [counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]]


if __name__ == "__main__":
    torch.manual_seed(0)
    print(json.dumps({name: [run("inductor", m, x), run(_backend.compile_graph, m, x)] for name, m, x in models()}))
