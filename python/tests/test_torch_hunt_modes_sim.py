"""Step modes mixed (automatic "call" and "explicit") on the simulator (a helper's hunt).

Each test compares with what eager computes (fake tensors: the values are
known) and checks that an output whose memory a later step may reuse either
still reads its own value or raises, never reads another step's data.
Stand-ins imported from test_torch_ext_sim.py, as test_torch_docs_audit2_sim.py does."""
import gc
import os
import threading

import pytest

X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402
from test_torch_ext_sim import (  # noqa: E402
    ARG_TENSOR, ARG_TENSOR_STATIC, AddTwo, BackwardGraph, FakeTensor, ForwardGraph, Generation, Graph, Leaf,
    ThreadTrees, TiedForward, call, init_hot_path, optimizer_segment, segment)

tree = S.tree

# Seeds of each random walk: 12 in the suite (each walk collects garbage at its drops, which costs more in a
# process that has run the other files); the hunt ran 40, and CGTREE_HUNT_SEEDS=40 runs them again.
SEEDS = int(os.environ.get("CGTREE_HUNT_SEEDS", "12"))


@pytest.fixture
def box():
    """PyTorch's MarkStepBox stand-in, for the test's length."""
    class MarkStepBox:
        mark_step_counter = 0

    init_hot_path(mark_step_cls=MarkStepBox)
    yield MarkStepBox
    init_hot_path()


def mark(box):
    box.mark_step_counter -= 1  # torch.compiler.cudagraph_mark_step_begin()


def reads(t, want):
    """t reads want, or raises StaleTensorError: never another value. True if it read."""
    try:
        got = t.values()
    except RuntimeError as e:
        assert "StaleTensorError" in str(e), e
        return False
    assert got == want, "read %r, eager has %r" % (got, want)
    return True


def aff(v, a, b):
    return [a * e + b for e in v]


def training(tree, name="fw"):
    fw = segment(tree, ForwardGraph(tree), spans=(16,), name=name, saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name=name + "_bw",
                 backward=True)
    return fw, bw


# ------------------------------------------------ one thread, switching modes

@pytest.mark.parametrize("warm", [0, 4])
def test_auto_to_explicit_keeps_outputs_alive_until_a_mark_then_back_to_auto(tree, warm):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(warm):
        call(seg, x)
    (y,) = call(seg, x)
    tree.explicit_steps = True
    step = tree.step
    x2 = FakeTensor(4).fill([5, 6, 7, 8])
    zs = [call(seg, x2)[0] for _ in range(3)]  # no mark: one step, all alive
    assert tree.step == step
    assert y.values() == [3, 5, 7, 9]
    for z in zs:
        assert z.values() == [11, 13, 15, 17]
    tree.step_begin()
    (w,) = call(seg, x)
    assert tree.step == step + 1
    reads(y, [3, 5, 7, 9]); reads(zs[0], [11, 13, 15, 17])
    assert w.values() == [3, 5, 7, 9]
    tree.explicit_steps = False
    (v,) = call(seg, x2)  # automatic again: a new step
    assert tree.step == step + 2
    reads(w, [3, 5, 7, 9])
    assert v.values() == [11, 13, 15, 17]


@pytest.mark.parametrize("warm", [0, 4])
def test_explicit_to_auto_the_first_automatic_call_ends_the_explicit_step(tree, warm):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    tree.explicit_steps = True
    for _ in range(warm):
        tree.step_begin()
        call(seg, x)
    tree.step_begin()
    (y,) = call(seg, x)
    (y2,) = call(seg, y)  # same step: a VALUE
    assert y2.values() == [7, 11, 15, 19]
    tree.explicit_steps = False
    step = tree.step
    assert y.values() == [3, 5, 7, 9]  # the switch itself ends nothing
    (z,) = call(seg, x)
    assert tree.step == step + 1
    assert z.values() == [3, 5, 7, 9]
    reads(y, [3, 5, 7, 9]); reads(y2, [7, 11, 15, 19])


