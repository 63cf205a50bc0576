"""cgtree.torch never hands back silently wrong data: stale outputs raise,
views alias as in eager, mutations come from the compiler, the allocator is
per device and stream, threads get their own trees.

Needs a CUDA GPU (skips without one) and imports cgtree.torch first, so
that its allocator is installed before CUDA starts. Run it in a pytest
process of its own or with test_torch_backend.py.
"""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import torch_gpu  # skips the file without a GPU; imports cgtree.torch before CUDA starts

torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
from cgtree import _torch_ext as _ext  # noqa: E402
from cgtree.torch import _backend, _install  # noqa: E402


DEV = "cuda"


@pytest.fixture(autouse=True, scope="module")
def _sleep_kernel_loaded():
    """Several tests hold a stream back with torch.cuda._sleep. The first
    launch of a kernel in a process waits on the host for the device's
    work so far (CUDA loads the kernel's module then: on an H200 the first
    sleep of 4e9 cycles took 2.03 s to enqueue), so a test run alone found
    its long kernel over before the case it builds began, and passed
    whatever cgtree did. The sleep's kernel is loaded here, with a sleep of
    one cycle; a test loads the kernels it launches behind a sleep itself."""
    torch.cuda._sleep(1)
    torch.cuda.synchronize()


def fresh():
    torch._dynamo.reset()


def kept_is_right_or_raises(kept):
    """The promise: every output kept across calls either equals what eager
    computed for it, or raises StaleTensorError on access. Returns how many
    raised."""
    raised = 0
    for got, want in kept:
        try:
            value = got.clone()
        except RuntimeError as e:
            assert "StaleTensorError" in str(e), str(e)
            raised += 1
            continue
        assert torch.equal(value, want), "a kept output was silently overwritten"
    return raised


def run_and_keep(fn, make_inputs, calls=8):
    """Calls the cgtree-compiled fn `calls` times, keeping every output
    (lists and dicts included) beside what eager computes."""
    fresh()
    cg = torch.compile(fn, backend="cgtree")
    kept = []
    with torch.no_grad():
        for i in range(calls):
            args = make_inputs(i)
            want = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            got = cg(*args)
            flat_got, flat_want = flatten(got), flatten(want)
            assert len(flat_got) == len(flat_want)
            kept.extend(zip(flat_got, [w.clone() for w in flat_want]))
    return kept


def flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [v for k in sorted(out) for v in flatten(out[k])]
    return [v for o in out for v in flatten(o)]


def one_segment(x):
    return x * 2 + 1


def several_segments(x):
    a = torch.sin(x) + 1
    torch._dynamo.graph_break()
    b = a * 3
    torch._dynamo.graph_break()
    return b - 1


def views_of_an_intermediate(x):
    a = x * 3
    return a.view(-1), a[1:], a.t()


def the_same_tensor_twice(x):
    a = x + 5
    return a, a


def in_a_list_and_a_dict(x):
    a = x.cos()
    torch._dynamo.graph_break()
    return [a, {"b": a * 2, "c": [a + 1]}]


@pytest.mark.parametrize("fn", [one_segment, several_segments, views_of_an_intermediate, the_same_tensor_twice,
                                in_a_list_and_a_dict], ids=lambda f: f.__name__)
def test_outputs_kept_across_calls_are_right_or_raise_in_cold_and_steady_state(fn):
    kept = run_and_keep(fn, lambda i: (torch.full((4, 8), float(i), device=DEV),))
    raised = kept_is_right_or_raises(kept)
    assert raised > 0  # the steady state does reuse memory of kept outputs: the check had something to catch
    assert kept_is_right_or_raises(kept[-len(flatten(fn(torch.zeros(4, 8, device=DEV)))):]) == 0  # the last call's


def replaying_one_segment(x):
    """one_segment compiled, called until it replays."""
    fresh()
    cg = torch.compile(one_segment, backend="cgtree")
    for _ in range(4):
        cg(x)
    return cg


def test_views_made_later_of_a_kept_output_raise_too():
    x = torch.ones(16, device=DEV)
    cg = replaying_one_segment(x)
    y = cg(x)
    v = y[2:].view(2, 7)
    cg(x * 2)
    for t in (y, v, y[1:]):
        with pytest.raises(RuntimeError, match="StaleTensorError"):
            print(t)
    assert ct.stats()["outputs_marked_stale"] >= 1


def test_an_explicit_step_begin_makes_kept_outputs_raise():
    fresh()
    cg = torch.compile(one_segment, backend="cgtree")
    x = torch.ones(16, device=DEV)
    for _ in range(4):
        y = cg(x)
    want = y.clone()
    ct.step_begin()
    assert torch.equal(y, want)  # the step begins at the next call, as at PyTorch's mark
    cg(x)
    with pytest.raises(RuntimeError, match="StaleTensorError"):
        y.sum().item()


def test_the_y_equals_f_of_x_loop_never_raises():
    fresh()
    cg = torch.compile(several_segments, backend="cgtree")
    x = torch.randn(1024, device=DEV)
    want = several_segments(x)
    y = None
    for _ in range(20):
        y = cg(x)
        torch.testing.assert_close(y, want)


def recurrent_block(ws):
    """A step of a recurrent state: two graphs, split by a graph break."""
    def f(x):
        h = torch.nn.functional.gelu(x @ ws[0])
        torch._dynamo.graph_break()
        return x + 0.1 * torch.tanh(h @ ws[1])
    return f


def test_the_x_equals_f_of_x_loop_feeds_each_output_into_the_next_call_as_eager_does():
    """x = f(x): each call's argument is an output of the step that call
    ends. It is moved out of the pool before the new step's work
    (stale.c): the loop computes Inductor's numbers bit for bit, replays,
    and the object the call read stays right. It raised StaleTensorError
    at the third call before the move."""
    fresh()
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(64, 64, generator=g) / 8).to(DEV) for _ in range(2)]
    x0 = torch.randn(8, 64, generator=g).to(DEV)
    f = recurrent_block(ws)
    ind, cg = torch.compile(f), torch.compile(f, backend="cgtree")
    want, x = [], x0.clone()
    with torch.no_grad():
        for _ in range(12):
            x = ind(x)
            want.append(x.clone())
        before = ct.stats()
        x = x0.clone()
        for i in range(12):
            prev = x
            x = cg(x)
            assert torch.equal(x, want[i]), i
            if i:
                assert torch.equal(prev, want[i - 1]), "the moved argument reads right"
        torch.testing.assert_close(x, f(want[-2]))
    after = ct.stats()
    assert after["arguments_moved"] - before["arguments_moved"] >= 8
    assert after["replays"] - before["replays"] >= 12


def test_an_output_of_the_step_before_read_only_after_a_graph_break_raises_stale():
    """The move is the call's first graph's: an output of the step before
    that only a later graph of the call reads (after the first graph began
    the step and ran) may lie where that graph's outputs went, so it
    raises StaleTensorError, never computes with it."""
    fresh()

    def g(x, h):
        y = x * 2
        torch._dynamo.graph_break()
        return y + h

    cg = torch.compile(g, backend="cgtree")
    x = torch.randn(256, device=DEV)
    h = torch.zeros(256, device=DEV)
    with torch.no_grad():
        for _ in range(3):
            cg(x, h)  # warm up and record with h the caller's
        h = cg(x, h)
        with pytest.raises(ct.StaleTensorError):
            cg(x, h)


