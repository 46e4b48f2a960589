"""A .tck tractogram as it is stored: RAS millimetres read in chunks, never held whole.

The .tck counterpart of :func:`~.tractogram_mapped.open_trx_mm` for COMMIT, which only passes the
points on in chunks (cut into segments on the DWI's grid, then the kept ones written): a
whole-brain .tck read by :func:`~.tractogram.load_tractogram` holds every point in float32 voxel
coordinates (12 bytes a point: gigabytes for a million streamlines). Here the file is scanned
once, in chunks, for its streamline delimiters (MRtrix writes a NaN row after each streamline
and an infinite row at the end) to build the offsets (8 bytes a streamline), and ``points[lo:hi]``
reads those rows with ``pread``, the delimiter rows left out.

Only plain files are taken this way: anything irregular (a datatype other than Float32/64, no
end marker, a count that differs from the header's, per-point or per-streamline sidecar
files) returns None, and the caller reads the file with :func:`load_tractogram`, which checks
it and reports what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._pages import read_rows
from .tractogram_mapped import MappedTractogram

__all__ = ["TckPoints", "open_tck_mm"]

#: Rows read at a time while scanning for delimiters (48 MB of float32 rows)
SCAN_ROWS = 1 << 22


class TckPoints:
    """The points of a .tck without its delimiter rows: ``points[lo:hi]`` (contiguous slices) is a
    new (hi − lo, 3) array read from the file; ``len``, ``shape``, ``dtype``, ``ndim`` as an array's."""

    def __init__(self, path: Path, position: int, dtype: np.dtype, offsets: np.ndarray):
        self.path, self.position, self.dtype, self.offsets = path, position, dtype, offsets
        self.shape, self.ndim = (int(offsets[-1]), 3), 2
        self.fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("points are read by contiguous slices only")
        lo, hi, _ = key.indices(self.shape[0])
        if hi <= lo:
            return np.empty((0, 3), self.dtype)
        # point p of streamline k is file row p + k (one delimiter row after each streamline)
        k_lo = int(np.searchsorted(self.offsets, lo, side="right")) - 1
        k_hi = int(np.searchsorted(self.offsets, hi - 1, side="right")) - 1
        first, last = lo + k_lo, hi - 1 + k_hi
        rows = read_rows(self.fd, self.position + first * 3 * self.dtype.itemsize, self.dtype, (last - first + 1, 3))
        delimiters = self.offsets[k_lo + 1 : k_hi + 1] + np.arange(k_lo, k_hi) - first
        return np.delete(rows, delimiters, axis=0) if len(delimiters) else rows

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def close(self) -> None:
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        self.close()


def _delimiters(fd: int, position: int, dtype: np.dtype, n_rows: int) -> tuple[np.ndarray, int] | None:
    """File rows of the NaN delimiters before the end marker, and the end marker's row; None
    when there is no end marker."""
    found, start = [], 0
    while start < n_rows:
        rows = read_rows(fd, position + start * 3 * dtype.itemsize, dtype, (min(SCAN_ROWS, n_rows - start), 3))
        x = rows[:, 0]
        end = np.flatnonzero(np.isinf(x))
        stop = int(end[0]) if len(end) else len(x)
        found.append(np.flatnonzero(np.isnan(x[:stop])) + start)
        if len(end):
            return np.concatenate(found), start + stop
        start += len(x)
    return None


def open_tck_mm(path: str | os.PathLike, affine: np.ndarray, dimensions) -> MappedTractogram | None:
    """``path`` as a :class:`MappedTractogram` read in chunks (points in RAS mm, ``frame = "mm"``,
    on the grid ``affine``/``dimensions`` as :func:`load_tractogram` places a .tck on its
    reference), or None when it is not a plain .tck (module docstring)."""
    from .tractogram_tsf import read_mrtrix_header

    path = Path(path)
    if path.suffix.lower() != ".tck" or not path.is_file():
        return None
    stem = path.name[: -len(path.suffix)]
    if any(path.parent.glob(f"{stem}_*.tsf")) or any(path.parent.glob(f"{stem}_*.txt")):
        return None  # sidecar scalars: read with load_tractogram
    try:
        fields, position = read_mrtrix_header(path, b"mrtrix tracks")
    except Exception:
        return None
    kinds = {"Float32LE": "<f4", "Float32BE": ">f4", "Float64LE": "<f8", "Float64BE": ">f8"}
    if fields.get("datatype") not in kinds:
        return None
    dtype = np.dtype(kinds[fields["datatype"]])
    n_rows = (path.stat().st_size - position) // (3 * dtype.itemsize)
    fd = os.open(path, os.O_RDONLY)
    try:
        scanned = _delimiters(fd, position, dtype, n_rows)
    finally:
        os.close(fd)
    if scanned is None:
        return None
    delimiters, end = scanned
    # streamline k: file rows (delimiter k−1) + 1 … delimiter k − 1; a last one may end at the marker
    ends = delimiters if (len(delimiters) and delimiters[-1] == end - 1) or end == 0 else np.r_[delimiters, end]
    lengths = np.diff(np.r_[-1, ends]) - 1
    count = fields.get("count")
    if (count is not None and count.strip().isdigit() and int(count) != len(lengths)) or (lengths < 0).any():
        return None
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    points = TckPoints(path, position, dtype, offsets)
    return MappedTractogram(
        points,
        offsets,
        np.asarray(affine, dtype=np.float64),
        tuple(int(d) for d in dimensions),
        name=path.name.split(".")[0],
        source=str(path),
    )
