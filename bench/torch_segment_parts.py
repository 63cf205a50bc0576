"""Where the backend's time per replayed segment goes, on the GPT-2 decoder.

    python3 bench/torch_segment_parts.py [--calls N] [--rounds R]

Builds bench/torch_compare.py's gpt2 example under backend="cgtree", warms it
up with whole generations, then times single decoder calls four ways, alternating in rounds, with
the per-part timers of python/_torch_ext/segment.c (arguments, streams,
cgt_run, outputs; replays only):

  fresh      a new token tensor and a new cache_position tensor each call,
             as generation does: cgt_run repoints the graph's two DYNAMIC
             copies every call;
  same       the same two tensors every call: nothing to repoint, so cgt_run
             is the graph launch plus the tree's own bookkeeping;
  python     as fresh, with DLPack's C exchange API off
             (python/_torch_ext/exchange.c): pointers, the stream and output
             tensors through PyTorch's Python API, as before PyTorch 2.11.

The calls run in generations of 60 tokens from a reset cache, each followed
by a sync; "wall" is the call plus that sync.

Then, apart from the tree: what PyTorch takes to make one output tensor
each way (python/_torch_ext/exchange.c), twice: in a tight loop (hot caches)
and with the host's caches evicted before each pass (cold, as in the hot
path). Prints a table, those lines and one JSON line (RESULT ...). GPU only.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=240, help="calls per way per round")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    os.environ["CGTREE_TORCH_TIME_LAUNCHES"] = "1"  # the tree times its graph launch calls apart
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

    tree_stream = _install.tree_for(0)[1]

    def configure(way):
        """The hot path's ways of reading pointers, the stream and outputs."""
        _install.setup_exchange()
        _install.check_exchange_stream(0, tree_stream)
        if way == "python":
            _torch_ext.setup_exchange(None, (), [])

    totals = {w: {"replays": 0, "ns_in_call": 0, "ns_args": 0, "ns_step": 0, "ns_streams": 0, "ns_in_run": 0,
                  "ns_launch": 0, "ns_outputs": 0, "ns_make": 0, "wall": 0.0} for w in WAYS}

    def run(way, n):
        """n decoder calls in generations of 60 tokens: the static KV cache
        holds 72 positions, so each generation starts from reset() and an
        eager prefill, as generate() does. A sync after each call stands in
        for generation's host-side sampling."""
        configure(way)
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
        tot = totals[way]
        for s in _segments:
            t = s.timers()
            for k in tot:
                if k != "wall":
                    tot[k] += t[k]
        tot["wall"] += wall

    with torch.no_grad():
        for _ in range(a.rounds):  # the ways alternate, so drift in the machine's state hits each alike
            for way in WAYS:
                run(way, a.calls)
        configure("fresh")
        buf = torch.empty(4096, device=dev)
        making = _torch_ext.time_tensor_making(buf.data_ptr(), (1, 1, 4096), 0, 20000)
        cold_making = _torch_ext.time_tensor_making(buf.data_ptr(), (1, 1, 4096), 0, 200, EVICT)
    rows = []
    for way in WAYS:
        tot = totals[way]
        r = max(tot["replays"], 1)
        rows.append({"way": way, "replays": tot["replays"], "us_wall_per_call": tot["wall"] / r * 1e6,
                     **{"us_" + k[3:]: tot[k] / r / 1e3 for k in tot if k not in ("replays", "wall")}})
    print("device: %s, torch %s, at install: exchange API %s, stream %s" % (
        torch.cuda.get_device_name(), torch.__version__, _install._state["exchange"],
        _install._state["exchange_stream"]))
    print("%-10s %8s %9s %8s %8s %8s %8s %8s %8s %8s %8s %8s" % (
        "way", "replays", "wall/call", "call", "args", "(step)", "streams", "cgt_run", "(launch)", "outputs", "(make)",
        "call-launch"))
    for r in rows:
        r["us_without_launch"] = r["us_in_call"] - r["us_launch"]
        print("%-10s %8d %9.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f" % (
            r["way"], r["replays"], r["us_wall_per_call"], r["us_in_call"], r["us_args"], r["us_step"],
            r["us_streams"], r["us_in_run"], r["us_launch"], r["us_outputs"], r["us_make"], r["us_without_launch"]))
    print("(step: of args, the step's start and handing back dead outputs; launch: of cgt_run, the graph launch "
          "call alone; make: of outputs, PyTorch making the tensor; call-launch: the backend's own time)")
    print("(us per replayed segment; 'call' is the whole C hot path; repointing the two DYNAMIC copies costs "
          "cgt_run(fresh) - cgt_run(same) = %.2f us)" % (rows[0]["us_in_run"] - rows[1]["us_in_run"]))
    fmt = lambda v: "off" if v is None else "%.1f ns" % v  # noqa: E731
    print("one output tensor (1, 1, 4096), made and dropped, PyTorch's part alone: exchange API %s, "
          "capsule + torch._C._from_dlpack %s" % (fmt(making["exchange_ns"]), fmt(making["from_dlpack_ns"])))
    print("  cold caches: exchange API %s, capsule + torch._C._from_dlpack %s" % (
        fmt(cold_making["exchange_ns"]), fmt(cold_making["from_dlpack_ns"])))
    print("RESULT " + json.dumps({"example": "gpt2", "device": torch.cuda.get_device_name(), "rows": rows,
                                  "tensor_making_ns": making, "tensor_making_cold_ns": cold_making}))


WAYS = ("fresh", "same", "python")
EVICT = 64 << 20  # bytes written to evict the host's caches before a cold pass


def _cache_of(generate):
    """The StaticCache make_gpt2's generate() keeps in its closure."""
    for cell in generate.__closure__ or ():
        v = cell.cell_contents
        if isinstance(v, dict) and "cache" in v:
            return v["cache"]
    raise RuntimeError("no cache in generate()'s closure")


if __name__ == "__main__":
    main()
