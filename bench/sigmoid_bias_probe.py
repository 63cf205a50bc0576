# bench/sigmoid_bias_probe.py — a Linear and a sigmoid trained six AdamW steps by cgtree
# (or plain Inductor with its FX cache off: plain-nocache; after another compile:
# plain-warm), then by plain Inductor, with its autotuning log: is the bias bit-equal?
# Run from the repo root with a fresh TORCHINDUCTOR_CACHE_DIR each time (bench/RESULTS.md):
#   python3 bench/sigmoid_bias_probe.py cgtree|plain-nocache|plain-warm
# bench/autotune_reuse_probe.py runs the same two phases (sigmoid_pair, first_phase).
import copy
import glob
import logging
import os
import sys

sys.path.insert(0, "python/tests")
import test_torch_training as t  # noqa: E402

torch = t.torch


def sigmoid_pair(mode, device="cuda"):
    """The test's SigmoidHead twice, after a Dynamo reset: the first compiled
    by cgtree (mode "cgtree") or by plain Inductor, the second by plain
    Inductor; and six batches for both."""
    m = t.SigmoidHead().to(device)
    torch._dynamo.reset()
    ref = copy.deepcopy(m)
    cf = torch.compile(m, backend="cgtree" if mode == "cgtree" else "inductor")
    return m, ref, cf, torch.compile(ref), t.batches(6, width=16)


def first_phase(mode, cf, m, xs):
    """Phase A: the first model trained; a plain mode turns the FX graph cache
    off for it, so that phase B compiles its graphs again. The losses."""
    if mode == "cgtree":
        return t.train(cf, m, xs)
    with torch._inductor.config.patch(fx_graph_cache=False):
        return t.train(cf, m, xs)


def main(mode):
    h = logging.StreamHandler(sys.stdout)
    lg = logging.getLogger("torch._inductor.runtime.triton_heuristics")
    lg.setLevel(logging.DEBUG)
    lg.addHandler(h)
    m, ref, cf, rf, xs = sigmoid_pair(mode)
    if mode == "plain-warm":  # another compile first: its worker pool warms, as a program's first graph does
        torch.compile(lambda a: (a * 2).sum(1))(torch.randn(64, 64, device="cuda"))
    print("--- A", mode)
    got = first_phase(mode, cf, m, xs)
    from torch._inductor.async_compile import CompiledTritonKernels as K
    print("FUTURES", len(K._cache), [type(v).__name__ for v in K._cache.values()])
    print("BEST FILES", [f.split("/")[-1][:8] for f in
                         glob.glob(os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/**/*.best_config", recursive=True)])
    print("--- B plain")
    want = t.train(rf, ref, xs)
    print("RESULT", mode, "bias equal", torch.equal(m.lin.bias, ref.lin.bias), "losses", torch.equal(got, want))


if __name__ == "__main__":
    main(sys.argv[1])
