"""make_graphed_callables: PyTorch's graphed callables, every graph in one tree.

    a, b = cgtree.torch.make_graphed_callables((a, b), ((x,), (h,)))

``torch.cuda.make_graphed_callables`` captures each callable's forward and
backward as two CUDA graphs, in the order it expects them to run, and a
program that takes another path between them (a host branch choosing the
next module) needs its own captures and pools for each path it may take.
cgtree's version has PyTorch's signature and observable behaviour, but
every callable's graphs are segments of the calling thread's one tree and
pool, so a host branch between graphed callables grows a branch of the tree.

The route. Each callable (a module's bound ``forward``, or the function) is
compiled with ``torch.compile(fn, backend=cgtree.torch.backend,
fullgraph=True, dynamic=False)``: the same machinery as
``torch.compile(model, backend="cgtree")`` (docs/torch.md, "Training"), so
AOTAutograd's forward and backward are Inductor-compiled segments, the
parameters are static inputs (keyed by address, never copied), the sample
shapes are fixed, and the outputs are ordinary autograd outputs. We chose
this over wrapping AOTAutograd's eager FX graphs ourselves: the backend's
decisions (static inputs, mutated inputs, saved activations, which graph is
a backward) come from Inductor's compile and are tested; a second path
would have to make them again. The price: the kernels are Inductor's, not
eager's, so results equal ``torch.compile`` bit for bit and eager (and
``torch.cuda.make_graphed_callables``) within rounding.

What we mirror of PyTorch (torch/cuda/graphs.py): a single callable gives
a single result, a tuple a tuple; an ``nn.Module`` comes back as itself,
its ``forward`` replaced by one that runs the graphs while the module's
``training`` flag is what it was when graphed and the original forward
otherwise; ``num_warmup_iters`` forward and backward passes on the sample
arguments run before we return, the backward through
``torch.autograd.grad`` with respect to the inputs and parameters that
require grad (so no ``.grad`` changes), with ``allow_unused_input`` passed
on; sample arguments are tensors only. What differs: ``pool`` is accepted
and ignored with a warning (a tree has one pool: every graph of the thread
is in it); a callable Dynamo cannot capture whole raises CgtreeError naming
it, before any module is changed; other shapes or ``requires_grad`` than the
samples' compile again instead of failing; outputs kept past their step
raise on access, where PyTorch's are overwritten by the next replay.
"""
import types
import warnings
import weakref

import torch

from . import _install

_GRAPHED = "_cgtree_graphed"  # in a graphed module's __dict__: its _Graphed state


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    """torch.cuda.make_graphed_callables with every callable's forward and
    backward graphs in the calling thread's one cgtree tree and pool.

    callables: an nn.Module or function, or a tuple of them (in the order
    they run); sample_args: a tuple of CUDA tensors for one callable, a
    tuple of such tuples for a tuple. Returns the same shape: modules come
    back with their forward replaced, functions as graphed functions.
    ``pool`` is ignored (cgtree has one pool per tree). Bad arguments raise
    TypeError or ValueError before anything changes; a callable with a
    graph break raises CgtreeError. See docs/torch.md, "Graphed eager
    modules"."""
    one, callables, per_args = _check(callables, sample_args, num_warmup_iters, need_cuda=True)
    _install.require_installed()
    if pool is not None:
        warnings.warn("cgtree.torch.make_graphed_callables: pool is ignored: every graph of the calling thread "
                      "lives in its tree's one pool", RuntimeWarning, stacklevel=2)
    from ._backend import backend

    return _make(one, callables, per_args, num_warmup_iters, allow_unused_input, backend)


