"""What the panels that run one long job at a time share (Tracking, Probabilistic, COMMIT).

A job panel starts its work on the document's :class:`app.jobs.JobRunner` and keeps the id of
the run in flight (``job_id``, None when none is) and a token that grows with every start, so
that the results, failures and cancels of a run overtaken by a newer one are dropped. It has a
Cancel button (enabled while a run is in flight), a status line and a ``report`` callback for
messages the user must see (the main window's error dialog/log). Refusals (missing input, bad
parameters) go to both the status line and ``report`` and start nothing.

Subclasses build their own widgets and layout (the base creates ``cancel_button`` and
``status`` but places neither), and set :attr:`JobPanelBase.job_label` ("COMMIT", "Tracking"),
which begins the failure message. Hooks: :meth:`_cancelled` (what a cancel leaves on screen)
and :meth:`_progress_text` (the status line while the run reports progress).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QLabel, QPushButton, QWidget

from tractlens.app.model import Document


class JobPanelBase(QWidget):
    """Job id and token bookkeeping, Cancel, refusals, failures and cancels for one job panel."""

    job_label = "Job"  # begins the messages: "<label> failed: …", "<label> cancelled."

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(parent)
        self.document = document
        self.runner = runner
        self.device = device
        self.report = report or (lambda message, details="": None)
        self.job_id: int | None = None
        self._token = 0
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        runner.job_changed.connect(self._on_job_changed)
        runner.job_cancelled.connect(self._on_cancelled)

    # ------------------------------------------------------------- starting
    def _start(
        self,
        name: str,
        work: Callable[[Any], Any],
        *,
        on_done: Callable[[Any], None],
        on_partial: Callable[[Any], None] | None = None,
        token: int | None = None,
    ) -> int:
        """Submit ``work`` as this panel's run (the one in flight, if any, is cancelled first);
        enables Cancel; returns the job id. ``token``: the one :meth:`_next_token` gave for this
        run (a new one is taken otherwise); failures of older runs are then ignored."""
        if token is None:
            token = self._next_token()
        self.cancel_button.setEnabled(True)
        self.job_id = self.runner.submit(
            name,
            work,
            on_partial=on_partial,
            on_done=on_done,
            on_error=lambda message, details, token=token: self._failed(token, message, details),
        )
        return self.job_id

    def _next_token(self) -> int:
        """Cancel the run in flight (its results will be dropped) and number the next one."""
        if self.job_id is not None:
            self.runner.cancel(self.job_id)
        self._token += 1
        return self._token

    def _job_ended(self) -> None:
        """No run in flight any more (done, failed or cancelled)."""
        self.job_id = None
        self.cancel_button.setEnabled(False)

    def cancel(self) -> None:
        """Ask the run in flight to stop (it stops at its next check)."""
        if self.job_id is not None:
            self.runner.cancel(self.job_id)

    def _refuse(self, message: str) -> None:
        """Start nothing; say why on the status line and to the user. Returns None (no job id)."""
        self.status.setText(message)
        self.report(message, "")
        return None

    # -------------------------------------------------------------- endings
    def _failed(self, token: int, message: str, details: str) -> None:
        if token != self._token:
            return  # a run overtaken by a newer one
        self._job_ended()
        self.status.setText(f"{self.job_label} failed: {message}")
        self.report(message, details)

    def _on_cancelled(self, job_id: int) -> None:
        if job_id != self.job_id:
            return
        self._job_ended()
        self._cancelled()

    def _cancelled(self) -> None:
        """What a cancel of the run in flight leaves on screen (the run has ended)."""
        self.status.setText(f"{self.job_label} cancelled.")

    def _on_job_changed(self, job_id: int) -> None:
        if job_id != self.job_id:
            return
        job = self.runner.jobs.get(job_id)
        if job is not None and job.state == "running" and job.done > 0:
            text = self._progress_text(job)
            if text:
                self.status.setText(text)

    def _progress_text(self, job) -> str | None:
        """The status line while the run reports progress (``job.done`` of ``job.total``); None:
        leave it as it is."""
        return None
