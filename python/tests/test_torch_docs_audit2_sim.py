"""docs/torch.md, second audit, sentence by sentence: "Training", "Random
numbers", "Threads and explicit steps" (with "Another thread's tree that
reads an output"), "Outputs, steps and staleness" and "Graphed eager
modules". Each test here checks a promise that no test checked, or that
the test named beside it checked only in part. Runs without a GPU:
make_graphed_callables' part after its argument check runs on CPU tensors
through another Dynamo backend (as test_torch_graphed_args.py does), and
the torch door's logic on the simulator's stand-ins of
test_torch_ext_sim.py (imported, not copied)."""
import copy
import gc
import os

import pytest

torch = pytest.importorskip("torch")
X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402 - its stand-ins, init_hot_path included
from test_torch_ext_sim import BackwardGraph, FakeTensor, ForwardGraph, Graph, call, segment  # noqa: E402

_before = os.environ.get("CGTREE_TORCH_NO_INSTALL")
os.environ["CGTREE_TORCH_NO_INSTALL"] = "1"  # on a GPU machine, never take the hot path from the stand-ins
try:
    import cgtree.torch as ct  # noqa: E402
    from cgtree.torch import _graphed  # noqa: E402
finally:
    if _before is None:
        del os.environ["CGTREE_TORCH_NO_INSTALL"]
    else:
        os.environ["CGTREE_TORCH_NO_INSTALL"] = _before

tree = S.tree  # the simulator file's fixture: a tree on the simulator, checked after the test


# ---- Graphed eager modules (make_graphed_callables), on the CPU ----

def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def make(callables, sample_args, n=3, allow_unused_input=False, backend="eager"):
    """make_graphed_callables after its argument check, with another backend
    than cgtree's (which needs CUDA)."""
    one, cs, per = _graphed._check(callables, sample_args, n, need_cuda=False)
    return _graphed._make(one, cs, per, n, allow_unused_input, backend)


class Counting:
    """A Dynamo backend through AOTAutograd whose forward and backward
    graphs count their runs (what cgtree's backend gets: AOTAutograd's two
    graphs), run as the eager FX graphs."""

    def __init__(self):
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func

        self.runs = []

        def compiler(kind):
            def compile_(gm, example_inputs):
                inner = make_boxed_func(gm.forward)

                def run(args):
                    self.runs.append(kind)
                    return inner(args)

                run._boxed_call = True
                return run

            return compile_

        self.backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))

    def count(self, kind):
        return self.runs.count(kind)


def eager_mlp(net, x):
    return torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, net[0].weight, net[0].bias)),
                                      net[2].weight, net[2].bias)


@pytest.mark.parametrize("n", [1, 3])
def test_the_warm_up_runs_num_warmup_iters_forward_and_backward_passes_and_changes_no_grad(n):
    """"warm-up: num_warmup_iters forward and backward passes on the
    samples before it returns, the backward through torch.autograd.grad as
    PyTorch's: no .grad changes". The test named beside it checked only
    .grad, and the training-mode test counted at least 2 forward runs."""
    torch._dynamo.reset()
    c = Counting()
    m = mlp()
    x = torch.randn(4, 8, requires_grad=True)
    make(m, (x,), n=n, backend=c.backend)
    assert (c.count("forward"), c.count("backward")) == (n, n)
    assert x.grad is None and all(p.grad is None for p in m.parameters())
    m(x).sum().backward()  # a call after: one more of each, and now .grad
    assert (c.count("forward"), c.count("backward")) == (n + 1, n + 1)
    assert x.grad is not None and all(p.grad is not None for p in m.parameters())


