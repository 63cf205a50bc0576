"""cgtree.torch.make_graphed_callables on a GPU: PyTorch's graphed callables
with every callable's forward and backward graphs in the one tree and pool.

Its route is torch.compile with cgtree's backend (Inductor kernels), so
every case compares bit for bit with the same callables compiled by plain
Inductor (torch.compile(m.forward, fullgraph=True, dynamic=False)), and
within RTOL/ATOL with eager and with torch.cuda.make_graphed_callables
(eager kernels: the same arithmetic, other rounding). PyTorch's own version
runs in a fresh process (graphed_program.py), under PyTorch's allocator.

Needs a CUDA GPU (skips without one) and imports cgtree.torch first, so
that its allocator is installed before CUDA starts.
"""
import copy
import os
import subprocess
import sys

import pytest

import torch_gpu  # skips the file without a GPU; imports cgtree.torch before CUDA starts

torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
from cgtree.torch._graphed import graphs_of  # noqa: E402
from cgtree.torch._graphs import ARG_TENSOR, ARG_TENSOR_STATIC  # noqa: E402

import graphed_program as prog  # noqa: E402


DEV = "cuda"
HERE = os.path.dirname(os.path.abspath(__file__))
# Inductor's kernels against eager's, over a few SGD steps of small fp32 MLPs
# (no TF32): a reduction summed in another order differs by a few ulps.
RTOL, ATOL = 1e-4, 1e-5


def fresh():
    torch._dynamo.reset()


def plain(m):
    """m's forward compiled by plain Inductor, as cgtree compiles it."""
    return torch.compile(m.forward, fullgraph=True, dynamic=False)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def same_all(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert torch.equal(x, y)


def segments(m, kind):
    return [d["segment"] for d in graphs_of(m) if d["graph"] == kind and "segment" in d]


def test_graphed_modules_match_torch_cuda_make_graphed_callables_on_the_same_modules():
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "cgtree_graphed_reference_%d.pt" % os.getpid())
    r = subprocess.run([sys.executable, os.path.join(HERE, "graphed_program.py"), out], capture_output=True,
                       text=True, timeout=170, env=dict(os.environ))
    assert "SAVED" in r.stdout, r.stderr[-3000:]
    want = torch.load(out)
    os.remove(out)
    fresh()
    a, b = prog.modules()
    ga, gb = ct.make_graphed_callables((a, b), prog.samples())
    losses, params = prog.train(a, b, ga, gb, prog.data())
    close(losses, want["losses"])
    for p, q in zip(params, want["params"]):
        close(p, q)
    for m in (a, b):  # both graphs of both modules are segments of the tree
        assert segments(m, "forward") and segments(m, "backward")


def test_graphed_modules_train_bit_for_bit_like_plain_inductor_and_close_to_eager():
    fresh()
    a, b = prog.modules()
    ra, rb = copy.deepcopy(a), copy.deepcopy(b)
    ea, eb = copy.deepcopy(a), copy.deepcopy(b)
    ga, gb = ct.make_graphed_callables((a, b), prog.samples())
    assert ga is a and gb is b, "modules come back as themselves, forward replaced"
    xs = prog.data(8)
    before = ct.stats()
    got = prog.train(a, b, ga, gb, xs)
    want = prog.train(ra, rb, plain(ra), plain(rb), xs)
    eager = prog.train(ea, eb, ea, eb, xs)
    same_all([got[0]] + got[1], [want[0]] + want[1])
    close(got[0], eager[0])
    for p, q in zip(got[1], eager[1]):
        close(p, q)
    assert ct.stats()["replays"] - before.get("replays", 0) >= 8, "forwards and backwards should replay"


