"""The report for the planning meeting: a PDF (and PNG) of the views, the distance table and the
provenance of every result shown.

Page one: the 3-D view and the three planes at the cursor, the distance to the lesion of every
tractogram (and of its ROI selection) with the safety margin, the connectivity matrix when one
is shown; then the parameters and provenance of every visible layer, continued on further pages
only when they do not fit. The same drawing code paints the PDF (vector text, QPdfWriter) and
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
from tractlens.app.io import atomic_path
from tractlens.app.model import Document, Layer
from tractlens.app.pipelines.connectivity import (
    DEFAULT_MARGIN_MM,
    DISTANCE_STREAMLINE_SCALAR,
    DistanceRow,
    distance_row,
)
from tractlens.app.tractogram import first_column

DPI = 150
PAGE_PX = (1240, 1754)  # A4 at 150 dpi
MARGIN_PX = 70
WARN = QColor(200, 30, 30)


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
    provenance: list[tuple[str, list[str]]] = field(default_factory=list)


def distance_rows(document: Document, margin_mm: float) -> list[DistanceRow]:
    """A row per tractogram carrying distances to the lesion, and one for its ROI selection."""
    rows = []
    for layer in document.layers:
        if layer.kind != "tractogram":
            continue
        per = layer.data.streamline_scalars.get(DISTANCE_STREAMLINE_SCALAR)
        if per is None:
            continue
        per = first_column(per, len(layer.data))
        rows.append(distance_row(layer.name, per, margin_mm))
        if layer.selection is not None and not layer.selection.all():
            rows.append(distance_row(f"{layer.name} (selected)", per[layer.selection], margin_mm))
    return rows


def _flatten(value, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            out += _flatten(item, f"{prefix}{key}.")
        return out
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, list | tuple) and len(value) > 8:
        text = f"[{', '.join(str(v) for v in value[:8])}, … ({len(value)} values)]"
    else:
        text = str(value)
    return [f"{prefix[:-1]}: {text}"]


def provenance_lines(layer: Layer) -> list[str]:
    lines = _flatten(layer.provenance) if layer.provenance else ["(no provenance recorded)"]
    if layer.kind == "tractogram":
        lines.insert(0, f"streamlines: {len(layer.data)}, points: {len(layer.data.points)}")
    return lines


def _qimage(rgb: np.ndarray) -> QImage:
    rgb = np.ascontiguousarray(rgb[..., :3], dtype=np.uint8)
    height, width = rgb.shape[:2]
    return QImage(rgb.data, width, height, 3 * width, QImage.Format.Format_RGB888).copy()


def gather(window, *, margin_mm: float | None = None, lesion: str | None = None) -> ReportContent:
    """The report's content from a main window (its document, views and panels)."""
    doc = window.document
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
    for name in ("axial", "coronal", "sagittal"):
        images.append((f"{name} (slice {_slice_index(doc, name)})", window.views[name].grab().toImage()))
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
        f"{time.strftime('%Y-%m-%d %H:%M')} · TractLens {__version__} · compute device: {window.device}",
        f"data: {reference or '(none loaded)'}",
        cursor_text,
    ]
    provenance, seen = [], {}
    for layer in doc.layers:
        if not (layer.visible or layer.kind == "tractogram"):
            continue
        lines = provenance_lines(layer)
        key = "\n".join(lines)
        provenance.append((f"{layer.name} ({layer.kind})", [f"as {seen[key]}"] if key in seen else lines))
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
                    font.setPixelSize(round(8 * DPI / 72))
                    painter.setFont(font)
                    painter.setPen(QPen(QColor(20, 20, 20)))
                    painter.drawText(
                        QRectF(x, self.y + cell_h + 2, cell_w, 24), int(Qt.AlignmentFlag.AlignHCenter), caption
                    )
            self.y += cell_h + 30

    def table(self, header: list[str], rows: list[tuple[list[str], bool]], widths: list[float]) -> None:
        size = 9
        font = QFont("DejaVu Sans", 1)
        font.setPixelSize(round(size * DPI / 72))
        line = QFontMetricsF(font).height() + 8
        total = sum(widths)
        columns = [w / total * self.width for w in widths]
        for index, (cells, warn) in enumerate([(header, False), *rows]):
            self.need(line)
            x = MARGIN_PX
            for painter in self.pages.painters():
                if index == 0:
                    painter.fillRect(QRectF(MARGIN_PX, self.y, self.width, line), QColor(225, 228, 235))
                elif warn:
                    painter.fillRect(QRectF(MARGIN_PX, self.y, self.width, line), QColor(252, 225, 225))
            for cell, width in zip(cells, columns):
                for painter in self.pages.painters():
                    bold = QFont(font)
                    bold.setBold(index == 0 or warn)
                    painter.setFont(bold)
                    painter.setPen(QPen(WARN if warn else QColor(20, 20, 20)))
                    align = int(Qt.AlignmentFlag.AlignVCenter) | (
                        int(Qt.AlignmentFlag.AlignLeft) if x == MARGIN_PX else int(Qt.AlignmentFlag.AlignRight)
                    )
                    painter.drawText(QRectF(x + 6, self.y, width - 12, line), align, cell)
                x += width
            for painter in self.pages.painters():
                painter.setPen(QPen(QColor(200, 200, 200)))
                painter.drawLine(MARGIN_PX, int(self.y + line), int(MARGIN_PX + self.width), int(self.y + line))
            self.y += line
        self.y += 10


def render(content: ReportContent, pdf_path: Path | None, png: bool) -> list[QImage]:
    """Paint the report; returns the page images (empty unless ``png``)."""
    pages = _Pages(pdf_path, png)
    flow = _Flow(pages)
    flow.text(content.title, 20, bold=True)
    for line in content.subtitle:
        flow.text(line, 8, colour=QColor(80, 80, 80))
    flow.y += 10
    flow.images(content.images)
    lesion = f" '{content.lesion}'" if content.lesion else ""
    flow.text(f"Distance to the lesion{lesion} · safety margin {content.margin_mm:g} mm", 12, bold=True)
    if content.rows:
        rows = [
            (
                [
                    r.name,
                    str(r.streamlines),
                    f"{r.min_mm:.1f}" if np.isfinite(r.min_mm) else "–",
                    str(r.within_margin),
                    f"{r.percent_within:.1f} %",
                ],
                r.within_margin > 0,
            )
            for r in content.rows
        ]
        flow.table(
            ["bundle / selection", "streamlines", "closest (mm)", "within margin", "share"],
            rows,
            [4, 1.4, 1.6, 1.6, 1.2],
        )
        flow.text(
            "Distance from each fiber to the nearest lesion voxel (each voxel taken as the ellipsoid inscribed in it), "
            "fibers sampled every quarter voxel; rows in red come within the margin.",
            7,
            colour=QColor(90, 90, 90),
        )
    else:
        flow.text("No distances measured (Analysis ▸ Distance to lesion).", 9, colour=QColor(90, 90, 90))
    if content.extra_images:
        flow.y += 8
        flow.images(content.extra_images, columns=2, aspect=0.8)
    flow.y += 8
    flow.text("Results and provenance", 12, bold=True)
    for title, lines in content.provenance:
        flow.text(title, 8, bold=True)
        flow.text(" · ".join(lines), 7, indent=18, colour=QColor(60, 60, 60))
    pages.finish()
    return pages.images


def export_report(window, path: str | os.PathLike, *, png: bool = True, **options) -> list[Path]:
    """Write the report as PDF to ``path`` (and ``path``'s stem + ``.png``, ``-2.png``… per page).

    Returns the files written. The PDF is written beside the target and renamed over it."""
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
