"""Threads that interleave inside one call (a helper's hunt), on the simulator.

A segment's launch function (the fake compiled graph) and a random
graph's prelaunch function are Python that the C hot path calls; Python
may switch threads inside them. What this file hunts:

- handshakes: thread A, in the middle of a launch (or a prelaunch, or its
  plain first call), hands control to a worker thread B and waits until B
  has run a random list of jobs: calls of other segments (and of A's own
  segment object) on B's tree, dropping A's outputs (del + gc.collect)
  of this step and of earlier ones, step_begin on B's tree, reads of kept
  outputs, stats()/nodes() of A's tree (a monitoring thread's
  cgtree.torch.stats()), a thread C that runs, hands an output back and
  exits (its tree orphaned, as cgtree.torch's per-thread dict does);
- a launch that raises after such a handshake (the graph goes plain);
- free-form: three threads and thread churn with sys.setswitchinterval
  tiny and time.sleep(0) inside every launch and prelaunch, random graphs
  beside plain ones; one thread's outputs read by another thread's graph
  while the first ends its steps (and the reader's launch raises once);
- a process-wide step mark (or step_begin on A's tree) made by B inside
  A's launch, between two graphs of one call;
- a random graph called inside a random graph's Python (a custom op's
  compiled call): the thread waited for itself on random_mu for good; it
  now raises CgtreeError (run in a process of its own, in case it hangs).

Every value is compared with eager arithmetic; a kept output reads its
own value or raises StaleTensorError, never another's; tree.check() after
each step; joins have timeouts (no hang)."""
import gc
import queue
import random
import sys
import threading
import time
import traceback
import warnings

import pytest

X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402
from test_torch_hunt_modes_sim import reads  # noqa: E402
from test_torch_hunt_threads_budget_sim import PerThreadTrees  # noqa: E402
from test_torch_ext_sim import (  # noqa: E402
    ARG_INT, ARG_TENSOR, FakeTensor, fake_move_out, k_add, k_affine)


@pytest.fixture(autouse=True)
def mover():
    X.set_output_mover(fake_move_out)
    yield
    X.set_tree_getter(None)


# ------------------------------------------------------------------ helpers

class Worker:
    """A thread that runs the jobs handed to it, one at a time; run(job) waits for it (with a timeout)."""

    def __init__(self, name="B"):
        self.q, self.errors = queue.Queue(), []
        self.th = threading.Thread(target=self._loop, name=name, daemon=True)
        self.th.start()

    def _loop(self):
        while True:
            job, done = self.q.get()
            try:
                if job is None:
                    return
                job()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                self.errors.append("".join(traceback.format_exception(e))[-3000:])
            finally:
                done.set()

    def run(self, job):
        done = threading.Event()
        self.q.put((job, done))
        assert done.wait(30), "the worker hangs"

    def stop(self):
        self.run(None)
        self.th.join(30)
        assert not self.th.is_alive()


class Hooked:
    """y = a x + b through a temporary, keyed by n (a SymInt); hook() runs
    between the two kernels: in the middle of the launch (or plain call)."""

    def __init__(self, stream, a, b, hook=lambda: None):
        self.stream, self.a, self.b, self.hook = stream, a, b, hook

    def __call__(self, x, n):
        tmp = FakeTensor(x.n)
        # x's pointer through data_ptr(), which raises on a marked (stale) output as a real tensor access
        # does: read as x.ptr, past the mark, a plain call read the owner's next output by address (a harness
        # artifact that looked like a late read of the runtime)
        X.sim_launch(self.stream(), k_affine, tmp.ptr, x.data_ptr(), x.n, self.a, 0.0)
        self.hook()
        out = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, out.ptr, tmp.ptr, x.n, 1.0, self.b)
        del tmp
        return (out,)


