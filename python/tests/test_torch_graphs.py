"""What cgtree.torch decides about a graph at compile time: which inputs are
STATIC, which the graph writes, whether it draws random numbers. These come
from the compiler (Inductor's static_input_idxs and mutated_input_idxs, the
operators' tags), never from names. Needs torch, not a GPU: graphs of CPU
tensors go through the same inner_compile hook and are recorded in
cgtree.torch._backend.decisions before they run as plain Inductor graphs."""
import json
import operator
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.fx  # noqa: E402

from cgtree.torch import _backend  # noqa: E402
from cgtree.torch import _graphs as B  # noqa: E402

# The patterns of mutation the name scan missed, each compiled through the
# backend: the decision of each graph, as (static, mutated, random).
PATTERNS = textwrap.dedent('''
    import json, sys, torch
    from cgtree.torch import _backend

    def decide(fn, *args, grad=False):
        _backend.decisions.clear()
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            torch.compile(fn, backend=_backend.compile_graph)(*args)
        return [(list(d["static_input_idxs"]), d["mutated_input_idxs"], d["random"]) for d in _backend.decisions]

    from torch_patterns import foreach, iadd, setitem

    def pure(x, y):
        return torch.relu(x @ y) + x.t()

    torch.manual_seed(0)
    out = {
        "iadd": decide(iadd, torch.ones(4), torch.ones(4)),
        "foreach": decide(foreach, [torch.ones(3), torch.ones(3)], [torch.ones(3), torch.ones(3)]),
        "batchnorm_train": decide(torch.nn.BatchNorm1d(4).train(), torch.randn(8, 4)),
        "setitem": decide(setitem, torch.zeros(4, 3), 1, torch.ones(3)),
        "pure": decide(pure, torch.ones(3, 3), torch.ones(3, 3)),
        "linear": decide(torch.nn.Linear(4, 4), torch.randn(2, 4)),
        "rand": decide(lambda x: x + torch.rand_like(x), torch.ones(3)),
        "dropout_train": decide(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), torch.ones(3)),
        "dropout_eval": decide(lambda x: torch.nn.functional.dropout(x, 0.5, training=False), torch.ones(3)),
        "multinomial": decide(lambda p: torch.multinomial(p, 1), torch.ones(2, 4)),
        "sdpa": decide(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q), torch.ones(1, 2, 8, 16)),
        "sdpa_dropout": decide(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5),
                               torch.ones(1, 2, 8, 16)),
    }
    print("DECISIONS " + json.dumps(out))
''')

EXPECTED = {
    "iadd": [[[], [0], False]],
    "foreach": [[[], [0, 1], False]],
    # BatchNorm's inputs: weight, bias, running_mean, running_var, num_batches_tracked (static), x;
    # training updates the three running statistics.
    "batchnorm_train": [[[1, 2, 3, 4, 5], [1, 2, 3], False]],
    "setitem": [[[], [0], False]],
    "pure": [[[], [], False]],
    "linear": [[[0, 1], [], False]],
    "rand": [[[], [], True]],
    "dropout_train": [[[], [], True]],
    "dropout_eval": [[[], [], False]],
    "multinomial": [[[], [], True]],
    # every fused attention kernel carries the random tag for its dropout: off when dropout_p is 0
    "sdpa": [[[], [], False]],
    "sdpa_dropout": [[[], [], True]],
}