@pytest.mark.parametrize("warm", [0, 4])
def test_an_output_passed_across_the_switch_to_auto_moves_and_computes(tree, warm):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(warm):
        tree.explicit_steps = True
        tree.step_begin()
        (y,) = call(seg, x)
        tree.explicit_steps = False
        (z,) = call(seg, y)
        del y, z
    tree.explicit_steps = True
    tree.step_begin()
    (y,) = call(seg, x)
    tree.explicit_steps = False
    (z,) = call(seg, y)  # begins a step: y must move or raise
    assert z.values() == [7, 11, 15, 19]
    assert reads(y, [3, 5, 7, 9])


@pytest.mark.parametrize("warm", [0, 4])
def test_x_equals_f_of_x_switching_mode_every_call(tree, warm, box):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    want = [1.0, 2.0, 3.0, 4.0]
    for i in range(12 + warm):
        explicit = i % 2 == 0
        tree.explicit_steps = explicit
        if explicit:
            if i % 4 == 0:
                tree.step_begin()
            else:
                mark(box)
        (x,) = call(seg, x)
        want = aff(want, 2.0, 1.0)
        assert x.values() == want, i


def test_a_mark_pending_from_explicit_mode_is_taken_by_the_first_auto_call_only(tree):
    seg = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([0, 0, 0, 0])
    tree.explicit_steps = True
    call(seg, x)
    tree.step_begin()
    tree.explicit_steps = False
    step = tree.step
    (y,) = call(seg, x)
    assert tree.step == step + 1
    Generation.generation += 0
    (y2,) = seg(x)  # the same generation: the mark is spent
    assert tree.step == step + 1
    assert y.values() == [1, 1, 1, 1] and y2.values() == [1, 1, 1, 1]


# ------------------------------------------------ training across the switch

@pytest.mark.parametrize("warm", [0, 4])
def test_auto_forward_then_explicit_calls_then_auto_backward_computes(tree, warm):
    fw, bw = training(tree)
    g = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="g")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(warm):
        out, saved = call(fw, x)
        bw(saved, t)
        del out, saved
    out, saved = call(fw, x)
    tree.explicit_steps = True
    (h,) = call(g, x)  # no mark: same step
    tree.explicit_steps = False
    (grad,) = bw(saved, t)
    assert grad.values() == [4, 7, 10, 13]
    assert out.values() == [2, 4, 6, 8] and h.values() == [5, 10, 15, 20]


@pytest.mark.parametrize("warm", [0, 4])
def test_explicit_forward_then_auto_unrelated_call_then_backward(tree, warm):
    """A forward in explicit mode, the thread switched to automatic, an
    unrelated compiled call before the backward: its saved activations hold
    the step (saved_alive), or the backward raises; never wrong."""
    fw, bw = training(tree)
    g = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="g")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    for _ in range(warm):
        tree.explicit_steps = True
        tree.step_begin()
        out, saved = call(fw, x)
        tree.explicit_steps = False
        call(g, x)
        bw(saved, t)
        del out, saved
        gc.collect()
    tree.explicit_steps = True
    tree.step_begin()
    out, saved = call(fw, x)
    out.requires_grad = True
    tree.explicit_steps = False
    (h,) = call(g, x)
    assert h.values() == [5, 10, 15, 20]
    try:
        (grad,) = bw(saved, t)
    except X.StaleTensorError:
        return
    assert grad.values() == [4, 7, 10, 13]
    assert reads(out, [2, 4, 6, 8])


@pytest.mark.parametrize("view", [False, True])
def test_explicit_tied_forward_then_auto_call_before_its_backward(tree, view):
    """A forward that hands out a result it also saves, made in explicit mode
    (no tied hold then), the thread switched to automatic, a compiled call,
    then the backward: the saved result reads right or raises."""
    f = segment(tree, TiedForward(tree, view), spans=(16,), name="tied", saved_from=1)
    bw = segment(tree, AddTwo(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="tied_bw",
                 backward=True)
    g = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="g")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(6):
        tree.explicit_steps = True
        tree.step_begin()
        out, saved = call(f, x)
        tree.explicit_steps = False
        xi = FakeTensor(4).fill([10 + i, 20, 30, 40])
        (h,) = call(g, xi)
        assert h.values() == aff([10 + i, 20, 30, 40], 5.0, 0.0)
        want_saved = [2, 4, 6, 8][2:] if view else [2, 4, 6, 8]
        n = len(want_saved)
        tt = FakeTensor(n).fill([1] * n)
        try:
            (grad,) = bw(saved, tt)
        except X.StaleTensorError:
            continue
        assert grad.values() == [v + 1 for v in want_saved], i
        del out, saved, grad
        gc.collect()