def _check(callables, sample_args, num_warmup_iters, need_cuda):
    """(one, callables, per_args), or TypeError/ValueError saying what is wrong."""
    one = not isinstance(callables, tuple)
    if one:
        callables, sample_args = (callables,), (sample_args,)
    elif not isinstance(sample_args, (tuple, list)):
        raise TypeError("make_graphed_callables: for a tuple of %d callables, sample_args is a tuple of as many "
                        "tuples of tensors, not %s" % (len(callables), type(sample_args).__name__))
    if not callables:
        raise ValueError("make_graphed_callables: callables is an empty tuple")
    if len(sample_args) != len(callables):
        raise ValueError("make_graphed_callables: %d callables but %d tuples of sample_args (one per callable)"
                         % (len(callables), len(sample_args)))
    if type(num_warmup_iters) is not int or num_warmup_iters < 0:
        raise ValueError("make_graphed_callables: num_warmup_iters is an int >= 0, not %r" % (num_warmup_iters,))
    per_args = []
    for i, (c, args) in enumerate(zip(callables, sample_args)):
        where = "callables" if one else "callables[%d]" % i
        if not callable(c):
            raise TypeError("make_graphed_callables: %s is %s, not an nn.Module or a function"
                            % (where, type(c).__name__))
        if isinstance(c, torch.nn.Module) and _graphed_state(c) is not None:
            raise ValueError("make_graphed_callables: %s (%s) is graphed already" % (where, type(c).__name__))
        for j in range(i):
            if callables[j] is c and isinstance(c, torch.nn.Module):  # a function twice is two graphed functions
                raise ValueError("make_graphed_callables: callables[%d] is callables[%d] again" % (i, j))
        name = "sample_args" if one else "sample_args[%d]" % i
        if not isinstance(args, (tuple, list)):
            raise TypeError("make_graphed_callables: %s is a tuple of tensors (the arguments of %s), not %s"
                            % (name, where, type(args).__name__))
        for j, leaf in enumerate(torch.utils._pytree.arg_tree_leaves(*args)):
            if not isinstance(leaf, torch.Tensor):
                raise TypeError("make_graphed_callables: %s holds a %s (argument leaf %d); sample arguments are "
                                "tensors only, as in torch.cuda.make_graphed_callables"
                                % (name, type(leaf).__name__, j))
        per_args.append(tuple(args))
    for i, args in enumerate(per_args):  # after every type check: a wrong type is named first
        for j, leaf in enumerate(torch.utils._pytree.arg_tree_leaves(*args)):
            if need_cuda and leaf.device.type != "cuda":
                raise ValueError("make_graphed_callables: %s argument leaf %d is on %s; graphed callables run "
                                 "on CUDA tensors" % ("sample_args" if one else "sample_args[%d]" % i, j, leaf.device))
    return one, tuple(callables), per_args


def _label(one, i, c):
    return ("callables" if one else "callables[%d]" % i) + " (%s)" % getattr(c, "__qualname__", type(c).__name__)


def _make(one, callables, per_args, num_warmup_iters, allow_unused_input, backend):
    """Compile and warm up every callable, then (only if all succeeded)
    replace the modules' forwards. `backend` is cgtree's; CPU tests pass
    another to exercise the rest."""
    from ._backend import decisions

    made = []
    for i, (c, args) in enumerate(zip(callables, per_args)):
        module = isinstance(c, torch.nn.Module)
        fn = c.forward if module else c
        if module and _GRAPHED in c.__dict__:  # a deep copy of a graphed module: its own original forward
            fn = c.__dict__[_GRAPHED].original
        compiled = torch.compile(_own_frame(fn, args), backend=backend, fullgraph=True, dynamic=False)
        params = tuple(c.parameters()) if module else ()
        first = len(decisions)
        try:
            _warm_up(compiled, args, params, num_warmup_iters, allow_unused_input)
        except torch._dynamo.exc.Unsupported as e:
            raise _install.CgtreeError("make_graphed_callables: %s cannot be captured as one graph (Dynamo: %s); "
                                       "torch.cuda.make_graphed_callables needs capturable callables too"
                                       % (_label(one, i, c), str(e).split("\n")[0])) from e
        except torch._dynamo.exc.FailOnRecompileLimitHit as e:
            raise _install.CgtreeError("make_graphed_callables: %s was compiled more often than Dynamo's "
                                       "recompile_limit allows for one function (torch._dynamo.config."
                                       "recompile_limit): %s" % (_label(one, i, c), str(e).split("\n")[0])) from e
        except Exception as e:
            if hasattr(e, "add_note"):
                e.add_note("while cgtree.torch.make_graphed_callables warmed up %s" % _label(one, i, c))
            raise
        made.append((c, module, fn, compiled, decisions[first:]))
    out = []
    for c, module, fn, compiled, graphs in made:
        if module:
            _graph_forward(c, compiled, fn, graphs)
            out.append(c)
        else:
            compiled._cgtree_graphs = graphs
            out.append(compiled)
    return out[0] if one else tuple(out)


_frame_codes = {}  # (id of a method's function or of the callable, the samples' layout) -> (it, its frame's code)


