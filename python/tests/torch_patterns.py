"""Graphs that mutate their inputs in the ways the name scan used to miss,
shared by the CPU decision test (test_torch_graphs.py) and the GPU
mutation test (test_torch_trust.py), which run them in fresh processes."""
import torch


def iadd(x, y):
    x += y
    return x * 2


def foreach(xs, ys):
    torch._foreach_add_(xs, ys)
    return xs[0] + 1


def setitem(cache, pos, k):
    cache[pos] = k
    return cache.sum(0)
