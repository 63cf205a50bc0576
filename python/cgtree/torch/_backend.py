"""The torch.compile backend: each graph Dynamo hands over becomes a segment.

Inductor compiles the graph (its own CUDA graphs off: cgtree records
instead), and the compiled callable is wrapped in a ``_torch_ext.Segment``,
whose call is the C hot path. Here, at compile time, we decide everything the
hot path needs: which inputs are STATIC (parameters, buffers, addresses
Dynamo marked static, and any input the graph mutates: a DYNAMIC input is
copied into a placeholder, so writes to it would be lost), which arguments
are scalars that key the variant, and whether the graph draws random numbers
(a replay would repeat them, so such graphs are not made segments).

Graphs cgtree cannot carry run as plain Inductor graphs: graphs with no CUDA
tensor, graphs that draw random numbers, inputs on another device or on the CPU, and training graphs (inputs
that require grad with grad mode on: the forward's saved tensors would live
in the pool past the launch). Each case is logged once as a warning.
"""
import itertools
import warnings

import torch

from .. import _torch_ext as _ext
from . import _install

from ._graphs import (_DL, ARG_FLOAT, ARG_INT, ARG_OTHER, ARG_TENSOR, ARG_TENSOR_STATIC, _aot_mutated, describe,
                      draws_random_numbers, mutated_placeholders, span, uses_cublas)

_counter = itertools.count(1)
_segments = []  # every Segment made, for stats()

_from_dlpack = None


def alias(t, ptr):
    """t's layout over the memory at ptr (a pool placeholder): what the graph
    reads while it is warmed up or recorded for a DYNAMIC input."""
    global _from_dlpack
    if _from_dlpack is None:
        _from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
    code, bits = _DL[t.dtype]
    cap = _ext.alias_capsule(ptr, tuple(t.shape), tuple(t.stride()), code, bits, t.device.index)
    return _from_dlpack(cap)


_warned = set()


def _warn_once(key, msg):
    if key not in _warned:
        _warned.add(key)
        warnings.warn("cgtree.torch: " + msg, RuntimeWarning, stacklevel=3)


def _copy_graph(gm):
    """compile_fx mutates the graph it is given (pytorch issue 138980), and
    Dynamo may hand the same GraphModule on; Inductor gets a copy. Graph.graph_copy
    copies the nodes and shallow-copies their meta (a deepcopy would copy
    FakeTensors)."""
    g = torch.fx.Graph()
    out = g.graph_copy(gm.graph, {})
    g.output(out)
    return torch.fx.GraphModule(gm, g)


def backend(gm, example_inputs, **kwargs):
    """torch.compile(model, backend="cgtree"): Inductor kernels, cgtree graphs."""
    from torch._inductor.compile_fx import compile_fx

    _install.require_installed()
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    cuda = [x for x in tensors if x.device.type == "cuda"]
    patches = {"triton.cudagraphs": False}
    if not cuda:
        return compile_fx(_copy_graph(gm), example_inputs, config_patches=patches)
    device = cuda[0].device
    mutated = mutated_placeholders(gm)
    rng = draws_random_numbers(gm)
    training = torch.is_grad_enabled() and any(x.requires_grad for x in tensors)
    compiled = compile_fx(_copy_graph(gm), example_inputs, config_patches=patches)
    if rng:
        _warn_once("rng", "a graph that draws random numbers runs as a plain Inductor graph (a replay would "
                   "repeat the recorded random numbers)")
        return compiled
    if training:
        _warn_once("training", "training graphs (inputs that require grad) run as plain Inductor graphs; "
                   "wrap inference in torch.no_grad() or torch.inference_mode()")
        return compiled
    if any(x.device != device for x in tensors):
        _warn_once("devices", "a graph with inputs on several devices (or the CPU) runs as a plain Inductor graph")
        return compiled
    if any(x.dtype not in _DL for x in tensors):
        _warn_once("dtype", "a graph with an input dtype DLPack cannot describe runs as a plain Inductor graph")
        return compiled
    mutated |= _aot_mutated(len(example_inputs))

    kinds, spans, dynamic = [], [], False
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            static = (isinstance(x, torch.nn.Parameter) or getattr(x, "_dynamo_static_input_type", None) is not None
                      or i in mutated)
            kinds.append(ARG_TENSOR_STATIC if static else ARG_TENSOR)
            spans.append(span(x))
        elif isinstance(x, (bool, int, torch.SymInt)):
            kinds.append(ARG_INT)
            spans.append(0)
            dynamic = True
        elif isinstance(x, (float, torch.SymFloat)):
            kinds.append(ARG_FLOAT)
            spans.append(0)
        else:
            kinds.append(ARG_OTHER)
            spans.append(0)

    tree, stream = _install.tree_for(device.index)
    if uses_cublas(gm) and _install.blas_clear() is None:
        _install.prewarm_blas(device.index)  # an old PyTorch: the workspace outside the pool
    # compile_fx's callable takes the graph's arguments positionally. (It carries
    # a _boxed_call attribute copied from the boxed function it wraps: ignore it.)
    plain = compiled

    def launch(inputs):
        with torch.cuda.stream(stream):
            return plain(*inputs)

    # A graph that mutates no input may run a second time at its first call,
    # so that what it returns lies in the pool (segment.c, first_call).
    seg = _ext.Segment(tree, "graph%d" % next(_counter), plain, launch, alias, describe, span, bytes(kinds),
                       tuple(spans), 0, dynamic, not mutated)
    _segments.append(seg)
    return seg
