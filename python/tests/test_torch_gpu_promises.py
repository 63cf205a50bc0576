"""Promises of docs/torch.md that had no GPU test: a torch.Generator passed
to an op, activation checkpointing in AOTAutograd's host-side random form,
an eager random op on another thread during a random graph's recording,
compiled autograd's first call under gradient accumulation, and the stream
an explicit-mode tree makes and frees. Each case runs against plain
Inductor (or eager) in the same process, from the same seeds.

Needs a CUDA GPU (skips without one) and imports cgtree.torch first, so
that its allocator is installed before CUDA starts.
"""
import copy
import threading
import time

import pytest

import torch_gpu  # skips the file without a GPU; imports cgtree.torch before CUDA starts

torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
from cgtree.torch import _backend, _install  # noqa: E402


DEV = "cuda"


Replays = torch_gpu.Replays


def cloned(r):
    return [t.clone() for t in (r if isinstance(r, (list, tuple)) else [r])]


def assert_same_sequence(want, got, what="Inductor's"):
    assert len(want) == len(got)
    for i, (w, g) in enumerate(zip(want, got)):
        assert len(w) == len(g)
        for j, (a, b) in enumerate(zip(w, g)):
            assert a.shape == b.shape and torch.equal(a, b), "call %d, result %d differs from %s" % (i, j, what)


# --- 1. a torch.Generator passed to an op -----------------------------------------------------------------------


def test_a_generator_passed_to_an_op_breaks_the_graph_draws_eagers_numbers_and_the_rest_still_records():
    """docs/torch.md, Random graphs: "Only the default generator and
    AOTAutograd's checkpointing generators are handled (Inductor draws from
    the default; a `torch.Generator` passed to an op breaks the graph in
    Dynamo)." A function draws from the default generator (rand_like, in
    the first graph), then from a CUDA generator of its own (randn with
    generator=g), then computes on both. Dynamo breaks the graph at the
    draw from g, which runs eagerly: its numbers are eager's, call after
    call, and every result equals plain Inductor's bit for bit from the
    same seeds of both generators. The two graphs around the break are
    recorded and replay (neither runs plainly)."""
    g = torch.Generator(device=DEV)

    def f(x):
        a = torch.relu(x) * 2 + torch.rand_like(x)  # the default generator: a random graph
        r = torch.randn(x.shape, generator=g, device=x.device)  # a generator of its own: a graph break
        return a * r + 1, r

    x = torch.linspace(-1, 1, 4096, device=DEV)
    calls = 10

    def run(fn):
        torch.manual_seed(7)
        g.manual_seed(1234)
        return [cloned(fn(x)) for _ in range(calls)]

    g.manual_seed(1234)
    eager_draws = [torch.randn(x.shape, generator=g, device=DEV) for _ in range(calls)]
    torch._dynamo.reset()
    want = run(torch.compile(f, backend="inductor"))
    torch._dynamo.reset()
    cg = torch.compile(f, backend="cgtree")
    with Replays() as r:
        got = run(cg)
    assert r.compiled == 2, "Dynamo should break the graph at the draw from g: %d graph(s) compiled" % r.compiled
    assert r.plain == [] and r.recordings >= 2 and r.replays >= 2 * (calls - 3), vars(r)
    assert_same_sequence(want, got)
    assert_same_sequence([[d] for d in eager_draws], [[out[1]] for out in got], "eager's draws from g")
    assert not torch.equal(got[-1][1], got[-2][1]), "two calls drew the same numbers from g"
    assert not torch.equal(got[-1][0], got[-2][0]), "two replays drew the same numbers"


# --- 2. activation checkpointing in AOTAutograd's host-side form --------------------------------------------------


from test_torch_random import CheckpointedDropout  # noqa: E402  (the random file's checkpointed dropout)


