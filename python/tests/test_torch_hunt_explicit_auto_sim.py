"""A tree made in one step mode and used from the other (a helper's hunt), on the simulator: stream order and staleness.

cgtree.torch makes a thread's tree in the thread's mode of the moment
(_install.tree_for): in explicit mode on a non-blocking stream, which events
order with every caller's stream, the legacy default stream included; in
automatic mode on a blocking stream, which CUDA orders with the legacy
stream by itself. The thread may switch modes afterwards
(set_step_mode), so a non-blocking tree serves automatic calls from the
legacy stream and a blocking tree serves explicit steps. Everything of
stream order is the tree's (TreeObject.blocking, tx_caller_needs_events),
never the thread's mode: this file checks that it stays so across switches.

What the simulator can and cannot tell. It runs every kernel and copy at
once on one stream per tree and knows no races; a simulator tree makes no
events (module.c: ev_in and ev_out only off the simulator), so the two
events per call are not seen. What it counts is the tree's waits for the
streams its callers left (pool_readers.c; memory_stats()'s
pool_reader_waits): the waits that keep a launch from overwriting an output
a copy queued on another stream still reads. So each call here is checked
three ways:

- values: every result equals eager arithmetic, every kept output reads its
  value or raises StaleTensorError (the fake graphs read their inputs through
  data_ptr(), which honours the mark as a real tensor access does);
- the count: the waits a call made equal what docs/torch.md, "Streams" says
  (a stream a call left is noted with the step of its last call there,
  unless CUDA orders it with the tree's stream: the tree's own, or the legacy
  one with a blocking tree; each launch waits for every note but the
  caller's, and drops those of an earlier step);
- the hazard: a model of the reads the program queued (a copy of an output
  on the stream it was handed out on, a plain call's read on its caller's
  stream) says which streams hold a read of the tree's memory not yet
  ordered before the tree's stream; each launch must wait for all of them
  but its caller's (ordered by its own event): the set the count's model
  waits for must hold them.

Covered: the legacy stream a caller left, on a tree made in either mode and
used in both; a copy queued on the legacy stream before a switch; training
(forward in an explicit step, backward after a switch to automatic) with the
loss copied on the forward's stream; a random walk (mode switches, step_begin,
process-wide marks, caller streams legacy/s1/s2/the tree's own, calls,
copies, drops, reads, forwards and backwards; 12 seeds a tree kind, 300 more
ran clean in the hunt); another thread's tree, of either mode, reading an
output plainly or in a launch. Each case fails with one of these changes to
the C code: events by the thread's mode (tx_caller_needs_events), a
non-blocking tree taken for a blocking one, the legacy stream never noted,
notes retired within their step, a note's step one too low, other trees'
reads never noted. No fault found. Seen on the way: a plain first call
that reads another tree's output notes its own tree's stream as a reader
too (segment.c's argument loop, before the call turns out plain), so the
owner's next step waits for a stream that read nothing: a wait too many,
never one too few.
"""
import gc
import os
import random
import threading

import pytest

X = pytest.importorskip("cgtree._torch_ext")

import test_torch_ext_sim as S  # noqa: E402
from test_torch_ext_sim import ARG_TENSOR, FakeTensor, caller_stream, fake_move_out, init_hot_path, k_add, k_affine  # noqa: E402,E501
from test_torch_hunt_modes_sim import reads  # noqa: E402

SEEDS = int(os.environ.get("CGTREE_HUNT_SEEDS", "12"))
LEGACY, S1, S2 = 0, 0x7e10, 0x7e20


@pytest.fixture(autouse=True)
def box():
    """PyTorch's MarkStepBox stand-in (a process-wide mark), and the mover."""
    class MarkStepBox:
        mark_step_counter = 0

    X.set_output_mover(fake_move_out)
    init_hot_path(mark_step_cls=MarkStepBox)
    yield MarkStepBox
    init_hot_path()
    X.set_tree_getter(None)


