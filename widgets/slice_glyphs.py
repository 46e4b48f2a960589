"""A slice view's 2-D glyph layers: tensor layers as ellipses (each tensor's in-plane 2x2 part),
fODF layers as their in-plane sections (:mod:`widgets.fod_glyphs`).

They are built on worker threads (:class:`widgets.glyphs.LatestTask`): ellipses as one path per
colour in plane millimetres, sections as a picture for the slice's place on the screen
(:mod:`widgets.section_raster`). A paint only draws the last ones built, so a slice step never
waits for them: until the new slice's arrive the previous slice's are shown, and a picture made
before a zoom or pan is scaled along until its successor comes. Those of the slices one voxel
either way are built ahead (:mod:`widgets.glyph_prefetch`), so that a step draws its own in its
first paint. What is drawn is kept as one picture between paints (:class:`widgets.glyph_raster.GlyphRaster`).
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QTimer
from PySide6.QtGui import QPainter

from .fod_glyphs import slice_glyph_job
from .glyph_prefetch import MISSING, GlyphPrefetch, neighbour_planes
from .glyph_raster import GlyphRaster
from .glyphs import LatestTask

GLYPH_KINDS_2D = ("tensor", "fod")


class SliceGlyphs:
    """The 2-D glyphs of one :class:`widgets.slice_view.SliceView` (``view``: its document,
    geometry, place on the screen and 3-D partner)."""

    def __init__(self, view):
        self.view = view
        self.tasks: dict[int, LatestTask] = {}  # glyph layer id -> its 2-D glyph builds (workers)
        # glyph layer id -> the last built: [(rgba, path)] (ellipses) or a GlyphPicture (fODF sections)
        self.built: dict[int, list] = {}
        self.raster = GlyphRaster()  # those drawn into one picture, kept between paints
        self.ahead = GlyphPrefetch(kept=8)  # the neighbouring slices' glyphs
        self._ahead_due = False  # built ahead once the paint that shows new glyphs is done

    def jobs(self, geometry, target: QRectF) -> list:
        """(layer, build, key) per visible tensor or fODF layer: its glyphs on the slice of
        ``geometry``, every n-th voxel (the layer's step, or more: :func:`widgets.glyphs.glyph_step_2d`)."""
        view = self.view
        height, width = geometry.voxels.shape[:2]
        cell_px = min(target.width() / width, target.height() / height)
        area = target.intersected(QRectF(view.rect()))
        screen = (target.getRect(), area.getRect(), view.devicePixelRatioF())  # what a picture is made for
        return [(layer, *slice_glyph_job(layer, view.document, geometry, (height, width), cell_px, screen))
                for layer in view.document.layers
                if layer.kind in GLYPH_KINDS_2D and layer.visible and layer.opacity > 0]  # fmt: skip

    def request(self, geometry, target: QRectF) -> list:
        """:meth:`jobs` for the slice as it is now, asked of the workers (or found built ahead)."""
        requests = self.jobs(geometry, target)
        wanted = {id(layer) for layer, _build, _key in requests}
        for key in [key for key in self.tasks if key not in wanted]:
            self.tasks.pop(key).forget()
            self.built.pop(key, None)
        for layer, build, key in requests:
            task = self.tasks.get(id(layer))
            if task is None:
                task = LatestTask(lambda _key, paths, layer=layer: self._arrived(layer, paths), self.view)
                self.tasks[id(layer)] = task
            made = self.ahead.take(key, layer.data.data) if key != task.wanted else MISSING
            if made is MISSING:
                task.request(key, build)  # nothing when that picture is built or being built
            else:  # built ahead: drawn in this paint (and the next ones built ahead after it)
                self.built[id(layer)], self._ahead_due = task.settle(key, made, deliver=False) or [], True
        return requests

    def _arrived(self, layer, paths) -> None:
        if id(layer) in self.tasks:
            self.built[id(layer)] = paths or []
            self._ahead_due = True
            # with the 3-D frame that waits for its glyphs, if one does (one window update)
            partner = self.view.frame_partner
            if partner is None or not partner.join_frame(self.view):
                self.view.update()

    def ready(self, geometry, target: QRectF) -> bool:
        """Do the glyphs drawn show the document as it is now (no build pending)? Asks for the
        builds that are missing."""
        if geometry is not None:
            self.request(geometry, target)
        return all(task.ready() for task in self.tasks.values())

    def draw(self, painter: QPainter, geometry, target: QRectF) -> None:
        """Draw the last glyphs built (asking for the slice's own first)."""
        view = self.view
        self.request(geometry, target)
        width = geometry.voxels.shape[1]
        scale = target.width() / (width * geometry.pixel_mm[1])  # screen pixels per mm
        layers = [self.built.get(id(layer)) or [] for layer in view.document.layers if layer.kind in GLYPH_KINDS_2D]
        # filled once per picture: a repaint for the crosshair alone draws the same image
        self.raster.draw(painter, layers, target, QRectF(view.rect()), scale, view.devicePixelRatioF())

    def painted(self) -> None:
        """A paint is done: new glyphs shown in it start the builds ahead, after the step's 3-D
        frame if one is due (they would slow its build)."""
        if self._ahead_due:
            self._ahead_due = False
            partner = self.view.frame_partner
            if partner is not None:
                partner.after_frame(self.build_ahead)
            else:
                QTimer.singleShot(0, self.view, self.build_ahead)

    def build_ahead(self) -> None:
        """The glyphs of the slices one voxel either way, for this place on the screen."""
        view = self.view
        if (geometry := view.geometry_now()) is not None:
            target, planes = view._target_rect(geometry), neighbour_planes(geometry, view.document.reference_shape)
            self.ahead.ahead([(build, key, layer.data.data) for plane in planes
                              for layer, build, key in self.jobs(plane, target)])  # fmt: skip
