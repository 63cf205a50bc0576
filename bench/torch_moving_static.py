#!/usr/bin/env python3
"""A compiled function that writes a buffer it is given anew at every call,
side by side with PyTorch: the graph cgtree cannot keep.

    python3 bench/torch_moving_static.py [--modes inductor,reduce-overhead,cgtree]
                                         [--patterns fresh,recycled] [--calls 400] [--rounds 3]

f(x, buf) = buf.add_(1); x * buf. A buffer the graph writes in place is a
STATIC argument (its address keys the recording), so a buffer at a new
address at every call is a new key at every call. fresh: every buffer is
kept, so no address comes back (a program that fills a new output buffer
per call and keeps them); recycled: the buffer dies after the call, so the
caching allocator hands back the few addresses it has (a replay each).
Each mode and pattern runs in a process of its own, --rounds times,
interleaved; the table gives the median round's microseconds per call
over --calls calls (after 20 warm-up calls, synchronised at both ends,
the buffer's fill included, as it is in every mode), how many calls
returned other numbers than the same product computed eagerly in that
process (x * buf is exact), and for cgtree its recordings, updates in place and
eager runs over the timed calls. Prints a Markdown table.
"""
import argparse
import time

from mode_rounds import child_result, interleaved_rounds, median_round, run_child

WARMUP = 20


def child(mode, pattern, calls):
    if mode == "cgtree":
        import cgtree.torch as ct  # before CUDA starts: its allocator
    import torch

    def f(x, buf):
        buf.add_(1)
        return x * buf

    backend = {"inductor": dict(backend="inductor"), "reduce-overhead": dict(mode="reduce-overhead"),
               "cgtree": dict(backend="cgtree")}[mode]
    g = torch.compile(f, **backend)
    x = torch.randn(64, 256, device="cuda")
    kept, sums = [], []
    before = None

    def one(i):
        buf = torch.full((64, 256), float(i % 7), device="cuda")
        if pattern == "fresh":
            kept.append(buf)
        return g(x, buf).sum()

    for i in range(WARMUP):
        sums.append(one(i))
    if mode == "cgtree":
        before = ct.stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + calls):
        sums.append(one(i))
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / calls * 1e6
    # what each call must return, computed eagerly in this process (x * buf is exact, so bit-equal)
    want = [(x * float(i % 7 + 1)).sum() for i in range(WARMUP + calls)]
    wrong = [i for i, (a, b) in enumerate(zip(torch.stack(sums).cpu().tolist(), torch.stack(want).cpu().tolist()))
             if a != b]
    out = {"mode": mode, "pattern": pattern, "us_per_call": us, "wrong_calls": len(wrong),
           "first_wrong": wrong[:3]}
    if mode == "cgtree":
        after = ct.stats()
        for k in ("recordings", "updates", "eager_runs", "replays", "nodes"):
            out[k] = after[k] - before[k] if k != "nodes" else after[k]
    child_result(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="inductor,reduce-overhead,cgtree")
    ap.add_argument("--patterns", default="fresh,recycled")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2)
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.calls)
    print("| pattern | mode | us per call (median of rounds) | rounds | x Inductor | wrong calls | "
          "recordings | updates | eager runs | nodes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for pattern in a.patterns.split(","):
        rounds = interleaved_rounds(a.modes.split(","), a.rounds, lambda m: run_child(
            __file__, ["--child", m, pattern, "--calls", a.calls], {"mode": m, "pattern": pattern}))
        ref = median_round(rounds.get("inductor", []), "us_per_call")[1] if "inductor" in rounds else None
        for m, rs in rounds.items():
            ok, r = median_round(rs, "us_per_call")
            if not ok:
                print(f"| {pattern} | {m} | raised: {r.get('raised')} | 0 | | | | | | |")
                continue
            ratio = f"{r['us_per_call'] / ref['us_per_call']:.2f}x" if ref and "us_per_call" in ref else ""
            equal = f"{r['wrong_calls']} {r['first_wrong']}" if r["wrong_calls"] else "0"
            print(f"| {pattern} | {m} | {r['us_per_call']:.1f} | "
                  f"{', '.join('%.1f' % x['us_per_call'] for x in ok)} | {ratio} | {equal} | "
                  f"{r.get('recordings', '')} | {r.get('updates', '')} | {r.get('eager_runs', '')} | "
                  f"{r.get('nodes', '')} |")


if __name__ == "__main__":
    main()
