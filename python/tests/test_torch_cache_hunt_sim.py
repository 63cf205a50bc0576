"""Hunts for compiles in an earlier phase (the same process after
torch._dynamo.reset(), or an earlier process sharing the cache directory)
that make a later phase compute wrong values under cgtree's backend, where
the same program compiled in a fresh cache directory computes right. CPU
only: cgtree's backend (compile_graph) on CPU tensors goes through the same
inner_compile hook and Inductor's FX graph cache, and runs the plain
Inductor graphs (CGTREE_TORCH_NO_INSTALL=1). Each case runs its phases in
subprocesses with a cache directory of their own.

Found: torch.get_default_dtype() decides the dtype of an integer tensor's
true division (torch.arange(4) / 3), which Inductor works out at lowering
time (type promotion, torch._prims_common), but neither the FX graph's
code (aten.div.Tensor of an int64 tensor carries no dtype) nor Inductor's
FX graph cache key (PyTorch 2.11) has it. (torch.ones(4) was not hit: its
decomposition names the dtype.) A graph compiled under one default dtype comes back from the
cache to a program running under another: a float32 program gets float64
outputs; and since cgtree turns AOTAutograd's cache off, its forward comes
back from phase 1 while its backward (whose graph differs: no dtype
conversions) is compiled afresh, so the backward reads the float64 saved
activation as float32: gradients wrong by 1e25, silently. Plain Inductor
after a plain Inductor phase gets the whole phase-1 pair from AOTAutograd's
cache: float64 outputs, gradients off by float rounding only; after a
cgtree phase (which leaves no AOTAutograd entry) it is as wrong as cgtree.
The same happens in one process with no reset at all: Dynamo recompiles
when the default dtype changes, and the recompile hits the cache. cgtree's
backend now keys its compiles by the default dtype
(_backend._cache_keyed_by_what_it_omits), and these cases pass. Shared
with plain Inductor's key under float32, a graph the default dtype can
change still got plain Inductor's float64 entry (float64 outputs,
gradients off by 5e25): such a graph is now keyed under float32 too
(_backend._reads_the_default_dtype).

The guard: donated buffers (torch._functorch.config.donated_buffer) with
activation checkpointing, and from a plain Inductor compile, never reach a
retained graph's second backward (a backward's cache key carries the
indices of its donated buffers: _backend._cache_keyed_by_what_it_omits).

Found by a review since: the same backward graph after forwards that donate
different sets (one also returns a saved activation, which is then not
donated) came back compiled with more donated and overwrote the activation
the program held; TORCHINDUCTOR_FX_GRAPH_CACHE=1 defeated the first fix
(turning the cache off by a config patch, which the forced variable
shadows); TORCHINDUCTOR_AUTOGRAD_CACHE=1 kept AOTAutograd's cache on, so a
graph came back from it ungraphed, untold (now a CgtreeError). Clean in the same
hunt (not kept as tests): retain with the flag on; grads of a subset and of the
input; create_graph (raises, as fresh); frozen/unfrozen parameters; no_grad
then training and back; dynamic=True, mark_dynamic; an activation memory
budget; BatchNorm; dropout under checkpointing; freezing with other
weights; automatic-dynamic PGO state from an earlier process."""
import json
import operator
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import pytest

torch = pytest.importorskip("torch")


def _env(tmp_path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), CGTREE_TORCH_NO_INSTALL="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__))] + [p for p in sys.path if p])
    return env


