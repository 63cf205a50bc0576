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
_state = {"installed": False, "allocator": None, "error": None}
_trees = {}  # device index -> (Tree, torch stream over the tree's stream)


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
        _ext.init_hot_path(from_dlpack, torch._C._cuda_getCurrentRawStream, GenerationTracker, torch.Tensor)
        _state["allocator"] = alloc  # PyTorch holds it too; keep ours for clarity
        _state["installed"] = True
        _state["error"] = None


def require_installed():
    if not _state["installed"]:
        try:
            install()
        except CgtreeError:
            raise
        except Exception as e:  # pragma: no cover - anything else PyTorch raises
            raise CgtreeError("cgtree.torch could not install its allocator: %s" % e) from e


def _prewarm(stream, device):
    """cuBLAS keeps a workspace per (handle, stream), allocated at the first
    matmul on a stream. Were that first matmul inside a launch, the workspace
    would come from the pool and be freed under cuBLAS's feet when the launch
    returned. So the tree's stream does its first matmuls here, outside."""
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


def tree_for(device):
    """The one tree of a CUDA device and a torch stream over its stream."""
    entry = _trees.get(device)
    if entry is None:
        with _lock:
            entry = _trees.get(device)
            if entry is None:
                warmup = int(os.environ.get("CGTREE_TORCH_WARMUP_RUNS", "1"))
                tree = _ext.Tree(device, warmup_runs=warmup)
                stream = torch.cuda.ExternalStream(tree.stream, device=torch.device("cuda", device))
                _prewarm(stream, device)
                entry = (tree, stream)
                _trees[device] = entry
    return entry


def trees():
    return [t for t, _ in _trees.values()]
