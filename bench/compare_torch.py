#!/usr/bin/env python3
"""compare_torch.py -- the workloads of bench_workloads in PyTorch, on the same
GPU, and one table with both sides.

The PyTorch programs mirror tools/common/workloads.h layer for layer:

  chain    S segments separated by torch._dynamo.graph_break(), each L layers
           of relu(x @ W), x B x H, W H x H fp32 (TF32 off), the weights
           parameters (static inputs); two input tensors alternate step by
           step, as our DYNAMIC input alternates between two buffers.
  branchy  h = x @ W1; s = h.sum(); y = relu(h) (+ L-1 more layers);
           `if s > 0` on the host (a graph break with a sync), then
           relu(y @ W2)... or 1 - 0.5 * relu(y @ W3)...; a graph break; then
           2 * relu(z @ W4)... + 1. Inputs +x and -x alternate, so the
           branch alternates.

Modes: eager; torch.compile(mode="reduce-overhead") (CUDAGraph Trees); and,
for chains, the whole step captured as ONE CUDA graph and replayed (the
floor for those kernels). The method is the one of the anchor measurement
(shared/anchors/torch_trees.py) and of bench_workloads: warm up, then the
median of `reps` repetitions of `steps` steps, timed with the host clock and
a device sync at the end of each repetition.

Reads our JSON lines (bench_workloads --json) with --ours, writes the
PyTorch figures as JSON lines with --json, and prints one markdown table:

  ratio tree = torch trees us / our tree us (per step; > 1: we are faster)
  overhead per segment = (tree - one graph) / S on both sides (PyTorch's
  definition in the anchors); the ratio is theirs / ours.

Needs torch with CUDA (2.11 measured); runs offline.
"""
import argparse
import json
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", help="our JSON lines (bench_workloads --json)")
    ap.add_argument("--json", help="append the PyTorch results as JSON lines to this file")
    ap.add_argument("--md", help="also write the final markdown table to this file")
    ap.add_argument("--cases", default=None,
                    help="comma-separated SxL and branchy[:L]; default: the cases in --ours, "
                         "else 1x1,4x1,16x1,64x1,1x4,4x4,16x4,64x4,branchy")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="3 repetitions of 30 steps")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    return ap.parse_args()


def load_ours(path):
    rows = []
    if not path:
        return rows
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    if r.get("bench") == "workloads":
                        rows.append(r)
    except FileNotFoundError:
        print(f"compare_torch: {path} not found; our columns stay empty", file=sys.stderr)
    return rows


def case_key(kind, S, L):
    return ("chain", S, L) if kind == "chain" else ("branchy", 0, L)


def parse_cases(text):
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if tok.startswith("branchy"):
            L = int(tok.split(":")[1]) if ":" in tok else 1
            out.append(("branchy", 0, L))
        else:
            tok = tok[6:] if tok.startswith("chain:") else tok
            S, L = tok.split("x")
            out.append(("chain", int(S), int(L)))
    return out


