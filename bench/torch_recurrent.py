#!/usr/bin/env python3
"""A loop that feeds each output of a compiled model into its next call,
`x = f(x)` (a recurrent state, a denoising loop), side by side with PyTorch.

    python3 bench/torch_recurrent.py [--modes eager,inductor,reduce-overhead,cgtree] [--rounds 3]
                                     [--steps 200] [--out results.jsonl]

f is a small residual MLP block (4 Linear 256 -> 256 layers with GELU,
batch 64, fp32) with one graph break in the middle (torch._dynamo.graph_break(),
as a host decision would make), under torch.no_grad(): two graphs per call,
each launch-bound. Each mode runs in a fresh process (cgtree's allocator
must be installed before CUDA starts), --rounds processes for
reduce-overhead and cgtree, interleaved; the table gives the median
round's microseconds per call of f (wall time of --steps calls over their
count, synchronised at both ends, after 20 warm-up calls), whether the loop
raised (and the first line of what), and the last x compared with eager's
(max abs difference) and with Inductor's (bit for bit: cgtree and
reduce-overhead replay Inductor's kernels). Weights and the start are made
on the CPU from fixed seeds, so every process starts from the same bits.

cgtree rows also give stats()["arguments_moved"]: each call's x is an
output of the step that call ends, which cgtree moves out of the pool
before the new step's work (python/_torch_ext/stale.c), and its replays.
"""
import argparse
import time

from mode_rounds import append_rounds, child_result, interleaved_rounds, median_round, run_child

WIDTH, BATCH, WARMUP = 256, 64, 20


def child(mode, steps):
    if mode == "cgtree":
        import cgtree.torch as ct  # before CUDA starts: its allocator
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(WIDTH, WIDTH, generator=g) / WIDTH ** 0.5).cuda() for _ in range(4)]
    x0 = torch.randn(BATCH, WIDTH, generator=g).cuda()

    def f(x):
        h = torch.nn.functional.gelu(x @ ws[0])
        h = torch.nn.functional.gelu(h @ ws[1])
        torch._dynamo.graph_break()
        h = torch.nn.functional.gelu(h @ ws[2])
        return x + 0.1 * torch.tanh(h @ ws[3])

    fn = {"eager": lambda: f, "inductor": lambda: torch.compile(f),
          "reduce-overhead": lambda: torch.compile(f, mode="reduce-overhead"),
          "cgtree": lambda: torch.compile(f, backend="cgtree")}[mode]()
    out = {"mode": mode, "device": torch.cuda.get_device_name()}
    x = x0.clone()
    try:
        with torch.no_grad():
            for _ in range(WARMUP):
                x = fn(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                x = fn(x)
            torch.cuda.synchronize()
            out["us_per_call"] = (time.perf_counter() - t0) / steps * 1e6
            out["last"] = x.cpu().tolist()
    except Exception as e:  # what the mode does with the loop is the finding
        out["raised"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    if mode == "cgtree":
        s = ct.stats()
        out["arguments_moved"], out["replays"], out["recordings"] = s["arguments_moved"], s["replays"], s["recordings"]
    child_result(out)


def run(mode, steps):
    return run_child(__file__, ["--child", mode, "--steps", steps], {"mode": mode})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="eager,inductor,reduce-overhead,cgtree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.steps)
    import torch

    modes = a.modes.split(",")
    rounds = interleaved_rounds(modes, a.rounds, lambda m: run(m, a.steps))
    eager = rounds.get("eager", [{}])[0].get("last")
    inductor = rounds.get("inductor", [{}])[0].get("last")
    print(f"x = f(x), {a.steps} calls, two graphs a call, no_grad; {rounds[modes[0]][0].get('device', '?')}")
    print("| mode | us per call (median round) | rounds | raised | max abs diff from eager | bit-equal to Inductor "
          "| arguments moved | replays |")
    print("| --- | ---: | --- | --- | ---: | --- | ---: | ---: |")
    for m in modes:
        rs, med = median_round(rounds[m], "us_per_call")
        last = med.get("last")
        diff = (torch.tensor(last) - torch.tensor(eager)).abs().max().item() if last and eager else None
        equal = (torch.equal(torch.tensor(last), torch.tensor(inductor)) if last and inductor else None)
        each = " ".join("%.1f" % r["us_per_call"] for r in rs)
        diff_s = "" if diff is None else "%.2e" % diff
        print(f"| {m} | {med.get('us_per_call', float('nan')):.1f} | {each} | {med.get('raised', 'no')} | "
              f"{diff_s} | {'' if equal is None else equal} | {med.get('arguments_moved', '')} | "
              f"{med.get('replays', '')} |")
        append_rounds(a.out, rounds[m], ("last",), bench="torch_recurrent", steps=a.steps)


if __name__ == "__main__":
    main()
