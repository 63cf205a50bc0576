#!/usr/bin/env python3
"""cgtree as a torch.compile backend, side by side with PyTorch on real programs.

    python3 bench/torch_compare.py [--examples branch,early_exit,gpt2] [--modes ...]
                                   [--out results.jsonl] [--budget SECONDS]

For each example and each mode, a fresh Python process (PyTorch's CUDAGraph
Trees refuse a swapped allocator, and cgtree must install its allocator before
CUDA starts) runs the program, checks nothing, and reports: ms per step (or per
token), peak device memory, recordings, compile + record time (wall time of
the warm-up calls), and, for cgtree, the backend's own time per replayed
segment. The parent then compares every mode's outputs with Inductor without
CUDA graphs (bit for bit) and prints one table.

Identical inputs and weights in every process: each example builds its
weights and inputs on the CPU from a seeded torch.Generator (or under
torch.manual_seed(0)) and only then copies them to the GPU, and every child
reports a checksum of them ("inputs" in the JSON: the bits of every input
and parameter), which the parent checks against Inductor's before it
compares outputs. So "DIFFERENT" means the computation differs, never the
data.

Peak memory, measured the same way in every mode, in two windows:
  warm-up  from just before the first compiled call to the end of the warm-up
           calls: compilation (Triton autotuning and its 50 MiB L2-flush
           buffer on an H100, when the autotune cache is cold), recording,
           the first replays.
  steady   the timed calls (peaks reset after the warm-up).
PyTorch modes: torch.cuda.max_memory_allocated (reset with
reset_peak_memory_stats at the start of each window). cgtree: its own
figures (PyTorch's raise under a swapped allocator): the most bytes in use
at one moment, outside the pool and in it together (cgtree.torch.memory_stats'
peak_bytes; outside the pool counted as PyTorch counts allocated bytes, the
request rounded up to 512 bytes; pool bytes in use as the tree's allocator
holds them; reset at the start of each window). The JSON also has
peak_bound_mib, eager peak + lifetime pool peak, an upper bound.
Both include cuBLAS's workspaces (PyTorch 2.11 allocates them through the
current allocator: 32 MiB per (handle, stream) on sm90 plus 1 MiB for
cuBLASLt; cgtree, like reduce-overhead, drops them around every recording,
so the one a graph uses is a pool temporary), and both exclude what an
allocator caches. "reserved" is
torch.cuda.max_memory_reserved against cgtree's cudaMalloc'd bytes
outside the pool plus the pool's reserved bytes, at the end.
Modes of one example share Inductor's on-disk caches, so the first compiled
mode (inductor, by default order) compiles and autotunes cold and the
others find the cache warm: compare compile times and warm-up peaks of
reduce-overhead and cgtree with each other, not with the first mode.

Modes: eager; inductor (torch.compile, no CUDA graphs); reduce-overhead
(torch.compile mode="reduce-overhead": PyTorch's CUDAGraph Trees); cgtree
(torch.compile backend="cgtree"). Not run unless named in --modes:
inductor+alloc (plain Inductor with cgtree.torch imported, so cgtree's
allocator serves every allocation: what the allocator alone costs).

Examples:
  branch      the CUDAGraph Trees documentation example: graph 1, then
              `if y.sum() > 0` picks graph 2 or 3, a graph break, graph 4;
              the paths alternate every call. (Graph 4 multiplies by 2 where
              the docs multiply by torch.rand_like, so outputs can be compared.)
  early_exit  6 residual MLP layers; after each, a host check of the hidden
              state's mean decides whether to exit (a graph break per layer);
              4 inputs exit at different depths, so the tree has many paths.
  cond        torch.cond on a device predicate (x.sum() > 0): Inductor syncs
              on it, so no CUDA graph can hold the graph; the inputs alternate.
  gpt2        transformers GPT2LMHeadModel, random init, small config,
              StaticCache; 64 tokens per call of generate(): one compiled call
              per token, sampling (torch.multinomial, seeded) and the EOS check
              on the host between calls.
"""
import argparse
import json
import os
import subprocess
import sys
import time

MODES = ["eager", "inductor", "reduce-overhead", "cgtree"]


# ----------------------------------------------------------------- examples

def make_branch(torch, dev):
    def foo(x):
        y = x * x * x
        if y.sum() > 0:
            z = y ** y
        else:
            z = y.abs() ** y.abs()
        torch._dynamo.graph_break()
        return z * 2

    g = torch.Generator().manual_seed(0)
    x = (torch.rand(256, 256, generator=g) * 0.5 + 0.25).to(dev)
    inputs = [x, -x]

    def step(fn, i):
        return fn(inputs[i % 2])

    return foo, step, {"unit": "step", "segments_per_step": 3, "data": inputs}


