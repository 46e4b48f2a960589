"""Trilinear interpolation (gpu.interpolate): the flat-gather path equals the indexed one."""

from __future__ import annotations

import numpy as np
import pytest

from tractlens.gpu.interpolate import trilinear


@pytest.mark.parametrize("channels", [1, 6, 8])
def test_trilinear_gathers_by_flat_index_with_the_same_result(rng, channels):
    """A C-contiguous field (gathered by flat voxel number) and the same field in Fortran order
    (three index arrays) give bit-identical values, points outside the grid (clamped) included;
    at voxel centres the values are the voxels'."""
    field = rng.random((7, 9, 5, channels)).astype(np.float32)
    points = rng.uniform(-1.5, 10.0, (500, 3)) * [1.0, 1.0, 0.6]
    fast = trilinear(np, field, points)
    indexed = trilinear(np, np.asfortranarray(field), points)
    assert fast.shape == (500, channels) and fast.dtype == np.float64
    np.testing.assert_array_equal(fast, indexed)
    centres = np.argwhere(np.ones(field.shape[:3], bool)).astype(np.float64)
    np.testing.assert_allclose(trilinear(np, field, centres), field.reshape(-1, channels), rtol=1e-7)
