"""Fiber selection on the CPU: the regions' bits in boxes around them, and streamline blocks on
threads, by a compiled loop (numba, the ``cpu`` extra: :mod:`gpu.select_loops`) or by NumPy
without it (:mod:`gpu.select_arrays`).

The regions are small next to their grid (a 1 mm grid around a whole tractogram can hold 2·10⁸
voxels; an ROI a few thousand), so only boxes that hold the regions' voxels are kept
(:func:`region_boxes`: one per region, those that lie close together merged): their bits stay in
the cache, and no volume of the grid's size is made or scanned for each selection beyond one pass
over each mask to find its box. A point is looked up only in a box ± 1 voxel that holds it, and
a segment traversed only for a box whose ± 1 bounds its own bounds reach (the reference's
shortcut, :func:`gpu.select.hits_arrays`, per box; the others cannot reach a region). Both
engines compute the reference's float32 values operation for operation, so the bits are the same.

Blocks of streamlines of about :func:`block_points` points run on :func:`gpu.host.host_threads`
threads (both engines release the GIL for most of their time); the working memory of a block of
the NumPy engine is bounded by ``chunk_bytes`` (:data:`gpu.select.SELECT_CHUNK_BYTES`); the
compiled loop needs none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .backend import Cancelled
from .host import compile_or_uncached, compiled_started, host_threads, numba_installed, numba_module, run_in_order

#: Bytes of the NumPy engine's temporaries per point of a block (codes, flags, indices, the
#: segments' ends; ~100 measured with tracemalloc when every point is near a region) and per
#: piece of a segment it traverses (ends, crossings, voxels, their bits; ~230 measured).
#: Half of ``chunk_bytes`` goes to each.
ARRAY_BYTES_PER_POINT = 128
ARRAY_BYTES_PER_PIECE = 600
#: Blocks per thread (streamlines differ in length and in how many segments reach the regions)
BLOCKS_PER_THREAD = 4
#: Points of a block, at least and at most (the compiled loop needs no memory per point)
MIN_BLOCK_POINTS, MAX_BLOCK_POINTS = 1 << 15, 1 << 20
#: Two regions' boxes are merged into one when it holds at most this times their voxels, plus
#: a few (small boxes cost nothing to merge)
MERGE_FACTOR, MERGE_SLACK_VOXELS = 2.0, 4096

#: What ``"auto"`` weighs, in CPU seconds a point (one thread of a shared 2-core EPYC, 1 M
#: points of bench_cpu_peers.py's selection): a point far from every box, per box (NumPy 13-16
#: ns, compiled 4 ns), and a point near one (a 200³ box whose region the streamlines pass without
#: hitting it at once: a hollow shell, scattered voxels; NumPy 600-650 ns, compiled 180-190 ns;
#: a solid region, which the compiled loop stops looking at once hit, costs it 6 ns); numba's
#: start in a fresh process (its import, its CPU target, the loop from its cache: 0.5 s there,
#: 1.35 s on a 16-core machine).
ARRAYS_S_PER_POINT, COMPILED_S_PER_POINT = 1.5e-8, 4e-9
ARRAYS_S_PER_NEAR_POINT, COMPILED_S_PER_NEAR_POINT = 6.3e-7, 1.9e-7
NUMBA_START_S = 0.5
#: Every this many points one is sampled to estimate the share near a box
NEAR_SAMPLE_STEP = 64


@dataclass(frozen=True)
class RegionBoxes:
    """The region bits in boxes around the regions: box ``c``'s bits (uint8 for up to 8 regions,
    else uint32; C order) are ``flat[starts[c]:]`` of shape ``shapes[c]``; ``boxes[c]`` is
    float32 (lo xyz, hi xyz, lo - 1 xyz, hi + 1 xyz) in voxels of the grid; ``present[c]`` the
    bits of the regions in it. A voxel's bits are the OR over the boxes holding it (each region
    lies whole in one box)."""

    flat: np.ndarray
    starts: np.ndarray
    shapes: np.ndarray
    boxes: np.ndarray
    present: np.ndarray

    def bits(self, c: int) -> np.ndarray:
        shape = tuple(int(n) for n in self.shapes[c])
        start = int(self.starts[c])
        return self.flat[start : start + int(np.prod(shape))].reshape(shape)


def available() -> bool:
    """Whether the compiled loop can run (numba installed)."""
    return numba_module() is not None


def engine_by_cost(n_points: int, near_share: float, n_boxes: int, threads: int) -> str:
    """The cheaper CPU engine for ``n_points`` of which ``near_share`` lie near a box, numba's
    start counted unless a compiled loop has already run in this process."""
    per_thread = n_points / max(1, threads)
    arrays = per_thread * (ARRAYS_S_PER_POINT * n_boxes + ARRAYS_S_PER_NEAR_POINT * near_share)
    compiled = per_thread * (COMPILED_S_PER_POINT * n_boxes + COMPILED_S_PER_NEAR_POINT * near_share)
    if not compiled_started():
        compiled += NUMBA_START_S
    return "compiled" if compiled < arrays else "arrays"


def auto_engine(points: np.ndarray, boxes: RegionBoxes, threads: int) -> str:
    """The CPU engine ``"auto"`` runs: NumPy without numba; else the cheaper by
    :func:`engine_by_cost`, with the share of points near a box estimated from every
    :data:`NEAR_SAMPLE_STEP`-th point. Once numba has started in this process (the window after
    any compiled job, a pipeline after compiled tracking) the compiled loop loads in
    milliseconds and nearly always wins. The bits are the same either way."""
    if not numba_installed():  # found without importing numba (~0.3 s)
        return "arrays"
    sample = points[::NEAR_SAMPLE_STEP]
    near = np.zeros(len(sample), dtype=bool)
    for box in boxes.boxes:
        inside = np.ones(len(sample), dtype=bool)
        for axis in range(3):
            inside &= (sample[:, axis] >= box[6 + axis]) & (sample[:, axis] <= box[9 + axis])
        near |= inside
    share = float(near.mean()) if len(near) else 0.0
    engine = engine_by_cost(len(points), share, len(boxes.starts), threads)
    return engine if engine == "arrays" or available() else "arrays"


def box_slices(box: tuple[np.ndarray, np.ndarray]) -> tuple[slice, slice, slice]:
    """Inclusive voxel bounds (lo, hi), as :func:`mask_bounds` gives them, as index slices."""
    lo, hi = box
    return tuple(slice(int(a), int(b) + 1) for a, b in zip(lo, hi, strict=True))


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
    return np.array([xs[0], ys[0], zs[0]], np.int64), np.array([xs[-1], ys[-1], zs[-1]], np.int64)


def region_bounds(masks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(lo, hi) inclusive voxel bounds of the box that holds every region's voxels (int64), or
    None when every region is empty."""
    bounds = [b for b in (mask_bounds(mask) for mask in masks) if b is not None]
    if not bounds:
        return None
    return np.min([b[0] for b in bounds], axis=0), np.max([b[1] for b in bounds], axis=0)


