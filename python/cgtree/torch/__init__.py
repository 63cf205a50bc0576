"""cgtree as a torch.compile backend.

    import cgtree.torch                      # first: installs cgtree's CUDA allocator
    model = torch.compile(model, backend="cgtree")

Every graph Inductor compiles (the pieces between graph breaks, below
AOTAutograd) runs without Inductor's own CUDA graphs and becomes a segment
of one cgtree tree per device and thread: warmed up, recorded, replayed; new
branches restore the pool's checkpoint; all recordings share one pool, and
every byte a segment allocates comes from it. Each call of the compiled
model begins a step (PyTorch's inference heuristic); ``step_begin()`` begins
one explicitly. An output kept past its step raises on any access of its
data (clone what you keep); passed to a compiled call it raises
StaleTensorError. See docs/torch.md.

``make_graphed_callables(callables, sample_args)`` is
torch.cuda.make_graphed_callables with every callable's forward and
backward graphs in the one tree and pool (docs/torch.md, "Graphed eager
modules").
"""
import os

try:
    from ._install import CgtreeError, StaleTensorError, install, installed
    from . import _install
    from ._backend import backend
    from ._graphed import make_graphed_callables
except ImportError as _e:  # a build without CUDA has no cgtree._torch_ext
    _why = str(_e)

    class CgtreeError(RuntimeError):
        pass

    class StaleTensorError(CgtreeError):
        pass

    def installed():
        return False

    def install():
        raise CgtreeError("cgtree.torch needs cgtree built with CUDA (cgtree._torch_ext is missing: %s)" % _why)

    def backend(gm, example_inputs, **kwargs):
        install()

    def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
        install()

    class _NoTrees:
        @staticmethod
        def trees():
            return []

        thread_trees = trees

        @staticmethod
        def trees_and_freed_stats():
            return [], {}

        @staticmethod
        def set_explicit_steps(on):
            install()

        @staticmethod
        def set_budget(max_graphs=0, max_graph_bytes=0):
            install()

    _install = _NoTrees()

__all__ = ["backend", "make_graphed_callables", "install", "installed", "step_begin", "set_step_mode", "set_budget", "stats", "memory_stats", "empty_cache", "nodes",
           "reset_peak",
           "CgtreeError", "StaleTensorError"]


def step_begin():
    """End the calling thread's current step on every device, as
    torch.compiler.cudagraph_mark_step_begin() does for every thread: the
    step ends at the thread's next compiled call on that device, and its
    outputs still alive become stale there (any access raises); an
    argument of that call moves to memory of its own first, as in the
    x = f(x) loop. Until then nothing of the trees runs, and every output
    still reads its data."""
    for tree in _install.thread_trees():
        tree.step_begin()


def set_budget(max_graphs=0, max_graph_bytes=0):
    """A recording budget for the trees made from now on (set it before the
    first compiled call): at most max_graphs recorded graphs and
    max_graph_bytes in their executables; 0 is no cap. Graphs compiled with
    dynamic=True record once per concrete shape, so a program whose shapes
    come and go stays within it: the least recently replayed recordings off
    the current path are evicted (a warning says so once) and recorded again
    when reached. CGTREE_TORCH_MAX_GRAPHS sets max_graphs too."""
    _install.set_budget(max_graphs, max_graph_bytes)


def set_step_mode(mode):
    """How the calling thread's steps begin. "call" (default): at every call
    of a compiled model, PyTorch's inference heuristic. "explicit": only at
    step_begin() and torch.compiler.cudagraph_mark_step_begin(). Dynamo's
    call counter is process-wide, so threads that call compiled models
    concurrently should use "explicit" and call step_begin() before each
    call: another thread's call then cannot end this thread's step. (Not
    cudagraph_mark_step_begin() there: PyTorch's mark is one counter for
    the process, and begins a step on every thread's trees.) Set it
    before the thread's first compiled call: the trees a thread makes in
    "explicit" mode run on a non-blocking stream, so that other threads'
    work on the legacy default stream cannot meet their captures (events
    order it with the caller's stream)."""
    if mode not in ("call", "explicit"):
        raise ValueError("set_step_mode: mode is 'call' or 'explicit', not %r" % (mode,))
    _install.set_explicit_steps(mode == "explicit")


