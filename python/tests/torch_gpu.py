"""The start every GPU test file of the torch door shares.

cgtree.torch installs its CUDA allocator when imported, which must happen
before CUDA starts, so a test file imports torch, skips as a whole without a
CUDA device (CI's machines have none), and only then imports cgtree.torch;
its tests skip too if the install raised at import (unreachable: the import
raises then).

    import torch_gpu
    torch, ct, pytestmark = torch_gpu.torch, torch_gpu.ct, torch_gpu.pytestmark
"""
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cgtree.torch as ct  # noqa: E402  (installs the allocator before CUDA starts)

pytestmark = pytest.mark.skipif(not ct.installed(), reason="unreachable: install() raised at import")

# compute-sanitizer keeps the Python frames of kernel launches alive, and
# through them a forward's saved activations (bench/torch_saved_lifetime.py):
# under it a backward stays pending for good, no step ends, and figures that
# count steps, replays or moved gradients cannot hold. Tests check results
# everywhere, and those figures only where steps end.
UNDER_SANITIZER = any(k.startswith("NV_SANITIZER_") for k in os.environ)