def hseg(base, graph, name, **kw):
    def launch(inputs):
        return graph(*inputs)

    return X.Segment(base, name, graph, launch, S.alias, S.describe, S.span, bytes((ARG_TENSOR, ARG_INT)), (0, 0), 0,
                     True, **kw)


def run(seg, x):
    S.Generation.generation += 1
    return seg(x, x.n)


def xs(n, base):
    return FakeTensor(n).fill([base + i for i in range(n)])


def want(n, base, a, b):
    return [a * (base + i) + b for i in range(n)]


# ------------------------------------------------------------------ 1. handshakes inside A's launch

JOBS = ["drop", "drop", "call", "call_shared", "step", "read", "stats", "exit", "call_on_a", "empty_cache"]


class Scene:
    """Thread A (the test's thread) and worker B, each on trees of its own
    (explicit steps, a budget of 1 graph so recordings, and so launches,
    recur); A's segment hands off to B in the middle of its launch."""

    def __init__(self, seed, budget=1):
        self.rng = random.Random(seed)
        self.trees = PerThreadTrees(explicit=True, max_graphs=budget)
        X.set_tree_getter(self.trees)
        self.base = X.Tree(0, backend="sim")
        self.a_thread = threading.current_thread()
        self.armed = False
        self.handoffs = 0
        self.given = []  # (output of A's, its value): B drops them
        self.b_kept = []
        self.exited = []  # (output an exited thread handed back, its value, its tree)
        self.worker = Worker()
        self.ga = Hooked(self.trees.stream, 2.0, 1.0, self.hook)
        self.sa = hseg(self.base, self.ga, "a")
        self.sb = hseg(self.base, Hooked(self.trees.stream, 3.0, -1.0), "b")
        self.sc = hseg(self.base, Hooked(self.trees.stream, 0.5, 4.0), "c")
        self.jobs_done = {j: 0 for j in JOBS}

    def hook(self):
        if self.armed and threading.current_thread() is self.a_thread:
            self.armed = False
            self.handoffs += 1
            jobs = [self.rng.choice(JOBS) for _ in range(self.rng.randint(1, 4))]
            self.worker.run(lambda: self.b_jobs(jobs))

    # B's side ---------------------------------------------------------
    def b_jobs(self, jobs):
        tree = self.trees()
        for j in jobs:
            self.jobs_done[j] += 1
            if j == "drop" and self.given:
                self.given.pop(self.rng.randrange(len(self.given)))
                gc.collect()
            elif j == "call":
                n = self.rng.randint(1, 4)
                (y,) = run(self.sb, xs(n, 5.0))
                assert y.values() == want(n, 5.0, 3.0, -1.0)
                self.b_kept.append((y, want(n, 5.0, 3.0, -1.0)))
                del self.b_kept[:-4]
            elif j == "call_shared":  # A's own segment object, on B's tree, another variant or the same
                n = self.rng.randint(1, 4)
                (y,) = run(self.sa, xs(n, 7.0))
                assert y.values() == want(n, 7.0, 2.0, 1.0)
                self.b_kept.append((y, want(n, 7.0, 2.0, 1.0)))
            elif j == "step":
                tree.step_begin()
            elif j == "read":
                for o, w in self.b_kept + self.given:
                    reads(o, w)
            elif j == "stats":  # a monitoring thread's cgtree.torch.stats(): every live tree's stats
                for t in list(self.trees.made):
                    if not t.closed:
                        t.stats()
                        t.nodes()
                tree.check()
            elif j == "exit":
                self.exit_thread()
            elif j == "call_on_a":  # B's graph reads A's output (of A's step under way, or stale)
                for o, w in list(self.given)[-2:]:
                    try:
                        S.Generation.generation += 1
                        (z,) = self.sb(o, o.n)
                    except RuntimeError as e:
                        assert "StaleTensorError" in str(e), e
                        continue
                    assert z.values() == [3.0 * v - 1.0 for v in w]
                    self.b_kept.append((z, [3.0 * v - 1.0 for v in w]))
            elif j == "empty_cache":  # cgtree.torch.empty_cache() on another thread
                X.empty_cache(0)
        tree.check()

    def exit_thread(self):
        """A thread C that runs a few calls, hands an output back and exits; its tree is orphaned."""
        box = {}

        def c():
            t = self.trees()
            own = hseg(self.base, Hooked(self.trees.stream, 0.5, 4.0), "c_own")  # dies with C's tree
            for i in range(3):
                t.step_begin()
                n = 1 + i
                (y,) = run(self.sc if i % 2 else own, xs(n, 9.0))
                assert y.values() == want(n, 9.0, 0.5, 4.0)
            box["out"] = (y, want(n, 9.0, 0.5, 4.0), t)
            t.orphan()  # what cgtree.torch's per-thread dict does at the thread's exit

        th = threading.Thread(target=c, name="C")
        th.start()
        th.join(30)
        assert not th.is_alive(), "thread C hangs"
        assert "out" in box, "thread C failed"
        self.exited.append(box["out"])
        if len(self.exited) > 2:
            del self.exited[0]
            gc.collect()

    # A's side ---------------------------------------------------------
    def a_steps(self, steps):
        tree = self.trees()
        kept = []
        for i in range(steps):
            tree.step_begin()
            n = self.rng.randint(1, 4)
            base = float(i % 7)
            self.armed = self.rng.random() < 0.7
            (y,) = run(self.sa, xs(n, base))
            w = want(n, base, 2.0, 1.0)
            assert y.values() == w, (i, n)
            if self.rng.random() < 0.5:  # a second call in the step: its launch may see y die on B
                self.given.append((y, w))
                del y
                self.armed = self.rng.random() < 0.7
                (y,) = run(self.sa, xs(n, base + 1))
                w = want(n, base + 1, 2.0, 1.0)
                assert y.values() == w, (i, n)
            self.armed = False
            r = self.rng.random()
            if r < 0.4:
                self.given.append((y, w))
            elif r < 0.7:
                kept.append((y, w))
                del kept[:-4]
            del y
            for o, ww in kept + self.given:
                reads(o, ww)
            for o, ww, _t in self.exited:
                assert o.values() == ww  # a handed-back output reads right while it lives
            tree.check()
            assert self.worker.errors == [], self.worker.errors[0]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget", [0, 1, "plain"])
