"""Which streamlines pass which regions: the engine of ROI-based fiber selection.

A streamline passes a region when one of its points lies in a voxel of the
region, or one of its segments crosses such a voxel, even without a point
inside it (voxel v is the cube v ± 0.5 in voxel coordinates; points are in
voxel coordinates of the regions' grid).

Exact segment traversal without a loop per voxel: a segment is cut into pieces
no longer than one voxel along any axis; such a piece crosses at most one voxel
boundary plane per axis, so at most three, and the midpoints of the (at most
four) parameter intervals between its ends and those crossings lie one in each
voxel the piece visits. Looking those up is enough.

Up to 32 regions are tested at once through a bit volume (bit r set where
region r is); each streamline gets the OR of the bits of every voxel it visits.
The array reference below (NumPy or CuPy: :func:`hits_arrays`), the CUDA kernel
``kernels/select.cu`` (one thread per segment, ``atomicOr`` per streamline) and the
CPU engines of :mod:`gpu.select_host` (only the bits of boxes around the regions;
a compiled loop with numba, else NumPy) compute the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import cuda, select_host
from .backend import Backend, get_backend, run_batched
from .engines import ARRAYS, AUTO, COMPILED, KERNEL, choose_engine
from .host import NUMBA_HINT, host_threads
from .indices import flatnonzero
from .select_host import point_blocks
from .streamlines import repeat_counts
from .transfer import to_host

__all__ = ["Selection", "StreamlineIndex", "hits_arrays", "point_blocks", "region_bits", "select_streamlines"]

MAX_REGIONS = 32


def checked_masks(masks: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The regions as boolean volumes, checked: at least one, at most :data:`MAX_REGIONS`, one shape."""
    if not masks:
        raise ValueError("at least one region is needed")
    if len(masks) > MAX_REGIONS:
        raise ValueError(f"at most {MAX_REGIONS} regions can be tested at once, got {len(masks)}")
    out = [np.asarray(mask, dtype=bool) for mask in masks]
    for r, mask in enumerate(out):
        if mask.shape != out[0].shape:
            raise ValueError(f"region {r} has shape {mask.shape}, the first has {out[0].shape}")
    return out


