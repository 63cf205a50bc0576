"""cgtree.torch.make_graphed_callables without a GPU: its arguments are
checked before anything changes, and the part that mirrors PyTorch's
torch.cuda.make_graphed_callables (shapes of the result, the replaced
forward, the warm-up that leaves .grad alone, graph breaks named) runs on
CPU tensors through Dynamo's "eager" backend in place of cgtree's (which
needs CUDA). Needs torch (skips without it), not a GPU. The GPU cases are
in test_torch_graphed.py."""
import functools

import pytest

torch = pytest.importorskip("torch")

import cgtree.torch as ct  # noqa: E402
from cgtree.torch import _graphed  # noqa: E402


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def bad_cases():
    m, n = mlp(), mlp(1)
    x = torch.randn(4, 8)
    return [
        ("too few sample_args", (m, n), ((x,),), ValueError, r"2 callables but 1 tuples of sample_args"),
        ("a non-tensor sample arg", m, (x, 3), TypeError, r"sample_args holds a int .*tensors only"),
        ("a list inside, with a string", (m, n), ((x,), ([x, "y"],)), TypeError, r"sample_args\[1\] holds a str"),
        ("sample_args not a tuple", m, x, TypeError, r"sample_args is a tuple of tensors .* not Tensor"),
        ("a callable that is not", (m, 3), ((x,), (x,)), TypeError, r"callables\[1\] is int"),
        ("the same module twice", (m, m), ((x,), (x,)), ValueError, r"callables\[1\] is callables\[0\] again"),
        ("an empty tuple", (), (), ValueError, r"empty tuple"),
        ("negative warm-up", m, (x,), ValueError, r"num_warmup_iters"),
        ("a CPU sample", m, (x,), ValueError, r"is on cpu"),
    ]


@pytest.mark.parametrize("case", range(len(bad_cases())), ids=[c[0] for c in bad_cases()])
def test_bad_arguments_raise_type_or_value_errors_that_say_what_is_wrong_and_change_nothing(case):
    name, callables, sample_args, exc, match = bad_cases()[case]
    mods = [c for c in (callables if isinstance(callables, tuple) else (callables,)) if isinstance(c, torch.nn.Module)]
    kw = {"num_warmup_iters": -1} if name == "negative warm-up" else {}
    with pytest.raises(exc, match=match):
        ct.make_graphed_callables(callables, sample_args, **kw)
    for m in mods:
        assert "forward" not in vars(m), "a module's forward was replaced"
        assert all(p.grad is None for p in m.parameters())


def make(callables, sample_args, n=3):
    """The part after the argument check, with Dynamo's eager backend."""
    one, cs, per = _graphed._check(callables, sample_args, n, need_cuda=False)
    return _graphed._make(one, cs, per, n, False, "eager")


def test_modules_come_back_as_themselves_forward_replaced_and_the_warm_up_leaves_grad_alone():
    torch._dynamo.reset()
    a, b = mlp(), torch.nn.Sequential(torch.nn.Linear(1, 3))
    ra, rb = mlp(), torch.nn.Sequential(torch.nn.Linear(1, 3))
    rb.load_state_dict(b.state_dict())
    a[0].weight.grad = torch.full_like(a[0].weight, 7.0)
    x, h = torch.randn(4, 8), torch.randn(4, 1, requires_grad=True)
    ga, gb = make((a, b), ((x,), (h,)))
    assert ga is a and gb is b and "forward" in vars(a) and "forward" in vars(b)
    assert torch.equal(a[0].weight.grad, torch.full_like(a[0].weight, 7.0))
    assert all(p.grad is None for p in list(a.parameters())[1:] + list(b.parameters())), "warm-up touched .grad"
    assert h.grad is None
    loss = b(a(x)).square().sum()
    ref = rb(ra(x)).square().sum()
    torch.testing.assert_close(loss, ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match="graphed already"):
        ct.make_graphed_callables(a, (x,))