def stats():
    """cgtree's counters summed over devices and threads (recordings,
    replays, pool figures...) plus the backend's own (outputs made, stale
    arguments refused, graphs run plainly). ``graphs`` counts the
    recordings the trees hold, which a budget bounds; ``graphs_compiled``
    the graphs torch.compile handed the backend, ``graphs_plain`` those of
    them that run as plain Inductor graphs. Trees of threads that exited
    are freed once none of their outputs lives: their counters stay in the
    sums, and what they held (pool, graphs, nodes) leaves them; ``trees``
    counts the trees alive, ``trees_freed`` those freed."""
    from .. import _torch_ext
    from ._backend import _segments

    total = _torch_ext.zero_stats()  # every key, before the first tree too
    live, freed = _install.trees_and_freed_stats()
    for k, v in freed.items():
        total[k] = total.get(k, 0) + v
    for tree in live:  # one freed since gives its counters at its close
        for k, v in tree.stats().items():
            total[k] = total.get(k, 0) + v
    total["trees"] = len(live)
    total["trees_freed"] = _torch_ext.alloc_figures()["trees_freed"] if installed() else 0
    if installed():  # which uses of DLPack's C exchange API are on (python/_torch_ext/exchange.c)
        for k, v in _torch_ext.exchange_info().items():
            total["exchange_" + k] = v
    hook = _install._state["record_stream_hook"]  # PyTorch's C++ recordStream calls reach the allocator (_record_stream.py)
    total["record_stream_hook"] = 1 if hook and hook[0] else 0
    thrower = _install._state["oom_error"]  # eager out of memory raises torch.OutOfMemoryError (_oom_error.py)
    total["torch_out_of_memory_error"] = 1 if thrower and thrower[0] else 0
    # graphs: the recordings the trees hold (what a budget's max_graphs bounds), summed above;
    # graphs_compiled: the graphs torch.compile handed the backend, graphs_plain those run plainly
    total["graphs_compiled"] = len(_segments)
    total["graphs_plain"] = sum(1 for s in _segments if s.info["plain_reason"] is not None)
    return total


def nodes():
    """Every node of every tree: id, parent, segment, state, replays..."""
    out = []
    for tree in _install.trees():
        try:
            nodes = tree.nodes()
        except CgtreeError:
            if tree.closed:  # freed since (its thread exited): it has no nodes
                continue
            raise
        for n in nodes:
            n["device"] = tree.device
            out.append(n)
    return out


