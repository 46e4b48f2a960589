"""Fiber selection on the CPU: the regions' bits in their bounding box, and streamline blocks on
threads, by a compiled loop (numba, the ``cpu`` extra) or by NumPy without it.

The regions are small next to their grid (a 1 mm grid around a whole tractogram can hold 2·10⁸
voxels; an ROI a few thousand), so only the box that holds every region's voxels is kept: its
bits stay in the cache, and no volume of the grid's size is made or scanned for each selection
beyond one pass over each mask to find its box. Every point is then looked up in the box
(outside it the bits are 0), and only the segments whose bounds reach the box ± 1 voxel are
traversed (the reference's shortcut, :func:`gpu.select.hits_arrays`; the others cannot reach a
region). Both engines compute the reference's float32 values operation for operation, so the bits
are the same:

- ``compiled`` (:mod:`gpu.select_loops`): one pass over each streamline's points, no temporaries;
- ``arrays``: NumPy over blocks of points: a code per point says on which side of the box ± 1
  it lies (six flags, read as one 64-bit word), so a segment whose ends share a side is dropped
  by one AND; the few points and segments left are looked up and traversed as the reference
  does, in bounded batches of pieces.

Blocks of streamlines of about :func:`block_points` points run on :func:`gpu.host.host_threads`
threads (both engines release the GIL for most of their time); the working memory of a block of
the ``arrays`` engine is bounded by ``chunk_bytes`` (:data:`gpu.select.SELECT_CHUNK_BYTES`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .backend import Cancelled
from .host import compile_or_uncached, compiled_started, host_threads, numba_installed, numba_module, run_in_order
from .select_pieces import piece_cells, piece_counts, pieces

#: Bytes of the ``arrays`` engine's temporaries per point of a block (codes, flags, indices, the
#: segments' ends; ~100 measured with tracemalloc when every point is near a region) and per
#: piece of a segment it traverses (ends, crossings, four voxels, their bits; ~230 measured).
#: Half of ``chunk_bytes`` goes to each.
ARRAY_BYTES_PER_POINT = 128
ARRAY_BYTES_PER_PIECE = 600
#: Blocks per thread (streamlines differ in length and in how many segments reach the regions)
BLOCKS_PER_THREAD = 4
#: Points of a block, at least and at most (the compiled loop needs no memory per point)
MIN_BLOCK_POINTS, MAX_BLOCK_POINTS = 1 << 15, 1 << 20
#: Segments with more pieces than this (longer than any grid) are not traversed; also non-finite ones
MAX_PIECES = 2**31


#: CPU seconds per point of each engine and numba's start in a fresh process, for ``"auto"``:
#: bench_cpu_peers.py's selection (10³-voxel region, 5 M points), one thread of a shared 2-core
#: EPYC: arrays 54 ms, compiled 14 ms; numba's start (its import, the CPU target, the loop from
#: its cache) 0.5 s there, 1.35 s on a 16-core machine
ARRAYS_S_PER_POINT, COMPILED_S_PER_POINT, NUMBA_START_S = 1.1e-8, 3e-9, 0.5


def available() -> bool:
    """Whether the compiled loop can run (numba installed)."""
    return numba_module() is not None


def auto_engine(n_points: int, threads: int) -> str:
    """The CPU engine ``"auto"`` runs: the compiled loop once numba has started in this process
    (the window after any compiled job, a pipeline after compiled tracking: it then loads in
    milliseconds), or when the job is large enough to earn numba's start; else NumPy (the bits
    are the same)."""
    if compiled_started():
        return "compiled" if available() else "arrays"
    saved = n_points * (ARRAYS_S_PER_POINT - COMPILED_S_PER_POINT) / max(1, threads)
    return "compiled" if saved > NUMBA_START_S and numba_installed() and available() else "arrays"


def mask_bounds(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(lo, hi) inclusive voxel bounds of a boolean volume's true voxels, or None when it has none.
    Reductions along the axes (one pass over the volume, ~10 ms for 2·10⁸ voxels), not the
    indices of every voxel."""
    rows = mask.reshape(mask.shape[0], -1).any(axis=1)
    xs = np.flatnonzero(rows)
    if len(xs) == 0:
        return None
    slab = mask[xs[0] : xs[-1] + 1].any(axis=0)
    ys, zs = np.flatnonzero(slab.any(axis=1)), np.flatnonzero(slab.any(axis=0))
    return np.array([xs[0], ys[0], zs[0]]), np.array([xs[-1], ys[-1], zs[-1]])


