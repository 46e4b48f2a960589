"""What a long use case sees of whoever runs it: progress, partial results, cancellation.

A job is a function ``fn(ctx) -> result`` where ``ctx`` is a :class:`JobContext`: it reports
progress (``ctx.progress(done, total, message)``), hands over partial results
(``ctx.partial(obj)``) and polls for cancellation (``ctx.cancelled()``, or ``ctx.check()`` which
raises :class:`~tractlens.gpu.backend.Cancelled`). The context is plain Python: the window's job
runner (:mod:`tractlens.widgets.jobs`, the only place that knows Qt) builds one whose callbacks
emit its signals; a script, a test or the CLI builds one with its own callbacks, or none.

:func:`describe_error` turns what a job raised into the message a user reads.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from tractlens.gpu.backend import BackendError, Cancelled, OutOfDeviceMemory

from .errors import InputError

#: What :meth:`JobContext.check` raises (re-exported: the window's runner catches it without
#: reaching into the engine).
__all__ = ["Cancelled", "JobContext", "describe_error"]


class JobContext:
    """Progress, partial results and cancellation for one run of a use case.

    ``on_progress(done, total, message)`` and ``on_partial(obj)`` are called on the worker's
    thread (None: ignored); ``cancel_event`` is set by whoever may stop the run (None: a fresh
    event, set by :meth:`cancel`)."""

    def __init__(
        self,
        on_progress: Callable[[int, int, str], None] | None = None,
        on_partial: Callable[[Any], None] | None = None,
        cancel_event: threading.Event | None = None,
    ):
        self._on_progress = on_progress
        self._on_partial = on_partial
        self.cancel_event = cancel_event if cancel_event is not None else threading.Event()

    def progress(self, done: int, total: int, message: str = "") -> None:
        if self._on_progress is not None:
            self._on_progress(int(done), int(total), message)

    def partial(self, result: Any) -> None:
        if self._on_partial is not None:
            self._on_partial(result)

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def cancel(self) -> None:
        """Ask the run to stop (at its next check)."""
        self.cancel_event.set()

    def check(self) -> None:
        """Raise :class:`Cancelled` if the user asked to stop."""
        if self.cancelled():
            raise Cancelled()


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(message for the user, details) for an exception raised by a job."""
    if isinstance(exc, InputError | BackendError):
        return str(exc), ""
    if isinstance(exc, OutOfDeviceMemory):
        return f"{exc}. Try the CPU (device 'cpu') or a smaller region.", ""
    if isinstance(exc, MemoryError):
        return "out of memory; try a smaller region or close other programs.", ""
    details = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"internal error: {type(exc).__name__}: {exc}", details
