"""Data-parallel training on two GPUs (issue 21, item 6): DistributedDataParallel
over NCCL, compiled with torch.compile(backend="cgtree").

Under DDP, Dynamo's DDPOptimizer cuts the model's graph at the boundaries of
DDP's gradient buckets, so that each bucket's all-reduce can start while the
backward of the layers before it still runs; every piece's forward and
backward is a cgtree segment, and DDP's reducer (C++, in autograd's hooks)
runs the all-reduces between the backward segments.

The test launches two ranks (python/tests/ddp_worker.py, one process per GPU,
NCCL_NVLS_ENABLE=0), each of which imports cgtree.torch before CUDA starts and
trains the same model with plain Inductor (no CUDA graphs) and with cgtree;
the Inductor reference is the second of two Inductor runs, as the first
compile in an empty cache can give other last bits (see ddp_worker.py).
Each rank trains on its own batches, so only the all-reduce keeps the
ranks' weights equal. The parent asserts on what the ranks wrote:

- the final weights are bit-equal on both ranks, under Inductor and cgtree;
- each rank's losses (every step) and final weights under cgtree agree
  with its own under Inductor (losses to 1e-5 relative, weights to 1e-6
  absolute; see ddp_worker.py): not bit for bit, since two
  Inductor compiles of one graph in one process can differ in the last
  bits. On a fresh 2x H200 (`python bench/ddp_diff.py --cold`), plain
  Inductor's own first and second runs differed so in half the processes,
  and the last piece's backward, which cgtree compiles under its own cache
  key (it has no input it may donate: docs/torch.md, the cache
  paragraphs), gave its bias gradient other last bits than plain
  Inductor's with one compile thread, in deterministic mode too; the
  losses then differ by 1 ulp at a few steps. A value read from memory a
  replay overwrote would be off by far more;
- DDPOptimizer gave cgtree several forward graphs (a model DDP wraps must be
  a class of the program's own files: see ddp_worker.py), none ran plainly;
- after the warm-up, every segment call of every step replays: no
  recording, warmup or eager run.

Needs two CUDA GPUs (skips otherwise). This process never touches CUDA.
"""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
if torch.cuda.device_count() < 2:  # counts devices without initialising PyTorch's CUDA state
    pytest.skip("needs two CUDA GPUs", allow_module_level=True)
if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
    pytest.skip("needs torch.distributed with NCCL", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_worker.py")
STEPS, WARM = 24, 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, world=2, timeout=170):  # under torch_gpu.sh's pytest --timeout 200
    """Launch the ranks, wait for all, return their results (asserting each exited cleanly)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), NCCL_NVLS_ENABLE="0")
    env.pop("CGTREE_TORCH_NO_INSTALL", None)
    spec = importlib.util.find_spec("cgtree")  # the workers import the same cgtree as this process
    if spec is not None and spec.origin:
        root = os.path.dirname(os.path.dirname(spec.origin))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs, logs = [], []
    for r in range(world):
        log = open(os.path.join(tmp_path, "rank%d.log" % r), "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, WORKER, str(r), str(world), str(tmp_path),
                                       "--steps", str(STEPS), "--warm", str(WARM)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # until all are done, or one failed
            polls = [p.poll() for p in procs]
            if None not in polls or any(c not in (None, 0) for c in polls):
                break
            time.sleep(0.2)
        codes = [p.poll() if p.poll() is not None else "killed, still running after %.0f s" % (
            time.monotonic() - deadline + timeout) for p in procs]
    finally:
        for p in procs:  # a rank left waiting in a collective for one that failed, or past the timeout
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    tails = []
    for r, log in enumerate(logs):
        log.seek(0)
        tails.append("--- rank %d (%s) ---\n%s" % (r, codes[r], log.read()[-3000:]))
        log.close()
    assert codes == [0] * world, "a rank failed:\n" + "\n".join(tails)
    return [json.load(open(os.path.join(tmp_path, "rank%d.json" % r))) for r in range(world)]


def test_ddp_on_two_gpus_keeps_both_ranks_bit_equal_agrees_with_inductor_and_replays_after_warm_up(tmp_path):
    ranks = run_ranks(tmp_path)
    for res in ranks:
        r = res["rank"]
        assert res["allocator_installed"], "rank %d: cgtree's allocator was not installed" % r
        for run in ("inductor", "cgtree"):
            assert res[run]["weights_equal_across_ranks"], (
                "rank %d, %s: the final weights differ between the ranks (the all-reduce did not keep them equal)"
                % (r, run))
        assert res["forward_graphs"] > 1, (
            "rank %d: DDPOptimizer should cut the model into several graphs at DDP's bucket boundaries; cgtree "
            "compiled %d forward graphs" % (r, res["forward_graphs"]))
        assert res["graphs_plain"] == 0, "rank %d: %d graphs ran as plain Inductor" % (r, res["graphs_plain"])
        assert res["losses_close_to_inductor"], (
            "rank %d: cgtree's losses differ from Inductor's (max %g)\ncgtree   %s\ninductor %s"
            % (r, res["max_loss_difference"], res["cgtree"]["losses"], res["inductor"]["losses"]))
        assert res["weights_close_to_inductor"], (
            "rank %d: cgtree's final weights differ from Inductor's (max %g)" % (r, res["max_weight_difference"]))
        print("rank %d: cgtree bit-equal to Inductor's reference run: losses %s, weights %s; to its first run: "
              "losses %s (max differences %g, %g)" % (
                  r, res["losses_equal_to_inductor"], res["weights_equal_to_inductor"],
                  res["cgtree_equal_to_first_inductor_run"], res["max_loss_difference"], res["max_weight_difference"]))
        after = res["after_warm_up"]
        want = (STEPS - WARM) * res["graphs"]
        assert after["recordings"] == 0, "rank %d: recorded again after the warm-up: %s" % (r, after)
        assert after["replays"] == want, (
            "rank %d: after the warm-up each of the %d segments should replay at each of the %d steps (%d replays); "
            "counted %s" % (r, res["graphs"], STEPS - WARM, want, after))
    # Different batches per rank: the ranks' losses differ, so equal weights are the all-reduce's doing.
    assert ranks[0]["cgtree"]["losses"] != ranks[1]["cgtree"]["losses"], "the ranks trained on the same batches"
    for res in ranks:
        assert res["cgtree"]["losses_of_every_rank"] == [x["cgtree"]["losses"] for x in ranks], (
            "rank %d gathered other losses than the ranks reported" % res["rank"])
