"""Where the backend's time per replayed segment goes, on the GPT-2 decoder.

    python3 bench/torch_segment_parts.py [--calls N]

Builds bench/torch_compare.py's gpt2 example under backend="cgtree", warms it
up with whole generations, then times single decoder calls three ways, with
the per-part timers of python/_torch_ext/segment.c (arguments, streams,
cgt_run, outputs; replays only):

  fresh      a new token tensor and a new cache_position tensor each call,
             as generation does: cgt_run repoints the graph's two DYNAMIC
             copies every call;
  same       the same two tensors every call: nothing to repoint, so cgt_run
             is the graph launch plus the tree's own bookkeeping;
  exchange   as fresh, with the C shim off (python/_torch_ext/shim.c):
             pointers through DLPack's C exchange API;
  python     as fresh, with DLPack's C exchange API off too
             (python/_torch_ext/exchange.c): pointers, the stream and output
             tensors through PyTorch's Python API, as before PyTorch 2.11.

The calls run in generations of 60 tokens from a reset cache, each followed
by a sync; "wall" is the call plus that sync.

Prints one table and one JSON line (RESULT ...). GPU only.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1200)
    a = ap.parse_args()
    import cgtree.torch  # noqa: F401  (before CUDA starts: installs the allocator)
    import torch
    from cgtree import _torch_ext
    from cgtree.torch import _install
    from cgtree.torch._backend import _segments
    from torch_compare import make_gpt2

    dev = torch.device("cuda")
    fn, generate, _ = make_gpt2(torch, dev)
    cfn = torch.compile(fn, backend="cgtree")
    with torch.no_grad():
        for i in range(3):  # compile, record, replay: whole generations
            generate(cfn, i)
    torch.cuda.synchronize()
    cache = _cache_of(generate)
    prompt = torch.randint(0, 4000, (1, 8), device=dev)
    tok, pos = torch.tensor([[7]], device=dev), torch.tensor([8], device=dev)  # kept for "same"

    def run(way, n):
        """n decoder calls in generations of 60 tokens: the static KV cache
        holds 72 positions, so each generation starts from reset() and an
        eager prefill, as generate() does. A sync after each call stands in
        for generation's host-side sampling."""
        for s in _segments:
            s.reset_timers()
        done, wall = 0, 0.0
        while done < n:
            cache.reset()
            fn(prompt, cache, torch.arange(8, device=dev))
            torch.cuda.synchronize()
            for j in range(min(60, n - done)):
                t0 = time.perf_counter()
                if way == "same":
                    cfn(tok, cache, pos)
                else:
                    cfn(torch.tensor([[7 + j % 5]], device=dev), cache, torch.tensor([8 + j], device=dev))
                torch.cuda.synchronize()
                wall += time.perf_counter() - t0
            done += 60
        tot = {"replays": 0, "ns_in_call": 0, "ns_args": 0, "ns_streams": 0, "ns_in_run": 0, "ns_outputs": 0}
        for s in _segments:
            t = s.timers()
            for k in tot:
                tot[k] += t[k]
        r = max(tot["replays"], 1)
        return {"way": way, "replays": tot["replays"], "us_wall_per_call": wall / n * 1e6,
                **{"us_" + k[3:]: tot[k] / r / 1e3 for k in tot if k != "replays"}}

    with torch.no_grad():
        rows = [run("fresh", a.calls), run("same", a.calls)]
        _torch_ext.setup_shim(None, "", (), [])
        rows.append(run("exchange", a.calls))
        _torch_ext.setup_exchange(None, (), [])
        rows.append(run("python", a.calls))
    print("device: %s, torch %s, at install: shim %s, exchange API %s, stream %s" % (
        torch.cuda.get_device_name(), torch.__version__, _install._state["shim"], _install._state["exchange"],
        _install._state["exchange_stream"]))
    print("%-8s %8s %9s %8s %8s %8s %8s %8s" % ("way", "replays", "wall/call", "call", "args", "streams", "cgt_run",
                                              "outputs"))
    for r in rows:
        print("%-8s %8d %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f" % (r["way"], r["replays"], r["us_wall_per_call"],
                                                             r["us_in_call"], r["us_args"], r["us_streams"],
                                                             r["us_in_run"], r["us_outputs"]))
    print("(us per replayed segment; 'call' is the whole C hot path; repointing the two DYNAMIC copies costs "
          "cgt_run(fresh) - cgt_run(same) = %.2f us)" % (rows[0]["us_in_run"] - rows[1]["us_in_run"]))
    print("RESULT " + json.dumps({"example": "gpt2", "device": torch.cuda.get_device_name(), "rows": rows}))


def _cache_of(generate):
    """The StaticCache make_gpt2's generate() keeps in its closure."""
    for cell in generate.__closure__ or ():
        v = cell.cell_contents
        if isinstance(v, dict) and "cache" in v:
            return v["cache"]
    raise RuntimeError("no cache in generate()'s closure")


if __name__ == "__main__":
    main()
