"""Installing cgtree's allocator into PyTorch, and the trees (one per device).

PyTorch lets one allocator serve all of CUDA, and only before CUDA is
initialised: ``torch.cuda.memory.change_current_allocator`` refuses once the
native caching allocator has been set up. So ``import cgtree.torch`` installs
it at once (when a GPU is present), and ``install()`` can be called
explicitly; both must come before the first CUDA tensor.
"""
import os
import threading

import torch

from .. import _torch_ext as _ext

CgtreeError = _ext.CgtreeError
StaleTensorError = _ext.StaleTensorError

_lock = threading.Lock()
_state = {"installed": False, "allocator": None, "error": None, "exchange": None, "exchange_stream": None,
          "shim": None, "reuse": None}
_trees = {}  # device index -> (Tree, torch stream over the tree's stream)
_blas_ready = set()  # devices whose tree stream has its cuBLAS workspace (prewarm_blas)


def installed():
    """True once cgtree's allocator serves PyTorch's CUDA allocations."""
    return _state["installed"]


def install():
    """Make cgtree's allocator PyTorch's CUDA allocator (idempotent).

    Must run before PyTorch initialises CUDA (before the first CUDA tensor,
    ``.cuda()``, ``.to("cuda")`` or ``torch.cuda.current_device()``);
    afterwards it raises CgtreeError saying so.
    """
    with _lock:
        if _state["installed"]:
            return
        if not torch.cuda.is_available():
            raise CgtreeError("cgtree.torch: no CUDA device is available")
        alloc = torch.cuda.memory.CUDAPluggableAllocator(_ext.__file__, _ext.ALLOC_FN, _ext.FREE_FN)
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            msg = ("cgtree.torch must serve every CUDA allocation, so it has to be installed before PyTorch "
                   "initialises CUDA: put `import cgtree.torch` (or cgtree.torch.install()) before the first "
                   "CUDA tensor, .cuda() or .to('cuda'). PyTorch said: %s" % e)
            _state["error"] = msg
            raise CgtreeError(msg) from None
        from torch._dynamo.mutation_guard import GenerationTracker

        from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
        _ext.init_hot_path(from_dlpack, torch._C._cuda_getCurrentRawStream, GenerationTracker, torch.Tensor,
                           torch.Tensor.data_ptr, blas_clear(),
                           getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None))
        _state["allocator"] = alloc  # PyTorch holds it too; keep ours for clarity
        _state["installed"] = True
        _state["error"] = None
        _state["exchange"] = _setup_or_off(setup_exchange, lambda: _ext.setup_exchange(None, (), []))
        _state["shim"] = _setup_or_off(setup_shim, lambda: _ext.setup_shim(None, "", (), []))
        _state["reuse"] = _setup_or_off(setup_reuse, lambda: _ext.setup_reuse([], False))


def _setup_or_off(setup, off):
    """A fast path's setup, or, if it raised (a PyTorch this code has not
    seen), that path off with the reason: the Python API serves instead."""
    try:
        return setup()
    except Exception as e:  # noqa: BLE001
        off()
        return (False, "setup raised %s: %s" % (type(e).__name__, e))


# The exact types whose pointers the fast ways read (a subclass may answer
# data_ptr() differently), and the probes that prove them: CPU tensors of
# every kind the hot path meets (views with storage offsets, transposed,
# integer, Parameters with and without grad).
_SERVED = (torch.Tensor, torch.nn.Parameter)


def _probe_tensors():
    base = torch.arange(16, dtype=torch.float32)
    return [base, base[3:], base.view(4, 4).t(), base.view(4, 4)[1:, 2:], torch.zeros(2, dtype=torch.int64),
            torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(base[5:], requires_grad=False)]


