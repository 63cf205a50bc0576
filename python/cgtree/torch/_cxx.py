"""The C++ pieces of cgtree.torch built against the PyTorch that runs.

Two things cgtree must tell PyTorch can only be said in C++, through
PyTorch's public C++ declarations:

- record_stream_hook.cc: PyTorch's recordStream calls (Tensor.record_stream,
  and autograd's engine for a gradient made on one stream and read on
  another) reach cgtree's allocator only through a hook set with
  CUDAPluggableAllocator::set_record_stream_fn (_record_stream.py);
- oom_error.cc: out of memory raised as PyTorch's own exception class,
  c10::OutOfMemoryError, which its Python bindings turn into
  torch.OutOfMemoryError (_oom_error.py).

``library()`` builds both into one shared library with
torch.utils.cpp_extension, PyTorch's own tool for building against the
PyTorch that runs (the right include paths, C++ ABI and libraries), and
caches it, in a folder of its own under ``TORCH_EXTENSIONS_DIR`` or
~/.cache/torch_extensions; the first build takes some seconds. Where it
cannot be built (no C++ compiler, no ninja, no CUDA headers) each piece
falls back and says so (install() warns for the hook; out of memory is then
a RuntimeError with the same text).
"""
import ctypes
import glob
import os
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [os.path.join(HERE, "record_stream_hook.cc"), os.path.join(HERE, "oom_error.cc")]
NAME = "cgtree_torch_cxx"
LOCK_WAIT_SECONDS = 120  # another process's build takes seconds; a lock older than this was left behind


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
    """The library's own build folder under PyTorch's extensions root
    (TORCH_EXTENSIONS_DIR, else cpp_extension.get_default_build_root()),
    one per PyTorch, CUDA and Python."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    tag = "%s-torch%s-cuda%s-py%d%d" % ((NAME, torch.__version__, torch.version.cuda) + tuple(sys.version_info[:2]))
    return os.path.join(root, tag)


def wait_for_lock(directory, seconds):
    """cpp_extension.load waits without end while its build folder's lock
    file exists, and a process killed during the build leaves it behind:
    every later install would hang. So we wait `seconds` for another
    process's build, then give up (install goes on without the library,
    and warns, naming the file)."""
    lock = os.path.join(directory, "lock")
    deadline = time.monotonic() + seconds
    while os.path.exists(lock):
        if time.monotonic() >= deadline:
            raise RuntimeError("the build lock %s stayed %g s: another process builds cgtree's C++ library, or "
                               "one that stopped left it (remove it if no build runs)" % (lock, seconds))
        time.sleep(0.1)


def build():
    """The path of the built library (built once, then cached). Linked to
    PyTorch's own libraries only: CUDA's runtime is not linked (the library
    calls none of it), so no second copy of it comes into the process."""
    from torch.utils import cpp_extension

    include = cuda_include()
    if include is None:
        raise RuntimeError("no CUDA headers (cuda_runtime_api.h) found: set CUDA_HOME")
    directory = build_directory()
    os.makedirs(directory, exist_ok=True)
    wait_for_lock(directory, LOCK_WAIT_SECONDS)
    return cpp_extension.load(name=NAME, sources=SOURCES, extra_cflags=["-O2"], extra_include_paths=[include],
                              extra_ldflags=["-ltorch_cuda", "-lc10_cuda"], build_directory=directory,
                              with_cuda=False, is_python_module=False, verbose=False)


def first_error(text):
    """The line of a build's output that says what went wrong: the first
    compiler's or linker's "error:", else the last line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if "error:" in line.lower()]
    return named[0] if named else (lines[-1] if lines else "")


_built = {}  # "result": the library's path, or the exception its build raised
_built_lock = threading.Lock()


def library():
    """The built library's path, built at the first call (later calls give
    the same path, or raise the first call's exception again)."""
    with _built_lock:
        if "result" not in _built:
            try:
                _built["result"] = build()
            except Exception as e:  # noqa: BLE001 -- kept, and raised to each caller
                _built["result"] = e
        result = _built["result"]
    if isinstance(result, Exception):
        raise result
    return result


def why_not_built(e):
    """The reason, in one line, a build failed."""
    return "building cgtree's C++ library failed: %s: %s" % (type(e).__name__, first_error(str(e)))


class Unavailable(Exception):
    """The library, or one of its functions, cannot be had; str(): why."""


def function(library, name, missing):
    """(path, the function `name` of the library `library()` gives), or
    Unavailable saying why: the build's error, or that the library at path
    `missing` (a phrase: "has no thrower") where it lacks the function."""
    try:
        path = library()
    except Exception as e:  # noqa: BLE001 -- any failure of the build is reported, not raised
        raise Unavailable(why_not_built(e)) from None
    try:
        return path, getattr(ctypes.CDLL(path), name)
    except (OSError, AttributeError) as e:
        raise Unavailable("the library %s %s: %s" % (path, missing, e)) from None
