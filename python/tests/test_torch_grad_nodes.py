"""Which autograd nodes lead from a compiled function's input to the
parameters behind it (cgtree.torch._grad_nodes), checked against PyTorch's
own graphs: the walk must go on exactly through the nodes that can hand a
parameter the backward's own memory as its gradient, so that a renamed
node or a changed backward formula shows here. Needs torch, not a GPU."""
import pytest

torch = pytest.importorskip("torch")

from cgtree.torch._grad_nodes import ACCUMULATE, PASSES_ON, STOP, grad_node_kind  # noqa: E402


class Backward(torch.autograd.Function):
    """A stand-in for a compiled function: its backward returns new tensors
    (in the inputs' layouts) and remembers where their memory lies."""
    made = []

    @staticmethod
    def forward(ctx, *xs):
        ctx.layouts = [(x.shape, x.stride(), x.dtype) for x in xs]
        return sum(x.sum().real if x.is_complex() else x.sum() for x in xs)

    @staticmethod
    def backward(ctx, g):
        outs = [torch.empty_strided(s, st, dtype=d).fill_(1) for s, st, d in ctx.layouts]
        Backward.made = [o.untyped_storage().data_ptr() for o in outs]
        return tuple(outs)


def chain(v):
    """The kinds of the nodes from v.grad_fn to the first AccumulateGrad,
    along the first edge of each that leads anywhere."""
    kinds, node = [], v.grad_fn
    while node is not None:
        kinds.append(grad_node_kind(type(node)))
        if kinds[-1] == ACCUMULATE:
            break
        node = next((n for n, _ in node.next_functions if n is not None), None)
    return kinds


PASSES = {  # eager ops whose backward hands the parameter the incoming gradient or a view of it
    "view": lambda p: p.view(-1), "reshape": lambda p: p.reshape(6, 4), "flatten": lambda p: p.flatten(),
    "t": lambda p: p.t(), "transpose": lambda p: p.transpose(0, 1), "mT": lambda p: p.mT,
    "permute": lambda p: p.permute(1, 0), "unsqueeze": lambda p: p.unsqueeze(0),
    "squeeze": lambda p: p.unsqueeze(0).squeeze(0), "cat": lambda p: torch.cat([p, p.detach()]),
    "stack": lambda p: torch.stack([p, p.detach()]), "add": lambda p: p + 1, "sub": lambda p: p - 1,
    "clone": lambda p: p.clone(), "to": lambda p: p.to(torch.float32, copy=True),
    "expand_to_its_shape": lambda p: p.expand(4, 6), "alias": lambda p: torch.ops.aten.alias(p),
    "view_as_real": lambda p: torch.view_as_real(torch.view_as_complex(p.reshape(-1, 2))),
    # the operand these add to or copy gets the gradient itself (a review found them missing)
    "copy_": lambda p: torch.zeros(4, 6).copy_(p), "slice_scatter": lambda p: torch.slice_scatter(
        torch.zeros(8, 6), p, 0, 0, 4), "addcmul": lambda p: torch.addcmul(p, torch.randn(4, 6), torch.randn(4, 6)),
    "addcdiv": lambda p: torch.addcdiv(p, torch.randn(4, 6), torch.randn(4, 6)),
    "index_add": lambda p: p.index_add(0, torch.arange(2), torch.randn(2, 6)),
    "scatter_add": lambda p: p.scatter_add(0, torch.zeros(1, 6, dtype=torch.long), torch.randn(1, 6)),
    "index_put_accumulate": lambda p: p.index_put((torch.arange(2),), torch.randn(2, 6), accumulate=True),
}
NEW_MEMORY = {  # eager ops whose backward makes the parameter's gradient new memory
    "mm": lambda p: p @ torch.ones(6, 2), "slice": lambda p: p[1:], "select": lambda p: p[0],
    "mul": lambda p: p * 2, "neg": lambda p: -p, "split": lambda p: p.split(2)[0],
    "unbind": lambda p: p.unbind(0)[0], "index": lambda p: p[torch.tensor([0, 2])],
}


@pytest.mark.parametrize("op", sorted(PASSES))
def test_the_walk_goes_through_each_node_that_hands_a_parameter_the_backwards_own_memory(op):
    p = torch.randn(4, 6, requires_grad=True)
    v = PASSES[op](p)
    kinds = chain(v)
    assert kinds[-1] == ACCUMULATE and set(kinds[:-1]) == {PASSES_ON}, kinds
    Backward.apply(v).backward()
    assert p.grad.untyped_storage().data_ptr() in Backward.made  # the case's condition: .grad is that memory


@pytest.mark.parametrize("op", sorted(NEW_MEMORY))
def test_the_walk_stops_at_each_node_whose_backward_makes_new_memory(op):
    p = torch.randn(4, 6, requires_grad=True)
    v = NEW_MEMORY[op](p)
    assert chain(v)[0] == STOP
    Backward.apply(v).backward()
    assert p.grad.untyped_storage().data_ptr() not in Backward.made  # the case's condition


def test_a_python_autograd_functions_node_stops_the_walk_whatever_its_name():
    """A Python Function named View has a node type named ViewBackward, a
    heap type: the walk stops there, as at AOTAutograd's
    CompiledFunctionBackward, whose own call noted its leaves."""

    class View(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view(-1)

        @staticmethod
        def backward(ctx, g):
            return g.view(4, 6)

    p = torch.randn(4, 6, requires_grad=True)
    v = View.apply(p)
    assert type(v.grad_fn).__name__.startswith("ViewBackward") and grad_node_kind(type(v.grad_fn)) == STOP
    compiled = torch.compile(lambda x: x * 2, backend="aot_eager")(p)
    assert grad_node_kind(type(compiled.grad_fn)) == STOP
