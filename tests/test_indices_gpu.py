"""gpu/indices.py on CuPy (run on the GPU machine: pytest -m gpu tests/test_indices_gpu.py).

The indices equal NumPy's, and a fresh process that finds the true elements of arrays of one
size and shape compiles nothing more for arrays of other sizes (either side of CuPy's limit of
512 elements) and shapes. CuPy's own ``flatnonzero`` does compile more there: the twin that
shows the test can fail, and that :data:`gpu.indices.CUPY_NONZERO_SMALL` is still CuPy's limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu

#: In a fresh process with an empty kernel cache: ``first`` arrays, then the cache's kernels, then
#: each of the ``then`` arrays with the kernels it added (a JSON line). CuPy saves each kernel's
#: source beside its binary (``CUPY_CACHE_SAVE_CUDA_SOURCE``), so a failure names the kernels.
_PROGRAM = """
import json, os, re, sys
import cupy, numpy as np
from tractlens.gpu import backend, indices
ok, gpu = backend.gpu_status(); assert ok, gpu
use = cupy.flatnonzero if sys.argv[1] == "cupy" else (lambda a: indices.flatnonzero(cupy, a))
nonzero = cupy.nonzero if sys.argv[1] == "cupy" else (lambda a: indices.nonzero(cupy, a))
cache = os.environ["CUPY_CACHE_DIR"]
def kernels():
    # {binary file: its kernels names from the saved source, else the file name}
    found = {}
    for name in os.listdir(cache):
        if name.endswith(".cu"):
            continue
        label = name
        for source in (name + ".cu", name.rsplit(".", 1)[0] + ".cu"):
            if os.path.exists(os.path.join(cache, source)):
                text = open(os.path.join(cache, source), errors="replace").read()
                label = " ".join(re.findall(r"__global__\\s+void\\s+(\\w+)", text)) or name
                break
        found[name] = label
    return found
def run(shape):
    mask = cupy.asarray(np.random.default_rng(1).random(shape) < 0.3)  # made on the host: no kernel
    use(mask.ravel()) if len(shape) == 1 else nonzero(mask)
    cupy.cuda.Device().synchronize()
for shape in [(40,), (40, 3)]:
    run(shape)
first = kernels()
added = {}
for shape in [(5000,), (2000, 3), (512,), (513,), (1,), (7, 2, 11), (200000,)]:
    before = kernels()
    run(shape)
    added[str(shape)] = sorted(label for name, label in kernels().items() if name not in before)
print(json.dumps([sorted(first.values()), added]))
"""


def _kernels(tmp_path: Path, which: str) -> tuple[list[str], dict[str, list[str]]]:
    cache = tmp_path / f"cache-{which}"
    cache.mkdir()
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(cache),
        "CUPY_CACHE_SAVE_CUDA_SOURCE": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, which], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, added = json.loads(done.stdout.strip().splitlines()[-1])
    return first, added


def test_other_sizes_and_shapes_compile_nothing_more(tmp_path):
    pytest.importorskip("cupy")
    first, added = _kernels(tmp_path, "engine")
    more = {shape: names for shape, names in added.items() if names}
    assert first and not more, f"kernels compiled for other sizes and shapes: {more}"
    _, own_added = _kernels(tmp_path, "cupy")
    assert any(own_added.values()), "CuPy's own nonzero no longer changes kernels at 512 elements"


@pytest.mark.parametrize("shape", [(0,), (1,), (40,), (512,), (513,), (5000,), (40, 3), (300, 3), (7, 2, 11)])
def test_the_indices_equal_numpys(shape):
    cupy = pytest.importorskip("cupy")
    from tractlens.gpu import backend, indices

    ok, gpu = backend.gpu_status()
    assert ok, gpu
    mask = np.random.default_rng(len(shape) + shape[0]).random(shape) < 0.3
    device = cupy.asarray(mask)
    np.testing.assert_array_equal(cupy.asnumpy(indices.flatnonzero(cupy, device)), np.flatnonzero(mask))
    for got, expected in zip(indices.nonzero(cupy, device), np.nonzero(mask), strict=True):
        np.testing.assert_array_equal(cupy.asnumpy(got), expected)
    values = cupy.asarray(np.where(mask, 2.5, 0.0))  # numbers, not booleans
    np.testing.assert_array_equal(cupy.asnumpy(indices.flatnonzero(cupy, values)), np.flatnonzero(mask))
