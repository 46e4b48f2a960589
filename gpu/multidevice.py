"""One piece of work split across the GPUs of a host.

The trackers number their streamlines and draw every streamline's random numbers from its own
counter-based stream (Philox, keyed by the streamline's number), so a range of numbers tracked
on one GPU gives exactly what the same range gives inside a run on one GPU. A run split into
contiguous ranges, one per GPU, and summed therefore equals the single-GPU run bit for bit for
every count (path distributions, target counts, matrices are integers).

Each GPU is driven from its own host thread with its device current (:meth:`Backend.activate`);
CuPy keeps the current device per thread, compiles each kernel once per device and allocates
from a pool per device. The results are summed on the host: nothing goes between the GPUs, so
no NCCL (and none of its NVLink multicast) is involved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .backend import Backend

T = TypeVar("T")


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


def run_split(
    backends: Sequence[Backend],
    total: int,
    work: Callable[[Backend, int, int, Callable[[], bool]], T],
    *,
    align: int = 1,
    cancelled: Callable[[], bool] | None = None,
) -> list[T]:
    """``work(backend, start, count, stop)`` on each backend's share of ``range(total)``, at
    once, one host thread per backend with its device current; the results in the ranges'
    order. ``stop()`` is true once ``cancelled()`` is or another share has failed: a share
    polls it between batches. An exception is raised after every share has ended."""
    ranges = split_range(total, len(backends), align)
    failed = threading.Event()

    def stop() -> bool:
        return failed.is_set() or (cancelled is not None and cancelled())

    def run(backend: Backend, start: int, count: int) -> T:
        try:
            with backend.activate():
                return work(backend, start, count, stop)
        except BaseException:
            failed.set()
            raise

    if len(ranges) <= 1:
        return [run(backends[0], *r) for r in ranges]
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="tractlens-gpu") as pool:
        futures = [pool.submit(run, b, *r) for b, r in zip(backends, ranges, strict=False)]
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]