def rng_operators_inductor_compiles(model, x):
    """The names of the higher-order operators that save or restore the
    generator's state (any whose name has "rng") in the graphs plain
    Inductor compiles for one training step of model: compile_fx, as
    backend="inductor" runs it, with an inner_compile that looks at each
    graph before compile_fx_inner compiles it (AOTAutograd's cache off, so
    that every graph reaches it)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    seen = set()

    def inner(gm, example_inputs, **kwargs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator):
                if "rng" in n.target.name():
                    seen.add(n.target.name())
        return compile_fx_inner(gm, example_inputs, **kwargs)

    def probe(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    torch._dynamo.reset()
    with torch._functorch.config.patch(enable_autograd_cache=False):
        torch.compile(model, backend=probe)(x).square().mean().backward()
    torch._dynamo.reset()
    return seen


def test_checkpointing_in_the_host_side_random_form_runs_plainly_and_trains_as_inductor():
    """docs/torch.md, Activation checkpointing: "The host-side form
    (`run_and_save_rng_state` and `run_with_rng_state`: random operators on
    the CPU or on several GPUs) still runs plainly." AOTAutograd takes that
    form instead of its graph-safe one wherever Inductor's fallback_random
    is on (torch/_functorch/partitioners.py, functionalize_rng_ops: the
    graph-safe form changes numerics, so fallback_random refuses it), as it
    does for the CPU and for several GPUs; with fallback_random Inductor
    leaves the dropout's aten ops in the graph, which checkpointing then
    wraps. So a checkpointed dropout trained under fallback_random: the
    forward, which saves the generator's state (run_and_save_rng_state),
    runs as the plain Inductor graph for that reason, its backward
    (run_with_rng_state, fed that state on the CPU) plainly too, no error,
    and every loss and gradient, and the weights, equal plain Inductor's
    bit for bit. Skips where this PyTorch builds no such graph."""
    torch.manual_seed(0)
    model = CheckpointedDropout().to(DEV)
    probe_model, ref_model = copy.deepcopy(model), copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(32, 64, generator=gen).to(DEV) for _ in range(8)]

    def train(m, cf):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(11)
        losses, grads = [], []
        for x in xs:
            loss = cf(x).square().mean()
            loss.backward()
            grads.append([p.grad.clone() for p in m.parameters()])
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())
        return torch.stack(losses), grads

    with torch._inductor.config.patch(fallback_random=True):
        ops = rng_operators_inductor_compiles(probe_model, xs[0])
        if "run_and_save_rng_state" not in ops:
            pytest.skip("AOTAutograd built no host-side random checkpointing here (rng operators: %s)" % sorted(ops))
        torch._dynamo.reset()
        want, want_grads = train(ref_model, torch.compile(ref_model, backend="inductor"))
        torch._dynamo.reset()
        first = len(_backend.decisions)
        got, got_grads = train(model, torch.compile(model, backend="cgtree"))
    mine = _backend.decisions[first:]
    forwards = [d for d in mine if d["graph"] == "forward"]
    backwards = [d for d in mine if d["graph"] == "backward"]
    assert forwards and backwards, mine
    for d in forwards:
        assert d["plain_reason"] is not None and "random generator's state" in d["plain_reason"], d
    for d in backwards:
        assert d["plain_reason"] is not None, d  # run_with_rng_state, and the saved state lies on the CPU
    assert torch.equal(got, want), "losses %s, Inductor's %s" % (got.tolist(), want.tolist())
    names = [n for n, _ in model.named_parameters()]
    for i, (gs, ws) in enumerate(zip(got_grads, want_grads)):
        for n, a, b in zip(names, gs, ws):
            assert torch.equal(a, b), "step %d: the gradient of %s differs from Inductor's" % (i, n)
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        assert torch.equal(p, q), "weight %s differs from Inductor's" % n


# --- 3. an eager random op on another thread while a random graph is recorded -------------------------------------

_pause = {"hook": None}  # called once, from inside a recording, by pause_while_recording


@torch.library.custom_op("cgtree_gpu_promises::pause_while_recording", mutates_args=())
def pause_while_recording(x: torch.Tensor) -> torch.Tensor:
    """A copy of x. Run inside a capture (a recording: cgtree's launch runs
    Inductor's graph, this op's Python included, on the capturing tree
    stream), it first calls the hook set in _pause, once."""
    hook = _pause["hook"]
    if hook is not None and torch.cuda.is_current_stream_capturing():
        _pause["hook"] = None
        hook()
    return x.clone()


@pause_while_recording.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_eager_random_op_on_another_thread_while_a_random_graph_is_recorded_fails_and_the_recording_is_right():
    """docs/torch.md, Random graphs, Limits: "The generator's capture mode is
    one flag per generator, so random graphs are recorded one at a time per
    process (a lock), and an eager random op on another thread while one is
    recorded fails, as under `torch.cuda.graph`." Made deterministic: the
    random graph holds a custom op whose Python, run by Inductor's graph
    inside cgtree's recording (the generator in capture mode from the
    empty graph's capture_begin to its capture_end, _rng.py), hands over
    to the main thread and waits. The main thread then draws eagerly from
    the default generator (uniform_ into a tensor made beforehand, on a
    stream of its own): PyTorch refuses it (its generator counts offsets
    for a capture only). The recording thread runs in explicit step mode,
    so its tree's stream is non-blocking and the main thread's work cannot
    meet the capture. The refused draw leaves the generator as it was: the
    graph still records (no plain run) and replays, and every call draws Inductor's
    numbers from the same seed. After the recording, the same eager draw
    on the main thread runs."""
    def f(x):
        return torch.rand_like(x) + pause_while_recording(x)

    x = torch.ones(4096, device=DEV)
    calls = 10

    def run(fn, step=lambda: None):
        torch.manual_seed(7)
        out = []
        for _ in range(calls):
            step()
            out.append(cloned(fn(x)))
        return out

    torch._dynamo.reset()
    want = run(torch.compile(f, backend="inductor"))
    torch._dynamo.reset()
    cg = torch.compile(f, backend="cgtree")
    buf = torch.zeros(1024, device=DEV)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    inside, done = threading.Event(), threading.Event()
    box = {}

    def hook():
        inside.set()
        box["main_answered"] = done.wait(120)

    def worker():
        try:
            ct.set_step_mode("explicit")
            with Replays() as r:
                box["got"] = run(cg, ct.step_begin)
            box["r"] = r
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e
        finally:
            inside.set()  # never leave the main thread waiting

    _pause["hook"] = hook
    t = threading.Thread(target=worker)
    try:
        t.start()
        assert inside.wait(300), "the worker neither recorded nor finished"
        refused = None
        if "error" not in box and "got" not in box:  # inside the recording: the hook waits for us
            try:
                with torch.cuda.stream(side):
                    buf.uniform_()
            except RuntimeError as e:
                refused = str(e)
        done.set()
        t.join(300)
    finally:
        _pause["hook"] = None
        done.set()
    assert not t.is_alive(), "the worker hangs"
    assert "error" not in box, repr(box.get("error"))
    assert box.get("main_answered"), "the random graph was never recorded (or the hook timed out)"
    assert refused is not None, "an eager random op ran on another thread during a random graph's recording"
    assert "capture" in refused.lower(), refused
    r = box["r"]
    assert r.plain == [] and r.recordings >= 1 and r.replays >= calls - 3, vars(r)
    assert_same_sequence(want, box["got"])
    with torch.cuda.stream(side):
        buf.uniform_()  # no recording under way: the eager draw runs
    side.synchronize()
    assert bool(((buf >= 0) & (buf <= 1)).all()) and not bool((buf == 0).all())


# --- 4. compiled autograd's first call, with gradients accumulating ------------------------------------------------


from test_torch_training import assert_close_params, mlp  # noqa: E402


def micro_step_of(model):
    """A micro-batch's step: the forward, the mean square loss, backward();
    returns the loss."""
    def micro_step(x):
        loss = model(x).square().mean()
        loss.backward()
        return loss

    return micro_step


def test_compiled_autograds_backward_never_runs_twice_at_its_first_call_with_gradients_accumulating():
    """docs/torch.md, Training, the compiled autograd row: cgtree makes
    compiled autograd's graph a backward: "its outputs become `.grad`
    (moved out of the pool if they outlive the step), the optimizer goes on
    in its step, it never runs twice at its first call". A compiled
    micro-step (forward, loss.backward() under
    torch._dynamo.config.compiled_autograd) is called twice per
    accumulation cycle with no zero_grad between, so the second backward
    adds into the .grad the first made; a backward graph run twice at its
    first call would show as a doubled share of .grad. Every .grad after
    every micro-step, and every loss, agrees with plain Inductor's to 1e-5
    relative (compiled autograd is not bit-reproducible from one compile to
    the next, docs/torch.md), and each graph of compiled autograd, seen
    right after its first call, ran once, plainly, leaving no run in the
    tree (as test_a_backward_never_reruns_at_its_first_call checks for
    AOTAutograd's backward)."""
    model = mlp()
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 64, generator=gen).to(DEV) for _ in range(12)]
    results = {}
    checked = []

    def first_call_checks(first):
        """For each compiled-autograd graph cgtree made since decisions[first]
        whose first call just ran: (name, calls, plain calls, runs in the tree)."""
        for d in _backend.decisions[first:]:
            name = d.get("segment")
            if d["graph"] != "compiled_autograd" or name is None or name in [c[0] for c in checked]:
                continue
            seg = next(s for s in _backend._segments if s.info["name"] == name)
            if seg.info["calls"] == 1:
                runs = sum(n["eager_runs"] + n["replays"] for n in ct.nodes() if n["segment"] == name)
                checked.append((name, seg.info["calls"], seg.info["plain_calls"], runs, seg.info["plain_reason"]))

    with torch._dynamo.config.patch(compiled_autograd=True):
        for m, backend in ((model, "cgtree"), (ref, "inductor")):
            torch._dynamo.reset()  # compiled autograd's cache of graphs too: the other backend's are not reused
            step = torch.compile(micro_step_of(m), backend=backend)  # compiled under the flag: so are its backwards
            first = len(_backend.decisions)
            losses, grads = [], []
            for i in range(0, len(xs), 2):
                for x in xs[i:i + 2]:  # two micro-batches: the second backward accumulates into .grad
                    losses.append(step(x).detach().clone())
                    grads.append([p.grad.clone() for p in m.parameters()])
                    if backend == "cgtree":
                        first_call_checks(first)
                with torch.no_grad():
                    for p in m.parameters():
                        p -= 0.05 * p.grad
                m.zero_grad(set_to_none=i % 4 == 0)  # None, then zeros in place: both kinds of first accumulation
            results[backend] = torch.stack(losses), grads
            if backend == "cgtree":
                made = [d for d in _backend.decisions[first:] if d["graph"] == "compiled_autograd"]
    assert made, "no graph of compiled autograd reached cgtree"
    assert checked, "no graph of compiled autograd was seen right after its first call"
    assert any(c[4] is None for c in checked), "every graph of compiled autograd ran plainly: %s" % checked
    for name, calls, plain_calls, runs, _ in checked:
        assert (calls, plain_calls, runs) == (1, 1, 0), (
            "%s at its first call: %d call(s), %d plain, %d run(s) in the tree" % (name, calls, plain_calls, runs))
    (got, got_grads), (want, want_grads) = results["cgtree"], results["inductor"]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    for i, (gs, ws) in enumerate(zip(got_grads, want_grads)):
        for j, (a, b) in enumerate(zip(gs, ws)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7,
                                       msg=lambda s: "micro-step %d, gradient %d: %s" % (i, j, s))
    assert_close_params(model, ref)


