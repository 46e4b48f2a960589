"""The connectome's counting by value (:func:`gpu.connectome_counts.bincount_or_zeros`,
:func:`count_true`) against NumPy's, on the CPU and (marked gpu) with CuPy's own kernels, and
the phase timings of a connectome run."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu.backend import get_backend
from tractlens.gpu.connectome_counts import bincount_or_zeros, count_true


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_bincount_is_numpys(device, dtype):
    """Counts, weighted sums (within the order of additions: atomic on the GPU), values
    beyond ``minlength``, empty input, as ``np.bincount``."""
    backend = get_backend(device)
    xp = backend.xp
    rng = np.random.default_rng(3)
    x = rng.integers(0, 1000, 200_000).astype(dtype)
    w = rng.random(len(x))
    for minlength in (1000, 1500, 10):
        counts = backend.to_host(bincount_or_zeros(xp, backend.asarray(x), minlength))
        assert counts.dtype == np.int64
        assert np.array_equal(counts, np.bincount(x, minlength=minlength))
        sums = backend.to_host(bincount_or_zeros(xp, backend.asarray(x), minlength, backend.asarray(w)))
        expect = np.bincount(x, weights=w, minlength=minlength)
        assert sums.dtype == np.float64 and sums.shape == expect.shape
        assert np.allclose(sums, expect, rtol=1e-12, atol=0)
    ones = backend.to_host(bincount_or_zeros(xp, backend.asarray(x), 1000, xp.ones(len(x))))
    assert np.array_equal(ones, np.bincount(x, minlength=1000).astype(np.float64))  # integer sums: exact
    empty = backend.to_host(bincount_or_zeros(xp, xp.zeros(0, dtype=xp.int64), 7))
    assert np.array_equal(empty, np.zeros(7, np.int64))
    with pytest.raises(ValueError):
        bincount_or_zeros(xp, backend.asarray(np.array([3, -1, 2], dtype=dtype)), 5)


def test_count_true(device):
    backend = get_backend(device)
    mask = np.random.default_rng(1).random(100_001) < 0.3
    n = count_true(backend.xp, backend.asarray(mask))
    assert int(n) == int(mask.sum()) and backend.to_host(n).dtype == np.int64


@pytest.mark.gpu
def test_the_gpu_counts_without_cupys_bincount(monkeypatch):
    """With CuPy the counts come from the engine's kernels: ``cupy.bincount`` checks
    ``(x < 0).any()``, which with CUB block reductions off runs on a single thread block."""
    import cupy

    def refused(*args, **kwargs):
        raise AssertionError("cupy.bincount was called")

    monkeypatch.setattr(cupy, "bincount", refused)
    x = cupy.asarray(np.arange(10) % 4)
    assert cupy.asnumpy(bincount_or_zeros(cupy, x, 4)).tolist() == [3, 3, 2, 2]
    assert cupy.asnumpy(bincount_or_zeros(cupy, x, 4, cupy.ones(10))).tolist() == [3.0, 3.0, 2.0, 2.0]


def test_a_timed_connectome_run_counts_the_same_and_gives_its_phases(device):
    """``timing`` waits between the phases; the counts are those of an untimed run."""
    from tests.test_connectome_modes import PARAMS, SHAPE, phantom
    from tractlens.gpu.connectome import ConnectomeSpec, track_connectome
    from tractlens.gpu.probabilistic_params import mask_bits

    field_, brain, bundle, seeds = phantom()
    nodes = np.full(SHAPE, -1, dtype=np.int64)
    layer = np.argwhere(bundle)
    nodes[tuple(layer.T)] = np.arange(len(layer))
    spec = ConnectomeSpec(matrix3_nodes=nodes, n_matrix3_nodes=len(layer))
    kw = dict(distthresh=0.0, distthresh3=0.0, lengths=False, device=device, chunk=50, capacity=100)
    plain = track_connectome(field_, mask_bits(brain), seeds, PARAMS, spec, **kw)
    timed = track_connectome(field_, mask_bits(brain), seeds, PARAMS, spec, timing=True, **kw)
    assert "phases_s" not in plain.provenance
    phases = timed.provenance["phases_s"]
    assert set(phases) == {"visits", "paths", "entries", "reduce", "result"}
    assert all(v >= 0 for v in phases.values()) and phases["visits"] > 0
    assert sum(phases.values()) <= timed.provenance["tracking_s"] + 1e-3
    assert timed.provenance["reductions"] > 1 and phases["reduce"] > 0
    for name in ("rows", "cols", "counts"):
        assert np.array_equal(getattr(plain.matrix3, name), getattr(timed.matrix3, name))
    assert np.array_equal(plain.paths, timed.paths) and np.array_equal(plain.waytotal, timed.waytotal)
    assert timed.matrix3.nnz > 0
