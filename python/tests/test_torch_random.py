"""Graphs that draw random numbers are recorded, and every replay draws
fresh numbers: Inductor's own, number for number, for the same
torch.manual_seed (python/cgtree/torch/_rng.py). Each case runs the same
program compiled by plain Inductor and by cgtree from the same seed, and
checks that cgtree's graphs really replayed (a graph that ran plainly would
pass the comparison without proving anything).

Needs a CUDA GPU (skips without one) and imports cgtree.torch first, so
that its allocator is installed before CUDA starts.
"""
import copy
import threading
import warnings

import pytest

import torch_gpu  # skips the file without a GPU; imports cgtree.torch before CUDA starts

torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
from cgtree.torch import _backend, _rng  # noqa: E402
from test_torch_training import assert_close_params  # noqa: E402


DEV = "cuda"


def compiled_pair(fn, **kw):
    torch._dynamo.reset()
    return torch.compile(fn, **kw), torch.compile(fn, backend="cgtree", **kw)


def run_seeded(fn, calls, seed=7, between=None):
    """fn(i) for i in range(calls) after torch.manual_seed(seed), cloning
    what it returns; `between(i)` runs eager random ops between calls."""
    torch.manual_seed(seed)
    out = []
    for i in range(calls):
        r = fn(i)
        out.append([t.clone() for t in (r if isinstance(r, (list, tuple)) else [r])])
        if between is not None:
            out[-1].append(between(i))
    return out


def assert_same_sequence(want, got):
    for i, (w, g) in enumerate(zip(want, got)):
        for j, (a, b) in enumerate(zip(w, g)):
            assert a.shape == b.shape and torch.equal(a, b), "call %d, result %d differs from Inductor's" % (i, j)


Replays = torch_gpu.Replays


def test_a_random_graph_is_recorded_and_every_replay_draws_inductors_next_numbers():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    ref, cg = compiled_pair(f)
    x = torch.ones(4096, device=DEV)
    want = run_seeded(lambda i: ref(x), 12)
    with Replays() as r:
        got = run_seeded(lambda i: cg(x), 12)
    assert r.plain == [] and r.recordings == 1 and r.replays >= 9, vars(r)
    assert_same_sequence(want, got)
    assert not torch.equal(got[-1][0], got[-2][0]), "two replays drew the same numbers"


def test_eager_random_ops_between_replays_see_the_generator_where_inductor_leaves_it():
    def f(x):
        return x * torch.randn_like(x)

    ref, cg = compiled_pair(f)
    x = torch.full((1000,), 2.0, device=DEV)

    def between(i):  # eager draws from the same generator, and a reseed halfway
        if i == 6:
            torch.manual_seed(123)
        return torch.rand(17, device=DEV)

    want = run_seeded(lambda i: ref(x), 12, between=between)
    with Replays() as r:
        got = run_seeded(lambda i: cg(x), 12, between=between)
    assert r.plain == [] and r.replays >= 8, vars(r)
    assert_same_sequence(want, got)


def test_two_random_graphs_in_one_step_split_by_a_graph_break_draw_inductors_numbers():
    def f(x):
        a = torch.rand_like(x) + x
        if a.sum() > 0:  # a host decision: a graph break between two random graphs
            b = torch.bernoulli(torch.full_like(x, 0.3)) * a
        else:
            b = a
        return b, torch.randn(3, device=x.device)

    ref, cg = compiled_pair(f)
    x = torch.ones(2048, device=DEV)
    want = run_seeded(lambda i: ref(x), 10)
    with Replays() as r:
        got = run_seeded(lambda i: cg(x), 10)
    assert r.plain == [] and r.replays >= 2 * 7, vars(r)
    assert_same_sequence(want, got)


def test_multinomial_sampling_in_a_generation_loop_samples_inductors_tokens():
    torch.manual_seed(0)
    emb = torch.randn(64, 32, device=DEV)
    head = torch.randn(32, 64, device=DEV)

    def step(tok):
        logits = emb[tok] @ head
        probs = torch.softmax(logits / 0.8, dim=-1)
        return torch.multinomial(probs, 1).squeeze(-1)

    ref, cg = compiled_pair(step)

    def generate(fn):
        tok = torch.zeros(4, dtype=torch.long, device=DEV)
        out = []
        for _ in range(24):
            tok = fn(tok).clone()  # kept across calls: cloned, as outputs kept past their step must be
            out.append(tok)
        return out

    torch.manual_seed(5)
    want = generate(ref)
    with Replays() as r:
        torch.manual_seed(5)
        got = generate(cg)
    assert r.plain == [] and r.replays >= 20, vars(r)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), "token %d differs from Inductor's: %s vs %s" % (i, a.tolist(), b.tolist())


