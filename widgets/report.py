"""The report for the planning meeting: a PDF (and PNG) of the views, the distance table and the
provenance of every result shown.

Page one: the patient, study and scan (:mod:`tractlens.app.report_data`: from the NIfTI's
sidecar, edited by the user), the 3-D view and the three planes at the cursor, the distance to
the lesion of every tractogram (and of what its selection shows) with the safety margin, the
statistics of the tractograms and ROIs, the connectivity matrix when one is shown; then the
parameters of every visible layer in words, continued on further pages only when they do not
fit. Text is at least 9 pt at A4. The same drawing code paints the PDF (vector text, QPdfWriter) and
the PNG pages (QImage), so both show the same thing.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PySide6.QtCore import QMarginsF, QRectF, QSizeF, Qt
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QImage, QPageLayout, QPageSize, QPainter, QPdfWriter, QPen
from PySide6.QtWidgets import QApplication

from tractlens.app import __version__
from tractlens.app.envelopes import LEVEL_MEANING
from tractlens.app.errors import InputError
from tractlens.app.io import atomic_path
from tractlens.app.model import Document, Layer
from tractlens.app.pipelines.connectivity import DEFAULT_MARGIN_MM, DISTANCE_STREAMLINE_SCALAR, DistanceRow
from tractlens.app.pipelines.connectivity import distance_rows as tract_distance_rows
from tractlens.app.report_data import (
    ScanInfo,
    document_scan_info,
    export_rows,
    export_summary,
    navigation_exports,
    parameter_rows,
)
from tractlens.app.selection import shown_of
from tractlens.app.statistics import StatisticsTable, layer_statistics
from tractlens.app.tractogram import first_column
from tractlens.app.window_words import device_choice

from .envelope_display import envelope_rows

DPI = 150
PAGE_PX = (1240, 1754)  # A4 at 150 dpi
MARGIN_PX = 70
WARN = QColor(200, 30, 30)
MIN_PT = 9  # the smallest text, legible on a printed A4 page


@dataclass
class ReportContent:
    """What a report shows, gathered on the GUI thread from the window (or a reopened session)."""

    title: str
    subtitle: list[str]
    images: list[tuple[str, QImage]]
    margin_mm: float
    lesion: str
    rows: list[DistanceRow]
    extra_images: list[tuple[str, QImage]] = field(default_factory=list)
    provenance: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)  # (setting, value) rows
    scan: ScanInfo = field(default_factory=ScanInfo)
    statistics: list[StatisticsTable] = field(default_factory=list)
    exports: list[dict] = field(default_factory=list)  # exports for navigation (ExportResult.as_dict)
    envelopes: list = field(default_factory=list)  # uncertainty envelopes' distances (EnvelopeRow)


def distance_rows(document: Document, margin_mm: float) -> list[DistanceRow]:
    """A row per tractogram carrying distances to the lesion, and one for what its selection shows."""
    rows = []
    for layer in document.layers:
        if layer.kind != "tractogram":
            continue
        per = layer.data.streamline_scalars.get(DISTANCE_STREAMLINE_SCALAR)
        if per is None:
            continue
        per = first_column(per, len(layer.data))
        rows += tract_distance_rows(layer.name, per, margin_mm, layer.selection, layer.selection_by)
    return rows


def provenance_lines(layer: Layer) -> list[tuple[str, str]]:
    """A layer's parameters and provenance as (setting, value) rows in words, with units (no
    internal keys, no "inf")."""
    lines = parameter_rows(layer.provenance) if layer.provenance else []
    if layer.kind == "tractogram":
        lines.insert(0, ("streamlines", f"{len(layer.data):,} ({shown_of(layer).text})"))
    return lines or [("", "no provenance recorded")]


def report_statistics(document: Document) -> list[StatisticsTable]:
    """The statistics of every tractogram and of every visible, non-empty ROI."""
    out = []
    for layer in document.layers:
        if layer.kind == "tractogram" or (layer.kind == "roi" and layer.visible and layer.data.mask.any()):
            out.append(layer_statistics(document, layer))
    return out


#: The longest a report waits for a slice view's worker-drawn parts (glyphs, a whole-brain
#: tractogram's segments) before it takes the view as it is.
SETTLE_S = 30.0


def settled(view, timeout_s: float = SETTLE_S):
    """``view`` once what its workers draw for the slice shown now has arrived: one paint asks
    for it (a new slice position has none yet), then events are processed until it is drawn."""
    view.repaint()
    end = time.monotonic() + timeout_s
    while not view.glyphs_ready() and time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.005)
    QApplication.processEvents()
    return view


def _qimage(rgb: np.ndarray) -> QImage:
    rgb = np.ascontiguousarray(rgb[..., :3], dtype=np.uint8)
    height, width = rgb.shape[:2]
    return QImage(rgb.data, width, height, 3 * width, QImage.Format.Format_RGB888).copy()


def gather(
    window, *, margin_mm: float | None = None, lesion: str | None = None, scan: ScanInfo | None = None
) -> ReportContent:
    """The report's content from a main window (its document, views and panels); ``scan``: the
    patient and scan fields (else those the user edited, else the sidecar's)."""
    doc = window.document
    if scan is None:
        reports = getattr(window, "reports", None)
        scan = getattr(reports, "scan_info", None) or document_scan_info(doc)
    presurgical = getattr(window, "presurgical_panel", None)
    if margin_mm is None:
        margin_mm = float(getattr(presurgical, "margin_mm", DEFAULT_MARGIN_MM))
    if lesion is None:
        lesion = str(getattr(presurgical, "lesion_name", "") or "")
    cursor_before = doc.cursor.copy()
    centre = _lesion_centre(doc, lesion)
    if centre is not None:  # the planes through the lesion
        doc.set_cursor(centre)
        QApplication.processEvents()
    window.view3d.request_render()
    QApplication.processEvents()
    images = [("3-D view", _qimage(window.view3d.screenshot()))]
    hint = getattr(getattr(window, "first_steps", None), "hint", None)
    hint_shown = hint is not None and hint.isVisible()
    if hint_shown:  # a hint for the user at the screen, not for the report's reader
        hint.hide()
    for name in ("axial", "coronal", "sagittal"):
        images.append((f"{name} (slice {_slice_index(doc, name)})", settled(window.views[name]).grab().toImage()))
    if hint_shown:
        hint.show()
    cursor_text = (
        f"voxel {tuple(int(v) for v in doc.cursor)}, RAS {tuple(round(float(v), 1) for v in doc.cursor_world())} mm"
    )
    if centre is not None:
        cursor_text = f"planes through the lesion's centre: {cursor_text}"
    doc.set_cursor(cursor_before)
    extra = []
    connectivity = getattr(window, "connectivity_panel", None)
    heatmap = getattr(connectivity, "heatmap", None)
    if connectivity is not None and getattr(connectivity, "matrix", None) is not None and heatmap is not None:
        extra.append((f"connectivity ({connectivity.matrix.measure})", heatmap.grab().toImage()))
    reference = next((layer.provenance.get("file") for layer in doc.layers if layer.provenance.get("file")), "")
    subtitle = [
        f"{time.strftime('%Y-%m-%d %H:%M')} · TractLens {__version__} · compute device: {device_choice(window.device)}",
        f"data: {reference or '(none loaded)'}",
        cursor_text,
    ]
    provenance, seen = [], {}
    for layer in doc.layers:
        if not (layer.visible or layer.kind == "tractogram"):
            continue
        lines = provenance_lines(layer)
        key = repr(lines)
        provenance.append((f"{layer.name} ({layer.kind})", [("", f"as {seen[key]}")] if key in seen else lines))
        seen.setdefault(key, layer.name)
    return ReportContent(
        "TractLens report",
        subtitle,
        images,
        margin_mm,
        lesion,
        distance_rows(doc, margin_mm),
        extra,
        provenance,
        scan,
        report_statistics(doc),
        navigation_exports(doc),
        envelope_rows(doc, margin_mm),
    )


def _lesion_centre(doc: Document, name: str):
    """The lesion layer's centre of mass as a reference voxel, or None."""
    if not name or doc.reference_affine is None:
        return None
    try:
        layer = doc.layer(name)
    except KeyError:
        return None
    mask = layer.data.mask if layer.kind == "roi" else np.asarray(layer.data.data) != 0
    if mask.ndim != 3 or not mask.any():
        return None
    centre = np.argwhere(mask).mean(axis=0)
    world = layer.data.affine[:3, :3] @ centre + layer.data.affine[:3, 3]
    return np.linalg.solve(doc.reference_affine, np.append(world, 1.0))[:3]


def _slice_index(doc: Document, name: str) -> int:
    axis = {"sagittal": 0, "coronal": 1, "axial": 2}[name]
    return int(doc.cursor[axis])


class _Pages:
    """Paints pages one after another on a PDF writer, on images, or both in step."""

    def __init__(self, pdf_path: Path | None, png: bool):
        self.images: list[QImage] = []
        self.png = png
        self.pdf: QPdfWriter | None = None
        self.pdf_painter: QPainter | None = None
        self.image_painter: QPainter | None = None
        if pdf_path is not None:
            self.pdf = QPdfWriter(str(pdf_path))
            self.pdf.setResolution(DPI)
            self.pdf.setPageLayout(
                QPageLayout(QPageSize(QPageSize.PageSizeId.A4), QPageLayout.Orientation.Portrait, QMarginsF(0, 0, 0, 0))
            )
            self.pdf.setTitle("TractLens report")
            self.pdf.setCreator(f"TractLens {__version__}")
        self.count = 0
        self.new_page()

    def painters(self) -> list[QPainter]:
        return [p for p in (self.pdf_painter, self.image_painter) if p is not None]

    def new_page(self) -> None:
        if self.count:
            if self.pdf is not None:
                self.pdf.newPage()
            if self.image_painter is not None:
                self.image_painter.end()
        if self.pdf is not None and self.pdf_painter is None:
            self.pdf_painter = QPainter(self.pdf)
        if self.png:
            image = QImage(*PAGE_PX, QImage.Format.Format_RGB32)
            image.fill(Qt.GlobalColor.white)
            self.images.append(image)
            self.image_painter = QPainter(image)
        for painter in self.painters():
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        self.count += 1

    def finish(self) -> None:
        for painter in self.painters():
            painter.end()


class _Flow:
    """Top-to-bottom layout on A4 pages in 150-dpi pixels."""

    def __init__(self, pages: _Pages):
        self.pages = pages
        self.y = MARGIN_PX
        self.width = PAGE_PX[0] - 2 * MARGIN_PX

    def need(self, height: float) -> None:
        if self.y + height > PAGE_PX[1] - MARGIN_PX:
            self.pages.new_page()
            self.y = MARGIN_PX

    def text(self, text: str, size: float = 9, *, bold=False, colour=None, indent=0.0) -> None:
        font = QFont("DejaVu Sans", 1)
        font.setPixelSize(max(1, round(size * DPI / 72)))
        font.setBold(bold)
        metrics = QFontMetricsF(font)
        rect = QRectF(MARGIN_PX + indent, 0, self.width - indent, 10_000)
        flags = int(Qt.AlignmentFlag.AlignLeft) | int(Qt.TextFlag.TextWordWrap)
        height = metrics.boundingRect(rect, flags, text).height()
        self.need(height)
        for painter in self.pages.painters():
            painter.setFont(font)
            painter.setPen(QPen(colour or QColor(20, 20, 20)))
            painter.drawText(QRectF(rect.x(), self.y, rect.width(), height + 2), flags, text)
        self.y += height + 2

    def images(self, images: list[tuple[str, QImage]], columns: int = 2, aspect: float = 0.72) -> None:
        gap = 16
        cell_w = (self.width - gap * (columns - 1)) / columns
        cell_h = cell_w * aspect
        for start in range(0, len(images), columns):
            self.need(cell_h + 30)
            for col, (caption, image) in enumerate(images[start : start + columns]):
                x = MARGIN_PX + col * (cell_w + gap)
                scaled = QSizeF(image.width(), image.height()).scaled(
                    QSizeF(cell_w, cell_h), Qt.AspectRatioMode.KeepAspectRatio
                )
                target = QRectF(
                    x + (cell_w - scaled.width()) / 2,
                    self.y + (cell_h - scaled.height()) / 2,
                    scaled.width(),
                    scaled.height(),
                )
                for painter in self.pages.painters():
                    painter.fillRect(QRectF(x, self.y, cell_w, cell_h), QColor(0, 0, 0))
                    painter.drawImage(target, image)
                    painter.setPen(QPen(QColor(90, 90, 90)))
                    painter.drawRect(QRectF(x, self.y, cell_w, cell_h))
                    font = QFont("DejaVu Sans", 1)
                    font.setPixelSize(round(MIN_PT * DPI / 72))
                    painter.setFont(font)
                    painter.setPen(QPen(QColor(20, 20, 20)))
                    painter.drawText(
                        QRectF(x, self.y + cell_h + 2, cell_w, 24), int(Qt.AlignmentFlag.AlignHCenter), caption
                    )
            self.y += cell_h + 30

    def table(
        self, header: list[str] | None, rows: list[tuple[list[str], bool]], widths: list[float], *, align_left=False
    ) -> None:
        """A table whose cells wrap (a row grows to its tallest cell); ``header`` None: none."""
        font = QFont("DejaVu Sans", 1)
        font.setPixelSize(round(MIN_PT * DPI / 72))
        strong = QFont(font)
        strong.setBold(True)
        total = sum(widths)
        columns = [w / total * self.width for w in widths]
        wrap = int(Qt.TextFlag.TextWordWrap)
        lines = ([(header, False)] if header is not None else []) + list(rows)
        for index, (cells, warn) in enumerate(lines):
            is_header = header is not None and index == 0
            metrics = QFontMetricsF(strong if is_header or warn else font)
            line = 8 + max(
                [metrics.height()]
                + [metrics.boundingRect(QRectF(0, 0, w - 12, 10_000), wrap, c).height() for c, w in zip(cells, columns)]
            )
            self.need(line)
            x = MARGIN_PX
            for painter in self.pages.painters():
                if is_header:
                    painter.fillRect(QRectF(MARGIN_PX, self.y, self.width, line), QColor(225, 228, 235))
                elif warn:
                    painter.fillRect(QRectF(MARGIN_PX, self.y, self.width, line), QColor(252, 225, 225))
            for cell, width in zip(cells, columns):
                for painter in self.pages.painters():
                    bold = QFont(font)
                    bold.setBold(is_header or warn)
                    painter.setFont(bold)
                    painter.setPen(QPen(WARN if warn else QColor(20, 20, 20)))
                    align = (
                        wrap
                        | int(Qt.AlignmentFlag.AlignVCenter)
                        | (
                            int(Qt.AlignmentFlag.AlignLeft)
                            if x == MARGIN_PX or align_left or width > 0.25 * self.width
                            else int(Qt.AlignmentFlag.AlignRight)
                        )
                    )
                    painter.drawText(QRectF(x + 6, self.y, width - 12, line), align, cell)
                x += width
            for painter in self.pages.painters():
                painter.setPen(QPen(QColor(200, 200, 200)))
                painter.drawLine(MARGIN_PX, int(self.y + line), int(MARGIN_PX + self.width), int(self.y + line))
            self.y += line
        self.y += 10


def _scan_block(flow: _Flow, scan: ScanInfo) -> None:
    """Patient, study and scan fields as a two-pair-per-row table."""
    pairs = scan.lines()
    rows = []
    for i in range(0, len(pairs), 2):
        cells = [*pairs[i], *(pairs[i + 1] if i + 1 < len(pairs) else ("", ""))]
        rows.append((cells, False))
    flow.table(None, rows, [1.3, 2.7, 1.3, 2.7], align_left=True)


def _statistics_rows(tables: list[StatisticsTable]) -> list[tuple[list[str], bool]]:
    rows = []
    for table in tables:
        by = {q.name: q for q in table.quantities}
        if table.kind == "tractogram":
            count = f"{by['streamlines shown'].text} of {by['streamlines in total'].text}"
            size = by["length mean"].text, by["volume of voxels visited"].text
        else:
            count, size = f"{by['voxels'].text} voxels", ("", by["volume"].text)
        maps = " · ".join(
            f"{q.name.rsplit(' ', 2)[0]} {q.text}"
            for q in table.quantities
            if q.name.endswith(("along mean", "inside mean"))
        )
        rows.append(([table.subject, count, *size, maps or "none"], False))
    return rows


def render(content: ReportContent, pdf_path: Path | None, png: bool) -> list[QImage]:
    """Paint the report; returns the page images (empty unless ``png``)."""
    pages = _Pages(pdf_path, png)
    flow = _Flow(pages)
    flow.text(content.title, 18, bold=True)
    for line in content.subtitle:
        flow.text(line, MIN_PT, colour=QColor(80, 80, 80))
    flow.y += 4
    _scan_block(flow, content.scan)
    flow.images(content.images, aspect=0.56)
    lesion = f" '{content.lesion}'" if content.lesion else ""
    flow.text(f"Distance to the lesion{lesion} · safety margin {content.margin_mm:g} mm", 11, bold=True)
    if content.rows:
        rows = [
            (
                [
                    r.name,
                    str(r.streamlines),
                    r.closest_text,
                    str(r.within_margin),
                    f"{r.percent_within:.1f} %",
                    r.shown,
                ],
                r.within_margin > 0,
            )
            for r in content.rows
        ]
        flow.table(
            ["bundle / selection", "streamlines", "closest (mm)", "within margin", "share", "shown"],
            rows,
            [2.8, 1.7, 1.5, 1.5, 1.1, 3.2],
        )
        flow.text(
            "Distance from each streamline to the nearest lesion voxel (each voxel taken as the ellipsoid inscribed in it), "
            "streamlines sampled every quarter voxel; rows in red come within the margin.",
            MIN_PT,
            colour=QColor(90, 90, 90),
        )
    elif not content.envelopes:
        flow.text("No distances measured (Analysis ▸ Distance to lesion).", MIN_PT, colour=QColor(90, 90, 90))
    if content.envelopes:
        flow.table(
            ["uncertainty envelope", "level", "closest (mm)", "within margin"],
            [
                ([r.name, f"{r.level:g} %", r.closest_text, "yes" if r.within_margin else "no"], r.within_margin)
                for r in content.envelopes
            ],
            [3.2, 1.2, 2.4, 1.6],
        )
        flow.text(
            LEVEL_MEANING + " Distance: between the nearest voxel centres of the envelope and the lesion.",
            MIN_PT,
            colour=QColor(90, 90, 90),
        )
    if content.statistics:
        flow.text("Statistics (of the streamlines shown)", 11, bold=True)
        flow.table(
            ["tractogram / ROI", "streamlines", "length (mm)", "volume", "maps (mean ± sd)"],
            _statistics_rows(content.statistics),
            [2.6, 1.6, 1.8, 1.6, 4.4],
        )
    if content.extra_images:
        flow.images(content.extra_images, columns=2, aspect=0.8)
    if content.exports:
        flow.text("Exported for navigation", 11, bold=True)
        for export in content.exports:
            flow.text(export_summary(export), MIN_PT, colour=QColor(60, 60, 60))
            # UIDs have no spaces: zero-width spaces between their characters let a cell wrap them
            rows = [([*row[:2], *("\u200b".join(uid) for uid in row[2:])], False) for row in export_rows(export)]
            flow.table(["object", "file", "series instance UID", "SOP instance UID"], rows, [2.2, 2.4, 3.0, 3.6],
                       align_left=True)  # fmt: skip
    flow.text("Results and provenance", 11, bold=True)
    rows = []
    for title, lines in content.provenance:  # one table: the result, then its settings two by two
        pairs = [line if isinstance(line, tuple) else ("", line) for line in lines]
        for index in range(0, len(pairs), 2):
            cells = [cell for pair in pairs[index : index + 2] for cell in pair]
            rows.append(([title if index == 0 else "", *cells, *[""] * (4 - len(cells))], False))
    if rows:
        flow.table(["result", "setting", "value", "setting", "value"], rows, [2.4, 2.2, 2.0, 2.2, 2.0], align_left=True)
    pages.finish()
    return pages.images


def export_report(window, path: str | os.PathLike, *, png: bool = True, **options) -> list[Path]:
    """Write the report as PDF to ``path`` (and ``path``'s stem + ``.png``, ``-2.png``… per page).

    Returns the files written. The PDF is written beside the target and renamed over it."""
    if not window.document.layers:  # a report of black panels helps nobody
        raise InputError("there is nothing to report yet", fix="open data first (File ▸ Open, or File ▸ Open demo)")
    path = Path(path)
    if path.suffix.lower() != ".pdf":
        path = path.with_suffix(".pdf")
    path.parent.mkdir(parents=True, exist_ok=True)
    content = gather(window, **options)
    with atomic_path(path) as tmp:
        images = render(content, tmp, png)
        _check_complete_pdf(tmp)
    written = [path]
    for index, image in enumerate(images):
        name = f"{path.stem}.png" if index == 0 else f"{path.stem}-{index + 1}.png"
        written.append(save_image(image, path.with_name(name)))
    return written


def _check_complete_pdf(path: Path) -> None:
    """QPdfWriter reports no write error: a full disk would leave a PDF without its end."""
    try:
        with open(path, "rb") as pdf:
            pdf.seek(max(0, path.stat().st_size - 1024))
            tail = pdf.read()
    except OSError:
        tail = b""
    if b"%%EOF" not in tail:
        raise OSError(errno.EIO, "the PDF could not be written completely (is the disk full?)")


def save_image(image, path: Path) -> Path:
    """A QImage as PNG, atomically (QImage.save only says yes or no: no means nothing usable)."""
    with atomic_path(path) as tmp:
        if not image.save(str(tmp)):
            raise OSError(errno.EIO, "the image could not be written (is the disk full?)")
    return path
