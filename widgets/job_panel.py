"""The Jobs dock (:class:`JobPanel`: the list of jobs), and what the panels that run one long job
at a time share (:class:`JobPanelBase`: Tracking, Probabilistic, COMMIT).

The job list keeps one row per interactive job kind (:data:`COALESCED`: the fibre selection runs
at every brush stroke and would flood the list), the latest run's; a failure's whole message is
the row's tool tip and, wrapped, the detail line under the list.


A job panel starts its work on the document's :class:`widgets.jobs.JobRunner` and keeps the id of
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

import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QRect, QSize, Qt, QTimer
from PySide6.QtWidgets import (
    QLabel,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.model import Document
from tractlens.app.window_words import window_words

from .jobs import FAILED, QUEUED, RUNNING, JobRunner

#: What a cell keeps of its width for margins (px), when a job's name is wrapped.
NAME_MARGIN = 8

#: Quick jobs started by interaction, many times a minute: one row each, the latest run.
COALESCED = ("select streamlines", "statistics")

#: A job that reports no progress shows how long it has run, renewed this often (ms), instead of
#: a busy bar: Qt animates one at 60 frames a second, and every frame composes the whole window
#: (the 3-D view is OpenGL), 12 ms a frame on an H200 machine. An ROI edit's selection job waited
#: for the GUI thread behind them; a long job's animation took a third of it from the user.
TICK_MS = 1000
#: The status bar says that work runs once jobs have run this long (ms): a selection at a brush
#: stroke is done before, and neither shows nor hides anything.
BUSY_AFTER_MS = 500


def job_kind(name: str) -> str:
    """The row a job shares with earlier runs: "statistics of FA" and "statistics of bundles" are
    both the Statistics panel's, one row; other jobs are their own name."""
    return "statistics" if name.startswith("statistics of ") else name


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
        message = window_words(message)
        self.status.setText(message)
        self.report(message, "")
        return None

    # -------------------------------------------------------------- endings
    def _failed(self, token: int, message: str, details: str) -> None:
        if token != self._token:
            return  # a run overtaken by a newer one
        self._job_ended()
        message = window_words(message)
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


def set_bar(bar: QProgressBar, maximum: int, value: int | None = None, text: str | None = None) -> None:
    """Set a progress bar's range (0..``maximum``), value and text (a ``QProgressBar`` format),
    repainted with the window's next update. (QProgressBar repaints at once when its value leaves
    the range or its text changes: a whole window composed, and a 3-D frame drawn if one is due,
    while an ROI edit's selection job was being started: 200 ms a stroke in a local trace,
    llvmpipe, 100 k streamlines.)"""
    bar.setUpdatesEnabled(False)
    try:
        bar.setRange(0, maximum)
        if value is not None:
            bar.setValue(value)
        if text is not None:
            bar.setFormat(text)
    finally:
        bar.setUpdatesEnabled(True)
    bar.update()


class BusyIndicator(QLabel):
    """The status bar's word that work runs ("running: <job>"): shown once jobs have run for
    :data:`BUSY_AFTER_MS`, hidden when none runs. A label, not a busy bar (see :data:`TICK_MS`)."""

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("busy")
        self.setMaximumWidth(260)
        self.runner = runner
        self.later = QTimer(self)
        self.later.setSingleShot(True)
        self.later.setInterval(BUSY_AFTER_MS)
        self.later.timeout.connect(self._show)
        self.hide()
        for signal in (runner.job_added, runner.job_changed, runner.job_removed):
            signal.connect(lambda _id: self.refresh())

    def refresh(self) -> None:
        if not self.runner.active():
            self.later.stop()
            self.hide()
        elif self.isVisible():
            self._show()
        elif not self.later.isActive():
            self.later.start()

    def _show(self) -> None:
        active = self.runner.active()
        if not active:
            return
        more = f" and {len(active) - 1} more" if len(active) > 1 else ""
        words = f"running: {active[0].name}{more}"
        self.setText(self.fontMetrics().elidedText(words, Qt.TextElideMode.ElideMiddle, self.maximumWidth()))
        self.setToolTip("\n".join(job.name for job in active))
        self.show()


