"""Recording budgets with threads, step pruning and byte budgets (a helper's hunt).

What this file hunts, on the simulator (fake tensors: every value is known):

- recording budgets (max_graphs, max_graph_bytes) on two and three threads,
  each with trees of its own (a tree getter per thread, as cgtree.torch's):
  one compiled graph (segment) shared by every thread, evictions in one
  thread's tree beside replays in another's, in explicit and automatic
  step modes; each tree keeps its own budget, the warning comes once per
  tree, and the stats each tree keeps add up;
- WARMUP nodes pruned (prune_after_steps, 256 in every tree cgtree.torch
  makes) beside a budget, with training pairs and shapes that come once
  and shapes that come back after their nodes were evicted and pruned;
- the byte budget alone with recordings whose sizes differ tenfold and
  more, training pairs, explicit steps, and one recording larger than the
  whole budget;
- cgtree.torch.stats()'s budget figures (docs/torch.md, "Shapes that come
  and go: the recording budget": "stats() counts evictions, graphs and
  updates").

Every value read is compared with what eager computes; an output kept
past its step reads its own value or raises StaleTensorError, never
another step's (or another thread's) data. tree.check() after each step.
Stand-ins imported from test_torch_ext_sim.py, as the other hunt files do.
The random walks run SEEDS seeds (CGTREE_HUNT_SEEDS, 4 in the suite)."""
import gc
import os
import random
import threading
import warnings

import pytest

X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402
from test_torch_hunt_modes_sim import reads  # noqa: E402
from test_torch_ext_sim import (  # noqa: E402
    ARG_INT, ARG_TENSOR, ARG_TENSOR_STATIC, FakeTensor, call, fake_move_out, k_add, k_affine)

SEEDS = int(os.environ.get("CGTREE_HUNT_SEEDS", "4"))
STEPS = int(os.environ.get("CGTREE_HUNT_STEPS", "60"))
EVICTING = "budget is evicting graphs"


@pytest.fixture(autouse=True)
def mover():
    X.set_output_mover(fake_move_out)  # another test file of the process may have installed cgtree.torch's
    yield
    X.set_tree_getter(None)


# ------------------------------------------------------------------ helpers

class PerThreadTrees:
    """A tree getter of one sim tree per thread, as cgtree.torch's (each
    thread has its own trees): made with tree_kw, or with what kw_of_thread
    returns for the thread's name where given, in explicit mode where
    asked; `made` lists them in the order they were made."""

    def __init__(self, explicit=False, kw_of_thread=None, **tree_kw):
        self.local, self.made, self.kw, self.explicit = threading.local(), [], tree_kw, explicit
        self.kw_of_thread = kw_of_thread
        self.lock = threading.Lock()

    def __call__(self, device=0):
        if not hasattr(self.local, "tree"):
            kw = self.kw_of_thread(threading.current_thread().name) if self.kw_of_thread else self.kw
            t = X.Tree(0, backend="sim", **kw)
            t.explicit_steps = self.explicit
            self.local.tree = t
            with self.lock:
                self.made.append(t)
        return self.local.tree

    def stream(self):
        return self(0).stream


class Fw:
    """A training forward keyed by k (a SymInt): out = 2k x, saved = 3k x, on the running tree's stream."""

    def __init__(self, stream):
        self.stream = stream

    def __call__(self, x, k):
        out, saved = FakeTensor(x.n), FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, out.ptr, x.ptr, x.n, 2.0 * k, 0.0)
        X.sim_launch(self.stream(), k_affine, saved.ptr, x.ptr, x.n, 3.0 * k, 0.0)
        return (out, saved)


class Bw:
    """Its backward: grad = saved + k * tangent."""

    def __init__(self, stream):
        self.stream = stream

    def __call__(self, saved, t, k):
        tmp = FakeTensor(saved.n)
        X.sim_launch(self.stream(), k_affine, tmp.ptr, t.ptr, t.n, float(k), 0.0)
        out = FakeTensor(saved.n)
        X.sim_launch(self.stream(), k_add, out.ptr, saved.ptr, tmp.ptr, saved.n)
        del tmp
        return (out,)


class Scaled:
    """An inference graph keyed by its size n and k (SymInts both): y = k x, through `1 + pad(k)` kernels
    (the extra ones multiply by 1), so recordings of different k differ in
    size as much as pad says."""

    def __init__(self, stream, pad=lambda k: 0):
        self.stream, self.pad = stream, pad

    def __call__(self, x, n, k):
        y = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, y.ptr, x.ptr, x.n, float(k), 0.0)
        for _ in range(self.pad(k)):
            X.sim_launch(self.stream(), k_affine, y.ptr, y.ptr, x.n, 1.0, 0.0)
        return (y,)


