"""The run's streamlines traced again as polylines (gpu.probabilistic_trace): the array version
against the per-streamline reference it replaced, on the CPU exactly and on the GPU exactly for the
GPU's own trace (the polylines and the kept test are integer/selection work: no tolerance), and the
kept sample (trace_kept) as the first kept polylines of trace_paths."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_probabilistic import slab, straight_bundle
from tractlens.gpu.probabilistic import path_positions, trace_kept, trace_paths
from tractlens.gpu.probabilistic_numpy import track_numpy
from tractlens.gpu.probabilistic_params import BIT_EXCLUDE, WAYPOINT_SHIFT, ProbParams, mask_bits, streamline_ids
from tractlens.gpu.probabilistic_trace import kept_of, polylines_of


def reference_polylines(first, second) -> list[np.ndarray]:
    """The per-streamline construction (second half reversed, then the first without its start;
    a position where it moved), as gpu.probabilistic built it before."""
    out = []
    for a, b in zip(first, second, strict=True):
        parts = []
        for steps in (b, a):
            xyz = steps[:, :3]
            moved = np.concatenate([[True], np.any(xyz[1:] != xyz[:-1], axis=1)])
            parts.append(xyz[moved])
        out.append(np.concatenate([parts[0][::-1], parts[1][1:]]).astype(np.float32))
    return out


def reference_kept(lines, bits, n_waypoints: int, waycond: str) -> np.ndarray:
    shape = np.array(bits.shape)
    hits = np.zeros(len(lines), dtype=np.uint32)
    for i, line in enumerate(lines):
        v = np.rint(line).astype(np.int64)
        v = v[((v >= 0) & (v < shape)).all(1)]
        hits[i] = np.bitwise_or.reduce(bits[tuple(v.T)].astype(np.uint32)) if len(v) else 0
    waymask = np.uint32(sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints)))
    kept = (hits & BIT_EXCLUDE) == 0
    if n_waypoints:
        kept &= (hits & waymask) == waymask if waycond == "AND" else (hits & waymask) != 0
    return kept


def _halves(device, field_, bits, seeds, params, n_waypoints, positions):
    """The traced halves of ``positions`` on ``device`` (host arrays)."""
    if device == "gpu":
        from tractlens.gpu.backend import get_backend
        from tractlens.gpu.probabilistic_kernel import KernelTracker

        backend = get_backend("gpu")
        cp = backend.xp
        ids, _ = streamline_ids(0, 0, len(seeds), params.n_samples, positions)
        tracker = KernelTracker(backend, field_, bits, seeds, params, 0, n_waypoints, max_batch=len(positions))
        trace = cp.zeros((len(positions), 2, params.n_steps + 1, 4))
        tracker.launch(0, len(positions), trace, cp.asarray(ids))
        host = backend.to_host(trace)
        return host[:, 0], host[:, 1]
    _, (first, second) = track_numpy(field_, bits, seeds, params, 0, n_waypoints, record=True, positions=positions)
    return first, second


CASES = {
    "waypoint AND, exclusion": dict(waypoints=2, waycond="AND", exclude=True, stop=False),
    "waypoint OR, stop": dict(waypoints=2, waycond="OR", exclude=False, stop=True),
    "no waypoint, exclusion": dict(waypoints=0, waycond="AND", exclude=True, stop=False),
}


def _setup(case):
    field_, brain, bundle = straight_bundle(noise=0.4)
    spec = CASES[case]
    waypoints = [slab(12, 13), slab(17, 18)][: spec["waypoints"]]
    bits = mask_bits(
        brain,
        exclude=slab(20, 21, y=slice(4, 6)) if spec["exclude"] else None,
        stop=slab(25, 26) if spec["stop"] else None,
        waypoints=waypoints,
    )
    params = ProbParams(n_samples=12, n_steps=150, waycond=spec["waycond"])
    seeds = np.argwhere(bundle & slab(3, 4))
    return field_, bits, seeds, params, len(waypoints)


@pytest.mark.parametrize("case", list(CASES))
def test_trace_paths_equal_the_per_streamline_reference(device, case):
    field_, bits, seeds, params, n_way = _setup(case)
    total = len(seeds) * params.n_samples
    positions = path_positions(total, total)
    lines, seed_of, kept = trace_paths(
        field_, bits, seeds, params, positions, n_waypoints=n_way, device=device, chunk=53
    )
    first, second = _halves(device, field_, bits, seeds, params, n_way, positions)
    expected = reference_polylines(first, second)
    assert len(lines) == len(expected) == total
    for line, want in zip(lines, expected, strict=True):
        assert line.dtype == np.float32
        np.testing.assert_array_equal(line, want)  # exactly: the same trace, selected and cast alike
    np.testing.assert_array_equal(kept, reference_kept(expected, bits, n_way, params.waycond))
    assert 0 < kept.sum() < total
    np.testing.assert_array_equal(seed_of, streamline_ids(0, 0, len(seeds), params.n_samples, positions)[1])


@pytest.mark.parametrize("case", list(CASES))
def test_trace_kept_gives_the_first_kept_polylines(device, case):
    field_, bits, seeds, params, n_way = _setup(case)
    total = len(seeds) * params.n_samples
    positions = path_positions(total, total)
    lines, seed_of, kept = trace_paths(field_, bits, seeds, params, positions, n_waypoints=n_way, device=device)
    order = np.flatnonzero(kept)
    for most_kept in (None, 7, len(order) + 5):
        timings: dict = {}
        points, offsets, seeds_kept, traced = trace_kept(
            field_, bits, seeds, params, positions, most_kept=most_kept, n_waypoints=n_way, device=device, chunk=41,
            timings=timings,
        )  # fmt: skip
        want = order if most_kept is None else order[:most_kept]
        assert len(offsets) - 1 == len(want) == len(seeds_kept)
        for i, k in enumerate(want):
            np.testing.assert_array_equal(points[offsets[i] : offsets[i + 1]], lines[k])
        np.testing.assert_array_equal(seeds_kept, seed_of[want])
        assert set(timings) == {"trace_s", "polylines_s", "to_host_s"}
        if most_kept == 7:  # tracing stops at the chunk that holds the 7th kept one
            assert traced == min(total, (order[6] // 41 + 1) * 41)
        else:
            assert traced == total


@pytest.mark.gpu
def test_gpu_trace_kept_matches_the_numpy_reference():
    """The GPU's kept sample against the CPU's (the compiled loop with numba: the NumPy reference's
    steps bit for bit): the same streamlines (kept flags, seed voxels, point counts) and points
    within 1e-3 voxel (the kernel's float32/float64 steps against NumPy's float64)."""
    field_, bits, seeds, params, n_way = _setup("waypoint AND, exclusion")
    positions = path_positions(len(seeds) * params.n_samples, 10**9)
    cpu, gpu = (
        trace_kept(field_, bits, seeds, params, positions, most_kept=40, n_waypoints=n_way, device=d)
        for d in ("cpu", "gpu")
    )
    np.testing.assert_array_equal(cpu[1], gpu[1])
    np.testing.assert_array_equal(cpu[2], gpu[2])
    np.testing.assert_allclose(cpu[0], gpu[0], atol=1e-3)


def _padded_trace(n=300, steps=120, seed=1):
    """(n, 2, steps + 1, 4) traces as the kernel writes them: each half moves for a while, then
    repeats its last position (some halves never move); positions on a 20 x 12 x 12 grid and off it."""
    rng = np.random.default_rng(seed)
    trace = np.zeros((n, 2, steps + 1, 4))
    for i in range(n):
        for h in range(2):
            length = int(rng.integers(1, steps + 1))
            moves = rng.normal(0.0, 0.6, (length, 3))
            moves[rng.random(length) < 0.1] = 0.0  # a failed step leaves the position
            walk = np.cumsum(moves, axis=0) + np.array([10.0, 6.0, 6.0])
            trace[i, h, :length, :3] = walk
            trace[i, h, length:, :3] = walk[-1]
            trace[i, h, :length, 3] = 1.0
    return trace


def test_polylines_and_kept_test_equal_the_reference_on_padded_traces():
    trace = _padded_trace()
    bits = mask_bits(np.ones((20, 12, 12), bool), exclude=slab(14, 15)[:20, :12, :12], waypoints=[slab(6, 8)[:20]])
    positions, used = polylines_of(np, trace[:, 0], trace[:, 1])
    points = positions.astype(np.float32)
    expected = reference_polylines(trace[:, 0], trace[:, 1])
    for i, want in enumerate(expected):
        np.testing.assert_array_equal(points[i][used[i]], want)
    kept = kept_of(np, points, used, bits, ProbParams(), 1)
    np.testing.assert_array_equal(kept, reference_kept(expected, bits, 1, "AND"))
    assert 0 < kept.sum() < len(kept)


@pytest.mark.gpu
def test_gpu_polylines_and_kept_test_equal_numpys_exactly():
    """The same array operations in CuPy on the same trace: the same polylines and kept flags, bit
    for bit (comparisons, selections, a float32 cast and rounding: no tolerance)."""
    import cupy as cp

    trace = _padded_trace()
    bits = mask_bits(np.ones((20, 12, 12), bool), exclude=slab(14, 15)[:20, :12, :12], waypoints=[slab(6, 8)[:20]])
    results = []
    for xp, data, b in ((np, trace, bits), (cp, cp.asarray(trace), cp.asarray(bits))):
        positions, used = polylines_of(xp, data[:, 0], data[:, 1])
        points = positions.astype(xp.float32)
        kept = kept_of(xp, points, used, b, ProbParams(), 1)
        results.append([np.asarray(a.get() if xp is cp else a) for a in (points[used], used.sum(axis=1), kept)])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