def test_an_output_moved_into_the_next_call_keeps_its_version_for_an_eager_op_that_saved_it():
    """A frozen compiled trunk's output h (an inference graph: nothing holds
    its step), read by an eager layer that saves it for its backward, then
    by a frozen compiled head (an inference graph too, so h holds no step
    for it, as it would for a training forward's call) whose call begins a
    step: h is moved into the head's call, its autograd version kept, so the
    eager layer's backward reads the same numbers it saved and does not
    raise autograd's "modified by an inplace operation" (set_ alone bumps
    the version). Gradients as eager's."""
    fresh()
    torch.manual_seed(0)
    trunk = torch.nn.Linear(32, 32).to(DEV).requires_grad_(False)
    side = torch.nn.Linear(32, 1).to(DEV)
    head = torch.nn.Linear(32, 1).to(DEV).requires_grad_(False)
    ct_trunk, ct_head = torch.compile(trunk, backend="cgtree"), torch.compile(head, backend="cgtree")
    before = ct.stats()
    for i in range(6):
        x = torch.randn(8, 32, device=DEV)
        side.zero_grad(set_to_none=True)
        h = ct_trunk(x)
        (side(h) + ct_head(h)).sum().backward()
        got = [p.grad.clone() for p in side.parameters()]
        side.zero_grad(set_to_none=True)
        he = trunk(x)
        (side(he) + head(he)).sum().backward()
        for g, p in zip(got, side.parameters()):
            torch.testing.assert_close(g, p.grad)
    assert ct.stats()["arguments_moved"] - before["arguments_moved"] >= 3


def test_a_stale_output_passed_back_raises_stale_tensor_error_also_through_a_view():
    x = torch.randn(256, device=DEV)
    cg = replaying_one_segment(x)
    y1 = cg(x)
    v = y1[1:]
    cg(x)
    with pytest.raises(ct.StaleTensorError):
        cg(y1)
    with pytest.raises(ct.StaleTensorError):
        cg(v)


def test_an_output_that_is_a_view_of_an_input_aliases_the_callers_tensor_as_in_eager():
    def f(x):
        return x.view(-1), x[1:]

    fresh()
    cg = torch.compile(f, backend="cgtree")
    for _ in range(5):
        x = torch.randn(4, 4, device=DEV)
        flat, tail = cg(x)
        assert flat.data_ptr() == x.data_ptr() and tail.data_ptr() == x[1:].data_ptr()
        x.add_(1)  # eager: the views see it
        assert torch.equal(flat, x.view(-1)) and torch.equal(tail, x[1:])
        cg(torch.randn(4, 4, device=DEV))  # a later call does not touch them
        assert torch.equal(flat, x.view(-1))


def test_outputs_that_alias_each_other_or_a_parameter_keep_that_aliasing():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4, device=DEV))

        def forward(self, x):
            a = x @ self.w
            return a, a.view(-1), self.w.t()

    fresh()
    m = M()
    cg = torch.compile(m, backend="cgtree")
    with torch.no_grad():
        for _ in range(5):
            a, flat, wt = cg(torch.randn(4, 4, device=DEV))
        assert a.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        a.add_(1)
        assert torch.equal(flat, a.view(-1))
        assert wt.data_ptr() == m.w.data_ptr()
        m.w.mul_(2)
        assert torch.equal(wt, m.w.t())


def test_a_view_of_an_output_passed_back_in_the_same_step_works():
    def f(x):
        a = x * 2
        torch._dynamo.graph_break()
        v = a[1:]
        torch._dynamo.graph_break()
        return v + 1

    fresh()
    cg = torch.compile(f, backend="cgtree")
    for i in range(6):
        x = torch.full((8,), float(i), device=DEV)
        torch.testing.assert_close(cg(x), f(x))


MUTATIONS = textwrap.dedent('''
    import cgtree.torch as ct
    import torch, triton, triton.language as tl

    @triton.jit
    def add_one(ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(ptr + i, tl.load(ptr + i, mask=i < n) + 1, mask=i < n)

    from torch_patterns import foreach, iadd, setitem

    def user_triton(x):
        add_one[(1,)](x, x.numel(), BLOCK=64)
        return x * 3

    def check(name, fn, make, calls=5):
        torch._dynamo.reset()
        eager_args, cg_args = make(), make()
        cg = torch.compile(fn, backend="cgtree")
        for i in range(calls):
            want = fn(*eager_args)
            got = cg(*cg_args)
            flat = lambda a: [t for x in a for t in (x if isinstance(x, list) else [x]) if isinstance(t, torch.Tensor)]
            for w, g in zip(flat(eager_args) + [want], flat(cg_args) + [got]):
                assert torch.equal(w, g), (name, i)
        print("OK", name)

    dev = "cuda"
    with torch.no_grad():
        check("iadd", iadd, lambda: (torch.ones(64, device=dev), torch.ones(64, device=dev)))
        check("foreach", foreach, lambda: ([torch.ones(8, device=dev), torch.ones(8, device=dev)],
                                           [torch.ones(8, device=dev), torch.ones(8, device=dev)]))
        check("setitem", setitem, lambda: (torch.zeros(4, 8, device=dev), 2, torch.ones(8, device=dev)))
        check("user_triton", user_triton, lambda: (torch.zeros(64, device=dev),))
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm1d(8).to(dev).train()
        bn_eager = torch.nn.BatchNorm1d(8).to(dev).train()
        bn_eager.load_state_dict(bn.state_dict())
        cg = torch.compile(bn, backend="cgtree")
        for i in range(5):
            x = torch.randn(16, 8, device=dev)
            torch.testing.assert_close(cg(x), bn_eager(x))
        for k in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(bn, k), getattr(bn_eager, k))
        print("OK batchnorm_train")
    print("STATS", ct.stats()["replays"])
''')


def test_mutations_apply_exactly_once_per_call_in_a_cold_and_a_warm_process(tmp_path):
    """x += y, _foreach_add_, setitem, a user Triton kernel writing its
    input, BatchNorm's running statistics in train mode: each compared with
    eager after every call, in two fresh processes sharing Inductor's
    caches (the warm one is where name scans and AOTAutograd's cache hid
    mutations)."""
    here = os.path.dirname(os.path.abspath(__file__))  # torch_patterns.py
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([here] + [p for p in sys.path if p]))
    script = tmp_path / "mutations.py"  # Triton's @jit wants its source in a file
    script.write_text(MUTATIONS)
    for run in ("cold", "warm"):
        r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, (run, r.stdout[-2000:], r.stderr[-4000:])
        for name in ("iadd", "foreach", "setitem", "user_triton", "batchnorm_train"):
            assert "OK " + name in r.stdout, (run, name, r.stdout[-2000:])
        replays = int([ln for ln in r.stdout.splitlines() if ln.startswith("STATS")][0].split()[1])
        assert replays > 0, run


def test_graphs_that_draw_random_numbers_give_inductors_numbers_for_the_same_seed():
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)

    fresh()
    ref = torch.compile(f, backend="inductor")
    cg = torch.compile(f, backend="cgtree")
    x = torch.ones(4096, device=DEV)
    torch.manual_seed(7)
    want = [ref(x).clone() for _ in range(8)]
    replays = ct.stats().get("replays", 0)
    torch.manual_seed(7)
    got = [cg(x).clone() for _ in range(8)]  # kept across calls: cloned
    assert ct.stats()["replays"] - replays >= 5  # recorded and replayed, not run plainly
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    assert not torch.equal(got[-1], got[-2])


