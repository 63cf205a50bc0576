"""Why no GPU is usable here, in words a user can act on (`cgtree info`).

cgtree's C side answers only "available or not" (cuda_available()). When the
answer is no, this asks the CUDA driver itself through ctypes, in the order
that separates the cases: no driver library at all (a machine without an
NVIDIA driver: nothing to upgrade), a driver that fails to start (cuInit's
error, e.g. CUDA_ERROR_NO_DEVICE), or a driver that sees no GPU.
"""
import ctypes


def _driver_error(lib, code):
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"error {code}"


def no_gpu_reason():
    """One line saying why the CUDA driver offers no GPU, or None if it offers one."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver is installed (libcuda.so.1 not found), so no GPU can be used"
    code = lib.cuInit(0)
    if code != 0:
        return f"the NVIDIA driver did not start: cuInit failed with {_driver_error(lib, code)}"
    count = ctypes.c_int(0)
    code = lib.cuDeviceGetCount(ctypes.byref(count))
    if code != 0:
        return f"the NVIDIA driver cannot count GPUs: {_driver_error(lib, code)}"
    if count.value == 0:
        return "the NVIDIA driver sees no GPU"
    return None