def _decide_in_a_fresh_process(cache_dir):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), CGTREE_TORCH_NO_INSTALL="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__))] + [p for p in sys.path if p])
    r = subprocess.run([sys.executable, "-c", PATTERNS], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("DECISIONS ")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(line[-1][len("DECISIONS "):])


def test_mutations_and_static_inputs_come_from_the_compiler_in_a_cold_and_a_warm_process(tmp_path):
    """x += y, _foreach_add_, BatchNorm's running statistics and setitem are
    mutations Inductor reports; parameters and buffers are static because
    the compiler says so. The second process finds Inductor's caches warm
    (the case where AOTAutograd's cache used to hide its metadata), and
    decides the same."""
    cold = _decide_in_a_fresh_process(tmp_path)
    assert cold == EXPECTED
    assert any(tmp_path.iterdir()), "the first process left no cache to warm the second"
    warm = _decide_in_a_fresh_process(tmp_path)
    assert warm == EXPECTED


def test_a_compiled_graph_that_does_not_say_what_it_mutates_is_treated_as_mutating_every_input():
    assert B.mutated_inputs(object(), 3) == ({0, 1, 2}, False)

    class Says:
        mutated_input_idxs = (2,)

    assert B.mutated_inputs(Says(), 3) == ({2}, True)


def test_static_and_mutated_inputs_are_planned_static_and_others_dynamic():
    ex = [torch.zeros(4), torch.zeros(4), torch.zeros(4), 3, 1.5, None]
    kinds, spans, dynamic = B.plan_inputs(ex, static_idxs=(0,), mutated={1})
    assert kinds == [B.ARG_TENSOR_STATIC, B.ARG_TENSOR_STATIC, B.ARG_TENSOR, B.ARG_INT, B.ARG_FLOAT, B.ARG_OTHER]
    assert spans == [16, 16, 16, 0, 0, 0]
    assert dynamic  # an int argument: spans are measured every call


def test_random_operators_are_found_by_their_tag_also_inside_nested_graphs():
    def rnd(a):
        return a + torch.rand_like(a)

    def plain(a):
        return a * 2

    from torch.fx.experimental.proxy_tensor import make_fx

    def aten(fn):  # the operator-level graph inner_compile sees
        return make_fx(fn)(torch.ones(3))

    assert B.random_use(aten(rnd)) == (True, False)
    assert B.random_use(aten(plain)) == (False, False)
    outer = aten(plain)
    outer.add_submodule("branch", aten(rnd))  # as torch.cond keeps its branches
    assert B.random_use(outer) == (True, False)


def test_an_operator_tagged_cudagraph_unsafe_is_found_also_inside_nested_graphs():
    """A custom operator tagged cudagraph_unsafe reads host state each call
    (here a Python global): its graph must run plainly, never be recorded."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch_patterns import host_scaled_op

    scaled_by_global = host_scaled_op("cgtree_test::scaled_by_global", [2.0])

    def aten(fn):
        return make_fx(fn)(torch.ones(3))

    unsafe = aten(lambda a: scaled_by_global(a) + 1)
    assert B.cudagraph_unsafe_op(unsafe) == "cgtree_test.scaled_by_global.default"
    plain = aten(lambda a: a * 2)
    assert B.cudagraph_unsafe_op(plain) is None
    plain.add_submodule("branch", unsafe)  # as torch.cond keeps its branches
    assert B.cudagraph_unsafe_op(plain) == "cgtree_test.scaled_by_global.default"


def test_graphs_that_save_or_restore_the_generator_state_are_told_apart_from_plain_random_graphs():
    """Random graphs are recorded (the generator's state per launch,
    _rng.py); a graph that saves or restores that state (activation
    checkpointing's rng ops) cannot be, and runs plainly."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    from torch.fx.experimental.proxy_tensor import make_fx

    def checkpointed(a):
        state, r = run_and_save_rng_state(torch.ops.aten.rand.default, [3], device=a.device)
        return a + r + run_with_rng_state(state, torch.ops.aten.rand.default, [3], device=a.device)

    def rnd(a):
        return a + torch.rand_like(a)

    saved = make_fx(checkpointed)(torch.ones(3))
    drawn = make_fx(rnd)(torch.ones(3))
    assert B.random_use(saved) == (True, True)
    assert B.random_use(drawn) == (True, False)
    why, _ = _backend._plain_reason([_FakeCuda()], {}, restores_rng=True)
    assert why is not None and "random generator's state" in why
    why, _ = _backend._plain_reason([_FakeCuda()], {}, restores_rng=False)
    assert why is None


def test_activation_checkpointings_graph_safe_form_is_a_random_graph_that_records_and_its_generators_key_variants():
    """AOTAutograd's graph-safe checkpointing (graphsafe_run_with_rng_state,
    its default on CUDA) passes the generators as graph arguments: a
    recording registers them (_rng.py), so the graph draws and restores
    nothing on the host; the host-side form still restores. Each generator
    argument is planned as ARG_GENERATOR, whose identity keys the variant."""
    from torch._prims.rng_prims import graphsafe_run_with_rng_state, run_with_rng_state

    def graph(host_side_too):
        g = torch.fx.Graph()
        a, gen = g.placeholder("a"), g.placeholder("fwd_rng_state_0")
        r = g.call_function(graphsafe_run_with_rng_state, (torch.ops.aten.rand.default, [3]), {"rng_state": gen})
        out = g.call_function(torch.ops.aten.add.Tensor, (a, r))
        if host_side_too:
            state = g.placeholder("state")
            out = g.call_function(torch.ops.aten.add.Tensor,
                                  (out, g.call_function(run_with_rng_state, (state, torch.ops.aten.rand.default, [3]))))
        g.output((out,))
        return torch.fx.GraphModule({}, g)

    assert B.random_use(graph(False)) == (True, False)
    assert B.random_use(graph(True)) == (True, True)
    kinds, spans, _ = B.plan_inputs([torch.ones(2), torch.Generator(), 3], (), set())
    assert kinds == [B.ARG_TENSOR, B.ARG_GENERATOR, B.ARG_INT] and spans[1] == 0


class _FakeCuda(torch.Tensor):
    """Stands for a CUDA tensor where only its device and dtype are read."""

    @staticmethod
    def __new__(cls):
        return torch.Tensor._make_subclass(cls, torch.empty(0))

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_span_covers_strided_views_and_empty_tensors():
    t = torch.zeros(4, 8)
    assert B.span(t) == 4 * 8 * 4
    assert B.span(t.t()) == 4 * 8 * 4
    assert B.span(t[:, :2]) == (3 * 8 + 1 + 1) * 4
    assert B.span(torch.zeros(0, 3)) == 0
    assert B.span(torch.zeros(1).expand(5)) == 4


def test_ties_name_the_same_object_and_tensors_over_one_storage_and_nothing_else():
    """describe()'s ties, on real tensors: the same object at a later
    position, views of one buffer (chunk, a view as another shape, as
    Inductor's reinterpret_tensor makes them), and nothing for tensors of
    their own, empty ones or constants."""
    buf = torch.arange(8.0)
    a, b = buf.chunk(2)
    other, empty = torch.ones(3), torch.empty(0)
    res = (buf, 7, a, buf, other, b, buf.view(2, 4), empty, torch.empty(0), other)
    assert B.ties(res) == [(-1, 0), (-1, 0), (0, 0), (0, 1), (-1, 0), (0, 0), (0, 0), (-1, 0), (-1, 0), (4, 1)]
    assert B.ties((b, a)) == [(-1, 0), (0, 0)]  # the earlier result, wherever its data begins


def test_describe_refuses_cpu_outputs_and_keeps_constants():
    assert B.describe([1, torch.zeros(2)]) == "output 1 is a tensor on cpu (a recording returns CUDA tensors only)"
    assert B.describe(torch.zeros(2)) == "the graph returned a Tensor, not a list or tuple"
    assert B.describe((3, None)) == (False, (None, None), (3, None))


def test_only_saved_tensors_the_compile_saw_on_the_gpu_are_marked_for_copying_from_the_cpu():
    """A training forward's results: its output, then what its backward
    needs. The compile's fake tensors say where each lies; a user's output
    is never marked, nor a saved tensor the compile itself put on the CPU,
    nor a saved SymInt."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.fx.Graph()
    x = g.placeholder("x")
    out = g.call_function(torch.relu, (x,))
    seed = g.call_function(torch.ops.aten.clone.default, (x,))
    host = g.call_function(torch.ops.aten.clone.default, (x,))
    size = g.call_function(torch.ops.aten.sym_size.int, (x, 0))
    lse = g.call_function(torch.ops.aten.clone.default, (x,))
    g.output((out, seed, host, size, lse))
    with FakeTensorMode():
        out.meta["val"] = torch.empty(2, device="cuda")
        seed.meta["val"] = torch.empty((), dtype=torch.int64, device="cuda")
        host.meta["val"] = torch.empty(2)
        lse.meta["val"] = torch.empty(4, device="cuda")
    size.meta["val"] = 2
    gm = torch.fx.GraphModule({}, g)
    assert B.saved_on_cuda(gm, 1) == (1, 4)
    assert B.saved_on_cuda(gm, 2) == (4,)
    assert B.saved_on_cuda(gm, 5) == ()


def test_a_saved_tensor_left_on_the_cpu_is_copied_to_the_device_with_its_values_and_nothing_else_moves():
    """onto_device copies, at the marked positions only, the tensors a run
    left on the CPU (the "device" here is meta, which a CPU machine has);
    it keeps a list a list and a tuple a tuple, hands back the very object
    where nothing moved, and copies nothing inside a capture."""
    out, seed, lse = torch.ones(2), torch.tensor(7), torch.zeros(3).to("meta")
    res = [out, seed, 5, lse]
    moved = B.onto_device(res, (1, 2, 3), "meta", lambda: False)
    assert isinstance(moved, list) and moved is not res and res[1] is seed
    assert moved[0] is out and moved[2] == 5 and moved[3] is lse
    assert moved[1].device.type == "meta" and moved[1].dtype == torch.int64 and moved[1].shape == ()
    as_tuple = B.onto_device(tuple(res), (1,), "meta", lambda: False)
    assert isinstance(as_tuple, tuple) and as_tuple[1].device.type == "meta"
    assert B.onto_device(res, (0,), "meta", lambda: True) is res  # in a capture: describe() refuses it
    assert B.onto_device(res, (2, 3), "meta", lambda: False) is res  # nothing on the CPU there
    assert B.onto_device(res, (), "meta", lambda: False) is res


def attention_backward_graph(op, dropout_p):
    """A backward's graph: placeholders (with the compile's fake values),
    then one attention backward whose seed and offset come from them, or
    from a forward recomputed inside the graph ("recompute")."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    aten = torch.ops.aten
    g = torch.fx.Graph()
    names = ("grad", "q", "lse", "out", "seed", "offset", "step")
    grad, q, lse, out, seed, offset, step = (g.placeholder(n) for n in names)
    with FakeTensorMode():
        for node in (grad, q, lse, out):
            node.meta["val"] = torch.empty(2, 2, 16, 32, device="cuda")
        for node in (seed, offset, step):  # step: a 0-d int64 input that is no seed
            node.meta["val"] = torch.empty((), dtype=torch.int64, device="cuda")
    mask = [True, True, True, False]
    if op == "efficient_alias":  # the seed through a view of the input
        seed = g.call_function(aten.alias.default, (seed,))
    if op == "recompute":  # an activation checkpoint: the forward runs again inside the backward
        scaled = g.call_function(aten.mul.Tensor, (q, step))
        fwd = g.call_function(aten._scaled_dot_product_efficient_attention.default,
                              (scaled, q, q, None, True, dropout_p))
        seed, offset = (g.call_function(operator.getitem, (fwd, i)) for i in (2, 3))
    if op in ("efficient", "efficient_alias", "recompute"):
        call = g.call_function(aten._scaled_dot_product_efficient_attention_backward.default,
                               (grad, q, q, q, None, out, lse, seed, offset, dropout_p, mask))
    elif op == "efficient_kwargs":
        call = g.call_function(aten._efficient_attention_backward.default, (grad, q, q, q, None, out, None, None, 16,
                                                                            16, lse),
                               {"dropout_p": dropout_p, "philox_seed": seed, "philox_offset": offset,
                                "custom_mask_type": 0, "bias_requires_grad": False})
    else:
        call = g.call_function(aten._scaled_dot_product_flash_attention_backward.default,
                               (grad, q, q, q, out, lse, None, None, 16, 16, dropout_p, False, seed, offset))
    g.output((call,))
    return torch.fx.GraphModule({}, g)


def test_the_seed_and_offset_memory_efficient_attentions_backward_reads_on_the_host_are_found_where_it_draws():
    """Memory-efficient attention's backward reads its philox seed and
    offset on the host outside a capture when it draws (dropout_p not 0):
    those inputs of the graph (positions 4 and 5) are the ones a plain run
    must get on the CPU, passed positionally or by keyword, or through a
    view. Seeds a forward recomputed inside the graph makes are not inputs,
    nor is an int64 input that feeds that forward;
    with dropout 0 the backward reads neither, and flash attention's
    backward is not on the list."""
    assert B.host_read_seeds(attention_backward_graph("efficient", 0.1)) == (4, 5)
    assert B.host_read_seeds(attention_backward_graph("efficient_kwargs", 0.2)) == (4, 5)
    assert B.host_read_seeds(attention_backward_graph("efficient_alias", 0.1)) == (4, 5)
    assert B.host_read_seeds(attention_backward_graph("recompute", 0.1)) == ()
    assert B.host_read_seeds(attention_backward_graph("efficient", 0.0)) == ()
    assert B.host_read_seeds(attention_backward_graph("flash", 0.1)) == ()


def test_onto_host_leaves_cpu_tensors_and_everything_in_a_capture_as_they_are():
    """onto_host copies only CUDA tensors (the GPU suite's fp32 attention
    with dropout copies real ones): a CPU tensor, a number, or anything at
    all inside a capture is handed on untouched, in the very list given."""
    seed, offset = torch.tensor(7), torch.tensor(9)
    args = [torch.ones(2), seed, offset, 3]
    assert B.onto_host(args, (1, 2, 3), lambda: False) is args
    assert args[1] is seed and args[2] is offset and args[3] == 3
    assert B.onto_host(args, (1, 2), lambda: True) is args and args[1] is seed


def test_a_plain_run_hands_the_graph_its_arguments_as_one_list_and_copies_only_where_told():
    """_boxed's plain call: the compiled graph gets the arguments as one new
    list (Inductor empties it), host-read seeds that lie on the CPU already
    are passed as they are, and a saved tensor left on the CPU is copied to
    the device after the run ("meta" here); with nothing to copy the
    graph's own result is handed back."""
    seen = []

    def compiled(args):
        seen.append(list(args))
        out = [args[1] * 2, torch.tensor(5)]
        args.clear()
        return out

    seed, x = torch.tensor(3), torch.ones(2)
    res = _backend._boxed(compiled, saved_cpu=(1,), device="meta", host_seeds=(0,), capturing=lambda: False)(seed, x)
    assert seen[-1][0] is seed and seen[-1][1] is x
    assert torch.equal(res[0], torch.full((2,), 2.0)) and res[1].device.type == "meta"
    out = _backend._boxed(compiled, capturing=lambda: False)(torch.ones(2), x)
    assert out[1].device.type == "cpu"
    inside = _backend._boxed(compiled, saved_cpu=(1,), device="meta", capturing=lambda: True)(seed, x)
    assert inside[1].device.type == "cpu", "inside a capture nothing is copied (describe() refuses it)"


def test_graphs_without_cuda_tensors_run_as_plain_inductor_graphs_with_the_reason_recorded():
    _backend.decisions.clear()
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 3, backend=_backend.compile_graph)
    assert torch.equal(f(torch.ones(2)), torch.full((2,), 3.0))
    assert _backend.decisions[-1]["plain_reason"] == "no CUDA tensor"