def test_eager_memory_is_per_device_and_stream_and_bounded_over_many_sizes():
    import random

    rng = random.Random(0)
    sizes = [rng.randrange(1, 1 << 20) for _ in range(1000)]
    base = ct.memory_stats()
    live = []
    for i in range(10000):
        live.append(torch.empty(sizes[i % 1000], dtype=torch.uint8, device=DEV))
        if len(live) > 64:
            live.pop(rng.randrange(len(live)))
    del live
    torch.cuda.synchronize()
    m = ct.memory_stats()
    assert m["eager_allocations"] - base["eager_allocations"] >= 10000
    assert m["eager_in_use"] <= base["eager_in_use"] + 4096
    # At most 65 live blocks of under 1 MiB each at any time, plus what the front cache keeps (its
    # bound): what the pool reserves stays near that.
    assert m["front_cache_bytes"] <= m["front_cache_limit"]
    assert m["device_reserved"] - base["device_reserved"] < (256 << 20) + m["front_cache_limit"]
    ct.empty_cache()
    after = ct.memory_stats()
    assert after["front_cache_bytes"] == 0
    assert after["device_reserved"] <= m["device_reserved"]


def test_reset_peak_restarts_the_reserved_high_water_mark_from_what_is_reserved_now():
    big = torch.empty(512 << 20, dtype=torch.uint8, device=DEV)  # 512 MiB, over the front cache's bound
    del big
    ct.empty_cache()  # the driver's pool gives it back to the device
    assert ct.memory_stats()["device_reserved_peak"] >= 512 << 20
    ct.reset_peak()
    m = ct.memory_stats()
    assert m["device_reserved_peak"] < 512 << 20 and m["device_reserved_peak"] >= m["device_reserved"]


def test_record_stream_keeps_a_block_from_another_stream_until_its_work_is_done():
    side = torch.cuda.Stream()
    x = torch.ones(1 << 22, device=DEV)  # 16 MiB
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # a long kernel on the side stream...
        y = x * 2  # ...then one that reads x
    before = ct.memory_stats()["recorded_streams"]
    x.record_stream(side)
    assert ct.memory_stats()["recorded_streams"] == before + 1
    del x  # freed while the side stream still has to read it
    z = torch.zeros(1 << 22, device=DEV)  # same size, same stream: may reuse x's block, after the side's work
    z.fill_(-1)
    side.synchronize()
    torch.cuda.synchronize()
    assert torch.all(y == 2)  # the side stream read 1s, not z's -1s


def test_a_record_stream_refused_for_want_of_host_memory_waits_for_the_streams_work_before_it_raises():
    """x is read on a side stream, then x.record_stream(side), as PyTorch
    asks. Out of host memory the record's note cannot grow and the call
    raises; x then dies with nothing to keep its block from the next
    allocation of its stream (the front cache), while the side stream
    still reads it (a helper's fault loop). So the host waits for the side
    stream's work before the call raises (records_refused_synced): it is
    done when the error comes, and y read x's ones, not z's -1s. (On an
    H200 the side stream was done there even with cgtree's wait taken
    out: the test ran alone, and its sleep and product were the process's
    first, whose launches wait on the host: _sleep_kernel_loaded.)"""
    from cgtree import _torch_ext

    side = torch.cuda.Stream()
    before = ct.memory_stats()  # first: reading the figures may wait for the device
    x = torch.ones(1 << 22, device=DEV)
    x * 2  # the product's kernel loaded: a first launch waits on the host, as _sleep_kernel_loaded says
    torch.cuda.synchronize()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(4_000_000_000)  # a kernel of about 2 s on the side stream...
        y = x * 2  # ...then one that reads x
    _torch_ext._fail_host_alloc(1)  # the note's list of streams is the block's first allocation
    began = time.perf_counter()
    try:
        with pytest.raises((MemoryError, RuntimeError)):
            x.record_stream(side)
    finally:
        left = _torch_ext._fail_host_alloc(0)
    took = time.perf_counter() - began
    assert left == 0, "record_stream allocated nothing: the case is not reached"
    assert side.query(), "the side stream's work was not done when record_stream raised (%.3f s)" % took
    after = ct.memory_stats()
    assert after["records_refused"] == before["records_refused"] + 1
    assert after["records_refused_synced"] == before["records_refused_synced"] + 1
    del x
    z = torch.zeros(1 << 22, device=DEV)  # may reuse x's block: its reader is done
    z.fill_(-1)
    torch.cuda.synchronize()
    assert torch.all(y == 2)


def test_pytorchs_record_stream_calls_reach_the_allocator_through_the_hook_and_tensors_method_is_pytorchs():
    from cgtree.torch import _record_stream

    assert ct.stats()["record_stream_hook"] == 1, _install._state["record_stream_hook"]
    assert torch.Tensor.record_stream is _record_stream._tensor_record_stream  # not wrapped: the hook sees it


class _SideStreamNode(torch.autograd.Function):
    """Called under torch.cuda.stream(side): autograd runs its backward
    there too, so the gradient it makes is a block of the side stream."""

    @staticmethod
    def forward(ctx, y):
        return y * 1

    @staticmethod
    def backward(ctx, g):
        return g * 3


class _SlowReaderNode(torch.autograd.Function):
    """Called on the default stream; its backward holds that stream back
    with a long kernel, then reads the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        torch.cuda._sleep(300_000_000)
        return g * 2


def test_a_gradient_made_on_a_side_stream_and_read_on_the_callers_is_not_reused_before_the_read():
    """Autograd's engine runs each backward node on its forward's stream. A
    gradient _SideStreamNode makes on the side stream is consumed by
    _SlowReaderNode on the default stream, and the engine records it there
    (recordStream, from C++). Freed once the reader's backward returns, its
    block must not go to the side stream's next allocation of its size while
    the default stream (held back by a long kernel) has still to read it.
    Without the hook PyTorch dropped the record, the side stream's fill
    overwrote the gradient first, and x.grad came out -2 instead of 6."""
    side = torch.cuda.Stream()
    n = 1 << 20  # 4 MiB of float32: a size the front cache serves
    x = torch.ones(n, device=DEV, requires_grad=True)
    y = _SlowReaderNode.apply(x)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss = _SideStreamNode.apply(y).sum()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    before = ct.memory_stats()["recorded_streams"]
    loss.backward()
    with torch.cuda.stream(side):
        junk = torch.full((n,), -1.0, device=DEV)  # the side stream's next block of that size
    torch.cuda.synchronize()
    assert torch.equal(x.grad, torch.full_like(x, 6.0)), "the gradient was reused before its read: %s" % x.grad[:4]
    assert ct.memory_stats()["recorded_streams"] > before  # the engine's record came through
    del junk


def test_an_output_a_copy_stream_reads_after_record_stream_is_not_overwritten_by_the_next_replay_first():
    """A compiled graph's output copied to the host on a copy stream, with
    record_stream(copy) as PyTorch asks of memory another stream reads: the
    next call's replay writes that memory again on the tree's stream, and
    waits for the copy (pool_readers.c). Without the wait the copy, held
    back by a long kernel, read the next call's 3s instead of 1s."""
    fresh()
    cg = torch.compile(lambda x: x * 2 + 1, backend="cgtree")
    copy = torch.cuda.Stream()
    n = 1 << 22
    x0, x1 = torch.zeros(n, device=DEV), torch.ones(n, device=DEV)
    host = torch.empty(n, pin_memory=True)
    with torch.no_grad():
        for _ in range(4):
            cg(x0)
        before = ct.memory_stats()["pool_reader_waits"]
        out = cg(x0)  # a replay: 1s
        copy.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy):
            torch.cuda._sleep(300_000_000)
            host.copy_(out, non_blocking=True)
        out.record_stream(copy)
        del out
        nxt = cg(x1)  # the same node's replay: 3s where out was
        torch.cuda.synchronize()
    assert torch.all(host == 1.0), "the next replay overwrote the output before the copy stream read it"
    assert torch.all(nxt == 3.0)
    m = ct.memory_stats()
    assert m["pool_reader_waits"] == before + 1, (m["pool_reader_waits"] - before, m["pool_reader_streams"],
                                                  ct.stats()["replays"])


