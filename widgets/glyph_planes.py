"""The voxels of the three cursor planes that carry 3-D glyphs, and the glyphs on them built
plane by plane (issue 41: whole-slice glyphs within 100 ms a slice step).

A slice step moves one of the three planes; the other two show the same glyphs as before. So each
plane's per-glyph values (tensors: :func:`~widgets.glyph_instances.instance_parts`, the
eigen-decomposition, rotations, shapes, colours; fODFs: the SH surfaces' radii and normals,
:mod:`widgets.fod_glyphs`) are kept in a small cache keyed by the plane and what its glyphs depend
on, and a step computes the moved plane only (a third of the work). The three planes' glyphs are
joined each voxel once (the voxels of :func:`plane_grid_voxels`), the same whether or not the
cache held a plane.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np

from tractlens.app.display_data import tensors_to_world
from tractlens.app.grid import Grid

from .glyph_instances import instance_parts


class PlaneCache:
    """The last ``size`` things made for planes of volumes, by key, each with a weak reference
    to its volume: a volume replaced is never answered for, and a volume gone (its layer
    removed, the window closed) takes its entries with it. Numpy arrays only: builds run on
    worker threads (one lock, reentrant: a volume may go while the lock is held)."""

    def __init__(self, size: int):
        self.size = size
        self._held: OrderedDict = OrderedDict()  # key -> (weak reference to the volume, the thing)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._held)

    def get(self, key: tuple, data, make):
        """What ``make()`` returns for ``key`` (made for the volume ``data``): the one held, or
        made now and held."""
        with self._lock:
            held = self._held.get(key)
            if held is not None and held[0]() is data:
                self._held.move_to_end(key)
                return held[1]
        value = make()
        with self._lock:
            self._held[key] = (weakref.ref(data, self._forget), value)
            while len(self._held) > self.size:
                self._held.popitem(last=False)
        return value

    def _forget(self, gone: weakref.ref) -> None:
        with self._lock:
            for key in [key for key, (ref, _value) in self._held.items() if ref is gone]:
                del self._held[key]


CACHED_PLANES = 24  # per-plane glyph voxels and values kept (a few layers' three planes, their neighbours)
_planes = PlaneCache(CACHED_PLANES)


def plane_grid_voxels(reference_shape, cursor, step: int) -> np.ndarray:
    """Every ``step``-th reference voxel (indices ≡ step // 2 mod step) of the three planes
    through ``cursor``, each voxel once, in lexicographic order: (M, 3). (Made unique as marks in
    a grid-sized byte mask: ``np.unique(axis=0)`` on the rows took 57 of a 75 ms glyph build, and
    ``np.unique`` on linear indices still a fifth of it.)"""
    shape = np.asarray(reference_shape, dtype=np.int64)
    cursor = np.asarray(cursor, dtype=np.int64)
    marks = np.zeros(int(np.prod(shape)), dtype=bool)
    for normal in range(3):
        marks[_plane_linear(shape, cursor[normal], normal, step)] = True
    linear = np.flatnonzero(marks)
    return np.stack(np.unravel_index(linear, tuple(int(v) for v in shape)), axis=1).astype(np.int64)


def _plane_linear(shape: np.ndarray, position: int, normal: int, step: int) -> np.ndarray:
    """The linear indices of one plane's glyph voxels (the step grid of its two other axes)."""
    a, b = (axis for axis in range(3) if axis != normal)
    ia = np.arange(step // 2, shape[a], step)
    ib = np.arange(step // 2, shape[b], step)
    stride = (shape[1] * shape[2], shape[2], 1)
    index = ia[:, None] * stride[a] + ib[None, :] * stride[b] + int(position) * stride[normal]
    return index.ravel()


def sample_volume(array: np.ndarray, affine: np.ndarray, reference_affine: np.ndarray, voxels: np.ndarray):
    """Nearest-neighbour values of a volume (``array`` on ``affine``) at reference voxels (..., 3):
    (values, inside). The same as :func:`widgets.render.sample_layer`, on plain arrays (workers)."""
    shape3 = np.array(array.shape[:3])
    if Grid.affines_match(affine, reference_affine):
        ijk = voxels
    else:
        to_layer = np.linalg.solve(affine, reference_affine)
        ijk = np.rint(voxels @ to_layer[:3, :3].T + to_layer[:3, 3]).astype(np.int64)
    inside = np.all((ijk >= 0) & (ijk < shape3), axis=-1)
    safe = np.where(inside[..., None], ijk, 0)
    return array[safe[..., 0], safe[..., 1], safe[..., 2]], inside


def plane_base(data, affine, reference, shape, normal: int, position: int, step: int, kind) -> dict:
    """One plane's fitted glyph voxels: ``voxels``, ``linear`` (reference voxel indices), world
    ``centres`` and their ``values``, and the plane's ``key``; from the cache when it holds them.
    ``kind``: (name, fitted(values) -> mask, ...)."""
    name, fitted = kind[:2]
    key = (name, id(data), affine.tobytes(), reference.tobytes(), tuple(shape), normal, int(position), step)

    def make():
        linear = _plane_linear(np.asarray(shape, dtype=np.int64), position, normal, step)
        voxels = np.stack(np.unravel_index(linear, tuple(int(v) for v in shape)), axis=1).astype(np.int64)
        values, inside = sample_volume(data, affine, reference, voxels)
        keep = inside & fitted(values)
        voxels = voxels[keep]
        centres = voxels @ reference[:3, :3].T + reference[:3, 3]
        return {"key": key, "voxels": voxels, "linear": linear[keep], "centres": centres, "values": values[keep]}

    return _planes.get(key, data, make)


def _plane(data, affine, reference, shape, normal: int, position: int, step: int, look: tuple, kind) -> dict:
    """:func:`plane_base` and what ``kind`` computes for its glyphs (``look``: what else they
    depend on), the plane's ``key`` with ``look``; from the cache when it holds them. ``kind``:
    (name, fitted(values) -> mask, compute(values, look) -> dict)."""
    base = plane_base(data, affine, reference, shape, normal, position, step, kind)
    key = (*base["key"], look)
    return _planes.get(key, data, lambda: {**base, "key": key, **kind[2](base["values"], look)})


def plane_choices(data, affine, reference, shape, cursor, step: int, look: tuple, kind, each_once: bool = True):
    """The three planes through ``cursor`` (:func:`_plane`, normal 0, 1, 2) as (plane, rows,
    left): ``rows`` selects the glyphs drawn (None: all), ``left`` says which are left out. With
    ``each_once`` a plane leaves its lines across the earlier planes to them, so that the three
    together hold each voxel once; otherwise every plane is whole (the glyphs on the planes'
    lines of intersection are in two of them), so that a step that moves one plane changes
    nothing of the others."""
    offset = step // 2
    cursor = [int(v) for v in cursor]
    chosen = []
    for normal in range(3):
        plane = _plane(data, affine, reference, shape, normal, cursor[normal], step, look, kind)
        rows, left = None, ()  # all
        if each_once and normal and cursor[normal] % step == offset:  # its lines across the earlier planes
            left = tuple((e, cursor[e]) for e in range(normal) if cursor[e] % step == offset)
            rows = np.ones(len(plane["linear"]), dtype=bool)
            for earlier, position in left:
                rows &= plane["voxels"][:, earlier] != position
        chosen.append((plane, rows, left))
    return chosen


def picked(plane: dict, rows, name: str) -> np.ndarray:
    """``plane[name]`` of the glyphs ``rows`` selects (:func:`plane_choices`; None: all)."""
    return plane[name] if rows is None else plane[name][rows]


def picked_count(plane: dict, rows) -> int:
    """How many glyphs ``rows`` selects of ``plane`` (None: all)."""
    return len(plane["linear"]) if rows is None else int(rows.sum())


def cursor_planes(data, affine, reference, shape, cursor, step: int, look: tuple, kind, names) -> dict | None:
    """The glyphs of the three planes through ``cursor`` (every ``step``-th voxel of each, fitted
    voxels only: ``kind`` as :func:`_plane`'s), each voxel once, plane after plane (the order does
    not change the picture; it is the same whatever the cache holds): ``linear`` (reference voxel
    indices), ``centres`` and ``names`` (per-glyph arrays ``kind`` computes); None when none."""
    chosen = plane_choices(data, affine, reference, shape, cursor, step, look, kind)
    if not sum(picked_count(plane, rows) for plane, rows, _left in chosen):
        return None
    return {name: np.concatenate([picked(plane, rows, name) for plane, rows, _left in chosen])
            for name in ("linear", "centres", *names)}  # fmt: skip


def tensor_fitted(values: np.ndarray) -> np.ndarray:
    """Voxels (...) holding a tensor (xx xy xz yy yz zz): a positive trace (outside the mask, zeros)."""
    return values[..., 0] + values[..., 3] + values[..., 5] > 0


def cursor_plane_tensors(data, affine, reference, shape, cursor, step: int, look: tuple) -> dict | None:
    """The tensor glyphs of the three planes through ``cursor`` (:func:`cursor_planes`; ``look``:
    (glyph shape, colour)): ``linear``, ``centres`` and the :func:`instance_parts` arrays."""

    def compute(values, look):
        world = tensors_to_world(values.astype(np.float64), affine)
        return instance_parts(world, shape=look[0], colour=look[1])

    kind = ("tensor", tensor_fitted, compute)
    names = ("evals", "orientation", "source", "rgb")
    return cursor_planes(data, affine, reference, shape, cursor, step, look, kind, names)