def test_another_threads_work_inside_a_launch_leaves_every_value_as_eager_computes_it(seed, budget):
    """budget "plain": A's graph raised at its warmup and runs as the plain
    graph from then on: B's work (thread C's exit and its tree's close
    among it) comes inside plain calls, where no run is under way."""
    sc = Scene(seed, 0 if budget == "plain" else budget)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if budget == "plain":
                hook, state = sc.ga.hook, {"n": 0}

                def raising_once():
                    state["n"] += 1
                    if state["n"] == 2:
                        raise RuntimeError("goes plain")
                    hook()
                sc.ga.hook = raising_once
                sc.trees().step_begin()
                for _ in range(2):
                    run(sc.sa, xs(1, 0.0))
                assert sc.sa.info.get("plain_reason"), sc.sa.info
            sc.a_steps(40)
        finally:
            sc.worker.stop()
    assert sc.worker.errors == [], sc.worker.errors[0]
    assert sc.handoffs > 5, sc.handoffs
    del sc.given[:], sc.b_kept[:], sc.exited[:]
    gc.collect()
    (y,) = run(sc.sa, xs(2, 0.0))  # the next call frees the exited threads' trees
    orphans = [t for t in sc.trees.made if t.owner_thread not in (threading.get_ident(), sc.worker.th.ident)]
    assert all(t.closed for t in orphans if t.stats()["outputs_alive"] == 0), [t.closed for t in orphans]
    for t in sc.trees.made:
        if not t.closed:
            t.check()


