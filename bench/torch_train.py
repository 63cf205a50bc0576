#!/usr/bin/env python3
"""Training steps on cgtree, side by side with PyTorch (issue: training).

    python3 bench/torch_train.py [--models mlp,branch,gpt2,gpt2drop] [--modes eager,inductor,reduce-overhead,cgtree]
                                 [--optimizer eager|compiled|compiled-none|compiled-lr-cuda|compiled-lr-cpu]
                                 [--rounds 3] [--profile MODES]
                                 [--trace MODES] [--cpus 2,3] [--out results.jsonl]

Each (model, mode) runs in a fresh process (cgtree's allocator must be
installed before CUDA starts; PyTorch's trees refuse a swapped allocator).
A step is: zero_grad(set_to_none=True), forward, loss, backward, AdamW
step. --optimizer eager (default): the eager foreach AdamW, the same in
every mode. --optimizer compiled: AdamW(capturable=True) whose step() is
compiled like the model (Inductor, reduce-overhead, cgtree; eager mode
keeps it eager), so under cgtree the optimizer step is a segment of the
same tree; zero_grad(set_to_none=False) then, so that the compiled step
sees the same gradient tensors every time (--optimizer compiled-none:
the same with set_to_none=True, as in the eager case; reduce-overhead
raises on gradients kept across steps, so this is the compiled optimizer
it can run; --optimizer compiled-lr-cuda and compiled-lr-cpu: the same
with an LR scheduler as PyTorch's recipe has it, the rate a tensor on that
device, LinearLR changing it at every step, opt.step() and sched.step()
compiled together), and each step begins with
torch.compiler.cudagraph_mark_step_begin() in every mode (reduce-overhead
refuses the three compiled calls of a step without it). Reported: ms per
step (wall time of the timed steps over their count, synchronised at both
ends), peak memory in the timed window (PyTorch modes:
torch.cuda.max_memory_allocated; cgtree: cgtree.torch.memory_stats()'s
peak_bytes, pool and eager bytes in use at one moment, where the pool's
bytes are its allocator's, which in a step of pure replays read what the
last warmup, recording or restore left: a replay's outputs are not in
them), peak reserved memory (the device memory the allocators hold at
their highest: PyTorch's torch.cuda.max_memory_reserved, private pools of
CUDA graphs included; cgtree's reserved_bytes.all.peak, its driver pool's
high-water mark plus the trees' pools), the device memory
the whole process holds (cudaMemGetInfo's total less free, read after
each part of one more step: the figure nvidia-smi shows, the same for
every mode), recordings made
after the warm-up (0 in steady state), and the losses and final weights
compared bit for bit with Inductor without CUDA graphs (the parent
compares; weights and data are built on the CPU from fixed seeds, so every
process starts from the same bits; where they differ, the table says for
how many steps the losses were bit-equal).

Steps of 1 to 4 ms of mostly host work vary by 10-15% from one process to
the next, so reduce-overhead and cgtree run --rounds processes each (200
timed steps each), interleaved, and the table gives the median round's
figures and every round's ms/step; eager and Inductor run once. A second
table splits the median round's step into host time per part (zero_grad,
forward and loss, backward, optimizer step; medians over the steps, no
sync). --profile MODES runs those modes once more under cProfile and prints
their 30 costliest functions (cProfile's own cost inflates those figures);
--trace MODES adds 20 steps under torch.profiler after the first round's
timed steps, which sees every thread (autograd runs a CUDA backward on its
own thread, where cProfile does not look), and prints the ops and Python
functions with the most self time per step. Before the timed steps each
process collects and freezes Python's garbage (gc.freeze), so that no full
collection lands in one mode's timed steps only; --cpus pins every process
to the given cores. cgtree rows also give cgtree's own host time per step:
what segment.c's timers count inside its calls (replays only). After the
timed steps every process runs 20 more under torch.profiler's CUDA
activity: the GPU's busy time per step (the union of its kernels', copies'
and fills' spans). Where it nears the step's time the step waits for the
GPU, and a faster host path cannot make it shorter.

Models:
  mlp     3 hidden layers of 1024 (ReLU), batch 64, MSE loss.
  branch  the same MLP whose forward skips its middle block on a host
          check (a graph break: `if h.mean() > t`), the batches alternate
          sides, so the tree has two paths in forward and backward.
  gpt2    transformers GPT2LMHeadModel, 4 layers, 256 wide, 4 heads,
          batch 8, sequence 128, bf16 autocast, dropout 0.
  gpt2drop  the same with GPT-2's own dropout (0.1 on embeddings,
          attention and residuals): random graphs, recorded, replays
          drawing Inductor's numbers.
  gpt2fp32  gpt2 without autocast: in fp32 the attention takes PyTorch's
          memory-efficient kernel, whose forward saves its random seed and
          offset (CPU tensors outside a capture) for the backward.
  gpt2dropfp32  gpt2drop without autocast: the memory-efficient attention
          with dropout, whose backward reads the saved seed and offset on
          the host outside a capture (through device pointers inside one).
  gpt2ckpt  gpt2 with gradient checkpointing (transformers'
          gradient_checkpointing_enable, non-reentrant): AOTAutograd
          passes its graph-safe generators to forward and backward.
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time

MODES = ["eager", "inductor", "reduce-overhead", "cgtree"]
# The parts of a step whose host time (median, no sync) is reported apart:
# zero_grad (and the step mark), forward and loss, backward, optimizer step.
PHASES = ("zero_grad", "forward", "backward", "optimizer")


def make_mlp(torch, dev, branch=False):
    torch.manual_seed(0)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(1024, 1024)
            self.l2 = torch.nn.Linear(1024, 1024)
            self.l3 = torch.nn.Linear(1024, 1024)
            self.out = torch.nn.Linear(1024, 1024)

        def forward(self, x):
            h = torch.relu(self.l1(x))
            if not branch or h.mean() > 0.25:  # the host check: a graph break
                h = torch.relu(self.l2(h))
            h = torch.relu(self.l3(h))
            return self.out(h)

    model = MLP().to(dev)
    g = torch.Generator().manual_seed(1)
    data = [((torch.randn(64, 1024, generator=g) + (0.5 if i % 2 else -0.5)).to(dev),
             torch.randn(64, 1024, generator=g).to(dev)) for i in range(8)]

    def loss_fn(f, i):
        x, y = data[i % len(data)]
        return torch.nn.functional.mse_loss(f(x), y)

    return model, loss_fn, False


def make_gpt2(torch, dev, dropout=0.0, autocast=True, checkpointing=False):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=8192,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    model = GPT2LMHeadModel(cfg).to(dev)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, cfg.vocab_size, (8, 128), generator=g).to(dev) for _ in range(4)]

    def loss_fn(f, i):
        ids = data[i % len(data)]
        return f(input_ids=ids, labels=ids).loss

    return model, loss_fn, autocast


MODELS = {"mlp": lambda t, d: make_mlp(t, d), "branch": lambda t, d: make_mlp(t, d, branch=True),
          "gpt2": make_gpt2, "gpt2drop": lambda t, d: make_gpt2(t, d, dropout=0.1),
          "gpt2fp32": lambda t, d: make_gpt2(t, d, autocast=False),
          "gpt2ckpt": lambda t, d: make_gpt2(t, d, checkpointing=True),
          "gpt2dropfp32": lambda t, d: make_gpt2(t, d, dropout=0.1, autocast=False)}


def child(name, mode, out_dir, warm, timed, optimizer="eager", profile=False, trace=False, cpus=""):
    if cpus:  # before torch starts its threads (autograd's device thread among them): they inherit it
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    ct = None
    if mode == "cgtree":
        import cgtree.torch as ct  # before CUDA starts: installs the allocator
    import torch

    dev = torch.device("cuda")
    model, loss_fn, autocast = MODELS[name](torch, dev)
    if mode == "eager":
        f = model
    elif mode == "inductor":
        f = torch.compile(model)
    elif mode == "reduce-overhead":
        f = torch.compile(model, mode="reduce-overhead")
    else:
        f = torch.compile(model, backend="cgtree")
    compiled_opt = optimizer.startswith("compiled")
    set_to_none = optimizer != "compiled"
    lr_device = optimizer[len("compiled-lr-"):] if optimizer.startswith("compiled-lr-") else None
    lr = torch.tensor(1e-4, device=lr_device) if lr_device else 1e-4
    opt = torch.optim.AdamW(model.parameters(), lr=lr, capturable=compiled_opt)
    if lr_device:  # a new rate at every step, never constant within the run (a branch change would recompile)
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.05, total_iters=100000)

        def opt_step():
            opt.step()
            sched.step()
    else:
        opt_step = opt.step
    if compiled_opt and mode != "eager":
        kw = {"inductor": {}, "reduce-overhead": {"mode": "reduce-overhead"}, "cgtree": {"backend": "cgtree"}}[mode]
        opt_step = torch.compile(opt_step, **kw)

    phases = {p: [] for p in PHASES}  # host time of each part of a timed step, ns (no sync)

    def in_use_mib():  # bytes in use as each mode's allocator counts them
        return (ct.memory_stats()["allocated_bytes.all.current"] if ct else torch.cuda.memory_allocated()) / 2**20

    def device_used_mib():
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**20

    def step(i, record=False, marks=None, used=None):
        def mark(k):  # after each part: the bytes in use (marks) and what the process holds (used)
            if marks is not None:
                marks[k] = round(in_use_mib(), 1)
                used[k] = round(device_used_mib(), 1)
        t0 = time.perf_counter_ns()
        if compiled_opt:  # three compiled calls per step: reduce-overhead needs the step marked
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=set_to_none)
        mark("after zero_grad")
        t1 = time.perf_counter_ns()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(f, i)
        mark("after forward")
        t2 = time.perf_counter_ns()
        loss.backward()
        mark("after backward")
        t3 = time.perf_counter_ns()
        opt_step()
        mark("after optimizer")
        t4 = time.perf_counter_ns()
        if record:
            for p, ns in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                phases[p].append(ns)
        return loss.detach().clone()  # reduce-overhead's outputs are overwritten by the next step

    torch.manual_seed(1234)  # dropout's numbers: the same in every mode
    losses = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(warm):
        losses.append(step(i))
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    rec0 = ct.stats().get("recordings", 0) if ct else 0
    segments = __import__("cgtree.torch._backend", fromlist=["_segments"])._segments if ct else []  # every one made
    for sg in segments:  # from here on the timers count the timed steps' replays only
        sg.reset_timers()
    if ct:
        ct.reset_peak()
    else:
        torch.cuda.reset_peak_memory_stats()
    times = []
    # Whatever the warm-up left for Python's collector goes now and is frozen: a full collection
    # (tens of ms with torch and Inductor loaded) must not land in one mode's timed steps only.
    gc.collect()
    gc.freeze()
    prof = None
    if profile:  # cProfile over the timed steps (slows them: its figures are not the table's)
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    for i in range(warm, warm + timed):
        s0 = time.perf_counter()
        losses.append(step(i, record=True))
        times.append(time.perf_counter() - s0)
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    gc.unfreeze()
    # cgtree's own host time: what segment.c's timers counted inside its calls (replays), per step
    in_calls = [sg.timers() for sg in segments]
    timers = ("ns_in_call", "ns_args", "ns_step", "ns_streams", "ns_in_run", "ns_launch", "ns_make", "ns_outputs")
    ours_us = {k: sum(t[k] for t in in_calls) / timed / 1e3 for k in timers}
    # The same per graph (forward, backward, optimizer...): replays per step and us per step
    per_graph = [dict({"graph": sg.info["name"], "calls": round(t["replays"] / timed, 2)},
                      **{k[3:]: round(t[k] / timed / 1e3, 1) for k in timers if k != "ns_make"})
                 for sg, t in zip(segments, in_calls) if t["replays"]]
    ours_calls = sum(t["replays"] for t in in_calls) / timed
    if trace:
        print_trace(torch, step, name, mode, out_dir, warm + timed)
    try:
        gpu = gpu_busy(torch, step, out_dir, name, mode, warm + timed)
    except Exception as e:  # the profiler is a probe: its failure must not cost the round's figures
        gpu = {"error": repr(e)[:200]}
    if prof:
        import pstats
        prof.disable()
        print("PROFILE %s %s (cProfile, %d steps; its overhead inflates every figure)" % (name, mode, timed))
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    peak = ct.memory_stats()["peak_bytes"] if ct else torch.cuda.max_memory_allocated()
    # Device memory the allocators hold at their highest since the reset before the timed steps
    # (cgtree: the driver's pool for eager memory plus the trees' pools; PyTorch: its caching
    # allocator, private pools of CUDA graphs included)
    m = ct.memory_stats() if ct else None
    reserved = m["reserved_bytes.all.peak"] if ct else torch.cuda.max_memory_reserved()
    held = ({"driver_pool_peak_mib": m["device_reserved_peak"] / 2**20, "trees_pools_mib": m["pool_reserved"] / 2**20,
             "front_cache_mib": m["front_cache_bytes"] / 2**20} if ct else {})
    # One more step, reading after each part the bytes in use, what each allocator's count shows of the
    # gradients (the parameters' size) while they live; and the device memory the whole process holds
    # (what nvidia-smi shows: allocators' caches, private pools, the CUDA context and libraries'
    # workspaces), one figure for every mode, whatever its allocator counts
    marks, used = {}, {}
    losses.append(step(warm + timed, marks=marks, used=used))
    torch.cuda.synchronize()
    phase_q = {p: quantiles([t / 1e9 for t in v], digits=6) for p, v in phases.items()}  # ms, one sort each
    res = {"model": name, "mode": mode, "ms_per_step": total * 1e3 / timed, "warm_s": warm_s,
           "peak_mib": peak / 2**20, "reserved_peak_mib": reserved / 2**20,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "steps": warm + timed, "optimizer": optimizer,
           "phases_us": {p: q["p50"] * 1e3 for p, q in phase_q.items()},
           "step_ms_quantiles": quantiles(times),
           "phases_p90_us": {p: q["p90"] * 1e3 for p, q in phase_q.items()},
           "in_use_mib": marks, "reserved_split": held, "gpu": gpu,
           "device_used_mib": max(used.values()), "device_used_by_part": used,
           "params_mib": round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20, 1)}
    if ct:
        res["cgtree_calls_per_step"] = ours_calls
        if os.environ.get("CGTREE_TORCH_TIME_LAUNCHES", "0") == "1":
            res["cgtree_us_per_step"] = {k[3:]: round(v, 1) for k, v in ours_us.items()}
            res["cgtree_us_per_graph"] = per_graph
        else:  # the trees time nothing: no figures, rather than zeros that read as figures
            res["cgtree_timers"] = "off"
        s = ct.stats()
        res.update(recordings=s.get("recordings", 0), recordings_after_warmup=s.get("recordings", 0) - rec0,
                   replays=s.get("replays", 0), graphs=s["graphs_compiled"], graphs_plain=s["graphs_plain"],
                   steps_deferred=s.get("steps_deferred", 0), gradients_moved=s.get("gradients_moved", 0),
                   steps_kept_after_backward=s.get("steps_kept_after_backward", 0),
                   plain_reasons=sorted({sg.info["plain_reason"] for sg in segments if sg.info["plain_reason"]}))
    torch.save({"losses": torch.stack(losses).float().cpu(),
                "weights": [p.detach().float().cpu() for p in model.parameters()]},
               os.path.join(out_dir, "%s-%s-%s.pt" % (name, mode, optimizer)))
    print("RESULT " + json.dumps(res), flush=True)


def print_trace(torch, step, name, mode, out_dir, first, steps=20):
    """torch.profiler over `steps` more steps, CPU only, every thread (autograd runs a CUDA backward
    on its device thread): the ops and Python functions with the most self time, per step, and a
    Chrome trace in out_dir for reading the timeline."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as p:
        for i in range(first, first + steps):
            with torch.profiler.record_function("step"):
                step(i)
        torch.cuda.synchronize()
    path = os.path.join(out_dir, "trace-%s-%s.json" % (name, mode))
    p.export_chrome_trace(path)
    print("TRACE %s %s (torch.profiler, %d steps, CPU, all threads; per step; its overhead inflates every "
          "figure; timeline: %s)" % (name, mode, steps, path))
    print("| self us/step | calls/step | thread | name (op or Python function) |")
    for (name_, thread), (us, n) in trace_self_times(path, steps)[:45]:
        print("| %.1f | %.1f | %s | %s |" % (us, n, thread, name_[:110]))


