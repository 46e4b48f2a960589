"""Display arrays of tractograms, computed off the GUI thread and kept while their layer lives.

The 3-D view draws a tractogram from ONE point array, the tractogram's own float32 positions in
voxel coordinates, or a file's memory-mapped float32 millimetres (:func:`display_points`; the
actor carries the points -> RAS affine, so no copy is made), which goes to the GPU once. What is drawn is a set of index ranges over it (:class:`Cells`: VTK's
offsets + connectivity layout, which VTK wraps without copying): every streamline, a subset
while the camera moves, a capped subset at rest on software OpenGL, the selected streamlines.
Changing the subset or the selection changes only those integers; colouring by direction is one
RGBA byte quadruple per point (VTK draws it as it is), by a scalar a float32 array and a lookup
table. Everything here is plain NumPy, so a loading or selection job computes it on its worker
thread and the GUI thread only wraps the arrays. The document owns one
:class:`~tractlens.app.fiber_cache.FiberArrayCache` (``document.fiber_arrays``); every view asks
it, so they share one copy per layer and a removed layer's arrays go with it.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from tractlens.gpu.select_host import point_blocks

from .colormaps import LUTS
from .fiber_colours import COLOUR_CHUNK_POINTS, COLOUR_THREADS, direction_colours  # noqa: F401 - names of this module
from .layers import SOLID, Layer

INTERACTIVE_POINTS = 60_000  # drawn while the camera moves with software OpenGL: a subset, every k-th point
INTERACTIVE_STREAMLINES = 5_000  # software OpenGL pays per line as well as per point
SOFTWARE_SETTLED_POINTS = 2_000_000  # drawn at rest when OpenGL is software (llvmpipe): < 1 s frames
# Drawn while the camera moves with hardware OpenGL (whole streamlines), until the view has timed a
# full frame and thins it to the GPU's rate: 24 M points kept an H200's compute-card graphics at
# about 30 ms a frame (40 M took 51 ms, drawn to the end: tests/benchmarks/results/runs_2026-11-29.md).
HARDWARE_MOVING_POINTS = 24_000_000
#: Points of one vertex buffer. VTK counts a buffer's bytes in 32 bits (at most 357 M float32
#: xyz points), so a larger tractogram is drawn as pieces of consecutive streamlines, each its own
#: buffer over a slice of the one point array (no copy).
PIECE_POINTS = 1 << 27
INDEX_CHUNK_POINTS = 1 << 22  # index ranges are written this many points at a time ...
INDEX_THREADS = min(16, os.cpu_count() or 1)  # ... by this many threads (NumPy releases the GIL)
INDEX_THREAD_PREFIX = "tractlens-index"


@functools.lru_cache(maxsize=1)
def _index_pool() -> ThreadPoolExecutor:
    """The index work's threads, kept between calls. A pool made and shut down per call joined
    its threads for 45 ms over six ROI edits in a profile on the H200 machine (16 cores, 8
    threads a call), on the worker the edit's frame waits for; here a fresh pool of 8 costs
    about 0.9 ms a call more than a kept one."""
    return ThreadPoolExecutor(max_workers=INDEX_THREADS, thread_name_prefix=INDEX_THREAD_PREFIX)


def index_map(fn, items: list) -> list:
    """``[fn(item) for item in items]``, on the kept index threads when there are several items
    (in order); at once on this thread when called from one of them (no pool waits on itself)."""
    inside = threading.current_thread().name.startswith(INDEX_THREAD_PREFIX)
    if len(items) <= 1 or INDEX_THREADS <= 1 or inside:
        return [fn(item) for item in items]
    return list(_index_pool().map(fn, items))


#: The levels of detail: name -> (point budget, decimate: every k-th point of each streamline).
#: ``full`` draws everything; the view picks which level it shows at rest and while moving.
LEVELS = {
    "full": (None, False),
    "moving": (HARDWARE_MOVING_POINTS, False),
    "moving_software": (INTERACTIVE_POINTS, True),
    "software": (SOFTWARE_SETTLED_POINTS, False),
}


def index_dtype(n: int):
    """int32 indices while they fit (half the memory of int64; VTK wraps both)."""
    return np.int32 if n < 2**31 - 1 else np.int64


@dataclass
class Cells:
    """Polylines as index ranges over the full point array: streamline k of the level is
    ``connectivity[offsets[k]:offsets[k + 1]]`` (point indices), one of the tractogram's
    streamlines ``streamlines[k]`` (None: all of them, in order). ``connectivity`` None: the
    identity (every point in order, the level that draws everything): nothing is stored, the 3-D
    view gives VTK an implicit array. A level of a tractogram drawn in pieces is built piece by
    piece (:meth:`pieces`); its whole connectivity is joined only when read."""

    offsets: np.ndarray
    stored: np.ndarray | None  # the connectivity (None: the identity, or not joined from the pieces yet)
    streamlines: np.ndarray | None = None
    total: int = 0  # streamlines of the tractogram (what "of N" counts)
    first: int = 0  # the identity's first streamline (a piece's: see :meth:`pieces`)
    decimated: bool = False  # every k-th point of each streamline (not whole streamlines)
    _pieces: tuple | None = field(default=None, repr=False, compare=False)  # (bounds, cells, first points)
    _source: np.ndarray | None = field(default=None, repr=False, compare=False)  # tractogram offsets: lazy
    _ranges: tuple | None = field(default=None, repr=False, compare=False)  # (bounds, (first, count) per piece)

    @property
    def identity(self) -> bool:
        return self.stored is None and self.streamlines is None and not self.decimated

    @property
    def connectivity(self) -> np.ndarray | None:
        """The point indices over the whole array (None: the identity)."""
        if self.stored is None and self.streamlines is not None and self._pieces is None:  # ranges only
            self.stored = streamline_cells(self._source, self.streamlines).connectivity  # made when read
        if self.stored is None and self._pieces is not None and (self.streamlines is not None or self.decimated):
            # built by piece: joined now
            _bounds, parts, firsts = self._pieces
            dtype = self.offsets.dtype.type
            self.stored = np.concatenate([p.point_index() + dtype(f) for p, f in zip(parts, firsts, strict=True)])
        return self.stored

    @property
    def n_streamlines(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_points(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])

    def streamline_ids(self) -> np.ndarray | slice:
        """The tractogram's streamlines drawn, in order (a slice for the identity)."""
        if self.streamlines is None:
            return slice(self.first, self.first + self.n_streamlines)
        return self.streamlines

    def pieces(self, offsets: np.ndarray, bounds: list[tuple[int, int]]) -> list[Cells]:
        """These cells split by the pieces of the point array (:func:`piece_bounds` of the
        tractogram's ``offsets``: streamline ranges ``[a, b)``), each over its piece's points
        (indices from the piece's first point ``offsets[a]``).
        One piece: these cells. Computed once per bounds (a worker calls it before the view)."""
        if len(bounds) <= 1:
            return [self]
        key = tuple(bounds)
        if self._pieces is not None and self._pieces[0] == key:
            return self._pieces[1]
        out = []
        if self.identity:  # every streamline: identities over the pieces
            for a, b in bounds:
                part = self.offsets[a - self.first : b - self.first + 1]
                out.append(Cells(part - part[0], None, None, self.total, a))
        else:
            ids = self.streamlines
            cuts = np.searchsorted(ids, [a for a, _b in bounds] + [bounds[-1][1]])

            def piece(k: int) -> Cells:  # NumPy releases the GIL: the pieces on parallel threads
                ka, kb, a = int(cuts[k]), int(cuts[k + 1]), bounds[k][0]
                lo, hi = int(self.offsets[ka]), int(self.offsets[kb])
                start = self.connectivity.dtype.type(offsets[a])
                return Cells(self.offsets[ka : kb + 1] - self.offsets[ka], self.connectivity[lo:hi] - start,
                             ids[ka:kb], self.total)  # fmt: skip

            out = index_map(piece, list(range(len(bounds))))
        self._pieces = (key, out, [int(offsets[a]) for a, _b in bounds])
        return out

    def ranges(
        self, offsets: np.ndarray, bounds: list[tuple[int, int]], starts: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per piece of the point array (``bounds``, :func:`piece_bounds` of the tractogram's
        ``offsets``): (first point from the piece's first, point count) of each streamline drawn,
        int32 (what ``glMultiDrawArrays`` takes). Whole streamlines only (not a decimated level);
        computed once per bounds (a worker calls it before the view). ``starts``: the drawn
        streamlines' first points when known (found on the GPU beside a selection), not gathered
        from ``offsets`` again."""
        if self.decimated:
            raise ValueError("a decimated level is not index ranges of whole streamlines")
        key = tuple(bounds)
        if self._ranges is not None and self._ranges[0] == key:
            return self._ranges[1]
        ids = self.streamline_ids()
        out = []
        if isinstance(ids, slice):
            for a, b in bounds:
                lo, hi = max(a, ids.start), min(b, ids.stop)
                part = np.asarray(offsets[lo : max(lo, hi) + 1], dtype=np.int64)
                out.append(((part[:-1] - int(offsets[a])).astype(np.int32), np.diff(part).astype(np.int32)))
        else:
            # Each streamline's point count from the level's own offsets (whole streamlines: the
            # cumulative sum of their lengths), its first point by one gather of the tractogram's
            # offsets, piece by piece on parallel threads (NumPy releases the GIL).
            cuts = np.searchsorted(ids, [a for a, _b in bounds] + [bounds[-1][1]])

            def piece(k: int) -> tuple[np.ndarray, np.ndarray]:
                ka, kb, a = int(cuts[k]), int(cuts[k + 1]), bounds[k][0]
                first = np.asarray(offsets[ids[ka:kb]] if starts is None else starts[ka:kb], dtype=np.int64)
                return (first - int(offsets[a])).astype(np.int32), np.diff(self.offsets[ka : kb + 1]).astype(np.int32)

            out = index_map(piece, list(range(len(bounds))))
        self._ranges = (key, out)
        return out

    @property
    def thinnable(self) -> bool:
        """Chosen whole streamlines held as index ranges (no connectivity, no pieces made): what
        :meth:`thinned` slices."""
        return not self.decimated and self.streamlines is not None and self.stored is None and self._pieces is None

    def thinned(self, step: int) -> Cells:
        """Every ``step``-th streamline of these cells of whole streamlines, from the first: a
        selection's level while the camera moves, sliced from its whole level (its index ranges
        per piece too, when made: :meth:`ranges`) instead of a random subset drawn and its ranges
        gathered again, on the worker that an ROI edit's frame waits for."""
        if not self.thinnable:
            raise ValueError("only index ranges of chosen whole streamlines are thinned")
        kept = np.diff(self.offsets)[::step]
        offsets = np.zeros(len(kept) + 1, dtype=self.offsets.dtype)
        np.cumsum(kept, out=offsets[1:])
        out = Cells(offsets, None, self.streamlines[::step], self.total, _source=self._source)
        if self._ranges is not None:
            key, per_piece = self._ranges
            parts, first = [], 0
            for starts, counts in per_piece:
                skip = (-first) % step  # the piece's first kept streamline (every step-th of all)
                parts.append((np.ascontiguousarray(starts[skip::step]), np.ascontiguousarray(counts[skip::step])))
                first += len(starts)
            out._ranges = (key, parts)
        return out

    def point_index(self) -> np.ndarray:
        """The connectivity as an array (made for the identity)."""
        if self.identity:
            return np.arange(self.n_points, dtype=self.offsets.dtype)
        return self.connectivity


def piece_bounds(offsets: np.ndarray, max_points: int | None = None) -> list[tuple[int, int]]:
    """Ranges ``[a, b)`` of consecutive streamlines of at most ``max_points`` points
    (:data:`PIECE_POINTS`) each (a longer streamline alone): the pieces a tractogram is drawn in
    (one when it fits). At most, so that a piece fits a GPU's limits (a texture buffer of 2^27
    texels, for one)."""
    max_points = PIECE_POINTS if max_points is None else max_points
    n_lines, n_points = len(offsets) - 1, int(offsets[-1])
    if n_lines <= 0 or n_points <= max_points:
        return [(0, max(n_lines, 0))]
    return point_blocks(offsets, max_points)


@dataclass
class FiberArrays:
    """What the 3-D view draws a tractogram from: ``points`` (P, 3) float32 (:func:`display_points`:
    the tractogram's voxel coordinates or its file's memory-mapped millimetres, not a copy; float16
    millimetres for a view that draws from its own buffers),
    ``affine`` points -> RAS mm, ``box`` the grid's corners in the points' frame, ``direction`` (P, 4)
    uint8 RGBA (made when first read, unless given: a view that colours by direction in a shader
    never reads it), and the levels of detail as :class:`Cells`; ``ranges_only``: levels of whole
    streamlines are index ranges (:meth:`Cells.ranges`), without connectivity."""

    points: np.ndarray
    affine: np.ndarray
    offsets: np.ndarray
    given_direction: np.ndarray | None = None
    levels: dict[str, Cells] = field(default_factory=dict)
    bounds: list[tuple[int, int]] = field(default_factory=list)  # the pieces drawn (:func:`piece_bounds`)
    ranges_only: bool = False
    box: np.ndarray | None = None  # the grid's box corners (8, 3) in the points' frame (:func:`grid_box`)

    def __post_init__(self) -> None:
        if not self.bounds:
            self.bounds = piece_bounds(self.offsets)
        self._direction_lock = threading.Lock()

    @property
    def direction(self) -> np.ndarray:
        with self._direction_lock:
            if self.given_direction is None:
                rotation = np.asarray(self.affine, dtype=np.float64)[:3, :3]
                self.given_direction = direction_colours(self.points, self.offsets, rotation, rgba=True)
        return self.given_direction

    @property
    def point_data(self) -> dict[str, np.ndarray]:
        return {"direction": self.direction}


BERNOULLI_FROM = 0.1  # random_subset: a share of the streamlines from which each is drawn on its own


def random_subset(n: int, k: int) -> np.ndarray:
    """``k`` numbers of ``range(n)``, sorted: a reproducible random subset (the same for the same
    n and k). A small share is drawn as k distinct numbers (unshuffled: sorted next anyway; 6
    times faster for 400 k of 10 M streamlines). A larger one (a selection's moving level: 240 k
    of 1.2 M) keeps each number with a probability a little above k / n, in order, and thins
    what came evenly to k: 4 times faster there (no permutation of n, no sort)."""
    rng = np.random.default_rng(0)
    if k < BERNOULLI_FROM * n:
        return np.sort(rng.choice(n, k, replace=False, shuffle=False))
    share = min(1.0, (k + 6.0 * np.sqrt(k) + 10.0) / n)  # fewer than k come once in a billion draws
    pick = np.flatnonzero(rng.random(n) < share)
    if len(pick) < k:
        return np.sort(rng.choice(n, k, replace=False, shuffle=False))
    return pick[(np.arange(k) * (len(pick) / k)).astype(np.int64)]


def lines_within(n_lines: int, n_points: int, max_points: int) -> int:
    """How many whole streamlines of these ``n_lines`` (``n_points`` in all) fit ``max_points``
    at their mean length: at least one, at most all."""
    mean_len = max(1.0, n_points / max(n_lines, 1))
    return int(min(n_lines, max(1, max_points / mean_len)))


def streamline_cells(
    offsets: np.ndarray,
    ids: np.ndarray | None = None,
    max_points: int | None = None,
    decimate: bool = False,
    bounds: list[tuple[int, int]] | None = None,
    ranges_only: bool = False,
    lengths: np.ndarray | None = None,
) -> Cells:
    """Cells of the streamlines ``ids`` (None: all), or of a reproducible random subset of them
    with about ``max_points`` points when they have more: whole streamlines, or with
    ``decimate`` at most :data:`INTERACTIVE_STREAMLINES` of them, every k-th point (last kept).
    With ``bounds`` (the pieces the tractogram is drawn in, :func:`piece_bounds`) the cells are
    built piece by piece (see :meth:`Cells.pieces`). With ``ranges_only`` whole streamlines get
    no connectivity (a view that draws :meth:`Cells.ranges` needs none; it is made if read).
    ``lengths``: the point counts of ``ids`` when known (not gathered again)."""
    offsets = np.asarray(offsets)
    total = len(offsets) - 1
    chosen = None if ids is None else np.asarray(ids, dtype=np.int64)  # None: all (no index made)
    # the chosen streamlines' lengths only (a selection of a whole-brain tractogram: not all 10 M)
    if chosen is None:
        chosen_lengths = None
    else:
        chosen_lengths = offsets[chosen + 1] - offsets[chosen] if lengths is None else np.asarray(lengths)
    n_points = int(offsets[-1]) if ids is None else int(chosen_lengths.sum())
    step = 1
    if max_points is not None and n_points > max_points:
        n_lines = total if chosen is None else len(chosen)
        mean_len = max(1.0, n_points / max(n_lines, 1))
        if decimate:
            n_keep = min(n_lines, INTERACTIVE_STREAMLINES)
            step = max(1, int(np.ceil(n_keep * mean_len / max_points)))
        else:
            n_keep = lines_within(n_lines, n_points, max_points)
        pick = random_subset(n_lines, n_keep)
        if chosen is None:
            chosen = pick.astype(np.int64)
            chosen_lengths = offsets[chosen + 1] - offsets[chosen]
        else:
            chosen, chosen_lengths = chosen[pick], chosen_lengths[pick]
    elif ids is None:  # everything: the identity over the points (not stored), offsets as they are
        return Cells(offsets.astype(index_dtype(n_points)), None, None, total)
    if ranges_only and step == 1:
        new_offsets = np.zeros(len(chosen) + 1, dtype=np.int64)
        np.cumsum(chosen_lengths, out=new_offsets[1:])
        return Cells(new_offsets.astype(index_dtype(int(offsets[-1]))), None, chosen, total, _source=offsets)
    starts, lengths = offsets[chosen], chosen_lengths
    regular = (lengths + step - 1) // step
    needs_last = ((lengths - 1) % step != 0) & (lengths > 0)
    counts = regular + needs_last
    dtype = index_dtype(int(offsets[-1]))
    new_offsets = np.zeros(len(chosen) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    base = starts - new_offsets[:-1] * step
    if bounds is None or len(bounds) <= 1:
        connectivity = index_ranges(base.astype(dtype), counts, new_offsets, step)
        if needs_last.any():  # the decimated streamline's last point, where the step skipped it
            last_slot = new_offsets[1:][needs_last] - 1
            connectivity[last_slot] = (starts + lengths - 1)[needs_last]
        return Cells(new_offsets.astype(dtype), connectivity, chosen, total, decimated=step > 1)
    # Drawn in pieces: each piece's indices from its first point, written once (not a whole
    # connectivity first and a shifted copy per piece).
    cuts = np.searchsorted(chosen, [a for a, _b in bounds] + [bounds[-1][1]])
    parts = []
    for k, (a, _b) in enumerate(bounds):
        ka, kb, first = int(cuts[k]), int(cuts[k + 1]), int(offsets[a])
        local = new_offsets[ka : kb + 1]
        connectivity = index_ranges((base[ka:kb] - first).astype(dtype), counts[ka:kb], local, step)
        last = needs_last[ka:kb]
        if last.any():
            connectivity[local[1:][last] - local[0] - 1] = (starts[ka:kb] + lengths[ka:kb] - 1 - first)[last]
        parts.append(Cells((local - local[0]).astype(dtype), connectivity, chosen[ka:kb], total, decimated=step > 1))
    cells = Cells(new_offsets.astype(dtype), None, chosen, total, decimated=step > 1)
    cells._pieces = (tuple(bounds), parts, [int(offsets[a]) for a, _b in bounds])
    return cells


def index_ranges(base: np.ndarray, counts: np.ndarray, new_offsets: np.ndarray, step: int) -> np.ndarray:
    """The connectivity ``base[k] + step * j`` for ``j`` in ``new_offsets[k] .. new_offsets[k+1]``
    of every drawn streamline ``k``: in the index type throughout (int32 below 2^31 points, no
    int64 temporaries per point), :data:`INDEX_CHUNK_POINTS` at a time on :data:`INDEX_THREADS`
    threads (a selection of 10 M streamlines writes ~10^8 indices)."""
    dtype = base.dtype
    origin = int(new_offsets[0])  # the first streamline's place when they are a piece of a level
    n_points = int(new_offsets[-1]) - origin
    connectivity = np.empty(n_points, dtype=dtype)

    def fill(a_b: tuple[int, int]) -> None:
        a, b = a_b
        lo, hi = int(new_offsets[a]), int(new_offsets[b])
        part = connectivity[lo - origin : hi - origin]
        if hi == lo:
            return
        # As differences, summed in place: ``step`` within a streamline, the jump at each first
        # point (two passes over the indices instead of a repeat, a range and their sum).
        drawn = counts[a:b] > 0
        firsts = new_offsets[a:b][drawn]
        values = base[a:b][drawn].astype(np.int64) + step * firsts  # each drawn streamline's first index
        lasts = values + step * (counts[a:b][drawn] - 1)
        part.fill(step)
        part[firsts - lo] = np.concatenate([values[:1], values[1:] - lasts[:-1]])
        np.cumsum(part, dtype=part.dtype, out=part)

    n_chunks = max(1, min(len(counts), -(-n_points // INDEX_CHUNK_POINTS)))
    cuts = np.searchsorted(new_offsets, origin + np.linspace(0, n_points, n_chunks + 1)[1:-1]).tolist()
    chunks = list(zip([0, *cuts], [*cuts, len(counts)], strict=True))
    index_map(fill, chunks)
    return connectivity


def subset(
    offsets: np.ndarray, max_points: int | None, decimate: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(point index, new offsets, kept streamline ids) of a lighter version with about
    ``max_points`` points, or None when the whole is small enough (see :func:`streamline_cells`)."""
    if max_points is None or int(offsets[-1]) <= max_points:
        return None
    cells = streamline_cells(offsets, None, max_points, decimate)
    return cells.point_index().astype(np.int64), cells.offsets.astype(np.int64), cells.streamlines


def level_cells(
    offsets: np.ndarray,
    level: str,
    selected: np.ndarray | None = None,
    bounds: list[tuple[int, int]] | None = None,
    ranges_only: bool = False,
    lengths: np.ndarray | None = None,
    starts: np.ndarray | None = None,
) -> Cells:
    """The cells of level of detail ``level`` (:data:`LEVELS`), of the selected streamlines
    (bool per streamline, or their sorted ids) when there is a selection; by piece with ``bounds``; with
    ``ranges_only``, as index ranges per piece (:meth:`Cells.ranges`) where whole streamlines;
    ``lengths``, ``starts``: the selected streamlines' point counts and first points, when known."""
    budget, decimate = LEVELS[level]
    ids = None if selected is None else (selected if selected.dtype != bool else np.flatnonzero(selected))
    cells = streamline_cells(offsets, ids, budget, decimate, bounds, ranges_only, lengths)
    if bounds is not None and ranges_only and not cells.decimated:
        every = starts is not None and ids is not None and cells.n_streamlines == len(ids)  # (not a subset of them)
        cells.ranges(offsets, bounds, starts if every else None)
    elif bounds is not None:
        cells.pieces(offsets, bounds)  # the identity's (the others' are made already)
    return cells


def selected_cells(offsets: np.ndarray, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, connectivity) of the selected streamlines over the full, shared point array."""
    cells = streamline_cells(offsets, np.flatnonzero(selected))
    return cells.offsets.astype(np.int64), cells.point_index().astype(np.int64)


def display_points(tract, half: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(points, affine: points -> RAS mm) the 3-D view draws a tractogram from, without a copy:
    a file's memory-mapped float32 millimetres (identity affine) when the tractogram keeps them
    (:attr:`app.tractogram.Tractogram.mapped`: its voxel coordinates are then never made for the
    view), or float16 ones with ``half`` (for a view that converts them a chunk at a time as it
    uploads them), else its float32 voxel coordinates and its grid's affine."""
    mapped = tract.mapped
    drawable = (np.float32, np.float16) if half else (np.float32,)
    if mapped is not None and not mapped.made and mapped.world.dtype in drawable:
        return mapped.world, np.eye(4)
    return np.asarray(tract.points), np.asarray(tract.affine, dtype=np.float64)


def grid_box(tract, affine: np.ndarray) -> np.ndarray:
    """The eight corners (8, 3) float32 of a tractogram's grid box (half a voxel beyond the
    centres) in the frame of points drawn with ``affine`` (points -> RAS mm): what bounds it in
    the 3-D view (the camera's reset)."""
    hi = np.asarray(tract.dimensions, dtype=np.float64) - 0.5
    corners = np.array([[x, y, z, 1.0] for x in (-0.5, hi[0]) for y in (-0.5, hi[1]) for z in (-0.5, hi[2])])
    to_frame = np.linalg.solve(np.asarray(affine, dtype=np.float64), np.asarray(tract.affine, dtype=np.float64))
    return (corners @ to_frame.T)[:, :3].astype(np.float32)


def fiber_arrays(layer: Layer, skip=(), shader_drawn: bool = False) -> FiberArrays:
    """The display arrays of a tractogram layer: its points as they are (:func:`display_points`),
    direction colours (world directions) and the levels of detail (but those in ``skip``: made
    when asked for). ``shader_drawn``: the 3-D view draws it from its own buffers and colours it
    by direction in a shader: no direction colours are made ahead, and levels are index ranges;
    a file's float16 millimetres are kept as they are (the view converts them as it uploads them)."""
    tract = layer.data
    points, affine = display_points(tract, half=shader_drawn)
    arrays = FiberArrays(points, affine, tract.offsets, ranges_only=shader_drawn)
    arrays.box = grid_box(tract, affine)
    if not shader_drawn:
        arrays.direction  # noqa: B018 - made now, on the caller's (worker) thread
    for name in LEVELS:
        if name not in skip:
            arrays.levels[name] = level_cells(tract.offsets, name, bounds=arrays.bounds, ranges_only=shader_drawn)
    return arrays


def scalar_values(layer: Layer, name: str) -> tuple[np.ndarray, str]:
    """A tractogram scalar as float32 for colouring: (values, "point") per point (the file's
    array when it is float32 already), or (values, "streamline") per streamline (the view makes
    them cell colours: nothing per point is computed)."""
    tract = layer.data
    if name in tract.point_scalars:
        values = np.asarray(tract.point_scalars[name])
        values = values.reshape(len(values), -1)[:, 0] if values.ndim > 1 else values
        return np.asarray(values, dtype=np.float32), "point"
    if name in tract.streamline_scalars:
        values = np.asarray(tract.streamline_scalars[name])
        values = values.reshape(len(values), -1)[:, 0] if values.ndim > 1 else values
        return np.asarray(values, dtype=np.float32), "streamline"
    raise KeyError(f"{layer.name} has no scalar {name!r}")


def fiber_point_colours(layer: Layer, cells: Cells | None = None) -> np.ndarray:
    """Per-point RGB (uint8) of a tractogram layer: by world direction, or a scalar through the
    layer's colour map and range (the slice views' colours); of the points of ``cells`` only
    when given (a level of detail: nothing is computed for the points it leaves out)."""
    tract = layer.data
    if layer.color_by == "direction":
        rotation = np.asarray(tract.affine)[:3, :3]
        if cells is None or cells.connectivity is None or cells.decimated:
            points, affine = display_points(tract)  # a mapped file's millimetres: no voxel array made
            colours = direction_colours(points, tract.offsets, np.asarray(affine)[:3, :3])
            return colours if cells is None or cells.connectivity is None else colours[cells.connectivity]
        # whole streamlines: their own points' tangents, none made for the rest
        return direction_colours(tract.points_take(cells.connectivity), cells.offsets - cells.offsets[0], rotation)
    if layer.color_by == SOLID:  # one colour (a named bundle's): the layer's ``color``
        rgb = [int(layer.color[i : i + 2], 16) for i in (1, 3, 5)] if layer.color else [255, 255, 255]
        count = tract.n_points if cells is None else cells.n_points
        return np.tile(np.asarray(rgb, dtype=np.uint8), (count, 1))
    if cells is None or cells.connectivity is None:
        values = layer.point_values(layer.color_by)
    else:
        per, kind = scalar_values(layer, layer.color_by)
        ids = np.arange(len(tract)) if cells.streamlines is None else cells.streamlines
        values = per[cells.connectivity] if kind == "point" else np.repeat(per[ids], np.diff(cells.offsets))
    lo, hi = layer.clim
    index = np.clip(((values - lo) / (hi - lo if hi > lo else 1.0) * 255).astype(np.int64), 0, 255)
    return (LUTS.get(layer.colormap, LUTS["viridis"])[index] * 255 + 0.5).astype(np.uint8)