def test_outputs_another_thread_drops_during_a_launch_go_back_to_the_pool_after_that_run():
    """A's outputs of this step, dropped on B while A is inside its second
    call's launch: queued, then released; the pool's bytes in use come back
    to what the live outputs hold."""
    sc = Scene(1, budget=0)
    tree = sc.trees()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for i in range(6):
                tree.step_begin()
                (y0,) = run(sc.sa, xs(4, 1.0))
                sc.given.append((y0, want(4, 1.0, 2.0, 1.0)))
                del y0
                n = 1 + i % 4  # new variants at first: launches

                def drop_all():
                    del sc.given[:]
                    gc.collect()
                    run(sc.sb, xs(2, 0.0))  # B's call drains while A's tree is in its run

                sc.ga.hook = lambda: threading.current_thread() is sc.a_thread and sc.armed and (
                    setattr(sc, "armed", False) or sc.worker.run(drop_all))
                sc.armed = True
                (y,) = run(sc.sa, xs(n, 2.0))
                assert y.values() == want(n, 2.0, 2.0, 1.0)
                del y
                gc.collect()
                st = tree.stats()
                assert st["outputs_alive"] == 0, (i, st["outputs_alive"])
                tree.check()
        finally:
            sc.worker.stop()
    assert sc.worker.errors == [], sc.worker.errors[0]


# ------------------------------------------------------------------ 2. a launch that raises after a handshake

@pytest.mark.parametrize("raise_at", [1, 2, 3, 5])
def test_a_launch_that_raises_after_another_thread_ran_inside_it_goes_plain_and_computes(raise_at):
    """The raise_at-th call of A's graph (1: the plain first call, 2: the
    warmup, 3: the recording, 5: a new variant's warmup) lets B run (its
    calls of the same segment object and of others, drops of A's outputs,
    a step on its tree), then raises once. The graph goes plain, or the
    first call raises; every later call computes as eager, on both threads."""
    sc = Scene(raise_at, budget=0)
    tree = sc.trees()
    calls = {"n": 0}

    def hook():
        if threading.current_thread() is not sc.a_thread:
            return
        calls["n"] += 1
        if calls["n"] == raise_at:
            sc.worker.run(lambda: sc.b_jobs(["call_shared", "drop", "call", "step", "call_shared", "read"]))
            raise RuntimeError("the graph raised midway")

    sc.ga.hook = hook
    raised = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for i in range(10):
                tree.step_begin()
                n = 2 if i < 4 else 3
                try:
                    (y,) = run(sc.sa, xs(n, float(i)))
                except RuntimeError as e:
                    assert "midway" in str(e)
                    raised += 1
                    continue
                assert y.values() == want(n, float(i), 2.0, 1.0), i
                sc.given.append((y, want(n, float(i), 2.0, 1.0)))
                del y
                for o, w in sc.given:
                    reads(o, w)
                tree.check()
                sc.worker.run(lambda: sc.b_jobs(["call_shared", "read"]))
        finally:
            sc.worker.stop()
    assert sc.worker.errors == [], sc.worker.errors[0]
    assert raised <= 1
    assert calls["n"] >= raise_at


# ------------------------------------------------------------------ 3. the first call of a graph on two threads

def test_two_threads_first_calls_of_one_graph_interleaved_inside_the_plain_call_compute_and_replay():
    """A's first call of the graph (plain) lets B make its own first call of
    the same segment object (same variant, then another) before A's
    returns; both trees then warm up, record and replay it, values right."""
    sc = Scene(3, budget=0)
    tree = sc.trees()
    first = {"done": False}

    def hook():
        if threading.current_thread() is sc.a_thread and not first["done"]:
            first["done"] = True
            sc.worker.run(lambda: sc.b_jobs(["call_shared", "call_shared", "call_shared"]))

    sc.ga.hook = hook
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for i in range(8):
                tree.step_begin()
                for n in (2, 3):
                    (y,) = run(sc.sa, xs(n, float(i)))
                    assert y.values() == want(n, float(i), 2.0, 1.0), (i, n)
                tree.check()

                def b():
                    t = sc.trees()
                    t.step_begin()
                    for n in (2, 3):
                        (z,) = run(sc.sa, xs(n, 7.0 + i))
                        assert z.values() == want(n, 7.0 + i, 2.0, 1.0)
                    t.check()
                sc.worker.run(b)
        finally:
            sc.worker.stop()
    assert sc.worker.errors == [], sc.worker.errors[0]
    assert tree.stats()["replays"] > 0
    assert sc.sa.info["plain_reason"] is None, sc.sa.info


