"""Out of memory raised as torch.OutOfMemoryError, PyTorch's own class.

cgtree's allocation function throws a C++ exception when it refuses
(python/_torch_ext/oom.cc). PyTorch's bindings raise torch.OutOfMemoryError
for c10::OutOfMemoryError only, so ``set_thrower`` hands oom.cc the function
of cgtree's C++ library (oom_error.cc, built by _cxx.py) that throws that
class. Without the library an eager out of memory is a RuntimeError with
the same text ("CUDA out of memory. Tried to allocate ..."); a compiled
graph's call raises torch.OutOfMemoryError either way (segment.c).
``stats()["torch_out_of_memory_error"]`` says which.
"""
import ctypes

from .. import _torch_ext as _ext
from . import _cxx


def _ext_lib():
    """The extension's loaded image (dlopen gives the same one), its two
    out-of-memory entries typed."""
    lib = ctypes.CDLL(_ext.__file__)
    lib.cgt_torch_set_oom_thrower.argtypes = [ctypes.c_void_p]
    lib.cgt_torch_set_oom_thrower.restype = None
    lib.cgt_torch_alloc_exception.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                                              ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    lib.cgt_torch_alloc_exception.restype = ctypes.c_int
    return lib


def set_thrower(library=_cxx.library):
    """Hands oom.cc the thrower of the library `library()` gives. (True,
    library path) when set; (False, why) when not, having changed
    nothing."""
    try:
        path, thrower = _cxx.function(library, "cgt_torch_throw_out_of_memory", "has no thrower")
    except _cxx.Unavailable as e:
        return (False, str(e))
    _ext_lib().cgt_torch_set_oom_thrower(ctypes.cast(thrower, ctypes.c_void_p).value)
    return (True, path)


def clear_thrower():
    """Refusals throw std::runtime_error again (RuntimeError in Python)."""
    _ext_lib().cgt_torch_set_oom_thrower(None)


def alloc_exception(size, device, stream):
    """(type name, text) of what cgtree's allocation function throws when
    PyTorch asks it for `size` bytes on `device` for `stream` (raw handle),
    caught in C++; None if it gave memory (freed at once)."""
    name, what = ctypes.create_string_buffer(256), ctypes.create_string_buffer(1024)
    if _ext_lib().cgt_torch_alloc_exception(size, device, stream, name, 256, what, 1024) == 0:
        return None
    return name.value.decode(), what.value.decode()
