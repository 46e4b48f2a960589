"""Use case: keep the streamlines of a tractogram that pass ROI masks (include AND, exclude NOT)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import numpy as np

from tractlens.gpu.backend import get_backend
from tractlens.gpu.engines import decide_device
from tractlens.gpu.select import StreamlineIndex

from ..errors import InputError
from ..grid import Grid
from ..io.nifti import load_3d, load_image
from ..model import Tractogram
from ..timing import phase
from ..tractogram import on_grid

log = logging.getLogger(__name__)


def resample_nearest(mask: np.ndarray, affine: np.ndarray, ref_affine: np.ndarray, ref_shape) -> np.ndarray:
    """A mask on another grid, brought onto the reference grid by nearest neighbour."""
    return Grid(ref_affine, ref_shape).resample_nearest(np.asarray(mask, dtype=bool), Grid(affine, mask.shape))


def mask_on_reference(
    mask: np.ndarray,
    affine: np.ndarray,
    what: str,
    name,
    ref_affine,
    ref_shape,
    notes: list[str],
    reference: str = "the first mask",
) -> np.ndarray:
    """One region (a boolean array on the grid of ``affine``) on the reference grid, by the one
    grid rule of :class:`app.grid.Grid`: on the same grid, as it is; on another, resampled by
    nearest neighbour (a note says so). An empty region, or one that lies outside the reference
    grid, is refused. ``name`` names it in the messages (its file, or its layer)."""
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        raise InputError(f"the {what} is empty (no non-zero voxel)", path=name, fix="Give a non-empty region")
    if not Grid(ref_affine, ref_shape).matches((affine, mask.shape)):
        mask = resample_nearest(mask, affine, ref_affine, ref_shape)
        notes.append(f"{name}: on another grid than {reference}; resampled (nearest neighbour)")
        if not mask.any():
            raise InputError(f"the {what} lies outside {reference}'s volume", path=name)
    return mask


def load_masks_on_reference(
    paths: Sequence[str | os.PathLike],
    what: str,
    ref_affine,
    ref_shape,
    notes: list[str],
    reference: str = "the first mask",
):
    """Masks from files (non-zero, finite voxels), each on the reference grid by :func:`mask_on_reference`."""
    masks = []
    for path in paths:
        with phase("read"):
            img = load_image(path, what)
            data = np.asarray(load_3d(path, None, what))
        mask = (data != 0) & np.isfinite(data)
        masks.append(mask_on_reference(mask, img.affine, what, path, ref_affine, ref_shape, notes, reference))
    return masks


def select_pipeline(
    tractogram: Tractogram,
    include: Sequence[str | os.PathLike],
    exclude: Sequence[str | os.PathLike] = (),
    *,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
):
    """(selected tractogram, selection, notes). The first mask is the reference grid."""
    if not include:
        raise InputError("at least one --include mask is needed", fix="Give the region fibers must pass")
    first = load_image(include[0], "mask")
    ref_affine, ref_shape = first.affine, tuple(int(s) for s in first.shape[:3])
    notes: list[str] = []
    inc = load_masks_on_reference(include, "include mask", ref_affine, ref_shape, notes)
    exc = load_masks_on_reference(exclude, "exclude mask", ref_affine, ref_shape, notes)
    choice = decide_device("select", tractogram.n_points, requested=device)
    selection = select_on_grid(
        tractogram, ref_affine, inc, exc, device=choice.argument, progress=progress, cancelled=cancelled
    )
    selection.provenance["device_choice"] = choice.reason
    return tractogram.subset(selection.selected), selection, notes


def index_on_grid(tractogram: Tractogram, grid_affine: np.ndarray, device: str = "auto") -> StreamlineIndex:
    """The tractogram's points in voxel coordinates of another grid, kept on the compute device
    for repeated selections (the GUI keeps one per tractogram while ROIs are edited). On the GPU
    they go up a chunk at a time as they are read (:class:`GridRows`): a tractogram kept as its
    file's millimetres (:attr:`Tractogram.mapped`) gets no voxel copy in host memory."""
    backend = get_backend(device)
    points = GridRows(tractogram, grid_affine) if backend.is_gpu else points_on_grid(tractogram, grid_affine)
    return StreamlineIndex(points, tractogram.offsets, device=backend)


class GridRows:
    """A tractogram's points in voxel coordinates of the grid ``grid_affine``, read by row slices
    (``rows[a:b]``: float32 (b - a, 3)), converted as they are read."""

    def __init__(self, tractogram: Tractogram, grid_affine: np.ndarray):
        self.tractogram = tractogram
        self.same = Grid.affines_match(tractogram.affine, grid_affine)
        self.to_grid = np.linalg.solve(np.asarray(grid_affine, dtype=np.float64), tractogram.affine)

    def __len__(self) -> int:
        return self.tractogram.n_points

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(len(self))
        part = self.tractogram.points_rows(a, max(a, b))
        if self.same:
            return part
        return on_grid(part, self.to_grid, np.float32)


#: Points converted to another grid at a time (no float64 copy of a whole-brain tractogram)
GRID_CHUNK_POINTS = 1 << 22


def points_on_grid(tractogram: Tractogram, grid_affine: np.ndarray) -> np.ndarray:
    """The points (float32) in voxel coordinates of the grid ``grid_affine``: the tractogram's own
    array when that is its grid (no copy), else converted :data:`GRID_CHUNK_POINTS` at a time."""
    if Grid.affines_match(tractogram.affine, grid_affine):
        return tractogram.points  # float32 (a mapped file's: its voxel coordinates, made once)
    to_grid = np.linalg.solve(np.asarray(grid_affine, dtype=np.float64), tractogram.affine)
    out = np.empty((tractogram.n_points, 3), dtype=np.float32)
    for start in range(0, len(out), GRID_CHUNK_POINTS):
        out[start : start + GRID_CHUNK_POINTS] = on_grid(
            tractogram.points_rows(start, start + GRID_CHUNK_POINTS), to_grid
        )
    return out


def select_on_grid(
    tractogram: Tractogram, grid_affine: np.ndarray, include, exclude=(), *, device: str = "auto", **kwargs
):
    """Select with masks on the grid of ``grid_affine`` (the tractogram's own grid may differ)."""
    return index_on_grid(tractogram, grid_affine, device).select(include, exclude, **kwargs)