def made_in(mode):
    """A tree as tree_for makes it for a thread in `mode`."""
    t = X.Tree(0, backend="sim", nonblocking=mode == "explicit")
    t.explicit_steps = mode == "explicit"
    return t


def waits():
    return X.alloc_figures()["pool_reader_waits"]


def aff(v, a, b):
    return [a * e + b for e in v]


class Aff:
    """out = a x + b through a temporary, on the running tree's stream; x read through data_ptr()."""

    def __init__(self, stream, a, b):
        self.stream, self.a, self.b = stream, a, b

    def __call__(self, x):
        tmp = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, tmp.ptr, x.data_ptr(), x.n, self.a, 0.0)
        out = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, out.ptr, tmp.ptr, x.n, 1.0, self.b)
        del tmp
        return (out,)


class Add:
    def __init__(self, stream):
        self.stream = stream

    def __call__(self, x, y):
        out = FakeTensor(x.n)
        X.sim_launch(self.stream(), k_add, out.ptr, x.data_ptr(), y.data_ptr(), x.n)
        return (out,)


class Fw:
    """A training forward: out = 2x, saved = 3x."""

    def __init__(self, stream):
        self.stream = stream

    def __call__(self, x):
        out, saved = FakeTensor(x.n), FakeTensor(x.n)
        X.sim_launch(self.stream(), k_affine, out.ptr, x.data_ptr(), x.n, 2.0, 0.0)
        X.sim_launch(self.stream(), k_affine, saved.ptr, x.data_ptr(), x.n, 3.0, 0.0)
        return (out, saved)


def seg(tree, graph, name, n_args=1, **kw):
    return S.segment(tree, graph, kinds=(ARG_TENSOR,) * n_args, spans=(16,) * n_args, name=name, **kw)


class Model:
    """The tree's notes of the streams its callers left, as docs/torch.md
    ("Streams") states them, and the reads of its memory the program has
    queued on streams not yet ordered before the tree's stream."""

    def __init__(self, tree, blocking):
        self.tree, self.blocking = tree, blocking
        self.notes = {}  # stream -> the step of its last call before the tree's calls left it
        self.last, self.last_step, self.called = None, 0, False
        self.dirty = {}  # stream -> what read the tree's memory there since the tree last waited for it
        self.seen = set()  # segments called once on the tree: their first call is plain

    def ordered(self, s):
        """CUDA orders s with the tree's stream by itself."""
        return s == self.tree.stream or (s == LEGACY and self.blocking)

    def queued_read(self, s, what):
        if not self.ordered(s):
            self.dirty.setdefault(s, []).append(what)

    def call(self, sg, c, launched):
        """A call of sg from stream c that got past its step's sync; launched: it reached cgt_run.
        Returns the waits the docs say it makes, and asserts they cover every unordered read."""
        step = self.tree.step
        if self.called and c != self.last and not self.ordered(self.last):
            self.notes[self.last] = max(self.notes.get(self.last, 0), self.last_step)
        self.last, self.last_step, self.called = c, step, True
        if not launched:
            return 0
        waited = set()
        for s, st in list(self.notes.items()):
            if s != c:
                waited.add(s)
            if st < step:
                del self.notes[s]
        missed = {s: w for s, w in self.dirty.items() if s != c and s not in waited}
        assert not missed, "a launch from %r in step %d overwrites what these streams may still read: %r" % (
            c, step, missed)
        self.dirty = {}  # the caller's stream by its event, the others by the waits
        return len(waited)