def gpu_busy(torch, step, out_dir, name, mode, first, steps=20):
    """The GPU's side of a step: torch.profiler (CUDA activity only) over `steps` more steps; per step the
    time the GPU was busy (the union of its kernels', copies' and fills' spans), the kernels it ran, and
    the span from the first one's start to the last one's end. Busy time close to the host's ms/step
    means the step waits for the GPU, and no runtime's host path can make it faster."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for i in range(first, first + steps):
            step(i)
        torch.cuda.synchronize()
    path = os.path.join(out_dir, "gpu-%s-%s.json" % (name, mode))
    p.export_chrome_trace(path)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in json.load(open(path))["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    os.remove(path)
    if not spans:
        return {}
    busy, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return {"busy_us": round(busy / steps, 1), "kernels": round(len(spans) / steps, 1),
            "span_us": round((spans[-1][1] - spans[0][0]) / steps, 1)}


def trace_self_times(path, steps):
    """From a Chrome trace: per (name, thread) the self time (its span less its children's, on the
    same thread) per step and calls per step, of ops and Python functions, the costliest first;
    thread 'main' is the one that ran the steps, 'other' any other (autograd's device thread)."""
    events = [e for e in json.load(open(path))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("python_function", "cpu_op", "user_annotation")]
    marks = [e for e in events if e["name"] == "step"]
    main_tid = marks[0]["tid"] if marks else None
    lo = min((e["ts"] for e in marks), default=0)
    hi = max((e["ts"] + e["dur"] for e in marks), default=float("inf"))
    by_tid = {}
    for e in events:
        if lo <= e["ts"] < hi:  # within the steps: not the profiler's own start and stop
            by_tid.setdefault(e["tid"], []).append(e)
    total = {}
    for tid, evs in by_tid.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # (end, event, children's time)
        def close(item):
            end, e, kids = item
            key = (e["name"], "main" if tid == main_tid else "other")
            us, n = total.get(key, (0.0, 0))
            total[key] = (us + e["dur"] - kids, n + 1)
        for e in evs:
            while stack and stack[-1][0] <= e["ts"]:
                close(stack.pop())
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e, 0.0])
        while stack:
            close(stack.pop())
    rows = [(k, (us / steps, n / steps)) for k, (us, n) in total.items() if k[0] != "step"]
    return sorted(rows, key=lambda r: -r[1][0])


