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

import numpy as np

__all__ = ["file_region", "read_rows", "release_pages"]


def release_pages(array) -> bool:
    """Drop the pages of the memory map under ``array`` (a ``numpy.memmap`` opened ``"r"`` or
    ``"r+"``, or a view of one) from the resident set; returns whether it did. Anything else
    (an ordinary array, a copy-on-write map, a platform without ``madvise``) is left alone."""
    mapping = getattr(array, "_mmap", None)
    if not isinstance(array, np.memmap) or mapping is None or getattr(array, "mode", "c") not in ("r", "r+"):
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
    mapping = getattr(array, "_mmap", None)
    name = getattr(array, "filename", None)
    if not isinstance(array, np.memmap) or mapping is None or not name or not array.flags.c_contiguous:
        return None
    try:
        whole = np.frombuffer(mapping, dtype=np.uint8)
    except (TypeError, ValueError):
        return None
    try:
        base_address = whole.ctypes.data
        map_start = array.offset - array.offset % mmap.ALLOCATIONGRANULARITY  # where numpy mapped from
        within = array.ctypes.data - base_address
        if not 0 <= within <= len(whole) - array.nbytes:
            return None
        return str(name), map_start + within
    finally:
        del whole


def read_rows(fd: int, position: int, dtype, shape) -> np.ndarray:
    """``shape`` items of ``dtype`` read with ``os.preadv`` from ``position`` of the open file
    ``fd`` (thread-safe: no shared file position; the GIL is released while reading)."""
    import os

    out = np.empty(shape, dtype=dtype)
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], position + done)
        if got <= 0:
            raise OSError(f"the file ended {len(view) - done} bytes early")
        done += got
    return out
