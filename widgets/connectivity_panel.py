"""The Connectivity panel: a region × region matrix of a tractogram over a parcellation, shown
as a heat map whose cells select their streamlines in 3-D, and along-tract profiles.

The panel holds no algorithm: "Compute" runs :func:`app.pipelines.connectivity.compute_connectome`
on a worker (the chosen tractogram layer, the chosen labels layer with its lookup table, the
weight and the endpoint search radius); "Probabilistic run" builds the seeds × targets counts of
the Probabilistic tracking panel's last run (:func:`seed_target_matrix`, on a worker too), whose
streamlines are not kept, so its cells only report counts. "Profile" (second tab) runs
:func:`compute_profile` of a bundle (a tractogram layer; its selected streamlines only when it
has a selection) over a scalar map. CSV files are written on workers.

:class:`HeatMap` and :class:`ProfilePlot` are plain QPainter widgets (no matplotlib).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PySide6.QtCore import QPointF, QRect, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QLinearGradient, QPainter, QPainterPath, QPen, QPolygonF
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from tractlens.app.io.lut import load_lut
from tractlens.app.model import Document, Layer
from tractlens.app.params import ConnectomeParams, ProfileParams
from tractlens.app.pipelines.connectivity import (
    WEIGHTS,
    ConnectivityMatrix,
    compute_connectome,
    compute_profile,
    profile_csv_text,
    seed_target_matrix,
    write_matrix_csv,
    write_text_atomic,
)

from .job_panel import JobPanelBase
from .params_form import limits_of, spin_for
from .render import LUTS

ORDERS = {"label": "label order", "name": "name (A–Z)", "strength": "strength (row sum)"}
HEAT_LUT = "viridis"
EMPTY_CELL = QColor(40, 40, 46)  # cells without a streamline
BACKGROUND = QColor(24, 24, 28)
TEXT = QColor(225, 225, 225)
COMBO_CHARS = 12
CSV_FILTER = "CSV (*.csv);;All files (*)"
LUT_FILTER = "Lookup tables (*.txt *.tsv *.csv *.ctbl *.lut);;All files (*)"


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


class LayerCombo(QComboBox):
    """A combo box of the document's layers of some kinds that keeps the user's choice (by
    identity, following a layer replaced by another) across ``layers`` events."""

    def __init__(
        self,
        document: Document,
        kinds: Sequence[str],
        *,
        prefer: Callable[[Layer], bool] | None = None,
        accept: Callable[[Layer], bool] | None = None,
        show_kind: bool = False,
        parent=None,
    ):
        super().__init__(parent)
        self.document, self.kinds, self.prefer, self.accept = document, tuple(kinds), prefer, accept
        self.show_kind = show_kind
        self.layers: list[Layer] = []
        self._chosen: Layer | None = None
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(COMBO_CHARS)
        self.activated.connect(self._picked)
        self.refresh()

    def _picked(self, index: int) -> None:
        if 0 <= index < len(self.layers):
            self._chosen = self.layers[index]

    def follow(self, old: Layer, new: Layer) -> None:
        if self._chosen is old:
            self._chosen = new

    def refresh(self) -> None:
        layers = [
            layer
            for layer in self.document.layers
            if layer.kind in self.kinds and (self.accept is None or self.accept(layer))
        ]
        current = self._chosen if self._chosen in layers else None
        if current is None and layers:
            preferred = [layer for layer in layers if self.prefer is not None and self.prefer(layer)]
            current = (preferred or layers)[-1]
        self.layers = layers
        self.blockSignals(True)
        self.clear()
        for layer in layers:
            self.addItem(f"{layer.name}  [{layer.kind}]" if self.show_kind else layer.name)
        if current is not None:
            self.setCurrentIndex(layers.index(current))
        self.blockSignals(False)

    def layer(self) -> Layer | None:
        index = self.currentIndex()
        return self.layers[index] if 0 <= index < len(self.layers) else None

    def choose(self, layer: Layer) -> None:
        if layer not in self.document.layers or layer.kind not in self.kinds:
            raise ValueError(f"{layer.name} cannot be chosen here")
        self._chosen = layer
        self.refresh()


# --------------------------------------------------------------------------- heat map


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


def _has_lut(layer: Layer) -> bool:
    return getattr(layer.data, "lut", None) is not None


class ConnectivityPanel(JobPanelBase):
    """Matrix tab: tractogram, labels, weight, radius, Lookup table…, Compute, Probabilistic
    run, log scale, order, Show all, Save CSV… and the heat map. Profile tab: bundle, map,
    points, Profile, Save CSV… and the plot.

    For scripts and tests: :meth:`compute`, :meth:`probabilistic_matrix`, :meth:`select_cell`,
    :meth:`show_all`, :meth:`save_csv`, :meth:`load_lookup_table`, :meth:`compute_profile`,
    :meth:`save_profile_csv`; attributes ``matrix`` (the shown :class:`ConnectivityMatrix`),
    ``matrix_layer`` (the tractogram it was computed from; None for a probabilistic run),
    ``profile`` (the last :class:`gpu.tractometry.Profile`), ``heatmap``, ``plot``, ``job_id``."""

    job_label = "Connectivity"

    def __init__(
        self, document: Document, runner, *, device: str = "auto", report=None, probabilistic=None, parent=None
    ):
        super().__init__(document, runner, device=device, report=report, parent=parent)
        self.probabilistic = probabilistic  # the Probabilistic tracking panel (its .run and .result)
        self.matrix: ConnectivityMatrix | None = None
        self.matrix_layer: Layer | None = None
        self.profile = None
        self.profile_map: str = ""
        self._profile_affine: np.ndarray | None = None

        # ---- matrix tab
        self.tract_box = LayerCombo(document, ("tractogram",))
        self.tract_box.setObjectName("connectivity_tractogram")
        self.labels_box = LayerCombo(document, ("labels",), prefer=_has_lut)
        self.labels_box.setObjectName("connectivity_labels")
        self.labels_box.setToolTip("The parcellation: each non-zero label is a region")
        self.weight_box = QComboBox()
        self.weight_box.setObjectName("connectivity_weight")
        for i, (name, text) in enumerate(WEIGHTS.items()):
            self.weight_box.addItem(name)
            self.weight_box.setItemData(i, text, Qt.ItemDataRole.ToolTipRole)
        self.radius_box = QDoubleSpinBox()
        self.radius_box.setObjectName("connectivity_radius")
        self.radius_box.setRange(*limits_of(ConnectomeParams, "radius_mm"))
        self.radius_box.setDecimals(1)
        self.radius_box.setSuffix(" mm")
        self.radius_box.setValue(ConnectomeParams.radius_mm)
        self.radius_box.setToolTip("Search this far from a streamline's end for a region (0: the end's voxel only)")
        self.lut_button = QPushButton("Lookup table…")
        self.lut_button.setToolTip("Names for the labels (FreeSurfer colour table or 'index name' lines)")
        self.lut_button.clicked.connect(self._lut_clicked)
        self.compute_button = QPushButton("Compute")
        self.compute_button.setObjectName("connectivity_compute")
        self.compute_button.clicked.connect(self.compute)
        self.prob_button = QPushButton("Probabilistic run")
        self.prob_button.setToolTip(
            "The seeds × targets counts of the last probabilistic run (rows: the labels' regions when "
            "the parcellation is on the run's grid)"
        )
        self.prob_button.clicked.connect(self.probabilistic_matrix)
        self.log_box = QCheckBox("log scale")
        self.log_box.setToolTip("Colour by log(1 + value)")
        self.sort_box = QComboBox()
        self.sort_box.setObjectName("connectivity_order")
        for mode, text in ORDERS.items():
            self.sort_box.addItem(text, mode)
        self.show_all_button = QPushButton("Show all")
        self.show_all_button.setToolTip("Show every streamline of the tractogram again")
        self.show_all_button.clicked.connect(self.show_all)
        self.save_button = QPushButton("Save CSV…")
        self.save_button.setEnabled(False)
        self.save_button.clicked.connect(lambda: self.save_csv())
        self.heatmap = HeatMap()
        self.heatmap.cell_clicked.connect(self.select_cell)
        self.log_box.toggled.connect(self.heatmap.set_log_scale)
        self.sort_box.currentIndexChanged.connect(lambda _i: self.heatmap.set_order(self.sort_box.currentData()))

        form = QFormLayout()
        form.addRow("Tractogram", self.tract_box)
        form.addRow("Labels", self.labels_box)
        form.addRow("Weight", self.weight_box)
        form.addRow("Radius", self.radius_box)
        row1 = QHBoxLayout()
        for widget in (self.lut_button, self.compute_button, self.cancel_button):
            row1.addWidget(widget)
        row2 = QHBoxLayout()
        for widget in (self.prob_button, self.show_all_button, self.save_button):
            row2.addWidget(widget)
        row3 = QHBoxLayout()
        row3.addWidget(self.log_box)
        row3.addWidget(self.sort_box, 1)
        matrix_tab = QWidget()
        matrix_layout = QVBoxLayout(matrix_tab)
        matrix_layout.setContentsMargins(2, 2, 2, 2)
        matrix_layout.addLayout(form)
        matrix_layout.addLayout(row1)
        matrix_layout.addLayout(row2)
        matrix_layout.addLayout(row3)
        matrix_layout.addWidget(self.heatmap, 1)

        # ---- profile tab
        self.bundle_box = LayerCombo(document, ("tractogram",))
        self.bundle_box.setObjectName("profile_bundle")
        self.bundle_box.setToolTip("The bundle (its selected streamlines only, when it has a selection)")
        self.map_box = LayerCombo(document, ("scalar",), prefer=lambda layer: layer.name.upper() == "FA")
        self.map_box.setObjectName("profile_map")
        self.points_box = QSpinBox()
        self.points_box.setObjectName("profile_points")
        spin_for(ProfileParams, "n_points", self.points_box)
        self.profile_button = QPushButton("Profile")
        self.profile_button.clicked.connect(self.compute_profile)
        self.profile_save_button = QPushButton("Save CSV…")
        self.profile_save_button.setEnabled(False)
        self.profile_save_button.clicked.connect(lambda: self.save_profile_csv())
        self.plot = ProfilePlot()
        pform = QFormLayout()
        pform.addRow("Bundle", self.bundle_box)
        pform.addRow("Map", self.map_box)
        pform.addRow("Points", self.points_box)
        prow = QHBoxLayout()
        prow.addWidget(self.profile_button)
        prow.addWidget(self.profile_save_button)
        profile_tab = QWidget()
        profile_layout = QVBoxLayout(profile_tab)
        profile_layout.setContentsMargins(2, 2, 2, 2)
        profile_layout.addLayout(pform)
        profile_layout.addLayout(prow)
        profile_layout.addWidget(self.plot, 1)

        self.tabs = QTabWidget()
        self.tabs.addTab(matrix_tab, "Matrix")
        self.tabs.addTab(profile_tab, "Profile")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.tabs, 1)
        layout.addWidget(self.status)
        self.combos = (self.tract_box, self.labels_box, self.bundle_box, self.map_box)
        document.connect(self._on_document)

    # ------------------------------------------------------------- document
    def _on_document(self, _source, event, **info) -> None:
        if event != "layers":
            return
        if "replaced" in info:
            old, new = info["replaced"]
            for box in self.combos:
                box.follow(old, new)
            if self.matrix_layer is old and new.kind == "tractogram" and len(new.data) == len(old.data):
                self.matrix_layer = new
        for box in self.combos:
            box.refresh()

    # ---------------------------------------------------------------- matrix
    def compute(self) -> int | None:
        """Start the connectome of the chosen tractogram over the chosen labels; the job id."""
        tract_layer, labels_layer = self.tract_box.layer(), self.labels_box.layer()
        if tract_layer is None:
            return self._refuse("Open or track a tractogram first: the matrix counts its streamlines.")
        if labels_layer is None:
            return self._refuse("Open a parcellation (a labels image) first: its regions are the matrix's rows.")
        weight = self.weight_box.currentText()
        radius = float(self.radius_box.value())
        tract, labels, lut, device = tract_layer.data, labels_layer.data, labels_layer.data.lut, self.device
        token = self._next_token()
        self.status.setText(f"Connectome of {tract_layer.name} over {labels_layer.name} ({weight})…")

        def job(ctx):
            ctx.progress(0, 1, "assigning streamline ends to regions")
            matrix = compute_connectome(
                tract,
                labels,
                weight=weight,
                lut=lut,
                radius_mm=radius,
                device=device,
                progress=lambda done, total: ctx.progress(done, total, "assigning streamline ends"),
                cancelled=ctx.cancelled,
            )
            ctx.check()
            return matrix

        return self._start(
            f"connectome ({tract_layer.name})",
            job,
            on_done=lambda matrix, token=token: self._matrix_done(token, matrix, tract_layer),
            token=token,
        )

    def _matrix_done(self, token: int, matrix: ConnectivityMatrix, layer: Layer | None) -> None:
        if token != self._token:
            return
        self._job_ended()
        self.show_matrix(matrix, layer)
        if matrix.symmetric:
            prov = matrix.provenance
            links = int(np.count_nonzero(np.triu(np.asarray(matrix.counts))))
            self.status.setText(
                f"{prov.get('assigned', 0):,} of {prov.get('streamlines', 0):,} streamlines join two regions; "
                f"{links} connection{'s' if links != 1 else ''} among {len(matrix.row_names)} regions "
                f"({matrix.measure}). Click a cell to select its streamlines."
            )

    def show_matrix(self, matrix: ConnectivityMatrix | None, layer: Layer | None = None) -> None:
        """Show a matrix in the heat map (``layer``: the tractogram whose streamlines it counts)."""
        self.matrix, self.matrix_layer = matrix, layer
        self.heatmap.set_matrix(matrix)
        self.save_button.setEnabled(matrix is not None)

    def probabilistic_matrix(self) -> int | None:
        """The seeds × targets counts of the Probabilistic panel's last run (on a worker)."""
        panel = self.probabilistic
        run = getattr(panel, "run", None)
        result = getattr(panel, "result", None)
        if run is None or result is None:
            return self._refuse("Run probabilistic tracking first (Probabilistic tracking panel).")
        if not run.targets:
            return self._refuse("The last probabilistic run had no target ROI: there is nothing to count.")
        labels_layer = self.labels_box.layer()
        labels, lut, grouped = None, None, ""
        if labels_layer is not None:
            vol, samples = labels_layer.data, run.samples
            if tuple(vol.shape3) == tuple(samples.mask.shape[:3]) and np.allclose(
                vol.affine, samples.affine, atol=1e-4
            ):
                labels, lut, grouped = vol, vol.lut, f" grouped by {labels_layer.name}"
            else:
                grouped = f" ({labels_layer.name} is not on the run's grid: one row for all seeds)"
        seeds, counts, targets = run.seeds, np.array(result.seed_targets, copy=True), list(run.targets)
        token = self._next_token()

        def job(ctx):
            ctx.progress(0, 1, "seed × target counts")
            return seed_target_matrix(seeds, counts, targets, labels=labels, lut=lut)

        def done(matrix, token=token):
            if token != self._token:
                return
            self._job_ended()
            self.show_matrix(matrix, None)
            self.status.setText(
                f"Probabilistic run: {len(seeds):,} seed voxels × {len(targets)} targets{grouped}. Its "
                "streamlines are not kept: a cell shows its count only."
            )

        return self._start("seed × target matrix", job, on_done=done, token=token)

    def select_cell(self, row: int, column: int) -> np.ndarray | None:
        """Select the streamlines of a cell (original indices) in 3-D; the selection (None for a
        probabilistic run's matrix, whose streamlines are not kept)."""
        m = self.matrix
        if m is None:
            return None
        self.heatmap.highlight = (int(row), int(column))
        self.heatmap.update()
        label = self.heatmap.tooltip_text(row, column)
        selected = m.cell_streamlines(row, column)
        if selected is None:
            self.status.setText(f"{label}. A probabilistic run keeps no streamlines: nothing to select in 3-D.")
            return None
        layer = self.matrix_layer
        if layer is None or layer not in self.document.layers or len(layer.data) != len(selected):
            self.status.setText(f"{label}. The tractogram of this matrix is no longer open: Compute again.")
            return None
        layer.set_selection(selected)
        n = int(selected.sum())
        self.status.setText(
            f"{label}: {n:,} of {len(selected):,} streamlines selected in {layer.name} (Show all to see every one)."
        )
        return selected

    def show_all(self) -> None:
        layer = self.matrix_layer or self.tract_box.layer()
        if layer is not None and layer in self.document.layers:
            layer.set_selection(None)
            self.heatmap.highlight = None
            self.heatmap.update()
            self.status.setText(f"Every streamline of {layer.name} shown.")

    def _ask_save_path(self, title: str, name: str) -> str:
        """The file the user picks ("" if none); tests pass a path instead."""
        if os.environ.get("TRACTLENS_NO_DIALOGS"):
            return ""
        path, _ = QFileDialog.getSaveFileName(self, title, name, CSV_FILTER)
        return path

    def save_csv(self, path=None) -> int | None:
        """Write the shown matrix as CSV (on a worker); asks for the file when ``path`` is None."""
        if self.matrix is None:
            return self._refuse("Compute a matrix first: there is nothing to save yet.")
        if path is None:
            path = self._ask_save_path("Save the connectivity matrix", "connectome.csv")
            if not path:
                return None
        matrix, path = self.matrix, Path(path)

        def job(ctx):
            ctx.progress(0, 1, f"writing {path.name}")
            return write_matrix_csv(matrix, path)

        self.status.setText(f"Saving {path.name}…")
        return self.runner.submit(
            "save connectivity CSV",
            job,
            on_done=lambda written: self.status.setText(f"Saved the matrix to {written}."),
            on_error=self._save_failed,
        )

    def _save_failed(self, message: str, details: str) -> None:
        self.status.setText(f"Saving failed: {message}")
        self.report(message, details)

    def _lut_clicked(self) -> None:
        if os.environ.get("TRACTLENS_NO_DIALOGS"):
            return
        path, _ = QFileDialog.getOpenFileName(self, "Lookup table for the labels", "", LUT_FILTER)
        if path:
            self.load_lookup_table(path)

    def load_lookup_table(self, path, layer: Layer | None = None) -> int | None:
        """Read a lookup table (on a worker) into the labels layer's volume (``.lut``): the
        region names of the next matrix."""
        layer = layer or self.labels_box.layer()
        if layer is None:
            return self._refuse("Open a parcellation (a labels image) first, then its lookup table.")
        path = Path(path)

        def job(ctx):
            ctx.progress(0, 1, f"reading {path.name}")
            return load_lut(path)

        def done(lut):
            layer.data.lut = lut
            self.status.setText(f"{path.name}: names for {layer.name}'s labels; Compute to use them.")

        return self.runner.submit("read lookup table", job, on_done=done, on_error=self._save_failed)

    # --------------------------------------------------------------- profile
    def compute_profile(self) -> int | None:
        """Start the profile of the chosen bundle over the chosen map; the job id."""
        bundle, scalar = self.bundle_box.layer(), self.map_box.layer()
        if bundle is None:
            return self._refuse("Open or track a tractogram first: the profile follows its streamlines.")
        if scalar is None:
            return self._refuse("Open a scalar map (FA, MD, …) first: the profile samples it.")
        selection = None if bundle.selection is None else bundle.selection.copy()
        if selection is not None and not selection.any():
            return self._refuse(f"No streamline of {bundle.name} is selected: Show all, or select some.")
        tract, volume, n_points, device = bundle.data, scalar.data, int(self.points_box.value()), self.device
        map_name, affine = scalar.name, scalar.data.affine.copy()
        token = self._next_token()
        which = "selected streamlines" if selection is not None else "streamlines"
        self.status.setText(f"Profile of {scalar.name} along {bundle.name}…")

        def job(ctx):
            ctx.progress(0, 1, "resampling the bundle")
            part = tract if selection is None else tract.subset(selection)
            return compute_profile(part, volume, n_points, device=device)

        def done(profile, token=token):
            if token != self._token:
                return
            self._job_ended()
            self.profile, self.profile_map, self._profile_affine = profile, map_name, affine
            streamlines = profile.provenance.get("streamlines", "?")
            self.plot.set_profile(profile, map_name, f"{bundle.name}: {streamlines} {which}")
            self.profile_save_button.setEnabled(True)
            self.tabs.setCurrentIndex(1)
            self.status.setText(
                f"Profile of {map_name} along {bundle.name}: {streamlines} {which}, {len(profile.mean)} points "
                f"(mean {np.nanmean(profile.mean):.4g})."
            )

        return self._start(f"profile ({bundle.name})", job, on_done=done, token=token)

    def save_profile_csv(self, path=None) -> int | None:
        """Write the last profile as CSV (on a worker); asks for the file when ``path`` is None."""
        if self.profile is None:
            return self._refuse("Compute a profile first: there is nothing to save yet.")
        if path is None:
            path = self._ask_save_path("Save the profile", f"profile_{self.profile_map}.csv")
            if not path:
                return None
        profile, affine, name, path = self.profile, self._profile_affine, self.profile_map, Path(path)

        def job(ctx):
            ctx.progress(0, 1, f"writing {path.name}")
            return write_text_atomic(profile_csv_text(profile, affine, name), path)

        self.status.setText(f"Saving {path.name}…")
        return self.runner.submit(
            "save profile CSV",
            job,
            on_done=lambda written: self.status.setText(f"Saved the profile to {written}."),
            on_error=self._save_failed,
        )
