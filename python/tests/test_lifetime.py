"""Who keeps what alive: trees, values, exports, wrapped arguments; threads."""
import gc
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import cgtree
from conftest import scale_segment


class DLPackOnly:
    """A CPU producer that speaks only DLPack (like a torch CPU tensor), delegating to a numpy array."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_a_value_keeps_its_tree_alive_and_the_tree_dies_with_its_last_reference():
    t = cgtree.Tree(backend="sim")
    seg = scale_segment(t)
    (y,) = t.run(seg, (cgtree.static(np.ones(4, np.float32)),))
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is not None and y.live
    del y
    gc.collect()
    assert ref() is None


def test_an_export_keeps_the_memory_allocated_after_the_tree_and_value_are_dropped():
    t = cgtree.Tree(backend="sim")
    seg = scale_segment(t, 3.0)
    (y,) = t.run(seg, (cgtree.static(np.ones(16, np.float32)),))
    arr = y.view(np.float32)
    ref = weakref.ref(t)
    del t, y
    gc.collect()
    assert ref() is not None  # the array holds the Value, the Value the tree
    np.testing.assert_array_equal(arr, np.full(16, 3.0, np.float32))
    del arr
    gc.collect()
    assert ref() is None


def test_a_tree_whose_launch_function_refers_to_it_is_collected():
    t = cgtree.Tree(backend="sim")

    def launch(l):
        assert l.tree is t  # a cycle: tree -> segment -> launch -> tree
        out = l.alloc(16)
        l.set_output(0, out, 16)

    seg = t.segment("cyclic", launch, 0, 1)
    t.run(seg, ())
    ref = weakref.ref(t)
    del t, launch
    gc.collect()
    assert ref() is None


def test_dlpack_producers_without_a_buffer_are_consumed_and_released():
    a = np.arange(16, dtype=np.float32)
    arg = cgtree.static(DLPackOnly(a))
    assert arg.ptr == a.ctypes.data and arg.nbytes == 64 and arg.device == ("cpu", 0)
    with pytest.raises(cgtree.InvalidArgument, match="contiguous"):
        cgtree.static(DLPackOnly(a[::2]))
    t = cgtree.Tree(backend="sim")
    seg = scale_segment(t, 2.0)
    (y,) = t.run(seg, (arg,))
    np.testing.assert_array_equal(y.view(np.float32), 2 * a)


def test_exports_and_wrapped_arguments_leak_nothing(tree):
    seg = scale_segment(tree)
    a = np.ones(64, np.float32)
    (y,) = tree.run(seg, (cgtree.static(a),))

    def churn(n):
        for _ in range(n):
            np.from_dlpack(y)
            y.view(np.float32, (8, 8))
            y.__dlpack__()
            cgtree.static(DLPackOnly(a))
            cgtree.dynamic(a)

    for _ in range(3):
        churn(300)  # warms numpy's and the interpreter's caches
    gc.collect()
    before, refs = sys.getallocatedblocks(), (sys.getrefcount(y), sys.getrefcount(a))
    churn(1000)
    gc.collect()
    assert (sys.getrefcount(y), sys.getrefcount(a)) == refs  # every export and wrapper let go of its owner
    # A leaked object per iteration would keep >= 1000 blocks; the interpreter's and numpy's
    # caches keep up to a few hundred, varying from run to run.
    assert sys.getallocatedblocks() - before < 1000


def test_another_thread_cannot_enter_a_tree_while_its_launch_function_runs(tree):
    seen = {}
    started = threading.Event()

    def launch(l):
        started.set()
        time.sleep(0.2)  # releases the GIL
        out = l.alloc(16)
        l.set_output(0, out, 16)

    seg = tree.segment("slow", launch, 0, 1)

    def intruder():
        started.wait(5)
        try:
            tree.run(seg, ())
        except cgtree.Error as e:
            seen["error"] = e

    th = threading.Thread(target=intruder)
    th.start()
    tree.run(seg, ())
    th.join()
    assert isinstance(seen.get("error"), cgtree.StateError)
    assert tree.stats()["runs"] == 1
