"""Probabilistic tracking split across GPUs (or, to check it, across shares of one device, or
simulated GPUs on the CPU: :func:`gpu.multidevice.simulated_backends`).

Run positions ``0 .. seeds × samples`` are handed out in chunks as the devices ask for them
(:func:`gpu.multidevice.run_shared`); each device tracks its chunks with its own
:class:`gpu.probabilistic.KernelTracker` (the NumPy reference on a CPU backend), keeping the
totals on the device, and at the end the totals are added on the first GPU (peer copies) and
read once. The field of samples is uploaded once and copied to the other GPUs
(:class:`gpu.multidevice_copy.Broadcast`). A streamline's random numbers depend only on its
number, so the sum is the single-device result bit for bit: path distribution, waytotal,
seed × target counts, seed matrix, steps.

Each device's stages are timed (``provenance["devices"]``): ``start`` (its CUDA context),
``upload`` (the field: from the host or a peer), ``setup`` (the tracker: kernel load, totals,
visited-voxel sets), ``compute`` (its chunks), ``finish``; and the run's ``merge_s`` (the
reduction on the first GPU and the copy of the totals to the host).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .backend import Backend, Cancelled
from .multidevice import ShareReport, memory_peaks, run_shared
from .multidevice_copy import Broadcast, reduce_to_first
from .probabilistic_kernel import KernelTracker
from .probabilistic_numpy import track_numpy
from .probabilistic_params import GPU_BATCH, NUMPY_BITMAP_BYTES, ProbParams, ProbResult, SampleField

#: The smallest chunk handed to a GPU at the end of a run (smaller ones cost more in launches
#: than they save in balance).
GPU_SMALLEST_CHUNK = 1 << 18


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


class _KernelShare:
    """A GPU's part: its context, the field (broadcast), a tracker whose totals stay on it."""

    def __init__(self, backend: Backend, report: ShareReport, broadcast: Broadcast, args: dict, largest: int):
        t0 = time.perf_counter()
        backend.xp.zeros(1)  # the device's context
        backend.synchronize()
        t1 = time.perf_counter()
        arrays = broadcast.get(backend)
        t2 = time.perf_counter()
        self.tracker = KernelTracker(backend, device_field=arrays, max_batch=largest, **args)
        backend.synchronize()
        t3 = time.perf_counter()
        report.add("start", t1 - t0)
        report.add("upload", t2 - t1)
        report.add("setup", t3 - t2)
        self.backend = backend

    def launch(self, start: int, count: int) -> None:
        self.tracker.launch(start, count)

    def finish(self):
        self.backend.synchronize()
        return self.tracker


class _NumpyShare:
    """A CPU backend's part (the reference tracker), batch by batch, summed on the host."""

    def __init__(self, backend: Backend, args: dict, batch: int, stop: Callable[[], bool]):
        self.backend, self.args, self.batch, self.stop = backend, args, batch, stop
        self.parts: list[ProbResult] = []

    def launch(self, start: int, count: int) -> None:
        a = self.args
        for first in range(start, start + count, self.batch):
            if self.stop():
                raise Cancelled()
            n = min(self.batch, start + count - first)
            self.parts.append(
                track_numpy(a["field_"], a["bits"], a["seeds"], a["params"], a["n_targets"], a["n_waypoints"],
                            first, n, seed_matrix=a["seed_matrix"])
            )  # fmt: skip

    def finish(self):
        a = self.args
        result = sum_results(self.parts, a["field_"].shape, len(a["seeds"]), a["n_targets"])
        self.parts = [result]
        return result


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
    keep_going: bool = True,
) -> ProbResult:
    """Every streamline of every seed voxel, shared out over ``backends`` (one host thread
    each); ``progress(done, total)`` counts all shares; :class:`Cancelled` when ``cancelled``.
    ``batch_streamlines``: the largest chunk (the engine's batch by default). A device that
    fails is named (:class:`gpu.multidevice.DeviceFailure`); with ``keep_going`` its share is
    tracked on the others and ``provenance["notes"]`` says so, else the failure is raised."""
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    total = len(seeds) * params.n_samples
    args = {"field_": field_, "bits": bits, "seeds": seeds, "params": params, "n_targets": n_targets,
            "n_waypoints": n_waypoints, "seed_matrix": seed_matrix}  # fmt: skip
    on_gpu = backends[0].is_gpu
    if on_gpu:
        largest = min(batch_streamlines or GPU_BATCH, max(1, total))
        smallest = min(largest, GPU_SMALLEST_CHUNK)
    else:
        largest = batch_streamlines or max(1, NUMPY_BITMAP_BYTES // int(np.prod(field_.shape)))
        smallest = max(1, min(largest, total // (8 * len(backends)) or 1))
    broadcast = Broadcast((field_.dirs, field_.f, field_.index))
    stop = [lambda: False]

    def open_share(backend: Backend, report: ShareReport):
        if backend.is_gpu:
            return _KernelShare(backend, report, broadcast, args, largest)
        return _NumpyShare(backend, args, largest, stop[0])

    if cancelled is not None:
        stop[0] = cancelled
    t0 = time.perf_counter()
    shared = run_shared(backends, total, open_share, largest=largest, smallest=smallest, cancelled=cancelled,
                        progress=progress, keep_going=keep_going)  # fmt: skip
    broadcast.release()
    tracking_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if on_gpu:
        trackers = shared.totals
        sums = reduce_to_first(shared.backends, [t.totals for t in trackers])
        with shared.backends[0].activate():
            result = trackers[0]._result(sums, sum(t.streamlines for t in trackers))
    else:
        result = sum_results(shared.totals, field_.shape, len(seeds), n_targets)
        result.provenance = {}
    merge_s = time.perf_counter() - t1
    result.provenance.update(
        devices=[vars(r) for r in shared.reports],
        merge_s=round(merge_s, 4),
        shared_tracking_s=round(tracking_s, 4),
        device_pool_peak_bytes=memory_peaks(backends),
        params=vars(params).copy(),
        notes=shared.notes,
    )
    return result
