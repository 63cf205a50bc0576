"""PyTorch's recordStream calls, handed to cgtree's allocator.

A block freed on its own stream is reused in that stream's order; a read
still queued on another stream would then see the block's next owner's
data. PyTorch tells its allocator of such reads with recordStream(ptr,
stream): Tensor.record_stream calls it, and so does autograd's engine for a
gradient produced on one stream and consumed on another. The pluggable
allocator cgtree is loaded as drops the call unless a C++ hook is set, so
``set_hook`` sets the one in record_stream_hook.cc (built with the rest of
cgtree's C++ library, _cxx.py). eager.c then keeps the stream on the block,
and the free waits for it; for a compiled graph's output, the trees' next
launches wait for the stream (pool_readers.c).

Where the library cannot be built, or ``CGTREE_TORCH_RECORD_STREAM_HOOK=0``
says not to set the hook, install() warns, and wraps the documented method
Tensor.record_stream instead: the user's own calls are then seen,
autograd's are not, and the warning says what to avoid.
"""
import ctypes
import os

import torch

from .. import _torch_ext as _ext
from . import _cxx

ENV = "CGTREE_TORCH_RECORD_STREAM_HOOK"

WARNING = ("cgtree.torch: PyTorch's C++ calls of recordStream do not reach cgtree's allocator (%s). Your own "
           "Tensor.record_stream calls are seen; autograd's are not, so a backward whose forward ran part of its "
           "work on another stream (torch.cuda.stream(side)) may read a gradient's memory after it was reused. Keep "
           "a model's forward and backward on one stream, or let cgtree build its hook (a C++ compiler, ninja and "
           "the CUDA headers; see docs/torch.md, \"record_stream\").")


def set_hook(library=_cxx.library):
    """Sets the hook of the library `library()` gives on PyTorch's current
    allocator, which must be cgtree's. (True, library path) when set;
    (False, why) when not, having changed nothing."""
    if os.environ.get(ENV, "1") == "0":
        return (False, "%s=0" % ENV)
    try:
        path, setter = _cxx.function(library, "cgt_torch_set_record_stream_hook", "cannot set the hook")
    except _cxx.Unavailable as e:
        return (False, str(e))
    setter.argtypes = [ctypes.c_void_p]
    setter.restype = ctypes.c_int
    record = ctypes.cast(ctypes.CDLL(_ext.__file__).cgt_torch_record_stream, ctypes.c_void_p).value
    if setter(record) != 1:
        return (False, "PyTorch's current CUDA allocator is not a pluggable one")
    return (True, path)


_tensor_record_stream = torch.Tensor.record_stream


def stream_handle(stream):
    """The raw cudaStream_t of a torch.cuda.Stream (cuda_stream) or of a
    device-generic torch.Stream, as torch.accelerator.current_stream()
    returns (native_handle), both of which record_stream takes."""
    handle = getattr(stream, "cuda_stream", None)
    return stream.native_handle if handle is None else handle


def wrap_tensor_method():
    """Without the hook: Tensor.record_stream(s) runs PyTorch's own checks,
    then tells eager.c that the block's free must wait for s."""
    def record_stream(self, stream):
        _tensor_record_stream(self, stream)
        if self.device.type == "cuda":
            _ext.record_stream(self.untyped_storage().data_ptr(), stream_handle(stream))

    record_stream.__doc__ = _tensor_record_stream.__doc__
    torch.Tensor.record_stream = record_stream
