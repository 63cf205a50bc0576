"""The start every GPU test file of the torch door shares.

cgtree.torch installs its CUDA allocator when imported, which must happen
before CUDA starts, so a test file imports torch, skips as a whole without a
CUDA device (CI's machines have none), and only then imports cgtree.torch;
its tests skip too if the install raised at import (unreachable: the import
raises then).

    import torch_gpu
    torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
"""
import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cgtree.torch as ct  # noqa: E402  (installs the allocator before CUDA starts)

import triton  # noqa: E402  (Inductor's kernels are Triton's; it comes with torch's CUDA builds)
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(not ct.installed(), reason="unreachable: install() raised at import")

# Something outside Python may keep the frames of calls that launched a
# kernel alive after they return: compute-sanitizer does, with its default
# host backtraces (--show-backtrace yes); bench/torch_saved_lifetime.py
# shows it, and bench/torch_gpu.sh memcheck turns them off. Through such a
# frame Inductor's generated code keeps a forward's saved activations, so a
# backward stays pending for good and no step ends: figures that count
# steps, replays or moved gradients cannot hold. Tests check results
# everywhere, and those figures only where steps end.


@triton.jit
def _add_one(x_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(x_ptr + i, tl.load(x_ptr + i) + 1)


def _launch_frames_kept():
    """True where the frame of a function that launched a Triton kernel (as
    Inductor's generated code does) outlives its call: its local is still
    alive after it returned. compute-sanitizer's host backtraces keep the
    frames of Triton's launches (its driver API calls), not those of
    PyTorch's eager kernels."""
    class Local:
        pass

    def launch():
        local = Local()
        _add_one[(1,)](torch.zeros(16, device="cuda"), 16)
        return weakref.ref(local)

    ref = launch()
    torch.cuda.synchronize()
    gc.collect()
    return ref() is not None


LAUNCH_FRAMES_KEPT = ct.installed() and _launch_frames_kept()


class Replays:
    """What cgtree's graphs did inside the with-block: recordings, replays,
    graphs compiled, and the reasons of those that went plain."""

    def __enter__(self):
        from cgtree.torch import _backend

        self.before = ct.stats()
        self.graphs = len(_backend._segments)
        return self

    def __exit__(self, *exc):
        from cgtree.torch import _backend

        after = ct.stats()
        self.replays = after.get("replays", 0) - self.before.get("replays", 0)
        self.recordings = after.get("recordings", 0) - self.before.get("recordings", 0)
        self.compiled = after["graphs_compiled"] - self.before["graphs_compiled"]
        self.plain = [s.info["plain_reason"] for s in _backend._segments[self.graphs:]
                      if s.info["plain_reason"] is not None]


def stream_is_non_blocking(handle):
    """cuStreamGetFlags of a raw stream handle (the driver's, always there
    beside a GPU): CU_STREAM_NON_BLOCKING is 1."""
    import ctypes

    flags = ctypes.c_uint(0)
    rc = ctypes.CDLL("libcuda.so.1").cuStreamGetFlags(ctypes.c_void_p(handle), ctypes.byref(flags))
    assert rc == 0, "cuStreamGetFlags returned %d" % rc
    return bool(flags.value & 1)
