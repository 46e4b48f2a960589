"""Display arrays of tractograms, computed off the GUI thread and kept while their layer lives.

Everything a fiber actor or a slice view needs that costs O(points) — world points, line
connectivity, per-point colours and scalars, the index sets of the levels of detail, the points
on a view's reference grid — is plain NumPy here, so a loading job computes it on its worker
thread and the GUI thread only wraps the arrays in VTK objects. The document owns one
:class:`FiberArrayCache` (``document.fiber_arrays``); every view asks it, so they share one copy
per layer and a removed layer's arrays go with it.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from .colormaps import LUTS
from .grid import Grid
from .layers import SOLID, Layer

INTERACTIVE_POINTS = 60_000  # drawn while the camera moves: a streamline subset, every k-th point
INTERACTIVE_STREAMLINES = 5_000  # software OpenGL pays per line as well as per point
SOFTWARE_SETTLED_POINTS = 2_000_000  # drawn at rest when OpenGL is software (llvmpipe): < 1 s frames


@dataclass
class Level:
    """Polylines over ``points`` with ``offsets`` (VTK's modern offsets + connectivity layout,
    which VTK wraps without copying); the full level shares the tractogram's arrays."""

    points: np.ndarray
    point_data: dict[str, np.ndarray]
    offsets: np.ndarray
    connectivity: np.ndarray
    index: np.ndarray | None = None  # positions in the full point array; None: all of them
    streamlines: np.ndarray | None = None  # ids of the streamlines kept; None: all of them


@dataclass
class FiberArrays:
    points: np.ndarray  # (P, 3) float32, RAS mm
    point_data: dict[str, np.ndarray]
    levels: dict[str, Level] = field(default_factory=dict)


