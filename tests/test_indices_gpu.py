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

#: In a fresh process with an empty kernel cache: ``first`` arrays, then the cache's files, then
#: ``then`` arrays, then its files again (a JSON line).
_PROGRAM = """
import json, os, sys
import cupy, numpy as np
from tractlens.gpu import backend, indices
ok, gpu = backend.gpu_status(); assert ok, gpu
use = cupy.flatnonzero if sys.argv[1] == "cupy" else (lambda a: indices.flatnonzero(cupy, a))
nonzero = cupy.nonzero if sys.argv[1] == "cupy" else (lambda a: indices.nonzero(cupy, a))
cache = os.environ["CUPY_CACHE_DIR"]
def files():
    return sorted(f for f in os.listdir(cache) if f.endswith(".cubin"))
def run(shapes):
    for shape in shapes:
        mask = cupy.asarray(np.random.default_rng(1).random(shape) < 0.3)  # made on the host: no kernel
        use(mask.ravel()) if len(shape) == 1 else nonzero(mask)
    cupy.cuda.Device().synchronize()
run([(40,), (40, 3)])
first = files()
run([(5000,), (2000, 3), (512,), (513,), (1,), (7, 2, 11), (200000,)])
print(json.dumps([first, files()]))
"""


def _kernel_files(tmp_path: Path, which: str) -> tuple[list[str], list[str]]:
    cache = tmp_path / f"cache-{which}"
    cache.mkdir()
    env = {
        **os.environ,
        "CUPY_CACHE_DIR": str(cache),
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, which], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, then = json.loads(done.stdout.strip().splitlines()[-1])
    return first, then


def test_other_sizes_and_shapes_compile_nothing_more(tmp_path):
    pytest.importorskip("cupy")
    first, then = _kernel_files(tmp_path, "engine")
    assert first and then == first, f"{len(then) - len(first)} more kernels for other sizes and shapes"
    own_first, own_then = _kernel_files(tmp_path, "cupy")
    assert len(own_then) > len(own_first), "CuPy's own nonzero no longer changes kernels at 512 elements"


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