def test_the_gpt2_decoder_of_the_benchmark_is_not_taken_for_a_random_graph():
    """Every fused attention operator carries PyTorch's random tag for its
    dropout; the benchmark's GPT-2 decoder calls it with dropout_p = 0 and
    must be recorded, not run plainly as a graph that draws numbers."""
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    try:
        from torch_compare import make_gpt2
    finally:
        sys.path.pop(0)
    _backend.decisions.clear()
    torch._dynamo.reset()
    fn, generate, _ = make_gpt2(torch, torch.device("cpu"))
    generate(torch.compile(fn, backend=_backend.compile_graph), 0)
    assert _backend.decisions and not any(d["random"] for d in _backend.decisions)


def test_a_training_forward_says_where_its_saved_activations_begin_and_its_backward_keys_only_on_saved_weights():
    """A Linear-ReLU-Linear forward returns its output, then what its
    backward needs: the batch x (new every step), the second weight (a
    parameter) and the ReLU's output. Only the weight is STATIC in the
    backward (its address keys the recording); AOTAutograd itself calls
    all three static."""
    torch.manual_seed(0)
    _backend.decisions.clear()
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    f = torch.compile(m, backend=_backend.compile_graph)
    f(torch.randn(2, 8)).sum().backward()
    fw, bw = _backend.decisions
    assert (fw["graph"], bw["graph"]) == ("forward", "backward")
    assert fw["saved_from"] == 1  # one user output, then the saved tensors
    assert bw["static_input_idxs"] == (1,)  # backward inputs: x, the second weight, the ReLU's output, the tangent
    assert all(p.grad is not None for p in m.parameters())