def checked_call(model, sg, c, args, log):
    """sg(*args) from stream c (a new compiled call); checks the waits it made against the model."""
    launched = sg in model.seen
    before = waits()
    S.Generation.generation += 1
    with caller_stream(c):
        try:
            res = sg(*args)
        except X.StaleTensorError:
            launched = False
            res = None
    if res is not None:  # a first call refused (a stale argument) leaves the graph unknown: the next is plain
        model.seen.add(sg)
    want = model.call(sg, c, launched)
    got = waits() - before
    assert got == want, ("waits", got, "docs say", want, log[-14:])
    if res is not None and not launched:  # a plain call read its tensor arguments on c
        for a in args:
            if getattr(a, "_pool", False) and a.ptr == a._pool:
                model.queued_read(c, "plain read")
    return res, launched


# ------------------------------------------------------------------ 1. the legacy stream across the switch

@pytest.mark.parametrize("made", ["explicit", "automatic"])
def test_the_legacy_stream_a_caller_left_is_waited_for_by_a_non_blocking_tree_in_either_mode(made):
    """A tree made in `made` mode serves the other mode too. Calls from the
    legacy stream, then from s1: the non-blocking tree (made explicit)
    waits for the legacy stream it left, in automatic mode as in explicit
    mode; the blocking one (made automatic) never does, in either mode
    (CUDA orders the two). Then back and forth between the modes."""
    tree = made_in(made)
    a = seg(tree, Aff(lambda: tree.stream, 2.0, 1.0), "a")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    per_switch = 1 if made == "explicit" else 0
    for explicit in (made == "explicit", made != "explicit", made == "explicit"):
        tree.explicit_steps = explicit
        for _ in range(4):  # plain first call, warmup, recording, replay
            if explicit:
                tree.step_begin()
            S.Generation.generation += 1
            (y,) = a(x)
        assert y.values() == [3, 5, 7, 9]
        del y
        w0 = waits()
        if explicit:
            tree.step_begin()
        S.Generation.generation += 1
        with caller_stream(S1):
            (y1,) = a(x)  # left the legacy stream
        assert waits() - w0 == per_switch, (explicit, waits() - w0)
        w1 = waits()
        if explicit:
            tree.step_begin()
        S.Generation.generation += 1
        (y2,) = a(x)  # back to the legacy stream: s1 noted and waited for, whatever the tree
        assert waits() - w1 == 1
        assert y2.values() == [3, 5, 7, 9]
        assert reads(y1, [3, 5, 7, 9]) is False  # its step ended: stale, never y2's
        del y1, y2
    tree.check()


@pytest.mark.parametrize("made", ["explicit", "automatic"])
@pytest.mark.parametrize("switch", ["to_explicit", "to_automatic"])
def test_a_copy_queued_on_the_legacy_stream_before_the_switch_is_waited_for_by_the_next_steps_launch(made, switch):
    """y = a(x) from the legacy stream, the program queues y's copy there,
    the thread switches modes, and the next step's first launch, from s1,
    replays into y's memory. A non-blocking tree must wait for the legacy
    stream (nothing else orders them); a blocking tree need not. y itself
    is stale, never the new output."""
    tree = made_in(made)
    tree.explicit_steps = switch == "to_automatic"
    a = seg(tree, Aff(lambda: tree.stream, 2.0, 1.0), "a")
    x = FakeTensor(4).fill([1, 2, 3, 4])

    def step(explicit, stream):
        if explicit:
            tree.step_begin()
        S.Generation.generation += 1
        with caller_stream(stream):
            return a(x)[0]

    for _ in range(4):
        y = step(tree.explicit_steps, LEGACY)
    y_ptr = y.ptr
    # the program: host.copy_(y, non_blocking=True) on the legacy stream
    tree.explicit_steps = not tree.explicit_steps
    w0 = waits()
    y2 = step(tree.explicit_steps, S1)
    assert y2.ptr == y_ptr  # the replay wrote y's memory
    assert waits() - w0 == (1 if made == "explicit" else 0), waits() - w0
    assert y2.values() == [3, 5, 7, 9]
    assert reads(y, [3, 5, 7, 9]) is False
    w1 = waits()
    y3 = step(tree.explicit_steps, S1)  # a later step: the legacy note is retired
    assert waits() - w1 == 0
    assert y3.values() == [3, 5, 7, 9]
    del y, y2, y3
    tree.check()


