"""PyTorch's recordStream calls, handed to cgtree's allocator.

A block freed on its own stream is reused in that stream's order; a read
still queued on another stream would then see the block's next owner's
data. PyTorch tells its allocator of such reads with recordStream(ptr,
stream): Tensor.record_stream calls it, and so does autograd's engine for a
gradient produced on one stream and consumed on another. The pluggable
allocator cgtree is loaded as drops the call unless a C++ hook is set, so
``set_hook`` builds record_stream_hook.cc with torch.utils.cpp_extension
(PyTorch's own tool for building against the PyTorch that runs; the build
is cached, in a folder of its own under ``TORCH_EXTENSIONS_DIR`` or
~/.cache/torch_extensions, and takes some seconds the first time) and sets
the hook. eager.c then keeps
the stream on the block, and the free waits for it.

Where the build cannot be made (no C++ compiler, no ninja, no CUDA headers),
or ``CGTREE_TORCH_RECORD_STREAM_HOOK=0`` says not to, install() warns, and
wraps the documented method Tensor.record_stream instead: the user's own
calls are then seen, autograd's are not, and the warning says what to avoid.
"""
import ctypes
import glob
import os
import sys
import time

import torch

from .. import _torch_ext as _ext

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record_stream_hook.cc")
ENV = "CGTREE_TORCH_RECORD_STREAM_HOOK"
LOCK_WAIT_SECONDS = 120  # another process's build takes seconds; a lock older than this was left behind

WARNING = ("cgtree.torch: PyTorch's C++ calls of recordStream do not reach cgtree's allocator (%s). Your own "
           "Tensor.record_stream calls are seen; autograd's are not, so a backward whose forward ran part of its "
           "work on another stream (torch.cuda.stream(side)) may read a gradient's memory after it was reused. Keep "
           "a model's forward and backward on one stream, or let cgtree build its hook (a C++ compiler, ninja and "
           "the CUDA headers; see docs/torch.md, \"record_stream\").")


def cuda_include():
    """A directory with the CUDA runtime's headers, for the cudaStream_t of
    PyTorch's headers: CUDA_HOME's (the toolkit's), else pip's beside
    PyTorch, where it is whole (the runtime's package alone lacks the
    compiler's crt/host_defines.h, which cuda_runtime_api.h includes); None
    without."""
    from torch.utils import cpp_extension

    places = [os.path.join(cpp_extension.CUDA_HOME, "include")] if cpp_extension.CUDA_HOME else []
    try:
        import nvidia  # PyTorch's CUDA wheels depend on nvidia's CUDA packages

        for root in nvidia.__path__:
            places += sorted(glob.glob(os.path.join(root, "*", "include")))
    except ImportError:
        pass
    whole = lambda d: all(os.path.isfile(os.path.join(d, f)) for f in ("cuda_runtime_api.h", "crt/host_defines.h"))  # noqa: E731
    return next((d for d in places if whole(d)), None)


def build_directory():
    """The hook's own build folder under PyTorch's extensions root
    (TORCH_EXTENSIONS_DIR, else cpp_extension.get_default_build_root()),
    one per PyTorch, CUDA and Python."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    tag = "cgtree_record_stream_hook-torch%s-cuda%s-py%d%d" % ((torch.__version__, torch.version.cuda)
                                                               + tuple(sys.version_info[:2]))
    return os.path.join(root, tag)


def wait_for_lock(directory, seconds):
    """cpp_extension.load waits without end while its build folder's lock
    file exists, and a process killed during the build leaves it behind:
    every later install would hang. So we wait `seconds` for another
    process's build, then give up (install warns, naming the file)."""
    lock = os.path.join(directory, "lock")
    deadline = time.monotonic() + seconds
    while os.path.exists(lock):
        if time.monotonic() >= deadline:
            raise RuntimeError("the build lock %s stayed %g s: another process builds the hook, or one that stopped "
                               "left it (remove it if no build runs)" % (lock, seconds))
        time.sleep(0.1)


def build():
    """The path of the built hook library (built once, then cached). Linked
    to PyTorch's own libraries only: CUDA's runtime is not linked (the hook
    calls none of it), so no second copy of it comes into the process."""
    from torch.utils import cpp_extension

    include = cuda_include()
    if include is None:
        raise RuntimeError("no CUDA headers (cuda_runtime_api.h) found: set CUDA_HOME")
    directory = build_directory()
    os.makedirs(directory, exist_ok=True)
    wait_for_lock(directory, LOCK_WAIT_SECONDS)
    return cpp_extension.load(name="cgtree_record_stream_hook", sources=[SOURCE], extra_cflags=["-O2"],
                              extra_include_paths=[include], extra_ldflags=["-ltorch_cuda", "-lc10_cuda"],
                              build_directory=directory, with_cuda=False, is_python_module=False, verbose=False)


def set_hook(build=build):
    """Builds the hook and sets it on PyTorch's current allocator, which
    must be cgtree's. (True, library path) when set; (False, why) when not,
    having changed nothing."""
    if os.environ.get(ENV, "1") == "0":
        return (False, "%s=0" % ENV)
    try:
        path = build()
        setter = ctypes.CDLL(path).cgt_torch_set_record_stream_hook
        setter.argtypes = [ctypes.c_void_p]
        setter.restype = ctypes.c_int
        record = ctypes.cast(ctypes.CDLL(_ext.__file__).cgt_torch_record_stream, ctypes.c_void_p).value
        if setter(record) != 1:
            return (False, "PyTorch's current CUDA allocator is not a pluggable one")
        return (True, path)
    except Exception as e:  # noqa: BLE001 -- any failure of the build is reported, not raised
        return (False, "building the hook failed: %s: %s" % (type(e).__name__, first_error(str(e))))


def first_error(text):
    """The line of a build's output that says what went wrong: the first
    compiler's or linker's "error:", else the last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if "error:" in line.lower()]
    return named[0] if named else (lines[-1] if lines else "")


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
