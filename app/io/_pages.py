"""Memory-mapped files read in passes: their pages leave the process's resident set once read.

Reading a memory map brings the file's pages into the process's resident set, and they stay
there until the map is closed: a 4 GB tractogram read once to convert it counts 4 GB of
resident memory on top of the converted copy. The page cache keeps the pages (reading again
maps them back, no disk access), so dropping them from this process costs nothing but shows the
memory the process really needs. Only shared or read-only maps are released: a copy-on-write
map may hold changes that only this process has, which ``MADV_DONTNEED`` would throw away.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

__all__ = ["PreadRows", "file_region", "read_rows", "release_pages"]


def _memmap_of(array):
    """The ``numpy.memmap`` under ``array`` (itself, or the base of a view), or None."""
    seen = 0
    while array is not None and seen < 8:
        if isinstance(array, np.memmap) and getattr(array, "_mmap", None) is not None:
            return array
        array, seen = getattr(array, "base", None), seen + 1
    return None


def release_pages(array) -> bool:
    """Drop the pages of the memory map under ``array`` (a ``numpy.memmap`` opened ``"r"`` or
    ``"r+"``, or a view of one) from the resident set; returns whether it did. Anything else
    (an ordinary array, a copy-on-write map, a platform without ``madvise``) is left alone."""
    mapped = _memmap_of(array)
    mapping = getattr(mapped, "_mmap", None)
    if mapped is None or mapping is None or getattr(mapped, "mode", "c") not in ("r", "r+"):
        return False
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None or not hasattr(mapping, "madvise"):
        return False
    try:
        mapping.madvise(advice)
    except (OSError, ValueError):  # closed, or refused: the pages just stay
        return False
    return True


def file_region(array) -> tuple[str, int] | None:
    """(file name, byte position) of the first byte of ``array`` when it is a C-contiguous memory
    map of a file (or a view of one), so that it can be read with ``pread`` instead of through
    page faults on the map; None otherwise."""
    mapped = _memmap_of(array)
    mapping = getattr(mapped, "_mmap", None)
    name = getattr(mapped, "filename", None)
    if mapped is None or mapping is None or not name or not array.flags.c_contiguous:
        return None
    try:
        whole = np.frombuffer(mapping, dtype=np.uint8)
    except (TypeError, ValueError):
        return None
    try:
        base_address = whole.ctypes.data
        map_start = mapped.offset - mapped.offset % mmap.ALLOCATIONGRANULARITY  # where numpy mapped from
        within = array.ctypes.data - base_address
        if not 0 <= within <= len(whole) - array.nbytes:
            return None
        return str(name), map_start + within
    finally:
        del whole


def read_rows(fd: int, position: int, dtype, shape) -> np.ndarray:
    """``shape`` items of ``dtype`` read with ``os.preadv`` from ``position`` of the open file
    ``fd`` (thread-safe: no shared file position; the GIL is released while reading)."""
    out = np.empty(shape, dtype=dtype)
    if out.size == 0:
        return out
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], position + done)
        if got <= 0:
            raise OSError(f"the file ended {len(view) - done} bytes early")
        done += got
    return out


class PreadRows:
    """Rows of a C-contiguous memory-mapped array read with ``pread`` on demand: ``rows[lo:hi]``
    is a new array, read from the file without faulting the map's pages in (so they never
    count in this process's resident memory). ``len``, ``shape``, ``dtype`` and ``ndim`` as the
    array's. Made by :meth:`over`, which returns the array itself when it is not such a map."""

    def __init__(self, array: np.ndarray, name: str, position: int):
        self.shape, self.dtype, self.ndim = tuple(array.shape), array.dtype, array.ndim
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self.name, self.position = name, position
        self.fd = os.open(name, os.O_RDONLY)

    @classmethod
    def over(cls, array):
        region = file_region(array) if array.ndim >= 1 and len(array) else None
        return array if region is None else cls(array, *region)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("rows are read by contiguous slices only")
        lo, hi, _ = key.indices(self.shape[0])
        hi = max(lo, hi)
        return read_rows(self.fd, self.position + lo * self.row_bytes, self.dtype, (hi - lo, *self.shape[1:]))

    def take_runs(self, index: np.ndarray, max_runs: int | None = None) -> np.ndarray | None:
        """``rows[index]`` read with one ``pread`` per run of consecutive rows (whole streamlines of
        a level of detail: a few thousand reads, and no page of the map joins the resident
        memory, where a gather through the map faults in pages around every row it reads).
        None when ``index`` has more than ``max_runs`` runs (default: an eighth of its length,
        at least 1000): then one read per row would cost more than the map's page faults."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        out = np.empty((len(index), *self.shape[1:]), dtype=self.dtype)
        if not len(index):
            return out
        if index.min() < 0 or index.max() >= self.shape[0]:
            raise IndexError("row index out of range")
        breaks = np.flatnonzero(np.diff(index) != 1) + 1
        limit = max(1000, len(index) // 8) if max_runs is None else max_runs
        if len(breaks) + 1 > limit:
            return None
        starts = [0, *breaks.tolist()]
        ends = [*breaks.tolist(), len(index)]
        flat = out.reshape(len(index), -1).view(np.uint8)
        for a, b in zip(starts, ends, strict=True):
            view = memoryview(flat[a:b].reshape(-1))
            position, done = self.position + int(index[a]) * self.row_bytes, 0
            while done < len(view):
                got = os.preadv(self.fd, [view[done:]], position + done)
                if got <= 0:
                    raise OSError(f"the file ended {len(view) - done} bytes early")
                done += got
        return out

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def close(self) -> None:
        """Close the file (done by itself when the object goes)."""
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self):
        self.close()
