"""A slice view's 2-D glyphs (tensor ellipses, fODF sections) kept as one picture between paints.

A slice step repaints all three slice views, but only the one whose slice moved has new glyphs:
the other two repaint for the crosshair. Filling thousands of small paths is the costly part of
such a paint, so the glyphs are filled once into an image and later paints draw that image
while the paths, the target rectangle and the scale are the same. (Filled on the GUI thread:
PySide holds Python's lock while Qt fills, so a worker would stall the GUI thread as much. The
fODF sections, 32 pieces each, come as pictures drawn with NumPy on a worker instead:
:mod:`widgets.section_raster`.)
"""

from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QPainter

from .section_raster import GlyphPicture


class GlyphRaster:
    """The last filled glyph picture of one view, and what it was filled from."""

    def __init__(self):
        self.sources: list = []  # the path lists the picture was filled from (held: compared by identity)
        self.key = None
        self.image: QImage | None = None
        self.fills = 0  # how many times the paths were filled (tests)

    def forget(self) -> None:
        self.sources, self.key, self.image = [], None, None

    def draw(self, painter: QPainter, layers: list[list], target: QRectF, visible: QRectF, scale: float,
             ratio: float) -> None:  # fmt: skip
        """Draw ``layers`` (per layer, [(rgba, path)] in plane millimetres from ``target``'s
        top-left corner, or a :class:`widgets.section_raster.GlyphPicture`; bottom first), the
        paths scaled by ``scale`` (screen pixels per mm), where they meet ``visible`` (the
        widget: a zoomed slice's target is larger than the screen);
        ``ratio``: the widget's device pixel ratio (the picture has the screen's own pixels)."""
        layers = [paths for paths in layers if paths]  # a hidden or unbuilt layer's [] is new at each paint
        if not layers:
            return
        area = target.intersected(visible)
        if area.isEmpty():
            return
        key = (target.left(), target.top(), target.width(), target.height(), area.left(), area.top(),
               area.width(), area.height(), scale, ratio)  # fmt: skip
        same = len(layers) == len(self.sources) and all(a is b for a, b in zip(layers, self.sources, strict=True))
        if not same or key != self.key or self.image is None:
            self.image = self._fill(layers, target, area, scale, ratio)
            self.sources, self.key = list(layers), key
            self.fills += 1
        painter.drawImage(QPointF(area.left(), area.top()), self.image)

    @staticmethod
    def _fill(layers: list[list], target: QRectF, area: QRectF, scale: float, ratio: float) -> QImage:
        image = QImage(max(1, math.ceil(area.width() * ratio)), max(1, math.ceil(area.height() * ratio)),
                       QImage.Format.Format_ARGB32_Premultiplied)  # fmt: skip
        image.fill(Qt.GlobalColor.transparent)
        image.setDevicePixelRatio(ratio)
        painter = QPainter(image)
        painter.translate(target.left() - area.left(), target.top() - area.top())
        for source in layers:
            if isinstance(source, GlyphPicture):  # drawn on a worker for a place on the screen
                height, width = source.pixels.shape
                picture = QImage(
                    source.pixels.data, width, height, 4 * width, QImage.Format.Format_ARGB32_Premultiplied
                )
                painter.drawImage(QRectF(*source.placed(target.getRect())), picture)
            else:
                fill_layers(painter, [source], scale)
        painter.end()
        return image


def fill_layers(painter: QPainter, layers: list[list], scale: float) -> None:
    """Fill the glyph paths of ``layers`` (plane millimetres) at ``scale`` screen pixels per mm
    from the painter's origin."""
    painter.save()
    painter.scale(scale, scale)
    painter.setPen(Qt.PenStyle.NoPen)
    for paths in layers:
        for rgba, path in paths:
            painter.fillPath(path, QColor(*rgba))
    painter.restore()
