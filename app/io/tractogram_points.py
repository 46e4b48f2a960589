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


# The affine is applied as one matrix product per part; a product of a single row takes
# another BLAS path whose last bit can differ, so short parts are padded to this many rows.
_MIN_ROWS = 16


#: Rows of one matrix product of :func:`points_world_float32`: OpenBLAS runs a product this small
#: on the calling thread. Its threads on a whole part's (N, 3) @ (3, 3) ran five times slower than
#: one thread (0.44 against 2.2 GB/s on 2 cores), and slower still with several writers at once
#: (a batch's workers: each pool's threads spin while the others' run); the bits are the same,
#: each row's product being computed alone.
_BLOCK_ROWS = 1 << 14


def points_world_float32(points: np.ndarray, affine: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """:meth:`Tractogram.points_world` of some of a tractogram's points, bit for bit as for all of
    them, in blocks of :data:`_BLOCK_ROWS` rows; into ``out`` (``(len(points), 3)``, the result's
    dtype) when given."""
    rotation = affine[:3, :3].T.astype(np.float32)
    shift = affine[:3, 3].astype(np.float32)
    points = np.asarray(points)
    if out is None:
        out = np.empty((len(points), 3), np.result_type(points.dtype, np.float32))
    for start in range(0, len(points), _BLOCK_ROWS):
        block = points[start : start + _BLOCK_ROWS]
        if len(block) < _MIN_ROWS:
            padded = np.zeros((_MIN_ROWS, 3), np.float32)
            padded[: len(block)] = block
            out[start:] = (padded @ rotation)[: len(block)]
        else:
            np.matmul(block, rotation, out=out[start : start + len(block)])
    _add_rows(out, shift)
    return out


#: Rows of the shift repeated once, for :func:`_add_rows` (12 MB).
_TILE_ROWS = 1 << 20
_tiles: dict[bytes, np.ndarray] = {}


def _add_rows(out: np.ndarray, shift: np.ndarray) -> None:
    """``out += shift`` for ``(N, 3)`` float32 ``out``, as one flat sum with the shift repeated:
    the same additions, without NumPy's per-row loop over 3 values (twice as fast)."""
    tile = _tiles.get(shift.tobytes())
    if tile is None:
        tile = np.tile(shift, _TILE_ROWS)
        _tiles.clear()  # one grid at a time
        _tiles[shift.tobytes()] = tile
    flat = out.reshape(-1)
    for start in range(0, len(flat), len(tile)):
        part = flat[start : start + len(tile)]
        part += tile[: len(part)]