def dseg(base, graph, kinds, name, **kw):
    """A Segment with dynamic spans (a graph compiled with dynamic=True)."""
    def launch(inputs):
        return graph(*inputs)

    spans = tuple(0 for _ in kinds)
    return X.Segment(base, name, graph, launch, S.alias, S.describe, S.span, bytes(kinds), spans, 0, True, **kw)


class Model:
    """One training pair and one inference graph, shared by every thread
    (one compiled graph, a state per tree), running on trees(0)."""

    def __init__(self, trees, pad=lambda k: 0):
        self.base = X.Tree(0, backend="sim")  # what the segments are made with; runs go to the getter's trees
        self.fw = dseg(self.base, Fw(trees.stream), (ARG_TENSOR, ARG_INT), "fw", saved_from=1)
        self.bw = dseg(self.base, Bw(trees.stream), (ARG_TENSOR, ARG_TENSOR, ARG_INT), "fw_bw", backward=True)
        self.scaled = dseg(self.base, Scaled(trees.stream, pad), (ARG_TENSOR, ARG_INT, ARG_INT), "scaled")

    def infer(self, x, k):
        """scaled with its size as a SymInt, as dynamic=True passes it: variant and size go together."""
        return call(self.scaled, x, x.n, k)


def xs_of(k, base=1.0):
    return FakeTensor(k).fill([base + i for i in range(k)])


def want_x(k, base=1.0):
    return [base + i for i in range(k)]




def within_budget(tree, calls_in_step, before, max_graphs=0, max_bytes=0):
    """The budget holds after a step that recorded, or every recording held
    lies on the current path (docs/api.md: "a path longer than the budget
    holds more until the next recording off it"; "enforced at recordings
    only"): a step of calls_in_step calls has at most that many. A step
    that recorded nothing holds no more than before it. before: stats()
    before the step."""
    st = tree.stats()
    nodes = tree.nodes()
    assert st["nodes"] == len(nodes), (st["nodes"], len(nodes))
    assert st["graphs"] == sum(n["state"] == "RECORDED" for n in nodes), (st["graphs"], [n["state"] for n in nodes])
    if st["recordings"] == before["recordings"]:
        assert st["graphs"] <= before["graphs"] and st["graph_bytes"] <= before["graph_bytes"], (before, st)
        return
    if max_graphs:
        assert st["graphs"] <= max(max_graphs, calls_in_step), st
    if max_bytes and st["graph_bytes"] > max_bytes:
        assert st["graphs"] <= calls_in_step, ("over the byte budget off the path", st["graph_bytes"], st["graphs"])