def test_step_begin_twice_in_auto_mode_begins_one_step(tree, box):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(3):
        call(seg, x)
    (y,) = call(seg, x)
    step = tree.step
    tree.step_begin()
    tree.step_begin()
    mark(box)
    mark(box)
    assert y.values() == [3, 5, 7, 9]
    (z,) = call(seg, y)
    assert tree.step == step + 1
    assert z.values() == [7, 11, 15, 19]
    (w,) = seg(z)  # same generation, marks spent: same step
    assert tree.step == step + 1
    assert w.values() == [15, 23, 31, 39]


def test_step_begin_before_any_call_in_auto_mode(tree, box):
    tree.step_begin()
    mark(box)
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for _ in range(5):
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]


@pytest.mark.parametrize("how", ["step_begin", "mark"])
@pytest.mark.parametrize("explicit", [False, True])
def test_a_mark_between_forward_and_backward_then_the_backward(tree, box, how, explicit):
    """mark; out = fw(x); mark; bw(saved): the backward's call begins the
    step; its arguments (saved activations) move, or it raises."""
    fw, bw = training(tree)
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    tree.explicit_steps = explicit
    for i in range(6):
        if explicit:
            tree.step_begin()
        out, saved = call(fw, x)
        if how == "step_begin":
            tree.step_begin()
        else:
            mark(box)
        try:
            (grad,) = bw(saved, t)
        except X.StaleTensorError:
            continue
        assert grad.values() == [4, 7, 10, 13], i
        reads(out, [2, 4, 6, 8])
        del out, saved, grad
        gc.collect()


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("how", ["step_begin", "mark"])
def test_gradient_accumulation_with_a_mark_between_micro_batches(tree, box, explicit, how):
    fw = segment(tree, S.ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    w, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 1, 1, 1])
    tree.explicit_steps = explicit
    for it in range(4):
        w.grad = None
        want = [0.0] * 4
        losses = []
        for mb in range(3):
            if how == "step_begin":
                tree.step_begin()
            else:
                mark(box)
            x = FakeTensor(4).fill([mb + 1, 2, 3, 4])
            out, saved = call(fw, x, w)
            (g,) = bw(saved, t)
            w.accumulate(g)
            want = [a + b + 1 for a, b in zip(want, [mb + 1, 2, 3, 4])]
            losses.append((out, [mb + 1, 2, 3, 4]))
            del g, saved
        assert w.grad.values() == want, (it, w.grad.values(), want)
        for o, v in losses[:-1]:
            reads(o, v)
        assert losses[-1][0].values() == losses[-1][1]


# ------------------------------------------------ two threads, one explicit and one automatic