def test_a_caller_that_switches_streams_is_waited_for_before_the_next_replay_overwrites_its_output():
    """Calls from two streams: the first call's output, copied to the host
    on its own stream behind a long kernel, is the caller's on s1, as under
    plain Inductor, where its block is reused on s1 only. The next call,
    from s2, replays into that memory: the tree waits for s1 first
    (pool_readers.c, tx_pool_readers_caller). Without the wait the copy
    read the next call's 3s instead of 1s (a helper's audit)."""
    fresh()
    cg = torch.compile(lambda x: x * 2 + 1, backend="cgtree")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    n = 1 << 22
    x0, x1 = torch.zeros(n, device=DEV), torch.ones(n, device=DEV)
    host = torch.empty(n, pin_memory=True)
    s1.wait_stream(torch.cuda.current_stream())
    s2.wait_stream(torch.cuda.current_stream())
    with torch.no_grad():
        for i in range(4):
            with torch.cuda.stream(s2 if i % 2 else s1):
                cg(x0)
        torch.cuda.synchronize()
        replays = ct.stats()["replays"]
        with torch.cuda.stream(s1):
            out = cg(x0)  # a replay: 1s
            torch.cuda._sleep(300_000_000)
            host.copy_(out, non_blocking=True)
        del out  # plain Inductor's block would wait on s1 for its next use
        with torch.cuda.stream(s2):
            nxt = cg(x1)  # the same node's replay: 3s where out was
        torch.cuda.synchronize()
    assert ct.stats()["replays"] == replays + 2
    assert torch.all(host == 1.0), "the replay from s2 overwrote the output before s1's copy read it"
    assert torch.all(nxt == 3.0)


def test_without_its_hook_cgtree_warns_at_install_and_still_sees_tensor_record_stream():
    code = textwrap.dedent("""
        import warnings
        import torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import cgtree.torch as ct
        said = [str(w.message) for w in caught if "recordStream" in str(w.message)]
        assert len(said) == 1 and "CGTREE_TORCH_RECORD_STREAM_HOOK=0" in said[0], said
        assert ct.stats()["record_stream_hook"] == 0
        side = torch.cuda.Stream()
        x = torch.ones(1024, device="cuda")
        before = ct.memory_stats()["recorded_streams"]
        x.record_stream(side)
        x.record_stream(side)  # kept once
        assert ct.memory_stats()["recorded_streams"] == before + 1
        print("ok")
    """)
    env = dict(os.environ, CGTREE_TORCH_RECORD_STREAM_HOOK="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tree_of_the_second_device_made_while_the_first_is_current_orders_a_side_streams_calls():
    """A tree's two events, which order a caller on a side stream with the
    tree's stream, were made on whichever device was current when the tree
    was (cuda:0 here, for a model on cuda:1), and CUDA refuses to record an
    event of one device on another's stream: the calls from cuda:1's side
    stream went unordered (a review). Here each call's input is written on
    the side stream behind a long kernel: an unordered replay read the
    input before the write."""
    fresh()
    torch.cuda.set_device(0)
    cg = torch.compile(lambda x: x * 2 + 1, backend="cgtree")
    n = 1 << 22
    x = torch.zeros(n, device="cuda:1")
    with torch.no_grad():
        cg(x)  # the tree of cuda:1 is made here, with cuda:0 current
        side = torch.cuda.Stream(device="cuda:1")
        side.wait_stream(torch.cuda.current_stream("cuda:1"))
        host = torch.empty(n, pin_memory=True)
        for i in range(1, 6):
            with torch.cuda.stream(side):  # cuda:1 current inside, as PyTorch's context makes it
                torch.cuda._sleep(100_000_000)
                x.fill_(float(i))
                host.copy_(cg(x), non_blocking=True)
            side.synchronize()
            assert torch.all(host == 2 * i + 1), "call %d read its input before the side stream wrote it" % i
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_two_devices_never_share_a_block_and_each_device_counts_its_own():
    a = [torch.full((1000,), 1.0, device="cuda:0") for _ in range(50)]
    b = [torch.full((1000,), 2.0, device="cuda:1") for _ in range(50)]
    del a[::2], b[::2]
    c = [torch.full((1000,), 3.0, device="cuda:1") for _ in range(25)]  # reuses cuda:1's blocks only
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert all(t.device.index == 0 and torch.all(t == 1) for t in a)
    assert all(t.device.index == 1 and torch.all(t == 2) for t in b)
    assert all(torch.all(t == 3) for t in c)
    ptrs0 = {t.data_ptr() for t in a}
    assert not ptrs0 & {t.data_ptr() for t in b + c}
    assert ct.memory_stats(1)["device_in_use"] >= 50 * 4096
    m1 = torch.nn.Linear(64, 64).to("cuda:1").eval()
    cg = torch.compile(m1, backend="cgtree")
    x = torch.randn(8, 64, device="cuda:1")
    with torch.no_grad():
        for _ in range(5):
            torch.testing.assert_close(cg(x), m1(x))


stream_is_non_blocking = torch_gpu.stream_is_non_blocking


def test_two_threads_calling_compiled_models_at_once_get_correct_results():
    """Each thread in explicit step mode gets a tree of its own, in explicit
    mode, on a non-blocking stream the tree made (docs/torch.md, Threads
    and explicit steps), not one of PyTorch's pool of 32 per device, which
    torch.cuda.Stream() hands every caller round and round: another
    thread's work on it would join the tree's captures (a helper's audit).
    The main thread's tree, in the default mode, is on a blocking one."""
    fresh()
    models = [torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU()).to(DEV).eval() for _ in range(2)]
    compiled = [torch.compile(m, backend="cgtree") for m in models]
    with torch.no_grad():  # compiled here: Dynamo's tracing is not thread-safe (FX's tracing flag is global)
        for m in compiled:
            m(torch.randn(32, 128, device=DEV))
    errors, trees = [], {}
    main_tree = _install.tree_for(0)[0]
    assert not main_tree.explicit_steps and not stream_is_non_blocking(main_tree.stream)

    def work(k):
        try:
            ct.set_step_mode("explicit")
            x = torch.randn(32, 128, device=DEV)
            want = models[k](x)
            with torch.no_grad():
                for _ in range(40):
                    ct.step_begin()
                    y = compiled[k](x)
                    a = y + 0  # reads it before this thread's next step
                    torch.testing.assert_close(a, want)
            tree = _install.tree_for(0)[0]
            trees[k] = (tree, tree.explicit_steps, stream_is_non_blocking(tree.stream))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert trees[0][0] is not trees[1][0] and main_tree not in (trees[0][0], trees[1][0])
    assert [trees[k][1:] for k in (0, 1)] == [(True, True), (True, True)], "explicit steps, non-blocking streams"
    pytorchs = {torch.cuda.Stream(device=DEV).cuda_stream for _ in range(64)}  # the pool, twice round
    assert not pytorchs & {trees[k][0].stream for k in (0, 1)}, "a tree's stream is one PyTorch hands out"
    s = ct.stats()
    assert s["trees"] + s["trees_freed"] >= 2  # the threads' trees, freed or not yet


_slow_copy_signals = {}  # "inside": set once slow_copy's Python runs, before it reads


