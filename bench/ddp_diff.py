"""Where do two DDP training runs first differ? A diagnostic for
test_torch_ddp.py's bit-equality: each rank trains the test's MLP once per
mode (inductor, cgtree, or cgtree_sync: cgtree with a device sync after each
backward and each optimizer step), keeping every step's loss and gradients,
and prints, against the first mode's run, the first step whose gradients
differ, how many elements, by how much, and in which parameter.

    python bench/ddp_diff.py [--modes inductor,cgtree,inductor,cgtree] [--repeat 3]
                             [--deterministic] [--no-cgtree]

--deterministic runs the ranks with TORCHINDUCTOR_DETERMINISTIC=1 (Inductor
picks reduction configurations by heuristics, not by timing them).
--no-cgtree leaves cgtree out of the ranks altogether (PyTorch's own
allocator; then --modes may name only inductor). --share-backward makes
cgtree's backend share plain Inductor's FX-graph-cache key for every
backward (its rule keys a backward with nothing it may donate, such as
the last DDP piece's lone Linear; the probe asks whether that keying is
what differs). --cold gives each repeat empty Inductor and Triton caches.
It launches its two ranks itself (NCCL_NVLS_ENABLE=0), a process each.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="inductor,cgtree,inductor,cgtree,cgtree_sync")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--deterministic", action="store_true", help="TORCHINDUCTOR_DETERMINISTIC=1 in the ranks")
    ap.add_argument("--no-cgtree", action="store_true",
                    help="never import cgtree (PyTorch's own allocator): --modes must name only inductor")
    ap.add_argument("--share-backward", action="store_true",
                    help="every backward under plain Inductor's cache key (a probe of cgtree's keying rule)")
    ap.add_argument("--cold", action="store_true", help="empty Inductor and Triton caches for each repeat")
    ap.add_argument("--rank", type=int, default=-1)
    ap.add_argument("--port", type=int, default=0)
    return ap.parse_args()


def launch(a):
    if a.no_cgtree and set(a.modes.split(",")) != {"inductor"}:
        sys.exit("ddp_diff.py: --no-cgtree runs no cgtree: --modes may name only inductor")
    for rep in range(a.repeat):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, NCCL_NVLS_ENABLE="0")
        if a.deterministic:
            env["TORCHINDUCTOR_DETERMINISTIC"] = "1"
        cold = tempfile.mkdtemp(prefix="ddp_diff_cache.") if a.cold else None
        if cold:
            env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(cold, "inductor"), TRITON_CACHE_DIR=os.path.join(cold, "triton"))
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                                   "--modes", a.modes, "--steps", str(a.steps)]
                                  + (["--no-cgtree"] if a.no_cgtree else [])
                                  + (["--share-backward"] if a.share_backward else []), env=env) for r in range(2)]
        codes = [p.wait() for p in procs]
        if cold:
            shutil.rmtree(cold, ignore_errors=True)
        print("repeat %d: exit codes %s" % (rep, codes), flush=True)


def rank_main(a):
    ct = None
    if not a.no_cgtree:
        import cgtree.torch as ct
        if a.share_backward:
            from cgtree.torch import _backend
            _backend._donates_all_it_may = lambda graph_id, donated: True
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
    from ddp_model import MLP

    dev = torch.device("cuda", a.rank)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    dist.init_process_group("nccl", rank=a.rank, world_size=2)
    g = torch.Generator().manual_seed(1000 + a.rank)
    data = [(torch.randn(32, 512, generator=g).to(dev), torch.randn(32, 512, generator=g).to(dev))
            for _ in range(a.steps)]

    def train(mode):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = MLP(512, 4).to(dev)
        params = list(model.parameters())
        sizes = [p.numel() for p in params]
        hist = torch.zeros(a.steps, sum(sizes), device=dev)
        f = torch.compile(DDP(model, device_ids=[a.rank], bucket_cap_mb=1.0),
                          backend="inductor" if mode == "inductor" else "cgtree")
        opt = torch.optim.AdamW(params, lr=1e-3)
        losses = []
        for i, (x, y) in enumerate(data):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(f(x), y)
            loss.backward()
            if mode == "cgtree_sync":
                torch.cuda.synchronize()
            off = 0
            for p, n in zip(params, sizes):
                hist[i, off:off + n].copy_(p.grad.reshape(-1))
                off += n
            opt.step()
            if mode == "cgtree_sync":
                torch.cuda.synchronize()
            losses.append(loss.detach().clone())
        return torch.stack(losses), hist, sizes

    runs = [(m, *train(m)) for m in a.modes.split(",")]
    m0, l0, h0, sizes = runs[0]
    lines = []
    for m, l, h, _ in runs[1:]:
        d = (h - h0).abs()
        steps = (d.amax(dim=1) > 0).nonzero().flatten().tolist()
        lsteps = (l != l0).nonzero().flatten().tolist()
        if not steps:
            lines.append("rank %d %s vs %s: gradients bit-equal at every step; losses differ at %s" % (
                a.rank, m, m0, lsteps))
            continue
        k = steps[0]
        row = d[k]
        where, off = [], 0
        for j, n in enumerate(sizes):
            part = row[off:off + n]
            if part.amax() > 0:
                where.append("param %d: %d elements, max %.3g (of |g| max %.3g)" % (
                    j, int((part > 0).sum()), float(part.amax()), float(h0[k, off:off + n].abs().amax())))
            off += n
        lines.append("rank %d %s vs %s: gradients first differ at step %d (steps differing: %s); losses differ at %s; %s"
                     % (a.rank, m, m0, k, steps, lsteps, "; ".join(where)))
    st = ct.stats() if ct is not None else {}
    lines.append("rank %d cgtree stats: recordings %s replays %s graphs %s plain %s" % (
        a.rank, st.get("recordings"), st.get("replays"), st.get("graphs_compiled"), st.get("graphs_plain")))
    print("\n".join(lines), flush=True)
    dist.barrier(device_ids=[a.rank])
    dist.destroy_process_group()


if __name__ == "__main__":
    args = parse()
    launch(args) if args.rank < 0 else rank_main(args)
