"""The connectivity panel's plots: the region × region heat map (its cells select their
streamlines) and the along-tract profile, plain QPainter widgets (no matplotlib)."""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import QPointF, QRect, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QLinearGradient, QPainter, QPainterPath, QPen, QPolygonF
from PySide6.QtWidgets import (
    QToolTip,
    QWidget,
)

from tractlens.app.colormaps import LUTS
from tractlens.app.pipelines.connectivity import (
    ConnectivityMatrix,
)

ORDERS = {"label": "label order", "name": "name (A–Z)", "strength": "strength (row sum)"}
HEAT_LUT = "viridis"
EMPTY_CELL = QColor(40, 40, 46)  # cells without a streamline
BACKGROUND = QColor(24, 24, 28)
TEXT = QColor(225, 225, 225)


def _lut_colour(t: float, name: str = HEAT_LUT) -> QColor:
    rgb = LUTS[name][int(np.clip(t, 0.0, 1.0) * 255)]
    return QColor(*(int(v * 255 + 0.5) for v in rgb))


def _format(value: float) -> str:
    if not np.isfinite(value):
        return "–"
    if value == int(value) and abs(value) < 1e7:
        return str(int(value))
    return f"{value:.3g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (about ``count`` of them)."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, value = [], first
    while value <= hi + 1e-9 * step:
        ticks.append(round(value, 12))
        value += step
    return ticks


# --------------------------------------------------------------------------- layer choosers