class JobPanel(QWidget):
    """One row per job: name, progress bar, state; Cancel stops the selected running job; the
    selected job's full state or error, wrapped, under the list."""

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self.runner = runner
        self.tree = QTreeWidget()
        self.tree.setObjectName("job_list")
        self.tree.setHeaderLabels(["Job", "Progress", "State"])
        self.tree.setRootIsDecorated(False)
        # A job's name longer than its column (the window fits the columns: widgets.window_layout)
        # wraps onto a second line rather than being cut ("deterministic trac…" at 1280 px). Qt's
        # tree sizes a row by its text's one-line width, wrapped or not: each row is given the
        # height its name needs at the column's width, again whenever that width changes.
        self.tree.setWordWrap(True)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideNone)
        header = self.tree.header()
        header.sectionResized.connect(lambda column, _old, _new: column == 0 and self._fit_rows())
        self.detail = QLabel("")
        self.detail.setObjectName("job_detail")
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.cancel_button = QPushButton("Cancel the selected job")
        self.cancel_button.setObjectName("cancel_job")
        self.cancel_button.setEnabled(False)  # only while the selected job is queued or running
        self.cancel_button.clicked.connect(self._cancel_selected)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tree)
        layout.addWidget(self.detail)
        layout.addWidget(self.cancel_button)
        self._items: dict[int, tuple[QTreeWidgetItem, QProgressBar]] = {}
        self._row_of_kind: dict[str, int] = {}  # coalesced job name -> the job id its row shows
        self.tree.currentItemChanged.connect(lambda *_: self._show_detail())
        self.ticker = QTimer(self)  # the running seconds of jobs that report no progress
        self.ticker.setInterval(TICK_MS)
        self.ticker.timeout.connect(self._tick)
        runner.job_added.connect(self._added)
        runner.job_changed.connect(self._changed)
        runner.job_removed.connect(self._removed)

    def _added(self, job_id: int) -> None:
        job = self.runner.jobs[job_id]
        kind = job_kind(job.name)
        previous = self._row_of_kind.get(kind) if kind in COALESCED else None
        if previous is not None and previous in self._items:
            item, bar = self._items.pop(previous)  # the row now shows the newer run
            item.setText(2, job.state)
        else:
            item = QTreeWidgetItem([job.name, "", job.state])
            bar = QProgressBar()
            self.tree.addTopLevelItem(item)
            self.tree.setItemWidget(item, 1, bar)
        item.setText(0, job.name)
        item.setToolTip(0, job.name)
        self._fit_row(item)
        if kind in COALESCED:
            self._row_of_kind[kind] = job_id
        item.setData(0, Qt.ItemDataRole.UserRole, job_id)
        set_bar(bar, 1000, 0, "")  # empty until the first progress report; its seconds meanwhile
        self.tree.setCurrentItem(item)
        self._items[job_id] = (item, bar)
        self._show_detail()
        if not self.ticker.isActive():
            self.ticker.start()

    def _tick(self) -> None:
        """Each running job without progress shows its seconds; stops when none waits."""
        now, waiting = time.perf_counter(), False
        for job_id, (_item, bar) in self._items.items():
            job = self.runner.jobs.get(job_id)
            if job is not None and job.state == RUNNING and job.total <= 0:
                set_bar(bar, 1000, 0, f"{now - job.started_at:.0f} s")
            waiting = waiting or (job is not None and job.state in (QUEUED, RUNNING))
        if not waiting:
            self.ticker.stop()

    def _fit_row(self, item: QTreeWidgetItem) -> None:
        width = max(20, self.tree.header().sectionSize(0) - NAME_MARGIN)
        flags = int(Qt.AlignmentFlag.AlignLeft) | int(Qt.TextFlag.TextWordWrap)
        needed = self.tree.fontMetrics().boundingRect(QRect(0, 0, width, 10_000), flags, item.text(0)).height()
        item.setSizeHint(0, QSize(width, needed + 6))  # a width of -1 makes Qt ignore the hint

    def _fit_rows(self) -> None:
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item is not None:  # rows taken out meanwhile (a window closing resizes as it goes)
                self._fit_row(item)

    def _changed(self, job_id: int) -> None:
        if job_id not in self._items:
            return  # a coalesced run whose row shows a newer one
        job = self.runner.jobs[job_id]
        item, bar = self._items[job_id]
        if job.total > 0:
            set_bar(bar, 1000, int(1000 * job.done / job.total), "%p%")
        elif job.state not in (QUEUED, RUNNING):  # ended without progress: the state says how
            set_bar(bar, 1000, 0, "")
        state = job.error or job.message or job.state
        text = state if job.state == RUNNING else f"{job.state}: {state}" if job.error else job.state
        item.setText(2, text.splitlines()[0] if text else text)
        tip = f"{job.name}: {text}" + (f"\n\n{job.details}" if job.details else "")
        for column in range(3):
            item.setToolTip(column, tip)
        if self.tree.currentItem() is item:
            self._show_detail()

    def _removed(self, job_id: int) -> None:
        entry = self._items.pop(job_id, None)
        if entry is None:
            return  # its row was taken over by a newer run of the same kind
        item, _bar = entry
        for name, shown in list(self._row_of_kind.items()):
            if shown == job_id:
                del self._row_of_kind[name]
        self.tree.takeTopLevelItem(self.tree.indexOfTopLevelItem(item))
        self._show_detail()

    def _show_detail(self) -> None:
        """The selected job's whole state (a failure's full message), wrapped."""
        item = self.tree.currentItem()
        job = self.runner.jobs.get(item.data(0, Qt.ItemDataRole.UserRole)) if item is not None else None
        self.cancel_button.setEnabled(job is not None and job.state in ("queued", RUNNING))
        if job is None:
            self.detail.setText("")
        elif job.state == FAILED:
            self.detail.setText(f"{job.name} failed: {job.error}")
        else:
            self.detail.setText(f"{job.name}: {job.message or job.state}")

    def _cancel_selected(self) -> None:
        item = self.tree.currentItem()
        if item is not None:
            self.runner.cancel(item.data(0, Qt.ItemDataRole.UserRole))
