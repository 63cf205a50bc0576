"""Value.view(dtype, shape): a value's bytes with a dtype and a shape, without a copy.

On the simulator the view is a numpy array over the pool memory (through
DLPack, so the array keeps the Value, and with it the tree, alive). On CUDA
it is a ValueView, which speaks DLPack and __cuda_array_interface__:
torch.from_dlpack(v.view("float32", (8, 256))) or cupy.asarray(...) read it
without a copy. Either way the view is valid while the value is live; after
the value is released or its step ends, the memory stays allocated (the tree
holds it) but later runs may overwrite it.
"""

# DLPack type codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6.
_DTYPES = {
    "int8": (0, 8, "<i1"), "int16": (0, 16, "<i2"), "int32": (0, 32, "<i4"), "int64": (0, 64, "<i8"),
    "uint8": (1, 8, "|u1"), "uint16": (1, 16, "<u2"), "uint32": (1, 32, "<u4"), "uint64": (1, 64, "<u8"),
    "float16": (2, 16, "<f2"), "float32": (2, 32, "<f4"), "float64": (2, 64, "<f8"),
    "bfloat16": (4, 16, None), "complex64": (5, 64, "<c8"), "complex128": (5, 128, "<c16"),
    "bool": (6, 8, "|b1"),
}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64", "int": "int32",
            "bool_": "bool", "cfloat": "complex64", "cdouble": "complex128"}


def dtype_info(dtype):
    """(DLPack code, bits, typestr or None, name) of a dtype given as a name, a numpy dtype or a torch dtype."""
    if isinstance(dtype, str):
        name = dtype
    else:
        name = getattr(dtype, "name", None)  # numpy dtypes
        if not isinstance(name, str):
            name = getattr(dtype, "__name__", None) or str(dtype)  # numpy scalar types; torch.float32
    name = name.replace("torch.", "")
    name = _ALIASES.get(name, name)
    if name not in _DTYPES:
        raise TypeError(f"cgtree: unsupported dtype {dtype!r}")
    code, bits, typestr = _DTYPES[name]
    return code, bits, typestr, name


class ValueView:
    """A typed, shaped window on a live Value's memory (DLPack and, on CUDA, __cuda_array_interface__)."""

    __slots__ = ("value", "dtype", "shape", "_code", "_bits", "_typestr")

    def __init__(self, value, dtype, shape=None):
        code, bits, typestr, name = dtype_info(dtype)
        item = bits // 8
        if shape is None:
            shape = (value.nbytes // item,)
        elif isinstance(shape, int):
            shape = (shape,)
        self.value, self.dtype, self.shape = value, name, tuple(int(d) for d in shape)
        self._code, self._bits, self._typestr = code, bits, typestr
        value._dlpack(code, bits, self.shape)  # checks liveness and size now; the capsule is dropped

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("cgtree values are exported without a copy (copy=True is not supported)")
        if dl_device is not None and tuple(dl_device) != self.value.__dlpack_device__():
            raise BufferError(f"the value lives on {self.value.__dlpack_device__()}, not {tuple(dl_device)}")
        return self.value._dlpack(self._code, self._bits, self.shape, stream, max_version)

    def __dlpack_device__(self):
        return self.value.__dlpack_device__()

    @property
    def __cuda_array_interface__(self):
        cai = self.value.__cuda_array_interface__  # AttributeError on the simulator
        if self._typestr is None:
            raise AttributeError(f"__cuda_array_interface__ has no typestr for {self.dtype}; use DLPack")
        cai = dict(cai)
        cai["shape"] = self.shape
        cai["typestr"] = self._typestr
        return cai

    def __repr__(self):
        return f"<cgtree.ValueView {self.dtype}{list(self.shape)} of {self.value!r}>"


def view(value, dtype, shape=None):
    v = ValueView(value, dtype, shape)
    if value.tree.backend == "sim":
        import numpy
        return numpy.from_dlpack(v)
    return v


def host_array(ptr, dtype, shape):
    """A numpy array over simulator device memory at ptr (for simulator kernels written in Python)."""
    import numpy
    from ._cgtree import host_memory
    dt = numpy.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for d in shape:
        count *= d
    return numpy.frombuffer(host_memory(ptr, count * dt.itemsize), dtype=dt).reshape(shape)