def memory_stats(device=None):
    """Device memory figures. PyTorch's own (torch.cuda.memory_stats and
    friends) cannot work under a swapped allocator, so cgtree reports them,
    under PyTorch's key names where the meaning is the same:

    - ``allocated_bytes.all.current`` / ``.peak``: bytes in use outside the
      tree's pool and in it together, counted as torch.cuda.memory_allocated
      counts (the peak is the most at one moment: what compares with
      torch.cuda.max_memory_allocated), summed over devices;
    - ``reserved_bytes.all.current`` / ``.peak``: what the driver's
      stream-ordered pool of ``device`` holds (default: the current device)
      plus the pools of that device's trees;
    - ``num_alloc_retries``, ``num_ooms``: eager allocations that first
      failed and were retried after a trim, and that failed for good.

    The front cache (freed eager blocks kept for the next allocation of the
    same device, stream and size class, served with no CUDA call):
    ``front_cache_hits`` (allocations it served), ``front_cache_bytes`` and
    ``front_cache_blocks`` (what it keeps for ``device`` now: not in use,
    but reserved), ``front_cache_returns`` (blocks it gave back to the
    driver's pool, over its bound or drained), ``front_cache_limit`` (its
    bound per device, CGTREE_TORCH_FRONT_CACHE_BYTES); and
    ``driver_allocations`` / ``driver_frees``, the blocks taken from and
    given back to the driver's pools. ``capture_allocations``: allocations
    made inside a CUDA graph capture cgtree did not begin
    (torch.cuda.graph...), which come from the driver and never enter the
    front cache; ``capture_free_nodes``: such blocks freed while their
    capture was open, as a node of its graph that no stream's work depends
    on (a side stream that joined back stays joined); ``frees_waiting_capture``: blocks whose give-back was put
    off (each once) because their stream, or a stream they were recorded
    on, was capturing a capture not their own; ``trims_without_sync``:
    trims (empty_cache, the retry after a refusal) that gave back only what
    was free already, without synchronising the device, because a recording
    of cgtree's might run or a capture not its own was known open;
    ``driver_alloc_errors``: allocations the driver's pool refused for
    another cause than memory (raised as "CUDA error: ...", not counted in
    num_ooms); ``records_refused``: record_stream calls that failed for
    want of host memory, and ``records_refused_synced``: those of them
    whose stream the host waited for before the call failed.

    cgtree's own figures keep their names: eager_* for memory outside the
    pool (parameters, inputs, eager ops), pool_* for the pools of the
    trees alive (a freed tree's, of a thread that exited, hold nothing),
    peak_bytes (= allocated_bytes.all.peak) and peak_bytes_bound =
    eager_peak + pool_peak (two peaks that may come at different moments:
    an upper bound while no tree was freed)."""
    import torch as _t
    from .. import _torch_ext

    if device is None:
        device = _t.cuda.current_device()
    elif isinstance(device, _t.device):
        device = device.index if device.index is not None else _t.cuda.current_device()
    f = _torch_ext.alloc_figures(int(device))
    pool_peak = pool_reserved = 0
    for tree in _install.trees():  # trees alive (a freed tree holds nothing)
        s = tree.stats()
        pool_peak += s["pool_peak_bytes"] + s["side_pool_peak_bytes"]
        if tree.device == int(device):  # reserved is the device's; the peaks are summed, as allocated is
            pool_reserved += s["pool_reserved_bytes"]
    f["pool_peak"] = pool_peak
    f["pool_reserved"] = pool_reserved
    f["peak_bytes"] = f["combined_peak"]
    f["peak_bytes_bound"] = f["eager_peak"] + pool_peak
    f["allocated_bytes.all.current"] = f["eager_in_use"] + f["pool_in_use"]
    f["allocated_bytes.all.peak"] = f["combined_peak"]
    f["reserved_bytes.all.current"] = f["device_reserved"] + pool_reserved
    f["reserved_bytes.all.peak"] = f["device_reserved_peak"] + pool_reserved
    return f


def empty_cache():
    """Free the trees of threads that exited whose outputs all died (they
    are freed at the next compiled call anyway), then give the front
    cache's blocks back to the driver's stream-ordered pools, and the
    memory those pools keep cached back to the device, on every device in
    use (torch.cuda.empty_cache's job; the live trees' pools keep their
    chunks: recorded graphs point into them)."""
    import torch as _t
    from .. import _torch_ext

    if installed():
        for d in range(_t.cuda.device_count()):
            _torch_ext.empty_cache(d)


def _torch_ext_figures():
    """The allocator's raw counters (tests and benchmarks)."""
    from .. import _torch_ext

    return _torch_ext.alloc_figures()


def reset_peak():
    """Restart eager_peak and peak_bytes from what is in use now, and the
    driver pools' reserved high-water marks (reserved_bytes.all.peak) from
    what they hold now, as torch.cuda.reset_peak_memory_stats does (the
    pool's own peak, pool_peak, is the tree's lifetime figure and is not
    reset)."""
    from .. import _torch_ext

    _torch_ext.reset_peak()


def _register_name():
    """backend="cgtree" works through the torch_dynamo_backends entry point once
    the package is installed; from a source tree (no entry point) register the
    name here. Never both: Dynamo refuses a name registered twice."""
    try:
        from importlib.metadata import entry_points

        if "cgtree" in entry_points(group="torch_dynamo_backends").names:
            return
        from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

        if "cgtree" not in _COMPILER_FNS:
            register_backend(compiler_fn=backend, name="cgtree")
    except Exception:  # noqa: BLE001 - an old torch: backend=cgtree.torch.backend still works
        pass


_register_name()

# `import cgtree.torch` installs the allocator when it can; when it cannot
# (CUDA already initialised), compiling with backend="cgtree" raises the reason.
if os.environ.get("CGTREE_TORCH_NO_INSTALL") != "1":
    try:
        import torch as _torch

        if _torch.cuda.is_available():
            install()
    except CgtreeError:
        pass
