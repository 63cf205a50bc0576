"""Shared helpers for the cgtree pytest suite (simulator: numpy kernels on the CPU)."""
import numpy as np
import pytest

import cgtree


def f32(ptr, n):
    """The n float32s of simulator device memory at ptr, as a numpy array."""
    return cgtree.host_array(ptr, np.float32, n)


def scale_kernel(dst, src, n, factor):
    f32(dst, n)[:] = f32(src, n) * factor


def add_kernel(dst, a, b, n):
    f32(dst, n)[:] = f32(a, n) + f32(b, n)


class Counter:
    """Counts the calls of a launch function (launch functions never run for a replay)."""

    def __init__(self):
        self.calls = 0


def scale_segment(t, factor=2.0, name="scale", counter=None):
    """Segment: out = in * factor, one simulator kernel."""

    def launch(l):
        if counter is not None:
            counter.calls += 1
        src, nbytes = l.input(0)
        out = l.alloc(nbytes)
        cgtree.sim_launch(l.stream, scale_kernel, out, src, nbytes // 4, factor)
        l.set_output(0, out, nbytes)

    return t.segment(name, launch, 1, 1)


def add_segment(t, name="add"):
    """Segment: out = a + b."""

    def launch(l):
        a, nbytes = l.input(0)
        b, _ = l.input(1)
        out = l.alloc(nbytes)
        cgtree.sim_launch(l.stream, add_kernel, out, a, b, nbytes // 4)
        l.set_output(0, out, nbytes)

    return t.segment(name, launch, 2, 1)


def snapshot(t):
    """Everything a refused call must leave as it was (stale_uses counts refused stale uses on purpose;
    host_allocs counts the tree's bookkeeping, not state)."""
    stats = {k: v for k, v in t.stats().items() if k not in ("stale_uses", "host_allocs")}
    return stats, t.nodes()


@pytest.fixture
def tree():
    t = cgtree.Tree(backend="sim")
    yield t
    t.check()
    t.close()