def test_with_no_warm_up_nothing_is_compiled_at_graphing_and_a_graph_break_raises_dynamos_error_at_the_call():
    """"With num_warmup_iters=0 nothing is compiled before the first call,
    as nothing is run: a graph break raises Dynamo's error at that call,
    not a CgtreeError at graphing"."""
    torch._dynamo.reset()
    c = Counting()
    m = mlp()

    def breaks(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    gm, gb = make((m, breaks), ((torch.randn(4, 8),), (torch.randn(3),)), n=0, backend=c.backend)
    assert c.runs == [] and gm is m and "forward" in vars(m)
    with pytest.raises(torch._dynamo.exc.Unsupported) as e:
        gb(torch.randn(3))
    assert not isinstance(e.value, ct.CgtreeError)
    x = torch.randn(4, 8)
    torch.testing.assert_close(m(x), eager_mlp(m, x), rtol=0, atol=0)
    assert c.count("forward") == 1


def test_an_unused_input_is_reported_at_graphing_unless_allowed_and_not_at_all_with_no_warm_up():
    """PyTorch's observable behaviour, which the docs promise: an input
    that requires grad and that the callable does not use fails the
    warm-up's autograd.grad unless allow_unused_input=True, before any
    module is changed; "With num_warmup_iters=0 ... an unused input is not
    reported"."""
    torch._dynamo.reset()
    m = mlp()

    def ignores_w(x, w):
        return x * 2

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="not have been used"):
        make((m, ignores_w), ((x,), (x, w)), n=1)
    assert "forward" not in vars(m), "a module was changed though graphing failed"
    assert w.grad is None
    for n, allow in ((1, True), (0, False)):
        m2 = mlp()
        _, g = make((m2, ignores_w), ((x,), (x, w)), n=n, allow_unused_input=allow)
        torch.testing.assert_close(g(x, w), x * 2, rtol=0, atol=0)
        assert "forward" in vars(m2) and x.grad is None and w.grad is None


def test_a_graphed_function_gives_eager_gradients_for_each_of_its_tensor_arguments():
    """"a function is graphed (gradients for its tensor arguments)": the
    CPU test named beside it compared the values only."""
    torch._dynamo.reset()

    def f(x, w):
        return torch.relu(x @ w).sum(1)

    torch.manual_seed(1)
    w0 = torch.randn(8, 3)
    g = make(f, (torch.randn(4, 8, requires_grad=True), w0.clone().requires_grad_()))
    for i in range(3):
        x0 = torch.randn(4, 8)
        got = [x0.clone().requires_grad_(), w0.clone().requires_grad_()]
        want = [x0.clone().requires_grad_(), w0.clone().requires_grad_()]
        g(*got).square().sum().backward()
        f(*want).square().sum().backward()
        for a, b in zip(got, want):
            torch.testing.assert_close(a.grad, b.grad)


def test_other_requires_grad_than_the_samples_compiles_again_and_gives_eager_values_and_gradients():
    """"Other shapes or requires_grad than the samples' compile and record
    again instead of failing": the test beside it changed shapes only."""
    torch._dynamo.reset()
    c = Counting()
    m, ref = mlp(), mlp()
    make(m, (torch.randn(4, 8),), n=1, backend=c.backend)  # a sample that requires no grad
    x0 = torch.randn(4, 8)
    x, xr = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    y = m(x)
    y.square().sum().backward()
    ref(xr).square().sum().backward()
    torch.testing.assert_close(y, eager_mlp(ref, x0))
    torch.testing.assert_close(x.grad, xr.grad)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert c.count("forward") == 2  # the warm-up's, then the new graph's


def test_module_hooks_run_eagerly_around_the_graphed_forward():
    """"Module hooks registered before the call run eagerly around the
    graphed forward (PyTorch's version refuses them; not tested here)":
    a forward pre-hook that changes the input and a forward hook that
    changes the output, registered before graphing and after, each run
    once per call around the compiled forward, which runs."""
    torch._dynamo.reset()
    c = Counting()
    m = mlp()
    seen = []
    m.register_forward_pre_hook(lambda mod, args: (seen.append("pre"), (args[0] + 1,))[1])
    make(m, (torch.randn(4, 8),), n=1, backend=c.backend)
    assert seen == [], "the warm-up ran the module's hooks (it runs the forward itself)"
    m.register_forward_hook(lambda mod, args, out: (seen.append("post"), out * 3)[1])
    x = torch.randn(4, 8)
    before = c.count("forward")
    got = m(x)
    assert seen == ["pre", "post"] and c.count("forward") == before + 1
    torch.testing.assert_close(got, eager_mlp(m, x + 1) * 3, rtol=0, atol=0)


def test_a_shallow_copy_of_a_graphed_module_runs_the_originals_graphs_under_the_originals_training_flag():
    """The limit: "a shallow copy (copy.copy) shares the original's
    forward, bound to the original, so it runs the original's graphs under
    the original's training flag (with the parameters it shares)"."""
    torch._dynamo.reset()
    c = Counting()
    m = mlp()
    make(m, (torch.randn(4, 8),), n=1, backend=c.backend)
    shallow = copy.copy(m)
    x = torch.randn(4, 8)
    shallow.training = False  # its own flag: not the one that chooses
    n = c.count("forward")
    torch.testing.assert_close(shallow(x), eager_mlp(m, x), rtol=0, atol=0)
    assert c.count("forward") == n + 1, "the shallow copy did not run the original's graphs"
    shallow.training, m.training = True, False  # the original's flag chooses: the original forward
    shallow(x)
    assert c.count("forward") == n + 1


