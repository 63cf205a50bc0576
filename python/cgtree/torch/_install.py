"""Installing cgtree's allocator into PyTorch, and the trees (one per device and thread).

PyTorch lets one allocator serve all of CUDA, and only before CUDA is
initialised: ``torch.cuda.memory.change_current_allocator`` refuses once the
native caching allocator has been set up. So ``import cgtree.torch`` installs
it at once (when a GPU is present), and ``install()`` can be called
explicitly; both must come before the first CUDA tensor.
"""
import os
import sys
import threading
import warnings

import torch

from .. import _torch_ext as _ext
from . import _oom_error, _record_stream

CgtreeError = _ext.CgtreeError
StaleTensorError = _ext.StaleTensorError

_lock = threading.Lock()
_state = {"installed": False, "allocator": None, "error": None, "exchange": None, "exchange_stream": None,
          "record_stream_hook": None, "oom_error": None}
_local = threading.local()  # per thread: .trees {device: (Tree, torch stream over its stream)}
_all_trees = []  # every (Tree, stream) of every thread not freed yet (_prune_freed_locked drops the freed)
_freed = {}  # the counters of freed trees (Tree.stats() at their close), summed
_blas_ready = set()  # tree streams that have their cuBLAS workspace (prewarm_blas)


def installed():
    """True once cgtree's allocator serves PyTorch's CUDA allocations."""
    return _state["installed"]


def _env_count(name, what, limit=1 << 64):
    """The whole number >= 0 (and < limit) environment variable `name`
    says, or None if unset or empty. Raises CgtreeError naming the variable
    for anything else: a bad value is refused where it is read, not passed
    on to fail later as some other call's error."""
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0 or n >= limit:
        raise CgtreeError("%s must be %s >= 0, not %r" % (name, what, text))
    return n


def _env_bytes(name):
    """The number of bytes environment variable `name` says, or None if unset."""
    return _env_count(name, "a number of bytes")


def apply_env_bytes():
    """CGTREE_TORCH_CACHE_BYTES (what each device's stream-ordered pool keeps
    cached) and CGTREE_TORCH_FRONT_CACHE_BYTES (the front cache's bound per
    device, 0: off), where set. Raises CgtreeError for a value that is not a
    number of bytes, before anything is changed."""
    cache = _env_bytes("CGTREE_TORCH_CACHE_BYTES")
    front = _env_bytes("CGTREE_TORCH_FRONT_CACHE_BYTES")
    if cache is not None:
        _ext.set_cache_bytes(cache)
    if front is not None:
        _ext.set_front_cache_bytes(front)


