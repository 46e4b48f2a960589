"""Probabilistic tracking on the GPU: the CUDA kernel ``kernels/probabilistic.cu`` (one thread
per streamline) and :class:`KernelTracker`, which owns its launch configuration and device memory
(the field, the running totals, the per-streamline sets of visited voxels) across the batches of
a run. :mod:`gpu.probabilistic_numpy` is the reference it matches."""

from __future__ import annotations

import functools
import time

import numpy as np

from . import cuda
from .backend import OutOfDeviceMemory
from .probabilistic_params import (
    BIT_BRAIN,
    BIT_EXCLUDE,
    BIT_STOP,
    P_EULER,
    P_RANDFIB,
    P_START,
    P_STEP,
    TARGET_SHIFT,
    WAYPOINT_SHIFT,
    ProbParams,
    ProbResult,
    SampleField,
    check_seed_matrix,
)
from .rng import seed_key
from .transfer import empty_pinned, to_device


def kernel_defines(seed_matrix: bool = False, visit_list: bool = False) -> tuple[tuple[str, int], ...]:
    """What kernels/probabilistic.cu receives at compile time: the mask bits, the stream
    purposes, whether the seed × seed matrix is counted (it costs registers) and whether
    kept streamlines list their voxels (the connectome modes, :mod:`gpu.connectome`)."""
    return (
        ("BIT_BRAIN", BIT_BRAIN),
        ("BIT_EXCLUDE", BIT_EXCLUDE),
        ("BIT_STOP", BIT_STOP),
        ("TARGET_SHIFT", TARGET_SHIFT),
        ("P_STEP", P_STEP),
        ("P_START", P_START),
        ("P_EULER", P_EULER),
        ("P_RANDFIB", P_RANDFIB),
        ("SEED_MATRIX", int(seed_matrix)),
        ("VISIT_LIST", int(visit_list)),
    )


def kernel_function(seed_matrix: bool = False, visit_list: bool = False):
    """The compiled ``prob_track`` kernel."""
    return cuda.function("probabilistic.cu", "prob_track", ("philox.cuh",), kernel_defines(seed_matrix, visit_list))


#: Slots of a thread's visited-voxel set in the first pass (8 bytes each, plus 4 for the
#: member list when streamlines are kept only at their end). A streamline with more than
#: 3/4 as many distinct voxels (3072: ~4 m of path at 1.25 mm, near the 4001 that 2 × 2000
#: steps allow) is run again with a set large enough for any streamline. Such reruns are
#: long and run after the rest of their batch, so they are kept rare (with 2048 slots the
#: benchmark field reran ~35 per million streamlines and ran at 11.1 M/s, with 4096 none and
#: 11.6 M/s on an H100).
SET_SLOTS = 4096


def set_sizes(params: ProbParams, slots: int = SET_SLOTS) -> tuple[int, int, int]:
    """(slots, member limit) of the first pass and the slots of the second: every step enters
    at most one new voxel, so a streamline has at most ``2 n_steps + 1`` distinct voxels; the
    second pass holds that many at a load of at most 1/2."""
    most = 2 * params.n_steps + 1
    full = 1 << int(np.ceil(np.log2(2 * most)))
    if full <= slots:
        return full, most, full
    return slots, slots * 3 // 4, full


@functools.cache
def _device_properties(cp, device: int) -> dict:
    return cp.cuda.runtime.getDeviceProperties(device)  # asked once per device: the driver gathers every property


def _resident_threads(cp, kernel, block: int) -> int:
    """Threads the device runs at once with this kernel (persistent threads: no more are useful)."""
    props = _device_properties(cp, int(cp.cuda.Device().id))
    try:
        per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, block, 0)
    except Exception:  # an older CuPy: assume a full SM
        per_sm = props["maxThreadsPerMultiProcessor"] // block
    return max(1, per_sm) * block * props["multiProcessorCount"]


class _Lane:
    """A stream's part of a tracker (:class:`KernelTracker`): its threads' visited-voxel sets, the
    counters of its launches and their overflow list (two launches at once need their own)."""

    def __init__(self, stream):
        self.stream = stream  # None: the current stream
        self.threads, self.tables, self.lists = 0, None, None
        self.rerun_threads, self.rerun_tables, self.rerun_lists = 0, None, None
        self.counters = self.rerun_counters = self.overflow_ids = None
        self.stamp_base = self.rerun_stamp = 0


