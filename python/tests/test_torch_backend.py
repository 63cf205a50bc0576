"""torch.compile(backend="cgtree"): the backend on a GPU, against plain Inductor.

The allocator must be installed before PyTorch initialises CUDA, so this
module imports cgtree.torch at collection time; run it in its own pytest
process if another test module touches CUDA at import:
    python -m pytest python/tests/test_torch_backend.py
Every test here needs a GPU and skips without one. Graph-analysis tests
that need only torch are in test_torch_graphs.py.
"""
import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

import torch_gpu  # skips the file without a GPU; imports cgtree.torch before CUDA starts

torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark


DEV = "cuda"


def bits(t):
    """Bit pattern of a float tensor, so NaNs compare equal to themselves."""
    return t.detach().contiguous().view(torch.int32 if t.element_size() == 4 else torch.int16).cpu()


def assert_bit_equal(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a), bits(b))


def fresh():
    torch._dynamo.reset()


class MLP(torch.nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.a = torch.nn.Linear(d, d)
        self.b = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def branchy(x):
    y = x * x * x
    if y.sum() > 0:
        z = y ** 2
    else:
        z = y.abs() * 3
    torch._dynamo.graph_break()
    return z * 2 + 1


def test_compiled_model_replays_bit_equal_to_plain_inductor():
    fresh()
    torch.manual_seed(0)
    m = MLP().to(DEV).eval()
    ref = torch.compile(m, backend="inductor")
    cg = torch.compile(m, backend="cgtree")
    before = ct.stats()
    with torch.no_grad():
        for i in range(8):
            x = torch.randn(16, 256, device=DEV)
            assert_bit_equal(cg(x), ref(x))
    s = ct.stats()
    assert s["recordings"] - before.get("recordings", 0) >= 1
    assert s["replays"] - before.get("replays", 0) >= 5
    assert s["graphs_plain"] == before["graphs_plain"]  # the process's count: other tests' graphs may run plainly


def test_the_hot_path_uses_dlpacks_exchange_api_and_a_weight_moved_under_it_is_seen():
    """python/_torch_ext/exchange.c: with this PyTorch, pointers, the stream
    and output tensors go through DLPack's C exchange API (each proven at
    install), and a weight whose storage is swapped (param.data = ...) is
    still found at its new address: a new recording, the new weight's result."""
    fresh()
    from cgtree import _torch_ext

    assert hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    info = _torch_ext.exchange_info()
    assert info["pointers"] and info["outputs"], ct._install._state["exchange"]
    torch.manual_seed(0)
    m = MLP(64).to(DEV).eval()
    cg = torch.compile(m, backend="cgtree")
    x = torch.randn(8, 64, device=DEV)
    with torch.no_grad():
        for _ in range(4):
            y = cg(x)
        assert _torch_ext.exchange_info()["stream"]
        assert type(y) is torch.Tensor and y.device == x.device
        assert_bit_equal(y, m(x))
        before = ct.stats()["recordings"]
        m.b.weight.data = torch.randn(64, 64, device=DEV)  # same shape, new storage
        for _ in range(3):
            y = cg(x)
            assert_bit_equal(y, m(x))
        assert ct.stats()["recordings"] > before
    read = _exchange_reader()
    for t in (x, x[2:], x.t(), x[1:, 3:], m.a.weight, m.a.bias[1:], y):  # CUDA tensors agree too
        assert read(t) == t.data_ptr()
    assert _torch_ext.exchange_info()["disagreements"] == 0


def _exchange_reader():
    """dltensor_from_py_object_no_sync of PyTorch's table, through ctypes."""
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                    ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("byte_offset", ctypes.c_uint64)]

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api")
    fn_addr = ctypes.c_void_p.from_address(table + 16 + 3 * 8).value  # header, then the 4th function
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))(fn_addr)

    def read(t):
        dl = DLTensor()
        assert fn(t, ctypes.byref(dl)) == 0
        return (dl.data or 0) + dl.byte_offset

    return read