# ------------------------------------------------------------------ 4. inside a random graph's prelaunch

class RandomGraph:
    """x + state, where the prelaunch writes the generator's offset into
    state (one for every thread, as the device's generator is); the
    prelaunch notes on its thread what it wrote, so the call can check it
    read just that; hook() runs inside the prelaunch."""

    def __init__(self, trees, hook=lambda: None):
        self.trees, self.hook = trees, hook
        self.state = FakeTensor(4).fill([0.0] * 4)
        self.offset = 0.0
        self.local = threading.local()

    def prelaunch(self, variant, on_current):
        self.offset += 1
        off = self.offset
        self.hook()
        X.sim_launch(self.trees.stream(), S.k_fill, self.state.ptr, 4, off)
        self.hook()
        self.local.wrote = off

    def __call__(self, x, n):
        out = FakeTensor(x.n)
        X.sim_launch(self.trees.stream(), k_add, out.ptr, x.ptr, self.state.ptr, x.n)
        return (out,)


def rseg(base, g, name="rnd"):
    return X.Segment(base, name, g, lambda inputs: g(*inputs), S.alias, S.describe, S.span,
                     bytes((ARG_TENSOR, ARG_INT)), (0, 0), 0, True, prelaunch=g.prelaunch)


def rcall(seg, g, x):
    """A random call: its value is x + the offset its own prelaunch wrote (where one ran), else x plus some
    offset written before; (output, value or None)."""
    g.local.wrote = None
    (y,) = run(seg, x)
    got = y.values()
    d = [a - b for a, b in zip(got, x.values())]
    assert len(set(d)) == 1, ("torn state", got)
    if g.local.wrote is not None:
        assert d[0] == g.local.wrote, ("read another launch's draw", d[0], g.local.wrote)
        return y, got
    return y, None


@pytest.mark.parametrize("seed", range(4))
def test_another_threads_work_inside_a_prelaunch_keeps_each_launch_reading_its_own_draw(seed):
    """A's prelaunch hands off to B (between advancing the offset and
    writing it, and between writing and the launch): B calls plain
    segments, drops A's outputs, steps, exits a thread C. B makes no random
    call (it would wait for the lock A holds, while A waits for B: a
    deadlock of the test's making)."""
    sc = Scene(seed, budget=1)
    tree = sc.trees()
    g = RandomGraph(sc.trees)
    armed = {"on": False}

    def hook():
        if armed["on"] and threading.current_thread() is sc.a_thread:
            armed["on"] = sc.rng.random() < 0.5
            jobs = [sc.rng.choice(["drop", "call", "call_shared", "step", "read", "stats", "exit"])
                    for _ in range(sc.rng.randint(1, 3))]
            sc.worker.run(lambda: sc.b_jobs(jobs))

    g.hook = hook
    seg = rseg(sc.base, g)
    checked = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for i in range(30):
                tree.step_begin()
                n = sc.rng.randint(1, 3)
                armed["on"] = True
                y, w = rcall(seg, g, xs(n, float(i)))
                checked += w is not None
                armed["on"] = False
                if w is not None:
                    sc.given.append((y, w))
                del y
                for o, ww in sc.given:
                    reads(o, ww)
                tree.check()
        finally:
            sc.worker.stop()
    assert sc.worker.errors == [], sc.worker.errors[0]
    assert checked > 10, checked