def region_bits(masks: Sequence[np.ndarray], box: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """A uint32 volume with bit r set in the voxels of ``masks[r]`` (all on one grid); with
    ``box`` (:func:`~gpu.select_host.region_bounds` of the masks) the box's part of it only."""
    masks = checked_masks(masks)
    if box is None:
        bits = np.zeros(masks[0].shape, dtype=np.uint32)
        for r, mask in enumerate(masks):
            bits[mask] |= np.uint32(1) << np.uint32(r)
        return bits
    inside = select_host.box_slices(box)
    return region_bits([mask[inside] for mask in masks])


def device_region_bits(xp, masks: Sequence[np.ndarray], box: tuple[np.ndarray, np.ndarray]):
    """:func:`region_bits` on the device, only its box's part made on the host and uploaded (a
    brain grid's volume is 15 MB of uint32; the ROIs' box is often a few thousand voxels)."""
    bits = xp.zeros(masks[0].shape, dtype=xp.uint32)
    bits[select_host.box_slices(box)] = xp.asarray(region_bits(masks, box))
    return bits


def _piece_cells(xp, p, q):
    """Voxels visited by pieces p->q (each ≤ 1 voxel per axis): (4, N, 3) int64 indices.

    Interval midpoints between the sorted boundary-crossing parameters; unused
    intervals repeat a visited voxel, which changes no OR.
    """
    d = q - p
    # Parameter where each axis crosses its boundary plane (k + 0.5) between p and q, else 1.
    lo = xp.minimum(p, q)
    plane = xp.floor(lo + 0.5) + 0.5  # first plane above the lower end
    crosses = (plane < xp.maximum(p, q)) & (d != 0)
    t = xp.where(crosses, (plane - p) / xp.where(d != 0, d, 1.0), 1.0)
    t = xp.sort(t, axis=1)  # (N, 3)
    zero = xp.zeros((t.shape[0], 1), dtype=t.dtype)
    one = xp.ones((t.shape[0], 1), dtype=t.dtype)
    edges = xp.concatenate([zero, t, one], axis=1)  # (N, 5)
    mids = 0.5 * (edges[:, :-1] + edges[:, 1:])  # (N, 4)
    samples = p[None, :, :] + mids.T[:, :, None] * d[None, :, :]
    return xp.floor(samples + 0.5).astype(xp.int64)


def _split_segments(xp, points, seg_start, seg_stream):
    """Cut segments into pieces of at most one voxel per axis: (p, q, streamline id)."""
    p0 = points[seg_start]
    p1 = points[seg_start + 1]
    n_pieces = xp.maximum(xp.ceil(xp.abs(p1 - p0).max(axis=1)), 1).astype(xp.int64)
    total = int(n_pieces.sum())
    seg_of_piece = repeat_counts(xp, xp.arange(len(seg_start)), n_pieces)
    first = xp.cumsum(n_pieces) - n_pieces
    k = xp.arange(total) - first[seg_of_piece]
    n = n_pieces[seg_of_piece].astype(points.dtype)
    a = p0[seg_of_piece]
    d = p1[seg_of_piece] - a
    p = a + d * (k.astype(points.dtype) / n)[:, None]
    q = a + d * ((k + 1).astype(points.dtype) / n)[:, None]
    return p, q, seg_stream[seg_of_piece]


def _lookup(xp, bits, cells):
    shape = bits.shape
    inside = (
        (cells >= 0).all(axis=-1) & (cells[..., 0] < shape[0]) & (cells[..., 1] < shape[1]) & (cells[..., 2] < shape[2])
    )
    safe = xp.where(inside[..., None], cells, 0)
    values = bits[safe[..., 0], safe[..., 1], safe[..., 2]]
    return xp.where(inside, values, 0).astype(xp.uint32)


def hits_arrays(xp, points, offsets, bits, first: int, last: int, box=None):
    """Region bits of streamlines ``first..last-1`` with array operations (the reference).

    ``box`` = (lo, hi) voxel bounds of all regions: segments whose own bounds miss
    it are dropped before the exact traversal (small ROIs make that most of them).
    """
    lengths = offsets[first + 1 : last + 1] - offsets[first:last]
    starts = offsets[first:last]
    out = xp.zeros(last - first, dtype=xp.uint32)
    # Single points (and every point, cheaply): the voxel containing it.
    pts = points[int(offsets[first]) : int(offsets[last])]
    stream_of_point = repeat_counts(xp, xp.arange(last - first), lengths)
    point_bits = _lookup(xp, bits, xp.floor(pts + 0.5).astype(xp.int64))
    _or_into(xp, out, stream_of_point, point_bits)
    # Segments: start index of each (not across streamline boundaries).
    n_seg = xp.maximum(lengths - 1, 0)
    seg_stream = repeat_counts(xp, xp.arange(last - first), n_seg)
    seg_first = xp.cumsum(n_seg) - n_seg
    seg_start = starts[seg_stream] + (xp.arange(int(n_seg.sum())) - seg_first[seg_stream])
    if box is not None and len(seg_start):
        p0, p1 = points[seg_start], points[seg_start + 1]
        lo, hi = xp.asarray(box[0], dtype=points.dtype), xp.asarray(box[1], dtype=points.dtype)
        near = ((xp.maximum(p0, p1) >= lo - 1.0) & (xp.minimum(p0, p1) <= hi + 1.0)).all(axis=1)
        seg_start, seg_stream = seg_start[near], seg_stream[near]
    if len(seg_start):
        p, q, piece_stream = _split_segments(xp, points, seg_start, seg_stream)
        cells = _piece_cells(xp, p, q)  # (4, N, 3)
        piece_bits = _lookup(xp, bits, cells)
        combined = piece_bits[0] | piece_bits[1] | piece_bits[2] | piece_bits[3]
        _or_into(xp, out, piece_stream, combined)
    return out


def _or_into(xp, out, index, values):
    """out[index] |= values for a non-decreasing ``index`` with repeats.

    Regions are small, so most values are 0: only the others are scattered. NumPy
    reduces each run of equal indices with ``bitwise_or.reduceat``; CuPy has no
    OR scatter, so it sets one bit plane at a time.
    """
    hit = values != 0
    index, values = index[hit], values[hit]
    if len(values) == 0:
        return
    if xp is np:
        runs = np.flatnonzero(np.concatenate([[True], index[1:] != index[:-1]]))
        out[index[runs]] |= np.bitwise_or.reduceat(values, runs)
        return
    for bit in range(MAX_REGIONS):
        has = ((values >> np.uint32(bit)) & np.uint32(1)).astype(bool)
        if bool(has.any()):
            flags = xp.zeros(len(out), dtype=xp.uint32)
            flags[index[has]] = 1
            out |= flags << np.uint32(bit)


def _kernel():
    return cuda.function("select.cu", "streamline_region_bits")


def hits_kernel(backend: Backend, points, stream_of_point, is_last, bits, n_streams: int, box=None):
    """Same as :func:`hits_arrays` for all streamlines at once, one CUDA thread per point/segment.

    ``stream_of_point`` (int32) and ``is_last`` (uint8, 1 where a point ends its
    streamline) come from :class:`StreamlineIndex`, which keeps them on the device. ``box`` =
    (lo, hi): inclusive voxel bounds of every region's voxels (:func:`select_host.region_bounds`;
    None: the whole grid); points whose segment stays outside it look nothing up.
    """
    cp = backend.xp
    out = cp.zeros(n_streams, dtype=cp.uint32)
    n_points = int(points.shape[0])
    if n_points == 0:
        return out
    threads = 256
    blocks = (n_points + threads - 1) // threads
    shape = bits.shape
    lo, hi = ((0, 0, 0), tuple(n - 1 for n in shape)) if box is None else box
    corners = (*(np.int32(v) for v in lo), *(np.int32(v) for v in hi))
    _kernel()(
        (blocks,),
        (threads,),
        (points, stream_of_point, is_last, np.int64(n_points), bits, *(np.int32(n) for n in shape), *corners, out),
    )
    return out


@dataclass
class Selection:
    """Per-streamline region bits and the include/exclude verdict. Bits made on the GPU stay
    there until :attr:`bits` is first read (a view shows only the verdict: 4 bytes per
    streamline less to copy at every ROI edit)."""

    region_bits: object  # (S,) uint32, NumPy (or CuPy until :attr:`bits` is read)
    selected: np.ndarray  # (S,) bool
    provenance: dict = field(default_factory=dict)
    #: the selected streamlines' ids (sorted) and point counts, when the device found them beside
    #: the verdict (the GPU's kernel: a view's index ranges need them, and on the host they cost
    #: as much as the selection); None where they were not made
    ids: np.ndarray | None = None
    lengths: np.ndarray | None = None
    starts: np.ndarray | None = None  # and where each starts in the point array (its first point)

    @property
    def bits(self) -> np.ndarray:
        """(S,) uint32: bit k set where the streamline passes region k (include, then exclude)."""
        if not isinstance(self.region_bits, np.ndarray):
            self.region_bits = to_host(self.region_bits)
        return self.region_bits

    def passes(self, region: int) -> np.ndarray:
        return (self.bits >> np.uint32(region)) & np.uint32(1) == 1


#: Working memory of one batch of a selection on the CPU (and of the array engine on the GPU),
#: per thread: the temporaries of the CPU's NumPy engine and of :func:`hits_arrays` are bounded
#: by it, not by the free memory (a whole-brain selection once took 38 GB of a 128 GB machine's
#: host memory in one go); the compiled loop needs none.
SELECT_CHUNK_BYTES = 256 << 20
#: Points uploaded (and streamline ids made) at a time when a GPU index is built
INDEX_CHUNK_POINTS = 1 << 24
#: ... made on the host (a mapped file's rows converted) a block of this many points per thread,
#: on at most this many threads: ~0.6 GB of host blocks in flight at most
UPLOAD_BLOCK_POINTS = 1 << 22
UPLOAD_THREADS = 4


class StreamlineIndex:
    """Streamlines kept on the compute device for repeated selections.

    While an ROI is painted only the region bits change: uploading a small bit
    volume and launching one kernel is all a new selection costs on the GPU.
    ``points`` (P, 3) are voxel coordinates of the regions' grid: an array, or anything whose
    row slices ``points[a:b]`` are arrays (a tractogram's points converted as they are read).
    On the CPU an array is used as it is (float32: no copy); on the GPU the points go up
    ``chunk_points`` (:data:`INDEX_CHUNK_POINTS`) at a time through the pinned staging buffers,
    so no host copy of them is made, and the per-point streamline ids are made a block at a time.
    ``chunk_bytes`` (:data:`SELECT_CHUNK_BYTES`) bounds a batch's working memory in
    :meth:`select`; the bits do not depend on it.
    """

    def __init__(
        self,
        points,
        offsets: np.ndarray,
        *,
        device: str | Backend = "auto",
        chunk_points: int | None = None,
        chunk_bytes: int | None = None,
    ):
        self.backend = get_backend(device)
        xp = self.backend.xp
        self.offsets_host = np.asarray(offsets, dtype=np.int64)
        self.n_streams = len(self.offsets_host) - 1
        self.chunk_points = int(chunk_points or INDEX_CHUNK_POINTS)
        self.chunk_bytes = int(chunk_bytes or SELECT_CHUNK_BYTES)
        if not self.backend.is_gpu:
            self.points = np.ascontiguousarray(np.asarray(points) if isinstance(points, np.ndarray) else
                                               points[0 : len(points)], dtype=np.float32)  # fmt: skip
            self.offsets = self.offsets_host
            return
        self.points = self._upload(points)
        self.offsets = self.backend.asarray(self.offsets_host)
        lengths = xp.diff(self.offsets)
        self.stream_of_point = self._stream_ids()
        self.is_last = xp.zeros(len(self.points), dtype=xp.uint8)
        self.is_last[self.offsets[1:][lengths > 0] - 1] = 1

    def _upload(self, points):
        """The points on the device, ``chunk_points`` at a time (no whole host copy). Rows that
        are made as they are read (a mapped file's millimetres to voxels) are made by
        :data:`UPLOAD_THREADS` host threads a block ahead, and go up in order."""
        from .host import run_in_order
        from .transfer import to_device

        xp = self.backend.xp
        n = len(points)
        out = xp.empty((n, 3), dtype=xp.float32)
        step = max(1, min(self.chunk_points, UPLOAD_BLOCK_POINTS))
        bounds = [(a, min(n, a + step)) for a in range(0, n, step)]
        blocks = ((lambda a=a, b=b: np.ascontiguousarray(points[a:b], dtype=np.float32)) for a, b in bounds)
        for (a, b), block in zip(bounds, run_in_order(blocks, min(host_threads(), UPLOAD_THREADS)), strict=True):
            out[a:b] = to_device(block)
        return out

    def _stream_ids(self):
        """The streamline of every point (int32, on the device), made for blocks of streamlines
        of about ``chunk_points`` points: the temporaries of one block, not of all points."""
        xp = self.backend.xp
        out = xp.empty(int(self.offsets_host[-1]), dtype=xp.int32)
        for a, b in point_blocks(self.offsets_host, self.chunk_points):
            lo, hi = int(self.offsets_host[a]), int(self.offsets_host[b])
            lengths = self.offsets[a + 1 : b + 1] - self.offsets[a:b]
            out[lo:hi] = repeat_counts(xp, xp.arange(a, b, dtype=xp.int32), lengths)
        return out

    def select(
        self,
        include: Sequence[np.ndarray],
        exclude: Sequence[np.ndarray] = (),
        *,
        engine: str = "auto",
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Selection:
        """Streamlines that pass every ``include`` region (AND) and no ``exclude`` region (NOT).

        ``engine``: ``"auto"``, ``"kernel"`` (the GPU), ``"compiled"`` (the CPU, numba) or
        ``"arrays"`` (array operations: NumPy on the CPU, CuPy on the GPU). ``"auto"`` is the
        kernel on the GPU; on the CPU NumPy or the compiled loop, whichever costs less with
        numba's start in a fresh process counted (:func:`gpu.select_host.auto_engine`). Every
        engine gives the same bits.
        """
        backend = self.backend
        masks = checked_masks([*include, *exclude])
        t0 = time.perf_counter()
        requested = engine
        engine = choose_engine(engine, backend, available=(KERNEL, COMPILED, ARRAYS), method="fiber selection")
        if backend.is_gpu:
            if engine == COMPILED:
                raise ValueError("the 'compiled' engine of fiber selection runs on the CPU backend; on the GPU "
                                 "use 'kernel' or 'arrays'")  # fmt: skip
            out = self._select_gpu(masks, engine, progress, cancelled)
        else:
            threads = host_threads()
            if engine == COMPILED and requested != AUTO and not select_host.available():
                raise ValueError(f"the 'compiled' engine needs numba: {NUMBA_HINT}; or use engine='arrays'")
            boxes = select_host.region_boxes(masks)
            if boxes is None:  # every region is empty: no streamline passes one
                out = np.zeros(self.n_streams, dtype=np.uint32)
                engine = ARRAYS if requested == AUTO else engine
            else:
                if requested == AUTO:
                    engine = select_host.auto_engine(self.points, boxes, threads)
                out = select_host.streamline_bits(
                    self.points, self.offsets_host, boxes, engine=engine, threads=threads,
                    chunk_bytes=self.chunk_bytes, progress=progress, cancelled=cancelled,
                )  # fmt: skip
        include_mask = np.uint32((1 << len(include)) - 1)
        exclude_mask = np.uint32(((1 << len(exclude)) - 1) << len(include))
        selected = ((out & include_mask) == include_mask) & ((out & exclude_mask) == 0)
        ids = lengths = starts = None
        if not isinstance(out, np.ndarray):  # bits on the device: the verdict, ids, starts and counts made there
            found = flatnonzero(backend.xp, selected)
            first = self.offsets[found]
            ids, lengths = backend.to_host(found), backend.to_host(self.offsets[found + 1] - first)
            starts = backend.to_host(first)
            selected = backend.to_host(selected)  # the bits stay on the device until read
        provenance = {
            "backend": backend.name,
            "device": backend.device_name,
            "engine": engine,
            "streamlines": self.n_streams,
            "selected": int(selected.sum()) if ids is None else len(ids),
            "seconds": time.perf_counter() - t0,
        }
        return Selection(out, selected, provenance, ids=ids, lengths=lengths, starts=starts)

    def _select_gpu(self, masks, engine, progress, cancelled):
        """Region bits of every streamline on the GPU: the kernel's, left on the device (CuPy),
        or the array reference's on CuPy in batches of bounded working memory (NumPy)."""
        backend, xp = self.backend, self.backend.xp
        if engine == KERNEL:  # left on the device: the verdict is made there too (see select)
            box = select_host.region_bounds(masks)
            if box is None:  # every region is empty: no streamline passes one
                out = xp.zeros(self.n_streams, dtype=xp.uint32)
            else:
                bits = device_region_bits(xp, masks, box)
                out = hits_kernel(backend, self.points, self.stream_of_point, self.is_last, bits, self.n_streams, box)
            if progress is not None:
                progress(self.n_streams, self.n_streams)
            return out
        bits = backend.asarray(region_bits(masks))
        out = np.zeros(self.n_streams, dtype=np.uint32)
        box = select_host.region_bounds(masks)
        mean_points = max(1.0, self.offsets_host[-1] / max(self.n_streams, 1))
        per_stream = int(mean_points * 600)  # pieces, 4 cells and their bits: generous

        def process(a: int, b: int) -> None:
            out[a:b] = backend.to_host(hits_arrays(xp, self.points, self.offsets, bits, a, b, box))

        run_batched(
            backend, self.n_streams, per_stream, process, progress=progress, cancelled=cancelled, fraction=0.3,
            maximum=max(1, self.chunk_bytes // per_stream),
        )  # fmt: skip
        return out


def select_streamlines(
    points: np.ndarray,
    offsets: np.ndarray,
    include: Sequence[np.ndarray],
    exclude: Sequence[np.ndarray] = (),
    *,
    device: str | Backend = "auto",
    engine: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Selection:
    """One selection (see :meth:`StreamlineIndex.select`); for repeated ones keep an index."""
    index = StreamlineIndex(points, offsets, device=device)
    return index.select(include, exclude, engine=engine, progress=progress, cancelled=cancelled)
