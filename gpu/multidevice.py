"""One piece of work split across the GPUs of a host.

The trackers number their streamlines and draw every streamline's random numbers from its own
counter-based stream (Philox, keyed by the streamline's number), so a range of numbers tracked
on one GPU gives exactly what the same range gives inside a run on one GPU. Any split of the
numbers into disjoint ranges, tracked anywhere and summed, therefore equals the single-GPU run
bit for bit for every count (path distributions, target counts, matrices are integers).

:func:`run_shared` hands the ranges out as they are asked for (guided self-scheduling: large
chunks first, smaller ones towards the end, so the devices finish together whatever each chunk
costs), one host thread per device with its device current (:meth:`Backend.activate`); CuPy keeps
the current device per thread, compiles each kernel once per device and allocates from a pool
per device. Each device keeps its running totals until it finishes (with ``finish_early``, as
soon as the queue is empty for it, while the others still compute); nothing goes through NCCL (so
none of its NVLink multicast is involved): the totals are reduced by peer copies or added on the
host (:mod:`gpu.multidevice_copy`).

A device that fails (out of memory, a lost device, any error) is named in a
:class:`DeviceFailure` ("GPU 2 (NVIDIA H100 80GB HBM3): out of memory while tracking"). With
``keep_going`` its whole share (its totals went with it) is tracked again on the others and the
run finishes there, with a note; otherwise the others stop at their next chunk and the failure
is raised once every thread has ended. No thread is left behind either way.

A list of CPU backends (:func:`simulated_backends`) runs the same code path on NumPy, so the
split, the scheduling, the failures and the merge are tested without a GPU.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .backend import Backend, BackendError, Cancelled, gpu_count
from .multidevice_copy import enable_peer_access
from .transfer import prepare_staging

T = TypeVar("T")


# --------------------------------------------------------------------------- naming and failures


def device_label(backend: Backend) -> str:
    """``GPU 2 (NVIDIA H100 80GB HBM3)`` for a GPU; a CPU backend's own name."""
    if not backend.is_gpu:
        return backend.device_name
    model = backend.device_name.split(" (GPU ")[0]
    return f"GPU {backend.device_id} ({model})"


def simulated_backends(n: int) -> list[Backend]:
    """``n`` NumPy backends named like GPUs (``GPU i (simulated on the CPU)``): the multi-GPU
    code path (split, scheduling, failures, merge) on a machine without one."""
    import numpy

    return [Backend("cpu", numpy, f"GPU {i} (simulated on the CPU)", device_id=i) for i in range(n)]


class DeviceFailure(BackendError):
    """A device of a shared run failed: which one, in which stage, and why (``__cause__``).
    A :class:`BackendError`, so the command line and the window show its message as it is."""

    def __init__(self, backend: Backend, stage: str, error: BaseException):
        self.device, self.stage, self.error = device_label(backend), stage, error
        self.out_of_memory = backend.is_out_of_memory(error) or "out of memory" in str(error).lower()
        what = "out of memory" if self.out_of_memory else f"{type(error).__name__}: {error}"
        super().__init__(f"{self.device}: {what} while {stage}")


# --------------------------------------------------------------------------- splitting