def _slow_copy_op():
    """cgtree_test::slow_copy: x.clone() after 0.1 s of Python, which lets
    the GIL go between a call's look-up of its arguments and its read of x,
    as a warmup or a recording of any graph may (they run its Python).
    Defined once per process."""
    if "op" not in _slow_copy_signals:
        @torch.library.custom_op("cgtree_test::slow_copy", mutates_args=())
        def slow_copy(x: torch.Tensor) -> torch.Tensor:
            inside = _slow_copy_signals.get("inside")
            if inside is not None:
                inside.set()
            time.sleep(0.1)
            return x.clone()

        @slow_copy.register_fake
        def _(x):
            return torch.empty_like(x)

        _slow_copy_signals["op"] = slow_copy
    return _slow_copy_signals["op"]


def test_another_threads_call_that_reads_an_output_keeps_the_owners_step_from_ending_until_it_returned():
    """Thread A hands y = enc(x) to thread B and begins its next step at
    once; B's dec(y) runs Python between its look-up of y and its read (its
    warmup and its recording run slow_copy's 0.1 s of Python). Before, A's
    step ended meanwhile and marked y: B's read raised where Inductor
    computes (or, where B's copy read y by address, took A's next output).
    Now A's step ends only once B's call returned: every z is eager's, and
    A's steps waited for B's calls."""
    fresh()
    slow_copy = _slow_copy_op()
    enc = torch.compile(lambda x: x * 3 + 1, backend="cgtree")
    dec = torch.compile(lambda y: slow_copy(y) * 2, backend="cgtree")
    x0 = torch.zeros(1 << 16, device=DEV)
    with torch.no_grad():  # compiled here: Dynamo's tracing is not thread-safe
        dec(enc(x0))
    torch.cuda.synchronize()
    import queue

    handed, taken, errors, got = queue.Queue(), queue.Queue(), [], []
    inside, done = threading.Event(), [-1]  # done[0]: the last round whose dec(y) returned
    waits_before = _ext.alloc_figures(0)["pool_reader_waits_for_calls"]
    rounds = 8

    def a():
        try:
            ct.set_step_mode("explicit")
            x = torch.empty(1 << 16, device=DEV)
            with torch.no_grad():
                for i in range(rounds):
                    ct.step_begin()  # ends the step of the y B may still read
                    x.fill_(float(i))
                    handed.put((i, enc(x)))
                    assert taken.get(timeout=10) == i  # B took y and calls dec(y) now
                    deadline = time.monotonic() + 5
                    while not (inside.is_set() or done[0] >= i) and time.monotonic() < deadline:
                        time.sleep(0.001)  # B's call is under way, or over: go on at once
                    inside.clear()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("A: " + repr(e))

    def b():
        try:
            ct.set_step_mode("explicit")
            with torch.no_grad():
                for _ in range(rounds):
                    i, y = handed.get(timeout=10)
                    ct.step_begin()
                    taken.put(i)
                    z = dec(y)
                    del y
                    done[0] = i
                    got.append((i, z.clone()))
                    del z
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("B: " + repr(e))
            taken.put(-1)

    _slow_copy_signals["inside"] = inside
    try:
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        _slow_copy_signals["inside"] = None
        while not handed.empty():  # no output of A's tree outlives the test, failed or not
            handed.get()
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert [i for i, _ in got] == list(range(rounds))
    for i, z in got:
        assert torch.equal(z, torch.full_like(z, 2.0 * (3 * i + 1))), "B's dec(y) read A's next output (round %d)" % i
    assert _ext.alloc_figures(0)["pool_reader_waits_for_calls"] > waits_before, "no step of A waited for B's call"


def orphaned(trees, seconds=10.0):
    """Waits until each tree is orphaned: a thread's trees are orphaned when
    its OS thread is gone (PyTorch's thread-local stash lets go of them
    then), which comes a little after join()."""
    deadline = time.monotonic() + seconds
    while not all(t.orphaned for t in trees) and time.monotonic() < deadline:
        time.sleep(0.01)
    return all(t.orphaned for t in trees)


def test_a_thread_per_request_keeps_only_live_threads_trees_and_an_output_it_handed_back_reads_right():
    """A server that runs a compiled model on a new thread per request: each
    thread's tree (pool, graphs, stream) is freed once the thread exited and
    no output of it lives. An output a thread handed back reads right until
    it dies, and keeps its tree until then; after 12 requests the device
    memory cgtree holds is what it held after 2."""
    fresh()
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(DEV)
    model.eval()
    cg = torch.compile(model, backend="cgtree")
    x = torch.randn(64, 256, device=DEV)
    with torch.no_grad():
        want = model(x)
    handed = []

    def request():
        with torch.no_grad():
            for _ in range(4):  # warm-up, recording, replays
                y = cg(x)
        (tree,) = ct._install.thread_trees()
        s = tree.stats()
        assert s["recordings"] >= 1 and s["pool_reserved_bytes"] >= 2 << 20  # a chunk at least
        handed.append((y, tree))

    def serve():
        t = threading.Thread(target=request)
        t.start()
        t.join()
        return handed.pop()

    kept, first = serve()
    assert orphaned([first])
    ct.empty_cache()  # frees what it can: not this tree, which kept names
    assert not first.closed
    torch.testing.assert_close(kept, want)
    del kept
    ct.empty_cache()
    assert first.closed and first.stats()["recordings"] >= 1 and first.stats()["pool_reserved_bytes"] == 0
    y, second = serve()
    del y
    assert orphaned([second])
    ct.empty_cache()
    assert second.closed
    torch.cuda.synchronize()
    live_after_2, freed_after_2 = ct.stats()["trees"], ct.stats()["trees_freed"]
    held_after_2 = ct.memory_stats()["reserved_bytes.all.current"]
    free_after_2 = torch.cuda.mem_get_info()[0]
    events_after_2 = _ext.alloc_figures(0)["events_live"]
    later = []
    for _ in range(10):
        y, tree = serve()
        later.append(tree)
        torch.testing.assert_close(y, want)  # Inductor's kernels against eager's
        del y
    assert orphaned(later)
    ct.empty_cache()
    assert all(t.closed for t in later)
    torch.cuda.synchronize()
    s = ct.stats()
    assert s["trees"] == live_after_2 and s["trees_freed"] == freed_after_2 + 10
    assert not any(t in ct._install.trees() for t in [first, second] + later)
    assert ct.memory_stats()["reserved_bytes.all.current"] <= held_after_2
    assert torch.cuda.mem_get_info()[0] >= free_after_2 - (8 << 20)  # 10 pools of 2 MiB or more, were they kept
    assert _ext.alloc_figures(0)["events_live"] == events_after_2  # a freed tree's two CUDA events went with it


def test_a_tree_dropped_without_being_closed_gives_back_its_cuda_events():
    """A tree that never ran (a test's, or one whose thread made none) is
    deallocated without being closed: its two CUDA events go with it."""
    before = _ext.alloc_figures(0)["events_live"]
    trees = [_ext.Tree(0) for _ in range(4)]
    assert _ext.alloc_figures(0)["events_live"] == before + 8
    del trees
    assert _ext.alloc_figures(0)["events_live"] == before


def test_torch_cond_with_a_device_predicate_matches_inductor():
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    fresh()
    ref = torch.compile(f, backend="inductor")
    cg = torch.compile(f, backend="cgtree")
    for i in range(6):
        x = torch.randn(1024, device=DEV) + (1 if i % 2 else -1)
        torch.testing.assert_close(cg(x), ref(x))