def test_a_training_forwards_view_of_an_intermediate_is_named_as_an_output_aotautograd_makes_anew():
    """An output that is a view of an intermediate, the only one over it,
    reaches the program as torch.ops.aten._unsafe_view of what the graph
    returned, a new tensor: the forward names its position
    (memory_watched_outputs), after the updated values of inputs it
    mutates, so its hold on the step is watched through its memory. A
    plain output, and an input's view, are not named."""
    def decide(fn, *args):
        _backend.decisions.clear()
        torch._dynamo.reset()
        out = torch.compile(fn, backend=_backend.compile_graph)(*args)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
        return [d.get("memory_watched_outputs") for d in _backend.decisions if d["graph"] == "forward"]

    w = torch.randn(8, 8, requires_grad=True)
    assert decide(lambda x: (x @ w).relu().t(), torch.randn(4, 8)) == [(0,)]
    assert decide(lambda x: (x @ w).relu(), torch.randn(4, 8)) == [()]
    assert decide(lambda x: (x.t(), (x @ w).sum()), torch.randn(4, 8, requires_grad=True)) == [()]

    def mutating(x, y):
        y.mul_(2)  # an input that requires grad, written in place: its updated value comes first among the results
        return (x @ w + y).relu()[:, 0]
    y = torch.randn(4, 8, requires_grad=True) * 1  # not a leaf: autograd lets it be written
    assert decide(mutating, torch.randn(4, 8), y) == [(1,)]


