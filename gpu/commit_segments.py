"""COMMIT's segments: streamlines cut at voxel boundaries, inside the mask, merged per
(streamline, voxel, orientation) and sorted by voxel row (Daducci et al. 2015; :mod:`gpu.commit`).

Every polyline segment is split exactly where it crosses a voxel boundary, pieces outside the
mask are dropped, and pieces of one streamline in one voxel with one orientation (the look-up
tables' nearest, :func:`gpu.commit.orientation_index`) are merged (summed lengths). Built on the
host in bounded chunks, or on the device (:func:`segments` with a GPU backend).
"""

from __future__ import annotations

import numpy as np

from .commit import N_ORIENTATIONS, orientation_index
from .host import host_threads, release_freed_memory, run_in_order
from .indices import flatnonzero


# ------------------------------------------------------------------------------- segments
class Segments:
    """Streamline pieces inside the mask, merged per (streamline, voxel, orientation) and sorted
    by voxel row, then streamline and orientation: ``fiber`` int32, ``length`` (mm) float32 when
    cut on the host for the CPU engine (float64 when cut for a GPU), ``orient`` (look-up table
    index) uint16; the operator's own arrays, nothing per streamline. Products widen each length
    to float64 as they read it.

    The voxel rows come in one of two forms: ``row`` (int32, one per segment), as a GPU's
    kernels read them, or ``row_start`` (int64, one per voxel row and one more: where each row's
    segments begin; the segments are sorted by row), as the CPU engine reads them — 8 bytes a
    voxel rather than 4 a segment (a whole-brain tractogram has ~570 segments a voxel).
    :attr:`row` gives the per-segment rows in either form (made anew from ``row_start``, for
    the reference and the tests); :meth:`starts` and :meth:`rows_of` serve both without that."""

    def __init__(self, row, fiber, length, orient, n_fibers: int, by_fiber=None, *, row_start=None):
        if (row is None) == (row_start is None):
            raise ValueError("give the segments' rows as row or as row_start, one of them")
        self._row = row
        self.row_start = None if row_start is None else np.asarray(row_start, dtype=np.int64)
        self.fiber, self.length, self.orient = fiber, length, orient
        self.n_fibers = n_fibers
        #: Where each segment sits, listed by streamline (rows ascending within one): what the
        #: device operator's Aᵀ and norms need; known when the segments were built on the device
        #: (no sort of a per-segment key then), None otherwise.
        self.by_fiber = by_fiber

    def __len__(self) -> int:
        return len(self.fiber)

    def __repr__(self) -> str:
        form = "row" if self._row is not None else "row_start"
        return f"Segments({len(self)} segments, {self.n_fibers} streamlines, rows as {form})"

    @property
    def on_device(self) -> bool:
        return array_module(self.fiber) is not np

    @property
    def has_row_array(self) -> bool:
        """Whether the rows are stored one per segment (``row``) rather than as ``row_start``."""
        return self._row is not None

    @property
    def row(self):
        """The voxel row of every segment (int32): the stored array, or one made from
        ``row_start`` (a new array of the whole: 4 bytes a segment)."""
        if self._row is not None:
            return self._row
        return rows_from_starts(self.row_start, 0, len(self.row_start) - 1)

    def starts(self, n_rows: int):
        """Where each of the rows 0 … ``n_rows`` − 1 begins, and the end (``n_rows`` + 1 values,
        int64; a device array for rows on the device)."""
        if self._row is None:
            have = len(self.row_start) - 1
            if n_rows <= have:
                return self.row_start[: n_rows + 1]
            return np.r_[self.row_start, np.full(n_rows - have, self.row_start[-1])]
        xp = array_module(self._row)
        return xp.searchsorted(self._row, xp.arange(n_rows + 1, dtype=self._row.dtype)).astype(xp.int64)

    def rows_of(self, part: slice):
        """The rows of the segments ``part`` (a slice): a view of ``row``, or made from
        ``row_start`` for those segments only."""
        if self._row is not None:
            return self._row[part]
        start, stop, _ = part.indices(len(self))
        if stop <= start:
            return np.zeros(0, dtype=np.int32)
        r0 = int(np.searchsorted(self.row_start, start, side="right")) - 1
        r1 = int(np.searchsorted(self.row_start, stop, side="left"))
        rows = rows_from_starts(self.row_start, r0, r1)
        return rows[start - int(self.row_start[r0]) : stop - int(self.row_start[r0])]

    def drop_empty_rows(self, n_rows: int):
        """Renumber the rows 0 … ``n_rows`` − 1 to those that hold segments (in order), in place;
        the mask of those rows among the old ones (an array of the segments' module)."""
        if self._row is None:
            counts = np.diff(self.starts(n_rows))
            held = counts > 0
            self.row_start = np.r_[0, np.cumsum(counts[held])].astype(np.int64)
            return held
        xp = array_module(self._row)
        held = xp.zeros(n_rows, dtype=bool)
        held[self._row] = True
        renumber = (xp.cumsum(held) - 1).astype(xp.int32)
        step = ROW_PASS_SEGMENTS if xp is np else ROW_PASS_SEGMENTS_DEVICE
        for start in range(0, len(self._row), step):  # in place (order kept: the map is increasing)
            self._row[start : start + step] = renumber[self._row[start : start + step]]
        return held


#: Segments per step when rows are renumbered in place on the host, and on a device
ROW_PASS_SEGMENTS = 1 << 18
ROW_PASS_SEGMENTS_DEVICE = 1 << 26


