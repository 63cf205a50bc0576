"""When do a compiled forward's saved activations die? A probe, run with and
without compute-sanitizer (bench/torch_gpu.sh lifetime).

Under compute-sanitizer memcheck, a training loop's saved activations were
seen to outlive their backward (cgtree's saved_activations_alive grew by 7
a step), so no step began. The cause: the host backtraces the sanitizer
takes by default keep the Python frames of Triton's launches alive, and up
their callers Inductor's generated code with its buffers; with
--show-backtrace device they die as without the sanitizer. This script runs the same loop (an MLP, SGD,
set_to_none) a few steps and prints, after each: cgtree's counts, which
graphs run plainly and why, the exchange API's state, and for every
tensor the forward saved (read from the autograd node before backward) who
still holds its memory afterwards: a Python object (found by gc, with its
referrers) or something Python cannot see.

    python3 bench/torch_saved_lifetime.py [--steps 4]
"""
import argparse
import gc
import os
import sys

import cgtree.torch as ct  # before CUDA starts
import torch
from cgtree import _torch_ext as ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
from saved_tensors import saved_tensors_of  # noqa: E402  (the walk the training tests use)


def saved_of(loss):
    """(node name, data_ptr, nbytes) of each CUDA tensor the backward nodes of loss saved."""
    return [(name, t.data_ptr(), t.untyped_storage().nbytes()) for name, t in saved_tensors_of(loss) if t.is_cuda]


def tensors_over(ptr):
    """The CUDA tensors Python holds whose storage holds ptr."""
    found = []
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.is_cuda:
            try:
                st = o.untyped_storage()
                lo = st.data_ptr()
                hi = lo + st.nbytes()
            except Exception:
                continue
            if lo <= ptr < hi:
                found.append(o)
    return found


def holders(ptr):
    """Python tensors alive over ptr, each with the types of its referrers."""
    found = tensors_over(ptr)
    return [(tuple(o.shape), [type(r).__name__ for r in gc.get_referrers(o) if r is not found][:6]) for o in found]


def who_holds_frames(ptr):
    """For the first Python tensor over ptr that a frame refers to: each such
    frame (function, file:line), what refers to the frame, and up the chain
    (a traceback, its exception: type, text, and what holds the exception)."""
    import types
    found = tensors_over(ptr)
    for o in found:
        frames = [r for r in gc.get_referrers(o) if isinstance(r, types.FrameType)]
        lists = [r for r in gc.get_referrers(o) if isinstance(r, list) and r is not found]
        for li in lists:
            frames += [r for r in gc.get_referrers(li) if isinstance(r, types.FrameType)]
        ours = (list, type(iter([])))  # the probe's own lists of frames and its loop over them
        for fr in frames[:4]:
            print("      frame %s %s:%d" % (fr.f_code.co_name, fr.f_code.co_filename[-60:], fr.f_lineno))
            held = [r for r in gc.get_referrers(fr) if not isinstance(r, ours)]
            if not held:
                print("        held by nothing Python can see (no object refers to it)")
            for r in held:
                if isinstance(r, types.TracebackType):
                    for e in gc.get_referrers(r):
                        if isinstance(e, BaseException):
                            print("        held by a traceback of %s: %s" % (type(e).__name__, str(e)[:300]))
                            for h in gc.get_referrers(e):
                                print("          the exception is held by a %s%s" % (
                                    type(h).__name__, (": keys " + str(list(h)[:8])) if isinstance(h, dict) else ""))
                elif isinstance(r, types.FrameType):
                    print("        held by frame %s, which it called (the frame's f_back)" % r.f_code.co_name)
                else:
                    print("        held by a %s" % type(r).__name__)
        if frames:
            return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    env = sorted(k for k in os.environ if any(s in k for s in ("SANITIZER", "INJECTION", "CUDA_", "NV_")))
    print("environment:", env)
    print("exchange API:", ext.exchange_info() if hasattr(ext, "exchange_info") else "?")
    torch.manual_seed(0)
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 1)).cuda()
    f = torch.compile(model, backend="cgtree")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(16, 256, device="cuda")
    keys = ("saved_activations_alive", "steps_deferred", "recordings", "replays", "graphs_compiled", "graphs_plain",
            "gradients_moved")
    for i in range(a.steps):
        opt.zero_grad(set_to_none=True)
        loss = f(x).square().mean()
        saved = saved_of(loss)
        after_fw = ct.stats()["saved_activations_alive"]
        loss.backward()
        del loss
        gc.collect()
        opt.step()
        torch.cuda.synchronize()
        s = ct.stats()
        print("step %d: saved by the forward %d (cgtree counted %d after it); after backward: %s"
              % (i, len(saved), after_fw, {k: s.get(k) for k in keys}))
        if i == 0 or s["saved_activations_alive"]:
            for name, ptr, nbytes in saved[:8]:
                print("   saved by %s at %#x (%d bytes): Python holders %s" % (name, ptr, nbytes, holders(ptr)))
            if i:
                who_holds_frames(saved[-1][1])
            print("   sys.last_exc: %r; exc_info: %r" % (getattr(sys, "last_exc", None), sys.exc_info()[0]))
    print("plain graphs:", [(d.get("segment"), d.get("graph"), d.get("plain_reason"))
                            for d in __import__("cgtree.torch._backend", fromlist=["decisions"]).decisions])
    print("segments:", [(sg.info.get("name"), sg.info.get("plain_reason")) for sg in
                        __import__("cgtree.torch._backend", fromlist=["_segments"])._segments])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
