"""COMMIT's segments: streamlines cut at voxel boundaries, inside the mask, merged per
(streamline, voxel, orientation) and sorted by voxel row (Daducci et al. 2015; :mod:`gpu.commit`).

Every polyline segment is split exactly where it crosses a voxel boundary, pieces outside the
mask are dropped, and pieces of one streamline in one voxel with one orientation (the look-up
tables' nearest, :func:`gpu.commit.orientation_index`) are merged (summed lengths). Built on the
host in bounded chunks, or on the device (:func:`segments` with a GPU backend).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .commit import N_ORIENTATIONS, orientation_index
from .host import host_threads, run_in_order


# ------------------------------------------------------------------------------- segments
@dataclass
class Segments:
    """Streamline pieces inside the mask, merged per (streamline, voxel, orientation) and sorted
    by voxel row, then streamline and orientation: ``row`` (mask voxel number) and ``fiber``
    int32, ``length`` (mm) float32 when cut on the host for the CPU engine (float64 when cut
    for a GPU), ``orient`` (look-up table index) uint16; the operator's own arrays, nothing per
    streamline. Products widen each length to float64 as they read it."""

    row: np.ndarray
    fiber: np.ndarray
    length: np.ndarray
    orient: np.ndarray
    n_fibers: int
    #: Where each segment sits, listed by streamline (rows ascending within one): what the
    #: device operator's Aᵀ and norms need; known when the segments were built on the device
    #: (no sort of a per-segment key then), None otherwise.
    by_fiber: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.row)

    @property
    def on_device(self) -> bool:
        return array_module(self.row) is not np


def array_module(a):
    """numpy, or cupy for a CuPy array (decided by the array's type: no CuPy import otherwise)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def host_array(a) -> np.ndarray:
    """A NumPy array of ``a`` (a copy from the device for a CuPy array)."""
    return a.get() if array_module(a) is not np else np.asarray(a)


def _repeat_index(xp, counts):
    """``repeat(arange(len(counts)), counts)`` on any array module."""
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if len(ends) else 0
    return xp.searchsorted(ends, xp.arange(total), side="right")


def _chunk_segments(xp, points, offsets, rows_flat, shape, vs, n_rows: int):
    """(fiber, row, orientation, length) of the pieces of streamlines ``offsets`` (local to
    ``points``), merged per (fiber, row, orientation); fibers numbered from 0."""
    n_fibers = len(offsets) - 1
    fiber_of_point = _repeat_index(xp, offsets[1:] - offsets[:-1])
    # Polyline segment k runs from point k to point k + 1 of the same streamline.
    start = xp.flatnonzero(fiber_of_point[1:] == fiber_of_point[:-1])
    p, q = points[start], points[start + 1]
    fib = fiber_of_point[start]
    delta = q - p
    physical = delta * vs
    seg_len = xp.sqrt((physical**2).sum(1))
    keep = xp.flatnonzero(seg_len > 0)
    p, delta, physical, seg_len, fib = p[keep], delta[keep], physical[keep], seg_len[keep], fib[keep]
    q = p + delta
    n = len(p)
    empty = (xp.zeros(0, xp.int64),) * 3 + (xp.zeros(0),)
    if n == 0 or n_fibers == 0:
        return empty
    orient_seg = orientation_index(physical, xp)
    # Crossings of the planes k + 1/2 on each axis, as parameters t in (0, 1).
    cp_, cq_ = xp.floor(p + 0.5), xp.floor(q + 0.5)
    t_parts, id_parts = [xp.zeros(n), xp.ones(n)], [xp.arange(n), xp.arange(n)]
    for axis in range(3):
        lo, hi = xp.minimum(cp_[:, axis], cq_[:, axis]), xp.maximum(cp_[:, axis], cq_[:, axis])
        count = (hi - lo).astype(xp.int64)
        owner = _repeat_index(xp, count)
        if not len(owner):
            continue
        first = xp.cumsum(count) - count
        within = xp.arange(len(owner)) - first[owner]
        plane = lo[owner] + 0.5 + within
        t_parts.append((plane - p[owner, axis]) / delta[owner, axis])
        id_parts.append(owner)
    t = xp.concatenate(t_parts)
    owner = xp.concatenate(id_parts)
    order = xp.lexsort(xp.stack([t, owner.astype(xp.float64)]))
    t, owner = t[order], owner[order]
    same = owner[1:] == owner[:-1]
    t0, t1, k = t[:-1][same], t[1:][same], owner[:-1][same]
    piece = (t1 - t0) * seg_len[k]
    mid = p[k] + ((t0 + t1) / 2)[:, None] * delta[k]
    vox = xp.floor(mid + 0.5).astype(xp.int64)
    inside = ((vox >= 0) & (vox < shape)).all(1)
    flat = (vox[:, 0] * shape[1] + vox[:, 1]) * shape[2] + vox[:, 2]
    row = xp.where(inside, rows_flat[xp.where(inside, flat, 0)], -1)
    ok = xp.flatnonzero((row >= 0) & (piece > 0))
    row, k, piece = row[ok], k[ok], piece[ok]
    fiber, orient = fib[k], orient_seg[k].astype(xp.int64)
    # Merge per (fiber, row, orientation): sum the lengths.
    key = (fiber * max(n_rows, 1) + row) * N_ORIENTATIONS + orient
    unique, inverse = xp.unique(key, return_inverse=True)
    total = xp.bincount(inverse.ravel(), weights=piece, minlength=len(unique))
    return (
        unique // (max(n_rows, 1) * N_ORIENTATIONS),
        (unique // N_ORIENTATIONS) % max(n_rows, 1),
        unique % N_ORIENTATIONS,
        total,
    )


#: Points per chunk when cutting streamlines into segments (bounds the working memory: about
#: 0.6 kB per point at the peak on the host, 1 kB on the device; smaller when the device has
#: less free). The host's chunk is smaller: its working memory adds to the segments kept.
SEGMENT_CHUNK_POINTS = 4_000_000
HOST_SEGMENT_CHUNK_POINTS = 1 << 18
SEGMENT_BYTES_PER_POINT = 1024
#: Host bytes each kept segment costs when cut for a GPU (row, fiber int32; length float64;
#: orientation uint16).
SEGMENT_BYTES = 4 + 4 + 8 + 2
#: ... and when cut for the CPU engine (length float32: dmri-commit's precision too).
HOST_SEGMENT_BYTES = 4 + 4 + 4 + 2
#: Host bytes per segment at the peak of cutting on the CPU (one pass): the chunks' segments,
#: plus the largest field of the row-sorted result while the chunks' copies are freed field by
#: field (:func:`_scatter_fields`).
HOST_CUT_PEAK_BYTES = HOST_SEGMENT_BYTES + 4


#: Chunks of the host's cut held at once, whatever the threads: with more threads than this,
#: each thread's chunk is smaller, so the working memory stays that of this many default chunks.
HOST_CUT_CHUNKS_IN_FLIGHT = 4


def host_cut_plan(threads: int | None = None) -> tuple[int, int]:
    """(points per chunk, threads) of cutting on the host: each thread cuts its own chunks
    (NumPy releases the GIL in most of the work), in flight at most ``threads`` chunks whose
    points add up to at most :data:`HOST_CUT_CHUNKS_IN_FLIGHT` default chunks."""
    threads = threads or host_threads()
    chunk = HOST_SEGMENT_CHUNK_POINTS
    if threads > HOST_CUT_CHUNKS_IN_FLIGHT:
        chunk = max(1 << 15, HOST_SEGMENT_CHUNK_POINTS * HOST_CUT_CHUNKS_IN_FLIGHT // threads)
    return chunk, threads


class NonFinitePoints(ValueError):
    """Streamline points that are NaN or infinite (on the grid), met while cutting segments."""


def _finite(xp, chunk, lo: int):
    if not bool(xp.isfinite(chunk).all()):
        raise NonFinitePoints(f"streamline points from number {lo} on include NaN or infinite coordinates")
    return chunk


def _voxel_points(points, lo: int, hi: int, to_voxel) -> np.ndarray:
    """Points ``lo … hi − 1`` as float64 voxel coordinates (``to_voxel``: a 4×4 affine from the
    points' frame, or None when they are voxel coordinates already); the same arithmetic as
    :meth:`Tractogram.points_on`, one chunk at a time."""
    chunk = np.asarray(points[lo:hi], dtype=np.float64)
    if to_voxel is None:
        return _finite(np, chunk, lo)
    return _finite(np, chunk @ to_voxel[:3, :3].T + to_voxel[:3, 3], lo)


def _compact(xp, host, fiber, row, orient, length, first: int, min_length_mm: float, length_dtype=None):
    """A chunk's merged pieces of at least ``min_length_mm`` as compact host arrays (fiber
    numbered from ``first``), re-sorted by row where they are (on the device for a GPU), stably:
    the key row · n + position is unique, so any sort keeps the order within a row. Lengths
    are float32 on the host (the CPU engine), float64 for a GPU. A list, so that the caller
    can free each field once used."""
    keep = xp.flatnonzero(length >= min_length_mm)
    if len(keep):
        keep = keep[xp.argsort(row[keep] * len(keep) + xp.arange(len(keep)))]
    return [
        host((row[keep]).astype(xp.int32)),
        host((fiber[keep] + first).astype(xp.int32)),
        host(length[keep].astype(length_dtype or (np.float32 if xp is np else xp.float64))),
        host(orient[keep].astype(xp.uint16)),
    ]


def _empty_segments(counts: np.ndarray, n_fibers: int, length_dtype=np.float64) -> tuple[Segments, np.ndarray]:
    """Preallocated segments for ``counts`` per row, and where each row's first one goes."""
    total = int(counts.sum())
    out = Segments(
        np.empty(total, np.int32),
        np.empty(total, np.int32),
        np.empty(total, length_dtype),
        np.empty(total, np.uint16),
        n_fibers,
    )
    return out, np.cumsum(counts) - counts


def _row_targets(cursor: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Where one chunk's segments (ordered by row) go in the row-sorted whole: a stable
    counting sort by row, ``cursor`` (each row's next free place) advanced."""
    group_start = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    sizes = np.diff(np.r_[group_start, len(row)])
    target = cursor[row] + (np.arange(len(row)) - np.repeat(group_start, sizes))
    cursor[row[group_start]] += sizes
    return target


def _scatter_by_row(out: Segments, cursor: np.ndarray, part) -> None:
    """One chunk's segments (ordered by row, then fiber and orientation; chunks come in fiber
    order) into their places in ``out``, ``cursor`` advanced."""
    row, fiber, length, orient = part
    if not len(row):
        return
    target = _row_targets(cursor, row)
    out.row[target], out.fiber[target], out.length[target], out.orient[target] = row, fiber, length, orient


def _scatter_fields(parts: list, counts: np.ndarray, n_fibers: int) -> Segments:
    """The chunks' segments (``parts``: [row, fiber, length, orient] lists in fiber order) sorted
    by row, one field at a time: each field of the whole is filled from the chunks' copies, which
    are freed as they are used, so the host holds the segments about once (plus one field) rather
    than twice. The rows are the counts repeated: no scatter. ``parts`` is emptied."""
    starts = np.cumsum(counts) - counts
    fields = []
    for index in (1, 2, 3):  # fiber, length, orient
        dtype = parts[0][index].dtype if parts else (np.int32, np.float32, np.uint16)[index - 1]
        field_ = np.empty(int(counts.sum()), dtype)
        cursor = starts.copy()
        for part in parts:
            if len(part[0]):
                field_[_row_targets(cursor, part[0])] = part[index]
            part[index] = None
        fields.append(field_)
    parts.clear()
    row = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
    return Segments(row, *fields, n_fibers)


def segments(
    points: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    voxel_size,
    *,
    min_length_mm: float = 1e-3,
    backend=None,
    chunk_points: int | None = None,
    to_voxel: np.ndarray | None = None,
    two_pass: bool | None = None,
    on_device: bool = False,
    length_dtype=None,
) -> Segments:
    """Split streamlines (``points`` (P, 3) in voxel coordinates, voxel centres at integers, or
    in another frame that ``to_voxel`` (4×4) maps to them; streamline i is
    ``points[offsets[i]:offsets[i + 1]]``; any array that slices, e.g. a memory map) exactly at
    voxel boundaries. ``rows``: (X, Y, Z) int, each voxel's row (−1 outside the mask). On
    ``backend`` (a GPU backend: the same array operations in CuPy) when given; streamlines go in
    chunks of about ``chunk_points`` points, and only the compact segments are kept
    (:data:`HOST_SEGMENT_BYTES` a segment on the CPU, :data:`SEGMENT_BYTES` for a GPU; no copy
    of the points). The counting sort by row needs the count per row first: ``two_pass``
    (default: on a GPU, where cutting is cheap) cuts the streamlines twice, counting and then
    scattering, so the host holds the segments once; otherwise the chunks' segments are kept
    until all are counted, then moved into place one field at a time
    (:data:`HOST_CUT_PEAK_BYTES` a segment at the peak on the CPU).
    ``on_device`` (a GPU backend only): the segments stay on the device, nothing per segment
    on the host, and their listing by streamline (:attr:`Segments.by_fiber`) comes with them.
    ``length_dtype``: the lengths' type (default float32 on the host, float64 for a GPU; the
    device-resident ones are always float64)."""
    xp = np if backend is None or not backend.is_gpu else backend.xp
    if on_device and backend is not None and backend.is_gpu:
        return _device_segments(points, offsets, rows, voxel_size, min_length_mm, backend, chunk_points, to_voxel)
    two_pass = xp is not np if two_pass is None else two_pass
    threads = 1
    if xp is np:
        default_chunk, threads = host_cut_plan()
        chunk_points = default_chunk if chunk_points is None else chunk_points
    elif chunk_points is None:
        chunk_points = SEGMENT_CHUNK_POINTS
    if xp is not np:  # the working memory must fit in what the device has free
        chunk_points = max(1000, min(chunk_points, backend.free_memory_bytes() // 2 // SEGMENT_BYTES_PER_POINT))
    offsets = np.asarray(offsets, dtype=np.int64)
    to_voxel = None if to_voxel is None else np.asarray(to_voxel, dtype=np.float64)
    n_fibers = len(offsets) - 1
    n_rows = int(rows.max()) + 1 if rows.size else 0
    rows_flat = xp.asarray(np.ascontiguousarray(rows, dtype=np.int64).ravel())
    shape = xp.asarray(np.array(rows.shape, dtype=np.int64))
    vs = xp.asarray(np.asarray(voxel_size, dtype=np.float64))
    host = (lambda a: a) if xp is np else backend.to_host

    def host_chunks():  # on host threads, in fiber order
        def ranges():
            first = 0
            while first < n_fibers:
                last = int(np.searchsorted(offsets, offsets[first] + max(chunk_points, 2), side="right")) - 1
                last = min(max(last, first + 1), n_fibers)
                yield first, last
                first = last

        def cut(first: int, last: int):
            lo, hi = offsets[first], offsets[last]
            chunk = _voxel_points(points, lo, hi, to_voxel)
            part = _chunk_segments(np, chunk, offsets[first : last + 1] - lo, rows_flat, shape, vs, n_rows)
            return _compact(np, host, *part, first, min_length_mm, length_dtype)

        return run_in_order((lambda a=a, b=b: cut(a, b) for a, b in ranges()), threads)

    def chunks():  # (compact host arrays) of whole streamlines, in fiber order
        nonlocal chunk_points
        if xp is np:
            yield from host_chunks()
            return
        first = 0
        while first < n_fibers:
            last = int(np.searchsorted(offsets, offsets[first] + max(chunk_points, 2), side="right")) - 1
            last = min(max(last, first + 1), n_fibers)
            lo, hi = offsets[first], offsets[last]
            try:
                chunk = xp.asarray(_voxel_points(points, lo, hi, to_voxel))
                part = _chunk_segments(
                    xp, chunk, xp.asarray(offsets[first : last + 1] - lo), rows_flat, shape, vs, n_rows
                )
                part = _compact(xp, host, *part, first, min_length_mm, length_dtype)
            except Exception as exc:  # out of device memory: retry with half the points
                if xp is np or not backend.is_out_of_memory(exc) or last - first == 1:
                    raise
                backend.free_cached_memory()
                chunk_points = max(1, (hi - lo) // 2)
                continue
            del chunk
            yield part
            first = last

    counts = np.zeros(n_rows, dtype=np.int64)
    parts = []
    for part in chunks():
        counts += np.bincount(part[0], minlength=n_rows)
        if not two_pass:
            parts.append(part)
        del part
    if not two_pass:  # field by field, each chunk's copy freed once used
        return _scatter_fields(parts, counts, n_fibers)
    out, cursor = _empty_segments(counts, n_fibers, length_dtype or (np.float32 if xp is np else np.float64))
    for part in chunks():
        _scatter_by_row(out, cursor, part)
    return out


def _device_voxel_points(xp, points, lo: int, hi: int, to_voxel):
    """Points ``lo … hi − 1`` as float64 voxel coordinates on the device: sent in their own
    precision (float32: a third of the bytes of float64) and transformed there."""
    chunk = xp.asarray(np.ascontiguousarray(points[lo:hi])).astype(xp.float64)
    if to_voxel is None:
        return _finite(xp, chunk, lo)
    m = xp.asarray(to_voxel)
    return _finite(xp, chunk @ m[:3, :3].T + m[:3, 3], lo)


#: Device bytes each segment holds while the device-resident segments are built (the chunks'
#: compact arrays, the row-sorted copy and the listing by streamline)
DEVICE_BUILD_BYTES_PER_SEGMENT = 2 * SEGMENT_BYTES + 8


def _device_segments(points, offsets, rows, voxel_size, min_length_mm, backend, chunk_points, to_voxel) -> Segments:
    """:func:`segments` kept on the device: each chunk's merged pieces (ordered by streamline,
    row, orientation, as ``unique`` gives them) are counted per row; then each chunk is placed
    by a stable counting sort by row, and where each of its segments went is, read in chunk
    order, the listing by streamline (:attr:`Segments.by_fiber`) without a sort of the whole.
    The chunks stay on the device between the two steps when they fit (else they are cut again)."""
    xp = backend.xp
    if chunk_points is None:
        chunk_points = SEGMENT_CHUNK_POINTS
    offsets = np.asarray(offsets, dtype=np.int64)
    to_voxel = None if to_voxel is None else np.asarray(to_voxel, dtype=np.float64)
    n_fibers = len(offsets) - 1
    n_rows = int(rows.max()) + 1 if rows.size else 0
    rows_flat = xp.asarray(np.ascontiguousarray(rows, dtype=np.int64).ravel())
    shape = xp.asarray(np.array(rows.shape, dtype=np.int64))
    vs = xp.asarray(np.asarray(voxel_size, dtype=np.float64))

    def cut(first: int, last: int):
        lo, hi = int(offsets[first]), int(offsets[last])
        chunk = _device_voxel_points(xp, points, lo, hi, to_voxel)
        fiber, row, orient, length = _chunk_segments(
            xp, chunk, xp.asarray(offsets[first : last + 1] - lo), rows_flat, shape, vs, n_rows
        )
        del chunk
        keep = xp.flatnonzero(length >= min_length_mm)
        return (
            row[keep].astype(xp.int32),
            (fiber[keep] + first).astype(xp.int32),
            length[keep],
            orient[keep].astype(xp.uint16),
        )

    def ranges():
        limit = max(1000, min(chunk_points, backend.free_memory_bytes() // 2 // SEGMENT_BYTES_PER_POINT))
        first = 0
        while first < n_fibers:
            last = int(np.searchsorted(offsets, offsets[first] + max(limit, 2), side="right")) - 1
            yield first, min(max(last, first + 1), n_fibers)
            first = min(max(last, first + 1), n_fibers)

    def cut_or_halve(first: int, last: int):
        try:
            part = cut(first, last)
        except Exception as exc:  # out of device memory: this range in two halves, and so on
            if not backend.is_out_of_memory(exc) or last - first == 1:
                raise
            backend.free_cached_memory()
            middle = (first + last) // 2
            yield from cut_or_halve(first, middle)
            yield from cut_or_halve(middle, last)
            return
        yield part

    def parts():
        for first, last in ranges():
            yield from cut_or_halve(first, last)

    counts = xp.zeros(n_rows, dtype=xp.int64)
    kept: list | None = []
    held = 0
    for part in parts():
        counts += xp.bincount(part[0], minlength=n_rows)
        if kept is not None:
            held += len(part[0]) * SEGMENT_BYTES
            if 3 * held > backend.free_memory_bytes():  # keeping them would crowd the rest out: cut again
                kept = None
            else:
                kept.append(part)
        del part
    total = int(counts.sum())
    out = Segments(
        xp.empty(total, xp.int32),
        xp.empty(total, xp.int32),
        xp.empty(total, xp.float64),
        xp.empty(total, xp.uint16),
        n_fibers,
        xp.empty(total, xp.int64),
    )
    cursor = xp.cumsum(counts) - counts
    base = 0
    source = parts() if kept is None else _drain(kept)
    for row, fiber, length, orient in source:
        n = len(row)
        if n:
            # by row; the unique key row · n + position keeps the order within a row (any sort)
            by_row = xp.argsort(row.astype(xp.int64) * n + xp.arange(n))
            row_sorted = row[by_row]
            first = xp.concatenate([xp.ones(1, dtype=bool), row_sorted[1:] != row_sorted[:-1]])
            starts = xp.flatnonzero(first)
            sizes = xp.diff(xp.concatenate([starts, xp.asarray([n])]))
            rank = xp.arange(n) - starts[xp.cumsum(first) - 1]
            target = cursor[row_sorted] + rank
            cursor[row_sorted[starts]] += sizes
            out.row[target], out.fiber[target] = row_sorted, fiber[by_row]
            out.length[target], out.orient[target] = length[by_row], orient[by_row]
            out.by_fiber[base + by_row] = target
        base += n
    return out


def _drain(items: list):
    """Yield and drop the items of ``items`` from the front (each freed once used)."""
    items.reverse()
    while items:
        yield items.pop()
