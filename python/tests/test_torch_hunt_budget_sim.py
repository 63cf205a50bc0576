"""The recording budget and shapes that come and go, with training (a helper's hunt).

Trees with a small max_graphs on the simulator: variants keyed by int
arguments (as SymInt sizes key them), training forward/backward pairs whose
variant changes from step to step, outputs kept across evictions, an
optimizer segment under a budget. Every read is compared with what eager
computes (fake tensors: the values are known); an output whose memory a
later step may reuse either reads its own value or raises, never another
step's data. tree.check() after each test.
Stand-ins imported from test_torch_ext_sim.py, as test_torch_hunt_modes_sim.py does."""
import gc
import warnings

import pytest

X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402
from test_torch_ext_sim import (  # noqa: E402
    ARG_INT, ARG_TENSOR, ARG_TENSOR_STATIC, FakeTensor, Leaf, call, fake_move_out, k_add, k_affine, segment)


@pytest.fixture(autouse=True)
def quiet():
    X.set_output_mover(fake_move_out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def make_tree(max_graphs=0, max_graph_bytes=0, **kw):
    return X.Tree(0, backend="sim", max_graphs=max_graphs, max_graph_bytes=max_graph_bytes, **kw)


def dseg(tree, graph, kinds, name, **kw):
    """A Segment whose tensor spans are read per call (dynamic_spans), as a
    graph compiled with dynamic=True has them: a span of 0 in segment()'s
    spans means an empty tensor, passed by itself, never copied."""
    def launch(inputs):
        return graph(*inputs)

    spans = tuple(0 for _ in kinds)
    return X.Segment(tree, name, graph, launch, S.alias, S.describe, S.span, bytes(kinds), spans, 0, True, **kw)


def reads(t, want):
    """t reads want, or raises StaleTensorError: never another value. True if it read."""
    try:
        got = t.values()
    except RuntimeError as e:
        assert "StaleTensorError" in str(e) or "stale" in str(e).lower(), e
        return False
    assert got == want, "read %r, eager has %r" % (got, want)
    return True


def aff(v, a, b):
    return [a * e + b for e in v]


class VarForward:
    """A training forward keyed by k (a SymInt size): out = 2k x, saved = 3k x.
    Its input has k elements (the shape), so the variant and the size go together."""

    def __init__(self, tree):
        self.tree, self.calls = tree, 0

    def __call__(self, x, k):
        self.calls += 1
        out, saved = FakeTensor(x.n), FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, x.ptr, x.n, 2.0 * k, 0.0)
        X.sim_launch(self.tree.stream, k_affine, saved.ptr, x.ptr, x.n, 3.0 * k, 0.0)
        return (out, saved)


class VarBackward:
    """Its backward: grad = saved + k * tangent (takes the SymInt too, as AOTAutograd's backward does)."""

    def __init__(self, tree):
        self.tree, self.calls = tree, 0

    def __call__(self, saved, t, k):
        self.calls += 1
        tmp = FakeTensor(saved.n)
        X.sim_launch(self.tree.stream, k_affine, tmp.ptr, t.ptr, t.n, float(k), 0.0)
        out = FakeTensor(saved.n)
        X.sim_launch(self.tree.stream, k_add, out.ptr, saved.ptr, tmp.ptr, saved.n)
        del tmp
        return (out,)


def var_pair(t, name="fw"):
    fw = dseg(t, VarForward(t), (ARG_TENSOR, ARG_INT), name, saved_from=1)
    bw = dseg(t, VarBackward(t), (ARG_TENSOR, ARG_TENSOR, ARG_INT), name + "_bw", backward=True)
    return fw, bw


def xs_of(k):
    return FakeTensor(k).fill([float(i + 1) for i in range(k)])


def ts_of(k):
    return FakeTensor(k).fill([1.0] * k)


def want_fw(k):
    x = [float(i + 1) for i in range(k)]
    return aff(x, 2.0 * k, 0.0), aff(x, 3.0 * k, 0.0)


def want_bw(k):
    return [s + k for s in want_fw(k)[1]]


SEQS = {
    "alternating": [1, 2] * 6,
    "three_cycle": [1, 2, 3] * 5,
    "random_walk": [1, 2, 1, 3, 3, 2, 1, 4, 2, 4, 1, 1, 3, 2, 4, 4, 1, 2, 3, 1],
}


# ------------------------------------------------------------- one pair per step