# ------------------------------------------------------------------ 5. free-form: switches anywhere

@pytest.mark.parametrize("seed", range(3))
def test_threads_switching_inside_every_launch_and_prelaunch_with_churn_compute_as_eager(seed):
    """Three lanes, each a run of threads one after another (a thread does
    a few steps, hands nothing back, and exits: its tree orphaned); a tiny
    switch interval and time.sleep(0) inside every launch and prelaunch;
    plain and random graphs shared by all; outputs kept across steps read
    their values or raise; check() after each step."""
    trees = PerThreadTrees(explicit=True, max_graphs=2)
    X.set_tree_getter(trees)
    base = X.Tree(0, backend="sim")
    sleepy = lambda: time.sleep(0)  # noqa: E731
    sa = hseg(base, Hooked(trees.stream, 2.0, 1.0, sleepy), "a")
    sb = hseg(base, Hooked(trees.stream, -1.0, 3.0, sleepy), "b")
    g = RandomGraph(trees, sleepy)
    sr = rseg(base, g)
    errors = []
    counts = {"steps": 0, "random_checked": 0}

    def thread_body(tseed, steps):
        rng = random.Random(tseed)
        tree = trees()
        kept = []
        for i in range(steps):
            tree.step_begin()
            n = rng.randint(1, 4)
            b = float(tseed % 11 + i)
            op = rng.choice(["a", "b", "chain", "rnd"])
            if op == "a":
                (y,) = run(sa, xs(n, b))
                w = want(n, b, 2.0, 1.0)
            elif op == "b":
                (y,) = run(sb, xs(n, b))
                w = want(n, b, -1.0, 3.0)
            elif op == "chain":
                (y,) = run(sa, xs(n, b))
                (y,) = run(sb, y)
                w = [-v + 3.0 for v in want(n, b, 2.0, 1.0)]
            else:
                y, w = rcall(sr, g, xs(n, b))
                counts["random_checked"] += w is not None
            if w is not None:
                assert y.values() == w, (tseed, i, op)
                if rng.random() < 0.5:
                    kept.append((y, w))
                    del kept[:-3]
            del y
            if rng.random() < 0.2:
                gc.collect()
            for o, ww in kept:
                reads(o, ww)
            tree.check()
            counts["steps"] += 1
        tree.orphan()

    def lane(lseed):
        def run_lane():
            try:
                for k in range(4):
                    th = threading.Thread(target=guarded(lambda: thread_body(lseed * 100 + k, 8)))
                    th.start()
                    th.join(60)
                    assert not th.is_alive(), "a thread hangs"
            except BaseException as e:  # noqa: BLE001
                errors.append("".join(traceback.format_exception(e))[-3000:])
        return run_lane

    def guarded(fn):
        def r():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001
                errors.append("".join(traceback.format_exception(e))[-3000:])
        return r

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lanes = [threading.Thread(target=lane(seed * 10 + j)) for j in range(3)]
            for t in lanes:
                t.start()
            for t in lanes:
                t.join(120)
                assert not t.is_alive(), "a lane hangs"
    finally:
        sys.setswitchinterval(old)
    assert errors == [], errors[0]
    assert counts["steps"] == 3 * 4 * 8
    gc.collect()
    run(sa, xs(2, 0.0))  # frees the exited threads' trees
    assert sum(t.closed for t in trees.made) >= 10, [t.closed for t in trees.made]


# ------------------------------------------------------------------ 6. a process-wide mark inside a launch