def test_one_function_passed_twice_with_samples_of_one_layout_shares_one_frame():
    """"Each callable is compiled behind a frame with a code object of its
    own, shared only by modules of one class ... and by one function or
    callable object passed twice with samples of one layout": the test
    beside it passed the function with two layouts only."""
    torch._dynamo.reset()

    def f(x):
        return torch.nn.functional.gelu(x) * 2

    x = torch.randn(4, 8)
    frames = len(_graphed._frame_codes)
    g1, g2 = make((f, f), ((x,), (x,)), n=1)
    assert g1 is not g2 and len(_graphed._frame_codes) == frames + 1
    other = make(lambda t: t * 2, (x,), n=1)  # another function, the same layout: a frame of its own
    assert len(_graphed._frame_codes) == frames + 2
    torch.testing.assert_close(g1(x), f(x), rtol=0, atol=0)
    torch.testing.assert_close(g2(x), f(x), rtol=0, atol=0)
    torch.testing.assert_close(other(x), x * 2, rtol=0, atol=0)


# ---- Threads and explicit steps: cgtree.torch's step functions act on the calling thread's trees ----

class RecordingTree:
    """What cgtree.torch.step_begin() and set_step_mode() ask of a thread's
    tree (and what the thread's dict asks at its exit)."""

    def __init__(self):
        self.step_begins, self.explicit_steps, self.orphans, self.closed = 0, False, 0, False

    def step_begin(self):
        self.step_begins += 1

    def orphan(self):
        self.orphans += 1

    def stats(self):
        return {}


class NoStream:
    cuda_stream = 0


def test_step_begin_and_set_step_mode_act_on_the_calling_threads_trees_only():
    """"cgtree.torch.step_begin() ..., which begins a step on the calling
    thread's trees only" (on each of its devices), and set_step_mode
    switches the calling thread's trees; the other thread's trees are
    left alone. A mode other than "call" or "explicit" is a ValueError."""
    import threading

    from cgtree.torch import _install

    mine = {0: RecordingTree(), 1: RecordingTree()}
    theirs = RecordingTree()
    ready, done, acted = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def other():
        try:
            _install._thread_trees()[0] = (theirs, NoStream())
            ready.set()
            assert acted.wait(10)
            ct.step_begin()  # the other thread's own: its tree only
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            done.set()

    t = threading.Thread(target=other)
    t.start()
    try:
        assert ready.wait(10)
        trees = _install._thread_trees()
        saved = dict(trees)
        for d, tr in mine.items():
            trees[d] = (tr, NoStream())
        try:
            ct.step_begin()
            assert [mine[0].step_begins, mine[1].step_begins, theirs.step_begins] == [1, 1, 0]
            ct.set_step_mode("explicit")
            assert mine[0].explicit_steps and mine[1].explicit_steps and not theirs.explicit_steps
            with pytest.raises(ValueError, match="'call' or 'explicit'"):
                ct.set_step_mode("manual")
            assert mine[0].explicit_steps, "a refused mode changed the thread's trees"
            acted.set()
            assert done.wait(10)
            assert [mine[0].step_begins, mine[1].step_begins, theirs.step_begins] == [1, 1, 1]
            ct.set_step_mode("call")
            assert not mine[0].explicit_steps and not mine[1].explicit_steps
        finally:
            for d in mine:
                del trees[d]
            trees.update(saved)
            _install.set_explicit_steps(False)
    finally:
        acted.set()
        t.join()
    assert errors == []


# ---- Training: the distillation row's counters ----

def test_inference_outputs_watched_counts_the_teachers_outputs_watched_now_and_steps_held_the_calls_held(tree):
    """"stats()["steps_held_for_inference_outputs"] counts the calls held,
    inference_outputs_watched the outputs watched now": the test beside it
    saw the count at 0 only (after the backward). The teacher's output is
    watched from its call to the one training forward's call it holds
    ("Only for one such call")."""
    teacher = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="teacher")
    student = segment(tree, ForwardGraph(tree), spans=(16,), name="student", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(S.ARG_TENSOR, S.ARG_TENSOR), spans=(16, 16), name="bw",
                 backward=True)
    g, x = FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(4):
        (t,) = call(teacher, x)
        s0 = tree.stats()
        y, saved = call(student, x)
        s1 = tree.stats()
        if i:  # the first calls run as the plain graphs: their outputs are not the tree's
            assert s0["inference_outputs_watched"] == 1, "the teacher's output is alive and unwatched"
            # the hold is for one training forward's call: the watch ends there
            assert s1["inference_outputs_watched"] == 0
            assert s1["steps_held_for_inference_outputs"] - s0["steps_held_for_inference_outputs"] == 1
        assert t.values() == [5, 10, 15, 20]
        (gx,) = bw(saved, g)
        assert tree.stats()["inference_outputs_watched"] == 0
        del y, saved, gx, t
        gc.collect()


