"""A thread's trees and PyTorch's thread-local stash, on the CPU.

A backward runs on autograd's device thread, and finds the trees of the
thread that called backward() through torch._C._stash_obj_in_tls, which
PyTorch copies into that thread for each backward (_install.py,
_thread_trees). The stash holds its object in a c10::SafePyObject, which
releases a reference when the stashing thread exits. No GPU is needed:
making a thread's trees dict touches no device."""
import os
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from cgtree import _torch_ext as _ext  # noqa: E402
from cgtree.torch import _install  # noqa: E402


def join_until_gone(t, seconds=5.0):
    """Joins t, then waits until its OS thread is gone: join() returns
    before the thread's C++ thread-locals (the stash) are destroyed."""
    t.join()
    task = "/proc/self/task/%d" % t.native_id
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs Linux's /proc to see a thread end")
    deadline = time.monotonic() + seconds
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(task), "thread %d still runs" % t.native_id


def references(holder):
    """The references to holder[0] its holders count. (holder, not the
    object, is the parameter: a parameter would count too.)"""
    return sys.getrefcount(holder[0]) - 1  # less getrefcount's own


def mend(obj, got, want):
    """Gives obj the references it lost, so that a failure here is not a crash later."""
    for _ in range(want - got):
        _ext.give_reference(obj)


def references_after_thread(work, held):
    """Runs work in a thread of its own, waits until the thread is gone, and
    returns the references held[0] counts then. Mends any it lost against
    len(held), its real holders, before returning."""
    t = threading.Thread(target=work)
    t.start()
    join_until_gone(t)
    got = references(held)
    mend(held[0], got, len(held))
    return got


def test_a_threads_trees_keep_every_reference_their_holders_count_after_the_thread_exits():
    """The thread's trees are held twice here; after the thread exits (its
    threading.local and its stash gone) they must still count both. PyTorch
    2.11's stash releases a reference it was never given: the trees then
    count one, and were freed under a live holder (heap corruption, seen on
    the GPU as a KeyError in an unrelated dict after the thread test)."""
    held = []

    def work():
        trees = _install._thread_trees()
        held.extend([trees, trees])

    got = references_after_thread(work, held)
    assert got == len(held), "the trees count %d reference(s) after their thread exited, not %d" % (got, len(held))


def test_the_stash_helper_gives_a_reference_only_where_the_stash_takes_none():
    """_stash_in_tls: after the stashing thread exits, the object counts
    exactly its real holders, whether or not PyTorch's stash took a
    reference of its own."""
    obj, held = object(), []
    held.extend([obj, obj])
    del obj

    def work():
        _install._stash_in_tls("cgtree_test_stash_helper", held[0])

    assert references_after_thread(work, held) == len(held)


def test_a_backwards_trees_are_its_callers_even_where_autograds_thread_once_made_its_own():
    """Autograd's device thread runs each backward with the stash of the
    thread that called backward(). Once a backward whose caller had no
    trees made trees of that thread's own, a later backward of another
    thread must still find its caller's trees (where its forward's saved
    activations live), not those. Simulated here: a thread makes trees of
    its own, then gets a caller's stash as PyTorch copies it in."""
    caller, found = [], []

    def calling_thread():
        caller.append(_install._thread_trees())

    t = threading.Thread(target=calling_thread)
    t.start()
    t.join()

    def autograds_thread():
        own = _install._thread_trees()  # a backward whose caller had no trees
        _install._stash_in_tls(_install._TLS_KEY, caller[0])  # the next backward: its caller's stash
        found.append((own, _install._thread_trees()))

    t = threading.Thread(target=autograds_thread)
    t.start()
    join_until_gone(t)
    own, trees = found[0]
    assert trees is caller[0] and trees is not own


class FakeTree:
    """What the per-thread dict asks of a tree: orphan(), closed, stats()."""

    def __init__(self, recordings):
        self.orphans, self.closed, self.recordings = 0, False, recordings

    def orphan(self):
        self.orphans += 1

    def stats(self):
        return {"recordings": self.recordings, "pool_reserved_bytes": 0}


class FakeStream:
    cuda_stream = 12345


def test_a_threads_trees_are_orphaned_when_the_thread_exits_and_only_then():
    """The dict of a thread's trees orphans each of them when the thread
    exits (its threading.local and PyTorch's stash let go of it), so that
    the C side frees them once no output of theirs lives; while the thread
    runs, nothing is orphaned."""
    tree, running, go = FakeTree(1), threading.Event(), threading.Event()

    def work():
        _install._thread_trees()[0] = (tree, FakeStream())
        running.set()
        go.wait(5)

    t = threading.Thread(target=work)
    t.start()
    assert running.wait(5)
    assert tree.orphans == 0  # the thread lives
    go.set()
    join_until_gone(t)
    deadline = time.monotonic() + 5
    while tree.orphans == 0 and time.monotonic() < deadline:  # the stash goes with the OS thread
        time.sleep(0.01)
    assert tree.orphans == 1


