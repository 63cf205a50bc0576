"""Bad input from Python raises a clear exception and changes nothing (like the C API)."""
import numpy as np
import pytest

import cgtree
from conftest import add_segment, scale_segment, snapshot


@pytest.fixture
def setup(tree):
    scale = scale_segment(tree)
    add = add_segment(tree)
    a = np.ones(16, np.float32)
    x = cgtree.static(a)
    for _ in range(2):
        tree.step_begin()
        tree.run(scale, (x,))
    tree.step_begin()
    (y,) = tree.run(scale, (x,))
    return tree, scale, add, x, y


def refused(tree, exc, call, match=None):
    before = snapshot(tree)
    with pytest.raises(exc, match=match):
        call()
    assert snapshot(tree) == before, "a refused call changed the tree"
    tree.check()


def test_wrong_argument_counts(setup):
    tree, scale, add, x, y = setup
    refused(tree, cgtree.InvalidArgument, lambda: tree.run(scale, ()), "takes 1 arguments, got 0")
    refused(tree, cgtree.InvalidArgument, lambda: tree.run(add, (x,)), "takes 2 arguments, got 1")
    refused(tree, cgtree.InvalidArgument, lambda: tree.run(scale, (x, x)))


def test_unknown_segments(setup):
    tree, *_ = setup
    for seg in (0, 99, 2**40):
        refused(tree, cgtree.InvalidArgument, lambda: tree.run(seg, ()), "unknown segment")


def test_stale_values(setup):
    tree, scale, add, x, y = setup
    y.release()
    refused(tree, cgtree.StaleValue, lambda: tree.run(add, (y, x)))
    (y2,) = tree.run(scale, (x,))
    tree.step_begin()
    refused(tree, cgtree.StaleValue, lambda: tree.run(add, (y2, x)))


def test_values_of_another_tree(setup):
    tree, scale, add, x, y = setup
    other = cgtree.Tree(backend="sim")
    oscale = scale_segment(other)
    (foreign,) = other.run(oscale, (x,))
    refused(tree, cgtree.InvalidArgument, lambda: tree.run(add, (foreign, x)), "another tree")
    refused(tree, cgtree.InvalidArgument, lambda: tree.release(foreign), "another tree")
    assert foreign.live


def test_non_contiguous_buffers_are_refused_when_wrapped():
    a = np.zeros((8, 8), np.float32)
    for bad in (a[:, ::2], a.T[1:], a[::2]):
        with pytest.raises(cgtree.InvalidArgument, match="contiguous"):
            cgtree.static(bad)
    assert cgtree.static(a.T).nbytes == a.nbytes  # Fortran order is one byte range too
    assert cgtree.dynamic(a[2:4]).nbytes == 64


class FakeCudaArray:
    """Speaks __cuda_array_interface__ like a GPU array: device memory a simulator tree must refuse."""

    def __init__(self, ptr, shape, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (ptr, False), "version": 3,
                                         "strides": strides}


def test_memory_of_the_wrong_device(setup):
    tree, scale, add, x, y = setup
    gpu = cgtree.static(FakeCudaArray(0x7f0000000000, (16,)))
    assert gpu.device == ("cuda", -1) and gpu.nbytes == 64
    refused(tree, cgtree.InvalidArgument, lambda: tree.run(scale, (gpu,)), "device memory given to a simulator tree")
    with pytest.raises(cgtree.InvalidArgument, match="contiguous"):
        cgtree.static(FakeCudaArray(0x7f0000000000, (4, 4), strides=(32, 4)))


def test_arguments_that_are_not_values_or_wrapped_memory(setup):
    tree, scale, add, x, y = setup
    refused(tree, TypeError, lambda: tree.run(scale, (np.ones(16, np.float32),)), "cgtree.static")
    refused(tree, TypeError, lambda: tree.run(scale, x))  # not a sequence of args
    refused(tree, TypeError, lambda: tree.run())
    refused(tree, TypeError, lambda: tree.run(scale, (x,), 0, 1))
    refused(tree, TypeError, lambda: tree.run(scale, (x,), bogus=1))
    refused(tree, OverflowError, lambda: tree.run(scale, (x,), variant=-1))
    with pytest.raises(TypeError):
        cgtree.static(object())
    with pytest.raises(cgtree.InvalidArgument):
        cgtree.static(y)
    with pytest.raises(cgtree.InvalidArgument):
        cgtree.static((1234, -1))


def test_bad_tree_options():
    with pytest.raises(cgtree.InvalidArgument, match="backend"):
        cgtree.Tree(backend="tpu")
    with pytest.raises(cgtree.InvalidArgument, match="mode"):
        cgtree.Tree(mode="fast")
    with pytest.raises(cgtree.InvalidArgument):
        cgtree.Tree(backend="sim", stream=1234)
    with pytest.raises(cgtree.InvalidArgument):
        cgtree.Tree(warmup_runs=-1)
    with pytest.raises(TypeError):
        cgtree.Tree("sim")  # options are keywords
    if not cgtree.cuda_available():
        with pytest.raises(cgtree.NoDevice):
            cgtree.Tree(backend="cuda")


def test_bad_segment_registrations(tree):
    with pytest.raises(TypeError):
        tree.segment("x", "not callable", 0, 1)
    with pytest.raises(TypeError):
        tree.segment(b"bytes name", print, 0, 1)
    assert tree.segments == []
