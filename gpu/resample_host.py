"""The resampler's CPU path without numba: NumPy over slabs of output rows, on threads.

The same map and the same arithmetic as the compiled loop (:mod:`gpu.resample_loops`), operation
for operation and in the same order, so the two give the same bits (``tests/test_resample_engine.py``
checks it): float64 coordinates ``((a·i + b·j) + c·k) + d``; the displacement field read trilinearly
with the weights ``(gx·gy)·gz`` summed over the corners in the loop's order and added as
``x + ((s00·w0 + s01·w1) + s02·w2)``; SciPy's ``mode="constant"`` edges (a coordinate outside
``[0, n - 1]`` reads ``cval``, the field reads 0); nearest takes ``floor(x + 0.5)`` (half up).

Why not numba here: a fresh ``tractlens`` command pays numba's start (import, then the loop from
its on-disk cache and numba's CPU target: ~0.7 s on a 2-core machine, 1.35 s on the GPU machine)
before the first voxel, more than this path needs for a whole 1 mm brain. Every array operation
writes into buffers allocated once per thread (a slab of tens of thousands of voxels), so the
threads do not fault fresh temporaries in (which kept the earlier array path from scaling), and
NumPy releases the GIL inside each operation, so the slabs run side by side. Through a field, the
voxels whose affine coordinates lie farther outside the source than the field's largest
displacement are not sampled at all (they read ``cval`` whatever the field says; a third of a
1 mm subject grid for the Harvard-Oxford atlas).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from .backend import Cancelled
from .host import run_parallel

#: Samples (output voxels × channels) per slab, in whole rows of the last axis: ~25 float64/int64
#: buffers of a slab's voxels a thread (14 MB at 1 << 16) and ~250 NumPy calls a slab, whose Python
#: share (~0.2-0.3 ms) holds the GIL: on many threads the slabs' count bounds the speed, so slabs
#: are no smaller than the CPU time allows. One thread, a 1 mm atlas through a SyN field: 1 << 13
#: took 15 % more CPU than 1 << 15; 1 << 15 to 1 << 17 the same (2-core EPYC).
SLAB_SAMPLES = 1 << 16


class _Work:
    """One thread's buffers for slabs of up to ``n`` voxels of ``channels`` channels."""

    def __init__(self, n: int, channels: int):
        self.n, self.channels = n, channels
        self.coords = [np.empty(n) for _ in range(3)]  # source coordinates (x, y, z)
        self.field_at = [np.empty(n) for _ in range(3)]  # field coordinates (u, v, t)
        self.displacement = np.empty(3 * n)  # (3, voxels) once shaped by like()
        self.lower = [np.empty(n) for _ in range(3)]  # 1 - fraction, per axis
        self.lo = [np.empty(n, np.intp) for _ in range(3)]
        self.hi = [np.empty(n, np.intp) for _ in range(3)]
        self.index, self.row = np.empty(n, np.intp), np.empty(n, np.intp)
        self.weight, self.weight_xy, self.scratch = np.empty(n), np.empty(n), np.empty(n)
        self.inside, self.ok = np.empty(n, bool), np.empty(n, bool)
        self._like: dict = {}

    def like(self, role: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A kept buffer of ``dtype`` (one per role and type, for up to ``max(3, channels)`` values a
        voxel), as a C-contiguous array of ``shape``."""
        key = (role, np.dtype(dtype))
        if key not in self._like:
            self._like[key] = np.empty(max(3, self.channels) * self.n, dtype)
        return self._like[key][: int(np.prod(shape))].reshape(shape)


def _affine_rows(m, i, j, k, out) -> None:
    """``out`` (the slab's rows × nz, flat) = ``((m0·i + m1·j) + m2·k) + m3`` at the rows' ``(i, j)``."""
    row = m[0] * i + m[1] * j  # (rows,) float64, the loop's m0 * i + m1 * j
    view = out.reshape(i.size, k.size)
    np.add(row[:, None], m[2] * k, out=view)
    np.add(view, m[3], out=view)


def _inside(w: _Work, coords, shape, n: int) -> np.ndarray | None:
    """Mark ``w.inside[:n]`` where every coordinate lies in ``[0, size - 1]`` and return the voxels
    outside (None when there are none), whose coordinates are then set to 0 so that every index
    made from them is in bounds (NaN included); their values are replaced afterwards."""
    inside, ok = w.inside[:n], w.ok[:n]
    for d, c in enumerate(coords):
        np.greater_equal(c, 0.0, out=inside if d == 0 else ok)
        if d:
            np.logical_and(inside, ok, out=inside)
        np.less_equal(c, shape[d] - 1, out=ok)
        np.logical_and(inside, ok, out=inside)
    if inside.all():
        return None
    outside = np.logical_not(inside, out=ok)
    for c in coords:
        np.copyto(c, 0.0, where=outside)
    return outside


def _trilinear(w: _Work, coords, source, shape, n: int, total, axis: int = 0) -> None:
    """``total`` = ``source`` trilinear at ``coords`` (inside; overwritten by their fractions), in
    float64: the loop's weights ``(gx·gy)·gz`` and its order of the eight corners, each product
    ``weight · value`` added in turn. ``source``: the flat source voxels along ``axis`` ((S,) or
    (S, C) with ``axis=0``, (3, S) with ``axis=1``: a field's components gathered in one call);
    ``total``: the same layout with ``n`` in place of ``S``."""
    strides = (shape[1] * shape[2], shape[2], 1)
    base = w.scratch[:n]
    for d, c in enumerate(coords):
        lo, hi = w.lo[d][:n], w.hi[d][:n]
        np.floor(c, out=base)
        np.subtract(c, base, out=c)  # the fraction f
        np.subtract(1.0, c, out=w.lower[d][:n])  # g = 1 - f
        np.copyto(lo, base, casting="unsafe")
        np.add(lo, 1, out=hi)
        np.minimum(hi, shape[d] - 1, out=hi)
        if strides[d] != 1:
            np.multiply(lo, strides[d], out=lo)
            np.multiply(hi, strides[d], out=hi)
    weight_xy, weight, row, index = w.weight_xy[:n], w.weight[:n], w.row[:n], w.index[:n]
    scale = weight if total.ndim == 1 else (weight[:, None] if axis == 0 else weight[None, :])
    value = w.like("value", source.dtype, total.shape)
    term = w.like("term", np.float64, total.shape)
    first = True
    for cx, wx in ((w.lo[0], w.lower[0]), (w.hi[0], coords[0])):
        for cy, wy in ((w.lo[1], w.lower[1]), (w.hi[1], coords[1])):
            np.multiply(wx[:n], wy[:n], out=weight_xy)
            np.add(cx[:n], cy[:n], out=row)
            for cz, wz in ((w.lo[2], w.lower[2]), (w.hi[2], coords[2])):
                np.multiply(weight_xy, wz[:n], out=weight)
                np.add(row, cz[:n], out=index)
                np.take(source, index, axis=axis, out=value, mode="clip")
                if first:
                    np.multiply(scale, value, out=total)
                    first = False
                else:
                    np.multiply(scale, value, out=term)
                    np.add(total, term, out=total)


def _displace(w: _Work, coords, at_coords, field, step, fshape, n: int) -> None:
    """``coords`` moved by the field read at ``at_coords``: ``x + ((s0·w0 + s1·w1) + s2·w2)``, as the
    loop's ``x += ...``; the field reads 0 outside its grid."""
    outside = _inside(w, at_coords, fshape, n)
    displacement = w.displacement[: 3 * n].reshape(3, n)
    _trilinear(w, at_coords, field, fshape, n, displacement, axis=1)
    if outside is not None:
        for c in displacement:
            np.copyto(c, 0.0, where=outside)
    move, term = w.scratch[:n], w.weight[:n]
    for d in range(3):
        np.multiply(step[d][0], displacement[0], out=move)
        np.multiply(step[d][1], displacement[1], out=term)
        np.add(move, term, out=move)
        np.multiply(step[d][2], displacement[2], out=term)
        np.add(move, term, out=move)
        np.add(coords[d], move, out=coords[d])


def _may_land_inside(w: _Work, coords, shape, margin, n: int) -> np.ndarray | None:
    """The voxels whose affine coordinates lie within ``margin`` (voxels, per axis: the most the field
    can move them) of the source, as positions; None when that is all of them. The others land
    outside whatever the field says, and are not sampled."""
    maybe, ok = w.inside[:n], w.ok[:n]
    for d, c in enumerate(coords):
        np.greater_equal(c, -margin[d], out=maybe if d == 0 else ok)
        if d:
            np.logical_and(maybe, ok, out=maybe)
        np.less_equal(c, shape[d] - 1 + margin[d], out=ok)
        np.logical_and(maybe, ok, out=maybe)
    return None if maybe.all() else np.flatnonzero(maybe)


def _nearest_index(w: _Work, coords, shape, n: int) -> np.ndarray:
    """The flat source voxel of each coordinate (inside): ``floor(x + 0.5)`` per axis, half up."""
    index, part = w.index[:n], w.row[:n]
    strides = (shape[1] * shape[2], shape[2], 1)
    for d, c in enumerate(coords):
        np.add(c, 0.5, out=c)
        np.floor(c, out=c)
        into = index if d == 0 else part
        np.copyto(into, c, casting="unsafe")
        if strides[d] != 1:
            np.multiply(into, strides[d], out=into)
        if d:
            np.add(index, part, out=index)
    return index


def _slab(w: _Work, v0: int, v1: int, job: dict, out: np.ndarray) -> None:
    """Output voxels ``v0:v1`` (whole rows of the last axis) into ``out`` (voxels × channels)."""
    n = v1 - v0
    ny, nz = job["shape"][1:]
    rows = np.arange(v0 // nz, v1 // nz)
    i, j, k = (rows // ny).astype(np.float64), (rows % ny).astype(np.float64), np.arange(nz, dtype=np.float64)
    coords = [c[:n] for c in w.coords]
    for d in range(3):
        _affine_rows(job["linear"][d], i, j, k, coords[d])
    source, fill = job["source"], job["fill"]
    target = out[v0:v1] if source.ndim == 2 else out[v0:v1, 0]
    kept, m = None, n
    if job["field"] is not None:
        at_coords = [c[:n] for c in w.field_at]
        for d in range(3):
            _affine_rows(job["at"][d], i, j, k, at_coords[d])
        kept = _may_land_inside(w, coords, job["source_shape"], job["margin"], n)
        if kept is not None:  # only the voxels the field can bring inside are sampled: the same values
            m = kept.size
            for c in (*coords, *at_coords):  # each moved to the front of its own buffer
                np.copyto(c[:m], np.take(c, kept, out=w.scratch[:m]))
            coords, at_coords = [c[:m] for c in coords], [c[:m] for c in at_coords]
        _displace(w, coords, at_coords, job["field"], job["step"], job["field_shape"], m)
    outside = _inside(w, coords, job["source_shape"], m)
    values = target if kept is None else w.like("kept", target.dtype, (m,) if target.ndim == 1 else (m, w.channels))
    if job["order"] == 0:
        np.take(source, _nearest_index(w, coords, job["source_shape"], m), axis=0, out=values, mode="clip")
    else:
        total = w.like("total", np.float64, (m,) if source.ndim == 1 else (m, w.channels))
        _trilinear(w, coords, source, job["source_shape"], m, total)
        np.copyto(values, total, casting="unsafe")  # float64 sums rounded to the output's float32
    if outside is not None:
        np.copyto(values, fill, where=outside if values.ndim == 1 else outside[:, None])
    if kept is not None:
        np.copyto(target, fill)
        target[kept] = values


def _field_reach(field, step) -> list[float]:
    """Per source axis, the most (voxels) the field can move a coordinate: a trilinear value is a
    convex combination of the field's values, so ``|w_c| <= max |field_c|``; with a relative and an
    absolute slack for the rounding of the weights and sums. Infinite for a field with NaN or inf
    (every voxel is then sampled)."""
    largest = np.abs(np.asarray(field, np.float32).reshape(-1, 3)).max(axis=0).astype(np.float64)
    if not np.isfinite(largest).all():
        return [np.inf] * 3
    return (np.abs(step) @ largest * (1 + 1e-6) + 1e-6).tolist()


def resample_on_threads(
    flat: np.ndarray,
    out: np.ndarray,
    shape: tuple[int, int, int],
    linear,
    field,
    at_field,
    step,
    order: int,
    cval: float,
    threads: int,
    check: Callable[[], bool],
) -> None:
    """``out`` (X, Y, Z, C) from ``flat`` (SX, SY, SZ, C; of ``out``'s type for trilinear) through the
    voxel map of :func:`gpu.resample.resample_volume` (same arguments), slabs of rows on ``threads`` threads."""
    total = int(np.prod(shape))
    if total == 0:
        return
    channels = flat.shape[3]
    source = np.ascontiguousarray(flat).reshape(-1, channels)  # a voxel's channels side by side
    job = {
        "shape": tuple(shape),
        "source_shape": flat.shape[:3],
        "source": source[:, 0] if channels == 1 else source,
        "linear": np.asarray(linear, np.float64)[:3].tolist(),
        "field": None,
        "order": order,
        "fill": np.array(cval).astype(out.dtype),
    }
    if field is not None:
        step = np.asarray(step, np.float64)[:3, :3]
        # the field's values as the loop reads them (float32), then float64 (exact): one gather a corner
        job.update(
            field=np.ascontiguousarray(np.moveaxis(np.asarray(field, np.float32), -1, 0), np.float64).reshape(3, -1),
            field_shape=field.shape[:3],
            at=np.asarray(at_field, np.float64)[:3].tolist(),
            step=step.tolist(),
            margin=_field_reach(field, step),
        )
    nz = shape[2]
    voxels = max(1, SLAB_SAMPLES // (channels * max(1, nz))) * nz
    flat_out = out.reshape(total, channels)
    local = threading.local()

    def task(v0: int):
        def run():
            if check():
                raise Cancelled()
            work = getattr(local, "work", None)
            if work is None:
                work = local.work = _Work(voxels, channels)
            _slab(work, v0, min(total, v0 + voxels), job, flat_out)

        return run

    run_parallel([task(v0) for v0 in range(0, total, voxels)], threads)