@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("seq", list(SEQS))
def test_a_training_pair_whose_shape_changes_every_step_under_a_budget_computes_as_eager(budget, seq):
    t = make_tree(max_graphs=budget)
    fw, bw = var_pair(t)
    xs = {k: xs_of(k) for k in range(1, 5)}
    ts = {k: ts_of(k) for k in range(1, 5)}
    for i, k in enumerate(SEQS[seq] * 2):
        out, saved = call(fw, xs[k], k)
        assert out.values() == want_fw(k)[0], (i, k)
        (g,) = bw(saved, ts[k], k)
        assert g.values() == want_bw(k), (i, k)
        del out, saved, g
        gc.collect()
        t.check()
    st = t.stats()
    assert st["graphs"] <= max(budget, 2)
    if budget < 4:
        assert st["evictions"] > 0
    t.check()


@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("seq", list(SEQS))
def test_outputs_kept_across_steps_of_changing_shape_read_their_value_or_raise(budget, seq):
    """Every output and gradient kept by the program (a log of losses): each later
    read gives what eager computed or raises, through evictions and re-recordings."""
    t = make_tree(max_graphs=budget)
    fw, bw = var_pair(t)
    xs = {k: xs_of(k) for k in range(1, 5)}
    ts = {k: ts_of(k) for k in range(1, 5)}
    kept = []
    for i, k in enumerate(SEQS[seq] * 2):
        out, saved = call(fw, xs[k], k)
        (g,) = bw(saved, ts[k], k)
        kept += [(out, want_fw(k)[0]), (g, want_bw(k))]
        del saved
        gc.collect()
        for j, (o, w) in enumerate(kept):
            reads(o, w)
        t.check()
    t.check()


@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("seq", list(SEQS))
def test_saved_activations_kept_past_their_backward_read_their_value_or_raise(budget, seq):
    """A retained graph: the saved activation kept after the backward, then
    read again (a second backward of the same graph) at the next steps."""
    t = make_tree(max_graphs=budget)
    fw, bw = var_pair(t)
    xs = {k: xs_of(k) for k in range(1, 5)}
    ts = {k: ts_of(k) for k in range(1, 5)}
    kept = []
    for i, k in enumerate(SEQS[seq]):
        out, saved = call(fw, xs[k], k)
        (g,) = bw(saved, ts[k], k)
        assert g.values() == want_bw(k)
        kept.append((saved, want_fw(k)[1], out, want_fw(k)[0]))
        for s, ws, o, wo in kept:
            reads(s, ws)
            reads(o, wo)
        t.check()


# ------------------------------------------------ two forwards, then two backwards

@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("order", ["fifo", "lifo"])
@pytest.mark.parametrize("pairs", [[(1, 2), (2, 1)], [(1, 2), (3, 1), (2, 3), (1, 1), (2, 2), (3, 2)]])
def test_two_forwards_of_different_shapes_then_their_backwards_under_a_budget(budget, order, pairs):
    t = make_tree(max_graphs=budget)
    fw, bw = var_pair(t)
    xs = {k: xs_of(k) for k in range(1, 5)}
    ts = {k: ts_of(k) for k in range(1, 5)}
    for rep in range(3):
        for a, b in pairs:
            oa, sa = call(fw, xs[a], a)
            ob, sb = call(fw, xs[b], b)
            assert oa.values() == want_fw(a)[0] and ob.values() == want_fw(b)[0], (rep, a, b)
            first, second = ((sa, a), (sb, b)) if order == "fifo" else ((sb, b), (sa, a))
            (g1,) = bw(first[0], ts[first[1]], first[1])
            assert g1.values() == want_bw(first[1]), (rep, a, b)
            (g2,) = bw(second[0], ts[second[1]], second[1])
            assert g2.values() == want_bw(second[1]), (rep, a, b)
            reads(oa, want_fw(a)[0]); reads(ob, want_fw(b)[0]); reads(g1, want_bw(first[1]))
            del oa, sa, ob, sb, g1, g2, first, second
            gc.collect()
            t.check()


# --------------------------------------------- gradient accumulation over micro-batches

