"""The window's job runner: use cases on worker threads, never on the GUI thread.

A job is a function ``fn(ctx) -> result`` taking the plain :class:`app.jobs.JobContext`
(progress, partial results, cancellation). The :class:`JobRunner` runs jobs on a
``QThreadPool`` and re-emits what their contexts report as Qt signals delivered on the thread
that owns the runner (the GUI thread), so slots may touch widgets. Exceptions become
user-facing messages (:func:`app.jobs.describe_error`): :class:`~app.errors.InputError` and
out-of-memory keep their text; anything else is reported as an internal error with the
traceback in the details.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThread, QThreadPool, Signal

from tractlens.app.jobs import Cancelled, JobContext, describe_error
from tractlens.app.window_words import window_words

log = logging.getLogger(__name__)

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
KEEP_ENDED = 100  # ended jobs the runner remembers (the job list's history); older ones are dropped


class _Signals(QObject):
    progress = Signal(int, int, int, str)
    partial = Signal(int, object)
    finished = Signal(int, object)
    failed = Signal(int, str, str)
    cancelled = Signal(int)


@dataclass
class Job:
    """Book-keeping for one job; ``state`` is one of queued, running, done, failed, cancelled."""

    id: int
    name: str
    fn: Callable[[JobContext], Any]
    signals: _Signals
    low_priority: bool = False
    cancel_event: threading.Event = field(default_factory=threading.Event)
    state: str = QUEUED
    done: int = 0
    total: int = 0
    message: str = ""
    error: str = ""
    details: str = ""
    result: Any = None
    started_at: float = 0.0
    ended_at: float = 0.0
    finished_event: threading.Event = field(default_factory=threading.Event)


class _Runnable(QRunnable):
    def __init__(self, job: Job):
        super().__init__()
        self.job = job
        self.setAutoDelete(True)

    @staticmethod
    def _context(job: Job) -> JobContext:
        """The plain context the use case sees; what it reports goes out as the job's signals."""
        return JobContext(
            on_progress=lambda done, total, message: job.signals.progress.emit(job.id, done, total, message),
            on_partial=lambda result: job.signals.partial.emit(job.id, result),
            cancel_event=job.cancel_event,
        )

    @staticmethod
    def _run_at_priority(job: Job, ctx: JobContext):
        """``job.fn(ctx)``, on a thread of lowest priority for a low-priority job (the pool's
        thread gets its priority back afterwards)."""
        if not job.low_priority:
            return job.fn(ctx)
        thread = QThread.currentThread()
        before = thread.priority()
        thread.setPriority(QThread.Priority.LowestPriority)
        try:
            return job.fn(ctx)
        finally:
            thread.setPriority(before)

    def run(self) -> None:
        # This frame holds the job from here: nothing of it is left for the runnable's deletion
        # by QThreadPool after run() returns (outside any Python frame on this pool thread).
        job, self.job = self.job, None
        ended, result = job.finished_event, None
        try:
            if job.cancel_event.is_set():
                raise Cancelled()
            job.started_at = time.perf_counter()
            job.state = RUNNING
            result = self._run_at_priority(job, self._context(job))
            if job.cancel_event.is_set():
                raise Cancelled()
        except Cancelled:
            job.signals.cancelled.emit(job.id)
        except BaseException as exc:  # every failure must reach the user, none the event loop
            message, details = window_words_of(exc)
            log.debug("job %s failed: %s\n%s", job.name, message, details)
            job.signals.failed.emit(job.id, message, details)
        else:
            job.signals.finished.emit(job.id, result)
        finally:
            job.ended_at = time.perf_counter()
            # Let go before saying so: once ``ended`` is set the runner may forget the job, and what
            # the job made or captured should then go on the runner's thread, not on this one.
            job = result = None
            ended.set()