def make_early_exit(torch, dev):
    torch.manual_seed(0)
    D, L = 512, 6

    class EarlyExit(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(D, D) for _ in range(L))
            self.head = torch.nn.Linear(D, 16)
            self.register_buffer("thresholds", torch.tensor([1.5, 1.0, 0.6, 0.4, 0.2, 0.1]))

        def layer(self, i, h):
            return h + 0.1 * torch.nn.functional.gelu(self.layers[i](h))

        # Unrolled by hand: Dynamo gives up on a frame whose graph break sits inside a loop.
        def forward(self, x):
            t = self.thresholds
            h = self.layer(0, x)
            if h.mean() > t[0]:  # data-dependent: a graph break after every layer
                return self.head(h) + 0
            h = self.layer(1, h)
            if h.mean() > t[1]:
                return self.head(h) + 1
            h = self.layer(2, h)
            if h.mean() > t[2]:
                return self.head(h) + 2
            h = self.layer(3, h)
            if h.mean() > t[3]:
                return self.head(h) + 3
            h = self.layer(4, h)
            if h.mean() > t[4]:
                return self.head(h) + 4
            h = self.layer(5, h)
            return self.head(h) + 5

    m = EarlyExit().eval()  # built on the CPU from the seeded CPU generator, then copied
    base = torch.randn(32, D, generator=torch.Generator().manual_seed(1))
    m = m.to(dev)
    inputs = [(base + s).to(dev) for s in (0.05, 0.3, 0.7, 2.0)]

    def step(fn, i):
        return fn(inputs[i % len(inputs)])

    return m, step, {"unit": "step", "segments_per_step": None, "data": inputs + list(m.state_dict().values())}


def make_gpt2(torch, dev):
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=4096, n_positions=256, n_embd=256, n_layer=4, n_head=4,
                     bos_token_id=0, eos_token_id=4095)
    model = GPT2LMHeadModel(cfg).eval().to(dev)  # initialised on the CPU under the seed, then copied
    prompt = torch.randint(0, 4000, (1, 8), generator=torch.Generator().manual_seed(1)).to(dev)
    new_tokens = 64
    max_len = 8 + new_tokens
    StaticCache = transformers.StaticCache

    def new_cache():
        try:
            return StaticCache(config=cfg, max_cache_len=max_len)
        except TypeError:
            return StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len, device=dev, dtype=torch.float32)

    def forward(input_ids, cache, cache_position):
        return model(input_ids=input_ids, past_key_values=cache, cache_position=cache_position,
                     use_cache=True).logits

    state = {}

    def generate(fn, i):
        cache = state.get("cache")
        if cache is None:
            cache = state["cache"] = new_cache()
        else:
            cache.reset()
        g = torch.Generator(device=dev)
        g.manual_seed(1234)
        with torch.no_grad():
            logits = forward(prompt, cache, torch.arange(8, device=dev))  # prefill: eager in every mode
            tokens = []
            pos = 8
            tok = torch.multinomial(torch.softmax(logits[:, -1].float(), -1), 1, generator=g)
            for _ in range(new_tokens):
                tokens.append(tok)
                logits = fn(tok, cache, torch.tensor([pos], device=dev))
                pos += 1
                probs = torch.softmax(logits[:, -1].float(), -1)
                tok = torch.multinomial(probs, 1, generator=g)  # sampling on the host side of a graph break
                if int(tok.item()) == cfg.eos_token_id:  # the end-of-sequence check on the host
                    break
            return torch.cat(tokens + [logits[:, -1].argmax(-1, keepdim=True)], 1)

    generate.tokens = new_tokens
    return forward, generate, {"unit": "token", "tokens_per_step": new_tokens, "segments_per_step": None,
                               "data": [prompt] + list(model.state_dict().values())}


def make_cond(torch, dev):
    """torch.cond on a device predicate: Inductor syncs on the predicate, so
    no CUDA graph can hold it; cgtree must run it at Inductor's speed."""
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: (t.sin() * 2).cos(), lambda t: (t.cos() + 1).sin(), (x,))

    g = torch.Generator().manual_seed(0)
    x = (torch.rand(256, 256, generator=g) - 0.5).to(dev)
    inputs = [x + 0.1, x - 0.1]

    def step(fn, i):
        return fn(inputs[i % 2])

    return f, step, {"unit": "step", "segments_per_step": 1, "data": inputs}


