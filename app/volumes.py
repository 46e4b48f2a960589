"""The voxel data of a document: volumes (scalar, colour, tensor, labels, a diffusion series,
fibre orientations) and ROI masks with their optional sphere or box shape.

Arrays live in voxel index space (voxel centres at integer indices); each object carries the
affine that maps voxel indices to RAS+ millimetres.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .observable import Observable


class DiffusionSeries(Protocol):
    """What the model needs of a diffusion series (:class:`app.io.DWI` is one): the model holds
    the series it shows and never imports the file formats that read it."""

    affine: np.ndarray
    path: str

    def mean_b0(self) -> np.ndarray: ...


class PosteriorSamples(Protocol):
    """What the model needs of bedpostX samples (:class:`app.io.BedpostSamples` is one)."""

    affine: np.ndarray


ROI_ROLES = ("seed", "target", "exclusion", "waypoint", "stop", "lesion")  # lesion: measured against, never tracked


class Volume(Observable):
    """A 3-D scalar/vector volume (or 4-D series) with its voxel-to-RAS affine.

    ``kind`` says how to show and use it: ``scalar``, ``rgb``, ``vector``,
    ``tensor`` (6 components, order xx, xy, xz, yy, yz, zz in voxel axes),
    ``dwi``, ``labels`` or ``dyads`` (fibre orientations, see :class:`Layer`).
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
        self.lut = None  # labels: an app.io.lut.LabelTable with the regions' names, when one is known

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


class DWIVolume(Volume):
    """A loaded diffusion series as a layer's data: shown as its mean b=0 image, the series kept.

    ``data`` is the 3-D mean of the b=0 volumes (what the views draw, in grey);
    ``dwi`` is the :class:`app.io.DWI` itself (4-D signal, b-values, b-vectors in
    voxel axes), which model fits started from the layer (ball & sticks) use.
    """

    def __init__(self, name: str, dwi: DiffusionSeries):
        super().__init__(name, dwi.mean_b0().astype(np.float32), dwi.affine, kind="dwi", source=dwi.path)
        self.dwi = dwi


class DyadsVolume(Volume):
    """Fibre orientations for display (kind ``dyads``, see :class:`Layer`) that keep the
    posterior samples they summarise (:class:`app.io.BedpostSamples`), which
    probabilistic tracking started from the layer uses."""

    def __init__(self, name: str, data: np.ndarray, samples: PosteriorSamples, *, source: str = ""):
        super().__init__(name, data, samples.affine, kind="dyads", source=source)
        self.samples = samples


def shape_half_sizes(shape: dict) -> np.ndarray:
    """A shape's half-size per voxel axis (3,): the radius of a sphere three times, a box's
    half-sizes (its radius is one number or one per axis)."""
    return np.broadcast_to(np.asarray(shape["radius"], dtype=float), (3,)).copy()


def normal_shape(shape: dict) -> dict:
    """A shape dict with its centre as a float array and its radius as a float (a box's
    per-axis half-sizes as a tuple of floats when they differ); checks the kind."""
    if shape["kind"] not in ("sphere", "box"):
        raise ValueError(f"unknown ROI shape {shape['kind']!r}")
    radius = np.asarray(shape["radius"], dtype=float)
    if radius.ndim == 0 or np.all(radius == radius.flat[0]):
        radius = float(radius.flat[0])
    elif shape["kind"] == "sphere" or radius.shape != (3,):
        raise ValueError("a sphere has one radius; a box one half-size or three (i, j, k)")
    else:
        radius = tuple(float(v) for v in radius)
    if np.any(np.asarray(radius) < 0):
        raise ValueError("a shape's radius cannot be negative")
    return dict(shape, centre=np.asarray(shape["centre"], dtype=float).reshape(3), radius=radius)


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
        # A movable 3-D shape ({"kind": "sphere"|"box", "centre": (3,) voxels, "radius": voxels})
        # whose voxels the mask holds; None for a freehand ROI (painting turns a shape freehand).
        # A box's radius is its half-size, one number or one per voxel axis (i, j, k).
        self.shape: dict | None = None

    def box(self) -> tuple[slice, slice, slice] | None:
        """The bounding box of the mask's voxels as slices, or None when it is empty (reductions
        along the axes: 0.5 ms for a 1.25 mm brain grid, where the indices of every voxel took
        18 ms of the GUI thread at each ROI edit's 3-D surface)."""
        from tractlens.gpu.select_host import box_slices, mask_bounds

        bounds = mask_bounds(self.mask)
        return None if bounds is None else box_slices(bounds)

    def apply_shape(self, shape: dict | None) -> None:
        """Make the mask the voxels of ``shape`` (sphere: distance ≤ radius; box: |d| ≤ radius per axis)."""
        self.shape = None if shape is None else normal_shape(shape)
        if shape is None:
            return
        grid = np.indices(self.mask.shape, dtype=np.float64)
        d = grid - self.shape["centre"][:, None, None, None]
        if self.shape["kind"] == "sphere":
            r = float(self.shape["radius"])
            inside = (d**2).sum(axis=0) <= r * r + 1e-9
        else:
            half = shape_half_sizes(self.shape)
            inside = (np.abs(d) <= half[:, None, None, None] + 1e-9).all(axis=0)
        self.mask[...] = inside

    @property
    def voxel_count(self) -> int:
        return int(np.count_nonzero(self.mask))

    @property
    def shape3(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.mask.shape)

    def set_voxels(self, index: tuple, value: bool = True) -> None:
        """Paint (or erase) voxels; ``index`` is anything NumPy accepts."""
        self.mask[index] = value
        self.emit("mask")

    def voxel_coordinates(self) -> np.ndarray:
        """(M, 3) integer voxel indices inside the ROI."""
        return np.argwhere(self.mask)
