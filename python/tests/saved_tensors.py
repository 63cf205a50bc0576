"""The tensors an autograd graph has saved for its backward, read from its
nodes that expose them (those of autograd.Functions, AOTAutograd's
CompiledFunctionBackward among them): python/tests/test_torch_training.py holds them to keep activations
alive, bench/torch_saved_lifetime.py follows them. Needs torch imported by
the caller first (after cgtree.torch where cgtree runs)."""
import torch


def saved_tensors_of(loss):
    """(node type name, tensor) for every tensor the backward of loss will
    read: new tensor objects over the saved ones (holding them keeps those
    activations alive past their backward)."""
    out, seen, todo = [], set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        try:
            saved = fn.saved_tensors
        except (AttributeError, RuntimeError):
            saved = ()
        out += [(type(fn).__name__, t) for t in saved or () if isinstance(t, torch.Tensor)]
        todo.extend(f for f, _ in fn.next_functions)
    return out