def test_graph_break_branches_record_both_paths_and_restore_the_checkpoint():
    fresh()
    ref = torch.compile(branchy, backend="inductor")
    cg = torch.compile(branchy, backend="cgtree")
    before = ct.stats()
    x = torch.rand(64, 64, device=DEV) + 0.1
    for i in range(12):
        xi = x if i % 2 == 0 else -x
        assert_bit_equal(cg(xi), ref(xi))
    s = ct.stats()
    assert s["recordings"] - before.get("recordings", 0) >= 4  # 1, 2, 3 and 4 twice (under 2 and under 3)
    assert s["checkpoint_restores"] - before.get("checkpoint_restores", 0) >= 1
    assert s["replays"] - before.get("replays", 0) >= 12
    for t in ct._install.trees():
        t.check()


def test_steady_state_segments_allocate_nothing_outside_the_pool():
    fresh()
    m = MLP().to(DEV).eval()
    cg = torch.compile(m, backend="cgtree")
    x = torch.randn(16, 256, device=DEV)
    with torch.no_grad():
        for _ in range(5):
            cg(x)
        torch.cuda.synchronize()
        f0 = ct._torch_ext_figures()
        for _ in range(50):
            y = cg(x)
        torch.cuda.synchronize()
        f1 = ct._torch_ext_figures()
    assert f1["eager_allocations"] == f0["eager_allocations"]
    assert f1["pool_allocs"] == f0["pool_allocs"]  # replays never call the allocator
    assert y.shape == (16, 256)


def test_output_memory_goes_back_to_the_tree_when_the_tensor_dies():
    fresh()

    def f(x):
        a = x + 1
        torch._dynamo.graph_break()
        return a * 2

    cg = torch.compile(f, backend="cgtree")
    x = torch.randn(1024, device=DEV)
    for _ in range(4):
        y = cg(x)
    alive = ct.stats()["outputs_alive"]
    del y
    assert ct.stats()["outputs_alive"] == alive - 1


def test_an_output_of_an_earlier_step_passed_back_raises_stale_tensor_error():
    fresh()

    def f(x):
        return x * 2 + 1

    cg = torch.compile(f, backend="cgtree")
    x = torch.randn(256, device=DEV)
    for _ in range(3):
        cg(x)
    y1 = cg(x)
    y2 = cg(x)  # a new step: y1's memory now holds y2
    assert torch.equal(y2, x * 2 + 1)
    with pytest.raises(ct.StaleTensorError):
        cg(y1)  # a call of the model too: y2's step ends with it
    assert ct.stats()["stale_refused"] >= 1


def test_outputs_flow_between_segments_of_one_step_as_values():
    fresh()

    def f(x):
        a = torch.sin(x)
        torch._dynamo.graph_break()
        return torch.cos(a)

    ref = torch.compile(f, backend="inductor")
    cg = torch.compile(f, backend="cgtree")
    x = torch.randn(4096, device=DEV)
    for _ in range(6):
        assert_bit_equal(cg(x), ref(x))
    before = ct.stats()
    for _ in range(10):
        cg(x)
    s = ct.stats()
    # Only x is copied (DYNAMIC); the first graph's output reaches the second as a VALUE.
    assert s["input_copies"] - before["input_copies"] <= 10


def test_a_mutated_input_and_a_mutated_buffer_keep_working():
    fresh()

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(4, device=DEV))

        def forward(self, x, acc):
            self.n.add_(1)
            acc.add_(x)
            return x * self.n

    m = Counter()
    cg = torch.compile(m, backend="cgtree")
    acc = torch.zeros(4, device=DEV)
    x = torch.ones(4, device=DEV)
    with torch.no_grad():
        for i in range(1, 7):
            y = cg(x, acc)
            assert torch.equal(y, torch.full((4,), float(i), device=DEV))
    assert torch.equal(acc, torch.full((4,), 6.0, device=DEV))
    assert torch.equal(m.n, torch.full((4,), 6.0, device=DEV))


def test_new_input_shapes_keep_matching_plain_inductor():
    fresh()
    m = MLP(64).to(DEV).eval()
    ref = torch.compile(m, backend="inductor")
    cg = torch.compile(m, backend="cgtree")
    with torch.no_grad():
        for i in range(12):
            x = torch.randn(8 * (1 + i % 3), 64, device=DEV)
            assert_bit_equal(cg(x), ref(x))


