"""The tractograms of the 3-D view and their level of detail, stated on screen.

Each tractogram is one :class:`~widgets.fiber_actors.FiberActors`: its points go to the GPU once,
and what is drawn is a set of index ranges (:class:`app.fiber_arrays.Cells`, prepared on workers
by the document's fiber array cache). At rest the view draws every (selected) streamline where
the hardware allows it: with software OpenGL it draws at most
:data:`~app.fiber_arrays.SOFTWARE_SETTLED_POINTS` points of whole streamlines, and with hardware
OpenGL a full frame that takes longer than :data:`FULL_FRAME_BUDGET_S` makes it draw the moving
level at rest instead. While the camera moves it draws a subset (every streamline when a full
frame takes at most :data:`MOVING_FRAME_BUDGET_S`; otherwise the moving level, thinned to what the
GPU's rate, as its timed full frame showed, draws in that time). A frame is timed until the GPU
has drawn it, not until its GL calls are queued. Whenever fewer than all are drawn, a line in
the top right corner says so ("showing 240 k of 10 M streamlines while moving"). ROI edits on a
tractogram filtered by ROIs draw the moving level too until they pause (:meth:`editing`).

Tractograms of at least :data:`GL_LAYER_MIN_POINTS` points are drawn from the view's own OpenGL
buffers (:mod:`widgets.gl_fiber_actors`: no index buffer or colour array built on the GUI thread,
selections and colours changed without rebuilding) where this OpenGL can (GL 3.2 core and
PyOpenGL); otherwise, or when the shaders fail, by VTK as before, and the status bar says why.
``TRACTLENS_FIBRES_GL=0`` in the environment keeps every tractogram on VTK.
"""

from __future__ import annotations

import math
import os
import re
import time

from PySide6.QtCore import QTimer
from vtkmodules.vtkRenderingCore import vtkTextActor

from tractlens.app.fiber_arrays import LEVELS
from tractlens.app.layers import SOLID
from tractlens.app.model import Layer

from .fiber_actors import FiberActors, draws_nothing, lookup_table
from .fibre_simplifier import FibreSimplifier
from .gl_fiber_actors import GLFiberActors
from .view3d_overlays import colour_bar_title, show_one_colour_bar

FULL_FRAME_BUDGET_S = 1.0  # a full frame at rest may take this long, else the view draws fewer
MOVING_FRAME_BUDGET_S = 1 / 30  # a full frame this fast is drawn while the camera moves too
LOD_TEXT_PT = 13
EDITING = "editing ROIs"  # why the moving level is drawn while ROI edits go on (what the view says)
EDIT_SELECTION_WAIT_S = 10.0  # an ROI edit's selection is waited for this long before drawing everything
#: Tractograms of at least this many points are drawn from the view's own buffers (where OpenGL
#: allows): below it VTK's own preparation of the polylines takes well under a second.
GL_LAYER_MIN_POINTS = 2_000_000
GL_MIN_VERSION = (3, 2)  # geometry shaders, core profile


def gl_version(ren_win) -> tuple[int, int]:
    """The OpenGL version of the view's context ((0, 0) when unknown)."""
    info = ren_win.ReportCapabilities() or ""
    line = next((line for line in info.splitlines() if "version string" in line), "")
    found = re.search(r"(\d+)\.(\d+)", line.split(":", 1)[-1])
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def gl_layer_refusal(ren_win) -> str | None:
    """Why tractograms cannot be drawn from the view's own buffers here (None: they can)."""
    if os.environ.get("TRACTLENS_FIBRES_GL", "1") == "0":
        return "TRACTLENS_FIBRES_GL=0"
    try:
        import OpenGL  # noqa: F401 - the gui extra's PyOpenGL
    except ImportError:
        return "PyOpenGL is not installed (pip install 'tractlens[gui]')"
    version = gl_version(ren_win)
    if (0, 0) < version < GL_MIN_VERSION:  # unknown: tried (a shader that fails falls back to VTK)
        return f"OpenGL {version[0]}.{version[1]} is older than {GL_MIN_VERSION[0]}.{GL_MIN_VERSION[1]}"
    return None


