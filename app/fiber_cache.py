"""The document's cache of its tractograms' display arrays (:mod:`app.fiber_arrays`): computed
once per layer, and per colouring, selection or reference grid where they depend on it, by
whichever thread asks first (a loading or selection job's worker), then read by the views."""

from __future__ import annotations

import functools
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .fiber_arrays import (
    LEVELS,
    Cells,
    FiberArrays,
    fiber_arrays,
    fiber_point_colours,
    level_cells,
    lines_within,
    scalar_values,
)
from .grid import Grid
from .layers import Layer

LATER_THREAD_NAME = "tractlens-later-levels"


@functools.lru_cache(maxsize=1)
def _later_thread() -> ThreadPoolExecutor:
    """The thread that makes a selection's levels drawn later (kept between calls; one, so that
    an ROI edit's later work never takes more than one core from the next edit)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=LATER_THREAD_NAME)


class FiberArrayCache:
    """The display arrays of tractogram layers, computed once per layer (and per colouring,
    selection or reference grid where they depend on it); entries go when their layer is garbage
    collected. Thread-safe: loading and selection jobs prepare on workers while the views read
    on the GUI thread."""

    def __init__(self) -> None:
        self._arrays: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._colours: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._scalars: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._selections: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._on_grid: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: Levels of detail not prepared ahead (the 3-D view says which it never draws here: the
        #: hardware moving level with software OpenGL); made when asked for all the same.
        self.skip_levels: frozenset[str] = frozenset()
        #: Levels never drawn of a selection (the other OpenGL's): not prepared by
        #: :meth:`prepare_selection`; made when asked for all the same.
        self.skip_selection_levels: frozenset[str] = frozenset()
        #: Levels of a selection the views draw only after the others (a whole-brain selection's
        #: full level, drawn once ROI edits pause: the edits draw the moving level):
        #: :meth:`prepare_selection` makes them on the later thread, after the selection is shown.
        self.later_selection_levels: frozenset[str] = frozenset()
        #: Tractograms of at least this many points are drawn by the 3-D view from its own buffers
        #: (None: none): :func:`fiber_arrays` with ``shader_drawn``.
        self.shader_drawn_min_points: int | None = None

    def shader_drawn(self, layer: Layer) -> bool:
        least = self.shader_drawn_min_points
        return least is not None and layer.data.n_points >= least

    def prepare(self, layer: Layer) -> FiberArrays:
        """The display arrays of a tractogram layer (computed once; safe to call from a worker)."""
        with self._lock:
            cached = self._arrays.get(layer)
        if cached is not None:
            return cached
        arrays = fiber_arrays(layer, self.skip_levels, self.shader_drawn(layer))
        with self._lock:
            self._arrays[layer] = arrays
        return arrays

    def cells(self, layer: Layer, level: str, selected: np.ndarray | None = None) -> Cells:
        """The cells of ``level`` (:data:`LEVELS`) of the layer's streamlines, or of those that
        ``selected`` keeps (computed once per selection array: a selection job calls
        :meth:`prepare_selection` on its worker, the view then only reads)."""
        arrays = self.prepare(layer)
        if selected is None:
            if level not in arrays.levels:  # skipped when prepared
                cells = level_cells(arrays.offsets, level, bounds=arrays.bounds, ranges_only=self.shader_drawn(layer))
                with self._lock:
                    arrays.levels.setdefault(level, cells)
            return arrays.levels[level]
        with self._lock:
            cached = self._selections.get(layer)
        if cached is None or cached[0] is not selected:
            ids = np.flatnonzero(selected)  # its ids and their lengths: found once for all levels
            offsets = np.asarray(arrays.offsets)
            first = offsets[ids]  # (gathered once: the ranges start from it too)
            cached = self._remember_selection(layer, selected, ids, offsets[ids + 1] - first, first)
        per_level = cached[1]
        made = per_level.get(level)
        if isinstance(made, Future):  # being made on the later thread (:meth:`prepare_selection`)
            made = made.result()  # (None: it gave up, its selection replaced; made here instead)
        if made is None:
            made = self._selection_level(layer, arrays, level, cached)
            per_level[level] = made
        return made

    def _selection_level(self, layer: Layer, arrays: FiberArrays, level: str, cached: tuple) -> Cells:
        """The cells of ``level`` of a selection entry (:meth:`_remember_selection`). A level with a
        point budget that keeps whole streamlines is every k-th of the selected ones (its ids are in
        the tractogram's order, which a whole-brain seeding spreads in space): sliced from the whole
        level when that is made, made from the ids alone when not (the same cells either way)."""
        per_level, ids, lengths, starts = cached[1], cached[2], cached[3], cached[4]
        budget, decimate = LEVELS[level]
        whole = per_level.get("full")
        whole = None if isinstance(whole, Future) else whole
        n_points = int(lengths.sum()) if whole is None else whole.n_points
        if budget is not None and n_points <= budget:  # within the level's budget: the whole level's cells
            return whole if whole is not None else self.cells(layer, "full", cached[0])  # (not made twice)
        if budget is None or decimate:
            return level_cells(arrays.offsets, level, ids, arrays.bounds, self.shader_drawn(layer), lengths=lengths,
                               starts=starts)  # fmt: skip
        step = -(-len(ids) // lines_within(len(ids), n_points, budget))
        if whole is not None and whole.thinnable:
            return whole.thinned(step)  # its index ranges sliced (when made)
        return level_cells(arrays.offsets, "full", ids[::step], arrays.bounds, self.shader_drawn(layer),
                           lengths=lengths[::step], starts=None if starts is None else starts[::step])  # fmt: skip

    def simplified(self, layer: Layer, device: str = "auto", cancelled=None) -> Cells:
        """Every streamline of the layer simplified for drawing within
        :data:`~app.fiber_simplify.SIMPLIFY_TOLERANCE_MM` (:func:`~app.fiber_simplify.simplified_cells`),
        computed once, on the GPU when ``device`` gives one (on the CPU when it runs out of memory):
        seconds for 10 M streamlines, so a worker asks, and the view draws it when it is there."""
        from tractlens.gpu.backend import get_backend

        from .fiber_simplify import SIMPLIFY_TOLERANCE_MM, simplified_cells, tolerance_in_points

        arrays = self.prepare(layer)
        cells = arrays.levels.get("simplified")
        if cells is None:
            tolerance = tolerance_in_points(SIMPLIFY_TOLERANCE_MM, arrays.affine)
            backend = get_backend(device)
            args = (arrays.points, arrays.offsets, arrays.bounds, tolerance)
            try:
                cells = simplified_cells(*args, cancelled=cancelled, backend=backend)
            except Exception as error:
                if not (backend.is_gpu and backend.is_out_of_memory(error)):
                    raise
                cells = simplified_cells(*args, cancelled=cancelled)
            with self._lock:
                cells = arrays.levels.setdefault("simplified", cells)
        return cells

    def seed_selection(self, layer: Layer, selected: np.ndarray, ids: np.ndarray, lengths: np.ndarray,
                       starts: np.ndarray | None = None) -> None:  # fmt: skip
        """Give the cache a selection's sorted streamline ids, their point counts and (when known)
        their first points, found elsewhere (the GPU, beside the selection), so :meth:`cells`
        does not find them again."""
        self._remember_selection(layer, selected, ids, lengths, starts)

    def _remember_selection(self, layer: Layer, selected: np.ndarray, ids, lengths, starts=None) -> tuple:
        """The layer's selection entry: (selected, cells per level, ids int64, lengths in the
        offsets' dtype, first points int64 or None), replacing the one before."""
        kind = np.asarray(self.prepare(layer).offsets).dtype
        first = None if starts is None else np.asarray(starts, dtype=np.int64)
        entry = (selected, {}, np.asarray(ids, dtype=np.int64), np.asarray(lengths).astype(kind, copy=False), first)
        with self._lock:
            self._selections[layer] = entry
        return entry

    def prepare_selection(self, layer: Layer, selected: np.ndarray) -> None:
        """The cells of the levels the views draw of a selection (on a worker, before it is
        shown): those not in :attr:`skip_selection_levels`; those in
        :attr:`later_selection_levels` on the later thread, after this returns (a view that
        reads one before it is made waits for it)."""
        levels = [level for level in LEVELS if level not in self.skip_selection_levels]
        for level in levels:
            if level not in self.later_selection_levels:
                self.cells(layer, level, selected)
        later = [level for level in levels if level in self.later_selection_levels]
        if not later:
            return
        with self._lock:
            cached = self._selections.get(layer)
        if cached is None or cached[0] is not selected:
            self.cells(layer, later[0], selected)  # (its entry: made by the others already when there are any)
            return
        per_level = cached[1]
        for level in later:
            if level not in per_level:
                future = _later_thread().submit(self._make_later, layer, cached, level)
                per_level.setdefault(level, future)

    def _make_later(self, layer: Layer, cached: tuple, level: str) -> Cells | None:
        """A level of a selection made on the later thread; None when the selection was replaced
        meanwhile (an ROI edit that followed), whose levels no view will draw."""
        with self._lock:
            current = self._selections.get(layer)
        if current is not cached:
            cached[1].pop(level, None)
            return None
        try:
            made = self._selection_level(layer, self.prepare(layer), level, cached)
        except Exception:  # made again where it is asked for, which then says what went wrong
            cached[1].pop(level, None)
            return None
        cached[1][level] = made
        return made

    def scalar(self, layer: Layer, name: str) -> tuple[np.ndarray, str]:
        """:func:`scalar_values`, computed once per layer and scalar."""
        with self._lock:
            cached = self._scalars.setdefault(layer, {})
        if name not in cached:
            cached[name] = scalar_values(layer, name)
        return cached[name]

    def colours(self, layer: Layer, cells: Cells | None = None) -> np.ndarray:
        """:func:`fiber_point_colours` (RGB) of all points or of ``cells``', computed once per
        layer, colouring and cells (views share it)."""
        if layer.color_by == "direction":
            arrays = self.prepare(layer)
            if arrays.given_direction is None and cells is not None and cells.connectivity is not None:
                return fiber_point_colours(layer, cells)  # of the cells' points only: none made for all
            colours = arrays.direction[:, :3]  # the prepared arrays hold them (or make them now)
            return colours if cells is None or cells.connectivity is None else colours[cells.connectivity]
        key = (layer.color_by, layer.colormap, layer.clim, layer.color, id(cells))
        with self._lock:
            cached = self._colours.get(layer)
        if cached is None or cached[0] != key:
            cached = (key, fiber_point_colours(layer, cells))
            with self._lock:
                self._colours[layer] = cached
        return cached[1]

    def on_reference(self, layer: Layer, reference_affine: np.ndarray):
        """(points in reference voxel coordinates (P, 3) float32, colours (P, 3) uint8, offsets,
        streamline id of each point) for the slice views: the geometry until the grid changes,
        the colours until the colouring does. Very large tractograms use their at-rest level of
        detail of software OpenGL (whole streamlines, at most a few million points) so that a
        slab search per paint stays in milliseconds; the views draw a bounded number of segments
        anyway."""
        level = self.cells(layer, "software")
        whole = level.streamlines is None
        grid_key = reference_affine.tobytes()
        colour_key = (layer.color_by, layer.colormap, layer.clim, layer.color)
        with self._lock:
            cached = self._on_grid.get(layer)
        if cached is None or cached["grid"] != grid_key:
            tract = layer.data
            to_ref = np.linalg.solve(reference_affine, tract.affine)
            # a mapped file's points converted here (all of them only for a small tractogram): the
            # tractogram's own voxel array is not made for the views
            points = tract.points_rows(0, tract.n_points) if whole else tract.points_take(level.connectivity)
            if not Grid.affines_match(tract.affine, reference_affine):
                to_ref = to_ref.astype(np.float32)
                points = points @ to_ref[:3, :3].T + to_ref[:3, 3]
            ids = np.arange(len(tract)) if whole else level.streamlines
            cached = {"grid": grid_key, "points": points, "streams": np.repeat(ids, np.diff(level.offsets))}
            with self._lock:
                self._on_grid[layer] = cached
        if cached.get("colour_key") != colour_key:  # of the level's points only
            cached["colours"] = self.colours(layer, None if whole else level)
            cached["colour_key"] = colour_key
        return cached["points"], cached["colours"], level.offsets.astype(np.int64), cached["streams"]

    def cm_layer(self, name: str, tractogram) -> Layer:
        """A geodesic result as the Geodesic panel shows it (coloured by CM over its robust
        range), with its display arrays prepared: call it on a worker."""
        layer = Layer(name, tractogram, "tractogram", color_by="cm", colormap="hot")
        layer.clim = layer.scalar_range("cm")
        self.prepare(layer)
        return layer
