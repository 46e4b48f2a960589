"""Streamline positions in bulk: an affine applied row by row without BLAS, and the check that
a file's positions are finite and fit a grid, read a chunk at a time (a memory map by ``pread``:
its pages never join the resident memory) by a pool of threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tractlens.gpu.host import host_threads

from ._pages import PreadRows

#: Threads reading chunks of positions
CHECK_THREADS = min(16, host_threads())  # a batch worker's share of the cores (TRACTLENS_THREADS)


def affine_rows(affine: np.ndarray, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[:] = rows @ affine[:3, :3].T + affine[:3, 3]`` for (n, 3) float64 ``rows``, column by
    column in float64 (``out`` may be float32). The same sums in the same order whatever the
    number of rows, and no BLAS call: a BLAS matrix product of n x 3 by 3 x 3 starts its own
    threads, which on a busy machine took seconds for two million points."""
    x, y, z = rows[:, 0], rows[:, 1], rows[:, 2]
    for i in range(3):
        column = x * affine[i, 0]
        column += y * affine[i, 1]
        column += z * affine[i, 2]
        column += affine[i, 3]
        out[:, i] = column
    return out


#: Points read at a time when a mapped file's positions are checked (24 MB of float32)
CHECK_CHUNK_POINTS = 1 << 21


def points_bounds(points_mm) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) corners (float64, per axis) of ``points_mm`` (P, 3), read
    :data:`CHECK_CHUNK_POINTS` at a time by :data:`CHECK_THREADS` threads (a memory map with
    ``pread``: its pages never join the resident memory). A NaN anywhere makes both NaN, an
    infinite value an infinite corner. Empty: (inf, -inf)."""
    starts = range(0, len(points_mm), CHECK_CHUNK_POINTS)
    source = PreadRows.over(points_mm)  # itself when it is a PreadRows already

    def extent(lo: int) -> tuple[np.ndarray, np.ndarray]:
        part = np.asarray(source[lo : lo + CHECK_CHUNK_POINTS])
        # NumPy reduces float16 in software, 4 times slower than casting (exactly) and reducing float32
        return _extent(part.astype(np.float32) if part.dtype == np.float16 else part)

    try:
        if len(starts) <= 1:
            parts = [extent(lo) for lo in starts]
        else:
            with ThreadPoolExecutor(max_workers=min(CHECK_THREADS, len(starts))) as pool:
                parts = list(pool.map(extent, starts))
    finally:
        if source is not points_mm:
            source.close()
    if not parts:
        return np.full(3, np.inf), np.full(3, -np.inf)
    lows, highs = np.array([p[0] for p in parts]), np.array([p[1] for p in parts])
    # np.min/max would skip no NaN, but keep the NaN of any chunk explicitly
    low = np.where(np.isnan(lows).any(axis=0), np.nan, lows.min(axis=0))
    high = np.where(np.isnan(highs).any(axis=0), np.nan, highs.max(axis=0))
    return low, high


def _extent(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) per column of (n, 3) ``part``, as float64. Reduced as rows of 32 points (96
    values, column j being axis j % 3): NumPy reduces a 3-wide axis 0 twenty times slower."""
    whole = len(part) - len(part) % 32
    blocks = part[:whole].reshape(-1, 96)
    lows, highs = [part[whole:]], [part[whole:]]
    if whole:
        lows.append(blocks.min(axis=0).reshape(32, 3))
        highs.append(blocks.max(axis=0).reshape(32, 3))
    return np.concatenate(lows).min(axis=0).astype(np.float64), np.concatenate(highs).max(axis=0).astype(np.float64)


def points_fit_grid(points_mm, to_voxel: np.ndarray) -> bool:
    """Are all of ``points_mm`` finite, and finite in float32 voxel coordinates (``to_voxel``)?
    Checked on their bounding box (:func:`points_bounds`): an affine map takes the box's
    corners furthest, so finite corners mean finite points."""
    low, high = points_bounds(points_mm)
    if len(points_mm) == 0:
        return True
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return False
    corners = np.array([[x, y, z] for x in (low[0], high[0]) for y in (low[1], high[1]) for z in (low[2], high[2])])
    with np.errstate(all="ignore"):
        voxels = (corners @ to_voxel[:3, :3].T + to_voxel[:3, 3]).astype(np.float32)
    return bool(np.isfinite(voxels).all())