def make_sample(torch, dev):
    """A sampling step of a small decoder: embedding, two residual GELU
    layers, softmax with a temperature, multinomial; then a host check on
    the sampled tokens (an end-of-sequence test: a graph break). The first
    graph draws random numbers at every call, so its replays must draw
    Inductor's numbers for the outputs to match."""
    torch.manual_seed(0)
    V, D = 4096, 512

    class Sampler(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, D)
            self.l1 = torch.nn.Linear(D, D)
            self.l2 = torch.nn.Linear(D, D)
            self.head = torch.nn.Linear(D, V)

        def forward(self, tok):
            h = self.emb(tok)
            h = h + torch.nn.functional.gelu(self.l1(h))
            h = h + torch.nn.functional.gelu(self.l2(h))
            nxt = torch.multinomial(torch.softmax(self.head(h) / 0.8, dim=-1), 1).squeeze(-1)
            if (nxt == 0).any():  # the end-of-sequence check, on the host
                return nxt.clamp(min=1)
            return nxt + 0

    m = Sampler().eval().to(dev)
    g = torch.Generator().manual_seed(1)
    toks = [torch.randint(1, V, (16,), generator=g).to(dev) for _ in range(4)]

    def step(fn, i):
        return fn(toks[i % len(toks)])

    return m, step, {"unit": "step", "segments_per_step": 2, "data": toks}


def make_rand(torch, dev):
    """The smallest random graph: one uniform draw and one multiply (Inductor:
    a seeds kernel and one fused kernel). What a random graph's replay costs
    beside the plain Inductor call (the generator's writes before each
    launch are not free)."""
    def f(x):
        return x * torch.rand_like(x)

    g = torch.Generator().manual_seed(0)
    inputs = [torch.rand(64, 64, generator=g).to(dev) for _ in range(2)]

    def step(fn, i):
        return fn(inputs[i % 2])

    return f, step, {"unit": "step", "segments_per_step": 1, "data": inputs}


EXAMPLES = {"branch": make_branch, "early_exit": make_early_exit, "gpt2": make_gpt2, "cond": make_cond,
            "sample": make_sample, "rand": make_rand}


# -------------------------------------------------------------------- child

def checksum(torch, tensors):
    """A checksum of the bits of every tensor (on the CPU): equal inputs and
    weights in every process, or the output comparison means nothing."""
    total = 0
    for t in tensors:
        t = t.detach().cpu().contiguous().view(-1)
        if t.is_floating_point():
            t = t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])
        t = t.to(torch.int64)
        w = torch.arange(t.numel(), dtype=torch.int64) % 65521 + 1
        total = (total * 1000003 + int((t * w).sum()) + t.numel()) % (1 << 61)
    return "%016x" % total


def peaks(torch, mode, ct):
    """(peak bytes in this window, reserved bytes) the same way for every mode (see the docstring)."""
    if ct is not None:
        m = ct.memory_stats()
        return m["peak_bytes"], m["reserved_bytes.all.current"]
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def reset_peaks(torch, mode, ct):
    if ct is not None:
        ct.reset_peak()
    else:
        torch.cuda.reset_peak_memory_stats()