def _own_frame(fn, args):
    """fn behind a frame whose code object is its own: Dynamo keeps its
    cache, and counts its recompile_limit (8), per code object. torch.compile
    wraps every function without a source file of the program's (every
    torch.nn module's forward, a functools.partial) in one shared frame, and
    every nn.Sequential has one forward: graphed callables of ten built-in
    classes, ten partials, or five Sequential stages of other widths called
    in training and under no_grad, drew on one limit and raised, where
    PyTorch's version graphs them (helpers' audits). Callables of one
    method's function (one class's forward) whose samples have one layout
    (identical layers) share a code object, so their graphs and their
    limit; any other callable has one of its own per layout."""
    def graphed(*args, **kwargs):
        return fn(*args, **kwargs)

    owner = getattr(fn, "__func__", fn)  # a method's function: one class's forward; else the callable itself
    layout = tuple((tuple(a.shape), a.stride(), a.dtype, a.requires_grad)
                   for a in torch.utils._pytree.arg_tree_leaves(*args))
    key = (id(owner), layout)  # by identity: a callable object may not hash
    kept = _frame_codes.get(key)
    if kept is None:
        name = getattr(owner, "__qualname__", type(owner).__qualname__)
        name = "".join(ch if ch.isalnum() else "_" for ch in name)
        code = graphed.__code__.replace(co_name="graphed_%s_%d" % (name, len(_frame_codes)))
        kept = _frame_codes[key] = (owner, code)  # owner kept: its id stays its own
    graphed.__code__ = kept[1]
    return graphed


def _warm_up(compiled, args, params, n, allow_unused_input):
    """n forward and backward passes, as torch.cuda.make_graphed_callables
    warms up: the backward through autograd.grad with respect to the
    arguments and parameters that require grad, so no .grad changes (the
    gradients fed back are ones: any values serve)."""
    for _ in range(n):
        outs = [o for o in torch.utils._pytree.tree_leaves(compiled(*args))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        inputs = [a for a in torch.utils._pytree.arg_tree_leaves(*args) if a.requires_grad]
        inputs += [p for p in params if p.requires_grad]
        if outs and inputs:
            torch.autograd.grad(outs, inputs, grad_outputs=[torch.ones_like(o) for o in outs],
                                only_inputs=True, allow_unused=allow_unused_input)
        del outs


class _Graphed:
    """What a graphed module keeps (in its __dict__, under _GRAPHED): the
    module it was graphed for (a weak reference), its compiled forward, its
    original forward, its training flag then, and the graphs' decisions."""

    def __init__(self, module, compiled, original, graphs):
        self.owner, self.compiled, self.original = weakref.ref(module), compiled, original
        self.training, self.graphs = module.training, graphs


def _graphed_forward(self, *args, **kwargs):
    """A graphed module's forward, bound to the module: the graphs while
    its training flag is what it was when graphed, the original forward
    otherwise (as PyTorch's). Bound, not a closure over the module: a deep
    copy of the module (an EMA or a teacher made after graphing) kept the
    original's closure (deepcopy copies no function), so it computed with
    the original's parameters and sent its gradients to the original's
    .grad, silently (a helper's review; PyTorch's closure does so too).
    deepcopy binds a bound method to the copy, and the state's original
    forward with it, while the weak reference still names the original:
    the copy runs its own forward eagerly, and may be graphed in turn."""
    state = self.__dict__[_GRAPHED]
    if state.owner() is self and self.training == state.training:
        return state.compiled(*args, **kwargs)
    return state.original(*args, **kwargs)


def _graph_forward(module, compiled, original, graphs):
    module.__dict__[_GRAPHED] = _Graphed(module, compiled, original, graphs)
    module.forward = types.MethodType(_graphed_forward, module)


def _graphed_state(module):
    """module's _Graphed state if it is graphed (a deep copy of a graphed
    module is not: it runs eagerly), else None."""
    state = module.__dict__.get(_GRAPHED)
    return state if state is not None and state.owner() is module else None


def graphs_of(graphed):
    """What the backend decided for each graph compiled while `graphed` (a
    result of make_graphed_callables) warmed up: the dicts of
    cgtree.torch._backend.decisions, with "graph" ("forward", "backward",
    "inference") and, for a segment, "segment" (its nodes' name in
    cgtree.torch.nodes()). Empty when its code was compiled before (another
    callable with the same code and shapes shares its graphs)."""
    if isinstance(graphed, torch.nn.Module):
        state = _graphed_state(graphed)
        return list(state.graphs) if state is not None else []
    return list(getattr(graphed, "_cgtree_graphs", ()))