class VarParamForward:
    """out = x + k w (the parameter w, STATIC, one element per... the first n
    of its elements), saved = x."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, x, w, k):
        out, saved = FakeTensor(x.n), FakeTensor(x.n)
        tmp = FakeTensor(x.n)
        X.sim_launch(self.tree.stream, k_affine, tmp.ptr, w.ptr, x.n, float(k), 0.0)
        X.sim_launch(self.tree.stream, k_add, out.ptr, x.ptr, tmp.ptr, x.n)
        X.sim_launch(self.tree.stream, k_affine, saved.ptr, x.ptr, x.n, 1.0, 0.0)
        del tmp
        return (out, saved)


class FullGrad:
    """Backward: w's gradient (4 elements): saved (padded with 0) + tangent."""

    def __init__(self, tree):
        self.tree = tree

    def __call__(self, saved, t, k):
        out = FakeTensor(4)
        X.sim_launch(self.tree.stream, k_affine, out.ptr, t.ptr, 4, 1.0, 0.0)
        X.sim_launch(self.tree.stream, k_add, out.ptr, out.ptr, saved.ptr, saved.n)
        return (out,)


def accum_pair(t):
    fw = dseg(t, VarParamForward(t), (ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT), "pfw", saved_from=1, grad_inputs=(1,))
    bw = dseg(t, FullGrad(t), (ARG_TENSOR, ARG_TENSOR, ARG_INT), "pbw", backward=True)
    return fw, bw


@pytest.mark.parametrize("budget", [0, 1, 2, 3])
@pytest.mark.parametrize("micro", [[1, 2], [2, 3, 1], [3, 3, 1, 2]])
def test_gradient_accumulation_over_micro_batches_of_different_sizes_under_a_budget(budget, micro):
    t = make_tree(max_graphs=budget)
    fw, bw = accum_pair(t)
    w = Leaf(4).fill([1, 1, 1, 1])
    xs = {k: xs_of(k) for k in range(1, 5)}
    tg = FakeTensor(4).fill([1, 1, 1, 1])
    for step in range(6):
        w.grad = None
        want_grad = [0.0] * 4
        for k in micro:
            out, saved = call(fw, xs[k], w, k)
            assert out.values() == [float(i + 1) + k for i in range(k)], (step, k)
            (g,) = bw(saved, tg, k)
            gw = [1.0 + (float(i + 1) if i < k else 0.0) for i in range(4)]
            assert g.values() == gw, (step, k)
            w.accumulate(g)
            want_grad = [a + b for a, b in zip(want_grad, gw)]
            del out, saved, g
            gc.collect()
        assert w.grad.values() == want_grad, step
        t.check()


@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("micro", [[1, 2], [2, 3, 1]])
def test_all_micro_batch_forwards_first_then_all_backwards_under_a_budget(budget, micro):
    """Pipeline-like: every micro-batch's forward, then the backwards in reverse order."""
    t = make_tree(max_graphs=budget)
    fw, bw = accum_pair(t)
    w = Leaf(4).fill([1, 1, 1, 1])
    xs = {k: xs_of(k) for k in range(1, 5)}
    tg = FakeTensor(4).fill([1, 1, 1, 1])
    for step in range(6):
        w.grad = None
        want_grad = [0.0] * 4
        saveds = []
        for k in micro:
            out, saved = call(fw, xs[k], w, k)
            assert out.values() == [float(i + 1) + k for i in range(k)], (step, k)
            saveds.append((saved, k, out))
        for saved, k, out in reversed(saveds):
            (g,) = bw(saved, tg, k)
            gw = [1.0 + (float(i + 1) if i < k else 0.0) for i in range(4)]
            assert g.values() == gw, (step, k)
            w.accumulate(g)
            want_grad = [a + b for a, b in zip(want_grad, gw)]
            reads(out, [float(i + 1) + k for i in range(k)])
            del g
        del saveds, saved, out
        gc.collect()
        assert w.grad.values() == want_grad, step
        t.check()


# ------------------------------------------------ inference variants, kept outputs

def scaled_seg(t, name="shapes"):
    g = S.Graph(t, 1.0, 0.0)

    def scaled(x, k):
        (y,) = g(x)
        X.sim_launch(t.stream, k_affine, y.ptr, y.ptr, y.n, float(k), 0.0)
        return (y,)

    return segment(t, scaled, kinds=(ARG_TENSOR, ARG_INT), spans=(16, 0), name=name), g


