"""Tractograms written so that reading them back gives the same arrays bit for bit (sessions, the autosave).

A tractogram computed in memory holds float32 voxel coordinates: its ``.trx`` holds them as
float64 millimetres (:func:`~.tractogram.save_tractogram` with ``exact``), which convert back to
the same float32 values. A tractogram read from an uncompressed ``.trx`` keeps the file's
positions memory-mapped (:class:`app.tractogram.MappedPoints`), and its voxel coordinates are made
from them; for it the exact copy is the file's positions themselves, in the file's own dtype
(float32, or float16 as stored: a twelfth or a sixth of the float64 copy), streamed from the file
:data:`CHUNK_POINTS` at a time with ``pread`` (no copy of the whole in memory, no page of the map
kept resident). Reopened on the same grid (the session keeps the exact affine), they are mapped
again and give the same voxel coordinates bit for bit.

The file is trx-python's uncompressed layout (``header.json``, ``positions.3.<dtype>``,
``offsets.uint64``, ``dpv/``, ``dps/``; scalars in their own dtypes), written atomically (a
temporary file beside the target, flushed and renamed).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from ..model import Tractogram
from ._atomic import atomic_path
from ._pages import PreadRows, release_pages
from .tractogram import save_tractogram, trx_reference
from .tractogram_mapped import check_positions

__all__ = ["CHUNK_POINTS", "save_tractogram_exact", "written_as_stored"]

#: Rows (points, or a per-point scalar's values) read from the mapping and written at a time
#: (12 MB of float32 positions)
CHUNK_POINTS = 1 << 20


def written_as_stored(tract: Tractogram) -> bool:
    """Is ``tract`` written by :func:`save_tractogram_exact` as its file stores it (memory-mapped
    float16/32 millimetres whose voxel coordinates come from its own affine), rather than as
    float64 millimetres?"""
    mapped = tract.mapped
    if mapped is None or len(tract) == 0 or np.dtype(mapped.world.dtype) not in (np.float16, np.float32):
        return False
    # reopened on this affine, the voxel coordinates are made through inv(affine): the same bits
    # only when that is what made them here (an affine changed since would give others)
    return bool(np.array_equal(np.linalg.inv(np.asarray(tract.affine, np.float64)), mapped.to_voxel))


def save_tractogram_exact(tract: Tractogram, path: str | os.PathLike) -> Path:
    """Write ``tract`` as a ``.trx`` that reads back (with ``grid=(tract.affine, tract.dimensions)``)
    as the same arrays bit for bit: a memory-mapped tractogram's positions as its file stores
    them, streamed (:func:`written_as_stored`); anything else as float64 millimetres."""
    path = Path(path)
    if path.suffix.lower() != ".trx":
        raise ValueError("exact tractograms are written as .trx")
    if not written_as_stored(tract):
        return save_tractogram(tract, path, exact=True)
    check_positions(tract)  # a file opened by a window that checks after drawing: not copied unchecked
    with atomic_path(path) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            _write_as_stored(tract, archive)
    return path


def _write_as_stored(tract: Tractogram, archive: zipfile.ZipFile) -> None:
    from trx.utils import get_reference_info_wrapper

    mapped = tract.mapped
    affine, dimensions, _, _ = get_reference_info_wrapper(trx_reference(tract.affine, tract.dimensions))
    header = {"DIMENSIONS": dimensions.tolist(), "VOXEL_TO_RASMM": affine.tolist(),
              "NB_VERTICES": tract.n_points, "NB_STREAMLINES": len(tract)}  # fmt: skip
    archive.writestr("header.json", json.dumps(header))
    dtype = np.dtype(mapped.world.dtype).newbyteorder("<")
    _write_rows(archive, f"positions.3.{dtype.name}", mapped.reader, mapped.world, dtype)
    offsets = np.asarray(tract.offsets)  # S + 1 values, as trx-python writes them
    _write_rows(archive, "offsets.uint64", offsets, offsets, np.dtype("<u8"))
    for kind, scalars in (("dpv", tract.point_scalars), ("dps", tract.streamline_scalars)):
        for key, values in scalars.items():
            dtype = np.dtype(values.dtype).newbyteorder("<")
            reader = PreadRows.over(values) if isinstance(values, np.ndarray) else values
            try:
                _write_rows(archive, _member_name(kind, key, values, dtype), reader, values, dtype)
            finally:
                if reader is not values:
                    reader.close()


def _member_name(kind: str, key: str, values, dtype: np.dtype) -> str:
    """trx-python's names: (n,) and (n, 1) -> ``kind/key.dtype``, (n, k) -> ``kind/key.k.dtype``."""
    shape = np.shape(values)
    columns = "" if len(shape) == 1 or shape[1] == 1 else f".{shape[1]}"
    return f"{kind}/{key}{columns}.{dtype.name}"


def _write_rows(archive: zipfile.ZipFile, name: str, reader, source, dtype: np.dtype) -> None:
    """``reader``'s rows (``reader[a:b]`` an array: a :class:`PreadRows` or an array) into member
    ``name`` as ``dtype``, :data:`CHUNK_POINTS` rows at a time; the pages of ``source`` (when it is
    a memory map read through itself) are dropped after each chunk."""
    with archive.open(name, "w", force_zip64=True) as member:
        for lo in range(0, len(reader), CHUNK_POINTS):
            part = np.ascontiguousarray(reader[lo : lo + CHUNK_POINTS], dtype=dtype)
            member.write(part.data)
            if reader is source:
                release_pages(source)  # only a file's read-only or shared map; anything else stays