class HeatMap(QWidget):
    """A :class:`ConnectivityMatrix` painted as a heat map with its row and column names and a
    colour bar. ``cell_clicked(row, column)`` gives the matrix's own (unsorted) indices."""

    cell_clicked = Signal(int, int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.matrix: ConnectivityMatrix | None = None
        self.log_scale = False
        self.order = "label"
        self.row_order: list[int] = []
        self.column_order: list[int] = []
        self.highlight: tuple[int, int] | None = None
        self.empty_text = "No matrix yet: choose a tractogram and a parcellation, then Compute."
        self.setMouseTracking(True)
        self.setMinimumSize(240, 220)

    # ---------------------------------------------------------------- state
    def set_matrix(self, matrix: ConnectivityMatrix | None) -> None:
        self.matrix = matrix
        self.highlight = None
        self._reorder()

    def set_log_scale(self, on: bool) -> None:
        self.log_scale = bool(on)
        self.update()

    def set_order(self, mode: str) -> None:
        """``label`` (the matrix's order), ``name`` (alphabetical) or ``strength`` (row sum of
        the values, descending). A symmetric matrix's columns follow its rows; a non-square
        one's columns keep their order."""
        if mode not in ORDERS:
            raise ValueError(f"unknown order {mode!r}: one of {', '.join(ORDERS)}")
        self.order = mode
        self._reorder()

    def _reorder(self) -> None:
        m = self.matrix
        if m is None:
            self.row_order, self.column_order = [], []
        else:
            rows = len(m.row_names)
            if self.order == "name":
                order = sorted(range(rows), key=lambda i: (m.row_names[i].lower(), i))
            elif self.order == "strength":
                sums = np.nan_to_num(np.asarray(m.values, dtype=np.float64)).sum(axis=1)
                order = list(np.argsort(-sums, kind="stable"))
            else:
                order = list(range(rows))
            self.row_order = [int(i) for i in order]
            square = m.symmetric or (rows == len(m.column_names) and list(m.row_names) == list(m.column_names))
            self.column_order = list(self.row_order) if square else list(range(len(m.column_names)))
        self.update()

    def display_values(self) -> np.ndarray:
        values = np.nan_to_num(np.asarray(self.matrix.values, dtype=np.float64))
        return np.log1p(np.maximum(values, 0.0)) if self.log_scale else values

    def value_range(self) -> tuple[float, float]:
        values = self.display_values()
        hi = float(values.max()) if values.size else 1.0
        lo = min(0.0, float(values.min())) if values.size else 0.0
        return lo, (hi if hi > lo else lo + 1.0)

    # -------------------------------------------------------------- geometry
    def _font(self) -> QFont:
        font = QFont(self.font())
        cell = self._cell_size_guess()
        font.setPointSizeF(float(np.clip(cell * 0.45, 6.5, 9.0)))
        return font

    def _cell_size_guess(self) -> float:
        m = self.matrix
        rows, cols = len(m.row_names), len(m.column_names)
        return min((self.width() - 160) / max(cols, 1), (self.height() - 120) / max(rows, 1))

    def _layout(self) -> tuple[int, int, int]:
        """(left, top, cell size) in pixels."""
        m = self.matrix
        metrics = QFontMetrics(self._font())
        rows, cols = len(m.row_names), len(m.column_names)
        left = 6 + max((metrics.horizontalAdvance(n) for n in m.row_names), default=0)
        top = 6 + max((metrics.horizontalAdvance(n) for n in m.column_names), default=0)
        right, bottom = 70, 8  # the colour bar and its numbers
        cell = int(min((self.width() - left - right) / max(cols, 1), (self.height() - top - bottom) / max(rows, 1)))
        return left, top, max(cell, 2)

    def cell_rect(self, row: int, column: int) -> QRect:
        """Widget pixels of the matrix's cell (row, column) (original indices) as drawn now."""
        if self.matrix is None:
            return QRect()
        left, top, cell = self._layout()
        r, c = self.row_order.index(int(row)), self.column_order.index(int(column))
        return QRect(left + c * cell, top + r * cell, cell, cell)

    def cell_at(self, pos) -> tuple[int, int] | None:
        """Original (row, column) under a widget position, None outside the cells."""
        if self.matrix is None:
            return None
        left, top, cell = self._layout()
        c = math.floor((pos.x() - left) / cell)
        r = math.floor((pos.y() - top) / cell)
        if 0 <= r < len(self.row_order) and 0 <= c < len(self.column_order):
            return self.row_order[r], self.column_order[c]
        return None

    def tooltip_text(self, row: int, column: int) -> str:
        m = self.matrix
        value, count = float(m.values[row, column]), int(m.counts[row, column])
        arrow = "↔" if m.symmetric else "→"
        unit = "streamline" if count == 1 else "streamlines"
        return f"{m.row_names[row]} {arrow} {m.column_names[column]}: {_format(value)} ({count} {unit})"

    # ---------------------------------------------------------------- events
    def mouseMoveEvent(self, event) -> None:
        hit = self.cell_at(event.position())
        if hit is None:
            QToolTip.hideText()
            self.setToolTip("")
        else:
            text = self.tooltip_text(*hit)
            self.setToolTip(text)
            QToolTip.showText(event.globalPosition().toPoint(), text, self)
        super().mouseMoveEvent(event)

    def mousePressEvent(self, event) -> None:
        hit = self.cell_at(event.position())
        if hit is not None and event.button() == Qt.MouseButton.LeftButton:
            self.highlight = hit
            self.update()
            self.cell_clicked.emit(*hit)
        super().mousePressEvent(event)

    # ----------------------------------------------------------------- paint
    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), BACKGROUND)
        painter.setPen(TEXT)
        if self.matrix is None or not self.row_order or not self.column_order:
            painter.drawText(
                self.rect().adjusted(12, 12, -12, -12),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                self.empty_text,
            )
            painter.end()
            return
        m = self.matrix
        font = self._font()
        painter.setFont(font)
        metrics = QFontMetrics(font)
        left, top, cell = self._layout()
        values = self.display_values()
        lo, hi = self.value_range()
        counts = np.asarray(m.counts)
        for r, row in enumerate(self.row_order):
            for c, col in enumerate(self.column_order):
                rect = QRect(left + c * cell, top + r * cell, cell, cell)
                if counts[row, col] <= 0:
                    colour = EMPTY_CELL
                else:
                    colour = _lut_colour((values[row, col] - lo) / (hi - lo))
                painter.fillRect(rect, colour)
        if cell >= 6:  # thin grid lines between cells
            painter.setPen(QPen(BACKGROUND, 1))
            for i in range(len(self.column_order) + 1):
                x = left + i * cell
                painter.drawLine(x, top, x, top + cell * len(self.row_order))
            for i in range(len(self.row_order) + 1):
                y = top + i * cell
                painter.drawLine(left, y, left + cell * len(self.column_order), y)
        if self.highlight is not None and self.highlight[0] in self.row_order:
            painter.setPen(QPen(QColor(0, 230, 255), 2))
            painter.drawRect(self.cell_rect(*self.highlight).adjusted(1, 1, -1, -1))
        # Names: rows on the left, columns rotated on top (only where they fit).
        painter.setPen(TEXT)
        if cell >= metrics.height() * 0.6:
            for r, row in enumerate(self.row_order):
                rect = QRect(0, top + r * cell, left - 4, cell)
                painter.drawText(rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, m.row_names[row])
            for c, col in enumerate(self.column_order):
                painter.save()
                painter.translate(left + c * cell + cell / 2 + metrics.ascent() / 2 - 1, top - 4)
                painter.rotate(-90)
                painter.drawText(0, 0, m.column_names[col])
                painter.restore()
        self._paint_colour_bar(painter, metrics, left + cell * len(self.column_order) + 14, top, cell)
        painter.end()

    def _paint_colour_bar(self, painter: QPainter, metrics: QFontMetrics, x: int, top: int, cell: int) -> None:
        height = max(cell * len(self.row_order), 60)
        bar = QRect(x, top, 14, height)
        gradient = QLinearGradient(QPointF(bar.left(), bar.bottom()), QPointF(bar.left(), bar.top()))
        for t in np.linspace(0, 1, 9):
            gradient.setColorAt(float(t), _lut_colour(float(t)))
        painter.fillRect(bar, gradient)
        painter.setPen(TEXT)
        painter.drawRect(bar)
        lo, hi = self.value_range()
        raw = np.nan_to_num(np.asarray(self.matrix.values, dtype=np.float64))
        top_text = _format(float(raw.max()) if raw.size else hi)
        bottom_text = _format(min(0.0, float(raw.min())) if raw.size else lo)
        painter.drawText(bar.right() + 4, bar.top() + metrics.ascent(), top_text)
        painter.drawText(bar.right() + 4, bar.bottom(), bottom_text)
        label = f"log(1+{self.matrix.measure})" if self.log_scale else self.matrix.measure
        painter.save()
        painter.translate(bar.right() + 4 + metrics.ascent(), bar.center().y() + metrics.horizontalAdvance(label) / 2)
        painter.rotate(-90)
        painter.drawText(0, 0, label)
        painter.restore()