def env_read_wait():
    """CGTREE_TORCH_READ_WAIT_WARN_SECONDS, or None if unset: after how many
    seconds a step's end that waits for another thread's call (one that
    reads an output of the step) warns, 0: never (reads_in_flight.c;
    default 10). Raises CgtreeError for a value that is not a number of
    seconds."""
    text = os.environ.get("CGTREE_TORCH_READ_WAIT_WARN_SECONDS")
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= 1e9:  # NaN too
        raise CgtreeError("CGTREE_TORCH_READ_WAIT_WARN_SECONDS must be a number of seconds >= 0, not %r" % text)
    return seconds


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
        mark = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
        if mark is None:  # checked before the allocator is swapped: nothing changed
            raise CgtreeError("cgtree.torch needs torch._C._set_storage_data_ptr_access_error_msg (PyTorch 2.11 "
                              "or later) to make stale outputs raise; this PyTorch is %s" % torch.__version__)
        read_wait = env_read_wait()  # read before anything changes, as apply_env_bytes reads its own
        apply_env_bytes()
        if read_wait is not None:
            _ext.set_read_wait_warning(read_wait)
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
                           getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None), mark, _mark_step_box(),
                           torch.OutOfMemoryError)
        _ext.set_tree_getter(_tree_of_this_thread)
        # a compiled call inside a backward (checkpointing's recompute) never begins a step (module.c)
        _ext.set_graph_task_id(getattr(torch._C, "_current_graph_task_id", None))
        # an output passed to the call that ends its step moves out of the pool (stale.c)
        from ._backend import move_out_of_pool
        _ext.set_output_mover(move_out_of_pool)
        # parameters a compiled function reaches through eager ops (w.t(), torch.cat([w1, w2])) are found
        # behind its inputs, so their kept .grad moves (stale.c, note_leaves_behind)
        from ._grad_nodes import grad_node_kind
        _ext.set_grad_node_kind(grad_node_kind)
        # cgtree's C++ library, built against this PyTorch (_cxx.py): PyTorch's recordStream calls reach the
        # allocator, and out of memory raises torch.OutOfMemoryError. Each falls back without it.
        _state["record_stream_hook"] = _record_stream.set_hook()
        _state["oom_error"] = _oom_error.set_thrower()
        if not _state["record_stream_hook"][0]:
            _record_stream.wrap_tensor_method()
            warnings.warn(_record_stream.WARNING % _state["record_stream_hook"][1], RuntimeWarning, stacklevel=2)
        _state["allocator"] = alloc  # PyTorch holds it too; keep ours for clarity
        _state["installed"] = True
        _state["error"] = None
        _state["exchange"] = _setup_or_off(setup_exchange, lambda: _ext.setup_exchange(None, (), []))


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
    a temporary of the launch in the pool (python/_torch_ext/seg_launch.c says
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
    returned. So each tree's stream does its first matmuls here, outside
    any launch, once, when the first graph becomes a segment."""
    tree, stream = tree_for(device)
    key = stream.cuda_stream
    if key in _blas_ready:
        return
    with _lock:
        if key in _blas_ready:
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
        _blas_ready.add(key)


def _mark_step_box():
    """The counter torch.compiler.cudagraph_mark_step_begin() moves, so
    that it begins a cgtree step too; None where this PyTorch has none."""
    try:
        from torch._inductor.cudagraph_trees import MarkStepBox

        return MarkStepBox if isinstance(getattr(MarkStepBox, "mark_step_counter", None), int) else None
    except Exception:  # noqa: BLE001 - an older or newer PyTorch: only step_begin() then
        return None


_TLS_KEY = "cgtree_torch_trees"


def _in_a_backward():
    """True while autograd's engine runs a backward on this thread."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _thread_trees():
    """The calling thread's trees by device. A backward runs on autograd's
    device thread, which serves every thread's backward; PyTorch copies
    objects stashed with torch._C._stash_obj_in_tls into it for the
    duration of each backward (PyTorch's CUDAGraph Trees stash their tree
    managers the same way), so a backward runs on the trees of the thread
    that called backward(), where its forward's saved activations live.
    The stash is read first: in a thread that made trees it is its own
    (the same dict as _local.trees), and in autograd's thread it is the
    caller's, even where a backward whose caller had no trees once made
    trees of autograd's thread's own (then later backwards of other
    threads would have run there, away from their forwards' trees)."""
    if torch._C._is_key_in_tls(_TLS_KEY):
        return torch._C._get_obj_in_tls(_TLS_KEY)
    trees = getattr(_local, "trees", None)
    if trees is not None:
        return trees
    trees = _local.trees = _ThreadTrees()
    _stash_in_tls(_TLS_KEY, trees)
    return trees


class _ThreadTrees(dict):
    """A thread's trees by device: {device: (Tree, torch stream)}. Only the
    thread's threading.local and PyTorch's thread-local stash hold it, and
    both let go when the thread exits: then each tree is orphaned, and
    freed, graphs, pool and stream, once no output of it lives and no
    capture is open (python/_torch_ext/tree_close.c). A program that runs
    compiled models on threads that come and go keeps only the trees of
    live threads and of outputs it still holds. ``owner``: the thread's
    identity, which its trees carry (Tree.owner_thread), so that another
    thread running on them (autograd's) never takes them for its own. Trees
    made inside a backward on a thread without a caller's stash (autograd's
    device thread, where a backward's caller had no trees) are nobody's (0):
    that thread runs every caller's backward, so the hot path asks for its
    tree at each call rather than keep these as its own. ``explicit``: the
    thread's step mode (set_explicit_steps), which the trees made for it
    take, also where autograd's thread makes one for its backward."""

    def __init__(self):
        super().__init__()
        self.owner = 0 if _in_a_backward() else threading.get_ident()
        self.explicit = False

    def __del__(self):
        if sys.is_finalizing():  # the process ends: CUDA may be gone, nothing is worth freeing
            return
        for tree, _ in self.values():
            try:
                tree.orphan()
            except Exception:  # noqa: BLE001 - out of host memory: the tree stays, as before
                pass


def _stash_in_tls(key, obj):
    """torch._C._stash_obj_in_tls(key, obj), with the reference the stash
    keeps, where this thread's stash does not hold obj under key already.
    The stash holds obj in a c10::SafePyObject, which releases a reference
    when the thread's state goes at its exit, but PyTorch (2.11 at least)
    hands it a borrowed pointer. Without this, a thread's exit took from
    its trees a reference nobody had given: they were freed while still
    held, and the freed memory's next owner was corrupted (a dict lost its
    keys after the thread test of test_torch_training.py, with Inductor's
    caches cold). A PyTorch whose stash takes its own reference gets none
    from us."""
    before = sys.getrefcount(obj)
    torch._C._stash_obj_in_tls(key, obj)
    if sys.getrefcount(obj) == before:
        _ext.give_reference(obj)


def tree_for(device):
    """The calling thread's tree of a CUDA device and a torch stream over
    its stream. Each thread has its own trees (and pools), as PyTorch's
    CUDAGraph Trees keep one per thread: two threads never record into one
    tree at once."""
    trees = _thread_trees()
    entry = trees.get(device)
    if entry is None:
        warmup = _env_count("CGTREE_TORCH_WARMUP_RUNS", "a number of runs", 1 << 31)
        warmup = 1 if warmup is None else warmup
        # The benchmarks' split of cgt_run into the graph launch and the rest.
        timed = os.environ.get("CGTREE_TORCH_TIME_LAUNCHES", "0") == "1"
        # The mode of the thread whose trees these are: on autograd's thread, making a tree for a
        # backward's caller, the caller's (its own _local says nothing of the caller).
        explicit = trees.explicit
        budget = {k: v for k, v in _budget.items() if v}
        # A thread that runs beside others (explicit mode) gets a non-blocking
        # stream, so that another thread's work on the legacy default stream
        # never meets this tree's captures (CUDA refuses the legacy stream
        # while a blocking stream captures, in every thread); events order it
        # with the caller's stream, the legacy one included. The tree makes
        # it and destroys it at its close: torch.cuda.Stream() hands out a
        # pool of 32 streams per device to every caller, so with many
        # threads another thread's work could land on the tree's stream and
        # join its captures.
        tree = _ext.Tree(device, warmup_runs=warmup, time_launches=timed, nonblocking=explicit, **budget)
        stream = torch.cuda.ExternalStream(tree.stream, device=torch.device("cuda", device))
        tree.explicit_steps = explicit
        tree.owner_thread = trees.owner  # made on autograd's thread for its caller, it is still the caller's
        with _lock:
            if not _ext.exchange_info()["stream"]:
                _state["exchange_stream"] = _setup_or_off(lambda: check_exchange_stream(device, stream),
                                                          lambda: None)
            entry = (tree, stream)
            _prune_freed_locked()
            _all_trees.append(entry)
        trees[device] = entry
    return entry


MAX_GRAPHS_LIMIT = _ext.MAX_GRAPHS_LIMIT  # CGT_MAX_GRAPHS_LIMIT (include/cgtree.h): the C library refuses more

# The recording budget of trees made from now on (cgtree.torch.set_budget).
_budget = {"max_graphs": _env_count("CGTREE_TORCH_MAX_GRAPHS", "a number of graphs up to %d" % MAX_GRAPHS_LIMIT,
                                    MAX_GRAPHS_LIMIT + 1) or 0,
           "max_graph_bytes": 0}


def set_budget(max_graphs=0, max_graph_bytes=0):
    """The recording budget of the trees made from now on: at most
    max_graphs recorded graphs and max_graph_bytes in their executables
    (0: no cap). Past it the least recently replayed recordings off the
    current path are evicted and made again when reached (docs/api.md,
    "Recording budget"). Checked here as cgtree's C library checks it when
    a tree is made, so a bad budget fails at this call, not later."""
    for name, v, top in (("max_graphs", max_graphs, MAX_GRAPHS_LIMIT), ("max_graph_bytes", max_graph_bytes, 2**64 - 1)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
            raise ValueError("set_budget: %s must be an int from 0 to %d, not %r" % (name, top, v))
    if 0 < max_graph_bytes < _ext.MIN_GRAPH_BYTES:
        raise ValueError("set_budget: max_graph_bytes must be 0 (no cap) or at least %d (CGT_MIN_GRAPH_BYTES), not %d"
                         % (_ext.MIN_GRAPH_BYTES, max_graph_bytes))
    _budget["max_graphs"], _budget["max_graph_bytes"] = max_graphs, max_graph_bytes


def _tree_of_this_thread(device):
    """The C hot path's getter (set_tree_getter): tree_for(device)'s tree.
    A backward asks at every call (autograd's device thread serves every
    thread's backward), so the usual case, a tree this thread's trees
    already hold, is read here directly: what tree_for would return, one
    Python call fewer."""
    entry = _thread_trees().get(device)
    return entry[0] if entry is not None else tree_for(device)[0]


def set_explicit_steps(on):
    """This thread's steps: False (default), a step begins at every call of
    a compiled model; True, only at step_begin() and
    torch.compiler.cudagraph_mark_step_begin(). Trees this thread makes
    while True run on a non-blocking stream (see tree_for)."""
    trees = _thread_trees()
    trees.explicit = bool(on)  # what tree_for reads, also on autograd's thread for this thread's backwards
    for tree, _ in trees.values():
        tree.explicit_steps = bool(on)


def thread_trees():
    """The calling thread's trees."""
    return [t for t, _ in getattr(_local, "trees", {}).values()]


def blas_ready(device):
    """True once this thread's tree stream on the device has its cuBLAS workspace."""
    return tree_for(device)[1].cuda_stream in _blas_ready


def _prune_freed_locked():
    """Drops the trees freed since (their threads exited, their outputs
    died): their counters are added to _freed, their streams leave
    _blas_ready."""
    kept = []
    for entry in _all_trees:
        tree, stream = entry
        if not tree.closed:
            kept.append(entry)
            continue
        for k, v in tree.stats().items():
            _freed[k] = _freed.get(k, 0) + v
        _blas_ready.discard(stream.cuda_stream)
    _all_trees[:] = kept


def trees():
    """Every tree of every thread that is not freed."""
    with _lock:
        _prune_freed_locked()
        return [t for t, _ in _all_trees]


def trees_and_freed_stats():
    """The trees not freed, and the counters of those freed so far, summed
    (their figures of memory held now are 0), at one moment: a tree freed
    meanwhile is in one or the other, never both or neither."""
    with _lock:
        _prune_freed_locked()
        return [t for t, _ in _all_trees], dict(_freed)