def gl_renderer(ren_win) -> str:
    """The OpenGL renderer string ("NVIDIA H100 80GB HBM3/PCIe/SSE2", "llvmpipe (LLVM 15.0.6, 256 bits)")."""
    info = ren_win.ReportCapabilities() or ""
    line = next((line for line in info.splitlines() if "renderer string" in line), "")
    return line.split(":", 1)[1].strip() if ":" in line else info[:200]


def count_words(n: int) -> str:
    """``400 k``, ``10 M``, ``5,000``: counts as the level-of-detail line says them."""
    if n >= 1_000_000:
        return f"{n / 1e6:.3g} M"
    if n >= 10_000:
        return f"{n / 1e3:.3g} k"
    return f"{n:,}"


class FiberView:
    """The tractogram part of :class:`widgets.view3d.View3D` (a mixin: it uses the view's
    ``plotter``, ``document``, ``request_render`` and ``_software``)."""

    def _init_fibers(self) -> None:
        self._fibers: dict[int, dict] = {}
        self._moving = False
        self._moving_why = "moving"  # what the level-of-detail line says the view is doing: moving, editing ROIs
        self._selection_due, self._selection_due_since = False, 0.0  # an ROI edit's selection is on its way
        self._full_frame_s: float | None = None  # the last full frame at rest (hardware OpenGL)
        self._points_per_s: float | None = None  # the GPU's drawing rate that frame showed
        self._simplifier = FibreSimplifier(self)  # every streamline, simplified, where a full frame is slow
        self.compute_device = "auto"  # where the simplified levels are made (the window's device)
        self._frames_at_build = 0  # frames drawn when a tractogram came: the first one after uploads it
        self._rest_capped = False  # a full frame was over budget: the moving level is drawn at rest
        text = self._lod_actor = vtkTextActor()
        text.GetPositionCoordinate().SetCoordinateSystemToNormalizedViewport()
        text.SetPosition(0.99, 0.97)
        prop = text.GetTextProperty()
        prop.SetJustificationToRight()
        prop.SetVerticalJustificationToTop()
        prop.SetFontSize(LOD_TEXT_PT)
        prop.SetColor(1.0, 0.85, 0.3)
        text.SetInput("")
        self.plotter.renderer.AddViewProp(text)

    def decide_fibre_drawing(self) -> None:
        """Decide now, once the view's OpenGL context exists, how tractograms are drawn (and so
        what the loading jobs prepare for them: :attr:`FiberArrayCache.shader_drawn_min_points`),
        rather than at the first frame, which a file opened at start-up (``tractlens view``) comes
        before: its display arrays would be prepared for VTK (a colour per point, a float16
        file's positions converted)."""
        ren_win = self.plotter.ren_win
        if ren_win is not None and ren_win.GetInitialized():
            self._software()

    def _software(self) -> bool:
        """Is OpenGL software-rendered here (then the settled detail is capped)?"""
        if getattr(self, "_software_rendering", None) is None:
            self.gl_renderer = gl_renderer(self.plotter.ren_win)
            self._software_rendering = any(name in self.gl_renderer for name in ("llvmpipe", "softpipe", "swrast"))
            cache = self.document.fiber_arrays
            self.gl_layer_refused = gl_layer_refusal(self.plotter.ren_win)
            cache.shader_drawn_min_points = None if self.gl_layer_refused else GL_LAYER_MIN_POINTS
            if self._software_rendering:  # the hardware moving level is never drawn here: not prepared ahead
                cache.skip_levels = frozenset({"moving"})
                cache.skip_selection_levels = frozenset({"full", "moving"})
            else:  # nor are the software levels of a selection with hardware OpenGL
                cache.skip_selection_levels = frozenset({"software", "moving_software"})
                cache.later_selection_levels = frozenset({"full"})  # drawn once ROI edits pause
        return self._software_rendering

    # ------------------------------------------------------------- levels
    def _rest_level(self) -> str:
        if self._software():
            return "software"
        return "moving" if self._rest_capped else "full"

    def _moving_level(self) -> str:
        if self._software():
            return "moving_software"
        fast = self._full_frame_s is not None and self._full_frame_s <= MOVING_FRAME_BUDGET_S
        return self._rest_level() if fast else "moving"

    def _place_cells(self, entry: dict, editing: bool | None = None) -> None:
        """Both actors' index ranges for the levels of now and the layer's selection; while ROI
        edits go on (``editing``, by default whether they do), the moving level's alone, the rest
        level's once they pause (:meth:`_full_detail`): a whole-brain selection's is made on the
        later thread meanwhile (the cache's ``later_selection_levels``), not before the edit's frame."""
        layer, cache = entry["layer"], self.document.fiber_arrays
        entry["selection"] = layer.selection
        entry["shown_total"] = len(layer.data) if layer.selection is None else layer.selected_count()
        scene = entry["scene"]
        moving = cache.cells(layer, self._moving_level(), layer.selection)
        editing = (self._moving and self._moving_why == EDITING) if editing is None else editing
        entry["rest_due"] = editing and "actor" in scene.cells
        if entry["rest_due"]:
            scene.show_cells("moving", moving)  # (the rest actor keeps the selection before until then)
            return
        rest = cache.cells(layer, self._rest_level(), layer.selection)
        simple = None if self._software() else self._simplifier.level(id(layer), entry)
        fast = self._full_frame_s is not None and self._full_frame_s <= MOVING_FRAME_BUDGET_S
        frame = self._simplifier.frame_s
        if simple is not None and not fast and (frame is None or frame <= FULL_FRAME_BUDGET_S):
            rest = simple  # every streamline, within the tolerance, instead of the whole or a subset
            if frame is not None and frame <= MOVING_FRAME_BUDGET_S:
                moving = simple
        scene.show_cells("actor", rest)
        scene.show_cells("moving", rest if moving.n_points == rest.n_points else moving)
        if hasattr(scene, "set_moving_stride"):
            scene.set_moving_stride(self._moving_stride())

    def simplified_arrived(self) -> None:
        """A simplified level came (:class:`FibreSimplifier`): drawn from the next frame on; at
        rest that frame uploads its indices, and the one after is timed."""
        for entry in self._fibers.values():
            self._place_cells(entry)
        self._update_lod_text()
        if not self._moving and self.plotter.ren_win is not None:
            self.plotter.render()
            self._full_detail()

    def simplified_ready(self) -> bool:
        """Has every simplified level asked for arrived (or failed)?"""
        return self._simplifier.ready()

    def _cap_rest(self, capped: bool) -> None:
        """Draw the moving level at rest too (a full frame was over budget), or not. While it is,
        a new selection's full level is not prepared: no view draws it (the selection's moving
        level holds all of a selection that fits it)."""
        self._rest_capped = capped
        cache = self.document.fiber_arrays
        hardware = getattr(self, "_software_rendering", None) is False  # (the software levels are skipped already)
        if hardware:
            skip = set(cache.skip_selection_levels) - {"full"}
            cache.skip_selection_levels = frozenset(skip | ({"full"} if capped else set()))

    def _moving_stride(self) -> int:
        """Every how many streamlines of the moving level are drawn while the camera moves: 1 until
        a full frame was timed, then what keeps the moving frame within :data:`MOVING_FRAME_BUDGET_S`
        at the GPU's measured rate (a GPU whose graphics draw few lines a second, as the compute
        cards' do, draws fewer while moving rather than turning slowly)."""
        rate = getattr(self, "_points_per_s", None)
        if not rate or self._software():
            return 1
        moving = sum(
            entry["scene"].cells["moving"].n_points
            for entry in self._fibers.values()
            if entry["layer"].visible and "moving" in entry["scene"].cells
        )
        allowed = rate * MOVING_FRAME_BUDGET_S  # points a moving frame may draw
        return max(1, math.ceil(moving / allowed)) if allowed > 0 else 1

    def lod_text(self) -> str:
        """What the level-of-detail line says now ("" when every streamline is drawn)."""
        return self._lod_actor.GetInput() or ""

    def _update_lod_text(self) -> None:
        drawn = total = 0
        filling = False
        for entry in self._fibers.values():
            layer, scene = entry["layer"], entry["scene"]
            if not layer.visible or draws_nothing(layer):
                continue
            moving = self._moving and scene.moving_drawn()
            drawn += scene.drawn_streamlines("moving" if moving else "actor")
            total += entry.get("shown_total", 0)
            filling = filling or scene.filling
        text = ""
        if drawn < total:
            what = f"{count_words(drawn)} of {count_words(total)} streamlines"
            if filling:
                text = f"{what} drawn, more coming"
            elif self._moving:
                text = f"showing {what} while {self._moving_why}"
            elif self._software():
                text = (
                    f"{what} drawn at rest: software OpenGL draws at most {count_words(LEVELS['software'][0])} points"
                )
            else:
                took = self._full_frame_s or 0.0
                text = (
                    f"{what} drawn at rest: a full frame took {took:.1f} s "
                    f"(more than {FULL_FRAME_BUDGET_S:g} s on this OpenGL)"
                )
        self._lod_actor.SetInput(text)

    # ------------------------------------------------------------- layers
    def _sync_fibers(self) -> None:
        present = {id(layer): layer for layer in self.document.layers if layer.kind == "tractogram"}
        for key in list(self._fibers):
            if key not in present:
                entry = self._fibers.pop(key)
                self._simplifier.forget(key)
                self._drop_bar(entry)
                self._remove_scene(entry["scene"])
        for key, layer in present.items():
            if key not in self._fibers:
                self._fibers[key] = entry = self._build_fibers(layer)
                self._frames_at_build = getattr(self, "frames_drawn", 0)
                self._cap_rest(False)  # measured again
                if len(entry["scene"].pieces) > 1:  # a whole-brain tractogram: its first piece first
                    entry["scene"].reveal(1)
                    QTimer.singleShot(0, self._reveal_next)
        self.layout_colour_bars()
        self._update_lod_text()

    def _reveal_next(self) -> None:
        """One more piece of each tractogram being drawn in, drawn now (that frame uploads its
        buffers); the event loop runs between pieces, so the window answers while they come."""
        filling = [entry for entry in self._fibers.values() if entry["scene"].filling]
        if not filling or self.plotter.ren_win is None:
            return
        for entry in filling:
            scene = entry["scene"]
            # a piece revealed and not drawn yet (the first: no frame since the layer came) gets
            # one turn to be drawn alone, so that the first frame shows one piece as soon as it is
            # on the GPU (one turn only: a hidden layer draws nothing and must not stop the rest)
            shown = scene.shown_pieces
            if getattr(scene, "uploaded_pieces", shown) < shown and entry.get("waited_at") != shown:
                entry["waited_at"] = shown
            else:
                scene.reveal(shown + 1)
        self._update_lod_text()
        self.plotter.render()
        if any(entry["scene"].filling for entry in filling):
            QTimer.singleShot(0, self._reveal_next)
        else:  # everything is on the GPU: the next full frame is a drawing time
            self._frames_at_build = getattr(self, "frames_drawn", 0)
            self._update_lod_text()
            self.request_render()

    def _remove_scene(self, scene) -> None:
        for actor in scene.all_actors():
            self.plotter.remove_actor(actor, render=False)
        if isinstance(scene, GLFiberActors):
            scene.release()

    def _new_scene(self, layer: Layer, arrays):
        """The layer's 3-D presence: from the view's own buffers where the cache prepared it so."""
        self._software()  # decides whether the view's own buffers may be used
        if self.document.fiber_arrays.shader_drawn(layer):
            scene = GLFiberActors(arrays, layer.data.dimensions, on_failure=self._gl_layer_failed)
            scene.renderer = self.plotter.renderer
            return scene
        if layer.data.n_points >= GL_LAYER_MIN_POINTS and getattr(self, "gl_layer_refused", None):
            self._say(f"Fibres drawn by VTK (slower at this size): {self.gl_layer_refused}")
        return FiberActors(arrays)

    def _say(self, text: str) -> None:
        notice = getattr(self, "notice", None)
        if notice is not None:
            notice.emit(text)

    def _gl_layer_failed(self, scene, reason: str) -> None:
        """OpenGL could not draw a tractogram from the view's own buffers (called inside a
        frame): from now on VTK draws every tractogram, rebuilt after this frame, and the
        status bar says why."""
        self.gl_layer_refused = reason
        self.document.fiber_arrays.shader_drawn_min_points = None
        QTimer.singleShot(0, lambda: self._rebuild_on_vtk(scene, reason))

    def _rebuild_on_vtk(self, scene, reason: str) -> None:
        for key, entry in list(self._fibers.items()):
            if entry["scene"] is scene:
                self._drop_bar(entry)
                self._remove_scene(scene)
                del self._fibers[key]
        self._say(f"Fibres drawn by VTK (slower at this size): {reason}")
        self._sync_fibers()
        self.request_render()

    def _build_fibers(self, layer: Layer) -> dict:
        arrays = self.document.fiber_arrays.prepare(layer)  # normally done already by the loading job
        scene = self._new_scene(layer, arrays)
        entry = {"layer": layer, "scene": scene, "actor": scene.actor, "colour": None, "bar_title": None}
        self._place_cells(entry)
        name = f"fibers_{id(layer)}"
        for k, actor in enumerate(scene.all_actors()):  # rest and moving actors of each piece
            self.plotter.add_actor(actor, name=f"{name}_{k}", reset_camera=False, render=False, pickable=False)
        self._colour_fibers(entry)
        self._apply_line_style(entry)
        return entry

    def _reuse_fibers(self, old: Layer, new: Layer) -> None:
        """A tractogram replaced by another (a tracking result growing): the new arrays go into
        the old actors, which is much cheaper than new actors and a new colour bar."""
        entry = self._fibers.get(id(old))
        if entry is None or new.kind != "tractogram" or entry["colour"][:2] != (new.color_by, new.colormap):
            return
        arrays = self.document.fiber_arrays.prepare(new)
        if len(arrays.bounds) != len(entry["scene"].pieces) or entry["scene"].filling:
            return  # grown into another number of pieces: new actors (the view's sync builds them)
        if self.document.fiber_arrays.shader_drawn(new) != isinstance(entry["scene"], GLFiberActors):
            return  # grown past the size drawn from the view's own buffers (or back): new actors
        del self._fibers[id(old)]
        self._simplifier.forget(id(old))  # made from the old arrays
        entry["layer"] = new
        entry["scene"].set_arrays(arrays)
        self._place_cells(entry)
        entry["colour"] = None
        self._colour_fibers(entry)
        self._apply_line_style(entry)
        self._fibers[id(new)] = entry

    def _colour_fibers(self, entry: dict) -> None:
        """The layer's colouring: the mappers' colour array and lookup table (points untouched)."""
        layer, scene = entry["layer"], entry["scene"]
        key = (layer.color_by, layer.colormap, layer.clim, layer.color)
        if entry["colour"] == key:
            return
        entry["colour"] = key
        self._drop_bar(entry)
        if layer.color_by == "direction":
            scene.colour("direction")
            return
        if layer.color_by == SOLID:  # a named bundle in its colour
            scene.solid(layer.color)
            return
        values, kind = self.document.fiber_arrays.scalar(layer, layer.color_by)
        lut = lookup_table(layer.colormap, layer.clim)
        scene.colour(layer.color_by, values, kind, lut, layer.clim)
        title = colour_bar_title(layer.name, layer.color_by)
        self.plotter.add_scalar_bar(title=title, mapper=scene.actor.GetMapper(), color="white", render=False)
        entry["bar_title"] = title

    def _drop_bar(self, entry: dict) -> None:
        if entry.get("bar_title") in self.plotter.scalar_bars.keys():
            self.plotter.remove_scalar_bar(title=entry["bar_title"], render=False)
        entry["bar_title"] = None

    def _apply_line_style(self, entry: dict) -> None:
        layer = entry["layer"]
        entry["scene"].style(layer.visible and not draws_nothing(layer), layer.opacity, layer.tubes)
        entry["scene"].show_moving(self._moving)

    def _update_fiber_display(self, layer: Layer) -> None:
        entry = self._fibers.get(id(layer))
        if entry is None:
            return
        if entry["selection"] is not layer.selection:
            self._place_cells(entry)  # index ranges only
        self._colour_fibers(entry)
        self._apply_line_style(entry)
        self.layout_colour_bars()  # hidden or emptied: its bar goes
        self._update_lod_text()

    def layout_colour_bars(self) -> None:
        """One colour bar: the selected tractogram's (:meth:`show_colour_bar_of`), else the topmost
        shown one's; none for hidden or empty layers."""
        bars, shown = self.plotter.scalar_bars, []
        for layer in reversed(self.document.layers):
            entry = self._fibers.get(id(layer))
            if entry is not None and entry.get("bar_title") and layer.visible and not draws_nothing(layer):
                shown.insert(0 if layer is getattr(self, "bar_layer", None) else len(shown), entry["bar_title"])
        show_one_colour_bar(bars, shown)

    def show_colour_bar_of(self, layer) -> None:
        """The selected layer's colour bar (when it has one), drawn at the next frame."""
        self.bar_layer = layer
        self.layout_colour_bars()
        self.request_render()

    # -------------------------------------------------------- interaction
    def _set_moving(self, moving: bool, why: str = "moving") -> None:
        self._moving, self._moving_why = moving, why
        for entry in self._fibers.values():
            entry["scene"].show_moving(moving)
        self._update_lod_text()

    def _coarse_detail(self, *_args) -> None:
        """The camera starts moving (a mouse press on the view)."""
        self._lod_timer.stop()
        self._set_moving(True)

    def editing(self) -> None:
        """An ROI edit whose selection is on its way (the window's fibre selection says so): its
        frame, and those of the edits that follow, draw the moving level, as the camera's do (a
        selection larger than the moving budget thinned, and the view says so), and everything
        again once the edits pause for the camera's rest time. A whole-brain selection's full
        frame (1.2 M of 10 M streamlines) took longer than the rest of the edit."""
        if not self._fibers or (self._moving and self._moving_why == "moving"):
            return  # nothing to thin, or the camera is moving already
        self._lod_timer.stop()
        self._selection_due, self._selection_due_since = True, time.perf_counter()
        self._set_moving(True, EDITING)
        self._lod_timer.start()

    def edit_selected(self) -> None:
        """The selection of the last ROI edit is shown (or failed, or was dropped): everything
        is drawn again once no edit has come for the camera's rest time."""
        self._selection_due = False
        if self._moving and self._moving_why != "moving":
            self._lod_timer.start()

    def _full_detail(self) -> None:
        """The camera stopped: everything the hardware allows, timed; over budget, fewer."""
        if self.plotter.ren_win is None:  # the window closed meanwhile (an ROI edit's pause came after it)
            return
        if self._selection_due and time.perf_counter() - self._selection_due_since < EDIT_SELECTION_WAIT_S:
            self._lod_timer.start()  # an edit's selection is still on its way: the edits go on
            return
        for entry in self._fibers.values():
            if entry.get("rest_due"):  # the last edit's selection at rest
                self._place_cells(entry, editing=False)
        self._set_moving(False)
        uploaded = getattr(self, "frames_drawn", 0) > self._frames_at_build  # the points are on the GPU already
        uploaded = uploaded and not any(entry["scene"].filling for entry in self._fibers.values())
        start = time.perf_counter()
        self.plotter.render()
        self.plotter.ren_win.WaitForCompletion()  # drawn, not only queued: the GPU's time counts
        took = time.perf_counter() - start
        simplified = self._simplifier.cells
        drew_simplified = any(
            simplified.get(k) is not None and e["scene"].cells.get("actor") is simplified[k]
            for k, e in self._fibers.items()
        )
        if uploaded and drew_simplified:
            self._simplifier.frame_s = took  # a frame of the simplified levels (not of the whole)
        full = (
            not drew_simplified
            and self._rest_level() == "full"
            and any(
                entry["layer"].visible and entry["scene"].cells["actor"].streamlines is None
                for entry in self._fibers.values()
            )
        )
        if full and self._fibers:
            if uploaded:  # the first frame after a tractogram came uploads its points: not a drawing time
                self._full_frame_s = took
                drawn = sum(e["scene"].cells["actor"].n_points for e in self._fibers.values() if e["layer"].visible)
                self._points_per_s = drawn / max(took, 1e-6)  # this GPU's drawing rate, frame overheads included
                if took > FULL_FRAME_BUDGET_S:
                    self._cap_rest(True)
                    for entry in self._fibers.values():
                        self._place_cells(entry)
                    self._update_lod_text()
                    self.plotter.render()
        slow = self._full_frame_s is not None and self._full_frame_s > MOVING_FRAME_BUDGET_S
        if slow and not self._software():  # every streamline simplified, made on a worker
            self._simplifier.want(self._fibers, self.compute_device)
        for entry in self._fibers.values():  # the moving level may follow the measured frame time
            self._place_cells(entry)