@pytest.mark.parametrize("budget", [1, 2])
def test_an_output_of_an_evicted_recording_kept_alive_then_the_variant_recorded_again(budget):
    t = make_tree(max_graphs=budget)
    seg, g = scaled_seg(t)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    kept = []
    for i in range(30):
        k = [1, 2, 3][i % 3] if i < 15 else 1 + (i * 7) % 4
        (y,) = call(seg, x, k)
        assert y.values() == [k * v for v in [1, 2, 3, 4]], i
        if i % 2 == 0:
            kept.append((y, [k * v for v in [1, 2, 3, 4]]))
        for o, w in kept:
            reads(o, w)
        t.check()
    assert t.stats()["evictions"] > 0


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_a_chain_of_variant_graphs_in_one_step_x_equals_f_of_x(budget):
    """x = f(x, k) with k changing within a step and across steps: a path
    longer than the budget, evictions off it at every recording."""
    t = make_tree(max_graphs=budget)
    seg, g = scaled_seg(t)
    for step in range(8):
        x = FakeTensor(4).fill([1, 2, 3, 4])
        want = [1.0, 2.0, 3.0, 4.0]
        ks = [1, 2, 1, 3] if step % 2 else [2, 3, 2]
        for k in ks:
            (x,) = call(seg, x, k)
            want = [k * v for v in want]
            assert x.values() == want, (step, ks)
        t.check()


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_two_variants_inside_one_step_their_outputs_both_read_right(budget):
    """Explicit steps: y1 = f(x, 1), y2 = f(x, 2), y3 = f(y1, 3) in a step; other shapes in between steps."""
    t = make_tree(max_graphs=budget)
    t.explicit_steps = True
    seg, g = scaled_seg(t)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    base = [1.0, 2.0, 3.0, 4.0]
    for step in range(10):
        t.step_begin()
        a, b = (1, 2) if step % 3 else (3, 4)
        (y1,) = call(seg, x, a)
        (y2,) = call(seg, x, b)
        (y3,) = call(seg, y1, b)
        assert y1.values() == [a * v for v in base], step
        assert y2.values() == [b * v for v in base], step
        assert y3.values() == [a * b * v for v in base], step
        t.check()


# ------------------------------------------------ capture failure / plain graphs under a budget

@pytest.mark.parametrize("budget", [1, 2])
def test_a_graph_going_plain_beside_variants_under_a_budget(budget):
    t = make_tree(max_graphs=budget)
    seg, g = scaled_seg(t)
    gs = S.Graph(t, 2.0, 1.0)

    def syncing(x):
        X.sim_sync(t.stream)
        return gs(x)

    sync = segment(t, syncing, spans=(16,), name="syncs")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    t.explicit_steps = True
    for i in range(12):
        t.step_begin()
        k = 1 + i % 3
        (y,) = call(seg, x, k)
        (z,) = call(sync, y)
        (w,) = call(seg, z, k + 1)
        assert y.values() == [k * v for v in [1, 2, 3, 4]], i
        assert z.values() == [2 * k * v + 1 for v in [1, 2, 3, 4]], i
        assert w.values() == [(k + 1) * (2 * k * v + 1) for v in [1, 2, 3, 4]], i
        t.check()


# ------------------------------------------------ optimizer segment, moving STATIC inputs

@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("moves", ["never", "every_3_steps", "two_buffers"])
def test_an_optimizer_step_with_variant_forwards_under_a_budget(budget, moves):
    t = make_tree(max_graphs=budget)
    fw, bw = accum_pair(t)
    opt = S.optimizer_segment(t)
    ws = [Leaf(4).fill([1, 1, 1, 1]), Leaf(4).fill([1, 1, 1, 1])]
    w = ws[0]
    xs = {k: xs_of(k) for k in range(1, 5)}
    tg = FakeTensor(4).fill([1, 1, 1, 1])
    for step in range(14):
        if moves == "every_3_steps" and step % 3 == 2:
            nw = Leaf(4).fill(w.values())  # reloaded at a new address
            w = nw
        elif moves == "two_buffers":
            nw = ws[step % 2]
            nw.fill(w.values())
            w = nw
        w.grad = None
        k = 1 + step % 3
        out, saved = call(fw, xs[k], w, k)
        wv = w.values()
        assert out.values() == [float(i + 1) + k * wv[i] for i in range(k)], step
        (g,) = bw(saved, tg, k)
        w.accumulate(g)
        (nwv,) = call(opt, w, w.grad)
        gw = [1.0 + (float(i + 1) if i < k else 0.0) for i in range(4)]
        assert nwv.values() == [a + b for a, b in zip(wv, gw)], step
        w.fill([v * 0.5 for v in nwv.values()])  # the update written back in place
        del out, saved, g, nwv
        gc.collect()
        t.check()


