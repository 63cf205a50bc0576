"""Rounds of a benchmark's modes, each in a process of its own: what
bench/torch_recurrent.py and bench/torch_two_models.py share.

A child process prints one line `RESULT {json}`; the parent runs it with
run_child, keeps the rounds per mode, takes the median round, and appends
each round to a JSON-lines file. cgtree's allocator must be installed
before CUDA starts, hence a process per round."""
import json
import subprocess
import sys


def child_result(out):
    """The child's side: its one result line."""
    print("RESULT " + json.dumps(out))


def run_child(script, args, fallback):
    """Runs `python3 script args...`; its result dict, or fallback with
    "raised" saying how the process ended where it printed none."""
    p = subprocess.run([sys.executable, script] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return dict(fallback, raised=f"process rc={p.returncode}: {p.stderr.strip().splitlines()[-1:]}")


def median_round(rounds, key):
    """(the rounds that measured `key`, the median of them, or the first
    round where none did)."""
    rs = [r for r in rounds if key in r]
    return rs, sorted(rs, key=lambda r: r[key])[len(rs) // 2] if rs else rounds[0]


def append_rounds(path, rounds, drop, **fields):
    """Each round as a JSON line in path, less the keys in drop, plus fields."""
    if not path:
        return
    with open(path, "a") as fh:
        for r in rounds:
            r = {k: v for k, v in r.items() if k not in drop}
            fh.write(json.dumps(dict(r, **fields)) + "\n")


def interleaved_rounds(modes, n, run_one):
    """{mode: [result, ...]}: n rounds of run_one(mode) for each mode, the
    modes interleaved in each round; eager and inductor once (the
    references)."""
    rounds = {m: [] for m in modes}
    for r in range(n):
        for m in modes:
            if r and m in ("eager", "inductor"):
                continue
            rounds[m].append(run_one(m))
    return rounds