def test_a_module_in_the_other_training_mode_runs_its_original_forward_as_pytorchs_does():
    torch._dynamo.reset()
    runs = []

    def counting(gm, example_inputs):  # a backend whose graphs count their runs
        def run(*args):
            runs.append(1)
            return gm(*args)

        return run

    m = mlp()
    one, cs, per = _graphed._check(m, (torch.randn(4, 8),), 2, need_cuda=False)
    _graphed._make(one, cs, per, 2, False, counting)
    n = len(runs)
    assert n >= 2, "the warm-up ran the compiled forward"
    m(torch.randn(4, 8))
    assert len(runs) == n + 1, "in training mode (as graphed) the compiled forward runs"
    m.eval()
    m(torch.randn(4, 8))
    assert len(runs) == n + 1, "in eval mode the original forward runs"
    m.train()
    m(torch.randn(4, 8))
    assert len(runs) == n + 2


def test_a_single_function_gives_a_single_function_and_a_tuple_a_tuple():
    torch._dynamo.reset()

    def f(x, w):
        return torch.relu(x @ w)

    w = torch.randn(8, 3, requires_grad=True)
    g = make(f, (torch.randn(4, 8), w))
    assert callable(g) and not isinstance(g, tuple) and w.grad is None
    x = torch.randn(4, 8)
    torch.testing.assert_close(g(x, w), f(x, w), rtol=0, atol=0)
    gs = make((f,), ((torch.randn(4, 8), w),))
    assert isinstance(gs, tuple) and len(gs) == 1


