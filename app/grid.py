"""The voxel grid of an image: its voxel-to-RAS affine and its 3-D shape.

Every "is this mask on that image's grid, else resample it" test in TractLens goes through
:class:`Grid`, with one tolerance, so that a mask accepted by one panel or command is accepted by
all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np


@dataclass(frozen=True, eq=False)
class Grid:
    """A voxel grid: ``affine`` maps voxel indices (i, j, k) to RAS+ millimetres; ``shape`` is (X, Y, Z)."""

    affine: np.ndarray = field(repr=False)
    shape: tuple[int, int, int]

    #: Two grids are the same when their shapes are equal and no affine entry differs by more than
    #: this (mm for the translation; the same number for the scaled rotation). NIfTI stores affines
    #: in float32, so one image written by two tools differs by ~1e-6 relative; 1e-3 mm is far
    #: below any voxel and above that rounding.
    TOLERANCE: ClassVar[float] = 1e-3

    def __post_init__(self):
        affine = np.array(self.affine, dtype=np.float64)
        if affine.shape != (4, 4) or not np.isfinite(affine).all():
            raise ValueError(f"a grid needs a finite 4x4 affine, got {affine.shape}")
        affine.setflags(write=False)
        shape = tuple(int(n) for n in tuple(self.shape)[:3])
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"a grid needs three positive dimensions, got {self.shape}")
        object.__setattr__(self, "affine", affine)
        object.__setattr__(self, "shape", shape)

    @classmethod
    def of(cls, thing: Any) -> Grid:
        """The grid of a :class:`Grid`, a volume-like object (``.affine`` and ``.shape3`` or
        ``.shape``, e.g. a model Volume, a tensor field or a nibabel image) or an (affine, shape) pair."""
        if isinstance(thing, Grid):
            return thing
        if isinstance(thing, tuple) and len(thing) == 2:
            return cls(np.asarray(thing[0]), tuple(thing[1]))
        shape = getattr(thing, "shape3", None)
        if shape is None:
            shape = thing.shape
        return cls(np.asarray(thing.affine), tuple(shape)[:3])

    def matches(self, other: Any) -> bool:
        """Same shape and the same affine within :attr:`TOLERANCE`."""
        other = Grid.of(other)
        return self.shape == other.shape and bool(np.allclose(self.affine, other.affine, rtol=0, atol=self.TOLERANCE))

    def same_placement(self, other: Any) -> bool:
        """The same affine within :attr:`TOLERANCE`, whatever the shapes (a cropped or padded copy)."""
        return Grid.affines_match(self.affine, Grid.of(other).affine)

    @staticmethod
    def affines_match(a: np.ndarray, b: np.ndarray) -> bool:
        """Two voxel-to-RAS affines equal within :attr:`TOLERANCE` (e.g. a layer drawn on the
        reference grid without resampling)."""
        return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=0, atol=Grid.TOLERANCE))

    @property
    def voxel_sizes(self) -> np.ndarray:
        """Voxel edge lengths in mm along i, j, k."""
        return np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0))

    @property
    def n_voxels(self) -> int:
        return int(np.prod(self.shape))

    def to_voxels(self, points_mm: np.ndarray) -> np.ndarray:
        """RAS mm (N, 3) -> continuous voxel coordinates (N, 3) of this grid."""
        inv = np.linalg.inv(self.affine)
        return np.asarray(points_mm, dtype=np.float64) @ inv[:3, :3].T + inv[:3, 3]

    def contains(self, voxels: np.ndarray) -> np.ndarray:
        """Per row of continuous voxel coordinates (N, 3): whether it lies within the grid's volume
        (inside its voxels' outer faces)."""
        voxels = np.asarray(voxels)
        return ((voxels > -0.5) & (voxels < np.asarray(self.shape) - 0.5)).all(axis=1)

    def to_mm(self, voxels: np.ndarray) -> np.ndarray:
        """Voxel coordinates (N, 3) -> RAS mm (N, 3)."""
        return np.asarray(voxels, dtype=np.float64) @ self.affine[:3, :3].T + self.affine[:3, 3]

    def resample_nearest(self, data: np.ndarray, source: Any) -> np.ndarray:
        """``data`` (3-D, on the grid ``source``) brought onto this grid by nearest neighbour; voxels
        of this grid outside ``source`` get 0 (False). Keeps the dtype; returns ``data`` itself when
        the grids match."""
        source = Grid.of((source.affine, np.shape(data)) if not isinstance(source, Grid) else source)
        data = np.asarray(data)
        if data.shape[:3] != source.shape:
            raise ValueError(f"data of shape {data.shape} is not on a grid of shape {source.shape}")
        if self.matches(source):
            return data
        to_source = np.linalg.solve(source.affine, self.affine)
        out = np.zeros(self.shape, dtype=data.dtype)
        # one k-plane at a time: whole-brain grids stay within a few MB of temporaries
        ii, jj = np.meshgrid(np.arange(self.shape[0]), np.arange(self.shape[1]), indexing="ij")
        plane = np.stack([ii.ravel(), jj.ravel(), np.zeros(ii.size)], axis=1).astype(np.float64)
        limits = np.array(source.shape)
        for k in range(self.shape[2]):
            plane[:, 2] = k
            ijk = np.rint(plane @ to_source[:3, :3].T + to_source[:3, 3]).astype(np.int64)
            inside = np.all((ijk >= 0) & (ijk < limits), axis=1)
            values = np.zeros(len(plane), dtype=data.dtype)
            values[inside] = data[tuple(ijk[inside].T)]
            out[:, :, k] = values.reshape(self.shape[:2])
        return out


def same_field_of_view(a: Any, b: Any, tolerance_voxels: float = 1.0) -> bool:
    """Do two grids span the same box of space (their corners within ``tolerance_voxels`` of the
    coarser one's voxels)? A registration's fixed grid may be its working grid over the fixed
    image's field of view rather than the image's own grid."""
    a, b = Grid.of(a), Grid.of(b)

    def corners(grid: Grid) -> np.ndarray:
        lo, hi = np.full(3, -0.5), np.array(grid.shape) - 0.5
        return np.sort(grid.to_mm(np.array([lo, hi])), axis=0)

    tolerance = tolerance_voxels * max(a.voxel_sizes.max(), b.voxel_sizes.max())
    return bool(np.all(np.abs(corners(a) - corners(b)) <= tolerance))