class KernelTracker:
    """The kernel's state on the device for one run: the field, masks and seeds, the running
    totals, and each thread's visited-voxel set, kept between launches.

    :meth:`launch` queues the streamlines at run positions ``first .. first + count`` on the
    current stream without waiting: the first pass, then a second pass over the
    streamlines that outgrew their sets (its count is read on the device). The totals
    accumulate on the device; :meth:`result` reads them, :meth:`snapshot` copies them
    asynchronously (see :func:`gpu.probabilistic.iter_track`).
    """

    BLOCK = 128

    def __init__(
        self,
        backend,
        field_: SampleField,
        bits,
        seeds,
        params: ProbParams,
        n_targets: int = 0,
        n_waypoints: int = 0,
        *,
        max_batch: int,
        device_field=None,
        set_slots: int = SET_SLOTS,
        threads: int | None = None,
        seed_matrix: bool = False,
        visit_list: bool = False,
        lanes: int = 1,
    ):
        cp = self.cp = backend.xp
        t0 = time.perf_counter()
        self.backend, self.field, self.params = backend, field_, params
        self.n_seeds, self.n_targets = len(seeds), n_targets
        self.kernel = kernel_function(seed_matrix, visit_list)
        self.visit_list, self.visit_buffers = visit_list, None
        try:
            self.arrays = device_field or upload_field(backend, field_)
        except Exception as exc:
            if not backend.is_out_of_memory(exc):
                raise
            backend.free_cached_memory()
            size = (field_.dirs.nbytes + field_.f.nbytes + field_.index.nbytes) / 2**30
            raise OutOfDeviceMemory(
                f"the posterior samples ({size:.1f} GiB) do not fit in the free memory of {backend.device_name} "
                f"({backend.free_memory_bytes() / 2**30:.1f} GiB)"
            ) from exc
        self.bits = cp.ascontiguousarray(cp.asarray(bits, dtype=cp.uint32))
        self.seeds = cp.ascontiguousarray(cp.asarray(seeds, dtype=cp.int32))  # argwhere gives F order
        self.paths = cp.zeros(int(np.prod(field_.shape)), dtype=cp.uint64)
        self.seed_targets = cp.zeros((self.n_seeds, max(n_targets, 1)), dtype=cp.uint64)
        self.seed_number = self.seed_matrix = None
        if seed_matrix:
            check_seed_matrix(self.n_seeds)
            number = np.full(field_.shape, -1, dtype=np.int32)
            number[tuple(np.asarray(seeds).T)] = np.arange(self.n_seeds, dtype=np.int32)
            self.seed_number = cp.asarray(number)
            self.seed_matrix = cp.zeros((self.n_seeds, self.n_seeds), dtype=cp.uint32)
        self.waymask = sum(1 << (WAYPOINT_SHIFT + i) for i in range(n_waypoints))
        # Kept for sure (no waypoints, no exclusion voxel): count visits as they happen. A visit
        # list needs the member lists, which only the counting at the end keeps.
        self.immediate = not visit_list and self.waymask == 0 and not bool((self.bits & BIT_EXCLUDE).any())
        self.slots, self.limit, self.full = set_sizes(params, set_slots)
        t1 = time.perf_counter()
        self.resident = threads or _resident_threads(cp, self.kernel, self.BLOCK)  # loads the kernel on the device
        t2 = time.perf_counter()
        self.max_batch = max(1, int(max_batch))
        # One lane runs on the current stream. Several run on streams of their own, in turn, so
        # a chunk starts while the previous one's last (longest) streamlines still run: a
        # launch's tail no longer leaves the device idle (the split run's chunks).
        if lanes < 1:
            raise ValueError(f"at least one lane is needed, got {lanes}")
        streams = [None] if lanes == 1 else [cp.cuda.Stream(non_blocking=True) for _ in range(lanes)]
        self.lanes = [self._lane(stream) for stream in streams]
        if lanes > 1:  # the lanes' streams start after this set-up (queued on the current stream)
            ready = cp.cuda.get_current_stream().record()
            for lane in self.lanes:
                lane.stream.wait_event(ready)
        t3 = time.perf_counter()
        #: host seconds of the set-up's parts (device work queued, not waited for): inputs and
        #: totals, the kernel loaded on the device, the lanes' visited-voxel sets
        self.setup_s = {"arrays": round(t1 - t0, 4), "kernel": round(t2 - t1, 4), "sets": round(t3 - t2, 4)}
        self.turn = 0
        self.launch_events: list | None = None  # (count, start, end) CUDA events: time_launches()
        self.threads = self.lanes[0].threads
        self.counters, self.rerun_counters = self.lanes[0].counters, self.lanes[0].rerun_counters
        self.totals = (self.paths, self.seed_targets, self.counters, self.rerun_counters)
        self.totals += (self.seed_matrix,) if seed_matrix else ()
        self.streamlines = 0

    def _lane(self, stream) -> _Lane:
        """A lane's visited-voxel sets (at most a quarter of the free memory), counters and
        overflow list."""
        cp = self.cp
        lane = _Lane(stream)
        lane.counters = cp.zeros(4, dtype=cp.uint64)  # kept, abandoned in the last launch, in all, steps
        lane.rerun_counters = cp.zeros(4, dtype=cp.uint64)  # the second passes' (abandoned: never)
        budget = self.backend.free_memory_bytes() // 4
        whole = -(-self.max_batch // self.BLOCK) * self.BLOCK
        per_slot = 8 if self.immediate else 12
        lane.threads, lane.tables, lane.lists = self._sets(
            min(self.resident, whole, budget // (self.slots * per_slot)), self.slots
        )
        # The second pass's sets hold any streamline; few threads (few streamlines need them).
        if self.slots < self.full:
            most = min(self.resident, whole, 8192, budget // 2 // (self.full * per_slot))
            lane.rerun_threads, lane.rerun_tables, lane.rerun_lists = self._sets(most, self.full)
        lane.overflow_ids = cp.empty(self.max_batch, dtype=cp.uint64)
        return lane

    def _whole(self, threads: int) -> int:  # whole blocks: each thread owns a set
        return max(self.BLOCK, int(threads) // self.BLOCK * self.BLOCK)

    def _sets(self, threads: int, slots: int):
        """(threads, tables, member lists) of visited-voxel sets for up to ``threads`` threads;
        fewer (halving) when the device is out of memory."""
        cp, threads = self.cp, self._whole(threads)
        while True:
            try:
                tables = cp.zeros(threads * slots, dtype=cp.uint64)
                lists = None if self.immediate else cp.empty(threads * slots, dtype=cp.int32)
                return threads, tables, lists
            except Exception as exc:
                if not self.backend.is_out_of_memory(exc):
                    raise
                self.backend.free_cached_memory()
                if threads <= self.BLOCK:
                    raise OutOfDeviceMemory(
                        f"{self.backend.device_name} has no memory left for the tracking threads' visited-voxel sets"
                    ) from exc
                threads = self._whole(threads // 2)

    def _args(self, count, n_device, ids, first, cap, limit, stamp_base, rank_from, tables, lists, counters, trace,
              overflow_ids):  # fmt: skip
        p, cp = self.params, self.cp
        key0, key1 = seed_key(p.seed)
        null = np.uint64(0)
        return (
            *self.arrays,
            self.bits,
            self.seeds,
            np.int64(count),
            null if n_device is None else n_device,
            null if ids is None else ids,
            np.int64(first),
            np.int32(p.n_samples),
            np.int64(self.n_seeds),
            *(np.int32(v) for v in self.field.shape),
            np.int32(self.field.n_samples),
            np.int32(self.field.n_fibres),
            *(np.int32(v) for v in (p.n_steps, p.randfib, p.loopcheck, p.modeuler, cap, limit)),
            np.uint32(stamp_base),
            *(np.float64(v) for v in (*(p.step_mm / self.field.voxel_size), p.cthr, p.fibthresh)),
            np.uint32(key0),
            np.uint32(key1),
            np.int32(self.n_targets),
            np.uint32(self.waymask),
            np.int32(p.waycond == "AND"),
            np.int32(self.immediate),
            np.int32(rank_from),
            cp.zeros(1, dtype=cp.uint64),
            tables,
            null if lists is None else lists,
            self.paths,
            self.seed_targets,
            counters,
            overflow_ids,
            np.int64(len(overflow_ids)),
            null if self.seed_number is None else self.seed_number,
            null if self.seed_matrix is None else self.seed_matrix,
            null if trace is None else trace,
            *self._visit_args(),
        )

    def set_visit_buffers(self, sid, voxel, count) -> None:
        """Where a ``visit_list`` tracker's kept streamlines append (id, voxel) pairs: device
        arrays (capacity,) uint64 and int32, and a (1,) uint64 counter the caller zeroes."""
        self.visit_buffers = (sid, voxel, count)

    def _visit_args(self) -> tuple:
        if not self.visit_list:
            return ()
        if self.visit_buffers is None:
            raise ValueError("a visit-list tracker needs set_visit_buffers before a launch")
        sid, voxel, count = self.visit_buffers
        return sid, voxel, count, np.int64(len(sid))

    def launch(self, first: int, count: int, trace=None, ids=None):
        """Queue run positions ``first .. first + count`` (at most ``max_batch``), or the
        streamlines of ids ``ids`` (a device array of ``count``). ``trace``: a device array
        (count, 2, n_steps + 1, 4) to fill with their steps (one pass). With several lanes the
        launch goes to the next lane's stream and an event recorded after it is returned (None
        with one lane: it is on the current stream)."""
        if count > self.max_batch:
            raise ValueError("a launch larger than max_batch")
        lane = self.lanes[self.turn]
        self.turn = (self.turn + 1) % len(self.lanes)
        if lane.stream is None:
            began = self._timing_event()
            self._launch(lane, first, count, trace, ids)
            done = None
            if began is not None:
                self.launch_events.append((count, began, self.cp.cuda.get_current_stream().record()))
        else:
            with lane.stream:
                began = self._timing_event()
                self._launch(lane, first, count, trace, ids)
                done = lane.stream.record()
            if began is not None:
                self.launch_events.append((count, began, done))
        self.streamlines += count
        return done

    def _timing_event(self):
        return self.cp.cuda.get_current_stream().record() if self.launch_events is not None else None

    def time_launches(self) -> None:
        """Record two CUDA events around every launch from now on (:meth:`launch_seconds`)."""
        self.launch_events = []

    def launch_seconds(self) -> list[tuple[int, float]]:
        """(streamlines, device seconds) of each launch since :meth:`time_launches`, in order (wait
        for the device first). With several lanes a launch's seconds include the time it shared
        the device with the other lane's."""
        cp = self.cp
        return [(n, round(cp.cuda.get_elapsed_time(a, b) / 1000, 5)) for n, a, b in self.launch_events or ()]

    def _launch(self, lane: _Lane, first: int, count: int, trace, ids) -> None:
        cp = self.cp
        if lane.stamp_base + count >= 2**32 - 1:  # the stamps would wrap: start the sets afresh
            lane.tables.fill(0)
            lane.stamp_base = 0
        slots, limit = (self.full, 2 * self.params.n_steps + 1) if trace is not None else (self.slots, self.limit)
        tables = lane.tables if slots == self.slots else cp.zeros(lane.threads * slots, dtype=cp.uint64)
        lists = lane.lists if slots == self.slots or self.immediate else cp.empty_like(tables, dtype=np.int32)
        lane.counters[1:2].fill(0)
        threads = min(lane.threads, self._whole(-(-count // self.BLOCK) * self.BLOCK))
        args = (count, None, ids, first, slots, limit, lane.stamp_base, 0, tables, lists, lane.counters, trace,
                lane.overflow_ids)  # fmt: skip
        self.kernel((threads // self.BLOCK,), (self.BLOCK,), self._args(*args))
        lane.stamp_base += count
        # The streamlines that outgrew their sets, again with sets for any streamline, adding the
        # voxels from the one where the first pass stopped (counted as they came) or all of them.
        if trace is None and lane.rerun_tables is not None:
            if lane.rerun_stamp + count >= 2**32 - 1:
                lane.rerun_tables.fill(0)
                lane.rerun_stamp = 0
            rank_from = limit if self.immediate else 0
            args = (0, lane.counters[1:2], lane.overflow_ids, 0, self.full, self.full // 2, lane.rerun_stamp)
            args += (rank_from, lane.rerun_tables, lane.rerun_lists, lane.rerun_counters, None, lane.overflow_ids)
            self.kernel((lane.rerun_threads // self.BLOCK,), (self.BLOCK,), self._args(*args))
            lane.rerun_stamp += count

    def device_totals(self) -> tuple:
        """The running totals on the device, as :attr:`totals` (paths, seed × target counts,
        counters, second-pass counters[, seed matrix]), the lanes' counters added (queued on the
        current stream: wait for every lane first, e.g. ``backend.synchronize()``)."""
        if len(self.lanes) == 1:
            return self.totals
        counters, rerun = self.lanes[0].counters.copy(), self.lanes[0].rerun_counters.copy()
        for lane in self.lanes[1:]:
            counters += lane.counters
            rerun += lane.rerun_counters
        return (self.paths, self.seed_targets, counters, rerun, *self.totals[4:])

    def reset_totals(self) -> None:
        """Zero the running totals (once they were handed in: a split run's share then counts
        only what it tracks next) and wait for it."""
        for a in (self.paths, self.seed_targets, self.seed_matrix):
            if a is not None:
                a.fill(0)
        for lane in self.lanes:
            lane.counters.fill(0)
            lane.rerun_counters.fill(0)
        self.streamlines = 0
        self.backend.synchronize()

    def result(self, provenance: dict | None = None) -> ProbResult:
        """The totals so far (waits for the queued launches)."""
        if len(self.lanes) > 1:
            self.backend.synchronize()
        return self._result(self.device_totals(), self.streamlines, provenance)

    def _result(self, totals, streamlines, provenance=None) -> ProbResult:
        paths, seed_targets, counters, rerun, *matrix = (self.backend.to_host(a) for a in totals)
        if rerun[1]:
            raise RuntimeError("probabilistic kernel: a streamline outgrew the largest visited-voxel set")
        return ProbResult(
            paths.reshape(self.field.shape).astype(np.int64),
            int(counters[0] + rerun[0]),
            seed_targets[:, : self.n_targets].astype(np.int64),
            streamlines,
            {
                "set_slots": self.slots,
                "rerun_large_sets": int(counters[2]),
                "threads": self.threads,
                "lanes": len(self.lanes),
                "counting": "immediate" if self.immediate else "at end",
                **(provenance or {}),
            },
            steps=int(counters[3] + rerun[3]),
            seed_matrix=matrix[0].astype(np.int64) if matrix else None,
        )

    def snapshot(self, copy_stream, after=None):
        """Copy the totals, as they are once the queued launches are done, to pinned host memory
        on ``copy_stream`` (so the copy overlaps the next launch). Returns (ready event,
        function giving the :class:`ProbResult`)."""
        cp = self.cp
        if len(self.lanes) > 1:
            raise ValueError("a snapshot is taken of a tracker with one lane (on the current stream)")
        compute = cp.cuda.get_current_stream()
        if after is not None:  # the previous copy has finished reading the snapshot buffers
            compute.wait_event(after)
        if not hasattr(self, "_snap"):
            self._snap = [cp.empty_like(a) for a in self.totals]
            self._pinned = [[_pinned_like(a) for a in self._snap] for _ in range(2)]
            self._turn = 0
        for dst, src in zip(self._snap, self.totals, strict=True):
            dst[...] = src
        taken = compute.record()
        copy_stream.wait_event(taken)
        host = self._pinned[self._turn]
        self._turn ^= 1
        for dst, src in zip(host, self._snap, strict=True):
            cp.cuda.runtime.memcpyAsync(dst.ctypes.data, src.data.ptr, src.nbytes, 2, copy_stream.ptr)  # 2: D2H
        ready = copy_stream.record()
        streamlines = self.streamlines

        def result(provenance=None):
            ready.synchronize()
            return self._result(host, streamlines, provenance)

        return ready, result


def upload_field(backend, field_: SampleField) -> tuple:
    """The field's arrays (dirs, f, index) on the device, for :func:`gpu.probabilistic.iter_track`'s ``device_field``."""
    if not backend.is_gpu:
        return tuple(np.ascontiguousarray(a) for a in (field_.dirs, field_.f, field_.index))
    with backend.activate():
        return tuple(to_device(a) for a in (field_.dirs, field_.f, field_.index))


def _pinned_like(a):
    return empty_pinned(a.shape, a.dtype)


def track_kernel(
    backend,
    field_: SampleField,
    bits,
    seeds,
    params: ProbParams,
    n_targets=0,
    n_waypoints=0,
    first_id=0,
    count=None,
    *,
    threads=None,
    trace=False,
    device_field=None,
    set_slots=SET_SLOTS,
    seed_matrix=False,
):
    """:func:`gpu.probabilistic_numpy.track_numpy` as the CUDA kernel ``prob_track`` (one launch of a
    :class:`KernelTracker`). ``device_field``: the field's arrays already on the device (dirs,
    f, index); ``set_slots``: the first pass's set size (:func:`set_sizes`). Returns
    :class:`ProbResult` (and the (n, 2, n_steps + 1, 4) trace when ``trace``)."""
    n = len(seeds) * params.n_samples - first_id if count is None else count
    if n <= 0:
        empty = ProbResult(np.zeros(field_.shape, np.int64), 0, np.zeros((len(seeds), n_targets), np.int64), 0)
        return (empty, np.zeros((0, 2, params.n_steps + 1, 4))) if trace else empty
    tracker = KernelTracker(
        backend,
        field_,
        bits,
        seeds,
        params,
        n_targets,
        n_waypoints,
        max_batch=n,
        device_field=device_field,
        set_slots=set_slots,
        threads=threads,
        seed_matrix=seed_matrix,
    )
    tr = backend.xp.zeros((n, 2, params.n_steps + 1, 4)) if trace else None
    tracker.launch(first_id, n, tr)
    result = tracker.result()
    return (result, backend.to_host(tr)) if trace else result
