"""What cgtree.torch decides about a graph at compile time, in pure Python
(no GPU, no C extension): which placeholders the graph writes to, whether it
draws random numbers, how many bytes a tensor spans, and how its outputs are
described to the C hot path."""
import operator

import torch

ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT, ARG_FLOAT, ARG_OTHER = range(5)

# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
_DL = {
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float64: (2, 64),
    torch.int64: (0, 64), torch.int32: (0, 32), torch.int16: (0, 16), torch.int8: (0, 8),
    torch.uint8: (1, 8), torch.bool: (6, 8),
}

_VIEWS = {
    "view", "reshape", "transpose", "permute", "t", "narrow", "select", "squeeze", "unsqueeze", "expand",
    "flatten", "unflatten", "as_strided", "view_as", "expand_as", "reshape_as", "diagonal", "unfold", "movedim",
    "moveaxis", "swapaxes", "swapdims", "split", "chunk", "unbind", "__getitem__", "getitem", "contiguous",
    "detach", "alias", "slice", "real", "imag", "tensor_split", "split_with_sizes",
}
_RNG = ("rand", "bernoulli", "multinomial", "normal", "uniform", "exponential", "cauchy", "geometric",
        "poisson", "seed")


def span(t):
    """Bytes from a tensor's first element to one past its last."""
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def describe(res):
    """(as_list, metas, consts) for segment.c, or None if a recording cannot
    carry these outputs (not a list/tuple, a CPU tensor, an unknown dtype)."""
    if not isinstance(res, (list, tuple)):
        return None
    metas, consts = [], []
    for x in res:
        if isinstance(x, torch.Tensor):
            dl = _DL.get(x.dtype)
            if x.device.type != "cuda" or dl is None or type(x) is not torch.Tensor and not isinstance(
                    x, torch.nn.Parameter):
                return None
            metas.append((x.data_ptr(), span(x), tuple(x.shape), tuple(x.stride()), dl[0], dl[1]))
            consts.append(None)
        else:
            metas.append(None)
            consts.append(x)
    return isinstance(res, list), tuple(metas), tuple(consts)


def _name(n):
    if n.op == "call_method":
        return n.target
    return getattr(n.target, "__name__", str(n.target))


def mutated_placeholders(gm):
    """Indices of placeholders the FX graph writes to, directly or through a
    view. Conservative: an over-marked input only becomes STATIC."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    root = {n: i for i, n in enumerate(placeholders)}
    mutated = set()
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method"):
            continue
        name = _name(n)
        first = n.args[0] if n.args else None
        writes = []
        if n.target is operator.setitem:
            writes.append(first)
        elif isinstance(n.target, torch._ops.OpOverload):
            for a, v in zip(n.target._schema.arguments, n.args):
                if a.alias_info is not None and a.alias_info.is_write:
                    writes.append(v)
            for a in n.target._schema.arguments:
                if a.alias_info is not None and a.alias_info.is_write and a.name in n.kwargs:
                    writes.append(n.kwargs[a.name])
        elif name.endswith("_") and not name.endswith("__") and not name.startswith("_"):
            writes.append(first)
        if "out" in n.kwargs:
            out = n.kwargs["out"]
            writes.extend(out if isinstance(out, (list, tuple)) else [out])
        for w in writes:
            if isinstance(w, torch.fx.Node) and w in root:
                mutated.add(root[w])
        if isinstance(first, torch.fx.Node) and first in root and (name in _VIEWS or n.target is operator.getitem):
            root[n] = root[first]
    return mutated


def _aot_mutated(n_inputs):
    """Inputs AOTAutograd saw mutated, when its metadata lines up with ours."""
    try:
        ctx = torch._guards.TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        info = getattr(meta, "input_info", None)
        if info is None or len(info) != n_inputs:
            return set()
        return {i for i, x in enumerate(info) if getattr(x, "mutates_data", False) or
                getattr(x, "mutates_metadata", False)}
    except Exception:
        return set()


# Names of ops that may call cuBLAS (matmul family, attention's math path,
# einsum, linalg). Matched as substrings of the op name, so "addmm",
# "baddbmm", "_scaled_dot_product_attention_math" and the like are caught.
# Over-matching costs one cuBLAS workspace (33 MiB on an H100); missing
# one would let cuBLAS allocate its workspace inside a launch (see
# _install.prewarm_blas), so the list is wide.
_BLAS = ("mm", "matmul", "linear", "bmm", "mv", "dot", "einsum", "tensordot", "attention", "linalg", "gemm",
         "bilinear", "conv", "lstm", "gru", "rnn", "cdist", "baddbmm", "addr", "outer", "ger", "inner", "kron",
         "chain_matmul", "matrix", "cholesky", "inverse", "solve", "lstsq", "householder", "geqrf", "orgqr",
         "ormqr", "slogdet", "logdet")
# Short names that would match too much as substrings ("lu" is in "relu"):
# matched as whole words of the op name split at "_" and ".".
_BLAS_WORDS = {"qr", "svd", "lu", "det", "eig", "eigh", "eigvals", "pinv", "trsm", "ger"}


def uses_cublas(gm):
    """True if the graph may call cuBLAS, so the tree's stream needs its
    cuBLAS workspace before the graph is warmed up or recorded."""
    for n in gm.graph.nodes:
        if n.op == "call_module":
            return True  # not inlined by Dynamo: cannot tell, assume it may
        if n.op not in ("call_function", "call_method"):
            continue
        name = _name(n).lower()
        if n.target is operator.matmul or n.target is operator.imatmul or any(k in name for k in _BLAS):
            return True
        if _BLAS_WORDS.intersection(name.replace(".", "_").split("_")):
            return True
    return False


def draws_random_numbers(gm):
    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method"):
            continue
        name = _name(n).lower()
        if "dropout" in name:
            training = n.kwargs.get("training", n.kwargs.get("train", n.args[2] if len(n.args) > 2 else True))
            if training is not False:
                return True
        elif any(k in name for k in _RNG):
            return True
    return False
