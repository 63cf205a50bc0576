# bench/sigmoid_bias_probe.py — a Linear and a sigmoid trained six AdamW steps by cgtree
# (or plain Inductor with its FX cache off: plain-nocache; after another compile:
# plain-warm), then by plain Inductor, with its autotuning log: is the bias bit-equal?
# Run from the repo root with a fresh TORCHINDUCTOR_CACHE_DIR each time (bench/RESULTS.md).
# session 43: why does SigmoidHead's bias differ from Inductor's in the last bits on a cold cache?
import os, sys, logging
sys.path.insert(0, "python/tests")
import test_torch_training as t
torch = t.torch
h = logging.StreamHandler(sys.stdout)
lg = logging.getLogger("torch._inductor.runtime.triton_heuristics"); lg.setLevel(logging.DEBUG); lg.addHandler(h)
mode = sys.argv[1]
m = t.SigmoidHead().to("cuda")
torch._dynamo.reset()
import copy
ref = copy.deepcopy(m)
cf = torch.compile(m, backend="cgtree" if mode == "cgtree" else "inductor")
rf = torch.compile(ref)
xs = t.batches(6, width=16)
if mode == "plain-warm":  # another compile first: its worker pool warms, as a program's first graph does
    torch.compile(lambda a: (a * 2).sum(1))(torch.randn(64, 64, device="cuda"))
print("--- A", mode)
if mode in ("plain-nocache", "plain-warm"):
    with torch._inductor.config.patch(fx_graph_cache=False):
        got = t.train(cf, m, xs)
else:
    got = t.train(cf, m, xs)
import glob
from torch._inductor.async_compile import CompiledTritonKernels as K
print("FUTURES", len(K._cache), [type(v).__name__ for v in K._cache.values()])
print("BEST FILES", [f.split("/")[-1][:8] for f in glob.glob(os.environ["TORCHINDUCTOR_CACHE_DIR"] + "/**/*.best_config", recursive=True)])
print("--- B plain")
want = t.train(rf, ref, xs)
print("RESULT", mode, "bias equal", torch.equal(m.lin.bias, ref.lin.bias), "losses", torch.equal(got, want))
