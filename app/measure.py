"""Measurements on the reference grid: the distance in millimetres between two points given in
(continuous) voxel coordinates, as the slice views' ruler shows it.

Voxel indices become RAS+ millimetres through the grid's affine (:meth:`tractlens.app.grid.Grid.to_mm`),
so anisotropic voxels and oblique affines measure true distances.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .grid import Grid


def distance_mm(grid: Grid, a_ijk, b_ijk) -> float:
    """Euclidean distance in mm between two points in voxel coordinates of ``grid``."""
    ends = grid.to_mm(np.asarray([a_ijk, b_ijk], dtype=np.float64).reshape(2, 3))
    return float(np.linalg.norm(ends[1] - ends[0]))


@dataclass(frozen=True)
class Measurement:
    """A ruler between two points of one slice: ``start`` and ``end`` in reference voxel
    coordinates (continuous), ``axis`` and ``index`` the slice they were drawn on."""

    start: tuple[float, float, float]
    end: tuple[float, float, float]
    axis: int
    index: int
    length_mm: float

    @classmethod
    def between(cls, grid: Grid, start, end, axis: int) -> Measurement:
        start = tuple(float(v) for v in np.asarray(start, dtype=np.float64).ravel()[:3])
        end = tuple(float(v) for v in np.asarray(end, dtype=np.float64).ravel()[:3])
        return cls(start, end, int(axis), round(start[axis]), distance_mm(grid, start, end))

    @property
    def label(self) -> str:
        """The length as the ruler shows it (one decimal, mm)."""
        return f"{self.length_mm:.1f} mm"