def test_a_callable_with_a_graph_break_raises_cgtree_error_naming_it_and_no_module_changes():
    torch._dynamo.reset()
    m = mlp()

    def breaks(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    with pytest.raises(ct.CgtreeError, match=r"callables\[1\] \(.*breaks\) cannot be captured as one graph"):
        make((m, breaks), ((torch.randn(4, 8),), (torch.randn(3),)))
    assert "forward" not in vars(m)


def test_other_shapes_than_the_samples_compile_again_up_to_dynamos_limit_and_then_raise():
    """docs/torch.md: other shapes than the samples' compile (and, on a
    GPU, record) again instead of failing, forward and backward giving
    eager's numbers; a callable's graphs are bounded by Dynamo's
    recompile_limit per code object, and past it fullgraph=True raises."""
    import copy

    torch._dynamo.reset()  # the limit counts per code object, across callables: start from none
    m = mlp()
    ref = copy.deepcopy(m)
    make(m, (torch.randn(4, 8),))
    limit = torch._dynamo.config.recompile_limit
    g = torch.Generator().manual_seed(3)
    for batch in range(4, 4 + limit):  # the sample's shape, then limit - 1 others
        x = torch.randn(batch, 8, generator=g)
        for p in (*m.parameters(), *ref.parameters()):
            p.grad = None
        y, want = m(x), ref(x)
        torch.testing.assert_close(y, want)
        y.square().sum().backward()
        want.square().sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        m(torch.randn(4 + limit, 8, generator=g))
    x = torch.randn(5, 8, generator=g)  # a shape compiled before: its graph still serves
    torch.testing.assert_close(m(x), ref(x))


def test_built_in_modules_of_many_classes_and_stages_of_one_class_each_have_dynamos_limit_to_themselves():
    """Dynamo counts recompile_limit (8) per code object, and torch.compile
    wraps every torch.nn forward in one shared frame, while every
    nn.Sequential has one forward: ten built-in modules of ten classes
    raised while the ninth warmed up, and five Sequential stages of other
    widths, graphed in training and then called under no_grad, raised at
    the fourth call (a helper's audit), where PyTorch's version graphs and
    runs them. Each callable's frame has a code object of its own, shared
    only by callables of one function with samples of one layout."""
    torch._dynamo.reset()
    x = torch.randn(2, 16)
    mods = (torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.ReLU(), torch.nn.Tanh(),
            torch.nn.Sigmoid(), torch.nn.SiLU(), torch.nn.Softplus(), torch.nn.Dropout(0.0), torch.nn.ELU())
    want = [m(x) for m in mods]
    graphed = make(mods, tuple((x,) for _ in mods), n=1)
    for m, w in zip(graphed, want):
        torch.testing.assert_close(m(x), w, rtol=0, atol=0)
    torch._dynamo.reset()
    torch.manual_seed(0)
    stages = tuple(torch.nn.Sequential(torch.nn.Linear(8 * (i + 1), 8 * (i + 2))) for i in range(5))
    samples = tuple((torch.randn(2, 8 * (i + 1)),) for i in range(5))
    graphed = make(stages, samples, n=1)
    with torch.no_grad():
        for g, (s,) in zip(graphed, samples):
            torch.testing.assert_close(g(s), torch.nn.functional.linear(s, g[0].weight, g[0].bias), rtol=0, atol=0)
    torch._dynamo.reset()
    fns = (torch.sin, torch.cos, torch.tanh, torch.sigmoid, torch.relu, torch.exp, torch.neg, torch.abs,
           torch.square, torch.erf)
    partials = tuple(functools.partial(lambda f, s, t: f(t) * s, f, 2.0) for f in fns)  # one lambda's code
    graphed = make(partials, tuple((x,) for _ in partials), n=1)
    for g, f in zip(graphed, fns):
        torch.testing.assert_close(g(x), f(x) * 2.0, rtol=0, atol=0)


def test_identical_layers_share_one_frame_and_a_function_twice_is_two_graphed_functions():
    """Layers of one class with samples of one layout share their frame's
    code, so Dynamo compiles them once (their graphs are shared, as
    before). A function may come twice (used at two points of a network,
    as PyTorch's version allows: it captures each entry apart); a module
    twice is still refused (PyTorch's result for it wraps its own)."""
    torch._dynamo.reset()
    layers = tuple(torch.nn.Linear(8, 8) for _ in range(4))
    x = torch.randn(4, 8)
    frames = len(_graphed._frame_codes)
    make(layers, tuple((x,) for _ in layers), n=1)
    assert len(_graphed._frame_codes) <= frames + 1  # one frame's code for the four (or one made before)

    def f(x):
        return torch.nn.functional.gelu(x) * 2

    x1, x2 = torch.randn(4, 8), torch.randn(4, 16)
    frames = len(_graphed._frame_codes)
    g1, g2 = make((f, f), ((x1,), (x2,)), n=1)
    assert g1 is not g2 and len(_graphed._frame_codes) == frames + 2  # samples of two layouts
    torch.testing.assert_close(g1(x1), f(x1), rtol=0, atol=0)
    torch.testing.assert_close(g2(x2), f(x2), rtol=0, atol=0)


def test_a_deep_copy_of_a_graphed_module_computes_with_its_own_parameters_and_may_be_graphed_in_turn():
    """copy.deepcopy(model) after graphing (an EMA or a teacher): the
    replaced forward was a closure over the original module, which
    deepcopy does not copy, so the copy ran the original's graphs with the
    original's parameters, followed the original's training flag, and sent
    its gradients to the original's .grad, silently (a helper's review;
    PyTorch's make_graphed_callables does the same). The copy now runs its
    own forward eagerly, with its own parameters, and may be graphed in
    turn; the original stays graphed."""
    import copy

    torch._dynamo.reset()
    m = mlp()
    x = torch.randn(4, 8)
    make(m, (x,), n=1)
    ema = copy.deepcopy(m)
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)

    def eager(net):
        return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, net[0].weight, net[0].bias)),
                                          net[2].weight, net[2].bias)

    got = ema(x)
    torch.testing.assert_close(got, eager(ema), rtol=0, atol=0)
    got.sum().backward()
    assert all(p.grad is None for p in m.parameters()), "the copy's backward wrote the original's .grad"
    assert all(p.grad is not None for p in ema.parameters())
    assert _graphed._graphed_state(m) is not None and _graphed._graphed_state(ema) is None
    make(ema, (x,), n=1)  # not "graphed already"
    torch.testing.assert_close(ema(x), eager(ema), rtol=0, atol=0)
    torch.testing.assert_close(m(x), eager(m), rtol=0, atol=0)