@pytest.mark.parametrize("how", ["mark", "tree_step_begin"])
@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "automatic"])
def test_a_step_mark_made_on_another_thread_inside_a_launch_between_two_graphs_of_one_call(how, explicit):
    """One compiled call of A = two graphs (a graph break: one Dynamo
    generation), y1 = a(x), y2 = b(y1). Inside a's launch B makes
    torch.compiler.cudagraph_mark_step_begin() (process-wide), or calls
    step_begin() on A's tree, and runs its own graph. b then reads y1: its
    value or StaleTensorError (docs: an output read only by a later graph
    of the call), never another; y1 itself reads right or raises."""

    class Box:
        mark_step_counter = 0

    S.init_hot_path(mark_step_cls=Box)
    sc = Scene(5, budget=0)
    tree = sc.trees()
    tree.explicit_steps = explicit
    got = {"right": 0, "stale": 0}

    def job():
        if how == "mark":
            Box.mark_step_counter -= 1
        else:
            tree.step_begin()
        sc.b_jobs(["call", "read"])

    sc.ga.hook = lambda: threading.current_thread() is sc.a_thread and sc.armed and (
        setattr(sc, "armed", False) or sc.worker.run(job))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(24):
                if explicit:
                    tree.step_begin()
                n = 1 + i % 4 if i < 12 else 2 + i % 2
                sc.armed = i % 3 != 2
                S.Generation.generation += 1
                x = xs(n, float(i))
                (y1,) = sc.sa(x, n)
                w1 = want(n, float(i), 2.0, 1.0)
                try:
                    (y2,) = sc.sb(y1, n)  # the same generation: one call
                except RuntimeError as e:
                    assert "StaleTensorError" in str(e), e
                    got["stale"] += 1
                else:
                    assert y2.values() == [3.0 * v - 1.0 for v in w1], i
                    got["right"] += 1
                    del y2
                reads(y1, w1)
                del y1
                tree.check()
    finally:
        sc.worker.stop()
        S.init_hot_path()
    assert sc.worker.errors == [], sc.worker.errors[0]
    assert got["right"] > 0, got


# ------------------------------------------------------------------ 7. one thread's outputs read by another's graphs

@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("b_raises", [False, True], ids=["", "b_raises_once"])
def test_a_graph_on_one_thread_reading_another_threads_outputs_while_both_switch_inside_launches(seed, b_raises):
    """y = a(x) on A (explicit steps, a step per call), handed to B, which
    runs b(y) on its tree; both threads' launches sleep(0) midway and the
    switch interval is tiny, so A's step ends fall inside B's reads. B
    reads 3y - 1 of the y it was handed, or StaleTensorError. b_raises:
    b's third launch raises after its sleep (b goes plain and reruns on y)."""
    trees = PerThreadTrees(explicit=True, max_graphs=2)
    X.set_tree_getter(trees)
    base = X.Tree(0, backend="sim")
    sleepy = lambda: time.sleep(0)  # noqa: E731
    b_calls = {"n": 0}

    def b_hook():
        time.sleep(0)
        b_calls["n"] += 1
        if b_raises and b_calls["n"] == 3:
            for _ in range(20):
                time.sleep(0)
            raise RuntimeError("b raised midway")

    sa = hseg(base, Hooked(trees.stream, 2.0, 1.0, sleepy), "a")
    sb = hseg(base, Hooked(trees.stream, 3.0, -1.0, b_hook), "b")
    slot, errors, stop = {}, [], threading.Event()
    got = {"right": 0, "stale": 0}

    def producer():
        try:
            rng = random.Random(seed)
            tree = trees()
            for i in range(150):
                tree.step_begin()
                n = rng.randint(1, 4)
                (y,) = run(sa, xs(n, float(i)))
                w = want(n, float(i), 2.0, 1.0)
                assert y.values() == w
                taken = threading.Event()
                slot["y"] = (y, w, taken)
                del y
                assert taken.wait(30), "the consumer hangs"  # B's call has begun or is about to: race it
                if rng.random() < 0.5:
                    time.sleep(0)
                tree.check()
        except BaseException as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-3000:])
        finally:
            stop.set()

    def consumer():
        try:
            tree = trees()
            while not stop.is_set():
                item = slot.pop("y", None)
                if item is None:
                    time.sleep(0)
                    continue
                y, w, taken = item
                del item
                taken.set()
                tree.step_begin()
                try:
                    S.Generation.generation += 1
                    (z,) = sb(y, y.n)
                except RuntimeError as e:
                    assert "StaleTensorError" in str(e), e
                    got["stale"] += 1
                    continue
                assert z.values() == [3.0 * v - 1.0 for v in w], (z.values(), w)
                got["right"] += 1
                del y, z
                tree.check()
        except BaseException as e:  # noqa: BLE001
            errors.append("".join(traceback.format_exception(e))[-3000:])

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ths = [threading.Thread(target=producer, name="A"), threading.Thread(target=consumer, name="B")]
            for t in ths:
                t.start()
            for t in ths:
                t.join(120)
                assert not t.is_alive(), "a thread hangs"
    finally:
        sys.setswitchinterval(old)
    assert errors == [], errors[0]
    assert got["right"] > 10 and got["right"] + got["stale"] == 150, got