def quantiles(seconds, digits=3):
    """p10, p50, p90, p99 and the max of per-step host times, in ms: where the
    mean lies above the median, a few slow steps carry the difference."""
    q = sorted(seconds)
    at = lambda f: round(q[min(len(q) - 1, int(f * len(q)))] * 1e3, digits)  # noqa: E731
    return {"p10": at(0.1), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(q[-1] * 1e3, digits)}


def compare(torch, d, name, mode, optimizer):
    ref, mine = (os.path.join(d, "%s-%s-%s.pt" % (name, m, optimizer)) for m in ("inductor", mode))
    if not (os.path.exists(ref) and os.path.exists(mine)):
        return "n/a"
    A, B = torch.load(ref), torch.load(mine)
    if torch.equal(A["losses"], B["losses"]) and all(torch.equal(x, y) for x, y in zip(A["weights"], B["weights"])):
        return "bit-equal"
    differ = (A["losses"] != B["losses"]).nonzero()
    same_steps = int(differ[0, 0]) if len(differ) else len(A["losses"])
    dl = float((A["losses"] - B["losses"]).abs().max())
    dw = max(float((x - y).abs().max()) for x, y in zip(A["weights"], B["weights"]))
    return "losses bit-equal for %d of %d steps; then up to %.3g; weights up to %.3g" % (
        same_steps, len(A["losses"]), dl, dw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,branch,gpt2")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    ap.add_argument("--dir", default="/tmp/cgtree_torch_train")
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--timed", type=int, default=200)
    ap.add_argument("--optimizer", choices=("eager", "compiled", "compiled-none", "compiled-lr-cuda", "compiled-lr-cpu"),
                    default="eager")
    ap.add_argument("--rounds", type=int, default=3,
                    help="processes per mode for reduce-overhead and cgtree, interleaved; the median is reported")
    ap.add_argument("--profile", default="", help="modes to run once more under cProfile, printing their top")
    ap.add_argument("--trace", default="", help="modes whose first round also runs 20 steps under torch.profiler "
                    "(every thread), printing the top ops and functions and writing a Chrome trace to --dir")
    ap.add_argument("--cpus", default="", help="CPU cores each process runs on (e.g. 2,3; default: any)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    if a.child:
        profile = a.child[1] in a.profile.split(",")
        trace = a.child[1] in a.trace.split(",")
        child(a.child[0], a.child[1], a.dir, a.warm, a.timed, a.optimizer, profile=profile, trace=trace,
              cpus=a.cpus)
        return
    import torch

    def run(name, mode, profile=False, trace=False):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name, mode, "--dir", a.dir,
               "--warm", str(a.warm), "--timed", str(a.timed), "--optimizer", a.optimizer, "--cpus", a.cpus]
        if profile:
            cmd += ["--profile", mode]
        elif trace and mode in a.trace.split(","):
            cmd += ["--trace", mode]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if profile:
            print(p.stdout[p.stdout.find("PROFILE"):], flush=True)
            return None
        if "TRACE " in p.stdout:
            print(p.stdout[p.stdout.find("TRACE "):p.stdout.find("RESULT ")], flush=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        res = json.loads(line[-1][7:]) if line else {"model": name, "mode": mode,
                                                     "error": (p.stderr or p.stdout)[-1200:]}
        # One line per process as it ends: a run its time limit stops still shows the rounds it finished.
        print("ROUND %s %s %s" % (name, mode, "%.3f ms/step" % res["ms_per_step"] if "ms_per_step" in res
                                  else "failed"), flush=True)
        return res

    rows = []
    modes = a.modes.split(",")
    for name in a.models.split(","):
        # eager and Inductor once; reduce-overhead and cgtree a.rounds times, interleaved, so that a
        # slow spell of the machine falls on both
        once = [m for m in modes if m not in ("reduce-overhead", "cgtree")]
        again = [m for m in modes if m in ("reduce-overhead", "cgtree")]
        runs = {m: [] for m in modes}
        for mode in once:
            runs[mode].append(run(name, mode, trace=True))
        for k in range(max(1, a.rounds)):
            for mode in again:
                runs[mode].append(run(name, mode, trace=k == 0))
        for mode in modes:
            ok = [r for r in runs[mode] if "error" not in r]  # in the order they ran
            if not ok:
                r = runs[mode][-1]
            else:
                r = sorted(ok, key=lambda r: r["ms_per_step"])[len(ok) // 2]  # the median round: all its figures
                r["ms_per_step_rounds"] = [x["ms_per_step"] for x in ok]  # in the order they ran
                r["phases_us_rounds"] = [x["phases_us"] for x in ok]  # the same order
            if "error" not in r:
                r["equal"] = "reference" if mode == "inductor" else compare(torch, a.dir, name, mode, a.optimizer)
            rows.append(r)
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(r) + "\n")
        for mode in a.profile.split(",") if a.profile else ():
            run(name, mode, profile=True)
    def ro_row(r):  # reduce-overhead's row of r's model, the ratios' reference, or None
        return next((x for x in rows if x["model"] == r["model"] and x["mode"] == "reduce-overhead"
                     and "error" not in x), None)

    print()
    print("optimizer: %s" % a.optimizer)
    print("| model | mode | ms/step | rounds (in the order they ran) | x reduce-overhead | peak MiB | peak reserved MiB | device used MiB | "
          "recordings after warm-up | gradients moved | vs inductor |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if "error" in r:
            print("| %s | %s | error: %s |" % (r["model"], r["mode"], r["error"].strip().splitlines()[-1][:160]))
            continue
        ro = ro_row(r)
        ratio = "%.2f" % (r["ms_per_step"] / ro["ms_per_step"]) if ro else ""
        mine, theirs = r.get("ms_per_step_rounds", []), (ro or {}).get("ms_per_step_rounds", [])
        rounds = " ".join("%.3f" % x for x in mine) if len(mine) > 1 else ""
        if r is not ro and len(mine) > 1 and len(mine) == len(theirs):  # round k against reduce-overhead's round k
            r["pair_ratios"] = [round(c / o, 2) for c, o in zip(mine, theirs)]
        print("| %s | %s | %.3f | %s | %s | %.1f | %.1f | %.0f | %s | %s | %s |" % (
            r["model"], r["mode"], r["ms_per_step"], rounds, ratio, r["peak_mib"], r["reserved_peak_mib"],
            r["device_used_mib"],
            r.get("recordings_after_warmup", ""), r.get("gradients_moved", ""), r.get("equal", "")))
    for r in rows:
        if r.get("pair_ratios"):
            print("%s %s, each round against reduce-overhead's round of the same number (interleaved): %s" % (
                r["model"], r["mode"], ", ".join("%.2f" % x for x in r["pair_ratios"])))
    print()
    print("Bytes in use as each allocator counts them after each part of one more step, MiB (the parameters'")
    print("size, which the gradients take, in brackets); cgtree: where its reserved memory is:")
    for r in rows:
        if "in_use_mib" in r:
            parts = ", ".join("%s %s" % kv for kv in r["in_use_mib"].items())
            print("| %s | %s | %s [%s] | %s |" % (r["model"], r["mode"], parts, r["params_mib"],
                                               r.get("reserved_split", "")))
    print()
    print("Device memory the whole process holds (total less free, cudaMemGetInfo; the CUDA context and")
    print("libraries' workspaces included, as nvidia-smi shows it), after each part of one more step, MiB; max:")
    for r in rows:
        if "device_used_by_part" in r:
            print("| %s | %s | %.0f | %s |" % (r["model"], r["mode"], r["device_used_mib"], ", ".join(
                "%s %.0f" % kv for kv in r["device_used_by_part"].items())))
    print()
    print("cgtree's own host time per timed step (segment.c's timers, inside its calls), us; and the step less")
    print("that time against reduce-overhead's: the ratio a cgtree whose own path cost nothing would reach")
    print("(the median round's figures):")
    for r in rows:
        if r.get("cgtree_timers") == "off":
            print("| %s | %s | %.1f calls | timers off: CGTREE_TORCH_TIME_LAUNCHES=1 turns them on |" % (
                r["model"], r["mode"], r["cgtree_calls_per_step"]))
        if "cgtree_us_per_step" in r:
            ro = ro_row(r)
            less = r["ms_per_step"] - r["cgtree_us_per_step"]["in_call"] / 1e3
            floor = " | step less it %.3f ms, %.2f x reduce-overhead" % (less, less / ro["ms_per_step"]) if ro else ""
            print("| %s | %s | %.1f calls | %s%s |" % (r["model"], r["mode"], r["cgtree_calls_per_step"], ", ".join(
                "%s %.1f" % kv for kv in r["cgtree_us_per_step"].items()), floor))
            for g in r.get("cgtree_us_per_graph", ()):
                print("|   | %s | %.2f calls | %s |" % (g["graph"], g["calls"], ", ".join(
                    "%s %.1f" % (k, v) for k, v in g.items() if k not in ("graph", "calls"))))
    print()
    print("The GPU's side of a step (torch.profiler, CUDA activity, 20 steps after the timed ones): busy us per")
    print("step (the union of kernels, copies and fills), kernels per step, and busy against the host's ms/step:")
    for r in rows:
        g = r.get("gpu") or {}
        if "error" in g:
            print("| %s | %s | the profiler failed: %s |" % (r["model"], r["mode"], g["error"]))
        elif g:
            print("| %s | %s | busy %.1f us | %.1f kernels | span %.1f us | busy %.2f of the step |" % (
                r["model"], r["mode"], g["busy_us"], g["kernels"], g["span_us"], g["busy_us"] / 1e3 / r["ms_per_step"]))
    print()
    print("Host time of each timed step (no sync between steps), ms, the median round: quantiles against the mean")
    for r in rows:
        if "step_ms_quantiles" in r:
            print("| %s | %s | mean %.3f | %s | parts' p90 us: %s |" % (
                r["model"], r["mode"], r["ms_per_step"], ", ".join("%s %.3f" % kv for kv in r["step_ms_quantiles"].items()),
                ", ".join("%s %.1f" % kv for kv in r["phases_p90_us"].items())))
    print()
    print("Host time per part of a timed step, median us (no sync: where the host waits for the GPU, it shows")
    print("in the part that waits), each round:")
    print("| model | mode | " + " | ".join(PHASES) + " |")
    print("| --- | --- |" + " ---: |" * len(PHASES))
    for r in rows:
        for k, ph in enumerate(r.get("phases_us_rounds") or [r["phases_us"]] if "phases_us" in r else []):
            rounds = r.get("ms_per_step_rounds") or [r["ms_per_step"]]
            print("| %s | %s (%.3f ms%s) | " % (r["model"], r["mode"], rounds[k], ", median" if len(rounds) > 1 and
                                               ph is r["phases_us"] else "") + " | ".join("%.1f" % ph[p] for p in PHASES) + " |")


if __name__ == "__main__":
    main()
