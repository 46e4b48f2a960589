"""Streamlines simplified for drawing (issue 41, app.fiber_simplify and gpu.simplify): every
streamline stays, its first and last points stay, and every dropped point lies within the
tolerance of the segment drawn in its place, checked here point by point against a plain loop;
the same on the GPU (marked ``gpu``)."""

import itertools

import numpy as np
import pytest

from tractlens.app.fiber_arrays import piece_bounds
from tractlens.app.fiber_simplify import simplified_cells, simplify_block, tolerance_in_points


def curvy(rng, n_streamlines=400, longest=70, step=0.5):
    """Random smooth-ish walks of 1..longest points (some of one or two points)."""
    lengths = rng.integers(1, longest, n_streamlines)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    turns = rng.normal(0, 0.35, (int(offsets[-1]), 3))
    direction = np.cumsum(turns, axis=0)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    points = np.cumsum(step * direction, axis=0).astype(np.float32)
    return points, offsets


def worst_gap(points, offsets, new_offsets, kept) -> float:
    """The largest distance of a dropped point to the segment between the kept points around it
    (a plain loop); asserts that every streamline keeps its first and last point."""
    worst = 0.0
    for s in range(len(offsets) - 1):
        mine = kept[new_offsets[s] : new_offsets[s + 1]]
        assert mine[0] == offsets[s] and mine[-1] == offsets[s + 1] - 1
        for a, b in itertools.pairwise(mine):
            p, q = points[a].astype(np.float64), points[b].astype(np.float64)
            u = q - p
            for i in range(a + 1, b):
                t = np.clip(np.dot(points[i] - p, u) / max(np.dot(u, u), 1e-300), 0.0, 1.0)
                worst = max(worst, float(np.linalg.norm(points[i] - p - t * u)))
    return worst


@pytest.mark.parametrize("tolerance", [0.02, 0.1, 0.5])
def test_every_dropped_point_is_within_the_tolerance_of_the_line_drawn(tolerance):
    points, offsets = curvy(np.random.default_rng(3))
    new_offsets, kept = simplify_block(points, offsets, tolerance)
    assert len(new_offsets) == len(offsets) and np.all(np.diff(kept) > 0)
    assert worst_gap(points, offsets, new_offsets, kept) <= tolerance * (1 + 1e-5)
    assert len(kept) < len(points)  # something was dropped


def test_a_straight_line_keeps_one_point_in_sixteen_and_a_zigzag_keeps_all():
    straight = np.zeros((97, 3), np.float32)
    straight[:, 0] = np.arange(97)
    zigzag = straight.copy()
    zigzag[1::2, 1] = 1.0
    points = np.concatenate([straight, zigzag])
    offsets = np.array([0, 97, 194])
    new_offsets, kept = simplify_block(points, offsets, 0.1)
    assert new_offsets[1] == 7  # 0, 16, 32, 48, 64, 80 and the last (96)
    np.testing.assert_array_equal(kept[:7], [0, 16, 32, 48, 64, 80, 96])
    assert new_offsets[2] - new_offsets[1] == 97  # every zigzag point is 1 mm off its neighbours' line


def test_pieces_give_the_cells_of_the_whole_and_float16_points_are_read_as_float32():
    points, offsets = curvy(np.random.default_rng(5), 900)
    whole = simplified_cells(points, offsets, [(0, 900)], 0.1)
    bounds = piece_bounds(offsets, max_points=int(offsets[-1]) // 3)
    assert len(bounds) >= 3
    pieced = simplified_cells(points, offsets, bounds, 0.1)
    assert pieced.decimated and not pieced.identity and pieced.n_streamlines == 900
    np.testing.assert_array_equal(pieced.offsets, whole.offsets)
    np.testing.assert_array_equal(pieced.connectivity, whole.connectivity)
    for part, (a, _b) in zip(pieced.pieces(offsets, bounds), bounds, strict=True):
        np.testing.assert_array_equal(part.connectivity + offsets[a], whole.connectivity[part_slice(whole, a, part)])
    half = simplified_cells(points.astype(np.float16), offsets, [(0, 900)], 0.1)
    assert (
        worst_gap(points.astype(np.float16).astype(np.float32), offsets, half.offsets, half.connectivity) <= 0.1 + 1e-5
    )


def part_slice(whole, first_streamline, part) -> slice:
    lo = int(whole.offsets[first_streamline])
    return slice(lo, lo + part.n_points)


def test_the_tolerance_is_taken_to_the_points_units_by_the_longest_axis():
    affine = np.diag([1.25, 1.25, 2.5, 1.0])
    assert tolerance_in_points(0.1, affine) == pytest.approx(0.04)
    assert tolerance_in_points(0.1, np.eye(4)) == pytest.approx(0.1)


def test_cancelling_stops_it():
    points, offsets = curvy(np.random.default_rng(1))
    with pytest.raises(RuntimeError, match="cancelled"):
        simplified_cells(points, offsets, [(0, len(offsets) - 1)], 0.1, cancelled=lambda: True)


@pytest.mark.gpu
def test_the_gpu_keeps_the_points_numpy_keeps_within_the_bound():
    """CuPy against NumPy on the same blocks: the bound holds, and the kept points agree but for
    points whose distance is within float32 rounding of the tolerance (at most 1 in 10^4 here)."""
    from tractlens.gpu.backend import get_backend

    backend = get_backend("gpu")
    points, offsets = curvy(np.random.default_rng(7), 3000)
    bounds = piece_bounds(offsets, max_points=int(offsets[-1]) // 2)
    on_cpu = simplified_cells(points, offsets, bounds, 0.1)
    on_gpu = simplified_cells(points, offsets, bounds, 0.1, backend=backend)
    assert worst_gap(points, offsets, on_gpu.offsets, on_gpu.connectivity) <= 0.1 * (1 + 1e-5)
    differ = np.setxor1d(on_cpu.connectivity, on_gpu.connectivity)
    assert len(differ) <= max(1, len(points) // 10_000), len(differ)
