"""A .trx tractogram as it is stored: memory-mapped RAS millimetres, nothing converted or copied.

:func:`~.tractogram.load_tractogram` gives a :class:`~app.model.Tractogram` in float32 voxel
coordinates of its grid, which the window and most pipelines need. A pipeline that only passes
the points on in chunks (COMMIT cuts them into segments on the DWI's grid, then writes the kept
ones) need not pay for that: for a whole-brain tractogram the conversion reads and writes
hundreds of millions of points twice (millimetres to voxels when read, back when written) and
holds a float32 copy. :func:`open_trx_mm` maps an uncompressed ``.trx`` (as TractLens and
trx-python write it) and returns its arrays as they are: ``points`` in RAS mm (float16/32/64,
a memory map), the per-point and per-streamline scalars likewise; ``frame = "mm"`` says so.
What consumers do: transform each chunk with ``inv(grid affine)`` themselves, check it is
finite (the file was not checked as a whole), and write kept parts through a writer opened
with ``points_in_mm`` (the positions go out exactly as they came in).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..tractogram import MappedPoints
from ._pages import PreadRows
from .tractogram import _DAMAGED, BAD_POSITIONS, _check_grid, _single_column, _to_voxels, reason

__all__ = ["MappedTractogram", "check_positions", "open_trx_mm", "world_points"]


def world_points(points_mm: np.ndarray, affine) -> MappedPoints:
    """Streamline points held as RAS millimetres of the grid ``affine`` ((P, 3) float32, finite:
    a GPU tracker's, made on the device before they left it) as a tractogram's ``points``: the
    voxel coordinates are made only if something reads them (with a file's conversion), and a
    writer writes the millimetres as they are (:meth:`.tractogram_stream.TractogramWriter.world_of`)."""
    return MappedPoints(
        np.asarray(points_mm, dtype=np.float32), np.linalg.inv(np.asarray(affine, np.float64)), _to_voxels
    )


def check_positions(tract) -> None:
    """Raise :class:`InputError` (what opening it would have said) when a tractogram read with
    ``load_tractogram(check_positions=False)`` has NaN or infinite positions, or ones beyond what
    its grid's voxel coordinates hold; they are checked once
    (:meth:`app.tractogram.MappedPoints.positions_fit`). Nothing to do for any other tractogram
    (checked when read)."""
    mapped = getattr(tract, "mapped", None)
    if mapped is not None and not mapped.positions_fit():
        raise InputError(BAD_POSITIONS, path=tract.source or None, fix=_DAMAGED[".trx"])


@dataclass
class MappedTractogram:
    """Streamlines straight from an uncompressed .trx: ``points`` (P, 3) RAS mm (a memory map),
    ``offsets`` (S + 1,), the file's grid (``affine`` voxel -> RAS mm, ``dimensions``), scalars
    (per point: memory maps; per streamline: arrays). The attributes a :class:`Tractogram`
    has, with ``frame = "mm"``: the points are not in voxel coordinates."""

    points: np.ndarray
    offsets: np.ndarray
    affine: np.ndarray
    dimensions: tuple[int, int, int]
    point_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    streamline_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "tractogram"
    source: str = ""
    frame: str = "mm"

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _compressed(path: Path) -> bool:
    with zipfile.ZipFile(path) as zf:
        return any(info.compress_type != zipfile.ZIP_STORED for info in zf.infolist())


def open_trx_mm(path: str | os.PathLike) -> MappedTractogram | None:
    """``path`` mapped as a :class:`MappedTractogram`, or None when it is not an uncompressed
    ``.trx`` (a compressed one is extracted to a temporary folder that closing removes: read it
    with :func:`load_tractogram`). Raises :class:`InputError` for a damaged file: a grid,
    lengths or scalars that do not fit its points."""

    path = Path(path)
    if path.suffix.lower() != ".trx" or not path.is_file():
        return None
    try:
        if _compressed(path):
            return None
        from trx.trx_file_memmap import load as trx_load

        trx = trx_load(str(path))
    except Exception as exc:
        raise InputError(f"could not be read as a .trx tractogram ({reason(exc)})", path=path,
                         fix=_DAMAGED[".trx"]) from None  # fmt: skip
    fix = _DAMAGED[".trx"]
    affine, dims = _check_grid((trx.header["VOXEL_TO_RASMM"], trx.header["DIMENSIONS"]), path)
    points = trx.streamlines._data
    lengths = np.asarray(trx.streamlines._lengths, dtype=np.int64)
    if points.size == 0 and lengths.size == 0:
        points, lengths = np.zeros((0, 3), np.float32), np.zeros(0, np.int64)
    if points.ndim != 2 or points.shape[1:] != (3,):
        raise InputError(f"the points have shape {points.shape}, not (N, 3)", path=path, fix=fix)
    if (lengths < 0).any() or int(lengths.sum()) != len(points):
        raise InputError("the streamline lengths do not add up to the number of points", path=path, fix=fix)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def column(values):  # (n, 1) columns as (n,) views: the memory map stays one
        return values[:, 0] if values.ndim == 2 and values.shape[1] == 1 else values

    per_point = {k: column(v._data) for k, v in trx.data_per_vertex.items()}
    per_streamline = {k: _single_column(v) for k, v in trx.data_per_streamline.items()}
    for key, values in per_point.items():
        if len(values) != len(points):
            raise InputError(f"the file is inconsistent: point scalar {key!r} has {len(values)} values for "
                             f"{len(points)} points", path=path, fix=fix)  # fmt: skip
    for key, values in per_streamline.items():
        if len(values) != len(lengths):
            raise InputError(f"the file is inconsistent: streamline scalar {key!r} has {len(values)} values "
                             f"for {len(lengths)} streamlines", path=path, fix=fix)  # fmt: skip
    # read by pread in the chunks asked for: the map's pages never join the resident memory
    points = PreadRows.over(points)
    per_point = {k: PreadRows.over(v) for k, v in per_point.items()}
    return MappedTractogram(
        points, offsets, affine, dims, per_point, per_streamline, name=path.name.split(".")[0], source=str(path)
    )
