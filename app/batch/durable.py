"""A worker's outputs flushed to the disk after their step, on a thread of their own.

A step's command runs with :func:`~app.io._atomic.durability_deferred`: its files reach their
names by atomic renames but without waiting for the disk. :func:`later` then queues what makes
them durable: every output flushed (a folder's files and the folder), the output folder
flushed, and only then the sidecars, which are the record that the step is done. The worker
meanwhile runs the next step, so the disk's work overlaps the computing instead of adding to it
(a whole-brain tractogram is gigabytes a subject). What a power cut or a killed worker leaves
before the sidecars are written reads as not done, and the next run does the step again.

One thread per worker process flushes in the order the steps finished. The batch's runner
calls :func:`drain_on_worker` on every worker before it reports: it waits until all is flushed and gives
each step's flush seconds, or the error that kept its sidecars from being written (a full disk,
an input/output error), which the runner reports as that step's failure.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pending: list[tuple[str, str, Future]] = []  # (run, key, its flush)


def later(key: str, flush: Callable[[], None], run: str = "") -> None:
    """Run ``flush`` (which writes the step's sidecars last) on this process's flushing thread;
    ``key`` names the step (``step/subject``) and ``run`` the batch run (its staging folder) in
    :func:`drain`'s report."""
    global _pool

    def timed() -> float:
        start = time.perf_counter()
        flush()
        return time.perf_counter() - start

    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tractlens-durable")
        _pending.append((run, key, _pool.submit(timed)))


def drain(run: str | None = None) -> list[dict]:
    """Wait for the flushes of ``run`` queued in this process (every run's with None); for each,
    in order, ``{"key", "seconds"}`` or ``{"key", "error"}``, once. Other runs' flushes (another
    batch on the same workers) stay queued for their own run's drain."""
    with _lock:
        mine = [entry for entry in _pending if run is None or entry[0] == run]
        _pending[:] = [entry for entry in _pending if not (run is None or entry[0] == run)]
    report = []
    for _run, key, future in mine:
        try:
            report.append({"key": key, "seconds": round(future.result(), 3)})
        except Exception as exc:  # the step's sidecars were not written: it reads as not done
            report.append({"key": key, "error": f"{type(exc).__name__}: {exc}"})
    return report


async def drain_on_worker(run: str | None = None) -> list[dict]:
    """:func:`drain` for ``Client.run``: a coroutine, so that the worker's event loop (its
    heartbeats to the scheduler) goes on while the flushes are waited for on another thread."""
    return await asyncio.to_thread(drain, run)