def test_a_host_branch_between_graphed_modules_grows_a_branch_of_one_tree():
    fresh()
    torch.manual_seed(0)
    trunk = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).to(DEV)
    head_a = torch.nn.Sequential(torch.nn.Linear(64, 1)).to(DEV)
    head_b = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(DEV)
    mods = (trunk, head_a, head_b)
    refs, eagers = copy.deepcopy(mods), copy.deepcopy(mods)
    h = torch.randn(16, 64, device=DEV, requires_grad=True)
    ct.make_graphed_callables(mods, ((torch.randn(16, 32, device=DEV),), (h,), (h,)))
    g = torch.Generator().manual_seed(3)
    xs = [(torch.randn(16, 32, generator=g) + (1.0 if i % 2 else -1.0)).to(DEV) for i in range(12)]

    def run(ms, calls):
        opt = torch.optim.SGD([p for m in ms for p in m.parameters()], lr=0.05)
        losses = []
        for x in xs:
            opt.zero_grad()
            hid = calls[0](x)
            y = calls[1](hid) if float(x.sum()) > 0 else calls[2](hid)  # the host branch
            loss = y.square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        return [torch.stack(losses)] + [p.detach().clone() for m in ms for p in m.parameters()]

    got = run(mods, mods)
    want = run(refs, [plain(m) for m in refs])
    eager = run(eagers, eagers)
    same_all(got, want)
    for p, q in zip(got, eager):
        close(p, q)
    tree = ct._install.tree_for(torch.cuda.current_device())[0]  # this thread's one tree for the device
    nodes = tree.nodes()
    by_id = {n["id"]: n for n in nodes}
    recorded = {n["segment"] for n in nodes if n["state"] == "RECORDED"}
    for m in mods:
        fw, bw = segments(m, "forward"), segments(m, "backward")
        assert len(fw) == 1 and len(bw) == 1, graphs_of(m)
        assert fw[0] in recorded and bw[0] in recorded, "forward and backward recorded in the one tree"
    trunk_fw = segments(trunk, "forward")[0]
    for head in (head_a, head_b):  # both heads' forwards hang below the trunk's: a branch
        assert any(n["segment"] == segments(head, "forward")[0] and n["state"] == "RECORDED"
                   and by_id.get(n["parent"], {}).get("segment") == trunk_fw for n in nodes)


def test_parameters_are_static_and_an_optimizer_step_between_calls_changes_the_output_as_in_eager():
    fresh()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(DEV)
    params = list(m.parameters())
    params[0].grad = torch.ones_like(params[0])  # a gradient from before: the warm-up must leave it
    ref, eager = copy.deepcopy(m), copy.deepcopy(m)
    ct.make_graphed_callables(m, (torch.randn(16, 32, device=DEV),))
    assert torch.equal(params[0].grad, torch.ones_like(params[0])) and all(p.grad is None for p in params[1:]), \
        "warm-up must not touch .grad (autograd.grad, as PyTorch's)"
    fw = [d for d in graphs_of(m) if d["graph"] == "forward"]
    assert len(fw) == 1 and "kinds" in fw[0], graphs_of(m)
    assert sum(k == ARG_TENSOR_STATIC for k in fw[0]["kinds"]) >= len(params), "parameters are STATIC inputs"
    assert ARG_TENSOR in fw[0]["kinds"], "the batch is DYNAMIC (copied into the pool)"
    x = torch.randn(16, 32, device=DEV)
    outs = {}
    for name, mod, f in (("cgtree", m, m), ("inductor", ref, plain(ref)), ("eager", eager, eager)):
        opt = torch.optim.SGD(mod.parameters(), lr=0.1)
        ys = []
        for i in range(10):
            opt.zero_grad()
            y = f(x)
            ys.append(y.detach().clone())
            y.square().mean().backward()
            opt.step()  # in place: the next replay reads the new weights at the same addresses
            if name == "cgtree" and i == 5:
                rec = ct.stats()["recordings"]
        outs[name] = torch.stack(ys)
    assert ct.stats()["recordings"] == rec, "steady state: parameters updated in place need no new recording"
    assert not torch.equal(outs["cgtree"][0], outs["cgtree"][-1]), "the optimizer steps change the output"
    assert torch.equal(outs["cgtree"], outs["inductor"])
    close(outs["cgtree"], outs["eager"])


