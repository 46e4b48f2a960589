"""The Statistics panel: the numbers of the chosen tractogram (its shown streamlines) or ROI, with
every open scalar map (:mod:`tractlens.app.statistics` computes them, on a worker), and their CSV.

The table follows the choice and the tractogram's selection: a selection by ROIs or a
connectivity cell changes what is measured, and the note above the table says so."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from tractlens.app.io import write_text_atomic
from tractlens.app.model import Document
from tractlens.app.statistics import StatisticsTable, layer_statistics, statistics_csv_text

from . import dialogs
from .job_panel import JobPanelBase
from .layer_combo import LayerCombo

COLUMNS = ("quantity", "value")


class StatisticsPanel(JobPanelBase):
    """Layer chooser (tractograms and ROIs), the table, Refresh and Export CSV….

    For scripts and tests: :meth:`refresh` (the job id), ``statistics`` (the shown
    :class:`~app.statistics.StatisticsTable`), :meth:`export_csv`."""

    job_label = "Statistics"

    def __init__(self, document: Document, runner, *, device: str = "auto", report=None, parent=None):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.statistics: StatisticsTable | None = None
        self.layer_box = LayerCombo(document, ("tractogram", "roi"), show_kind=True)
        self.layer_box.setObjectName("statistics_layer")
        self.layer_box.setMinimumContentsLength(8)
        self.layer_box.setToolTip("The tractogram (its shown streamlines) or ROI to measure")
        self.layer_box.activated.connect(lambda _i: self.refresh())
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setObjectName("statistics_refresh")
        self.refresh_button.clicked.connect(self.refresh)
        self.export_button = QPushButton("CSV…")
        self.export_button.setToolTip("Export the table as CSV")
        self.export_button.setObjectName("statistics_export")
        self.export_button.clicked.connect(lambda: self.export_csv())
        self.note = QLabel("")
        self.note.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("statistics_table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.table.setMinimumHeight(24)  # a tab beside Jobs: small enough not to raise the window's minimum height
        buttons = QHBoxLayout()  # one row: the chooser and the buttons
        buttons.addWidget(self.layer_box, 1)
        for button in (self.refresh_button, self.export_button):  # (cancelled from the job list: a short job)
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.setSpacing(2)
        layout.addLayout(buttons)
        layout.addWidget(self.note)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        self._seen, self._stale = True, False  # (:meth:`set_seen`)
        document.connect(self._on_document)
        self._say_next()

    def _say_next(self) -> None:
        """Before a first result: what Refresh will measure, in words (never "Choose…" with one chosen)."""
        if self.statistics is None and self.job_id is None:
            layer = self.layer_box.layer()
            self.status.setText(
                "Open a tractogram or draw an ROI: its statistics are shown here."
                if layer is None
                else f"Refresh measures {layer.name}: streamlines, lengths in mm, volume in mm³, mean maps."
            )

    def _on_document(self, _source, event, **info) -> None:
        if event == "layers":
            if "replaced" in info:
                self.layer_box.follow(*info["replaced"])
            self.layer_box.refresh()
            self._say_next()
        elif event == "display" and info.get("layer") is self.layer_box.layer():
            if "selection" in info.get("changed", ()):
                # Measured when seen: a hidden tab (behind Jobs) measures once it is shown, not at
                # every ROI edit (a whole-brain selection's statistics read every selected point,
                # on all cores, while the window draws the selection).
                self._stale = not self._seen
                if not self._stale:
                    self.refresh()

    @property
    def seen(self) -> bool:
        return self._seen

    def set_seen(self, seen: bool) -> None:
        """Whether the panel can be seen (its dock's ``visibilityChanged``: a tab behind another
        is not); a selection that changed while unseen is measured when it is seen again."""
        self._seen = bool(seen)
        if self._seen and self._stale:
            self._stale = False
            self.refresh()

    def refresh(self) -> int | None:
        """Compute the chosen layer's statistics on a worker; the job id (None: nothing chosen)."""
        layer = self.layer_box.layer()
        if layer is None:
            self.status.setText("Open a tractogram or draw an ROI: its statistics are shown here.")
            return None
        doc = self.document
        token = self._next_token()
        self.status.setText(f"Statistics of {layer.name}…")

        def job(ctx):
            ctx.progress(0, 1, f"statistics of {layer.name}")
            return layer_statistics(doc, layer, progress=ctx.progress, cancelled=ctx.cancelled)

        return self._start(
            f"statistics of {layer.name}", job, on_done=lambda table, token=token: self._done(token, table), token=token
        )

    def _done(self, token: int, table: StatisticsTable) -> None:
        if token != self._token:
            return
        self._job_ended()
        self.statistics = table
        self.note.setText(table.note)
        self.table.setRowCount(len(table.quantities))
        for row, quantity in enumerate(table.quantities):
            self.table.setItem(row, 0, QTableWidgetItem(quantity.name))
            value = QTableWidgetItem(quantity.text)
            value.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(row, 1, value)
        self.status.setText(f"Statistics of {table.subject}.")

    def _cancelled(self) -> None:
        self.status.setText("Statistics cancelled.")

    def export_csv(self, path=None):
        """Write the shown statistics as CSV (asks for the file when ``path`` is None); the path or None."""
        if self.statistics is None:
            self.status.setText("Nothing to export yet: choose a tractogram or an ROI.")
            return None
        if path is None:
            path = dialogs.save_file(self, "Export statistics", f"{self.statistics.subject}_stats.csv", "CSV (*.csv)")
            if not path:
                return None
        try:
            written = write_text_atomic(statistics_csv_text([self.statistics]), path)
        except OSError as exc:
            self.status.setText(f"The statistics could not be written: {exc}")
            self.report(f"The statistics could not be written: {exc}", "")
            return None
        self.status.setText(f"Statistics written to {written}.")
        return written
