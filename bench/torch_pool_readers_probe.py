"""A compiled graph's output read on a copy stream, with record_stream, then
the next call: prints, step by step, what cgtree's allocator saw (the
record_stream hook's state, the streams noted for outputs, the waits of
launches, replays) and whether the copy read the right values. One process,
nothing else compiled before it: the case that failed on an H100 when
test_an_output_a_copy_stream_reads_after_record_stream_is_not_overwritten_by_the_next_replay_first
ran alone (0 waits), though it passed after other tests of its file.

    python3 bench/torch_pool_readers_probe.py

The failing runs were on a machine whose build folder a mutation had just
been rebuilt in: `objdump -d <the extension> | grep -c "call.*<tx_pool_readers_wait"`
should print 1 (0: the binary lacks the wait).
"""
import torch

import cgtree.torch as ct
from cgtree import _torch_ext as X
from cgtree.torch import _install


def figures(tag, out=None):
    m, s = ct.memory_stats(), ct.stats()
    line = {k: m[k] for k in ("pool_reader_streams", "pool_reader_waits", "recorded_streams")}
    line.update({k: s[k] for k in ("replays", "recordings", "graphs_plain")})
    if out is not None:
        ptr = out.untyped_storage().data_ptr()
        line["output"] = hex(ptr)
        line["output_is_an_eager_block"] = ptr in [p for _, _, p in X.eager_held(0)]
    print(tag, line, flush=True)


def main():
    print("device:", torch.cuda.get_device_name(), "hook:", _install._state["record_stream_hook"])
    print("extension:", X.__file__)
    print("exchange:", X.exchange_info())
    cg = torch.compile(lambda x: x * 2 + 1, backend="cgtree")
    copy = torch.cuda.Stream()
    n = 1 << 22
    x0, x1 = torch.zeros(n, device="cuda"), torch.ones(n, device="cuda")
    host = torch.empty(n, pin_memory=True)
    with torch.no_grad():
        for i in range(4):
            o = cg(x0)
            figures("warm call %d" % i, o)
            del o
        out = cg(x0)
        figures("the output's call", out)
        copy.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy):
            torch.cuda._sleep(300_000_000)
            host.copy_(out, non_blocking=True)
        out.record_stream(copy)
        figures("after record_stream", out)
        del out
        tree, _ = _install.tree_for(0)
        print("current stream before the next call:", hex(torch.cuda.current_stream().cuda_stream),
              "copy stream:", hex(copy.cuda_stream), "tree stream:", hex(tree.stream), "tree device:", tree.device)
        nxt = cg(x1)
        figures("the next call", nxt)
        torch.cuda.synchronize()
    print("copy read the output's values:", bool(torch.all(host == 1.0)), "next call right:", bool(torch.all(nxt == 3.0)))


if __name__ == "__main__":
    main()
