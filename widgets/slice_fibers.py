"""Tractograms on a slice view: the segments within a slab around the slice, coloured as in 3-D.

A paint used to test every point of the tractogram's slice-view level (a few million) against
the slab and build a Python ``QLineF`` per segment drawn, twice (a dark halo, then the colour):
about a third of a second per view, paid by all three slice views at every selection or colour
change. Here the segments within the slab are found once per slice position (a selection only
filters those few by streamline), and they are drawn as one path per colour, built from an array
in ``QPainterPath``'s data-stream format (no Python object per segment).
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QByteArray, QDataStream, QIODevice, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen

from tractlens.app.loaders import check_pending

MAX_SEGMENTS = 20_000  # drawn per tractogram and view (a regular subset beyond)


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
    layer until the slice, the slab or the layer's arrays change."""

    def __init__(self) -> None:
        self._slab: dict[int, tuple] = {}  # layer id -> (key, segment indices within the slab)

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

    def draw(self, painter: QPainter, document, geometry, target: QRectF, slab_mm) -> None:
        """Segments of visible tractograms within the slab, coloured as in 3-D."""
        height, width = geometry.voxels.shape[:2]
        axis = geometry.normal_axis
        zoom = float(np.sqrt((document.reference_affine[:3, axis] ** 2).sum()))
        present = set()
        painter.save()
        painter.setBrush(Qt.BrushStyle.NoBrush)
        for layer in document.layers:
            if layer.kind != "tractogram" or not layer.visible or len(layer.data) < 1 or check_pending(layer):
                continue  # (a .trx whose positions are still being checked: drawn once they are)
            present.add(id(layer))
            pts, point_colours, offsets, stream_of_point = document.fiber_arrays.on_reference(
                layer, document.reference_affine
            )
            idx = self.slab_segments(layer, pts, offsets, axis, document.cursor[axis], zoom, slab_mm)
            if layer.selection is not None and idx.size:
                idx = idx[layer.selection[stream_of_point[idx]]]
            if idx.size == 0:
                continue
            idx = idx[:: max(1, idx.size // MAX_SEGMENTS)]  # bound the 2-D drawing work
            rows0, cols0 = geometry.pixel_of(pts[idx])
            rows1, cols1 = geometry.pixel_of(pts[idx + 1])
            sx, sy = target.width() / width, target.height() / height
            x0, y0 = target.left() + (cols0 + 0.5) * sx, target.top() + (rows0 + 0.5) * sy
            x1, y1 = target.left() + (cols1 + 0.5) * sx, target.top() + (rows1 + 0.5) * sy
            # A dark halo under the fibres: red, green or blue fibres stay visible on colour FA.
            painter.setPen(QPen(QColor(0, 0, 0, int(170 * layer.opacity)), 3.0))
            painter.drawPath(segments_path(x0, y0, x1, y1))
            buckets = np.rint(point_colours[idx] * (4 / 255.0)).astype(np.int64)  # 125 colours: one path each
            keys = buckets[:, 0] * 25 + buckets[:, 1] * 5 + buckets[:, 2]
            order = np.argsort(keys, kind="stable")
            cuts = np.flatnonzero(np.diff(keys[order])) + 1
            alpha = int(255 * layer.opacity)
            for group in np.split(order, cuts):
                r, g, b = (buckets[group[0]] * 255) // 4
                painter.setPen(QPen(QColor(int(r), int(g), int(b), alpha), 1.5))
                painter.drawPath(segments_path(x0[group], y0[group], x1[group], y1[group]))
        painter.restore()
        self.forget(present)
