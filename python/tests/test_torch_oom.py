"""Out of device memory under cgtree.torch (GPU): an error the program can
catch and recover from, never a crash, and never a failure eager PyTorch
would not have.

Each scenario runs in a process of its own (oom_program.py): it fills the
device with memory taken outside PyTorch (cudaMalloc through CuPy), and a
regression would end that process's CUDA context.
"""
import json
import os
import subprocess
import sys

import pytest

import torch_gpu

torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
pytest.importorskip("cupy")

PROGRAM = os.path.join(os.path.dirname(__file__), "oom_program.py")


def scenario(name):
    p = subprocess.run([sys.executable, PROGRAM, name], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_an_eager_allocation_larger_than_the_device_raises_torch_out_of_memory_error_and_cuda_keeps_working():
    """torch.OutOfMemoryError, PyTorch's own class, with PyTorch's wording:
    what code that recovers from out of memory catches (oom_error.cc)."""
    r = scenario("eager")
    kind, text = r["raised"]
    assert r["torch_class"] == 1  # the library built here: its thrower is set
    assert kind == "OutOfMemoryError"
    assert text.startswith("CUDA out of memory. Tried to allocate 65536.00 GiB on device 0")
    assert r["after"] == 8.0
    assert r["num_ooms"] == 1


def test_a_compiled_graph_the_full_device_cannot_warm_up_raises_out_of_memory_and_records_once_memory_is_back():
    r = scenario("compiled_true_oom")
    kind, text = r["raised"]
    assert kind == "OutOfMemoryError" and "CUDA out of memory" in text
    assert r["when_full"]["front_cache_mib_before"] == 0  # nothing cached that could make room
    assert r["when_full"]["out_of_memory"] == 1
    assert r["when_full"]["graphs_plain"] == 0  # the graph stays a segment: out of memory is not its fault
    assert r["first"] == [3.0, 3.0]
    assert all(res == [[3.0, 3.0], 3.0] for res in r["results"])
    assert r["end"]["graphs_plain"] == 0 and r["end"]["recordings"] >= 1 and r["end"]["replays"] >= 1


@pytest.mark.parametrize("inputs", ["static", "dynamic"])
def test_memory_eager_code_freed_serves_a_compiled_graph_whose_pool_must_grow(inputs):
    """PyTorch's one caching allocator would reuse memory eager code freed
    for the graph. The tree's pool cannot, and the driver sees the blocks
    cgtree's front cache keeps as in use: when the pool cannot grow, the
    front cache and the driver's pool give their memory back to the device,
    and the pool tries once more: for the output, and for a DYNAMIC input's
    placeholder, which the tree makes before the launch."""
    r = scenario("compiled_cache_holds_room" if inputs == "static" else "compiled_cache_holds_room_for_a_placeholder")
    assert r["raised"] is None, json.dumps(r["when_full"])
    assert r["when_full"]["front_cache_mib_before"] == 240 and r["when_full"]["front_cache_mib"] == 0
    assert r["when_full"]["pool_alloc_retries"] == 1
    assert r["when_full"]["out_of_memory"] == 0 and r["when_full"]["graphs_plain"] == 0
    assert all(res == [[3.0, 3.0], 3.0] for res in r["results"])
    assert r["end"]["graphs_plain"] == 0 and r["end"]["recordings"] >= 1 and r["end"]["replays"] >= 1