def _volume(lo: np.ndarray, hi: np.ndarray) -> int:
    return int(np.prod(hi - lo + 1))


def region_boxes(masks: Sequence[np.ndarray]) -> RegionBoxes | None:
    """The regions' bits (bit r where ``masks[r]`` is) in one box per region, boxes merged while
    the merged box holds at most :data:`MERGE_FACTOR` times their voxels (regions close together
    share one; two ROIs at the two ends of a bundle keep two small ones, not one of the brain's
    size). None when every region is empty. ``masks``: boolean volumes of one shape, at most 32
    (checked by the caller)."""
    groups = []
    for r, mask in enumerate(masks):
        bounds = mask_bounds(mask)
        if bounds is not None:
            groups.append(([r], *bounds))
    if not groups:
        return None
    merged = True
    while merged and len(groups) > 1:
        merged = False
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                (ri, lo_i, hi_i), (rj, lo_j, hi_j) = groups[i], groups[j]
                lo, hi = np.minimum(lo_i, lo_j), np.maximum(hi_i, hi_j)
                apart = _volume(lo_i, hi_i) + _volume(lo_j, hi_j)
                if _volume(lo, hi) <= MERGE_FACTOR * apart + MERGE_SLACK_VOXELS:
                    groups[i] = (ri + rj, lo, hi)
                    del groups[j]
                    merged = True
                    break
            if merged:
                break
    dtype = np.uint8 if len(masks) <= 8 else np.uint32  # a quarter of the cache for up to 8 regions
    parts, boxes = [], []
    for regions, lo, hi in groups:
        window = tuple(slice(a, b + 1) for a, b in zip(lo, hi, strict=True))
        bits = np.zeros(tuple(hi - lo + 1), dtype=dtype)
        for r in regions:
            bits |= masks[r][window].astype(dtype) << dtype(r)
        parts.append(bits.ravel())
        box = np.concatenate([lo, hi]).astype(np.float32)
        boxes.append(np.concatenate([box, box[:3] - np.float32(1.0), box[3:] + np.float32(1.0)]))
    sizes = np.array([len(part) for part in parts], dtype=np.int64)
    return RegionBoxes(
        flat=np.concatenate(parts),
        starts=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        shapes=np.array([hi - lo + 1 for _, lo, hi in groups], dtype=np.int64),
        boxes=np.array(boxes, dtype=np.float32),
        present=np.array([sum(1 << r for r in regions) for regions, _, _ in groups], dtype=np.uint32),
    )


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