def test_attention_with_dropout_draws_inductors_numbers():
    def attn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.2)

    ref, cg = compiled_pair(attn)
    g = torch.Generator(device="cpu").manual_seed(3)
    q, k, v = (torch.randn(2, 4, 128, 64, generator=g).to(DEV, torch.float16) for _ in range(3))
    want = run_seeded(lambda i: ref(q, k, v), 8)
    with Replays() as r:
        got = run_seeded(lambda i: cg(q, k, v), 8)
    assert r.plain == [] and r.replays >= 5, vars(r)
    assert_same_sequence(want, got)


def test_a_dynamic_shape_random_graph_draws_inductors_numbers_for_each_size():
    def f(x):
        return x + torch.rand_like(x)

    ref, cg = compiled_pair(f, dynamic=True)
    xs = [torch.zeros(n, device=DEV) for n in (1000, 3000, 1000, 5000, 3000, 1000, 5000, 3000, 1000, 1000, 5000, 3000, 1000)]
    want = run_seeded(lambda i: ref(xs[i]), len(xs))
    with Replays() as r:
        got = run_seeded(lambda i: cg(xs[i]), len(xs))
    assert r.plain == [] and r.replays >= 6, vars(r)
    assert_same_sequence(want, got)


def test_training_with_dropout_gives_inductors_losses_and_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(128, 1)).to(DEV)
    ref_model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(32, 64, generator=g).to(DEV) for _ in range(12)]

    def train(m, cf):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(11)
        losses = []
        for x in xs:
            loss = cf(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())
        return losses

    torch._dynamo.reset()
    want = train(ref_model, torch.compile(ref_model))
    torch._dynamo.reset()
    with Replays() as r:
        got = train(model, torch.compile(model, backend="cgtree"))
    assert r.plain == [] and r.replays >= 2 * 8, vars(r)  # the forward and the backward replay
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), "loss %d: %r vs Inductor's %r" % (i, b.item(), a.item())
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        assert torch.equal(p, q), "weight %s differs from Inductor's" % n


class CheckpointedDropout(torch.nn.Module):
    """A block recomputed in the backward (torch.utils.checkpoint) that draws
    a dropout mask: its recompute must draw the forward's mask again."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = torch.nn.Linear(64, 128), torch.nn.Linear(128, 128), torch.nn.Linear(128, 1)

    def block(self, x):
        return torch.nn.functional.dropout(torch.relu(self.b(torch.relu(self.a(x)))), 0.3, training=self.training)

    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))


class CheckpointedAttention(torch.nn.Module):
    """Self-attention with dropout, recomputed in the backward: the fused
    kernel draws its mask inside, so AOTAutograd cannot seed it as Inductor
    seeds a dropout; it swaps in a generator of its own (its graph-safe
    checkpointing)."""

    def __init__(self, width=64, heads=2):
        super().__init__()
        self.qkv, self.head, self.heads = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, 1), heads

    def block(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.3 if self.training else 0.0)
        return a.transpose(1, 2).reshape(b, s, w)

    def forward(self, x):
        return self.head(torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False))


class AttentionWithDropout(CheckpointedAttention):
    """The same attention with dropout, not recomputed: the forward saves the
    kernel's random seed and offset for the backward."""

    def forward(self, x):
        return self.head(self.block(x))


def train_both(make, shape, autocast=None):
    """The model trained by plain Inductor and, from the same seeds, by
    cgtree: (Inductor's losses and model, cgtree's, what cgtree's graphs
    did, the backend's decisions for them)."""
    torch.manual_seed(0)
    model = make().to(DEV)
    ref_model = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(*shape, generator=g).to(DEV) for _ in range(12)]

    def train(m, cf):
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(11)  # also seeds the generators AOTAutograd makes at the first call
        losses = []
        for x in xs:
            with torch.autocast("cuda", dtype=autocast or torch.float32, enabled=autocast is not None):
                loss = cf(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())
        return torch.stack(losses)

    torch._dynamo.reset()
    want = train(ref_model, torch.compile(ref_model))
    torch._dynamo.reset()
    first = len(_backend.decisions)
    with Replays() as r:
        got = train(model, torch.compile(model, backend="cgtree"))
    return (want, ref_model), (got, model), r, _backend.decisions[first:]


def test_activation_checkpointing_with_dropout_records_and_its_recompute_draws_the_forwards_mask():
    """Inductor seeds a checkpointed dropout itself (the forward draws the
    seeds and saves them; the backward's recompute reads them): the forward
    is a random graph, recorded, and the recompute draws the forward's
    mask: losses and weights equal Inductor's bit for bit."""
    (want, ref_model), (got, model), r, _ = train_both(CheckpointedDropout, (32, 64))
    assert r.plain == [] and r.replays >= 2 * 8, vars(r)  # the forward and the backward replay
    assert torch.equal(got, want), "losses %s, Inductor's %s" % (got.tolist(), want.tolist())
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        assert torch.equal(p, q), "weight %s differs from Inductor's" % n


