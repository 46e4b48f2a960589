"""Tractograms on a slice view: the segments within a slab around the slice, coloured as in 3-D.

A paint used to test every point of the tractogram's slice-view level (a few million) against
the slab and build a Python ``QLineF`` per segment drawn, twice (a dark halo, then the colour):
about a third of a second per view, paid by all three slice views at every selection or colour
change. Here the segments within the slab are found once per slice position (a selection only
filters those few by streamline), and they are drawn as one path per colour, built from an array
in ``QPainterPath``'s data-stream format (no Python object per segment).

A whole-brain tractogram (more than :data:`WORKER_MIN_POINTS` points) is drawn by a worker
thread instead (:class:`widgets.glyphs.LatestTask`), into a transparent image at a whole
multiple of the slice's resolution that the paint only scales onto the screen: drawing 20,000
segments twice took ~120 ms of the GUI thread per view and change at 10 M streamlines (three
views: a third of a second per ROI edit). Until the new image arrives, a selection or colour
change shows the previous one; a new slice position shows none.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QByteArray, QDataStream, QIODevice, QObject, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QPainter, QPainterPath, QPen

from tractlens.app.loaders import check_pending

from .glyphs import LatestTask

MAX_SEGMENTS = 20_000  # drawn per tractogram and view (a regular subset beyond)
#: Tractograms of more points are drawn by a worker into an image (module docstring).
WORKER_MIN_POINTS = 2_000_000
#: The worker's image is at most this many pixels on its longer side (a whole multiple of the
#: slice's resolution: about the screen's, so that the lines keep their width).
MAX_IMAGE_SIDE = 2048


def segments_path(x0: np.ndarray, y0: np.ndarray, x1: np.ndarray, y1: np.ndarray) -> QPainterPath:
    """One path of separate segments (x0, y0) -> (x1, y1), made from an array in QPainterPath's
    QDataStream format (element count, (type, x, y) per element, the last subpath's start, the
    fill rule): a move and a line per segment."""
    path = QPainterPath()
    count = len(x0)
    if count == 0:
        return path
    elements = np.empty((count, 2), dtype=[("type", ">i4"), ("x", ">f8"), ("y", ">f8")])
    elements["type"][:, 0] = 0  # MoveToElement
    elements["type"][:, 1] = 1  # LineToElement
    elements["x"][:, 0], elements["y"][:, 0], elements["x"][:, 1], elements["y"][:, 1] = x0, y0, x1, y1
    tail = np.array([2 * count - 2, 0], dtype=">i4")  # last subpath start, Qt::OddEvenFill
    buffer = QByteArray(np.array([2 * count], dtype=">i4").tobytes() + elements.tobytes() + tail.tobytes())
    stream = QDataStream(buffer, QIODevice.OpenModeFlag.ReadOnly)  # ``buffer`` lives while it is read
    stream >> path
    return path


class SliceFibres:
    """The tractogram segments of one slice view, with the segments within the slab kept per
    layer until the slice, the slab or the layer's arrays change; whole-brain tractograms drawn
    into an image by a worker (module docstring). ``owner``: the view (its ``update`` is called
    when an image arrives)."""

    def __init__(self, owner: QObject | None = None) -> None:
        self._slab: dict[int, tuple] = {}  # layer id -> (key, segment indices within the slab)
        self._owner = owner
        self._task: LatestTask | None = None
        self._image: tuple | None = None  # (key, QImage) of the large tractograms, built last

    def slab_segments(self, layer, pts, offsets, axis: int, cursor: float, zoom: float, slab_mm) -> np.ndarray:
        """Indices ``k`` of the segments (point k -> k + 1, within one streamline) with both ends
        within ``slab_mm`` / 2 of the slice (every segment when ``slab_mm`` is None)."""
        key = (id(pts), len(pts), len(offsets), axis, float(cursor), zoom, slab_mm)  # (offsets: a new array each time)
        cached = self._slab.get(id(layer))
        if cached is not None and cached[0] == key:
            return cached[1]
        if slab_mm is None:
            seg = np.ones(max(len(pts) - 1, 0), dtype=bool)
        else:
            near = np.abs(pts[:, axis] - cursor) * zoom <= slab_mm / 2
            seg = near[:-1] & near[1:]
        seg[offsets[1:-1] - 1] = False  # no segment joins two streamlines
        index = np.flatnonzero(seg)
        self._slab[id(layer)] = (key, index)
        return index

    def forget(self, present: set[int]) -> None:
        for key in [k for k in self._slab if k not in present]:
            del self._slab[key]

    def ready(self) -> bool:
        """Does the image of the large tractograms show what was asked for last (scripts and
        tests wait on it through the window's ``wait_for_jobs``)?"""
        return self._task is None or self._task.ready()

    def draw(self, painter: QPainter, document, geometry, target: QRectF, slab_mm) -> None:
        """Segments of visible tractograms within the slab, coloured as in 3-D."""
        height, width = geometry.voxels.shape[:2]
        axis = geometry.normal_axis
        zoom = float(np.sqrt((document.reference_affine[:3, axis] ** 2).sum()))
        cursor = float(document.cursor[axis])
        present, large = set(), []
        painter.save()
        painter.setBrush(Qt.BrushStyle.NoBrush)
        sx, sy = target.width() / width, target.height() / height
        for layer in document.layers:
            if layer.kind != "tractogram" or not layer.visible or len(layer.data) < 1 or check_pending(layer):
                continue  # (a .trx whose positions are still being checked: drawn once they are)
            present.add(id(layer))
            if int(layer.data.offsets[-1]) > WORKER_MIN_POINTS:
                large.append(layer)
                continue
            ends = self._segments(layer, layer.selection, document, geometry, zoom, cursor, slab_mm)
            if ends is not None:
                (rows0, cols0, rows1, cols1), colours = ends
                x0, y0 = target.left() + (cols0 + 0.5) * sx, target.top() + (rows0 + 0.5) * sy
                x1, y1 = target.left() + (cols1 + 0.5) * sx, target.top() + (rows1 + 0.5) * sy
                paint_segments(painter, x0, y0, x1, y1, colours, layer.opacity)
        if large:
            self._draw_large(painter, document, geometry, target, large, (zoom, cursor, slab_mm))
        elif self._task is not None:
            self._task.forget()
            self._image = None
        painter.restore()
        self.forget(present)

    def _segments(self, layer, selection, document, geometry, zoom: float, cursor: float, slab_mm):
        """((row0, col0, row1, col1) in slice pixels, colours (S, 3) uint8) of the layer's
        segments drawn on this slice (at most :data:`MAX_SEGMENTS`), or None."""
        axis = geometry.normal_axis
        pts, point_colours, offsets, stream_of_point = document.fiber_arrays.on_reference(
            layer, document.reference_affine
        )
        idx = self.slab_segments(layer, pts, offsets, axis, cursor, zoom, slab_mm)
        if selection is not None and idx.size:
            idx = idx[selection[stream_of_point[idx]]]
        if idx.size == 0:
            return None
        idx = idx[:: max(1, idx.size // MAX_SEGMENTS)]  # bound the 2-D drawing work
        rows0, cols0 = geometry.pixel_of(pts[idx])
        rows1, cols1 = geometry.pixel_of(pts[idx + 1])
        return (rows0, cols0, rows1, cols1), point_colours[idx]

    def _draw_large(self, painter: QPainter, document, geometry, target: QRectF, layers, where) -> None:
        """The large tractograms: the image built for this slice and state, else (asked for) the
        previous one while only the selection, the colours or the opacity changed."""
        height, width = geometry.voxels.shape[:2]
        zoom, cursor, slab_mm = where
        scale = int(np.clip(np.ceil(max(target.width() / width, target.height() / height)), 1,
                            max(1, MAX_IMAGE_SIDE // max(width, height))))  # fmt: skip
        place = (geometry.normal_axis, cursor, slab_mm, zoom, (height, width), geometry.h_axis, geometry.v_axis,
                 geometry.h_reversed, geometry.v_reversed, document.reference_affine.tobytes(), scale)  # fmt: skip
        state = tuple(_drawn_state(layer) for layer in layers)
        key = (place, state)
        if self._task is None:
            self._task = LatestTask(self._built, self._owner)
        snapshot = [(layer, layer.selection, layer.opacity) for layer in layers]  # as they are now

        def build():
            image = QImage(width * scale, height * scale, QImage.Format.Format_ARGB32_Premultiplied)
            image.fill(Qt.GlobalColor.transparent)
            out = QPainter(image)
            out.setBrush(Qt.BrushStyle.NoBrush)
            for layer, selection, opacity in snapshot:
                ends = self._segments(layer, selection, document, geometry, zoom, cursor, slab_mm)
                if ends is not None:
                    rows0, cols0, rows1, cols1 = ((a + 0.5) * scale for a in ends[0])
                    paint_segments(out, cols0, rows0, cols1, rows1, ends[1], opacity)
            out.end()
            return image

        # Only the selection, colours or opacity changed (this place's image is shown meanwhile):
        # built after this paint, so the worker does not compete with the 3-D view's frame of
        # the same change. A new place has nothing to show until its image: built at once.
        shown = self._image is not None and (self._image[0] == key or self._image[0][0] == place)
        self._task.request(key, build, after_paint=shown)  # nothing when this image is built or being built
        if shown:
            painter.drawImage(target, self._image[1])

    def _built(self, key, image) -> None:
        self._image = None if image is None else (key, image)
        if self._owner is not None:
            self._owner.update()


def _drawn_state(layer) -> tuple:
    """What a layer's segments on a slice depend on besides the slice: its data, selection,
    colouring and opacity (plain values: compared, not hashed)."""
    colouring = tuple(repr(value) for value in (layer.color_by, layer.colormap, layer.clim, layer.color))
    return (id(layer), id(layer.data), id(layer.selection), *colouring, float(layer.opacity))


def paint_segments(painter: QPainter, x0, y0, x1, y1, colours: np.ndarray, opacity: float) -> None:
    """Segments (x0, y0) -> (x1, y1) in the painter's pixels: a dark halo under them (red, green
    or blue fibres stay visible on colour FA), then one path per colour (125 colours)."""
    painter.setPen(QPen(QColor(0, 0, 0, int(170 * opacity)), 3.0))
    painter.drawPath(segments_path(x0, y0, x1, y1))
    buckets = np.rint(colours * (4 / 255.0)).astype(np.int64)  # 125 colours: one path each
    keys = buckets[:, 0] * 25 + buckets[:, 1] * 5 + buckets[:, 2]
    order = np.argsort(keys, kind="stable")
    cuts = np.flatnonzero(np.diff(keys[order])) + 1
    alpha = int(255 * opacity)
    for group in np.split(order, cuts):
        r, g, b = (buckets[group[0]] * 255) // 4
        painter.setPen(QPen(QColor(int(r), int(g), int(b), alpha), 1.5))
        painter.drawPath(segments_path(x0[group], y0[group], x1[group], y1[group]))