def render_table(cases, results, ours_by_key, B, H, torch_version, gpu):
    """The one markdown table: our modes, PyTorch's, and the ratios."""
    def f(v, nd=1):
        return "-" if v is None else f"{v:.{nd}f}"

    lines = []
    lines.append(f"## cgtree vs PyTorch {torch_version} CUDAGraph Trees on {gpu}")
    lines.append("")
    lines.append(f"µs per step (median); B={B} H={H} fp32, TF32 off. ours: bench_workloads; torch: compare_torch.py. "
                 "overhead/seg = (tree - one graph) / S on both sides; ratios > 1 mean cgtree is faster / leaner.")
    lines.append("")
    lines.append("| case | ours eager | ours tree | ours bare | ours one-graph | torch eager | torch trees | "
                 "torch one-graph | torch trees / ours tree | ours overhead/seg | torch overhead/seg | "
                 "overhead ratio torch/ours | ours (tree-bare)/S | ours host (tree-bare)/S |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in cases:
        kind, S, L = key
        t = results.get(key)
        o = ours_by_key.get(key)
        name = t["name"] if t else (o["name"] if o else str(key))
        oe = o.get("eager_us") if o else None
        ot = o.get("tree_us") if o else None
        ob = o.get("bare_us") if o else None
        og = o.get("one_graph_us") if o else None
        ov = o.get("tree_minus_one_graph_per_segment_us") if o else None
        obo = o.get("overhead_per_segment_us") if o else None
        oho = o.get("host_overhead_per_segment_us") if o else None
        te = t["eager_us"] if t else None
        tt = t["trees_us"] if t else None
        tg = t["one_graph_us"] if t else None
        tov = t["trees_overhead_per_segment_us"] if t else None
        r_tree = tt / ot if (tt and ot) else None
        r_ov = tov / ov if (tov is not None and ov is not None and ov > 0) else None
        r_ov_s = f(r_ov, 0) if r_ov is not None else ("(ours ≤ 0)" if ov is not None and ov <= 0 and tov else "-")
        flag = "" if (not t or t["trees_match_eager"]) else " (torch trees != eager!)"
        lines.append(f"| {name}{flag} | {f(oe)} | {f(ot)} | {f(ob)} | {f(og)} | {f(te)} | {f(tt)} | {f(tg)} | "
                     f"{f(r_tree, 1)} | {f(ov, 2)} | {f(tov, 1)} | {r_ov_s} | {f(obo, 2)} | {f(oho, 2)} |")
    lines.append("")
    lines.append("ours bare = our tree's own graphs launched with no runtime (their in-graph input copy not "
                 "repointed; for branchy with the host read-back); (tree-bare)/S is our runtime's own cost per segment, host = with the GPU idle at "
                 "each step's start. Branchy has no one-graph form (the branch is decided on the host).")
    return "\n".join(lines)


def main():
    args = parse_args()
    if args.quick:
        args.reps, args.steps = 3, 30
    ours = load_ours(args.ours)
    ours_by_key = {}
    for r in ours:
        ours_by_key[case_key(r["case"], r["S"], r["L"])] = r
    if args.cases:
        cases = parse_cases(args.cases)
    elif ours:
        cases = [case_key(r["case"], r["S"], r["L"]) for r in ours]
    else:
        cases = parse_cases("1x1,4x1,16x1,64x1,1x4,4x4,16x4,64x4,branchy")
    B = args.batch or (ours[0]["B"] if ours else 8)
    H = args.hidden or (ours[0]["H"] if ours else 256)

    try:
        import torch
    except ImportError as e:
        print(f"compare_torch: PyTorch is not importable here ({e})", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("compare_torch: torch.cuda is not available", file=sys.stderr)
        return 3
    import torch._dynamo
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 4096
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    torch.manual_seed(0)

    jf = open(args.json, "a") if args.json else None
    results = {}

    def emit(**kw):
        line = json.dumps(kw)
        print(line, flush=True)
        if jf:
            jf.write(line + "\n")
            jf.flush()

    emit(bench="torch", what="env", torch=torch.__version__, gpu=torch.cuda.get_device_name(),
         cuda=torch.version.cuda, B=B, H=H, reps=args.reps, steps=args.steps)

    def time_steps(fn):
        """fn(i) runs step i. Median us per step over reps x steps."""
        per = []
        i = 0
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn(i)
                i += 1
            torch.cuda.synchronize()
            per.append((time.perf_counter() - t0) / args.steps * 1e6)
        return statistics.median(per)

    def he():
        return (torch.rand(H, H, device=dev) * 2 - 1) * (6.0 / H) ** 0.5

    def make_chain(S, L):
        mod = torch.nn.ParameterList([torch.nn.Parameter(he(), requires_grad=False) for _ in range(S * L)])
        lines = ["def step(x):"]
        for k in range(S):
            for j in range(L):
                lines.append(f"    x = torch.relu(x @ mod[{k * L + j}])")
            if k != S - 1:
                lines.append("    torch._dynamo.graph_break()")
        lines.append("    return x")
        ns = {"torch": torch, "mod": mod}
        exec("\n".join(lines), ns)
        return ns["step"]

    def make_branchy(L):
        W = [[he() for _ in range(L)] for _ in range(4)]

        def stack(x, ws):
            for w in ws:
                x = torch.relu(x @ w)
            return x

        def foo(x):
            h = x @ W[0][0]                    # segment 1
            s = h.sum()
            y = stack(torch.relu(h), W[0][1:])
            if s > 0:                          # graph break: the host reads s
                z = stack(y, W[1])             # segment 2
            else:
                z = stack(y, W[2]) * -0.5 + 1.0  # segment 3
            torch._dynamo.graph_break()
            return stack(z, W[3]) * 2.0 + 1.0  # segment 4

        return foo

    for kind, S, L in cases:
        name = f"chain S={S} L={L}" if kind == "chain" else f"branchy L={L}"
        print(f"compare_torch: {name} ...", file=sys.stderr, flush=True)
        if kind == "chain":
            step = make_chain(S, L)
            xs = [torch.rand(B, H, device=dev) * 2 - 1 for _ in range(2)]
        else:
            step = make_branchy(L)
            base = torch.rand(B, H, device=dev) * 2 - 1
            xs = [base, -base]
        with torch.no_grad():
            for i in range(4):
                step(xs[i & 1])
            ref = [step(xs[0]).clone(), step(xs[1]).clone()]
            eager_us = time_steps(lambda i: step(xs[i & 1]))

            torch._dynamo.reset()
            cstep = torch.compile(step, mode="reduce-overhead")
            t0 = time.perf_counter()
            for i in range(6):
                cstep(xs[i & 1])
            torch.cuda.synchronize()
            warm_s = time.perf_counter() - t0
            got = [cstep(xs[0]).clone(), cstep(xs[1]).clone()]
            check = all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(ref, got))
            trees_us = time_steps(lambda i: cstep(xs[i & 1]))
            torch._dynamo.reset()

            one_graph_us = None
            if kind == "chain":
                sx = xs[0].clone()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        step(sx)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step(sx)

                def one(i):
                    sx.copy_(xs[i & 1])  # the same input copy the trees and our tree do
                    g.replay()

                one_graph_us = time_steps(one)
                del g
        segs = S if kind == "chain" else 3
        row = dict(bench="torch", case=kind, name=name, S=segs, L=L, B=B, H=H,
                   eager_us=round(eager_us, 2), trees_us=round(trees_us, 2),
                   one_graph_us=None if one_graph_us is None else round(one_graph_us, 2),
                   trees_overhead_per_segment_us=None if one_graph_us is None
                   else round((trees_us - one_graph_us) / S, 2),
                   warm_record_s=round(warm_s, 2), trees_match_eager=bool(check))
        emit(**row)
        results[(kind, S, L)] = row
        torch.cuda.empty_cache()

    table = render_table(cases, results, ours_by_key, B, H, torch.__version__, torch.cuda.get_device_name())
    print()
    print(table)
    if args.md:
        with open(args.md, "w") as mf:
            mf.write(table + "\n")
    if jf:
        jf.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