def test_compiled_autograds_graph_of_the_backward_is_told_apart_as_a_backward():
    """With compiled autograd, a compiled step's backward() is traced by
    Dynamo into a graph of its own, which AOTAutograd compiles as an
    inference graph; its CompileId names it a compiled-autograd graph, and
    the backend makes it a backward (its outputs become .grad). Nothing
    else is taken for one: the forward stays a forward, the optimizer an
    inference graph."""
    torch.manual_seed(0)
    _backend.decisions.clear()
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    with torch._dynamo.config.patch(compiled_autograd=True):
        torch.compile(step, backend=_backend.compile_graph)(torch.randn(4, 8))
    kinds = [d["graph"] for d in _backend.decisions]
    assert kinds == ["forward", "compiled_autograd", "inference"], kinds
    assert _backend.decisions[2]["mutated_input_idxs"]  # the optimizer writes the parameters
    assert all(p.grad is not None for p in m.parameters())
    _backend.decisions.clear()
    torch._dynamo.reset()
    torch.compile(step, backend=_backend.compile_graph)(torch.randn(4, 8))  # compiled autograd off
    assert "compiled_autograd" not in [d["graph"] for d in _backend.decisions]


def test_a_backward_without_its_forwards_record_copies_every_saved_tensor():
    """Where the forward's compile left nothing under the backward's graph_id,
    no saved tensor is STATIC (each is copied unless it is a pool value)."""
    assert _backend._backward_static([torch.ones(1)] * 3, {"graph_id": object(), "static_input_idxs": [0, 1]}) == ()


