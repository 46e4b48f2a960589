"""Pictures of the window: a screenshot (the whole window with the 3-D view pasted in, which
``QWidget.grab`` cannot read back from OpenGL) and the presurgical report
(:mod:`tractlens.widgets.report`), with their File-menu dialogs. This one is about widgets: it
holds the window it pictures."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PySide6.QtGui import QImage, QPainter

from tractlens.app.errors import InputError
from tractlens.app.report_data import FIELD_LABELS, ScanInfo, document_scan_info

from .. import dialogs
from ..report import export_report, save_image


class ReportController:
    """Screenshots and reports of ``window`` (a :class:`~tractlens.widgets.main_window.MainWindow`)."""

    def __init__(self, window):
        self.window = window
        #: the patient and scan fields as the user last confirmed them (kept in the session);
        #: None: not edited yet, read from the data's sidecar
        self.scan_info: ScanInfo | None = None

    def edit_scan_info(self) -> ScanInfo | None:
        """Show the patient, study and scan fields (from the sidecar, or as last edited) for
        editing; the confirmed fields (also kept for the session), or None when cancelled."""
        info = self.scan_info or document_scan_info(self.window.document)
        values = [(name, label, getattr(info, name)) for name, label in FIELD_LABELS]
        edited = dialogs.fields(self.window, "Report: patient and scan", values)
        if edited is None:
            return None
        self.scan_info = ScanInfo.from_dict({**info.as_dict(), **edited})
        return self.scan_info

    def session_state(self) -> dict:
        return {"scan": self.scan_info.as_dict()} if self.scan_info is not None else {}

    def restore_session_state(self, state: dict | None) -> None:
        scan = (state or {}).get("scan")
        self.scan_info = ScanInfo.from_dict(scan) if isinstance(scan, dict) else None

    def save_screenshot(self, path: str | os.PathLike) -> Path:
        """Write the whole window, the 3-D view included, as PNG."""
        window, view3d = self.window, self.window.view3d
        image = window.grab().toImage().convertToFormat(QImage.Format.Format_RGB888)
        if view3d.isVisible():  # not when another view is maximised
            rgb = np.ascontiguousarray(view3d.screenshot()[..., :3])
            height, width = rgb.shape[:2]
            view_image = QImage(rgb.data, width, height, 3 * width, QImage.Format.Format_RGB888)
            origin = view3d.mapTo(window, view3d.rect().topLeft())
            painter = QPainter(image)
            painter.drawImage(origin, view_image.scaled(view3d.size()))
            painter.end()

        return save_image(image, Path(path))

    def export_report(self, path: str | os.PathLike, **options) -> list[Path]:
        """The planning report as PDF (and PNG pages) — see :mod:`widgets.report`."""

        return export_report(self.window, path, **options)

    def report_dialog(self) -> None:
        if not self.window.document.layers:
            self.window.report_error("There is nothing to report yet: open data first (File ▸ Open, or Open demo).", "")
            return
        path = dialogs.save_file(self.window, "Export report", "report.pdf", "PDF (*.pdf)")
        if path and self.edit_scan_info() is not None:
            try:
                files = self.window.export_report(path)
            except (OSError, InputError) as exc:  # InputError: SaveError, e.g. the disk is full
                self.window.report_error(f"The report could not be written: {exc}", "")
                return
            self.window.statusBar().showMessage("Report written: " + ", ".join(f.name for f in files), 8000)

    def screenshot_dialog(self) -> None:
        path = dialogs.save_file(self.window, "Save screenshot", "tractlens.png", "PNG (*.png)")
        if path:
            try:
                self.window.save_screenshot(path)
            except (OSError, InputError) as exc:
                self.window.report_error(f"The screenshot could not be written: {exc}", "")