def region_bounds(masks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(lo, hi) inclusive voxel bounds of the box that holds every region's voxels (int64), or
    None when every region is empty."""
    bounds = [b for b in (mask_bounds(mask) for mask in masks) if b is not None]
    if not bounds:
        return None
    lo = np.min([b[0] for b in bounds], axis=0).astype(np.int64)
    return lo, np.max([b[1] for b in bounds], axis=0).astype(np.int64)


def region_box(masks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(bits, lo): the uint32 region bits (bit r where ``masks[r]`` is) of the smallest box that
    holds every region's voxels, and the box's first voxel; None when every region is empty.
    ``masks`` are boolean volumes of one shape, at most 32 (checked by the caller)."""
    bounds = region_bounds(masks)
    if bounds is None:
        return None
    lo, hi = bounds
    box = tuple(slice(a, b + 1) for a, b in zip(lo, hi, strict=True))
    bits = np.zeros(tuple(hi - lo + 1), dtype=np.uint32)
    for r, mask in enumerate(masks):
        bits |= mask[box].astype(np.uint32) << np.uint32(r)
    return bits, lo


def point_blocks(offsets: np.ndarray, max_points: int) -> list[tuple[int, int]]:
    """Ranges ``[a, b)`` of consecutive streamlines of about ``max_points`` points each (a longer
    streamline alone), covering all of them."""
    n = len(offsets) - 1
    out, a = [], 0
    while a < n:
        b = int(np.searchsorted(offsets, int(offsets[a]) + max_points, side="right")) - 1
        b = min(max(b, a + 1), n)
        out.append((a, b))
        a = b
    return out


def block_points(n_points: int, threads: int, chunk_bytes: int, engine: str) -> int:
    """Points of a block: :data:`BLOCKS_PER_THREAD` blocks a thread, within the bounds, and for
    the ``arrays`` engine within ``chunk_bytes`` of temporaries."""
    size = -(-n_points // (threads * BLOCKS_PER_THREAD))
    size = min(max(size, MIN_BLOCK_POINTS), MAX_BLOCK_POINTS)
    if engine != "compiled":
        size = min(size, max(1, chunk_bytes // (2 * ARRAY_BYTES_PER_POINT)))
    return size


def streamline_bits(
    points: np.ndarray,
    offsets: np.ndarray,
    bits: np.ndarray,
    lo: np.ndarray,
    *,
    engine: str,
    threads: int | None = None,
    chunk_bytes: int = 256 << 20,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Region bits (uint32) of every streamline: ``points`` (P, 3) float32 voxel coordinates,
    ``offsets`` (S + 1,) int64, ``bits`` the region bits of the box whose first voxel is ``lo``
    (:func:`region_box`). ``engine``: ``"compiled"`` (numba) or ``"arrays"`` (NumPy).
    ``cancelled()`` is polled between blocks (:class:`gpu.backend.Cancelled`); ``progress(done,
    total)`` is called in streamline order."""
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out
    threads = threads or host_threads()
    box = np.concatenate([lo, lo + np.array(bits.shape) - 1]).astype(np.float32)
    near = np.concatenate([box[:3] - np.float32(1.0), box[3:] + np.float32(1.0)]).astype(np.float32)
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    size = block_points(int(offsets[-1]), threads, chunk_bytes, engine)
    if engine == "compiled":
        loop = compile_or_uncached(_loop, lambda f: f(points, offsets, bits, box, near, 0, 0, out), "select_loops")

        def block(a: int, b: int) -> None:
            loop(points, offsets, bits, box, near, a, b, out[a:b])
    else:
        max_pieces = max(1, chunk_bytes // (2 * ARRAY_BYTES_PER_PIECE))

        def block(a: int, b: int) -> None:
            out[a:b] = block_bits_arrays(points, offsets, bits, box, near, a, b, max_pieces)

    def tasks():
        for a, b in point_blocks(offsets, size):
            if cancelled is not None and cancelled():
                raise Cancelled()
            yield lambda a=a, b=b: (block(a, b), b)[1]

    for stop in run_in_order(tasks(), threads):
        if progress is not None:
            progress(stop, n)
    return out


def _loop():
    from . import select_loops

    return select_loops.streamline_bits


def block_bits_arrays(points, offsets, bits, box, near, first: int, last: int, max_pieces: int) -> np.ndarray:
    """Region bits of streamlines ``first..last-1`` by NumPy (the ``arrays`` engine)."""
    out = np.zeros(last - first, dtype=np.uint32)
    local = offsets[first : last + 1] - offsets[first]
    pts = points[int(offsets[first]) : int(offsets[last])]
    n = len(pts)
    if n == 0:
        return out
    # Six flags a point: below lo - 1 / above hi + 1 on each axis, two bytes of padding: a word.
    flags = np.zeros((n, 8), dtype=bool)
    for axis in range(3):  # column by column: a row of three is too short for NumPy's inner loop
        np.less(pts[:, axis], near[axis], out=flags[:, axis])
        np.greater(pts[:, axis], near[3 + axis], out=flags[:, 3 + axis])
    code = flags.view(np.uint64)[:, 0]
    del flags
    # Points: only those within the box ± 1 can lie in a region's voxel.
    candidates = np.flatnonzero(code == 0)
    if len(candidates):
        values = lookup_in_box(bits, box, pts[candidates])
        _or_into(out, local, candidates, values)
    if n < 2:
        return out
    # Segments j -> j + 1 within a streamline whose ends lie on no common side of the box ± 1.
    keep = (code[:-1] & code[1:]) == 0
    ends = local[1:] - 1
    keep[ends[(ends >= 0) & (ends < n - 1)]] = False
    segments = np.flatnonzero(keep)
    if len(segments) == 0:
        return out
    p0, p1 = pts[segments], pts[segments + 1]
    # The reference's own test (a NaN end fails it), then its pieces
    near_box = ((np.maximum(p0, p1) >= near[:3]) & (np.minimum(p0, p1) <= near[3:])).all(axis=1)
    count = piece_counts(np, p0, p1)
    traversed = near_box & (count < MAX_PIECES)  # also drops NaN and infinite lengths
    segments, p0, p1 = segments[traversed], p0[traversed], p1[traversed]
    count = count[traversed].astype(np.int64)
    ends = np.cumsum(count)
    total = int(ends[-1]) if len(ends) else 0
    for g0 in range(0, total, max_pieces):
        piece = np.arange(g0, min(total, g0 + max_pieces))
        segment = np.searchsorted(ends, piece, side="right")
        k = piece - (ends[segment] - count[segment])
        p, q = pieces(np, p0[segment], p1[segment], k, count[segment])
        cells = piece_cells(np, p, q)  # (4, N, 3)
        values = _cells_in_box(bits, box, cells[0])
        for m in range(1, 4):
            values |= _cells_in_box(bits, box, cells[m])
        _or_into(out, local, segments[segment], values)
    return out


def lookup_in_box(bits: np.ndarray, box: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Bits of the voxels holding ``pts`` (``floor(x + 0.5)``, float32 as the reference)."""
    return _cells_in_box(bits, box, np.floor(pts + np.float32(0.5)))


def _cells_in_box(bits, box, cells) -> np.ndarray:
    """Bits of voxels ``cells`` (N, 3) (integer-valued, floats or ints) in the box (0 outside);
    compared as they are, so a NaN or a huge coordinate is outside."""
    inside = ((cells >= box[:3]) & (cells <= box[3:])).all(axis=1)
    values = np.zeros(len(cells), dtype=np.uint32)
    where = np.flatnonzero(inside)
    if len(where):
        ijk = (cells[where] - box[:3]).astype(np.int64)
        values[where] = bits[ijk[:, 0], ijk[:, 1], ijk[:, 2]]
    return values


def _or_into(out: np.ndarray, local: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """``out[streamline of point index] |= values``, for non-decreasing point indices ``index``
    of the block (``local``: its streamlines' offsets from its first point)."""
    hit = values != 0
    index, values = index[hit], values[hit]
    if len(values) == 0:
        return
    stream = np.searchsorted(local, index, side="right") - 1
    runs = np.flatnonzero(np.concatenate([[True], stream[1:] != stream[:-1]]))
    out[stream[runs]] |= np.bitwise_or.reduceat(values, runs)
