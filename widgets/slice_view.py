"""A 2-D slice view (axial, coronal or sagittal) of the document, drawn with QPainter.

Left click or drag moves the cursor (and so the other views); the wheel and
Page Up/Down (or the arrow keys Up/Down) step through slices; right drag sets
window/level of the top visible scalar layer (horizontal: width, vertical:
level). With an ROI tool the left button edits the ROI instead (see
:class:`widgets.roi_tools.RoiTools`); with the sphere or box tool a click places a
shape, a drag that starts inside the active shape moves it in the slice's plane,
and a Shift+drag resizes it around its centre (a sphere's radius, a box's
half-sizes in the slice's two directions, follow the mouse). Over the composited
image: tensor layers as ellipses, fODF layers as their in-plane sections (widgets.fod_glyphs),
dyads layers as sticks (their in-plane part),
and tractograms as the segments within a slab of ``slab_mm`` around the slice
(None: every segment, projected onto it; View > Fiber slab on slices). Ctrl+wheel or a
pinch zooms, a middle, Shift or Space drag pans, ``0`` resets; the ruler tool measures in mm
(see :mod:`widgets.slice_navigation`).
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QLineF, QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from tractlens.app import roi_raster
from tractlens.app.grid import Grid
from tractlens.app.model import SCALAR_KINDS, STICK_COLOURS, Document, shape_half_sizes

from . import roi_outlines
from .glyphs import stick_segments
from .render import composite, display_oversample, fractional_voxel, normal_slice, patch_stroke, plane_geometry
from .slice_fibers import SliceFibres
from .slice_glyphs import SliceGlyphs
from .slice_navigation import SliceNavigation

MIN_STICK_CELL_PX = 6  # dyads sticks are drawn on voxels at least this many pixels apart


class SliceView(QWidget):
    cursor_moved = Signal()
    hovered = Signal(object)  # reference voxel under the mouse (or None), without moving the cursor
    shape_created = Signal(object)  # a new shape ROI layer was placed
    notice = Signal(str)  # something the user should read (e.g. why a flood fill filled nothing)
    measured = Signal(object)  # a ruler measurement was completed (tractlens.app.measure.Measurement)

    def __init__(self, document: Document, view: str, parent: QWidget | None = None, tools=None):
        super().__init__(parent)
        self.navigation = SliceNavigation(self)  # zoom, pan and the ruler (first: event() uses it)
        self.document = document
        self.tools = tools  # shared RoiTools (brush/eraser state); None: navigation only
        self._last_paint = None
        self._rect_start = self._rect_end = None
        self._polygon: list[np.ndarray] = []  # vertices so far; a double click closes and fills
        # While a sphere or box is dragged: (shape ROI layer, grab offset, moved yet, "move"|"resize")
        self._drag_shape = None
        self.view = view
        self._image_cache: np.ndarray | None = None  # the composited slice (an ROI stroke patches it)
        self._image_key: tuple | None = None  # (radiological, slice index) it was composited for
        self.radiological = False
        self.slab_mm: float | None = 4.0  # thickness of the slab of fibers drawn; None: all fibers
        self._fibres = SliceFibres(self)  # the segments within the slab, kept per slice position
        self.show_crosshair = True
        self.setMinimumSize(160, 160)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setMouseTracking(True)
        self.setObjectName(f"slice_{view}")
        self._scene_layers: tuple = ()  # ids of the non-tractogram layers, in order
        self._wl_start: tuple | None = None
        self.glyphs = SliceGlyphs(self)  # the tensor and fODF layers' 2-D glyphs (widgets.slice_glyphs)
        self.frame_partner = None  # the 3-D view, whose held frame new glyphs join (View3D.join_frame)
        document.connect(self._on_document)

    # ----------------------------------------------------------------- model
    def _on_document(self, _source, event, **info) -> None:
        if event not in ("layers", "display", "cursor", "roi"):
            return
        layer = info.get("layer")
        if event == "roi" and self._redraw_stroke(layer, info.get("voxels")):
            return
        if event == "layers":
            # Tractograms are drawn over the composited image, not into it: replacing one
            # (a tracking result streaming in) keeps the image.
            scene = self.document.image_layers_key()
            if scene != self._scene_layers:
                self._scene_layers = scene
                self._image_cache = None
        elif event == "cursor":
            pass  # the image is made again only when this view's slice moved (:meth:`image_array`)
        elif not (event == "display" and layer is not None and layer.kind in ("tractogram", "dyads")):
            self._image_cache = None  # sticks and fibres are drawn over the image, not into it
        elif layer.kind == "tractogram" and self.frame_partner is not None and self.frame_partner.join_frame(self):
            return  # (a selection or colour change) repainted with the 3-D frame that waits for it: one window update
        self.update()

    def _redraw_stroke(self, layer, voxels) -> bool:
        """An ROI edit that says its voxels (a stroke): only the pixels of this slice it changed
        are composited again, and a view whose slice it missed is not redrawn (a brush paints on
        one slice). False: the whole image is made again."""
        if self._image_cache is None or self._image_key != self._image_key_now():
            return False  # not drawn yet, or drawn the other way round or for another slice
        patched = patch_stroke(self.document, self.geometry_now(), self._image_cache, layer, voxels)
        if patched:
            self._outlines_of = None  # the ROI's edges are found again (over the slice: they join up)
            self.update()
        return patched is not None

    def geometry_now(self):
        if self.document.reference_affine is None:
            return None
        return plane_geometry(self.document, self.view, self.radiological)

    def image_array(self) -> np.ndarray | None:
        """The composited slice (H, W, 3) uint8, as drawn (before scaling)."""
        geometry = self.geometry_now()
        if geometry is None:
            return None
        key = self._image_key_now()
        if self._image_cache is None or self._image_key != key:  # reset by document events, or another slice
            self._image_cache = composite(self.document, geometry, display_oversample(self.document))
            self._image_key = key
        return self._image_cache

    def _image_key_now(self) -> tuple:
        return (self.radiological, normal_slice(self.document, self.view))

    # --------------------------------------------------------------- drawing
    def _target_rect(self, geometry) -> QRectF:
        height, width = geometry.voxels.shape[:2]
        mm_h, mm_w = height * geometry.pixel_mm[0], width * geometry.pixel_mm[1]
        scale = min(self.width() / mm_w, self.height() / mm_h)
        w, h = mm_w * scale, mm_h * scale
        return self.navigation.target_rect(QRectF((self.width() - w) / 2, (self.height() - h) / 2, w, h))

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor(0, 0, 0))
        geometry = self.geometry_now()
        if geometry is None:
            painter.setPen(QColor(160, 160, 160))
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "Open a file or the demo (File menu)")
            return
        image = self.image_array()
        height, width = image.shape[:2]
        qimage = QImage(np.ascontiguousarray(image).data, width, height, 3 * width, QImage.Format.Format_RGB888)
        target = self._target_rect(geometry)
        painter.drawImage(target, qimage)
        self._draw_roi_outlines(painter, geometry, target)
        self.glyphs.draw(painter, geometry, target)
        self._draw_sticks(painter, geometry, target)
        self._draw_fibers(painter, geometry, target)
        if self.show_crosshair:
            self._draw_crosshair(painter, geometry, target)
        if self._rect_start is not None and self._rect_end is not None:
            self._draw_rubber_band(painter, geometry, target)
        if self._polygon:
            self._draw_polygon(painter, geometry, target)
        self.navigation.paint(painter, geometry, target)
        self._draw_labels(painter, geometry)
        self.glyphs.painted()

    def _draw_roi_outlines(self, painter: QPainter, geometry, target: QRectF) -> None:
        """ROI edges over their fill (:mod:`widgets.roi_outlines`), found once per composited image."""
        if getattr(self, "_outlines_of", None) is not self._image_cache:
            self._outlines = roi_outlines.roi_outlines(self.document, geometry, display_oversample(self.document))
            self._outlines_of = self._image_cache
        roi_outlines.draw_outlines(painter, self._outlines, geometry, target)

    def _draw_crosshair(self, painter: QPainter, geometry, target: QRectF) -> None:
        row, col = geometry.cursor_pixel
        height, width = geometry.voxels.shape[:2]
        x = target.left() + (col + 0.5) * target.width() / width
        y = target.top() + (row + 0.5) * target.height() / height
        colour = QColor(255, 255, 255, 140)  # neutral: never the green of a seed
        # one-pixel rectangles: a quarter of the time of lines drawn with a pen (every paint draws them)
        painter.fillRect(QRectF(target.left(), y - 0.5, target.width(), 1.0), colour)
        painter.fillRect(QRectF(x - 0.5, target.top(), 1.0, target.height()), colour)

    def _draw_rubber_band(self, painter: QPainter, geometry, target: QRectF) -> None:
        height, width = geometry.voxels.shape[:2]
        corners = []
        for ijk in (self._rect_start, self._rect_end):
            row, col = geometry.pixel_of(np.asarray(ijk, dtype=float))
            corners.append(
                (target.left() + col * target.width() / width, target.top() + row * target.height() / height)
            )
        (x0, y0), (x1, y1) = corners
        painter.setPen(QPen(QColor(255, 255, 255), 1, Qt.PenStyle.DashLine))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        cell_w, cell_h = target.width() / width, target.height() / height
        painter.drawRect(QRectF(min(x0, x1), min(y0, y1), abs(x1 - x0) + cell_w, abs(y1 - y0) + cell_h))

    def _draw_polygon(self, painter: QPainter, geometry, target: QRectF) -> None:
        height, width = geometry.voxels.shape[:2]
        points = []
        for ijk in self._polygon:
            row, col = geometry.pixel_of(np.asarray(ijk, dtype=float))
            points.append(
                QPointF(
                    target.left() + (col + 0.5) * target.width() / width,
                    target.top() + (row + 0.5) * target.height() / height,
                )
            )
        painter.setPen(QPen(QColor(255, 255, 255), 1, Qt.PenStyle.DashLine))
        painter.drawPolyline(points)

    def _draw_labels(self, painter: QPainter, geometry) -> None:
        left, right, top, bottom = geometry.labels
        painter.setPen(QColor(255, 220, 0))
        font = QFont()
        font.setBold(True)
        painter.setFont(font)
        r = self.rect().adjusted(4, 4, -4, -4)
        align = Qt.AlignmentFlag
        painter.drawText(r, align.AlignLeft | align.AlignVCenter, left)
        painter.drawText(r, align.AlignRight | align.AlignVCenter, right)
        painter.drawText(r, align.AlignTop | align.AlignHCenter, top)
        painter.drawText(r, align.AlignBottom | align.AlignHCenter, bottom)
        painter.setPen(QColor(200, 200, 200))
        index = int(self.document.cursor[geometry.normal_axis])
        painter.drawText(r, align.AlignTop | align.AlignLeft, f"{self.view} {index}")

    def glyphs_ready(self) -> bool:
        """Do the glyphs and fibres drawn show the document as it is now (no build pending)? Asks
        for the builds that are missing (scripts and tests wait on it)."""
        geometry = self.geometry_now()
        target = None if geometry is None else self._target_rect(geometry)
        return self.glyphs.ready(geometry, target) and self._fibres.ready()

    def _draw_sticks(self, painter: QPainter, geometry, target: QRectF) -> None:
        """Dyads layers: each stick's in-plane projection on every n-th voxel (``glyph_step``, or
        more so that drawn voxels are at least ``MIN_STICK_CELL_PX`` apart: shorter sticks cannot
        be read and would only cost time), one colour per stick number, one ``drawLines`` call
        per colour."""
        doc = self.document
        height, width = geometry.voxels.shape[:2]
        px_w, px_h = target.width() / width, target.height() / height
        thinning = int(np.ceil(MIN_STICK_CELL_PX / max(min(px_w, px_h), 1e-6)))
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        for layer in doc.layers:
            if layer.kind != "dyads" or not layer.visible or layer.opacity <= 0:
                continue
            step = max(1, int(layer.glyph_step), thinning)
            voxels = geometry.voxels[step // 2 :: step, step // 2 :: step].reshape(-1, 3)
            ends, stick = stick_segments(layer, doc, voxels, step)
            rows, cols = geometry.pixel_of(ends)  # (S, 2) each: the two ends
            screen = np.stack([target.left() + (cols + 0.5) * px_w, target.top() + (rows + 0.5) * px_h], axis=-1)
            screen = screen.reshape(-1, 4)  # x0, y0, x1, y1
            pen_width = float(np.clip(0.15 * step * min(px_w, px_h), 1.5, 3.0))
            for number in np.unique(stick):
                r, g, b = (int(255 * c) for c in STICK_COLOURS[number % len(STICK_COLOURS)])
                pen = QPen(QColor(r, g, b, int(255 * layer.opacity)), pen_width)
                pen.setCapStyle(Qt.PenCapStyle.FlatCap)  # round caps on wide lines are slow to draw
                painter.setPen(pen)
                painter.drawLines([QLineF(*line) for line in screen[stick == number].tolist()])
        painter.restore()

    def _draw_fibers(self, painter: QPainter, geometry, target: QRectF) -> None:
        """Segments of visible tractograms within the slab (:mod:`widgets.slice_fibers`)."""
        self._fibres.draw(painter, self.document, geometry, target, self.slab_mm)

    # ------------------------------------------------------------ interaction
    def voxel_at(self, x: float, y: float, exact: bool = False) -> np.ndarray | None:
        """Reference voxel under widget pixel (x, y), or None outside the image; ``exact``: its
        fractional voxel coordinates (where in the voxel the point is)."""
        geometry = self.geometry_now()
        if geometry is None:
            return None
        target = self._target_rect(geometry)
        height, width = geometry.voxels.shape[:2]
        col_f = (x - target.left()) / target.width() * width
        row_f = (y - target.top()) / target.height() * height
        col, row = int(col_f), int(row_f)
        if not (0 <= col < width and 0 <= row < height):
            return None
        return fractional_voxel(geometry, row_f, col_f) if exact else geometry.voxels[row, col]

    def widget_point_of_voxel(self, ijk) -> QPointF:
        """Centre of a reference voxel (projected on this plane) in widget coordinates."""
        geometry = self.geometry_now()
        target = self._target_rect(geometry)
        height, width = geometry.voxels.shape[:2]
        row, col = geometry.pixel_of(np.asarray(ijk, dtype=float))
        return QPointF(
            target.left() + (col + 0.5) * target.width() / width,
            target.top() + (row + 0.5) * target.height() / height,
        )

    def _painting(self) -> bool:
        """Does a left drag edit ROIs (rather than move the cursor)? Shapes need no ROI first."""
        if self.tools is None or self.tools.tool == "navigate":
            return False
        return self.tools.tool in ("sphere", "box") or self.tools.active_roi() is not None

    def _shape_at(self, pos, resize: bool = False) -> None:
        """One-click tools. Fill paints the connected voxels above the threshold; sphere and box
        grab the active shape ROI under the click (to drag it), or anywhere with ``resize``
        (Shift: to resize it), or place a new shape ROI there."""
        ijk = self.voxel_at(pos.x(), pos.y())
        if ijk is None:
            return
        tools = self.tools
        roi = tools.active_roi()
        if tools.tool in ("sphere", "box"):
            shape = roi.data.shape if roi is not None else None
            if shape is not None and shape["kind"] == tools.tool and (resize or roi.data.mask[tuple(ijk)]):
                grab = np.asarray(ijk, dtype=float) - shape["centre"]
                self._drag_shape = (roi, grab, False, "resize" if resize else "move")
            else:
                layer = tools.new_roi(shape={"kind": tools.tool, "centre": ijk, "radius": tools.radius})
                self.shape_created.emit(layer)
                self._drag_shape = (layer, np.zeros(3), False, "resize" if resize else "move")
            return
        self._flood_fill(roi, ijk)

    def _flood_fill(self, roi, ijk) -> None:
        """Fill from ``ijk``: the voxels of the top visible scalar map above the threshold that
        are connected to it; says why when nothing can be filled."""
        tools = self.tools
        layer = self._window_level_layer()
        if layer is None:
            self.notice.emit("Flood fill needs a scalar map: open an image (it fills the top visible one)")
            return
        volume = layer.data
        if not Grid.of(volume).matches(Grid(roi.data.affine, roi.data.mask.shape)):
            self.notice.emit(
                f"Flood fill did nothing: {layer.name} (the top visible scalar map) is on another grid "
                f"than {roi.name}; show a map on the ROI's grid on top"
            )
            return
        ijk = roi_raster.nearest_on_roi(self.document, roi, ijk)  # the fill runs on the ROI's own grid
        value = float(np.nan_to_num(np.asarray(volume.data[tuple(ijk)], dtype=float).ravel()[0]))
        if not value > tools.threshold:
            self.notice.emit(
                f"Flood fill did nothing: {layer.name} is {value:.4g} here, not above the threshold "
                f"{tools.threshold:.4g}; click inside the region or lower the threshold"
            )
            return
        voxels = roi_raster.flood(volume.data, ijk, tools.threshold)
        changed = self.document.paint(roi, voxels, True)
        already = "" if changed else ", all in the ROI already"
        self.notice.emit(f"Flood fill: {len(voxels)} voxels of {layer.name} above {tools.threshold:.4g}{already}")

    def _drag_shape_to(self, pos) -> None:
        """Move the dragged shape in the slice's plane, or resize it around its centre: a
        sphere's radius becomes the in-plane distance from its centre to the mouse (in whole
        voxels), a box's half-sizes in the slice's two directions that distance along each
        (the voxel under the mouse becomes a corner of the box)."""
        ijk = self.voxel_at(pos.x(), pos.y())
        if ijk is None:
            return
        layer, grab, moved, mode = self._drag_shape
        shape = dict(layer.data.shape)
        geometry = self.geometry_now()
        if mode == "move":
            centre = np.asarray(ijk, dtype=float) - grab
            centre[geometry.normal_axis] = shape["centre"][geometry.normal_axis]  # within the plane
            if np.array_equal(centre, shape["centre"]):
                return
            shape["centre"] = centre
        else:
            d = np.asarray(ijk, dtype=float) - shape["centre"]
            h, v = geometry.h_axis, geometry.v_axis
            if shape["kind"] == "sphere":
                radius = float(round(np.hypot(d[h], d[v])))
            else:
                half = shape_half_sizes(shape)
                half[h], half[v] = abs(d[h]), abs(d[v])  # the mouse's voxel is a corner
                radius = half
            if np.array_equal(shape_half_sizes(dict(shape, radius=radius)), shape_half_sizes(shape)):
                return
            shape["radius"] = radius
        # One drag = one undo step, separate from the placement before it.
        self.document.set_roi_shape(layer, shape, merge_with_last=moved)
        self._drag_shape = (layer, grab, True, mode)

    def _paint_at(self, pos, continuing: bool) -> None:
        """Paint (or erase) a disc of the tools' radius in this plane; strokes are joined
        voxel to voxel so fast mouse moves leave no gaps; one stroke is one undo step."""
        point = self.voxel_at(pos.x(), pos.y(), exact=True)
        if point is None:
            return
        geometry = self.geometry_now()
        start = self._last_paint if continuing and self._last_paint is not None else point
        roi = self.tools.active_roi()
        voxels = roi_raster.stroke(
            self.document, roi, start, point, self.tools.radius, geometry.h_axis, geometry.v_axis, geometry.normal_axis
        )
        self.document.paint(roi, voxels, self.tools.tool == "brush", merge_with_last=continuing)
        self._last_paint = point

    def mousePressEvent(self, event) -> None:
        if self.navigation.press(event):  # a pan or a ruler click
            return
        if event.button() == Qt.MouseButton.LeftButton and self._painting():
            self._last_paint = None
            tool = self.tools.tool
            if tool in ("brush", "eraser"):
                self._paint_at(event.position(), continuing=False)
            elif tool == "rectangle":
                self._rect_start = self.voxel_at(event.position().x(), event.position().y())
                self._rect_end = self._rect_start
            elif tool == "polygon":
                vertex = self.voxel_at(event.position().x(), event.position().y())
                if vertex is not None:
                    self._polygon.append(np.asarray(vertex))
                    self.update()
            else:
                shift = bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
                self._shape_at(event.position(), resize=shift)
            return
        if event.button() == Qt.MouseButton.RightButton:
            layer = self._window_level_layer()
            if layer is not None:
                self._wl_start = (event.position(), layer, layer.clim)
            return
        self._move_cursor(event.position())

    def mouseMoveEvent(self, event) -> None:
        if self.navigation.move(event):  # a pan
            return
        if self._wl_start is not None:
            start, layer, (lo, hi) = self._wl_start
            delta = event.position() - start
            width = max((hi - lo) * (1 + delta.x() / 200.0), 1e-9)
            level = (lo + hi) / 2 - (hi - lo) * delta.y() / 200.0
            layer.set(clim=(level - width / 2, level + width / 2))
            return
        if event.buttons() & Qt.MouseButton.LeftButton:
            tool = self.tools.tool if self._painting() else "navigate"
            if tool in ("brush", "eraser"):
                self._paint_at(event.position(), continuing=self._last_paint is not None)
            elif tool == "rectangle":
                end = self.voxel_at(event.position().x(), event.position().y())
                if end is not None:
                    self._rect_end = end
                    self.update()
            elif tool == "navigate":
                self._move_cursor(event.position())
            elif self._drag_shape is not None:
                self._drag_shape_to(event.position())
        else:
            self.hovered.emit(self.voxel_at(event.position().x(), event.position().y()))

    def mouseDoubleClickEvent(self, event) -> None:
        if self._painting() and self.tools.tool == "polygon":
            self.finish_polygon()
            return
        super().mouseDoubleClickEvent(event)

    def finish_polygon(self) -> None:
        """Fill the polygon drawn so far on this slice (needs three distinct vertices)."""
        vertices = np.unique(np.asarray(self._polygon), axis=0) if self._polygon else []
        if len(vertices) >= 3:
            geometry = self.geometry_now()
            ordered = [v for i, v in enumerate(self._polygon) if i == 0 or not np.array_equal(v, self._polygon[i - 1])]
            voxels = roi_raster.polygon(ordered, geometry.h_axis, geometry.v_axis)
            roi = self.tools.active_roi()
            self.document.paint(roi, roi_raster.to_roi_grid(self.document, roi, voxels), True)
        self._polygon = []
        self.update()

    def mouseReleaseEvent(self, event) -> None:
        if self.navigation.release(event):  # the end of a pan
            return
        self._wl_start = None
        self._last_paint = None
        self._drag_shape = None
        if self._rect_start is not None and self._painting():
            end = self.voxel_at(event.position().x(), event.position().y())
            end = self._rect_end if end is None else end
            roi, box = self.tools.active_roi(), roi_raster.rectangle(self._rect_start, end)
            self.document.paint(roi, roi_raster.to_roi_grid(self.document, roi, box), True)
        self._rect_start = self._rect_end = None
        self.update()

    def _window_level_layer(self):
        for layer in reversed(self.document.layers):
            if layer.visible and layer.kind in SCALAR_KINDS:
                return layer
        return None

    def _move_cursor(self, pos) -> None:
        ijk = self.voxel_at(pos.x(), pos.y())
        if ijk is not None:
            self.document.set_cursor(ijk)
            self.cursor_moved.emit()

    def step(self, delta: int) -> None:
        geometry = self.geometry_now()
        if geometry is None:
            return
        ijk = self.document.cursor.copy()
        ijk[geometry.normal_axis] += delta
        self.document.set_cursor(ijk)

    def wheelEvent(self, event) -> None:
        if self.navigation.wheel(event):  # Ctrl+wheel zooms
            return
        self.step(1 if event.angleDelta().y() > 0 else -1)

    def keyPressEvent(self, event) -> None:
        key = event.key()
        if key in (Qt.Key.Key_PageUp, Qt.Key.Key_Up):
            self.step(1)
        elif key in (Qt.Key.Key_PageDown, Qt.Key.Key_Down):
            self.step(-1)
        elif key in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and self._polygon:
            self.finish_polygon()
        elif key == Qt.Key.Key_Escape and self._polygon:
            self._polygon = []
            self.update()
        elif not self.navigation.key_press(event):  # 0: reset zoom; Space: pan; Esc: ruler
            super().keyPressEvent(event)

    def keyReleaseEvent(self, event) -> None:
        if not self.navigation.key_release(event):
            super().keyReleaseEvent(event)

    def event(self, event) -> bool:
        if self.navigation.event(event):  # a touchpad pinch zooms
            return True
        return super().event(event)
