"""Streamlines of a probabilistic run traced again as polylines (:func:`trace_paths`,
:func:`trace_kept`): the same steps as the run's (the same random streams), recorded, then turned
into polylines and tested for being kept with array operations on the device that traced them
(the CUDA kernel's trace stays on the GPU; only the kept polylines' float32 points come back).

A polyline is the second half reversed, then the first half without its start point; a half's
positions are those where it moved (a failed step leaves the position, and the trace repeats it).
A streamline is kept when no point (rounded to its voxel) lies in an exclusion voxel and its
points meet the waypoint condition, as the run decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from . import probabilistic_host
from .backend import Cancelled, get_backend
from .probabilistic_kernel import KernelTracker
from .probabilistic_params import (
    BIT_EXCLUDE,
    WAYPOINT_SHIFT,
    ProbParams,
    SampleField,
    numpy_batch,
    streamline_ids,
)

#: Streamlines traced at a time on a GPU, at most (their traces and the arrays made from them take
#: about :func:`trace_bytes_per_streamline` each; a chunk takes at most 1/8 of the free memory).
GPU_TRACE_CHUNK = 16384


def trace_bytes_per_streamline(params: ProbParams) -> int:
    """Device bytes one traced streamline takes: its (2, n_steps + 1, 4) float64 trace and the
    polyline arrays made from it (positions, float32 points, voxels, bits: about 3 traces)."""
    return 4 * 2 * (params.n_steps + 1) * 4 * 8


def polylines_of(xp, first, second):
    """The polylines of traced halves ``first`` and ``second`` ((n, t, 4) each: x, y, z, alive;
    t may differ): (positions (n, m, 3), used (n, m) bool): streamline ``i`` is
    ``positions[i][used[i]]``, the second half reversed, then the first without its start (m: the
    longest half of each, ``t2 + t1 - 1`` at most)."""

    def moved(steps):
        xyz = steps[..., :3]
        used = xp.ones(xyz.shape[:2], dtype=bool)
        if xyz.shape[1] > 1:
            changed = xyz[:, 1:] != xyz[:, :-1]  # per axis, or-ed (a reduction along a 3-long axis is slow)
            used[:, 1:] = changed[..., 0] | changed[..., 1] | changed[..., 2]
        # the steps after every streamline's last move (a trace's padding) hold no point: cut off
        moving = used.any(axis=0).astype(xp.int8)
        last = int(moving.shape[0] - int(xp.argmax(moving[::-1])))
        return xyz[:, :last], used[:, :last]

    x2, u2 = moved(second)
    x1, u1 = moved(first)
    positions = xp.concatenate([x2[:, ::-1], x1[:, 1:]], axis=1)
    used = xp.concatenate([u2[:, ::-1], u1[:, 1:]], axis=1)
    return positions, used


def kept_of(xp, points, used, bits, params: ProbParams, n_waypoints: int):
    """Which polylines (float32 ``points`` (n, m, 3) where ``used``) are kept: none of their voxels
    (points rounded; those off the grid ignored) an exclusion voxel, and their voxels meeting the
    waypoint condition."""
    shape = bits.shape
    inside = used.copy()
    flat = None
    for axis in range(3):
        v = xp.rint(points[..., axis]).astype(xp.int64)
        inside &= (v >= 0) & (v < shape[axis])
        v = xp.clip(v, 0, shape[axis] - 1)
        flat = v if flat is None else flat * shape[axis] + v
    values = xp.where(inside, bits.reshape(-1)[flat], xp.uint32(0))
    del flat, inside

    def met(bit: int):
        return xp.any((values & xp.uint32(bit)) != 0, axis=1)

    kept = ~met(BIT_EXCLUDE)
    if n_waypoints:
        hit = [met(1 << (WAYPOINT_SHIFT + i)) for i in range(n_waypoints)]
        both = hit[0].copy()
        for h in hit[1:]:
            both = both & h if params.waycond == "AND" else both | h
        kept &= both
    return kept


def _opening(field_, bits, seeds, params, positions, n_waypoints, device, chunk, device_field, cancelled, timings):
    """What :func:`trace_paths` and :func:`trace_kept` start with: (backend, run positions (int64),
    their seed voxel numbers, the chunks of :func:`_chunks`)."""
    backend = get_backend(device)
    positions = np.asarray(positions, dtype=np.int64)
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    _, seed_of = streamline_ids(0, 0, len(seeds), params.n_samples, positions)
    chunk = _chunk_size(backend, bits, len(seeds), params, chunk)
    parts = _chunks(
        field_, bits, seeds, params, positions, n_waypoints, backend, chunk, device_field, cancelled, timings
    )
    return backend, positions, seed_of, parts


def _chunks(field_, bits, seeds, params, positions, n_waypoints, backend, chunk, device_field, cancelled, timings):
    """Per chunk of ``positions``: (polyline positions, used, float32 points, kept), arrays of the
    backend (CuPy on a GPU). On the CPU the steps are recorded by the compiled loop when numba is
    installed (:func:`gpu.probabilistic_host.track_on_host`: the reference's steps bit for bit),
    else by the NumPy reference."""
    xp = backend.xp
    ids, _ = streamline_ids(0, 0, len(seeds), params.n_samples, positions)
    tracker = None
    device_bits = xp.asarray(np.ascontiguousarray(bits, dtype=np.uint32))
    for start in range(0, len(positions), chunk):
        if cancelled is not None and cancelled():
            raise Cancelled()
        part = positions[start : start + chunk]
        t0 = time.perf_counter()
        if backend.is_gpu:
            if tracker is None:
                tracker = KernelTracker(
                    backend, field_, bits, seeds, params, 0, n_waypoints, max_batch=chunk, device_field=device_field
                )
            trace = xp.zeros((len(part), 2, params.n_steps + 1, 4))
            tracker.launch(0, len(part), trace, xp.asarray(ids[start : start + chunk]))
            first, second = trace[:, 0], trace[:, 1]
            backend.synchronize()
        else:
            _, (first, second) = probabilistic_host.track_on_host(
                field_, bits, seeds, params, 0, n_waypoints, record=True, positions=part
            )
        t1 = time.perf_counter()
        positions_xyz, used = polylines_of(xp, first, second)
        del first, second
        trace = None  # its memory goes back to the pool
        points = positions_xyz.astype(xp.float32)
        del positions_xyz
        kept = kept_of(xp, points, used, device_bits, params, n_waypoints)
        backend.synchronize()
        if timings is not None:
            timings["trace_s"] = timings.get("trace_s", 0.0) + t1 - t0
            timings["polylines_s"] = timings.get("polylines_s", 0.0) + time.perf_counter() - t1
        yield start, part, points, used, kept


def _to_host(backend, points, used, timings) -> tuple[np.ndarray, np.ndarray]:
    """(float32 points (P, 3), points per polyline) of the polylines ``points[used]``, on the host."""
    t0 = time.perf_counter()
    counts = backend.to_host(used.sum(axis=1)).astype(np.int64)
    flat = backend.to_host(points[used]) if len(counts) else np.zeros((0, 3), np.float32)
    if timings is not None:
        timings["to_host_s"] = timings.get("to_host_s", 0.0) + time.perf_counter() - t0
    return np.asarray(flat, dtype=np.float32).reshape(-1, 3), counts


def _chunk_size(backend, bits, n_seeds: int, params: ProbParams, chunk: int | None) -> int:
    if chunk:
        return chunk
    if backend.is_gpu:
        return max(1, min(GPU_TRACE_CHUNK, backend.free_memory_bytes() // 8 // trace_bytes_per_streamline(params)))
    return probabilistic_host.trace_chunk(params) if probabilistic_host.available() else numpy_batch(bits, n_seeds)


def trace_paths(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    positions: np.ndarray,
    *,
    n_waypoints: int = 0,
    device="auto",
    chunk: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    device_field=None,
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The streamlines at run positions ``positions`` as polylines (voxel coordinates, float32), the
    same steps as the run's (same random streams): (polylines, seed voxel numbers, kept: not
    excluded and meeting the waypoint condition, as the run decides). ``device_field``: the field
    already on the GPU (:func:`gpu.probabilistic.iter_track`'s), not copied again."""
    backend, positions, seed_of, parts = _opening(
        field_, bits, seeds, params, positions, n_waypoints, device, chunk, device_field, cancelled, None
    )
    lines: list[np.ndarray] = []
    kept_all = np.zeros(len(positions), dtype=bool)
    for start, part, points, used, kept in parts:
        flat, counts = _to_host(backend, points, used, None)
        lines += np.split(flat, np.cumsum(counts)[:-1]) if len(counts) else []
        kept_all[start : start + len(part)] = backend.to_host(kept)
        if progress is not None:
            progress(start + len(part), len(positions))
    return lines, seed_of, kept_all


def trace_kept(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    positions: np.ndarray,
    *,
    most_kept: int | None = None,
    n_waypoints: int = 0,
    device="auto",
    chunk: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    device_field=None,
    timings: dict | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The kept streamlines among those at run positions ``positions`` (:func:`trace_paths`'
    polylines, in the same order), the first ``most_kept`` of them when given (tracing stops
    once they are found): (float32 points (P, 3), offsets (S + 1,), seed voxel numbers (S,),
    streamlines traced). Only the kept polylines' points leave the device. ``timings``: seconds
    added under 'trace_s' (tracing), 'polylines_s' (polylines and the kept test) and
    'to_host_s' (the copy of the kept points)."""
    backend, positions, seed_of, parts = _opening(
        field_, bits, seeds, params, positions, n_waypoints, device, chunk, device_field, cancelled, timings
    )
    most_kept = len(positions) if most_kept is None else int(most_kept)
    flats, counts_all, seeds_kept = [], [], []
    found = traced = 0
    for start, part, points, used, kept in parts:
        traced = start + len(part)
        rows = np.flatnonzero(backend.to_host(kept))[: max(0, most_kept - found)]
        if len(rows):
            take = backend.xp.asarray(rows)
            flat, counts = _to_host(backend, points[take], used[take], timings)
            flats.append(flat)
            counts_all.append(counts)
            seeds_kept.append(seed_of[start + rows])
            found += len(rows)
        if progress is not None:
            progress(traced, len(positions))
        if found >= most_kept:
            break
    counts = np.concatenate(counts_all) if counts_all else np.zeros(0, np.int64)
    points = np.concatenate(flats) if flats else np.zeros((0, 3), np.float32)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    seeds_out = np.concatenate(seeds_kept) if seeds_kept else np.zeros(0, np.int64)
    return points, offsets, seeds_out, traced
