"""Probabilistic tracking split across GPUs (or, to check it, across shares of one device).

Run positions ``0 .. seeds × samples`` are cut into one contiguous range per backend
(:func:`gpu.multidevice.run_split`); each backend tracks its range in batches with its own
:class:`gpu.probabilistic.KernelTracker` (the NumPy reference on a CPU backend) and the totals
are summed on the host. A streamline's random numbers depend only on its number, so the sum is
the single-device result bit for bit: path distribution, waytotal, seed × target counts,
seed matrix, steps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from .backend import Backend, Cancelled
from .multidevice import run_split
from .probabilistic_kernel import KernelTracker
from .probabilistic_numpy import track_numpy
from .probabilistic_params import GPU_BATCH, NUMPY_BITMAP_BYTES, ProbParams, ProbResult, SampleField


def sum_results(parts: Sequence[ProbResult], shape, n_seeds: int, n_targets: int) -> ProbResult:
    """The totals of several runs over disjoint streamlines."""
    paths = np.zeros(shape, np.int64)
    seed_targets = np.zeros((n_seeds, n_targets), np.int64)
    matrix = None
    waytotal = streamlines = steps = 0
    for p in parts:
        paths += p.paths
        seed_targets += p.seed_targets
        waytotal += p.waytotal
        streamlines += p.streamlines
        steps += p.steps
        if p.seed_matrix is not None:
            matrix = p.seed_matrix.copy() if matrix is None else matrix + p.seed_matrix
    return ProbResult(paths, waytotal, seed_targets, streamlines, {}, steps, matrix)


def track_split(
    field_: SampleField,
    bits: np.ndarray,
    seeds: np.ndarray,
    params: ProbParams,
    backends: Sequence[Backend],
    *,
    n_targets: int = 0,
    n_waypoints: int = 0,
    seed_matrix: bool = False,
    batch_streamlines: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ProbResult:
    """Every streamline of every seed voxel, shared out over ``backends`` (one host thread
    each); ``progress(done, total)`` counts all shares; :class:`Cancelled` when ``cancelled``."""
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    total = len(seeds) * params.n_samples
    done = [0]
    lock = threading.Lock()

    def advance(count: int) -> None:
        with lock:
            done[0] += count
            now = done[0]
        if progress is not None:
            progress(now, total)

    def work(backend: Backend, start: int, count: int, stop) -> tuple[ProbResult, dict]:
        if backend.is_gpu:
            batch = min(batch_streamlines or GPU_BATCH, count)
            tracker = KernelTracker(
                backend, field_, bits, seeds, params, n_targets, n_waypoints, max_batch=batch, seed_matrix=seed_matrix
            )
        else:
            batch = batch_streamlines or max(1, NUMPY_BITMAP_BYTES // int(np.prod(field_.shape)))
        parts = []
        for first in range(start, start + count, batch):
            if stop():
                raise Cancelled()
            n = min(batch, start + count - first)
            if backend.is_gpu:
                tracker.launch(first, n)
                backend.synchronize()  # so that progress means work done
            else:
                parts.append(
                    track_numpy(field_, bits, seeds, params, n_targets, n_waypoints, first, n, seed_matrix=seed_matrix)
                )
            advance(n)
        result = tracker.result() if backend.is_gpu else sum_results(parts, field_.shape, len(seeds), n_targets)
        return result, {"device": backend.device_name, "first": start, "streamlines": count}

    shares = run_split(backends, total, work, cancelled=cancelled)
    result = sum_results([r for r, _ in shares], field_.shape, len(seeds), n_targets)
    result.provenance = {"devices": [info for _, info in shares], "params": vars(params).copy()}
    return result
