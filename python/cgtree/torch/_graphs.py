"""What cgtree.torch decides about a graph at compile time, in pure Python
(no GPU, no C extension).

Everything here reads what the compiler itself says, never names: which
inputs are STATIC comes from Inductor's ``static_input_idxs`` (parameters,
buffers, inputs Dynamo marked static), which inputs the graph writes comes
from the compiled graph's ``mutated_input_idxs`` (Inductor computes it from
the functionalized graph, so ``x += y``, ``_foreach_*_``, BatchNorm's running
statistics and user Triton kernels that write an input all land there),
and whether a graph draws random numbers comes from the
``nondeterministic_seeded`` tag PyTorch puts on every random operator. Where
the compiler says nothing, we assume the worst: every tensor input mutated.
"""
import torch

# ARG_GENERATOR: a torch.Generator the graph draws from (activation
# checkpointing's graph-safe random state); its identity keys the variant.
ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT, ARG_FLOAT, ARG_OTHER, ARG_GENERATOR = range(6)

# The one operator that swaps the generator's state in a way a capture can
# carry: AOTAutograd's graph-safe form of activation checkpointing, whose
# generators are arguments of the graph (_rng.py registers them with the
# recording). Every other operator that saves or restores the state reads
# or writes it on the host, which a replay cannot do.
GRAPHSAFE_RNG = "graphsafe_run_with_rng_state"

# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
_DL = {
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float64: (2, 64),
    torch.int64: (0, 64), torch.int32: (0, 32), torch.int16: (0, 16), torch.int8: (0, 8),
    torch.uint8: (1, 8), torch.bool: (6, 8),
}


def span(t):
    """Bytes from a tensor's first element to one past its last."""
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def _symbolic(t):
    return any(not isinstance(d, int) for d in tuple(t.shape) + tuple(t.stride()))


def ties(res):
    """For each result, (position, same): the earlier tensor result it is
    tied to and whether it is that very object (1) or another tensor over
    the same storage (0); (-1, 0) for none, and for what is no tensor.
    Inductor returns one buffer twice where a training forward hands the
    program a tensor it also saves for the backward (a sigmoid's output),
    and views of one buffer where it returns several; they must share
    autograd's version counter, so that a write to one in place raises at
    the backward, as under Inductor (seg_outputs.c, tied_output). A storage
    without memory (data pointer 0) ties nothing."""
    first_seen = {}  # a tensor object's id: its first position (res keeps every one alive)
    first_over = {}  # a storage's data pointer: the position of the first result over it
    out = []
    for i, x in enumerate(res):
        if not isinstance(x, torch.Tensor):
            out.append((-1, 0))
            continue
        tie = first_seen.setdefault(id(x), i)
        same = int(tie != i)
        if not same:
            base = x.untyped_storage().data_ptr()
            tie = first_over.setdefault(base, i) if base else i
        out.append((tie, same) if tie != i else (-1, 0))
    return out


def describe(res):
    """(as_list, metas, consts) for segment.c, or a sentence saying why a
    recording cannot carry these outputs (not a list or tuple, a tensor off
    the GPU, an unknown dtype, a tensor subclass).

    A meta's last two fields tie the output to an earlier one: ties()."""
    if not isinstance(res, (list, tuple)):
        return "the graph returned a %s, not a list or tuple" % type(res).__name__
    for i, x in enumerate(res):
        if isinstance(x, torch.Tensor):
            if x.device.type != "cuda":
                return "output %d is a tensor on %s (a recording returns CUDA tensors only)" % (i, x.device)
            if x.dtype not in _DL:
                return "output %d is a tensor of %s, a dtype DLPack cannot describe" % (i, x.dtype)
            if type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter):
                return "output %d is a %s, a tensor subclass" % (i, type(x).__name__)
    metas, consts = [], []
    tied = ties(res)  # after the checks: only plain tensors' storages are asked for
    for i, x in enumerate(res):
        if isinstance(x, torch.Tensor):
            dl = _DL[x.dtype]
            metas.append((x.data_ptr(), span(x), tuple(x.shape), tuple(x.stride()), dl[0], dl[1],
                          x.storage_offset() * x.element_size()) + tied[i])
            consts.append(None)
        else:
            metas.append(None)
            consts.append(x)
    return isinstance(res, list), tuple(metas), tuple(consts)


