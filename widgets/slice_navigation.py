"""Zoom, pan and the ruler of a slice view.

- Zoom: Ctrl+wheel (or a pinch on a touchpad) around the mouse pointer, from 1x (the whole
  slice fits) to :data:`MAX_ZOOM`; the plain wheel still steps through slices.
- Pan: a middle-button drag, a Shift+drag with the navigate tool, or a drag while Space is held
  (any tool).
- Reset: the ``0`` key (the focused view) or View ▸ Reset slice zoom (every view).
- Ruler (the ``ruler`` tool): two clicks on a slice measure the distance between them in mm
  (through the reference grid's affine, :func:`tractlens.app.measure.distance_mm`); the
  measurement is drawn and labelled on its slice; Esc removes the last one (the one being drawn
  first).

The slice view asks :class:`SliceNavigation` first for each input event; what it does not
take, the view handles as before (cursor, ROI tools, window/level).
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QFont, QPainterPath, QPen

from tractlens.app.grid import Grid
from tractlens.app.measure import Measurement

MAX_ZOOM = 20.0
WHEEL_ZOOM_STEP = 1.25  # per wheel notch (120 eighths of a degree)
RULER_COLOUR = QColor(255, 255, 0)


def plane_point(geometry, row: float, col: float, cursor) -> np.ndarray:
    """Continuous reference voxel coordinates of a (fractional) pixel of a slice plane:
    the inverse of :meth:`PlaneGeometry.pixel_of` on the slice through ``cursor``."""
    height, width = geometry.voxels.shape[:2]
    ijk = np.asarray(cursor, dtype=np.float64).copy()
    ijk[geometry.h_axis] = width - 1 - col if geometry.h_reversed else col
    ijk[geometry.v_axis] = height - 1 - row if geometry.v_reversed else row
    return ijk


class SliceNavigation:
    """Zoom and pan state, and the ruler's measurements, of one :class:`SliceView`."""

    def __init__(self, view):
        self.view = view
        self.zoom = 1.0
        self.pan = QPointF(0.0, 0.0)  # offset of the image's centre from the widget's, in pixels
        self.measurements: list[Measurement] = []
        self._ruler_start: np.ndarray | None = None  # first click of the ruler being drawn
        self._ruler_end: np.ndarray | None = None  # where the mouse is meanwhile
        self._pan_from: QPointF | None = None
        self.space_held = False

    # ---------------------------------------------------------------- zoom, pan
    def target_rect(self, fit: QRectF) -> QRectF:
        """The image's rectangle on screen: ``fit`` (the whole slice fitted to the widget)
        scaled by the zoom about the widget's centre and moved by the pan."""
        view = self.view
        w, h = fit.width() * self.zoom, fit.height() * self.zoom
        cx, cy = view.width() / 2 + self.pan.x(), view.height() / 2 + self.pan.y()
        return QRectF(cx - w / 2, cy - h / 2, w, h)

    def zoom_at(self, pos: QPointF, factor: float) -> None:
        """Zoom by ``factor`` keeping the point under ``pos`` (widget pixels) where it is."""
        geometry = self.view.geometry_now()
        if geometry is None:
            return
        new_zoom = float(np.clip(self.zoom * factor, 1.0, MAX_ZOOM))
        if new_zoom == self.zoom:
            return
        old = self.view._target_rect(geometry)
        ratio = new_zoom / self.zoom
        left = pos.x() - (pos.x() - old.left()) * ratio
        top = pos.y() - (pos.y() - old.top()) * ratio
        self.zoom = new_zoom
        self.pan = QPointF(
            left + old.width() * ratio / 2 - self.view.width() / 2,
            top + old.height() * ratio / 2 - self.view.height() / 2,
        )
        self._keep_in_view()
        self.view.update()

    def pan_by(self, dx: float, dy: float) -> None:
        self.pan = QPointF(self.pan.x() + dx, self.pan.y() + dy)
        self._keep_in_view()
        self.view.update()

    def reset(self) -> None:
        """Back to the whole slice, centred."""
        self.zoom, self.pan = 1.0, QPointF(0.0, 0.0)
        self.view.update()

    def _keep_in_view(self) -> None:
        """At least a quarter of the view stays covered by the image (it cannot be lost)."""
        geometry = self.view.geometry_now()
        if geometry is None:
            return
        rect = self.view._target_rect(geometry)
        limit_x = max(0.0, (rect.width() + self.view.width()) / 2 - self.view.width() / 4)
        limit_y = max(0.0, (rect.height() + self.view.height()) / 2 - self.view.height() / 4)
        if self.zoom == 1.0:
            limit_x = limit_y = 0.0  # the whole slice fits: nothing to pan
        self.pan = QPointF(
            float(np.clip(self.pan.x(), -limit_x, limit_x)), float(np.clip(self.pan.y(), -limit_y, limit_y))
        )

    # ------------------------------------------------------------------ events
    def wheel(self, event) -> bool:
        if not event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            return False
        notches = event.angleDelta().y() / 120.0
        if notches:
            self.zoom_at(event.position(), WHEEL_ZOOM_STEP**notches)
        return True

    def native_gesture(self, event) -> bool:
        """A touchpad pinch (macOS, Wayland): zoom about the fingers."""
        if event.gestureType() != Qt.NativeGestureType.ZoomNativeGesture:
            return False
        self.zoom_at(event.position(), 1.0 + float(event.value()))
        return True

    def _starts_pan(self, event) -> bool:
        button = event.button()
        if button == Qt.MouseButton.MiddleButton:
            return True
        if button != Qt.MouseButton.LeftButton:
            return False
        navigating = self.view.tools is None or self.view.tools.tool == "navigate"
        shift = bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        return self.space_held or (shift and navigating)

    def press(self, event) -> bool:
        if self._starts_pan(event):
            self._pan_from = event.position()
            self.view.setCursor(Qt.CursorShape.ClosedHandCursor)
            return True
        if event.button() == Qt.MouseButton.LeftButton and self.ruler_active():
            self._ruler_click(event.position())
            return True
        return False

    def move(self, event) -> bool:
        if self._pan_from is not None:
            delta = event.position() - self._pan_from
            self._pan_from = event.position()
            self.pan_by(delta.x(), delta.y())
            return True
        if self._ruler_start is not None:
            self._ruler_end = self.point_at(event.position())
            self.view.update()
        # With the ruler a drag moves nothing; otherwise the view reports what is under the mouse.
        return self.ruler_active() and bool(event.buttons() & Qt.MouseButton.LeftButton)

    def release(self, event) -> bool:
        if self._pan_from is not None:
            self._pan_from = None
            self.view.unsetCursor()
            return True
        return False

    def key_press(self, event) -> bool:
        key = event.key()
        if key == Qt.Key.Key_Space and not event.isAutoRepeat():
            self.space_held = True
            return True
        if key == Qt.Key.Key_0 and not event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier:
            self.reset()
            return True
        if key == Qt.Key.Key_Escape and (self._ruler_start is not None or self.measurements):
            self.remove_last_measurement()
            return True
        return False

    def key_release(self, event) -> bool:
        if event.key() == Qt.Key.Key_Space and not event.isAutoRepeat():
            self.space_held = False
            return True
        return False

    def event(self, event) -> bool:
        return event.type() == QEvent.Type.NativeGesture and self.native_gesture(event)

    # ------------------------------------------------------------------- ruler
    def ruler_active(self) -> bool:
        return self.view.tools is not None and self.view.tools.tool == "ruler"

    def point_at(self, pos: QPointF) -> np.ndarray | None:
        """Continuous reference voxel coordinates under a widget point (None: off the slice)."""
        view = self.view
        geometry = view.geometry_now()
        if geometry is None:
            return None
        target = view._target_rect(geometry)
        height, width = geometry.voxels.shape[:2]
        col = (pos.x() - target.left()) / target.width() * width - 0.5
        row = (pos.y() - target.top()) / target.height() * height - 0.5
        if not (-0.5 <= col < width - 0.5 and -0.5 <= row < height - 0.5):
            return None
        return plane_point(geometry, row, col, view.document.cursor)

    def _ruler_click(self, pos: QPointF) -> None:
        point = self.point_at(pos)
        if point is None:
            return
        if self._ruler_start is None:
            self._ruler_start, self._ruler_end = point, point
        else:
            self.add_measurement(self._ruler_start, point)
            self._ruler_start = self._ruler_end = None
        self.view.update()

    def add_measurement(self, start, end) -> Measurement:
        """Measure from ``start`` to ``end`` (reference voxel coordinates on this view's slice)."""
        doc, geometry = self.view.document, self.view.geometry_now()
        grid = Grid(doc.reference_affine, doc.reference_shape)
        measurement = Measurement.between(grid, start, end, geometry.normal_axis)
        self.measurements.append(measurement)
        self.view.measured.emit(measurement)
        self.view.update()
        return measurement

    def remove_last_measurement(self) -> None:
        """Esc: drop the ruler being drawn, else the last measurement."""
        if self._ruler_start is not None:
            self._ruler_start = self._ruler_end = None
        elif self.measurements:
            self.measurements.pop()
        self.view.update()

    def paint(self, painter, geometry, target: QRectF) -> None:
        """The measurements of the slice shown, and the ruler being drawn, with their lengths."""
        index = int(self.view.document.cursor[geometry.normal_axis])
        shown = [
            (m.start, m.end, m.label) for m in self.measurements if (m.axis, m.index) == (geometry.normal_axis, index)
        ]
        if self._ruler_start is not None and self._ruler_end is not None:
            doc = self.view.document
            live = Measurement.between(
                Grid(doc.reference_affine, doc.reference_shape),
                self._ruler_start,
                self._ruler_end,
                geometry.normal_axis,
            )
            shown.append((live.start, live.end, live.label))
        if not shown:
            return
        height, width = geometry.voxels.shape[:2]
        sx, sy = target.width() / width, target.height() / height
        font = QFont()
        font.setBold(True)
        painter.save()
        painter.setRenderHint(painter.RenderHint.Antialiasing, True)
        painter.setFont(font)
        for start, end, label in shown:
            ends = []
            for point in (start, end):
                row, col = geometry.pixel_of(np.asarray(point, dtype=float))
                ends.append(QPointF(target.left() + (col + 0.5) * sx, target.top() + (row + 0.5) * sy))
            for colour, width_px in ((QColor(0, 0, 0, 200), 4.0), (RULER_COLOUR, 2.0)):
                painter.setPen(QPen(colour, width_px))
                painter.drawLine(ends[0], ends[1])
                for end_point in ends:
                    painter.drawEllipse(end_point, 3.0, 3.0)
            middle = (ends[0] + ends[1]) / 2 + QPointF(6, -6)
            path = QPainterPath()
            path.addText(middle, font, label)
            painter.strokePath(path, QPen(QColor(0, 0, 0), 3.0))  # a dark halo: legible on any map
            painter.fillPath(path, RULER_COLOUR)
        painter.restore()
