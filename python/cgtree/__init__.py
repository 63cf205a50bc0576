"""cgtree — CUDA graph trees with checkpointed memory pools, from Python.

A compiler splits a program into segments at graph breaks and runs them
through a Tree. The first time a path is taken, the tree records one CUDA
graph per segment; later steps that take the same path replay them. All
recordings share one memory pool, checkpointed after each recording.

    import cgtree
    t = cgtree.Tree()                      # CUDA if a GPU is present, else the CPU simulator
    seg = t.segment("double", launch, n_inputs=1, n_outputs=1)
    x = cgtree.static(array)               # or cgtree.dynamic(array), or a Value
    for step in range(10):
        t.step_begin()
        (y,) = t.run(seg, (x,))            # replayed from step 2 on (warmup_runs=1)

A launch function `launch(l)` enqueues work on `l.stream`: real kernels on
CUDA (Triton, CuPy, PyTorch on an external stream), or Python callables on
the simulator with `cgtree.sim_launch(l.stream, fn, *args)`. It reads its
inputs with `l.input(i) -> (ptr, nbytes)`, allocates with `l.alloc(nbytes)`
and names its outputs with `l.set_output(i, ptr, nbytes)`. It is called for
warmup, recording and eager runs, never for a replay.

Values live until `v.release()` or the next `step_begin()`; every later use
raises `cgtree.StaleValue`. See docs/python.md.
"""
from . import _cgtree
from ._cgtree import (
    SEGMENT_NO_CAPTURE,
    Arg,
    BackendError,
    CaptureFailed,
    Error,
    InvalidArgument,
    Launch,
    NoDevice,
    OutOfMemory,
    SegmentFailed,
    StaleValue,
    StateError,
    Tree,
    Value,
    __version__,
    cuda_available,
    dynamic,
    host_memory,
    sim_launch,
    static,
    status_name,
)
from . import _view
from ._view import ValueView, dtype_info, host_array

_cgtree._set_view_impl(_view.view)

__all__ = [
    "Tree", "Value", "Arg", "Launch", "ValueView", "static", "dynamic", "sim_launch", "host_array", "host_memory",
    "cuda_available", "status_name", "dtype_info", "SEGMENT_NO_CAPTURE", "__version__",
    "Error", "InvalidArgument", "OutOfMemory", "StaleValue", "CaptureFailed", "BackendError", "NoDevice",
    "StateError", "SegmentFailed",
]