@pytest.mark.parametrize("budget", [1, 2])
def test_weights_reloaded_under_a_budget_with_variants(budget):
    """weighted graph (x + w) keyed by k; w reloaded at a new address every few steps."""
    t = make_tree(max_graphs=budget)

    def add_w(x, w, k):
        out = FakeTensor(x.n)
        X.sim_launch(t.stream, k_add, out.ptr, x.ptr, w.ptr, x.n)
        X.sim_launch(t.stream, k_affine, out.ptr, out.ptr, x.n, float(k), 0.0)
        return (out,)

    seg = segment(t, add_w, kinds=(ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT), spans=(16, 16, 0), name="wk")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    w = FakeTensor(4).fill([0, 0, 0, 0])
    kept = []
    for step in range(40):
        if step % 5 == 4:
            w = FakeTensor(4).fill([float(step)] * 4)
        k = 1 + step % 2 if step < 20 else 1 + step % 3
        (y,) = call(seg, x, w, k)
        want = [k * (a + b) for a, b in zip([1, 2, 3, 4], w.values())]
        assert y.values() == want, step
        kept.append((y, want))
        for o, wv in kept[-6:]:
            reads(o, wv)
        t.check()


# ------------------------------------------------ a byte budget

@pytest.mark.parametrize("max_bytes", [4096, 20000, 60000])
@pytest.mark.parametrize("seq", list(SEQS))
def test_a_training_pair_whose_shape_changes_under_a_byte_budget_computes_as_eager(max_bytes, seq):
    t = make_tree(max_graph_bytes=max_bytes)
    fw, bw = var_pair(t)
    xs = {k: xs_of(k) for k in range(1, 5)}
    ts = {k: ts_of(k) for k in range(1, 5)}
    kept = []
    for i, k in enumerate(SEQS[seq] * 2):
        out, saved = call(fw, xs[k], k)
        assert out.values() == want_fw(k)[0], (i, k)
        (g,) = bw(saved, ts[k], k)
        assert g.values() == want_bw(k), (i, k)
        kept.append((out, want_fw(k)[0]))
        for o, w in kept[-5:]:
            reads(o, w)
        del saved, g
        gc.collect()
        t.check()


# ------------------------------------------------ rerecord limit and budget together

@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("limit", [1, 2])
def test_moving_weights_past_a_small_rerecord_limit_with_variants_under_a_budget(budget, limit):
    t = X.Tree(0, backend="sim", rerecord_limit=limit, max_graphs=budget)

    def add_w(x, w, k):
        out = FakeTensor(x.n)
        X.sim_launch(t.stream, k_add, out.ptr, x.ptr, w.ptr, x.n)
        X.sim_launch(t.stream, k_affine, out.ptr, out.ptr, x.n, float(k), 0.0)
        return (out,)

    seg = segment(t, add_w, kinds=(ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT), spans=(16, 16, 0), name="wk")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    ring = [FakeTensor(4).fill([float(i)] * 4) for i in range(3)]
    t.explicit_steps = True
    for step in range(60):
        t.step_begin()
        if step % 7 == 6:
            ring[step % 3] = FakeTensor(4).fill([float(step)] * 4)  # a reload
        w = ring[step % 3] if step % 4 else ring[0]
        k = 1 + step % 2
        (y,) = call(seg, x, w, k)
        want = [k * (a + b) for a, b in zip([1, 2, 3, 4], w.values())]
        (z,) = call(seg, y, ring[1], 3 - k)
        wz = [(3 - k) * (a + b) for a, b in zip(want, ring[1].values())]
        assert y.values() == want, step
        assert z.values() == wz, step
        t.check()


# ------------------------------------------------ liveness siblings (key groups) under a budget

