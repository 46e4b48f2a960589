"""Probabilistic tracking split across GPUs (or, to check it, across shares of one device, or
simulated GPUs on the CPU: :func:`gpu.multidevice.simulated_backends`).

Run positions ``0 .. seeds × samples`` are handed out in chunks as the devices ask for them
(:func:`gpu.multidevice.run_shared`); each device tracks its chunks with its own
:class:`gpu.probabilistic_kernel.KernelTracker` (the NumPy reference on a CPU backend), on
:data:`GPU_LANES` streams in turn, keeping the totals on the device. When the queue has nothing
left for a device, it hands its totals in at once: copied back and added on the host
(:class:`gpu.multidevice_copy.HostSums`) while the others still compute. The field of samples
is uploaded in parts, one per device, all at once, and each device takes the parts it lacks from
the others (:class:`gpu.multidevice_copy.ShardedUpload`), while its tracker is set up beside
the copy. A streamline's random numbers depend only on its number, and the totals are integers
added in their own types, so the sum is the single-device result bit for bit: path
distribution, waytotal, seed × target counts, seed matrix, steps.

Each device's stages are timed (``provenance["devices"]``, see :func:`track_split`) with its
timeline, so a run's tracking time can be attributed: the slowest device's opening, compute and
finish, then the ``merge_s`` (the result made from the host sums).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from .backend import Backend, Cancelled
from .multidevice import ShareReport, memory_peaks, run_shared
from .multidevice_copy import HostSums, ShardedUpload
from .probabilistic_kernel import KernelTracker
from .probabilistic_numpy import track_numpy
from .probabilistic_params import GPU_BATCH, NUMPY_BITMAP_BYTES, ProbParams, ProbResult, SampleField

#: The smallest chunk handed to a GPU at the end of a run (smaller ones cost more in launches
#: than they save in balance: a launch of few streamlines lasts as long as its longest one, the
#: device nearly idle; 2^20 streamlines are about 45 ms of an H100's work, four times the threads
#: it keeps resident).
GPU_SMALLEST_CHUNK = 1 << 20
#: Streams each GPU's tracker runs its chunks on, in turn (:class:`gpu.probabilistic_kernel.KernelTracker`
#: lanes): with two, a chunk's longest streamlines no longer leave the device idle at its end.
GPU_LANES = 2


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
    """A GPU's part: its context, its copy of the field (:class:`ShardedUpload`, filled on a thread
    of its own while the tracker is set up beside it), a tracker whose totals stay on the device
    until :meth:`finish` hands them in to the host sums."""

    def __init__(self, backend: Backend, report: ShareReport, upload: ShardedUpload, sums: HostSums, args: dict,
                 largest: int, lanes: int):  # fmt: skip
        self.backend, self.sums, self.report = backend, sums, report
        filling = None
        try:
            t0 = time.perf_counter()
            backend.xp.zeros(1)  # the device's context
            backend.synchronize()
            t1 = time.perf_counter()
            arrays = upload.allocate(backend)
            failed: list[BaseException] = []

            def fill() -> None:
                try:
                    with backend.activate():
                        upload.fill(backend, report.index, arrays)
                except BaseException as exc:  # raised in the share's thread below
                    failed.append(exc)

            filling = threading.Thread(target=fill, name=f"tractlens-upload{report.index}", daemon=True)
            filling.start()
            self.tracker = KernelTracker(backend, device_field=arrays, max_batch=largest, lanes=lanes, **args)
            self.tracker.time_launches()
            backend.xp.cuda.get_current_stream().synchronize()  # its own work, not the copies beside it
            t2 = time.perf_counter()
        except BaseException:
            upload.give_up(report.index)  # nobody waits for this share's part
            raise
        finally:
            if filling is not None:
                filling.join()
        if failed:
            raise failed[0]
        t3 = time.perf_counter()
        report.add("start", t1 - t0)
        for stage, seconds in upload.seconds[report.index].items():
            report.add(stage, seconds)
        report.add("setup", t2 - t1)
        for part, seconds in self.tracker.setup_s.items():
            report.add(f"setup_{part}", seconds)
        report.add("field_wait", t3 - t2)  # the tracker was ready, the field not yet

    def launch(self, start: int, count: int):
        return self.tracker.launch(start, count)

    def finish(self):
        """Wait for the device, hand the totals in (added on the host) and start them afresh."""
        t0 = time.perf_counter()
        self.backend.synchronize()
        t1 = time.perf_counter()
        host = [self.backend.to_host(a) for a in self.tracker.device_totals()]
        streamlines = self.tracker.streamlines
        t2 = time.perf_counter()
        self.report.chunk_s.extend(self.tracker.launch_seconds())
        self.tracker.time_launches()
        self.tracker.reset_totals()
        self.sums.add(host, streamlines)
        t3 = time.perf_counter()
        self.report.add("drain", t1 - t0)  # the last chunks still running when the queue ran dry
        self.report.add("copy_back", t2 - t1)
        self.report.add("host_add", t3 - t2)
        return self.tracker


class _NumpyShare:
    """A CPU backend's part (the reference tracker), batch by batch, summed on the host."""

    def __init__(self, backend: Backend, args: dict, batch: int, stop: Callable[[], bool], sums: HostSums):
        self.backend, self.args, self.batch, self.stop, self.sums = backend, args, batch, stop, sums
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
        """Hand this share's totals in (paths, seed × target counts, waytotal, steps, seed
        matrix) and start afresh."""
        a = self.args
        part = sum_results(self.parts, a["field_"].shape, len(a["seeds"]), a["n_targets"])
        self.parts = []
        totals = [part.paths, part.seed_targets, np.int64(part.waytotal), np.int64(part.steps), part.seed_matrix]
        self.sums.add([np.asarray(t) if t is not None else None for t in totals], part.streamlines)
        return part


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
    smallest_chunk: int | None = None,
    lanes: int = GPU_LANES,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    keep_going: bool = True,
) -> ProbResult:
    """Every streamline of every seed voxel, shared out over ``backends`` (one host thread
    each); ``progress(done, total)`` counts all shares; :class:`Cancelled` when ``cancelled``.
    ``batch_streamlines``: the largest chunk (the engine's batch by default); ``smallest_chunk``:
    the smallest (:data:`GPU_SMALLEST_CHUNK` on a GPU); ``lanes``: streams per GPU
    (:data:`GPU_LANES`). A device that fails is named (:class:`gpu.multidevice.DeviceFailure`);
    with ``keep_going`` its share is tracked on the others and ``provenance["notes"]`` says so,
    else the failure is raised.

    ``provenance``: ``devices`` (each device's stages in seconds: start, upload, gather_wait,
    gather, setup, field_wait, open, compute, drain, copy_back, host_add, finish; its
    ``timeline_s``: when it was ready, when its last chunk was done and when its totals were in,
    from the run's start; on a GPU its ``chunk_s``: each chunk's streamlines and device seconds), ``merge_s`` (after the last device's totals were in: the result made
    from the sums), ``shared_tracking_s`` and each device's memory-pool peak."""
    seeds = np.ascontiguousarray(np.asarray(seeds, dtype=np.int64).reshape(-1, 3))
    total = len(seeds) * params.n_samples
    on_gpu = backends[0].is_gpu
    if on_gpu:
        largest = min(batch_streamlines or GPU_BATCH, max(1, total))
        smallest = min(largest, smallest_chunk or GPU_SMALLEST_CHUNK)
    else:
        largest = batch_streamlines or max(1, NUMPY_BITMAP_BYTES // int(np.prod(field_.shape)))
        smallest = max(1, min(largest, smallest_chunk or total // (8 * len(backends)) or 1))
    upload = ShardedUpload((field_.dirs, field_.f, field_.index), len(backends)) if on_gpu else None
    sums = HostSums()
    stop = [cancelled or (lambda: False)]

    def open_share(backend: Backend, report: ShareReport):
        if backend.is_gpu:
            kernel_args = {"field_": field_, "bits": bits, "seeds": seeds, "params": params, "n_targets": n_targets,
                           "n_waypoints": n_waypoints, "seed_matrix": seed_matrix}  # fmt: skip
            return _KernelShare(backend, report, upload, sums, kernel_args, largest, lanes)
        args = {"field_": field_, "bits": bits, "seeds": seeds, "params": params, "n_targets": n_targets,
                "n_waypoints": n_waypoints, "seed_matrix": seed_matrix}  # fmt: skip
        return _NumpyShare(backend, args, largest, stop[0], sums)

    t0 = time.perf_counter()
    try:
        shared = run_shared(backends, total, open_share, largest=largest, smallest=smallest, cancelled=cancelled,
                            progress=progress, keep_going=keep_going, finish_early=True,
                            in_flight=lanes + 1 if on_gpu else 2)  # fmt: skip
    finally:
        if upload is not None:
            upload.release()
    tracking_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    if on_gpu:
        tracker = shared.totals[0]
        with shared.backends[0].activate():
            result = tracker._result(tuple(sums.sums), sums.count)
    else:
        paths, seed_targets, waytotal, steps, matrix = sums.sums
        result = ProbResult(paths, int(waytotal), seed_targets, sums.count, {}, int(steps), matrix)
    merge_s = time.perf_counter() - t1
    result.provenance.update(
        devices=[r.as_dict() for r in shared.reports],
        merge_s=round(merge_s, 4),
        shared_tracking_s=round(tracking_s, 4),
        device_pool_peak_bytes=memory_peaks(backends),
        params=vars(params).copy(),
        lanes=lanes if on_gpu else None,
        chunk_sizes={"largest": largest, "smallest": smallest},
        notes=shared.notes,
    )
    return result
