"""Values: lifetime, release, DLPack exports and views."""
import numpy as np
import pytest

import cgtree
from conftest import scale_segment


def run_once(tree, n=16, factor=2.0):
    seg = scale_segment(tree, factor)
    a = np.arange(n, dtype=np.float32)
    (y,) = tree.run(seg, (cgtree.static(a),))
    return seg, a, y


def test_a_value_reports_its_memory_while_live(tree):
    _, a, y = run_once(tree)
    assert y.live and y.nbytes == a.nbytes and y.ptr % 256 == 0 and y.tree is tree
    assert "64 bytes" in repr(y)


def test_a_released_value_is_stale_for_every_use(tree):
    _, _, y = run_once(tree)
    y.release()
    assert not y.live
    for use in (lambda: y.ptr, lambda: y.nbytes, y.release, y.__dlpack__, lambda: y.view(np.float32)):
        with pytest.raises(cgtree.StaleValue) as e:
            use()
        assert e.value.status == "CGT_ERR_STALE_VALUE"
    assert "stale" in repr(y)


def test_values_of_an_ended_step_are_stale(tree):
    _, _, y = run_once(tree)
    tree.step_begin()
    with pytest.raises(cgtree.StaleValue):
        tree.release(y)


def test_numpy_reads_a_value_through_dlpack_without_a_copy(tree):
    _, a, y = run_once(tree)
    raw = np.from_dlpack(y)
    assert raw.dtype == np.uint8 and raw.shape == (a.nbytes,)
    assert raw.ctypes.data == y.ptr
    np.testing.assert_array_equal(raw.view(np.float32), 2 * a)
    assert y.__dlpack_device__() == (1, 0)  # kDLCPU


def test_view_gives_a_typed_shaped_zero_copy_array(tree):
    _, a, y = run_once(tree, n=24)
    v = y.view("float32", (4, 6))
    assert v.shape == (4, 6) and v.dtype == np.float32 and v.ctypes.data == y.ptr
    np.testing.assert_array_equal(v, (2 * a).reshape(4, 6))
    v[0, 0] = 100.0  # writes the pool memory itself
    assert y.view(np.float32)[0] == 100.0
    assert y.view(np.int32, 3).shape == (3,)
    with pytest.raises(cgtree.InvalidArgument):
        y.view("float32", (5, 6))  # more than the value holds
    with pytest.raises(TypeError):
        y.view("no_such_dtype")


def test_an_export_held_past_release_stays_allocated_but_may_be_overwritten(tree):
    seg, a, y = run_once(tree)
    view = y.view(np.float32)
    addr = y.ptr
    y.release()
    with pytest.raises(cgtree.StaleValue):
        y.ptr
    a[:] = 5.0
    (y2,) = tree.run(seg, (cgtree.static(a),))
    np.testing.assert_array_equal(view, view)  # still readable: the tree holds the memory
    if y2.ptr == addr:  # the pool reused the block: the old export sees the new run's output
        np.testing.assert_array_equal(view, np.full(16, 10.0, np.float32))


def test_a_dlpack_capsule_is_consumed_once(tree):
    _, _, y = run_once(tree)
    cap = y.__dlpack__()
    assert "dltensor" in repr(cap)
    del cap  # an unconsumed capsule frees its tensor (and its reference to the value)
    with pytest.raises(BufferError):
        y.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        y.__dlpack__(dl_device=(2, 0))


def test_the_cuda_array_interface_is_absent_on_the_simulator(tree):
    _, _, y = run_once(tree)
    assert not hasattr(y, "__cuda_array_interface__")


def test_a_value_view_object_speaks_dlpack_with_its_dtype(tree):
    _, a, y = run_once(tree, n=8)
    vv = cgtree.ValueView(y, "float32", (2, 4))
    arr = np.from_dlpack(vv)
    np.testing.assert_array_equal(arr, (2 * a).reshape(2, 4))
    assert cgtree.dtype_info("torch.bfloat16")[:2] == (4, 16)
