"""The walk, buffers, kernel launch and compaction shared by the streamline trackers.

The tensor tracker (:mod:`gpu.deterministic`) and the fODF trackers (:mod:`gpu.fod_tracking`)
differ only in how a direction is found at a point; everything else is this module's:

* the tracking map: voxel codes ``OUTSIDE`` (not in the mask), ``TRACK`` and ``STOP`` (a stop
  region), :func:`region_map`;
* the walk of the NumPy reference (:func:`walk`): both halves of every seed's streamline,
  forward first, then backward with what is left of the length budget, over the live
  streamlines of a batch, applying the rules every tracker shares (the length budget, leaving
  the volume or the mask, entering a stop region) and asking the method for the next direction;
* the CUDA launch (:func:`launch`: one thread per seed, ``kernels/tracking.cuh`` holding the
  same rules on the device) into the same buffers — points ``(N, 2M+1, 3)`` with the seed in
  the middle, per-half counts and stop codes, and whether the seed started;
* :func:`compact`: the length filters, the points packed into ragged arrays on the device and
  copied to the host (:class:`gpu.streamlines.StreamlineBatch`);
* :func:`track_batches` and :func:`joined`: batches sized to the device, provenance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict

import numpy as np

from . import transfer
from .backend import Backend, iter_batched
from .indices import flatnonzero
from .interpolate import inside_volume, lookup
from .streamlines import (
    MAX_LENGTH,
    OUTSIDE_MASK,
    OUTSIDE_VOLUME,
    STOP_REGION,
    StreamlineBatch,
    StreamlineScalars,
    pack_rows,
    points_to_world,
    stop_code_defines,
)

# Region codes of the tracking map.
OUTSIDE, TRACK, STOP = 0, 1, 2
#: What every tracking kernel receives at compile time: its stop and region codes.
KERNEL_DEFINES = (
    *stop_code_defines("MAX_LENGTH", "OUTSIDE_VOLUME", "OUTSIDE_MASK", "LOW_FA", "SHARP_ANGLE", "STOP_REGION"),
    ("REGION_OUTSIDE", OUTSIDE),
    ("REGION_STOP", STOP),
)
#: The headers every tracking kernel is compiled with (``walk.cuh``: the rules of :func:`walk`).
KERNEL_HEADERS = ("sym3.cuh", "tracking.cuh", "walk.cuh")
#: Most seeds of one GPU batch. A whole brain would fit one batch of a large GPU; its points all
#: come to the host at once (HCP: 235 M points, 2.8 GB). Batches of 2^18 seeds (~60 M points,
#: 0.7 GB) bound that and cost a few more kernel launches; every seed is tracked alone, so the
#: streamlines do not depend on the batching.
GPU_MAX_BATCH = 1 << 18
#: Most seeds of one CPU batch: the arrays engine walks all live streamlines step by step, so
#: they are kept few enough to stay in cache.
CPU_MAX_BATCH = 4096
#: Threads per block of the tracking kernels.
KERNEL_BLOCK = 128


def checked_voxel_size(voxel_size) -> np.ndarray:
    """``voxel_size`` as three positive millimetres (ValueError otherwise)."""
    voxel_size = np.asarray(voxel_size, dtype=np.float64).reshape(3)
    if not (np.isfinite(voxel_size).all() and (voxel_size > 0).all()):
        raise ValueError(f"voxel sizes must be positive, got {voxel_size}")
    return voxel_size


def region_map(shape, mask=None, stop=None, field_name: str = "field") -> np.ndarray:
    """The tracking map of a ``shape`` grid: ``TRACK``, ``OUTSIDE`` where ``mask`` is 0 and
    ``STOP`` where ``stop`` is non-zero inside the mask (ValueError naming ``field_name`` when a
    volume's shape differs)."""
    region = np.full(shape, TRACK, np.uint8)
    for name, volume, code in (("mask", mask, OUTSIDE), ("stop region", stop, STOP)):
        if volume is None:
            continue
        volume = np.asarray(volume)
        if volume.shape != tuple(shape):
            raise ValueError(f"the {name} has shape {volume.shape}, the {field_name} {tuple(shape)}")
        if code == OUTSIDE:
            region[volume == 0] = OUTSIDE
        else:
            region[(volume != 0) & (region != OUTSIDE)] = STOP
    return region


# ----------------------------------------------------------------------------- arrays engine
def drop(stop, idx, end: int, failed, reason: int):
    """Record why the ``failed`` streamlines of ``idx`` stopped at ``end``; the mask of the others."""
    stop[idx[failed], end] = reason
    return ~failed


#: ``start(p0, valid, stop) -> (d0, begin)``: the first direction of every seed at ``p0`` and
#: the indices of the seeds that take a step (stop codes of the others written into ``stop``).
Start = Callable[[object, object, object], tuple[object, object]]
#: ``advance(p, d) -> v``: the direction of the step from ``p`` entered along ``d``.
Advance = Callable[[object, object], object]
#: ``turn(stop, idx, q, v, steps, end) -> (idx, q, e, steps)``: at the new points ``q`` entered
#: along ``v``, the next directions ``e`` of the streamlines that go on (the others' stop codes
#: written with :func:`drop`).
Turn = Callable[..., tuple[object, object, object, object]]


def walk(xp, region, seeds, max_steps: int, h, *, start: Start, turn: Turn, advance: Advance | None = None,
         dtype=np.float64):  # fmt: skip
    """Both halves of every seed's streamline: (points (N, 2M+1, 3), counts (N, 2), stop (N, 2), valid (N,)).

    ``h`` is one step along each axis in voxels; the method supplies ``start``, ``advance``
    (None: along the incoming direction, an Euler step) and ``turn`` (see their types). Per step
    from ``p`` to ``q``: the length budget used up, ``q`` outside the volume or the mask → stop
    (``q`` not taken); ``q`` appended; in a stop region → stop; then ``turn`` decides.
    """
    n, m = len(seeds), max_steps
    shape = region.shape
    buf = xp.zeros((n, 2 * m + 1, 3), np.float32)
    count = xp.zeros((n, 2), np.int32)
    stop = xp.zeros((n, 2), np.uint8)
    p0 = seeds.astype(dtype)
    buf[:, m] = p0
    inside = inside_volume(xp, p0, shape)
    code = lookup(xp, region, p0)
    stop[~inside] = OUTSIDE_VOLUME
    stop[inside & (code == OUTSIDE)] = OUTSIDE_MASK
    valid = inside & (code != OUTSIDE)
    d0, begin = start(p0, valid, stop)
    for end, sign in ((1, 1.0), (0, -1.0)):
        budget = xp.full(n, m, np.int32) if end == 1 else m - count[:, 1]
        idx = begin
        p, d = p0[idx], sign * d0[idx]
        steps = xp.zeros(len(idx), np.int32)
        while len(idx):
            live = drop(stop, idx, end, steps >= budget[idx], MAX_LENGTH)
            idx, p, d, steps = idx[live], p[live], d[live], steps[live]
            v = d if advance is None else advance(p, d)
            q = p + h * v
            ins = inside_volume(xp, q, shape)
            code = lookup(xp, region, q)
            live = drop(stop, idx, end, ~ins, OUTSIDE_VOLUME)
            live &= drop(stop, idx, end, ins & (code == OUTSIDE), OUTSIDE_MASK)
            idx, q, v, code, steps = idx[live], q[live], v[live], code[live], steps[live] + 1
            buf[idx, m + steps if end == 1 else m - steps] = q
            count[idx, end] = steps
            live = drop(stop, idx, end, code == STOP, STOP_REGION)
            idx, q, v, steps = idx[live], q[live], v[live], steps[live]
            idx, p, d, steps = turn(stop, idx, q, v, steps, end)
    return buf, count, stop, valid


# ----------------------------------------------------------------------------- CUDA kernel
def launch(kernel, backend: Backend, field, region, seeds, max_steps: int, arguments: tuple):
    """Run a tracking ``kernel`` (one thread per seed) into fresh buffers: (points, counts, stop,
    valid) as :func:`walk` returns them. The kernel's parameters are the field, the region map,
    its shape, the seeds (float64), their number, then the method's ``arguments``, then the
    four buffers."""
    cp = backend.xp
    n, m = len(seeds), max_steps
    buf = cp.empty((n, 2 * m + 1, 3), cp.float32)
    count = cp.zeros((n, 2), cp.int32)
    stop = cp.zeros((n, 2), cp.uint8)
    valid = cp.zeros(n, cp.uint8)
    seeds64 = cp.ascontiguousarray(seeds, dtype=cp.float64)
    shape = tuple(np.int32(s) for s in region.shape)
    kernel(
        ((n + KERNEL_BLOCK - 1) // KERNEL_BLOCK,),
        (KERNEL_BLOCK,),
        (field, region, *shape, seeds64, np.int32(n), *arguments, buf, count, stop, valid),
    )
    return buf, count, stop, valid.astype(bool)


# ----------------------------------------------------------------------------- driver
def compact(xp, buf, count, stop, valid, seed_offset: int, params,
            scalars: StreamlineScalars | None = None) -> StreamlineBatch:  # fmt: skip
    """Keep the streamlines that pass the length filters of ``params`` (``max_steps``,
    ``step_mm``, ``min_length_mm``, ``keep_truncated``), joined into ragged arrays on the host;
    with ``scalars``, their values computed where the points are, before the copy."""
    m = params.max_steps
    back, fwd = count[:, 0].astype(np.int64), count[:, 1].astype(np.int64)
    n_points = back + fwd + 1
    length = (n_points - 1) * params.step_mm
    keep = valid & (length >= params.min_length_mm - 1e-6)
    if not params.keep_truncated:
        keep &= ~(stop == MAX_LENGTH).any(axis=1)
    kept = flatnonzero(xp, keep)
    points, offsets = pack_rows(xp, buf, kept, m - back[kept], n_points[kept])
    to_host = transfer.to_host  # large arrays through pinned buffers (gpu.transfer)
    host_offsets = to_host(offsets)
    point_scalars, streamline_scalars = {}, {}
    frame = "voxel"
    if scalars is not None:
        point_scalars, streamline_scalars = scalars.compute(xp, points, offsets, host_offsets)
        if scalars.world:
            points, frame = points_to_world(xp, points, scalars.affine), "mm"
    # what each filter left, so an empty result can say which one emptied it
    filters = {
        "started": int(valid.sum()),
        "left_seed": int((valid & (n_points > 1)).sum()),
        "long_enough": int((valid & (length >= params.min_length_mm - 1e-6)).sum()),
    }
    return StreamlineBatch(
        to_host(points),
        host_offsets,
        to_host(kept) + seed_offset,
        to_host(stop[kept]),
        to_host(back[kept]),
        filters,
        {k: to_host(v) for k, v in point_scalars.items()},
        {k: to_host(v) for k, v in streamline_scalars.items()},
        frame,
    )


def batch_bytes(params) -> int:
    """Working memory of one seed: its point buffer, plus the gather of its points."""
    return (2 * params.max_steps + 1) * 3 * 4 * 3 + 256


def track_batches(
    backend: Backend,
    seeds: np.ndarray,
    params,
    track_chunk: Callable[[int, int, object], tuple],
    *,
    max_batch: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    scalars: StreamlineScalars | None = None,
) -> Iterator[StreamlineBatch]:
    """Batches of streamlines from ``seeds`` (host ``(N, 3)``): ``track_chunk(a, b, chunk)``
    tracks seeds ``a:b`` (``chunk``, on the backend) into :func:`walk`'s buffers, which
    :func:`compact` filters and copies. Batches are sized to the free device memory (at most
    ``max_batch`` seeds: :data:`GPU_MAX_BATCH` on a GPU, :data:`CPU_MAX_BATCH` else).
    Cancelling between batches raises :class:`gpu.backend.Cancelled`."""
    if max_batch is None:
        max_batch = GPU_MAX_BATCH if backend.is_gpu else CPU_MAX_BATCH

    def work(a: int, b: int) -> StreamlineBatch:
        t0 = time.perf_counter()
        result = track_chunk(a, b, backend.asarray(seeds[a:b]))
        batch = compact(backend.xp, *result, a, params, scalars)
        backend.synchronize()
        batch.provenance = {
            **batch.provenance,
            "seeds": b - a,
            "streamlines": len(batch),
            "seconds": time.perf_counter() - t0,
        }
        return batch

    yield from iter_batched(
        backend,
        len(seeds),
        batch_bytes(params),
        work,
        progress=progress,
        cancelled=cancelled,
        fraction=0.4,
        maximum=max_batch,
    )


def joined(batches: list[StreamlineBatch], method: str, params, backend: Backend, seeds, t0: float) -> StreamlineBatch:
    """All ``batches`` joined, with the run's provenance (started at ``t0``)."""
    out = StreamlineBatch.concatenate(batches)
    out.provenance = {
        "method": method,
        "parameters": asdict(params),
        "backend": backend.name,
        "device": backend.device_name,
        "seeds": len(np.asarray(seeds).reshape(-1, 3)),
        "streamlines": len(out),
        "points": len(out.points),
        "seconds": time.perf_counter() - t0,
        "stop_reasons": out.reason_counts(),
    }
    return out
