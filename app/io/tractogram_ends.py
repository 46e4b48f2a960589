"""A tractogram's streamline ends only: what a connectome's end assignment reads.

:func:`~.tractogram.load_tractogram` converts every point of a file to voxel coordinates (a
whole-brain run's 310 M points: gigabytes read and converted in float64). A connectome by count
(or by a per-streamline weight) reads only each streamline's first and last point, so
:func:`load_tractogram_ends` reads those from an uncompressed ``.trx``'s memory map and converts
only them, with the same conversion as a whole load (so the same float32 voxel coordinates);
any other file is loaded whole and cut to its ends. The result is a
:class:`~app.model.Tractogram` of two-point streamlines (none for an empty streamline) with the
file's per-streamline scalars; the other points are not read, so they are not checked either.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..model import Tractogram
from ._pages import PreadRows
from .tractogram import _tractogram_from_mm, load_tractogram
from .tractogram_mapped import open_trx_mm

__all__ = ["end_rows", "load_tractogram_ends", "tractogram_ends"]


def end_rows(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(point rows of every non-empty streamline's first and last point, in order; the two-point
    lengths: 2 for each streamline with points, 0 for an empty one)."""
    offsets = np.asarray(offsets, dtype=np.int64)
    has = np.diff(offsets) > 0
    rows = np.stack([offsets[:-1][has], offsets[1:][has] - 1], axis=1).reshape(-1)
    return rows, np.where(has, 2, 0).astype(np.int64)


def tractogram_ends(tract: Tractogram) -> Tractogram:
    """``tract``'s streamlines cut to their first and last points (per-streamline scalars kept)."""
    rows, lengths = end_rows(tract.offsets)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Tractogram(tract.points[rows], offsets, tract.affine, tract.dimensions, {},
                      dict(tract.streamline_scalars), name=tract.name, source=tract.source)  # fmt: skip


def load_tractogram_ends(path: str | os.PathLike, reference=None) -> Tractogram:
    """The streamlines of ``path`` cut to their ends, in voxel coordinates of the file's grid (see
    the module's description); raises :class:`InputError` as :func:`load_tractogram` does."""
    path = Path(path)
    mapped = open_trx_mm(path) if path.suffix.lower() == ".trx" else None
    if mapped is None:
        return tractogram_ends(load_tractogram(path, reference))
    rows, lengths = end_rows(mapped.offsets)
    points = mapped.points
    if isinstance(points, PreadRows):  # scattered rows: through a map of the same bytes
        points = np.memmap(points.name, dtype=points.dtype, mode="r", offset=points.position, shape=points.shape)
    ends_mm = np.asarray(points[rows]) if len(rows) else np.zeros((0, 3), np.float32)
    return _tractogram_from_mm(ends_mm, lengths, (mapped.affine, mapped.dimensions), {},
                               dict(mapped.streamline_scalars), path)  # fmt: skip