@pytest.mark.parametrize("made", ["explicit", "automatic"])
@pytest.mark.parametrize("fw_on,bw_on", [(S1, LEGACY), (LEGACY, S1), (S1, S2), (LEGACY, LEGACY)])
def test_training_across_a_switch_with_the_loss_copied_on_the_forwards_stream(made, fw_on, bw_on):
    """Each iteration: an explicit step, the forward from fw_on, the
    program copies its output there (a loss to the host); the thread
    switches to automatic mode and runs the backward from bw_on (the same
    step: a backward is pending), then switches back. The next iteration's
    forward replays into the last one's memory: the waits each call makes
    are the docs' (Model), they cover the copy, and every value is eager's."""
    tree = made_in(made)
    model = Model(tree, blocking=made != "explicit")
    st = lambda: tree.stream  # noqa: E731
    fw = seg(tree, Fw(st), "fw", saved_from=1)
    bw = seg(tree, Add(st), "bw", n_args=2, backward=True)
    log, outs = [], []
    for i in range(6):
        tree.explicit_steps = True
        tree.step_begin()
        x = FakeTensor(4).fill([i, 1, 2, 3])
        log.append("fw %d" % i)
        (out, saved), launched = checked_call(model, fw, fw_on, (x,), log)
        assert out.values() == aff(x.values(), 2.0, 0.0)
        if launched:
            model.queued_read(fw_on, "loss copy")
        tree.explicit_steps = False
        log.append("bw %d" % i)
        (gr,), _ = checked_call(model, bw, bw_on, (saved, FakeTensor(4).fill([1, 1, 1, 1])), log)
        assert gr.values() == [3 * v + 1 for v in x.values()], i
        outs.append((out, aff(x.values(), 2.0, 0.0), launched))
        del saved, gr
    for o, v, launched in outs[:-1]:
        assert reads(o, v) is not launched  # an earlier step's: stale; the plain first call's is the program's
    assert outs[-1][0].values() == outs[-1][1]
    tree.check()


# ------------------------------------------------------------------ 2. a random walk, one thread