def test_a_graph_that_writes_an_output_of_a_graph_whose_capture_failed_writes_that_output_itself():
    """torch.cond's device predicate is a host sync, so its graph's capture
    fails, and that one run's output lies in cgtree's side pool, which the
    tree passes on through a copy. The next graph writes the output in place
    (y.mul_(2)): the write must land in y, as in eager, not in the copy."""
    def f(x):
        y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
        torch._dynamo.graph_break()
        y.mul_(2)
        return y

    fresh()
    first = len(_backend._segments)
    cg = torch.compile(f, backend="cgtree")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x = torch.randn(1024, device=DEV) + (1 if i % 2 else -1)
            torch.testing.assert_close(cg(x), f(x.clone()), msg="call %d" % i)
    reasons = [s.info["plain_reason"] or "" for s in _backend._segments[first:]]
    assert any("capture failed" in r for r in reasons), reasons  # the case this test is about did happen
    said = [str(c.message) for c in caught if "writes into an output of a run cgtree made eagerly" in str(c.message)]
    assert len(said) == 1, [str(c.message) for c in caught]


@pytest.mark.parametrize("use", ["read_at_an_offset", "returned_view", "returned_as_another_dtype"])
def test_a_view_of_an_output_of_a_graph_whose_capture_failed_is_read_and_returned_as_inductor_does(use):
    """The run whose capture failed (torch.cond's device predicate is a host
    sync) lies in cgtree's side pool, which a recorded graph reads through a
    placeholder copy. A view of that output at an offset, made before the
    graph break, must be read where it lies (it was read at the copy's
    first bytes), and a view of it the next graph returns, in its own dtype
    or another, must see the program's later writes to the output (it lay
    over the copy): the simulator's
    test_a_graph_that_reads_an_output_of_an_eager_run_reads_it_and_returns_it_as_inductor_does
    (its reads at an offset, of a view returned, and of one returned as
    another dtype) on a GPU. (A STATIC input at a new address at every call does not reach
    the side pool here: update in place keeps the tree at a few nodes.)"""
    def f(x):
        y = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
        v = y[8:]
        torch._dynamo.graph_break()
        if use == "read_at_an_offset":
            return v * 2 + 1, y
        if use == "returned_view":
            return v[4:], y
        return v.view(torch.int32), y

    fresh()
    first = len(_backend._segments)
    cg = torch.compile(f, backend="cgtree")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(6):
            x = torch.randn(1024, device=DEV) + (1 if i % 2 else -1)
            got, y = cg(x)
            want, y_want = f(x)
            y.add_(1)  # a later write to the output: a view of it sees it, as under Inductor
            y_want.add_(1)
            if use == "returned_as_another_dtype":
                got, want = got.view(torch.float32), want.view(torch.float32)
            torch.testing.assert_close(got, want, msg="call %d" % i)
    reasons = [s.info["plain_reason"] or "" for s in _backend._segments[first:]]
    assert any("capture failed" in r for r in reasons), reasons  # the case this test is about did happen


def test_a_view_of_an_output_of_a_node_past_the_rerecord_limit_is_read_where_it_lies_by_the_next_graph():
    """A graph that writes a buffer passed anew at every call (a mutated
    input is STATIC: its address keys the node) is recorded anew each time
    up to the rerecord limit (32): a recording that never replayed is not
    updated in place (before, each call updated one, for good: 116 updates
    in 120 calls on an H200, and no eager run). Then its node runs eagerly,
    16 calls, and then the graph runs as the plain graph. Meanwhile its
    output lies in cgtree's side pool,
    which a recorded graph reads through a placeholder copy. A view of that
    output at an offset, made eagerly and passed to a second compiled
    function, must be read where it lies: it was read at the copy's first
    bytes (simulator:
    test_a_graph_that_reads_an_output_of_an_eager_run_reads_it_and_returns_it_as_inductor_does)."""
    def scale(x, buf):
        buf.add_(1)
        return x * buf

    def after(v):
        return v * 2 + 1

    fresh()
    first = len(_backend._segments)
    f1 = torch.compile(scale, backend="cgtree")
    f2 = torch.compile(after, backend="cgtree")
    x = torch.randn(16, 64, device=DEV)
    bufs = []  # kept, so that no buffer's address comes back
    before = ct.stats()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(80):
            buf = torch.full((16, 64), float(i), device=DEV)
            bufs.append(buf)
            y = f1(x, buf)
            got = f2(y[:, 8:])
            want = after((x * (i + 1))[:, 8:])
            torch.testing.assert_close(got, want, msg="call %d" % i)
    end = ct.stats()
    seen = {k: end[k] - before[k] for k in ("eager_runs", "recordings", "updates", "replays")}
    # captures bounded (scale's up to the limit, each with after's under it), then the case at hand
    assert seen["eager_runs"] >= 16 and seen["recordings"] <= 72, seen
    reasons = [s.info["plain_reason"] or "" for s in _backend._segments[first:]]
    assert any("eagerly in 16 of its last 32 calls" in r for r in reasons), reasons  # then scale runs plainly


def test_dynamic_shapes_record_once_per_shape_and_a_budget_bounds_them():
    """torch.compile(dynamic=True): one recording per concrete shape; with a
    budget of 2 graphs, five shapes in turn evict (a warning says so once),
    each shape replays while it lasts, and every result still matches eager. A fresh process: the budget holds
    for trees made after it is set."""
    code = textwrap.dedent("""
        import warnings
        import cgtree.torch as ct
        import torch
        ct.set_budget(max_graphs=2)
        f = torch.compile(lambda x: (x * 2).sin() + x.sum(), backend="cgtree", dynamic=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for i in range(40):  # five shapes, each for four calls in a row, through a budget of two graphs
                x = torch.randn(8 * (1 + (i // 4) % 5), device="cuda")
                torch.testing.assert_close(f(x), (x * 2).sin() + x.sum())
        s = ct.stats()
        evicting = sum("budget is evicting" in str(x.message) for x in w)
        print("STATS", s["evictions"], s["graphs"], s["recordings"], s["replays"], evicting)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("STATS")]
    assert line, r.stderr[-3000:]
    evictions, graphs, recordings, replays, warned = map(int, line[0].split()[1:])
    assert evictions > 0 and graphs <= 2 and recordings >= 5 and replays > 0
    assert warned == 1


def test_the_allocator_sees_a_side_streams_capture_only_while_it_is_open_and_front_caches_outside_it():
    """The eager allocator asks each stream but the legacy one whether it
    captures. A side stream that captures nothing must read as not capturing
    (else every allocation on it would skip the front cache and cost a
    driver call: bench/torch_alloc_cost.py's side-stream figures); inside a
    torch.cuda.graph on it, as capturing, with the capture's id; after it,
    not capturing again. The legacy stream is never asked."""
    s = torch.cuda.Stream()
    dev = torch.cuda.current_device()
    assert _ext.capture_id(dev, 0) == 0
    assert _ext.capture_id(dev, s.cuda_stream) == 0
    n = 1 << 16
    with torch.cuda.stream(s):
        torch.empty(n, device=DEV)  # freed at once: a front-cached block of this size on s
        m0 = ct.memory_stats()
        for _ in range(20):
            t = torch.empty(n, device=DEV)
            del t
        m1 = ct.memory_stats()
    assert m1["front_cache_hits"] - m0["front_cache_hits"] == 20, "a side stream's allocations miss the front cache"
    assert m1["capture_allocations"] == m0["capture_allocations"]
    x = torch.ones(n, device=DEV)
    g = torch.cuda.CUDAGraph()
    ids = []
    with torch.cuda.graph(g, stream=s):
        ids.append(_ext.capture_id(dev, s.cuda_stream))
        y = x + 1
    assert ids[0] not in (0, 2**64 - 1), ids
    assert _ext.capture_id(dev, s.cuda_stream) == 0
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 2.0))
    del g, y


def test_a_graph_captured_with_torch_cuda_graph_keeps_its_memory_from_eager_tensors_made_after_it():
    """Once cgtree.torch is installed its allocator serves every allocation of
    the process, those of a CUDA graph some other code captures with
    torch.cuda.graph included. A temporary that graph freed during its
    capture is still the graph's: every replay writes it. An eager tensor
    allocated after the capture, on the capture's stream and of the
    temporary's size, must not get that memory, or the next replay would
    overwrite it; and the graph's own output must read right after replays.
    The capture's stream held a freed block of that size before the
    capture, which the front cache would hand the graph's temporary."""
    n = 1 << 18
    s = torch.cuda.Stream()
    x = torch.ones(n, device=DEV)
    with torch.cuda.stream(s):
        before = torch.empty(n, device=DEV)
    del before
    made = ct.memory_stats()["capture_allocations"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        tmp = x * 2
        y = tmp + 1
        del tmp
    assert ct.memory_stats()["capture_allocations"] - made >= 2, "the capture's tensors come from the driver"
    with torch.cuda.stream(s):
        z = torch.zeros(n, device=DEV)
        w = torch.zeros(n, device=DEV)
    torch.cuda.synchronize()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 3.0))
    assert torch.equal(z, torch.zeros_like(z)) and torch.equal(w, torch.zeros_like(w)), \
        "a replay of the graph wrote into an eager tensor made after its capture"
    del y  # the graph's output, dropped while the graph lives: its replays still write that memory
    with torch.cuda.stream(s):
        v = torch.zeros(n, device=DEV)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(v, torch.zeros_like(v)), "a replay wrote into an eager tensor made after its output died"
    del g



def test_a_temporary_a_torch_cuda_graph_capture_makes_on_a_side_stream_and_frees_after_the_join_is_right():
    """A capture that forks to a side stream, allocates a temporary there,
    joins back, then frees the temporary (Python drops it after the join):
    the free is on the side stream, whose capture has joined. PyTorch's own
    caching allocator makes no CUDA call at that free; a free node on the
    side stream after the join would leave the capture unjoined, and
    torch.cuda.graph would fail at its end. The graph must replay right, as
    under PyTorch."""
    n = 1 << 18
    s, side = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.ones(n, device=DEV)
    before = ct.memory_stats()["capture_free_nodes"]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        side.wait_stream(s)
        with torch.cuda.stream(side):
            tmp = x * 2
            tmp2 = x * 3
        s.wait_stream(side)
        y = tmp + 1
        tmp2.record_stream(s)  # read on s too: its free is after s's read as well
        z = tmp2 + 1
        del tmp, tmp2
    assert ct.memory_stats()["capture_free_nodes"] - before == 2
    with torch.cuda.stream(s):
        w = torch.zeros(n, device=DEV)  # an eager tensor after the capture: never the graph's memory
    for _ in range(2):
        x.fill_(float(_ + 1))
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(y, 5.0)) and torch.equal(z, torch.full_like(z, 7.0))
    assert torch.equal(w, torch.zeros_like(w))
    del g, y, z