def split_range(total: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``total`` items as ``parts`` contiguous ``(start, count)`` ranges of nearly equal size
    (the starts on multiples of ``align``); empty ranges are left out."""
    if parts < 1:
        raise ValueError(f"at least one part is needed, got {parts}")
    align = max(1, int(align))
    blocks = -(-int(total) // align)
    ranges = []
    for i in range(parts):
        a, b = (blocks * i) // parts * align, min(total, (blocks * (i + 1)) // parts * align)
        if b > a:
            ranges.append((a, b - a))
    return ranges


class ChunkQueue:
    """Ranges of ``range(total)`` handed out on request, guided: each chunk is the remaining
    work over ``2 × parts``, at most ``largest`` and at least ``smallest`` (so the last chunks
    are small and the devices end together; with one part, every chunk is ``largest``: there is
    nothing to balance). No chunk leaves less than ``smallest`` behind: below ``2 × smallest``
    the rest goes as two near-equal chunks, below ``smallest`` as one, so a run never ends on a
    crumb (on a GPU a launch of few streamlines lasts as long as its longest streamline, the
    device nearly idle). Ranges given back (a failed device's) come first."""

    def __init__(self, total: int, parts: int, largest: int, smallest: int = 1):
        self.next, self.total, self.parts = 0, int(total), max(1, int(parts))
        self.largest, self.smallest = max(1, int(largest)), max(1, min(int(smallest), int(largest)))
        self.returned: deque[tuple[int, int]] = deque()
        self.lock = threading.Lock()

    def take(self) -> tuple[int, int] | None:
        with self.lock:
            if self.returned:
                start, count = self.returned.popleft()
                if count > self.largest:  # a failed device's share: cut up again
                    self.returned.appendleft((start + self.largest, count - self.largest))
                    count = self.largest
                return start, count
            left = self.total - self.next
            if left <= 0:
                return None
            count = min(left, self.largest, self.chunk(left))
            start, self.next = self.next, self.next + count
            return start, count

    def chunk(self, left: int) -> int:
        """The next chunk's size with ``left`` items not yet handed out (before ``largest``)."""
        if self.parts == 1:
            return self.largest
        if left <= self.smallest:
            return left
        if left < 2 * self.smallest:
            return -(-left // 2)
        return max(self.smallest, -(-left // (2 * self.parts)))

    def give_back(self, ranges) -> None:
        with self.lock:
            self.returned.extend(ranges)

    def empty(self) -> bool:
        with self.lock:
            return not self.returned and self.next >= self.total


# --------------------------------------------------------------------------- the shared run


class Share(Protocol):
    """One device's part of a run (made in that device's thread, with the device current)."""

    def launch(self, start: int, count: int) -> Any:
        """Queue the work of ``start .. start + count`` (may return before it is done); an event
        that is recorded once it is done (a CUDA event, when the share queues on streams of its
        own), or None (then the current stream's is taken)."""

    def finish(self) -> Any:
        """Wait for everything queued; the running totals (left on the device for the merge, or
        handed in at once when the run finishes each share early: ``run_shared(finish_early=True)``)."""


@dataclass
class ShareReport:
    """What one device did: its label, its share's number (``index``, 0 … n − 1), streamlines,
    chunks, seconds per stage and ``timeline_s``: moments (seconds from the run's start) such as
    ``ready`` (opened), ``done`` (its last chunk completed) and ``finished`` (its totals in)."""

    device: str
    index: int = 0
    items: int = 0
    chunks: int = 0
    stages_s: dict = field(default_factory=dict)
    timeline_s: dict = field(default_factory=dict)
    failed: str | None = None
    #: (items, device seconds) of each chunk, where the share times them
    chunk_s: list = field(default_factory=list)

    def add(self, stage: str, seconds: float) -> None:
        self.stages_s[stage] = round(self.stages_s.get(stage, 0.0) + seconds, 4)

    def mark(self, moment: str, seconds: float) -> None:
        self.timeline_s[moment] = round(seconds, 4)

    def as_dict(self) -> dict:
        return {"device": self.device, "index": self.index, "items": self.items, "chunks": self.chunks,
                "stages_s": dict(self.stages_s), "timeline_s": dict(self.timeline_s), "failed": self.failed,
                "chunk_s": [list(c) for c in self.chunk_s]}  # fmt: skip


@dataclass
class SharedRun:
    """The outcome of :func:`run_shared`: each surviving device's totals (``finish()``'s value,
    in device order), every device's report, and the failures the run went on after."""

    backends: list[Backend]
    totals: list[Any]
    reports: list[ShareReport]
    failures: list[DeviceFailure]

    @property
    def notes(self) -> list[str]:
        return [f"{f}; its share was done again on the other device(s)" for f in self.failures]


def _event(backend: Backend, given=None):
    if given is not None:
        return given
    return backend.xp.cuda.get_current_stream().record() if backend.is_gpu else None


def run_shared(
    backends: Sequence[Backend],
    total: int,
    open_share: Callable[[Backend, ShareReport], Share],
    *,
    largest: int,
    smallest: int = 1,
    cancelled: Callable[[], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    keep_going: bool = True,
    in_flight: int = 2,
    finish_early: bool = False,
) -> SharedRun:
    """``range(total)`` over ``backends``: each device's thread opens its share
    (``open_share(backend, report)``: start, uploads; it may add stages to the report), then takes
    chunks from a :class:`ChunkQueue` and launches them, ``in_flight`` queued at once on a GPU
    (so it never idles between chunks), and at the end ``finish()``es its share. A failing device
    (:class:`DeviceFailure`) gives its ranges back and the others track them (``keep_going``), or
    the run stops; :class:`Cancelled` when ``cancelled()`` says so. ``progress(done, total)``
    counts the chunks completed on every device.

    ``finish_early``: a device ``finish()``es in its own thread as soon as the queue has nothing
    left for it, while the others still compute (its ``finish`` hands its totals in and starts
    them afresh, so a later call, after ranges given back by a failed device were tracked, hands
    in only those). Its ranges are then safe: a failure later gives back only newer ones."""
    backends = list(backends)
    if not backends:
        raise ValueError("no device to run on")
    queue = ChunkQueue(total, len(backends), largest, smallest)
    stop = threading.Event()
    lock = threading.Lock()
    done = [0]
    began = time.perf_counter()
    reports = [ShareReport(device_label(b), index=i) for i, b in enumerate(backends)]
    shares: list[Any] = [None] * len(backends)
    taken: list[list[tuple[int, int]]] = [[] for _ in backends]
    alive = [True] * len(backends)
    failures: list[DeviceFailure] = []

    def advance(count: int) -> None:
        with lock:
            done[0] += count
            now = done[0]
        if progress is not None:
            progress(min(now, total), total)

    def halted() -> bool:
        if cancelled is not None and cancelled():
            stop.set()
        return stop.is_set()

    def work(i: int) -> None:
        backend, report = backends[i], reports[i]
        stage = "starting"
        try:
            with backend.activate():
                if shares[i] is None:
                    t0 = time.perf_counter()
                    shares[i] = open_share(backend, report)
                    report.add("open", time.perf_counter() - t0)
                    report.mark("ready", time.perf_counter() - began)
                stage = "tracking"
                pending: deque = deque()
                t0 = time.perf_counter()
                while not halted() and (r := queue.take()) is not None:
                    taken[i].append(r)
                    pending.append((r[1], _event(backend, shares[i].launch(*r))))
                    report.items += r[1]
                    report.chunks += 1
                    while len(pending) >= max(1, in_flight):
                        count, event = pending.popleft()
                        if event is not None:
                            event.synchronize()
                        advance(count)
                for count, event in pending:
                    if event is not None:
                        event.synchronize()
                    advance(count)
                report.add("compute", time.perf_counter() - t0)
                report.mark("done", time.perf_counter() - began)
        except Cancelled:
            stop.set()
        except Exception as exc:  # every failure is a device's, named
            failure = DeviceFailure(backend, stage, exc)
            failure.__cause__ = exc
            report.failed = str(failure)
            with lock:
                alive[i] = False
                shares[i] = None  # its totals went with it
                failures.append(failure)
                queue.give_back(taken[i])
                taken[i] = []
                if not keep_going or not any(alive):
                    stop.set()
            return
        if finish_early and alive[i] and not halted():
            out = finish(i)
            if alive[i]:
                with lock:
                    totals[i] = out
                    taken[i] = []  # handed in: safe whatever happens next

    def finish(i: int) -> Any:
        backend = backends[i]
        t0 = time.perf_counter()
        try:
            with backend.activate():
                out = shares[i].finish()
            reports[i].add("finish", time.perf_counter() - t0)
            reports[i].mark("finished", time.perf_counter() - began)
            return out
        except Exception as exc:
            failure = DeviceFailure(backend, "finishing its totals", exc)
            failure.__cause__ = exc
            reports[i].failed = str(failure)
            with lock:
                alive[i] = False
                shares[i] = None
                failures.append(failure)
                queue.give_back(taken[i])
                taken[i] = []
            return None

    totals: dict[int, Any] = {}

    def in_threads(fn, indices):
        if not indices:
            return []
        if len(indices) == 1:
            return [fn(indices[0])]
        with ThreadPoolExecutor(len(indices), thread_name_prefix="tractlens-gpu") as pool:
            futures = [pool.submit(fn, i) for i in indices]
            return [f.result() for f in futures]

    while True:
        in_threads(work, [i for i in range(len(backends)) if alive[i]])
        if (cancelled is not None and cancelled()) or (stop.is_set() and not failures):
            raise Cancelled()
        if failures and (not keep_going or not any(alive)):
            raise failures[0]
        if not queue.empty():  # a device failed: its ranges again, on the others
            continue
        finishing = [i for i in range(len(backends)) if alive[i] and i not in totals]
        for i, out in zip(finishing, in_threads(finish, finishing), strict=True):
            if alive[i]:
                totals[i] = out
        if not any(alive):
            raise failures[0]
        if queue.empty():
            break
        # a device failed while finishing: its ranges are tracked again (its totals are gone)
        if not keep_going:
            raise failures[0]
        for i in list(totals):  # the finished shares stay open; their totals are taken again at the end
            del totals[i]
    order = [i for i in range(len(backends)) if alive[i]]
    return SharedRun([backends[i] for i in order], [totals[i] for i in order], reports, failures)


def run_split(
    backends: Sequence[Backend],
    total: int,
    work: Callable[[Backend, int, int, Callable[[], bool]], T],
    *,
    align: int = 1,
    cancelled: Callable[[], bool] | None = None,
) -> list[T]:
    """``work(backend, start, count, stop)`` on each backend's contiguous share of
    ``range(total)``, at once, one host thread per backend with its device current; the results
    in the ranges' order. ``stop()`` is true once ``cancelled()`` is or another share has failed:
    a share polls it between batches. A failure is raised, naming its device
    (:class:`DeviceFailure`), after every share has ended."""
    ranges = split_range(total, len(backends), align)
    failed = threading.Event()

    def stop() -> bool:
        return failed.is_set() or (cancelled is not None and cancelled())

    def run(backend: Backend, start: int, count: int) -> T:
        try:
            with backend.activate():
                return work(backend, start, count, stop)
        except Cancelled:
            failed.set()
            raise
        except BaseException as exc:
            failed.set()
            raise DeviceFailure(backend, f"working on items {start:,}–{start + count:,}", exc) from exc

    if len(ranges) <= 1:
        return [run(backends[0], *r) for r in ranges]
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="tractlens-gpu") as pool:
        futures = [pool.submit(run, b, *r) for b, r in zip(backends, ranges, strict=False)]
        errors = [f.exception() for f in futures]
    failures = [e for e in errors if e is not None and not isinstance(e, Cancelled)]
    for error in failures or [e for e in errors if e is not None]:
        raise error
    return [f.result() for f in futures]


def start_devices(n: int, staging: bool = True) -> threading.Thread | None:
    """Create the CUDA contexts of GPUs 1 … n − 1 on background threads (GPU 0's is made by the
    usual warm-up), so a shared run started while its files are read finds them ready (a context
    takes a few hundred milliseconds; the driver serialises a thread that asks for one being
    made); with ``staging``, also each of the n GPUs' pinned staging buffers for host uploads
    (:func:`gpu.transfer.prepare_staging`); then each GPU's direct access to the others' memory
    (:func:`gpu.multidevice_copy.enable_peer_access`: the field's gather copies part by part from
    the peers, and a fresh process paid the mapping inside the run). Nothing happens without a
    usable GPU; failures are left to the run, which names them."""
    if n <= 1:
        return None

    def start() -> None:
        try:
            count = gpu_count()
            import cupy

            def one(i: int) -> None:
                if i > 0:
                    with cupy.cuda.Device(i):
                        cupy.zeros(1).sum()
                if staging:
                    prepare_staging(i)

            devices = range(min(n, count))

            def peers(i: int) -> None:
                with cupy.cuda.Device(i):
                    for j in devices:
                        enable_peer_access(cupy, i, j)

            with ThreadPoolExecutor(max(1, len(devices)), thread_name_prefix="tractlens-gpu-start") as pool:
                list(pool.map(one, devices))
                list(pool.map(peers, devices))  # every context exists: mapping a peer needs its context
        except Exception:  # the run itself reports what is wrong, naming the device
            pass

    thread = threading.Thread(target=start, name="tractlens-gpu-start", daemon=True)
    thread.start()
    return thread


def memory_peaks(backends: Sequence[Backend]) -> dict[str, int]:
    """Each GPU's memory-pool peak so far (bytes CuPy's pool holds), by device label."""
    out = {}
    for b in backends:
        if b.is_gpu:
            with b.activate():
                out[device_label(b)] = int(b.xp.get_default_memory_pool().total_bytes())
    return out


__all__ = [
    "ChunkQueue",
    "DeviceFailure",
    "Share",
    "ShareReport",
    "SharedRun",
    "device_label",
    "memory_peaks",
    "run_shared",
    "run_split",
    "simulated_backends",
    "split_range",
    "start_devices",
]