class JobRunner(QObject):
    """Runs jobs on worker threads; signals arrive on the runner's (GUI) thread.

    A finished job's result is handed to ``on_done`` and ``job_finished`` and then let go (a
    live re-track would otherwise keep every tractogram it ever made); the runner remembers the
    last :data:`KEEP_ENDED` ended jobs and drops older ones (``job_removed``).

    Signals: ``job_added(id)``, ``job_removed(id)``, ``job_changed(id)`` (progress or state),
    ``job_partial(id, obj)``, ``job_finished(id, result)``,
    ``job_failed(id, message, details)``, ``job_cancelled(id)``.
    """

    job_added = Signal(int)
    job_removed = Signal(int)  # an ended job dropped from the history (see KEEP_ENDED)
    job_changed = Signal(int)
    job_partial = Signal(int, object)
    job_finished = Signal(int, object)
    job_failed = Signal(int, str, str)
    job_cancelled = Signal(int)

    def __init__(self, max_threads: int | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.pool = QThreadPool(self)
        if max_threads:
            self.pool.setMaxThreadCount(max_threads)
        self.jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._callbacks: dict[int, dict[str, Callable]] = {}

    def submit(
        self,
        name: str,
        fn: Callable[[JobContext], Any],
        *,
        on_done: Callable[[Any], None] | None = None,
        on_partial: Callable[[Any], None] | None = None,
        on_error: Callable[[str, str], None] | None = None,
        low_priority: bool = False,
    ) -> int:
        """Queue ``fn(ctx)``; callbacks run on the runner's thread. Returns the job id.
        ``low_priority``: run on a thread of lowest priority (work the user did not ask for)."""
        # Parented to the runner: the QObject lives and dies on the runner's thread, never
        # on a pool thread (where the last Python reference to a finished job may drop).
        signals = _Signals(self)
        job = Job(next(self._ids), name, fn, signals, low_priority=low_priority)
        # Bound methods of a QObject that lives on this thread: Qt queues the calls here.
        signals.progress.connect(self._on_progress)
        signals.partial.connect(self._on_partial)
        signals.finished.connect(self._on_finished)
        signals.failed.connect(self._on_failed)
        signals.cancelled.connect(self._on_cancelled)
        self.jobs[job.id] = job
        self._callbacks[job.id] = {"done": on_done, "partial": on_partial, "error": on_error}
        # Started first: what the job list does when it hears of it (a row, its repaint) must
        # not delay the work (its outcomes come back queued, after this call).
        self.pool.start(_Runnable(job))
        self.job_added.emit(job.id)
        return job.id

    def cancel(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.state in (QUEUED, RUNNING):
            job.cancel_event.set()
            job.message = "cancelling…"
            self.job_changed.emit(job_id)

    def cancel_all(self) -> None:
        for job_id in list(self.jobs):
            self.cancel(job_id)

    def active(self) -> list[Job]:
        return [job for job in self.jobs.values() if job.state in (QUEUED, RUNNING)]

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every job's worker has returned (for shutdown and scripts)."""
        return self.pool.waitForDone(-1 if timeout_s is None else int(timeout_s * 1000))

    def shutdown(self, timeout_s: float = 10.0) -> bool:
        """Cancel every job and wait for the workers, before the runner is destroyed."""
        self.cancel_all()
        return self.wait(timeout_s)

    # Slots, on the runner's thread.
    def _on_progress(self, job_id: int, done: int, total: int, message: str) -> None:
        job = self.jobs[job_id]
        job.done, job.total = done, total
        if message:
            job.message = message
        self.job_changed.emit(job_id)

    def _on_partial(self, job_id: int, result: object) -> None:
        callback = self._callbacks[job_id]["partial"]
        if callback is not None and not self.jobs[job_id].cancel_event.is_set():
            callback(result)
        self.job_partial.emit(job_id, result)

    def _on_finished(self, job_id: int, result: object) -> None:
        job = self.jobs[job_id]
        job.state, job.result = DONE, result
        job.message = ""  # the step it was at is over: a finished job is just done
        job.done = job.total = max(job.total, 1)
        self.job_changed.emit(job_id)
        callback = self._callbacks.pop(job_id)["done"]
        if callback is None or self._guarded(job, callback, result):
            self.job_finished.emit(job_id, result)
        job.result = None  # delivered: whoever wanted it has it now
        self._forget_old()

    def _forget_old(self) -> None:
        ended = [job_id for job_id, job in self.jobs.items() if job.state in (DONE, FAILED, CANCELLED)]
        for job_id in ended[: max(0, len(ended) - KEEP_ENDED)]:
            job = self.jobs[job_id]
            if not job.finished_event.is_set():  # its worker has not let go yet: forgotten next time
                continue
            del self.jobs[job_id]
            self._callbacks.pop(job_id, None)
            job.signals.deleteLater()  # a child of the runner: it would otherwise live as long as the runner
            self.job_removed.emit(job_id)

    def _guarded(self, job: Job, callback: Callable, *args) -> bool:
        """Run a result callback; a failure there is the job's failure, not the event loop's."""
        try:
            callback(*args)
        except Exception as exc:
            message, details = window_words_of(exc)
            log.error("handling the result of %s failed: %s\n%s", job.name, message, details)
            job.state, job.error, job.details = FAILED, message, details
            self.job_changed.emit(job.id)
            self.job_failed.emit(job.id, message, details)
            return False
        return True

    def _on_failed(self, job_id: int, message: str, details: str) -> None:
        job = self.jobs[job_id]
        job.state, job.error, job.details = FAILED, message, details
        self.job_changed.emit(job_id)
        callback = self._callbacks.pop(job_id)["error"]
        if callback is not None:
            callback(message, details)
        self.job_failed.emit(job_id, message, details)
        self._forget_old()

    def _on_cancelled(self, job_id: int) -> None:
        job = self.jobs[job_id]
        job.state, job.message = CANCELLED, "cancelled"
        self._callbacks.pop(job_id, None)
        self.job_changed.emit(job_id)
        self.job_cancelled.emit(job_id)
        self._forget_old()


def window_words_of(exc: BaseException) -> tuple[str, str]:
    """:func:`app.jobs.describe_error` in the window's words (no command-line flags)."""
    message, details = describe_error(exc)
    return window_words(message), details
