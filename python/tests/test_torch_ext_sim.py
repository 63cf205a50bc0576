"""The C half of cgtree.torch (cgtree._torch_ext) on the CPU simulator.

No torch and no GPU: a fake tensor type stands in for torch.Tensor (it has
data_ptr(), and it allocates through the very allocator functions PyTorch
would call), a fake from_dlpack consumes the backend's output capsules the
way torch.from_dlpack does, and "compiled graphs" are Python functions that
allocate fake tensors and enqueue simulator kernels. Everything else is the
real hot path: arguments, cgt_run, recording and replay, output capsules and
their deleters, the registry of outputs, steps from the generation counter,
stale outputs, and the allocator's routing into the pool.
"""
import contextlib
import ctypes
import gc
import sys
import threading
import types
import warnings
import weakref

import pytest

X = pytest.importorskip("cgtree._torch_ext")

ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT = 0, 1, 2

_lib = ctypes.CDLL(X.__file__)  # the same loaded image: shares the allocator's state
_lib.cgt_torch_alloc.restype = ctypes.c_void_p
_lib.cgt_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
_lib.cgt_torch_free.restype = None
_lib.cgt_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
_lib.cgt_torch_record_stream.restype = ctypes.c_int
_lib.cgt_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_rename = ctypes.pythonapi.PyCapsule_SetName
_capsule_rename.restype = ctypes.c_int
_capsule_rename.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED = b"used_dltensor"  # kept alive: the capsule keeps a pointer to it


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManaged(ctypes.Structure):
    _fields_ = [("dl", DLTensor), ("ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class Generation:
    generation = 0  # what Dynamo bumps at every call of a compiled model


class FakeStorage:
    """What a torch tensor's untyped_storage() is to cgtree: a key (_cdata)
    that the mark function takes, and a flag that makes every access of the
    data raise, through any tensor sharing the storage. It frees the DLPack
    tensor it wraps when it dies, as PyTorch's StorageImpl does."""

    live = weakref.WeakValueDictionary()  # _cdata -> storage, as PyTorch finds a StorageImpl by address

    def __init__(self, managed=None, owned=None, base=None, nbytes=0):
        self.managed, self.owned, self.error = managed, owned, None  # owned: (ptr, nbytes) allocated for it
        self.base, self.nbytes = base, nbytes  # where its memory begins, and its size
        self._cdata = id(self)
        FakeStorage.live[self._cdata] = self

    def check(self):
        if self.error is not None:
            raise RuntimeError(self.error)

    def __del__(self):
        if self.managed is not None:
            addr, deleter = self.managed
            deleter(addr)
        if self.owned is not None:
            _lib.cgt_torch_free(self.owned[0], self.owned[1], -1, None)


marks = []  # (key, message) of every call of the stand-in mark function


def fake_mark(cdata, msg):
    """torch._C._set_storage_data_ptr_access_error_msg's stand-in."""
    marks.append((cdata, msg))
    FakeStorage.live[cdata].error = msg


class FakeTensor:
    """n float32s of simulator memory; allocated through cgt_torch_alloc unless ptr is given.
    To cgtree it lies on CUDA device 0, the sim trees' device (is_cuda,
    get_device(), and dl_device for the stand-in exchange table)."""
    is_cuda = True
    dl_device = (2, 0)  # kDLCUDA, 0

    def get_device(self):
        return 0


    def __init__(self, n, ptr=None, managed=None, storage=None):
        self.n, self.nbytes = n, 4 * n
        # Device -1: host memory outside launches (PyTorch never asks for it), so this
        # module can share a process with cgtree.torch's real allocator. The storage
        # frees it, as PyTorch's StorageImpl does.
        owned = None
        if ptr is None:
            ptr = _lib.cgt_torch_alloc(self.nbytes, -1, None)
            if ptr is None:  # refused: PyTorch raises what oom.cc throws
                raise RuntimeError("CUDA out of memory. Tried to allocate %d bytes (the simulator)" % self.nbytes)
            owned = (ptr, self.nbytes)
        self.ptr = ptr
        # managed: (address of the DLManagedTensor, its deleter)
        self.storage = storage or FakeStorage(managed, owned, base=ptr, nbytes=self.nbytes)

    def untyped_storage(self):
        return self.storage

    def view(self):
        """A new tensor object over the same storage, as y.view(-1) or y[:] is."""
        t = FakeTensor(self.n, ptr=self.ptr, storage=self.storage)
        t.storage_offset_bytes = self.storage_offset_bytes
        return t

    storage_offset_bytes = 0  # where its data begins in its storage (storage_offset() * 4)

    def storage_offset(self):
        return self.storage_offset_bytes // 4

    def element_size(self):
        return 4

    dtype = "float32"  # every fake tensor's: what cgtree compares of an output and the input it aliases
    requires_grad = False  # a test sets it on an output, as autograd's Function does on a training forward's

    def as_strided(self, size, stride, storage_offset):
        """A view over the same storage at storage_offset (elements), as
        Tensor.as_strided is (dense strides only, as the fakes' layouts)."""
        n = 1
        for d in size:
            n *= d
        t = FakeTensor(n, ptr=self.ptr - self.storage_offset_bytes + 4 * storage_offset, storage=self.storage)
        t.storage_offset_bytes = 4 * storage_offset
        return t

    def narrow(self, start, length):
        """`length` elements from `start` on, over the same storage, as y[start:start + length] is."""
        t = FakeTensor(length, ptr=self.ptr + 4 * start, storage=self.storage)
        t.storage_offset_bytes = self.storage_offset_bytes + 4 * start
        return t

    def data_ptr(self):
        self.storage.check()
        return self.ptr

    def values(self):
        self.storage.check()
        return list((ctypes.c_float * self.n).from_address(self.ptr))

    _version = 0  # writes in place (fill), as Tensor._version counts them

    def fill(self, vals):
        self.storage.check()
        (ctypes.c_float * self.n).from_address(self.ptr)[:] = vals
        self._version += 1
        return self

    def clone(self):
        return FakeTensor(self.n).fill(self.values())

    def size(self):
        return (self.n,)

    def stride(self):
        return (1,)

    def set_(self, source, storage_offset=None, size=None, stride=None):
        """Takes source's storage and layout, keeping this object, as Tensor.set_ does;
        or a storage with the layout given."""
        if isinstance(source, FakeStorage):
            assert tuple(stride) == (1,)
            self.storage, self.storage_offset_bytes = source, 4 * storage_offset
            self.n, self.ptr = size[0], source.base + 4 * storage_offset
            self.nbytes = 4 * self.n
            return self
        self.n, self.nbytes, self.ptr, self.storage = source.n, source.nbytes, source.ptr, source.storage
        return self


def fake_from_dlpack(cap):
    addr = _capsule_ptr(cap, b"dltensor")
    m = DLManaged.from_address(addr)
    n = 1
    for d in range(m.dl.ndim):
        n *= m.dl.shape[d]
    t = FakeTensor(n, ptr=m.dl.data + m.dl.byte_offset, managed=(addr, m.deleter))
    t.storage_offset_bytes = m.dl.byte_offset  # as torch.from_dlpack makes it: the storage begins at data
    t.storage.base, t.storage.nbytes = m.dl.data, m.dl.byte_offset + 4 * n
    _capsule_rename(cap, _USED)
    return t


class FakeOutOfMemoryError(RuntimeError):
    """torch.OutOfMemoryError's stand-in."""


_caller_stream = [0]  # what the raw stream getter's stand-in answers: the caller's current stream


@contextlib.contextmanager
def caller_stream(stream):
    """torch.cuda.stream(stream)'s stand-in for the calls made inside."""
    before = _caller_stream[0]
    _caller_stream[0] = stream
    try:
        yield
    finally:
        _caller_stream[0] = before


def init_hot_path(ptrs_equal=None, mark_step_cls=None, mark=None):
    """The hot path on the simulator's stand-ins; mark: PyTorch's storage
    marking's stand-in (fake_mark by default)."""
    X.init_hot_path(fake_from_dlpack, lambda device: _caller_stream[0], Generation, FakeTensor, None, None, ptrs_equal,
                    mark or fake_mark, mark_step_cls, FakeOutOfMemoryError)


def fake_move_out(ts):
    """cgtree.torch._backend.move_out_of_pool's stand-in: each tensor set_
    to a new storage, one per old storage, and one for old storages whose
    tensors reach overlapping memory (so views of one another stay so, as
    do outputs tied apart), holding the bytes from the lowest storage
    offset among them on, each at its old storage's place, its layout
    kept; a boolean per tensor. (Fake tensors have no autograd _base, which
    the real mover moves with a view over its storage.)"""
    storages = {}
    for t in ts:
        storages.setdefault(t.untyped_storage()._cdata, (t.untyped_storage(), []))[1].append(t)
    spans = sorted(((old.base + min(t.storage_offset_bytes for t in group), old, group)
                    for old, group in storages.values()), key=lambda e: e[0])
    merged, apart = [], []  # [lo, hi, [(old storage, its tensors)]]
    for used, old, group in spans:
        old.check()
        if used >= old.base + old.nbytes:
            apart.append([old.base, old.base + old.nbytes, [(old, group)]])
        elif merged and used < merged[-1][1]:
            merged[-1][0] = min(merged[-1][0], old.base)
            merged[-1][1] = max(merged[-1][1], old.base + old.nbytes)
            merged[-1][2].append((old, group))
        else:
            merged.append([old.base, old.base + old.nbytes, [(old, group)]])
    for m in merged:
        if len(m[2]) > 1:
            m[0] -= m[0] % 64  # as the real mover's _ALIGN
    for lo, hi, members in merged + apart:
        ptr = _lib.cgt_torch_alloc(hi - lo, -1, None)
        if ptr is None:
            raise FakeOutOfMemoryError("CUDA out of memory (the simulator)")
        new = FakeStorage(owned=(ptr, hi - lo), base=ptr, nbytes=hi - lo)
        for old, group in members:
            start = min(t.storage_offset_bytes for t in group)
            ctypes.memmove(ptr + (old.base - lo) + start, old.base + start, old.nbytes - start)
            for t in group:
                t.set_(new, (old.base - lo) // 4 + t.storage_offset(), t.size(), t.stride())
    return [True] * len(ts)


init_hot_path()
X.set_output_mover(fake_move_out)


def describe(res):
    for i, o in enumerate(res):
        if isinstance(o, FakeTensor) and not o.is_cuda:  # as cgtree.torch's describe says of a CPU tensor
            return "output %d is a tensor on cpu (a recording returns CUDA tensors only)" % i
    metas, first_seen, first_over = [], {}, {}
    for i, o in enumerate(res):  # ties as cgtree.torch's describe finds them: the same object, or over one storage
        if not isinstance(o, FakeTensor):
            metas.append(None)
            continue
        tie = first_seen.setdefault(id(o), i)
        same = int(tie != i)
        if not same:
            tie = first_over.setdefault(id(o.storage), i)
        metas.append((o.ptr, o.nbytes, (o.n,), (1,), 2, 32, o.storage_offset_bytes, tie if tie != i else -1, same))
    consts = tuple(None if isinstance(o, FakeTensor) else o for o in res)
    return isinstance(res, list), tuple(metas), consts


def alias(t, ptr):
    a = FakeTensor(t.n, ptr=ptr)
    a.storage_offset_bytes = t.storage_offset_bytes  # as cgtree.torch's alias keeps the caller's storage offset
    return a


def span(t):
    return t.nbytes


def k_affine(dst, src, n, a, b):
    d = (ctypes.c_float * n).from_address(dst)
    s = (ctypes.c_float * n).from_address(src)
    for i in range(n):
        d[i] = s[i] * a + b


def affine(stream, x, a, b):
    """A new tensor a * x + b, launched on stream (k_affine)."""
    out = FakeTensor(x.n)
    X.sim_launch(stream, k_affine, out.ptr, x.ptr, x.n, a, b)
    return out


def k_add(dst, x, y, n):
    d = (ctypes.c_float * n).from_address(dst)
    a = (ctypes.c_float * n).from_address(x)
    b = (ctypes.c_float * n).from_address(y)
    for i in range(n):
        d[i] = a[i] + b[i]


class Graph:
    """A fake compiled graph: out = x * a + b, through a temporary, counted."""

    def __init__(self, tree, a, b, extra=(), stream=None):
        self.tree, self.a, self.b, self.calls, self.extra = tree, a, b, 0, tuple(extra)
        self.stream = stream or (lambda: tree.stream)  # where its kernels go: the running tree's stream

    def __call__(self, x, *rest):
        self.calls += 1
        tmp = FakeTensor(x.n)  # freed inside the launch: its block is reused at once
        X.sim_launch(self.stream(), k_affine, tmp.ptr, x.ptr, x.n, self.a, 0.0)
        out = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, out.ptr, tmp.ptr, x.n, 1.0, self.b)
        del tmp
        return (out,) + self.extra


def segment(tree, graph, kinds=(ARG_TENSOR,), spans=None, name="g", **kw):
    """A Segment of graph; kw: Segment's keywords (saved_from, backward, grad_inputs, written_inputs...)."""
    def launch(inputs):
        return graph(*inputs)

    spans = spans or tuple(0 for _ in kinds)
    return X.Segment(tree, name, graph, launch, alias, describe, span, bytes(kinds), tuple(spans), 0, False, **kw)


def weighted_segment(tree, n_static, name):
    """A graph of x and n_static weights (STATIC inputs) computing x + the
    first weight; the other weights are read by nothing, as unused
    parameters."""
    def add_first_weight(x, *ws):
        out = FakeTensor(x.n)
        X.sim_launch(tree.stream, k_add, out.ptr, x.ptr, ws[0].ptr, x.n)
        return [out]

    kinds = (ARG_TENSOR,) + (ARG_TENSOR_STATIC,) * n_static
    return segment(tree, add_first_weight, kinds=kinds, spans=(16,) * (1 + n_static), name=name)


@pytest.fixture
def tree():
    X.set_output_mover(fake_move_out)  # another test file of the process may have installed cgtree.torch's
    t = X.Tree(0, backend="sim")
    yield t
    t.check()


def call(seg, *args):
    Generation.generation += 1  # a new call of the compiled model
    return seg(*args)


def replaying(tree, a=1.0, b=1.0, fill=(0, 0, 0, 0)):
    """A segment of Graph(a, b) and its input x, called until it replays."""
    seg = segment(tree, Graph(tree, a, b), spans=(16,))
    x = FakeTensor(4).fill(list(fill))
    for _ in range(3):
        call(seg, x)
    return seg, x


def test_out_of_host_memory_for_the_output_registry_raises_memory_error_and_loses_nothing(tree):
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    gc.collect()  # no output alive: the next call makes the registry's table again
    before = tree.stats()
    X._fail_host_alloc(1)
    try:
        with pytest.raises(MemoryError):
            call(seg, x)
    finally:
        X._fail_host_alloc(0)
    (y,) = call(seg, x)  # the value the failed call made went back; the next call works
    assert y.values() == [3, 5, 7, 9]
    del y
    gc.collect()
    call(seg, x)
    after = tree.stats()
    assert after["outputs_alive"] <= before["outputs_alive"] + 1
    assert after["pool_allocated_bytes"] == before["pool_allocated_bytes"]


def _ns(**kw):
    """A fault loop's state: trees (each checked after the runs) and the rest."""
    return types.SimpleNamespace(**kw)


def each_host_allocation_failed_in_turn(setup, run, limit=5000):
    """The SQLite habit: for n = 1, 2, ..., a fresh setup() (nothing
    failing), then run(state) with the extension's n-th host allocation
    failing. The run raises MemoryError (or PyTorch's out-of-memory error,
    where the allocator's hook refused a block) or finishes, and run()
    checks every value it reads, so a failure that loses or corrupts
    anything fails it; run(state) again, nothing failing, then finishes
    with the right values, and each tree's invariants hold. Ends at the
    first n the run never reaches; returns the n at which a run raised.
    What lived before the loop is frozen out of its collections (gc.freeze),
    which with torch imported cost more than the runs."""
    raised = []
    gc.collect()
    gc.freeze()
    try:
        return _fail_each_in_turn(setup, run, limit, raised)
    finally:
        gc.unfreeze()


def _fail_each_in_turn(setup, run, limit, raised):
    for n in range(1, limit):
        state = setup()
        X._fail_host_alloc(n)
        try:
            run(state)
        except (MemoryError, FakeOutOfMemoryError):
            raised.append(n)
        except BaseException as e:
            e.add_note("in the run whose allocation %d failed" % n)
            raise
        finally:
            left = X._fail_host_alloc(0)
        gc.collect()
        try:
            run(state)  # recovers: nothing lost, nothing stale
            for t in state.trees:
                t.check()
        except BaseException as e:
            e.add_note("in the run after allocation %d failed (raised: %s)" % (n, raised[-1:] == [n]))
            raise
        del state
        gc.collect()
        if left > 0:  # the run made fewer than n allocations: every one has failed once
            print("fault loop: %d allocations failed in turn, %d raised" % (n - 1, len(raised)))
            return raised
    pytest.fail("more than %d host allocations in one run" % limit)


def test_each_host_allocation_of_a_call_that_reads_another_trees_output_can_fail_and_loses_nothing():
    """enc on tree A, dec on tree B reading enc's output (a read of another
    tree's output: a read in flight, a note of the reading stream), each
    probed, warmed up, recorded and replayed: every host allocation of the
    extension on that path fails in turn."""
    X.set_output_mover(fake_move_out)

    def setup():
        st = _ns(trees=[X.Tree(0, backend="sim"), X.Tree(0, backend="sim")])
        a, b = st.trees
        st.enc = segment(a, Graph(a, 2.0, 1.0), spans=(16,), name="enc")
        st.dec = segment(b, Graph(b, 1.0, 0.0), spans=(16,), name="dec")
        st.x = FakeTensor(4)
        return st

    def run(st):
        for i in range(5):
            st.x.fill([i, i + 1, i + 2, i + 3])
            (y,) = call(st.enc, st.x)
            (z,) = st.dec(y)
            want = [2 * v + 1 for v in (i, i + 1, i + 2, i + 3)]
            assert y.values() == want and z.values() == want
            del y, z

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_a_training_step_with_a_kept_grad_can_fail_and_loses_nothing():
    """Training steps with zero_grad(set_to_none=False): forward, backward,
    AccumulateGrad, a compiled optimizer call that reads .grad, and the
    kept .grad moved out of the pool at each step's end. Every host
    allocation of the extension on that path fails in turn; the loss, the
    update and the gradient are checked each step."""
    X.set_output_mover(fake_move_out)

    def setup():
        tree = X.Tree(0, backend="sim")
        st = _ns(trees=[tree])
        st.fw, st.bw, st.w, st.x, st.t = param_training_pair(tree)
        st.opt = optimizer_segment(tree)
        return st

    def run(st):
        for _ in range(4):
            if st.w.grad is not None:
                st.w.grad.fill([0, 0, 0, 0])  # zero_grad(set_to_none=False)
            out, saved = call(st.fw, st.x, st.w)
            (g,) = st.bw(saved, st.t)
            st.w.accumulate(g)
            del saved, g
            (u,) = call(st.opt, st.w, st.w.grad)
            assert out.values() == [1, 2, 3, 4] and u.values() == [2, 3, 4, 5] and st.w.grad.values() == [2, 3, 4, 5]
            del out, u
        assert st.trees[0].stats()["gradients_moved"] >= 1

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_zero_stats_has_every_key_of_a_trees_stats_each_zero(tree):
    zero = X.zero_stats()
    assert set(zero) == set(tree.stats()) and not any(zero.values())


def test_a_segment_is_probed_warmed_recorded_then_replayed(tree):
    g = Graph(tree, 2.0, 1.0)
    seg = segment(tree, g, spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(6):
        x.fill([1, 2, 3, 4])
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
        x.fill([1 + i, 2, 3, 4])
        (y,) = call(seg, x)
        assert y.values() == [2 * (1 + i) + 1, 5, 7, 9]
    assert g.calls == 3  # the plain first call, one warmup, one recording; never for a replay
    s = tree.stats()
    assert s["recordings"] == 1 and s["replays"] == 12 - 3
    assert seg.info["registered"] and seg.info["plain_reason"] is None


def test_a_graph_that_mutates_no_input_runs_again_at_its_first_call_so_its_outputs_lie_in_the_pool(tree):
    for rerun in (False, True):
        g = Graph(tree, 2.0, 1.0)
        seg = X.Segment(tree, "rerun%d" % rerun, g, lambda inputs, g=g: g(*inputs), alias, describe, span,
                        bytes((ARG_TENSOR,)), (16,), 0, False, rerun)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        before = X.alloc_figures()["eager_in_use"]
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
        grew = X.alloc_figures()["eager_in_use"] - before  # y is alive here
        if rerun:
            assert g.calls == 2  # the plain call, then the first warmup through cgt_run
            assert grew == 0  # the plain output died; y is the pool's
            assert tree.stats()["warmups"] >= 1
        else:
            assert g.calls == 1
            assert grew == 512  # y is the plain call's own output, outside the pool
        del y
        for _ in range(4):
            (y,) = call(seg, x)
            assert y.values() == [3, 5, 7, 9]
        assert g.calls == 3  # with or without the rerun: plain call, one warmup, one recording


def test_allocations_in_a_launch_come_from_the_pool_and_replays_allocate_nothing(tree):
    g = Graph(tree, 1.0, 0.0)
    seg = segment(tree, g, spans=(64,))
    x = FakeTensor(16).fill([1.0] * 16)
    f0 = X.alloc_figures()
    for _ in range(3):
        call(seg, x)
    f1 = X.alloc_figures()
    assert f1["pool_allocs"] - f0["pool_allocs"] == 4  # tmp and out, in the warmup and the recording
    assert f1["pool_frees_in_launch"] - f0["pool_frees_in_launch"] == 2  # tmp, inside each launch
    for _ in range(20):
        (y,) = call(seg, x)
    f2 = X.alloc_figures()
    assert f2["pool_allocs"] == f1["pool_allocs"]
    assert f2["eager_allocations"] == f1["eager_allocations"]
    assert y.values() == [1.0] * 16


def test_memory_outside_the_pool_is_counted_in_use_as_pytorch_counts_it():
    f0 = X.alloc_figures()
    big = 3 * (1 << 20) + 100  # "in use" rounds each request up to 512 bytes, as PyTorch counts
    p = _lib.cgt_torch_alloc(big, -1, None)
    q = _lib.cgt_torch_alloc(100, -1, None)
    f1 = X.alloc_figures()
    assert f1["eager_in_use"] - f0["eager_in_use"] == (big + 511) // 512 * 512 + 512
    assert f1["eager_peak"] >= f1["eager_in_use"]
    _lib.cgt_torch_free(p, big, -1, None)
    _lib.cgt_torch_free(q, 100, -1, None)
    f2 = X.alloc_figures()
    assert f2["eager_in_use"] == f0["eager_in_use"]
    assert f2["eager_allocations"] - f0["eager_allocations"] == 2 == f2["eager_frees"] - f0["eager_frees"]
    X.reset_peak()
    assert X.alloc_figures()["eager_peak"] == f2["eager_in_use"]


def test_the_combined_peak_counts_pool_and_eager_bytes_in_use_at_one_moment(tree):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    X.reset_peak()
    f0 = X.alloc_figures()
    assert f0["combined_peak"] == f0["eager_in_use"] + f0["pool_in_use"]
    for _ in range(4):  # probe, warm-up, recording, replay: the launches take pool memory
        (y,) = call(seg, x)
    f1 = X.alloc_figures()
    # reported after every run; the figure is the process's, with other trees alive (earlier test files')
    assert f1["pool_in_use"] - f0["pool_in_use"] == tree.stats()["pool_allocated_bytes"]
    # the launch's temporary and its output were in the pool at once, beside x outside it
    assert f1["combined_peak"] >= f0["eager_in_use"] + 2 * 16
    assert f1["combined_peak"] <= f1["eager_peak"] + f0["pool_in_use"] + tree.stats()["pool_peak_bytes"]
    big = _lib.cgt_torch_alloc(1 << 20, -1, None)  # outside the pool, on top of what the pool holds
    f2 = X.alloc_figures()
    assert f2["combined_peak"] >= f2["eager_in_use"] + f2["pool_in_use"]
    _lib.cgt_torch_free(big, 1 << 20, -1, None)
    X.reset_peak()
    f3 = X.alloc_figures()
    assert f3["combined_peak"] == f3["eager_in_use"] + f3["pool_in_use"] < f2["combined_peak"]


class CountedTensor(FakeTensor):
    reads = 0

    def data_ptr(self):
        CountedTensor.reads += 1
        return self.ptr


def test_static_pointers_are_confirmed_in_one_check_and_a_moved_one_is_seen(tree):
    checks = []

    def ptrs_equal(tensors, ptrs, idx):  # torch._C._tensors_data_ptrs_at_indices_equal's contract
        checks.append(list(idx))
        return all(tensors[i].ptr == ptrs[i] for i in idx)

    init_hot_path(ptrs_equal)
    try:
        for n_static in (8, 7):  # the check pays from 8 STATIC inputs on; below, they are read one by one
            checks.clear()
            seg = weighted_segment(tree, n_static, "w%d" % n_static)
            x = FakeTensor(4).fill([1, 2, 3, 4])
            ws = [CountedTensor(4).fill([10, 10, 10, 10]) for _ in range(n_static)]
            for _ in range(3):
                (y,) = call(seg, x, *ws)
            CountedTensor.reads = 0
            for _ in range(5):
                (y,) = call(seg, x, *ws)
                assert y.values() == [11, 12, 13, 14]
            if n_static == 7:
                assert checks == [] and CountedTensor.reads == 5 * 7
                continue
            assert CountedTensor.reads == 0  # the weights' pointers came from the one check
            assert checks[-5:] == [list(range(1, 9))] * 5
            w = ws[0]
            w2 = CountedTensor(4).fill([20, 20, 20, 20])
            w.set_(w2)  # the weight moved (param.data = ...)
            (y,) = call(seg, x, *ws)
            assert y.values() == [21, 22, 23, 24]  # a new node for the new address, not a stale replay
            assert CountedTensor.reads == 8  # the check failed: all read one by one
    finally:
        init_hot_path()


def test_eager_blocks_in_use_are_listed_by_the_serial_of_their_allocation_until_freed():
    since = X.eager_serial()
    p = _lib.cgt_torch_alloc(3000, -1, None)
    q = _lib.cgt_torch_alloc(700, -1, None)
    held = X.eager_held(since)
    assert sorted((b, a) for b, _, a in held) == sorted([(700, q), (3000, p)])
    assert all(s > since for _, s, _ in held)
    _lib.cgt_torch_free(p, 3000, -1, None)
    assert [b for b, _, _ in X.eager_held(since)] == [700]
    assert X.eager_held(X.eager_serial()) == []  # nothing allocated since
    _lib.cgt_torch_free(q, 700, -1, None)
    assert X.eager_held(since) == []


def test_the_entry_pytorchs_record_stream_hook_calls_keeps_the_stream_on_eager_blocks_and_leaves_the_rest():
    """cgt_torch_record_stream is what record_stream_hook.cc hands PyTorch's
    C++ recordStream to: it keeps a stream on an eager block once, and
    answers 1 (nothing to do, not an error) for the block's own stream, a
    pointer that is not the start of an eager block and a freed block."""
    f0 = X.alloc_figures()
    p = _lib.cgt_torch_alloc(4096, -1, None)
    assert _lib.cgt_torch_record_stream(p, 7) == 1 and _lib.cgt_torch_record_stream(p, 7) == 1
    assert X.alloc_figures()["recorded_streams"] - f0["recorded_streams"] == 1
    assert _lib.cgt_torch_record_stream(p, None) == 1  # its own stream
    assert _lib.cgt_torch_record_stream(p + 16, 9) == 1  # not a block's start: ignored
    assert X.alloc_figures()["recorded_streams"] - f0["recorded_streams"] == 1
    _lib.cgt_torch_free(p, 4096, -1, None)
    assert _lib.cgt_torch_record_stream(p, 9) == 1
    assert X.alloc_figures()["recorded_streams"] - f0["recorded_streams"] == 1


def test_a_stream_record_stream_names_for_an_output_makes_each_trees_next_launch_wait_for_it_once(tree):
    """An output's memory is written again by its tree's next launch; a
    stream record_stream names for it (a copy stream still reading it) must
    be waited for by that launch, once (pool_readers.c). The tree's own
    stream needs no wait, and a tree made after the note has no output the
    stream could read."""
    seg, x = replaying(tree)
    (y,) = call(seg, x)
    f0 = X.alloc_figures()
    assert not X.record_stream(y.ptr, 0x7a11)  # not an eager block: noted for the trees
    assert _lib.cgt_torch_record_stream(y.ptr, 0x7a11) == 1  # the hook's entry: the same note
    f1 = X.alloc_figures()
    assert f1["pool_reader_streams"] == f0["pool_reader_streams"] + 1  # one stream, noted twice
    del y
    call(seg, x)
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 1
    (y,) = call(seg, x)
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 1  # nothing new: no wait
    assert not X.record_stream(y.ptr, tree.stream)  # the tree's own stream: ordered already
    del y
    call(seg, x)
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 1
    later = X.Tree(0, backend="sim")
    later_seg, later_x = replaying(later)
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 1  # made after every note
    del later_seg, later_x
    later.check()


def test_a_read_queued_on_a_noted_stream_after_a_launch_of_the_same_step_is_waited_for_by_the_next_step(tree):
    """record_stream(y, s) promises that y's memory is not reused before
    the work queued on s when y is freed: for cgtree, when its step ends.
    The note was spent at the tree's next launch, a launch of y's own step
    that reuses none of y's memory (explicit mode, or a training step held
    open), so a copy of y queued on s after that launch was never waited
    for, and the next step's replay wrote y's memory under it (a helper's
    audit). Launches of the step wait for s again; the next step's first
    launch waits, and retires the note."""
    tree.explicit_steps = True
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):  # plain first call, warmup, recording: one step each
        tree.step_begin()
        seg(x)
    tree.step_begin()
    (y,) = seg(x)  # step k: y
    copy = 0x7a51
    assert not X.record_stream(y.ptr, copy)  # y.record_stream(copy)
    f0 = X.alloc_figures()["pool_reader_waits"]
    (z,) = seg(x)  # another launch of step k: y's memory is not reused
    assert X.alloc_figures()["pool_reader_waits"] == f0 + 1
    # the program queues y_host.copy_(y, non_blocking=True) on `copy` here: y is alive and right
    tree.step_begin()
    (y2,) = seg(x)  # step k + 1: replays into y's memory
    assert y2.ptr == y.ptr
    assert X.alloc_figures()["pool_reader_waits"] == f0 + 2, "the launch that overwrites y did not wait for the stream"
    seg(x)  # the same step: the note is retired
    tree.step_begin()
    seg(x)
    assert X.alloc_figures()["pool_reader_waits"] == f0 + 2


def test_a_caller_that_switches_streams_has_the_tree_wait_for_the_stream_its_last_outputs_went_to(tree):
    """The outputs of a call on stream s1 are the caller's on s1, which may
    copy them there (queued behind the call) while the next call comes from
    s2; the tree waited for the stream of the call it runs only, so the
    next step's replay could write the first outputs' memory under that
    copy (a helper's audit). A launch whose caller is not the last one's
    notes the last one's stream as record_stream would (pool_readers.c):
    waited for until a later step's first launch. The legacy default
    stream needs no note with a blocking tree: CUDA orders the two."""
    seg, x = replaying(tree)  # on the legacy default stream
    f0 = X.alloc_figures()
    s1, s2 = 0x5a1, 0x5a2
    with caller_stream(s1):
        (y,) = call(seg, x)  # from the legacy stream to s1: nothing to note
        y_ptr = y.ptr
    assert X.alloc_figures()["pool_reader_waits"] == f0["pool_reader_waits"]
    # the program queues y_host.copy_(y, non_blocking=True) on s1 here
    with caller_stream(s2):
        (y2,) = call(seg, x)  # the next step: replays into y's memory
    assert y2.ptr == y_ptr
    f1 = X.alloc_figures()
    assert f1["pool_reader_waits"] == f0["pool_reader_waits"] + 1, "the launch over y's memory did not wait for s1"
    with caller_stream(s2):
        call(seg, x)  # a later step's first launch: s1's note is retired
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"]
    del y, y2
    with caller_stream(s1):
        call(seg, x)  # back to s1: s2 is noted and waited for
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 1
    call(seg, x)  # to the legacy stream: s1 is noted (a stream of PyTorch's is no blocking stream)
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 2
    call(seg, x)  # one stream: nothing new
    assert X.alloc_figures()["pool_reader_waits"] == f1["pool_reader_waits"] + 2
    tree.check()


def test_a_plain_call_on_another_stream_that_reads_an_output_is_waited_for_by_the_replay_over_it(tree):
    """A launch from s1 hands y; a graph that runs plainly (its first call)
    reads y on s2; the next step's first launch, from s3, replays into y's
    memory. Noted only at launches, s2 was never waited for, and the
    replay could overwrite y under the plain call's read (a review). Every
    call notes the stream it leaves, launched or plain."""
    tree.explicit_steps = True
    a = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="a")
    b = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="b")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s1, s2, s3 = 0x6a1, 0x6a2, 0x6a3
    for _ in range(4):
        tree.step_begin()
        with caller_stream(s1):
            (y,) = a(x)  # replays from s1 at the last
    y_ptr = y.ptr
    with caller_stream(s2):
        (z,) = b(y)  # b's first call: plain, on s2, reading y
    assert z.values() == [v * 2 + 1 + 1 for v in (1, 2, 3, 4)]
    f0 = X.alloc_figures()["pool_reader_waits"]
    tree.step_begin()
    with caller_stream(s3):
        (y2,) = a(x)
    assert y2.ptr == y_ptr
    assert X.alloc_figures()["pool_reader_waits"] == f0 + 2, "the replay over y waited for s1 and s2"
    del y, y2, z
    tree.check()


def test_a_stream_one_tree_left_is_no_wait_for_another_tree():
    """The streams a tree's callers left read that tree's outputs only:
    another tree (another thread's) waits for none of them."""
    one, other = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
    seg, x = replaying(one)
    so, xo = replaying(other)
    with caller_stream(0x6c1):
        call(seg, x)
    with caller_stream(0x6c2):
        call(seg, x)  # one notes 0x6c1, and waits for it
    f0 = X.alloc_figures()["pool_reader_waits"]
    call(so, xo)
    call(so, xo)
    assert X.alloc_figures()["pool_reader_waits"] == f0
    del seg, x, so, xo
    one.check()
    other.check()


def test_a_non_blocking_tree_waits_for_the_legacy_stream_a_caller_left_and_refuses_a_stream_beside():
    """A tree made nonblocking (explicit mode's) is not ordered with the
    legacy default stream by CUDA: a caller that leaves it for s1 has the
    legacy stream noted like any other. nonblocking=True beside a stream
    handed in is a contradiction: ValueError."""
    with pytest.raises(ValueError, match="nonblocking"):
        X.Tree(0, backend="sim", stream=0x1234, nonblocking=True)
    tree = X.Tree(0, backend="sim", nonblocking=True)
    seg, x = replaying(tree)  # on the legacy default stream
    f0 = X.alloc_figures()["pool_reader_waits"]
    with caller_stream(0x5c1):
        (y,) = call(seg, x)
    assert X.alloc_figures()["pool_reader_waits"] == f0 + 1, "the legacy stream was not waited for"
    del y, seg, x
    tree.check()


def test_a_switch_of_stream_within_a_step_is_waited_for_until_the_next_steps_first_launch(tree):
    """In one step (explicit mode) the first call's outputs live on: the
    program may queue more reads of them on s1 after a launch from s2, so
    the step's later launches wait for s1 again, and so does the next
    step's first, which reuses their memory; then the note is retired."""
    tree.explicit_steps = True
    a = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    b = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s1, s2 = 0x5b1, 0x5b2

    def step():
        tree.step_begin()
        with caller_stream(s1):
            (y,) = a(x)
        with caller_stream(s2):
            b(x)  # waits for s1
        return y

    for _ in range(4):  # plain first call, warmup, recording, replay
        step()
    tree.step_begin()
    with caller_stream(s1):
        (y,) = a(x)
        y_ptr = y.ptr
    f0 = X.alloc_figures()["pool_reader_waits"]
    with caller_stream(s2):
        b(x)
    assert X.alloc_figures()["pool_reader_waits"] == f0 + 1, "b's launch did not wait for s1"
    # the program queues another copy of y on s1 here: y is alive and right
    tree.step_begin()
    with caller_stream(s2):
        (y2,) = a(x)  # the next step's first launch: into y's memory
        assert y2.ptr == y_ptr
        assert X.alloc_figures()["pool_reader_waits"] == f0 + 2, "the next step did not wait for s1"
        b(x)
        assert X.alloc_figures()["pool_reader_waits"] == f0 + 2  # retired at that step's first launch
    del y, y2
    tree.check()


def test_a_stream_named_for_an_output_that_is_capturing_is_waited_for_once_its_capture_ended(tree):
    """An event recorded on a stream that captures would be a node of that
    capture, and the tree's stream would join it: the wait is put off to a
    later launch, and made once the capture has ended."""
    seg, x = replaying(tree)
    (y,) = call(seg, x)
    copy = 0x7a12
    assert not X.record_stream(y.ptr, copy)
    del y
    f0 = X.alloc_figures()
    X.sim_capture(copy, 33)
    try:
        call(seg, x)
        call(seg, x)
        f1 = X.alloc_figures()
        assert f1["pool_reader_waits"] == f0["pool_reader_waits"]  # none while it captures
        assert f1["pool_reader_waits_put_off"] == f0["pool_reader_waits_put_off"] + 2  # one per launch
    finally:
        X.sim_capture(copy, 0)
    call(seg, x)
    call(seg, x)
    f2 = X.alloc_figures()
    assert f2["pool_reader_waits"] == f0["pool_reader_waits"] + 1  # once, after the capture
    assert f2["pool_reader_waits_put_off"] == f1["pool_reader_waits_put_off"]


def test_record_stream_is_kept_for_eager_blocks_only_and_once_per_stream():
    f0 = X.alloc_figures()
    p = _lib.cgt_torch_alloc(4096, -1, None)
    assert X.record_stream(p, 7) and X.record_stream(p, 7) and X.record_stream(p, 9)
    assert X.record_stream(p, 0)  # its own stream (None is 0): stream order covers it, nothing kept
    assert X.alloc_figures()["recorded_streams"] - f0["recorded_streams"] == 2
    assert not X.record_stream(p + 16, 7)  # not the start of a block of ours (a view's pointer, a pool block)
    _lib.cgt_torch_free(p, 4096, -1, None)
    assert not X.record_stream(p, 7)  # freed: forgotten
    for bad in (("x", 1), (1, "y")):
        with pytest.raises(TypeError):
            X.record_stream(*bad)



# The front cache (eager.c): on device -1 a stream is only a key, so these
# fake streams stand for two CUDA streams; no other test uses them.
S1, S2 = 0x5100, 0x5200


def eager_alloc(n, stream):
    return _lib.cgt_torch_alloc(n, -1, stream)


def eager_free(p, n, stream):
    _lib.cgt_torch_free(p, n, -1, stream)


def eager_figures():
    return X.alloc_figures(-1)


def class_bytes(n):
    return (n + 511) // 512 * 512


@pytest.fixture
def front_limit():
    """Restores the front cache's bound a test changes."""
    before = eager_figures()["front_cache_limit"]
    yield
    X.set_front_cache_bytes(before)


def test_a_freed_block_serves_the_next_allocation_of_its_stream_and_size_class_with_no_driver_call():
    p = eager_alloc(1000, S1)
    f0 = eager_figures()
    eager_free(p, 1000, S1)
    f1 = eager_figures()
    assert f1["front_cache_blocks"] - f0["front_cache_blocks"] == 1
    assert f1["front_cache_bytes"] - f0["front_cache_bytes"] == 1024
    assert f0["eager_in_use"] - f1["eager_in_use"] == 1024  # cached is not in use
    assert f1["driver_frees"] == f0["driver_frees"]
    since = X.eager_serial()
    q = eager_alloc(1020, S1)  # the same size class, 1024 bytes
    f2 = eager_figures()
    assert q == p
    assert f2["driver_allocations"] == f1["driver_allocations"]
    assert f2["front_cache_hits"] - f1["front_cache_hits"] == 1
    assert f2["front_cache_blocks"] == f0["front_cache_blocks"]
    assert f2["eager_in_use"] == f0["eager_in_use"]
    assert [(b, a) for b, _, a in X.eager_held(since)] == [(1020, q)]  # the new request
    eager_free(q, 1020, S1)


def test_another_stream_or_size_class_never_takes_a_cached_block():
    p = eager_alloc(1000, S1)
    eager_free(p, 1000, S1)
    f0 = eager_figures()
    q = eager_alloc(1000, S2)  # another stream: only the driver may order it after p's work
    r = eager_alloc(1600, S1)  # another size class
    f1 = eager_figures()
    assert p not in (q, r)
    assert f1["driver_allocations"] - f0["driver_allocations"] == 2
    assert f1["front_cache_hits"] == f0["front_cache_hits"]
    assert eager_alloc(1000, S1) == p  # still there for its own key
    for ptr, n, stream in ((p, 1000, S1), (q, 1000, S2), (r, 1600, S1)):
        eager_free(ptr, n, stream)


def test_a_block_another_stream_reads_or_over_16_MiB_goes_back_to_the_driver_not_to_the_front_cache():
    p = eager_alloc(4096, S1)
    assert X.record_stream(p, S2)
    big = eager_alloc((16 << 20) + 1, S1)
    f0 = eager_figures()
    eager_free(p, 4096, S1)
    eager_free(big, (16 << 20) + 1, S1)
    f1 = eager_figures()
    assert f1["front_cache_blocks"] == f0["front_cache_blocks"]
    assert f1["driver_frees"] - f0["driver_frees"] == 2
    assert not X.record_stream(p, S2)  # forgotten
    q = eager_alloc(16 << 20, S1)  # 16 MiB itself is cached
    eager_free(q, 16 << 20, S1)
    assert eager_figures()["front_cache_blocks"] - f1["front_cache_blocks"] == 1
    X.empty_cache(-1)


CAPTURE_UNKNOWN = 2**64 - 1  # what the allocator's question returns when CUDA cannot tell (ext.h)


@pytest.mark.parametrize("capture", [7, CAPTURE_UNKNOWN], ids=["a_capture", "cuda_cannot_tell"])
def test_inside_a_capture_not_ours_allocations_skip_the_front_cache_and_their_blocks_never_enter_it(capture):
    """A graph some other code captures (torch.cuda.graph) keeps writing the
    memory its capture used, temporaries it freed included: so inside such a
    capture an allocation takes no front-cached block, and a block allocated
    there goes back to the driver when freed, in its capture or after it,
    never to the front cache where an eager tensor could take it. A stream
    CUDA cannot tell about is treated the same way, the safe side."""
    p = eager_alloc(1000, S1)
    eager_free(p, 1000, S1)  # a block of S1's size class waits in the front cache
    f0 = eager_figures()
    X.sim_capture(S1, capture)
    try:
        q = eager_alloc(1000, S1)
        f1 = eager_figures()
        assert q != p, "an allocation inside a capture took a front-cached block"
        assert f1["front_cache_hits"] == f0["front_cache_hits"]
        assert f1["driver_allocations"] - f0["driver_allocations"] == 1
        assert f1["capture_allocations"] - f0["capture_allocations"] == 1
        eager_free(q, 1000, S1)  # a temporary freed inside its own capture: a free of that capture
        f2 = eager_figures()
        assert f2["front_cache_blocks"] == f1["front_cache_blocks"]
        assert f2["driver_frees"] - f1["driver_frees"] == 1
        kept = eager_alloc(1000, S1)  # the graph's output, freed after the capture
        assert kept != p
        assert eager_figures()["front_cache_hits"] == f0["front_cache_hits"]
    finally:
        X.sim_capture(S1, 0)
    f3 = eager_figures()
    eager_free(kept, 1000, S1)
    f4 = eager_figures()
    assert f4["front_cache_blocks"] == f3["front_cache_blocks"], "a capture's block entered the front cache"
    assert f4["driver_frees"] - f3["driver_frees"] == 1
    assert eager_alloc(1000, S1) == p  # outside any capture the front cache serves again
    eager_free(p, 1000, S1)
    X.empty_cache(-1)


@pytest.mark.parametrize("block", ["alive", "freed_in_its_capture"])
def test_a_trim_synchronises_the_device_only_where_no_capture_not_ours_is_known_open(block):
    """Synchronising the whole device breaks any capture open on it, in
    every capture mode, so empty_cache's trim does not synchronise while a
    capture not ours is known open: a block allocated inside it lives and its
    stream still captures with its id. Then it gives back what is free
    already, and counts it (trims_without_sync). A capture whose every block
    was freed is not known: that trim synchronises, as before."""
    X.empty_cache(-1)
    f0 = eager_figures()
    X.sim_capture(S1, 11)
    try:
        q = eager_alloc(1000, S1)
        if block == "freed_in_its_capture":
            eager_free(q, 1000, S1)
        X.empty_cache(-1)
        f1 = eager_figures()
        known = block == "alive"
        assert f1["trims_without_sync"] - f0["trims_without_sync"] == int(known)
        X.sim_capture(S2, 12)  # another stream's capture, on which nothing was allocated: not known
        X.empty_cache(-1)
        assert eager_figures()["trims_without_sync"] - f1["trims_without_sync"] == int(known)
        X.sim_capture(S2, 0)
    finally:
        X.sim_capture(S1, 0)
    f2 = eager_figures()
    X.empty_cache(-1)  # the capture ended: its block, if alive, no longer says one is open
    assert eager_figures()["trims_without_sync"] == f2["trims_without_sync"]
    if block == "alive":
        eager_free(q, 1000, S1)
    X.empty_cache(-1)


def test_a_give_back_on_a_stream_that_captures_another_capture_waits_for_its_end():
    """A block the driver must take back (over 16 MiB) freed while its
    stream captures a capture it was not allocated in: a free on that stream
    now would join or break the capture, so it waits, and goes back at the
    first flush after the capture ended."""
    big = eager_alloc((16 << 20) + 1, S1)  # outside any capture
    f0 = eager_figures()
    X.sim_capture(S1, 9)
    try:
        eager_free(big, (16 << 20) + 1, S1)
        f1 = eager_figures()
        assert f1["driver_frees"] == f0["driver_frees"]
        assert f1["frees_waiting_capture"] - f0["frees_waiting_capture"] == 1
        for _ in range(3):  # flushes while the capture is open: it waits again, counted once
            p = eager_alloc(1000, S2)
            eager_free(p, 1000, S2)
        assert eager_figures()["driver_frees"] == f0["driver_frees"]
        assert eager_figures()["frees_waiting_capture"] - f0["frees_waiting_capture"] == 1
    finally:
        X.sim_capture(S1, 0)
    p = eager_alloc(1000, S2)  # the next flush, the capture over
    eager_free(p, 1000, S2)
    assert eager_figures()["driver_frees"] - f0["driver_frees"] == 1
    X.empty_cache(-1)


def test_a_give_back_waits_too_while_a_stream_the_block_was_recorded_on_captures_another_capture():
    """A block recorded on stream S2 (Tensor.record_stream) is given back
    after S2's work: an event on S2 that S1's free waits for. While S2
    captures a capture not the block's (torch.cuda.graph on S2), that event
    would be recorded inside it and pull S1's free into it, which then
    refuses the free: the give-back waits for the capture's end, as for the
    block's own stream."""
    p = eager_alloc(4096, S1)
    assert X.record_stream(p, S2)
    f0 = eager_figures()
    X.sim_capture(S2, 42)
    try:
        eager_free(p, 4096, S1)
        f1 = eager_figures()
        assert f1["driver_frees"] == f0["driver_frees"]
        assert f1["frees_waiting_capture"] - f0["frees_waiting_capture"] == 1
    finally:
        X.sim_capture(S2, 0)
    q = eager_alloc(1000, S1)  # the next flush, the capture over
    eager_free(q, 1000, S1)
    assert eager_figures()["driver_frees"] - f0["driver_frees"] == 1
    X.empty_cache(-1)


def test_the_front_cache_keeps_its_bound_and_exact_figures_over_10000_allocations_of_1000_sizes(front_limit):
    import random

    bound = 1 << 20
    X.set_front_cache_bytes(bound)
    rng = random.Random(0)
    sizes = [rng.randrange(1, 64 << 10) for _ in range(1000)]
    f0 = eager_figures()
    live = []
    for i in range(10000):
        n, stream = sizes[i % 1000], (S1, S2)[i % 3 == 0]
        live.append((eager_alloc(n, stream), n, stream))
        if len(live) > 64:
            eager_free(*live.pop(rng.randrange(len(live))))
        if i % 97 == 0:
            f = eager_figures()
            assert f["front_cache_bytes"] <= bound
            assert f["eager_in_use"] - f0["eager_in_use"] == sum(class_bytes(n) for _, n, _ in live)
    for block in live:
        eager_free(*block)
    f = eager_figures()
    assert f["front_cache_bytes"] <= bound
    assert f["front_cache_limit"] == bound
    assert f["eager_in_use"] == f0["eager_in_use"]
    assert f["eager_allocations"] - f0["eager_allocations"] == 10000 == f["eager_frees"] - f0["eager_frees"]
    hits = f["front_cache_hits"] - f0["front_cache_hits"]
    assert hits > 0
    assert f["driver_allocations"] - f0["driver_allocations"] == 10000 - hits
    # every block the driver gave is in use, front-cached, or given back
    assert f["driver_allocations"] - f["driver_frees"] == f["eager_live_blocks"] + f["front_cache_blocks"]


def test_empty_cache_gives_every_front_cached_block_back():
    ps = [(eager_alloc(n, S1), n) for n in (512, 2048, 8192)]
    for p, n in ps:
        eager_free(p, n, S1)
    f0 = eager_figures()
    assert f0["front_cache_blocks"] >= 3 and f0["front_cache_bytes"] >= 512 + 2048 + 8192
    X.empty_cache(-1)
    f1 = eager_figures()
    assert f1["front_cache_blocks"] == 0 == f1["front_cache_bytes"]
    assert f1["driver_frees"] - f0["driver_frees"] == f0["front_cache_blocks"]
    assert f1["front_cache_returns"] - f0["front_cache_returns"] == f0["front_cache_blocks"]


def test_an_allocation_the_driver_refuses_first_drains_the_front_cache_then_fails_after_one_retry():
    p = eager_alloc(4096, S1)
    eager_free(p, 4096, S1)
    f0 = eager_figures()
    assert f0["front_cache_blocks"] >= 1
    assert eager_alloc(1 << 60, S1) is None  # malloc refuses: the simulator's out of memory
    f1 = eager_figures()
    assert f1["num_alloc_retries"] - f0["num_alloc_retries"] == 1
    assert f1["num_ooms"] - f0["num_ooms"] == 1
    assert f1["front_cache_blocks"] == 0
    assert f1["driver_frees"] - f0["driver_frees"] == f0["front_cache_blocks"]
    assert f1["eager_in_use"] == f0["eager_in_use"]


@pytest.mark.parametrize("error", [700, 900, 400], ids=["illegal_address", "capture_unsupported",
                                                     "invalid_stream"])
def test_a_refusal_for_another_cause_than_memory_names_cudas_error_and_is_neither_retried_nor_counted_as_oom(error):
    """After an illegal address every CUDA call fails with that sticky error,
    the driver's pool included; a capture may forbid the call; the stream
    may be gone. Such a refusal must not read as out of memory: code that
    recovers from out of memory would retry smaller in vain, and the cause
    would be hidden. It is not retried (trimming cannot help), counts in
    driver_alloc_errors and not in num_ooms, and the text PyTorch raises
    names CUDA's error. An out-of-memory refusal after it still reads as
    one."""
    f0 = eager_figures()
    X.sim_fail_pool_allocs(error, 2)  # for the first try and any retry
    try:
        assert eager_alloc(3 * 4096 + 512, S1) is None  # a size class never cached: the driver is asked
    finally:
        X.sim_fail_pool_allocs(0, 0)
    f1 = eager_figures()
    text = X.refusal_text()
    assert text.startswith("CUDA error: ") and "with error %d," % error in text, text
    assert "out of memory." not in text.lower().replace("which is not out of memory", "")
    assert f1["num_ooms"] == f0["num_ooms"] and f1["num_alloc_retries"] == f0["num_alloc_retries"]
    assert f1["driver_alloc_errors"] - f0["driver_alloc_errors"] == 1
    assert eager_alloc(1 << 60, S1) is None  # malloc refuses: the simulator's out of memory
    assert X.refusal_text().startswith("CUDA out of memory. Tried to allocate")
    f2 = eager_figures()
    assert f2["num_ooms"] - f1["num_ooms"] == 1 and f2["driver_alloc_errors"] == f1["driver_alloc_errors"]


def test_a_refusal_with_a_code_that_names_no_other_cause_still_reads_as_out_of_memory():
    """Only codes that name another cause (a capture, a lost context, a
    missing device or stream) leave the out-of-memory wording: any other
    code of a refusal, as a huge request may get, reads as out of memory and
    is retried after the trim, as every refusal was before."""
    f0 = eager_figures()
    X.sim_fail_pool_allocs(1, 2)  # cudaErrorInvalidValue
    try:
        assert eager_alloc(5 * 4096 + 512, S1) is None
    finally:
        X.sim_fail_pool_allocs(0, 0)
    assert X.refusal_text().startswith("CUDA out of memory. Tried to allocate")
    f1 = eager_figures()
    assert f1["num_ooms"] - f0["num_ooms"] == 1 and f1["num_alloc_retries"] - f0["num_alloc_retries"] == 1
    assert f1["driver_alloc_errors"] == f0["driver_alloc_errors"]


def test_a_retry_after_a_refusal_synchronises_the_device_only_where_no_run_of_ours_is_under_way(tree):
    """The retry after the driver's pool refused an eager allocation trims
    the pool, and a trim synchronises the whole device, which would break a
    recording's capture in every capture mode. So while a run of ours is
    under way (here another thread allocates eagerly during a recording) it
    trims without the synchronisation, and counts it; once no run is under
    way, the same refusal's trim synchronises again."""
    seen = {}

    def refused_once_on_another_thread(key, n):  # n: a size class the front cache holds none of
        f0 = eager_figures()
        X.sim_fail_pool_allocs(2, 1)  # cudaErrorMemoryAllocation, once: the retry succeeds
        got = []
        th = threading.Thread(target=lambda: got.append(eager_alloc(n, S2)))
        th.start()
        th.join()
        X.sim_fail_pool_allocs(0, 0)
        f1 = eager_figures()
        assert got[0] is not None
        eager_free(got[0], n, S2)
        seen[key] = (f1["num_alloc_retries"] - f0["num_alloc_retries"],
                     f1["trims_without_sync"] - f0["trims_without_sync"])

    def graph(x):
        out = affine(tree.stream, x, 1.0, 0.0)
        return (out,)

    launches = []

    def launch(inputs):
        launches.append(1)
        if len(launches) == 2:  # the recording (the warmup was the first)
            refused_once_on_another_thread("during", 7 * 4096 + 512)
        return graph(*inputs)

    seg = X.Segment(tree, "g", graph, launch, alias, describe, span, bytes((ARG_TENSOR,)), (16,), 0, False)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(4):  # the plain first call, warmup, recording, replay
        (y,) = call(seg, x)
        assert y.values() == [1, 2, 3, 4]
    assert len(launches) == 2 and tree.stats()["recordings"] == 1 and tree.stats()["replays"] == 1
    refused_once_on_another_thread("after", 9 * 4096 + 512)
    assert seen == {"during": (1, 1), "after": (1, 0)}


def test_a_free_during_a_launch_enters_the_front_cache_and_only_what_must_reach_the_driver_waits(tree):
    p, q = eager_alloc(2048, S1), eager_alloc(2048, S1)
    assert X.record_stream(q, S2)  # q must reach the driver, after S2's work: not during a capture
    to_free = [(p, 2048, S1), (q, 2048, S1)]
    seen = {}

    def graph(x):
        out = affine(tree.stream, x, 1.0, 0.0)
        return (out,)

    def launch(inputs):  # what runs while a capture may be under way (a plain call is the graph alone)
        if to_free:
            f0 = eager_figures()
            while to_free:
                eager_free(*to_free.pop())
            f1 = eager_figures()
            seen.update(deferred=f1["deferred_frees"] - f0["deferred_frees"],
                        cached=f1["front_cache_blocks"] - f0["front_cache_blocks"],
                        driver_frees=f1["driver_frees"] - f0["driver_frees"])
        return graph(*inputs)

    seg = X.Segment(tree, "g", graph, launch, alias, describe, span, bytes((ARG_TENSOR,)), (16,), 0, False)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    before = eager_figures()
    for _ in range(3):  # probe, warmup, recording
        (y,) = call(seg, x)
    assert y.values() == [1, 2, 3, 4]
    assert seen == {"deferred": 1, "cached": 1, "driver_frees": 0}  # no stream call inside the launch
    r = eager_alloc(2048, S1)  # outside the launch: set-aside frees have reached the driver by now
    assert r == p  # from the front cache
    assert eager_figures()["driver_frees"] - before["driver_frees"] >= 1  # q's
    eager_free(r, 2048, S1)


def test_a_free_after_the_launch_function_returned_but_inside_the_run_still_waits(tree):
    """cgtree ends a capture after the launch function returns, and segment.c
    drops the graph's outputs in between: a free then (here from such an
    output's finaliser) must not reach the driver either. The GPU tests found
    this window: a cudaFreeAsync on the legacy stream there invalidated the
    capture."""
    q = eager_alloc(2048, S1)
    assert X.record_stream(q, S2)  # the front cache refuses q: only the driver takes it back
    seen = {}

    class LastRef(FakeTensor):
        armed = False

        def __del__(self):
            if LastRef.armed:
                LastRef.armed = False
                f0 = eager_figures()
                eager_free(q, 2048, S1)
                f1 = eager_figures()
                seen.update(deferred=f1["deferred_frees"] - f0["deferred_frees"],
                            driver_frees=f1["driver_frees"] - f0["driver_frees"])

    def graph(x):
        out = LastRef(x.n)
        X.sim_launch(tree.stream, k_affine, out.ptr, x.ptr, x.n, 2.0, 0.0)
        return (out,)

    calls = []

    def launch(inputs):
        calls.append(1)
        if len(calls) == 2:  # the recording: the output dies after this function returns
            LastRef.armed = True
        return graph(*inputs)

    seg = X.Segment(tree, "late", graph, launch, alias, describe, span, bytes((ARG_TENSOR,)), (16,), 0, False)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):  # probe (plain), warmup, recording
        (y,) = call(seg, x)
    assert y.values() == [2, 4, 6, 8]
    assert seen == {"deferred": 1, "driver_frees": 0}
    before = eager_figures()["driver_frees"]
    eager_free(eager_alloc(64, S1), 64, S1)  # outside any run: what waited reaches the driver
    assert eager_figures()["driver_frees"] - before >= 1


def test_a_front_cache_bound_of_0_from_the_environment_turns_it_off(front_limit, monkeypatch):
    # cgtree.torch must not install itself here (on a GPU machine it would
    # take the hot path over from this module's stand-ins)
    monkeypatch.setenv("CGTREE_TORCH_NO_INSTALL", "1")
    install = pytest.importorskip("cgtree.torch._install")
    p = eager_alloc(1000, S1)
    eager_free(p, 1000, S1)
    assert eager_figures()["front_cache_blocks"] >= 1
    monkeypatch.delenv("CGTREE_TORCH_CACHE_BYTES", raising=False)
    monkeypatch.setenv("CGTREE_TORCH_FRONT_CACHE_BYTES", "0")
    install.apply_env_bytes()
    f0 = eager_figures()
    assert f0["front_cache_limit"] == 0 and f0["front_cache_blocks"] == 0
    for _ in range(3):
        q = eager_alloc(1000, S1)
        eager_free(q, 1000, S1)
    f1 = eager_figures()
    assert f1["front_cache_hits"] == f0["front_cache_hits"]
    assert f1["driver_allocations"] - f0["driver_allocations"] == 3
    assert f1["front_cache_blocks"] == 0
    for bad in ("lots", "-1"):
        monkeypatch.setenv("CGTREE_TORCH_FRONT_CACHE_BYTES", bad)
        with pytest.raises(X.CgtreeError, match="CGTREE_TORCH_FRONT_CACHE_BYTES"):
            install.apply_env_bytes()
    monkeypatch.setenv("CGTREE_TORCH_FRONT_CACHE_BYTES", str(64 << 20))
    install.apply_env_bytes()
    assert eager_figures()["front_cache_limit"] == 64 << 20


def test_an_output_passed_to_the_next_segment_of_the_step_is_a_value(tree):
    g1, g2 = Graph(tree, 2.0, 0.0), Graph(tree, 1.0, 1.0)
    s1, s2 = segment(tree, g1, spans=(16,), name="one"), segment(tree, g2, spans=(16,), name="two")
    x = FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(4):
        Generation.generation += 1
        (a,) = s1(x)
        (b,) = s2(a)
        assert b.values() == [3, 3, 3, 3]
    before = tree.stats()
    for _ in range(5):
        Generation.generation += 1
        (a,) = s1(x)
        (b,) = s2(a)
    s = tree.stats()
    assert s["replays"] - before["replays"] == 10
    assert s["input_copies"] - before["input_copies"] == 5  # x only: a travels as a VALUE


def test_a_view_of_an_output_passed_to_the_next_segment_is_its_value_at_an_offset(tree):
    g1, g2 = Graph(tree, 2.0, 0.0), Graph(tree, 1.0, 1.0)
    s1, s2 = segment(tree, g1, spans=(16,), name="one"), segment(tree, g2, spans=(8,), name="two")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    before = tree.stats()
    for i in range(8):
        Generation.generation += 1
        (a,) = s1(x)
        start = 1 + i % 2  # two offsets: two variants, each replayed
        (b,) = s2(a.narrow(start, 2))
        assert b.values() == [2 * v + 1 for v in [1, 2, 3, 4][start:start + 2]]
    s = tree.stats()
    assert s["replays"] - before["replays"] >= 8
    assert s["input_copies"] - before["input_copies"] <= 8  # x only: the views travel as values


def test_a_view_at_a_dead_outputs_object_address_is_not_taken_for_that_stale_output(tree):
    """The registry of outputs is keyed by the tensor object's address, and
    an entry outlives its object while a view keeps the storage. A new
    tensor that CPython puts at that address, over this step's output at
    the same pool address (pool addresses repeat each step), was taken for
    the dead, stale output: the call raised StaleTensorError where the
    plain graph computes (a helper's review). The storage tells them
    apart."""
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    g2 = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="two")
    for _ in range(3):
        call(g2, x)
    # CPython hands a freed object's address to the next object of its size,
    # unless something else of that size came first (a CI run saw it): the
    # case is tried again until the addresses meet.
    for _ in range(100):
        (y,) = call(seg, x)
        ghost, ptr = id(y), y.ptr
        kept = y.view()  # the program keeps a view of the output; our object dies
        del y
        plug = FakeTensor.__new__(FakeTensor)  # holds the dead object's address while the next call runs
        if id(plug) != ghost:
            del kept, plug
            continue
        Generation.generation += 1  # the model's next call: a new step marks `kept`
        (y2,) = seg(x)
        assert y2.ptr == ptr
        del plug
        z = y2.view()  # a new tensor over y2 at the dead object's address
        if id(z) != ghost:
            del kept, y2, z
            continue
        (w,) = g2(z)  # the call's next graph, after a graph break
        assert w.values() == [4, 6, 8, 10]
        with pytest.raises(RuntimeError, match="StaleTensorError"):
            kept.values()
        break
    else:
        pytest.fail("no new tensor came at the dead output's address in 100 tries")
    tree.check()


class ManyGraph:
    """A graph of x returning k outputs: output j = x + j (x's size)."""

    def __init__(self, tree, k):
        self.tree, self.k = tree, k

    def __call__(self, x):
        outs = []
        for j in range(self.k):
            o = FakeTensor(x.n)
            X.sim_launch(self.tree.stream, k_affine, o.ptr, x.ptr, x.n, 1.0, float(j))
            outs.append(o)
        return tuple(outs)


def test_outputs_over_many_pages_are_found_by_address_from_any_view_and_the_index_follows_them(tree):
    n = 700_000  # 2.8 MB each: every output spans several 1 MiB pages of the index
    big = segment(tree, ManyGraph(tree, 3), spans=(4 * n,), name="big")
    small = segment(tree, ManyGraph(tree, 40), spans=(16,), name="small")
    reader = segment(tree, Graph(tree, 1.0, 0.5), spans=(8,), name="reader")
    x, x4 = FakeTensor(n).fill([1.0] * n), FakeTensor(4).fill([1, 2, 3, 4])
    before = tree.stats()
    for i in range(6):
        Generation.generation += 1
        outs = big(x)
        many = small(x4)  # 40 small outputs beside the big ones, on the same step list
        start = 300_000 + i % 2  # in the second page of the output: found through that page
        (r1,) = reader(outs[2].narrow(start, 2))
        (r2,) = reader(many[39].narrow(1, 2))
        assert r1.values() == [3.5, 3.5] and r2.values() == [2 + 39.5, 3 + 39.5]
        tree.check()  # the step list and its index agree
        del outs, many, r1, r2
        tree.check()
    s = tree.stats()
    assert s["replays"] - before["replays"] >= 6
    # x and x4 are copied in (DYNAMIC) at each replay; the views travel as values: two copies a step at most
    assert s["input_copies"] - before["input_copies"] <= 2 * 6


def test_an_output_of_an_earlier_step_is_refused_as_stale(tree):
    seg, x = replaying(tree)
    (y1,) = call(seg, x)
    (y2,) = call(seg, x)  # a new step: y1's memory is y2's now
    assert y2.values() == [1, 1, 1, 1]
    with pytest.raises(X.StaleTensorError, match="earlier step"):
        call(seg, y1)
    assert tree.stats()["stale_refused"] == 1
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        y2.values()  # that call was a call of the model too: a new step began


def test_an_output_kept_past_its_step_raises_on_any_access_through_itself_or_a_view(tree):
    seg, x = replaying(tree)
    (y1,) = call(seg, x)
    v1 = y1.view()  # made after the call: a per-tensor mark would miss it
    kept = {"y": y1}
    before = tree.stats()["outputs_marked_stale"]
    x.fill([5, 5, 5, 5])
    (y2,) = call(seg, x)  # a new step: y1's memory is y2's now
    for t in (y1, v1, kept["y"]):
        with pytest.raises(RuntimeError, match="StaleTensorError: this tensor is an output"):
            t.values()
        with pytest.raises(RuntimeError, match="clone"):
            t.data_ptr()
    assert y2.values() == [6, 6, 6, 6]
    assert tree.stats()["outputs_marked_stale"] == before + 1  # one storage, marked once


def test_an_explicit_step_begin_marks_the_outputs_it_ends(tree):
    """step_begin() begins the step at the tree's next call, as PyTorch's
    mark does: until then nothing of the tree runs and every output still
    holds its data; that call marks them."""
    seg = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([0, 0, 0, 0])
    Generation.generation += 1
    for _ in range(3):
        (y,) = seg(x)  # three runs in one step: all alive
        assert y.values() == [1, 1, 1, 1]
    step = tree.stats()["step"]
    tree.step_begin()
    assert y.values() == [1, 1, 1, 1] and tree.stats()["step"] == step
    seg(x)  # the same generation: only the mark begins the step
    assert tree.stats()["step"] == step + 1
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        y.values()


@contextlib.contextmanager
def pytorchs_mark():
    """PyTorch's step mark's stand-in (cudagraph_mark_step_begin() moves
    its counter): a class whose counter the hot path reads, for the
    block's length."""
    class MarkStepBox:
        mark_step_counter = 0

    init_hot_path(mark_step_cls=MarkStepBox)
    try:
        yield MarkStepBox
    finally:
        init_hot_path()


@pytest.mark.parametrize("how", ["cudagraph_mark_step_begin", "step_begin"])
def test_the_x_equals_f_of_x_loop_computes_in_explicit_mode_with_either_mark(tree, how):
    """Threads in explicit mode call step_begin() before each call, as the
    docs tell them; in the x = f(x) loop x is an output of the step the
    mark ends. Begun at step_begin() itself, the step marked x, and the
    call raised StaleTensorError (a helper's audit), where PyTorch's mark,
    read at the next call, moved x into it."""
    with pytorchs_mark() as box:
        tree.explicit_steps = True
        seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
        x = FakeTensor(4).fill([1, 2, 3, 4])
        want = [1.0, 2.0, 3.0, 4.0]
        for _ in range(6):
            if how == "step_begin":
                tree.step_begin()  # cgtree.torch.step_begin(): every tree of this thread
            else:
                box.mark_step_counter -= 1  # torch.compiler.cudagraph_mark_step_begin()
            (x,) = seg(x)
            want = [2 * v + 1 for v in want]
            assert x.values() == want
        assert tree.stats()["arguments_moved"] >= 4


def test_the_y_equals_f_of_x_loop_never_raises_and_marks_only_the_output_it_drops(tree):
    seg = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    (y,) = call(seg, x)
    (y,) = call(seg, x)  # the first call's output was the plain graph's, not ours
    before = tree.stats()["outputs_marked_stale"]
    for _ in range(10):
        (y,) = call(seg, x)  # the old y is alive while the call runs, then dropped unread
        assert y.values() == [2, 4, 6, 8]
    assert tree.stats()["outputs_marked_stale"] == before + 10
    del y
    gc.collect()
    for _ in range(5):
        call(seg, x)  # dropped at once: nothing alive to mark when the next call begins
    assert tree.stats()["outputs_marked_stale"] == before + 10


def test_an_output_passed_to_the_call_that_ends_its_step_is_moved_and_the_x_equals_f_of_x_loop_computes(tree):
    """x = f(x): the call that ends x's step reads x. Nothing of the new step
    has run yet, so x's memory still holds its data: x moves to memory of
    its own (the same object, its storage copied) before the step's marks,
    and is read as a DYNAMIC input. Without the move, every call after the
    first raised StaleTensorError where eager computes."""
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    want = [1.0, 2.0, 3.0, 4.0]
    before = tree.stats()
    for i in range(8):
        kept = x
        (x,) = call(seg, x)
        want = [2 * v + 1 for v in want]
        assert x.values() == want
        if i >= 2:  # kept is the object the call read: moved, and right
            assert kept.values() == [(v - 1) / 2 for v in want]
    after = tree.stats()
    assert after["replays"] - before["replays"] >= 4  # recorded once, then replayed: no node per call
    assert after["nodes"] <= 2
    assert after["arguments_moved"] - before["arguments_moved"] >= 6
    tree.check()


class AddTwo:
    """out = x + y: two DYNAMIC inputs, which may alias (Dynamo guards on
    object identity, and AOTAutograd passes aliased inputs it does not
    write straight through)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, y):
        out = FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, x.ptr, y.ptr, x.n)
        return (out,)


def test_two_arguments_over_one_output_stay_views_of_one_another_after_the_call_that_ends_its_step(tree):
    """h = f(x); v = h.view(-1); z = g(h, v): g's call ends h's step and
    moves both arguments out of the pool. In eager h and v share memory
    after the call as before: a write in place to h is read through v.
    Moved one by one, each got a copy of its own, and v kept the old
    numbers, silently (two helpers' audits); they move onto one storage."""
    f, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    g = segment(tree, AddTwo(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="g")
    for i in range(4):
        (h,) = call(f, x)  # [3, 5, 7, 9]
        v = h.view()  # h.view(-1): another tensor over h's storage
        (z,) = call(g, h, v)  # a new call: h's step ends here, h and v are its arguments
        assert z.values() == [6, 10, 14, 18]
        h.fill([0, 0, 0, 0])  # eager: h.zero_()
        assert v.values() == [0, 0, 0, 0], "v no longer aliases h (iteration %d)" % i
        del h, v, z
        gc.collect()
    assert tree.stats()["arguments_moved"] >= 6


def test_only_the_argument_the_call_reads_moves_and_other_tensors_over_the_output_go_stale(tree):
    """The move is the argument object's: a view of the same output kept
    elsewhere still lies in the old memory and is marked; an output of a step
    before is stale as ever; and an output passed to a later graph of the
    call (after the call's first graph began the step and ran) raises, since
    that graph's memory may already hold it."""
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    other = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="other")
    for _ in range(3):
        call(other, x)
    (old,) = call(seg, x)
    (y,) = call(seg, x)
    v = y.view()
    (z,) = call(seg, y)
    assert z.values() == [7, 11, 15, 19] and y.values() == [3, 5, 7, 9]
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        v.values()
    with pytest.raises(X.StaleTensorError, match="earlier step"):
        call(seg, old)
    (y,) = call(seg, x)
    Generation.generation += 1  # one call of the model: its first graph begins the step, then a later one
    seg(x)
    with pytest.raises(X.StaleTensorError, match="earlier step"):
        other(y)


def test_an_argument_that_requires_grad_holds_the_step_and_one_that_cannot_be_copied_raises_and_retries(tree):
    """set_ would cut an output that requires grad from autograd's graph, and
    a backward is to come through it (an inference graph's output an
    autograd.Function made its own: reentrant checkpointing): the call
    holds the step instead, and computes with the output where it lies.
    After an explicit step_begin() it is an output of an earlier step, and
    raises. Out of memory for the copy: the call raises it, the step does
    not begin, and the output still reads right; the retry moves it."""
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    (y,) = call(seg, x)
    y.requires_grad = True
    s0 = tree.stats()
    (z,) = call(seg, y)
    s1 = tree.stats()
    assert z.values() == [7, 11, 15, 19] and y.values() == [3, 5, 7, 9]
    assert s1["step"] == s0["step"] and s1["steps_deferred"] == s0["steps_deferred"] + 1
    assert s1["arguments_moved"] == s0["arguments_moved"]
    tree.step_begin()
    with pytest.raises(X.StaleTensorError):
        call(seg, y)
    (y,) = call(seg, x)
    step = tree.stats()["step"]

    def refused(t):
        raise FakeOutOfMemoryError("CUDA out of memory (a test)")

    def refuses_set(t):
        raise RuntimeError("set_ refused (a test)")  # PyTorch's own refusal: the output stays, and is stale

    X.set_output_mover(refused)
    try:
        with pytest.raises(FakeOutOfMemoryError):
            call(seg, y)
        assert tree.stats()["step"] == step and y.values() == [3, 5, 7, 9]
        X.set_output_mover(refuses_set)
        with pytest.raises(X.StaleTensorError):
            call(seg, y)
    finally:
        X.set_output_mover(fake_move_out)
    (y,) = call(seg, x)
    (z,) = call(seg, y)
    assert z.values() == [7, 11, 15, 19] and y.values() == [3, 5, 7, 9]
    tree.check()


def test_outputs_that_die_before_their_step_ends_are_never_named_to_pytorch(tree):
    seg = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    marks.clear()
    for _ in range(6):
        (y,) = call(seg, x)
        del y
        gc.collect()
    assert marks == []


def test_a_stale_view_passed_to_a_graph_raises_stale_tensor_error(tree):
    seg, x = replaying(tree)
    (y1,) = call(seg, x)
    v = y1.view()
    del y1
    call(seg, x)
    before = tree.stats()["stale_refused"]
    with pytest.raises(X.StaleTensorError, match="argument 0 of graph 'g' is an output of an earlier step"):
        call(seg, v)
    assert tree.stats()["stale_refused"] == before + 1


def test_two_threads_run_one_segment_on_their_own_trees_with_correct_results(tree):
    import threading

    local, trees = threading.local(), []

    def tree_of_this_thread(device):
        if not hasattr(local, "tree"):
            local.tree = X.Tree(0, backend="sim")
            local.tree.explicit_steps = True  # steps only where this thread says
            trees.append(local.tree)
        return local.tree

    graph = Graph(tree, 2.0, 1.0, stream=lambda: tree_of_this_thread(0).stream)
    seg = segment(tree, graph, spans=(16,), name="threads")
    X.set_tree_getter(tree_of_this_thread)
    errors = []

    def work(k):
        try:
            x = FakeTensor(4)
            for i in range(30):
                tree_of_this_thread(0).step_begin()
                x.fill([k, i, k + i, 1])
                (y,) = seg(x)
                Generation.generation += 1  # the other thread's calls move Dynamo's counter too
                (z,) = seg(y)  # a VALUE of this thread's step, whatever the other thread did
                assert y.values() == [2 * k + 1, 2 * i + 1, 2 * (k + i) + 1, 3]
                assert z.values() == [2 * v + 1 for v in y.values()]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    try:
        in_threads(lambda: work(1), lambda: work(2))
    finally:
        X.set_tree_getter(None)
    assert errors == []
    assert len(trees) == 2 and all(t.stats()["replays"] > 0 for t in trees)
    assert tree.stats()["replays"] == 0  # the tree the segment was made with ran nothing
    for t in trees:
        t.check()


class ThreadTrees:
    """A tree getter of one tree per thread, as cgtree.torch's: the trees
    made, in order."""

    def __init__(self):
        import threading

        self.local, self.made = threading.local(), []

    def __call__(self, device):
        if not hasattr(self.local, "tree"):
            self.local.tree = X.Tree(0, backend="sim")
            self.made.append(self.local.tree)
        return self.local.tree


def in_threads(*works):
    """Runs each of works in a thread of its own, all at once, and waits for
    every one."""
    import threading

    threads = [threading.Thread(target=w) for w in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def in_a_thread(work):
    in_threads(work)


def test_an_exited_threads_tree_is_freed_once_its_last_output_dies_and_the_segment_runs_on(tree):
    """A tree orphaned at its thread's exit (cgtree.torch's per-thread dict
    does it: test_torch_threads.py) stays while an output of it lives, and
    that output reads right; at the next call after it died the tree is
    freed (its C tree, pool and graphs, and the segment's run in it, which
    held a reference to the segment) with its counters kept; the segment
    runs on in the other trees."""
    trees = ThreadTrees()
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="exits")
    X.set_tree_getter(trees)
    kept = []

    def work():
        x = FakeTensor(4).fill([1, 2, 3, 4])
        for _ in range(4):  # plain first call, warmup, recording, replay
            (y,) = call(seg, x)
        kept.append(y)

    try:
        in_a_thread(work)
        (dead,) = trees.made
        assert dead.stats()["recordings"] == 1 and dead.stats()["pool_reserved_bytes"] > 0
        freed = X.alloc_figures()["trees_freed"]
        dead.orphan()
        assert dead.orphaned and not dead.closed  # kept[0] is its output
        x = FakeTensor(4).fill([0, 1, 2, 3])
        (z,) = call(seg, x)  # on the main thread's tree
        assert not dead.closed and kept[0].values() == [3, 5, 7, 9]
        refs = sys.getrefcount(seg)  # a reference from each tree it is registered with
        del kept[:]
        gc.collect()
        assert not dead.closed  # freed at a call, not inside a deleter
        (z,) = call(seg, x)
        assert dead.closed and X.alloc_figures()["trees_freed"] == freed + 1
        s = dead.stats()
        assert s["recordings"] == 1 and s["replays"] == 1  # its counters stay
        assert s["pool_reserved_bytes"] == s["nodes"] == s["graphs"] == s["outputs_alive"] == 0
        assert sys.getrefcount(seg) == refs - 1  # the reference its registered run held
        assert seg.info["trees"] == 1  # the main thread's
        with pytest.raises(X.CgtreeError, match="freed"):
            dead.check()
        for _ in range(3):
            (z,) = call(seg, x)
            assert z.values() == [1, 3, 5, 7]
        assert trees.made[1].stats()["replays"] >= 1
        trees.made[1].check()
    finally:
        X.set_tree_getter(None)


def test_an_orphan_is_freed_only_when_no_run_is_under_way():
    """Freeing a tree while a capture is open on any thread would break the
    capture: an orphan whose last output dies inside another tree's launch
    (here: the launch drops it, then asks for the orphans to be freed) is
    freed at the next call, after that run."""
    trees = ThreadTrees()
    kept, seen = [], []
    main = X.Tree(0, backend="sim")

    def graph(x):
        if kept:  # not in the plain first call: in the warmup, a launch of cgt_run
            del kept[:]  # the orphan's last output dies inside this launch
            gc.collect()
            X.empty_cache(-1)  # asks for the orphans to be freed
            seen.append(trees.made[0].closed)
        out = affine(trees(0).stream, x, 1.0, 1.0)
        return (out,)

    seg = segment(main, graph, spans=(16,), name="orphan_in_launch")
    plain = segment(main, Graph(main, 1.0, 0.0, stream=lambda: trees(0).stream), spans=(16,), name="plain")
    X.set_tree_getter(trees)
    try:
        def work():
            x = FakeTensor(4).fill([1, 2, 3, 4])
            for _ in range(3):
                (y,) = call(plain, x)
            kept.append(y)

        in_a_thread(work)
        dead = trees.made[0]
        dead.orphan()
        assert not dead.closed
        x = FakeTensor(4).fill([1, 1, 1, 1])
        plain_first = kept[:]
        del kept[:]
        call(seg, x)  # the plain first call, outside cgt_run
        kept.extend(plain_first)
        del plain_first
        call(seg, x)  # a warmup: the output dies inside its launch
        assert seen == [False]  # not freed inside the run
        assert not dead.closed
        call(plain, x)  # the next call frees it
        assert dead.closed
    finally:
        X.set_tree_getter(None)


def test_freeing_a_tree_frees_its_segments_runs_even_where_one_segment_holds_the_other(tree):
    """A tree's runs are freed after its C tree, in an order where dropping
    one segment (the tree held it) may free another whose run is in the
    same tree: here the held segment, whose first call failed (a run never
    registered), dies with the holder's graph. Neither is freed twice nor
    read once freed. (The segments sit in a list the thread reads, which
    the test empties: pyflakes took a `del` of names a closure reads for an
    undefined name.)"""
    trees = ThreadTrees()

    class Raising:
        def __call__(self, x):
            raise ValueError("its first call fails")

    g1 = Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream)
    segs = [segment(tree, g1, spans=(16,), name="holder"), segment(tree, Raising(), spans=(16,), name="held")]
    g1.keep = segs[1]  # the held segment dies with the holder
    gone = weakref.ref(g1)
    X.set_tree_getter(trees)
    try:
        def work():
            holder, held = segs
            x = FakeTensor(4).fill([1, 2, 3, 4])
            for _ in range(3):
                call(holder, x)  # registered in the thread's tree
            with pytest.raises(ValueError):
                call(held, x)  # a run that never registered, in the same tree

        in_a_thread(work)
        (dead,) = trees.made
        segs.clear()  # only the thread's tree holds the holder now
        del g1
        gc.collect()
        assert gone() is not None
        dead.orphan()
        X.empty_cache(-1)
        assert dead.closed
        gc.collect()
        assert gone() is None  # the holder went with the tree, and the held segment with it
    finally:
        X.set_tree_getter(None)


class DeviceThread:
    """Autograd's device thread's stand-in: a thread that runs what it is
    given (run(f)) with the stash of trees it is told (stash["tree"]), and
    a tree getter that gives it that stash and every other thread a tree of
    its own, as cgtree.torch's getter does."""

    def __init__(self):
        import queue
        import threading

        self.work, self.done = queue.Queue(), queue.Queue()
        self.stash, self.local = {"tree": None}, threading.local()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            f = self.work.get()
            if f is None:
                return
            try:
                self.done.put(("ok", f()))
            except BaseException as e:  # noqa: BLE001 - handed to the test
                self.done.put(("error", e))

    def run(self, f):
        self.work.put(f)
        kind, got = self.done.get(timeout=30)
        if kind == "error":
            raise got
        return got

    def getter(self, device):
        import threading

        if threading.current_thread() is self.thread:
            return self.stash["tree"]
        if not hasattr(self.local, "tree"):
            self.local.tree = X.Tree(0, backend="sim")
        return self.local.tree

    def stop(self):
        self.work.put(None)


def test_a_thread_that_cached_another_threads_tree_asks_again_once_that_tree_is_orphaned(tree):
    """A forward run on a thread from another thread's trees (autograd's
    thread under a backward's copied stash) leaves that tree in the
    thread's cache of trees. Once that tree is orphaned (and freed, its
    memory free to become another tree) the thread must ask the getter
    again, not run on what the cache points at."""
    dt = DeviceThread()
    getter, stash, on_worker = dt.getter, dt.stash, dt.run
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: getter(0).stream), spans=(16,), name="cached")
    X.set_tree_getter(getter)
    try:
        made = []

        def thread_a():
            a = getter(0)
            made.append(a)
            x = FakeTensor(4).fill([1, 2, 3, 4])
            for _ in range(3):
                call(seg, x)
            stash["tree"] = a  # the worker runs under A's trees
            on_worker(lambda: call(seg, FakeTensor(4).fill([1, 1, 1, 1]))[0].values())

        in_a_thread(thread_a)
        a = made.pop()
        a.orphan()
        X.empty_cache(-1)
        assert a.closed
        stash["tree"] = None
        del a  # its memory is free: the next tree made may lie where it lay
        gc.collect()
        other = X.Tree(0, backend="sim")
        b = X.Tree(0, backend="sim")
        stash["tree"] = b  # what the worker's getter says now
        got = on_worker(lambda: call(seg, FakeTensor(4).fill([1, 1, 1, 1]))[0].values())
        assert got == [3, 3, 3, 3]
        assert b.stats()["runs"] >= 1 and other.stats()["runs"] == 0  # it asked, and ran on b
    finally:
        X.set_tree_getter(None)
        dt.stop()


def test_a_tree_freed_before_it_made_an_output_retires_its_stream_too():
    """A tree dropped before it made an output (never called, or every
    call failed) is freed by its finaliser rather than closed: it destroyed
    its stream without retiring it, and an eager block still allocated on
    that stream later had its free ordered on a stream that no longer
    existed (a review)."""
    t = X.Tree(0, backend="sim")
    live = _lib.cgt_torch_alloc(4096, -1, t.stream)
    f0 = X.alloc_figures(-1)
    del t
    gc.collect()
    f1 = X.alloc_figures(-1)
    assert f1["blocks_rehomed"] == f0["blocks_rehomed"] + 1, "the freed tree's stream was not retired"
    _lib.cgt_torch_free(live, 4096, -1, None)  # its free goes to the legacy stream's cache
    again = _lib.cgt_torch_alloc(4096, -1, None)
    assert again == live
    _lib.cgt_torch_free(again, 4096, -1, None)


def test_freeing_a_tree_retires_its_stream_and_takes_its_pool_out_of_the_bytes_in_use(tree):
    """Eager blocks allocated on a freed tree's stream (outside any launch):
    a cached one goes back to the driver before the stream goes, a live one
    is freed on the legacy stream from then on (it then serves allocations
    there); and alloc.c's count of pool bytes in use loses the tree's."""
    trees = ThreadTrees()
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="retire")
    X.set_tree_getter(trees)
    blocks = {}
    try:
        def work():
            x = FakeTensor(4).fill([1, 2, 3, 4])
            for _ in range(3):
                (blocks["y"],) = call(seg, x)  # alive: in the pool bytes the tree reported after its run
            stream = trees(0).stream
            blocks["live"] = _lib.cgt_torch_alloc(4096, -1, stream)
            cached = _lib.cgt_torch_alloc(4096, -1, stream)
            _lib.cgt_torch_free(cached, 4096, -1, stream)  # into the front cache, under the tree's stream
            blocks["cached"] = cached

        in_a_thread(work)
        (dead,) = trees.made
        in_use = dead.stats()["pool_allocated_bytes"]  # what its last run reported
        assert in_use > 0
        del blocks["y"]
        gc.collect()
        f0 = X.alloc_figures(-1)
        dead.orphan()
        X.empty_cache(-1)  # frees the tree first, then drains what is left of the front cache
        f1 = X.alloc_figures(-1)
        assert dead.closed
        assert f1["blocks_rehomed"] == f0["blocks_rehomed"] + 1
        assert f0["pool_in_use"] - f1["pool_in_use"] == in_use
        live = blocks["live"]
        _lib.cgt_torch_free(live, 4096, -1, None)  # its free now goes to the legacy stream's cache
        again = _lib.cgt_torch_alloc(4096, -1, None)
        assert again == live  # served from the front cache under (host, legacy stream, 4096)
        _lib.cgt_torch_free(again, 4096, -1, None)
    finally:
        X.set_tree_getter(None)


def test_cudagraph_mark_step_begin_begins_a_step_in_explicit_mode(tree):
    class MarkStepBox:
        mark_step_counter = 0

    init_hot_path(mark_step_cls=MarkStepBox)
    try:
        tree.explicit_steps = True
        seg = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,))
        x = FakeTensor(4).fill([0, 0, 0, 0])
        step = tree.step
        for _ in range(3):
            call(seg, x)  # Dynamo's counter moves; in explicit mode that begins no step
        assert tree.step == step
        MarkStepBox.mark_step_counter -= 1  # what torch.compiler.cudagraph_mark_step_begin() does
        (y,) = seg(x)
        assert tree.step == step + 1
        tree.explicit_steps = False
        (y2,) = call(seg, x)
        assert tree.step == step + 2
        with pytest.raises(RuntimeError, match="StaleTensorError"):
            y.values()
    finally:
        init_hot_path()


def test_an_output_goes_back_to_the_tree_when_its_tensor_dies(tree):
    seg = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):
        call(seg, x)
    (y,) = call(seg, x)
    alive = tree.stats()["outputs_alive"]
    del y
    gc.collect()
    assert tree.stats()["outputs_alive"] == alive - 1


def test_outputs_alive_when_a_step_begins_are_counted_as_overwritable(tree):
    seg = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    kept = [call(seg, x)[0] for _ in range(5)]
    assert tree.stats()["outputs_overwritable"] >= 2
    del kept


def test_branches_record_both_paths_and_restore_the_checkpoint(tree):
    g1, g2, g3, g4 = (Graph(tree, 1.0, 0.0), Graph(tree, 2.0, 0.0), Graph(tree, -1.0, 0.0),
                      Graph(tree, 1.0, 10.0))
    s1, s2, s3, s4 = (segment(tree, g, spans=(16,), name=n) for g, n in
                      ((g1, "one"), (g2, "two"), (g3, "three"), (g4, "four")))
    for i in range(10):
        v = 1.0 if i % 2 == 0 else -1.0
        x = FakeTensor(4).fill([v] * 4)
        Generation.generation += 1
        (y,) = s1(x)
        (z,) = (s2 if y.values()[0] > 0 else s3)(y)
        del y
        (w,) = s4(z)
        assert w.values() == [12.0] * 4 if v > 0 else [11.0] * 4
    s = tree.stats()
    assert s["checkpoint_restores"] >= 1 and s["recordings"] >= 5 and s["replays"] >= 10


def test_int_arguments_key_the_variant(tree):
    class Scaled(Graph):
        def __call__(self, x, k):
            self.a = float(k)
            return Graph.__call__(self, x)

    g = Scaled(tree, 1.0, 0.0)
    seg = segment(tree, g, kinds=(ARG_TENSOR, ARG_INT), spans=(16, 0))
    x = FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(12):
        k = 2 + i % 2
        (y,) = call(seg, x, k)
        assert y.values() == [float(k)] * 4
    assert tree.stats()["recordings"] == 2


def test_generator_arguments_key_the_variant_by_identity(tree):
    """A generator argument (activation checkpointing's random state): a
    recording reads that generator's device state, so another generator
    object is another variant, recorded apart; the same one replays."""
    ARG_GENERATOR = 5
    g = Graph(tree, 2.0, 1.0)
    seg = segment(tree, lambda x, gen: g(x), kinds=(ARG_TENSOR, ARG_GENERATOR), spans=(16, 0))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    first, second = object(), object()
    for i in range(8):
        (y,) = call(seg, x, first)
        assert y.values() == [3.0, 5.0, 7.0, 9.0]
    recordings = tree.stats()["recordings"]
    assert recordings == 1
    for i in range(6):
        (y,) = call(seg, x, second if i % 2 else first)
        assert y.values() == [3.0, 5.0, 7.0, 9.0]
    assert tree.stats()["recordings"] == 2  # the second generator's variant, once
    with pytest.raises(ValueError, match="no argument kind"):
        segment(tree, g, kinds=(ARG_TENSOR, 6), spans=(16, 0))


def test_a_budget_of_graphs_evicts_variants_and_warns_once_and_results_stay_right():
    t = X.Tree(0, backend="sim", max_graphs=2)
    g = Graph(t, 1.0, 0.0)

    def scaled(x, k):
        (y,) = g(x)
        X.sim_launch(t.stream, k_affine, y.ptr, y.ptr, y.n, float(k), 0.0)
        return (y,)

    seg = segment(t, scaled, kinds=(ARG_TENSOR, ARG_INT), spans=(16, 0), name="shapes")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    with pytest.warns(RuntimeWarning, match="budget is evicting graphs"):
        for i in range(24):
            k = 1 + i % 4  # four variants (as four shapes would be) through a budget of two graphs
            (y,) = call(seg, x, k)
            assert y.values() == [k * v for v in [1, 2, 3, 4]]
    st = t.stats()
    assert st["evictions"] > 0 and st["graphs"] <= 2
    t.check()
    with pytest.raises(ValueError):
        X.Tree(0, backend="sim", max_graphs=1 << 30)  # past the library's limit: refused, no tree


def test_non_tensor_outputs_come_back_as_recorded(tree):
    seg = segment(tree, Graph(tree, 1.0, 0.0, extra=(7, None)), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(5):
        res = call(seg, x)
        assert isinstance(res, tuple) and res[1:] == (7, None) and res[0].values() == [1, 2, 3, 4]


def test_a_graph_whose_capture_fails_runs_as_the_plain_graph_from_then_on(tree):
    g = Graph(tree, 2.0, 1.0)

    def syncing(x):  # as a graph with torch.cond on a device predicate (a host sync) does
        X.sim_sync(tree.stream)
        return g(x)

    seg = segment(tree, syncing, spans=(16,), name="syncs")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    with pytest.warns(RuntimeWarning, match="capture failed"):
        for _ in range(3):
            (y,) = call(seg, x)
            assert y.values() == [3, 5, 7, 9]
    assert "capture failed" in seg.info["plain_reason"]
    runs = tree.stats()["runs"]
    for _ in range(5):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
    assert tree.stats()["runs"] == runs  # plain calls: cgtree is not involved any more
    assert seg.info["plain_calls"] >= 6


class DoublesInPlace:
    """A compiled graph that writes its input in place (y *= 2), as a graph
    of `y.mul_(2)` after a graph break does, and returns nothing."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, y):
        X.sim_launch(self.tree.stream, k_affine, y.ptr, y.ptr, y.n, 2.0, 0.0)
        return ()


def eager_run_maker(t, route):
    """A segment of (x, w STATIC) -> 2x + 1 whose runs cgtree makes eagerly,
    so its output lies in the side pool: its capture fails (a host sync, as
    torch.cond's device predicate makes), or (route past_the_rerecord_limit,
    t made with rerecord_limit=1) the caller passes a new w at each step."""
    if route == "capture_fails":
        g = Graph(t, 2.0, 1.0)

        def syncing(x, w):
            X.sim_sync(t.stream)
            return g(x)

        return segment(t, syncing, kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="syncs")
    return segment(t, Graph(t, 2.0, 1.0), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="new_w")


@pytest.mark.parametrize("route", ["capture_fails", "past_the_rerecord_limit", "a_view_past_the_rerecord_limit"])
def test_a_graph_that_writes_an_output_of_an_eager_run_writes_that_output_itself(route):
    """An output of a run cgtree made eagerly (a capture that failed, or a
    node past the rerecord limit) lies in the tree's side pool, and the tree
    copies such a VALUE into a placeholder. A later graph of the step that
    writes into it would write the copy, and the caller's tensor would keep
    the old numbers: the call runs as the plain graph instead, on the tensor
    itself (a view of it: the part the view covers)."""
    t = X.Tree(0, backend="sim", rerecord_limit=1)
    make = eager_run_maker(t, route.replace("a_view_", ""))
    view = route.startswith("a_view")
    write = segment(t, DoublesInPlace(t), kinds=(ARG_TENSOR_STATIC,), spans=(8 if view else 16,), name="doubles",
                    written_inputs=(0,))
    x, w, ws = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(8):
            if route != "capture_fails":
                w = FakeTensor(4)  # a new STATIC address each step: a new key under the same parent
                ws.append(w)  # kept, so no address comes back
            (y,) = call(make, x, w)
            assert y.values() == [3, 5, 7, 9], i
            assert write(y.narrow(1, 2) if view else y) == ()  # in the step, as a graph after a graph break
            want = [3, 10, 14, 9] if view else [6, 10, 14, 18]
            assert y.values() == want, i  # the write landed in y, not in a copy of it
    assert t.stats()["eager_runs"] > 0  # some y lay in the side pool
    said = [str(c.message) for c in caught if "writes into an output of a run cgtree made eagerly" in str(c.message)]
    assert len(said) == 1 and "'doubles'" in said[0]  # said once, naming the graph
    assert write.info["plain_calls"] >= 2  # its first call, and the calls on a side-pool y
    t.check()


def test_a_graph_run_eagerly_in_half_of_its_last_32_calls_runs_as_the_plain_graph_from_then_on():
    """Past the rerecord limit (a STATIC input at a new address at every
    call) the tree runs the graph eagerly, its outputs in the side pool,
    which cost 1.89x the plain graph's time on an H200
    (bench/torch_moving_static.py). Once 16 of the graph's last 32 calls
    through the tree were eager runs it runs as the plain graph, with a
    warning once, and its results stay right; a third of its calls eager,
    it stays in the tree."""
    t = X.Tree(0, backend="sim", rerecord_limit=1)
    make = eager_run_maker(t, "past_the_rerecord_limit")
    x, w0, ws = FakeTensor(4), FakeTensor(4), []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(60):
            # the first w (a plain first call, a warm-up, a recording); up to call 40 one call in three
            # passes a new w (eager), the others w0 (a replay); from then on every call a new w
            w = w0 if i < 3 or (i < 40 and i % 3) else FakeTensor(4)
            ws.append(w)  # kept, so no address comes back
            x.fill([i, i + 1, i + 2, i + 3])
            (y,) = call(make, x, w)
            assert y.values() == [2 * i + 1, 2 * i + 3, 2 * i + 5, 2 * i + 7], i
            if i == 39:
                assert make.info["plain_reason"] is None  # a third eager: it stays in the tree
                eager_then, plain_then = t.stats()["eager_runs"], make.info["plain_calls"]
    said = [str(c.message) for c in caught if "eagerly in 16 of its last 32 calls" in str(c.message)]
    assert len(said) == 1 and "'new_w'" in said[0]
    assert "rerecord limit" in make.info["plain_reason"]
    eager_after = t.stats()["eager_runs"] - eager_then
    assert 0 < eager_after <= 16  # then plain: the tree ran it no more
    assert make.info["plain_calls"] - plain_then == 60 - 40 - eager_after
    t.check()


def test_a_graph_called_at_two_places_of_a_step_one_of_them_eager_runs_as_the_plain_graph():
    """One graph, two calls a step: the first with a new STATIC input each
    step (past the limit: eager), the second with the same one (replays).
    Half its calls eager, it goes plain (a run of eager calls in a row, the
    first rule, was broken by every replay of the second call, and the
    first call stayed eager for good: a review)."""
    t = X.Tree(0, backend="sim", rerecord_limit=2)
    seg = eager_run_maker(t, "past_the_rerecord_limit")
    x, w0, ws = FakeTensor(4), FakeTensor(4), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(80):
            w = FakeTensor(4)
            ws.append(w)
            x.fill([i, i + 1, i + 2, i + 3])
            (y,) = call(seg, x, w)
            (z,) = seg(x, w0)
            assert y.values() == z.values() == [2 * i + 1, 2 * i + 3, 2 * i + 5, 2 * i + 7], i
            if i == 40:
                eager = t.stats()["eager_runs"]
    assert seg.info["plain_reason"] is not None
    assert t.stats()["eager_runs"] == eager  # the last 39 steps ran it plainly
    t.check()


def test_another_threads_replays_of_a_graph_do_not_keep_a_tree_that_runs_it_eagerly_from_the_plain_graph():
    """The 16 of 32 calls are counted per tree: thread A passes its STATIC
    input at a new address at every call (every call of A's tree an eager
    run), while thread B replays the same graph twice for each of A's calls.
    Counted over the segment's calls on every tree, B's replays kept A's
    share under half, and A's tree ran the graph eagerly for good
    (helper-89's hunt: 77 eager runs in 80 calls, never plain)."""
    import threading

    class Trees(ThreadTrees):
        def __call__(self, device):
            if not hasattr(self.local, "tree"):
                self.local.tree = X.Tree(0, backend="sim", rerecord_limit=1)
                self.local.tree.explicit_steps = True
                self.made.append(self.local.tree)
            return self.local.tree

    trees, base = Trees(), X.Tree(0, backend="sim")
    seg = segment(base, Graph(base, 2.0, 1.0, stream=lambda: trees(0).stream), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC),
                  spans=(16, 16), name="shared")
    turns, errors, n = threading.Barrier(2, timeout=30), [], 80

    def a():
        x, ws = FakeTensor(4), []
        for i in range(n):
            trees(0).step_begin()
            ws.append(FakeTensor(4))  # kept: no address comes back
            x.fill([i, 0, 0, 0])
            (y,) = call(seg, x, ws[-1])
            assert y.values() == [2 * i + 1, 1, 1, 1]
            turns.wait()
            turns.wait()

    def b():
        x, w0 = FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(4)
        for _ in range(n):
            turns.wait()  # A's call first
            for _ in range(2):
                trees(0).step_begin()
                (y,) = call(seg, x, w0)
                assert y.values() == [3, 3, 3, 3]
            turns.wait()

    def guarded(work):
        def run():
            try:
                work()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
                turns.abort()
        return run

    X.set_tree_getter(trees)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            in_threads(guarded(a), guarded(b))
    finally:
        X.set_tree_getter(None)
    assert errors == []
    assert seg.info["plain_reason"] is not None and "16 of its last 32" in seg.info["plain_reason"]
    eager = trees.made[0].stats()["eager_runs"]
    assert eager <= 16 + 3, "thread A's tree ran the graph eagerly %d times in %d calls" % (eager, n)
    for t in trees.made:
        t.check()


@pytest.mark.parametrize("route", ["capture_fails", "past_the_rerecord_limit"])
@pytest.mark.parametrize("read", ["a_view_at_an_offset", "returned_as_it_is", "a_view_returned_as_it_is",
                                  "a_view_as_another_dtype_returned"])
def test_a_graph_that_reads_an_output_of_an_eager_run_reads_it_and_returns_it_as_inductor_does(route, read):
    """An output of a run cgtree made eagerly lies in the side pool, and the
    tree copies such a VALUE whole into a placeholder for a recorded graph
    that reads it. A view of it at an offset (y[1:3]) was passed at the
    placeholder's start, so the graph read y[0:2]; and a graph that returns
    its input (a forward that saves it, a custom Function's view) handed
    back a tensor over the copy, which missed the program's later write to
    y, where under Inductor it is y; so did a view of it as another dtype.
    All silently (two reviews). Now the graph reads the view where it lies
    in the copy, the returned input is a view of y itself, and a graph
    that returns a view of it as another dtype runs as the plain graph."""
    t = X.Tree(0, backend="sim", rerecord_limit=1)
    make = eager_run_maker(t, route)
    if read == "a_view_at_an_offset":
        reader = segment(t, Graph(t, 1.0, 0.0), kinds=(ARG_TENSOR,), spans=(8,), name="reads")
    elif read == "a_view_as_another_dtype_returned":
        reader = segment(t, ReturnsInputView(t, "int32"), kinds=(ARG_TENSOR,), spans=(16,), name="as_int32")
    else:
        reader = segment(t, lambda y: (y, affine(t.stream, y, 1.0, 0.0)), kinds=(ARG_TENSOR,),
                         spans=(8 if read.startswith("a_view") else 16,), name="returns")
    x, w, ws, bad = FakeTensor(4), FakeTensor(4), [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the failed capture's
        for i in range(10):
            if route != "capture_fails":
                w = FakeTensor(4)  # a new STATIC address each step: a new key under the same parent
                ws.append(w)  # kept, so no address comes back
            x.fill([i, i + 1, i + 2, i + 3])
            (y,) = call(make, x, w)
            assert y.values() == [2 * i + 1, 2 * i + 3, 2 * i + 5, 2 * i + 7], i
            if read == "a_view_at_an_offset":
                (z,) = reader(y.narrow(1, 2))  # in the step, as a graph after a graph break
                if z.values() != [2 * i + 3, 2 * i + 5]:
                    bad.append((i, z.values()))
            elif read == "a_view_as_another_dtype_returned":
                v, z, _ = reader(y)  # v: y[1:] as int32 (the simulator's fakes keep the float bits)
                assert z.values() == [2 * (2 * (i + j) + 1) + 1 for j in range(4)], i
                y.fill([100 + i, 200 + i, 300 + i, 400 + i])  # under Inductor v is a view of y: it reads the write
                if v.values() != [200 + i, 300 + i, 400 + i]:
                    bad.append((i, v.values()))
            else:
                view = read.startswith("a_view")
                v, _ = reader(y.narrow(1, 2) if view else y)
                y.fill([100 + i, 200 + i, 300 + i, 0])  # under Inductor v is y, or that view of y: it reads the write
                if v.values() != ([200 + i, 300 + i] if view else [100 + i, 200 + i, 300 + i, 0]):
                    bad.append((i, v.values()))
    assert t.stats()["eager_runs"] > 0  # some y lay in the side pool
    assert bad == []
    t.check()


class HeadWritingAndSavingItsInput:
    """A training forward that writes its input in place (h += 1), then
    returns 2h and saves h itself (as a Linear saves its input)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, h):
        X.sim_launch(self.tree.stream, k_affine, h.ptr, h.ptr, h.n, 1.0, 1.0)
        return (affine(self.tree.stream, h, 2.0, 0.0), h)


@pytest.mark.parametrize("route", ["capture_fails", "past_the_rerecord_limit"])
def test_a_forward_that_writes_and_saves_an_output_of_an_eager_run_holds_the_step_until_its_backward(route):
    """A training forward that writes its input runs plainly where that
    input lies in the side pool, and it saves that input. Its saved result
    now holds the step until its backward, as at any plain call: held by
    nothing, the second forward of a contrastive pair began a step and
    raised StaleTensorError on y, where eager computes (a review)."""
    t = X.Tree(0, backend="sim", rerecord_limit=1)
    make = eager_run_maker(t, route)
    head = segment(t, HeadWritingAndSavingItsInput(t), kinds=(ARG_TENSOR_STATIC,), spans=(16,), name="head",
                   saved_from=1, written_inputs=(0,))
    bw = segment(t, BackwardGraph(t), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    x, w, ws, g = FakeTensor(4), FakeTensor(4), [], FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(8):
            if route != "capture_fails":
                w = FakeTensor(4)
                ws.append(w)
            x.fill([i, i + 1, i + 2, i + 3])
            (y,) = call(make, x, w)  # [2i + 1, ...]
            z1, s1 = call(head, y)  # y += 1
            z2, s2 = call(head, y)  # a second forward before the backwards: y += 1 again
            assert z2.values() == [2 * (2 * (i + j) + 3) for j in range(4)], i
            (g1,) = bw(s1, g)
            (g2,) = bw(s2, g)
            assert g1.values() == g2.values() == [2 * (i + j) + 4 for j in range(4)], i
            del y, z1, s1, z2, s2, g1, g2
            gc.collect()
    assert t.stats()["eager_runs"] > 0
    t.check()


def k_fill(dst, n, v):
    d = (ctypes.c_float * n).from_address(dst)
    for i in range(n):
        d[i] = v


class Generator:
    """A random generator's stand-in: the recorded graph reads `state` (device
    memory); the prelaunch function writes the host's offset there on the
    tree's stream and advances it, as _rng.py's brackets do."""

    def __init__(self, tree, fail=False):
        self.tree, self.offset, self.variants, self.fail = tree, 0.0, [], fail
        self.state = FakeTensor(4).fill([0.0] * 4)

    def prelaunch(self, variant, on_current):
        self.variants.append(variant)
        assert on_current is True  # the simulator's caller stream is 0 and its tree's stream blocking
        if self.fail:
            raise RuntimeError("the generator refused")
        X.sim_launch(self.tree.stream, k_fill, self.state.ptr, 4, self.offset)
        self.offset += 1

    def graph(self, x):
        out = FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, x.ptr, self.state.ptr, x.n)
        return (out,)


def random_segment(tree, gen):
    return X.Segment(tree, "random", gen.graph, lambda inputs: gen.graph(*inputs), alias, describe, span,
                     bytes((ARG_TENSOR,)), (16,), 0, False, False, prelaunch=gen.prelaunch)


def test_a_prelaunch_function_runs_before_each_launch_of_a_recording_and_its_work_comes_first(tree):
    gen = Generator(tree)
    seg = random_segment(tree, gen)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    (y,) = call(seg, x)  # the plain first call
    (y,) = call(seg, x)  # the warmup
    assert gen.variants == [] and y.values() == [1, 2, 3, 4]  # nobody wrote the state yet
    for k in range(5):  # the recording, then replays: each launch sees the state written for it
        (y,) = call(seg, x)
        assert y.values() == [1 + k, 2 + k, 3 + k, 4 + k]
    assert gen.variants == [0] * 5
    assert tree.stats()["recordings"] == 1 and tree.stats()["replays"] == 4


def run_threads(getter, *work):
    """Runs each function of work on a thread of its own, named A, B, ...
    in order, with getter as the hot path's tree getter; joins them and
    takes the getter away again."""
    import threading

    X.set_tree_getter(getter)
    try:
        ts = [threading.Thread(target=w, name="AB"[i]) for i, w in enumerate(work)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        X.set_tree_getter(None)


def test_a_random_graphs_run_keeps_other_threads_random_runs_out_from_its_write_to_its_launch():
    """Every random graph of a device, on every thread's tree, reads the
    one state of the generator, which the prelaunch of each launch writes
    first; an event after each run makes the next writer wait for the
    launches before it. The prelaunch is Python and lets other threads run
    (CUDAGraph.replay releases the GIL), so without a lock another thread
    could write the state between this run's write and its launch, and the
    two launches would draw the same numbers: test_torch_random.py's
    two-thread test saw it on an H200. Here each prelaunch sleeps, which
    releases the GIL: no other thread's random run may start meanwhile."""
    import threading
    import time

    trees = ThreadTrees()
    inside, overlaps, guard = [0], [], threading.Lock()

    def prelaunch(variant, on_current):
        with guard:
            inside[0] += 1
            if inside[0] > 1:
                overlaps.append(threading.current_thread().name)
        time.sleep(0.002)
        with guard:
            inside[0] -= 1

    seg = segment(trees(0), Graph(trees(0), 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,),
                  name="random_threads", prelaunch=prelaunch)
    errors = []

    def work(k):
        try:
            trees(0).explicit_steps = True
            x = FakeTensor(4).fill([k, 1, 2, 3])
            for _ in range(20):
                trees(0).step_begin()
                (y,) = seg(x)
                assert y.values() == [2 * k + 1, 3, 5, 7]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    run_threads(trees, lambda: work(1), lambda: work(2))
    assert errors == []
    assert sum(t.stats()["replays"] for t in trees.made[1:]) >= 30  # the prelaunches ran, at each replay
    assert overlaps == [], "a random run began while another thread's was between its write and its launch"


def test_a_plain_call_of_a_random_graph_waits_for_another_threads_random_recording():
    """While a thread records a random graph, PyTorch's generator is in
    capture mode and refuses eager draws; cgtree's own plain calls of random
    graphs (a graph's first call, a graph gone plain) wait for the
    recording instead of failing: they take the lock every random run
    holds."""
    import threading

    trees = ThreadTrees()
    state = {"recording": False, "next_is_recording": False}
    in_recording, clash = threading.Event(), []

    def graph_a(x):
        if state["next_is_recording"]:  # the recording's launch: the other thread tries meanwhile
            state.update(next_is_recording=False, recording=True)
            in_recording.set()
            threading.Event().wait(0.2)  # lets the GIL go, as PyTorch's calls do
            state["recording"] = False
        return Graph(trees(0), 2.0, 1.0, stream=lambda: trees(0).stream)(x)

    def graph_b(x):  # a random graph's plain call, on the other thread
        if state["recording"]:
            clash.append("a plain random call ran during another thread's random recording")
        return Graph(trees(0), 1.0, 0.0, stream=lambda: trees(0).stream)(x)

    def random_seg(name, fn):
        return X.Segment(trees(0), name, fn, lambda inputs: fn(*inputs), alias, describe, span,
                         bytes((ARG_TENSOR,)), (16,), 0, False, False, prelaunch=lambda variant, on_current: None)

    seg_a, seg_b = random_seg("recorded", graph_a), random_seg("plain", graph_b)
    errors = []

    def thread_a():
        try:
            trees(0).explicit_steps = True
            x = FakeTensor(4).fill([1, 2, 3, 4])
            for i in range(3):  # the plain first call, the warmup, then the recording
                trees(0).step_begin()
                state["next_is_recording"] = i == 2
                seg_a(x)
            assert trees(0).stats()["recordings"] == 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
            in_recording.set()

    def thread_b():
        try:
            assert in_recording.wait(10)
            trees(0).explicit_steps = True
            trees(0).step_begin()
            (y,) = seg_b(FakeTensor(4).fill([5, 6, 7, 8]))  # its first call: plain
            assert y.values() == [5, 6, 7, 8]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    run_threads(trees, thread_a, thread_b)
    assert errors == []
    assert seg_b.info["plain_calls"] == 1
    assert clash == []


def test_a_calls_static_pointers_stay_its_own_when_another_thread_calls_the_segment_meanwhile():
    """Without DLPack's exchange API a call may take its STATIC inputs'
    pointers as unchanged since its tree's last call, on PyTorch's word;
    each tree keeps those pointers of its own. A call that let the GIL go
    before it read them (here: Python's span of a DYNAMIC input) must not
    find the pointers of another thread's call on other weights: its node
    would be theirs, and the output too, silently."""
    import threading

    n_static = 8

    def ptrs_equal(tensors, ptrs, idx):
        return all(tensors[i].ptr == ptrs[i] for i in idx)

    init_hot_path(ptrs_equal)
    local = threading.local()

    def getter(dev):
        if not hasattr(local, "t"):
            local.t = X.Tree(0, backend="sim")
        return local.t

    def add_first_weight(x, *ws):
        out = FakeTensor(x.n)
        X.sim_launch(getter(0).stream, k_add, out.ptr, x.ptr, ws[0].ptr, x.n)
        return [out]

    pause, a_in_span, b_done = [False], threading.Event(), threading.Event()

    def span_of(t):
        if pause[0] and threading.current_thread().name == "A" and getattr(t, "is_x", False):
            pause[0] = False
            a_in_span.set()
            b_done.wait(10)  # A lets the GIL go here, as Python code may
        return t.nbytes

    base = X.Tree(0, backend="sim")
    kinds = (ARG_TENSOR,) + (ARG_TENSOR_STATIC,) * n_static
    seg = X.Segment(base, "w", add_first_weight, lambda inputs: add_first_weight(*inputs), alias, describe, span_of,
                    bytes(kinds), (16,) * (n_static + 1), 0, True)
    wa = [FakeTensor(4).fill([10] * 4) for _ in range(n_static)]
    wb = [FakeTensor(4).fill([1000] * 4) for _ in range(n_static)]
    got, errors = {}, []

    def thread_a():
        try:
            x = FakeTensor(4).fill([1, 2, 3, 4])
            x.is_x = True
            for w in (wb, wa):  # A's tree holds a node for each weight set
                for _ in range(4):
                    (y,) = call(seg, x, *w)
            pause[0] = True
            (y,) = call(seg, x, *wa)
            got["a"] = y.values()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
            a_in_span.set()

    def thread_b():
        try:
            assert a_in_span.wait(10)
            (y,) = call(seg, FakeTensor(4).fill([0] * 4), *wb)
            got["b"] = y.values()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            b_done.set()

    try:
        run_threads(getter, thread_a, thread_b)
    finally:
        init_hot_path()
    assert errors == []
    assert got == {"a": [11.0, 12.0, 13.0, 14.0], "b": [1000.0] * 4}


def test_a_forward_segment_on_autograds_thread_runs_on_the_tree_of_each_backwards_caller():
    """Autograd's device thread runs forward segments too (a checkpointed
    block's recompute, a compiled optimizer in a gradient hook), each time
    on the tree of the thread that called backward(), which cgtree.torch's
    getter gives from PyTorch's stash. That thread must not keep the first
    caller's tree as its own: only a tree's owner thread caches it."""
    import threading

    dt = DeviceThread()
    getter, stash, on_device_thread = dt.getter, dt.stash, dt.run
    base = X.Tree(0, backend="sim")
    seg = segment(base, Graph(base, 2.0, 1.0, stream=lambda: getter(0).stream), spans=(16,), name="fw")
    X.set_tree_getter(getter)
    runs, errors = {}, []

    def caller(name):
        try:
            t = getter(0)
            assert t.owner_thread == threading.get_ident()
            call(seg, FakeTensor(4).fill([1] * 4))
            before = t.stats()["runs"]
            stash["tree"] = t  # this thread's backward
            (y,) = on_device_thread(lambda: call(seg, FakeTensor(4).fill([1] * 4)))
            assert y.values() == [3.0] * 4
            runs[name] = t.stats()["runs"] - before
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    try:
        for name in ("first", "second"):  # two threads, both alive: the first waits on
            th = threading.Thread(target=caller, args=(name,))
            th.start()
            th.join()
    finally:
        X.set_tree_getter(None)
        dt.stop()
    assert errors == []
    assert runs == {"first": 1, "second": 1}, runs


def test_an_output_dropped_on_another_thread_during_its_trees_run_is_released_after_that_run():
    """A tensor one thread's tree made, dropped and drained on another
    thread while the first is inside a run of its tree (in a launch or
    prelaunch, which may let the GIL go): the tree refuses releases inside
    a launch, and its thread is using it. The release waits in the queue
    for the next drain after that run; it is never lost (the value's pool
    memory would stay taken until the step ended)."""
    import threading

    local = threading.local()

    def getter(dev):
        if not hasattr(local, "t"):
            local.t = X.Tree(0, backend="sim")
            local.t.explicit_steps = True
        return local.t

    base = X.Tree(0, backend="sim")
    g1 = Graph(base, 2.0, 1.0, stream=lambda: getter(0).stream)
    seg1 = segment(base, g1, spans=(16,), name="s1")
    in_launch, go_on, state = threading.Event(), threading.Event(), {"block": False}

    def g2(x):
        if state["block"] and threading.current_thread().name == "A":
            state["block"] = False
            in_launch.set()
            go_on.wait(10)  # a launch that lets other threads run
        return g1(x)

    seg2 = X.Segment(base, "s2", g2, lambda inputs: g2(*inputs), alias, describe, span, bytes((ARG_TENSOR,)),
                     (16,), 0, False)
    segb = segment(base, Graph(base, 1.0, 0.0, stream=lambda: getter(0).stream), spans=(16,), name="sb")
    handoff, res, errors = {}, {}, []

    def thread_a():
        try:
            T = getter(0)
            x = FakeTensor(4).fill([1] * 4)
            T.step_begin()
            (y0,) = seg1(x)
            del y0
            (y,) = seg1(x)
            handoff["y"] = y
            del y
            (z0,) = seg2(x)  # its first call: plain
            del z0
            state["block"] = True
            (z,) = seg2(x)  # its warmup: a launch, during which B drops y and drains
            del z
            T.stats()  # drains
            res["pool"] = T.stats()["pool_allocated_bytes"]
            res["alive"] = T.stats()["outputs_alive"]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
            in_launch.set()

    def thread_b():
        try:
            assert in_launch.wait(10)
            handoff.pop("y")
            segb(FakeTensor(4).fill([0] * 4))  # B's call drains the queue while A's tree is in its run
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            go_on.set()

    run_threads(getter, thread_a, thread_b)
    assert errors == []
    assert res == {"pool": 0, "alive": 0}, res


def test_cudagraph_mark_step_begin_is_process_wide_and_begins_a_step_on_every_threads_tree(tree):
    """docs/torch.md: PyTorch's mark is one counter for the process, so a
    mark on one thread begins a step on another thread's explicit-mode tree
    too; threads that run at once use cgtree.torch.step_begin(), which is
    per thread."""
    import threading

    class MarkStepBox:
        mark_step_counter = 0

    init_hot_path(mark_step_cls=MarkStepBox)
    trees = ThreadTrees()
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="marks")
    got, marked, go_on = {}, threading.Event(), threading.Event()

    def worker():
        t = trees(0)
        t.explicit_steps = True
        x = FakeTensor(4).fill([1, 2, 3, 4])
        for _ in range(3):
            t.step_begin()
            call(seg, x)
        steps = t.step
        call(seg, x)  # no step_begin(): the same step
        got["same"] = t.step - steps
        go_on.set()
        marked.wait(10)
        call(seg, x)
        got["marked"] = t.step - steps

    def marker():
        go_on.wait(10)
        MarkStepBox.mark_step_counter -= 1  # what torch.compiler.cudagraph_mark_step_begin() does
        marked.set()

    try:
        run_threads(trees, worker, marker)
    finally:
        init_hot_path()
    assert got == {"same": 0, "marked": 1}


NO_LIMIT = 2**64 - 1


def test_an_allocation_refused_in_a_warmup_raises_out_of_memory_and_the_graph_stays_a_segment(tree):
    seg = segment(tree, Graph(tree, 2.0, 1.0), kinds=(ARG_TENSOR_STATIC,), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    call(seg, x)  # its first call runs plainly, outside the pool
    p = eager_alloc(4096, S1)
    eager_free(p, 4096, S1)  # a freed eager block the front cache keeps
    f0, s0 = eager_figures(), tree.stats()
    assert f0["front_cache_blocks"] >= 1
    tree.sim_set_device_limit(0)  # the pool cannot grow
    with pytest.raises(FakeOutOfMemoryError, match="CUDA out of memory") as e:
        call(seg, x)  # the warmup's allocation is refused
    assert isinstance(e.value.__cause__, RuntimeError)  # what the allocation raised, kept as the cause
    f1 = eager_figures()
    assert f1["pool_alloc_retries"] - f0["pool_alloc_retries"] == 1  # the chunk asked for again once...
    assert f1["front_cache_blocks"] == 0  # ...after the eager caches went back to the device
    assert seg.info["out_of_memory"] == 1 and seg.info["plain_reason"] is None
    s1 = tree.stats()
    assert s1["recordings"] == s0["recordings"] and s1["pool_allocated_bytes"] == s0["pool_allocated_bytes"]
    tree.check()
    tree.sim_set_device_limit(NO_LIMIT)  # memory is back: the graph warms up, records and replays
    for _ in range(4):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
    assert tree.stats()["replays"] - s0["replays"] >= 1
    assert seg.info["plain_reason"] is None and seg.info["plain_calls"] == 1  # only the first call


def test_a_placeholder_the_pool_cannot_hold_raises_out_of_memory_naming_the_graph(tree):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="needs_room")  # a DYNAMIC input: a placeholder
    x = FakeTensor(4).fill([1, 2, 3, 4])
    call(seg, x)  # plainly
    f0 = eager_figures()
    tree.sim_set_device_limit(0)
    with pytest.raises(FakeOutOfMemoryError, match="out of memory.*'needs_room'"):
        call(seg, x)  # the warmup needs a placeholder for x in the pool first
    assert eager_figures()["pool_alloc_retries"] - f0["pool_alloc_retries"] == 1  # asked again, after a reclaim
    assert seg.info["out_of_memory"] == 1 and seg.info["plain_reason"] is None
    tree.check()
    tree.sim_set_device_limit(NO_LIMIT)
    for _ in range(3):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]


class AddsOneThenNeedsMemory:
    """A graph that writes its input (x += 1), then allocates a temporary."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        X.sim_launch(self.tree.stream, k_affine, x.ptr, x.ptr, x.n, 1.0, 1.0)
        tmp = FakeTensor(x.n)
        del tmp
        return ()


def test_a_graph_that_writes_its_input_and_runs_out_of_memory_in_a_warmup_is_not_run_again(tree):
    """Its warmup's kernels ran up to the refusal, as Inductor's would: running
    it again plainly would add one twice."""
    seg = segment(tree, AddsOneThenNeedsMemory(tree), kinds=(ARG_TENSOR_STATIC,), spans=(16,), written_inputs=(0,))
    x = FakeTensor(4).fill([0, 0, 0, 0])
    call(seg, x)  # plainly (a graph that writes its input runs once at its first call)
    assert x.values() == [1, 1, 1, 1]
    tree.sim_set_device_limit(0)
    with pytest.raises(FakeOutOfMemoryError):
        call(seg, x)  # the warmup added one, then its temporary was refused
    X.sim_sync(tree.stream)
    assert x.values() == [2, 2, 2, 2]
    assert seg.info["plain_reason"] is None
    tree.sim_set_device_limit(NO_LIMIT)
    for i in range(4):
        call(seg, x)
        X.sim_sync(tree.stream)
        assert x.values() == [3 + i] * 4


def test_a_prelaunch_function_that_raises_makes_the_graph_plain_and_the_call_still_right(tree):
    gen = Generator(tree, fail=True)
    seg = random_segment(tree, gen)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    call(seg, x)
    call(seg, x)
    with pytest.warns(RuntimeWarning, match="the generator refused"):
        (y,) = call(seg, x)  # the recording's prelaunch raises: the plain graph answers
    assert y.values() == [1, 2, 3, 4]
    assert "the generator refused" in seg.info["plain_reason"]
    assert tree.stats()["recordings"] == 0
    with pytest.raises(TypeError, match="prelaunch is a callable"):
        X.Segment(tree, "bad", gen.graph, gen.graph, alias, describe, span, bytes((ARG_TENSOR,)), (16,), 0, False,
                  False, prelaunch=3)


def test_a_graph_that_raises_under_cgtree_runs_plainly_and_a_real_error_still_reaches_the_caller(tree):
    class Failing(Graph):
        def __call__(self, x):
            if self.calls >= 1:
                self.calls += 1
                raise ValueError("graph failed")
            return Graph.__call__(self, x)

    seg = segment(tree, Failing(tree, 1.0, 0.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    call(seg, x)  # the plain first call succeeds
    with pytest.warns(RuntimeWarning, match="graph failed"), pytest.raises(ValueError, match="graph failed"):
        call(seg, x)  # the warmup raises; the plain call that follows raises too
    assert "graph failed" in seg.info["plain_reason"]


def test_a_graph_that_raises_only_under_cgtree_keeps_working_plainly(tree):
    class CaptureShy(Graph):
        def __call__(self, x):
            if self.calls == 1:  # the warmup: e.g. a call PyTorch refuses inside cgtree
                self.calls += 1
                raise RuntimeError("not under capture")
            return Graph.__call__(self, x)

    g = CaptureShy(tree, 2.0, 0.0)
    seg = segment(tree, g, spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    call(seg, x)
    with pytest.warns(RuntimeWarning, match="not under capture"):
        (y,) = call(seg, x)
    assert y.values() == [2, 4, 6, 8]
    (y,) = call(seg, x)
    assert y.values() == [2, 4, 6, 8] and seg.info["plain_calls"] == 3


def test_outputs_a_recording_cannot_carry_make_the_segment_plain(tree):
    class HostOutput(Graph):
        def __call__(self, x):
            self.calls += 1
            return (FakeTensor(x.n, ptr=x.ptr),)  # an alias the first call describes fine

    g = HostOutput(tree, 1.0, 0.0)

    def describe_none_after_first(res, _n=[0]):
        _n[0] += 1
        return describe(res) if _n[0] == 1 else None

    def launch(inputs):
        return g(*inputs)

    seg = X.Segment(tree, "host", g, launch, alias, describe_none_after_first, span, bytes([ARG_TENSOR]), (16,),
                    0, False)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    call(seg, x)
    with pytest.warns(RuntimeWarning, match="runs without CUDA graphs"):
        (y,) = call(seg, x)
    assert y.values() == [1, 2, 3, 4]
    assert seg.info["plain_reason"] is not None
    call(seg, x)
    assert seg.info["plain_calls"] >= 3


def test_a_segment_made_plain_from_the_start_runs_plainly_and_its_calls_still_begin_steps(tree):
    """A graph the compile decided must run plainly (it restores the
    generator's state, say) is a Segment all the same, so that its calls mark
    steps: cgtree runs nothing for it."""
    why = "it saves or restores the random generator's state (a replay cannot)"
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="plain", plain_reason=why)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for _ in range(3):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
    s = tree.stats()
    assert s["runs"] == s0["runs"] and s["step"] == s0["step"] + 3
    assert seg.info["plain_reason"] == why and seg.info["plain_calls"] == 3 and not seg.info["registered"]
    with pytest.raises(TypeError, match="plain_reason"):
        segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), plain_reason=3)


def test_an_output_of_an_earlier_step_passed_to_a_plain_segment_raises_when_read(tree):
    """A plain segment's call is a new compiled call like any other: it
    begins a step, so an output of a step before, passed to it, raises
    when the plain graph reads it, as it would passed to a recorded graph;
    an output of the step it ends is moved first, as for a recorded graph."""
    class Reads(Graph):
        def __call__(self, t):
            t.data_ptr()  # Inductor's kernels read their inputs' data
            return Graph.__call__(self, t)

    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    (old,) = call(seg, x)
    (y,) = call(seg, x)
    plain = segment(tree, Reads(tree, 1.0, 0.0), spans=(16,), name="plain", plain_reason="decided at compile time")
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        call(plain, old)
    (z,) = call(plain, x)  # what is not stale runs
    assert z.values() == [1, 2, 3, 4]
    (y,) = call(seg, x)
    moved = tree.stats()["arguments_moved"]
    (z,) = call(plain, y)  # the step this call ends: y moves, and the plain graph reads it
    assert z.values() == [3, 5, 7, 9] and y.values() == [3, 5, 7, 9]
    assert tree.stats()["arguments_moved"] == moved + 1


def test_a_segment_takes_its_arguments_boxed_in_one_list_as_aotautograd_passes_them(tree):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    assert seg._boxed_call is True
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(5):
        Generation.generation += 1
        (y,) = seg([x]) if i % 2 else seg(x)
        assert y.values() == [3, 5, 7, 9]
    assert tree.stats()["replays"] >= 2


def test_a_wrapper_made_by_functools_wraps_says_boxed_too_as_dynamos_disable_makes_around_a_backward(tree):
    """torch._dynamo.disable wraps every compiled backward with
    functools.wraps, which copies the instance's __dict__: the wrapper must
    say _boxed_call too, or AOTAutograd warns at each backward and passes
    the arguments one by one."""
    import functools
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))

    def wrapper(*args, **kwargs):
        return seg(*args, **kwargs)

    wrapped = functools.wraps(seg)(wrapper)
    assert getattr(wrapped, "_boxed_call", False) is True
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):
        Generation.generation += 1
        (y,) = wrapped([x])  # as AOTAutograd calls a boxed backward: one list
        assert y.values() == [3, 5, 7, 9]


def test_a_call_with_the_wrong_argument_count_is_a_type_error(tree):
    seg = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,))
    with pytest.raises(TypeError, match="positional arguments"):
        seg()


def test_a_tree_needs_a_known_backend():
    with pytest.raises(ValueError, match="backend"):
        X.Tree(0, backend="tpu")


# ---- DLPack's C exchange API (python/_torch_ext/exchange.c), with a stand-in
#
# No PyTorch here: the extension's stand-in exchange table reads a fake
# tensor's `ptr` attribute for its data pointer, makes output tensors by
# calling make() below, and says the current stream of device d is d * 4096.


class DLManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p)), ("flags", ctypes.c_uint64), ("dl", DLTensor)]


made = []  # tensors the stand-in table made


def make_from_versioned(addr):
    m = DLManagedVersioned.from_address(addr)
    n = 1
    for d in range(m.dl.ndim):
        n *= m.dl.shape[d]
    t = FakeTensor(n, ptr=m.dl.data + m.dl.byte_offset, managed=(addr, m.deleter))
    t.storage_offset_bytes = m.dl.byte_offset
    made.append(n)
    return t


class XTensor(FakeTensor):
    """A FakeTensor the stand-in table serves (it serves exact types only)."""
    reads = 0  # calls of data_ptr(), the slow path

    def data_ptr(self):
        XTensor.reads += 1
        return self.ptr


def probes(n=3):
    ts = [XTensor(4) for _ in range(n)]
    return ts, [(t, t.ptr) for t in ts]


@pytest.fixture
def exchange():
    def setup(probe_list, which="v1", types=(XTensor,)):
        return X.setup_exchange(X.test_exchange_api(make_from_versioned, which), types, probe_list)

    yield setup
    X.setup_exchange(None, (), [])


def test_the_exchange_api_is_used_only_where_it_proves_right(exchange):
    keep, good = probes()
    r = exchange(good)
    assert r["pointers"] and r["outputs"], r["why"]
    assert X.exchange_info()["pointers"] and X.exchange_info()["outputs"]
    assert exchange(good, "v2")["pointers"]  # a 2.0 table chained to a 1.3 one: the 1.3 one is used
    refusals = {
        "probe 1": exchange([good[0], (good[1][0], good[1][1] + 4)] + good[2:]),  # data_ptr() says otherwise
        "no probe": exchange([]),
        "no DLPack version 1.2": exchange(good, "old"),
    }
    for why, r in refusals.items():
        assert not r["pointers"] and why in r["why"], r
        assert not X.exchange_info()["pointers"]
    assert exchange(good)["pointers"]
    for bad in (([(1,)],), ([(good[0][0], "x")],), ("probes",)):  # malformed: refused, and nothing changes
        with pytest.raises(TypeError):
            exchange(*bad)
        assert X.exchange_info()["pointers"]
    with pytest.raises(TypeError):
        X.setup_exchange(object(), (XTensor,), good)  # not the table's capsule
    assert X.exchange_info()["pointers"]


def test_replays_read_pointers_and_make_outputs_through_the_exchange_api(tree, exchange):
    _, good = probes()
    assert exchange(good)["pointers"]

    seg = weighted_segment(tree, 8, "xchg")
    x = XTensor(4).fill([1, 2, 3, 4])
    ws = [XTensor(4).fill([10, 10, 10, 10]) for _ in range(8)]
    XTensor.reads = 0
    made.clear()
    for i in range(6):
        x.fill([1 + i, 2, 3, 4])
        (y,) = call(seg, x, *ws)
        assert y.values() == [11 + i, 12, 13, 14]
    assert XTensor.reads == 9  # the first call only: each input read both ways, and they agreed
    assert len(made) >= 4  # the replays' outputs came from the table, not from from_dlpack
    moved = XTensor(4).fill([20, 20, 20, 20])
    ws[0] = moved  # the weight moved (param.data = ...)
    (y,) = call(seg, x, *ws)
    assert y.values() == [26, 22, 23, 24]  # a new node for the new address, not a stale replay
    assert XTensor.reads == 9
    before = tree.stats()["pool_allocated_bytes"]
    del y  # its deleter hands the value back
    call(seg, x, *ws)
    assert tree.stats()["recordings"] == 2
    assert tree.stats()["pool_allocated_bytes"] <= before


@pytest.mark.parametrize("deleter", ["ran", "never_runs"])
def test_an_output_the_exchange_api_fails_to_make_gives_its_value_back_and_leaves_its_tree_free_to_close(
        tree, exchange, deleter):
    """DLPack's exchange API may fail to make an output tensor after running
    the output's deleter or without running it, and cgtree cannot tell
    which. The call raises, the value goes back to the tree at once, and the
    output's record leaves the tree, so that the tree of an exited thread is
    freed all the same (such a record used to keep it for good); a deleter
    that ran, or comes later, frees only the record."""
    _, good = probes()
    fail = []

    def make(addr):
        if fail:
            if deleter == "ran":
                m = DLManagedVersioned.from_address(addr)
                m.deleter(addr)
            raise RuntimeError("no tensor today")
        return make_from_versioned(addr)

    assert X.setup_exchange(X.test_exchange_api(make), (XTensor,), good)["outputs"]
    trees = ThreadTrees()
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="nomake")
    X.set_tree_getter(trees)
    errors, alive = [], []

    def work():
        x = XTensor(4).fill([1, 2, 3, 4])
        for _ in range(4):  # plain first call, warmup, recording, replay
            (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
        del y
        fail.append(1)
        try:
            call(seg, x)
        except RuntimeError as e:
            errors.append(str(e))
        alive.append(trees(0).stats()["outputs_alive"])

    try:
        in_a_thread(work)
        assert errors and "no tensor today" in errors[0], errors
        assert alive == [0]  # the value the failed call made went back
        fail.clear()
        (dead,) = trees.made
        freed = X.alloc_figures()["trees_freed"]
        dead.orphan()
        x = XTensor(4).fill([0, 1, 2, 3])
        (z,) = call(seg, x)  # on the main thread's tree; the orphan is freed at a call
        assert dead.closed and X.alloc_figures()["trees_freed"] == freed + 1
        assert z.values() == [1, 3, 5, 7]
    finally:
        X.set_tree_getter(None)


@pytest.mark.parametrize("when", ["first_call", "replay_through_the_exchange_api"])
def test_a_tensor_argument_off_the_trees_device_makes_the_graph_plain_and_its_call_right(tree, exchange, when):
    """A compile sees PyTorch's fake tensors, which may put on the GPU a
    tensor that really is on the CPU (memory-efficient attention's random
    seed and offset, outside a capture). Such an argument is never taken for
    device memory: the graph runs plainly from then on, and the call is
    right. The first call reads it through PyTorch (is_cuda), a replay through
    the exchange API (the DLTensor's device): each case sets only what its
    way reads."""
    _, good = probes()
    assert exchange(good)["pointers"]
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="offdev")
    off = XTensor(4).fill([1, 2, 3, 4])
    if when == "first_call":
        off.is_cuda = False
    else:
        x = XTensor(4).fill([0, 0, 0, 0])
        for _ in range(4):
            call(seg, x)
        assert tree.stats()["replays"] >= 1
        off.dl_device = (1, 0)  # kDLCPU
    runs = tree.stats()["runs"]
    with pytest.warns(RuntimeWarning, match="argument 0 is not a CUDA tensor of device 0 when it runs"):
        (y,) = call(seg, off)
    assert y.values() == [3, 5, 7, 9]
    assert "argument 0 is not a CUDA tensor" in seg.info["plain_reason"]
    assert tree.stats()["runs"] == runs  # cgtree ran nothing for it


def test_a_pointer_that_differs_from_data_ptr_turns_the_exchange_pointers_off_for_good(tree, exchange):
    _, good = probes()
    assert exchange(good)["pointers"]

    class Liar(XTensor):  # served: the table reads .ptr, data_ptr() says the truth
        def data_ptr(self):
            XTensor.reads += 1
            return self.real

    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="liar")
    x = Liar(4).fill([1, 2, 3, 4])
    elsewhere = FakeTensor(4).fill([9, 9, 9, 9])
    x.real, x.ptr = x.ptr, elsewhere.ptr  # the table would read other memory
    assert exchange(good, types=(Liar,))["pointers"]

    def tell_graph_the_truth():  # Graph reads .ptr: let it compute on the truth from here
        x.ptr = x.real

    a_disagreement_turns_the_way_off(seg, x, X.exchange_info, "pointers", XTensor, tell_graph_the_truth)


def a_disagreement_turns_the_way_off(seg, x, info, on_key, counted, after_first=None):
    """x's first call finds the fast way disagreeing with data_ptr(): a
    warning, the way off for good, and every later call reads data_ptr().
    Without after_first, the first call too must compute on data_ptr()'s
    memory."""
    with pytest.warns(RuntimeWarning, match="read through data_ptr"):
        (y,) = call(seg, x)
    if after_first:
        after_first()
    else:
        assert y.values() == [3, 5, 7, 9]
    f = info()
    assert not f[on_key] and f["disagreements"] >= 1
    del y  # alive when a step begins, an output has each argument's pointer read once more (to move it?)
    counted.reads = 0
    for _ in range(3):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
        del y
    assert counted.reads == 3  # every call reads through data_ptr() now


def test_the_exchange_stream_is_used_only_where_it_agrees_with_pytorch(exchange):
    _, good = probes()
    exchange(good)
    assert X.check_exchange_stream(2, lambda d: d * 4096)  # the stand-in's answer
    assert X.exchange_info()["stream"]
    assert not X.check_exchange_stream(2, lambda d: d * 4096 + 1)
    assert not X.exchange_info()["stream"]
    assert X.check_exchange_stream(2, lambda d: d * 4096)
    for bad in ((2, "not callable"), ("2", lambda d: 0)):
        with pytest.raises(TypeError):
            X.check_exchange_stream(*bad)
        assert X.exchange_info()["stream"]  # refused, and nothing changed
    with pytest.raises(ZeroDivisionError):
        X.check_exchange_stream(2, lambda d: 1 / 0)
    assert X.exchange_info()["stream"]
    X.setup_exchange(None, (), [])
    assert not X.exchange_info()["stream"]


def test_the_measurement_of_tensor_making_runs_each_way(exchange):
    ts, good = probes()
    assert exchange(good)["outputs"]
    buf = FakeTensor(8)
    made.clear()
    m = X.time_tensor_making(buf.ptr, (2, 4), 0, 5)
    assert m["exchange_ns"] > 0 and m["from_dlpack_ns"] > 0
    assert made == [8] * 5  # the stand-in table made each, and each was dropped (the deleters freed them)
    with pytest.raises(ValueError):
        X.time_tensor_making(buf.ptr, (1,) * 9, 0, 5)


def test_the_exchange_outputs_are_refused_where_a_made_tensor_misbehaves(exchange):
    _, good = probes()

    def wrong_place(addr):  # a tensor somewhere else than asked
        t = make_from_versioned(addr)
        t.ptr += 4
        return t

    def no_deleter(addr):  # a tensor that never gives the memory back
        m = DLManagedVersioned.from_address(addr)
        return FakeTensor(4, ptr=m.dl.data)

    for make in (wrong_place, no_deleter):
        r = X.setup_exchange(X.test_exchange_api(make), (XTensor,), good)
        assert r["pointers"] and not r["outputs"] and "tensor the table made" in r["why"], r
        assert not X.exchange_info()["outputs"]


def test_an_output_the_exchange_api_fails_to_make_raises_and_loses_nothing(tree, exchange):
    _, good = probes()
    state = {"fail": False, "delete_first": False}

    def flaky(addr):
        if not state["fail"]:
            return make_from_versioned(addr)
        if state["delete_first"]:  # the table ran the deleter before failing
            m = DLManagedVersioned.from_address(addr)
            m.deleter(addr)
        raise MemoryError("the table could not make the tensor")

    assert X.setup_exchange(X.test_exchange_api(flaky), (XTensor,), good)["outputs"]
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="flaky")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(4):
        (y,) = call(seg, x)
    del y
    base = tree.stats()["pool_allocated_bytes"]
    for delete_first in (False, True):
        state.update(fail=True, delete_first=delete_first)
        with pytest.raises(MemoryError):
            call(seg, x)
        tree.check()
        assert tree.stats()["pool_allocated_bytes"] <= base  # the value went back, once
        state["fail"] = False
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
        del y


def test_an_exchange_output_gives_its_value_back_when_the_tensor_dies(tree, exchange):
    _, good = probes()
    assert exchange(good)["outputs"]
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="dies")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(4):
        (y,) = call(seg, x)
    assert tree.stats()["outputs_alive"] == 1
    del y  # the versioned deleter queues it; stats() drains the queue
    assert tree.stats()["outputs_alive"] == 0


def test_a_subclass_of_a_served_type_is_read_through_data_ptr(tree, exchange):
    _, good = probes()
    assert exchange(good)["pointers"]

    class Sub(XTensor):
        pass

    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="sub")
    x = Sub(4).fill([1, 2, 3, 4])
    for _ in range(3):
        call(seg, x)
    XTensor.reads = 0
    (y,) = call(seg, x)
    assert y.values() == [3, 5, 7, 9]
    assert XTensor.reads == 1  # a replay, and still data_ptr(): only exact types are served


def test_a_tensor_described_as_base_and_byte_offset_reads_at_its_data(tree, exchange):
    """DLPack may describe a tensor as a base address plus byte_offset (the
    stand-in does for objects with `split`): the pointer is their sum."""
    _, good = probes()
    assert exchange(good)["pointers"]
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="split")
    x = XTensor(4).fill([1, 2, 3, 4])
    x.split = True
    XTensor.reads = 0
    for _ in range(5):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
    assert XTensor.reads == 1  # the first call's cross-check agreed: data + byte_offset
    assert X.exchange_info()["pointers"] and X.exchange_info()["disagreements"] == 0


def test_a_tree_made_with_time_launches_splits_the_graph_launch_out_of_cgt_run():
    for timed in (False, True):
        t = X.Tree(0, backend="sim", time_launches=timed)
        seg = segment(t, Graph(t, 2.0, 1.0), spans=(16,), name="timed")
        x = FakeTensor(4).fill([1, 2, 3, 4])
        for _ in range(5):
            (y,) = call(seg, x)
        timers = seg.timers()
        assert timers["replays"] >= 2
        assert (timers["ns_launch"] > 0) == timed and timers["ns_launch"] <= timers["ns_in_run"]
        assert (t.stats()["launch_host_ns"] > 0) == timed
        del y
        t.check()


def test_only_a_tree_made_with_time_launches_times_the_parts_of_its_calls():
    """The timers are the benchmarks': a tree made without time_launches
    (cgtree.torch's, unless CGTREE_TORCH_TIME_LAUNCHES=1) counts its replays
    and times nothing, even where another tree of the process is timed."""
    timed_tree = X.Tree(0, backend="sim", time_launches=True)  # the process now reads the clock at each call
    trees = {False: X.Tree(0, backend="sim"), True: timed_tree}
    for timed, t in trees.items():
        seg = segment(t, Graph(t, 2.0, 1.0), spans=(16,), name="parts")
        x = FakeTensor(4).fill([1, 2, 3, 4])
        for _ in range(5):
            (y,) = call(seg, x)
            assert y.values() == [3, 5, 7, 9]
        timers = seg.timers()
        assert timers["replays"] >= 2
        parts = [timers[k] for k in ("ns_in_call", "ns_args", "ns_in_run", "ns_outputs", "ns_step")]
        assert all(p > 0 for p in parts) if timed else all(p == 0 for p in parts), (timed, timers)
        if timed:
            assert timers["ns_in_call"] >= timers["ns_args"] + timers["ns_in_run"] + timers["ns_outputs"]
        seg.reset_timers()
        assert seg.timers()["replays"] == 0 and seg.timers()["ns_in_call"] == 0
        del y
        t.check()


# ------------------------------------------------------------ training

class ForwardGraph:
    """A training forward: out = 2x, then one saved activation, 3x."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        out, saved = FakeTensor(x.n), FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, x.ptr, x.n, 2.0, 0.0)
        X.sim_launch(self.tree.stream, k_affine, saved.ptr, x.ptr, x.n, 3.0, 0.0)
        return (out, saved)


class BackwardGraph(AddTwo):
    """Its backward: grad = saved + tangent."""


def frozen_backbone(tree):
    """A frozen backbone's inference graph, 5x, as a segment that may run
    its first call twice (rerun_first)."""
    g = Graph(tree, 5.0, 0.0)
    return X.Segment(tree, "backbone", g, lambda inputs: g(*inputs), alias, describe, span, bytes((ARG_TENSOR,)),
                     (16,), 0, False, True)


class HeadSavingItsInput:
    """A head's forward: 2h, saving h itself (as a Linear saves its input)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, h):
        out = FakeTensor(h.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, h.ptr, h.n, 2.0, 0.0)
        return (out, h)


def paired(tree, forward_graph, name, pair, span=16):
    """A training forward of forward_graph (saving its results from 1 on)
    and its backward (BackwardGraph: saved + tangent), named name and
    name + "_bw", one AOTAutograd id (pair) between them."""
    fw = segment(tree, forward_graph, spans=(span,), name=name, saved_from=1, pair=pair)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(span, span), name=name + "_bw",
                 backward=True, pair=pair)
    return fw, bw


def test_a_saved_input_that_is_an_output_of_the_step_is_a_view_of_it_and_holds_the_step_until_its_backward(tree):
    """h, an output of this step, passed to a training forward that saves
    its input (a Linear): the plain graph returns h itself as the saved
    result, sharing h's version counter, so a write in place to h before
    the backward raises autograd's error under Inductor. Made a DLPack
    tensor of its own over h's memory, the saved result had a counter of
    its own, and the backward read the written values without a word (a
    helper's audit). It is a view of h now (h's storage). It is no saved
    activation of the tree's either, so h's record holds the step for it:
    a second forward before the backwards (a contrastive pair) goes on in
    the step, and both backwards read what their forwards saw."""
    backbone = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone")
    head = segment(tree, HeadSavingItsInput(tree), spans=(16,), name="head", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    s0 = tree.stats()
    for i in range(5):
        (h,) = call(backbone, x)  # [2, 4, 6, 8]
        z1, s1 = call(head, h)
        step = tree.stats()["step"]
        z2, s2 = call(head, h)  # a second forward: held by s1, a view of h
        if i >= 2:  # the tree's runs (the first calls run as the plain graph, which returns h itself)
            assert s1.untyped_storage() is h.untyped_storage(), "the saved input is no view of h"
            assert tree.stats()["step"] == step, "the second forward began a step while a saved input lives"
        assert z1.values() == z2.values() == [4, 8, 12, 16]
        (g1,) = bw(s1, t)
        (g2,) = bw(s2, t)
        assert g1.values() == g2.values() == [3, 5, 7, 9]
        del h, z1, s1, z2, s2, g1, g2
        gc.collect()
    st = tree.stats()
    assert st["stale_refused"] == s0["stale_refused"] and st["steps_forced"] == s0["steps_forced"]
    assert st["outputs_viewing_values"] - s0["outputs_viewing_values"] >= 6


@pytest.mark.parametrize("kept", ["the_view", "a_detached_alias"])
@pytest.mark.parametrize("heads", ["one_head", "one_head_twice", "two_heads"])
def test_forwards_saving_an_output_of_the_step_hold_it_until_each_ones_backward_read_it(tree, heads, kept):
    """Training forwards save h, an output of the step, as a view of it (a
    Linear saves its input), then a compiled call comes before a backward
    (a metric, a log; or between two forwards' backwards, with the same
    head called twice or two heads). The saved view is no saved activation
    of the tree's: h's memory holds the step until each saving forward's
    backward read it. Held through a flag on h's record, the first backward
    ended it and the second raised StaleTensorError where Inductor computes;
    held through a weak reference to the view, nothing held it, since
    AOTAutograd saves a view detached, a new tensor over the memory (a
    helper's reviews)."""
    backbone = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone")
    head1, bw1 = paired(tree, HeadSavingItsInput(tree), "head1", 1)
    if heads == "two_heads":
        head2, bw2 = paired(tree, HeadSavingItsInput(tree), "head2", 2)
    else:
        head2, bw2 = head1, bw1
    other = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="other")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])

    def saved(s):  # what autograd keeps: AOTAutograd's s.detach() for a view, another tensor over the memory
        return s.view() if kept == "a_detached_alias" else s

    s0 = tree.stats()
    for i in range(6):
        (h,) = call(backbone, x)  # [2, 4, 6, 8]
        z1, s1 = call(head1, h)
        s1 = saved(s1)
        if heads != "one_head":
            z2, s2 = call(head2, h)
            s2 = saved(s2)
            del z2
        del h, z1
        gc.collect()
        if heads != "one_head":
            (g1,) = bw1(s1, t)  # the first loss's backward: autograd frees what it saved
            assert g1.values() == [3, 5, 7, 9]
            del s1, g1
            gc.collect()
            s1 = s2
        (o,) = call(other, x)  # a compiled call before the (second) backward: a log, another model
        del o
        (g,) = bw2(s1, t)
        assert g.values() == [3, 5, 7, 9], "iteration %d" % i
        del s1, g
        gc.collect()
    st = tree.stats()
    assert st["stale_refused"] == s0["stale_refused"] and st["steps_forced"] == s0["steps_forced"]


@pytest.mark.parametrize("how", ["plain_for_good", "first_call_of_a_graph_that_may_not_rerun"])
def test_a_plain_forwards_saved_input_from_this_step_holds_the_step_until_its_backward(tree, how):
    """A training forward that runs as the plain graph (for good, or at its
    first call where it may not run twice: dropout, BatchNorm) saves its
    input, an output of a compiled backbone of this step. A second forward
    before the backwards (a contrastive pair) must not begin a step while
    that saved tensor lives: it began one, marked the backbone's output,
    and the first backward raised StaleTensorError where Inductor computes
    (a helper's audit)."""
    backbone = frozen_backbone(tree)
    kw = {"plain_reason": "an op cgtree cannot record"} if how == "plain_for_good" else {}
    head = segment(tree, HeadSavingItsInput(tree), spans=(16,), name="head", saved_from=1, **kw)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    for _ in range(3):  # the backbone replays
        call(backbone, FakeTensor(4).fill([0, 0, 0, 0]))
    gc.collect()
    t = FakeTensor(4).fill([1, 1, 1, 1])
    x1, x2 = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([10, 20, 30, 40])
    z1, s1 = head(*call(backbone, x1))  # a compiled call each (the generation moves)
    z2, s2 = head(*call(backbone, x2))  # the head's backward of z1 is pending
    (g2,) = bw(s2, t)
    (g1,) = bw(s1, t)
    assert g1.values() == [6, 11, 16, 21] and g2.values() == [51, 101, 151, 201]
    assert z1.values() == [10, 20, 30, 40]
    assert tree.stats()["saved_tied_to_outputs_alive"] == 0


@pytest.mark.parametrize("how", ["plain_for_good", "compiled"])
def test_a_loop_that_keeps_its_backbone_output_bound_begins_a_step_at_every_iteration(tree, how):
    """The hold of a plain forward that saved the backbone's output ends
    with its backward, not with that output: an ordinary loop keeps it
    bound (h = backbone(x)) into the next iteration, and a hold on it kept
    every later step from beginning (98 of 100 calls deferred, a node
    each, then a forced step: a review found it)."""
    backbone = frozen_backbone(tree)
    kw = {"plain_reason": "an op cgtree cannot record"} if how == "plain_for_good" else {}
    head = segment(tree, HeadSavingItsInput(tree), spans=(16,), name="head", saved_from=1, **kw)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    t = FakeTensor(4).fill([1, 1, 1, 1])
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for i in range(40):
        (h,) = call(backbone, x)  # the previous h is still bound here
        z, s = head(h)
        (g,) = bw(s, t)
        assert g.values() == [6, 11, 16, 21]  # h + t, h = 5x
        del z, s, g
    st = tree.stats()
    assert st["step"] - s0["step"] >= 39 and st["steps_forced"] == s0["steps_forced"]
    assert st["steps_deferred"] - s0["steps_deferred"] <= 1


def test_a_compiled_call_inside_a_backward_checkpointings_recompute_begins_no_step(tree):
    """Activation checkpointing around a compiled block B, then a compiled
    block C: B keeps none of its saved tensors, C's backward hands B's
    backward a gradient in the pool, and checkpointing runs compiled B
    again inside the backward (a compiled call: the generation moves). No
    saved activation is alive then, so that call began a step, marked C's
    gradient, and B's backward raised StaleTensorError where Inductor
    computes. autograd's graph task id (set_graph_task_id) says a backward
    runs: the call goes on in the step (a helper's audit)."""
    fb = X.Segment(tree, "fwB", ForwardGraph(tree), lambda inputs, g=ForwardGraph(tree): g(*inputs), alias, describe,
                   span, bytes((ARG_TENSOR,)), (16,), 0, False, True, saved_from=1)
    fc = segment(tree, ForwardGraph(tree), spans=(16,), name="fwC", saved_from=1)
    bb = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bwB", backward=True)
    bc = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bwC", backward=True)
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    try:
        t = FakeTensor(4).fill([1, 1, 1, 1])
        for _ in range(4):
            x = FakeTensor(4).fill([1, 2, 3, 4])
            h, sb = call(fb, x)
            del sb  # checkpointing keeps none of B's saved tensors
            y, sc = fc(h)  # the next piece of the same compiled call
            task[0] = 7  # autograd runs the backward
            (gh,) = bc(sc, t)  # C's backward: B's output's gradient, a pool value: 3 * 2x + 1
            del sc
            gc.collect()
            h2, sb2 = call(fb, x)  # checkpointing's recompute of B, inside the backward
            (gx,) = bb(sb2, gh)
            assert gx.values() == [3 * a + 3 * 2 * a + 1 for a in (1, 2, 3, 4)]
            task[0] = -1
            del h, y, gh, h2, sb2, gx
            gc.collect()
    finally:
        X.set_graph_task_id(None)


def test_compiled_calls_inside_a_backward_hold_the_step_at_most_1024_then_a_step_begins_with_a_warning(tree):
    """Compiled calls autograd makes inside a backward (checkpointing's
    recomputes, gradient hooks) go on in the step, each counted in
    steps_deferred, up to the bound of 1024 in a row; then a step begins
    with a warning, counted in steps_forced. It began with no warning and
    was counted nowhere (a review)."""
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    try:
        s0 = tree.stats()
        task[0] = 7  # autograd runs a backward
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(1024):
                call(seg, x)
        s1 = tree.stats()
        assert s1["step"] == s0["step"] and s1["steps_deferred"] == s0["steps_deferred"] + 1024
        with pytest.warns(RuntimeWarning, match="inside backwards"):
            (y,) = call(seg, x)  # past the bound
        assert y.values() == [3, 5, 7, 9]
        s2 = tree.stats()
        assert s2["step"] == s1["step"] + 1 and s2["steps_forced"] == s1["steps_forced"] + 1
    finally:
        X.set_graph_task_id(None)
    tree.check()


@pytest.mark.parametrize("handed", ["its_output", "a_new_tensor_over_it"])
def test_a_checkpointed_compiled_blocks_output_holds_the_step_until_a_backward_though_no_saved_activation_lives(tree,
                                                                                                               handed):
    """torch.utils.checkpoint around a compiled block B keeps none of B's
    saved activations (its backward recomputes them), then a compiled
    block C is called on B's output h: a new compiled call. Nothing saved
    of B lives, so that call began a step, marked h, and raised
    StaleTensorError where Inductor computes (found on an H100). h itself,
    alive and requiring grad, made by a training forward since the last
    backward, holds the step; the backward call ends the hold, so a loop
    that keeps h bound into its next iteration still begins a step at each
    one.

    A block that returns a view of an intermediate (x.t(), x[:, 0]) hands
    the program torch.ops.aten._unsafe_view of cgtree's output, a new
    tensor over the same memory, and cgtree's object dies at once: a weak
    reference to it held nothing and C's call raised StaleTensorError (a
    helper's audit). Such outputs (memory_watched_outputs) hold the step
    through their memory."""
    remade = handed == "a_new_tensor_over_it"
    fb = segment(tree, ForwardGraph(tree), spans=(16,), name="fwB", saved_from=1,
                 memory_watched_outputs=(0,) if remade else ())
    fc = segment(tree, ForwardGraph(tree), spans=(16,), name="fwC", saved_from=1)
    bb = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bwB", backward=True)
    bc = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bwC", backward=True)
    t = FakeTensor(4).fill([1, 1, 1, 1])
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for i in range(6):
        out, sb = call(fb, x)  # the previous iteration's h is still bound here
        h = out.view() if remade else out  # _unsafe_view: the program's tensor; cgtree's object dies
        h.requires_grad = True  # autograd's Function marks the output
        del out, sb  # checkpointing keeps none of B's saved tensors
        gc.collect()
        step = tree.stats()["step"]
        y, sc = call(fc, h)  # a new compiled call on h
        if i:  # the first calls run as the plain graphs: their outputs are not the tree's
            assert tree.stats()["step"] == step, "C's call began a step while B's backward is to come"
        (gh,) = bc(sc, t)  # C's backward: 3 * 2x + 1
        del sc
        gc.collect()
        h2, sb2 = fb(x)  # the recompute (inside the backward: no new generation here)
        (gx,) = bb(sb2, gh)
        assert gx.values() == [3 * a + 3 * 2 * a + 1 for a in (1, 2, 3, 4)]
        del y, gh, h2, sb2, gx
        gc.collect()
    st = tree.stats()
    assert st["step"] - s0["step"] == 7 and st["steps_forced"] == s0["steps_forced"]  # B's calls, and C's first


@pytest.mark.parametrize("kept", ["the_output", "a_view_of_it"])
def test_an_inference_output_alive_holds_the_step_for_a_training_forward_that_may_read_it(tree, kept):
    """Distillation, or a frozen encoder before a trainable model: under
    no_grad t = teacher(x) (an inference graph), then student(x) trains and
    the loss reads t after the student's call. That call comes with no
    backward pending, so it began a step, marked t, and the loss raised
    StaleTensorError where Inductor computes. t, made since the last
    backward call and alive (itself, or a view: its memory), holds the step
    for the training forward's call; the backward call ends the hold, so
    the next iteration's teacher call begins a step with the old t bound."""
    teacher = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="teacher")
    student = segment(tree, ForwardGraph(tree), spans=(16,), name="student", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    g = FakeTensor(4).fill([1, 1, 1, 1])
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for i in range(6):
        (out,) = call(teacher, x)  # the previous iteration's t is still bound here
        t = out.view() if kept == "a_view_of_it" else out
        del out
        gc.collect()
        step = tree.stats()["step"]
        y, saved = call(student, x)
        if i:  # the first calls run as the plain graphs: their outputs are not the tree's
            assert tree.stats()["step"] == step, "the student's call began a step while the teacher's output lives"
        assert t.values() == [5, 10, 15, 20]  # the loss reads t after the student's call
        (gx,) = bw(saved, g)
        assert gx.values() == [4, 7, 10, 13]
        del y, saved, gx
        gc.collect()
        assert tree.stats()["inference_outputs_watched"] == 0  # the backward call ended the hold
    st = tree.stats()
    assert st["step"] - s0["step"] == 7  # the teacher's calls, and the student's first
    assert st["steps_held_for_inference_outputs"] - s0["steps_held_for_inference_outputs"] == 5
    assert st["steps_forced"] == s0["steps_forced"] and st["stale_refused"] == s0["stale_refused"]


def test_inference_outputs_hold_no_evaluation_call_and_an_optimizers_outputs_hold_nothing(tree):
    """The hold is for a training forward's call only: an evaluation loop
    under no_grad keeps its last output bound into each call and still
    begins a step at each. An inference graph after the step's backward
    (a compiled optimizer step, a gradient norm for the log) is the step's:
    its output, kept into the next iteration, holds no training forward, or
    every training step would join the next. An inference output dropped
    before the training forward's call holds nothing either."""
    ev = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,), name="eval")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    y = None
    for _ in range(6):
        (y,) = call(ev, x)
    assert y.values() == [3, 5, 7, 9]
    st = tree.stats()
    assert st["step"] - s0["step"] == 6 and st["steps_deferred"] == s0["steps_deferred"]

    student = segment(tree, ForwardGraph(tree), spans=(16,), name="student", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    opt = segment(tree, WritesItsInput(tree), kinds=(ARG_TENSOR_STATIC,), spans=(16,), name="opt",
                  written_inputs=(0,))
    w = FakeTensor(4).fill([0, 0, 0, 0])
    g = FakeTensor(4).fill([1, 1, 1, 1])
    del y
    gc.collect()
    s1 = tree.stats()
    o = None
    for _ in range(6):
        out, saved = call(student, x)  # the previous iteration's optimizer output o is still bound
        (gx,) = bw(saved, g)
        del out, saved, gx
        gc.collect()
        (o,) = call(opt, w)  # the step's optimizer: it stays in the step
    st = tree.stats()
    assert st["step"] - s1["step"] == 6  # each student's call began one
    assert o.values() == [12, 12, 12, 12] and w.values() == [6, 6, 6, 6]
    del o
    gc.collect()
    for _ in range(4):
        (e,) = call(ev, x)  # an evaluation output, dropped before the student's call
        del e
        gc.collect()
        out, saved = call(student, x)
        (gx,) = bw(saved, g)
        del out, saved, gx
        gc.collect()
    st2 = tree.stats()
    assert st2["step"] - st["step"] == 8  # the evaluation's calls, and the student's
    assert st2["steps_held_for_inference_outputs"] == s0["steps_held_for_inference_outputs"]


def test_an_inference_output_holds_the_step_for_one_training_forwards_call_only(tree):
    """Monte Carlo dropout's votes: under no_grad f = backbone(x), then a
    trainable head called many times on f with grad left on, each output
    dropped at once, and no backward. Held at every call, the step reached
    the 64-call bound with a warning and a recording per call (a helper's
    review). The hold holds one training forward's call (whose own saved
    activations hold the step from there in distillation): each later head
    call begins a step, and f, its argument, is moved into it, as before
    the hold."""
    backbone = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="backbone")
    head = segment(tree, ForwardGraph(tree), spans=(16,), name="head", saved_from=1)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 64-call warning would fail the test
        for _ in range(4):
            (f,) = call(backbone, x)
            for _ in range(20):
                y, saved = call(head, f)
                assert y.values() == [10, 20, 30, 40]
                del y, saved
                gc.collect()
    st = tree.stats()
    assert st["steps_forced"] == s0["steps_forced"]
    assert st["steps_held_for_inference_outputs"] - s0["steps_held_for_inference_outputs"] <= 4
    assert st["step"] - s0["step"] >= 4 * 19  # every head call but the first of each feature began a step
    assert st["recordings"] - s0["recordings"] <= 6


def test_a_memory_watched_output_the_program_dropped_holds_no_step(tree):
    """Once the new tensor over a memory-watched output dies, its memory
    with it, the hold ends: a forward used without a backward (an
    evaluation left in grad mode) begins a step at each call."""
    fb = segment(tree, ForwardGraph(tree), spans=(16,), name="fwB", saved_from=1, memory_watched_outputs=(0,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for _ in range(6):
        out, sb = call(fb, x)
        h = out.view()
        del out, sb
        gc.collect()
        assert h.values() == [2, 4, 6, 8]
        del h
        gc.collect()
    st = tree.stats()
    assert st["step"] - s0["step"] == 6 and st["steps_deferred"] == s0["steps_deferred"]
    assert st["forward_outputs_watched"] == 0


class ViewOfInput:
    """A training forward whose first result is a view of its input (the
    caller's memory), then a saved activation, 3x."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        saved = affine(self.tree.stream, x, 3.0, 0.0)
        return (x.view(), saved)


class ViewOfInputTwice:
    """A training forward returning a view of its input for the program and
    the same object as its saved result."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        v = x.view()
        return (v, v)


@pytest.mark.parametrize("hold", ["memory_watched", "tied_saved"])
def test_a_memory_watched_output_that_is_a_view_of_the_callers_tensor_holds_nothing(tree, hold):
    """A position named memory-watched whose output comes back as a view
    of the caller's tensor has no record of the tree's. Looked up by its
    address, it found the record of another output whose tensor object had
    died at that address while a view kept its memory (CPython reuses the
    address at once), and that unrelated output held the step (a helper's
    review). The record make_output made is watched, never one found by
    address. So for a saved result tied to such an output (the same
    object), whose hold looked its record up by address too (a second
    review)."""
    graph = ViewOfInput(tree) if hold == "memory_watched" else ViewOfInputTwice(tree)
    fa = segment(tree, graph, spans=(16,), name="fa", saved_from=1,
                 memory_watched_outputs=(0,) if hold == "memory_watched" else ())
    fp = segment(tree, ForwardGraph(tree), spans=(16,), name="fp", saved_from=1)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(4):
        for seg in (fa, fp):
            out, saved = call(seg, x)
            del out, saved
            gc.collect()
    for _ in range(6):
        o, so = call(fp, x)
        kept = o.view()  # o's object dies, its memory lives on: its record stays, keyed at o's address
        del o
        a, sa = fa(x)  # a view of x, at o's old address as CPython reuses it
        assert a.ptr == x.ptr
        del a, sa, so
        gc.collect()
        step = tree.stats()["step"]
        b, sb = call(fp, x)  # no output that requires grad lives: a step begins
        assert tree.stats()["step"] == step + 1
        del b, sb, kept
        gc.collect()


class TiedForward:
    """A training forward that hands the program a result it also saves for
    the backward, as Inductor does a sigmoid's output: out = 2x, returned
    twice (the same object), or with view=True saved as a view of out's
    second half (another tensor over its storage, as reinterpret_tensor)."""

    def __init__(self, tree, view=False):
        self.tree, self.view = tree, view

    def __call__(self, x):
        out = affine(self.tree.stream, x, 2.0, 0.0)
        return (out, out.narrow(x.n // 2, x.n - x.n // 2) if self.view else out)


@pytest.mark.parametrize("tie", ["the_same_object", "a_view_of_it"])
def test_an_output_the_plain_graph_also_saves_is_handed_out_tied_to_it_as_inductor_hands_it(tree, tie):
    """Inductor returns one buffer at two positions where a training forward
    hands the program a tensor it also saves (a sigmoid's output), and views
    of one buffer where it returns several; they share one version counter,
    so a write in place to the output raises autograd's error at the
    backward. Made from DLPack tensors of their own, they had a counter
    each, and the backward read the written values silently (a helper's
    audit, on an H100: a Linear's weight gradient off by up to 5.6). The
    tied result is handed out as the plain graph hands it, recorded or
    replayed: the output itself, or a view of its storage (as_strided;
    sharing the storage stands in for sharing the counter here)."""
    view = tie == "a_view_of_it"
    f = segment(tree, TiedForward(tree, view), spans=(16,), name="tied", saved_from=1)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for _ in range(5):
        out, saved = call(f, x)
        if view:
            assert saved is not out and saved.storage is out.storage and saved.ptr == out.ptr + 8
            assert saved.values() == [6, 8]
        else:
            assert saved is out
        assert out.values() == [2, 4, 6, 8]
        del out, saved
        gc.collect()
    st = tree.stats()
    assert st["replays"] - s0["replays"] >= 2
    assert st["outputs_tied"] - s0["outputs_tied"] >= 3 and st["outputs_tied_apart"] == s0["outputs_tied_apart"]


def test_a_saved_result_tied_to_the_programs_output_holds_the_step_through_its_memory_until_a_backward(tree):
    """What autograd keeps of a saved result that is also the program's
    output is another tensor over its storage (tensor_data), which the
    program's own output may outlive or not. The step is held while that
    memory lives and the backward that reads it has not run: a compiled
    call between the forward and its backward begins no step, where it
    would have marked the saved tensor stale (it holds nothing else: no
    saved activation of its own). The backward ends the hold, so a loop
    that keeps its output bound past the backward still begins a step at
    each call."""
    f = segment(tree, TiedForward(tree), spans=(16,), name="tied", saved_from=1)
    g = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="other")
    b = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(6):
        out, saved = call(f, x)
        kept = saved.view()  # autograd's tensor_data of the saved output
        del out, saved
        gc.collect()
        step = tree.stats()["step"]
        (y,) = call(g, x)  # another compiled call before the backward
        if i:
            assert tree.stats()["step"] == step, "a call began a step while the saved output's backward is to come"
        (gx,) = b(kept, t)  # reads the saved output: 2x + 1
        assert gx.values() == [2 * a + 1 for a in (1, 2, 3, 4)]
        del y, kept, gx
        gc.collect()
    s0 = tree.stats()
    for _ in range(6):
        out, saved = call(f, x)  # the last iteration's out is still bound here
        (gx,) = b(saved, t)
        del saved, gx
        gc.collect()
    st = tree.stats()
    assert st["step"] - s0["step"] == 6 and st["steps_forced"] == s0["steps_forced"]
    assert st["steps_deferred"] == s0["steps_deferred"]


def trunk_and_log(tree):
    """A trunk that saves its output (TiedForward, id 10) and its backward,
    a compiled call to put between backwards (a log), an input x and a
    tangent t."""
    f, b = paired(tree, TiedForward(tree), "trunk", 10)
    g = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="log")
    return f, b, g, FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])


def test_another_graphs_backward_reading_the_memory_leaves_the_forwards_tied_hold(tree):
    """Only the forward's own backward (the same pair: AOTAutograd compiles
    both under one graph id) ends its tied saved result's hold. A head that
    saved the output as its input reads that memory in its own backward;
    ended there, the hold let a compiled call before the forward's backward
    begin a step, and that backward raised StaleTensorError where Inductor
    computes (a helper's review)."""
    f, b, g, x, t = trunk_and_log(tree)
    head_bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="head_bw",
                      backward=True, pair=20)
    for i in range(5):
        o1, s1 = call(f, x)
        k1 = s1.view()  # autograd's saved tensor of f
        h = s1.view()  # the head's saved input
        del o1, s1
        gc.collect()
        (gh,) = head_bw(h, t)  # the head's backward, not f's
        del h, gh
        gc.collect()
        compiled_call_then_backward(tree, g, x, b, k1, t, i)  # a compiled call before f's backward
        del k1
        gc.collect()
    assert tree.stats()["saved_tied_to_outputs_alive"] == 0


def test_the_trunks_backward_reading_the_memory_leaves_a_heads_hold_of_its_saved_input(tree):
    """The converse of the test above: a head (another AOTAutograd id) saved
    the trunk's output as its input, a view of that memory; the trunk's own
    backward reads the memory too (its tied saved result) and ran first
    (a loss of the trunk's alone, its graph retained). Ended by any backward
    that read the memory, the head's hold let a compiled call before the
    head's backward begin a step over memory the head's saved input lies
    in (a helper's review): only the head's own backward ends it."""
    f, b, g, x, t = trunk_and_log(tree)
    head, head_bw = paired(tree, HeadSavingItsInput(tree), "head", 20)
    for i in range(5):
        o, s1 = call(f, x)  # o = 2x, saved by the trunk
        k = s1.view()  # autograd's saved tensor of the trunk
        z, hs = call(head, o)
        hv = hs.view()  # autograd's saved tensor of the head: o's memory
        del o, s1, z, hs
        gc.collect()
        (gt,) = b(k, t)  # the trunk's backward first
        del k, gt
        gc.collect()
        step = tree.stats()["step"]
        (y,) = call(g, x)
        if i >= 2:
            assert tree.stats()["step"] == step, "a compiled call began a step while the head's saved input lives"
        (gh,) = head_bw(hv, t)
        assert gh.values() == [2 * a + 1 for a in (1, 2, 3, 4)]  # o + t
        del hv, y, gh
        gc.collect()
    assert tree.stats()["saved_tied_to_outputs_alive"] == 0


@pytest.mark.parametrize("order", ["head_a_then_trunk", "trunk_then_head_a", "no_trunk_backward"])
def test_with_two_heads_of_different_ids_the_trunks_backward_leaves_the_other_heads_hold(tree, order):
    """Two heads of different AOTAutograd ids saved the trunk's output as
    their input: each head's hold is counted under its own id. Counted under
    one id for all (unknown once two differed), the trunk's backward, or
    head A's, ended head B's hold as well, and a compiled call (a log)
    before B's backward began a step over B's saved input (a helper's
    review: `(loss_main + loss_a).backward()`, a log, `loss_b.backward()`)."""
    f, b, g, x, t = trunk_and_log(tree)
    ha, ha_bw = paired(tree, HeadSavingItsInput(tree), "head_a", 20)
    hb, hb_bw = paired(tree, HeadSavingItsInput(tree), "head_b", 30)
    for i in range(5):
        o, s1 = call(f, x)
        k = s1.view()  # autograd's saved tensor of the trunk
        za, sa = call(ha, o)
        va = sa.view()
        zb, sb = call(hb, o)
        vb = sb.view()
        del o, s1, za, sa, zb, sb
        gc.collect()
        if order == "head_a_then_trunk":
            (ga,) = ha_bw(va, t)
            (gt,) = b(k, t)
        elif order == "trunk_then_head_a":
            (gt,) = b(k, t)
            (ga,) = ha_bw(va, t)
        else:
            (ga,) = ha_bw(va, t)
            gt = None
        del k, gt, va, ga
        gc.collect()
        step = tree.stats()["step"]
        (y,) = call(g, x)
        if i >= 1:  # the first calls run as the plain graph
            assert tree.stats()["step"] == step, "a compiled call began a step while head B's saved input lives"
        (gb,) = hb_bw(vb, t)
        assert gb.values() == [2 * a + 1 for a in (1, 2, 3, 4)]  # o + t
        del vb, y, gb
        gc.collect()
    assert tree.stats()["saved_tied_to_outputs_alive"] == 0


def test_per_head_backwards_each_through_the_trunk_keep_the_other_heads_holds(tree):
    """Six heads of different ids save the trunk's output, and each loss is
    backwarded on its own (`loss_j.backward(retain_graph=True)`, as
    per-task gradient methods do): head j's backward, then the trunk's,
    which reads the output through its tied saved result, then a compiled
    call (a log). No step may begin while a later head's saved input lives.
    With four ids told apart and the rest merged into anyone's, the trunk's
    backward ended a fifth head's hold (a helper's review): every id has
    an entry of its own now."""
    f, b, g, x, t = trunk_and_log(tree)
    heads = [paired(tree, HeadSavingItsInput(tree), "head%d" % j, 20 + j) for j in range(6)]
    for i in range(4):
        o, s1 = call(f, x)
        k = s1.view()  # autograd's saved tensor of the trunk
        views = []
        for fw, _ in heads:
            z, sv = call(fw, o)
            views.append(sv.view())  # autograd's saved tensor of the head
            del z, sv
        del o, s1
        gc.collect()
        tree.check()
        for j, (_, bw) in enumerate(heads):
            step = tree.stats()["step"]
            (gh,) = bw(views[j], t)
            assert gh.values() == [2 * a + 1 for a in (1, 2, 3, 4)], (i, j)  # o + t
            (gt,) = b(k, t)
            views[j] = None
            del gh, gt
            gc.collect()
            (y,) = call(g, x)
            del y
            if i >= 1 and j < len(heads) - 1:
                assert tree.stats()["step"] == step, "head %d's and the trunk's backward let a step begin" % j
        del k, views
        gc.collect()
        tree.check()


def test_a_backward_of_unknown_id_ends_a_hold_of_unknown_id_before_another_heads(tree):
    """A forward whose AOTAutograd id is unknown (0) saves the trunk's
    output after a head of a known id did. Its backward, of unknown id too,
    ends its own kind of hold first: taking the known head's, it left the
    unknown one, which the trunk's backward then ended (any backward may),
    and a compiled call began a step before the known head's backward (a
    helper's review)."""
    f, b, g, x, t = trunk_and_log(tree)
    known, known_bw = paired(tree, HeadSavingItsInput(tree), "known", 20)
    unknown, unknown_bw = paired(tree, HeadSavingItsInput(tree), "unknown", 0)
    for i in range(4):
        o, s1 = call(f, x)
        k = s1.view()
        z1, s_known = call(known, o)
        z2, s_unknown = call(unknown, o)
        v_known, v_unknown = s_known.view(), s_unknown.view()
        del o, s1, z1, z2, s_known, s_unknown
        gc.collect()
        (gu,) = unknown_bw(v_unknown, t)
        (gt,) = b(k, t)
        del gu, gt, v_unknown, k
        gc.collect()
        step = tree.stats()["step"]
        (y,) = call(g, x)
        if i >= 1:
            assert tree.stats()["step"] == step, "a compiled call began a step while the known head's input lives"
        (gk,) = known_bw(v_known, t)
        assert gk.values() == [2 * a + 1 for a in (1, 2, 3, 4)]
        del y, gk, v_known
        gc.collect()
        tree.check()


def test_a_backward_of_unknown_id_ends_a_known_heads_hold_where_no_hold_of_unknown_id_is_left(tree):
    """A backward of unknown id (compiled autograd's) that reads a head's
    saved input ends that head's hold, though the head's id is known: a
    backward of unknown id ends any hold it reads, never too late."""
    backbone = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone")
    head, _ = paired(tree, HeadSavingItsInput(tree), "head", 20)
    _, unknown_bw = paired(tree, HeadSavingItsInput(tree), "unknown", 0)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(4):
        (h,) = call(backbone, x)  # [2, 4, 6, 8]
        z, s = call(head, h)
        v = s.view()
        del h, z, s
        gc.collect()
        held = tree.stats()["saved_tied_to_outputs_alive"]
        assert held == 1 or i < 2, "iteration %d" % i  # the head records at its second call
        (g,) = unknown_bw(v, t)
        assert g.values() == [3, 5, 7, 9]
        assert tree.stats()["saved_tied_to_outputs_alive"] == 0, "iteration %d" % i
        tree.check()
        del g, v
        gc.collect()


class CellSavingInputAndOutput:
    """A recurrent cell's training forward: out = 2h, handed out and saved
    (tied to the output, as a tanh saves its result), and h saved too (as
    a Linear saves its input)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, h):
        out = affine(self.tree.stream, h, 2.0, 0.0)
        return (out, h, out)


class AddThree:
    """The cell's backward: saved input + saved output + tangent."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, a, b, t):
        ab = FakeTensor(a.n)
        X.sim_launch(self.tree.stream, k_add, ab.ptr, a.ptr, b.ptr, a.n)
        out = FakeTensor(a.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, ab.ptr, t.ptr, a.n)
        return (out,)


def cell_and_backward(tree, pair, name="cell"):
    fw = segment(tree, CellSavingInputAndOutput(tree), spans=(16,), name=name, saved_from=1, pair=pair)
    bw = segment(tree, AddThree(tree), kinds=(ARG_TENSOR,) * 3, spans=(16, 16, 16), name=name + "_bw",
                 backward=True, pair=pair)
    return fw, bw


@pytest.mark.parametrize("ids", ["one_id", "three_ids"])
def test_the_middle_call_of_a_chain_of_one_cell_keeps_its_holds_through_its_neighbours_backwards(tree, ids):
    """h0 = cell(x); h1 = cell(h0); h2 = cell(h1), the cell compiled once
    (one AOTAutograd id), or three cells. The first call's backward (a loss
    on h0, its graph retained) reads h0, where the middle call's saved input
    lies; the last call's backward (torch.autograd.grad(loss, h1)) reads h1,
    where the middle call's saved output lies. Each read ended every hold of
    that id on the memory, the middle call's too, so a compiled call then
    began a step and the middle call's backward raised StaleTensorError
    where Inductor computes (a review). One read now ends one hold."""
    if ids == "one_id":
        (zf, zb) = (af, ab) = (bf, bb) = cell_and_backward(tree, 7)
    else:
        (zf, zb), (af, ab), (bf, bb) = (cell_and_backward(tree, p, n) for p, n in ((7, "z"), (8, "a"), (9, "b")))
    log = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="log")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(4):
        h0, z_in, z_out = call(zf, x)
        h1, a_in, a_out = call(af, h0)
        h2, b_in, b_out = call(bf, h1)
        z_in, z_out, a_in, a_out, b_in, b_out = (v.view() for v in (z_in, z_out, a_in, a_out, b_in, b_out))
        del h2
        gc.collect()
        tree.check()
        (gz,) = zb(z_in, z_out, t)  # the first call's backward
        (gb,) = bb(b_in, b_out, t)  # the last call's: 4x + 8x + 1, the gradient at h1
        del b_in, b_out, gz
        gc.collect()
        tree.check()
        step = tree.stats()["step"]
        (y,) = call(log, x)  # a compiled call: a metric, a log
        if i >= 2:
            assert tree.stats()["step"] == step, "a step began while the middle call's backward is to come"
        (ga,) = ab(a_in, a_out, gb)
        assert ga.values() == [2 * a + 4 * a + (4 * a + 8 * a + 1) for a in (1, 2, 3, 4)], "iteration %d" % i
        del a_in, a_out, ga, gb, y, h0, h1, z_in, z_out
        gc.collect()
        tree.check()


def test_a_loop_over_a_chain_of_one_cell_begins_a_step_at_every_iteration(tree):
    """One read ends one hold: the chain's two backwards end its four holds,
    so a loop that keeps its last h1 bound into the next iteration still
    begins a step at every call of the cell, none forced."""
    cell, cell_bw = cell_and_backward(tree, 7)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    s0 = tree.stats()
    for i in range(20):
        h1, a_in, a_out = call(cell, x)  # the last iteration's h1 stays bound until here
        h2, b_in, b_out = call(cell, h1)
        (gb,) = cell_bw(b_in, b_out, t)
        (ga,) = cell_bw(a_in, a_out, gb)
        assert ga.values() == [a + 2 * a + (2 * a + 4 * a + 1) for a in (1, 2, 3, 4)]
        del a_in, a_out, b_in, b_out, ga, gb, h2
        gc.collect()
        tree.check()
        assert tree.stats()["saved_tied_to_outputs_alive"] == 0, "iteration %d" % i
    st = tree.stats()
    assert st["step"] - s0["step"] >= 19 and st["steps_forced"] == s0["steps_forced"]


@pytest.mark.parametrize("plain_heads_backward", ["first", "second"])
def test_a_plain_heads_hold_of_the_backbones_output_ends_only_at_its_own_backward(tree, plain_heads_backward):
    """A head that runs as the plain graph (an op cgtree cannot record) and a
    recorded head both save the backbone's output; each loss is backwarded
    on its own, a compiled call between. The plain head's hold was one
    count of the tree's that any backward call ended, so the recorded
    head's backward, run first, ended it, and the plain head's backward
    raised StaleTensorError where Inductor computes (a review). It is held
    on the output's memory for its own id now, as a recorded head's saved
    input is."""
    backbone = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone")
    plain_head = segment(tree, HeadSavingItsInput(tree), spans=(16,), name="plain_head", saved_from=1, pair=20,
                         plain_reason="an op cgtree cannot record")
    plain_bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                       name="plain_head_bw", backward=True, pair=20)
    head, head_bw = paired(tree, HeadSavingItsInput(tree), "head", 30)
    log = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="log")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(5):
        (h,) = call(backbone, x)  # [2, 4, 6, 8]
        z1, s1 = plain_head(h)
        z2, s2 = call(head, h)
        s1, s2 = s1.view(), s2.view()
        del h, z1, z2
        gc.collect()
        tree.check()
        runs = [(plain_bw, s1), (head_bw, s2)]
        if plain_heads_backward == "second":
            runs.reverse()
        (g,) = runs[0][0](runs[0][1], t)
        assert g.values() == [3, 5, 7, 9]
        del g
        step = tree.stats()["step"]
        (y,) = call(log, x)
        if i >= 2:
            assert tree.stats()["step"] == step, "a step began while a head's backward is to come"
        (g,) = runs[1][0](runs[1][1], t)
        assert g.values() == [3, 5, 7, 9], "iteration %d" % i
        del g, y, s1, s2, runs
        gc.collect()
        tree.check()
        assert tree.stats()["saved_tied_to_outputs_alive"] == 0


def test_a_backward_that_turns_plain_at_an_input_off_the_device_ends_each_hold_it_reads_once(tree):
    """One head called twice on the backbone's output h (a contrastive
    pair): two holds of h's memory for its id. The first call's backward
    read h at its first input and ended one hold, then found its second
    input off the device (memory-efficient attention's CPU seed) and ran
    plainly, ending the holds of every input again: the second call's hold
    went too, a compiled call began a step, and the second backward read
    overwritten memory (a review). Holds now end once every input was
    read."""
    backbone = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone")
    head, head_bw = paired(tree, HeadSavingItsInput(tree), "head", 20)
    log = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="log")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(4):
        t = FakeTensor(4).fill([1, 1, 1, 1])
        (h,) = call(backbone, x)  # [2, 4, 6, 8]
        z1, s1 = call(head, h)
        z2, s2 = call(head, h)
        v1, v2 = s1.view(), s2.view()  # autograd's saved tensors over h's memory
        del h, z1, z2, s1, s2
        gc.collect()
        held = tree.stats()["saved_tied_to_outputs_alive"]
        assert held == 2 or i < 2, "iteration %d" % i  # the head records at its second call
        if i == 3:
            t.is_cuda = False
            with pytest.warns(RuntimeWarning, match="not a CUDA tensor"):
                (g1,) = head_bw(v1, t)
        else:
            (g1,) = head_bw(v1, t)
        assert g1.values() == [3, 5, 7, 9]
        del g1, v1
        gc.collect()
        assert tree.stats()["saved_tied_to_outputs_alive"] == held // 2, "iteration %d" % i
        step = tree.stats()["step"]
        (y,) = call(log, x)  # a log before the second backward
        if i >= 2:
            assert tree.stats()["step"] == step, "a step began while the second call's saved input lives"
        (g2,) = head_bw(v2, FakeTensor(4).fill([1, 1, 1, 1]))
        assert g2.values() == [3, 5, 7, 9], "iteration %d" % i
        del y, g2, v2
        gc.collect()
        tree.check()


def test_a_backward_refused_at_a_stale_input_ends_no_hold_of_the_inputs_before_it(tree):
    """A backward whose second input is an output of an earlier step raises
    StaleTensorError and changes nothing: the hold of its first input, a
    saved view of this step's output, stays until the backward runs."""
    backbone = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone")
    head, head_bw = paired(tree, HeadSavingItsInput(tree), "head", 20)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    old = None
    for i in range(5):
        (h,) = call(backbone, x)
        z, s = call(head, h)
        v = s.view()
        del h, z, s
        gc.collect()
        if i >= 3:  # the head records at its second call; old is of an earlier step
            assert tree.stats()["saved_tied_to_outputs_alive"] == 1
            with pytest.raises(X.StaleTensorError):
                head_bw(v, old)
            assert tree.stats()["saved_tied_to_outputs_alive"] == 1, "the refused backward ended its input's hold"
            tree.check()
        (g,) = head_bw(v, t)
        assert g.values() == [3, 5, 7, 9]
        del g, v
        gc.collect()
        assert tree.stats()["saved_tied_to_outputs_alive"] == 0
        if i == 2:
            (old,) = call(backbone, x)  # kept: stale once the next call begins a step


class BackwardTangentFirst(BackwardGraph):
    """BackwardGraph with its arguments the other way round: the tangent, then the saved result."""

    def __call__(self, tangent, saved):
        return super().__call__(saved, tangent)


def test_a_backward_that_turns_plain_at_an_argument_off_the_device_still_ends_the_tied_hold_it_reads(tree):
    """A backward whose argument turns out to lie off the tree's device runs
    as the plain graph from that argument on, before its loop reaches the
    tied saved result after it: that hold ended only when the memory died,
    so a loop that keeps its output bound deferred its next step (a
    helper's review)."""
    f = segment(tree, TiedForward(tree), spans=(16,), name="sig", saved_from=1)
    b = segment(tree, BackwardTangentFirst(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                backward=True)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(3):
        out, saved = call(f, x)
        (gx,) = b(t, saved)
        del saved, gx
        gc.collect()
    out, saved = call(f, x)
    assert tree.stats()["saved_tied_to_outputs_alive"] == 1
    t.is_cuda = False  # read at the call: the graph goes plain there
    with pytest.warns(RuntimeWarning, match="argument 0 is not a CUDA tensor"):
        (gx,) = b(t, saved)
    assert gx.values() == [2 * a + 1 for a in (1, 2, 3, 4)]
    assert tree.stats()["saved_tied_to_outputs_alive"] == 0, "out is still bound: only the backward ends its hold"


class TiedAfterAnother(ForwardGraph):
    """A training forward returning (a, b, a): ForwardGraph's a = 2x and b =
    3x, the third result tied to the first, with nothing saved."""

    def __call__(self, x):
        a, b = super().__call__(x)
        return (a, b, a)


def test_a_memory_watched_output_tied_to_an_earlier_one_is_watched_through_that_ones_memory(tree):
    """A tied output has no record of its own: its memory watch follows the
    earlier output's record, whose storage it shares, never the record the
    last tensor made before it happened to be (here b's: dropped, it ended
    the hold while a new tensor over a still lived, and the next call's
    step marked it)."""
    f = segment(tree, TiedAfterAnother(tree), spans=(16,), name="tied3", saved_from=3, memory_watched_outputs=(2,))
    g = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="other")
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(5):
        a, b, a2 = call(f, x)
        assert a2 is a
        h = a2.view()  # AOTAutograd's new tensor over the watched output
        del a, b, a2
        gc.collect()
        step = tree.stats()["step"]
        (y,) = call(g, h)
        if i:
            assert tree.stats()["step"] == step, "the call began a step while the watched output's memory lives"
        assert h.values() == [2, 4, 6, 8]
        (gx,) = bw(h, t)  # its backward (2x + 1): the hold ends
        assert gx.values() == [3, 5, 7, 9]
        del h, y, gx
        gc.collect()


class TwoHalvesSwapped:
    """An inference graph returning (buf[2:4], buf[0:2]) of one buffer buf =
    2x, as Inductor returns views of one buffer (`a, b = (2 * x).chunk(2);
    return b, a`)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        buf = affine(self.tree.stream, x, 2.0, 0.0)
        return (buf.narrow(2, 2), buf.narrow(0, 2))


def test_an_output_tied_below_the_earlier_one_is_a_tensor_of_its_own_that_later_graphs_take(tree):
    """A view of the earlier output's storage lying below that output's
    data is outside the range its record covers, so no lookup by address
    finds it: passed to the next graph it was taken for caller memory inside
    the pool and refused (a helper's review). It is made a tensor of its
    own, as before ties, and counted."""
    f = segment(tree, TwoHalvesSwapped(tree), spans=(16,), name="split")
    g = segment(tree, Graph(tree, 1.0, 1.0), spans=(8,), name="add1")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for _ in range(5):
        b, a = call(f, x)
        (y,) = g(a)  # the same step: a is this step's output
        assert y.values() == [3, 5] and b.values() == [6, 8]
        del a, b, y
        gc.collect()
    assert tree.stats()["outputs_tied_apart"] - s0["outputs_tied_apart"] >= 3


def compiled_call_then_backward(tree, g, x, b, saved, t, check):
    """A compiled call of g, which must begin no step where check says so
    (a backward is to come), then the backward b of TiedForward's saved
    result: 2x + 1."""
    step = tree.stats()["step"]
    (z,) = call(g, x)
    if check:
        assert tree.stats()["step"] == step, "a compiled call began a step while a backward is to come"
    (gx,) = b(saved, t)
    assert gx.values() == [2 * a + 1 for a in (1, 2, 3, 4)]


@pytest.mark.parametrize("backward", ["recorded", "plain"])
def test_two_forwards_with_tied_saved_results_then_a_compiled_call_between_their_backwards(tree, backward):
    """Each forward's tied saved result holds the step until the backward
    that reads it, not until just any backward: y1 = f(x1); y2 = f(x2);
    the first backward; another compiled call; the second backward. Ended
    by the first backward call, the hold let the call begin a step, and the
    second backward raised StaleTensorError where Inductor computes (a
    helper's review). A backward that runs as the plain graph ends the hold
    of what it reads too."""
    f = segment(tree, TiedForward(tree), spans=(16,), name="sig", saved_from=1)  # its one saved result: its output
    g = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="loss")
    plain = {"plain_reason": "inputs on several devices"} if backward == "plain" else {}
    b = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True,
                **plain)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain reason's warning
        for i in range(5):
            o1, s1 = call(f, x)
            k1 = s1.view()  # autograd's tensor_data of the saved output; the program drops the output
            del o1, s1
            o2, s2 = call(f, x)
            k2 = s2.view()
            del o2, s2
            gc.collect()
            (g1,) = b(k1, t)
            del k1, g1
            gc.collect()
            compiled_call_then_backward(tree, g, x, b, k2, t, i)  # a logging model, then the second backward
            del k2
            gc.collect()
        s0 = tree.stats()
        for _ in range(6):  # the loop that keeps its output bound past the backward: a step at each call
            out, saved = call(f, x)
            (gx,) = b(saved, t)
            del saved, gx
            gc.collect()
    st = tree.stats()
    assert st["step"] - s0["step"] == 6 and st["steps_deferred"] == s0["steps_deferred"]


class SameGradTwice:
    """A backward that returns one gradient at two positions, as Inductor
    does where two parameters get the same one (x @ (w + delta)): saved +
    tangent."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, saved, tangent):
        grad = FakeTensor(saved.n)
        X.sim_launch(self.tree.stream, k_add, grad.ptr, saved.ptr, tangent.ptr, saved.n)
        return (grad, grad)


def test_a_backward_that_returns_one_gradient_twice_hands_out_one_tensor_twice_as_inductor(tree):
    """AccumulateGrad takes a gradient over as .grad only where it holds the
    last reference: Inductor's one object at two positions is cloned for one
    of the two parameters. Two tensors over one memory were both taken over,
    so every in-place change of one .grad (clip_grad_norm_,
    GradScaler.unscale_, a second micro-batch's accumulation) changed the
    other too (a helper's audit, torch on the CPU: gradients 1000x too small
    after clipping, 1.5x too large after two micro-batches). The backward's
    tied result is handed out as Inductor hands it, one object."""
    fw = segment(tree, ForwardGraph(tree), spans=(16,), name="fw", saved_from=1)
    bw = segment(tree, SameGradTwice(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    s0 = tree.stats()
    for _ in range(5):
        out, saved = call(fw, x)
        g1, g2 = bw(saved, t)
        assert g1 is g2 and g1.values() == [3 * a + 1 for a in (1, 2, 3, 4)]
        del out, saved, g1, g2
        gc.collect()
    st = tree.stats()
    assert st["replays"] - s0["replays"] >= 4 and st["outputs_tied"] - s0["outputs_tied"] >= 3


def test_memory_watched_outputs_must_be_forward_results_before_the_saved_ones(tree):
    """Positions at or past saved_from, or past 63, or not a tuple of ints,
    are refused with a clear error."""
    for bad, err in (((1,), ValueError), ((64,), ValueError), ((-1,), ValueError), ([0], TypeError),
                     (("0",), TypeError)):
        with pytest.raises(err, match="memory_watched_outputs|integer"):
            segment(tree, ForwardGraph(tree), spans=(16,), name="fwB", saved_from=1, memory_watched_outputs=bad)
    with pytest.raises(ValueError, match="memory_watched_outputs"):  # no saved_from: no forward results to name
        segment(tree, ForwardGraph(tree), spans=(16,), name="f", saved_from=0, memory_watched_outputs=(0,))


def test_a_training_forwards_output_kept_only_detached_holds_no_step(tree):
    """A training forward run without a backward whose output the program
    keeps only detached (y = f(x).detach()) leaves no backward to come:
    the storage lives, the output and its graph do not, and the next call
    begins a step as in eager evaluation (the detached tensor goes stale
    with it)."""
    fw, _ = training_pair(tree)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    s0 = tree.stats()
    for _ in range(5):
        out, saved = call(fw, x)
        out.requires_grad = True
        kept = out.view()  # .detach(): a new tensor over the same storage
        del out, saved
        gc.collect()
        assert kept.values() == [2, 4, 6, 8]
    st = tree.stats()
    assert st["step"] - s0["step"] == 5 and st["steps_deferred"] == s0["steps_deferred"]


class GradProbe(FakeTensor):
    """An output whose requires_grad runs code of the test's (PyTorch runs
    a TorchFunctionMode's Python there): `on_read`, where set, is called at
    each read and gives the answer.
    A test makes an output one (out.__class__ = GradProbe), as autograd
    marks a training forward's output."""
    on_read = None

    @property
    def requires_grad(self):
        return GradProbe.on_read() if GradProbe.on_read else True


def test_an_error_while_asking_whether_a_forward_output_holds_the_step_leaves_the_step_to_the_retried_call(tree):
    """Reading an output's requires_grad may raise (Python runs there): the
    call fails, and the retried call, in the same generation, decides
    again whether a step begins, rather than going on in the old step."""
    fw, bw = training_pair(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(3):  # recorded, then replayed
        out, saved = call(fw, x)
        bw(saved, t)
        del out, saved
        gc.collect()
    kept, saved = call(fw, x)  # a forward output alive, no backward since
    kept.__class__ = GradProbe
    del saved
    gc.collect()

    def fail():
        raise RuntimeError("a mode's error")
    GradProbe.on_read = fail
    try:
        step = tree.stats()["step"]
        with pytest.raises(RuntimeError, match="a mode's error"):
            call(fw, x)
    finally:
        GradProbe.on_read = None
    del kept
    gc.collect()
    fw(x)  # the retried call: the generation has not moved again
    assert tree.stats()["step"] == step + 1


def test_a_forward_output_list_emptied_while_it_is_read_is_read_no_further(tree):
    """The read of requires_grad may run Python that calls a backward,
    which empties the list being read: the reading stops at its new end
    (it read past it before)."""
    fw, bw = training_pair(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(3):
        out, saved = call(fw, x)
        bw(saved, t)
        del out, saved
        gc.collect()
    held = []
    for _ in range(3):  # three outputs alive, each saved activation dropped: only the list holds the step
        out, saved = fw(x)
        out.__class__ = GradProbe
        held.append(out)
        del saved
        gc.collect()
    assert tree.stats()["forward_outputs_watched"] == 3
    reads = []

    def backward_inside():
        reads.append(1)
        bw(FakeTensor(4).fill([0, 0, 0, 0]), t)  # a backward call: the list is emptied
        return False  # so the reading would go on to the next entry
    GradProbe.on_read = backward_inside
    try:
        out, saved = call(fw, x)
    finally:
        GradProbe.on_read = None
    assert reads == [1] and tree.stats()["forward_outputs_watched"] == 1  # the new call's own output
    del out, saved, held
    gc.collect()


def test_explicit_steps_watch_no_forward_output(tree):
    """With explicit steps only marks begin steps, so a training forward's
    outputs are not watched: without a backward or a mark the list grew
    with every call."""
    tree.explicit_steps = True
    fw, _ = training_pair(tree)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    keep = []
    for _ in range(6):
        out, saved = call(fw, x)
        out.requires_grad = True
        keep.append(out)
        del saved
        gc.collect()
    assert tree.stats()["forward_outputs_watched"] == 0


def training_pair(tree):
    fg, bg = ForwardGraph(tree), BackwardGraph(tree)
    fw = segment(tree, fg, spans=(16,), name="fw", saved_from=1)
    bw = segment(tree, bg, kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    return fw, bw


def train_step(fw, bw, x, t):
    out, saved = call(fw, x)  # a compiled call: a new generation
    (grad,) = bw(saved, t)  # autograd calls the backward: no new generation
    return out.values(), grad.values()


def replaying_training_pair(tree):
    """training_pair's segments, their input and tangent, after steps enough
    for both to replay."""
    fw, bw = training_pair(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(4):
        train_step(fw, bw, x, t)
    gc.collect()
    return fw, bw, x, t


def test_training_steps_replay_forward_and_backward_with_the_saved_activation_as_a_value(tree):
    fw, bw = training_pair(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(6):
        assert train_step(fw, bw, x, t) == ([2, 4, 6, 8], [4, 7, 10, 13])
        gc.collect()
    s = tree.stats()
    assert s["replays"] >= 4 and s["steps_deferred"] == 0
    assert s["saved_activations_alive"] == 0  # the last step's saved tensor died with its step's locals


def test_a_new_call_begins_no_step_while_a_saved_activation_lives_and_one_once_none_does(tree):
    fw, bw, x, t = replaying_training_pair(tree)
    step0, deferred0 = tree.stats()["step"], tree.stats()["steps_deferred"]
    out1, saved1 = call(fw, x)
    out2, saved2 = call(fw, x)  # saved1's backward is pending: the same step goes on
    s = tree.stats()
    assert s["step"] == step0 + 1 and s["steps_deferred"] == deferred0 + 1
    assert s["saved_activations_alive"] == 2
    assert saved1.values() == [3, 6, 9, 12]  # not marked stale, not overwritten by the second forward
    (g2,) = bw(saved2, t)
    (g1,) = bw(saved1, t)
    assert g1.values() == g2.values() == [4, 7, 10, 13]
    del saved1, saved2, out1, out2, g1, g2
    gc.collect()
    call(fw, x)
    assert tree.stats()["step"] == step0 + 2  # nothing pending: a step began


class Leaf(FakeTensor):
    """A parameter: a leaf that requires grad, whose .grad AccumulateGrad sets."""

    requires_grad = True
    is_leaf = True

    def __init__(self, n):
        super().__init__(n)
        self.grad = None

    def accumulate(self, g):
        """AccumulateGrad: where .grad is None it takes g over (g's alias, the
        same storage); else it adds g into .grad in place."""
        if self.grad is None:
            self.grad = g.view()
        else:
            self.grad.fill([a + b for a, b in zip(self.grad.values(), g.values())])


class ParamForwardGraph:
    """A training forward of x and a parameter w: out = x + w, saving x (times 1)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, w):
        out, saved = FakeTensor(x.n), FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, x.ptr, w.ptr, x.n)
        X.sim_launch(self.tree.stream, k_affine, saved.ptr, x.ptr, x.n, 1.0, 0.0)
        return (out, saved)


def test_a_grad_a_recorded_backward_made_for_a_forward_that_runs_plainly_is_moved_past_its_step(tree):
    """A training forward that runs as the plain graph from its first call
    (a plain_reason) may still have its backward recorded. AccumulateGrad
    takes that backward's output over as .grad; accumulated into the next
    step (zero_grad(set_to_none=False), micro-batches a step each), it must
    move out of the pool when the step ends. Only a recorded forward's call
    noted its leaves, so this .grad was marked stale instead, and the next
    accumulation raised StaleTensorError where Inductor computes (a helper's
    audit)."""
    fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,), plain_reason="inputs on several devices")
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain reason's warning
        for _ in range(4):  # until the backward replays; zero_grad(set_to_none=True) each step
            w.grad = None
            out, saved = call(fw, x, w)
            (g,) = bw(saved, t)
            w.accumulate(g)
            del out, saved, g
            gc.collect()
        for _ in range(3):  # accumulate into the kept .grad over the next steps
            out, saved = call(fw, x, w)
            (g,) = bw(saved, t)
            w.accumulate(g)
            del out, saved, g
            gc.collect()
    assert w.grad.values() == [4 * (a + 1) for a in (1, 2, 3, 4)]  # (saved x + 1), four times
    assert tree.stats()["gradients_moved"] >= 1 and tree.stats()["gradient_leaves"] == 1


def test_a_backward_called_as_a_compiled_call_of_its_own_goes_on_in_its_forwards_step(tree):
    """With compiled autograd, Dynamo enters a frame for the backward (a new
    generation), while its forward's activations are alive. The backward
    still belongs to that step: it begins no step, and does not count
    toward the bound of deferred calls. Once it read them, activations a
    program keeps (or compute-sanitizer keeps) hold nothing: the next
    forward begins a step, and a kept one raises, never read wrong."""
    fw, bw, x, t = replaying_training_pair(tree)
    s0 = tree.stats()
    kept = []
    for i in range(10):
        out, saved = call(fw, x)
        kept.append(saved)  # alive, as a program (or compute-sanitizer) may keep them
        (grad,) = call(bw, saved, t)  # a new generation, as a compiled-autograd backward is
        assert grad.values() == [4, 7, 10, 13], i
    s = tree.stats()
    assert s["steps_deferred"] == s0["steps_deferred"] and s["steps_forced"] == s0["steps_forced"]
    assert s["step"] == s0["step"] + 10  # each forward's; no backward's
    assert s["saved_activations_alive"] == 0
    assert kept[-1].values() == [3, 6, 9, 12]  # the last step's, still alive and right
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        kept[0].values()


@pytest.mark.parametrize("loss", ["compiled", "eager"])
def test_a_loop_that_retains_its_graph_and_keeps_it_bound_begins_a_step_at_each_iteration(tree, loss):
    """loss.backward(retain_graph=True) (or create_graph=True) with `loss`
    bound into the next iteration keeps the last iteration's saved
    activations alive at the next forward. Counted until they died, they
    held one step for good: every call a new node, and after 1024 held
    calls a forced step marked the model's output that the compiled loss
    function was about to read, which raised at iteration 513 (a helper's
    audit). A backward's read ends their hold: each iteration is a step,
    replayed."""
    fw, bw = training_pair(tree)
    loss_fw = segment(tree, HeadSavingItsInput(tree), spans=(16,), name="loss", saved_from=1)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    kept = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no forced step's warning
        for i in range(600):
            out, saved = call(fw, x)  # the model
            out.requires_grad = True
            if loss == "compiled":
                lout, lsaved = call(loss_fw, out)
                (gl,) = bw(lsaved, t)
                assert lout.values() == [4, 8, 12, 16], i
            else:
                gl = t
            (gm,) = bw(saved, gl)
            assert gm.values() == ([6, 11, 16, 21] if loss == "compiled" else [4, 7, 10, 13]), i
            kept = (out, saved) + ((lout, lsaved) if loss == "compiled" else ())  # the retained graph
            del gl, gm
    s = tree.stats()
    assert s["steps_forced"] == 0 and s["replays"] > 1000 and s["nodes"] <= 6, {
        k: s[k] for k in ("step", "steps_forced", "replays", "nodes")}
    del kept


@pytest.mark.parametrize("between", ["a_second_head_on_an_eager_op_of_feat", "a_compiled_metric",
                                     "a_second_head_on_feat_itself"])
def test_a_retained_graphs_second_backward_after_a_compiled_call_raises_or_reads_its_activations(tree, between):
    """feat = backbone(x); head1(feat).backward(retain_graph=True); then a
    compiled call, then the second loss's backward runs the backbone's
    backward again on the same saved activation (real AOTAutograd does).
    The first backward's read ended the activation's hold, as PyTorch's
    trees end a pending backward at the backward: a second head on
    relu(feat) or a compiled metric begins a step, and the second backward
    raises StaleTensorError, never reads wrong (the documented limit); a
    second head on feat itself is held by its argument, and computes."""
    backbone, bwb = paired(tree, ForwardGraph(tree), "backbone", 1)
    head1, bwh = paired(tree, HeadSavingItsInput(tree), "head1", 2)
    head2, bwh2 = paired(tree, HeadSavingItsInput(tree), "head2", 3)
    metric = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="metric")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    raised = 0
    for i in range(6):
        feat, sb = call(backbone, x)  # feat = 2x, sb = 3x
        feat.requires_grad = True
        z1, s1 = call(head1, feat)
        (g1,) = bwh(s1, t)  # loss1.backward(retain_graph=True): head1's backward, then the backbone's
        (gx1,) = bwb(sb, g1)
        assert gx1.values() == [6, 11, 16, 21], i
        del g1, gx1
        if between == "a_second_head_on_an_eager_op_of_feat":
            r = FakeTensor(4).fill([max(v, 0) for v in feat.values()])  # torch.relu(feat), eager
            r.requires_grad = True
            z2, s2 = call(head2, r)
            (g2,) = bwh2(s2, t)
            del z2, s2  # loss2.backward() retains nothing: autograd frees them
        elif between == "a_second_head_on_feat_itself":
            z2, s2 = call(head2, feat)
            (g2,) = bwh2(s2, t)
            del z2, s2
        else:
            call(metric, x)
            g2 = t
        gc.collect()
        try:
            (gx2,) = bwb(sb, g2)  # loss2.backward(): the backbone's backward again, on sb
            assert gx2.values() == [v + w for v, w in zip([3, 6, 9, 12], g2.values())], i
            del gx2
        except X.StaleTensorError:
            raised += 1
        del feat, sb, z1, s1, g2
        gc.collect()
    if between == "a_second_head_on_feat_itself":
        assert raised == 0
    else:  # the iterations after the first two, whose calls run plainly, out of the pool
        assert raised >= 3
    assert tree.stats()["replays"] > 0 and tree.stats()["steps_forced"] == 0


class ForwardOutputAboveSaved:
    """A training forward whose output is y[1:] and which saves y itself
    (Inductor does for `y = x @ W; return y[:, 1:], (y @ W2).sum()`): the
    saved result's data lies below the output's, so it is a record of its
    own over the output's memory."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        y = affine(self.tree.stream, x, 3.0, 0.0)
        return (y.narrow(1, x.n - 1), y)


@pytest.mark.parametrize("reorder", [False, True])
def test_another_forwards_backward_reading_an_overlapping_record_leaves_a_saved_activations_hold(tree, reorder):
    """A probe head trained on out.detach() saves its input, which lies in
    the main forward's saved record (that record covers the output's
    memory). The probe's backward read it, and ended the main forward's
    hold when the page's lookup found that record first (an earlier output
    on the page died): a compiled call before the main backward began a
    step, and the main backward raised (a review). Only a backward of the
    record's own forward (its pair) ends the hold."""
    f1, bw1 = paired(tree, ForwardOutputAboveSaved(tree), "f1", 1)
    head2, bwh2 = paired(tree, HeadSavingItsInput(tree), "head2", 2, span=12)
    pre = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,), name="pre")
    metric = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="metric")
    x, t4, t3 = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(3).fill([1, 1, 1])
    for i in range(6):
        (junk,) = call(pre, x)  # an output of the step made before f1's, on the same page
        out, saved = f1(x)  # the same generation: one compiled model, after a graph break
        out.requires_grad = True
        if reorder:
            del junk  # dies: the page's last record is swapped into its slot
            gc.collect()
        od = out.view()  # out.detach()
        od.requires_grad = True
        z2, s2 = call(head2, od)
        (g2,) = bwh2(s2, t3)  # the probe's loss.backward()
        del z2, s2, g2
        call(metric, x)  # a compiled call before the main backward
        gc.collect()
        (gx,) = bw1(saved, t4)  # the main loss's backward
        assert gx.values() == [4, 7, 10, 13], i
        del out, saved, od, gx
        if not reorder:
            del junk
        gc.collect()


def param_training_pair(tree):
    """Segments of ParamForwardGraph (w, its argument 1, may get a gradient)
    and BackwardGraph (w's gradient: saved + tangent), a parameter w, an
    input x and a tangent t, after steps enough for both to replay."""
    fg, bg = ParamForwardGraph(tree), BackwardGraph(tree)
    fw = segment(tree, fg, kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw", saved_from=1,
                 grad_inputs=(1,))
    bw = segment(tree, bg, kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(4):
        param_step(fw, bw, w, x, t)
        w.grad = None
    gc.collect()
    assert tree.stats()["replays"] >= 2
    return fw, bw, w, x, t


def param_step(fw, bw, w, x, t):
    """A training step: forward, backward, AccumulateGrad; returns the
    backward's output (for its address)."""
    out, saved = call(fw, x, w)
    (g,) = bw(saved, t)
    w.accumulate(g)
    return g.ptr


def test_a_backwards_output_becomes_grad_without_a_copy_and_the_usual_loop_moves_nothing(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    moved0 = tree.stats()["gradients_moved"]
    for _ in range(5):
        w.grad = None  # zero_grad() before the forward
        g_ptr = param_step(fw, bw, w, x, t)
        assert w.grad.ptr == g_ptr  # .grad is the backward's output itself: no copy, no second set
        assert w.grad.values() == [2, 3, 4, 5]
    s = tree.stats()
    assert s["gradients_moved"] == moved0 and s["gradient_leaves"] == 1


@pytest.mark.parametrize("plain", [False, True])
def test_a_reloaded_parameter_that_took_the_accumulated_grad_over_accumulates_into_it_at_the_next_micro_batch(
        tree, plain):
    """Micro-batches a step each, .grad kept between them, and between two
    micro-batches the weights reloaded as new parameters
    (load_state_dict(sd, assign=True)) that take the accumulated gradient
    over (new.grad = old.grad). The next forward's call ends the step, and
    the new parameter's .grad, a backward output of that step, must move,
    not be marked: the call's leaves were noted only after its step began,
    so the new parameter was noted by no call yet and the next
    accumulation raised StaleTensorError where eager computes (helper-88's
    hunt). Also for a forward that runs as the plain graph."""
    if plain:
        fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                     name="fw", saved_from=1, grad_inputs=(1,), plain_reason="inputs on several devices")
        bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                     backward=True)
        w, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 1, 1, 1])
        for _ in range(4):
            param_step(fw, bw, w, FakeTensor(4).fill([1, 2, 3, 4]), t)
            w.grad = None
    else:
        fw, bw, w, _, t = param_training_pair(tree)
    moved0 = tree.stats()["gradients_moved"]
    xs0, xs1 = [1, 2, 3, 4], [0, 1, 0, 1]
    param_step(fw, bw, w, FakeTensor(4).fill(xs0), t)  # micro-batch 0: w.grad = xs0 + 1
    gc.collect()
    new = Leaf(4).fill([5, 5, 5, 5])  # the reloaded weight
    new.grad, w.grad = w.grad, None  # the accumulated gradient carried over
    w = new
    out, saved = call(fw, FakeTensor(4).fill(xs1), w)  # micro-batch 1: its call ends micro-batch 0's step
    assert out.values() == [5, 6, 5, 6]
    (g,) = bw(saved, t)
    w.accumulate(g)
    assert w.grad.values() == [a + b + 2 for a, b in zip(xs0, xs1)]
    assert tree.stats()["gradients_moved"] == moved0 + 1
    del out, saved, g
    tree.check()


def test_a_gradient_kept_outside_grad_is_an_output_like_any_other_and_raises_after_its_step(tree):
    """torch.autograd.grad's list: the backward's output, kept by the
    program, never taken over as a leaf's .grad. It is not moved; the next
    step marks it, and a read raises."""
    fw, bw, w, x, t = param_training_pair(tree)
    s0 = tree.stats()
    out, saved = call(fw, x, w)
    (g,) = bw(saved, t)  # no AccumulateGrad: w.grad stays None
    assert w.grad is None and g.values() == [2, 3, 4, 5]
    del out, saved
    gc.collect()
    call(fw, x, w)  # no saved activation alive: a new step, which may reuse g's memory
    s = tree.stats()
    assert s["step"] == s0["step"] + 2 and s["gradients_moved"] == s0["gradients_moved"]
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        g.values()


def test_a_grad_that_outlives_its_step_moves_to_memory_of_its_own_and_a_kept_view_of_the_old_raises(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    moved0, marked0 = tree.stats()["gradients_moved"], tree.stats()["outputs_marked_stale"]
    g_ptr = param_step(fw, bw, w, x, t)  # no zero_grad from here on: .grad lives across steps
    grad, kept_view = w.grad, w.grad.view()
    assert grad.ptr == g_ptr
    g_ptr2 = param_step(fw, bw, w, x, t)  # its forward begins a step: .grad moves, then accumulates
    s = tree.stats()
    assert s["gradients_moved"] == moved0 + 1 and s["outputs_marked_stale"] == marked0 + 1
    assert w.grad is grad and grad.ptr not in (g_ptr, g_ptr2)  # the same object, on memory of its own
    assert grad.values() == [4, 6, 8, 10]  # both steps' gradients, nothing overwritten
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        kept_view.values()  # still on the old storage, which the new step may reuse
    for _ in range(3):  # ordinary memory now: AccumulateGrad adds into it, nothing moves again
        param_step(fw, bw, w, x, t)
    assert grad.values() == [10, 15, 20, 25]
    assert tree.stats()["gradients_moved"] == moved0 + 1


class AccumulateGradNode:
    """autograd's AccumulateGrad: no next functions; .variable is the leaf."""

    def __init__(self, variable):
        self.variable, self.next_functions = variable, ()


class PassesOnNode:
    """A node whose backward hands its gradient on as it is or as a view
    (ViewBackward0, TBackward0, CatBackward0)."""

    def __init__(self, next_functions):
        self.next_functions = next_functions


class MakesNewMemoryNode:
    """A node whose backward makes new memory (MmBackward0, a slice's):
    the walk stops there and never reads its edges."""
    edges_read = 0

    def __init__(self, next_functions):
        self._next = next_functions

    @property
    def next_functions(self):
        MakesNewMemoryNode.edges_read += 1
        return self._next


class PythonFunctionNode(MakesNewMemoryNode):
    """A Python autograd Function's node, as AOTAutograd's CompiledFunctionBackward."""


GRAD_NODE_KINDS = {AccumulateGradNode: 1, PassesOnNode: 2}  # cgtree.torch._grad_nodes' answers for the fakes


@pytest.fixture
def grad_nodes():
    """The fakes' node kinds, as cgtree.torch sets grad_node_kind; asked once per type."""
    asked = []

    def kind(node_type):
        asked.append(node_type)
        return GRAD_NODE_KINDS.get(node_type, 0)

    X.set_grad_node_kind(kind)
    yield asked
    X.set_grad_node_kind(None)


def eager_op_of(ws, nodes=1, stop_at=None):
    """Parameters ws passed through eager ops before the compiled call
    (`w.view(-1)`, `w.t()`, `torch.cat(ws)`): a new tensor over the first's
    memory that requires grad and is no leaf, whose grad_fn leads through a
    chain of `nodes` nodes to the AccumulateGrad of each w; the node at
    index stop_at (0 is grad_fn) is of that class instead."""
    ws = ws if isinstance(ws, list) else [ws]
    edges = tuple((AccumulateGradNode(w), 0) for w in ws)
    node = None
    for i in reversed(range(nodes)):
        cls = stop_at[1] if stop_at and stop_at[0] == i else PassesOnNode
        node = cls(edges + ((None, 0),))
        edges = ((node, 0),)
    v = ws[0].view()
    v.requires_grad, v.is_leaf, v.grad_fn = True, False, node
    return v


@pytest.mark.parametrize("nodes", [1, 3, 64])
def test_a_grad_kept_past_its_step_moves_where_its_parameter_reaches_the_call_through_an_eager_op(tree, grad_nodes,
                                                                                                  nodes):
    """w.view(-1) taken eagerly and passed to the compiled forward: the
    forward's input is no leaf, and its gradient flows through the eager
    op's backward to w, whose AccumulateGrad takes it over as w.grad (a view
    of the backward's output). Kept past its step (accumulation,
    zero_grad(set_to_none=False)), it moves. Only leaves among the arguments
    were noted, so it was marked instead, and the next accumulation raised
    StaleTensorError where Inductor computes (a documented limit, found
    again by a review). The walk goes through at most 64 nodes that pass a
    gradient on, and asks each node type's kind once."""
    fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])

    def step():
        out, saved = call(fw, x, eager_op_of(w, nodes))  # a new view each step, as eager makes it
        (g,) = bw(saved, t)
        w.accumulate(g)  # the eager op's backward passes g on: AccumulateGrad takes it over

    for _ in range(4):
        step()
        w.grad = None
    gc.collect()
    assert tree.stats()["replays"] >= 2
    moved0 = tree.stats()["gradients_moved"]
    for i in range(3):  # no zero_grad: .grad lives across steps
        step()
    assert w.grad.values() == [6, 9, 12, 15]  # 3 steps of [2, 3, 4, 5]: nothing overwritten, nothing raised
    assert tree.stats()["gradients_moved"] == moved0 + 1
    assert sorted(t.__name__ for t in grad_nodes) == ["AccumulateGradNode", "PassesOnNode"]


def test_every_parameter_of_a_fused_weight_made_eagerly_is_noted_however_many(tree, grad_nodes):
    """torch.cat of 100 parameters: one node that leads to 100
    AccumulateGrad nodes. The walk counts only the nodes it goes through,
    so every parameter is noted (a review: with every node counted, a cat
    of 16 lost the 16th, whose kept .grad then raised)."""
    fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    ws = [Leaf(4) for _ in range(100)]
    call(fw, FakeTensor(4).fill([1, 2, 3, 4]), eager_op_of(ws))
    assert tree.stats()["gradient_leaves"] == 100


@pytest.mark.parametrize("case", ["past_64_nodes", "behind_a_node_that_makes_new_memory", "behind_a_python_function"])
def test_the_walk_behind_an_input_stops_past_64_nodes_and_at_nodes_whose_gradients_are_new_memory(tree, grad_nodes,
                                                                                                   case):
    """Where the walk stops, and w is no leaf the tree knows (its kept
    .grad is marked, loud, as before): past 64 nodes that pass a gradient
    on; at a node whose backward makes new memory (a matmul's: the leaves
    behind it never hold the pool, so an activation of an eager layer costs
    one lookup, and its node's edges are never read); at a Python autograd
    Function's node (AOTAutograd's, which every activation a graph break
    hands on has: its own call noted its leaves)."""
    fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    w, x = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4])
    MakesNewMemoryNode.edges_read = 0
    if case == "past_64_nodes":
        v = eager_op_of(w, 65)
    else:
        python = case == "behind_a_python_function"
        v = eager_op_of(w, 3, stop_at=(0, PythonFunctionNode) if python else (1, MakesNewMemoryNode))
    call(fw, x, v)
    assert tree.stats()["gradient_leaves"] == 0 and MakesNewMemoryNode.edges_read == 0
    call(fw, x, eager_op_of(w, 64 if case == "past_64_nodes" else 1))  # the case's condition
    assert tree.stats()["gradient_leaves"] == 1


def test_out_of_memory_while_walking_behind_an_input_raises_and_the_next_call_notes_the_leaf(tree):
    """The kind function raises MemoryError once (no memory to answer):
    the call raises it, leaves nothing set and notes nothing; the next
    call, with the same input, walks again and notes w."""
    fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    w, x = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4])
    fail = [True]

    def kind(node_type):
        if fail.pop() if fail else False:
            raise MemoryError
        return GRAD_NODE_KINDS.get(node_type, 0)

    X.set_grad_node_kind(kind)
    try:
        v = eager_op_of(w, 2)
        with pytest.raises(MemoryError):
            call(fw, x, v)
        assert tree.stats()["gradient_leaves"] == 0
        call(fw, x, v)
        assert tree.stats()["gradient_leaves"] == 1
    finally:
        X.set_grad_node_kind(None)


def test_gradient_accumulation_over_two_forwards_keeps_the_first_gradient(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    x2 = FakeTensor(4).fill([10, 20, 30, 40])
    for _ in range(3):
        w.grad = None
        param_step(fw, bw, w, x, t)  # micro-batch 1: .grad takes the output over
        param_step(fw, bw, w, x2, t)  # micro-batch 2: a new step; .grad moves first, then adds
        assert w.grad.values() == [2 + 11, 3 + 21, 4 + 31, 5 + 41]


def test_only_leaves_that_require_grad_are_noted_and_dead_ones_are_dropped(tree):
    fg = ParamForwardGraph(tree)
    fw = segment(tree, fg, kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw", saved_from=1,
                 grad_inputs=(0, 1))
    x = FakeTensor(4).fill([1, 2, 3, 4])  # no requires_grad: not a leaf autograd gives a .grad
    for _ in range(300):  # a new parameter object each call, each dead by the next
        out, saved = call(fw, x, Leaf(4).fill([0, 0, 0, 0]))
        del out, saved
    n = tree.stats()["gradient_leaves"]
    assert 1 <= n <= 2 * 64 + 64  # pruned as the dict doubles: bounded, not 300
    w = Leaf(4)
    call(fw, x, w)
    call(fw, x, w)  # the same object again: one comparison, nothing noted
    assert tree.stats()["gradient_leaves"] <= n + 1


@pytest.mark.parametrize("keyword", ["grad_inputs", "written_inputs"])
def test_grad_and_written_inputs_must_name_tensor_positions(tree, keyword):
    g = Graph(tree, 1.0, 0.0)
    for bad in ((2,), (-1,), (1,), (0, 1)):  # past the end, negative, an int argument, one bad of two
        with pytest.raises(ValueError, match=keyword):
            X.Segment(tree, "g", g, g, alias, describe, span, bytes((ARG_TENSOR, ARG_INT)), (16, 0), 0, False,
                      **{keyword: bad})
    with pytest.raises(TypeError, match=keyword):
        X.Segment(tree, "g", g, g, alias, describe, span, bytes((ARG_TENSOR,)), (16,), 0, False, **{keyword: [0]})
    X.Segment(tree, "g", g, g, alias, describe, span, bytes((ARG_TENSOR, ARG_INT)), (16, 0), 0, False,
              **{keyword: (0,)})  # a tensor position is taken


class StepGraph:
    """A compiled optimizer step of a parameter w and its gradient g: out = w + g."""

    def __init__(self, tree):
        self.tree, self.calls = tree, 0

    def __call__(self, w, g):
        self.calls += 1
        out = FakeTensor(w.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, w.ptr, g.ptr, w.n)
        return (out,)


def optimizer_segment(tree):
    return segment(tree, StepGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="opt")


def test_a_compiled_optimizer_step_that_reads_the_gradients_goes_on_in_their_step_and_nothing_moves(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    opt = optimizer_segment(tree)
    s0 = tree.stats()
    for i in range(5):
        w.grad = None  # zero_grad() before the forward: the next forward reads no gradient and begins a step
        g_ptr = param_step(fw, bw, w, x, t)
        step = tree.stats()["step"]
        (out,) = call(opt, w, w.grad)  # a new compiled call with no backward pending, reading .grad
        assert out.values() == [2, 3, 4, 5]
        assert tree.stats()["step"] == step  # the step goes on: the gradients stay where they are
        assert w.grad.ptr == g_ptr
    s = tree.stats()
    assert s["gradients_moved"] == s0["gradients_moved"]
    assert s["steps_kept_after_backward"] == s0["steps_kept_after_backward"] + 5
    assert s["step"] == s0["step"] + 5 and s["steps_forced"] == s0["steps_forced"]
    assert s["replays"] > s0["replays"] + 10  # forward, backward and the optimizer's graph replay


def test_the_optimizer_rule_reads_pointers_through_the_exchange_api_as_the_argument_loop_does(tree, exchange):
    keep, good = probes()
    assert exchange(good)["pointers"]
    fw, bw, w, x, t = param_training_pair(tree)
    opt = optimizer_segment(tree)
    for i in range(5):
        w.grad = None
        param_step(fw, bw, w, x, t)
        step = tree.stats()["step"]
        g = XTensor(4, ptr=w.grad.ptr, storage=w.grad.storage)  # another object over .grad, of a type the table serves
        if i == 1:
            XTensor.reads = 0  # from the optimizer's second call on (its first cross-checks both ways)
        (out,) = call(opt, w, g)
        assert out.values() == [2, 3, 4, 5]
        assert tree.stats()["step"] == step  # found the gradient: the step goes on
    assert XTensor.reads == 0  # the rule and the argument loop read g through the table, never data_ptr()


class SavesParamGraph(ParamForwardGraph):
    """ParamForwardGraph that also returns w itself, as AOTAutograd's
    forwards return the parameters their backward reads (an output that is
    the STATIC input)."""

    def __call__(self, x, w):
        return super().__call__(x, w) + (w,)


class UsesParamBackwardGraph(BackwardGraph):
    """BackwardGraph taking the saved w too (and not needing it)."""

    def __call__(self, saved, w, tangent):
        return super().__call__(saved, tangent)


class SGDGraph:
    """A compiled optimizer step that updates the parameter in place: w += g."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, w, g):
        X.sim_launch(self.tree.stream, k_add, w.ptr, w.ptr, g.ptr, w.n)
        return ()


@pytest.mark.parametrize("keep", [False, True], ids=["activations_die", "activations_kept"])
def test_a_saved_parameter_is_passed_on_as_the_parameter_so_an_optimizer_step_updates_it_in_place(tree, keep):
    """The forward returns w itself for its backward: an output over caller
    memory. While it lives (kept here, as a retained graph or a program
    holding saved tensors keeps it), later calls in the step that take w
    must still get w's own memory: as a VALUE outside the pool it would go
    through a placeholder, and the optimizer's update would land in the copy."""
    fw = segment(tree, SavesParamGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    bw = segment(tree, UsesParamBackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC, ARG_TENSOR),
                 spans=(16, 16, 16), name="bw", backward=True)
    opt = segment(tree, SGDGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="opt",
                  written_inputs=(0,))
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    kept, want_w = [], [0, 0, 0, 0]
    for i in range(8):
        w.grad = None
        out, saved, w_saved = call(fw, x, w)
        assert out.values() == [a + b for a, b in zip([1, 2, 3, 4], want_w)], i
        assert w_saved.ptr == w.ptr  # the saved parameter is the parameter's memory
        if keep:
            kept += [saved, w_saved]
        (g,) = bw(saved, w_saved, t)
        del saved, w_saved
        w.accumulate(g)
        del g
        call(opt, w, w.grad)
        want_w = [a + b for a, b in zip(want_w, [2, 3, 4, 5])]
        assert w.values() == want_w, i
    s = tree.stats()
    # Kept activations their backward read hold the step against the optimizer's call, not against the
    # next forward: each iteration is a step, and replays.
    assert s["steps_forced"] == 0 and s["replays"] > 0
    assert [v.values() for v in kept[1::2]] == [want_w] * len(kept[1::2])  # a kept saved w reads w, never stale


@pytest.mark.parametrize("noted_by", ["one_tree", "two_trees"])
def test_a_view_of_grad_passed_to_the_call_that_ends_its_step_stays_a_view_of_grad(tree, noted_by):
    """The step's end moved a kept .grad onto a copy (grad.set_(grad.clone()))
    and then the call's arguments onto another: a view of .grad the call
    read was moved apart from .grad, and a write in place to .grad (zero_(),
    the next accumulation) was lost to the view, silently (a helper's
    review). They move in one go now, onto one copy; a leaf another tree
    noted too (another thread's forward of the same model) goes on the list
    once."""
    fw, bw, w, x, t = param_training_pair(tree)
    if noted_by == "two_trees":
        other = X.Tree(0, backend="sim")
        other_fw = segment(other, ParamForwardGraph(other), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                           name="other_fw", saved_from=1, grad_inputs=(1,))
        call(other_fw, x, w)
    reader = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,), name="reader")  # a norm, a log
    for _ in range(3):
        call(reader, x)
    w.grad = None
    param_step(fw, bw, w, x, t)  # w.grad: the backward's output, taken over by AccumulateGrad
    flat = w.grad.view()  # p.grad.view(-1), kept
    s0 = tree.stats()
    tree.step_begin()
    (n,) = reader(flat)  # the call that begins the next step reads the view
    assert n.values() == [2, 3, 4, 5]
    s = tree.stats()
    assert s["gradients_moved"] == s0["gradients_moved"] + 1 and s["arguments_moved"] == s0["arguments_moved"] + 1
    assert flat.untyped_storage() is w.grad.untyped_storage()
    w.grad.fill([0, 0, 0, 0])  # zero_()
    assert flat.values() == [0, 0, 0, 0]
    tree.check()


def test_a_grad_kept_past_the_optimizer_moves_when_the_next_forward_begins_its_step(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    opt = optimizer_segment(tree)
    moved0 = tree.stats()["gradients_moved"]
    param_step(fw, bw, w, x, t)
    call(opt, w, w.grad)
    grad = w.grad
    param_step(fw, bw, w, x, t)  # zero_grad(set_to_none=False) style: .grad lives into the next step
    assert tree.stats()["gradients_moved"] == moved0 + 1
    assert w.grad is grad and grad.values() == [4, 6, 8, 10]
    (out,) = call(opt, w, w.grad)  # .grad is ordinary memory now: a step begins as for any input
    assert out.values() == [4, 6, 8, 10]


@pytest.mark.parametrize("after_backward", ["a_norm_for_the_log", "a_per_parameter_update_100_times",
                                            "a_norm_of_a_slice_at_an_offset"])
def test_calls_after_the_backward_that_read_a_kept_grad_go_on_in_its_step_as_those_that_read_a_pool_one(tree,
                                                                                                       after_backward):
    """zero_grad(set_to_none=False): from the loop's second step .grad is
    memory of its own (moved at the first step's end), which AccumulateGrad
    adds into. A compiled call after the backward that reads it was no
    reader of the step's gradients: a norm for the log began a step, and
    the loss the loop logs raised StaleTensorError where Inductor computes;
    a per-parameter update came under the bound of calls that only write
    (64, no warning), and past it the loss raised too (a helper's review).
    Both now go on in the backward's step, as with set_to_none=True. So
    does a norm of a slice of .grad at an offset (w.grad.narrow(0, 2, 2): a
    fused QKV gradient split eagerly, its K part logged): only the address
    where a .grad begins was looked for, so it began a step and the logged
    loss raised (a review)."""
    fw, bw, w, x, t = param_training_pair(tree)
    if after_backward == "a_norm_for_the_log":
        opt = optimizer_segment(tree)
        after, calls = lambda: call(opt, w, w.grad), 1
    elif after_backward == "a_norm_of_a_slice_at_an_offset":
        norm = segment(tree, Graph(tree, 2.0, 0.0), spans=(8,), name="norm")
        after, calls = lambda: call(norm, w.grad.narrow(2, 2)), 1
    else:
        upd = segment(tree, SGDGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="upd",
                      written_inputs=(0,))
        after, calls = lambda: call(upd, w, w.grad), 100
    w.grad = None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no bound is reached
        for i in range(4):
            if w.grad is not None:
                w.grad.fill([0, 0, 0, 0])  # zero_grad(set_to_none=False)
            out, saved = call(fw, x, w)  # out: the loss the loop logs
            logged = out.values()
            (g,) = bw(saved, t)
            w.accumulate(g)
            del saved, g
            gc.collect()
            step = tree.stats()["step"]
            for _ in range(calls):
                after()
            assert tree.stats()["step"] == step, "iteration %d" % i
            assert out.values() == logged  # readable after the optimizer, as under Inductor
    s = tree.stats()
    assert s["gradients_moved"] >= 1 and s["optimizer_steps_forced"] == 0
    tree.check()


class CountingLeaf(Leaf):
    """A parameter that counts the reads of its .grad."""

    reads = 0

    @property
    def grad(self):
        CountingLeaf.reads += 1
        return self._grad

    @grad.setter
    def grad(self, g):
        self._grad = g


def many_param_training(tree, n, leaf=Leaf):
    """A forward over n parameters (the first gets the backward's
    gradient), its backward, and n leaves whose .grad is kept (memory of
    their own, zeroed in place each step)."""
    first = ParamForwardGraph(tree)
    fw = segment(tree, lambda x, *ws: first(x, ws[0]), kinds=(ARG_TENSOR,) + (ARG_TENSOR_STATIC,) * n,
                 spans=(16,) * (n + 1), name="fw", saved_from=1, grad_inputs=tuple(range(1, n + 1)))
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    ws = [leaf(4).fill([k, k, k, k]) for k in range(n)]
    for w in ws:
        w.grad = FakeTensor(4).fill([0, 0, 0, 0])
    return fw, bw, ws


@pytest.mark.parametrize("keep_loss", [True, False])
def test_a_per_parameter_update_after_the_backward_reads_the_leaves_grad_once_not_at_every_call(tree, keep_loss):
    """A per-parameter compiled update after the backward, .grad kept: each
    of its N calls asked whether it reads a kept .grad, and each read all N
    leaves' .grad, N squared per step (a review). They are read once per
    backward. With the loss dropped, the update (in place, returning
    nothing) finds nothing alive: its first call begins a readers' step,
    which the rest join (each began a step, and read every leaf's .grad
    again: a review), and the cache of where .grad lie is read once more
    there (carried into it, it missed a .grad replaced in between: a
    review)."""
    n = 24
    fw, bw, ws = many_param_training(tree, n, leaf=CountingLeaf)
    upd = segment(tree, SGDGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="upd",
                  written_inputs=(0,))
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(4):
        if keep_loss:
            out, saved = call(fw, x, *ws)  # out: the loss the loop logs
            logged = out.values()
            (g,) = bw(saved, t)
            ws[0].accumulate(g)
            del saved, g
        else:
            kept_grad_training_step(fw, bw, ws, x, t)
        gc.collect()
        step, CountingLeaf.reads = tree.stats()["step"], 0
        for w in ws:
            call(upd, w, w.grad)  # the test's own read of .grad, then cgtree's
        if i >= 2 and keep_loss:  # recorded and replayed: the step's outputs live, and each call asks
            assert tree.stats()["step"] == step and out.values() == logged
            assert CountingLeaf.reads <= 3 * n, "iteration %d: %d reads of .grad" % (i, CountingLeaf.reads)
        elif i >= 2:
            assert tree.stats()["step"] == step + 1, "iteration %d: the updates began more than one step" % i
            assert CountingLeaf.reads <= 4 * n, "iteration %d: %d reads of .grad" % (i, CountingLeaf.reads)
    tree.check()


@pytest.mark.parametrize("keep_score", [False, True])
def test_an_analysis_loop_reading_a_kept_grad_after_training_begins_a_step_at_each_call(tree, keep_score):
    """After training with zero_grad(set_to_none=False), a loop of compiled
    calls that read the kept .grad (a gradient probe) and drop their
    outputs: with nothing of the step alive there is nothing to hold it
    for, so each call begins a step and replays one node (held as the
    step's gradient reader, it made a recording per call up to the bound,
    then warned: a review). With `score` kept bound into the next
    iteration, as a Python loop does, each call repeats the last (the same
    segment, the same arguments) and begins a readers' step of its own
    (joined to the readers' step, each made a node: a review)."""
    fw, bw, w, x, t = param_training_pair(tree)
    probe = optimizer_segment(tree)
    w.grad = None
    for i in range(3):
        if w.grad is not None:
            w.grad.fill([0, 0, 0, 0])
        out, saved = call(fw, x, w)
        (g,) = bw(saved, t)
        w.accumulate(g)
        del out, saved, g
        gc.collect()
    s0 = tree.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(100):
            (score,) = call(probe, w, w.grad)
            assert score.values() == [a + b for a, b in zip(w.values(), w.grad.values())]
            if not keep_score:
                del score
    s = tree.stats()
    assert s["nodes"] - s0["nodes"] <= 2 and s["steps_kept_after_backward"] == s0["steps_kept_after_backward"]
    tree.check()


def test_calls_that_only_read_gradients_hold_the_step_at_most_1024_then_a_step_begins_with_a_warning(tree):
    """A compiled function called once per parameter after the backward
    (Muon's orthogonalisation, a per-parameter norm kept for a histogram)
    reads each .grad: each call goes on in the step, so the step's outputs
    stay readable. At 64 such calls a step began, and the outputs kept
    from before (the logged loss, the norms) raised, though the bound was
    said to lose nothing (a helper's audit). The bound is 1024; past it a
    step begins with a warning once, and the kept .grad moves."""
    fw, bw, w, x, t = param_training_pair(tree)
    opt = optimizer_segment(tree)
    w.grad = None
    out, saved = call(fw, x, w)  # out: the loss the program logs after the step
    (g,) = bw(saved, t)
    w.accumulate(g)
    del saved, g
    s0 = tree.stats()
    norms = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning before the bound
        for _ in range(1024):
            norms.append(call(opt, w, w.grad)[0])
    assert out.values() == [1, 2, 3, 4] and all(n.values() == [2, 3, 4, 5] for n in norms)
    with pytest.warns(RuntimeWarning, match="taken for the step's optimizer"):
        (last,) = call(opt, w, w.grad)
    s = tree.stats()
    assert s["steps_kept_after_backward"] == s0["steps_kept_after_backward"] + 1024
    assert s["optimizer_steps_forced"] == s0["optimizer_steps_forced"] + 1 and s["steps_forced"] == s0["steps_forced"]
    assert s["gradients_moved"] == s0["gradients_moved"] + 1 and s["step"] == s0["step"] + 1
    assert w.grad.values() == [2, 3, 4, 5] and last.values() == [2, 3, 4, 5]
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        out.values()  # held past the bound: marked, never read wrong


class DecodeStep:
    """A decode step: writes its cache in place (cache += x), returns x + 1."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, cache, x):
        out = FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_add, cache.ptr, cache.ptr, x.ptr, x.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, x.ptr, x.n, 1.0, 1.0)
        return (out,)


def test_a_forward_of_many_calls_leaves_the_optimizer_its_own_bound(tree):
    """A forward of 1000 compiled calls before its backward (an RNN cell
    unrolled) held 1000 calls of the step's bound of deferred calls, which
    the optimizer's calls shared: only 24 per-parameter calls reading .grad
    were held after it, and the next began a step that marked the logged
    loss (a review). The optimizer's calls have their own count."""
    fw, bw, w, x, t = param_training_pair(tree)
    opt = optimizer_segment(tree)
    w.grad = None
    held = [call(fw, x, w) for _ in range(1000)]
    for _, saved in held:
        (g,) = bw(saved, t)
        w.accumulate(g)
        del g
    loss = held[-1][0]
    del held, saved
    gc.collect()
    s0 = tree.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(50):
            call(opt, w, w.grad)
    s = tree.stats()
    assert s["optimizer_steps_forced"] == s0["optimizer_steps_forced"] and s["step"] == s0["step"]
    assert loss.values() == [1, 2, 3, 4]


def test_gradient_reads_and_writes_of_the_steps_optimizer_are_counted_apart(tree):
    """100 per-parameter calls that read .grad (Muon), then one compiled
    update that only writes its buffers (an EMA): counted together, the
    write saw 100 held calls past its bound of 64 and began a step that
    marked the logged loss (a review)."""
    fw, bw, w, x, t = param_training_pair(tree)
    opt, count, n = optimizer_segment(tree), counting_segment(tree), FakeTensor(4).fill([0, 0, 0, 0])
    w.grad = None
    out, saved = call(fw, x, w)
    (g,) = bw(saved, t)
    w.accumulate(g)
    del saved, g
    s0 = tree.stats()
    for _ in range(100):
        call(opt, w, w.grad)
    call(count, n)
    s = tree.stats()
    assert s["optimizer_steps_forced"] == s0["optimizer_steps_forced"] and s["step"] == s0["step"]
    assert out.values() == [1, 2, 3, 4]


def test_calls_that_only_write_an_input_after_training_hold_the_step_at_most_64_without_a_warning(tree):
    """A generation loop after each training step, each call writing its
    cache in place, is taken for the step's optimizer: held at most 64
    calls, then steps begin as in any inference loop, with no warning (at
    1024, a review counted 2051 nodes and 1028 recordings over three
    rollouts where 69 served, and a warning for an ordinary program)."""
    fw, bw, w, x, t = param_training_pair(tree)
    dec = segment(tree, DecodeStep(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="dec",
                  written_inputs=(0,))
    cache = FakeTensor(4).fill([0, 0, 0, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for it in range(3):
            w.grad = None
            param_step(fw, bw, w, x, t)
            tok = FakeTensor(4).fill([0, 0, 0, 0])
            for _ in range(300):
                (tok,) = call(dec, cache, tok)
            assert tok.values() == [300] * 4
    s = tree.stats()
    assert s["steps_kept_after_backward"] == 3 * 64 and s["nodes"] < 100, {k: s[k] for k in ("nodes", "recordings")}


class CountGraph:
    """An optimizer's bookkeeping: writes n + 1 into its input n, in place; returns nothing."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, n):
        X.sim_launch(self.tree.stream, k_affine, n.ptr, n.ptr, n.n, 1.0, 1.0)
        return ()


def counting_segment(tree):
    return segment(tree, CountGraph(tree), kinds=(ARG_TENSOR_STATIC,), spans=(16,), name="count",
                   written_inputs=(0,))


def test_a_call_that_updates_its_inputs_after_a_backward_goes_on_in_the_step_and_the_loss_stays_readable(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    count, n = counting_segment(tree), FakeTensor(4).fill([0, 0, 0, 0])
    s0 = tree.stats()
    for i in range(4):
        w.grad = None
        out, saved = call(fw, x, w)  # out: what a compiled model's loss is, an output of the step
        (g,) = bw(saved, t)
        w.accumulate(g)
        del saved, g
        step = tree.stats()["step"]
        call(count, n)  # the optimizer's graph reads no gradient, but writes into its state
        assert tree.stats()["step"] == step
        assert out.values() == [1, 2, 3, 4]  # logged after opt.step(): still the step's, not stale
        assert n.values() == [i + 1] * 4
    s = tree.stats()
    assert s["steps_kept_after_backward"] == s0["steps_kept_after_backward"] + 4
    assert s["gradients_moved"] == s0["gradients_moved"]


def test_a_forward_and_backward_that_run_plainly_still_mark_steps_so_the_optimizer_step_after_them_replays(tree):
    """As a model whose attention saves CPU tensors for its backward: the
    forward goes plain at its first call (an output on the CPU) and so does
    its backward (that output is its argument); the compiled optimizer step
    after them stays a segment. Plain calls still mark steps: each forward
    begins its step and each backward makes the optimizer go on in it, so
    the optimizer's graph replays at one node, instead of going on in one
    endless step with a new node at every call."""
    class CpuSavingForwardGraph(ForwardGraph):
        def __call__(self, x):
            out, saved = ForwardGraph.__call__(self, x)
            saved.is_cuda, saved.dl_device = False, (1, 0)
            return (out, saved)

    fw = segment(tree, CpuSavingForwardGraph(tree), spans=(16,), name="fw", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True)
    count, n = counting_segment(tree), FakeTensor(4).fill([0, 0, 0, 0])
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    s0 = tree.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(8):
            out, saved = call(fw, x)
            (g,) = bw(saved, t)
            assert out.values() == [2, 4, 6, 8] and g.values() == [4, 7, 10, 13]
            step = tree.stats()["step"]
            call(count, n)
            assert tree.stats()["step"] == step  # the optimizer goes on in the backward's step
            assert n.values() == [i + 1] * 4
    reasons = [str(w.message) for w in caught]
    assert any("graph 'fw'" in r and "output 1 is a tensor on cpu" in r for r in reasons), reasons
    assert any("graph 'bw'" in r and "argument 0 is not a CUDA tensor" in r for r in reasons), reasons
    s = tree.stats()
    assert s["step"] - s0["step"] == 8  # each plain forward began its step
    assert s["steps_kept_after_backward"] - s0["steps_kept_after_backward"] == 8
    assert s["replays"] - s0["replays"] >= 5 and s["recordings"] - s0["recordings"] == 1
    assert [nd["segment"] for nd in tree.nodes()] == ["count"]  # one node, below the root


def test_a_call_that_updates_its_inputs_with_no_backward_in_the_step_begins_a_step_as_any_call(tree):
    count, n = counting_segment(tree), FakeTensor(4).fill([0, 0, 0, 0])
    fw, bw, w, x, t = param_training_pair(tree)
    out, saved = call(fw, x, w)  # a forward whose backward never runs (its saved tensor dies)
    del saved
    gc.collect()
    s0 = tree.stats()
    assert s0["saved_activations_alive"] == 0
    for _ in range(3):  # e.g. a decode loop writing its cache: every call a step, as before
        call(count, n)
    s = tree.stats()
    assert s["step"] == s0["step"] + 3 and s["steps_kept_after_backward"] == s0["steps_kept_after_backward"]
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        out.values()


def test_an_explicit_mark_before_the_optimizer_begins_a_step_and_the_gradient_moves_first(tree):
    fw, bw, w, x, t = param_training_pair(tree)
    opt = optimizer_segment(tree)

    class MarkStepBox:
        mark_step_counter = 0

    init_hot_path(mark_step_cls=MarkStepBox)
    try:
        w.grad = None
        g_ptr = param_step(fw, bw, w, x, t)
        moved0 = tree.stats()["gradients_moved"]
        MarkStepBox.mark_step_counter -= 1  # torch.compiler.cudagraph_mark_step_begin()
        (out,) = call(opt, w, w.grad)
        assert tree.stats()["gradients_moved"] == moved0 + 1 and w.grad.ptr != g_ptr
        assert out.values() == [2, 3, 4, 5]
    finally:
        init_hot_path()


def test_an_explicit_mark_begins_a_step_even_with_a_backward_pending_and_the_backward_then_raises(tree):
    fw, bw, x, t = replaying_training_pair(tree)
    class MarkStepBox:
        mark_step_counter = 0

    init_hot_path(mark_step_cls=MarkStepBox)
    try:
        out, saved = call(fw, x)
        step0 = tree.stats()["step"]
        MarkStepBox.mark_step_counter -= 1  # torch.compiler.cudagraph_mark_step_begin()
        call(fw, x)
        assert tree.stats()["step"] == step0 + 1
        with pytest.raises(X.StaleTensorError):
            bw(saved, t)  # its activation's memory belongs to the new step: never computed with
    finally:
        init_hot_path()


@pytest.mark.parametrize("grads", ["dropped", "accumulated_into_grad", "kept_outside_grad"])
def test_a_tree_where_only_backwards_run_begins_a_step_once_nothing_but_gradients_of_its_step_lives(grads):
    """A worker thread that never called a compiled model calls
    loss.backward() on a forward of the main thread's: the backward runs on
    trees of autograd's thread, where only backwards ever run. A backward
    begins no step, so that tree's one step never ended: every backward was
    a new node, run plainly as a warm-up, never recorded or replayed (a
    helper's audit). There a new generation begins a step once nothing of
    the step lives but leaves' .grad, and the backward replays. A gradient
    AccumulateGrad took over as .grad and accumulates into
    (zero_grad(set_to_none=False)) is moved at that step's end, found
    through the leaves the forward's tree noted: kept, it held the step for
    good and the path grew a node per backward. One kept outside .grad
    (torch.autograd.grad's; or one autograd passes on to the next node of a
    backward under way) keeps the step, as long as any step is held."""
    fw_tree = X.Tree(0, backend="sim")
    bw_tree = X.Tree(0, backend="sim")  # autograd's thread's own
    fw = segment(fw_tree, ParamForwardGraph(fw_tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                 name="fw", saved_from=1, grad_inputs=(1,))
    bw = segment(bw_tree, BackwardGraph(bw_tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True)
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    kept = []
    for i in range(40):
        out, saved = call(fw, x, w)  # the forward, on the main thread's tree: Dynamo's counter moves
        (g,) = bw(saved, t)  # its backward, on autograd's thread's tree
        assert g.values() == [2, 3, 4, 5]
        if grads == "accumulated_into_grad":
            if i < 5:  # zero_grad() until the backward replays: then .grad is taken over from the pool
                w.grad = None
            w.accumulate(g)
        elif grads == "kept_outside_grad":
            kept.append(g)
        del out, saved, g
        gc.collect()
        if i == 6:
            moved = bw_tree.stats()["gradients_moved"]
    s = bw_tree.stats()
    if grads == "kept_outside_grad":  # held: every backward a node of one step, each read right
        assert s["steps_deferred"] >= 35 and s["steps_forced"] == 0
        assert all(g.values() == [2, 3, 4, 5] for g in kept)
    else:
        assert s["replays"] >= 30 and s["nodes"] <= 3, {k: s[k] for k in ("step", "recordings", "replays", "nodes")}
    if grads == "accumulated_into_grad":
        assert w.grad.values() == [36 * v for v in (2, 3, 4, 5)]  # the 5th backward's on
        assert s["gradients_moved"] == moved >= 1  # moved once: then it is memory of its own, added into
    del kept
    gc.collect()
    bw_tree.check()


def test_a_backward_only_tree_held_by_gradients_kept_outside_grad_begins_a_step_at_the_bound_with_a_warning():
    """Gradients torch.autograd.grad returned, kept by the program, hold a
    backward-only tree's step as long as any held step: 1024 new
    generations, then a step begins with a warning, and a kept one raises."""
    fw_tree, bw_tree = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
    fw = segment(fw_tree, Graph(fw_tree, 2.0, 1.0), spans=(16,), name="fw")
    bw = segment(bw_tree, BackwardGraph(bw_tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    kept = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(1026):  # the first two backwards begin steps: nothing of the pool lives yet
            (y,) = call(fw, x)
            kept.append(bw(y, t)[0])
    with pytest.warns(RuntimeWarning, match="no leaf's .grad"):
        (y,) = call(fw, x)
        kept.append(bw(y, t)[0])
    assert bw_tree.stats()["steps_forced"] == 1
    assert kept[-1].values() == [4, 6, 8, 10]
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        kept[-2].values()
    del kept, y
    gc.collect()
    bw_tree.check()


@pytest.mark.parametrize("first", ["the_heads_backward", "the_recompute"])
def test_a_backward_only_tree_whose_backward_recomputes_a_compiled_block_still_begins_steps_and_replays(first):
    """The worker's backward of the test above, through a block that
    activation checkpointing recomputes: the recompute is a compiled call
    inside the backward, on autograd's thread's tree. It counted as a call
    other than a backward, so no backward there began a step again: that
    tree's one step never ended, every call a new node run as a warm-up,
    never replayed, until the bound began a step inside a backward and it
    raised StaleTensorError where Inductor computes (a helper's review). A
    call inside a backward leaves a tree of backwards one. Where the
    recompute is the backward's first compiled call (every block
    checkpointed, the loss eager), deferred as a call inside a backward, it
    never began a step at all (a review): it begins the step as that
    backward would."""
    main, worker = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")  # the worker: autograd's thread's own
    block = segment(main, ForwardGraph(main), spans=(16,), name="block", saved_from=1)
    head = segment(main, ForwardGraph(main), spans=(16,), name="head", saved_from=1)
    recompute = segment(worker, ForwardGraph(worker), spans=(16,), name="block_recompute", saved_from=1)
    block_bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                       name="block_bw", backward=True)
    head_bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                      name="head_bw", backward=True)
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    try:
        for _ in range(12):
            x = FakeTensor(4).fill([1, 2, 3, 4])
            h, saved = call(block, x)  # checkpointed: none of its saved tensors is kept
            h.requires_grad = True
            del saved
            if first == "the_heads_backward":
                y, head_saved = call(head, h)
                task[0] = 7  # the worker's loss.backward(), run by autograd's thread
                (gh,) = head_bw(head_saved, t)
                del y, head_saved
                gc.collect()
            else:  # the loss eager: the block's node unpacks its saved tensors first, and recomputes
                task[0], gh = 7, t
            h_again, saved = call(recompute, x)  # checkpointing's recompute, inside the backward
            (gx,) = block_bw(saved, gh)
            want = [3 * a + 3 * 2 * a + 1 for a in (1, 2, 3, 4)] if gh is not t else [3 * a + 1 for a in (1, 2, 3, 4)]
            assert gx.values() == want
            task[0] = -1
            del h, gh, h_again, saved, gx
            gc.collect()
    finally:
        X.set_graph_task_id(None)
    s = worker.stats()
    assert s["replays"] >= 10 and s["nodes"] <= 4, {k: s[k] for k in ("step", "replays", "nodes", "warmups")}
    assert s["steps_forced"] == 0
    worker.check()


def test_a_backward_only_trees_step_held_by_a_kept_recompute_activation_begins_at_the_bound_with_a_warning():
    """A recompute inside a worker's backward leaves autograd's thread's
    tree one of backwards, but its saved activations are the tree's own.
    One whose block backward never ran, kept alive (a kept exception's
    frame), held that tree's step for good: a node per call, no warning (a
    review). It holds under the bound of any held step: 1024 generations,
    then a step begins with a warning."""
    main, worker = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
    block = segment(main, ForwardGraph(main), spans=(16,), name="block", saved_from=1)
    recompute = segment(worker, ForwardGraph(worker), spans=(16,), name="block_recompute", saved_from=1)
    block_bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                       name="block_bw", backward=True)
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    t = FakeTensor(4).fill([1, 1, 1, 1])
    kept = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(1040):
                x = FakeTensor(4).fill([1, 2, 3, 4])
                h, saved = call(block, x)  # checkpointed: none of its saved tensors is kept
                del saved
                task[0] = 7  # the worker's loss.backward(), the loss eager
                h_again, saved = call(recompute, x)
                if i == 5:  # that backward fails after the recompute; the error, and its frame, are kept
                    kept.append(saved)
                else:
                    (gx,) = block_bw(saved, t)
                    del gx
                task[0] = -1
                del h, h_again, saved
                gc.collect()
    finally:
        X.set_graph_task_id(None)
    s = worker.stats()
    assert s["steps_forced"] == 1 and any("recompute" in str(w.message) for w in caught), s
    assert s["step"] > 7  # steps begin again after the forced one
    del kept
    gc.collect()
    worker.check()


def model_and_a_workers_loss():
    """Two trees, the main thread's and a worker's: the model's forward fw
    (it notes its parameter, argument 1) on the main tree; on the worker's,
    a compiled loss of the model's output (it takes no parameter), the
    loss's backward, and the model's backward, which the worker's
    loss.backward() runs there. (main, worker, fw, loss, loss_bw, bw)."""
    main, worker = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
    fw = segment(main, ParamForwardGraph(main), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    loss = segment(worker, ForwardGraph(worker), spans=(16,), name="loss", saved_from=1, grad_inputs=(0,))
    loss_bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                      name="loss_bw", backward=True)
    bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True)
    return main, worker, fw, loss, loss_bw, bw


def test_a_kept_grad_a_worker_threads_backward_made_moves_though_the_main_thread_noted_the_leaf():
    """The main thread's model notes its parameter on its tree; a worker
    thread that has called a compiled loss of its own calls backward, so
    the gradient is an output of the worker's tree. With accumulation its
    .grad lives into the worker tree's next step, which looked for leaves
    in its own notes only: the .grad was marked, not moved, and the next
    accumulation raised StaleTensorError where Inductor computes (a
    helper's review). Every tree's leaves are looked at."""
    main, worker, fw, loss, loss_bw, bw = model_and_a_workers_loss()
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(8):
        if i < 5:
            w.grad = None  # zero_grad() until everything replays; then gradients accumulate into .grad
        out, saved = call(fw, x, w)  # the main thread
        out.requires_grad, out.is_leaf = True, False
        lout, lsaved = call(loss, out)  # the worker's compiled loss
        (gl,) = loss_bw(lsaved, t)  # loss.backward() on the worker
        (g,) = bw(saved, gl)  # the model's backward, on the worker's tree
        one = g.values()
        w.accumulate(g)
        del out, saved, lout, lsaved, gl, g
        gc.collect()
    assert worker.stats()["gradients_moved"] >= 1
    assert w.grad.values() == [4 * v for v in one]  # the 5th backward's on
    worker.check()


@pytest.mark.parametrize("then, backward", [("the_next_forward_with_out_bound", "recorded"),
                                            ("a_compiled_optimizer_and_the_logged_loss", "recorded"),
                                            ("the_next_forward_with_out_bound", "plain")])
def test_a_worker_threads_backward_of_the_main_threads_forward_is_heard_by_the_forwards_tree(then, backward):
    """The backward runs on the tree of the thread that called it, so a
    worker's loss.backward() of the main thread's forward ran on another
    tree than the forward's, and the forward's tree never heard of it: its
    watch of the forward's output never ended, so a loop that keeps `out`
    bound held one step (every call a new node, up to the bound of 1024),
    and a compiled optimizer step on the main thread began a step, so the
    loss it logs raised StaleTensorError where Inductor computes (a
    helper's review). The forward's tree hears of each backward that reads
    what holds its step for a backward, recorded or plain (the plain path
    first asked only the worker's own tree, which holds nothing: a
    review)."""
    main, worker = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")  # the worker: autograd's thread's own
    fw = segment(main, ParamForwardGraph(main), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    plain = {"plain_reason": "an op cgtree cannot record"} if backward == "plain" else {}
    bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True, **plain)
    opt = optimizer_segment(main)
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    out = None
    s0 = main.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error" if backward == "recorded" else "ignore")  # the plain reason's warning
        for i in range(10):
            w.grad = None  # zero_grad()
            step = main.stats()["step"]
            out, saved = call(fw, x, w)  # the last iteration's `out` is still bound here
            out.requires_grad = True
            assert i == 0 or main.stats()["step"] == step + 1, "iteration %d" % i
            logged = out.values()
            (g,) = bw(saved, t)  # the worker's loss.backward()
            w.accumulate(g)
            del saved, g
            gc.collect()
            if then == "a_compiled_optimizer_and_the_logged_loss":
                step = main.stats()["step"]
                call(opt, w, w.grad)
                if i >= 2:  # from the forward's first recorded call on: its outputs are the pool's
                    assert main.stats()["step"] == step and out.values() == logged, "iteration %d" % i
    s = main.stats()
    assert s["steps_deferred"] == s0["steps_deferred"] and s["steps_forced"] == 0 and s["replays"] >= 6
    del out
    gc.collect()
    main.check()
    worker.check()


def test_another_threads_backward_reading_a_teachers_output_leaves_the_teachers_tree_its_hold_for_the_student():
    """Thread A runs a teacher under no_grad, then its student, whose loss
    reads the teacher's output t. Thread B trains a head of its own on t
    (handed over detached); the head runs as the plain graph and saves its
    input, so B's backward reads t. Heard by A as a backward of its own,
    it ended every watch of A's step, the teacher output's hold for the
    student among them: the student's call began a step that marked t, and
    A's loss raised StaleTensorError where Inductor computes (a review). A
    tree hears of another tree's backward only where it reads what holds
    the step for a backward."""
    X.set_output_mover(fake_move_out)
    a, b = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
    teacher = segment(a, Graph(a, 5.0, 0.0), spans=(16,), name="teacher")
    student = segment(a, ForwardGraph(a), spans=(16,), name="student", saved_from=1)
    student_bw = segment(a, BackwardGraph(a), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="student_bw",
                         backward=True)
    head = segment(b, HeadSavingItsInput(b), spans=(16,), name="head", saved_from=1,
                   plain_reason="an op cgtree cannot record")
    head_bw = segment(b, BackwardGraph(b), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="head_bw",
                      backward=True)
    g, x = FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(4).fill([1, 2, 3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain reason's warning
        for i in range(6):
            (t,) = call(teacher, x)  # thread A, under no_grad
            on_b = t.view()  # thread B's head on t.detach(), then its backward
            zb, sb = call(head, on_b)
            (gb,) = head_bw(sb, g)
            del on_b, zb, sb, gb
            gc.collect()
            step = a.stats()["step"]
            y, saved = call(student, x)  # thread A's student
            assert i == 0 or a.stats()["step"] == step, "iteration %d" % i  # the teacher's first call ran plainly
            assert t.values() == [5, 10, 15, 20]  # A's loss reads t
            (gx,) = student_bw(saved, g)
            del y, saved, gx
            gc.collect()
    del t
    gc.collect()
    a.check()
    b.check()


def test_a_forward_whose_backward_never_comes_holds_the_step_at_most_1024_calls_then_warns(tree):
    fw, bw = training_pair(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    kept = [call(fw, x) for _ in range(3)]
    step0 = tree.stats()["step"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning before the bound
        for _ in range(1024 - 2):
            kept.append(call(fw, x))
    assert tree.stats()["step"] == step0 and tree.stats()["steps_forced"] == 0
    with pytest.warns(RuntimeWarning, match="saved activations"):
        for _ in range(2):
            kept.append(call(fw, x))
    s = tree.stats()
    assert s["steps_forced"] == 1 and s["step"] == step0 + 1
    # The forced step took the held step's memory: a backward that comes
    # late for one of its activations raises, and never computes with them.
    # (kept[0] came from the segment's first call, which runs plainly, on
    # memory of its own, so it stays valid; kept[-2] is the held step's last.)
    _, saved = kept[-2]
    with pytest.raises(X.StaleTensorError):
        bw(saved, t)
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        saved.values()
    assert kept[0][1].values() == [3, 6, 9, 12]  # the plain first call's: never the pool's


@pytest.mark.parametrize("steps", [70, 300])
def test_an_rnn_cell_unrolled_over_hundreds_of_compiled_calls_then_its_backward_trains(tree, steps):
    """h = cell(x[t], h) for each t: every call of the compiled cell is a
    new call of a compiled model, held in the step by the saved activations
    of the calls before it; then loss.backward() runs the cell's backward
    for each. At 64 held calls a step began, with a warning, and the
    backward raised StaleTensorError where Inductor computes (a helper's
    audit); regionally compiled layers are the same case. The bound is
    now 1024 calls; the iterations after the first replay one path."""
    cell = segment(tree, ForwardGraph(tree), spans=(16,), name="cell", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    g = FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the bound's warning fails the test
        for it in range(3):
            if it == 2:
                recorded = tree.stats()["recordings"]
            h = FakeTensor(4).fill([1, 1, 1, 1])
            saved = []
            for _ in range(steps):
                h, s = call(cell, h)
                h.fill([1, 1, 1, 1])  # keeps the numbers small: an eager write, as a normalisation would
                saved.append(s)
            for s in reversed(saved):  # loss.backward(): autograd runs each call's backward
                (gx,) = bw(s, g)
                assert gx.values() == [4, 4, 4, 4]
                del gx
            del saved, s, h
            gc.collect()
    st = tree.stats()
    assert st["steps_forced"] == 0 and st["recordings"] == recorded


def test_give_reference_adds_exactly_one_reference():
    """_install._stash_in_tls gives PyTorch's thread-local stash the one
    reference it releases at the thread's exit (test_torch_threads.py)."""
    held = [object()]
    before = sys.getrefcount(held[0])
    X.give_reference(held[0])
    after = sys.getrefcount(held[0])  # read before the assert, whose rewriting holds the object too
    assert after == before + 1  # the object is leaked on purpose: nothing releases it


def test_an_output_whose_stale_mark_failed_stays_watched_and_is_marked_when_the_step_does_end(tree):
    """A step's end marks every live output of the step. If marking one
    fails (PyTorch's call raises), the call raises and the step goes on;
    that output must stay on the step's list, so that the step that does
    end marks it: otherwise its memory is reused while it still reads,
    silently."""
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    (y1,) = call(seg, x)
    (y2,) = seg(x)  # the same step
    bad = y1.untyped_storage()._cdata

    def mark_failing_for_y1(cdata, msg):
        if cdata == bad:
            raise MemoryError("marking y1 failed")
        fake_mark(cdata, msg)

    init_hot_path(mark=mark_failing_for_y1)
    try:
        with pytest.raises(MemoryError):
            call(seg, x)
    finally:
        init_hot_path()
    assert y1.values() == [3, 5, 7, 9]  # not marked, and its step goes on
    x.fill([100, 100, 100, 100])
    (y3,) = call(seg, x)  # the step ends now, and y1 with it
    assert y3.values() == [201, 201, 201, 201]
    with pytest.raises(RuntimeError, match="StaleTensorError|stale|cgtree"):
        y1.values()
    tree.check()


def test_a_mark_of_a_step_is_not_lost_when_the_step_could_not_begin(tree):
    """In explicit mode a step begins at torch.compiler.cudagraph_mark_step_begin().
    A call whose step could not begin (marking the old outputs failed)
    raises; the mark still stands, and the next call begins the step."""
    class MarkStepBox:
        mark_step_counter = 0

    tree.explicit_steps = True
    seg, x = replaying(tree, a=2.0, b=1.0, fill=(1, 2, 3, 4))
    (y,) = seg(x)
    steps = tree.step

    def mark_failing(cdata, msg):
        raise MemoryError("marking failed")

    init_hot_path(mark_step_cls=MarkStepBox, mark=mark_failing)
    try:
        MarkStepBox.mark_step_counter -= 1
        with pytest.raises(MemoryError):
            seg(x)
        init_hot_path(mark_step_cls=MarkStepBox)
        seg(x)  # the retry: the mark is still there
    finally:
        init_hot_path()
    assert tree.step == steps + 1
    tree.check()


class WritesItsInput:
    """A graph that adds one to its input in place and returns x * 2."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        X.sim_launch(self.tree.stream, k_affine, x.ptr, x.ptr, x.n, 1.0, 1.0)
        out = affine(self.tree.stream, x, 2.0, 0.0)
        return (out,)


def test_a_first_call_that_wrote_its_input_keeps_its_result_when_cgtree_cannot_take_it_in(tree):
    """A graph's first call runs plainly; if what cgtree does after it
    fails (here describing its outputs raises), a graph that wrote an input
    must not raise: a caller that retries would write it twice. Its result
    stands, with a warning, and its next call tries again."""
    fails = [1]

    def describe_once_failing(res):
        if fails[0]:
            fails[0] -= 1
            raise MemoryError("no memory to describe the outputs")
        return describe(res)

    graph = WritesItsInput(tree)
    seg = X.Segment(tree, "writes", graph, lambda inputs: graph(*inputs), alias, describe_once_failing, span,
                    bytes((ARG_TENSOR_STATIC,)), (16,), 0, False, False, written_inputs=(0,))
    x = FakeTensor(4).fill([0, 0, 0, 0])
    with pytest.warns(RuntimeWarning, match="its result stands"):
        (y,) = call(seg, x)
    assert x.values() == [1, 1, 1, 1] and y.values() == [2, 2, 2, 2]
    for k in range(2, 6):  # taken in at the next call, then warmed up, recorded, replayed
        (y,) = call(seg, x)
        X.sim_sync(tree.stream)
        assert x.values() == [k] * 4 and y.values() == [2 * k] * 4
    assert tree.stats()["replays"] >= 1
    tree.check()


def test_a_first_call_of_a_graph_that_writes_nothing_still_raises_when_cgtree_cannot_take_it_in(tree):
    """The contrast: a graph that may run again raises, and a retry computes
    the same."""
    def describe_failing(res):
        raise MemoryError("no memory to describe the outputs")

    graph = Graph(tree, 2.0, 1.0)
    seg = X.Segment(tree, "pure", graph, lambda inputs: graph(*inputs), alias, describe_failing, span,
                    bytes((ARG_TENSOR,)), (16,), 0, False, True)
    with pytest.raises(MemoryError):
        call(seg, FakeTensor(4).fill([1, 2, 3, 4]))


class LeafOnceOutOfMemory(Leaf):
    """A parameter whose requires_grad raises MemoryError the first time it
    is read (no memory to answer)."""

    def __init__(self, n):
        super().__init__(n)
        self.fail = True

    @property
    def requires_grad(self):
        if self.fail:
            self.fail = False
            raise MemoryError("no memory for requires_grad")
        return True


def test_a_parameter_not_noted_for_lack_of_memory_is_noted_at_the_next_call(tree):
    """A training forward notes the leaves among its inputs, whose .grad a
    step's end must move rather than mark; a parameter seen at a position
    is not looked at again while the same object comes back. Out of memory
    while noting it, the call raises (before anything ran), and the next
    call notes it: before, it counted as seen, and its .grad was marked
    stale at every step's end instead of moved."""
    fw = segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    w, x = LeafOnceOutOfMemory(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4])
    Generation.generation += 1
    with pytest.raises(MemoryError):
        fw(x, w)
    assert tree.stats()["gradient_leaves"] == 0
    call(fw, x, w)
    assert tree.stats()["gradient_leaves"] == 1
    tree.check()


class ScaledByInts:
    """A graph of x and two ints (a dynamic shape's sizes, say): out = x * a + b."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, a, b):
        out = FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, x.ptr, x.n, float(a), float(b))
        return (out,)


def int_segment(tree):
    g = ScaledByInts(tree)
    return X.Segment(tree, "ints", g, lambda inputs: g(*inputs), alias, describe, span,
                     bytes((ARG_TENSOR, ARG_INT, ARG_INT)), (16, 0, 0), 0, False, True)


def test_ints_that_a_sum_and_shift_hash_confused_key_variants_of_their_own(tree):
    """(0, 62) and (1, 1), (8, 100) and (9, 39): the variant hash of an
    earlier version gave each pair one variant, so the second replayed the
    first's recording (with a dynamic shape's sizes: the first's output
    shape and numbers). Each now records and replays its own."""
    seg = int_segment(tree)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for pair in ((0, 62), (1, 1), (8, 100), (9, 39)):
        for _ in range(4):
            (y,) = call(seg, x, *pair)
            a, b = pair
            assert y.values() == [v * a + b for v in (1, 2, 3, 4)], pair
    assert seg.info["collisions"] == 0
    assert tree.stats()["recordings"] == 4
    tree.check()


def test_a_call_whose_variant_collides_with_another_keys_runs_plainly_and_right(tree):
    """However unlikely a 64-bit collision, a call whose ints hash to the
    variant of a recording made with other ints must not replay it: it runs
    as the plain graph, with one warning. Here every variant is 0."""
    seg = int_segment(tree)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    X._set_variant_mask(0)
    try:
        for _ in range(4):
            (y,) = call(seg, x, 2, 0)
        assert y.values() == [2, 4, 6, 8]
        with pytest.warns(RuntimeWarning, match="same variant key"):
            (y,) = call(seg, x, 3, 1)
        assert y.values() == [4, 7, 10, 13]
        (y,) = call(seg, x, 3, 1)
        assert y.values() == [4, 7, 10, 13]
        (y,) = call(seg, x, 2, 0)  # the recording's own key still replays it
        assert y.values() == [2, 4, 6, 8]
    finally:
        X._set_variant_mask(2**64 - 1)
    assert seg.info["collisions"] == 2
    assert tree.stats()["recordings"] == 1
    tree.check()


class ReturnsAView:
    """y = 2x + 1 and a view at an offset, as a dynamic-shape graph returns
    y[start:] or x[start:]: (y, y[start:]), or with of_input (x[start:], y),
    a view of the input that has the input's storage (its storage offset:
    x's plus start)."""

    def __init__(self, tree, start, of_input=False):
        self.tree, self.start, self.of_input = tree, start, of_input

    def __call__(self, x):
        y = affine(self.tree.stream, x, 2.0, 1.0)
        if self.of_input:
            return (x.narrow(self.start, x.n - self.start), y)
        return (y, y.narrow(self.start, x.n - self.start))


class ReturnsInputView:
    """(x[1:], 2x + 1, x[1:]): a view of the input for the user, an output of
    its own, and the same view again, which saved_from=2 makes a saved
    activation (AOTAutograd's custom_function_view: the view a custom
    autograd.Function returns of its input, handed to the user as the
    graph returned it)."""

    def __init__(self, tree, as_dtype=None):
        self.tree, self.as_dtype = tree, as_dtype  # as_dtype: the user's view is one as another dtype

    def __call__(self, x):
        y = affine(self.tree.stream, x, 2.0, 1.0)
        v = x.narrow(1, x.n - 1)
        if self.as_dtype:
            v.dtype = self.as_dtype
        return (v, y, x.narrow(1, x.n - 1))


@pytest.mark.parametrize("as_dtype", [None, "int32"], ids=["same_dtype", "as_another_dtype"])
@pytest.mark.parametrize("kind", [ARG_TENSOR, ARG_TENSOR_STATIC], ids=["dynamic", "static"])
def test_a_view_of_an_input_lies_in_the_callers_memory_as_the_plain_graphs_and_a_saved_one_in_the_copy(tree, kind,
                                                                                                      as_dtype):
    """A DYNAMIC input is copied into a placeholder, and the graph's view of
    it lies there. Under plain Inductor the view lies in the caller's
    tensor: a later write to the caller's tensor shows in it, and no step
    reuses it. So the view for the user is made over the caller's memory at
    the same place, at every call, and stays readable past its step. Over
    the placeholder it read a copy, silently, that the next call
    overwrote. With the input's dtype the view is the caller's tensor's
    own (as_strided: its storage); as another dtype, a tensor over the same
    memory that holds the caller's storage, as a view holds its base's (a
    STATIC input's view too, which lies in the caller's memory anyway). A
    saved activation of a DYNAMIC input keeps the copy the forward read."""
    seg = segment(tree, ReturnsInputView(tree, as_dtype), kinds=(kind,), spans=(16,), saved_from=2)
    kept = []
    for i in range(5):  # the plain first call, warmup, recording, replays
        x = FakeTensor(4).fill([i, i + 1, i + 2, i + 3])  # another address at each call: copied
        v, y, saved = call(seg, x)
        assert v.ptr == x.ptr + 4 and v.storage_offset_bytes == 4
        assert (v.storage is x.storage) == (as_dtype is None or i == 0), i  # the first call: the plain graph's
        assert y.values() == [2.0 * (i + j) + 1 for j in range(4)]
        x.fill([-10 * i - 1, -10 * i - 2, -10 * i - 3, -10 * i - 4])  # the caller writes its tensor after the call
        assert v.values() == [-10 * i - 2, -10 * i - 3, -10 * i - 4], "the view read a copy of the input"
        if i >= 1 and kind == ARG_TENSOR:  # the tree's runs: the saved view lies in the copy the graph read
            assert saved.values() == [i + 1, i + 2, i + 3] and saved.ptr != x.ptr + 4
        kept.append(v)
        del saved, x  # the caller drops its tensor: the view keeps its memory, as a view keeps its base's
    assert tree.stats()["replays"] + tree.stats()["recordings"] >= 3  # STATIC: a node per address
    gc.collect()
    others = [FakeTensor(4).fill([9, 9, 9, 9]) for _ in range(8)]  # would take any memory freed
    for i, v in enumerate(kept):  # past their steps: the callers' memory, readable
        assert v.values() == [-10 * i - 2, -10 * i - 3, -10 * i - 4], i
    del others
    tree.check()


class SavesWeightAsAnotherDtype:
    """(2x + 1, w as int32): a training forward that saves a view of its
    STATIC input w as another dtype (a bit reinterpretation of a weight)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, w):
        y = affine(self.tree.stream, x, 2.0, 1.0)
        v = w.narrow(0, w.n)
        v.dtype = "int32"
        return (y, v)


def test_a_saved_view_of_a_static_input_as_another_dtype_holds_no_step(tree):
    """A saved result that lies in a STATIC input's memory (here a view of
    it as another dtype: a tensor of its own over the caller's memory) is
    no memory of the tree's: no step reuses it, and its backward's
    argument loop passes it on as caller memory without ending a hold. It
    was counted a saved activation all the same, so one kept past its
    backward (a retained graph) held every step after it until the bound
    (a helper's review): each call a new node."""
    seg = segment(tree, SavesWeightAsAnotherDtype(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                  saved_from=1)
    x, w = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([5, 6, 7, 8])
    kept = []
    for i in range(6):
        step = tree.stats()["step"]
        y, saved = call(seg, x, w)
        if i >= 2:
            assert tree.stats()["step"] == step + 1, "a saved view of caller memory held the step"
            assert saved.ptr == w.ptr and tree.stats()["saved_activations_alive"] == 0
        assert y.values() == [3, 5, 7, 9]
        kept.append(saved)  # as a retained graph keeps it
    assert tree.stats()["steps_deferred"] == 0
    del kept, saved, y
    gc.collect()
    tree.check()


class ViewAndWeight:
    """(x[1:], 2x + 1) of a DYNAMIC x and a STATIC w the graph does not read:
    a new w at each call makes a new node each time, so that past the
    rerecord limit the tree runs the graph eagerly."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, w):
        y = affine(self.tree.stream, x, 2.0, 1.0)
        return (x.narrow(1, x.n - 1), y)


def test_an_eager_runs_view_of_a_dynamic_input_holds_the_callers_storage_and_is_never_stale():
    """An eager run of the tree (past its rerecord limit) reads a DYNAMIC
    input in the caller's own memory, so its view of it lies there: it
    must hold the caller's storage, as a view holds its base's, and no step
    reuses it. It held nothing, and read another tensor's data once the
    caller dropped its tensor (a helper's review found it)."""
    t = X.Tree(0, backend="sim", rerecord_limit=1)
    seg = segment(t, ViewAndWeight(t), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16))
    weights, kept = [], []
    for i in range(8):
        w = FakeTensor(4)
        weights.append(w)
        x = FakeTensor(4).fill([i, i + 1, i + 2, i + 3])
        v, y = call(seg, x, w)
        x.fill([-10 * i - 1, -10 * i - 2, -10 * i - 3, -10 * i - 4])
        kept.append(v)
        del x
        gc.collect()
        others = [FakeTensor(4).fill([9, 9, 9, 9]) for _ in range(4)]  # would take the memory x freed
        assert v.values() == [-10 * i - 2, -10 * i - 3, -10 * i - 4], i
        del others
    assert t.stats()["eager_runs"] >= 3
    for i, v in enumerate(kept):  # past their steps: the callers' memory, readable
        assert v.values() == [-10 * i - 2, -10 * i - 3, -10 * i - 4], i
    t.check()


class InputViewAndDouble:
    """(x[1:], 2x + 1): a view of its input handed to the user as the graph
    returned it; with as_dtype, a view as another dtype (the view a custom
    autograd.Function returns of its input, AOTAutograd's
    custom_function_view). Int arguments after x only key the variant (a
    shape, under dynamic shapes)."""

    def __init__(self, tree, as_dtype=None):
        self.tree, self.as_dtype = tree, as_dtype

    def __call__(self, x, *_variant):
        y = affine(self.tree.stream, x, 2.0, 1.0)
        v = x.narrow(1, x.n - 1)
        if self.as_dtype:
            v.dtype = self.as_dtype
        return (v, y)


@pytest.mark.parametrize("kind", [ARG_TENSOR, ARG_TENSOR_STATIC], ids=["dynamic", "static"])
def test_a_view_of_another_trees_output_shares_its_storage_and_goes_stale_with_it(kind):
    """Another thread's tree A makes y in its pool; this thread's tree M
    takes y as an input and returns a view of it. y's memory is A's, which
    A's next step reuses. The view is made as the plain graph's is, a view
    of y itself (as_strided): it shares y's storage, so A's mark on it at
    A's next step makes the view raise too, as y does. Made over y's memory
    as if it were M's caller's own, it was never marked and read A's next
    outputs silently (a helper's audit found it)."""
    A = X.Tree(0, backend="sim")
    M = X.Tree(0, backend="sim")
    seg_a = segment(A, Graph(A, 1.0, 0.0), spans=(16,), name="a")
    seg_m = segment(M, InputViewAndDouble(M), kinds=(kind,), spans=(16,), name="m")
    x = FakeTensor(4)
    raised = 0
    for i in range(6):
        x.fill([10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3])
        (y,) = call(seg_a, x)  # y = x: in tree A's pool, but at A's first (plain) call
        v, _ = call(seg_m, y)  # v = y[1:], under tree M
        want = [10 * i + 1, 10 * i + 2, 10 * i + 3]
        assert v.values() == want
        assert v.storage is y.storage  # a view of y, not a tensor of its own
        del y
        x.fill([-1, -2, -3, -4])
        (y2,) = call(seg_a, x)  # tree A's next step: y's memory is y2's now
        try:
            assert v.values() == want, i  # y was the plain graph's own tensor: nothing reused it
            assert i == 0
        except RuntimeError as e:
            assert "StaleTensorError" in str(e)
            raised += 1
        del y2
    assert raised == 5
    assert M.stats()["replays"] + M.stats()["recordings"] >= 3 and A.stats()["replays"] >= 2
    A.check()
    M.check()


@pytest.mark.parametrize("kind", [ARG_TENSOR, ARG_TENSOR_STATIC], ids=["dynamic", "static"])
def test_a_view_as_another_dtype_of_another_trees_output_runs_as_the_plain_graph_and_goes_stale_with_it(kind):
    """As test_a_view_of_another_trees_output_shares_its_storage_and_goes_stale_with_it,
    with M's view of A's output y as another dtype, which as_strided cannot
    make of y. Over a STATIC y it was a tensor of its own over A's memory,
    which A's next step reused and never marked: it read A's next outputs,
    silently (a limit docs/torch.md listed); over a DYNAMIC y it lay in M's
    copy, and missed the program's writes to y after the call. Such a call
    runs as the plain graph, whose view shares y's storage: it shows y's
    writes and raises once A's next step begins, as y does; so does the
    first call of a variant M has not run before (no template of its own
    yet says what it returns)."""
    A = X.Tree(0, backend="sim")
    M = X.Tree(0, backend="sim")
    seg_a = segment(A, Graph(A, 1.0, 0.0), spans=(16,), name="a")
    seg_m = segment(M, InputViewAndDouble(M, "int32"), kinds=(kind, ARG_INT), spans=(16, 0), name="m")
    x = FakeTensor(4)
    raised = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x.fill([10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3])
            (y,) = call(seg_a, x)  # y = x, in tree A's pool from A's second call on
            v, d = call(seg_m, y, int(i >= 3))  # v = y[1:] as int32, under tree M; a new variant at i = 3
            assert d.values() == [2.0 * (10 * i + j) + 1 for j in range(4)]
            assert v.values() == [10 * i + 1, 10 * i + 2, 10 * i + 3]
            assert v.storage is y.storage, i  # the plain graph's view of y
            y.fill([7, 7, 7, 7])  # the program writes y after the call: the view shows it
            assert v.values() == [7, 7, 7], i
            del y
            x.fill([-1, -2, -3, -4])
            (y2,) = call(seg_a, x)  # tree A's next step: y's memory is y2's now
            try:
                assert v.values() == [7, 7, 7], i  # y was the plain graph's own tensor: nothing reused it
                assert i == 0
            except RuntimeError as e:
                assert "StaleTensorError" in str(e)
                raised += 1
            del y2, v, d
    assert raised == 5
    assert A.stats()["replays"] >= 2
    assert seg_m.info["plain_calls"] >= 4, seg_m.info
    assert sum("another thread" in str(w.message) for w in caught) == 1
    A.check()
    M.check()


@pytest.mark.parametrize("rerun_first", [False, True], ids=["keeps_first", "reruns_first"])
@pytest.mark.parametrize("kind", [ARG_TENSOR, ARG_TENSOR_STATIC], ids=["dynamic", "static"])
def test_a_first_call_that_views_another_trees_output_as_another_dtype_keeps_its_plain_outputs(kind, rerun_first):
    """The segment's very first call already takes an output of A's pool. That
    call runs the plain graph, and its template is made from it; a graph
    that may run again (rerun_first: no input writes, no autograd, no
    random draws) then threw the plain outputs away and had the tree make
    them: the view of A's y as another dtype lay in A's memory (STATIC),
    unmarked, and read A's next outputs silently, or in M's copy (DYNAMIC)
    and missed the program's write (a helper's review). The plain outputs
    stand."""
    A = X.Tree(0, backend="sim")
    M = X.Tree(0, backend="sim")
    seg_a = segment(A, Graph(A, 1.0, 0.0), spans=(16,), name="a")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):  # A's outputs lie in its pool from here on
        call(seg_a, x)
    seg_m = segment(M, InputViewAndDouble(M, "int32"), kinds=(kind, ARG_INT), spans=(16, 0), name="m",
                    rerun_first=rerun_first)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(4):
            x.fill([10 * i, 10 * i + 1, 10 * i + 2, 10 * i + 3])
            (y,) = call(seg_a, x)
            v, _ = call(seg_m, y, 0)
            assert v.values() == [10 * i + 1, 10 * i + 2, 10 * i + 3] and v.storage is y.storage, i
            y.fill([7, 7, 7, 7])
            assert v.values() == [7, 7, 7], i
            del y
            x.fill([-1, -2, -3, -4])
            (y2,) = call(seg_a, x)  # A's next step
            with pytest.raises(RuntimeError, match="StaleTensorError"):
                v.values()
            del y2, v
    assert seg_m.info["plain_calls"] == 4, seg_m.info
    assert sum("another thread" in str(w.message) for w in caught) == 1
    A.check()
    M.check()


def test_an_output_that_is_a_view_at_an_offset_keeps_the_plain_graphs_storage_offset(tree):
    """AOTAutograd rebuilds an output that aliases an input or another
    output from its base with as_strided(size, stride, storage_offset())
    where the view's steps are symbolic (x[start:] with a dynamic start):
    each output cgtree makes must have the storage offset the plain graph's
    had. A tensor made with storage offset 0 gave x[0:] for x[start:],
    silently."""
    g = ReturnsAView(tree, 3)
    seg = X.Segment(tree, "view", g, lambda inputs: g(*inputs), alias, describe, span, bytes((ARG_TENSOR,)), (32,),
                    0, False, True)
    x = FakeTensor(8).fill([0, 1, 2, 3, 4, 5, 6, 7])
    for _ in range(4):  # the plain first call, warmup, recording, replay
        y, v = call(seg, x)
        assert v.storage_offset_bytes == 12, "the view's storage offset is lost"
        assert v.ptr == y.ptr + 12 and v.values() == [7, 9, 11, 13, 15]
        assert y.storage_offset_bytes == 0
    assert tree.stats()["replays"] >= 1
    tree.check()


def test_an_output_that_is_a_view_of_an_input_has_that_inputs_storage_offset_at_each_call(tree):
    """The input's own storage offset may change from call to call without
    a new variant (Dynamo does not specialise on it): a view of the input
    the graph returns has the input's storage offset of that call plus
    where it lies from the input's data, as the plain graph's view does.
    The recording's offset, replayed, gave AOTAutograd's as_strided the
    wrong place in the caller's storage (seen on an H200)."""
    g = ReturnsAView(tree, 2, of_input=True)
    seg = X.Segment(tree, "input_view", g, lambda inputs: g(*inputs), alias, describe, span, bytes((ARG_TENSOR,)),
                    (32,), 0, False, True)
    base = FakeTensor(20).fill(list(range(20)))
    for shift in (0, 0, 0, 0, 5, 3, 0, 5):
        x = base.narrow(shift, 8)
        v, y = call(seg, x)
        assert v.storage_offset_bytes == 4 * (shift + 2), (shift, v.storage_offset_bytes)
        assert y.values() == [2.0 * (shift + i) + 1 for i in range(8)] and y.storage_offset_bytes == 0
    assert tree.stats()["replays"] >= 3
    tree.check()


class BufAndItsTail:
    """An inference graph returning (buf[2:4], buf), buf = 2x, as Inductor
    returns a view of a buffer and the buffer (`y = 2 * x; return y[2:],
    y`): the first output lies above the second's data, so the second is
    tied below it, a tensor of its own over the same memory (another
    storage)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        buf = affine(self.tree.stream, x, 2.0, 0.0)
        return (buf.narrow(2, 2), buf)


def test_outputs_over_one_memory_on_two_storages_passed_to_the_call_that_ends_their_step_stay_views_of_one_another(
        tree):
    """tail, whole = f(x), with tail whole[2:] in eager (one storage);
    z = g(tail, whole) ends their step and moves both. cgtree made them two
    storages over one memory (a tie below the earlier output), and the
    mover, grouping by storage, put them on two copies: a write in place to
    `whole` after it was lost to `tail`, where eager reads it, silently (a
    helper's review). Both go to the mover in one call, which groups
    storages over one memory (test_torch_graphs.py tests the real mover)."""
    f = segment(tree, BufAndItsTail(tree), spans=(16,), name="f")
    g = segment(tree, AddTwo(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(8, 16), name="g")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    apart = 0
    for i in range(4):  # warmed up, recorded, replaying
        tail, whole = call(f, x)
        assert tail.values() == [6, 8] and whole.values() == [2, 4, 6, 8]
        apart += tail.storage is not whole.storage  # from the pool: tied apart
        (z,) = call(g, tail, whole)  # a new call: the step of tail and whole ends here, and both move
        assert z.values() == [8, 12]
        whole.fill([0, 0, 0, 0])  # eager: whole.zero_(), which tail, a view of whole, reads
        assert tail.values() == [0, 0], "tail no longer shares whole's memory (iteration %d)" % i
        del tail, whole, z
        gc.collect()
    assert apart >= 2


def test_a_grad_a_compiled_gradient_hook_returned_moves_past_its_step_as_a_backwards_output_does(tree):
    """p.register_hook(lambda g: compiled_clip(g)): autograd runs the hook
    inside the backward, and the compiled call's output (an inference
    graph's, no backward's) is what AccumulateGrad takes over as .grad.
    Kept into the next step (micro-batches, no zero_grad), it was marked,
    not moved: a step's end moved only a backward's outputs, and the next
    accumulation raised StaleTensorError where Inductor computes (a helper's
    review). An inference graph's outputs made inside a backward count as
    a backward's now."""
    fw, bw, w, x, t = param_training_pair(tree)
    hook = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,), name="hook")  # the compiled hook: g * 1
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    try:
        for _ in range(3):  # the hook warmed up and recorded
            call(hook, FakeTensor(4).fill([0, 0, 0, 0]))
        w.grad = None
        for i in range(3):  # micro-batches: no zero_grad between them
            out, saved = call(fw, x, w)
            task[0] = 7  # autograd runs the backward
            (g,) = bw(saved, t)  # [2, 3, 4, 5]
            Generation.generation += 1  # the hook's compiled call: Dynamo enters a frame
            (h,) = hook(g)  # inside the backward: the call goes on in the step
            del g
            w.accumulate(h)  # AccumulateGrad takes the hook's result over (the first time), then adds
            del h, out, saved
            task[0] = -1
            gc.collect()
            assert w.grad.values() == [2 * (i + 1), 3 * (i + 1), 4 * (i + 1), 5 * (i + 1)], i
        assert tree.stats()["gradients_moved"] >= 1
    finally:
        X.set_graph_task_id(None)



def test_an_evaluation_batch_at_the_address_of_a_grad_freed_after_the_backward_begins_a_step_as_usual(tree):
    """zero_grad(set_to_none=False) through training, then after the last
    step's backward and its gradient norm (a reader of the kept .grad, which
    goes on in the step), zero_grad(set_to_none=True) frees the kept .grad,
    and the evaluation's batch lands in its memory. The batch is no leaf's
    .grad: the evaluation's compiled calls begin steps as any inference
    loop's. The .grad addresses read for the norm were kept for the rest of
    the backward's step (keyed by the step and the backwards called only),
    so each evaluation call was taken for a reader of the kept .grad: the
    step was held, a node per call, up to the bound of 1024 and its
    warning."""
    fw, bw, w, x, t = param_training_pair(tree)
    norm = optimizer_segment(tree)  # reads w.grad: the gradient norm for the log
    evaluate = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="eval")  # the model in eval mode
    x_eval = FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(3):
        call(evaluate, x_eval)  # recorded and replaying before training goes on
    w.grad = None
    for i in range(3):
        if w.grad is not None:
            w.grad.fill([0, 0, 0, 0])  # zero_grad(set_to_none=False)
        out, saved = call(fw, x, w)  # out: the loss the loop logs
        (g,) = bw(saved, t)
        w.accumulate(g)
        del saved, g
        gc.collect()
        step = tree.stats()["step"]
        call(norm, w, w.grad)
        assert tree.stats()["step"] == step and out.values() == [1, 2, 3, 4], "iteration %d" % i
    assert tree.stats()["gradients_moved"] >= 1  # .grad is memory of its own, kept across steps
    gc.collect()
    freed = w.grad.ptr
    w.grad = None  # zero_grad(set_to_none=True) after the last step: the kept .grad's memory is freed at once
    batch = FakeTensor(4).fill([1, 2, 3, 4])  # the evaluation's batch, allocated next
    assert batch.ptr == freed  # the front cache hands the freed block to the next allocation of its size
    s0 = tree.stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k in range(20):
            (y,) = call(evaluate, batch)
            assert y.values() == [2, 4, 6, 8]
            del y
            assert tree.stats()["step"] == s0["step"] + 1 + k, "evaluation call %d" % k  # a step each, as usual
    s = tree.stats()
    assert s["steps_kept_after_backward"] == s0["steps_kept_after_backward"]
    assert s["nodes"] - s0["nodes"] <= 2
    tree.check()


def test_a_worker_trees_norm_of_a_kept_grad_after_its_backward_keeps_its_logged_loss_readable():
    """The main thread's model notes its parameter on its tree; a worker
    thread computes a compiled loss of the model's output (a loss that
    takes no parameter: its tree notes no leaf), calls backward, and logs
    the gradient's norm through a compiled call of its own before it reads
    the loss. Once everything replays, zero_grad(set_to_none=False): .grad
    is memory of its own (moved out of the worker's pool at its step's
    end), a kept .grad, read after the backward as in the single-tree case
    (test_calls_after_the_backward_that_read_a_kept_grad_go_on_in_its_step_
    as_those_that_read_a_pool_one): the norm goes on in the worker's step
    and the worker's logged loss stays readable. A tree that noted no leaf
    asked no leaf's .grad: the norm began a step and the loss raised
    StaleTensorError where Inductor computes."""
    X.set_output_mover(fake_move_out)
    main, worker, fw, loss, loss_bw, bw = model_and_a_workers_loss()
    norm = optimizer_segment(worker)  # the worker's gradient norm for the log: reads w.grad
    w, x, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no bound is reached
        for i in range(8):
            if i < 4:
                w.grad = None  # zero_grad() until everything replays
            else:
                w.grad.fill([0, 0, 0, 0])  # then zero_grad(set_to_none=False): .grad is kept
            out, saved = call(fw, x, w)  # the main thread
            out.requires_grad, out.is_leaf = True, False
            lout, lsaved = call(loss, out)  # the worker's compiled loss: lout, the loss it logs
            logged = lout.values()
            (gl,) = loss_bw(lsaved, t)  # loss.backward() on the worker
            (g,) = bw(saved, gl)  # the model's backward, on the worker's tree
            w.accumulate(g)
            del out, saved, lsaved, gl, g
            gc.collect()
            step = worker.stats()["step"]
            (n,) = call(norm, w, w.grad)
            assert n.values() == w.grad.values(), "iteration %d" % i  # w stays 0: the norm reads .grad
            if i >= 2:  # the loss recorded: its outputs are the pool's (from 4 on, .grad is kept)
                assert lout.values() == logged, "iteration %d" % i  # readable after the norm, as under Inductor
                assert worker.stats()["step"] == step, "iteration %d" % i
            del n
    assert worker.stats()["gradients_moved"] >= 1  # .grad was moved out of the worker's pool: a kept .grad
    assert worker.stats()["gradient_leaves"] == 0  # the case's condition: the worker's tree noted no leaf
    del lout
    gc.collect()
    main.check()
    worker.check()


def test_a_worker_heads_backward_of_another_id_leaves_the_main_trees_watch_of_a_checkpointed_blocks_output():
    """The main thread runs a trunk (AOTAutograd id 10) that saves its
    output (a tied saved result, holding the main tree's step until the
    trunk's backward), and a checkpointed compiled block B whose output h,
    alive and requiring grad, holds the step until a backward (no saved
    activation of B lives). A worker thread trains a head (id 20) on the
    trunk's output; the head's backward runs on the worker's tree and reads
    the trunk's memory. It is no backward of the trunk's (its tied hold
    stays) nor of B's, yet the main tree heard it as a backward of its own
    before the id was looked at: B's watch of h ended. The trunk's graph is
    then dropped (its memory dies, ending the tied hold), and the main
    thread's next compiled call, a log that does not take h, began a step
    that marked h: h raised StaleTensorError where Inductor computes. (On
    one tree the head's backward call ends h's watch too, as any backward
    call does: the same call raises there at this code.)"""
    X.set_output_mover(fake_move_out)
    main, worker = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
    trunk, _ = paired(main, TiedForward(main), "trunk", 10)
    block = segment(main, ForwardGraph(main), spans=(16,), name="block", saved_from=1, pair=30)
    log = segment(main, Graph(main, 1.0, 1.0), spans=(16,), name="log")
    head_bw = segment(worker, BackwardGraph(worker), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="head_bw",
                      backward=True, pair=20)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(5):
        o, s = call(trunk, x)
        kept = s.view()  # autograd's saved tensor of the trunk: its tied hold
        on_worker = s.view()  # the head's saved input, on the worker: the trunk's memory
        del o, s
        h, sb = call(block, x)
        h.requires_grad = True  # autograd's Function marks the output
        del sb  # checkpointing keeps none of B's saved tensors
        gc.collect()
        (gh,) = head_bw(on_worker, t)  # the worker's head's backward (id 20)
        del on_worker, gh
        del kept  # the trunk's graph dropped: its memory dies, and its tied hold with it
        gc.collect()
        step = main.stats()["step"]
        (y,) = call(log, x)  # a compiled call that does not take h, before B's backward
        if i:  # the first calls run as the plain graphs: their outputs are not the tree's
            assert h.values() == [2, 4, 6, 8], "iteration %d" % i  # B's backward (its recompute) is to come
            assert main.stats()["step"] == step, "iteration %d" % i
        del h, y
        gc.collect()
    main.check()
    worker.check()


def test_an_output_made_inside_a_backward_that_is_no_gradient_lets_the_next_forward_that_reads_it_begin_its_step(tree):
    """A compiled call inside a backward that makes no gradient:
    checkpointing's recompute calls a compiled helper of inputs that need
    no grad (a mask, rotary tables: an inference graph), and the model
    keeps its result for the next forward (a cache). Its outputs, counted
    as gradients of the step, made the next forward that reads it a reader
    of the step's gradients: it went on in the backward's step instead of
    beginning one, every iteration, a node per call up to the bound (a
    review). Such an output counts only where it is a leaf's .grad (a
    gradient hook's): the forward begins its step and moves the cached
    tensor, as any output passed to the call that ends its step."""
    fw, bw, w, x, t = param_training_pair(tree)
    mk = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,), name="mask")
    for _ in range(3):  # recorded and replaying
        call(mk, x)
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    try:
        (m,) = call(mk, x)  # the first forward's cache
        n0 = tree.stats()["nodes"]
        began = []
        for i in range(30):
            w.grad = None
            step = tree.stats()["step"]
            out, saved = call(fw, m, w)  # the forward reads the cached tensor
            began.append(tree.stats()["step"] == step + 1)
            task[0] = 7  # autograd runs the backward
            (g,) = bw(saved, t)
            Generation.generation += 1  # the recompute's compiled helper
            (m,) = mk(x)  # inside the backward: no gradient, kept for the next forward
            w.accumulate(g)
            task[0] = -1
            del g, saved, out
            gc.collect()
        s = tree.stats()
        assert all(began[1:]), "forwards that began no step: %s; nodes %d -> %d, steps kept after a backward %d" % (
            [i for i, b in enumerate(began) if not b], n0, s["nodes"], s["steps_kept_after_backward"])
        assert s["nodes"] - n0 <= 4
    finally:
        X.set_graph_task_id(None)


def test_compiled_gradient_hooks_past_1024_in_one_backward_go_on_reading_the_steps_gradients(tree):
    """A model of more than 1024 parameters, each with a compiled gradient
    hook (p.register_hook(compiled_clip)): one backward makes more than
    1024 compiled calls, each reading a gradient of the step. Past the
    bound of calls inside a backward they go on in the step as readers of
    its gradients (bounded by their own count); forced there, a step began
    inside the backward at the 1025th hook, and the gradients autograd
    still passed on raised StaleTensorError (a review)."""
    fw, bw, w, x, t = param_training_pair(tree)
    hook = segment(tree, Graph(tree, 1.0, 0.0), spans=(16,), name="hook")
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    try:
        for _ in range(3):
            call(hook, FakeTensor(4).fill([0, 0, 0, 0]))
        w.grad = None
        out, saved = call(fw, x, w)
        task[0] = 7
        (g,) = bw(saved, t)  # the first parameters' gradient
        (g2,) = bw(saved, t)  # the last parameter's, passed on by autograd to its hook after the others
        del saved
        gc.collect()
        s0 = tree.stats()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for i in range(1100):  # one compiled hook per parameter
                Generation.generation += 1
                (h,) = hook(g)
                assert h.values() == [2, 3, 4, 5], i
                del h
        Generation.generation += 1
        (h,) = hook(g2)  # the last hook: its gradient was marked by the step begun inside the backward
        assert h.values() == [2, 3, 4, 5]
        assert tree.stats()["step"] == s0["step"]
        task[0] = -1
        del out, g, g2, h
    finally:
        X.set_graph_task_id(None)


def test_another_threads_tree_that_reads_an_output_is_waited_for_before_the_owning_tree_overwrites_it():
    """Thread A (tree A, caller stream sA) hands y = enc(x) to thread B,
    whose z = dec(y) runs on its own tree from its own stream sB while y
    lives (under plain Inductor y's block is not reused while alive). Tree
    B reads y on tree B's stream (its copy into a placeholder, or its
    recording), or on sB where dec runs plainly. Then A's next step replays
    enc over y's memory on tree A's stream. Before the fix that stream
    waited for sA and the streams noted on tree A only: nothing ordered the
    replay after B's read, so dec could read enc's next output, silently
    (a review; no stream wait was made). Now a read of another tree's
    output notes its stream on the owning tree, whose next step's launch
    waits for it once."""
    def explicit_tree():
        t = X.Tree(0, backend="sim")
        t.explicit_steps = True
        return t

    ta, tb = explicit_tree(), explicit_tree()
    enc = segment(ta, Graph(ta, 2.0, 1.0), spans=(16,), name="enc")
    decoders = {"replayed": segment(tb, Graph(tb, 1.0, 0.0), spans=(16,), name="dec"),
                "plain": segment(tb, Graph(tb, 1.0, 0.0), spans=(16,), name="dec_plain",
                                 plain_reason="decided at compile time")}
    sA, sB = 0x5a1, 0x5b1
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for how, dec in decoders.items():
        for _ in range(4):  # both replay from here on
            ta.step_begin()
            with caller_stream(sA):
                (y,) = enc(x)
            tb.step_begin()
            with caller_stream(sB):
                (z,) = dec(y)
            del y, z
            gc.collect()
        ta.step_begin()
        with caller_stream(sA):
            (y,) = enc(x)
        y_ptr = y.ptr
        tb.step_begin()
        with caller_stream(sB):
            (z,) = dec(y)  # B's read of y: on tree B's stream, or on sB for the plain graph
        assert z.values() == [3, 5, 7, 9], how
        w0 = X.alloc_figures()["pool_reader_waits"]
        ta.step_begin()
        with caller_stream(sA):
            (y2,) = enc(x)  # A's next step: replays into y's memory while B still holds y
        assert y2.ptr == y_ptr, "the replay writes where y lies"
        w1 = X.alloc_figures()["pool_reader_waits"]
        assert w1 == w0 + 1, "%s: tree A overwrote y without waiting for the stream that read it" % how
        del y, y2, z
        gc.collect()
        ta.step_begin()
        with caller_stream(sA):
            (y3,) = enc(x)  # nothing of B read y2: no wait
        assert X.alloc_figures()["pool_reader_waits"] == w1, how
        del y3
        gc.collect()
    ta.check()
    tb.check()


def test_an_empty_output_kept_past_its_step_is_no_stale_data_and_need_not_raise(tree):
    """A graph that returns an empty tensor beside its result (an empty KV
    cache of length 0, an empty aux output). The empty output has no data a
    later step could overwrite (its value is one byte of pool nothing reads),
    yet it was watched and marked at its step's end like any output: kept past
    its step, passing it back to the compiled graph raised StaleTensorError,
    and so did every PyTorch op that asks for its data_ptr (torch.cat([old_empty,
    x]), .sum()), where plain Inductor computes. Now it is never marked, never
    refused, and counted in no step's live or overwritable outputs."""
    class WithEmpty:
        def __call__(self, x, e):
            out = FakeTensor(x.n)
            X.sim_launch(tree.stream, k_affine, out.ptr, x.ptr, x.n, 2.0, 0.0)
            return (out, FakeTensor(0, ptr=0))

    seg = segment(tree, WithEmpty(), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 0), name="empty")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    e0 = FakeTensor(0, ptr=0)
    for _ in range(3):
        out, e = call(seg, x, e0)
    n_marks, before = len(marks), tree.stats()
    out, e = call(seg, x, e0)  # the empty output e of this step ...
    out2, e2 = call(seg, x, e0)  # ... lives on into the next step, which marks out
    marked = {key for key, _ in marks[n_marks:]}
    assert out.untyped_storage()._cdata in marked, "the non-empty output kept past its step is marked"
    assert e.untyped_storage()._cdata not in marked
    assert e.values() == []  # an eager op reading it (torch.cat, .sum()) does not raise
    out3, e3 = call(seg, x, e)  # the cache handed to the next step, as under Inductor
    assert out3.values() == [2, 4, 6, 8] and e3.values() == []
    after = tree.stats()
    assert after["stale_refused"] == before["stale_refused"]
    # three steps ended, each with one non-empty output alive (the loop's last out, out, out2), never an empty one
    assert after["outputs_overwritable"] - before["outputs_overwritable"] == 3
    del out, e, out2, e2, out3, e3
    gc.collect()


def test_an_empty_view_of_an_output_is_tied_at_its_place_in_it_and_shares_its_mark(tree):
    """A graph that returns y and an empty view of y at an offset (y[2:2]:
    a KV cache sliced to length 0). The view is tied to y, over y's storage,
    so it shares y's stale mark. Its value was one byte of pool of its own,
    and the view was placed by that byte: anywhere in y's storage or past it
    (no bounds are checked for no element), where its storage offset was not
    the plain graph's and a lookup by address could take it for another
    output. Now it lies where the plain graph's did, and y's mark reaches it."""
    class WithEmptyView:
        def __call__(self, x):
            out = FakeTensor(x.n)
            X.sim_launch(tree.stream, k_affine, out.ptr, x.ptr, x.n, 2.0, 0.0)
            return (out, out.narrow(2, 0))

    seg = segment(tree, WithEmptyView(), spans=(16,), name="empty_view")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):
        call(seg, x)
    y, v = call(seg, x)
    assert v.untyped_storage() is y.untyped_storage()
    assert v.storage_offset() - y.storage_offset() == 2 and v.ptr == y.ptr + 8
    n_marks = len(marks)
    call(seg, x)  # the next step marks y's storage, and so v's
    assert y.untyped_storage()._cdata in {key for key, _ in marks[n_marks:]}
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        v.data_ptr()
    del y, v
    gc.collect()


class EmptySavedForward:
    """A training forward (saved_from=1) whose output is empty (a batch of
    no rows, an expert that got no token) and that also saves that output
    (a sigmoid's): the same object at positions 0 and 1."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x):
        e = FakeTensor(0, ptr=0)
        return (e, e)


class TangentCopy:
    """Its backward: grad = tangent (it reads the saved empty tensor, nothing of it)."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, saved, t):
        out = FakeTensor(t.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, t.ptr, t.n, 1.0, 0.0)
        return (out,)


def test_a_forward_that_saves_its_empty_output_holds_no_step_past_its_backward(tree):
    """The empty output a forward also saves was held for the backward as
    any output tied to a saved result is, but an empty record lies on no
    step's list, so no backward read could end that hold: while the loop
    kept `out` bound, every later step was put off (a review: 38 of 40
    deferred, no replay). An empty output holds nothing a step could
    overwrite, so it holds no step."""
    f = segment(tree, EmptySavedForward(tree), spans=(16,), name="empty_sigmoid", saved_from=1)
    g = segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="nonempty_forward", saved_from=1)
    b = segment(tree, TangentCopy(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(0, 16), name="bw", backward=True)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    s0 = tree.stats()
    for _ in range(40):
        out, saved = call(f, x)  # `out` stays bound into the next iteration's call
        (h,) = g(x)
        (gx,) = b(saved, t)
        assert gx.values() == [1, 1, 1, 1]
        del saved, gx
        gc.collect()
        assert tree.stats()["saved_tied_to_outputs_alive"] == 0
    tree.check()
    s = tree.stats()
    assert s["step"] - s0["step"] >= 39 and s["steps_deferred"] == s0["steps_deferred"] and s["replays"] > 0, s
    del out, h
    gc.collect()


class ReadingGraph(Graph):
    """Graph(1, 0) (z = y) that, while `block` is set, first tells `started`
    and lets the GIL go until `go`, as a warmup, a recording or a plain
    graph runs Python between the call's note of y and its read of y;
    `order` gets "B read" once it read."""

    def __init__(self, tree, stream, order):
        super().__init__(tree, 1.0, 0.0, stream=stream)
        self.block, self.order, self.pause = False, order, 0.2
        self.started, self.go = threading.Event(), threading.Event()

    def __call__(self, y, *rest):
        if self.block:
            self.started.set()
            self.go.wait(5)
            import time

            time.sleep(self.pause)  # the owner's step ends here, unless it waits for this call
        out = super().__call__(y, *rest)
        self.order.append("B read")
        return out


def handed_output(trees, enc, x):
    """The calling thread's tree in explicit steps: enc(x) called until it
    replays, then once more in a new step; that output y in a list, from
    which the thread that reads it takes it (and the test drops it)."""
    trees(0).explicit_steps = True
    for _ in range(3):  # enc replays from here on
        trees(0).step_begin()
        (y,) = enc(x)
        del y
    trees(0).step_begin()
    return list(enc(x))


def reader_thread(trees, work, errors):
    """A started thread, B, that runs work() on a tree of its own in
    explicit steps; what it raises goes to errors."""
    def run():
        try:
            trees(0).explicit_steps = True
            work()
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(repr(e))

    th = threading.Thread(target=run)
    th.start()
    return th


def b_reading_y(tree, trees, order):
    """Thread A, the caller, hands y = enc(x) = [3, 5, 7, 9] to thread B,
    whose dec(y) (a ReadingGraph, blocked) has noted its read of y and
    waits for `reading.go` before it reads: enc, x, handed ([y]), got
    (B's results), errors (B's), th (B's thread) and reading, as names."""
    stream = lambda: trees(0).stream  # noqa: E731 - each thread's own tree's
    r = types.SimpleNamespace(got=[], errors=[])
    r.enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
    r.reading = ReadingGraph(tree, stream, order)
    dec = segment(tree, r.reading, spans=(16,), name="dec")
    r.x = FakeTensor(4).fill([1, 2, 3, 4])
    r.handed = handed_output(trees, r.enc, r.x)

    def b():
        r.reading.block = True
        (z,) = dec(r.handed[0])
        r.got.append(z.values())

    r.th = reader_thread(trees, b, r.errors)
    assert r.reading.started.wait(5)
    return r


def test_a_step_ends_only_once_another_threads_call_that_reads_its_output_returned(tree):
    """Thread A hands y = enc(x) to thread B, whose dec(y) notes its read
    of y, then runs Python before it reads (its first call runs the plain
    graph; a warmup, a recording and a random graph's lock let the GIL go
    there too). A's next step ends meanwhile, and its replay writes y's
    memory. Before the fix that replay waited for the streams B's call had
    queued on so far, which held no read of y yet: B read A's next output,
    silently (z = [21, 41, 61, 81]; on a GPU a recording's copy reads by
    address). Now A's step ends only once B's call returned; a later step,
    with no such call in flight, waits for nothing."""
    trees, order = ThreadTrees(), []
    X.set_tree_getter(trees)
    try:
        r = b_reading_y(tree, trees, order)  # the main thread is A
        enc, x, handed, got, errors, th, reading = r.enc, r.x, r.handed, r.got, r.errors, r.th, r.reading
        y_ptr = handed[0].ptr
        w0 = X.alloc_figures()["pool_reader_waits_for_calls"]
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        reading.go.set()
        (y2,) = enc(x)  # A's next step: its end waits for B's call, then the replay writes y's memory
        order.append("A replayed")
        th.join(10)
        assert not th.is_alive() and errors == []
        assert y2.ptr == y_ptr, "the replay writes where y lies"
        assert got == [[3, 5, 7, 9]], "B's dec read A's next output"
        assert order == ["B read", "A replayed"]
        assert X.alloc_figures()["pool_reader_waits_for_calls"] == w0 + 1
        del handed[:], y2
        gc.collect()
        trees(0).step_begin()
        (y3,) = enc(x)  # nothing in flight: no wait
        assert y3.values() == [21, 41, 61, 81]
        assert X.alloc_figures()["pool_reader_waits_for_calls"] == w0 + 1
        del y3
        for t in trees.made:
            t.check()
    finally:
        X.set_tree_getter(None)


def runtime_warnings(seen):
    """The texts of the RuntimeWarnings among warnings recorded."""
    return [str(m.message) for m in seen if issubclass(m.category, RuntimeWarning)]


@pytest.mark.parametrize("filtered", ["shown", "as_an_error"])
def test_a_step_end_that_waits_long_for_another_threads_read_warns_naming_that_thread(tree, filtered):
    """A step's end waits for another thread's call that reads its output,
    and that call may wait in turn for something the waiting thread is to
    do after its step (a hang, where before the wait the reader read the
    wrong data). A wait past the bound (set_read_wait_warning; 10 s unless
    CGTREE_TORCH_READ_WAIT_WARN_SECONDS says) warns once, naming the reading
    thread by threading.get_ident(), and goes on waiting: B's read is still
    the output it was handed. Where the program's filter makes warnings
    errors, A's call raises it before its step ended, its graph stays a
    segment, and called again once B returned it replays A's next output."""
    trees, order = ThreadTrees(), []
    X.set_tree_getter(trees)
    before = X.set_read_wait_warning(0.05)  # B's read holds A's end 0.2 s
    try:
        r = b_reading_y(tree, trees, order)
        enc, x, handed, got, errors, th, reading = r.enc, r.x, r.handed, r.got, r.errors, r.th, r.reading
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        reading.go.set()
        replays = trees(0).stats()["replays"]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("error" if filtered == "as_an_error" else "always")
            if filtered == "as_an_error":
                with pytest.raises(RuntimeWarning, match="thread %d " % th.ident):
                    enc(x)
            else:
                (y2,) = enc(x)
        order.append("A went on")
        th.join(10)
        assert not th.is_alive() and errors == []
        assert got == [[3, 5, 7, 9]], "B's dec read A's next output"
        assert order == (["A went on", "B read"] if filtered == "as_an_error" else ["B read", "A went on"])
        if filtered == "as_an_error":
            assert seen == []
            (y2,) = enc(x)  # B returned: the step ends now, and the graph replays
        else:
            texts = runtime_warnings(seen)
            assert len(texts) == 1, texts
            assert "thread %d " % th.ident in texts[0] and "waited 0.05 s" in texts[0]
            assert "clone the output" in texts[0]
        assert y2.values() == [21, 41, 61, 81]
        assert trees(0).stats()["replays"] == replays + 1
        del handed[:], y2
        for t in trees.made:
            t.check()
    finally:
        X.set_read_wait_warning(before)
        X.set_tree_getter(None)


def test_a_step_a_bound_forces_that_a_read_wait_refuses_is_neither_counted_nor_warned_of_until_it_begins(tree):
    """After a backward, 1024 calls that read .grad hold the step (its
    optimizer); the next forces a step, counted in optimizer_steps_forced,
    with a warning once. Here thread B reads the step's loss when it comes,
    and the read wait's warning, made an error, refuses the step's begin:
    the call raises and the step goes on. That refused begin was counted
    and warned of ("a step begins now") though none began, and the retry
    that began one counted again and said nothing (a review). Now both
    come once, with the step that begins."""
    trees, order = ThreadTrees(), []
    trees.local.tree = tree  # the main thread, A, trains on the fixture's tree
    X.set_tree_getter(trees)
    before = X.set_read_wait_warning(0.05)
    try:
        fw, bw, w, x, t = param_training_pair(tree)
        opt = optimizer_segment(tree)
        w.grad = None
        out, saved = call(fw, x, w)  # out: the loss B reads
        (g,) = bw(saved, t)
        w.accumulate(g)
        del saved, g
        for _ in range(1024):
            (n,) = call(opt, w, w.grad)
            del n
        reading = ReadingGraph(tree, lambda: trees(0).stream, order)
        dec = segment(tree, reading, spans=(16,), name="dec")
        got, errors = [], []

        def b():
            reading.block = True
            (z,) = dec(out)
            got.append(z.values())

        th = reader_thread(trees, b, errors)
        assert reading.started.wait(5)
        s0 = tree.stats()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            warnings.filterwarnings("error", message=".*has waited")
            with pytest.raises(RuntimeWarning, match="thread %d " % th.ident):
                call(opt, w, w.grad)  # the 1025th: its step's end waits for B, and the wait's warning raises
        s1 = tree.stats()
        assert runtime_warnings(seen) == [], "warned of a step that did not begin"
        assert s1["optimizer_steps_forced"] == s0["optimizer_steps_forced"] and s1["step"] == s0["step"]
        reading.go.set()
        th.join(10)
        assert not th.is_alive() and errors == [] and got == [[1, 2, 3, 4]]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            (last,) = call(opt, w, w.grad)  # B returned: the step begins now
        texts = runtime_warnings(seen)
        assert len(texts) == 1 and "taken for the step's optimizer" in texts[0], texts
        s2 = tree.stats()
        assert s2["optimizer_steps_forced"] == s0["optimizer_steps_forced"] + 1 and s2["step"] == s0["step"] + 1
        assert last.values() == [2, 3, 4, 5] and w.grad.values() == [2, 3, 4, 5]
        with pytest.raises(RuntimeError, match="StaleTensorError"):
            out.values()  # the step ended: marked, never read wrong
        del last
        for t in trees.made:
            t.check()
        tree.check()
    finally:
        X.set_read_wait_warning(before)
        X.set_tree_getter(None)


def spanned_dec(tree, stream, span_fn):
    """dec(y, w) = (y,) with span_fn as its dynamic span function (y of 4
    floats, w of 8), and w; its first call (plain) made on the calling
    thread's tree, so that its outputs are known."""
    g = Graph(tree, 1.0, 0.0, stream=stream)
    dec = X.Segment(tree, "dec", g, lambda inputs: g(*inputs), alias, describe, span_fn,
                    bytes((ARG_TENSOR, ARG_TENSOR)), (16, 32), 0, True)
    w = FakeTensor(8).fill([0] * 8)
    out = dec(FakeTensor(4).fill([0] * 4), w)
    del out
    return dec, w


def replays_here(trees, dec, w):
    """dec called on the calling thread's tree until it replays (its copy
    reads its input by address), then a new step begun."""
    for _ in range(4):
        trees(0).step_begin()
        (z,) = dec(FakeTensor(4).fill([0] * 4), w)
        del z
    trees(0).step_begin()


def step_end_on_cue(trees, enc_c, ev, errors):
    """A started thread, C, on a tree of its own in explicit steps, whose
    step holds an output; its step ends once ev["c_go"] is set (a step's
    end that crosses another thread's look-up), and ev["c_done"] is set
    after. What it raises goes to errors."""
    def c():
        try:
            trees(0).explicit_steps = True
            xc = FakeTensor(4).fill([1, 1, 1, 1])
            for _ in range(3):
                trees(0).step_begin()
                (kept,) = enc_c(xc)  # alive: C's step has an output to take at its end
            assert ev["c_go"].wait(10)
            trees(0).step_begin()
            (kept,) = enc_c(xc)  # C's step ends
            del kept
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append("C: " + repr(e))
        finally:
            ev["c_done"].set()

    t = threading.Thread(target=c)
    t.start()
    return t


class CrossedLookUp:
    """Thread B's look-up of y (4 floats) in spanned_dec's dec(y, w),
    crossed by thread C's step end (step_end_on_cue): once armed, y's span
    function cues C's end and waits for it, so the look-up settles and
    reads y's pointer again through data_ptr of `ptr_class` (the class to
    give y), which runs on_reread(p) first; w's span function then runs
    on_w(), y's read in flight. Both run once per arm(), on threads other
    than the main one."""

    def __init__(self, ev, on_reread, on_w):
        self.ev, self.armed = ev, {"y": False, "w": False, "reread": False}
        crossed = self

        class SlowPtr(FakeTensor):
            def data_ptr(self):
                p = super().data_ptr()
                if crossed.armed["reread"] and threading.current_thread() is not threading.main_thread():
                    crossed.armed["reread"] = False
                    on_reread(p)
                return p

        self.ptr_class, self.on_w = SlowPtr, on_w

    def arm(self):
        self.armed["y"] = self.armed["w"] = True

    def span(self, t):
        if threading.current_thread() is not threading.main_thread():
            if self.armed["y"] and t.n == 4:  # y's pointer is read: C's step ends, and the look-up settles
                self.armed["y"] = False
                self.ev["c_go"].set()
                assert self.ev["c_done"].wait(5)
                self.armed["reread"] = True
            elif self.armed["w"] and t.n == 8:
                self.armed["w"] = False
                self.on_w()
        return t.nbytes


def test_a_step_end_that_first_waits_for_a_settling_look_up_still_warns_of_a_long_read_after_it(tree):
    """A's step end waits first for B's settling look-up alone (C's end
    crossed it) past the bound, then for B's read of y that the look-up
    began, past the bound again. The first timeout spent the warning (a
    sixth review): the wait went on without a bound, and a reader's hang
    after it would have been silent. The bound now starts again there, so
    the long read warns, naming B."""
    import time

    trees = ThreadTrees()
    X.set_tree_getter(trees)
    ev = {k: threading.Event() for k in ("b_settling", "c_go", "c_done")}
    w0 = [0]

    def settles_long(p):  # B's look-up settles: A's end waits for it alone, past the bound
        ev["b_settling"].set()
        for _ in range(500):
            if X.alloc_figures()["pool_reader_waits_for_calls"] > w0[0]:
                break
            time.sleep(0.01)
        time.sleep(0.15)

    crossed = CrossedLookUp(ev, settles_long, lambda: time.sleep(0.15))  # w: y's read in flight past it again

    before = X.set_read_wait_warning(0.05)
    try:
        stream = lambda: trees(0).stream  # noqa: E731 - each thread's own tree's
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        enc_c = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="enc_c")
        dec, w = spanned_dec(tree, stream, crossed.span)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # y = [3, 5, 7, 9]: the main thread is A
        handed[0].__class__ = crossed.ptr_class
        got, errors = [], []

        def b():
            replays_here(trees, dec, w)
            w0[0] = X.alloc_figures()["pool_reader_waits_for_calls"]
            crossed.arm()
            (z,) = dec(handed[0], w)
            got.append(z.values())

        tc = step_end_on_cue(trees, enc_c, ev, errors)  # its end crosses B's look-up of y
        th = reader_thread(trees, b, errors)
        assert ev["b_settling"].wait(10)
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            (y2,) = enc(x)  # A's end waits for B's settle, then for B's read
        th.join(10), tc.join(10)
        assert not th.is_alive() and not tc.is_alive() and errors == []
        assert got == [[3, 5, 7, 9]], "B's dec read A's next output"
        assert X.alloc_figures()["pool_reader_waits_for_calls"] == w0[0] + 1
        texts = runtime_warnings(seen)
        assert len(texts) == 1 and "thread %d " % th.ident in texts[0], texts
        assert y2.values() == [21, 41, 61, 81]
        del handed[:], y2
        assert all(t.check() is None for t in trees.made)
    finally:
        X.set_read_wait_warning(before)
        X.set_tree_getter(None)
        gc.collect()


def test_the_read_wait_warnings_bound_comes_from_the_environment_and_refuses_what_is_no_number_of_seconds(
        monkeypatch):
    """CGTREE_TORCH_READ_WAIT_WARN_SECONDS, read at install() before
    anything changes; set_read_wait_warning refuses a bound below 0 or NaN
    and changes nothing, and gives the bound before."""
    monkeypatch.setenv("CGTREE_TORCH_NO_INSTALL", "1")
    install = pytest.importorskip("cgtree.torch._install")
    monkeypatch.delenv("CGTREE_TORCH_READ_WAIT_WARN_SECONDS", raising=False)
    assert install.env_read_wait() is None
    for text, seconds in (("2.5", 2.5), ("0", 0.0), ("600", 600.0)):
        monkeypatch.setenv("CGTREE_TORCH_READ_WAIT_WARN_SECONDS", text)
        assert install.env_read_wait() == seconds
    for bad in ("soon", "-1", "nan", "1e12"):
        monkeypatch.setenv("CGTREE_TORCH_READ_WAIT_WARN_SECONDS", bad)
        with pytest.raises(X.CgtreeError, match="CGTREE_TORCH_READ_WAIT_WARN_SECONDS"):
            install.env_read_wait()
    before = X.set_read_wait_warning(3)
    try:
        for bad in (-1, float("nan"), 1e12):
            with pytest.raises(ValueError, match="seconds"):
                X.set_read_wait_warning(bad)
        with pytest.raises(TypeError):
            X.set_read_wait_warning("3")
        assert X.set_read_wait_warning(0.0001) == 3.0  # nothing changed by the refusals
        assert X.set_read_wait_warning(3) == 0.001  # below a millisecond is a millisecond, not never
    finally:
        X.set_read_wait_warning(before)


class PausingStorage(FakeStorage):
    """A storage whose death runs `hook` once, as a finaliser may: the
    Python a drain of dead outputs can run (an output over the caller's
    memory as another dtype holds the caller's storage)."""

    hook = None

    def __del__(self):
        hook, PausingStorage.hook = PausingStorage.hook, None
        if hook:
            hook()
        super().__del__()


class ViewAsAnotherDtype(Graph):
    """(x as int32, 2x + 1): an output over the caller's memory as another
    dtype, which holds the caller's storage."""

    def __call__(self, x):
        v = x.narrow(0, x.n)
        v.dtype = "int32"
        return (v, affine(self.stream(), x, 2.0, 1.0))


def test_a_settling_look_ups_pointer_read_again_is_checked_for_an_end_that_began_during_it(tree):
    """A fifth review: B's dec(y, w) settles (C's step's end crossed y's
    first pointer read) and reads y's pointer again, through Python. A's
    step end had passed its first wait (it waited for B's dec1(y)) and ran
    Python before its moves (a drain freed an output that held the
    caller's storage, whose finaliser ran): not under way, so the settle
    did not wait for it. While y.data_ptr() ran, A moved y (its old
    storage died, and a drain freed its record); data_ptr returned the old
    address P, the look-up found nothing there and noted nothing, A's
    replay wrote its next output at P, and B's replay copied P: A's next
    output, silently. The pointer read again is now checked as the first
    read is: an end begun during it reads it once more."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    main = threading.main_thread()
    ev = {k: threading.Event() for k in ("in_dec1", "a_paused", "a_go", "c_go", "c_done", "moved", "a_replayed")}
    armed = {"mover": False}
    seen = []

    def a_pauses():  # the drain in A's step end, past its first wait and before its moves
        seen.append(("drained on the main thread", threading.current_thread() is main))
        ev["a_paused"].set()
        ev["a_go"].wait(5)

    def moved_during_reread(p):
        ev["a_go"].set()  # A's end goes on: it moves y, and waits for this look-up
        assert ev["moved"].wait(5)
        tree.stats()  # a drain: y's old storage died with the move, and its record goes

    def after_y(_=None):  # w, after y's look-up: A's next step replays meanwhile
        seen.append(("A replayed before B's look-up ended", ev["a_replayed"].wait(2)))

    crossed = CrossedLookUp(ev, moved_during_reread, after_y)

    def mover(ts):
        res = fake_move_out(ts)
        if armed["mover"]:
            armed["mover"] = False
            ev["moved"].set()
        return res

    class DropsV(Graph):
        """z = y; while armed, waits until A's end waits for this call, then
        drops the last tensor over v's output."""
        armed, holder, w0 = False, [], 0

        def __call__(self, y, *rest):
            if self.armed:
                self.armed = False
                ev["in_dec1"].set()
                for _ in range(500):
                    if X.alloc_figures()["pool_reader_waits_for_calls"] > self.w0:
                        break
                    threading.Event().wait(0.01)
                seen.append(("A waits for dec1", X.alloc_figures()["pool_reader_waits_for_calls"] - self.w0))
                self.holder.clear()  # v's output record is queued dead: A's end drains it
            return super().__call__(y, *rest)

    try:
        stream = lambda: trees(0).stream  # noqa: E731 - each thread's own tree's
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        as_int = segment(tree, ViewAsAnotherDtype(tree, 1.0, 0.0, stream=stream), spans=(16,), name="as_int")
        enc_c = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="enc_c")
        drops = DropsV(tree, 1.0, 0.0, stream=stream)
        dec1 = segment(tree, drops, spans=(16,), name="dec1")
        dec, w = spanned_dec(tree, stream, crossed.span)
        out = dec1(FakeTensor(4).fill([0] * 4))  # its first call (plain) on the main thread's tree: outputs known
        del out
        x = FakeTensor(4).fill([1, 2, 3, 4])
        trees(0).explicit_steps = True
        for _ in range(4):  # enc and as_int replay from here on
            trees(0).step_begin()
            outs = enc(x), as_int(FakeTensor(4).fill([0] * 4))
            del outs
        trees(0).step_begin()
        (y,) = enc(x)  # [3, 5, 7, 9] at P
        P = y.ptr
        y.__class__ = crossed.ptr_class
        x2 = FakeTensor(4).fill([1, 1, 1, 1])
        x2.storage.__class__ = PausingStorage
        v, _ = as_int(x2)
        assert v.storage is not x2.storage, "a tree's run makes the output over x2's memory, holding its storage"
        drops.holder.append(v)
        del v, x2, _
        handed, got, errors = [y], [], []
        del y

        def b():
            replays_here(trees, dec, w)
            drops.w0 = X.alloc_figures()["pool_reader_waits_for_calls"]
            drops.armed = True
            (z1,) = dec1(handed[0])  # a read in flight: A's step end waits for this call
            del z1
            assert ev["a_paused"].wait(5)  # A's end drained v's record (this thread's next call would have)
            crossed.arm()
            (z,) = dec(handed[0], w)
            got.append(z.values())

        X.set_output_mover(mover)
        PausingStorage.hook = a_pauses
        tc = step_end_on_cue(trees, enc_c, ev, errors)  # its end crosses B's look-up of y
        th = reader_thread(trees, b, errors)
        armed["mover"] = True
        assert ev["in_dec1"].wait(5)
        trees(0).step_begin()
        (y2,) = enc(handed[0])  # A's ending call passes y: it waits for dec1, moves y, marks, replays at P
        ev["a_replayed"].set()
        th.join(10), tc.join(10)
        assert not th.is_alive() and not tc.is_alive()
        assert seen == [("A waits for dec1", 1), ("drained on the main thread", True),
                        ("A replayed before B's look-up ended", True)], seen  # the sequence above, as meant
        assert ev["moved"].is_set() and ev["c_done"].is_set() and y2.ptr == P and handed[0].ptr != P
        # y's data, or a StaleTensorError; never A's next output ([7, 11, 15, 19])
        assert (errors == [] and got == [[3, 5, 7, 9]]) or (got == [] and "earlier step" in "".join(errors)), (
            "B read A's next output", errors, got)
        del handed[:], y2
        for t in trees.made:
            t.check()
    finally:
        PausingStorage.hook = None
        X.set_output_mover(fake_move_out)
        X.set_tree_getter(None)
        gc.collect()


class TwoTreesPerThread(ThreadTrees):
    """ThreadTrees, but a thread whose `alt` is set gets a second tree of
    its own (as a thread with trees on two devices has). use_alt switches
    the calling thread, and sets the getter again: segments cache the
    getter's tree per thread until then."""

    def use_alt(self, on):
        self.local.alt = on
        X.set_tree_getter(self)

    def __call__(self, device):
        if getattr(self.local, "alt", False):
            if not hasattr(self.local, "alt_tree"):
                self.local.alt_tree = X.Tree(0, backend="sim")
                self.made.append(self.local.alt_tree)
            return self.local.alt_tree
        return super().__call__(device)


def test_a_settling_look_up_inside_its_own_threads_end_raises_while_another_threads_end_is_under_way(tree):
    """A sixth review: B's dec(y, w) is called from Python that B's own step
    end runs (its mover): this_thread_ending, so tx_reads_settle waits for
    NO end under way, not only B's own. A's end is under way (in its
    moves) when B settles; during B's second read of y's pointer A moves y
    (its old storage at P dies and a drain drops its record), the read
    returns P, no end BEGAN since the settle, so the look-up at P finds
    nothing and notes nothing; A's second wait passes and A takes and
    marks its outputs while B's call will copy P, which no note orders
    before A's next replay over P (silently wrong data on a GPU, where
    the copy is queued). It cannot wait there (that end may run such a
    call too, waiting for this one), so it raises CgtreeError; called
    again outside its end, B's dec reads y where it moved."""
    trees = TwoTreesPerThread()
    X.set_tree_getter(trees)
    main = threading.main_thread()
    ev = {k: threading.Event() for k in ("b_ready", "a_in_mover", "b_rereading", "moved", "b_in_end")}
    armed = {"a_mover": False, "b_mover": False, "y_span": False, "w_span": False, "reread": False}
    seen, got, errors, used, at_read, a_step, refused = [], [], [], [], [], [0], []

    class SlowPtr(FakeTensor):
        def data_ptr(self):
            p = super().data_ptr()
            if armed["reread"] and threading.current_thread() is not main:
                armed["reread"] = False
                ev["b_rereading"].set()  # A's mover goes on: it moves y
                seen.append(("A moved y during B's re-read", ev["moved"].wait(5)))
                tree.stats()  # a drain: y's old storage died with the move, and its record goes
                used.append(p)  # the address B's look-up goes by, and its replay's copy reads
            return p

    def slow_span(t):
        if armed["y_span"] and t.n == 4 and threading.current_thread() is not main:
            armed["y_span"] = False
            armed["reread"] = True  # crossed already: A's end and B's own are under way
        elif armed["w_span"] and t.n == 8 and threading.current_thread() is not main:
            armed["w_span"] = False  # after y's look-up: A's step ends meanwhile, unless it waits for this call
            a_tree = trees.made[0]
            for _ in range(200):  # A's step ends (take, marks) unless it waits for this call
                if a_tree.stats()["step"] > a_step[0]:
                    break
                threading.Event().wait(0.01)
            at_read.append((a_tree.stats()["step"] > a_step[0], handed[0].ptr))
        return t.nbytes

    try:
        stream = lambda: trees(0).stream  # noqa: E731 - the calling thread's tree's
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        enc_b = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="enc_b")
        dec, w = spanned_dec(tree, stream, slow_span)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # y = [3, 5, 7, 9] at P, A's (the main thread's)
        P = handed[0].ptr
        handed[0].__class__ = SlowPtr

        def a_or_b_mover(ts):
            on_main = threading.current_thread() is main
            if on_main and armed["a_mover"]:
                armed["a_mover"] = False
                ev["a_in_mover"].set()
                seen.append(("B re-reads while A's moves are under way", ev["b_rereading"].wait(5)))
                res = fake_move_out(ts)
                ev["moved"].set()
                return res
            if not on_main and armed["b_mover"]:
                armed["b_mover"] = False
                ev["b_in_end"].set()
                armed["y_span"] = armed["w_span"] = True
                trees.use_alt(True)  # dec runs on B's other tree
                try:
                    (z,) = dec(handed[0], w)
                    got.append(z.values())
                except X.CgtreeError as e:
                    refused.append(str(e))
                    armed["w_span"] = armed["reread"] = False
                    ev["b_rereading"].set()  # A's mover goes on
                finally:
                    trees.use_alt(False)
            return fake_move_out(ts)

        def b():
            trees.use_alt(True)
            trees(0).explicit_steps = True
            replays_here(trees, dec, w)  # on B's other tree
            trees.use_alt(False)
            xb = FakeTensor(4).fill([1, 1, 1, 1])
            for _ in range(4):  # enc_b replays on B's tree
                trees(0).step_begin()
                (u,) = enc_b(xb)
                del u
            trees(0).step_begin()
            kept = list(enc_b(xb))  # alive, and passed to the call that ends B's step: B's end moves it
            ev["b_ready"].set()
            assert ev["a_in_mover"].wait(5)
            armed["b_mover"] = True
            trees(0).step_begin()
            (u2,) = enc_b(kept[0])  # B's end: its mover calls dec(y, w)
            del u2, kept
            trees.use_alt(True)  # outside its end, B's dec reads y where it moved
            trees(0).step_begin()
            (z,) = dec(handed[0], w)
            got.append(z.values())
            trees.use_alt(False)

        X.set_output_mover(a_or_b_mover)
        th = reader_thread(trees, b, errors)
        assert ev["b_ready"].wait(10)  # B's warm-ups are over before A's end begins
        armed["a_mover"] = True
        a_step[0] = trees(0).stats()["step"]
        trees(0).step_begin()
        (y2,) = enc(handed[0])  # A's end: moves y (waiting in its mover for B's re-read), marks, replays
        th.join(10)
        assert not th.is_alive()
        assert ev["b_in_end"].is_set(), (seen, errors)
        assert seen == [("B re-reads while A's moves are under way", True)], (seen, errors)  # the sequence, as meant
        assert y2.ptr == P and handed[0].ptr != P
        assert len(refused) == 1 and "inside this thread's step end" in refused[0], refused
        assert used == [] and at_read == [], "B read y's old address P unnoted while A's step ended"
        assert errors == [] and got == [[3, 5, 7, 9]], (errors, got)
        del handed[:], y2
        for t in trees.made:
            t.check()
    finally:
        X.set_output_mover(fake_move_out)
        X.set_tree_getter(None)
        gc.collect()


def test_a_step_that_would_end_inside_another_call_while_another_thread_reads_its_output_raises_and_none_hangs(tree):
    """B's dec(yA) reads A's output and, inside its Python (the call in
    flight), calls B's own segment, whose call would end B's step. A's call
    dec(yB) reads B's output and waits, inside its Python, for that inner
    call. Had B's step's end waited for A's call (which reads yB), each
    thread would wait for the other (the first version let B's step end
    without waiting: A could read B's next output, silently). A step's end
    inside another compiled call cannot wait: it raises CgtreeError, and
    B's step goes on, so A's read is right."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    inner_done, a_reading = threading.Event(), threading.Event()
    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        inner = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="inner")

        class WaitsForInner(Graph):
            def __call__(self, y, *rest):
                a_reading.set()
                ok = inner_done.wait(5)
                out = super().__call__(y, *rest)
                return out + (ok,)

        class CallsInner(Graph):
            def __call__(self, y, *rest):
                assert a_reading.wait(5)
                trees(0).step_begin()
                (w,) = inner(y)  # ends B's step: A's call reads an output of it
                inner_done.set()
                out = super().__call__(w, *rest)
                return out

        dec_a = segment(tree, WaitsForInner(tree, 1.0, 0.0, stream=stream), spans=(16,), name="dec_a")
        dec_b = segment(tree, CallsInner(tree, 1.0, 0.0, stream=stream), spans=(16,), name="dec_b")
        handed, results, errors = {}, {}, []
        ready = threading.Barrier(2)

        def work(name, fill, dec):
            try:
                trees(0).explicit_steps = True
                x = FakeTensor(4).fill(fill)
                for _ in range(4):  # enc replays from the third call on: both outputs lie in pools
                    trees(0).step_begin()
                    (handed[name],) = enc(x)
                ready.wait(5)
                other = handed["b" if name == "a" else "a"]
                results[name] = dec(other)[:2]
                results[name] = (results[name][0].values(),) + tuple(results[name][1:])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
                inner_done.set(), a_reading.set()

        ta = threading.Thread(target=work, args=("a", [1, 1, 1, 1], dec_a))
        tb = threading.Thread(target=work, args=("b", [2, 2, 2, 2], dec_b))
        ta.start(), tb.start()
        ta.join(15), tb.join(15)
        assert not ta.is_alive() and not tb.is_alive(), "the threads wait for each other"
        assert len(errors) == 1 and "inside another compiled call" in errors[0], errors
        assert results["a"] == ([5, 5, 5, 5], True), "A's read waited past B's inner call"
        assert "b" not in results
    finally:
        X.set_tree_getter(None)


class TwoReadsGraph(Graph):
    """z = y. While armed, the first call (plain: a segment's first call runs
    the graph itself) lets the GIL go 0.2 s before it reads; a second graph
    of this class (`second_of`), on its first call, tells `second` and waits
    (GIL let go) up to 1 s for `a_replayed` before it reads, as a warmup's,
    a recording's or a plain graph's Python may."""

    def __init__(self, tree, stream, first=None):
        super().__init__(tree, 1.0, 0.0, stream=stream)
        self.armed, self.first = False, first
        self.started, self.go, self.second, self.a_replayed = (threading.Event() for _ in range(4))

    def __call__(self, y, *rest):
        if self.armed and self.first is None:
            self.armed = False
            self.started.set()
            self.go.wait(5)
            import time

            time.sleep(0.2)
        elif self.armed:
            self.armed = False
            self.first.second.set()
            self.first.a_replayed.wait(1)
        return super().__call__(y, *rest)


def test_a_read_begun_while_the_waiting_step_asks_for_the_gil_back_is_waited_for_too(tree):
    """A's step end waits for B's dec(y); B's call returns, and B, still holding
    the GIL, calls dec2(y) (a second read of the same output of A's current
    step: noted, since y is not marked yet) whose Python lets the GIL go
    before its read. A, woken, takes the GIL back, and marks y and replays
    over it without looking at the reads in flight again: B's second read
    takes A's next output (a review; the first version). Now the wait ends
    with a look made holding the GIL."""
    import time

    trees = ThreadTrees()
    X.set_tree_getter(trees)
    old_interval = sys.getswitchinterval()
    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        reading = TwoReadsGraph(tree, stream)
        reading2 = TwoReadsGraph(tree, stream, first=reading)
        dec = segment(tree, reading, spans=(16,), name="dec")
        dec2 = segment(tree, reading2, spans=(16,), name="dec2")
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # [y]: the main thread is A
        got, errors = [], []

        def b():
            reading.armed = reading2.armed = True
            (z1,) = dec(handed[0])
            t = time.perf_counter()
            while time.perf_counter() - t < 0.05:  # holds the GIL: A wakes and asks for it meanwhile
                pass
            (z2,) = dec2(handed[0])
            got.append((z1.values(), z2.values()))

        sys.setswitchinterval(5.0)  # B keeps the GIL until it lets it go itself
        th = reader_thread(trees, b, errors)
        assert reading.started.wait(5)
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        reading.go.set()
        (y2,) = enc(x)  # waits for B's dec(y); must wait for its dec2(y) too
        second_in_flight = reading.second.is_set() and not reading.a_replayed.is_set()
        reading.a_replayed.set()
        th.join(10)
        assert not th.is_alive() and errors == [], errors
        assert got == [([3, 5, 7, 9], [3, 5, 7, 9])], (
            "B's dec2(y) read A's next output: %r (A's step ended while it was in flight: %s)" % (got, second_in_flight))
        del handed[:], y2
        gc.collect()
    finally:
        sys.setswitchinterval(old_interval)
        X.set_tree_getter(None)


def test_a_read_whose_span_function_lets_a_step_end_before_its_look_up_raises_or_reads_right(tree):
    """B's dec has dynamic spans: its span function (Python) runs between the
    read of y's pointer and the look-up of y among A's step's outputs. A's
    step ends meanwhile (no read in flight yet), marks y and replays over it;
    B's look-up by address found A's next output there (or nothing), and B
    read it, silently (a review). Now an argument whose look-up a step's end
    crossed has its pointer read again: y is marked, so B's call raises
    StaleTensorError."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    in_span, a_done, armed = threading.Event(), threading.Event(), [False]

    def slow_span(t):
        if armed[0] and threading.current_thread() is not threading.main_thread():
            in_span.set()
            a_done.wait(2)
        return t.nbytes

    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        g = Graph(tree, 1.0, 0.0, stream=stream)
        dec = X.Segment(tree, "dec", g, lambda inputs: g(*inputs), alias, describe, slow_span,
                        bytes((ARG_TENSOR,)), (16,), 0, True)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # [y]: the main thread is A
        got, errors = [], []

        def b():
            armed[0] = True
            (z,) = dec(handed[0])
            got.append(z.values())

        th = reader_thread(trees, b, errors)
        assert in_span.wait(5)
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        (y2,) = enc(x)  # A's next step
        a_done.set()
        th.join(10)
        assert not th.is_alive()
        # y's data, or a StaleTensorError (A's step ended before B's look-up); never A's next output
        assert (errors == [] and got == [[3, 5, 7, 9]]) or (got == [] and "earlier step" in "".join(errors)), (
            errors, got)
        assert X.alloc_figures()["pool_reader_reads_rechecked"] >= 1
        del handed[:], y2
        gc.collect()
    finally:
        X.set_tree_getter(None)


@pytest.mark.parametrize("warning", ["none", "as_an_error"])
def test_a_read_that_begins_while_a_step_end_moves_its_call_arguments_is_waited_for(tree, warning):
    """A's step end waits for reads in flight, then moves the ending call's
    arguments out of the pool (the output mover: Python, which may let the
    GIL go), then marks. B's dec(y) that begins in that Python is not waited
    for: A marked y and replayed over it before B read (a review). Now the
    step's end looks again right before it takes its outputs. With the read
    wait's warning made an error (a seventh review), A's call raises it from
    that second wait, after its moves; once B returned, the retried call
    ends the step, and A's moved argument w reads right."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    in_mover, b_noted = threading.Event(), threading.Event()
    armed = [False]

    def mover(ts):
        if armed[0]:
            armed[0] = False
            in_mover.set()
            b_noted.wait(2)  # lets the GIL go, as any Python may at a switch
        return fake_move_out(ts)

    before = X.set_read_wait_warning(0.05 if warning == "as_an_error" else 10)
    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        reading = ReadingGraph(tree, stream, [])
        dec = segment(tree, reading, spans=(16,), name="dec")
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # [y]: the main thread is A
        (w,) = enc(x)  # another output of the step, which A's ending call takes: it moves
        got, errors = [], []

        def b():
            assert in_mover.wait(5)
            reading.block = True
            reading.started = b_noted  # set once dec's Python runs: its read is noted by then
            reading.go.set()
            (z,) = dec(handed[0])
            got.append(z.values())

        th = reader_thread(trees, b, errors)
        X.set_output_mover(mover)
        armed[0] = True
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        if warning == "as_an_error":
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with pytest.raises(RuntimeWarning):
                    enc(w)  # B's read outlasts the bound in the second wait
        else:
            (w2,) = enc(w)  # A's ending call passes w: the mover runs after the wait, before the marks
        th.join(10)
        assert not th.is_alive()
        assert errors == [] and got == [[3, 5, 7, 9]], (errors, got)
        if warning == "as_an_error":
            assert w.values() == [3, 5, 7, 9]
            (w2,) = enc(w)  # the retry ends the step
            assert w2.values() == [7, 11, 15, 19]
            (y3,) = enc(x)
            assert y3.values() == [21, 41, 61, 81]
            del y3
        del handed[:], w2, w
        gc.collect()
        for t in trees.made:
            t.check()
    finally:
        X.set_read_wait_warning(before)
        X.set_output_mover(fake_move_out)
        X.set_tree_getter(None)


def test_a_step_end_inside_a_random_graphs_run_raises_rather_than_wait_for_a_reader_that_waits_for_it(tree):
    """Thread B's random graph `rnd` holds random_mu while its Python runs
    (its plain first call); inside, a nested compiled call ends B's step.
    rnd reads no other tree's output, so B waits for A's call dec_a(yB) --
    which noted its read of yB and then waits for random_mu (dec_a is random
    too). Neither returned: a hang (a review). Now a step's end inside
    another call never waits: it raises CgtreeError there, and A's read,
    once random_mu is free, reads B's step's output, right."""
    import time

    trees = ThreadTrees()
    X.set_tree_getter(trees)
    stream = lambda: trees(0).stream  # noqa: E731
    enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
    inner = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="inner")
    b_holds, handed, errors, done = threading.Event(), {}, [], []

    def rnd_graph(x):
        b_holds.set()
        time.sleep(0.3)  # A's dec_a notes its read of yB and waits for random_mu meanwhile
        trees(0).step_begin()
        inner(x)  # would end B's step, nested in rnd's run: raises (it waited for A's call)
        return Graph(tree, 1.0, 0.0, stream=stream)(x)

    rnd = segment(tree, rnd_graph, spans=(16,), name="rnd", prelaunch=lambda v, c: None)
    dec_a = segment(tree, Graph(tree, 1.0, 0.0, stream=stream), spans=(16,), name="dec_a",
                    prelaunch=lambda v, c: None)

    def b():
        try:
            trees(0).explicit_steps = True
            x = FakeTensor(4).fill([1, 1, 1, 1])
            for _ in range(4):
                trees(0).step_begin()
                (handed["b"],) = enc(x)
            rnd(x)  # reads x only: no read of another tree's output in flight on B
            done.append("b")
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    def a():
        try:
            assert b_holds.wait(5)
            (z,) = dec_a(handed["b"])
            done.append("a")
            done.append(z.values())
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ta, tb = threading.Thread(target=a, daemon=True), threading.Thread(target=b, daemon=True)
    tb.start(), ta.start()
    ta.join(5), tb.join(5)
    hung = ta.is_alive() or tb.is_alive()
    if not hung:
        X.set_tree_getter(None)
    assert not hung, ("deadlock: A waits for random_mu, B waits for A's read", errors)
    assert len(errors) == 1 and "inside another compiled call" in errors[0], errors
    assert done == ["a", [3, 3, 3, 3]], "A read B's step's output, y = 2 * 1 + 1"


@pytest.mark.parametrize("b_begins", ["before_the_moves", "during_the_moves"])
def test_a_look_up_that_crosses_a_step_ends_moves_reads_y_where_it_moved(tree, b_begins):
    """B's dec(y, w) reads y's pointer P, and y's span function lets the GIL
    go. A's next call is enc(y): its step's end moves y out of the pool (the
    mover: Python), and y's old storage dies (its record is drained by any
    compiled call). B's look-up of P came then: it saw no end and no output
    at P, so nothing was in flight; w's span function let the GIL go again,
    A's step ended without waiting, its replay wrote P, and B's recording
    copied from P: A's next output, silently. Before the moves counted as an
    end (a review), when B began before them; and when B began during them,
    after a bump of the counters made before they ran (a third review). Now
    the moves are bracketed like the take and marks: B's look-up waits for
    them to end, reads y's pointer again and reads y where it moved, and
    A's take waits for B's look-up."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    b_read, in_mover, moved, looked, a_replayed = (threading.Event() for _ in range(5))
    armed, once = [False], [False]

    def slow_span(t):
        if armed[0] and threading.current_thread() is not threading.main_thread():
            if t.n == 4:  # y
                b_read.set()
                moved.wait(5)
                tree.stats()  # any compiled call of any thread drains dead outputs' records
            else:  # w, the next argument
                looked.set()
                a_replayed.wait(2)
        return t.nbytes

    def mover(ts):
        if once[0] and b_begins == "during_the_moves":
            in_mover.set()
            b_read.wait(5)  # B's counters and pointer: inside the moves, before y's set_
        res = fake_move_out(ts)
        if once[0]:
            once[0] = False
            moved.set()
            looked.wait(2)
        return res

    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        dec, w = spanned_dec(tree, stream, slow_span)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # [y]: the main thread is A
        got, errors = [], []

        def b():
            (z,) = dec(FakeTensor(4).fill([0, 0, 0, 0]), w)  # B's tree warms dec up
            del z
            armed[0] = True
            if b_begins == "during_the_moves":
                assert in_mover.wait(5)
            (z,) = dec(handed[0], w)  # B's tree records dec: its copy reads y by address
            got.append(z.values())

        X.set_output_mover(mover)
        once[0] = True
        th = reader_thread(trees, b, errors)
        if b_begins == "before_the_moves":
            assert b_read.wait(5)
        trees(0).step_begin()
        (y2,) = enc(handed[0])  # A's ending call passes y: it moves, the step ends, the replay writes P
        a_replayed.set()
        th.join(10)
        assert not th.is_alive()
        assert errors == [] and got == [[3, 5, 7, 9]], ("B read A's next output", errors, got)
        assert X.alloc_figures()["pool_reader_reads_rechecked"] >= 1
        del handed[:], y2
        gc.collect()
    finally:
        X.set_output_mover(fake_move_out)
        X.set_tree_getter(None)


def test_a_step_end_refused_inside_a_warmup_passes_its_error_on_and_the_graph_stays_a_segment(tree):
    """B's outer graph calls, inside its Python, B's inner segment after a
    step_begin(): while A's dec(yB) reads an output of B's step, that step's
    end is refused (CgtreeError). Raised inside outer's warmup, the error
    sent outer plain for good (a warning, plain_reason set, and inner called
    a second time by the plain rerun): a matter of A's timing, not of the
    graph (a review). Now the error reaches the caller and outer stays a
    segment: its next call, with nothing in flight, warms up."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        inner = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="inner")
        g = Graph(tree, 1.0, 0.0, stream=stream)
        a_reading, inner_raised = threading.Event(), []

        def outer_graph(x):
            trees(0).step_begin()
            try:
                inner(x)
            except Exception as e:  # noqa: BLE001 - counted, then raised on
                inner_raised.append(repr(e))
                raise
            return g(x)

        outer = segment(tree, outer_graph, spans=(16,), name="outer")
        reading = ReadingGraph(tree, stream, [])
        dec_a = segment(tree, reading, spans=(16,), name="dec_a")
        handed, errors, res = {}, [], {}

        def b():
            x = FakeTensor(4).fill([1, 1, 1, 1])
            (o,) = outer(x)  # first call: plain, nothing in flight
            del o
            for _ in range(3):
                trees(0).step_begin()
                (handed["b"],) = enc(x)
            b_ready.set()  # yB of B's step: A reads it now
            assert a_reading.wait(5)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                try:
                    (o,) = outer(x)  # its warmup: inside, inner would end B's step while A reads yB
                except Exception as e:  # noqa: BLE001 - checked below
                    res["error"] = repr(e)
                res["warned"] = [str(m.message) for m in w]
            reading.go.set()
            res["info"] = outer.info

        def a():
            assert b_ready.wait(5)
            reading.block, reading.started = True, a_reading
            (z,) = dec_a(handed["b"])
            res["a"] = z.values()

        b_ready = threading.Event()
        tb = reader_thread(trees, b, errors)
        ta = threading.Thread(target=a)
        ta.start()
        tb.join(10), ta.join(10)
        assert not tb.is_alive() and not ta.is_alive() and errors == [], errors
        assert "inside another compiled call" in res.get("error", ""), res
        assert not any("without CUDA graphs" in m for m in res["warned"]), "outer went plain for good"
        assert len(inner_raised) == 1 and not res["info"].get("plain_reason"), (inner_raised, res["info"])
        assert res["a"] == [3, 3, 3, 3]
    finally:
        X.set_tree_getter(None)


def test_a_static_pointer_vouched_for_before_a_step_end_is_read_again_after_it(tree):
    """B's dec(xb, y, w1..w7): y (A's output) is a STATIC input, and without
    the exchange API PyTorch's one check vouches for the STATIC pointers
    before the argument loop. xb's span function (Python) runs in the loop,
    and A's step ends there (y marked, A's replay writes y2 at y's address).
    y's counters were read only after that end, its pointer was the vouched
    one, the look-up found y2, and B's replay read A's next output, silently
    (a fourth review). Now a vouched pointer counts as read at the check: B
    settles, reads y's pointer again and raises StaleTensorError."""
    n_static = 8

    def ptrs_equal(tensors, ptrs, idx):
        return all(tensors[i].ptr == ptrs[i] for i in idx)

    init_hot_path(ptrs_equal)
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    in_span, a_done, armed = threading.Event(), threading.Event(), [False]

    def slow_span(t):
        if armed[0] and getattr(t, "is_xb", False) and threading.current_thread() is not threading.main_thread():
            armed[0] = False
            in_span.set()
            a_done.wait(5)
        return t.nbytes

    def add_first_weight(x, *ws):
        out = FakeTensor(x.n)
        X.sim_launch(trees(0).stream, k_add, out.ptr, x.ptr, ws[0].ptr, x.n)
        return [out]

    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        kinds = (ARG_TENSOR,) + (ARG_TENSOR_STATIC,) * n_static
        dec = X.Segment(tree, "dec", add_first_weight, lambda inputs: add_first_weight(*inputs), alias, describe,
                        slow_span, bytes(kinds), (16,) * (n_static + 1), 0, True)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)  # [y] = 2x + 1 = [3, 5, 7, 9]: the main thread is A
        got, errors = [], []

        def b():
            xb = FakeTensor(4).fill([0, 0, 0, 0])
            xb.is_xb = True
            ws = [FakeTensor(4).fill([0] * 4) for _ in range(n_static - 1)]
            for _ in range(4):  # replays from here on, y's pointer vouched for at each call
                trees(0).step_begin()
                (z,) = call(dec, xb, handed[0], *ws)
                got.append(z.values())
                del z
            armed[0] = True
            trees(0).step_begin()
            (z,) = call(dec, xb, handed[0], *ws)
            got.append(z.values())

        th = reader_thread(trees, b, errors)
        assert in_span.wait(5)
        trees(0).step_begin()
        x.fill([10, 20, 30, 40])
        (y2,) = enc(x)  # A's next step: y2 = [21, 41, 61, 81] at y's address
        a_done.set()
        th.join(10)
        assert not th.is_alive()
        assert got[:4] == [[3, 5, 7, 9]] * 4, got
        # y's data, or a StaleTensorError; never A's next output
        assert (errors == [] and got[4:] == [[3, 5, 7, 9]]) or (got[4:] == [] and "earlier step" in "".join(errors)), (
            errors, got)
        del handed[:], y2
        gc.collect()
    finally:
        X.set_tree_getter(None)
        init_hot_path()


def test_a_settling_look_up_whose_pointer_read_again_raises_leaves_no_step_end_waiting(tree):
    """A seventh review: B's look-up of y settles (C's end crossed it) and
    reading y's pointer again raises: B's call raises that error, and A's
    next step end (y no longer read) waits for nothing: it ends within
    seconds."""
    trees = ThreadTrees()
    X.set_tree_getter(trees)
    ev = {k: threading.Event() for k in ("c_go", "c_done")}

    def boom(p):
        raise ValueError("the re-read failed")

    crossed = CrossedLookUp(ev, boom, lambda: None)
    try:
        stream = lambda: trees(0).stream  # noqa: E731
        enc = segment(tree, Graph(tree, 2.0, 1.0, stream=stream), spans=(16,), name="enc")
        enc_c = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="enc_c")
        dec, w = spanned_dec(tree, stream, crossed.span)
        x = FakeTensor(4).fill([1, 2, 3, 4])
        handed = handed_output(trees, enc, x)
        y = crossed.ptr_class(4).fill(handed[0].values())  # not A's: only the error path matters here
        errors, c_errors = [], []
        rc0 = X.alloc_figures()["pool_reader_reads_rechecked"]
        tc = step_end_on_cue(trees, enc_c, ev, c_errors)

        def b():
            (z,) = dec(FakeTensor(4).fill([0, 0, 0, 0]), w)
            del z
            crossed.arm()
            with pytest.raises(ValueError, match="the re-read failed"):
                dec(y, w)

        th = reader_thread(trees, b, errors)
        th.join(10)
        tc.join(10)
        assert not th.is_alive() and not tc.is_alive()
        assert errors == [] and c_errors == [], (errors, c_errors)
        assert X.alloc_figures()["pool_reader_reads_rechecked"] >= rc0 + 1, "the look-up did not settle"
        w0 = X.alloc_figures()["pool_reader_waits_for_calls"]
        trees(0).step_begin()
        (y2,) = enc(x)  # on the main thread (A): hangs here if lookups_settling leaked (run under `timeout`)
        assert y2.values() == [3, 5, 7, 9]
        assert X.alloc_figures()["pool_reader_waits_for_calls"] == w0
        del y2
        del handed[:]
        gc.collect()
    finally:
        X.set_tree_getter(None)


# ---- More fault loops (a review): each path's host allocations failed in turn. ----

def test_each_host_allocation_of_calls_over_several_variants_with_graph_eviction_can_fail_and_loses_nothing():
    """Int arguments key three variants through a budget of two graphs:
    new variant templates, evictions, re-recordings."""
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim", max_graphs=2)
        g = Graph(t, 1.0, 0.0)

        def scaled(x, k):
            (y,) = g(x)
            X.sim_launch(t.stream, k_affine, y.ptr, y.ptr, y.n, float(k), 0.0)
            return (y,)

        return _ns(trees=[t], seg=segment(t, scaled, kinds=(ARG_TENSOR, ARG_INT), spans=(16, 0), name="shapes"),
                   x=FakeTensor(4).fill([1, 2, 3, 4]))

    def run(st):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(12):
                k = 1 + i % 3
                (y,) = call(st.seg, st.x, k)
                assert y.values() == [k * v for v in [1, 2, 3, 4]]
                del y

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_calls_with_inputs_of_two_sizes_can_fail_and_loses_nothing():
    """Dynamic shapes: the same segment called with 4 and 8 elements, the size
    passed as an int (a SymInt), as Dynamo's dynamic graphs take it: two variants."""
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim")
        g = Graph(t, 2.0, 1.0)
        return _ns(trees=[t], seg=segment(t, lambda x, n: g(x), kinds=(ARG_TENSOR, ARG_INT), spans=(0, 0), name="dyn"),
                   xs=[FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(8).fill([1, 2, 3, 4, 5, 6, 7, 8])])

    def run(st):
        for i in range(10):
            x = st.xs[i % 2]
            (y,) = call(st.seg, x, x.n)
            assert y.values() == [2 * v + 1 for v in x.values()]
            del y

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_views_of_an_output_passed_to_the_next_segment_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim")
        return _ns(trees=[t], s1=segment(t, Graph(t, 2.0, 0.0), spans=(16,), name="one"),
                   s2=segment(t, Graph(t, 1.0, 1.0), spans=(8,), name="two"),
                   s3=segment(t, Graph(t, 1.0, 0.0), spans=(16,), name="three"),
                   x=FakeTensor(4).fill([1, 2, 3, 4]))

    def run(st):
        for i in range(8):
            Generation.generation += 1
            (a,) = st.s1(st.x)
            start = 1 + i % 2
            (b,) = st.s2(a.narrow(start, 2))
            (c,) = st.s3(a)  # a itself too: a value twice in one step
            assert b.values() == [2 * v + 1 for v in [1, 2, 3, 4][start:start + 2]]
            assert c.values() == [2, 4, 6, 8]
            del a, b, c

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_calls_through_the_exchange_api_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)
    _, good = probes()
    assert X.setup_exchange(X.test_exchange_api(make_from_versioned, "v1"), (XTensor,), good)["pointers"]
    try:
        def setup():
            t = X.Tree(0, backend="sim")
            return _ns(trees=[t], seg=weighted_segment(t, 3, "xchg"), x=XTensor(4),
                       ws=[XTensor(4).fill([10, 10, 10, 10]) for _ in range(3)])

        def run(st):
            for i in range(6):
                st.x.fill([1 + i, 2, 3, 4])
                (y,) = call(st.seg, st.x, *st.ws)
                assert y.values() == [11 + i, 12, 13, 14]
                del y

        raised = each_host_allocation_failed_in_turn(setup, run)
        assert len(raised) >= 10, raised
    finally:
        X.setup_exchange(None, (), [])


def test_each_host_allocation_of_the_eager_allocator_can_fail_and_loses_nothing():
    """The allocator hooks outside any launch: allocations of two streams,
    record_stream, frees into the front cache, hits, empty_cache."""
    def setup():
        X.empty_cache(-1)
        return _ns(trees=[])

    def run(st):
        held = []
        try:
            for i in range(6):
                for s in (S1, S2):
                    n = 1000 + 600 * (i % 3)
                    p = eager_alloc(n, s)
                    if not p:
                        raise FakeOutOfMemoryError("refused")
                    held.append((p, n, s))
                    if i % 2:
                        if not X.record_stream(p, S2 if s == S1 else S1):
                            raise AssertionError("record_stream refused a block of ours")
                for p, n, s in held[:-1]:
                    eager_free(p, n, s)
                del held[:-1]
        finally:
            for p, n, s in held:
                eager_free(p, n, s)
        X.empty_cache(-1)
        assert eager_figures()["front_cache_blocks"] == 0

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 3, raised


def test_each_host_allocation_of_explicit_steps_with_outputs_kept_across_them_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim")
        st = _ns(trees=[t], seg=segment(t, Graph(t, 1.0, 1.0), spans=(16,)), x=FakeTensor(4).fill([0, 0, 0, 0]))
        for _ in range(3):  # the plain first call, a warmup, a recording: then the outputs lie in the pool
            call(st.seg, st.x)
        return st

    def run(st):
        kept = []
        Generation.generation += 1
        for i in range(6):
            for _ in range(2):
                (y,) = st.seg(st.x)
                assert y.values() == [1, 1, 1, 1]
                kept.append((y, y.view()))
            st.trees[0].step_begin()
            assert all(v.values() == [1, 1, 1, 1] for _, v in kept[-2:])
        (y,) = st.seg(st.x)  # that call began a step: everything kept before it is stale
        for a, v in kept:
            for t in (a, v):
                with pytest.raises(RuntimeError, match="StaleTensorError"):
                    t.values()
        assert y.values() == [1, 1, 1, 1]

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_a_thread_whose_tree_is_orphaned_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        main = X.Tree(0, backend="sim")
        trees = ThreadTrees()
        seg = segment(main, Graph(main, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="exits")
        return _ns(trees=[main], getter=trees, seg=seg, ran_on=None, tx=FakeTensor(4), mx=FakeTensor(4))

    def run(st):
        kept, errors = [], []

        def work():
            try:
                x = st.tx.fill([1, 2, 3, 4])
                for _ in range(4):
                    (y,) = call(st.seg, x)
                    assert y.values() == [3, 5, 7, 9]
                kept.append(y)
            except BaseException as e:  # noqa: BLE001
                errors.append(e.with_traceback(None))  # no frame kept: it holds the last output y

        X.set_tree_getter(st.getter)
        try:
            in_a_thread(work)
            if not st.getter.made or st.getter.made[-1] is st.ran_on:
                raise errors[0]  # the thread's tree was never made
            dead = st.ran_on = st.getter.made[-1]
            dead.orphan()
            x = st.mx.fill([0, 1, 2, 3])
            err = errors[0] if errors else None
            if err is not None:
                err.__context__ = err.__cause__ = None  # the failed launch's frames hold the output it made
            if err is None:
                (z,) = call(st.seg, x)
                assert kept[0].values() == [3, 5, 7, 9]
                del kept[:]
            (z,) = call(st.seg, x)
            assert z.values() == [1, 3, 5, 7]
            (z,) = call(st.seg, x)
            assert dead.closed, (errors, dead.stats()["outputs_alive"])
            if err is not None:
                raise err
        finally:
            X.set_tree_getter(None)

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_a_backward_only_tree_with_accumulated_grads_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        fw_tree, bw_tree = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
        fw = segment(fw_tree, ParamForwardGraph(fw_tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                     name="fw", saved_from=1, grad_inputs=(1,))
        bw = segment(bw_tree, BackwardGraph(bw_tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                     backward=True)
        return _ns(trees=[fw_tree, bw_tree], fw=fw, bw=bw, w=Leaf(4).fill([0, 0, 0, 0]),
                   x=FakeTensor(4).fill([1, 2, 3, 4]), t=FakeTensor(4).fill([1, 1, 1, 1]))

    def run(st):
        for i in range(8):
            if st.w.grad is not None:
                st.w.grad.fill([0, 0, 0, 0])
            out, saved = call(st.fw, st.x, st.w)
            (g,) = st.bw(saved, st.t)
            assert g.values() == [2, 3, 4, 5]
            st.w.accumulate(g)
            del out, saved, g
            assert st.w.grad.values() == [2, 3, 4, 5]

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


class TwoParamForward:
    """out = x + w1 + w2, saving x."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, w1, w2):
        tmp, out, saved = FakeTensor(x.n), FakeTensor(x.n), FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_add, tmp.ptr, x.ptr, w1.ptr, x.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, tmp.ptr, w2.ptr, x.n)
        X.sim_launch(self.tree.stream, k_affine, saved.ptr, x.ptr, x.n, 1.0, 0.0)
        return (out, saved)


class TwoGradBackward:
    """grads: saved + t and 2 * saved + t."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, saved, t):
        g1, g2, tmp = FakeTensor(saved.n), FakeTensor(saved.n), FakeTensor(saved.n)
        X.sim_launch(self.tree.stream, k_add, g1.ptr, saved.ptr, t.ptr, saved.n)
        X.sim_launch(self.tree.stream, k_affine, tmp.ptr, saved.ptr, saved.n, 2.0, 0.0)
        X.sim_launch(self.tree.stream, k_add, g2.ptr, tmp.ptr, t.ptr, saved.n)
        return (g1, g2)


def test_each_host_allocation_of_training_steps_with_two_kept_grads_moved_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        tree = X.Tree(0, backend="sim")
        fw = segment(tree, TwoParamForward(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC, ARG_TENSOR_STATIC),
                     spans=(16, 16, 16), name="fw", saved_from=1, grad_inputs=(1, 2))
        bw = segment(tree, TwoGradBackward(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                     backward=True)
        return _ns(trees=[tree], fw=fw, bw=bw, opt=optimizer_segment(tree), w1=Leaf(4).fill([0, 0, 0, 0]),
                   w2=Leaf(4).fill([1, 1, 1, 1]), x=FakeTensor(4).fill([1, 2, 3, 4]),
                   t=FakeTensor(4).fill([1, 1, 1, 1]))

    def run(st):
        for _ in range(5):
            for w in (st.w1, st.w2):
                if w.grad is not None:
                    w.grad.fill([0, 0, 0, 0])
            out, saved = call(st.fw, st.x, st.w1, st.w2)
            g1, g2 = st.bw(saved, st.t)
            st.w1.accumulate(g1)
            st.w2.accumulate(g2)
            del saved, g1, g2
            (u1,) = call(st.opt, st.w1, st.w1.grad)
            (u2,) = call(st.opt, st.w2, st.w2.grad)
            assert out.values() == [2, 3, 4, 5]
            assert u1.values() == [2, 3, 4, 5] and u2.values() == [4, 6, 8, 10], (u1.values(), u2.values())
            assert st.w1.grad.values() == [2, 3, 4, 5] and st.w2.grad.values() == [3, 5, 7, 9]
            del out, u1, u2

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_two_heads_saving_the_backbones_output_can_fail_and_loses_nothing():
    """Two heads (pairs 1 and 2) save h, an output of the step, as a view
    (tx_view_pair entries), a compiled call between the backwards."""
    X.set_output_mover(fake_move_out)

    def setup():
        tree = X.Tree(0, backend="sim")
        st = _ns(trees=[tree], backbone=segment(tree, Graph(tree, 2.0, 0.0), spans=(16,), name="backbone"),
                 other=segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="other"),
                 x=FakeTensor(4).fill([1, 2, 3, 4]), t=FakeTensor(4).fill([1, 1, 1, 1]))
        st.head1, st.bw1 = paired(tree, HeadSavingItsInput(tree), "head1", 1)
        st.head2, st.bw2 = paired(tree, HeadSavingItsInput(tree), "head2", 2)
        return st

    def run(st):
        for i in range(5):
            (h,) = call(st.backbone, st.x)
            z1, s1 = call(st.head1, h)
            z2, s2 = call(st.head2, h)
            assert z1.values() == z2.values() == [4, 8, 12, 16]
            del h, z1, z2
            (g1,) = st.bw1(s1, st.t)
            assert g1.values() == [3, 5, 7, 9]
            del s1, g1
            (o,) = call(st.other, st.x)
            assert o.values() == [2, 3, 4, 5]
            del o
            (g2,) = st.bw2(s2, st.t)
            assert g2.values() == [3, 5, 7, 9], "iteration %d" % i
            del s2, g2

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_the_x_equals_f_of_x_loop_with_moves_in_both_modes_can_fail_and_loses_nothing():
    """x = f(x): the call that ends x's step moves x (implicit steps), and
    the same loop in explicit mode with step_begin(); an output kept and a
    stale output refused too."""
    X.set_output_mover(fake_move_out)

    def setup():
        a, b = X.Tree(0, backend="sim"), X.Tree(0, backend="sim")
        b.explicit_steps = True
        return _ns(trees=[a, b], sa=segment(a, Graph(a, 2.0, 1.0), spans=(16,), name="fa"),
                   sb=segment(b, Graph(b, 2.0, 1.0), spans=(16,), name="fb"),
                   x0=[FakeTensor(4), FakeTensor(4)], z=FakeTensor(4).fill([0, 0, 0, 0]))

    def run(st):
        for seg, explicit, x in ((st.sa, False, st.x0[0]), (st.sb, True, st.x0[1])):
            x.fill([1, 2, 3, 4])
            want = [1.0, 2.0, 3.0, 4.0]
            for i in range(6):
                kept = x
                if explicit:
                    st.trees[1].step_begin()
                    (x,) = seg(x)
                else:
                    (x,) = call(seg, x)
                want = [2 * v + 1 for v in want]
                assert x.values() == want
                assert kept.values() == [(v - 1) / 2 for v in want]
        (y1,) = call(st.sa, st.z)
        (y2,) = call(st.sa, st.z)
        assert y2.values() == [1, 1, 1, 1]
        if st.trees[0].stats()["replays"] >= 1:  # y1 is the tree's (not a plain first call's): stale
            with pytest.raises(X.StaleTensorError):
                call(st.sa, y1)

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_many_outputs_with_record_stream_and_introspection_can_fail_and_loses_nothing():
    """40 outputs a call (the step list and its page index grow), a stream
    record_stream names for an output (pool_readers.c), tree.nodes() and
    eager_held()."""
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim")
        return _ns(trees=[t], many=segment(t, ManyGraph(t, 40), spans=(16,), name="many"),
                   reader=segment(t, Graph(t, 1.0, 0.5), spans=(8,), name="reader"), x=FakeTensor(4).fill([1, 2, 3, 4]))

    def run(st):
        since = X.eager_serial()
        for i in range(5):
            outs = call(st.many, st.x)
            assert outs[39].values() == [40, 41, 42, 43]
            _lib.cgt_torch_record_stream(outs[7].ptr, 0x7a11 + i)
            (r,) = st.reader(outs[39].narrow(1, 2))
            assert r.values() == [41.5, 42.5]
            del outs, r
        nodes = st.trees[0].nodes()
        assert len(nodes) >= 1
        X.eager_held(since)

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_branches_that_restore_a_checkpoint_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim")
        segs = [segment(t, Graph(t, a, b), spans=(16,), name=n) for a, b, n in
                ((1.0, 0.0, "one"), (2.0, 0.0, "two"), (-1.0, 0.0, "three"), (1.0, 10.0, "four"))]
        return _ns(trees=[t], segs=segs, xs=[FakeTensor(4).fill([v] * 4) for v in (1.0, -1.0)])

    def run(st):
        s1, s2, s3, s4 = st.segs
        for i in range(8):
            x = st.xs[i % 2]
            v = x.values()[0]
            Generation.generation += 1
            (y,) = s1(x)
            (z,) = (s2 if y.values()[0] > 0 else s3)(y)
            del y
            (w,) = s4(z)
            assert w.values() == ([12.0] * 4 if v > 0 else [11.0] * 4)
            del z, w

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


@pytest.mark.parametrize("keep_outputs", [False, True])
def test_a_forward_that_runs_plainly_then_two_optimizer_calls_reading_kept_grads_leave_the_first_ones_output_readable(
        tree, keep_outputs):
    """No fault injected: the state the fault loop above reaches for one
    step (a training forward's first call not taken in) is that of a
    forward that runs plainly for good. With a recorded backward, its
    gradients accumulated into kept .grad (zero_grad(set_to_none=False)),
    and an optimizer of two compiled calls, each reading one .grad, the
    second call began a step and marked the first call's output: the
    program's read of it raised StaleTensorError where Inductor computes.
    With u1, u2 kept bound into the next iteration: they are the step's
    optimizer outputs, which hold no training forward (watched as
    inference outputs, they held the next forward in the readers' step,
    whose held calls then carried on to the bound: a review)."""
    fw = segment(tree, TwoParamForward(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC, ARG_TENSOR_STATIC),
                 spans=(16, 16, 16), name="fw", saved_from=1, grad_inputs=(1, 2), plain_reason="the test says so")
    bw = segment(tree, TwoGradBackward(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True)
    opt = optimizer_segment(tree)
    w1, w2 = Leaf(4).fill([0, 0, 0, 0]), Leaf(4).fill([1, 1, 1, 1])
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain reason's
        for i in range(6):
            for w in (w1, w2):
                if w.grad is not None:
                    w.grad.fill([0, 0, 0, 0])
            step = tree.stats()["step"]
            out, saved = call(fw, x, w1, w2)
            assert tree.stats()["step"] == step + 1, "iteration %d: the forward joined the readers' step" % i
            g1, g2 = bw(saved, t)
            w1.accumulate(g1)
            w2.accumulate(g2)
            del saved, g1, g2
            (u1,) = call(opt, w1, w1.grad)
            (u2,) = call(opt, w2, w2.grad)
            assert u1.values() == [2, 3, 4, 5], "iteration %d" % i
            assert u2.values() == [4, 6, 8, 10]
            if not keep_outputs:
                del out, u1, u2
    assert tree.stats()["steps_held_for_inference_outputs"] == 0
    tree.check()


def kept_grad_training_step(fw, bw, ws, x, t):
    """zero_grad(set_to_none=False), forward, backward, accumulation; the
    loss is dropped, so nothing of the step lives after it."""
    for w in ws:
        w.grad.fill([0, 0, 0, 0])
    out, saved = call(fw, x, *ws)
    (g,) = bw(saved, t)
    ws[0].accumulate(g)
    del out, saved, g


def test_per_parameter_norms_kept_in_a_list_stay_readable_with_the_last_steps_list_still_bound(tree):
    """600 compiled per-parameter norms of kept .grad tensors, kept in a
    list for a histogram until the next iteration rebuilds it, the loss
    dropped: the first norm begins a gradient readers' step and the rest
    join it, under the bound of 1024. With the readers' outputs watched as
    inference outputs, the next forward joined that step and the held
    calls carried over, so the bound came within the third iteration and
    the norms after it each began a step: 599 of 600 raised (a review)."""
    n = 600
    fw, bw, ws = many_param_training(tree, n)
    norm = optimizer_segment(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    norms = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(4):
            kept_grad_training_step(fw, bw, ws, x, t)
            norms = [call(norm, w, w.grad)[0] for w in ws]
            for k, (w, v) in enumerate(zip(ws, norms)):
                assert v.values() == [a + b for a, b in zip(w.values(), w.grad.values())], (i, k)
    assert tree.stats()["optimizer_steps_forced"] == 0
    tree.check()


def test_past_the_bound_the_step_a_gradient_reader_forces_is_a_readers_step_that_the_next_readers_join(tree):
    """1100 per-parameter norms kept in a list: the first begins a readers'
    step, 1024 join it, and the next forces a step (with the warning),
    which marks the ones before it, as documented; the step it begins is a
    readers' step, so it and the 74 after it stay readable (begun plain,
    each began a step of its own and marked the one before: a review)."""
    n = 1100
    fw, bw, ws = many_param_training(tree, n)
    norm = optimizer_segment(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(2):
        kept_grad_training_step(fw, bw, ws, x, t)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            norms = [call(norm, w, w.grad)[0] for w in ws]
        assert len(said) == (i == 0), [str(m.message) for m in said]
        stale = 0
        for k in range(n):
            want = [a + b for a, b in zip(ws[k].values(), ws[k].grad.values())]
            try:
                assert norms[k].values() == want, (i, k)
            except RuntimeError as e:
                assert "StaleTensorError" in str(e) and k < 1 + 1024, (i, k, e)
                stale += 1
        assert stale >= 1000, (i, stale)
        del norms
    assert tree.stats()["optimizer_steps_forced"] == 2
    tree.check()


def test_a_metric_of_one_grad_against_several_references_is_no_repeat_and_keeps_every_result(tree):
    """The same compiled metric of one kept .grad against three reference
    tensors, each result kept: the calls differ in an argument, so none
    repeats another; they join the readers' step and every result stays
    readable (as Inductor computes)."""
    fw, bw, ws = many_param_training(tree, 1)
    metric = optimizer_segment(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    refs = [FakeTensor(4).fill([k, k, k, k]) for k in (10, 20, 30)]
    (w,) = ws
    for i in range(4):
        kept_grad_training_step(fw, bw, ws, x, t)
        got = [call(metric, r, w.grad)[0] for r in refs]
        for r, v in zip(refs, got):
            assert v.values() == [a + b for a, b in zip(r.values(), w.grad.values())], i
    tree.check()


def test_readers_of_a_kept_grad_recorded_with_an_output_dead_never_overwrite_it_when_it_lives(tree):
    """Three readers of the kept .grad in a readers' step, the first one's
    output dropped at every other iteration before the third call: a
    recording made while it was dead never writes over it when it lives
    (a review's probe)."""
    fw, bw, w, x, t = param_training_pair(tree)
    a_seg = optimizer_segment(tree)
    b_seg = segment(tree, StepGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="b")
    c_seg = segment(tree, Graph(tree, 3.0, 1.0), spans=(16,), name="c")
    w.grad = None
    for order in ("drop_first_then_keep", "keep_first_then_drop"):
        for i in range(8):
            if w.grad is not None:
                w.grad.fill([0, 0, 0, 0])
            out, saved = call(fw, x, w)
            (g,) = bw(saved, t)
            w.accumulate(g)
            del out, saved, g
            want = [a + b for a, b in zip(w.values(), w.grad.values())]
            (a,) = call(a_seg, w, w.grad)
            (b,) = call(b_seg, w, w.grad)
            drop = (i % 2 == 0) == (order == "drop_first_then_keep")
            if drop:
                del a
            (c,) = call(c_seg, w.grad)
            assert c.values() == [3 * v + 1 for v in w.grad.values()]
            assert b.values() == want, (order, i)
            if not drop:
                assert a.values() == want, (order, i)
            del b, c
            a = None
    tree.check()


def plus(a, b):
    return [x + y for x, y in zip(a.values(), b.values())]


def test_a_metric_against_references_made_per_call_at_one_address_keeps_every_result(tree):
    """As the test above, but each reference is made for its call (moved to
    the device, a temporary) and dies after it: the next one lies at the
    same address, often as an object at the same address too. No repeat:
    the memo's weak reference to the dead one is dead (a hash of data
    pointers took the next call for a repeat, which marked the result
    before: a review)."""
    fw, bw, ws = many_param_training(tree, 1)
    metric = optimizer_segment(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    (w,) = ws
    for i in range(4):
        kept_grad_training_step(fw, bw, ws, x, t)
        got, wants = [], []
        for k in (10, 20, 30):
            ref = FakeTensor(4).fill([k, k, k, k])  # ref_cpu.to("cuda")
            wants.append(plus(ref, w.grad))
            got.append(call(metric, ref, w.grad)[0])
            del ref
        for j, (v, want) in enumerate(zip(got, wants)):
            assert v.values() == want, (i, j)
    tree.check()


def test_a_metric_against_one_buffer_refilled_for_each_call_keeps_every_result(tree):
    """The metric of one kept .grad against references copied into one
    buffer for each call (buf.copy_(ref)), each result kept: the same
    object at the same address, but written in place between the calls
    (its _version), so no call repeats another."""
    fw, bw, ws = many_param_training(tree, 1)
    metric = optimizer_segment(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    (w,) = ws
    buf = FakeTensor(4)
    for i in range(4):
        kept_grad_training_step(fw, bw, ws, x, t)
        got, wants = [], []
        for k in (10, 20, 30):
            buf.fill([k, k, k, k])
            wants.append(plus(buf, w.grad))
            got.append(call(metric, buf, w.grad)[0])
        for j, (v, want) in enumerate(zip(got, wants)):
            assert v.values() == want, (i, j)
    tree.check()


@pytest.mark.parametrize("write", ["clip", "compiled_update", "compiled_update_twice", "another_trees_compiled_update",
                                   "write_through_data"])
def test_a_norm_before_and_after_a_write_in_place_keeps_both(tree, write):
    """The norm of a kept .grad logged before and after a write in place,
    both kept: clipping .grad (clip_grad_norm_'s mul_, counted in
    _version), a compiled SGD step that writes w, once or twice, in this
    tree or in another (a worker thread's): compiled writes are counted in
    every tree, as PyTorch counts them in _version (the simulator's fakes
    do not, nor do inference tensors). The same call but for the write between, so
    no repeat (taken for one, the second call marked the first norm: three
    reviews). A write through .data bumps no _version and runs no compiled
    call: cgtree cannot see it, takes the second call for a repeat, and the
    first norm raises StaleTensorError (documented); never a wrong value."""
    fw, bw, ws = many_param_training(tree, 1)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    norm = optimizer_segment(tree)
    other = X.Tree(0, backend="sim") if write == "another_trees_compiled_update" else tree
    upd = segment(other, SGDGraph(other), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="upd",
                  written_inputs=(0,))
    (w,) = ws
    for i in range(4):
        kept_grad_training_step(fw, bw, ws, x, t)
        want0 = plus(w, w.grad)
        (before,) = call(norm, w, w.grad)
        if write == "clip":
            w.grad.fill([v * 0.5 for v in w.grad.values()])
        elif write == "write_through_data":
            w.grad.view().fill([v * 0.5 for v in w.grad.values()])  # a view has a _version of its own, as .data
        else:
            for _ in range(2 if write == "compiled_update_twice" else 1):
                call(upd, w, w.grad)
        want1 = plus(w, w.grad)
        (after,) = call(norm, w, w.grad)
        assert after.values() == want1
        try:
            assert before.values() == want0, i
        except RuntimeError as e:
            assert write == "write_through_data" and "StaleTensorError" in str(e), e
        del before, after
    tree.check()
    other.check()


class UpdateThenNormGraph:
    """A compiled update that returns a value of what it wrote: w += g (in
    place, under no_grad: AOTAutograd bumps no _version), out = w + g."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, w, g):
        X.sim_launch(self.tree.stream, k_add, w.ptr, w.ptr, g.ptr, w.n)
        out = FakeTensor(w.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, w.ptr, g.ptr, w.n)
        return (out,)


def test_a_compiled_in_place_update_called_twice_with_the_same_arguments_keeps_its_first_result(tree):
    """An iterative solver's inner steps: the same compiled in-place update
    of w by its kept .grad, twice, each result kept. The second call reads
    the w the first wrote, so it is no repeat: its memo is stamped before
    its own write is counted (stamped after, it compared equal where no
    _version told the write, as here, began a readers' step and marked the
    first result: a review)."""
    fw, bw, ws = many_param_training(tree, 1)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    upd = segment(tree, UpdateThenNormGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16),
                  name="upd", written_inputs=(0,))
    (w,) = ws
    for i in range(4):
        kept_grad_training_step(fw, bw, ws, x, t)
        (a,) = call(upd, w, w.grad)
        want = a.values()
        (b,) = call(upd, w, w.grad)
        assert b.values() == plus(w, w.grad)
        assert a.values() == want, i
        del a, b
    tree.check()


def shifted_graph(tree):
    """A graph of a tensor and an int: out = g + k."""

    def shifted(g, k):
        out = FakeTensor(g.n)
        X.sim_launch(tree.stream, k_affine, out.ptr, g.ptr, g.n, 1.0, float(k))
        return (out,)

    return shifted


def test_int_and_bool_arguments_whose_python_hashes_are_equal_are_no_repeat(tree):
    """A metric of a kept .grad with an int argument (a symbolic int: one
    segment, a variant per value), called with -1 then -2, both results
    kept: Python hashes -1 and -2 alike, and a memo of hashes took the
    second call for a repeat, which marked the first result (a review).
    The memo keeps the ints themselves."""
    fw, bw, ws = many_param_training(tree, 1)
    (w,) = ws
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    assert hash(-1) == hash(-2) and hash(True) == hash(1)
    metric = segment(tree, shifted_graph(tree), kinds=(ARG_TENSOR, ARG_INT), spans=(16, 0), name="shift")
    for i in range(4):
        kept_grad_training_step(fw, bw, ws, x, t)
        got = [(k, call(metric, w.grad, k)[0]) for k in (-1, -2, 1, True)]
        for k, v in got:
            assert v.values() == [a + k for a in w.grad.values()], (i, k)
    tree.check()


def test_a_read_of_a_kept_grad_past_a_slice_that_another_leaf_has_as_grad_is_a_gradient_read(tree):
    """w1.grad is a slice of w0.grad (as a flat gradient buffer's views
    are): a call that reads the tail of w0.grad, past w1's slice, reads a
    kept .grad as a read of its head does, and joins the readers' step.
    The look-up took the last range to begin below the pointer (w1's
    slice) for the only one that could hold it: a miss, so the call began
    a step and marked the norm logged before it (a review)."""
    fw, bw, ws = many_param_training(tree, 2)
    norm = optimizer_segment(tree)
    tail = segment(tree, Graph(tree, 1.0, 0.0), spans=(8,), name="tail")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    ws[1].grad = ws[0].grad.narrow(1, 1)  # w1.grad: element 1 of w0.grad
    for i in range(4):
        for w in ws:  # zero_grad(set_to_none=False)
            w.grad.fill([0] * w.grad.n)
        out, saved = call(fw, x, *ws)
        (g,) = bw(saved, t)
        ws[0].accumulate(g)
        del out, saved, g
        (a,) = call(norm, ws[0], ws[0].grad)  # begins a gradient readers' step
        want = plus(ws[0], ws[0].grad)
        (b,) = call(tail, ws[0].grad.narrow(2, 2))  # elements 2 and 3 of the kept w0.grad
        assert b.values() == ws[0].grad.values()[2:]
        assert a.values() == want, i
        del a, b
    tree.check()


def test_a_grad_replaced_after_the_cache_was_read_is_still_a_reader_in_the_readers_step(tree):
    """The cache of where .grad lie is read by a norm that joins the
    backward's step (the loss alive); the loss is dropped and one .grad is
    replaced (a copy, as a cast or a hook makes); the next reader begins a
    readers' step, where the cache is read again, so the reader of the
    replaced .grad joins it (carried into the readers' step, the cache
    missed that .grad, whose reader began a step and marked the first
    reader's output: a review)."""
    fw, bw, ws = many_param_training(tree, 2)
    opt = optimizer_segment(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for i in range(4):
        for w in ws:
            w.grad.fill([0, 0, 0, 0])
        out, saved = call(fw, x, *ws)
        (g,) = bw(saved, t)
        ws[0].accumulate(g)
        del saved, g
        (a,) = call(opt, ws[0], ws[0].grad)  # the logged norm, with the loss alive
        assert a.values() == plus(ws[0], ws[0].grad)
        del out, a
        ws[1].grad = ws[1].grad.clone()  # replaced
        (b,) = call(opt, ws[0], ws[0].grad)
        (c,) = call(opt, ws[1], ws[1].grad)
        assert c.values() == plus(ws[1], ws[1].grad)
        assert b.values() == plus(ws[0], ws[0].grad), i
        del b, c
    tree.check()


class FailsOnce(StepGraph):
    fail = False

    def __call__(self, w, g):
        if FailsOnce.fail:
            FailsOnce.fail = False
            raise RuntimeError("a failure of the graph")
        return super().__call__(w, g)


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_a_reader_whose_graph_failed_and_is_called_again_keeps_the_first_norm(tree, fail_at):
    """Per-parameter norms in a readers' step; one call's graph raises
    after its step was settled and the program calls it again: the second
    call is no repeat of the one that failed, and the first norm stays
    readable."""
    fw, bw, ws = many_param_training(tree, 2)
    norm = segment(tree, FailsOnce(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="norm")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph runs plainly after its failure, and says so
        for i in range(4):
            kept_grad_training_step(fw, bw, ws, x, t)
            (n0,) = call(norm, ws[0], ws[0].grad)
            FailsOnce.fail = i == fail_at
            try:
                (n1,) = call(norm, ws[1], ws[1].grad)
            except RuntimeError as e:
                assert "a failure of the graph" in str(e)
                (n1,) = call(norm, ws[1], ws[1].grad)
            assert n1.values() == plus(ws[1], ws[1].grad)
            assert n0.values() == plus(ws[0], ws[0].grad), i
            del n0, n1
    tree.check()


@pytest.mark.parametrize("at", [0, 1, 3])
def test_a_reader_that_ran_out_of_host_memory_after_its_step_was_settled_is_retried_and_keeps_the_first_norm(at):
    """Per-parameter norms in a readers' step; the second norm's call runs
    out of host memory at each of its allocations in turn, and the program
    retries it. The memo is the last call's that returned a result: kept
    at the failed call, it took the retry for a repeat, which began a
    readers' step and marked the first norm where Inductor computes both
    (a review)."""
    X.set_output_mover(fake_move_out)
    for n in range(1, 400):
        tree = X.Tree(0, backend="sim")
        fw, bw, ws = many_param_training(tree, 2)
        norm = optimizer_segment(tree)
        x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
        left = 0
        for i in range(at + 1):
            kept_grad_training_step(fw, bw, ws, x, t)
            (n0,) = call(norm, ws[0], ws[0].grad)
            raised = False
            if i == at:
                X._fail_host_alloc(n)
            try:
                (n1,) = call(norm, ws[1], ws[1].grad)
            except (MemoryError, FakeOutOfMemoryError):
                raised = True
            finally:
                if i == at:
                    left = X._fail_host_alloc(0)
            if raised:
                (n1,) = call(norm, ws[1], ws[1].grad)  # the retry
            assert n1.values() == plus(ws[1], ws[1].grad)
            assert n0.values() == plus(ws[0], ws[0].grad), (n, i, raised)
            del n0, n1
        tree.check()
        del tree
        gc.collect()
        if left > 0:
            return
    pytest.fail("the call made more than 400 host allocations")


@pytest.mark.parametrize("seed", range(30))
def test_random_training_programs_with_gradient_readers_read_every_kept_output_right_or_raise(seed):
    """A review's random programs (40 operations each): training steps,
    recorded and plain; .grad zeroed, set to None or replaced; readers of
    a kept .grad (one, all parameters, a temporary reference, an int
    argument, an in-place update, one that returns a value, one in another
    tree, a kept output read again, one call repeated); a write of .grad
    that bumps no _version (as through .data); a backward with no forward;
    explicit marks; outputs kept or dropped at random.
    After every operation each kept output reads what it read when made,
    or raises StaleTensorError: never a wrong value."""
    import random

    X.set_output_mover(fake_move_out)
    rng = random.Random(seed)
    tree = X.Tree(0, backend="sim")
    n = 3
    fw, bw, ws = many_param_training(tree, n)
    opt = optimizer_segment(tree)
    dyn = segment(tree, StepGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="dyn")
    sh = segment(tree, shifted_graph(tree), kinds=(ARG_TENSOR, ARG_INT), spans=(16, 0), name="shift")
    upd = segment(tree, SGDGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="upd",
                  written_inputs=(0,))
    first = ParamForwardGraph(tree)
    pfw = segment(tree, lambda x, *w: first(x, w[0]), kinds=(ARG_TENSOR,) + (ARG_TENSOR_STATIC,) * n,
                  spans=(16,) * (n + 1), name="pfw", saved_from=1, grad_inputs=tuple(range(1, n + 1)),
                  plain_reason="the test says so")
    other = X.Tree(0, backend="sim")  # a worker thread's
    oupd = segment(other, SGDGraph(other), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="oupd",
                   written_inputs=(0,))
    updr = segment(tree, UpdateThenNormGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16),
                   name="updr", written_inputs=(0,))
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    kept = []  # (tensor, what it read when made, label)
    log = []

    def check():
        for o, want, label in list(kept):
            try:
                v = o.values()
            except RuntimeError as e:
                assert "StaleTensorError" in str(e), e
                kept.remove((o, want, label))
                continue
            assert v == want, ("silently wrong", seed, label, v, want, log[-12:])

    def train(forward):
        for v in ws:
            if v.grad is not None and rng.random() < 0.8:
                v.grad.fill([0, 0, 0, 0])
        out, saved = call(forward, x, *ws)
        want = plus(x, ws[0])
        (g,) = bw(saved, t)
        ws[0].accumulate(g)
        del saved, g
        if rng.random() < 0.5:
            kept.append((out, want, "loss%d" % it))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plain reason's, the bounds'
        for it in range(40):
            op = rng.choice(["train"] * 3 + ["read", "read", "read", "metric", "shift", "upd", "chain", "drop",
                             "drop", "replace", "none", "mark", "eagerbw", "ptrain", "read2", "dataw", "updret",
                             "again", "again", "oupd"])
            log.append(op)
            w = ws[rng.randrange(n)]
            try:
                if op in ("train", "ptrain"):
                    train(fw if op == "train" else pfw)
                elif op in ("read", "metric", "shift", "upd", "chain", "updret", "oupd") and w.grad is not None:
                    o = None
                    if op == "read":
                        want = plus(w, w.grad)
                        (o,) = call(opt, w, w.grad)
                    elif op == "metric":
                        ref = FakeTensor(4).fill([rng.randrange(5)] * 4)
                        want = plus(ref, w.grad)
                        (o,) = call(opt, ref, w.grad)
                        del ref
                    elif op == "shift":
                        k = rng.choice([-1, -2, 3])
                        want = [a + k for a in w.grad.values()]
                        (o,) = call(sh, w.grad, k)
                    elif op in ("upd", "oupd"):
                        want_w = plus(w, w.grad)
                        call(upd if op == "upd" else oupd, w, w.grad)
                        assert w.values() == want_w, ("silently wrong update", seed, log[-12:])
                    elif op == "updret":
                        (o,) = call(updr, w, w.grad)
                        want = plus(w, w.grad)
                    else:
                        live = []
                        for e in kept:
                            try:
                                live.append((e[0], e[0].values()))
                            except RuntimeError:
                                pass
                        if live:
                            src, sv = rng.choice(live)
                            want = [a + b for a, b in zip(sv, w.grad.values())]
                            (o,) = call(dyn, src, w.grad)
                    if o is not None:
                        assert o.values() == want, ("silently wrong at the call", seed, op, log[-12:])
                        if rng.random() < 0.7:
                            kept.append((o, want, "%s%d" % (op, it)))
                        del o
                elif op == "eagerbw":
                    saved = FakeTensor(4).fill(x.values())
                    (g,) = bw(saved, t)
                    if rng.random() < 0.5:
                        ws[0].accumulate(g)
                    else:
                        kept.append((g, g.values(), "g%d" % it))
                    del saved, g
                elif op == "read2":
                    for v in ws:
                        if v.grad is not None:
                            want = plus(v, v.grad)
                            (o,) = call(opt, v, v.grad)
                            assert o.values() == want
                            if rng.random() < 0.7:
                                kept.append((o, want, "r2_%d" % it))
                            del o
                elif op == "again" and w.grad is not None:
                    for _ in range(rng.randrange(1, 4)):
                        want = plus(w, w.grad)
                        (o,) = call(opt, w, w.grad)
                        assert o.values() == want, ("silently wrong at the call", seed, op, log[-12:])
                        if rng.random() < 0.5:
                            kept.append((o, want, "%s%d" % (op, it)))
                        del o
                elif op == "dataw" and w.grad is not None:
                    w.grad.view().fill([v + 1 for v in w.grad.values()])  # a view has a _version of its own, as .data
                elif op == "drop" and kept:
                    kept.pop(rng.randrange(len(kept)))
                elif op == "replace" and w.grad is not None:
                    w.grad = w.grad.clone()
                elif op == "none":
                    w.grad = None
                elif op == "mark":
                    tree.step_begin()
            except RuntimeError as e:
                if "StaleTensorError" not in str(e):
                    raise
            check()
    check()
    tree.check()
    other.check()


def test_each_host_allocation_of_making_calling_and_dropping_trees_and_segments_can_fail_and_loses_nothing():
    """Trees and segments made inside the run (Tree and Segment's own
    allocations), called, then dropped with an output alive; eager blocks
    on a tree's stream, one freed into the front cache under it, while the
    tree goes."""
    X.set_output_mover(fake_move_out)

    def setup():
        return _ns(trees=[], x=FakeTensor(4).fill([1, 2, 3, 4]))

    def run(st):
        t = X.Tree(0, backend="sim")
        seg = segment(t, Graph(t, 2.0, 1.0), spans=(16,), name="short")
        w = weighted_segment(t, 2, "weighted")
        ws = [FakeTensor(4).fill([1, 1, 1, 1]) for _ in range(2)]
        for _ in range(4):
            (y,) = call(seg, st.x)
            assert y.values() == [3, 5, 7, 9]
            (z,) = w(st.x, *ws)  # in y's step
            assert z.values() == [2, 3, 4, 5]
        live = _lib.cgt_torch_alloc(4096, -1, t.stream)
        cached = _lib.cgt_torch_alloc(4096, -1, t.stream)
        if cached:
            _lib.cgt_torch_free(cached, 4096, -1, t.stream)
        del seg, w, t
        gc.collect()
        assert y.values() == [3, 5, 7, 9]  # the tree's output outlives the objects
        del y, z
        gc.collect()
        X.empty_cache(-1)
        if live:
            _lib.cgt_torch_free(live, 4096, -1, None)
        if not (live and cached):
            raise FakeOutOfMemoryError("an eager block was refused")

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_a_random_graph_with_a_prelaunch_function_can_fail_and_loses_nothing():
    X.set_output_mover(fake_move_out)

    def setup():
        t = X.Tree(0, backend="sim")
        gen = Generator(t)
        return _ns(trees=[t], gen=gen, seg=random_segment(t, gen), x=FakeTensor(4).fill([1, 2, 3, 4]))

    def run(st):
        for _ in range(6):
            before = st.gen.offset
            (y,) = call(st.seg, st.x)
            v = y.values()
            # the state the graph read: the offset the prelaunch wrote (or the last one, in a plain run)
            assert v[1:] == [v[0] + 1, v[0] + 2, v[0] + 3] and v[0] in (before, before + 1), v
            del y

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 5, raised


def test_each_host_allocation_of_training_steps_with_an_in_place_optimizer_and_a_saved_parameter_can_fail():
    """The forward saves w itself; the optimizer writes w in place (written_inputs)."""
    X.set_output_mover(fake_move_out)

    def setup():
        tree = X.Tree(0, backend="sim")
        st = _ns(trees=[tree])
        st.fw = segment(tree, SavesParamGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                        name="fw", saved_from=1, grad_inputs=(1,))
        st.bw = segment(tree, UsesParamBackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC, ARG_TENSOR),
                        spans=(16, 16, 16), name="bw", backward=True)
        st.opt = segment(tree, SGDGraph(tree), kinds=(ARG_TENSOR_STATIC, ARG_TENSOR), spans=(16, 16), name="opt",
                         written_inputs=(0,))
        st.w, st.x, st.t = Leaf(4), FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
        return st

    def run(st):
        st.w.fill([0, 0, 0, 0])
        want_w = [0, 0, 0, 0]
        for i in range(5):
            st.w.grad = None
            out, saved, w_saved = call(st.fw, st.x, st.w)
            assert out.values() == [a + b for a, b in zip([1, 2, 3, 4], want_w)], i
            (g,) = st.bw(saved, w_saved, st.t)
            del saved, w_saved
            st.w.accumulate(g)
            del g
            try:
                call(st.opt, st.w, st.w.grad)
            except (MemoryError, FakeOutOfMemoryError):
                assert st.w.values() == want_w  # not applied: nothing half done
                raise
            want_w = [a + b for a, b in zip(want_w, [2, 3, 4, 5])]
            assert st.w.values() == want_w, i

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_another_threads_calls_reading_an_output_can_fail_and_loses_nothing():
    """Thread A (the main one, explicit steps) hands y = enc(x) to a thread
    B, whose dec(y) runs on B's tree while A's next step waits for that
    read (reads_in_flight.c); B's first read blocks until A's step end
    began."""
    X.set_output_mover(fake_move_out)

    def setup():
        main = X.Tree(0, backend="sim")
        trees = ThreadTrees()
        order = []
        stream = lambda: trees(0).stream  # noqa: E731
        st = _ns(trees=[main], getter=trees, order=order, x=FakeTensor(4),
                 enc=segment(main, Graph(main, 2.0, 1.0, stream=stream), spans=(16,), name="enc"),
                 reading=ReadingGraph(main, stream, order))
        st.reading.pause = 0.02  # long enough for A's end to reach its wait, 2x128 times over
        st.dec = segment(main, st.reading, spans=(16,), name="dec")
        return st

    def run(st):
        X.set_tree_getter(st.getter)
        try:
            for i in range(4):
                st.getter(0).explicit_steps = True
                st.getter(0).step_begin()
                st.x.fill([i, i + 1, i + 2, i + 3])
                handed = list(st.enc(st.x))
                got, errors = [], []
                st.reading.block = i == 0
                st.reading.started.clear()
                st.reading.go.clear()

                def b():
                    (z,) = st.dec(handed[0])
                    got.append(z.values())

                th = reader_thread(st.getter, b, errors)
                if i == 0:
                    st.reading.started.wait(0.5)  # B may have failed before its read
                    st.reading.go.set()
                    st.getter(0).step_begin()
                    (y2,) = st.enc(st.x)  # its step end waits for B's read
                    del y2
                th.join(10)
                assert not th.is_alive()
                if errors:
                    if "MemoryError" in errors[0] or "out of memory" in errors[0]:
                        raise MemoryError(errors[0])
                    raise AssertionError(errors)
                assert got == [[2 * v + 1 for v in (i, i + 1, i + 2, i + 3)]], (i, got)
                handed.clear()  # B is done with it: y dies here
        finally:
            st.reading.block = False
            X.set_tree_getter(None)
        for t in st.getter.made:
            t.check()

    raised = each_host_allocation_failed_in_turn(setup, run)
    assert len(raised) >= 10, raised


def test_each_host_allocation_of_a_frozen_backbone_a_head_through_an_eager_op_and_a_kept_grad_can_fail():
    """A frozen backbone that reruns its first call (rerun_first), a head
    saving its input (pair 1) whose parameter reaches it through an eager
    op of 3 nodes (the walk behind an input), a compiled call between
    forward and backward, and the kept .grad accumulated over steps."""
    X.set_output_mover(fake_move_out)
    X.set_grad_node_kind(lambda node_type: GRAD_NODE_KINDS.get(node_type, 0))
    try:
        def setup():
            tree = X.Tree(0, backend="sim")
            st = _ns(trees=[tree], backbone=frozen_backbone(tree),
                     other=segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="other"),
                     fw=segment(tree, ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16),
                                name="fw", saved_from=1, grad_inputs=(1,), pair=1),
                     bw=segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                                name="bw", backward=True, pair=1),
                     w=Leaf(4).fill([0, 0, 0, 0]), x=FakeTensor(4).fill([1, 2, 3, 4]),
                     t=FakeTensor(4).fill([1, 1, 1, 1]))
            return st

        def run(st):
            st.w.grad = None
            for i in range(5):
                (h,) = call(st.backbone, st.x)  # 5x
                assert h.values() == [5, 10, 15, 20]
                out, saved = call(st.fw, h, eager_op_of(st.w, 3))  # h + w, saving h
                assert out.values() == [5, 10, 15, 20]
                del h, out
                (o,) = call(st.other, st.x)  # a compiled call before the backward
                assert o.values() == [2, 3, 4, 5]
                del o
                (g,) = st.bw(saved, st.t)
                assert g.values() == [6, 11, 16, 21]
                st.w.accumulate(g)
                del saved, g
                assert st.w.grad.values() == [(i + 1) * v for v in (6, 11, 16, 21)], i

        raised = each_host_allocation_failed_in_turn(setup, run)
        assert len(raised) >= 10, raised
    finally:
        X.set_grad_node_kind(None)


def test_each_host_allocation_of_a_teacher_a_student_and_a_checkpointed_recompute_can_fail_and_loses_nothing():
    """An inference output (the teacher's) held for the training forward
    that may read it (inference watches), then a checkpointed block B whose
    recompute is a compiled call inside the backward (graph task id)."""
    X.set_output_mover(fake_move_out)
    task = [-1]
    X.set_graph_task_id(lambda: task[0])
    try:
        def setup():
            tree = X.Tree(0, backend="sim")
            gb = ForwardGraph(tree)
            return _ns(trees=[tree],
                       teacher=segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="teacher"),
                       student=segment(tree, ForwardGraph(tree), spans=(16,), name="student", saved_from=1),
                       bw=segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                                  name="bw", backward=True),
                       fb=X.Segment(tree, "fwB", gb, lambda inputs: gb(*inputs), alias, describe, span,
                                    bytes((ARG_TENSOR,)), (16,), 0, False, True, saved_from=1),
                       fc=segment(tree, ForwardGraph(tree), spans=(16,), name="fwC", saved_from=1),
                       bb=segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                                  name="bwB", backward=True),
                       bc=segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16),
                                  name="bwC", backward=True),
                       g=FakeTensor(4).fill([1, 1, 1, 1]), x=FakeTensor(4).fill([1, 2, 3, 4]))

        def run(st):
            try:
                for i in range(4):
                    task[0] = -1
                    (t,) = call(st.teacher, st.x)
                    y, saved = call(st.student, st.x)
                    assert t.values() == [5, 10, 15, 20]
                    task[0] = 3
                    (gx,) = st.bw(saved, st.g)
                    assert gx.values() == [4, 7, 10, 13]
                    del t, y, saved, gx
                    task[0] = -1
                    h, sb = call(st.fb, st.x)
                    del sb  # checkpointing keeps none of B's saved tensors
                    y, sc = st.fc(h)
                    task[0] = 7
                    (gh,) = st.bc(sc, st.g)
                    del sc
                    h2, sb2 = call(st.fb, st.x)  # the recompute, inside the backward
                    (gxb,) = st.bb(sb2, gh)
                    assert gxb.values() == [3 * a + 3 * 2 * a + 1 for a in (1, 2, 3, 4)], i
                    del h, y, gh, h2, sb2, gxb
            finally:
                task[0] = -1

        raised = each_host_allocation_failed_in_turn(setup, run)
        assert len(raised) >= 10, raised
    finally:
        X.set_graph_task_id(None)


def test_a_record_stream_refused_for_want_of_host_memory_is_counted_and_changes_nothing():
    """record_stream(p, S2) whose note of S2 cannot grow raises MemoryError;
    it is counted (records_refused), and on CUDA memory the host first
    waits for S2's work so far (records_refused_synced; the simulator's
    memory is no CUDA memory: the GPU test checks the wait). The block's
    recorded streams are as before, and the record, made again, is kept."""
    X.empty_cache(-1)
    p = eager_alloc(4096, S1)
    try:
        f0 = X.alloc_figures()
        X._fail_host_alloc(1)
        try:
            with pytest.raises(MemoryError):
                X.record_stream(p, S2)
        finally:
            left = X._fail_host_alloc(0)
        assert left == 0, "record_stream allocated nothing: the case is not reached"
        f1 = X.alloc_figures()
        assert f1["records_refused"] == f0["records_refused"] + 1
        assert f1["records_refused_synced"] == f0["records_refused_synced"]  # no CUDA memory here
        assert f1["recorded_streams"] == f0["recorded_streams"]
        X.record_stream(p, S2)
        assert X.alloc_figures()["recorded_streams"] == f0["recorded_streams"] + 1
    finally:
        eager_free(p, 4096, S1)
        X.empty_cache(-1)


# ------------------------------------------- going plain mid-run (a helper's hunt)

def test_a_training_forward_that_raises_at_its_warmup_holds_its_saved_input_until_its_backward(tree):
    """A head (saving its input h, an output of this step) whose warm-up
    raises (a call PyTorch refuses under capture) goes plain at that call
    and runs as the plain graph. That plain call must hold the step for its
    saved h as seg_call_bypassed's does: the second forward of a contrastive
    pair began a step, and the first backward raised StaleTensorError where
    Inductor computes."""
    backbone = frozen_backbone(tree)
    hg = HeadSavingItsInput(tree)
    fail = [False]

    def launch(inputs):
        if fail[0]:
            fail[0] = False
            raise RuntimeError("refused under capture")
        return hg(*inputs)

    head = X.Segment(tree, "head", hg, launch, alias, describe, span, bytes((ARG_TENSOR,)), (16,), 0, False,
                     saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    t = FakeTensor(4).fill([1, 1, 1, 1])
    x1, x2 = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([10, 20, 30, 40])
    head(*call(backbone, x1))  # its first call: plain
    fail[0] = True
    with pytest.warns(RuntimeWarning, match="raised while cgtree ran it"):
        z1, s1 = head(*call(backbone, x1))  # its warm-up raises: plain from now on
    z2, s2 = head(*call(backbone, x2))  # a second forward before the backwards
    (g2,) = bw(s2, t)
    (g1,) = bw(s1, t)
    assert g1.values() == [6, 11, 16, 21] and g2.values() == [51, 101, 151, 201]
    tree.check()


class CpuFake(FakeTensor):
    """A CPU tensor (memory-efficient attention's seed outside a capture)."""
    is_cuda = False
    dl_device = (1, 0)

    def get_device(self):
        return -1


def test_a_training_forward_that_turns_plain_at_an_argument_off_the_device_holds_its_saved_input(tree):
    """As above, through seg_call_off_device: the plain call held nothing."""
    backbone = frozen_backbone(tree)
    hg = HeadSavingItsInput(tree)
    head = segment(tree, lambda h, seed: hg(h), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="head",
                   saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    t, seed = FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(4)
    x1, x2 = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([10, 20, 30, 40])
    for _ in range(3):  # the head replays
        z, s = head(*call(backbone, x1), seed)
        bw(s, t)
        del z, s
    with pytest.warns(RuntimeWarning, match="not a CUDA tensor"):
        z1, s1 = head(*call(backbone, x1), CpuFake(4))
    z2, s2 = head(*call(backbone, x2), seed)
    (g2,) = bw(s2, t)
    (g1,) = bw(s1, t)
    assert g1.values() == [6, 11, 16, 21] and g2.values() == [51, 101, 151, 201]
    tree.check()
