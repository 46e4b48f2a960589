"""COMMIT's segments built and kept on the device: the same segments as the host construction,
and their listing by streamline the permutation the device operator used to sort for.

The builder is written once against the array module; here NumPy stands in for the device (a
backend that says it is a GPU and hands out NumPy), and the ``gpu`` twins run it on CuPy. The host segments compared with them keep float64 lengths
(``length_dtype``), as when they are cut for a GPU (the CPU engine's are float32)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_commit import random_streamlines
from tractlens.gpu import commit_operator, commit_segments
from tractlens.gpu.commit_segments import segments


class NumpyAsDevice:
    """A backend whose "device" is NumPy, with a settable amount of free memory."""

    name, device_name, is_gpu = "gpu", "numpy standing in for a device", True
    xp = np

    def __init__(self, free_bytes: int = 1 << 34):
        self.free_bytes = free_bytes

    def free_memory_bytes(self) -> int:
        return self.free_bytes

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def free_cached_memory(self) -> None:
        pass

    def to_host(self, a):
        return np.asarray(a)


def _inputs(seed: int, n: int = 150):
    rng = np.random.default_rng(seed)
    shape = (9, 8, 10)
    points, offsets = random_streamlines(rng, n, shape, points=25)
    mask = rng.random(shape) > 0.15
    rows = np.full(shape, -1)
    rows[mask] = np.arange(mask.sum())
    return points.astype(np.float32), offsets, rows


def _by_fiber_reference(seg) -> np.ndarray:
    """What the device operator computed before: a sort of (streamline, row) keys."""
    n_rows = int(seg.row.max()) + 1
    return np.argsort(seg.fiber.astype(np.int64) * n_rows + seg.row, kind="stable")


@pytest.mark.parametrize("free_bytes", [1 << 34, 200_000])  # chunks kept / cut again
@pytest.mark.parametrize("chunk_points", [41, 700, 10**6])
@pytest.mark.parametrize("seed", [0, 1])
def test_device_segments_equal_the_host_ones(seed, chunk_points, free_bytes):
    points, offsets, rows = _inputs(seed)
    to_voxel = np.diag([1.0, 1.0, 1.0, 1.0])
    to_voxel[:3, 3] = [0.01, -0.02, 0.0]
    host = segments(points, offsets, rows, (2.0, 2.0, 2.5), to_voxel=to_voxel, length_dtype=np.float64)
    device = segments(
        points,
        offsets,
        rows,
        (2.0, 2.0, 2.5),
        backend=NumpyAsDevice(free_bytes),
        chunk_points=chunk_points,
        to_voxel=to_voxel,
        on_device=True,
    )
    assert len(host) > 1000
    for name in ("row", "fiber", "length", "orient"):
        got, want = getattr(device, name), getattr(host, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)  # bit for bit
    assert device.n_fibers == host.n_fibers == 150
    assert host.by_fiber is None
    np.testing.assert_array_equal(device.by_fiber, _by_fiber_reference(host))


def test_device_segments_of_streamlines_outside_the_mask():
    """Streamlines with no segment, and a chunk with none at all, leave no hole in the listing."""
    points, offsets, rows = _inputs(3, n=60)
    points[: offsets[20]] += 100.0  # the first 20 streamlines far outside the grid
    device = segments(points, offsets, rows, (2.0, 2.0, 2.5), backend=NumpyAsDevice(), chunk_points=50, on_device=True)
    host = segments(points, offsets, rows, (2.0, 2.0, 2.5), length_dtype=np.float64)
    assert not np.isin(np.arange(20), device.fiber).any()
    np.testing.assert_array_equal(device.row, host.row)
    np.testing.assert_array_equal(np.sort(device.by_fiber), np.arange(len(device)))
    np.testing.assert_array_equal(device.by_fiber, _by_fiber_reference(host))


def test_row_passes_over_device_segments_equal_the_host_ones():
    """EC compartments and IC sums per row from segments "on the device" (any array module)
    equal those from host segments."""
    points, offsets, rows = _inputs(5)
    host = segments(points, offsets, rows, (2.0, 2.0, 2.5), length_dtype=np.float64)
    device = segments(points, offsets, rows, (2.0, 2.0, 2.5), backend=NumpyAsDevice(), on_device=True)
    for got, want in zip(commit_operator.ec_from_segments(device), commit_operator.ec_from_segments(host), strict=True):
        np.testing.assert_array_equal(got, want)
    weight = np.random.default_rng(0).random(host.n_fibers)
    n_rows = int(host.row.max()) + 1
    np.testing.assert_array_equal(
        commit_operator.ic_per_row(device, weight, n_rows), commit_operator.ic_per_row(host, weight, n_rows)
    )


# ---------------------------------------------------------------------------------- on CuPy
@pytest.mark.gpu
@pytest.mark.parametrize("chunk_points", [700, 10**6])
def test_gpu_device_segments_equal_the_host_ones(chunk_points):
    """On CuPy: rows, streamlines and orientations exactly; lengths within 1e-12 (the points are
    transformed to voxels on the device: the same float64 operations, perhaps fused)."""
    from tractlens.gpu.backend import get_backend

    backend = get_backend("gpu")
    points, offsets, rows = _inputs(7, n=400)
    to_voxel = np.array([[1.0, 0.01, 0, 0.2], [0, 0.98, 0.0, -0.1], [0.0, 0.02, 1.01, 0.05], [0, 0, 0, 1]])
    host = segments(points, offsets, rows, (2.0, 2.0, 2.5), to_voxel=to_voxel, length_dtype=np.float64)
    device = segments(
        points, offsets, rows, (2.0, 2.0, 2.5), backend=backend, chunk_points=chunk_points, to_voxel=to_voxel,
        on_device=True,
    )  # fmt: skip
    assert device.on_device and len(device) == len(host) > 3000
    for name in ("row", "fiber", "orient"):
        np.testing.assert_array_equal(backend.to_host(getattr(device, name)), getattr(host, name), err_msg=name)
    np.testing.assert_allclose(backend.to_host(device.length), host.length, rtol=1e-12)
    np.testing.assert_array_equal(backend.to_host(device.by_fiber), _by_fiber_reference(host))


@pytest.mark.gpu
def test_gpu_operator_on_device_segments_equals_the_one_on_host_segments():
    """A x, Aᵀ y and the column norms from device-resident segments (their listing by streamline
    given, no sort) equal those of the operator built from the same segments on the host."""
    from tests.test_commit import small_problem
    from tractlens.gpu.backend import get_backend
    from tractlens.gpu.commit_device import DeviceOperator
    from tractlens.gpu.commit_operator import Problem
    from tractlens.gpu.commit_segments import Segments

    backend = get_backend("gpu")
    problem, *_ = small_problem(seed=5, n_fibers=80)
    seg = problem.segments
    xp = backend.xp
    resident = Segments(
        xp.asarray(seg.row), xp.asarray(seg.fiber), xp.asarray(seg.length), xp.asarray(seg.orient), seg.n_fibers,
        xp.asarray(_by_fiber_reference(seg)),
    )  # fmt: skip
    on_device = Problem(
        problem.n_rows, resident, problem.ec_row, problem.ec_orient, problem.lut_ic, problem.lut_ec, problem.lut_iso
    )
    rng = np.random.default_rng(1)
    x, y = rng.random(problem.n_cols), rng.random(problem.n_rows * problem.n_meas)
    a, b = DeviceOperator(backend, problem), DeviceOperator(backend, on_device)
    np.testing.assert_array_equal(backend.to_host(b.a(x)), backend.to_host(a.a(x)))
    np.testing.assert_array_equal(backend.to_host(b.at(y)), backend.to_host(a.at(y)))
    np.testing.assert_array_equal(b.column_norms(), a.column_norms())


@pytest.mark.gpu
def test_gpu_ic_per_row_is_the_host_bincount_bit_for_bit():
    """The per-row sums made on the device (one thread per row, in segment order, products not
    fused) equal the host's ``bincount`` exactly, empty rows included."""
    from tractlens.gpu.backend import get_backend

    backend = get_backend("gpu")
    points, offsets, rows = _inputs(9, n=500)
    host = segments(points, offsets, rows, (2.0, 2.0, 2.5), length_dtype=np.float64)
    device = segments(points, offsets, rows, (2.0, 2.0, 2.5), backend=backend, on_device=True)
    weight = np.random.default_rng(3).random(host.n_fibers)
    n_rows = int(rows.max()) + 1
    want = commit_operator.ic_per_row(host, weight, n_rows)
    got = commit_operator.ic_per_row(device, weight, n_rows)
    assert isinstance(got, np.ndarray) and got.shape == want.shape
    resident = commit_segments.Segments(
        backend.xp.asarray(host.row), backend.xp.asarray(host.fiber), backend.xp.asarray(host.length),
        backend.xp.asarray(host.orient), host.n_fibers,
    )  # fmt: skip
    np.testing.assert_array_equal(
        commit_operator.ic_per_row(resident, weight, n_rows), want
    )  # the same segments: exact
    np.testing.assert_allclose(got, want, rtol=1e-12)  # segments cut on the device: lengths within 1e-12


def test_device_segments_halve_a_chunk_that_runs_out_of_memory():
    """A chunk that does not fit is cut in halves (and those again) until it does: the same
    segments as in one piece."""
    points, offsets, rows = _inputs(4, n=120)

    class Cramped(NumpyAsDevice):
        def __init__(self):
            super().__init__()
            self.refused = 0

    backend = Cramped()
    real = commit_segments._chunk_segments

    def tight(xp, chunk, *args):
        if len(chunk) > 300:  # more than ~12 streamlines at once: "out of memory"
            backend.refused += 1
            raise MemoryError("device full")
        return real(xp, chunk, *args)

    want = segments(points, offsets, rows, (2.0, 2.0, 2.5), length_dtype=np.float64)
    import unittest.mock

    with unittest.mock.patch.object(commit_segments, "_chunk_segments", tight):
        got = segments(points, offsets, rows, (2.0, 2.0, 2.5), backend=backend, chunk_points=10**6, on_device=True)
    assert backend.refused > 3
    for name in ("row", "fiber", "length", "orient"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_array_equal(got.by_fiber, _by_fiber_reference(want))