def test_outputs_are_usable_by_autograd_through_a_following_eager_op():
    fresh()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(DEV)
    ref, eager = copy.deepcopy(m), copy.deepcopy(m)
    ct.make_graphed_callables(m, (torch.randn(16, 32, device=DEV),))
    grads = {}
    for name, mod, f in (("cgtree", m, m), ("inductor", ref, plain(ref)), ("eager", eager, eager)):
        w = torch.linspace(-1, 1, 8, device=DEV, requires_grad=True)
        for i in range(4):
            y = f(torch.full((16, 32), 0.1 * (i + 1), device=DEV))
            assert y.requires_grad and y.grad_fn is not None
            (torch.tanh(y) * w).sum().backward()  # eager ops after the graphed module
        grads[name] = [w.grad.clone()] + [p.grad.clone() for p in mod.parameters()]
    same_all(grads["cgtree"], grads["inductor"])
    for a, b in zip(grads["cgtree"], grads["eager"]):
        close(a, b)


def test_a_single_function_gives_a_single_graphed_function_and_pool_is_ignored_with_a_warning():
    fresh()

    def f(x, w):
        return torch.relu(x @ w).sum(1)

    torch.manual_seed(0)
    w = torch.randn(32, 8, device=DEV, requires_grad=True)
    sample = (torch.randn(16, 32, device=DEV, requires_grad=True), w)
    with pytest.warns(RuntimeWarning, match="pool is ignored"):
        g = ct.make_graphed_callables(f, sample, pool=torch.cuda.graph_pool_handle())
    assert callable(g) and not isinstance(g, tuple)
    assert w.grad is None and sample[0].grad is None
    assert segments(g, "forward") and segments(g, "backward")
    res = {}
    for name, fn in (("cgtree", g), ("inductor", torch.compile(f, fullgraph=True, dynamic=False)), ("eager", f)):
        rows = []
        for i in range(4):
            x = (torch.arange(16 * 32, device=DEV, dtype=torch.float32).view(16, 32) / 500 - i).requires_grad_()
            wi = w.detach().clone().requires_grad_()
            out = fn(x, wi)
            out.square().sum().backward()
            rows += [out.detach().clone(), x.grad, wi.grad]
        res[name] = rows
    same_all(res["cgtree"], res["inductor"])
    for a, b in zip(res["cgtree"], res["eager"]):
        close(a, b)


def test_a_callable_with_a_graph_break_raises_cgtree_error_naming_it_and_no_module_changes():
    fresh()

    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            torch._dynamo.graph_break()
            return torch.relu(y)

    good = torch.nn.Linear(8, 8).to(DEV)
    bad = Breaks().to(DEV)
    x = torch.randn(4, 8, device=DEV)
    with pytest.raises(ct.CgtreeError, match=r"callables\[1\] \(Breaks\) cannot be captured as one graph"):
        ct.make_graphed_callables((good, bad), ((x,), (x,)))
    assert "forward" not in vars(good) and "forward" not in vars(bad), "no module's forward was replaced"
    assert all(p.grad is None for p in good.parameters())


def test_under_no_grad_a_graphed_output_passed_to_another_graphed_callable_is_moved_into_its_call_and_right():
    """Each call of a graphed callable is a call of a compiled model: under
    no_grad no saved activation holds the step open, so b's call begins a
    step that ends a's output. That output is b's argument: cgtree moves it
    out of the pool before the new step's work (stale.c), and b computes
    with it as eager does, bit for bit as plain Inductor. It raised
    StaleTensorError before the move."""
    fresh()
    a, b = prog.modules()
    ea, eb = copy.deepcopy(a), copy.deepcopy(b)
    ra, rb = copy.deepcopy(a), copy.deepcopy(b)
    pa, pb = plain(ra), plain(rb)
    ct.make_graphed_callables((a, b), prog.samples())
    before = ct.stats()
    with torch.no_grad():
        for x in prog.data(6):
            h = a(x)
            got = b(h)
            close(got, eb(ea(x)))
            assert torch.equal(got, pb(pa(x)))
            assert torch.equal(h, pa(x)), "a's output, moved into b's call, still reads right"
            close(b(a(x).clone()), eb(ea(x)))
    after = ct.stats()
    assert after["arguments_moved"] - before["arguments_moved"] >= 4
    assert after["replays"] - before["replays"] >= 8