def test_checkpointed_attention_with_dropout_records_with_autograds_generators_and_recomputes_the_mask():
    """AOTAutograd's graph-safe checkpointing passes a generator pair per
    recomputed random operator (here flash attention with dropout, under
    bf16 autocast) to the forward and the backward; cgtree registers them
    with its recordings, so both graphs record and replay, and the
    backward's recompute draws the forward's mask. Losses and weights match
    Inductor's within rtol 1e-4 (the attention backward may accumulate with
    atomics; a mask drawn anew in the recompute would change the gradients
    themselves). Before, these graphs ran plainly."""
    from cgtree.torch._graphs import ARG_GENERATOR

    (want, ref_model), (got, model), r, mine = train_both(CheckpointedAttention, (4, 64, 64), torch.bfloat16)
    assert {d["graph"] for d in mine if ARG_GENERATOR in d.get("kinds", ())} == {"forward", "backward"}, mine
    assert r.plain == [] and r.replays >= 2 * 8, vars(r)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=lambda m: "weight %s: %s" % (n, m))


def test_fp32_attention_with_dropout_records_and_its_backward_reads_the_forwards_seed_in_and_out_of_captures():
    """In fp32, attention takes the memory-efficient kernel. Outside a
    capture its forward returns its random seed and offset as CPU tensors
    and its backward reads them on the host; inside one, both go through
    device pointers. cgtree copies a forward's onto the GPU, where the
    compile put them, and hands them back on the CPU to every run of the
    backward outside a capture, so both graphs record and replay, and each
    backward, replayed or run, applies the mask of the forward it follows:
    losses and weights are Inductor's within rtol 1e-5 (a mask drawn anew,
    or a seed read from the wrong memory, changes the gradients themselves).
    Before, both graphs ran plainly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 2, 16, 32, device=DEV)
    seed = torch.ops.aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.3)[2]
    assert seed.device.type == "cpu", "the case at hand: a CPU seed outside a capture"
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        (want, ref_model), (got, model), r, mine = train_both(AttentionWithDropout, (4, 64, 64))
    assert any(d["saved_copied_if_on_cpu"] for d in mine if d["graph"] == "forward"), mine
    assert any(d["host_read_seeds"] for d in mine if d["graph"] == "backward"), mine
    assert r.plain == [] and r.replays >= 2 * 8, vars(r)  # the forward and the backward replay
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert_close_params(model, ref_model)


def test_a_random_graph_called_on_a_side_stream_draws_inductors_numbers():
    """The caller's stream is not the legacy default stream: the generator's
    writes go on the tree's stream, ordered by events."""
    def f(x):
        return x + torch.randn_like(x)

    ref, cg = compiled_pair(f)
    x = torch.zeros(4096, device=DEV)
    side = torch.cuda.Stream()

    def run(fn):
        with torch.cuda.stream(side):
            out = run_seeded(lambda i: fn(x), 10, between=lambda i: torch.rand(5, device=DEV))
        side.synchronize()
        return out

    want = run(ref)
    with Replays() as r:
        got = run(cg)
    assert r.plain == [] and r.replays >= 7, vars(r)
    assert_same_sequence(want, got)


def test_a_random_graph_on_a_thread_with_explicit_steps_draws_inductors_numbers():
    """A thread in explicit step mode runs its tree on a non-blocking stream."""
    import threading

    def f(x):
        return torch.nn.functional.dropout(x, 0.4, training=True)

    ref, cg = compiled_pair(f)
    x = torch.ones(4096, device=DEV)
    want = run_seeded(lambda i: ref(x), 10)
    box = {}

    def worker():
        try:
            ct.set_step_mode("explicit")

            def call(i):
                ct.step_begin()
                return cg(x)

            with Replays() as r:
                box["got"] = run_seeded(call, 10)
            box["r"] = r
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert "error" not in box, repr(box.get("error"))
    r = box["r"]
    assert r.plain == [] and r.replays >= 7, vars(r)
    assert_same_sequence(want, box["got"])


