"""Graphs that mutate their inputs in the ways the name scan used to miss,
shared by the CPU decision test (test_torch_graphs.py) and the GPU
mutation test (test_torch_trust.py), which run them in fresh processes;
and an operator that reads host state, which both use too."""
import torch


def host_scaled_op(name, scale):
    """A custom operator `name` ("namespace::op") tagged cudagraph_unsafe
    that returns x * scale[0], reading the Python list at each call."""
    @torch.library.custom_op(name, mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
    def scaled_by_global(x: torch.Tensor) -> torch.Tensor:
        return x * scale[0]

    @scaled_by_global.register_fake
    def _(x):
        return torch.empty_like(x)

    return scaled_by_global


def iadd(x, y):
    x += y
    return x * 2


def foreach(xs, ys):
    torch._foreach_add_(xs, ys)
    return xs[0] + 1


def setitem(cache, pos, k):
    cache[pos] = k
    return cache.sum(0)
