"""Sessions in the window: a ``.tractlens`` file saved and opened on workers, the periodic autosave,
and the restore of an autosave a crashed window left behind.

The file format is :mod:`tractlens.app.session` and the recovery store
:mod:`tractlens.app.recovery`; moving the window's state into and out of them is
:mod:`tractlens.widgets.session_io`'s. This controller sequences the jobs and the autosave: what
is snapshotted, how a session is put on screen and how the autosave is made are callables the
window gives it, so it holds no widget and runs without a screen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from tractlens.app.recovery import DEFAULT_INTERVAL_S
from tractlens.app.session import load_session, write_session

from .. import dialogs
from ..jobs import JobRunner
from .settings import settings

INTERVAL_KEY = "autosave/interval_s"


class SessionController(QObject):
    """``snapshot()``: the document and window state now (GUI thread); ``apply(session)``: put a
    loaded session on screen; ``make_autosave(interval_s)``: the autosave (an object with
    ``saved``/``failed(message)`` signals, ``set_interval``, ``save_now``, ``interval_s``,
    ``close``), e.g. :class:`~tractlens.widgets.session_io.WindowAutosave`."""

    opened = Signal(object)  # the Path of a session put on screen
    message = Signal(str, int)  # status text, milliseconds
    error = Signal(str, str)  # message, details

    def __init__(
        self,
        runner: JobRunner,
        *,
        snapshot: Callable[[], object],
        apply: Callable[[object], None],
        make_autosave: Callable[[float], object] | None = None,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.runner = runner
        self.snapshot = snapshot
        self.apply = apply
        self.make_autosave = make_autosave
        self.autosave = None
        self.restoring = None  # the orphaned autosave being restored, deleted once autosaved again
        self.current_path: Path | None = None  # where File ▸ Save session writes without asking
        self._autosave_error = ""

    # -------------------------------------------------------------- sessions
    def save_session(self, path: str | os.PathLike) -> int:
        """Write the document (copied now, so edits made while it is written do not reach the
        file half-way) to a ``.tractlens`` file on a worker; the job id."""
        snap = self.snapshot()

        def done(written) -> None:
            self.current_path = Path(written)
            self.message.emit(f"Session saved to {written}", 8000)

        return self.runner.submit(
            f"save session {Path(path).name}",
            lambda ctx: write_session(snap, path),
            on_done=done,
            on_error=self.error.emit,
        )

    def save_session_dialog(self, parent) -> int | None:
        """File ▸ Save session (Ctrl+S): to the session last saved or opened, else as Save as."""
        if self.current_path is not None:
            return self.save_session(self.current_path)
        return self.save_session_as_dialog(parent)

    def save_session_as_dialog(self, parent) -> int | None:
        """File ▸ Save session as… (Ctrl+Shift+S): ask where; the job id (None: cancelled)."""
        suggested = str(self.current_path) if self.current_path is not None else "session.tractlens"
        path = dialogs.save_file(parent, "Save session", suggested, "TractLens session (*.tractlens)")
        return self.save_session(path) if path else None

    def open_session_dialog(self, parent) -> int | None:
        """File ▸ Open session…: ask which; the job id (None: cancelled)."""
        path = dialogs.open_file(parent, "Open session", "TractLens session (*.tractlens)")
        return self.open_session(path) if path else None

    def open_session(self, path: str | os.PathLike) -> int:
        """Read a session on a worker and put it on screen (replacing the current layers)."""

        def done(session) -> None:
            self.apply(session)
            self.current_path = Path(path)
            self.opened.emit(Path(path))

        return self.runner.submit(
            f"open session {Path(path).name}", lambda ctx: load_session(path), on_done=done, on_error=self.error.emit
        )

    # -------------------------------------------------------------- autosave
    def start_autosave(self, interval_s: float | None = None) -> None:
        """Autosave every ``interval_s`` seconds (0: off; None: the saved setting, default
        :data:`~tractlens.app.recovery.DEFAULT_INTERVAL_S`)."""
        if self.make_autosave is None:
            return
        if interval_s is None:
            interval_s = float(settings().value(INTERVAL_KEY, DEFAULT_INTERVAL_S))
        try:
            self.autosave = self.make_autosave(interval_s)
        except OSError as exc:
            self.autosave = None
            self.message.emit(f"Autosave is off: its folder cannot be written ({exc})", 15000)
            return
        self.autosave.saved.connect(self._autosaved)
        self.autosave.failed.connect(self._autosave_failed)

    def set_autosave_interval(self, seconds: float) -> None:
        """Autosave every ``seconds`` (0: off); remembered for the next start."""
        settings().setValue(INTERVAL_KEY, float(seconds))
        if self.autosave is not None:
            self.autosave.set_interval(seconds)

    def _autosaved(self) -> None:
        recovered, self._autosave_error = bool(self._autosave_error), ""
        if self.restoring is not None:  # the restored work is safe in our own autosave now
            restored = self.restoring.describe()
            self.restoring.discard()
            self.restoring = None
            self.message.emit(f"Restored the {restored}", 15000)
            return
        # after failures, a lasting line replaces the one that said autosave was failing
        self.message.emit(
            "Autosaved again: the work is safe" if recovered else "Autosaved", 8000 if recovered else 2000
        )

    def _autosave_failed(self, message: str) -> None:
        # A line in the status bar that stays until an autosave succeeds (renewed at every failed
        # tick, so another message cannot hide it for good); the error box once per cause.
        self.message.emit(f"Autosave is failing ({time.strftime('%H:%M:%S')}), it is tried again: {message}", 0)
        if message != self._autosave_error:
            self._autosave_error = message
            self.error.emit(f"Autosave failed (it is tried again): {message}", "")

    def restore_autosave(self, orphan) -> int:
        """Open an autosave a crashed window left (an :class:`~tractlens.app.recovery.Orphan`) on
        a worker, replacing the current layers; it is deleted once autosaved again here."""

        def done(session) -> None:
            self.apply(session)
            self.restoring = orphan
            self.message.emit(f"Restored the {orphan.describe()}", 15000)
            if self.autosave is not None:
                self.autosave.save_now()

        def failed(message: str, details: str) -> None:
            orphan.release()  # kept: another start may offer it again
            self.error.emit(f"The autosave could not be restored: {message}", details)

        return self.runner.submit(
            "restore autosave", lambda ctx: load_session(orphan.folder), on_done=done, on_error=failed
        )

    def close(self) -> None:
        """A clean exit: a restored autosave not yet saved again is offered next time; our own
        autosave stops and is deleted (nothing to recover)."""
        if self.restoring is not None:
            self.restoring.release()
            self.restoring = None
        if self.autosave is not None:
            self.autosave.close()
            self.autosave = None