def test_move_out_of_pool_copies_what_the_tensor_reads_and_keeps_its_object_layout_and_version():
    """What segment.c calls to move the arguments of the call that ends
    their step out of the pool (stale.c): the same object over a storage of
    its own of the same size, the bytes from its storage offset on copied
    (the bytes below were never its own: over a pool value at an offset
    they may be another output's), its layout and autograd version
    unchanged, the old storage left as it was. An inference tensor moves
    too, outside inference mode as well (the mover enters it for the
    set_): it raised StaleTensorError where Inductor reads it (a helper's
    audit). Its autograd base over the old storage moves with it (see
    test_a_moved_output_view_passed_with_a_view_of_itself_to_a_graph_that_writes_one_computes),
    so the old storage is written here through a tensor of its own."""
    base = torch.arange(24.0)
    t = base[4:16].view(3, 4).t()  # storage offset 4, strides (1, 4)
    t.mul_(1)  # a version of its own
    want, old = t.clone(), t.untyped_storage()
    base[:4] = -1  # below t's data: must not matter
    version = t._version  # shared with base's: 2
    assert _backend.move_out_of_pool([t]) == [True]
    assert t.untyped_storage().data_ptr() != old.data_ptr() and t.untyped_storage().nbytes() == old.nbytes()
    assert (t.storage_offset(), t.size(), t.stride()) == (4, (4, 3), (1, 4))
    assert t._version == version and torch.equal(t, want)
    assert t._base is base and base.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    torch.empty(0, dtype=torch.uint8).set_(old).zero_()  # the old storage is no longer t's
    assert torch.equal(t, want)
    e = torch.empty(0).as_strided((0,), (1,), 5)  # empty, past its 0-byte storage's end
    assert _backend.move_out_of_pool([e]) == [True] and e.numel() == 0 and e.storage_offset() == 5
    with torch.inference_mode():
        it = torch.ones(3)
    assert _backend.move_out_of_pool([it]) == [True]
    assert torch.equal(it, torch.ones(3)) and it.is_inference()
    with torch.inference_mode():
        it2 = torch.ones(3)
        assert _backend.move_out_of_pool([it2]) == [True]
        assert torch.equal(it2, torch.ones(3))


def test_move_out_of_pool_moves_tensors_over_one_storage_onto_one_new_storage():
    """An output and a view of it passed to one call (g(h, h[2:])) move
    together: after the move they are still views of one storage, so a
    write in place through one is read through the other, as in eager.
    Moved one by one, each got a copy of its own, and the write was lost
    to the other, silently (two helpers' audits). The copy begins at the
    lowest storage offset among them, here their autograd base's, which
    moves with them."""
    base = torch.arange(16.0)
    h = base[2:]  # storage offset 2
    v = h[4:].view(2, 5)  # storage offset 6
    other = torch.arange(4.0)
    old = h.untyped_storage()
    assert _backend.move_out_of_pool([v, h, other]) == [True, True, True]
    assert h.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() != old.data_ptr()
    assert other.untyped_storage().data_ptr() != h.untyped_storage().data_ptr()
    assert (h.storage_offset(), v.storage_offset()) == (2, 6)
    assert torch.equal(h, torch.arange(2.0, 16.0)) and torch.equal(other, torch.arange(4.0))
    assert base.untyped_storage().data_ptr() == h.untyped_storage().data_ptr()  # h's and v's _base
    h.mul_(10)  # eager: h.zero_() or any write in place
    assert torch.equal(v.flatten(), torch.arange(6.0, 16.0) * 10)
    torch.empty(0, dtype=torch.uint8).set_(old).zero_()  # the old storage is theirs no longer
    assert torch.equal(h, torch.arange(2.0, 16.0) * 10)


def test_move_out_of_pool_moves_tensors_over_storages_that_share_memory_onto_one_new_storage():
    """cgtree hands out two storages over one memory where a tie cannot be
    a view (an output of another dtype over an earlier one, a view below
    the earlier output): `tail, whole = f(x)` as `y[2:6], y`. Passed
    together to the call that ends their step, they moved onto two copies,
    and a write in place through `whole` was lost to `tail`, where eager
    (one storage) reads it: silently wrong (a helper's review). They now
    land on one storage, each at its place; a tensor over memory of its
    own still gets a storage of its own, and so does an empty one."""
    base = torch.arange(16.0)
    whole = torch.from_dlpack(base[1:12])  # a storage of its own over base's memory, from byte 4
    tail = torch.from_dlpack(base[3:7])  # another, from byte 12
    bits = torch.from_dlpack(base.view(torch.int32)[10:14])  # another dtype, from byte 40
    assert len({t.untyped_storage()._cdata for t in (whole, tail, bits)}) == 3
    other, empty = torch.arange(4.0), torch.from_dlpack(base[5:5])
    assert _backend.move_out_of_pool([tail, other, whole, empty, bits]) == [True] * 5
    assert tail.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr() == bits.untyped_storage().data_ptr()
    assert other.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
    assert (tail.data_ptr() - whole.data_ptr(), bits.data_ptr() - whole.data_ptr()) == (8, 36)
    assert whole.data_ptr() % 64 == base.data_ptr() % 64 + 4  # the group's copy keeps its places' alignment
    base.zero_()  # the old memory is theirs no longer
    assert torch.equal(whole, torch.arange(1.0, 12.0)) and torch.equal(tail, torch.arange(3.0, 7.0))
    whole.mul_(10)  # eager: a write in place through one, read through the others
    assert torch.equal(tail, torch.arange(3.0, 7.0) * 10)
    assert torch.equal(bits, torch.tensor([100.0, 110.0, 12.0, 13.0]).view(torch.int32))
    assert torch.equal(other, torch.arange(4.0)) and empty.numel() == 0


