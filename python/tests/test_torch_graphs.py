"""The compile-time analysis of cgtree.torch: which inputs a graph mutates,
whether it draws random numbers, byte spans. Needs torch, not a GPU."""
import operator

import pytest

torch = pytest.importorskip("torch")
import torch.fx  # noqa: E402

from cgtree.torch import _graphs as B  # noqa: E402


def trace(fn):
    return torch.fx.symbolic_trace(fn)


def test_in_place_method_marks_its_input_mutated():
    def f(a, b):
        a.add_(b)
        return a * 2

    assert B.mutated_placeholders(trace(f)) == {0}


def test_a_write_through_a_view_marks_the_base_mutated():
    def f(cache, k):
        cache.view(-1)[:4].copy_(k)
        return cache.sum()

    assert B.mutated_placeholders(trace(f)) == {0}


def test_setitem_marks_its_target_mutated():
    # Dynamo writes `cache[pos] = k` as operator.setitem; symbolic_trace cannot, so build it.
    g = torch.fx.Graph()
    cache, pos, k = g.placeholder("cache"), g.placeholder("pos"), g.placeholder("k")
    g.call_function(operator.setitem, (cache, pos, k))
    g.output(cache)
    assert B.mutated_placeholders(torch.fx.GraphModule(torch.nn.Module(), g)) == {0}


def test_pure_graphs_mutate_nothing():
    def f(a, b):
        return torch.relu(a @ b) + a.t()

    assert B.mutated_placeholders(trace(f)) == set()


def test_random_ops_are_found_and_inference_dropout_is_not():
    def rnd(a):
        return a + torch.rand_like(a)

    def drop_eval(a):
        return torch.nn.functional.dropout(a, 0.1, training=False)

    def drop_train(a):
        return torch.nn.functional.dropout(a, 0.1, training=True)

    assert B.draws_random_numbers(trace(rnd))
    assert not B.draws_random_numbers(trace(drop_eval))
    assert B.draws_random_numbers(trace(drop_train))


def test_span_covers_strided_views_and_empty_tensors():
    t = torch.zeros(4, 8)
    assert B.span(t) == 4 * 8 * 4
    assert B.span(t.t()) == 4 * 8 * 4
    assert B.span(t[:, :2]) == (3 * 8 + 1 + 1) * 4
    assert B.span(torch.zeros(0, 3)) == 0
    assert B.span(torch.zeros(1).expand(5)) == 4


def test_describe_refuses_cpu_outputs_and_keeps_constants():
    assert B.describe([torch.zeros(2)]) is None
    assert B.describe(torch.zeros(2)) is None
    assert B.describe((3, None)) == (False, (None, None), (3, None))


def test_matmul_family_ops_are_found_as_cublas_users_and_pointwise_ops_are_not():
    def matmul(a, b):
        return torch.relu(a @ b)

    def linear(a, w, b):  # weights as placeholders: symbolic_trace refuses a foreign module's parameters
        return torch.nn.functional.linear(a, w, b)

    def bmm(a):
        return torch.bmm(a, a).sum()

    def einsum(a, b):
        return torch.einsum("ij,jk->ik", a, b)

    def solve(a, b):
        return torch.linalg.solve(a, b)

    def qr(a):
        return torch.linalg.qr(a)[0] + torch.det(a)

    def pointwise(x):
        y = x * x * x
        return (torch.relu(y).abs() ** y.abs()).sqrt().sum()

    for f in (matmul, linear, bmm, einsum, solve, qr):
        assert B.uses_cublas(trace(f)), f.__name__
    assert not B.uses_cublas(trace(pointwise))
