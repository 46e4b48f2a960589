"""Display arrays of a tractogram, prepared off the GUI thread.

Everything a fiber actor needs that costs O(points) — world points, VTK line
connectivity, per-point colours and scalars, and the index sets of the levels
of detail — is plain NumPy here, so a loading job can compute it on its worker
thread (:func:`prepare`) and the GUI thread only wraps the arrays in VTK
objects. Results are cached per layer.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from tractlens.app.model import Layer

from .render import direction_colours

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


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def prepare(layer: Layer) -> FiberArrays:
    """The display arrays of a tractogram layer (computed once; safe to call from a worker)."""
    with _LOCK:
        cached = _CACHE.get(layer)
    if cached is not None:
        return cached
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
    with _LOCK:
        _CACHE[layer] = arrays
    return arrays


def cm_layer(name: str, tractogram) -> Layer:
    """A geodesic result as the Geodesic panel shows it (coloured by CM over its robust
    range), with its display arrays prepared: call it on a worker."""
    layer = Layer(name, tractogram, "tractogram", color_by="cm", colormap="hot")
    layer.clim = layer.scalar_range("cm")
    prepare(layer)
    return layer


def selected_cells(offsets: np.ndarray, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, connectivity) of the selected streamlines over the full, shared point array."""
    keep = np.flatnonzero(selected)
    lengths = np.diff(offsets)[keep]
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    owner_start = np.repeat(offsets[:-1][keep], lengths)
    within = np.arange(int(new_offsets[-1])) - np.repeat(new_offsets[:-1], lengths)
    return new_offsets, (owner_start + within).astype(np.int64)