def test_move_out_of_pool_moves_a_tensor_whose_storage_overlaps_another_only_below_its_data_at_any_alignment():
    """Two unrelated outputs of one pool: b, a bfloat16 output
    at storage offset 1 (its storage begins 2 bytes below its data), and a,
    a float32 output at storage offset 4 (its storage begins 16 bytes below
    its data, in memory that is b's). Their storages overlap only in a's
    dead bytes below its offset. Merged onto one copy, a lands at byte
    at = a.start - b.start = 6 of it, no multiple of 4: a is refused (stays,
    marked stale: StaleTensorError where eager computes; a review). They
    are grouped by the bytes their tensors reach: each moves onto a copy of
    its own."""
    mem = torch.zeros(16, dtype=torch.float32)  # the pool: 64 bytes, 4-aligned
    mem[6:10] = torch.tensor([1.0, 2.0, 3.0, 4.0])  # a's data: bytes 24..40
    bst = torch.from_dlpack(mem.view(torch.bfloat16)[1:9]).untyped_storage()  # bytes 2..18
    b = torch.empty(0, dtype=torch.bfloat16).set_(bst, 1, (3,))  # data: bytes 4..10
    ast = torch.from_dlpack(mem[2:10]).untyped_storage()  # bytes 8..40
    a = torch.empty(0, dtype=torch.float32).set_(ast, 4, (4,))  # data: bytes 24..40
    bwant, awant = b.clone(), a.clone()
    assert _backend.move_out_of_pool([b, a]) == [True, True]
    mem.zero_()
    assert torch.equal(a, awant) and torch.equal(b, bwant)


def test_move_out_of_pool_gives_a_tensor_no_storage_of_an_unrelated_ones_memory():
    """g, a small output (a .grad AccumulateGrad took over, or
    any argument) lies in the pool below h = out[-1], a view at a large
    offset whose storage begins where the plain graph's did, far below it.
    Their storages overlap only in h's dead bytes: merged, g is set_ onto
    the whole union (hi - lo bytes), and keeps it alive as long as g lives
    (a kept .grad: for the rest of training), and g.storage_offset() moved
    (a review). g gets a storage of its own size."""
    mem = torch.zeros(1 << 16)  # 256 KiB of pool
    hst = torch.from_dlpack(mem).untyped_storage()
    h = torch.empty(0).set_(hst, (1 << 16) - 4, (4,))  # out[-1]: the last 16 bytes, offset 65532
    g = torch.from_dlpack(mem[100:104])  # 16 bytes of its own storage, inside h's dead zone
    assert _backend.move_out_of_pool([h, g]) == [True, True]
    assert g.untyped_storage().nbytes() == 16, g.untyped_storage().nbytes()
    assert g.storage_offset() == 0


def test_move_out_of_pool_moves_tensors_over_one_memory_whose_lowest_storage_begins_off_their_alignment():
    """b, a bfloat16 output at storage offset 1 (its storage begins 2
    bytes below its data, at byte 2), and a, a float32 output over memory
    b's data reaches (bytes 8..40; eager: one storage, aliased). Grouped,
    the new buffer begins at b's storage start (byte 2), so a lands at byte
    6 of it, no multiple of 4: a is refused (False, marked stale:
    StaleTensorError where eager computes; a review). The buffer's start,
    rounded down to 64 bytes, keeps every member aligned."""
    mem = torch.zeros(16, dtype=torch.float32)
    mem[2:10] = torch.arange(1.0, 9.0)
    bst = torch.from_dlpack(mem.view(torch.bfloat16)[1:12]).untyped_storage()  # bytes 2..24
    b = torch.empty(0, dtype=torch.bfloat16).set_(bst, 1, (10,))  # data: bytes 4..24
    a = torch.from_dlpack(mem[2:10])  # bytes 8..40: overlaps b's data
    bwant, awant = b.clone(), a.clone()
    assert _backend.move_out_of_pool([b, a]) == [True, True]
    mem.zero_()
    assert torch.equal(a, awant) and torch.equal(b, bwant)
    a.mul_(2)  # eager: a write through one is read through the other
    assert torch.equal(b[2:], (awant * 2).view(torch.bfloat16)[:8])