@pytest.mark.parametrize("budget", [1, 2, 3])
def test_kept_outputs_that_change_liveness_make_key_group_siblings_under_a_budget(budget):
    """Explicit steps of three calls; which outputs are kept changes from step to
    step, so the same keys get siblings per liveness pattern; the variant changes too."""
    t = make_tree(max_graphs=budget)
    t.explicit_steps = True
    seg, g = scaled_seg(t)
    base = [1.0, 2.0, 3.0, 4.0]
    x = FakeTensor(4).fill(base)
    for step in range(40):
        t.step_begin()
        k = 1 + (step // 3) % 3
        kept = []
        (a,) = call(seg, x, k)
        if step % 2:
            kept.append((a, [k * v for v in base]))
        (b,) = call(seg, x, k + 1)
        del a
        if step % 3 == 0:
            kept.append((b, [(k + 1) * v for v in base]))
        del b
        (c,) = call(seg, x, k + 2)
        assert c.values() == [(k + 2) * v for v in base], step
        for o, w in kept:
            assert o.values() == w, step  # same step: alive, must read
        t.check()


# ------------------------------------------------ shapes that come and go: the cost of many shapes

def test_thousands_of_shapes_each_find_their_own_output_template_through_the_index():
    """A server with dynamic=True sees thousands of shapes over its life;
    the budget keeps 4 graphs. The segment keeps an output template per
    shape (variant), found through a hash index (seg_outputs.c,
    seg_tmpl_find): a linear scan of them made a replay of the newest shape
    cost 10x at 20,000 shapes (a helper's hunt; bench/sim_replay_cost.py
    --shapes 20000 times it). Here 3,000 shapes grow the index many times
    over, then shapes old and new, in a scattered order, each read their
    own size's result (a template of another shape would give another
    scale), and the newest replays."""
    t = make_tree(max_graphs=4)
    seg, g = scaled_seg(t)
    x = FakeTensor(4).fill([1, 2, 3, 4])
    n_shapes = 3000
    for k in range(1, n_shapes + 1):
        (y,) = call(seg, x, k)
        assert y.values() == [k * v for v in [1, 2, 3, 4]]
        del y
    for k in list(range(1, n_shapes + 1, 97)) + [n_shapes] * 4 + list(range(n_shapes, 0, -331)):
        (y,) = call(seg, x, k)
        assert y.values() == [k * v for v in [1, 2, 3, 4]], k
        del y
    for _ in range(2):  # recorded again where the scattered calls evicted it
        (y,) = call(seg, x, n_shapes)
        del y
    before = t.stats()["replays"]
    for _ in range(3):
        (y,) = call(seg, x, n_shapes)
        del y
    assert t.stats()["replays"] - before == 3
    assert t.stats()["graphs"] <= 4
    # Another shape's template would be taken for a 64-bit collision (its key differs) and run plainly: right
    # values, so the count says it.
    assert seg.info["collisions"] == 0
    t.check()


# ------------------------------------------------ a re-recording after an eviction that fails

class SyncsAtCall(VarForward):
    """VarForward that syncs (as .item() does: the capture fails) at its calls in `at`."""

    def __init__(self, tree, at):
        super().__init__(tree)
        self.at = at

    def __call__(self, x, k):
        res = super().__call__(x, k)
        if self.calls in self.at:
            X.sim_sync(self.tree.stream)
        return res


@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("at", [(3,), (4,), (5,), (6, 7)])
def test_a_forward_whose_capture_fails_at_a_re_recording_after_an_eviction(budget, at):
    t = make_tree(max_graphs=budget)
    fg = SyncsAtCall(t, at)
    fw = dseg(t, fg, (ARG_TENSOR, ARG_INT), "fw", saved_from=1)
    bw = dseg(t, VarBackward(t), (ARG_TENSOR, ARG_TENSOR, ARG_INT), "fw_bw", backward=True)
    xs = {k: xs_of(k) for k in range(1, 5)}
    ts = {k: ts_of(k) for k in range(1, 5)}
    kept = []
    for i, k in enumerate([1, 2, 3, 1, 2, 3, 1, 1, 2, 2, 3, 3] * 2):
        out, saved = call(fw, xs[k], k)
        assert out.values() == want_fw(k)[0], (i, k)
        out2, saved2 = call(fw, xs[k], k)  # a second micro-batch of the same shape
        (g,) = bw(saved, ts[k], k)
        (g2,) = bw(saved2, ts[k], k)
        assert g.values() == want_bw(k) and g2.values() == want_bw(k), (i, k)
        kept.append((out, want_fw(k)[0]))
        for o, w in kept[-4:]:
            reads(o, w)
        del saved, g, saved2, g2, out2
        gc.collect()
        t.check()


def test_each_host_allocation_of_a_training_pair_of_changing_shape_under_a_budget_can_fail_and_loses_nothing():
    def setup():
        t = make_tree(max_graphs=2)
        fw, bw = var_pair(t)
        return S._ns(trees=[t], fw=fw, bw=bw, xs={k: xs_of(k) for k in range(1, 4)},
                     ts={k: ts_of(k) for k in range(1, 4)})

    def run(st):
        for i, k in enumerate([1, 2, 1, 3, 2, 1]):
            out, saved = call(st.fw, st.xs[k], k)
            assert out.values() == want_fw(k)[0], (i, k)
            (g,) = st.bw(saved, st.ts[k], k)
            assert g.values() == want_bw(k), (i, k)
            del out, saved, g

    raised = S.each_host_allocation_failed_in_turn(setup, run, limit=3000)
    assert len(raised) >= 10, raised



# ------------------------------------------------ fresh inputs at every step (addresses come and go too)

@pytest.mark.parametrize("budget", [0, 1, 2, 3])
@pytest.mark.parametrize("seq", list(SEQS))
@pytest.mark.parametrize("keep", [False, True])
def test_a_training_pair_of_changing_shape_with_fresh_inputs_every_step_under_a_budget(budget, seq, keep):
    t = make_tree(max_graphs=budget)
    fw, bw = var_pair(t)
    kept = []
    for i, k in enumerate(SEQS[seq] * 2):
        x, tg = xs_of(k), ts_of(k)
        out, saved = call(fw, x, k)
        x2 = xs_of(k)
        out2, saved2 = call(fw, x2, k)  # a second micro-batch
        del x, x2
        (g2,) = bw(saved2, tg, k)
        (g,) = bw(saved, tg, k)
        assert out.values() == want_fw(k)[0] and out2.values() == want_fw(k)[0], (i, k)
        assert g.values() == want_bw(k) and g2.values() == want_bw(k), (i, k)
        if keep:
            kept += [(out, want_fw(k)[0]), (g2, want_bw(k))]
            for o, w in kept[-6:]:
                reads(o, w)
        del out, saved, out2, saved2, g, g2, tg
        gc.collect()
        t.check()


@pytest.mark.parametrize("budget", [0, 1, 2])
@pytest.mark.parametrize("micro", [[1, 2], [2, 3, 1]])
def test_gradient_accumulation_across_steps_with_fresh_batches_under_a_budget(budget, micro):
    """zero_grad(set_to_none=False): .grad accumulates over micro-batches and steps, fresh batches each time."""
    t = make_tree(max_graphs=budget)
    fw, bw = accum_pair(t)
    w = Leaf(4).fill([1, 1, 1, 1])
    want_grad = [0.0] * 4
    for step in range(8):
        for k in micro:
            x, tg = xs_of(k), FakeTensor(4).fill([1, 1, 1, 1])
            out, saved = call(fw, x, w, k)
            assert out.values() == [float(i + 1) + k for i in range(k)], (step, k)
            (g,) = bw(saved, tg, k)
            gw = [1.0 + (float(i + 1) if i < k else 0.0) for i in range(4)]
            assert g.values() == gw, (step, k)
            w.accumulate(g)
            want_grad = [a + b for a, b in zip(want_grad, gw)]
            del out, saved, g, x, tg
            gc.collect()
        assert w.grad.values() == want_grad, step
        t.check()


def test_a_budget_one_short_of_two_shapes_training_pairs_still_replays_some():
    """Two shapes alternating, forward + backward each: 4 graphs, budget 3.
    The oldest recording is always a forward (its last use precedes its
    backward's), and taken with its backward as its subtree every recording
    evicted two graphs and nothing ever replayed: 0 replays in 200 steps,
    as with a budget of 1 (a helper's hunt). Recordings now go leaves first
    (lib/evict.c, victim): the other shape's backward goes, and the
    forwards replay."""
    t = make_tree(max_graphs=3)
    fw, bw = var_pair(t)
    xs = {k: xs_of(k) for k in (1, 2)}
    ts = {k: ts_of(k) for k in (1, 2)}
    for i in range(100):
        k = 1 + i % 2
        out, saved = call(fw, xs[k], k)
        (g,) = bw(saved, ts[k], k)
        assert g.values() == want_bw(k)
        del out, saved, g
    st = t.stats()
    assert st["replays"] >= 90, st  # every forward after the first few; before, 0