# ------------------------------------------------------------------ 8. a random graph called inside a random graph

NESTED = r'''
import sys, threading, warnings
sys.path.insert(0, %(here)r)
import test_torch_hunt_interleave_sim as H
S, X = H.S, H.X
X.set_output_mover(H.fake_move_out)
trees = H.PerThreadTrees(explicit=True)
X.set_tree_getter(trees)
base = X.Tree(0, backend="sim")
gi, go = H.RandomGraph(trees), H.RandomGraph(trees)
inner = H.rseg(base, gi, "inner")
other = H.rseg(base, H.RandomGraph(trees), "other")

def outer_graph(x, n):
    (z,) = inner(x, n)  # a compiled call inside the graph's Python (a custom op's), drawing random numbers too
    return go(z, n)

outer = X.Segment(base, "outer", outer_graph, lambda inputs: outer_graph(*inputs), S.alias, S.describe, S.span,
                  bytes((H.ARG_TENSOR, H.ARG_INT)), (0, 0), 0, True, prelaunch=go.prelaunch)
res = {}

def a():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(4):
            trees().step_begin()
            try:
                (y,) = H.run(outer, H.xs(2, 1.0))
                res.setdefault("a", []).append(y.values())
            except Exception as e:
                res.setdefault("a", []).append(repr(e)[:120])

def b():  # another thread's own random graph, on its own tree
    trees().step_begin()
    (y,) = H.run(other, H.xs(2, 5.0))
    res["b"] = y.values()

ta = threading.Thread(target=a, daemon=True)
ta.start()
ta.join(3)
tb = threading.Thread(target=b, daemon=True)
tb.start()
tb.join(3)
print("A", "hangs" if ta.is_alive() else "returned", "B", "hangs" if tb.is_alive() else "returned", res)
sys.stdout.flush()
'''


def test_a_random_graph_called_inside_a_random_graphs_python_raises_and_other_threads_random_graphs_run():
    """A random graph whose Python calls another compiled random graph (a
    custom op's compiled call). The outer's plain first call holds
    random_mu (seg_plain.c, call_plain) while it runs the graph, and the
    inner call's took random_mu again on the same thread: a non-recursive
    mutex, so the thread waited for itself for good, and every other
    thread's random graph behind it (a helper's hunt). Now the inner call
    raises CgtreeError, saying such nesting is not supported, at every call,
    and another thread's random graph runs. In a process of its own: a hang
    would hold random_mu for the rest of the process."""
    import os
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", NESTED % {"here": here}], capture_output=True, text=True, timeout=60,
                       env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("A ")]
    assert line, (p.stdout[-2000:], p.stderr[-3000:])
    assert line[0].startswith("A returned B returned"), line[0]
    assert line[0].count("called inside another") == 4 and "'b': [5.0, 6.0]" in line[0], line[0]