def rows_from_starts(row_start: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """The row of every segment of the rows ``r0 … r1 − 1``, from their starts (int32)."""
    counts = np.diff(np.asarray(row_start[r0 : r1 + 1], dtype=np.int64))
    return np.repeat(np.arange(r0, r1, dtype=np.int32), counts)


def row_parts(seg: Segments, size: int):
    """(slice, rows) over the segments in pieces of about ``size`` that never split a row
    (extended to the end of the row they stop in), in either form of the rows (host or device
    ``row``; host ``row_start``): the pieces :func:`gpu.commit_operator.row_chunks` gives."""
    if seg.has_row_array:
        xp = array_module(seg.row)
        row, start, n = seg.row, 0, len(seg.row)
        while start < n:
            stop = min(start + size, n)
            if stop < n:  # extend to the end of the row it stops in
                stop = int(xp.searchsorted(row, row[stop - 1 : stop], side="right")[0])
            yield slice(start, stop), row[start:stop]
            start = stop
        return
    starts = seg.row_start
    n, n_rows = int(starts[-1]), len(starts) - 1
    start, r0 = 0, 0
    while start < n:
        r0 = int(np.searchsorted(starts, start, side="right")) - 1  # the row holding ``start``
        r1 = n_rows if start + size >= n else int(np.searchsorted(starts, start + size, side="left"))
        stop = int(starts[r1])
        yield slice(start, stop), rows_from_starts(starts, r0, r1)
        start = stop


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
    start = flatnonzero(xp, fiber_of_point[1:] == fiber_of_point[:-1])
    p, q = points[start], points[start + 1]
    fib = fiber_of_point[start]
    delta = q - p
    physical = delta * vs
    seg_len = xp.sqrt((physical**2).sum(1))
    keep = flatnonzero(xp, seg_len > 0)
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
    ok = flatnonzero(xp, (row >= 0) & (piece > 0))
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
#: ... and when cut for the CPU engine: fiber int32, length float32 (dmri-commit's precision
#: too), orientation uint16; the rows as their starts (:data:`HOST_ROW_BYTES` a voxel row).
HOST_SEGMENT_BYTES = 4 + 4 + 2
HOST_ROW_BYTES = 8
#: Host bytes per segment at the peak of cutting on the CPU in one pass: the chunks' segments
#: (with a row each, 14 bytes), plus the largest field of the row-sorted result while the
#: chunks' copies are freed field by field (:func:`_scatter_fields`). The chunks' arrays lie in
#: the C heap between each other: a freed field goes back to the system only when the heap is
#: trimmed (:func:`gpu.host.release_freed_memory`, after each field), else the peak is 24 bytes.
HOST_CUT_PEAK_BYTES = HOST_SEGMENT_BYTES + 4 + 4


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
    keep = flatnonzero(xp, length >= min_length_mm)
    if len(keep):
        keep = keep[xp.argsort(row[keep] * len(keep) + xp.arange(len(keep)))]
    return [
        host((row[keep]).astype(xp.int32)),
        host((fiber[keep] + first).astype(xp.int32)),
        host(length[keep].astype(length_dtype or (np.float32 if xp is np else xp.float64))),
        host(orient[keep].astype(xp.uint16)),
    ]


def _empty_segments(
    counts: np.ndarray, n_fibers: int, length_dtype=np.float64, row_array: bool = True
) -> tuple[Segments, np.ndarray]:
    """Preallocated segments for ``counts`` per row, and where each row's first one goes; the
    rows one per segment (``row_array``, for a GPU) or as their starts (the CPU engine)."""
    total = int(counts.sum())
    start = np.cumsum(counts) - counts
    out = Segments(
        np.empty(total, np.int32) if row_array else None,
        np.empty(total, np.int32),
        np.empty(total, length_dtype),
        np.empty(total, np.uint16),
        n_fibers,
        row_start=None if row_array else np.r_[start, total],
    )
    return out, start


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
    if out.has_row_array:
        out.row[target] = row
    out.fiber[target], out.length[target], out.orient[target] = fiber, length, orient


def _scatter_fields(parts: list, counts: np.ndarray, n_fibers: int) -> Segments:
    """The chunks' segments (``parts``: [row, fiber, length, orient] lists in fiber order) sorted
    by row, one field at a time: each field of the whole is filled from the chunks' copies, which
    are freed as they are used, so the host holds the segments about once (plus one field) rather
    than twice. The rows are their starts (the counts summed). ``parts`` is emptied."""
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
        release_freed_memory()  # the chunks' copies of this field lie between others in the heap
    parts.clear()
    return Segments(None, *fields, n_fibers, row_start=np.r_[0, np.cumsum(counts)].astype(np.int64))


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
    (:data:`HOST_CUT_PEAK_BYTES` a segment at the peak on the CPU). The heap's freed chunks
    are given back to the system at the end (:func:`gpu.host.release_freed_memory`). Cut on the host (the CPU engine), the rows come as
    ``row_start``; for a GPU, one per segment (:class:`Segments`).
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
        out = _scatter_fields(parts, counts, n_fibers)
    else:
        out, cursor = _empty_segments(
            counts, n_fibers, length_dtype or (np.float32 if xp is np else np.float64), row_array=xp is not np
        )
        for part in chunks():
            _scatter_by_row(out, cursor, part)
    release_freed_memory()  # the chunks' copies and working memory lay in the heap: back to the system
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
        keep = flatnonzero(xp, length >= min_length_mm)
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
            starts = flatnonzero(xp, first)
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