class _NarrowOf(torch.autograd.Function):
    """A custom autograd.Function whose forward returns a view of its input."""

    @staticmethod
    def forward(ctx, x):
        return x[1:]

    @staticmethod
    def backward(ctx, g):
        return torch.nn.functional.pad(g, (1, 0))


@pytest.mark.parametrize("x_grad", [True, False], ids=["x_requires_grad", "x_plain"])
def test_a_custom_autograd_functions_view_of_its_input_is_a_view_of_the_callers_tensor_as_under_inductor(x_grad):
    """The view a custom autograd.Function returns of its input, read within
    its step, and the gradients, equal plain Inductor's; kept past its step
    it reads the caller's tensor as it is now, as Inductor's view does. In
    a training graph AOTAutograd hands that view to the user as the graph
    returned it (custom_function_view), and the graph read a DYNAMIC
    input's copy: the view read the copy, 4..10 where Inductor's read 5..11
    after the caller's later writes, silently (an H100, before
    seg_outputs.c's over_caller_memory)."""
    def f(x, w):
        v = _NarrowOf.apply(x)
        return v, (v * w).sum()

    got = {}
    for backend in ("inductor", "cgtree"):
        fresh()
        cf = torch.compile(f, backend=backend)
        x = torch.arange(8.0, device=DEV).requires_grad_(x_grad)
        w = torch.full((7,), 2.0, device=DEV, requires_grad=True)
        kept, read = [], []
        for step in range(4):
            v, loss = cf(x, w)
            loss.backward()
            kept.append(v)
            read.append(v.detach().clone())
            with torch.no_grad():
                x.add_(1.0)  # a view sees the caller's later writes
        got[backend] = (kept, read, None if x.grad is None else x.grad.clone(), w.grad.clone())
    (kept_i, read_i, xg_i, wg_i), (kept_c, read_c, xg_c, wg_c) = got["inductor"], got["cgtree"]
    for a, b in zip(read_i, read_c):
        assert torch.equal(a, b), (a, b)
    assert (xg_i is None) == (xg_c is None) and (xg_i is None or torch.equal(xg_i, xg_c))
    assert torch.equal(wg_i, wg_c)
    for c, i in zip(kept_c, kept_i):  # past their steps: views of the caller's x, as it is now
        assert torch.equal(c.detach(), i.detach()), (c, i)


class _HalfViewOf(torch.autograd.Function):
    """A custom autograd.Function whose forward returns a view of its input
    as another dtype (float16 over float32: AOTAutograd's
    custom_function_view, which the graph hands to the user itself; a view
    as int32 it regenerates from the input instead)."""

    @staticmethod
    def forward(ctx, x):
        return x.view(torch.float16)[2:]

    @staticmethod
    def backward(ctx, g):
        return None


def test_a_custom_functions_view_as_another_dtype_of_another_threads_output_shows_its_writes_and_goes_stale_with_it():
    """Thread A's compiled enc makes y in A's tree; this thread's compiled
    f returns a view of it as float16 (a custom autograd.Function), which
    as_strided cannot make of y. Made by this thread's tree it lay in the
    copy its graph read: a write to y after the call did not show in it
    (Inductor's view shows it), silently. Such a call runs as the plain
    graph: the view is of y itself, shows the write, and raises
    StaleTensorError once A's next step begins, as y does."""
    fresh()
    from concurrent.futures import ThreadPoolExecutor

    enc = torch.compile(lambda x: x * 3 + 1, backend="cgtree")
    f = torch.compile(lambda y, w: (_HalfViewOf.apply(y), (y * w).sum()), backend="cgtree")
    w = torch.full((64,), 2.0, device=DEV, requires_grad=True)
    x = torch.zeros(64, device=DEV)
    with torch.no_grad():  # both compiled here: Dynamo's tracing is not thread-safe
        y0 = enc(x)
    f(y0.detach().requires_grad_(), w)[1].backward()
    del y0
    torch.cuda.synchronize()

    def a_step(i):  # on A's thread: its tree's next step
        with torch.no_grad():
            x.fill_(float(i))
            return enc(x)

    kept = kept_want = None
    raised = 0
    with ThreadPoolExecutor(max_workers=1) as a, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            y_a = a.submit(a_step, i).result()  # A's next step: the last round's y is stale now
            if kept is not None:  # last round's view: its own value (A's plain first outputs), or it raises
                try:
                    assert torch.equal(kept.detach().clone(), kept_want), (
                        "round %d: the view of A's last output reads other data" % i)
                    assert i <= 2, "round %d: the view of A's last output read on past A's next step" % i
                except RuntimeError as e:
                    assert "StaleTensorError" in str(e), str(e)
                    raised += 1
            y = y_a.detach().requires_grad_()  # A's memory: the same storage
            v, loss = f(y, w)
            loss.backward()
            assert v.dtype == torch.float16
            assert torch.equal(v.detach(), y.detach().view(torch.float16)[2:]), i
            with torch.no_grad():
                y.add_(1.0)  # the program writes y after the call: Inductor's view shows it
            assert torch.equal(v.detach(), y.detach().view(torch.float16)[2:]), (
                "round %d: the view missed a write to the tensor it views" % i)
            kept, kept_want = v, v.detach().clone()
            del y, y_a, v, loss
    assert raised >= 3, "a view of A's output never went stale with it"
    assert any("another thread" in str(m.message) for m in caught), [str(m.message) for m in caught]