# --- 5. the explicit-mode tree's stream ---------------------------------------------------------------------------


stream_is_non_blocking = torch_gpu.stream_is_non_blocking


def orphaned(tree, seconds=10.0):
    """Waits until the tree is orphaned: a thread's trees are orphaned when
    its OS thread is gone, a little after join()."""
    deadline = time.monotonic() + seconds
    while not tree.orphaned and time.monotonic() < deadline:
        time.sleep(0.01)
    return tree.orphaned


def test_an_explicit_threads_tree_makes_a_non_blocking_stream_of_its_own_and_retires_it_when_the_tree_is_freed():
    """docs/torch.md, Threads and explicit steps: "Trees made in explicit
    mode ... run on a non-blocking stream ... The tree makes that stream
    (`cudaStreamCreateWithFlags`) and destroys it with the tree". Made: the
    explicit thread's tree's stream is non-blocking and none of the
    streams torch.cuda.Stream() hands out. Destroyed with the tree: what
    can be seen of it without touching a destroyed handle is that the
    tree's free retires its stream first (tree_close.c, eager.c,
    tx_eager_retire_stream). An eager tensor the thread allocated on the
    tree's stream, outside any launch, and handed back, outlives the tree:
    at the tree's free (after the thread exited, its outputs dead,
    cgtree.torch.empty_cache()) its block is rehomed
    (memory_stats()["blocks_rehomed"]), it keeps its values, and its free
    afterwards goes to the legacy stream's cache, whose next allocation of
    its size gets it back."""
    if torch_gpu.LAUNCH_FRAMES_KEPT:
        pytest.skip("a tool keeps launch frames, and with them outputs: the tree is not freed here")
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU()).to(DEV).eval()
    cg = torch.compile(model, backend="cgtree")
    x = torch.randn(32, 128, device=DEV)
    device = torch.cuda.current_device()
    n = 12345  # floats: a size class of its own in the front cache
    with torch.no_grad():
        want = model(x)
        cg(x)  # compiled here: Dynamo's tracing is not thread-safe
    box = {}

    def work():
        try:
            ct.set_step_mode("explicit")
            with torch.no_grad():
                for _ in range(4):  # warm-up, recording, replays
                    ct.step_begin()
                    torch.testing.assert_close(cg(x), want)
            tree, stream = _install.tree_for(device)
            box["tree"], box["handle"] = tree, tree.stream
            box["explicit"], box["non_blocking"] = tree.explicit_steps, stream_is_non_blocking(tree.stream)
            with torch.cuda.stream(stream):
                box["keep"] = torch.full((n,), 7.0, device=DEV)  # an eager block on the tree's stream
            stream.synchronize()
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in box, repr(box.get("error"))
    tree = box["tree"]
    assert box["explicit"] and box["non_blocking"], "an explicit thread's tree should run on a non-blocking stream"
    pytorchs = {torch.cuda.Stream(device=DEV).cuda_stream for _ in range(64)}  # PyTorch's pool, twice round
    assert box["handle"] not in pytorchs, "the tree's stream is one torch.cuda.Stream() hands out"
    assert orphaned(tree), "the thread's tree was not orphaned after its exit"
    rehomed = ct.memory_stats()["blocks_rehomed"]
    freed = ct.stats()["trees_freed"]
    ct.empty_cache()  # frees the exited thread's tree: no output of it lives
    assert tree.closed
    assert ct.stats()["trees_freed"] >= freed + 1
    assert ct.memory_stats()["blocks_rehomed"] >= rehomed + 1, "the freed tree's stream was not retired"
    keep = box.pop("keep")
    assert bool((keep == 7.0).all()), "an eager block of the freed tree's stream lost its values"
    if ct.memory_stats()["front_cache_limit"] < 4 * keep.nbytes:
        return  # no front cache (CGTREE_TORCH_FRONT_CACHE_BYTES): where the free goes cannot be seen
    ptr = keep.data_ptr()
    del keep  # its free goes to the legacy stream's cache now, not to the destroyed stream's
    again = torch.empty(n, device=DEV)
    assert again.data_ptr() == ptr, "the freed block was not cached under the legacy stream"