def subset(
    offsets: np.ndarray, max_points: int | None, decimate: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(point index, new offsets, kept streamline ids) of a lighter version with about ``max_points`` points, or None
    when the whole is small enough. A reproducible random subset of streamlines and, with
    ``decimate``, every k-th point of each (its last point kept)."""
    n_points = int(offsets[-1])
    if max_points is None or n_points <= max_points:
        return None
    counts = np.diff(offsets)
    n_lines = len(counts)
    mean_len = max(1.0, n_points / max(n_lines, 1))
    if decimate:
        n_keep = min(n_lines, INTERACTIVE_STREAMLINES)
        step = max(1, int(np.ceil(n_keep * mean_len / max_points)))
    else:
        step = 1
        n_keep = int(min(n_lines, max(1, max_points / mean_len)))
    keep = np.sort(np.random.default_rng(0).choice(n_lines, n_keep, replace=False))
    starts, lengths = offsets[:-1][keep], counts[keep]
    regular = (lengths + step - 1) // step
    within = np.arange(int(regular.sum())) - np.repeat(np.cumsum(regular) - regular, regular)
    picks = np.repeat(starts, regular) + within * step
    needs_last = (lengths - 1) % step != 0
    index = np.sort(np.concatenate([picks, (starts + lengths - 1)[needs_last]]))
    new_offsets = np.concatenate([[0], np.cumsum(regular + needs_last)])
    return index, new_offsets, keep


def fiber_arrays(layer: Layer) -> FiberArrays:
    """The display arrays of a tractogram layer: its points in RAS mm, direction colours and
    scalars per point, and the levels of detail (full, coarse while moving, software at rest)."""
    tract = layer.data
    points = tract.points_world()
    data = {"direction": direction_colours(points, tract.offsets)}
    for name in (*tract.point_scalars, *tract.streamline_scalars):
        data[name] = layer.point_values(name)
    arrays = FiberArrays(points, data)
    arrays.levels["full"] = Level(points, data, tract.offsets, np.arange(len(points), dtype=np.int64))
    for name, budget, decimate in (
        ("coarse", INTERACTIVE_POINTS, True),
        ("software", SOFTWARE_SETTLED_POINTS, False),
    ):
        picked = subset(tract.offsets, budget, decimate)
        if picked is None:
            arrays.levels[name] = arrays.levels["full"]
        else:
            index, offsets, kept = picked
            arrays.levels[name] = Level(
                points[index],
                {key: value[index] for key, value in data.items()},
                offsets.astype(np.int64),
                np.arange(len(index), dtype=np.int64),
                index,
                kept,
            )
    return arrays


def direction_colours(points: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per-point RGB (uint8) from the local streamline direction |t|, the usual fiber colouring."""
    tangent = np.zeros_like(points, dtype=np.float32)
    if len(points) > 1:
        diff = np.diff(points, axis=0).astype(np.float32)
        tangent[:-1] += diff
        tangent[1:] += diff
        # No tangent across streamline boundaries.
        starts = offsets[1:-1]
        tangent[starts - 1] -= diff[starts - 1]
        tangent[starts] -= diff[starts - 1]
    norm = np.sqrt(np.einsum("ij,ij->i", tangent, tangent))
    scale = np.float32(255.0) / np.where(norm > 0, norm, np.float32(1.0))
    np.abs(tangent, out=tangent)
    tangent *= scale[:, None]
    tangent += np.float32(0.5)
    return tangent.astype(np.uint8)


def fiber_point_colours(layer: Layer) -> np.ndarray:
    """Per-point RGB (uint8) of a tractogram layer: by world direction, or a scalar through the
    layer's colour map and range."""
    tract = layer.data
    if layer.color_by == "direction":
        return direction_colours(tract.points_world(), tract.offsets)
    if layer.color_by == SOLID:  # one colour (a named bundle's): the layer's ``color``
        rgb = [int(layer.color[i : i + 2], 16) for i in (1, 3, 5)] if layer.color else [255, 255, 255]
        return np.tile(np.asarray(rgb, dtype=np.uint8), (len(tract.points), 1))
    values = layer.point_values(layer.color_by)
    lo, hi = layer.clim
    index = np.clip(((values - lo) / (hi - lo if hi > lo else 1.0) * 255).astype(np.int64), 0, 255)
    return (LUTS.get(layer.colormap, LUTS["viridis"])[index] * 255 + 0.5).astype(np.uint8)


def selected_cells(offsets: np.ndarray, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, connectivity) of the selected streamlines over the full, shared point array."""
    keep = np.flatnonzero(selected)
    lengths = np.diff(offsets)[keep]
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    owner_start = np.repeat(offsets[:-1][keep], lengths)
    within = np.arange(int(new_offsets[-1])) - np.repeat(new_offsets[:-1], lengths)
    return new_offsets, (owner_start + within).astype(np.int64)


class FiberArrayCache:
    """The display arrays of tractogram layers, computed once per layer (and per colouring or
    reference grid where they depend on it); entries go when their layer is garbage collected.
    Thread-safe: loading jobs prepare on workers while the views read on the GUI thread."""

    def __init__(self) -> None:
        self._arrays: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._colours: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._on_grid: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def prepare(self, layer: Layer) -> FiberArrays:
        """The display arrays of a tractogram layer (computed once; safe to call from a worker)."""
        with self._lock:
            cached = self._arrays.get(layer)
        if cached is not None:
            return cached
        arrays = fiber_arrays(layer)
        with self._lock:
            self._arrays[layer] = arrays
        return arrays

    def colours(self, layer: Layer) -> np.ndarray:
        """:func:`fiber_point_colours`, computed once per layer and colouring (views share it)."""
        if layer.color_by == "direction":
            return self.prepare(layer).point_data["direction"]  # the prepared arrays already hold them
        key = (layer.color_by, layer.colormap, layer.clim, layer.color)
        with self._lock:
            cached = self._colours.get(layer)
        if cached is None or cached[0] != key:
            cached = (key, fiber_point_colours(layer))
            with self._lock:
                self._colours[layer] = cached
        return cached[1]

    def on_reference(self, layer: Layer, reference_affine: np.ndarray):
        """(points in reference voxel coordinates (P, 3) float32, colours (P, 3) uint8, offsets,
        streamline id of each point) for the slice views: the geometry until the grid changes,
        the colours until the colouring does. Very large tractograms use their at-rest level of
        detail (whole streamlines, at most a few million points) so that a slab search per paint
        stays in milliseconds; the views draw a bounded number of segments anyway."""
        level = self.prepare(layer).levels["software"]
        grid_key = reference_affine.tobytes()
        colour_key = (layer.color_by, layer.colormap, layer.clim, layer.color)
        with self._lock:
            cached = self._on_grid.get(layer)
        if cached is None or cached["grid"] != grid_key:
            tract = layer.data
            to_ref = np.linalg.solve(reference_affine, tract.affine)
            points = tract.points if level.index is None else tract.points[level.index]
            if not Grid.affines_match(tract.affine, reference_affine):
                to_ref = to_ref.astype(np.float32)
                points = points @ to_ref[:3, :3].T + to_ref[:3, 3]
            ids = np.arange(len(tract)) if level.streamlines is None else level.streamlines
            cached = {"grid": grid_key, "points": points, "streams": np.repeat(ids, np.diff(level.offsets))}
            with self._lock:
                self._on_grid[layer] = cached
        if cached.get("colour_key") != colour_key:
            colours = self.colours(layer)
            cached["colours"] = colours if level.index is None else colours[level.index]
            cached["colour_key"] = colour_key
        return cached["points"], cached["colours"], level.offsets, cached["streams"]

    def cm_layer(self, name: str, tractogram) -> Layer:
        """A geodesic result as the Geodesic panel shows it (coloured by CM over its robust
        range), with its display arrays prepared: call it on a worker."""
        layer = Layer(name, tractogram, "tractogram", color_by="cm", colormap="hot")
        layer.clim = layer.scalar_range("cm")
        self.prepare(layer)
        return layer