def setup_exchange():
    """DLPack's C exchange API (torch.Tensor.__dlpack_c_exchange_api__, PyTorch
    2.11 and later) for the hot path's pointers and output tensors
    (python/_torch_ext/exchange.c): each use is on once it proves right on
    these probes, CPU tensors of every kind the hot path meets. Returns
    {"pointers", "outputs", "why"}. CGTREE_TORCH_EXCHANGE=0 keeps it off."""
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    why = None
    if type(api).__name__ != "PyCapsule":
        why = "torch.Tensor.__dlpack_c_exchange_api__ is %s, not a capsule" % type(api).__name__
    elif os.environ.get("CGTREE_TORCH_EXCHANGE", "1") == "0":
        why = "turned off"
    if why:
        _ext.setup_exchange(None, (), [])
        return {"pointers": False, "outputs": False, "why": why}
    return _ext.setup_exchange(api, _SERVED, [(t, t.data_ptr()) for t in _probe_tensors()])


def setup_shim():
    """Data pointers through PyTorch's C shim (aoti_torch_get_data_ptr;
    python/_torch_ext/shim.c): on once the tensor object's field is found and
    every probe, CPU tensors of every kind the hot path meets, reads back its
    data_ptr(). Returns (on, offset or why). CGTREE_TORCH_SHIM=0 keeps it off."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    if os.environ.get("CGTREE_TORCH_SHIM", "1") == "0" or not hasattr(torch.Tensor, "_cdata"):
        return _ext.setup_shim(None, "", (), [])
    return _ext.setup_shim(lib, "aoti_torch_get_data_ptr", _SERVED,
                           [(t, t._cdata, t.data_ptr()) for t in _probe_tensors()])


def setup_reuse(on=None):
    """Handing an output's tensor object back again when nobody holds it
    (python/_torch_ext/reuse.c), which saves making a tensor per output per
    replay. The C side proves where a TensorImpl keeps its StorageImpl and
    where a StorageImpl keeps its reference count; here we prove the rest of
    what its checks read: that a TensorImpl's count moves when C++ takes a
    reference, that its snapshot is stable while nothing changes, and that
    it sees each in-place change of metadata we can make. Returns (on, offset,
    why). CGTREE_TORCH_REUSE=0 keeps it off."""
    if on is None:
        on = os.environ.get("CGTREE_TORCH_REUSE", "1") != "0"
    use = getattr(torch._C, "_storage_Use_Count", None)
    if not _ext.shim_info()["offset"]:
        return _ext.setup_reuse([], False)
    if use is None:
        _ext.setup_reuse([], False)
        return (False, 0, "torch._C._storage_Use_Count is missing")
    alone, shared, param = torch.arange(16, dtype=torch.float32), torch.arange(8, dtype=torch.float32), \
        torch.nn.Parameter(torch.ones(3))
    view = shared[2:]
    tensors = (alone, shared, view, param, alone.view(4, 4))
    storages = [t.untyped_storage()._cdata for t in tensors]
    probes = [(t, t._cdata, sto, use(sto)) for t, sto in zip(tensors, storages)]
    found = _ext.setup_reuse(probes, False)
    if not found[1]:
        return found
    why = _reuse_unproven()
    if why:
        _ext.setup_reuse([], False)
        return (False, 0, why)
    return _ext.setup_reuse(probes, bool(on))


def _reuse_unproven():
    """Why reuse.c's checks cannot be trusted on this PyTorch, or None."""
    import warnings

    words = _ext.reuse_words
    low = 0xFFFFFFFF
    g = torch.ones(2)
    before = words(g)[0] & low
    holder = torch.zeros(2, requires_grad=True)
    holder.grad = g  # a C++ reference to g's TensorImpl
    held = words(g)[0] & low
    holder.grad = None
    if held != before + 1 or words(g)[0] & low != before:
        return "a TensorImpl's reference count is not where it was looked for (%d, %d)" % (before, held)
    t = torch.zeros(4, 4)
    snap = words(t)[2]
    junk = [torch.zeros(4, 4) for _ in range(64)]
    del junk
    if words(t)[2] != snap:
        return "a TensorImpl's snapshot changes while nothing changes the tensor"
    changes = {
        "requires_grad_()": lambda t: t.requires_grad_(),
        "unsqueeze_(0)": lambda t: t.unsqueeze_(0),
        "t_()": lambda t: t.t_(),
        "as_strided_ with an offset": lambda t: t.as_strided_((2, 2), (4, 1), 1),
        "resize_(2)": lambda t: t.resize_(2),
        "set_(another tensor)": lambda t: t.set_(torch.zeros(4, 4)),
        "rename_()": lambda t: t.rename_("a", "b"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # named tensors are a prototype
        for name, change in changes.items():
            t = torch.zeros(4, 4)
            snap = words(t)[2]
            change(t)
            if words(t)[2] == snap:
                return "the snapshot does not see %s" % name
    return None


def check_exchange_stream(device, stream):
    """The current stream through the exchange API: on when it agrees with
    the raw stream getter, asked at the same moment, on the default stream
    and on the tree's."""
    raw = torch._C._cuda_getCurrentRawStream
    with torch.cuda.stream(torch.cuda.default_stream(device)):
        on = _ext.check_exchange_stream(device, raw)
    if on:
        with torch.cuda.stream(stream):
            on = _ext.check_exchange_stream(device, raw)
    return on


def require_installed():
    if not _state["installed"]:
        try:
            install()
        except CgtreeError:
            raise
        except Exception as e:  # pragma: no cover - anything else PyTorch raises
            raise CgtreeError("cgtree.torch could not install its allocator: %s" % e) from e


def blas_clear():
    """torch._C._cuda_clearCublasWorkspaces, which drops every cuBLAS and
    cuBLASLt workspace PyTorch keeps (one per (handle, stream)), or None on a
    PyTorch without it. With it, each launch function drops the workspaces
    before and after it runs its graph, so the workspace its matmuls take is
    a temporary of the launch in the pool (python/_torch_ext/segment.c says
    why); without it, prewarm_blas gives the tree's stream its workspace
    outside the pool instead."""
    return getattr(torch._C, "_cuda_clearCublasWorkspaces", None)


def prewarm_blas(device):
    """The fallback for a PyTorch without blas_clear(). cuBLAS keeps a
    workspace per (handle, stream), allocated through the allocator at the
    first matmul on a stream and held until the process ends (PyTorch 2.11:
    32 MiB on sm90, `CUBLAS_WORKSPACE_CONFIG`, plus a 1 MiB cuBLASLt
    workspace). Were that first matmul inside a launch, the workspace would
    come from the pool and be reused under cuBLAS's feet once the launch
    returned. So the tree's stream does its first matmuls here, outside any
    launch, once per device, and only when a graph that may call cuBLAS
    becomes a segment (_graphs.uses_cublas): a program without matmuls never
    pays for the workspace."""
    tree, stream = tree_for(device)
    if device in _blas_ready:
        return
    with _lock:
        if device in _blas_ready:
            return
        dev = torch.device("cuda", device)
        with torch.cuda.device(dev), torch.cuda.stream(stream):
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                a = torch.ones(32, 32, device=dev, dtype=dt)
                b = a @ a
                b = torch.addmm(a[0], a, a)
                b = torch.nn.functional.linear(a, a, a[0])
                b = torch.bmm(a[None], a[None])
                b = torch.baddbmm(a[None], a[None], a[None])
                del b
        stream.synchronize()
        _blas_ready.add(device)


def tree_for(device):
    """The one tree of a CUDA device and a torch stream over its stream."""
    entry = _trees.get(device)
    if entry is None:
        with _lock:
            entry = _trees.get(device)
            if entry is None:
                warmup = int(os.environ.get("CGTREE_TORCH_WARMUP_RUNS", "1"))
                # The benchmarks' split of cgt_run into the graph launch and the rest.
                timed = os.environ.get("CGTREE_TORCH_TIME_LAUNCHES", "0") == "1"
                tree = _ext.Tree(device, warmup_runs=warmup, time_launches=timed)
                stream = torch.cuda.ExternalStream(tree.stream, device=torch.device("cuda", device))
                if not _ext.exchange_info()["stream"]:
                    _state["exchange_stream"] = _setup_or_off(lambda: check_exchange_stream(device, stream),
                                                              lambda: None)
                entry = (tree, stream)
                _trees[device] = entry
    return entry


def blas_ready(device):
    """True once the tree's stream on this device has its cuBLAS workspace."""
    return device in _blas_ready


def trees():
    return [t for t, _ in _trees.values()]
