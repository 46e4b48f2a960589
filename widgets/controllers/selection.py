"""The fibre selection by ROIs while they are drawn: a throttle on the document's ROI edits and
one selection job at a time on the :class:`~tractlens.widgets.jobs.JobRunner`.

What is selected is :mod:`tractlens.app.selection`'s business (the ROI snapshot, the streamline
index in ``document.derived``); this controller only decides when to run it. It holds no widget.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from tractlens.app.model import Document
from tractlens.app.selection import (
    RoiSelection,
    empty_selection_notice,
    filtered_tractograms,
    has_selecting_rois,
    select_fibres,
    selected_by_rois,
)

from ..jobs import JobRunner

THROTTLE_MS = 40
SELECTION_FRAME_HOLD_S = 0.15  # the 3-D frame of an ROI edit waits at most this long for its selection


class FibreSelection(QObject):
    """Shows on every tractogram the user filters by ROIs (``layer.filter_by_rois``, the layer
    menu's "Filter by ROIs") the streamlines that pass them (seed, target, waypoint: all;
    exclusion: none), updated as ROIs are edited; the others show every streamline.

    A throttle, not a debounce, with a leading edge: an edit with no other in the last
    :data:`THROTTLE_MS` is selected at once (at the event loop's next turn, with the rest of that
    edit, before the views' own work of the edit) and starts :attr:`timer`; edits made while
    it runs are selected together when it ends, so a continuous drag updates the selection every
    :data:`THROTTLE_MS` instead of only when it stops, and a single edit waits for nothing. One
    run at a time: edits made while one runs start another when it is done (cancelling it instead
    would starve the selection while an ROI is dragged or painted, if a run takes longer than the
    edits' pace)."""

    error = Signal(str, str)  # message, details
    notice = Signal(str)  # what the user should read: a selection that shows no streamline, and why
    # An ROI edit whose selection starts at once, and that selection shown (or failed, or dropped):
    # the window holds the 3-D frame of the edit for the selection (at most SELECTION_FRAME_HOLD_S),
    # so that both come in one frame and the GUI thread is free for the selection sooner.
    selecting = Signal()
    selected = Signal()

    def __init__(self, document: Document, runner: JobRunner, *, device: str = "auto", parent: QObject | None = None):
        super().__init__(parent)
        self.document = document
        self.runner = runner
        self.device = device
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(THROTTLE_MS)
        self.timer.timeout.connect(self._trailing)
        self._pending = False  # edited while the timer runs: selected when it ends
        self.job: int | None = None
        self._stale = False  # edited while a selection was being computed: run again
        self._from_rois = False  # the tractograms' selections come from the ROIs
        document.connect(self._on_document, first=True)  # (see _on_document)

    def _on_document(self, _source, event, **info) -> None:
        layer = info.get("layer")
        roi_changed = event == "roi" or (event == "display" and layer is not None and layer.kind == "roi")
        if event == "display" and "filter_by_rois" in info.get("changed", ()):
            roi_changed = True
        if not (roi_changed or event == "layers"):
            return
        if self.timer.isActive():
            self._pending = True
            return
        self.timer.start()
        # At the next turn, with the edit's other events of this turn (an edit may be several: a
        # shape moved is erased, then painted; started at the first, the selection would show the
        # half-made edit first). Heard before the views (``first``), this turn's call comes before
        # theirs: the 3-D view's patch of the stroke and the slice views' paints follow the submit.
        QTimer.singleShot(0, self, self._leading)
        if filtered_tractograms(self.document) and has_selecting_rois(self.document):
            self.selecting.emit()  # now: the edit's frame, asked for already, is drawn after this

    def _leading(self) -> None:
        self._pending = False  # (the edit's other events of the same turn are in this run)
        self.update()

    def _trailing(self) -> None:
        if self._pending:
            self._pending = False
            self.update()

    def update(self) -> int | None:
        """Select now (on a worker, from a snapshot of the masks); the job id, or None when
        nothing was started."""
        doc = self.document
        for layer in doc.layers:  # the user stopped filtering it: every streamline again
            if layer.kind == "tractogram" and not layer.filter_by_rois and selected_by_rois(layer):
                layer.set_selection(None)
        if not filtered_tractograms(doc):
            return None
        if not has_selecting_rois(doc):
            self._clear()
            return None
        self._from_rois = True
        running = self.runner.jobs.get(self.job) if self.job is not None else None
        if running is not None and running in self.runner.active() and not running.cancel_event.is_set():
            self._stale = True  # selected again with the masks of then, when it is done
            return None
        request = RoiSelection.of(doc)
        device = self.device

        def job(ctx):
            result = select_fibres(doc, request, device=device, cancelled=ctx.cancelled, check=ctx.check)
            for layer, selected in result:  # the index ranges the views draw, here and not on the GUI thread
                ctx.check()
                doc.fiber_arrays.prepare_selection(layer, selected)
            return result

        this = {}

        def done(result) -> None:
            if this["id"] != self.job:  # cancelled after it had finished: stale
                return
            notices = []
            for layer, selected in result:
                if layer in doc.layers and layer.filter_by_rois:
                    layer.set_selection(selected, by=request.by)
                    notices.append(empty_selection_notice(layer))
            self._finished()
            self.selected.emit()
            text = " ".join(n for n in notices if n)
            if text:
                self.notice.emit(text)

        def failed(message: str, details: str) -> None:
            if this["id"] == self.job:
                self._finished()
            self.selected.emit()
            self.error.emit(message, details)

        this["id"] = self.job = self.runner.submit("select streamlines", job, on_done=done, on_error=failed)
        return self.job

    def _clear(self) -> None:
        """No ROIs: only a selection the ROIs made is cleared; one chosen another way (a
        connectivity cell) stays through unrelated changes (a file opened, a result added)."""
        if self.job is not None:  # its result is stale now
            self.runner.cancel(self.job)
            self.job, self._stale = None, False
            self.selected.emit()  # (nothing more to wait for)
        if self._from_rois:
            for layer in filtered_tractograms(self.document):
                layer.set_selection(None)
            self._from_rois = False

    def _finished(self) -> None:
        self.job = None
        if self._stale:
            self._stale = False
            self.update()