@pytest.mark.parametrize("how", ["cudagraph_mark_step_begin", "step_begin"])
@pytest.mark.parametrize("hold", ["a_teachers_output", "a_checkpointed_blocks_output", "the_same_passed_to_the_call"])
def test_an_explicit_mark_begins_a_step_though_an_output_holds_it_and_the_held_output_then_raises(tree, how, hold):
    """The Training table's steps row: "cudagraph_mark_step_begin() and
    step_begin() always begin one". The tests beside it put the mark
    against a pending backward and the optimizer; here against the other
    holds, an inference output made before a training forward's call (the
    distillation row) and a checkpointed compiled block's output (the
    checkpointing row). The mark wins, and the held output is stale at
    once, never read over: passed to the call itself (it requires grad, so
    it cannot be moved) the call raises StaleTensorError naming it."""
    with S.pytorchs_mark() as box:
        teacher = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="teacher")
        fb = segment(tree, ForwardGraph(tree), spans=(16,), name="fwB", saved_from=1)
        fc = segment(tree, ForwardGraph(tree), spans=(16,), name="fwC", saved_from=1)
        bc = segment(tree, BackwardGraph(tree), kinds=(S.ARG_TENSOR, S.ARG_TENSOR), spans=(16, 16), name="bwC",
                     backward=True)
        g, x = FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(4).fill([1, 2, 3, 4])
        for i in range(3):
            if hold == "a_teachers_output":
                (t,) = call(teacher, x)
            else:
                t, sb = call(fb, x)
                t.requires_grad = True  # checkpoint's Function marks the output; it keeps none of B's saved
                del sb
                gc.collect()
            step = tree.stats()["step"]
            marked = i == 2
            if marked:
                if how == "step_begin":
                    tree.step_begin()
                else:
                    box.mark_step_counter -= 1
            arg = t if hold == "the_same_passed_to_the_call" else x
            if marked and hold == "the_same_passed_to_the_call":
                with pytest.raises(X.StaleTensorError, match="argument 0 of graph 'fwC'"):
                    call(fc, arg)
            else:
                y, sc = call(fc, arg)
                (gx,) = bc(sc, g)
                del y, sc, gx
            if i:  # the first calls run as the plain graphs: their outputs are not the tree's
                assert tree.stats()["step"] - step == (1 if marked else 0)
            if marked:
                with pytest.raises(RuntimeError, match="StaleTensorError"):
                    t.values()
            else:
                assert t.values() == ([5, 10, 15, 20] if hold == "a_teachers_output" else [2, 4, 6, 8])
            del t
            gc.collect()


# ---- Outputs, steps and staleness ----

def test_outputs_kept_in_a_list_across_calls_all_raise_but_the_last(tree):
    """"preds = [m(x) for x in xs] keeps every output across calls: all but
    the last raise when read." The test named for outputs in lists checks
    that each kept output is right or raises; here every one but the last
    raises, and a view of one made afterwards too, each with the mark's
    message, and the last reads right."""
    seg, _ = S.replaying(tree, a=2.0, b=0.0)
    xs = [FakeTensor(4).fill([i, i, i, i]) for i in range(5)]
    preds = [call(seg, x)[0] for x in xs]
    for p in preds[:-1]:
        with pytest.raises(RuntimeError, match=r"^cgtree\.torch\.StaleTensorError"):
            p.values()
        with pytest.raises(RuntimeError, match="StaleTensorError"):
            p.view().values()
    assert preds[-1].values() == [8, 8, 8, 8]
    kept = [call(seg, x)[0].clone() for x in xs]  # the way out the docs give: clone
    assert [k.values() for k in kept] == [[2 * i] * 4 for i in range(5)]