def test_move_out_of_pool_moves_tensors_over_one_memory_whose_storages_begin_off_their_element_size():
    """a and b, float32 over one memory on two storages that begin at bytes
    2 and 6 of a 64-byte-aligned buffer (their data lies off 4 bytes, as
    the storages do). Grouped from byte 2 they landed at 0 and 4 of the new
    buffer and moved; rounded down to 64 bytes they landed at 2 and 6, no
    multiple of 4, and both stayed unmoved (False: marked stale; a
    review). Where rounding down misplaces a member, the buffer begins at
    the highest place below that fits them all."""
    u = torch.arange(128, dtype=torch.uint8)
    assert u.data_ptr() % 64 == 0
    a = torch.empty(0).set_(torch.from_dlpack(u[2:40]).untyped_storage(), 0, (4,))
    b = torch.empty(0).set_(torch.from_dlpack(u[6:40]).untyped_storage(), 0, (4,))
    awant, bwant = a.clone(), b.clone()
    assert _backend.move_out_of_pool([a, b]) == [True, True]
    u.zero_()
    assert torch.equal(a.view(torch.int32), awant.view(torch.int32))
    assert torch.equal(b.view(torch.int32), bwant.view(torch.int32))
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert b.data_ptr() - a.data_ptr() == 4


def test_a_moved_output_view_passed_with_a_view_of_itself_to_a_graph_that_writes_one_computes():
    """h = f(x) under no_grad, f returning a view of an intermediate:
    AOTAutograd regenerates h from the base the graph returns, so h._base
    is that pool output. The next call's first graph reads h, and the mover
    set_ h onto a copy, but h._base stayed on the old storage, which the
    step's end marks. Later k(h, h[:, :1]) with k writing its first
    argument: AOTAutograd merges the two aliased inputs into a synthetic
    base taken from their common ._base, and the call raised
    StaleTensorError where plain Inductor computes (a review). The base on
    the view's storage now moves with it, onto the same copy, and is left
    out of the mover's list. (On the CPU: the pool base is an ordinary
    tensor, marked as the step's end marks its old storage.)"""
    torch._dynamo.reset()
    base = torch.arange(12.0)
    h = base.view(3, 4)[:, 1:]  # the output the program holds: a view of the pool base
    old = base.untyped_storage()
    assert _backend.move_out_of_pool([h]) == [True]  # the call that ends its step read it
    torch._C._set_storage_data_ptr_access_error_msg(old._cdata, "cgtree.torch.StaleTensorError: (the step's mark)")
    del base, old
    k = torch.compile(lambda a, b: (a.add_(1), b * 2), backend="aot_eager")  # AOTAutograd, as cgtree's backend
    _, r = k(h, h[:, :1])
    assert h.tolist() == [[2.0, 3.0, 4.0], [6.0, 7.0, 8.0], [10.0, 11.0, 12.0]]
    assert r.tolist() == [[4.0], [12.0], [20.0]]
    assert h._base.untyped_storage().data_ptr() == h.untyped_storage().data_ptr()  # the base moved with h
    assert h._base.tolist() == [0.0, 2.0, 3.0, 4.0, 4.0, 6.0, 7.0, 8.0, 8.0, 10.0, 11.0, 12.0]
    # a base that is passed too moves once; one set_ onto another storage stays where it is
    b2 = torch.arange(8.0)
    v2 = b2[4:]
    w = torch.arange(6.0)
    u = w[2:]
    w.set_(torch.arange(6.0, 12.0).untyped_storage())  # u's base now lies elsewhere
    wold = w.untyped_storage().data_ptr()
    assert _backend.move_out_of_pool([v2, b2, u]) == [True, True, True]
    assert v2._base is b2 and v2.untyped_storage().data_ptr() == b2.untyped_storage().data_ptr()
    assert w.untyped_storage().data_ptr() == wold and u.untyped_storage().data_ptr() != wold
    assert v2.tolist() == [4.0, 5.0, 6.0, 7.0] and u.tolist() == [2.0, 3.0, 4.0, 5.0]


def test_a_view_of_the_end_of_a_large_output_moves_with_a_copy_of_its_tail_and_its_base_stays():
    """h = out[-1], fed back at each call: h._base is the whole output. A
    base moves with its view only where that at most doubles the copy, so
    here only the tail is copied, as docs/torch.md's cost row says (moving
    every view's base copied the whole output at each call, 1024x the
    tail: a review), and the base stays on the old storage, to be marked."""
    out = torch.randn(1024, 256)
    h = out[-1]
    old, want = out.untyped_storage().data_ptr(), h.clone()
    copied, real = [], torch.Tensor.copy_

    def spy(self, src, *a, **k):
        copied.append(src.numel() * src.element_size())
        return real(self, src, *a, **k)

    torch.Tensor.copy_ = spy
    try:
        assert _backend.move_out_of_pool([h]) == [True]
    finally:
        torch.Tensor.copy_ = real
    assert sum(copied) == 256 * 4 and torch.equal(h, want)
    assert h.untyped_storage().data_ptr() != old and out.untyped_storage().data_ptr() == old