def test_a_caller_on_another_stream_is_ordered_with_the_tree():
    fresh()
    m = MLP().to(DEV).eval()
    ref = torch.compile(m, backend="inductor")
    cg = torch.compile(m, backend="cgtree")
    s = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(6):
            x = torch.randn(32, 256, device=DEV)
            y = cg(x)
            r = ref(x)
            assert_bit_equal(y, r)


def test_memory_figures_come_from_cgtree_because_pytorchs_raise():
    with pytest.raises(Exception):
        torch.cuda.max_memory_allocated()
    m = ct.memory_stats()
    assert m["eager_peak"] > 0 and m["pool_peak"] > 0
    assert m["peak_bytes_bound"] == m["eager_peak"] + m["pool_peak"]
    assert m["eager_peak"] <= m["peak_bytes"] <= m["peak_bytes_bound"]


def test_the_cublas_workspace_lives_in_the_pool_as_a_temporary_of_the_launch():
    # A fresh process: this module's other tests have compiled matmuls already.
    code = textwrap.dedent("""
        import cgtree.torch as ct
        import torch
        x = torch.rand(64, 64, device="cuda")
        m = torch.nn.Linear(64, 64).cuda().eval()
        m2 = torch.nn.Linear(64, 64).cuda().eval()
        def f(x):
            y = m(x)
            torch._dynamo.graph_break()
            return m2(y) + y  # y lives across the second graph's matmul and its workspace
        g = torch.compile(f, backend="cgtree")
        with torch.no_grad():
            ref = [f(x), f(-x)]
            torch.cuda.synchronize()
            base = ct.memory_stats()["eager_in_use"]
            outs = []
            for _ in range(6):
                outs.append((g(x).clone(), g(-x).clone()))
        torch.cuda.synchronize()
        s = ct.stats()
        mem = ct.memory_stats()
        worst = max(float((a - ref[0]).abs().max()) + float((b - ref[1]).abs().max()) for a, b in outs)
        print("FIGURES", ct._install.blas_ready(0), mem["eager_in_use"] - base, mem["pool_peak"], s["replays"], worst)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150,
                         env=dict(os.environ))
    line = [l for l in out.stdout.splitlines() if l.startswith("FIGURES")]
    assert line, out.stderr[-2000:]
    ready, eager_growth, pool_peak, replays, worst = line[0].split()[1:]
    assert ready == "False"  # no workspace was pre-warmed outside the pool
    assert int(eager_growth) < 4 << 20  # and none is held outside it after the calls
    assert int(pool_peak) >= 32 << 20  # the graphs' matmuls took it from the pool
    assert int(replays) > 0 and float(worst) < 1e-3


def test_what_the_installed_allocator_turns_off_raises_or_does_nothing_and_no_install_keeps_pytorchs():
    """docs/torch.md: "import cgtree.torch replaces PyTorch's CUDA allocator
    for the whole process. What that turns off: torch.cuda.memory_stats(),
    max_memory_allocated() and friends raise (use
    cgtree.torch.memory_stats()...), torch.cuda.empty_cache() has nothing to
    empty (use cgtree.torch.empty_cache()), and mode="reduce-overhead"
    refuses to run in the same process. Set CGTREE_TORCH_NO_INSTALL=1 to
    import without installing." Each in a fresh process: installed, every
    one of PyTorch's figures raises, empty_cache() leaves cgtree's figures
    as they were, and a reduce-overhead model raises (never returns a
    value); with CGTREE_TORCH_NO_INSTALL=1, PyTorch's allocator serves and
    its figures work."""
    code = textwrap.dedent("""
        import torch, cgtree.torch as ct
        x = torch.randn(1024, device="cuda")
        torch.randn(4096, device="cuda")  # freed at once: a block cgtree's front cache keeps
        print("INSTALLED", ct.installed())
        for name in ("memory_stats", "max_memory_allocated", "memory_allocated", "memory_reserved"):
            try:
                getattr(torch.cuda, name)()
                print("FIGURE", name, "ran")
            except Exception as e:
                print("FIGURE", name, "raised")
        if ct.installed():
            keys = ("reserved_bytes.all.current", "eager_in_use", "front_cache_bytes")
            before = [ct.memory_stats()[k] for k in keys]
            torch.cuda.empty_cache()
            print("EMPTY", [ct.memory_stats()[k] for k in keys] == before, before[2] > 0)
            f = torch.compile(lambda t: t * 2 + 1, mode="reduce-overhead")
            try:
                for _ in range(3):
                    y = f(x)
                torch.cuda.synchronize()
                print("REDUCE_OVERHEAD ran", bool((y == x * 2 + 1).all()))
            except Exception as e:
                print("REDUCE_OVERHEAD raised", type(e).__name__)
    """)
    for no_install in ("", "1"):
        env = dict(os.environ)
        env.pop("CGTREE_TORCH_NO_INSTALL", None)
        if no_install:
            env["CGTREE_TORCH_NO_INSTALL"] = no_install
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200, env=env)
        lines = out.stdout.splitlines()
        assert ("INSTALLED %s" % (not no_install)) in lines, (out.stdout, out.stderr[-2000:])
        figures = [l.split()[2] for l in lines if l.startswith("FIGURE")]
        assert figures == (["ran"] * 4 if no_install else ["raised"] * 4), lines
        if not no_install:
            assert "EMPTY True True" in lines, lines  # a front-cached block there to empty, kept
            assert "REDUCE_OVERHEAD raised" in " ".join(lines), (lines, out.stderr[-2000:])


def test_a_warmup_runs_variable_that_is_no_count_is_refused_naming_it_at_the_first_compiled_call():
    """docs/api.md, Environment: a cgtree.torch variable that takes a number
    and holds something else raises CgtreeError naming the variable where it
    is read: CGTREE_TORCH_WARMUP_RUNS when a device's tree is made, at the
    first compiled call (int() of it raised its own ValueError there, and
    -1 wrapped to 4 billion warm-up runs)."""
    code = textwrap.dedent("""
        import torch, cgtree.torch as ct
        f = torch.compile(lambda t: t * 2 + 1, backend="cgtree")
        try:
            f(torch.randn(1024, device="cuda"))
            print("RAN")
        except Exception as e:
            print("RAISED", type(e).__name__, e)
    """)
    for bad in ("two", "-1"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200,
                             env=dict(os.environ, CGTREE_TORCH_WARMUP_RUNS=bad))
        # Raised where the tree is made, inside the backend's compile: Dynamo wraps it (BackendCompilerFailed).
        said = out.stdout[out.stdout.find("RAISED"):] if "RAISED" in out.stdout else ""
        assert "CgtreeError: CGTREE_TORCH_WARMUP_RUNS must be a number of runs" in said, (out.stdout,
                                                                                          out.stderr[-2000:])


def test_install_after_cuda_started_raises_a_clear_error():
    code = textwrap.dedent("""
        import os, torch
        torch.zeros(1, device="cuda")
        os.environ["CGTREE_TORCH_NO_INSTALL"] = "1"
        import cgtree.torch as ct
        try:
            ct.install()
        except ct.CgtreeError as e:
            print("REFUSED:", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert "REFUSED:" in out.stdout, out.stderr[-2000:]
    assert "before PyTorch initialises CUDA" in out.stdout


def test_a_dropped_output_gives_its_memory_back_before_the_next_segment_of_the_step():
    """A dropped output's storage dies at once, and its value goes back to
    the tree before the next segment runs: the program below drops segment
    1's output inside the step, and its steady state replays the very
    recordings made when that memory was free again (no new recording, no
    eager run)."""
    fresh()

    def f(x):
        a = torch.relu(x) + 1
        torch._dynamo.graph_break()
        b = a * 3
        del a  # dead before segment 3 runs
        torch._dynamo.graph_break()
        return (b * 2).sum(0)

    cg = torch.compile(f, backend="cgtree")
    x = torch.randn(256, 1024, device=DEV)
    want = f(x)
    for _ in range(6):
        out = cg(x)
    del out
    before = ct.stats()
    for _ in range(6):
        out = cg(x)
        torch.testing.assert_close(out, want)
        del out
    after = ct.stats()
    for k in ("recordings", "warmups", "eager_runs", "rerecords"):
        assert after[k] == before[k], k
    assert after["replays"] >= before["replays"] + 12
