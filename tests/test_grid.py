"""Grid: one same-grid test and one nearest-neighbour resampling for every mask in TractLens."""

import numpy as np
import pytest

from tractlens.app.grid import Grid


def test_grids_match_within_the_tolerance_and_not_beyond():
    affine = np.diag([2.0, 2.0, 2.5, 1.0])
    grid = Grid(affine, (10, 12, 8))
    nudged = affine.copy()
    nudged[0, 3] += 0.5 * Grid.TOLERANCE
    assert grid.matches(Grid(nudged, (10, 12, 8)))
    nudged[0, 3] += Grid.TOLERANCE
    assert not grid.matches(Grid(nudged, (10, 12, 8)))
    assert not grid.matches(Grid(affine, (10, 12, 9)))
    assert grid.same_placement(Grid(affine, (10, 12, 9)))


def test_grid_of_volume_like_objects_and_pairs():
    class Img:
        affine = np.eye(4)
        shape = (4, 5, 6, 30)

    assert Grid.of(Img()).shape == (4, 5, 6)
    assert Grid.of((np.eye(4), (4, 5, 6))).matches(Img())
    with pytest.raises(ValueError):
        Grid(np.full((4, 4), np.nan), (1, 1, 1))
    with pytest.raises(ValueError):
        Grid(np.eye(4), (0, 1, 1))


def test_resample_nearest_against_brute_force_on_a_rotated_shifted_grid():
    rng = np.random.default_rng(1)
    source = Grid(np.diag([1.0, 1.0, 1.0, 1.0]), (20, 18, 16))
    data = rng.random(source.shape) > 0.7
    angle = np.deg2rad(10)
    rot = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rot * 1.5
    affine[:3, 3] = [2.0, -1.0, 0.5]
    target = Grid(affine, (12, 12, 10))
    out = target.resample_nearest(data, source)
    expected = np.zeros(target.shape, dtype=bool)
    for ijk in np.ndindex(target.shape):
        src = np.rint(source.to_voxels(target.to_mm(np.array([ijk], float)))[0]).astype(int)
        if np.all(src >= 0) and np.all(src < source.shape):
            expected[ijk] = data[tuple(src)]
    assert out.dtype == bool
    np.testing.assert_array_equal(out, expected)


def test_resample_onto_the_same_grid_returns_the_data():
    grid = Grid(np.eye(4), (3, 3, 3))
    data = np.arange(27).reshape(3, 3, 3)
    assert grid.resample_nearest(data, grid) is data
    with pytest.raises(ValueError):
        grid.resample_nearest(np.zeros((2, 2, 2)), grid)