def test_another_threads_torch_cuda_graph_capture_survives_this_threads_replays_allocations_tree_close_and_empty_cache():
    """torch.cuda.graph captures in CUDA's global mode: while it is open,
    CUDA refuses potentially unsafe calls from every other thread in global
    mode and breaks the capture (querying or synchronising any stream,
    cudaMallocAsync and cudaFreeAsync on any stream, destroying a graph,
    trimming a pool: bench/foreign_capture_probe.py). cgtree makes such
    calls for itself, so a thread running a compiled model beside one that
    captures used to break that capture. foreign_capture_program.py, in a
    process of its own (a broken capture leaves PyTorch's generator
    believing it captures, which would fail every later test): while thread
    B's capture is open, the main thread replays a compiled model (its first
    call closes an exited thread's tree, whose graphs and pool it frees),
    allocates sizes the front cache never held, small and past the front
    cache's largest, frees them, and empties cgtree's cache. It reads
    nothing on the host until the capture ended (a host read synchronises,
    which breaks any capture in plain PyTorch too)."""
    program = os.path.join(os.path.dirname(__file__), "foreign_capture_program.py")
    p = subprocess.run([sys.executable, program], capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["capture_error"] is None, "this thread broke another thread's capture: " + r["capture_error"]
    assert r["capture_replays_right"], "the other thread's graph replays other numbers"
    assert r["replays_right"], "a replay during another thread's capture gave other numbers"
    assert r["trees_closed_at_the_call"] == 1, "the exited thread's tree was not closed at the call"


def test_cgtree_leaves_the_threads_capture_mode_as_it_found_it():
    """cgtree switches the calling thread to CUDA's thread-local capture
    mode around its own CUDA calls (python/_torch_ext/dev.c) and back; a
    thread in relaxed mode stays in it. Whatever mode the thread was in, a
    compiled call, memory_stats() and empty_cache() leave it in that mode."""
    runtime = pytest.importorskip("cuda.bindings.runtime")
    modes = runtime.cudaStreamCaptureMode
    fresh()
    cg = torch.compile(one_segment, backend="cgtree")
    x = torch.ones(1024, device=DEV)
    for _ in range(4):  # warm-up, recording, replays
        cg(x)

    def mode_now():
        err, mode = runtime.cudaThreadExchangeStreamCaptureMode(modes.cudaStreamCaptureModeGlobal)
        assert err == runtime.cudaError_t.cudaSuccess
        runtime.cudaThreadExchangeStreamCaptureMode(mode)  # put it back
        return mode

    for mode in (modes.cudaStreamCaptureModeGlobal, modes.cudaStreamCaptureModeThreadLocal,
                 modes.cudaStreamCaptureModeRelaxed):
        err, before = runtime.cudaThreadExchangeStreamCaptureMode(mode)
        assert err == runtime.cudaError_t.cudaSuccess
        try:
            y = cg(x)
            assert mode_now() == mode, "a compiled call changed the thread's capture mode"
            ct.memory_stats()
            ct.empty_cache()
            assert mode_now() == mode, "memory_stats() or empty_cache() changed the thread's capture mode"
            torch.testing.assert_close(y, one_segment(x))
        finally:
            runtime.cudaThreadExchangeStreamCaptureMode(before)


def replays():
    return ct.stats()["replays"]


def test_dynamic_shapes_whose_sizes_an_old_hash_confused_each_get_their_own_recording():
    """A dynamic-shape graph gets its sizes as int arguments, hashed into
    the variant. The hash cgtree used before made (8, 100) and (9, 39), or
    (2, 150) and (3, 100), one variant: the second shape replayed the
    first's recording, with its output shape and numbers."""
    fresh()

    def f(x):
        return x.sum(1)

    cg = torch.compile(f, backend="cgtree", dynamic=True)
    r0 = replays()
    for shape in [(8, 100), (9, 39), (2, 150), (3, 100)] * 4:
        x = torch.randn(*shape, device=DEV)
        got = cg(x)
        assert got.shape == (shape[0],), (shape, tuple(got.shape))
        torch.testing.assert_close(got, f(x))
    assert replays() - r0 >= 8
    assert all(s.info["collisions"] == 0 for s in _backend._segments)


def test_a_view_of_an_input_at_a_dynamic_offset_is_the_plain_graphs_view():
    """AOTAutograd rebuilds an output that aliases an input from the
    caller's tensor with as_strided(size, stride, storage_offset()) when
    the view's steps are symbolic: cgtree's outputs must carry the plain
    graph's storage offset. Before, x[:, start:] came back as x[:, :n - start],
    silently. Also with an input that has a storage offset of its own."""
    fresh()

    def f(x, start):
        return x[:, start:], x.sum()

    cg = torch.compile(f, backend="cgtree", dynamic=True)
    big = torch.arange(400.0, device=DEV)
    r0 = replays()
    for start in (2, 3, 4, 5, 2, 3, 4, 5):
        for x in (big[:40].view(4, 10), big[30:70].view(4, 10)):
            v, s = cg(x, start)
            assert v.shape == x[:, start:].shape and torch.equal(v, x[:, start:]), (start, x.storage_offset())
            assert v.data_ptr() == x[:, start:].data_ptr()
            torch.testing.assert_close(s, x.sum())
    assert replays() - r0 >= 4


def test_a_view_of_an_intermediate_at_a_dynamic_offset_trains_like_eager():
    """The same for a view of an output of the graph, in training: y and
    y[1:n-1] returned together, both used in the loss."""
    fresh()

    def f(x):
        y = x * 2
        n = y.shape[0]
        return y, y[1:n - 1]

    cg = torch.compile(f, backend="cgtree", dynamic=True)
    for n in (8, 9, 10, 8, 9, 10, 8, 9, 10):
        x = torch.arange(float(n), device=DEV).requires_grad_()
        xe = x.detach().clone().requires_grad_()
        y, v = cg(x)
        ye, ve = f(xe)
        assert torch.equal(v, ve), n
        (y.sum() + (v * 3).sum()).backward()
        (ye.sum() + (ve * 3).sum()).backward()
        assert torch.equal(x.grad, xe.grad), n


def test_an_operator_tagged_cudagraph_unsafe_runs_plainly_and_sees_its_host_state_each_call():
    """A custom operator tagged cudagraph_unsafe reads a Python global at
    each call; a recording would replay the first value for good."""
    fresh()
    from torch_patterns import host_scaled_op

    scale = [2.0]
    scaled_by_global = host_scaled_op("cgtree_trust::scaled_by_global", scale)

    cg = torch.compile(lambda x: scaled_by_global(x + 1) * 2, backend="cgtree")
    x = torch.ones(16, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(6):
            scale[0] = float(k)
            assert torch.equal(cg(x), torch.full((16,), 4.0 * k, device=DEV)), k
    reasons = [d["plain_reason"] for d in _backend.decisions[-1:]]
    assert reasons and "cudagraph_unsafe" in reasons[0], reasons