def test_identical_layers_that_share_one_frame_each_compute_with_their_own_parameters_and_grads():
    """"shared only by modules of one class (one forward) whose samples
    have one layout (identical layers), which then share their graphs":
    the test beside it counted the frames only. Shared graphs must not
    mean shared weights: each layer computes with its own parameters and
    its backward writes its own .grad, in training and under no_grad."""
    torch._dynamo.reset()
    c = Counting()
    torch.manual_seed(2)
    layers = tuple(torch.nn.Linear(8, 8) for _ in range(4))
    x = torch.randn(4, 8)
    make(layers, tuple((x,) for _ in layers), n=1, backend=c.backend)
    compiles = len(c.runs)
    for layer in layers:
        xi = torch.randn(4, 8)
        y = layer(xi)
        torch.testing.assert_close(y, torch.nn.functional.linear(xi, layer.weight, layer.bias), rtol=0, atol=0)
        y.square().sum().backward()
        w = layer.weight.detach().requires_grad_()
        b = layer.bias.detach().requires_grad_()
        torch.nn.functional.linear(xi, w, b).square().sum().backward()
        torch.testing.assert_close(layer.weight.grad, w.grad)
        torch.testing.assert_close(layer.bias.grad, b.grad)
        with torch.no_grad():
            torch.testing.assert_close(layer(xi), torch.nn.functional.linear(xi, layer.weight, layer.bias),
                                       rtol=0, atol=0)
    assert len(c.runs) > compiles  # the graphs ran (not the original forwards)
    for i, a in enumerate(layers):  # each .grad its own: none was written by another layer's backward
        for b in layers[i + 1:]:
            assert not torch.equal(a.weight.grad, b.weight.grad)


def test_retain_graph_raises_aotautograds_donated_buffer_error_and_works_with_donated_buffers_off():
    """"loss.backward(retain_graph=True) then a second backward raises
    AOTAutograd's error about donated buffers, as under torch.compile ...
    Set torch._functorch.config.donated_buffer = False before the
    callables are graphed". AOTAutograd's check runs in the backward and
    reads the flag then: it is the backward that retains the graph that
    raises (not only a second one), and the flag set before graphing and
    left so makes both backwards compute, the second as the first."""
    was = torch._functorch.config.donated_buffer
    try:
        for donated in (True, False):
            torch._dynamo.reset()
            torch._functorch.config.donated_buffer = donated
            m = mlp()
            make(m, (torch.randn(4, 8),), n=1, backend=Counting().backend)
            loss = m(torch.randn(4, 8)).square().sum()
            if donated:
                with pytest.raises(RuntimeError, match="donated buffers"):
                    loss.backward(retain_graph=True)
                continue
            loss.backward(retain_graph=True)
            first = [p.grad.clone() for p in m.parameters()]
            loss.backward()
            for p, g in zip(m.parameters(), first):
                torch.testing.assert_close(p.grad, 2 * g)
    finally:
        torch._functorch.config.donated_buffer = was
        torch._dynamo.reset()


# ---- Threads: an exited thread's trees are freed at empty_cache() too ----

def test_an_exited_threads_tree_whose_outputs_died_is_freed_at_empty_cache_with_no_compiled_call(tree):
    """"A thread's trees are freed after the thread: once it has exited and
    no output of theirs lives ..., at the next call of a compiled model or
    at cgtree.torch.empty_cache()": the tests beside it free at a call, or
    ask inside a run (and see it refused there). Here no call comes: the
    cache's emptying frees it, keeps its counters, and counts it freed; one
    whose output still lives stays, and reads right."""
    trees = S.ThreadTrees()
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="exits_ec")
    X.set_tree_getter(trees)
    kept = []

    def work():
        x = FakeTensor(4).fill([1, 2, 3, 4])
        for _ in range(4):  # plain first call, warmup, recording, replay
            (y,) = call(seg, x)
        kept.append(y)

    try:
        S.in_a_thread(work)
        (dead,) = trees.made
        dead.orphan()
        freed = X.alloc_figures()["trees_freed"]
        X.empty_cache(-1)
        assert not dead.closed and kept[0].values() == [3, 5, 7, 9]  # its output lives: it stays
        del kept[:]
        gc.collect()
        assert not dead.closed  # freed at a call or at empty_cache, not inside a deleter
        X.empty_cache(-1)
        assert dead.closed and X.alloc_figures()["trees_freed"] == freed + 1
        s = dead.stats()
        assert s["recordings"] == 1 and s["replays"] == 1  # its counters stay
        assert s["pool_reserved_bytes"] == s["nodes"] == s["outputs_alive"] == 0
    finally:
        X.set_tree_getter(None)