def train_head(a, b, fa, fb, xs, detach, lr=0.1):
    """SGD steps of loss(fb(fa(x))), fa's output detached where asked;
    (losses, every parameter) on the CPU."""
    params = list(a.parameters()) + list(b.parameters())
    opt = torch.optim.SGD([p for p in params if p.requires_grad], lr=lr)
    losses = []
    for x in xs:
        opt.zero_grad()
        out = fb(fa(x).detach()) if detach else fb(fa(x))  # fa's temporary dies at once: nothing holds its step
        loss = (out - 1).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return torch.stack(losses).cpu(), [p.detach().cpu().clone() for p in params]


@pytest.mark.parametrize("how", ["frozen_trunk", "detached_feature"])
def test_a_frozen_trunk_or_a_detached_feature_before_a_trainable_head_trains_as_plain_inductor(how):
    """A frozen trunk (requires_grad_(False)) is an inference graph: its
    output, alive, holds the step for b's call, a training forward's
    (module.c, "Inference outputs a training forward reads"), and nothing
    moves. A feature passed on detached is a training forward's output
    whose saved activations die with the temporary: nothing holds the step,
    b's call begins one, and a's output is its argument: moved, as under
    no_grad. Before the hold and the move, b's call raised
    StaleTensorError where PyTorch's make_graphed_callables computes (a
    helper's audit on an H100)."""
    fresh()
    a, b = prog.modules()
    if how == "frozen_trunk":
        a.requires_grad_(False)
    ra, rb = copy.deepcopy(a), copy.deepcopy(b)
    ea, eb = copy.deepcopy(a), copy.deepcopy(b)
    x_sample = torch.randn(16, 32, device=DEV)
    h_sample = torch.randn(16, 64, device=DEV, requires_grad=True)
    ct.make_graphed_callables((a, b), ((x_sample,), (h_sample,)))
    xs = prog.data(8)
    detach = how == "detached_feature"
    before = ct.stats()
    got = train_head(a, b, a, b, xs, detach)
    want = train_head(ra, rb, plain(ra), plain(rb), xs, detach)
    eager = train_head(ea, eb, ea, eb, xs, detach)
    same_all([got[0]] + got[1], [want[0]] + want[1])
    close(got[0], eager[0])
    for p, q in zip(got[1], eager[1]):
        close(p, q)
    after = ct.stats()
    if detach:
        assert after["arguments_moved"] - before["arguments_moved"] >= 4
    else:
        assert after["arguments_moved"] == before["arguments_moved"]
        held = after["steps_held_for_inference_outputs"] - before["steps_held_for_inference_outputs"]
        assert held >= 4
    assert after["replays"] - before["replays"] >= 8, "forwards and backwards should replay"


def test_a_graphed_module_with_dropout_replays_fresh_masks_bit_equal_to_plain_inductor():
    """docs/torch.md, Graphed eager modules: "random graphs, dropout
    included, are recorded". A graphed module with dropout trains, seeded
    after the graphing, to Inductor's very losses and weights (the plain
    reference warmed up once, its gradients then cleared, so that neither
    compiles inside the timed loop); its forward and backward replay, none
    runs plainly, and two calls on one input draw two masks."""
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                   torch.nn.Linear(64, 1)).to(DEV)

    fresh()
    m, ref = model(), model()
    ct.make_graphed_callables(m, (torch.randn(16, 32, device=DEV),))
    f_ref = plain(ref)
    f_ref(torch.randn(16, 32, device=DEV)).sum().backward()
    for p in ref.parameters():
        p.grad = None
    xs = prog.data(8)

    def train(mod, f):
        opt = torch.optim.SGD(mod.parameters(), lr=0.05)
        torch.manual_seed(11)
        losses = []
        for x in xs:
            loss = (f(x) - 1).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach().clone())
        return losses

    want = train(ref, f_ref)
    before = ct.stats()
    got = train(m, m)
    after = ct.stats()
    same_all(got, want)
    same_all(list(m.parameters()), list(ref.parameters()))
    assert after["replays"] - before.get("replays", 0) >= 2 * 6, "forward and backward should replay"
    assert after.get("graphs_plain", 0) == before.get("graphs_plain", 0)
    with torch.no_grad():
        x = xs[0]
        a, b = m(x).clone(), m(x).clone()
    assert not torch.equal(a, b), "a replay drew the same mask again"


