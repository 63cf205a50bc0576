#!/usr/bin/env python3
"""Data-parallel training on two GPUs, side by side (issue 21, item 6).

    python3 bench/torch_ddp.py [--modes eager,inductor,reduce-overhead,cgtree] [--steps 200]
                               [--disturb sleep,busy] [--out results.jsonl] [--cpu]

Each mode runs in a fresh pair of processes, one per GPU, that this script
launches itself (no torchrun): DistributedDataParallel over NCCL
(NCCL_NVLS_ENABLE=0), MASTER_ADDR=127.0.0.1 and a free port. Only the cgtree
processes import cgtree.torch (first, before CUDA starts: it installs
cgtree's allocator); the others run with PyTorch's allocator
(CGTREE_TORCH_NO_INSTALL=1 besides).

The model: an MLP of --depth Linear+ReLU layers, --width wide, and a Linear
head: the DDP test's model, python/tests/ddp_model.py (a class of a file of
ours: DDP calls the wrapped module's forward, and Dynamo compiles no frame
of torch's own files, so a torch.nn.Sequential would run uncompiled).
DDP's bucket_cap_mb (--bucket-cap-mb, at least 1: Dynamo's
DDPOptimizer refuses less) sets the buckets, and DDPOptimizer cuts the
compiled graph at their boundaries, so each piece is a graph of its own
(for cgtree, a segment). Each rank has its own batches. A step:
zero_grad(set_to_none=True), forward, MSE loss, backward (the all-reduces),
AdamW step, then torch.cuda.synchronize(). Every mode runs the same comm
hook: PyTorch's allreduce_hook, after recording the time it was called.

Measured, per mode: --warm steps first (compiles, recordings), then phases of
--steps steps each: quiet, then each --disturb on rank 1 only:

- sleep: before each step rank 1 sleeps a random 0-2 ms (random.Random
  seeded 1234), like a data loader that is sometimes late; the sleep counts
  in the step's time;
- busy: a Python thread of rank 1 spins (an increment loop) for the whole
  phase and takes the GIL from the thread that launches the work.

Reported, per phase:

- step time per rank: host wall time of each step, from before the sleep
  (if any) to after torch.cuda.synchronize() at its end (time.perf_counter);
  median and p99;
- all-reduce arrival gap: the comm hook stamps
  time.clock_gettime_ns(CLOCK_MONOTONIC), one clock for both processes of
  the host, when DDP's reducer hands it a bucket; for each (step, bucket)
  seen on both ranks, |t_rank0 - t_rank1|; median and p99 in µs. This is
  the HOST's arrival: when the rank's Python reached the bucket's all-reduce
  in the backward (under reduce-overhead and cgtree as under eager), not when
  its GPU got there;
- peak memory per rank over the phase, as each mode's allocator counts it:
  torch.cuda.max_memory_allocated, and under cgtree (torch.cuda.memory_stats
  does not work under a pluggable allocator)
  cgtree.torch.memory_stats()["allocated_bytes.all.peak"] (the tree's pool
  and eager memory in use at one moment; JSON: eager_peak_mib, the eager
  part's own peak). Neither count sees a replay's outputs: a CUDA graph
  tree of PyTorch's makes them as storages around pointers into its pool,
  which its allocator does not count (bench/torch_count_probe.py measures
  it), and cgtree's pool figure is what its last warmup, recording or
  restore left (docs/torch.md, memory_stats);
- memory each rank's allocators hold at their highest over the phase
  (torch.cuda.max_memory_reserved; cgtree: reserved_bytes.all.peak, its
  driver pool's high-water mark plus its trees' pools, each part printed
  apart, with the front cache's bytes, which the driver pool's count
  includes);
- device memory the whole process holds after the phase: cudaMemGetInfo's
  total less free (torch.cuda.mem_get_info, after a synchronize), the one
  figure every mode shares whatever its allocator counts: allocators'
  caches, private pools, the CUDA context, NCCL's buffers;
- cgtree's recordings in the phase (0 in steady state);
- whether each rank's losses (every step, all phases) are bit-equal to its
  losses under inductor, and whether the final weights are bit-equal across
  the ranks (JSON only).

Results: a markdown table and one JSON line per (mode, phase) on stdout and
appended to --out. --cpu runs the plumbing on the CPU with gloo (eager and
inductor only; no synchronize, no memory figures).
"""
import argparse
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

MODES = ["eager", "inductor", "reduce-overhead", "cgtree"]