def _walk(box, made, seed, n_ops=260, training=True):
    rnd = random.Random(seed)
    tree = made_in(made)
    model = Model(tree, blocking=made != "explicit")
    st = lambda: tree.stream  # noqa: E731
    f = seg(tree, Aff(st, 1.0, 1.0), "f")
    g = seg(tree, Aff(st, -1.0, 2.0), "g")
    add = seg(tree, Add(st), "add", n_args=2)
    fw = seg(tree, Fw(st), "fw", saved_from=1)
    bw = seg(tree, Add(st), "bw", n_args=2, backward=True)
    streams = [LEGACY, S1, S2, tree.stream]
    cur = LEGACY
    kept = []  # (tensor, eager value)
    pending = []  # (saved, its eager value)
    log = []

    def keep(t, v, launched):
        if launched:  # in the tree's pool, handed out on cur: the program may copy it there
            t._pool, t._stream = t.ptr, cur
        kept.append((t, v))

    def arg():
        if kept and rnd.random() < 0.6:
            return kept[rnd.randrange(len(kept))]
        x = FakeTensor(4).fill([rnd.randint(-3, 3) for _ in range(4)])
        return x, x.values()

    for op in range(n_ops):
        k = rnd.random()
        if k < 0.07:
            tree.explicit_steps = not tree.explicit_steps
            log.append("explicit=%s" % tree.explicit_steps)
        elif k < 0.13:
            tree.step_begin()
            log.append("step_begin")
        elif k < 0.16:
            box.mark_step_counter -= 1  # torch.compiler.cudagraph_mark_step_begin(): process-wide
            log.append("mark")
        elif k < 0.26:
            cur = rnd.choice(streams)
            log.append("stream %#x" % cur)
        elif k < 0.36 and kept:  # a copy of a kept output queued on the stream it was handed out on
            t, v = kept[rnd.randrange(len(kept))]
            if reads(t, v) and getattr(t, "_pool", None) == t.ptr:
                model.queued_read(t._stream, "copy")
            log.append("copy")
        elif k < 0.41 and kept:
            kept.pop(rnd.randrange(len(kept)))
            if rnd.random() < 0.5:
                gc.collect()
            log.append("drop")
        elif k < 0.45 and kept:
            i = rnd.randrange(len(kept))
            if not reads(*kept[i]):
                kept.pop(i)
            log.append("read")
        elif training and k < 0.53:
            x = FakeTensor(4).fill([rnd.randint(-3, 3) for _ in range(4)])
            log.append("fw from %#x" % cur)
            res, launched = checked_call(model, fw, cur, (x,), log)
            if res is not None:
                out, saved = res
                assert out.values() == aff(x.values(), 2.0, 0.0), (seed, op, log[-14:])
                if launched:
                    saved._pool, saved._stream = saved.ptr, cur
                pending.append((saved, aff(x.values(), 3.0, 0.0)))
                keep(out, aff(x.values(), 2.0, 0.0), launched)
        elif training and k < 0.60 and pending:
            saved, sv = pending.pop(rnd.randrange(len(pending)))
            t = FakeTensor(4).fill([1, 1, 1, 1])
            log.append("bw from %#x" % cur)
            res, launched = checked_call(model, bw, cur, (saved, t), log)
            if res is not None:
                (gr,) = res
                assert gr.values() == [v + 1 for v in sv], (seed, op, log[-14:])
                keep(gr, gr.values(), launched)
        else:
            sg = rnd.choice((f, g, add))
            args = [arg()] if sg is not add else [arg(), arg()]
            log.append("call %s from %#x" % ({id(f): "f", id(g): "g", id(add): "add"}[id(sg)], cur))
            res, launched = checked_call(model, sg, cur, tuple(t for t, _ in args), log)
            if res is None:  # an argument of an earlier step: the program lets go of what went stale
                kept[:] = [(t, v) for t, v in kept if reads(t, v)]
                continue
            (y,) = res
            vs = [v for _, v in args]
            want = (aff(vs[0], 1.0, 1.0) if sg is f else aff(vs[0], -1.0, 2.0) if sg is g
                    else [p + q for p, q in zip(vs[0], vs[1])])
            assert y.values() == want, (seed, op, y.values(), want, log[-14:])
            for t, v in args:
                reads(t, v)
            if max(abs(e) for e in want) < 1e5:
                keep(y, want, launched)
        if len(kept) > 10:
            kept.pop(0)
    for t, v in kept:
        reads(t, v)
    kept.clear()
    pending.clear()
    gc.collect()
    tree.check()
    return tree


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("made", ["explicit", "automatic"])
def test_random_walk_of_modes_and_streams_on_a_tree_made_in_either_mode(box, made, seed):
    _walk(box, made, 700 + seed + (0 if made == "explicit" else 50))


# ------------------------------------------------------------------ 3. another thread reads an output

class Trees:
    """A tree getter: each thread's tree made in the mode its thread names, as tree_for makes it."""

    def __init__(self, modes):
        self.local, self.modes, self.made = threading.local(), modes, []

    def __call__(self, device=0):
        if not hasattr(self.local, "tree"):
            self.local.tree = made_in(self.modes[threading.current_thread().name])
            self.made.append(self.local.tree)
        return self.local.tree

    def stream(self):
        return self().stream


def in_thread(name, work):
    box = {}

    def run():
        try:
            box["res"] = work()
        except BaseException as e:  # noqa: BLE001 - reported below
            box["err"] = e

    th = threading.Thread(target=run, name=name)
    th.start()
    th.join(30)
    assert not th.is_alive(), "%s hangs" % name
    if "err" in box:
        raise box["err"]
    return box["res"]


