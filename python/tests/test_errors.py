"""Exceptions: one class per cgt_status; Python exceptions inside launch functions and kernels."""
import numpy as np
import pytest

import cgtree
from conftest import f32, snapshot


def test_every_status_has_a_class_under_cgtree_error():
    names = {
        "InvalidArgument": "CGT_ERR_INVALID_ARGUMENT", "OutOfMemory": "CGT_ERR_OUT_OF_MEMORY",
        "StaleValue": "CGT_ERR_STALE_VALUE", "CaptureFailed": "CGT_ERR_CAPTURE_FAILED",
        "BackendError": "CGT_ERR_BACKEND", "NoDevice": "CGT_ERR_NO_DEVICE", "StateError": "CGT_ERR_STATE",
        "SegmentFailed": "CGT_ERR_SEGMENT_FAILED",
    }
    for cls_name, status in names.items():
        cls = getattr(cgtree, cls_name)
        assert issubclass(cls, cgtree.Error) and cls.status == status
    assert issubclass(cgtree.InvalidArgument, ValueError)
    assert cgtree.status_name(3) == "CGT_ERR_STALE_VALUE"


def test_an_exception_in_a_launch_function_is_reraised_from_run_with_its_traceback(tree):
    def launch(l):
        raise KeyError("boom in launch")

    seg = tree.segment("fails", launch, 0, 1)
    before = snapshot(tree)
    with pytest.raises(cgtree.SegmentFailed) as e:
        tree.run(seg, ())
    cause = e.value.__cause__
    assert isinstance(cause, KeyError) and "boom in launch" in str(cause)
    tb = cause.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_name == "launch"
    assert e.value.status == "CGT_ERR_SEGMENT_FAILED" and "fails" in e.value.message
    assert snapshot(tree) == before


def test_a_launch_function_that_sets_no_output_fails_its_run(tree):
    seg = tree.segment("lazy", lambda l: None, 0, 1)
    with pytest.raises(cgtree.SegmentFailed):
        tree.run(seg, ())
    assert "output" in tree.last_error


def test_a_launch_context_is_dead_after_its_function_returns(tree):
    kept = []

    def launch(l):
        kept.append(l)
        out = l.alloc(64)
        l.set_output(0, out, 64)
        assert l.variant == 5 and l.tree is tree and isinstance(l.stream, int)

    seg = tree.segment("keeps", launch, 0, 1)
    tree.run(seg, (), variant=5)
    with pytest.raises(cgtree.StateError):
        kept[0].alloc(16)
    with pytest.raises(cgtree.StateError):
        kept[0].stream


def test_launch_context_errors_are_clear(tree):
    seen = {}

    def launch(l):
        for name, call in [("input", lambda: l.input(3)), ("free", lambda: l.free(12345)),
                           ("set_output", lambda: l.set_output(0, 12345, 8)),
                           ("set_output_index", lambda: l.set_output(9, 12345, 8))]:
            try:
                call()
            except cgtree.Error as e:
                seen[name] = type(e)
        out = l.alloc(16)
        l.set_output(0, out, 16)

    seg = tree.segment("probe", launch, 0, 1)
    tree.run(seg, ())
    assert seen == {"input": cgtree.InvalidArgument, "free": cgtree.InvalidArgument,
                    "set_output": cgtree.InvalidArgument, "set_output_index": cgtree.InvalidArgument}


def test_a_kernel_that_raises_when_launched_fails_the_launch(tree):
    def bad_kernel():
        raise ZeroDivisionError("kernel")

    def launch(l):
        cgtree.sim_launch(l.stream, bad_kernel)
        out = l.alloc(16)
        l.set_output(0, out, 16)

    seg = tree.segment("k", launch, 0, 1)
    with pytest.raises(cgtree.SegmentFailed) as e:
        tree.run(seg, ())
    assert isinstance(e.value.__cause__, ZeroDivisionError)


def test_a_kernel_that_raises_during_a_replay_fails_that_run_and_releases_its_outputs(tree):
    flag = {"raise": False}

    def kernel(dst, n):
        if flag["raise"]:
            raise RuntimeError("replayed kernel failed")
        f32(dst, n)[:] = 1.0

    def launch(l):
        out = l.alloc(64)
        cgtree.sim_launch(l.stream, kernel, out, 16)
        l.set_output(0, out, 64)

    seg = tree.segment("k", launch, 0, 1)
    for _ in range(3):
        tree.step_begin()
        tree.run(seg, ())
    flag["raise"] = True
    tree.step_begin()
    with pytest.raises(cgtree.SegmentFailed) as e:
        tree.run(seg, ())
    assert isinstance(e.value.__cause__, RuntimeError)
    flag["raise"] = False
    tree.step_begin()
    (y,) = tree.run(seg, ())  # the tree goes on
    assert y.view(np.float32)[0] == 1.0


def test_calling_the_tree_from_inside_its_launch_function_is_a_state_error(tree):
    inner = {}

    def launch(l):
        try:
            tree.step_begin()
        except cgtree.StateError as e:
            inner["error"] = e
        out = l.alloc(16)
        l.set_output(0, out, 16)

    seg = tree.segment("reenter", launch, 0, 1)
    tree.run(seg, ())
    assert isinstance(inner["error"], cgtree.StateError)


def test_running_out_of_pool_memory_in_a_launch_function_is_out_of_memory_and_changes_nothing():
    t = cgtree.Tree(backend="sim", pool_chunk_bytes=1 << 16)
    t.sim_set_device_limit(1 << 16)

    def launch(l):
        out = l.alloc(1 << 20)
        l.set_output(0, out, 1 << 20)

    seg = t.segment("big", launch, 0, 1)
    before = snapshot(t)
    with pytest.raises(cgtree.OutOfMemory) as e:  # libcgtree reports the failed allocation, not the segment
        t.run(seg, ())
    assert isinstance(e.value.__cause__, cgtree.OutOfMemory)  # what Launch.alloc raised inside
    assert snapshot(t)[1] == before[1]
    t.check()


def test_sim_launch_is_refused_outside_a_launch_function_and_on_a_foreign_stream(tree):
    with pytest.raises(cgtree.StateError):
        cgtree.sim_launch(tree.stream, print)
    with pytest.raises(TypeError):
        cgtree.sim_launch(tree.stream, "not callable")
    seen = []

    def launch(l):
        for stream in (12345, l.stream + 8):
            try:
                cgtree.sim_launch(stream, print)
            except cgtree.InvalidArgument as e:
                seen.append(e)
        out = l.alloc(16)
        l.set_output(0, out, 16)

    tree.run(tree.segment("s", launch, 0, 1), ())
    assert len(seen) == 2