def worker(a):
    ct = None
    if a.mode == "cgtree":
        import cgtree.torch as ct  # before CUDA starts: installs the allocator

        if not ct.installed():
            sys.exit("torch_ddp rank %d: cgtree.torch did not install its allocator at import" % a.rank)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
    from ddp_model import MLP  # the DDP test's model (python/tests/ddp_model.py)

    cuda = not a.cpu
    dev = torch.device("cuda", a.rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=a.rank, world_size=2)

    torch.manual_seed(0)
    model = MLP(a.width, a.depth).to(dev)
    g = torch.Generator().manual_seed(1000 + a.rank)
    data = [(torch.randn(a.batch, a.width, generator=g).to(dev), torch.randn(a.batch, a.width, generator=g).to(dev))
            for _ in range(8)]
    ddp = DDP(model, device_ids=[a.rank] if cuda else None, bucket_cap_mb=a.bucket_cap_mb)
    now = {"phase": "warm", "step": -1}
    stamps = []  # (phase, step, bucket index, CLOCK_MONOTONIC ns)

    def hook(state, bucket):
        stamps.append((now["phase"], now["step"], bucket.index(), time.clock_gettime_ns(time.CLOCK_MONOTONIC)))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    if a.mode == "eager":
        f = ddp
    elif a.mode == "inductor":
        f = torch.compile(ddp)
    elif a.mode == "reduce-overhead":
        f = torch.compile(ddp, mode="reduce-overhead")
    else:
        f = torch.compile(ddp, backend="cgtree")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses = []

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(f(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())  # reduce-overhead's outputs are overwritten by the next step

    t0 = time.perf_counter()
    for i in range(a.warm):
        now["step"] = i
        step(i)
    sync()
    res = {"mode": a.mode, "rank": a.rank, "warm_s": time.perf_counter() - t0, "phases": {},
           "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__}
    rng = random.Random(1234)
    i = a.warm
    for phase in ["quiet"] + [d for d in a.disturb.split(",") if d]:
        if ct is not None:
            ct.reset_peak()
            rec0 = ct.stats().get("recordings", 0)
        elif cuda:
            torch.cuda.reset_peak_memory_stats()
        stop = threading.Event()
        spinner = None
        if phase == "busy" and a.rank == 1:
            def spin():
                n = 0
                while not stop.is_set():
                    n += 1

            spinner = threading.Thread(target=spin, daemon=True)
            spinner.start()
        now["phase"] = phase
        times = []
        for k in range(a.steps):
            now["step"] = k
            nap = rng.uniform(0.0, 0.002) if phase == "sleep" and a.rank == 1 else 0.0
            s0 = time.perf_counter_ns()
            if nap:
                time.sleep(nap)
            step(i)
            sync()
            times.append(time.perf_counter_ns() - s0)
            i += 1
        stop.set()
        if spinner is not None:
            spinner.join()
        ph = {"step_ns": times}
        if ct is not None:
            m = ct.memory_stats(a.rank)
            ph["peak_bytes"] = m["allocated_bytes.all.peak"]
            ph["eager_peak_bytes"] = m["eager_peak"]
            ph["reserved_peak_bytes"] = m["reserved_bytes.all.peak"]
            ph["reserved_split_bytes"] = {"driver_pool_peak": m["device_reserved_peak"],
                                          "trees_pools": m["pool_reserved"], "front_cache": m["front_cache_bytes"]}
            ph["recordings"] = ct.stats().get("recordings", 0) - rec0
        elif cuda:
            ph["peak_bytes"] = torch.cuda.max_memory_allocated()
            ph["reserved_peak_bytes"] = torch.cuda.max_memory_reserved()
        if cuda:
            free, total = torch.cuda.mem_get_info()  # after the phase's last synchronize
            ph["device_used_bytes"] = total - free
        res["phases"][phase] = ph
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ws = [torch.empty_like(weights) for _ in range(2)]
    dist.all_gather(ws, weights)
    res["weights_equal_across_ranks"] = torch.equal(ws[0], ws[1])
    res["losses"] = torch.stack(losses).tolist()
    res["stamps"] = stamps
    if ct is not None:
        s = ct.stats()
        res["cgtree"] = {k: s.get(k, 0) for k in ("graphs_compiled", "graphs_plain", "recordings", "replays", "warmups",
                                                   "eager_runs", "capture_failures", "steps_deferred")}
    dist.barrier(device_ids=[a.rank]) if cuda else dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(a.dir, "%s-rank%d.json" % (a.mode, a.rank)), "w") as fh:
        json.dump(res, fh)


def pct(xs, q):
    """The q-quantile by rank (the smallest value with at least q of the values at or below it)."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s) - 1e-9) - 1))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUNNING = []  # the ranks of the mode under way


def stop_ranks(signum, frame):
    for p in RUNNING:
        if p.poll() is None:
            p.kill()
    sys.exit("torch_ddp: stopped by signal %d" % signum)


def launch(a, mode):
    """Run one mode's two ranks; return their results, or an error string."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), NCCL_NVLS_ENABLE="0")
    if mode == "cgtree":
        env.pop("CGTREE_TORCH_NO_INSTALL", None)
    else:
        env["CGTREE_TORCH_NO_INSTALL"] = "1"
    args = ["--steps", str(a.steps), "--warm", str(a.warm), "--width", str(a.width), "--depth", str(a.depth),
            "--batch", str(a.batch), "--bucket-cap-mb", str(a.bucket_cap_mb), "--disturb", a.disturb,
            "--dir", a.dir] + (["--cpu"] if a.cpu else [])
    logs = [open(os.path.join(a.dir, "%s-rank%d.log" % (mode, r)), "w+") for r in range(2)]
    me = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--rank"]
    procs = RUNNING[:] = [subprocess.Popen(me + [str(r)] + args, env=env, stdout=logs[r], stderr=subprocess.STDOUT,
                                           start_new_session=True) for r in range(2)]
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:  # until both are done, or one failed
        polls = [p.poll() for p in procs]
        if None not in polls or any(c not in (None, 0) for c in polls):
            break
        time.sleep(0.2)
    codes = [p.poll() if p.poll() is not None else "killed after %d s" % (time.monotonic() - deadline + a.timeout)
             for p in procs]
    for p in procs:  # a rank left in a collective by one that failed, or past the timeout
        if p.poll() is None:
            p.kill()
            p.wait()
    tail = ""
    if codes != [0, 0]:
        for r, log in enumerate(logs):
            log.seek(0)
            lines = [l for l in log.read().splitlines() if l.strip()]
            tail += " | rank %d (%s): %s" % (r, codes[r], " / ".join(lines[-3:])[-600:])
    for log in logs:
        log.close()
    if tail:
        return "failed" + tail
    return [json.load(open(os.path.join(a.dir, "%s-rank%d.json" % (mode, r)))) for r in range(2)]


def rows_of(mode, ranks, ref):
    rows = []
    for phase in ranks[0]["phases"]:
        ms = [[t / 1e6 for t in r["phases"][phase]["step_ns"]] for r in ranks]
        at = [{(s, b): t for ph, s, b, t in r["stamps"] if ph == phase} for r in ranks]
        gaps = [abs(at[0][k] - at[1][k]) / 1e3 for k in at[0] if k in at[1]]
        row = {"mode": mode, "disturbance": phase, "steps": len(ms[0]),
               "step_ms_median": [statistics.median(x) for x in ms], "step_ms_p99": [pct(x, 0.99) for x in ms],
               "gap_us_median": statistics.median(gaps) if gaps else None,
               "gap_us_p99": pct(gaps, 0.99) if gaps else None, "gaps": len(gaps),
               "buckets_per_step": len(gaps) / max(1, len(ms[0])),
               "peak_mib": [r["phases"][phase].get("peak_bytes", 0) / 2**20 for r in ranks],
               "reserved_peak_mib": [r["phases"][phase].get("reserved_peak_bytes", 0) / 2**20 for r in ranks],
               "device_used_mib": [r["phases"][phase].get("device_used_bytes", 0) / 2**20 for r in ranks],
               "recordings": [r["phases"][phase].get("recordings") for r in ranks],
               "weights_equal_across_ranks": all(r["weights_equal_across_ranks"] for r in ranks),
               "warm_s": [r["warm_s"] for r in ranks], "device": ranks[0]["device"], "torch": ranks[0]["torch"]}
        if ref is None:
            row["vs_inductor"] = "n/a"
        elif mode == "inductor":
            row["vs_inductor"] = "reference"
        else:
            same = all(r["losses"] == q["losses"] for r, q in zip(ranks, ref))
            diff = max(abs(x - y) for r, q in zip(ranks, ref) for x, y in zip(r["losses"], q["losses"]))
            row["vs_inductor"] = "bit-equal" if same else "differs (losses max %.3g)" % diff
        if "cgtree" in ranks[0]:
            row["cgtree"] = [r["cgtree"] for r in ranks]
            row["eager_peak_mib"] = [r["phases"][phase].get("eager_peak_bytes", 0) / 2**20 for r in ranks]
            row["reserved_split_mib"] = [{k: v / 2**20 for k, v in r["phases"][phase].get("reserved_split_bytes",
                                                                                       {}).items()} for r in ranks]
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=200, help="timed steps per phase")
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bucket-cap-mb", type=float, default=1.0)
    ap.add_argument("--disturb", default="sleep,busy", help="disturbed phases after the quiet one: sleep, busy")
    ap.add_argument("--out", default="")
    ap.add_argument("--dir", default="")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per mode (both ranks)")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (eager and inductor): the plumbing only")
    ap.add_argument("--worker")
    ap.add_argument("--rank", type=int)
    a = ap.parse_args()
    if a.worker:
        a.mode = a.worker
        worker(a)
        return
    a.dir = a.dir or tempfile.mkdtemp(prefix="cgtree_ddp_")
    os.makedirs(a.dir, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_ranks)  # `timeout` ends this process: end the ranks too
    modes = a.modes.split(",")
    if a.cpu:
        modes = [m for m in modes if m in ("eager", "inductor")]
    bad = [d for d in a.disturb.split(",") if d and d not in ("sleep", "busy")]
    if bad:
        ap.error("--disturb: sleep or busy, not %s" % bad)
    results, rows = {}, []
    for mode in modes:
        results[mode] = launch(a, mode)
    ref = results.get("inductor") if isinstance(results.get("inductor"), list) else None
    for mode in modes:
        got = results[mode]
        new = [{"mode": mode, "error": got}] if isinstance(got, str) else rows_of(mode, got, ref)
        for r in new:
            print(json.dumps(r), flush=True)
            if a.out:
                with open(a.out, "a") as fh:
                    fh.write(json.dumps(r) + "\n")
        rows += new
    print()
    print("Two ranks, one GPU each; step time: host wall time per step, synchronised at its end (rank 0 / rank 1);")
    print("arrival gap: |rank 0 - rank 1| of the host's arrival at each bucket's all-reduce "
          "(comm hook, CLOCK_MONOTONIC).")
    print("Disturbances on rank 1: sleep = a random 0-2 ms sleep before each step; busy = a spinning Python thread.")
    print()
    print("| mode | disturbance | step ms median | p99 | all-reduce arrival gap µs median | p99 "
          "| peak MiB | recordings after warm-up | vs inductor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")

    def two(xs, f):
        return " / ".join(f % x for x in xs)

    for r in rows:
        if "error" in r:
            print("| %s | error: %s |" % (r["mode"], r["error"].replace("|", "/")[:400]))
            continue
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["mode"], r["disturbance"], two(r["step_ms_median"], "%.3f"), two(r["step_ms_p99"], "%.3f"),
            "%.1f" % r["gap_us_median"] if r["gap_us_median"] is not None else "",
            "%.1f" % r["gap_us_p99"] if r["gap_us_p99"] is not None else "",
            two(r["peak_mib"], "%.1f"), two(r["recordings"], "%d") if None not in r["recordings"] else "",
            r["vs_inductor"]))
    print()
    print("Memory per rank (rank 0 / rank 1), MiB: peak in use as each allocator counts it; peak reserved by the")
    print("allocators; device used by the whole process after the phase (cudaMemGetInfo's total less free).")
    print()
    print("| mode | disturbance | peak in use | peak reserved | device used |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        if "error" not in r:
            print("| %s | %s | %s | %s | %s |" % (r["mode"], r["disturbance"], two(r["peak_mib"], "%.1f"),
                                              two(r["reserved_peak_mib"], "%.1f"), two(r["device_used_mib"], "%.0f")))
    for r in rows:
        if "error" not in r and r.get("reserved_split_mib"):
            print("%s %s, cgtree's reserved peak, rank 0: %s" % (r["mode"], r["disturbance"], ", ".join(
                "%s %.1f MiB" % kv for kv in r["reserved_split_mib"][0].items())))
    for r in rows:
        if "error" not in r and not r["weights_equal_across_ranks"]:
            print("WARNING: %s: the final weights differ between the ranks" % r["mode"])


if __name__ == "__main__":
    main()