@pytest.mark.parametrize("a_made", ["explicit", "automatic"])
@pytest.mark.parametrize("b_made", ["explicit", "automatic"])
@pytest.mark.parametrize("b_reads", ["plain_legacy", "plain_s2", "launched"])
def test_another_threads_read_of_an_output_is_waited_for_after_the_owner_switched_modes(a_made, b_made, b_reads):
    """Thread A's tree made in a_made mode; A switches to the other mode
    and hands y = a(x) (called from the legacy stream) to thread B, whose
    tree was made in b_made mode and which reads y: plainly (b's first
    call) on the legacy stream or on s2, or in a launch on B's tree's
    stream. A's next step, called from s1, replays a into y's memory: it
    must wait for the stream that read y, unless CUDA orders that stream
    with A's tree's (the legacy one with a blocking tree). B's tree's
    stream is noted at a plain call too (segment.c's argument loop notes it
    before the call turns out plain; call_plain_from notes the caller's):
    a wait more than needed, counted here as made. B's result is 3y - 1,
    y is stale after A's step, never A's next output."""
    trees = Trees({"A": a_made, "B": b_made})
    X.set_tree_getter(trees)
    base = X.Tree(0, backend="sim")
    a = seg(base, Aff(trees.stream, 2.0, 1.0), "a")
    b = seg(base, Aff(trees.stream, 3.0, -1.0), "b")
    x = FakeTensor(4).fill([1, 2, 3, 4])
    out = {}

    def on_b(work):
        return in_thread("B", work)

    def b_warm():  # B's tree, in B's own mode: b until it replays, on inputs of its own
        tb = trees()
        for _ in range(4):
            if tb.explicit_steps:
                tb.step_begin()
            S.Generation.generation += 1
            (z,) = b(FakeTensor(4).fill([0, 0, 0, 0]))
        return tb.stream

    def b_read(y):
        def work():
            tb = trees()
            if tb.explicit_steps:
                tb.step_begin()
            S.Generation.generation += 1
            with caller_stream(S2 if b_reads == "plain_s2" else LEGACY):
                (z,) = b(y)
            return z.values()
        return work

    def a_side():
        ta = trees()
        ta.explicit_steps = a_made != "explicit"  # the thread switched modes after its tree was made
        out["b_stream"] = on_b(b_warm) if b_reads == "launched" else on_b(lambda: trees().stream)
        for _ in range(4):
            if ta.explicit_steps:
                ta.step_begin()
            S.Generation.generation += 1
            (y,) = a(x)
        assert y.values() == [3, 5, 7, 9]
        y_ptr = y.ptr
        assert on_b(b_read(y)) == [8, 14, 20, 26]
        reader = {"plain_legacy": LEGACY, "plain_s2": S2, "launched": out["b_stream"]}[b_reads]
        noted = {out["b_stream"], reader, LEGACY}  # LEGACY: the stream A's own calls left for s1
        must = {s for s in noted if not (s == ta.stream or (s == LEGACY and a_made != "explicit")) and s != S1}
        assert reader in must or reader == ta.stream or (reader == LEGACY and a_made != "explicit")
        w0 = waits()
        if ta.explicit_steps:
            ta.step_begin()
        S.Generation.generation += 1
        with caller_stream(S1):
            (y2,) = a(x)  # A's next step: into y's memory
        assert y2.ptr == y_ptr
        assert waits() - w0 == len(must), (reader, must, waits() - w0)
        assert reads(y, [3, 5, 7, 9]) is False
        assert y2.values() == [3, 5, 7, 9]
        w1 = waits()
        if ta.explicit_steps:
            ta.step_begin()
        S.Generation.generation += 1
        with caller_stream(S1):
            a(x)  # and the step after: the notes are retired
        assert waits() - w1 == 0
        ta.check()

    in_thread("A", a_side)
    for t in trees.made:
        t.check()