def child(example, mode, out_dir, warm, timed):
    ct = None
    if mode in ("cgtree", "inductor+alloc"):
        import cgtree.torch as ct  # before CUDA starts: installs the allocator
    import torch

    dev = torch.device("cuda")
    torch.manual_seed(0)
    fn, step, meta = EXAMPLES[example](torch, dev)
    inputs_sum = checksum(torch, meta.pop("data"))
    if mode == "eager":
        cfn = fn
    elif mode in ("inductor", "inductor+alloc"):
        cfn = torch.compile(fn)
    elif mode == "reduce-overhead":
        cfn = torch.compile(fn, mode="reduce-overhead")
    else:
        cfn = torch.compile(fn, backend="cgtree")

    torch.cuda.synchronize()
    reset_peaks(torch, mode, ct)
    ctx = torch.no_grad()
    outs = []
    with ctx:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(warm):
            o = step(cfn, i)
            if i >= warm - 4:
                outs.append(o.detach().clone())
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        peak_warm, _ = peaks(torch, mode, ct)
        reset_peaks(torch, mode, ct)
        if mode == "cgtree":
            from cgtree.torch._backend import _segments
            for s in _segments:
                s.reset_timers()
            before = ct.stats()
        t0 = time.perf_counter()
        for i in range(warm, warm + timed):
            o = step(cfn, i)
        torch.cuda.synchronize()
        steady_s = time.perf_counter() - t0
        peak_steady, _ = peaks(torch, mode, ct)
        # the same inputs again, checked: outputs of the last 4 timed-phase calls
        for i in range(warm + timed, warm + timed + 4):
            outs.append(step(cfn, i).detach().clone())
    torch.cuda.synchronize()
    res = {"example": example, "mode": mode, "warm_calls": warm, "timed_calls": timed,
           "warm_s": warm_s, "ms_per_step": steady_s * 1e3 / timed, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "inputs": inputs_sum}
    if meta.get("unit") == "token":
        res["ms_per_token"] = res["ms_per_step"] / meta["tokens_per_step"]
    if mode == "cgtree":
        s = ct.stats()
        m = ct.memory_stats()
        res.update(recordings=s.get("recordings", 0), replays=s.get("replays", 0) - before.get("replays", 0),
                   nodes=s.get("nodes", 0), checkpoint_restores=s.get("checkpoint_restores", 0),
                   pool_peak=m["pool_peak"], eager_peak=m["eager_peak"], graphs=s["graphs_compiled"],
                   graphs_plain=s["graphs_plain"], eager_runs=s.get("eager_runs", 0),
                   capture_failures=s.get("capture_failures", 0), stale_refused=s.get("stale_refused", 0),
                   outputs_overwritable=s.get("outputs_overwritable", 0))
        states = {}
        for nd in ct.nodes():
            states[nd["state"]] = states.get(nd["state"], 0) + 1
        res["node_states"] = states
        from cgtree.torch._backend import _segments
        res["peak_bound_mib"] = (m["eager_peak"] + m["pool_peak"]) / 2**20
        calls = ns_call = ns_run = 0
        parts = {"ns_args": 0, "ns_streams": 0, "ns_outputs": 0, "ns_step": 0, "ns_make": 0, "ns_launch": 0}
        for sg in _segments:
            t = sg.timers()
            calls += t["replays"]
            ns_call += t["ns_in_call"]
            for k in parts:
                parts[k] += t.get(k, 0)
            ns_run += t["ns_in_run"]
        if calls and not ns_call:
            res["segment_timers"] = "off (CGTREE_TORCH_TIME_LAUNCHES=1 turns them on)"
        elif calls:
            res["us_per_segment_call"] = ns_call / calls / 1e3
            res["us_per_segment_in_cgt_run"] = ns_run / calls / 1e3
            res["us_per_segment_backend"] = (ns_call - ns_run) / calls / 1e3
            res["segment_replays_timed"] = calls
            if parts["ns_launch"]:  # CGTREE_TORCH_TIME_LAUNCHES=1: the graph launch call, timed apart
                res["us_per_segment_without_launch"] = (ns_call - parts["ns_launch"]) / calls / 1e3
            for k, v in parts.items():  # the backend's time, part by part (see segment.c's timers)
                res["us_per_segment_" + k[3:]] = v / calls / 1e3
            res["plain_reasons"] = [sg.info["plain_reason"] for sg in _segments if sg.info["plain_reason"]]
    if mode == "reduce-overhead":
        try:
            from torch._inductor import cudagraph_trees as cgt_mod
            mgr = cgt_mod.get_container(0).tree_manager
            n = 0
            stack = list(mgr.get_roots())
            while stack:
                node = stack.pop()
                n += 1
                for kids in node.children.values():
                    stack.extend(kids)
            res["recordings"] = n
        except Exception as e:  # noqa: BLE001
            res["recordings"] = "n/a (%s)" % type(e).__name__
    _, reserved = peaks(torch, mode, ct)
    res["peak_warm_mib"] = peak_warm / 2**20
    res["peak_steady_mib"] = peak_steady / 2**20
    res["peak_mib"] = max(peak_warm, peak_steady) / 2**20
    res["reserved_mib"] = reserved / 2**20
    torch.save([o.cpu() for o in outs], os.path.join(out_dir, "%s-%s.pt" % (example, mode)))
    print("RESULT " + json.dumps(res), flush=True)


# ------------------------------------------------------------------- parent