def run_threads(*works, barrier=None):
    """Runs each work in a thread of its own at once; returns the errors, as
    strings. A failing work aborts barrier, so the others do not wait for it."""
    errors = []

    def guarded(w):
        def run():
            try:
                w()
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                import traceback
                errors.append("".join(traceback.format_exception(e))[-3000:])
                if barrier is not None:
                    barrier.abort()
        return run

    threads = [threading.Thread(target=guarded(w)) for w in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a thread hangs"
    return errors


def eviction_warnings(record):
    return [w for w in record if EVICTING in str(w.message)]


# ------------------------------------------------------------------ one thread's random program

def random_program(m, trees, seed, steps, shapes, explicit, max_graphs=0, max_bytes=0, barrier=None, kept_n=6):
    """A thread's random walk: training pairs (one, or two forwards then
    their backwards), inference chains and single calls, over the shapes
    given; a few outputs kept across steps, each read at every step (its
    value or StaleTensorError). Base values differ per seed, so another
    thread's data would read wrong."""
    rng = random.Random(seed)
    base = float(1 + seed % 97)
    kept = []
    path = {"step": None, "calls": 0}  # the tree's step, and an upper bound of the calls made in it

    def one_step(i):
        tree = trees()
        before = tree.stats()
        if explicit:
            tree.step_begin()
        op = rng.choice(["train", "train", "two_forwards", "chain", "infer"])
        k = rng.choice(shapes)
        x, xw = xs_of(k, base), want_x(k, base)
        calls = 0
        if op == "train":
            out, saved = call(m.fw, x, k)
            (g,) = m.bw(saved, FakeTensor(k).fill([1.0] * k), k)
            calls = 2
            assert out.values() == [2 * k * v for v in xw], (seed, i, op, k)
            assert g.values() == [3 * k * v + k for v in xw], (seed, i, op, k)
            new = [(out, [2 * k * v for v in xw]), (g, [3 * k * v + k for v in xw])]
            del saved
        elif op == "two_forwards":
            k2 = rng.choice(shapes)
            x2, xw2 = xs_of(k2, base + 0.5), want_x(k2, base + 0.5)
            oa, sa = call(m.fw, x, k)
            ob, sb = call(m.fw, x2, k2)
            order = [(sb, k2, xw2), (sa, k, xw)] if rng.random() < 0.5 else [(sa, k, xw), (sb, k2, xw2)]
            new = []
            for s, kk, w in order:
                (g,) = m.bw(s, FakeTensor(kk).fill([1.0] * kk), kk)
                assert g.values() == [3 * kk * v + kk for v in w], (seed, i, op, kk)
                new.append((g, [3 * kk * v + kk for v in w]))
            calls = 4
            assert reads(oa, [2 * k * v for v in xw]) and reads(ob, [2 * k2 * v for v in xw2]), (seed, i, op)
            new += [(oa, [2 * k * v for v in xw]), (ob, [2 * k2 * v for v in xw2])]
            del sa, sb, order, s
        elif op == "chain":
            ks = [rng.choice(shapes[:3]) for _ in range(rng.randint(2, 4))]
            y, w = x, xw
            for kk in ks:
                (y,) = m.infer(y, kk)
                w = [kk * v for v in w]
                assert y.values() == w, (seed, i, op, ks)
            calls = len(ks)
            new = [(y, w)]
        else:
            (y,) = m.infer(x, k)
            calls = 1
            assert y.values() == [k * v for v in xw], (seed, i, op, k)
            new = [(y, [k * v for v in xw])]
        for o, w in kept:
            reads(o, w)
        if rng.random() < 0.5:
            kept.extend(new[:1])
            del kept[:-kept_n]
        del new  # dropped by reference counts: no gc.collect(), which costs seconds once torch is imported
        tree.check()
        # In automatic mode a step may hold across ops (a kept inference output holds the next training
        # forward's step: the distillation row), so the current path is the calls since the tree's step changed.
        path["calls"] = calls if tree.step != path["step"] else path["calls"] + calls
        path["step"] = tree.step
        within_budget(tree, path["calls"], before, max_graphs, max_bytes)

    for i in range(steps):
        if barrier is not None:
            barrier.wait()
        one_step(i)
    for o, w in kept:
        reads(o, w)


SHAPES_WIDE = [1, 2, 3, 4, 5, 6]


# ------------------------------------------------------------------ 1. budgets on two and three threads

@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("budget", [1, 2, 3])
@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "automatic"])
def test_two_threads_under_a_graph_budget_each_compute_as_eager_and_keep_their_trees_within_it(seed, budget, explicit):
    trees = PerThreadTrees(explicit=explicit, max_graphs=budget)
    m = Model(trees)
    X.set_tree_getter(trees)
    barrier = threading.Barrier(2, timeout=60)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        errors = run_threads(
            lambda: random_program(m, trees, 100 * seed + 1, STEPS, SHAPES_WIDE, explicit, max_graphs=budget,
                                   barrier=barrier),
            lambda: random_program(m, trees, 100 * seed + 2, STEPS, SHAPES_WIDE, explicit, max_graphs=budget,
                                   barrier=barrier), barrier=barrier)
    assert errors == [], errors[0]
    assert len(trees.made) == 2
    for t in trees.made:
        t.check()
        assert t.stats()["evictions"] > 0
    # "The first eviction warns once": once per tree that evicted (each tree counts its own)
    assert len(eviction_warnings(w)) == sum(t.stats()["evictions"] > 0 for t in trees.made), [
        str(x.message) for x in eviction_warnings(w)]


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_thread_without_a_budget_replays_untouched_beside_threads_whose_budgets_evict_at_every_recording(seed):
    """Budgets are per tree: thread A's tree has none (every shape records
    once, then replays for good), B's and C's have 1 graph. A's replay count
    after its warm-up grows by one per call, and its recordings stop."""
    budgets = {}

    trees = PerThreadTrees(explicit=True, kw_of_thread=lambda name: {"max_graphs": budgets[name]})
    m = Model(trees)
    X.set_tree_getter(trees)
    barrier = threading.Barrier(3, timeout=60)
    got = {}

    def steady():
        tree = trees()
        xs = {k: xs_of(k, 7.0) for k in (1, 2, 3)}
        for i in range(STEPS):
            barrier.wait()
            tree.step_begin()
            k = 1 + i % 3
            out, saved = call(m.fw, xs[k], k)
            (g,) = m.bw(saved, FakeTensor(k).fill([1.0] * k), k)
            assert g.values() == [3 * k * v + k for v in want_x(k, 7.0)], i
            del out, saved, g
            if i == 15:
                got["after_warmup"] = dict(tree.stats())
            tree.check()
        got["end"] = dict(tree.stats())

    ths = []
    for name, fn in (("A", steady),
                     ("B", lambda: random_program(m, trees, seed * 10 + 3, STEPS, SHAPES_WIDE, True, max_graphs=1,
                                                  barrier=barrier)),
                     ("C", lambda: random_program(m, trees, seed * 10 + 4, STEPS, SHAPES_WIDE, True, max_graphs=1,
                                                  barrier=barrier))):
        budgets[name] = 0 if name == "A" else 1
        ths.append((name, fn))

    def named(name, fn):
        def run():
            threading.current_thread().name = name
            fn()
        return run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = run_threads(*[named(n, f) for n, f in ths], barrier=barrier)
    assert errors == [], errors[0]
    a, e = got["after_warmup"], got["end"]
    assert e["evictions"] == 0 and e["recordings"] == a["recordings"], (a, e)
    assert e["replays"] - a["replays"] == 2 * (STEPS - 16), (a, e)
    for t in trees.made:
        t.check()
    assert sum(t.stats()["evictions"] > 0 for t in trees.made) == 2


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("max_bytes", [4096, 12000])
def test_three_threads_under_a_byte_budget_with_recordings_of_very_different_sizes_compute_as_eager(seed, max_bytes):
    trees = PerThreadTrees(explicit=True, max_graph_bytes=max_bytes)
    m = Model(trees, pad=lambda k: 0 if k < 4 else 12 * k)  # k >= 4: many kernels, a recording ten times larger
    X.set_tree_getter(trees)
    barrier = threading.Barrier(3, timeout=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = run_threads(*[
            (lambda s: lambda: random_program(m, trees, s, STEPS, SHAPES_WIDE, True, max_bytes=max_bytes,
                                              barrier=barrier))(100 * seed + j) for j in range(3)], barrier=barrier)
    assert errors == [], errors[0]
    for t in trees.made:
        t.check()


def test_an_eviction_in_one_threads_tree_leaves_another_threads_kept_outputs_and_replays_alone():
    """Lock-step: A records, replays and keeps its outputs (explicit mode, no
    step_begin between, so they stay alive and must read); B then evicts at
    every call under a budget of 1. A's kept outputs still read their values
    and A's next calls still replay."""
    trees = PerThreadTrees(explicit=True, kw_of_thread=lambda name: {"max_graphs": 1 if name == "B" else 0})
    m = Model(trees)
    X.set_tree_getter(trees)
    turn = threading.Barrier(2, timeout=60)
    log = {}

    def a():
        threading.current_thread().name = "A"
        tree = trees()
        x = xs_of(4, 5.0)
        kept = []
        for i in range(6):  # warm-up, recording, replays
            tree.step_begin()
            (y,) = m.infer(x, 3)
        tree.step_begin()
        for k in (1, 2, 3):
            (y,) = m.infer(x, k)
            kept.append((y, [k * v for v in want_x(4, 5.0)]))
        before = tree.stats()["replays"]
        turn.wait()  # B runs
        turn.wait()
        for o, w in kept:
            assert o.values() == w  # same step: alive, must read
        tree.step_begin()
        (y,) = m.infer(x, 3)
        assert y.values() == [3 * v for v in want_x(4, 5.0)]
        log["a_replayed"] = tree.stats()["replays"] - before
        tree.check()

    def b():
        threading.current_thread().name = "B"
        turn.wait()
        tree = trees()
        for i in range(40):
            tree.step_begin()
            k = 1 + i % 4
            (y,) = m.infer(xs_of(4, 9.0), k)
            assert y.values() == [k * v for v in want_x(4, 9.0)]
        log["b_evictions"] = tree.stats()["evictions"]
        tree.check()
        turn.wait()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = run_threads(a, b, barrier=turn)
    assert errors == [], errors[0]
    assert log["b_evictions"] > 0
    assert log["a_replayed"] == 1


# ------------------------------------------------------------------ 2. pruning beside a budget

def nodes_by_state(tree):
    out = {}
    for n in tree.nodes():
        out[n["state"]] = out.get(n["state"], 0) + 1
    return out


@pytest.mark.parametrize("budget", [0, 2, 3])
def test_shapes_that_come_once_are_pruned_beside_a_budget_and_shapes_that_come_back_record_again(budget):
    """Training pairs: shapes 1 and 2 every step; a new shape every 4th step
    for 540 steps (each warms up once and never recurs: WARMUP nodes);
    prune_after_steps is 256 in every tree cgtree.torch makes (a prune
    every 128 steps, of nodes unreached for 256: the first at step 384). Then the
    first one-off shapes come back after being pruned. Values right
    throughout; the tree stays bounded: nodes below 2 x (1.5 x 256 / 4 + 1)
    pairs' worth, nodes_pruned > 0."""
    tree = X.Tree(0, backend="sim", max_graphs=budget)
    tree.explicit_steps = True
    trees = lambda device=0: tree  # noqa: E731
    X.set_tree_getter(trees)
    m = Model(PerThreadTreesOf(tree))
    one_offs = iter(range(10, 10000))
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(560):
            before = tree.stats()
            tree.step_begin()
            k = next(one_offs) - 7 if i % 4 == 3 else 1 + i % 2  # 3, 4, 5, ...: each once
            if i >= 540:
                k = seen[(i - 540) % 8]  # shapes from the start, their nodes long pruned
            elif i % 4 == 3:
                seen.append(k)
            x = xs_of(k)
            out, saved = call(m.fw, x, k)
            (g,) = m.bw(saved, FakeTensor(k).fill([1.0] * k), k)
            assert out.values() == [2 * k * v for v in want_x(k)], (i, k)
            assert g.values() == [3 * k * v + k for v in want_x(k)], (i, k)
            del out, saved, g
            within_budget(tree, 2, before, budget)
            if i % 16 == 0:
                tree.check()
    st = tree.stats()
    tree.check()
    assert st["nodes_pruned"] > 0, st
    assert st["nodes"] <= 2 * (int(1.5 * 256 / 4) + 1) + 8, (st["nodes"], nodes_by_state(tree))


class PerThreadTreesOf:
    """A stand-in of PerThreadTrees for one fixed tree (Model asks it for a stream)."""

    def __init__(self, tree):
        self.tree = tree

    def stream(self):
        return self.tree.stream


@pytest.mark.parametrize("budget", [1, 2])
@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "automatic"])
def test_evicted_recordings_left_unreached_for_256_steps_are_pruned_and_record_again_when_their_shape_returns(
        budget, explicit):
    """An evicted recording goes back to WARMUP; unreached for 256 steps it
    is pruned (docs/long-programs.md). Phase 1: shapes 1..4 in turn under
    the budget (evictions); phase 2: 400 steps of shape 5 only; phase 3:
    shapes 1..4 again, as training pairs and an inference graph. Values
    right, replays resume."""
    tree = X.Tree(0, backend="sim", max_graphs=budget)
    tree.explicit_steps = explicit
    X.set_tree_getter(lambda device=0: tree)
    m = Model(PerThreadTreesOf(tree))

    def step(i, k):
        before = tree.stats()
        if explicit:
            tree.step_begin()
        out, saved = call(m.fw, xs_of(k), k)
        (g,) = m.bw(saved, FakeTensor(k).fill([1.0] * k), k)
        assert g.values() == [3 * k * v + k for v in want_x(k)], (i, k)  # before the next call, which may end its step
        (y,) = m.infer(out, k)  # out, an argument, moves if this call ends its step
        assert out.values() == [2 * k * v for v in want_x(k)], (i, k)
        assert y.values() == [2 * k * k * v for v in want_x(k)], (i, k)
        within_budget(tree, 3, before, budget)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(40):
            step(i, 1 + i % 4)
        ev = tree.stats()["evictions"]
        for i in range(400):  # the prune at step 384 takes what step 128 and before reached
            step(i, 5)
        pruned = tree.stats()["nodes_pruned"]
        before = tree.stats()["replays"]
        for i in range(40):
            step(i, 1 + (i // 6) % 4)  # each shape six steps in a row: replays once recorded again
    tree.check()
    assert ev > 0 and pruned > 0, (ev, pruned)
    if explicit or budget > 1:  # automatic, budget 1: [fw, bw] and [infer] are two steps, each evicting the other's
        assert tree.stats()["replays"] > before


# ------------------------------------------------------------------ 3. the byte budget alone

@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("max_bytes", [4096, 9000, 30000])
@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "automatic"])
def test_a_byte_budget_with_recordings_of_very_different_sizes_computes_as_eager_and_holds(seed, max_bytes, explicit):
    tree = X.Tree(0, backend="sim", max_graph_bytes=max_bytes)
    tree.explicit_steps = explicit
    X.set_tree_getter(lambda device=0: tree)
    m = Model(PerThreadTreesOf(tree), pad=lambda k: 0 if k < 4 else 20 * k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        random_program(m, lambda device=0: tree, 1000 + seed, STEPS * 2, SHAPES_WIDE, explicit, max_bytes=max_bytes)
    tree.check()


def test_one_recording_larger_than_the_whole_byte_budget_computes_and_goes_at_the_next_recording_off_it():
    """A graph of 200 kernels (its recording alone past 4096 bytes) beside a
    small one: the big one's recording is on the current path while it runs
    (never evicted then), and goes at the next recording off its path; values
    right at every call, and graph_bytes back under the budget once the
    small one's path is current."""
    tree = X.Tree(0, backend="sim", max_graph_bytes=4096)
    tree.explicit_steps = True
    X.set_tree_getter(lambda device=0: tree)
    m = Model(PerThreadTreesOf(tree), pad=lambda k: 200 if k == 4 else 0)
    x = xs_of(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(30):
            before = tree.stats()
            tree.step_begin()
            k = 4 if i % 3 == 0 else 2
            (y,) = m.infer(x, k)
            assert y.values() == [k * v for v in want_x(4)], i
            within_budget(tree, 1, before, max_bytes=4096)
            tree.check()
    assert tree.stats()["evictions"] > 0


# ------------------------------------------------------------------ 4. cgtree.torch.stats() and the budget

def test_cgtree_torch_stats_graphs_counts_the_recordings_the_trees_hold_as_the_budget_section_says(monkeypatch):
    """docs/torch.md, "Shapes that come and go": "stats() counts
    evictions, graphs and updates" (the trees' figures: graphs is what
    max_graphs bounds, as in cgtree.Tree.stats()). Two threads' trees
    with a budget of 2 graphs each, both full: cgtree.torch.stats()
    should say 4 graphs held (the sum over trees, as for every other tree
    counter), or at least what the trees say."""
    _install = pytest.importorskip("cgtree.torch._install")  # needs torch (cgtree.torch imports without it)
    import cgtree.torch as torch_pkg

    trees = PerThreadTrees(explicit=True, max_graphs=2)
    m = Model(trees)
    X.set_tree_getter(trees)

    def work():
        tree = trees()
        for i in range(12):
            tree.step_begin()
            k = 1 + i % 3
            (y,) = m.infer(xs_of(4), k)
            assert y.values() == [k * v for v in want_x(4)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run_threads(work, work) == []
    held = [t.stats()["graphs"] for t in trees.made]
    assert held == [2, 2]

    class Stream:
        cuda_stream = 0

    monkeypatch.setattr(_install, "_all_trees", [(t, Stream()) for t in trees.made])
    st = torch_pkg.stats()
    assert st["evictions"] == sum(t.stats()["evictions"] for t in trees.made)  # summed, as documented
    assert st["graphs"] == sum(held), (
        "cgtree.torch.stats()['graphs'] is %d: the number of compiled graphs (len(_segments)) overwrites "
        "the trees' recorded graphs held (%d), the figure the budget bounds" % (st["graphs"], sum(held)))


# ------------------------------------------------------------------ 5. budgets given past 32 and 64 bits

@pytest.mark.parametrize("max_graphs", [2 ** 32 + 1, 2 ** 33])
def test_a_max_graphs_past_32_bits_is_refused_not_wrapped_to_another_budget(max_graphs):
    """cgtree.torch.set_budget takes any int >= 0 and tree_for passes it to
    _torch_ext.Tree(max_graphs=...), whose C parser reads an unsigned int
    ("I", no overflow check): 2**32 + 1 became a budget of 1 graph (an
    eviction at every recording), 2**33 no cap at all. docs/api.md, "Bad
    input": max_graphs above CGT_MAX_GRAPHS_LIMIT (1 << 24) makes no tree,
    as max_graphs=1 << 30 is refused here."""
    try:
        t = X.Tree(0, backend="sim", max_graphs=max_graphs)
    except (ValueError, OverflowError):
        return
    st = four_shapes(t)
    pytest.fail("max_graphs=%d made a tree, which held %d graphs and evicted %d times in 4 shapes"
                % (max_graphs, st["graphs"], st["evictions"]))


def four_shapes(t):
    """24 calls over 4 shapes on tree t; its stats after."""
    m = Model(PerThreadTreesOf(t))
    X.set_tree_getter(lambda device=0: t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(24):
            m.infer(xs_of(4), 1 + i % 4)
    return t.stats()


def test_a_max_graph_bytes_past_64_bits_is_refused_not_wrapped_to_the_least_budget():
    """max_graph_bytes is read as an unsigned long long with no overflow
    check ("K"): 2**64 + 4096 became a budget of 4096 bytes."""
    with pytest.raises((ValueError, OverflowError)):
        X.Tree(0, backend="sim", max_graph_bytes=2 ** 64 + 4096)


def test_cgtree_torch_set_budget_refuses_a_max_graphs_the_library_would_not_take():
    """A budget the library cannot even see (past 32 bits) is refused here
    or there, never wrapped: set_budget took any int >= 0, and the tree
    tree_for made from it held one graph."""
    _install = pytest.importorskip("cgtree.torch._install")  # needs torch (cgtree.torch imports without it)
    import cgtree.torch as ct

    saved = dict(_install._budget)
    try:
        try:
            ct.set_budget(max_graphs=2 ** 32 + 1)
        except ValueError:
            return
        budget = {k: v for k, v in _install._budget.items() if v}  # what tree_for passes to _torch_ext.Tree
        try:
            t = X.Tree(0, backend="sim", **budget)
        except (ValueError, OverflowError):
            return
        st = four_shapes(t)
        pytest.fail("set_budget(max_graphs=2**32 + 1) made a tree that held %d graph(s) and evicted %d times "
                    "in 4 shapes" % (st["graphs"], st["evictions"]))
    finally:
        _install._budget.update(saved)


def test_a_trees_counts_take_ints_and_index_objects_and_refuse_bools_and_other_types_with_type_error():
    """Tree's count arguments (warmup_runs, rerecord_limit, max_graphs,
    max_graph_bytes): an object with __index__ (a numpy integer) counts as
    its int, as the "I" and "K" formats it replaced took it; True is no
    count (TypeError, as set_budget refuses bools); a float or a string is a
    TypeError, a negative int or one past the range a ValueError that says
    the range (a review: every wrong type was a ValueError, bools passed as
    1 and 0, and __index__ objects were refused)."""

    class Five:
        def __index__(self):
            return 5

    t = X.Tree(0, backend="sim", warmup_runs=Five(), max_graphs=Five())
    assert t.stats()["graphs"] == 0
    for kw in ("warmup_runs", "rerecord_limit", "max_graphs", "max_graph_bytes"):
        for bad in (True, 1.0, "3", None):
            with pytest.raises(TypeError, match="count must be an int"):
                X.Tree(0, backend="sim", **{kw: bad})
        with pytest.raises(ValueError, match="from 0 to"):
            X.Tree(0, backend="sim", **{kw: -1})
    with pytest.raises(ValueError, match="from 0 to 4294967295, not 4294967296"):
        X.Tree(0, backend="sim", max_graphs=2 ** 32)


def test_cgtree_torch_set_budget_refuses_a_byte_budget_below_the_librarys_floor_at_the_call():
    """docs/api.md: max_graph_bytes is 0 or at least CGT_MIN_GRAPH_BYTES
    (4096). set_budget took 1 to 4095 and the C library refused it only
    when the first tree was made, at some later compiled call (a review).
    Now the call raises ValueError naming the floor, and changes nothing;
    4096 and 0 are taken."""
    _install = pytest.importorskip("cgtree.torch._install")  # needs torch (cgtree.torch imports without it)
    import cgtree.torch as ct

    assert X.MIN_GRAPH_BYTES == 4096
    saved = dict(_install._budget)
    try:
        ct.set_budget(max_graphs=3, max_graph_bytes=8192)
        for bad in (1, 4095):
            with pytest.raises(ValueError, match="at least 4096"):
                ct.set_budget(max_graph_bytes=bad)
            assert _install._budget == {"max_graphs": 3, "max_graph_bytes": 8192}
        ct.set_budget(max_graph_bytes=4096)
        assert _install._budget["max_graph_bytes"] == 4096
        ct.set_budget()
        assert _install._budget == {"max_graphs": 0, "max_graph_bytes": 0}
    finally:
        _install._budget.update(saved)


# ------------------------------------------------------------------ 6. update in place under a byte budget

class AddW:
    """x + w (w STATIC: a parameter) times k, keyed by n and k."""

    def __init__(self, stream):
        self.stream = stream

    def __call__(self, x, w, n, k):
        out = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_add, out.ptr, x.ptr, w.ptr, x.n)
        X.sim_launch(self.stream(), k_affine, out.ptr, out.ptr, x.n, float(k), 0.0)
        return (out,)


@pytest.mark.parametrize("max_bytes", [4096, 8000])
@pytest.mark.parametrize("threads", [1, 2])
def test_weights_reloaded_under_a_byte_budget_update_in_place_and_compute_as_eager(max_bytes, threads):
    """An update in place keeps the graph its executable was made from and
    counts it too (docs/api.md): updates under a byte budget, with shapes
    changing, on one and two threads; every value right, the budget held
    after each step that recorded (an update counts as a recording)."""
    trees = PerThreadTrees(explicit=True, max_graph_bytes=max_bytes)
    base = X.Tree(0, backend="sim")
    seg = dseg(base, AddW(trees.stream), (ARG_TENSOR, ARG_TENSOR_STATIC, ARG_INT, ARG_INT), "addw")
    X.set_tree_getter(trees)
    barrier = threading.Barrier(threads, timeout=60)

    def work(seed):
        def run():
            rng = random.Random(seed)
            tree = trees()
            ws = {n: FakeTensor(n).fill([float(seed)] * n) for n in (2, 4, 8)}
            for i in range(80):
                barrier.wait()
                before = tree.stats()
                tree.step_begin()
                n = rng.choice([2, 4, 8])
                if i % 9 == 8:  # reloaded at a new address
                    ws[n] = FakeTensor(n).fill([float(seed + i)] * n)
                k = rng.choice([1, 2])
                x = xs_of(n)
                (y,) = call(seg, x, ws[n], n, k)
                assert y.values() == [k * (a + b) for a, b in zip(want_x(n), ws[n].values())], (seed, i, n, k)
                tree.check()
                within_budget(tree, 1, before, max_bytes=max_bytes)
        return run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = run_threads(*[work(s) for s in range(threads)], barrier=barrier)
    assert errors == [], errors[0]
    assert any(t.stats()["updates"] > 0 for t in trees.made), [t.stats()["updates"] for t in trees.made]


# ------------------------------------------------------------------ 7. an evicting thread that exits

def test_an_exited_threads_evicting_tree_keeps_its_handed_back_output_right_and_is_freed_with_its_counters():
    """Thread A runs under a budget of 1 (evicting), hands back an output and
    exits; its tree is orphaned (cgtree.torch's per-thread dict does it) and
    stays while the output lives, which reads its value; the main thread's
    tree evicts meanwhile; once the output dies the next call frees A's
    tree, whose evictions stay in its stats."""
    trees = PerThreadTrees(explicit=True, max_graphs=1)
    m = Model(trees)
    X.set_tree_getter(trees)
    handed = []

    def a():
        tree = trees()
        for i in range(12):
            tree.step_begin()
            k = 1 + i % 3
            (y,) = m.infer(xs_of(4, 2.0), k)
        handed.append((y, [k * v for v in want_x(4, 2.0)]))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run_threads(a) == []
        (dead,) = trees.made
        ev = dead.stats()["evictions"]
        assert ev > 0
        dead.orphan()
        main = trees()
        for i in range(12):
            main.step_begin()
            k = 1 + i % 4
            (z,) = m.infer(xs_of(4, 3.0), k)
            assert z.values() == [k * v for v in want_x(4, 3.0)]
            y, want = handed[0]
            assert y.values() == want, i  # another tree's evictions: A's output is A's
        assert not dead.closed
        del handed[:], y
        gc.collect()
        main.step_begin()
        m.infer(xs_of(4, 3.0), 1)
    assert dead.closed
    assert dead.stats()["evictions"] == ev and dead.stats()["graphs"] == 0
    main.check()


# ------------------------------------------------------------------ 8. long runs stay flat; marks between forward and backward

@pytest.mark.parametrize("budget", [{"max_graphs": 1}, {"max_graphs": 3}, {"max_graph_bytes": 4096}],
                         ids=["1_graph", "3_graphs", "4096_bytes"])
@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "automatic"])
def test_two_threads_evicting_for_hundreds_of_steps_hold_a_flat_pool_node_count_and_graph_count(budget, explicit):
    """docs/long-programs.md: under a budget the pool reserve stays flat
    after the warm-up. Two threads, training pairs and an inference call
    on six shapes in a random order, thousands of evictions: each tree's
    pool_reserved_bytes, nodes and graphs at the end are no more than at step 150."""
    trees = PerThreadTrees(explicit=explicit, **budget)
    m = Model(trees)
    X.set_tree_getter(trees)
    snaps = {}

    def work(seed):
        def run():
            rng = random.Random(seed)
            tree = trees()
            for i in range(400):
                if explicit:
                    tree.step_begin()
                k = rng.choice(SHAPES_WIDE)
                out, saved = call(m.fw, xs_of(k), k)
                (g,) = m.bw(saved, FakeTensor(k).fill([1.0] * k), k)
                assert g.values() == [3 * k * v + k for v in want_x(k)], (seed, i, k)
                (y,) = m.infer(out, k)
                assert y.values() == [2 * k * k * v for v in want_x(k)], (seed, i, k)
                del out, saved, g, y
                if i in (150, 399):
                    st = tree.stats()
                    snaps.setdefault(seed, []).append((st["pool_reserved_bytes"], st["nodes"], st["graphs"]))
            tree.check()
        return run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        errors = run_threads(work(1), work(2))
    assert errors == [], errors[0]
    for seed, (mid, end) in snaps.items():
        assert all(e <= m for e, m in zip(end, mid)), (seed, mid, end)  # (pool reserved, nodes, graphs)
    assert all(t.stats()["evictions"] > 100 for t in trees.made)


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("budget", [0, 1, 2, 3])
def test_an_explicit_mark_between_two_forwards_and_their_backwards_under_a_budget_reads_right_or_raises(seed, budget):
    """Two forwards of random shapes, then (half the time) step_begin(),
    then both backwards: the first backward ends the step and its saved
    activation moves (it is its argument); the second's is then an output
    of a step before: StaleTensorError (docs/torch.md, the table of
    outputs), never another value."""
    tree = X.Tree(0, backend="sim", max_graphs=budget)
    tree.explicit_steps = True
    X.set_tree_getter(lambda device=0: tree)
    m = Model(PerThreadTreesOf(tree))
    rng = random.Random(seed)
    got = {"read": 0, "stale": 0}

    def backward(saved, k, base):
        try:
            (g,) = m.bw(saved, FakeTensor(k).fill([1.0] * k), k)
        except RuntimeError as e:
            assert "StaleTensorError" in str(e), e
            got["stale"] += 1
            return
        assert g.values() == [3 * k * v + k for v in want_x(k, base)]
        got["read"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(80):
            tree.step_begin()
            k, k2 = rng.choice([1, 2, 3]), rng.choice([1, 2, 3])
            out, saved = call(m.fw, xs_of(k), k)
            out2, saved2 = call(m.fw, xs_of(k2, 2.0), k2)
            marked = rng.random() < 0.5
            if marked:
                tree.step_begin()
            backward(saved, k, 1.0)
            reads(out, [2 * k * v for v in want_x(k)])
            backward(saved2, k2, 2.0)
            reads(out2, [2 * k2 * v for v in want_x(k2, 2.0)])
            tree.check()
    assert got["read"] >= 80 and got["stale"] > 0, got
