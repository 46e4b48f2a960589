"""Streamlines simplified for drawing: every streamline, fewer points, each dropped point within
a tolerance of the polyline drawn (issue 41: every streamline of a whole-brain tractogram drawn at
rest and while moving on graphics that draw few segments a second).

A GPU's line drawing costs about the same per segment however the strips are submitted (an
H200's graphics draw 0.5-0.8 G segments a second: ``tests/benchmarks/bench_gl_draws.py``), so
the way to draw 10 M streamlines faster without leaving any out is fewer segments. Tractography
writes a point every 0.2-1 mm along smooth curves; most of them lie on the straight line between
their neighbours to well under a pixel (compression of this kind: Presseau et al., "A new
compression format for fiber tracking datasets", NeuroImage, 2015).

The scheme is dyadic and exact: in pass ``L`` (``h = 2^(L-1)``), a point ``c`` at ``h`` modulo
``2h`` along its streamline is dropped when every point strictly between ``c - h`` and
``min(c + h, last)`` other than itself is already dropped and every one of them (itself
included) lies within ``tolerance`` of the segment between those two. So each dropped point is
within the tolerance of the segment drawn in its place; the first and last points stay. At most
``2^passes`` times fewer points; vectorised over blocks of streamlines, on NumPy threads or
on the GPU (:mod:`gpu.simplify`).

The result is a :class:`~app.fiber_arrays.Cells` of every streamline (``decimated``: drawn
from point indices, not ranges), built piece by piece like the other levels.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tractlens.gpu.select_host import point_blocks
from tractlens.gpu.simplify import simplify_block as simplify_points

from .fiber_arrays import INDEX_THREADS, Cells, index_dtype
from .io._pages import release_pages  # (the module alone: app.io imports the model, which imports the cache)

SIMPLIFY_TOLERANCE_MM = 0.1  # a dropped point is at most this far from the polyline drawn
SIMPLIFY_PASSES = 4  # at most 2^4 = 16 times fewer points
BLOCK_POINTS = 1 << 19  # points simplified at a time by one CPU thread (about 60 MB of temporaries)
GPU_BLOCK_POINTS = 1 << 24  # points simplified at a time on a GPU (about 2 GB of temporaries)


def tolerance_in_points(tolerance_mm: float, affine: np.ndarray) -> float:
    """``tolerance_mm`` in the units of points drawn with ``affine`` (points -> mm): divided by
    the longest axis of the affine, so that the bound holds in millimetres along every axis."""
    scale = float(np.linalg.norm(np.asarray(affine, dtype=np.float64)[:3, :3], axis=0).max())
    return tolerance_mm / max(scale, 1e-12)


def simplify_block(
    points: np.ndarray, offsets: np.ndarray, tolerance: float, passes: int = SIMPLIFY_PASSES, backend=None
):
    """(offsets, kept point indices from ``offsets[0]``) of the streamlines ``offsets`` of
    ``points`` (the whole array) simplified within ``tolerance`` (the points' units), on
    ``backend`` (:class:`~gpu.backend.Backend`; None: NumPy): :func:`gpu.simplify.simplify_block`.
    Offsets and indices int64, on the host."""
    counts, kept = _kept(points, np.asarray(offsets, dtype=np.int64), tolerance, passes, backend)
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out, kept


def _kept(points: np.ndarray, offsets: np.ndarray, tolerance: float, passes: int, backend):
    """(kept points per streamline, kept point indices from ``offsets[0]``), int64 on the host."""
    lo, hi = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    block = np.asarray(points[lo:hi], dtype=np.float32)
    if backend is None:
        kept, counts = simplify_points(np, block, lengths, tolerance, passes)
    else:
        xp = backend.xp
        with backend.activate():
            kept, counts = simplify_points(xp, xp.asarray(block), xp.asarray(lengths), tolerance, passes)
            kept, counts = backend.to_host(kept), backend.to_host(counts)
    release_pages(points[lo:hi])  # a file map's pages read here leave the window's resident memory
    return counts, kept


def simplified_cells(
    points: np.ndarray,
    offsets: np.ndarray,
    bounds: list[tuple[int, int]],
    tolerance: float,
    passes: int = SIMPLIFY_PASSES,
    cancelled=None,
    backend=None,
) -> Cells:
    """Every streamline of ``offsets``, simplified within ``tolerance`` (points' units), as
    :class:`Cells` built piece by piece over ``bounds`` (:func:`~app.fiber_arrays.piece_bounds`):
    each piece's indices from its first point. ``cancelled()`` true stops it (RuntimeError).
    ``backend``: a GPU's :class:`~gpu.backend.Backend` simplifies block after block there;
    None (or the CPU's): NumPy on :data:`~app.fiber_arrays.INDEX_THREADS` threads."""
    on_gpu = backend is not None and backend.is_gpu
    size = GPU_BLOCK_POINTS if on_gpu else BLOCK_POINTS
    offsets = np.asarray(offsets)
    dtype = index_dtype(int(offsets[-1]))
    total = len(offsets) - 1
    blocks = []  # (piece, block's streamlines [a, b)) in order
    for k, (a, b) in enumerate(bounds):
        for ba, bb in point_blocks(offsets[a : b + 1], size) if b > a else []:
            blocks.append((k, a + ba, a + bb))

    def run(item):
        if cancelled is not None and cancelled():
            raise RuntimeError("cancelled")
        k, a, b = item
        counts, kept = _kept(points, np.asarray(offsets[a : b + 1], dtype=np.int64), tolerance, passes,
                             backend if on_gpu else None)  # fmt: skip
        # kept at once as the piece's indices, in the index type (not int64 for all blocks)
        return counts, (kept + (int(offsets[a]) - int(offsets[bounds[k][0]]))).astype(dtype)

    if on_gpu:
        results = [run(item) for item in blocks]
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(INDEX_THREADS, len(blocks)))) as pool:
            results = list(pool.map(run, blocks))
    whole_offsets = np.zeros(total + 1, dtype=np.int64)  # the blocks are in streamline order
    if results:
        np.cumsum(np.concatenate([counts for counts, _kept in results]), out=whole_offsets[1:])
    parts = []
    for k, (a, b) in enumerate(bounds):
        places = [i for i, blk in enumerate(blocks) if blk[0] == k]
        mine = [results[i][1] for i in places]
        for i in places:
            results[i] = None  # each block's indices go as soon as they are joined
        connectivity = np.concatenate(mine) if mine else np.zeros(0, dtype)
        del mine
        local_offsets = (whole_offsets[a : b + 1] - whole_offsets[a]).astype(dtype)
        parts.append(Cells(local_offsets, connectivity, None, total, a, decimated=True))
    if len(parts) == 1:
        return parts[0]
    cells = Cells(whole_offsets.astype(dtype), None, None, total, decimated=True)
    cells._pieces = (tuple(bounds), parts, [int(offsets[a]) for a, _b in bounds])
    return cells