def bit_equal(torch, a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        view = {4: torch.int32, 2: torch.int16, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


def compare(torch, d, r, ref_row):
    """Outputs against Inductor without CUDA graphs: bit-equal, allclose or
    DIFFERENT (with the indices of the outputs that differ), after checking
    that both processes had the same inputs and weights."""
    ref = os.path.join(d, "%s-inductor.pt" % r["example"])
    mine = os.path.join(d, "%s-%s.pt" % (r["example"], r["mode"]))
    if "error" in r or ref_row is None or "error" in ref_row or not os.path.exists(ref) or not os.path.exists(mine):
        return "n/a"
    if r.get("inputs") != ref_row.get("inputs"):
        return "n/a: inputs differ from inductor's (%s vs %s)" % (r.get("inputs"), ref_row.get("inputs"))
    A, B = torch.load(ref), torch.load(mine)
    if len(A) != len(B):
        return "DIFFERENT (count)"
    if all(bit_equal(torch, x, y) for x, y in zip(A, B)):
        return "bit-equal"
    if all(x.shape == y.shape and torch.allclose(x.float(), y.float(), rtol=1e-4, atol=1e-5) for x, y in zip(A, B)):
        return "allclose (rtol 1e-4, atol 1e-5)"
    worst = max(float((x.double() - y.double()).abs().max()) if x.shape == y.shape else float("inf")
                for x, y in zip(A, B))
    bad = [i for i, (x, y) in enumerate(zip(A, B)) if not bit_equal(torch, x, y)]
    return "DIFFERENT (max abs diff %.3g; outputs %s of %d differ)" % (worst, ",".join(map(str, bad)), len(A))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default="branch,early_exit,gpt2")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    ap.add_argument("--dir", default="/tmp/cgtree_torch_compare")
    ap.add_argument("--child", nargs=2, metavar=("EXAMPLE", "MODE"))
    ap.add_argument("--warm", type=int, default=0)
    ap.add_argument("--timed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per child process at most")
    ap.add_argument("--budget", type=int, default=0,
                    help="seconds for the whole run: a child starts only while at least 60 s are left, "
                         "and never runs past the budget (0: no budget)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    defaults = {"branch": (20, 400), "early_exit": (24, 400), "gpt2": (3, 5), "cond": (20, 400), "sample": (20, 400), "rand": (20, 1000)}
    if a.child:
        ex, mode = a.child
        w, t = defaults[ex]
        child(ex, mode, a.dir, a.warm or w, a.timed or t)
        return
    import torch

    rows = []
    start = time.time()
    for ex in a.examples.split(","):
        for mode in a.modes.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", ex, mode, "--dir", a.dir]
            if a.warm:
                cmd += ["--warm", str(a.warm)]
            if a.timed:
                cmd += ["--timed", str(a.timed)]
            timeout = a.timeout
            if a.budget:
                left = a.budget - (time.time() - start)
                if left < 60:
                    r = {"example": ex, "mode": mode, "error": "not run: the --budget of %d s was spent" % a.budget}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                    continue
                timeout = int(min(timeout, left - 5))
            t0 = time.time()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                out, err = p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                out, err = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout"
            line = [l for l in out.splitlines() if l.startswith("RESULT ")]
            if not line:
                r = {"example": ex, "mode": mode, "error": (err or out)[-1500:]}
            else:
                r = json.loads(line[-1][7:])
            r["process_s"] = time.time() - t0
            ref_row = next((x for x in rows if x["example"] == ex and x["mode"] == "inductor"), None)
            if mode == "inductor":
                ref_row = r
            r["equal"] = compare(torch, a.dir, r, ref_row)
            rows.append(r)
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
    for r in rows:  # eager ran before Inductor's outputs existed
        if r.get("equal") == "n/a" and "error" not in r:
            ref_row = next((x for x in rows if x["example"] == r["example"] and x["mode"] == "inductor"), None)
            r["equal"] = compare(torch, a.dir, r, ref_row)
    print()
    print("| example | mode | ms/step | ms/token | backend us/segment (in cgt_run; of it the launch call) | "
          "peak MiB warm-up | peak MiB steady | reserved MiB | recordings | compile+record s | outputs vs inductor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if "error" in r:
            print("| %s | %s | error: %s |" % (r["example"], r["mode"],
                                              r["error"].strip().splitlines()[-1][:150] if r["error"].strip() else "?"))
            continue
        seg = ""
        if "us_per_segment_call" in r:
            seg = "%.1f (%.1f" % (r["us_per_segment_call"], r["us_per_segment_in_cgt_run"])
            seg += "; %.1f)" % r["us_per_segment_launch"] if r.get("us_per_segment_launch") else ")"
        print("| %s | %s | %.3f | %s | %s | %.1f | %.1f | %.1f | %s | %.1f | %s |" % (
            r["example"], r["mode"], r["ms_per_step"],
            "%.3f" % r["ms_per_token"] if "ms_per_token" in r else "", seg, r["peak_warm_mib"],
            r["peak_steady_mib"], r["reserved_mib"], r.get("recordings", ""), r["warm_s"], r["equal"]))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps({"summary": [{k: r.get(k) for k in ("example", "mode", "equal")} for r in rows]}) + "\n")


if __name__ == "__main__":
    main()
