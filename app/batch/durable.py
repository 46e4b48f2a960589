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
an input/output error), which the runner reports as that step's failure. A file system that stops
answering (a network mount gone) does not hold the run's end for ever: when no flush of the run
finishes within :data:`FLUSH_STALL_S` seconds, the steps still waiting are reported failed with
that reason (their sidecars, if the disk comes back, are written after the outputs as always).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from ..errors import InputError

#: Seconds the end of a batch run waits for the next of a worker's flushes to finish (a slow disk
#: still finishes one within it; a file system that stopped answering does not) before it reports
#: the steps still waiting as failed. ``tractlens batch --flush-timeout``.
FLUSH_STALL_S = 600.0


def stall_limit(seconds: float | None) -> float | None:
    """``--flush-timeout`` checked: a positive number of seconds; None or inf for no limit."""
    if seconds is None or seconds == float("inf"):
        return None
    if not seconds > 0:  # (NaN too)
        raise InputError(f"--flush-timeout must be a positive number of seconds, got {seconds:g}",
                         fix=f"Give e.g. --flush-timeout {FLUSH_STALL_S:g}")  # fmt: skip
    return float(seconds)


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


def drain(run: str | None = None, stall_s: float | None = FLUSH_STALL_S) -> list[dict]:
    """Wait for the flushes of ``run`` queued in this process (every run's with None); for each,
    in order, ``{"key", "seconds"}`` or ``{"key", "error"}``, once. Other runs' flushes (another
    batch on the same workers) stay queued for their own run's drain. The flushes finish one after
    another; when none finishes within ``stall_s`` seconds (None or inf: no limit), the one waited for
    and those after it are reported with that error instead of being waited for."""
    with _lock:
        mine = [entry for entry in _pending if run is None or entry[0] == run]
        _pending[:] = [entry for entry in _pending if not (run is None or entry[0] == run)]
    report, stalled, stall_s = [], None, stall_limit(stall_s)
    for _run, key, future in mine:
        if stalled is not None and not future.done():
            report.append({"key": key, "error": stalled})
            continue
        wait([future], timeout=stall_s)  # (not result(timeout): a flush's own ETIMEDOUT is a TimeoutError too)
        if not future.done():
            stalled = (f"TimeoutError: no flush finished within {stall_s:g} s (--flush-timeout): the disk or "
                       "network file system stopped answering (a flush that finishes later still records its step, "
                       "which the next run then skips)")  # fmt: skip
            report.append({"key": key, "error": stalled})
            continue
        try:
            report.append({"key": key, "seconds": round(future.result(), 3)})
        except Exception as exc:  # the step's sidecars were not written: it reads as not done
            report.append({"key": key, "error": f"{type(exc).__name__}: {exc}"})
    return report


async def drain_on_worker(run: str | None = None, stall_s: float | None = FLUSH_STALL_S) -> list[dict]:
    """:func:`drain` for ``Client.run``: a coroutine, so that the worker's event loop (its
    heartbeats to the scheduler) goes on while the flushes are waited for on another thread."""
    return await asyncio.to_thread(drain, run, stall_s)
