"""The ruler's distances: voxel coordinates to millimetres through the grid's affine."""

import numpy as np
import pytest

from tractlens.app.grid import Grid
from tractlens.app.measure import Measurement, distance_mm


def test_distance_uses_the_voxel_sizes_of_each_axis():
    grid = Grid(np.diag([2.0, 3.0, 4.0, 1.0]), (10, 10, 10))
    assert distance_mm(grid, (1, 1, 1), (4, 5, 1)) == pytest.approx(np.hypot(3 * 2.0, 4 * 3.0), abs=1e-12)
    assert distance_mm(grid, (0, 0, 0), (0, 0, 2.5)) == pytest.approx(10.0, abs=1e-12)


def test_distance_is_invariant_to_a_rotation_and_translation_of_the_grid():
    angle = np.deg2rad(30)
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rotation * 1.5  # 1.5 mm isotropic, oblique
    affine[:3, 3] = (-90, 12, 40)
    grid = Grid(affine, (20, 20, 20))
    assert distance_mm(grid, (2, 3, 4), (5, 7, 4)) == pytest.approx(5 * 1.5, abs=1e-9)


def test_a_measurement_remembers_its_slice_and_labels_its_length():
    grid = Grid(np.diag([2.0, 2.0, 2.0, 1.0]), (10, 10, 10))
    m = Measurement.between(grid, (1.2, 1.0, 6), (4.2, 5.0, 6), axis=2)
    assert (m.axis, m.index) == (2, 6)
    assert m.length_mm == pytest.approx(10.0, abs=1e-12)
    assert m.label == "10.0 mm"
