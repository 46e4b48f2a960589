"""The document the user works on: volumes, ROI masks and tractograms.

Plain Python with change events (napari's model/view split): views subscribe
with :meth:`Observable.connect` and are called on every change; nothing polls
and nothing here knows about Qt or VTK. Arrays live in voxel index space
(voxel centres at integer indices); each object carries the affine that maps
voxel indices to RAS+ millimetres.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROI_ROLES = ("seed", "target", "exclusion", "waypoint", "stop")


class Observable:
    """Minimal event source: ``connect(callback)``, ``emit(event, **info)``."""

    def __init__(self) -> None:
        self._listeners: list[Callable[..., None]] = []

    def connect(self, callback: Callable[..., None]) -> None:
        self._listeners.append(callback)

    def disconnect(self, callback: Callable[..., None]) -> None:
        self._listeners.remove(callback)

    def emit(self, event: str, **info: Any) -> None:
        for callback in list(self._listeners):
            callback(self, event, **info)


class Volume(Observable):
    """A 3-D scalar/vector volume (or 4-D series) with its voxel-to-RAS affine.

    ``kind`` says how to show and use it: ``scalar``, ``rgb``, ``vector``,
    ``tensor`` (6 components, order xx, xy, xz, yy, yz, zz in voxel axes),
    ``dwi`` or ``labels``.
    """

    def __init__(self, name: str, data: np.ndarray, affine: np.ndarray, *, kind: str = "scalar", source: str = ""):
        super().__init__()
        data = np.asarray(data)
        if data.ndim < 3:
            raise ValueError(f"a volume needs at least 3 dimensions, got shape {data.shape}")
        affine = np.asarray(affine, dtype=np.float64)
        if affine.shape != (4, 4):
            raise ValueError("affine must be 4x4")
        self.name = name
        self._data = data
        self.affine = affine
        self.kind = kind
        self.source = source

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        value = np.asarray(value)
        if value.shape[:3] != self._data.shape[:3]:
            raise ValueError("a volume's grid cannot change; make a new volume instead")
        self._data = value
        self.emit("data")

    @property
    def shape3(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self._data.shape[:3])

    @property
    def voxel_size(self) -> np.ndarray:
        return np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0))

    def __repr__(self) -> str:
        return f"Volume({self.name!r}, shape={self._data.shape}, kind={self.kind!r})"


class RoiMask(Observable):
    """A region of interest as a boolean voxel mask on a reference grid."""

    def __init__(self, name: str, mask: np.ndarray, affine: np.ndarray, *, role: str = "seed"):
        super().__init__()
        if role not in ROI_ROLES:
            raise ValueError(f"unknown ROI role {role!r}: one of {', '.join(ROI_ROLES)}")
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 3:
            raise ValueError("an ROI mask must be 3-D")
        self.name = name
        self.mask = mask
        self.affine = np.asarray(affine, dtype=np.float64)
        self.role = role

    @property
    def voxel_count(self) -> int:
        return int(np.count_nonzero(self.mask))

    def set_voxels(self, index: tuple, value: bool = True) -> None:
        """Paint (or erase) voxels; ``index`` is anything NumPy accepts."""
        self.mask[index] = value
        self.emit("mask")

    def voxel_coordinates(self) -> np.ndarray:
        """(M, 3) integer voxel indices inside the ROI."""
        return np.argwhere(self.mask)


@dataclass
class Tractogram(Observable):
    """Streamlines as one ragged array: ``points`` (P, 3) and ``offsets`` (S + 1,).

    Streamline ``i`` is ``points[offsets[i]:offsets[i + 1]]``, in voxel index
    coordinates of the grid described by ``affine`` (voxel -> RAS mm) and
    ``dimensions``. ``point_scalars`` hold (P,) or (P, k) arrays,
    ``streamline_scalars`` (S,) or (S, k) arrays.
    """

    points: np.ndarray
    offsets: np.ndarray
    affine: np.ndarray = field(default_factory=lambda: np.eye(4))
    dimensions: tuple[int, int, int] = (1, 1, 1)
    point_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    streamline_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "tractogram"

    def __post_init__(self) -> None:
        Observable.__init__(self)
        self.points = np.asarray(self.points, dtype=np.float32).reshape(-1, 3)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.affine = np.asarray(self.affine, dtype=np.float64)
        self.dimensions = tuple(int(d) for d in self.dimensions)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must start at 0")
        if self.offsets[-1] != len(self.points) or np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing and end at the number of points")
        for key, values in self.point_scalars.items():
            if len(values) != len(self.points):
                raise ValueError(f"point scalar {key!r} has {len(values)} values for {len(self.points)} points")
        for key, values in self.streamline_scalars.items():
            if len(values) != len(self):
                raise ValueError(f"streamline scalar {key!r} has {len(values)} values for {len(self)} streamlines")

    @classmethod
    def from_list(cls, streamlines, **kwargs) -> Tractogram:
        lengths = [len(s) for s in streamlines]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        points = (
            np.concatenate([np.asarray(s, np.float32).reshape(-1, 3) for s in streamlines])
            if streamlines
            else np.zeros((0, 3), np.float32)
        )
        return cls(points, offsets, **kwargs)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @property
    def lengths(self) -> np.ndarray:
        """Number of points per streamline."""
        return np.diff(self.offsets)

    def points_world(self) -> np.ndarray:
        """All points in RAS mm."""
        return self.points @ self.affine[:3, :3].T + self.affine[:3, 3]

    def __eq__(self, other) -> bool:  # dataclass eq would compare arrays ambiguously
        return self is other

    __hash__ = object.__hash__