# --------------------------------------------------------------------------- profile plot


class ProfilePlot(QWidget):
    """An along-tract profile: the mean over position 0..1 with a ±1 sd band."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.profile = None
        self.map_name = "value"
        self.title = ""
        self.setMinimumSize(240, 180)

    def set_profile(self, profile, map_name: str = "value", title: str = "") -> None:
        self.profile, self.map_name, self.title = profile, map_name, title
        self.update()

    def plot_rect(self) -> QRectF:
        metrics = QFontMetrics(self.font())
        left = 14 + metrics.height() + metrics.horizontalAdvance("0.0000")
        return QRectF(left, 10 + metrics.height() * 1.4, self.width() - left - 14, self.height() - 52 - 1.4 * 10)

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.fillRect(self.rect(), BACKGROUND)
        painter.setPen(TEXT)
        p = self.profile
        if p is None or not np.isfinite(np.asarray(p.mean, dtype=np.float64)).any():
            painter.drawText(
                self.rect().adjusted(12, 12, -12, -12),
                Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap,
                "No profile yet: choose a bundle and a map, then Profile.",
            )
            painter.end()
            return
        metrics = QFontMetrics(self.font())
        mean = np.asarray(p.mean, dtype=np.float64)
        sd = np.nan_to_num(np.asarray(p.sd, dtype=np.float64))
        k = len(mean)
        x = np.linspace(0.0, 1.0, k)
        ok = np.isfinite(mean)
        lo, hi = float(np.min((mean - sd)[ok])), float(np.max((mean + sd)[ok]))
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        pad = 0.05 * (hi - lo)
        lo, hi = lo - pad, hi + pad
        area = self.plot_rect()

        def to_px(xv, yv):
            return QPointF(area.left() + xv * area.width(), area.bottom() - (yv - lo) / (hi - lo) * area.height())

        # Axes, ticks and labels.
        painter.setPen(QPen(TEXT, 1))
        painter.drawLine(area.bottomLeft(), area.bottomRight())
        painter.drawLine(area.bottomLeft(), area.topLeft())
        for t in (0.0, 0.25, 0.5, 0.75, 1.0):
            point = to_px(t, lo)
            painter.drawLine(point, point + QPointF(0, 4))
            text = f"{t:g}"
            painter.drawText(
                QPointF(point.x() - metrics.horizontalAdvance(text) / 2, point.y() + 4 + metrics.ascent()), text
            )
        for t in nice_ticks(lo, hi):
            point = to_px(0.0, t)
            painter.setPen(QPen(QColor(70, 70, 78), 1, Qt.PenStyle.DotLine))
            painter.drawLine(point, QPointF(area.right(), point.y()))
            painter.setPen(TEXT)
            painter.drawLine(point, point - QPointF(4, 0))
            text = f"{t:.4g}"
            painter.drawText(
                QPointF(point.x() - 6 - metrics.horizontalAdvance(text), point.y() + metrics.ascent() / 2 - 1), text
            )
        xlabel = "position along the bundle"
        painter.drawText(QPointF(area.center().x() - metrics.horizontalAdvance(xlabel) / 2, self.height() - 6), xlabel)
        painter.save()
        painter.translate(4 + metrics.ascent(), area.center().y() + metrics.horizontalAdvance(self.map_name) / 2)
        painter.rotate(-90)
        painter.drawText(0, 0, self.map_name)
        painter.restore()
        if self.title:
            painter.drawText(QPointF(area.left(), 6 + metrics.ascent()), self.title)
        # The ±sd band and the mean, broken where there is no sample.
        segments, start = [], None
        for i in range(k + 1):
            if i < k and ok[i]:
                start = i if start is None else start
            elif start is not None:
                segments.append((start, i))
                start = None
        band = QColor(80, 170, 255, 80)
        for a, b in segments:
            polygon = QPolygonF(
                [to_px(x[i], mean[i] + sd[i]) for i in range(a, b)]
                + [to_px(x[i], mean[i] - sd[i]) for i in reversed(range(a, b))]
            )
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(band)
            painter.drawPolygon(polygon)
            path = QPainterPath(to_px(x[a], mean[a]))
            for i in range(a + 1, b):
                path.lineTo(to_px(x[i], mean[i]))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.setPen(QPen(QColor(255, 200, 60), 2))
            painter.drawPath(path)
        legend = "mean ± 1 sd"
        painter.setPen(TEXT)
        painter.drawText(
            QPointF(area.right() - metrics.horizontalAdvance(legend), area.top() + metrics.ascent()), legend
        )
        painter.end()


# --------------------------------------------------------------------------- the panel
