"""ROI outlines on the slice views: each ROI's edge drawn in its colour over a dark halo, with a
line style per role, above its translucent fill; also the edges of a tract's uncertainty
envelopes (:mod:`widgets.envelope_display`), solid in their level's colour, with no fill.

A fill alone vanishes where the map beneath has the ROI's hue (a green seed on the green of
colour FA, a blue target on its blue); the dark halo keeps the edge visible on any map, the
colour says which ROI it is, and the line style says its role even to a colour-blind reader.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QLineF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen

from .render import oversampled_voxels, sample_layer

ROLE_LINES = {  # the role of an ROI by its outline's style
    "seed": Qt.PenStyle.SolidLine,
    "target": Qt.PenStyle.DashLine,
    "waypoint": Qt.PenStyle.DotLine,
    "exclusion": Qt.PenStyle.DashDotLine,
    "stop": Qt.PenStyle.DashDotDotLine,
    "lesion": Qt.PenStyle.SolidLine,  # orange, solid: the region to keep away from
}
HALO = QColor(0, 0, 0, 220)
HALO_PX, LINE_PX = 5.0, 2.5  # ITK-SNAP's look: a translucent fill inside a bold, contrasting edge


def _runs(edges: np.ndarray) -> np.ndarray:
    """(N, 3) runs of True along the rows of a 2-D bool array: (row, first column, end column)."""
    padded = np.zeros((edges.shape[0], edges.shape[1] + 2), dtype=np.int8)
    padded[:, 1:-1] = edges
    change = np.diff(padded, axis=1)
    starts, ends = np.argwhere(change == 1), np.argwhere(change == -1)
    return np.column_stack([starts[:, 0], starts[:, 1], ends[:, 1]])


def outline_segments(mask: np.ndarray) -> np.ndarray:
    """The boundary of a 2-D mask (rows, columns) as (N, 4) segments ``x0, y0, x1, y1`` along the
    pixels' edges (x: column, y: row; pixel (r, c) spans [c, c+1] x [r, r+1]), collinear edges
    joined into one segment."""
    mask = np.asarray(mask, dtype=bool)
    padded = np.pad(mask, 1)
    horizontal = padded[1:, 1:-1] != padded[:-1, 1:-1]  # (H+1, W): the edge above row r
    vertical = padded[1:-1, 1:] != padded[1:-1, :-1]  # (H, W+1): the edge left of column c
    h = _runs(horizontal)
    v = _runs(vertical.T)
    segments = np.concatenate(
        [
            np.column_stack([h[:, 1], h[:, 0], h[:, 2], h[:, 0]]),
            np.column_stack([v[:, 0], v[:, 1], v[:, 0], v[:, 2]]),
        ]
    )
    return segments.astype(np.float64)


def roi_outlines(doc, geometry, oversample: int = 1) -> list:
    """(layer, segments) of each visible ROI with voxels on the slice, bottom to top, in the
    plane's pixels; drawn at ``oversample`` sub-pixels a pixel (an ROI finer than the plane)."""
    out = []
    voxels = oversampled_voxels(geometry, oversample)
    for layer in doc.layers:
        envelope = layer.kind == "labels" and "envelope_level" in (layer.provenance or {})  # outline only
        if not layer.visible or not (envelope or (layer.kind == "roi" and layer.opacity > 0)):
            continue
        values, inside = sample_layer(layer, doc, voxels)
        mask = np.asarray(values, dtype=bool) & inside
        if mask.any():
            out.append((layer, outline_segments(mask) / oversample))
    return out


def draw_outlines(painter: QPainter, outlines: list, geometry, target: QRectF) -> None:
    """Each ROI's outline: a dark halo, then its colour in its role's line style."""
    height, width = geometry.voxels.shape[:2]
    sx, sy = target.width() / width, target.height() / height
    painter.save()
    for layer, segments in outlines:
        screen = segments * [sx, sy, sx, sy] + [target.left(), target.top(), target.left(), target.top()]
        lines = [QLineF(*row) for row in screen.tolist()]
        envelope = layer.kind != "roi"  # an uncertainty envelope: its level's colour, solid, opaque
        alpha = 1.0 if envelope else min(1.0, 0.55 + layer.opacity)  # opaque at the default 0.45 fill
        halo = QPen(QColor(HALO.red(), HALO.green(), HALO.blue(), int(HALO.alpha() * alpha)), HALO_PX)
        halo.setCapStyle(Qt.PenCapStyle.SquareCap)
        painter.setPen(halo)
        painter.drawLines(lines)
        colour = layer.provenance["envelope_colour"] if envelope else layer.color_rgb()
        r, g, b = (int(255 * c + 0.5) for c in colour)
        style = Qt.PenStyle.SolidLine if envelope else ROLE_LINES.get(layer.data.role, Qt.PenStyle.SolidLine)
        pen = QPen(QColor(r, g, b, int(255 * alpha)), LINE_PX, style)
        pen.setCapStyle(Qt.PenCapStyle.FlatCap)
        painter.setPen(pen)
        painter.drawLines(lines)
    painter.restore()