def test_freed_trees_leave_the_list_of_trees_and_their_counters_stay_in_the_sums():
    """_install.trees() drops a tree once it is closed (freed), adding its
    counters to the freed trees' sums, which cgtree.torch.stats() adds in."""
    live, freed = FakeTree(2), FakeTree(3)
    before = _install.trees_and_freed_stats()[1].get("recordings", 0)
    with _install._lock:
        _install._all_trees.extend([(live, FakeStream()), (freed, FakeStream())])
    try:
        assert live in _install.trees() and freed in _install.trees()
        freed.closed = True
        listed = _install.trees()
        assert live in listed and freed not in listed
        assert _install.trees_and_freed_stats()[1]["recordings"] == before + 3
        assert _install.trees_and_freed_stats()[1]["recordings"] == before + 3  # once
    finally:
        with _install._lock:
            _install._all_trees[:] = [e for e in _install._all_trees if e[0] is not live and e[0] is not freed]
            _install._freed["recordings"] -= 3


def test_record_stream_takes_a_device_generic_stream_as_well_as_a_cuda_one():
    """Tensor.record_stream accepts torch.Stream (torch.accelerator's) as
    well as torch.cuda.Stream; cgtree's wrapper (used where its C++ hook
    could not be built) read .cuda_stream only, which torch.Stream lacks,
    and raised AttributeError after PyTorch's own record had run."""
    from cgtree.torch import _record_stream

    class CudaStream:  # torch.cuda.Stream's attribute
        cuda_stream = 0x1234

    class GenericStream:  # torch.Stream's
        native_handle = 0x5678

    assert _record_stream.stream_handle(CudaStream()) == 0x1234
    assert _record_stream.stream_handle(GenericStream()) == 0x5678
    assert "native_handle" in dir(torch.Stream) and "cuda_stream" not in dir(torch.Stream)  # this PyTorch's


def test_reserved_bytes_of_a_device_count_that_devices_trees_pools_only(monkeypatch):
    """memory_stats(device)'s reserved_bytes is the device's: its driver
    pool and its trees' pools, not every device's trees' pools."""
    import cgtree.torch as ct

    class FakeTree:
        def __init__(self, device, reserved):
            self.device, self.reserved = device, reserved

        def stats(self):
            return {"pool_peak_bytes": 0, "side_pool_peak_bytes": 0, "pool_reserved_bytes": self.reserved}

    monkeypatch.setattr(_install, "trees", lambda: [])  # the driver's pools alone (real trees live on a GPU)
    base = [ct.memory_stats(d)["reserved_bytes.all.current"] for d in (0, 1)]
    monkeypatch.setattr(_install, "trees", lambda: [FakeTree(0, 100), FakeTree(1, 1000), FakeTree(0, 7)])
    got = [ct.memory_stats(d)["reserved_bytes.all.current"] - b for d, b in zip((0, 1), base)]
    assert got == [107, 1000]


def test_trees_made_inside_a_backward_without_a_callers_stash_are_nobodys():
    """A thread's trees carry its identity (Tree.owner_thread), and only
    the owner caches a tree as its own. Trees autograd's device thread makes
    for itself inside a backward (its caller had no trees) are nobody's:
    that thread serves every caller's backward, and must ask for the right
    tree at each call."""
    import threading

    seen = {}

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            seen["inside"] = _install._ThreadTrees().owner
            return g * 2

    seen["outside"] = _install._ThreadTrees().owner
    Probe.apply(torch.ones(2, requires_grad=True)).sum().backward()
    assert seen == {"outside": threading.get_ident(), "inside": 0}



def test_a_tree_made_on_another_thread_for_an_explicit_callers_backward_takes_the_callers_mode(monkeypatch):
    """A backward runs on autograd's device thread, on the trees of the
    thread that called backward() (PyTorch copies that thread's stash in);
    where that thread has no tree on the backward's device yet, autograd's
    thread makes it. It is the caller's tree, so it takes the caller's step
    mode: for a caller in explicit mode, explicit steps and a non-blocking
    stream. It took autograd's thread's own mode (threading.local says
    nothing of the caller): automatic, on a blocking stream (a helper's
    hunt). Here another thread with the caller's trees stashed stands for
    autograd's (on a CPU a backward runs on its caller's thread), and the
    tree is a stand-in that records how it was made (a real one needs a
    GPU)."""
    made = []

    class FakeTree:
        stream, closed = 0, False

        def __init__(self, device, **kw):
            made.append(kw)

        def orphan(self):
            pass

    monkeypatch.setattr(_install._ext, "Tree", FakeTree)
    monkeypatch.setattr(_install._ext, "exchange_info", lambda: {"stream": True})
    monkeypatch.setattr(_install.torch.cuda, "ExternalStream", lambda *a, **k: None)
    monkeypatch.setattr(_install, "_all_trees", [])
    got = {}

    def caller():
        _install.set_explicit_steps(True)
        trees = _install._thread_trees()

        def autograds_thread():
            _install._stash_in_tls(_install._TLS_KEY, trees)
            tree, _ = _install.tree_for(0)
            got["explicit_steps"], got["owner"] = tree.explicit_steps, tree.owner_thread

        t = threading.Thread(target=autograds_thread)
        t.start()
        t.join()
        got["caller"] = threading.get_ident()
        trees.clear()

    t = threading.Thread(target=caller)
    t.start()
    t.join()
    assert made and made[0]["nonblocking"] is True, made
    assert got == {"explicit_steps": True, "owner": got["caller"], "caller": got["caller"]}, got
