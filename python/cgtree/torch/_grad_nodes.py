"""Which autograd nodes lead from a compiled function's input to the
parameters whose .grad may hold the pool.

A parameter can reach a compiled function through an eager op made at
each call: ``w.t()``, ``w.view(-1)``, a fused weight ``torch.cat([w1,
w2])``. The function's input is then no leaf, and w's gradient is the
backward's output, or a view of it, that AccumulateGrad takes over as
``w.grad``. cgtree must know w to move that ``.grad`` out of the pool when
it is kept past its step, so at each call of a training forward the C
extension walks ``grad_fn.next_functions`` from such an input (stale.c,
note_leaves_behind) and asks this module, once per node type, what a node
is:

- AccumulateGrad: its ``.variable`` is a leaf to note;
- a node whose backward hands its gradient on to its inputs as it is or as
  a view (a view, a transpose, a cat's slices, an add's operand, a clone):
  the walk goes on through it;
- anything else (a matmul, a norm, a slice's zero-filled gradient, a Python
  autograd Function such as AOTAutograd's CompiledFunctionBackward): the
  gradients behind it are new memory, or the compiled function's own call
  noted its leaves; the walk stops.

Only the node types PyTorch implements in C++ are named here (a Python
Function's node type is a heap type, whatever its name). The list comes
from PyTorch's derivatives: each of these backward formulas returns its
incoming gradient or a view of it for at least one input. Left out on
purpose: addmm, addmv and baddbmm, whose `self` gets the gradient itself
only where it is full-size (a Linear's bias is broadcast, so its gradient
is a sum): walking through them would follow every eager Linear's input
back at each call, for a case that hardly occurs.
"""
import re

ACCUMULATE, PASSES_ON, STOP = 1, 2, 0  # stale.c's GRAD_NODE_*

_PASSES_ON = frozenset((
    "View", "UnsafeView", "ReshapeAlias", "Alias", "T", "Transpose", "Permute", "Squeeze", "Unsqueeze",
    "Expand", "Cat", "Stack", "Add", "Sub", "Clone", "ToCopy", "ViewAsReal", "ViewAsComplex",
    # the operand they add to or copy gets the gradient itself (a review found them missing)
    "Copy", "SliceScatter", "Addcmul", "Addcdiv", "IndexAdd", "ScatterAdd", "IndexPut",
))
_BACKWARD = re.compile(r"^([A-Za-z]+)Backwards?\d*$")  # CopyBackwards, copy_'s, has an s
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by Python code


def grad_node_kind(node_type):
    """ACCUMULATE, PASSES_ON or STOP for an autograd node's type."""
    if node_type.__flags__ & _HEAP_TYPE:
        return STOP
    name = node_type.__name__
    if name == "AccumulateGrad":
        return ACCUMULATE
    m = _BACKWARD.match(name)
    return PASSES_ON if m and m.group(1) in _PASSES_ON else STOP