def test_explicit_and_auto_threads_share_a_segment_and_pass_outputs(tree):
    trees = ThreadTrees()
    seg = segment(tree, Graph(tree, 2.0, 1.0, stream=lambda: trees(0).stream), spans=(16,), name="shared")
    add = segment(tree, AddTwo(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="add")
    add.graph_stream = None
    to_b, to_a = [], []
    ev_a, ev_b = threading.Event(), threading.Event()
    errors = []

    def a():  # explicit
        try:
            t = trees(0)
            t.explicit_steps = True
            x = FakeTensor(4)
            for i in range(8):
                t.step_begin()
                x.fill([i, 1, 2, 3])
                (y,) = call(seg, x)
                to_b.append((y, aff([i, 1, 2, 3], 2.0, 1.0)))
                ev_b.set()
                assert ev_a.wait(10)
                ev_a.clear()
                z, zwant = to_a.pop()
                assert reads(z, zwant)
                assert reads(y, aff([i, 1, 2, 3], 2.0, 1.0))
        except Exception as e:  # noqa: BLE001
            errors.append("A: " + repr(e))
            ev_b.set()

    def b():  # automatic
        try:
            for i in range(8):
                assert ev_b.wait(10)
                ev_b.clear()
                y, ywant = to_b.pop()
                (z,) = call(seg, y)
                zwant = aff(ywant, 2.0, 1.0)
                assert z.values() == zwant
                to_a.append((z, zwant))
                ev_a.set()
        except Exception as e:  # noqa: BLE001
            errors.append("B: " + repr(e))
            ev_a.set()

    S.run_threads(trees, a, b)
    assert errors == []
    for t in trees.made:
        t.check()


# ------------------------------------------------ a random walk over modes, marks, calls and kept outputs

def _fuzz(tree, box, seed, n_ops=300, training_ops=False):
    import random

    rnd = random.Random(seed)
    f = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="f")
    g = segment(tree, Graph(tree, -1.0, 2.0), spans=(16,), name="g")
    add = segment(tree, AddTwo(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="add")
    fw, bw = training(tree)
    kept = []  # (tensor, its eager value)
    pending = []  # (out, saved, eager saved value)
    log = []
    for op in range(n_ops):
        k = rnd.random()
        if k < 0.06:
            tree.explicit_steps = not tree.explicit_steps
            log.append("explicit=%s" % tree.explicit_steps)
        elif k < 0.12:
            tree.step_begin()
            log.append("step_begin")
        elif k < 0.16:
            mark(box)
            log.append("mark")
        elif k < 0.24 and kept:
            kept.pop(rnd.randrange(len(kept)))
            gc.collect()
            log.append("drop")
        elif k < 0.30 and kept:
            i = rnd.randrange(len(kept))
            t, v = kept[i]
            if not reads(t, v):
                kept.pop(i)
            log.append("read")
        elif training_ops and k < 0.38:
            x = FakeTensor(4).fill([rnd.randint(-3, 3) for _ in range(4)])
            try:
                out, saved = call(fw, x)
            except X.StaleTensorError:
                continue
            pending.append((out, saved, aff(x.values(), 3.0, 0.0)))
            kept.append((out, aff(x.values(), 2.0, 0.0)))
            log.append("fw")
        elif training_ops and k < 0.44 and pending:
            out, saved, sv = pending.pop(rnd.randrange(len(pending)))
            t = FakeTensor(4).fill([1, 1, 1, 1])
            log.append("bw")
            try:
                (gr,) = bw(saved, t)
            except X.StaleTensorError:
                continue
            got = gr.values()
            assert got == [v + 1 for v in sv], (seed, op, got, sv, log[-12:])
            kept.append((gr, got))
        else:
            seg = rnd.choice((f, g, add))
            def arg():
                if kept and rnd.random() < 0.6:
                    return kept[rnd.randrange(len(kept))]
                x = FakeTensor(4).fill([rnd.randint(-3, 3) for _ in range(4)])
                return x, x.values()
            a = arg()
            args = [a] if seg is not add else [a, arg()]
            log.append("call %s" % seg.name if hasattr(seg, "name") else "call")
            try:
                (y,) = call(seg, *[t for t, _ in args])
            except X.StaleTensorError:
                continue
            vs = [v for _, v in args]
            if seg is f:
                want = aff(vs[0], 1.0, 1.0)
            elif seg is g:
                want = aff(vs[0], -1.0, 2.0)
            else:
                want = [p + q for p, q in zip(vs[0], vs[1])]
            got = y.values()
            assert got == want, (seed, op, got, want, log[-12:])
            for t, v in args:
                reads(t, v)
            if max(abs(e) for e in want) < 1e5:
                kept.append((y, want))
        if len(kept) > 12:
            kept.pop(0)
    for t, v in kept:
        reads(t, v)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_walk_over_step_modes_never_reads_wrong(tree, box, seed):
    _fuzz(tree, box, seed)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_walk_over_step_modes_with_training_never_reads_wrong(tree, box, seed):
    _fuzz(tree, box, 1000 + seed, training_ops=True)


# ------------------------------------------------ holds of a step begun in explicit mode, after the switch

@pytest.mark.parametrize("begun", ["automatic", "explicit_then_switched"])
def test_a_tied_forwards_hold_is_noted_in_automatic_mode_only_so_after_a_switch_its_backward_raises(tree, begun):
    """A forward that hands out a result it also saves (a sigmoid's), a
    compiled call, then its backward. In automatic mode the tied saved
    result holds the step and the backward computes. A limit (docs/torch.md,
    "Threads and explicit steps"): holds are noted in automatic mode only
    (seg_tied_saved_hold returns on T->explicit_steps), so if the step began
    in explicit mode and the thread switched to automatic before the
    compiled call, that call begins a step, marks the output, and the
    backward raises StaleTensorError: loud, never another step's data."""
    f = segment(tree, TiedForward(tree), spans=(16,), name="tied", saved_from=1)
    bw = segment(tree, AddTwo(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="tied_bw", backward=True)
    g = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="g")
    x, t = FakeTensor(4).fill([1, 2, 3, 4]), FakeTensor(4).fill([1, 1, 1, 1])
    got = []
    for i in range(6):
        if begun != "automatic":
            tree.explicit_steps = True
            tree.step_begin()
        out, saved = call(f, x)
        tree.explicit_steps = False
        (h,) = call(g, x)
        assert h.values() == [5, 10, 15, 20]
        try:
            (grad,) = bw(saved, t)
            got.append(grad.values())
        except X.StaleTensorError:
            got.append("StaleTensorError")
        del out, saved
        gc.collect()
    if begun == "automatic":
        assert got == [[3, 5, 7, 9]] * 6
    else:  # the first calls run as the plain graphs: their outputs are not the tree's
        assert got[0] == [3, 5, 7, 9] and got[1:] == ["StaleTensorError"] * 5, got


@pytest.mark.parametrize("begun", ["automatic", "explicit_then_switched"])
def test_a_teachers_output_made_in_explicit_mode_holds_no_step_after_a_switch_and_raises_when_read(tree, begun):
    """Distillation: t = teacher(x) under no_grad, then the student trains
    and the loss reads t. In automatic mode t holds the step for the
    student's call (tx_tree_note_inference_output). The limit: made while
    the thread was explicit, then set_step_mode("call"), t was not noted,
    so the student's call begins a step and reading t raises
    StaleTensorError (never the student's data); the student computes."""
    teacher = segment(tree, Graph(tree, 5.0, 0.0), spans=(16,), name="teacher")
    student = segment(tree, ForwardGraph(tree), spans=(16,), name="student", saved_from=1)
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    g, x = FakeTensor(4).fill([1, 1, 1, 1]), FakeTensor(4).fill([1, 2, 3, 4])
    got = []
    for i in range(6):
        if begun != "automatic":
            tree.explicit_steps = True
            tree.step_begin()
        (t,) = call(teacher, x)
        tree.explicit_steps = False
        y, saved = call(student, x)
        try:
            got.append(t.values())
        except RuntimeError as e:
            assert "StaleTensorError" in str(e)
            got.append("StaleTensorError")
        (gx,) = bw(saved, g)
        assert gx.values() == [4, 7, 10, 13]
        del y, saved, gx
        gc.collect()
    if begun == "automatic":
        assert got == [[5, 10, 15, 20]] * 6
    else:
        assert got[0] == [5, 10, 15, 20] and got[1:] == ["StaleTensorError"] * 5, got


# ------------------------------------------------ two threads in lock step, each switching modes, sharing outputs

def _two_thread_fuzz(tree, box, seed, n_ops=160, training_ops=True):
    import random

    rnd = random.Random(seed)
    trees = ThreadTrees()
    stream = lambda: trees(0).stream  # noqa: E731
    f = segment(tree, Graph(tree, 1.0, 1.0, stream=stream), spans=(16,), name="f")
    g = segment(tree, Graph(tree, -1.0, 2.0, stream=stream), spans=(16,), name="g")

    class Add:
        def __call__(self, x, y):
            out = FakeTensor(x.n)
            X.sim_launch(stream(), S.k_add, out.ptr, x.ptr, y.ptr, x.n)
            return (out,)

    class Fw:
        def __call__(self, x):
            out, saved = FakeTensor(x.n), FakeTensor(x.n)
            X.sim_launch(stream(), S.k_affine, out.ptr, x.ptr, x.n, 2.0, 0.0)
            X.sim_launch(stream(), S.k_affine, saved.ptr, x.ptr, x.n, 3.0, 0.0)
            return (out, saved)

    add = segment(tree, Add(), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="add")
    fw = segment(tree, Fw(), spans=(16,), name="fw", saved_from=1)
    bw = segment(tree, Add(), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    shared = []  # (tensor, eager value)
    pending = {"A": [], "B": []}
    log, errors = [], []
    cond = threading.Condition()
    turn = {"who": None, "left": n_ops, "done": set()}

    def op(me):
        t_ = trees(0)
        k = rnd.random()
        if k < 0.08:
            t_.explicit_steps = not t_.explicit_steps
            log.append("%s explicit=%s" % (me, t_.explicit_steps))
        elif k < 0.14:
            t_.step_begin()
            log.append("%s step_begin" % me)
        elif k < 0.16:
            mark(box)
            log.append("%s mark" % me)
        elif k < 0.24 and shared:
            shared.pop(rnd.randrange(len(shared)))
            gc.collect()
            log.append("%s drop" % me)
        elif k < 0.30 and shared:
            i = rnd.randrange(len(shared))
            tt, v = shared[i]
            log.append("%s read" % me)
            if not reads(tt, v):
                shared.pop(i)
        elif training_ops and k < 0.38:
            x = FakeTensor(4).fill([rnd.randint(-3, 3) for _ in range(4)])
            log.append("%s fw" % me)
            try:
                out, saved = call(fw, x)
            except X.StaleTensorError:
                return
            pending[me].append((saved, aff(x.values(), 3.0, 0.0)))
            shared.append((out, aff(x.values(), 2.0, 0.0)))
        elif training_ops and k < 0.44 and pending[me]:
            saved, sv = pending[me].pop(rnd.randrange(len(pending[me])))
            tg = FakeTensor(4).fill([1, 1, 1, 1])
            log.append("%s bw" % me)
            try:
                (gr,) = bw(saved, tg)
            except X.StaleTensorError:
                return
            got = gr.values()
            assert got == [v + 1 for v in sv], (seed, me, got, sv, log[-14:])
            shared.append((gr, got))
        else:
            seg = rnd.choice((f, g, add))

            def arg():
                if shared and rnd.random() < 0.6:
                    return shared[rnd.randrange(len(shared))]
                x = FakeTensor(4).fill([rnd.randint(-3, 3) for _ in range(4)])
                return x, x.values()
            args = [arg()] if seg is not add else [arg(), arg()]
            log.append("%s call %s" % (me, {id(f): "f", id(g): "g", id(add): "add"}[id(seg)]))
            try:
                (y,) = call(seg, *[tt for tt, _ in args])
            except X.StaleTensorError:
                return
            vs = [v for _, v in args]
            want = (aff(vs[0], 1.0, 1.0) if seg is f else aff(vs[0], -1.0, 2.0) if seg is g
                    else [p + q for p, q in zip(vs[0], vs[1])])
            got = y.values()
            assert got == want, (seed, me, got, want, log[-14:])
            for tt, v in args:
                reads(tt, v)
            if max(abs(e) for e in want) < 1e5:
                shared.append((y, want))
        if len(shared) > 14:
            shared.pop(0)

    def worker(me):
        def run():
            try:
                while True:
                    with cond:
                        while turn["who"] != me and turn["left"] > 0:
                            cond.wait(10)
                        if turn["left"] <= 0:
                            break
                    try:
                        op(me)
                    finally:
                        with cond:
                            turn["left"] -= 1
                            turn["who"] = rnd.choice("AB")
                            cond.notify_all()
            except Exception as e:  # noqa: BLE001
                errors.append("%s: %r" % (me, e))
                with cond:
                    turn["left"] = 0
                    cond.notify_all()
            finally:
                pending[me].clear()
        return run

    turn["who"] = "A"
    S.run_threads(trees, worker("A"), worker("B"))
    for tt, v in shared:
        reads(tt, v)
    shared.clear()
    gc.collect()
    assert errors == [], errors
    for t_ in trees.made:
        t_.check()


@pytest.mark.parametrize("seed", range(SEEDS))
def test_two_threads_in_lock_step_switching_modes_never_read_wrong(tree, box, seed):
    _two_thread_fuzz(tree, box, 5000 + seed)


# ------------------------------------------------ speed: the recording made in one mode replays in the other

@pytest.mark.parametrize("first", ["automatic", "explicit"])
def test_a_recording_made_in_one_mode_replays_after_the_switch(tree, box, first):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    h = segment(tree, Graph(tree, 1.0, 1.0), spans=(16,), name="h")
    x = FakeTensor(4).fill([1, 2, 3, 4])

    def step(explicit):
        tree.explicit_steps = explicit
        if explicit:
            tree.step_begin()
        (y,) = call(seg, x)
        (z,) = seg(y) if explicit else call(h, y)
        return y, z

    for _ in range(5):
        step(first == "explicit")
    s0 = tree.stats()
    for _ in range(5):
        y, z = step(first == "explicit")
    s1 = tree.stats()
    assert s1["recordings"] == s0["recordings"] and s1["replays"] == s0["replays"] + 10
    for _ in range(5):
        y, z = step(first != "explicit")
    s2 = tree.stats()
    for _ in range(5):
        y, z = step(first != "explicit")
    s3 = tree.stats()
    assert s3["recordings"] == s2["recordings"] and s3["replays"] == s2["replays"] + 10, (s2, s3)
    assert y.values() == [3, 5, 7, 9]


def test_a_thread_switching_mode_every_iteration_replays(tree, box):
    seg = segment(tree, Graph(tree, 2.0, 1.0), spans=(16,))
    x = FakeTensor(4).fill([1, 2, 3, 4])
    for i in range(8):
        tree.explicit_steps = i % 2 == 0
        tree.step_begin()
        (y,) = call(seg, x)
    s0 = tree.stats()
    for i in range(8):
        tree.explicit_steps = i % 2 == 0
        if i % 2 == 0 or i % 3 == 0:  # explicit: always; automatic: a mark now and then too
            tree.step_begin()
        (y,) = call(seg, x)
        assert y.values() == [3, 5, 7, 9]
    s1 = tree.stats()
    assert s1["recordings"] == s0["recordings"] and s1["replays"] == s0["replays"] + 8, (s0, s1)


@pytest.mark.parametrize("pattern", ["AEA", "EAE", "AAE", "EEA"])
def test_gradient_accumulation_over_micro_batches_in_mixed_modes_then_a_compiled_optimizer(tree, box, pattern):
    fw = segment(tree, S.ParamForwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR_STATIC), spans=(16, 16), name="fw",
                 saved_from=1, grad_inputs=(1,))
    bw = segment(tree, BackwardGraph(tree), kinds=(ARG_TENSOR, ARG_TENSOR), spans=(16, 16), name="bw", backward=True)
    opt = optimizer_segment(tree)
    w, t = Leaf(4).fill([0, 0, 0, 0]), FakeTensor(4).fill([1, 1, 1, 1])
    for it in range(5):
        w.grad = None
        want = [0.0] * 4
        for mb, mode in enumerate(pattern):
            tree.explicit_steps = mode == "E"
            if mode == "E":
                tree.step_begin()
            x = FakeTensor(4).fill([mb + 1, 2, 3, it])
            out, saved = call(fw, x, w)
            (g,) = bw(saved, t)
            w.accumulate(g)
            want = [a + b + 1 for a, b in zip(want, x.values())]
            assert out.values() == [a + b for a, b in zip(x.values(), w.values())]
            del g, saved
            assert w.grad.values() == want, (it, mb)
        tree.explicit_steps = pattern[-1] == "E"
        (u,) = call(opt, w, w.grad)
        assert u.values() == [a + b for a, b in zip(w.values(), want)], it
        assert w.grad.values() == want
        if it % 2:
            tree.explicit_steps = not tree.explicit_steps