def _run(script, args, tmp_path):
    """Runs script with args in a process of its own, sharing tmp_path's
    cache directory; its last line of output, as JSON."""
    r = subprocess.run([sys.executable, "-c", script] + list(args), env=_env(tmp_path), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# One phase per argument (a default dtype), each after a Dynamo reset: a
# graph whose integer true division's dtype is the default dtype, compiled
# through cgtree's backend; per phase, whether the output has eager's dtype
# and values (a fresh compile's: equal to eager bit for bit).
DEFAULT_DTYPE_INFERENCE = textwrap.dedent('''
    import json, sys, torch
    from cgtree.torch import _backend

    def f(x):
        return x + torch.arange(4) / 3

    def phase(spec):  # "float64", or "inductor:float64" for plain Inductor's compile
        backend, _, default = spec.rpartition(":")
        torch._dynamo.reset()
        torch.set_default_dtype(getattr(torch, default))
        x = torch.ones(4, dtype=torch.float32)
        with torch.no_grad():
            out = torch.compile(f, backend=backend or _backend.compile_graph)(x)
            want = f(x)
        return {"dtype": str(out.dtype), "eager_dtype": str(want.dtype),
                "max_diff": float((out.double() - want.double()).abs().max())}

    print(json.dumps([phase(d) for d in sys.argv[1:]]))
''')


def test_a_graph_compiled_under_a_float64_default_dtype_never_comes_back_from_the_cache_to_a_float32_program(
        tmp_path):
    """torch.arange(4) / 3 is float64 under a float64 default dtype, float32
    under float32; the traced graph does not say which (aten.div.Tensor of
    an int64 tensor), Inductor decides at lowering time, and its FX graph
    cache key does not include the default dtype. Phase 1 (float64 default)
    compiles x + arange(4) / 3 for a float32 x, whose output is float64;
    phase 2 (float32 default, the same process after a reset) got that
    compile from the cache: a float64 output where eager and a fresh
    compile give float32 (and 1/3 to float64 precision, 2e-8 off)."""
    got = _run(DEFAULT_DTYPE_INFERENCE, ["float64", "float32"], tmp_path)
    assert got[0] == {"dtype": "torch.float64", "eager_dtype": "torch.float64", "max_diff": 0.0}, got
    assert got[1] == {"dtype": "torch.float32", "eager_dtype": "torch.float32", "max_diff": 0.0}, got


def test_a_graph_plain_inductor_compiled_under_a_float64_default_dtype_never_comes_back_to_cgtrees_float32_program(
        tmp_path):
    """The same order with plain Inductor's compile first: its entry, under
    plain Inductor's key, was written under a float64 default dtype, and
    cgtree's float32 forward, which shares plain Inductor's key where the
    default dtype cannot change the code, came back with a float64 output.
    A graph whose code the default dtype can change (a floating result of
    no floating input, where no dtype is named: here arange(4) / 3) is now
    keyed by the default dtype under float32 too
    (_backend._reads_the_default_dtype)."""
    got = _run(DEFAULT_DTYPE_INFERENCE, ["inductor:float64", "float32"], tmp_path)
    assert got[0]["dtype"] == "torch.float64", got  # plain Inductor's own phase: float64, as eager under it
    assert got[1] == {"dtype": "torch.float32", "eager_dtype": "torch.float32", "max_diff": 0.0}, got


# A training step of a float32 Linear whose output is scaled by
# torch.arange(4) / 3 (float32 or float64, as the default dtype says),
# through cgtree's backend; one phase per argument (a default dtype), each
# after a Dynamo reset: the output's dtype and its and the weight
# gradient's largest difference from eager (a fresh compile's: 0.0, bit for
# bit).
DEFAULT_DTYPE_TRAINING = textwrap.dedent('''
    import json, sys, torch
    from cgtree.torch import _backend

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(8, 4, dtype=torch.float32)

        def forward(self, x):
            return self.l(x) * (torch.arange(4) / 3)

    def phase(spec):  # "float64", or "inductor:float64" for plain Inductor's compile
        backend, _, default = spec.rpartition(":")
        torch._dynamo.reset()
        torch.set_default_dtype(getattr(torch, default))
        torch.manual_seed(0)
        m = M()
        x = torch.randn(2, 8, dtype=torch.float32)
        out = torch.compile(m, backend=backend or _backend.compile_graph)(x)
        out.square().sum().backward()
        got, grad = out.detach().clone(), m.l.weight.grad.clone()
        m.l.weight.grad = None
        want = m(x)
        want.square().sum().backward()
        return {"dtype": str(got.dtype), "eager_dtype": str(want.dtype),
                "out_diff": float((got.double() - want.double()).abs().max()),
                "grad_diff": float((grad.double() - m.l.weight.grad.double()).abs().max())}

    print(json.dumps([phase(d) for d in sys.argv[1:]]))
''')


def test_a_training_step_after_a_phase_with_a_float64_default_dtype_computes_a_fresh_compiles_gradients(tmp_path):
    """A phase with a float64 default dtype (the same process after a
    reset; an earlier process sharing the cache directory does the same)
    compiled the forward of the same graph code: its output and the
    activation it saves (arange(4) / 3) are float64. cgtree turns
    AOTAutograd's cache off, so the float32 phase retraces: its forward
    graph's code is the same and comes back from Inductor's FX graph cache
    (float64), its backward's is not (phase 1's had dtype conversions) and
    is compiled afresh for a float32 saved activation. It reads the float64
    bits as float32: weight gradients wrong by about 5e25, silently (plain
    Inductor gets phase 1's forward and backward from AOTAutograd's cache:
    float64 outputs, gradients 2.4e-7 off)."""
    got = _run(DEFAULT_DTYPE_TRAINING, ["float64", "float32"], tmp_path)
    assert got[0] == {"dtype": "torch.float64", "eager_dtype": "torch.float64", "out_diff": 0.0,
                      "grad_diff": 0.0}, got
    assert got[1] == {"dtype": "torch.float32", "eager_dtype": "torch.float32", "out_diff": 0.0,
                      "grad_diff": 0.0}, got


def test_a_training_step_after_plain_inductors_float64_phase_computes_a_fresh_compiles_gradients(tmp_path):
    """Plain Inductor trains the step first under a float64 default dtype,
    then cgtree under float32: the forward's code the default dtype
    decides (arange(4) / 3) is keyed by it, so it never comes back with
    float64 activations for a backward compiled for float32."""
    got = _run(DEFAULT_DTYPE_TRAINING, ["inductor:float64", "float32"], tmp_path)
    assert got[0]["dtype"] == "torch.float64", got
    assert got[1] == {"dtype": "torch.float32", "eager_dtype": "torch.float32", "out_diff": 0.0,
                      "grad_diff": 0.0}, got


# One phase per argument, "backend:kind:ckpt", each after a Dynamo reset
# (python/tests/donation_phase.py). backend: cgtree or inductor (plain);
# ckpt: "ckpt" checkpoints the first block, "-" does not. Prints per phase
# the largest difference of the second backward's gradients from twice the
# first's (0.0 for "plain").
DONATION = textwrap.dedent('''
    import json, sys
    from cgtree.torch import _backend
    from donation_phase import phase

    def run(spec):
        backend, kind, ckpt = spec.split(":")
        return phase(_backend.compile_graph if backend == "cgtree" else backend, kind, ckpt == "ckpt")

    print(json.dumps({k: run(k) for k in sys.argv[1:]}))
''')


def test_a_backward_compiled_with_donated_buffers_never_comes_back_from_inductors_cache_to_a_retained_graph(
        tmp_path):
    """Inductor reuses the memory of saved activations AOTAutograd donates
    to a backward, so that backward must run once, and the FX graph cache
    key does not say what was donated. A backward compiled with donation (a
    plain backward, the flag on: cgtree's, with and without activation
    checkpointing, whose backward recomputes the block, or plain
    Inductor's) came back to the same graph compiled for a retaining
    backward (the flag off; the flag on and a first backward that retains),
    whose second backward read activations the first had overwritten:
    gradients wrong by up to 3.7, silently. Now every retained graph's
    second backward computes twice the first's gradients exactly (a
    backward donated less than every activation it may be keys its compile
    by the donated indices: _backend._cache_keyed_by_what_it_omits)."""
    phases = ["cgtree:plain:-", "cgtree:retain-off:-", "cgtree:plain:ckpt", "cgtree:retain-off:ckpt",
              "cgtree:retain-on:ckpt", "inductor:plain:-", "cgtree:retain-on:-"]
    got = _run(DONATION, phases, tmp_path)
    assert got == dict.fromkeys(phases, 0.0), got


def test_a_cache_the_environment_forces_on_still_never_hands_a_float64_compile_to_a_float32_program(tmp_path,
                                                                                                   monkeypatch):
    """torch._inductor.config.fx_graph_cache is a Config with
    env_name_force="TORCHINDUCTOR_FX_GRAPH_CACHE": where the variable is 1
    (as guides on compile caching suggest), config.patch(fx_graph_cache=
    False) sets user_override, which the forced value shadows
    (torch/utils/_config_module.py __getattr__), so the first fix, which
    turned the cache off that way, was a no-op: the float64 phase's forward
    came back to the float32 program, float64 output, gradients off by
    5e25 (a review). Now the default dtype keys the compile, whatever the
    variable says."""
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    got = _run(DEFAULT_DTYPE_TRAINING, ["float64", "float32"], tmp_path)
    assert got[1] == {"dtype": "torch.float32", "eager_dtype": "torch.float32", "out_diff": 0.0,
                      "grad_diff": 0.0}, got


# Two phases, each after a Dynamo reset: an inference Linear through
# cgtree's backend; per phase, how many times inner_compile ran, or the
# error the compile raised (its type's name and message).
INNER_COMPILE_CALLS = textwrap.dedent('''
    import json, torch
    from cgtree.torch import _backend

    calls = []
    orig = _backend.inner_compile

    def spy(gm, ex, **kw):
        calls.append(1)
        return orig(gm, ex, **kw)

    _backend.inner_compile = spy

    def phase():
        torch._dynamo.reset()
        calls.clear()
        m = torch.nn.Linear(8, 4)
        try:
            with torch.no_grad():
                torch.compile(m, backend=_backend.compile_graph)(torch.randn(2, 8))
        except Exception as e:  # Dynamo wraps the backend's error; the cause is ours
            cause = getattr(e, "inner_exception", None) or e.__cause__ or e
            return [type(cause).__name__, str(cause)]
        return ["compiled", len(calls)]

    print(json.dumps([phase(), phase()]))
''')


def test_a_forced_aotautograd_cache_is_refused_with_an_error_naming_the_variable(tmp_path, monkeypatch):
    """torch._functorch.config.enable_autograd_cache has
    env_name_force="TORCHINDUCTOR_AUTOGRAD_CACHE": with it 1, compile_graph's
    patch(enable_autograd_cache=False) was a no-op, and the second phase's
    graph came back from AOTAutograd's cache without calling inner_compile:
    it ran as plain Inductor, never a Segment, untold (a review). Now every
    compile raises CgtreeError naming the variable, and none reaches
    Inductor; unset, the same script compiles through inner_compile in
    both phases."""
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    got = _run(INNER_COMPILE_CALLS, [], tmp_path)
    assert [g[0] for g in got] == ["CgtreeError", "CgtreeError"], got
    assert all("TORCHINDUCTOR_AUTOGRAD_CACHE='1'" in g[1] and "unset" in g[1] for g in got), got
    monkeypatch.delenv("TORCHINDUCTOR_AUTOGRAD_CACHE")
    assert _run(INNER_COMPILE_CALLS, [], tmp_path) == [["compiled", 1], ["compiled", 1]]


# Phases A and B, each after a Dynamo reset: the same MLP through cgtree's
# backend; B also returns r.detach(), an activation its backward reads. Per
# phase B: how far r is from eager's value before and after the backward.
DONATED_SUBSET = textwrap.dedent('''
    import json, sys, torch
    from cgtree.torch import _backend

    class M(torch.nn.Module):
        def __init__(self, ret):
            super().__init__()
            self.l1, self.l2, self.l3 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)
            self.ret = ret

        def forward(self, x):
            r = torch.relu(self.l1(x))
            h = torch.tanh(self.l2(r))
            out = self.l3(h * h.sigmoid())
            return (out, r.detach()) if self.ret else out

    def phase(kind):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = M(kind == "B")
        x = torch.randn(16, 32)
        res = torch.compile(m, backend=_backend.compile_graph)(x)
        want = torch.relu(m.l1(x)).detach()
        out, r = res if kind == "B" else (res, want)
        before = float((r - want).abs().max())
        out.square().sum().backward()
        return [before, float((r - want).abs().max())]

    print(json.dumps([phase(k) for k in sys.argv[1:]]))
''')


def test_a_backward_that_donates_fewer_buffers_never_gets_one_compiled_with_more_from_the_cache(tmp_path):
    """The same backward graph can follow forwards whose saved activations
    AOTAutograd donates differently: B returns r.detach(), a saved
    activation, so r is not donated (bw_donated_idxs [4, 5]) where A donated
    it ([3, 4, 5]); the backward graph's code is the same. B's donated set is
    not empty, so the first fix (the cache off only for a backward that
    donates nothing) let the cache serve A's backward, which reuses r's
    memory: the r the program held was overwritten by the backward (1.9
    off), silently (a review; plain Inductor does the same after A). Now the
    donated indices key the backward's compile; fresh, B gives [0, 0]."""
    got = _run(DONATED_SUBSET, ["A", "B"], tmp_path)
    assert got[1] == [0.0, 0.0], got


# One phase per argument ("keyed": a CustomGraphPass with a uuid; "plain": a
# bare function), each after a Dynamo reset: an inference graph through
# cgtree's backend with the program's own post-grad pass set; per phase, how
# often the pass ran, the output's distance from eager, and Inductor's
# FX graph cache hits and misses.
OWN_POST_GRAD_PASS = textwrap.dedent('''
    import json, sys, torch
    from torch._inductor import config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._dynamo.utils import counters
    from cgtree.torch import _backend

    ran = []

    class Keyed(CustomGraphPass):
        def __call__(self, graph):
            ran.append(len(graph.nodes))

        def uuid(self):
            return "test-keyed-pass-1"

    def plain(graph):
        ran.append(len(graph.nodes))

    def f(x):
        return torch.relu(x) * 3 + 1

    def phase(kind):
        torch._dynamo.reset()
        ran.clear()
        counters.clear()
        x = torch.randn(8)
        with inductor_config.patch(post_grad_custom_post_pass=Keyed() if kind == "keyed" else plain):
            out = torch.compile(f, backend=_backend.compile_graph)(x)
            left = inductor_config.post_grad_custom_post_pass
        return [len(ran), float((out - f(x)).abs().max()), counters["inductor"]["fxgraph_cache_hit"],
                counters["inductor"]["fxgraph_cache_miss"], left is not None and type(left).__name__]

    print(json.dumps([phase(k) for k in sys.argv[1:]]))
''')


def test_a_programs_own_post_grad_pass_runs_inside_cgtrees_and_keys_or_skips_the_cache_as_alone():
    """cgtree keys Inductor's FX graph cache through the post-grad custom
    pass slot (_backend._cache_keyed_by_what_it_omits), standing in for the
    program's own pass: that pass must still run at every compile that is
    not a hit, its uuid must still key the cache (a keyed pass: a miss, then a hit), a bare
    function, which Inductor cannot key, must still keep the cache out (no
    hit), and the program's pass must be back in the slot after the
    compile."""
    with tempfile.TemporaryDirectory() as d:
        keyed = _run(OWN_POST_GRAD_PASS, ["keyed", "keyed"], pathlib.Path(d))
    # compiled once, running the pass (a miss); then a hit, which stands for the pass's work
    assert keyed == [[1, 0.0, 0, 1, "Keyed"], [0, 0.0, 1, 0, "Keyed"]], keyed
    with tempfile.TemporaryDirectory() as d:
        plain = _run(OWN_POST_GRAD_PASS, ["plain", "plain"], pathlib.Path(d))
    assert [p[0] >= 1 and p[1] == 0.0 and p[2] == 0 and p[4] == "function" for p in plain] == [True, True], plain


# Two phases in one process, each after a Dynamo reset, sharing a cache
# directory: plain Inductor trains donation_phase's MLP (with activation
# checkpointing or without), then cgtree's backend trains it; per phase the
# FX graph cache's hits and misses.
SHARED = textwrap.dedent('''
    import json, sys
    from torch._dynamo.utils import counters
    from cgtree.torch import _backend
    from donation_phase import phase

    def run(backend, ckpt):
        counters.clear()
        phase(_backend.compile_graph if backend == "cgtree" else backend, "plain", ckpt == "ckpt")
        return [counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]]

    ckpt = sys.argv[1]
    print(json.dumps([run("inductor", ckpt), run("cgtree", ckpt)]))
''')


@pytest.mark.parametrize("ckpt", ["-", "ckpt"])
def test_a_common_training_step_shares_plain_inductors_cache_entries_forward_and_backward(tmp_path, ckpt):
    """A backward donated every saved activation that is not an input of
    its forward keeps plain Inductor's cache key (an entry of its graph was
    compiled with no more donated), as a float32 forward does: cgtree's
    compile after plain Inductor's is a hit for both graphs, so it runs
    plain Inductor's code and autotuning choices. Keyed, such a backward
    autotuned apart on an H200 with empty caches and a training loop's
    losses differed from plain Inductor's in the last bits."""
    got = _run(SHARED, [ckpt], tmp_path)
    assert got == [[0, 2], [2, 0]], got


@pytest.mark.parametrize("case, reads", [
    ("int_true_division", True), ("int_times_python_float", True), ("constructor_without_dtype", True),
    ("float_mlp", False), ("bool_mask_to_float_names_its_dtype", False), ("int_arange", False),
    ("constructor_naming_its_dtype", False), ("inductor_random", False), ("float_constant", False),
    ("call_without_a_value_of_a_float", False), ("call_without_a_value_of_an_int", True),
    ("int_true_division_in_a_subgraph", True), ("float_subgraph", False)])
def test_which_graphs_the_default_dtype_can_change(case, reads):
    """_reads_the_default_dtype on graphs traced as AOTAutograd hands them
    over (make_fx, ATen ops, each node's value in its metadata): a
    floating result of no floating argument where no argument names a dtype
    reads the default dtype at lowering; everything else does not, and is
    shared with plain Inductor's key under float32."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from cgtree.torch import _backend
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.inductor_random)

    w, i, seed = torch.randn(4, 4), torch.arange(4), torch.tensor(7)
    const = torch.tensor([0.5, 2.0, 1.0, 3.0])
    fns = {
        "int_true_division": (lambda i: i / 3, (i,)),
        "int_times_python_float": (lambda i: i * 0.5, (i,)),
        "constructor_without_dtype": (lambda w: w + torch.ops.aten.empty_strided.default([4, 4], [4, 1]).fill_(1), (w,)),
        "float_mlp": (lambda w: torch.relu(w @ w.t()).sum(0), (w,)),
        "bool_mask_to_float_names_its_dtype": (lambda w: w * (w > 0).float(), (w,)),
        "int_arange": (lambda i: i + torch.arange(4), (i,)),
        "constructor_naming_its_dtype": (lambda w: w + torch.ones(4, 4, dtype=torch.float32), (w,)),
        "inductor_random": (lambda w, s: w * torch.ops.prims.inductor_random.default([4, 4], s, "rand"), (w, seed)),
        "float_constant": (lambda w: w * const, (w,)),
    }
    if case.endswith("subgraph"):  # a higher-order op's subgraph, as flex attention's score function is
        sub = make_fx(fns["int_true_division" if case.startswith("int") else "float_mlp"][0])(
            i if case.startswith("int") else w)
        g = torch.fx.Graph()
        x = g.placeholder("x")
        x.meta["val"] = w
        body = g.get_attr("body")
        out = g.call_function(torch.neg, (x, body))  # stands for the op: a float argument, a float result
        out.meta["val"] = w
        g.output(out)
        root = torch.nn.Module()
        root.body = sub
        gm = torch.fx.GraphModule(root, g)
    elif case.startswith("call_without_a_value"):  # as a higher-order op (run_and_save_rng_state) stands
        g = torch.fx.Graph()
        x = g.placeholder("x")
        x.meta["val"] = w if case.endswith("float") else i
        hop = g.call_function(torch.neg, (x,))  # no value in its metadata
        out = g.call_function(operator.getitem, (hop, 0))
        out.meta["val"] = w[0]
        g.output(out)
        gm = torch.fx.GraphModule(torch.nn.Module(), g)
    else:
        fn, args = fns[case]
        gm = make_fx(fn)(*args)
    assert _backend._reads_the_default_dtype(gm) is reads, gm.graph
