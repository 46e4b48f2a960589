"""Every streamline drawn, simplified, where a full frame is too slow (issue 41).

On graphics that draw few segments a second (an H200's: 10 M streamlines of 100 points take
1.2 s) the 3-D view would draw a subset at rest and while moving. Once a full frame has been
timed over the moving budget, this asks a worker for the tractogram simplified within
:data:`~app.fiber_simplify.SIMPLIFY_TOLERANCE_MM` (:meth:`app.fiber_cache.FiberArrayCache.simplified`:
every streamline, each dropped point within 0.1 mm of the line drawn; on the GPU when there is
one), and the view draws that instead of the whole at rest, and while moving too when its own
timed frame is within the moving budget. It is drawn only while the tolerance is at most half a
pixel at the camera's focal plane (zoomed in further, the view draws the whole again), and never
for a selection (its own levels apply).
"""

from __future__ import annotations

import logging
import math
import time

from tractlens.app.fiber_arrays import Cells
from tractlens.app.fiber_simplify import SIMPLIFY_TOLERANCE_MM

from .gl_fibers import element_arrays
from .glyphs import LatestTask

log = logging.getLogger(__name__)

MAX_TOLERANCE_PX = 0.5  # the simplified level is drawn while its tolerance is at most this on screen


class FibreSimplifier:
    """The simplified level of each tractogram of a view: asked for, held, timed."""

    def __init__(self, view):
        self.view = view
        self.tasks: dict[int, LatestTask] = {}
        self.cells: dict[int, Cells] = {}
        self.made_for: dict[int, object] = {}  # the display arrays each level was made from
        self.frame_s: float | None = None  # the last frame at rest that drew simplified levels
        self.seconds: dict[int, float] = {}  # how long each took to make (worker)
        self.failed: str | None = None

    def forget(self, key: int) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            task.forget()
        self.cells.pop(key, None)
        self.made_for.pop(key, None)
        self.seconds.pop(key, None)
        self.frame_s = None

    def want(self, entries: dict, device: str = "auto") -> None:
        """Ask for the simplified level of every shown tractogram drawn from the view's own
        buffers that has none yet (on a worker; the view redraws when it comes)."""
        cache = self.view.document.fiber_arrays
        for key, entry in entries.items():
            scene = entry["scene"]
            if key in self.cells or key in self.tasks or not hasattr(scene, "set_moving_stride"):
                continue
            layer = entry["layer"]
            task = self.tasks[key] = LatestTask(lambda _key, cells, key=key: self._arrived(key, cells), self.view)

            def build(layer=layer, arrays=scene.arrays):
                start = time.perf_counter()
                cells = cache.simplified(layer, device)
                if cache.prepare(layer) is not arrays:  # the tractogram changed meanwhile (a growing result)
                    return None, arrays, 0.0
                element_arrays(cells, arrays.offsets, arrays.bounds)  # the GL layer's, made here too
                return cells, arrays, time.perf_counter() - start

            task.request(key, build, after_paint=True)

    def _arrived(self, key: int, result) -> None:
        if key not in self.tasks:  # the tractogram went meanwhile
            return
        if result is None:
            self.failed = "simplifying the streamlines for drawing failed (see the log)"
            log.warning(self.failed)
            return
        cells, arrays, seconds = result
        if cells is None:  # made for arrays that are gone: asked again at the next rest
            self.tasks.pop(key, None)
            return
        self.cells[key], self.made_for[key], self.seconds[key] = cells, arrays, seconds
        self.frame_s = None  # its frame is timed at the next rest
        self.view.simplified_arrived()

    def ready(self) -> bool:
        """Has every level asked for arrived (or failed)?"""
        return all(task.ready() for task in self.tasks.values())

    def allowed(self) -> bool:
        """Is the tolerance at most :data:`MAX_TOLERANCE_PX` at the camera's focal plane?"""
        renderer = self.view.plotter.renderer
        camera = renderer.GetActiveCamera()
        height_px = max(1, renderer.GetSize()[1])
        if camera.GetParallelProjection():
            height_mm = 2.0 * camera.GetParallelScale()
        else:
            height_mm = 2.0 * camera.GetDistance() * math.tan(math.radians(camera.GetViewAngle()) / 2)
        return SIMPLIFY_TOLERANCE_MM * height_px / max(height_mm, 1e-9) <= MAX_TOLERANCE_PX

    def level(self, key: int, entry: dict) -> Cells | None:
        """The simplified cells to draw for this tractogram now, or None."""
        cells = self.cells.get(key)
        if cells is not None and self.made_for.get(key) is not getattr(entry["scene"], "arrays", None):
            self.forget(key)  # the tractogram's arrays were replaced (a growing result): made again when asked
            return None
        if cells is None or entry["layer"].selection is not None or not self.allowed():
            return None
        return cells
