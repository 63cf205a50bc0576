"""The `cgtree` command of the Python package, as a user runs it: the console
script `pip install .` installs and `python -m cgtree`, the same program.
Bad input is one line, a hint and exit 2, never a traceback."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import cgtree

STEPS = "6"  # enough for warm-up, recording and replays on both branches


def console_script():
    """The `cgtree` script beside this Python (a venv's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "cgtree")
    return here if os.path.exists(here) else shutil.which("cgtree")


def run(*args, how="module"):
    cmd = [sys.executable, "-m", "cgtree"] if how == "module" else [console_script()]
    env = dict(os.environ, CGT_LOG="error")
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=300)


def test_pip_install_puts_a_cgtree_command_beside_python():
    assert console_script(), "no `cgtree` command installed with the package"
    r = run("--version", how="script")
    assert r.returncode == 0 and r.stdout == f"cgtree {cgtree.__version__}\n"


@pytest.mark.parametrize("how", ["module", "script"])
def test_the_demo_runs_every_workload_on_the_simulator(how):
    r = run("demo", "--backend", "sim", "--steps", STEPS, how=how)
    assert r.returncode == 0, r.stderr
    assert "branchy:" in r.stdout and "chain:" in r.stdout
    assert r.stdout.count("all equal") == 2 and "[RECORDED]" in r.stdout


def test_one_workload_as_one_json_document():
    r = run("demo", "--backend", "sim", "--workload", "chain", "--steps", STEPS, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cgtree"] == cgtree.__version__
    (w,) = doc["workloads"]
    assert w["workload"] == "chain" and w["outputs_equal"] is True and w["stats"]["replays"] > 0


def test_dot_writes_graphviz_to_stdout_and_to_a_file(tmp_path):
    r = run("dot", "--backend", "sim", "--workload", "branchy", "--steps", STEPS)
    assert r.returncode == 0 and r.stdout.startswith("digraph")
    f = tmp_path / "t.dot"
    r = run("demo", "--backend", "sim", "--workload", "chain", "--steps", STEPS, "--dot", str(f))
    assert r.returncode == 0 and f.read_text().startswith("digraph")


def test_a_dot_path_that_cannot_be_written_fails_before_the_demo_runs(tmp_path):
    r = run("demo", "--backend", "sim", "--dot", str(tmp_path / "no" / "x.dot"))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("cgtree: cannot write") and "Traceback" not in r.stderr


def test_info_says_whether_cuda_is_built_in_and_why_no_gpu():
    r = run("info")
    assert r.returncode == 0
    assert "backends: sim, cuda (" in r.stdout
    if "built, no usable GPU" in r.stdout:
        assert "cuda: " in r.stdout and "insufficient" not in r.stdout


@pytest.mark.parametrize("args", [
    [], ["bogus"], ["demo", "--bogus"], ["demo", "--steps", "0"], ["demo", "--steps", "-5"],
    ["demo", "--steps", "x"], ["demo", "--steps"], ["demo", "--workload", "nope"], ["demo", "--backend", "tpu"],
    ["demo", "extra"], ["dot", "--json"], ["dot", "a.dot", "b.dot"], ["info", "--bogus"], ["--version", "info"],
])
def test_bad_input_is_one_line_a_hint_and_exit_2(args):
    r = run(*args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("cgtree: ") and lines[1] == "Try 'cgtree help' for usage."
    assert r.stdout == ""


@pytest.mark.skipif(cgtree.cuda_available(), reason="a GPU is usable here")
def test_the_cuda_backend_without_a_gpu_is_one_line_and_exit_1():
    r = run("demo", "--backend", "cuda", "--steps", "2")
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "the CUDA backend is not available" in r.stderr


def test_defer_fuses_the_chain_and_a_closed_pipe_is_no_traceback():
    cmd = [sys.executable, "-m", "cgtree", "demo", "--backend", "sim", "--workload", "chain", "--steps", "20",
           "--defer"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "fused launches " in r.stdout
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader goes away at once, as `| head -0` would
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    assert "Traceback" not in err