def test_random_graphs_replayed_on_two_threads_trees_at_once_draw_each_of_inductors_numbers_once():
    """Two threads replay one random graph at once, each on its own tree,
    stream and caller's stream (explicit steps: non-blocking streams). Every
    tree's launches read the one state of the device's generator, so the
    writes of that state before a launch must wait until every launch
    enqueued before it has read it (seg_launch.c's event). A write that
    overtook a read would make two calls draw the same numbers and skip
    others, silently. So the draws of all calls, as a multiset, must be
    Inductor's first ones, each once, and each thread's own draws must come
    in the sequence's order. fallback_random: the random op (aten's
    bernoulli) reads the generator's state where it runs, after a matmul it
    depends on, which leaves another thread's write the widest window."""
    w = torch.randn(2048, 2048, device=DEV) / 45
    x = torch.randn(2048, 2048, device=DEV)

    def f(x):
        return torch.bernoulli(torch.sigmoid((x @ w)[:, :64]))

    warm, each = 3, 16
    total = 1 + 2 * (warm + each)
    with torch._inductor.config.patch(fallback_random=True):
        ref, cg = compiled_pair(f)
        want = [o[0] for o in run_seeded(lambda i: ref(x), total)]
        draws, errors = {0: [], 1: []}, []
        turn = [threading.Event(), threading.Event()]
        warmed = [threading.Event(), threading.Event()]
        go = threading.Event()

        def worker(k):
            try:
                ct.set_step_mode("explicit")
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    def call():
                        ct.step_begin()
                        draws[k].append(cg(x).clone())  # kept past its step: cloned, on this thread's stream

                    assert turn[k].wait(120)
                    for _ in range(warm):  # warmed up and recorded one thread at a time
                        call()
                    warmed[k].set()
                    assert go.wait(120)
                    for _ in range(each):
                        call()
                stream.synchronize()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
                warmed[k].set()

        with Replays() as r:
            torch.manual_seed(7)
            first = cg(x).clone()  # compiled here: Dynamo's tracing is not thread-safe
            torch.cuda.synchronize()
            threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
            for t in threads:
                t.start()
            for k in (0, 1):
                turn[k].set()
                assert warmed[k].wait(300)
            with Replays() as at_once:
                go.set()
                for t in threads:
                    t.join()
    assert errors == [], errors
    assert r.plain == [], vars(r)
    assert at_once.recordings == 0 and at_once.replays >= 2 * each, vars(at_once)
    used = {}

    def index_of(t, who):
        for j, v in enumerate(want):
            if j not in used and torch.equal(v, t):
                used[j] = who
                return j
        dup = [used[j] for j, v in enumerate(want) if j in used and torch.equal(v, t)]
        raise AssertionError("%s drew numbers that are none of Inductor's first %d not drawn already%s"
                             % (who, total, " (the same as %s)" % dup[0] if dup else ""))

    assert index_of(first, "the first call") == 0
    for k in (0, 1):
        got = [index_of(t, "thread %d, call %d" % (k, i)) for i, t in enumerate(draws[k])]
        assert got[:warm] == list(range(1 + k * warm, 1 + (k + 1) * warm)), (k, got)
        assert got == sorted(got), "thread %d drew Inductor's numbers out of order: %s" % (k, got)
    assert len(used) == total


def test_a_random_graph_whose_recording_raises_runs_as_inductors_graph_with_a_warning(monkeypatch):
    """A PyTorch whose generator refuses the offset counting of a capture it
    did not begin (its main branch keys that state by capture id) makes the
    recording raise. The graph then runs as the plain Inductor graph from
    then on, drawing Inductor's numbers, with one warning naming the cause."""
    def f(x):
        return x + torch.rand_like(x)

    ref, cg = compiled_pair(f)
    x = torch.zeros(4096, device=DEV)
    want = run_seeded(lambda i: ref(x), 8)

    def refuse(*args, **kwargs):
        raise RuntimeError("the generator's capture state is keyed by capture id (simulated)")

    monkeypatch.setattr(_rng, "_empty_capture_begin", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Replays() as r:
            got = run_seeded(lambda i: cg(x), 8)
    assert_same_sequence(want, got)
    assert r.replays == 0 and len(r.plain) == 1 and "keyed by capture id" in r.plain[0], vars(r)
    said = [str(w.message) for w in caught if "runs without CUDA graphs" in str(w.message)]
    assert len(said) == 1 and "keyed by capture id" in said[0], said


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_random_graph_on_the_second_device_with_the_first_current_draws_inductors_numbers():
    """The event every random graph's launch records (the last random launch
    of the device, which other threads' random runs wait for) is made on the
    tree's device. Made on the current device (cuda:0 here, for a model on
    cuda:1), CUDA refused to record it on cuda:1's stream. cuda:1's
    generator draws Inductor's numbers, replay after replay, while cuda:0's
    is left where Inductor leaves it (untouched)."""
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    torch.cuda.set_device(0)
    ref, cg = compiled_pair(f)
    x = torch.ones(4096, device="cuda:1")
    want = run_seeded(lambda i: ref(x), 12, between=lambda i: torch.rand(5, device="cuda:0"))
    with Replays() as r:
        got = run_seeded(lambda i: cg(x), 12, between=lambda i: torch.rand(5, device="cuda:0"))
    assert r.plain == [] and r.recordings == 1 and r.replays >= 9, vars(r)
    assert_same_sequence(want, got)
    assert all(g[0].device.index == 1 for g in got)
    torch.cuda.synchronize(1)