def block_points(n_points: int, threads: int, chunk_bytes: int) -> int:
    """Points of a block: :data:`BLOCKS_PER_THREAD` blocks a thread, within the bounds, and
    within half of ``chunk_bytes`` of the NumPy engine's temporaries (the compiled loop's blocks
    too, which need none, so that both report progress and check for cancellation alike)."""
    size = -(-n_points // (threads * BLOCKS_PER_THREAD))
    size = min(max(size, MIN_BLOCK_POINTS), MAX_BLOCK_POINTS)
    return min(size, max(1, chunk_bytes // (2 * ARRAY_BYTES_PER_POINT)))


def streamline_bits(
    points: np.ndarray,
    offsets: np.ndarray,
    boxes: RegionBoxes,
    *,
    engine: str,
    threads: int | None = None,
    chunk_bytes: int = 256 << 20,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> np.ndarray:
    """Region bits (uint32) of every streamline: ``points`` (P, 3) float32 voxel coordinates,
    ``offsets`` (S + 1,) int64, the regions in ``boxes`` (:func:`region_boxes`). ``engine``:
    ``"compiled"`` (numba) or ``"arrays"`` (NumPy). ``cancelled()`` is polled between blocks
    (:class:`gpu.backend.Cancelled`); ``progress(done, total)`` is called in streamline order."""
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.uint32)
    if n == 0:
        return out
    threads = threads or host_threads()
    size = block_points(int(offsets[-1]), threads, chunk_bytes)
    if engine == "compiled":
        tables = (boxes.flat, boxes.starts, boxes.shapes, boxes.boxes, boxes.present)
        loop = compile_or_uncached(_loop, lambda f: f(points, offsets, *tables, 0, 0, out), "select_loops")

        def block(a: int, b: int) -> None:
            loop(points, offsets, *tables, a, b, out[a:b])
    else:
        from .select_arrays import block_bits

        max_pieces = max(1, chunk_bytes // (2 * ARRAY_BYTES_PER_PIECE))

        def block(a: int, b: int) -> None:
            out[a:b] = block_bits(points, offsets, boxes, a, b, max_pieces)

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