def graph_outputs(gm):
    """The nodes (or constants) gm returns, as a list."""
    outs = torch._inductor.utils.output_node(gm).args[0]
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def saved_on_cuda(gm, saved_from):
    """Positions, among a training forward's results, of the saved tensors
    (from saved_from on) that the compile saw on a CUDA device."""
    outs = graph_outputs(gm)
    found = []
    for i in range(saved_from, len(outs)):
        val = outs[i].meta.get("val") if isinstance(outs[i], torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            found.append(i)
    return tuple(found)


# Operators that, run outside a capture, read the random seed and offset
# they are given on the host (``*philox_seed.data_ptr<int64_t>()``) and,
# inside one, through device pointers: memory-efficient attention's
# backward, whose forward returns them so (CPU tensors outside a capture).
HOST_READ_SEEDS = ("aten::_scaled_dot_product_efficient_attention_backward", "aten::_efficient_attention_backward")
SEED_MAKERS = ("aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_forward")


def _schema_name(node):
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    return schema.name if schema is not None else None


def _is_seed_tensor(node):
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.int64 and val.dim() == 0


def _seed_inputs(node):
    """The graph inputs a seed argument is made from: the argument itself
    where it is one, else every 0-d int64 input among its ancestors (a view
    or copy of an input follows that input's device), up to the forward
    kernel that makes seeds inside the graph (an activation checkpoint's
    recompute), whose seeds lie where that run needs them."""
    seen, stack, found = set(), [node], []
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            if n is node or _is_seed_tensor(n):
                found.append(n)
        elif _schema_name(n) not in SEED_MAKERS:
            stack.extend(n.all_input_nodes)
    return found


def host_read_seeds(gm):
    """Positions of gm's inputs that an operator of HOST_READ_SEEDS reads as
    its philox_seed or philox_offset, directly or through a view or copy, in
    a call that draws (dropout_p not 0): the tensors a plain run of gm must
    be given on the CPU."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = set()
    for n in gm.graph.nodes:
        if _schema_name(n) not in HOST_READ_SEEDS or not _draws(n):
            continue
        for name in ("philox_seed", "philox_offset"):
            value, _ = _argument(n, name)
            if isinstance(value, torch.fx.Node):
                found.update(places.index(p) for p in _seed_inputs(value))
    return tuple(sorted(found))


def _moved(seq, positions, on, to, capturing):
    """seq, with each tensor at `positions` that lies on a device of type
    `on` copied to `to` (a new list or tuple, as seq was; seq itself where
    nothing moved, and always inside a capture, which cannot record such a
    copy). The copy is ordered on the current stream."""
    moved = None
    for i in positions:
        x = seq[i]
        if isinstance(x, torch.Tensor) and x.device.type == on:
            if capturing():
                return seq
            if moved is None:
                moved = list(seq)
            moved[i] = x.to(to)
    if moved is None:
        return seq
    return moved if isinstance(seq, list) else type(seq)(moved)


def onto_host(args, positions, capturing):
    """args, with each CUDA tensor at `positions` copied to the CPU, unless
    `capturing()`: what a plain run of a graph whose operators read those
    tensors on the host must be given (host_read_seeds). The copy waits
    for the current stream, which wrote them."""
    return _moved(args, positions, "cuda", "cpu", capturing)


def onto_device(res, positions, device, capturing):
    """res, with each tensor at `positions` that this run left on the CPU
    copied onto `device` (the same values; a list or tuple as res was).

    A compile sees PyTorch's fake tensors, and a fake kernel may say GPU
    where the real kernel, run outside a capture, returns CPU tensors:
    scaled-dot-product attention's memory-efficient kernel returns its
    random seed and offset so (on the GPU inside a capture).
    A training forward saves them for its backward, which was compiled for
    GPU tensors there, and a recording carries GPU tensors only: so a
    warmup's, or a first call's, are copied. With dropout 0 the backward
    never reads them; with dropout it reads them on the host outside a
    capture, and its plain runs copy them back (onto_host). Inside a
    capture (`capturing()`) a copy from host memory cannot be recorded:
    nothing is copied, and describe() then names the output a recording
    cannot carry."""
    return _moved(res, positions, "cpu", device, capturing)


def mutated_inputs(compiled, n_inputs):
    """Indices of the inputs the compiled graph writes, as Inductor says
    (CompiledFxGraph.mutated_input_idxs), or every index when the compiled
    object does not say: anything unknown is treated as mutating."""
    idxs = getattr(compiled, "mutated_input_idxs", None)
    if idxs is None:
        return set(range(n_inputs)), False
    return {int(i) for i in idxs}, True


def _graph_modules(gm):
    """gm and every graph nested in it (torch.cond branches, while_loop
    bodies, invoke_subgraph): random numbers drawn there count too."""
    seen = []
    for m in gm.modules():
        if isinstance(m, torch.fx.GraphModule) and m not in seen:
            seen.append(m)
    return seen


def _argument(node, name):
    """(value, True) of the schema argument `name` in this call (its default
    when not passed), or (None, False) if the operator has none."""
    for i, a in enumerate(node.target._schema.arguments):
        if a.name != name:
            continue
        if i < len(node.args):
            return node.args[i], True
        if name in node.kwargs:
            return node.kwargs[name], True
        return (a.default_value if a.has_default_value() else None), True
    return None, False


def _draws(node):
    """A tagged operator draws random numbers unless this call turns its
    randomness off: attention with dropout_p = 0 (every fused SDPA kernel
    carries the tag for its dropout), dropout with train = False or p = 0."""
    for name in ("train", "training"):
        value, has = _argument(node, name)
        if has and value is False:
            return False
    for name in ("dropout_p", "p"):
        value, has = _argument(node, name)
        if has and isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            return False
    return True


def random_use(gm):
    """(draws, restores), from one walk of the graph and the graphs nested in
    it. restores: the graph saves or restores the generator's state on the
    host, a higher-order operator whose name speaks of it (run_with_rng_state,
    run_and_save_rng_state: activation checkpointing where AOTAutograd does
    not use its graph-safe form); a replay cannot set the generator's state,
    so such graphs run plainly. draws: restores, or the graph-safe form
    (graphsafe_run_with_rng_state, whose generators are the graph's
    arguments: a recording registers them), or an operator carries
    PyTorch's nondeterministic_seeded tag and this call of it draws (rand*,
    dropout in training, bernoulli, multinomial, normal_, SDPA with a
    nonzero dropout_p...)."""
    tag = getattr(torch.Tag, "nondeterministic_seeded", None)
    draws = restores = False
    for g in _graph_modules(gm):
        for n in g.graph.nodes:
            if n.op != "call_function":
                continue
            if isinstance(n.target, torch._ops.HigherOrderOperator) and n.target.name() == GRAPHSAFE_RNG:
                draws = True
            elif isinstance(n.target, torch._ops.HigherOrderOperator) and "rng" in n.target.name():
                restores = True
            tags = getattr(n.target, "tags", None)
            if not draws and tags is not None and tag in tags and _draws(n):
                draws = True
            if draws and restores:
                return True, True
    return draws or restores, restores


def cudagraph_unsafe_op(gm):
    """The name of the first operator of gm (or of a graph nested in it, or
    wrapped by a higher-order operator such as auto_functionalized) that
    carries PyTorch's cudagraph_unsafe tag, or None. Such an operator's
    work cannot be recorded: what it does on the host (reads a Python
    global, counts calls, syncs) would be baked into the recording, and
    every replay would repeat the recording's. PyTorch's own CUDA graphs
    refuse graphs with one; so does cgtree (the graph runs plainly)."""
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    if tag is None:
        return None
    for g in _graph_modules(gm):
        for n in g.graph.nodes:
            if n.op != "call_function":
                continue
            for op in (n.target,) + tuple(a for a in n.args if isinstance(a, torch._ops.OpOverload)):
                if tag in (getattr(op, "tags", None) or ()):
                    return str(op)
    return None


def plan_inputs(example_inputs, static_idxs, mutated):
    """(kinds, spans, dynamic) for segment.c: STATIC for inputs the
    compiler calls static and inputs the graph writes (a DYNAMIC input is
    copied into a placeholder, so a write to it would be lost); DYNAMIC for
    other tensors; ints and generators (by identity) key the variant;
    dynamic is True when spans must be measured at every call (symbolic
    sizes, or int arguments)."""
    kinds, spans, dynamic = [], [], False
    static_idxs = set(static_idxs)
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor):
            static = i in static_idxs or i in mutated or isinstance(x, torch.nn.Parameter)
            kinds.append(ARG_TENSOR_STATIC if static else ARG_TENSOR)
            if _symbolic(x):
                dynamic = True
                spans.append(0)
            else:
                spans.append(span(x))
        elif isinstance(x, (bool, int, torch.SymInt)):
            kinds.append(ARG_INT)
            spans.append(0)
            dynamic = True
        elif isinstance(x, (float, torch.SymFloat)):
            kinds.append(ARG_FLOAT)
            spans.append(0)
        elif isinstance(x, torch.Generator):
            kinds.append(ARG_GENERATOR)
            spans.append(0)
        else:
            kinds.append(ARG_OTHER)
            spans.append(0)
    return kinds, spans, dynamic