def test_a_graphed_modules_output_kept_past_its_step_raises_on_access():
    """docs/torch.md, Graphed eager modules: "Outputs kept past their step
    raise on access; PyTorch's are overwritten silently by the next replay
    of their graph." Once the module replays, an output kept across the
    next call raises the stale mark's error when read (a view made before
    its step ended too), and the
    last call's output reads the eager value."""
    fresh()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(DEV)
    ct.make_graphed_callables(m, (torch.randn(16, 32, device=DEV),))
    xs = prog.data(6)
    with torch.no_grad():
        for x in xs[:3]:
            m(x)  # replays from here
        before = ct.stats()["replays"]
        kept = m(xs[3])
        view = kept[2:]
        last = m(xs[4])
        assert ct.stats()["replays"] - before >= 2
        for t in (kept, view):
            with pytest.raises(RuntimeError, match="StaleTensorError"):  # the storage's mark (docs/torch.md)
                t.sum()
        want = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(xs[4], m[0].weight, m[0].bias)),
                                          m[2].weight, m[2].bias)
        close(last, want)


def test_retain_graph_through_a_graphed_module_needs_donated_buffers_off_and_then_matches_inductor():
    """docs/torch.md, Graphed eager modules: "loss.backward(retain_graph=True)
    itself raises AOTAutograd's error about donated buffers ... Set
    torch._functorch.config.donated_buffer = False before the callables are
    graphed and leave it so". With cgtree's backend on a GPU: the retaining
    backward raises with the flag on; with it off, both backwards compute,
    and the gradients (twice the first) are plain Inductor's bit for bit,
    the same shapes in both cases."""
    was, det = torch._functorch.config.donated_buffer, torch._inductor.config.deterministic
    # Both sides compile the off case's backward afresh: Inductor's deterministic mode has their reductions
    # pick the same configurations, not the one each benchmark found fastest.
    torch._inductor.config.deterministic = True
    try:
        for donated in (True, False):
            fresh()
            torch._functorch.config.donated_buffer = donated
            torch.manual_seed(0)
            # One width for both cases: the second case's compile of the same graphs used to get the first
            # case's donated backward from Inductor's FX graph cache, and its second backward read activations
            # the first had overwritten (cgtree's backend now keys a backward's compile by its donated buffers).
            m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(DEV)
            ref = copy.deepcopy(m)
            ct.make_graphed_callables(m, (torch.randn(16, 32, device=DEV),))
            x = prog.data(1)[0]
            if donated:
                loss = m(x).square().sum()
                with pytest.raises(RuntimeError, match="donated buffers"):
                    loss.backward(retain_graph=True)
                continue
            grads = {}
            for name, mod, f in (("cgtree", m, m), ("inductor", ref, plain(ref))):
                # plain Inductor's compile without its FX graph cache, which may hold a donated backward of
                # these graphs from an earlier process (its key does not say what was donated)
                with torch._inductor.config.patch(fx_graph_cache=name == "cgtree"):
                    for _ in range(3):  # the last round replays
                        for p in mod.parameters():
                            p.grad = None
                        loss = f(x).square().sum()
                        loss.backward(retain_graph=True)
                        first = [p.grad.clone() for p in mod.parameters()]
                        loss.backward()
                grads[name] = first + [p.grad.clone() for p in mod.parameters()]
            same_all(grads["cgtree"], grads["inductor"])
            for g1, g2 in zip(grads["cgtree"][:4], grads["cgtree"][4:]):
                assert torch.equal(g2, 2 * g1)
    finally:
        torch._functorch.config.donated_buffer, torch._inductor.config.deterministic = was, det
        fresh()
