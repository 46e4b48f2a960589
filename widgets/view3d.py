"""The 3-D view: the three cursor slice planes and the tractograms, in world millimetres.

One place owns the plotter (MNE's brain viewer pattern): actors are created once per layer and
updated in place. Slice planes (at the finest visible image's resolution, as the slice views) are
coloured by the same compositing as the 2-D views (:func:`widgets.render.composite`); tensor, fODF
and dyads layers are glyphs on those planes, rebuilt when the cursor moves (on worker threads, at
most :data:`widgets.glyphs.MAX_GLYPHS_PER_PLANE` per plane: :mod:`widgets.view3d_glyphs`). Each
tractogram's points go to the GPU once and levels of detail and selections are index ranges over
them (:mod:`widgets.view3d_fibers`), the level drawn stated on screen.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pyvista as pv
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget
from pyvistaqt import QtInteractor
from vtkmodules.vtkRenderingCore import vtkCellPicker, vtkMapper, vtkPolyDataMapper

from tractlens.app.model import GLYPH_KINDS, SCALAR_KINDS, Document, Layer

from .glyph_instances import rgb_actor
from .render import composite, display_oversample, normal_slice, oversampled_voxels, patch_stroke, plane_geometry
from .shape_handles import handle_fits, new_shape_widget, place_shape_widget, remove_shape_widget
from .view3d_fibers import FiberView
from .view3d_glyphs import NO_RENDER, VolumeGlyphs
from .view3d_overlays import add_orientation_marker

# The 3-D camera along an axis (View > 3-D camera): (direction of projection, view up) in RAS+,
# so that the screen shows what the slice view of that name shows (neurological convention).
CAMERA_VIEWS = {
    "axial": ((0.0, 0.0, -1.0), (0.0, 1.0, 0.0)),
    "coronal": ((0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "sagittal": ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
}


#: The 3-D cursor planes' opacity per mode (0: hidden).
PLANE_MODES = {"opaque": 1.0, "translucent": 0.35, "hidden": 0.0}


def plane_surface(width: int, height: int) -> pv.PolyData:
    """The quads a cursor plane is drawn as, over its grid's points in their order (which
    :func:`share_plane` gives it, with the colours). Drawn as a grid, VTK extracted its surface
    again at every ROI stroke that changed the plane's colours (a stroke's 3-D frame took
    13-15 ms longer on the H200 machine than one whose stroke missed the planes); a surface's
    changed colours are only sent again."""
    corner = (np.arange(height - 1)[:, None] * width + np.arange(width - 1)[None, :]).ravel()
    quads = np.stack([np.full_like(corner, 4), corner, corner + 1, corner + width + 1, corner + width], axis=1)
    surface = pv.PolyData()
    surface.faces = quads.ravel()
    return surface


def share_plane(grid: pv.StructuredGrid, surface) -> None:
    """The drawn surface takes the grid's points and colours (the same VTK arrays, not copies)."""
    surface.SetPoints(grid.GetPoints())
    colours = grid.GetPointData().GetArray("rgb")
    surface.GetPointData().AddArray(colours)
    surface.GetPointData().SetActiveScalars("rgb")
    surface.Modified()  # (the mapper sends points and colours again)


class View3D(FiberView, QWidget):
    plane_clicked = Signal(object)  # reference voxel (3,) of a cursor plane clicked with pick_planes on
    notice = Signal(str)  # something the user should read (how the fibres are drawn, and why)

    def __init__(self, document: Document, parent: QWidget | None = None):
        super().__init__(parent)
        self.document = document
        # No periodic redraw (pyvistaqt's default redraws the unchanged scene 5 times a second,
        # twice each time: ~40 % of the GUI thread with software OpenGL); this view asks for a
        # frame whenever the scene changes (request_render), and VTK's widgets draw their own.
        self.plotter = QtInteractor(self, auto_update=False)
        self.plotter.renderer.enable_depth_peeling()  # as pyvistaqt does with its redraw timer on
        self.plotter.set_background("black")
        # Depth offsets for geometry that coincides with other geometry (VTK keeps this for all its
        # mappers): dyads sticks lying in a slice plane are pulled in front of it (see _update_glyphs).
        vtkMapper.SetResolveCoincidentTopologyToPolygonOffset()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plotter.interactor)
        self.orientation_marker = add_orientation_marker(self.plotter)  # R/L, A/P, S/I
        self._planes: dict[str, tuple] = {}
        self._plane_at: dict[str, tuple] = {}  # view -> (slice, oversampling, grid) its plane was composited for
        self.plane_mode = "opaque"  # the cursor planes: one of PLANE_MODES (View > Slice planes in 3-D)
        self.glyphs = VolumeGlyphs(self)  # the glyph layers' actors (widgets.view3d_glyphs)
        self._roi_surfaces: dict[int, object] = {}
        self._layer_surfaces: dict[int, dict] = {}  # surfaces computed for a layer (set_layer_surface)
        self.shape_widget = None  # the 3-D handle on a shape ROI (vtkSphereWidget or vtkBoxWidget)
        self.shape_layer: Layer | None = None  # the ROI it is on
        # While a sphere or box tool is active, a click on a cursor plane emits plane_clicked.
        self.pick_planes = False
        self._press_at = None
        self._roi_timer = QTimer(self)
        self._roi_timer.setSingleShot(True)
        self._roi_timer.setInterval(150)  # a brush stroke rebuilds the surface once it pauses
        self._roi_timer.timeout.connect(self._update_roi_surfaces)
        self._scene_layers: tuple = ()  # ids of the non-tractogram layers, in order
        self._roi_layers: tuple = ()  # ids of the ROI layers, in order
        self._camera_set = False
        self._software_rendering: bool | None = None
        self._render_pending = False
        self._planes_stale = False  # a layer's values changed: the planes are recomposited with the next frame
        self._roi_edits: list = []  # (layer, voxels) of the ROI edits since the last frame (_patch_planes)
        self._frames_held_until = 0.0  # hold_frames: no frame before this perf_counter time
        self._roi_after_hold = False  # the ROI surfaces are rebuilt with the frame after the hold
        self._hold_timer = QTimer(self)
        self._hold_timer.setSingleShot(True)
        self._hold_timer.timeout.connect(lambda: self._render_now())
        self._joining: list = []  # widgets whose repaint waits for the held frame (join_frame)
        self._after_frame: list = []  # called once the next frame is drawn (after_frame)
        self.renders: collections.deque = collections.deque(maxlen=64)  # (start, end) perf_counter times
        self.frames_drawn = 0
        # Wait for the GPU at each frame's end, so that a frame's recorded end is when it is drawn
        # (measurements; a frame's render call returns once the GL calls are queued, not done).
        self.finish_frames = False
        self._frame_start = 0.0
        self.plotter.ren_win.AddObserver("StartEvent", self._frame_started)
        self.plotter.ren_win.AddObserver("EndEvent", self._frame_ended)
        self._lod_timer = QTimer(self)
        self._lod_timer.setSingleShot(True)
        self._lod_timer.setInterval(250)
        self._lod_timer.timeout.connect(self._full_detail)
        self._init_fibers()
        self.plotter.iren.add_observer("StartInteractionEvent", self._coarse_detail)
        self.plotter.iren.add_observer("EndInteractionEvent", lambda *a: self._lod_timer.start())
        self.plotter.iren.add_observer("LeftButtonPressEvent", self._left_pressed)
        self.plotter.iren.add_observer("LeftButtonReleaseEvent", self._left_released)
        document.connect(self._on_document)

    # ----------------------------------------------------------------- model
    def _on_document(self, _source, event, **info) -> None:
        if event == "layers":
            if "replaced" in info:
                self._reuse_fibers(*info["replaced"])
            self._sync_fibers()
            self._drop_layer_surfaces()
            # A tracking result replaced while it streams in changes no plane, glyph or ROI.
            scene = self.document.image_layers_key()
            if scene != self._scene_layers:
                self._scene_layers = scene
                self._update_planes()
                self._update_glyphs()
                rois = self._roi_layers_key()
                if rois != self._roi_layers:  # a result layer replaced leaves the ROI surfaces as they are
                    self._roi_layers = rois
                    self._roi_timer.start()
        elif event == "cursor":
            self._update_planes(moved_only=True)
            self._update_glyphs()
        elif event == "roi":  # a stroke: the planes' pixels it changed are composited with the next frame
            self._roi_edits.append((info.get("layer"), info.get("voxels")))
            self._roi_timer.start()
        elif event == "display":
            layer = info.get("layer")
            if layer is not None and layer.kind == "tractogram":
                self._update_fiber_display(layer)
            elif layer is not None and layer.kind in GLYPH_KINDS:
                self._update_glyphs()
            elif layer is not None and layer.kind == "roi":
                self._update_planes()  # visibility, opacity or role colour
                self._roi_timer.start()
            else:
                if "data" in info.get("changed", ()):  # values streaming in (a running result):
                    self._planes_stale = True  # recomposited once, when the next frame is drawn
                else:
                    self._update_planes()
                if layer is not None and id(layer) in self._layer_surfaces:
                    self._style_layer_surface(self._layer_surfaces[id(layer)])
        self.request_render()

    def request_render(self) -> None:
        """Coalesce renders: many model events in one event-loop turn render once."""
        if not self._render_pending:
            self._render_pending = True
            QTimer.singleShot(0, self._render_now)

    def hold_frames(self, seconds: float) -> None:
        """Draw no frame for up to ``seconds`` (what is asked meanwhile is drawn then, in one
        frame), or until :meth:`release_frames`: a live re-track whose map is on its way holds
        the frame of the stroke that started it, and its map's frame shows both (the GUI thread
        is free for the map sooner). The slice views are not held."""
        self._frames_held_until = max(self._frames_held_until, time.perf_counter() + seconds)

    def release_frames(self) -> None:
        """End :meth:`hold_frames`: a frame asked for meanwhile is asked of the window now (it
        and the widgets that joined it are painted in its next update)."""
        self._frames_held_until = 0.0
        if self._render_pending and self._hold_timer.isActive():
            self._hold_timer.stop()
            self._render_now()

    def join_frame(self, widget) -> bool:
        """Repaint ``widget`` with the frame now held (one window update: Qt composes and
        flushes the window once for both, not once each), if a frame is held; False when none
        is (repaint it now). A slice view's glyphs that arrive while a slice step's 3-D frame
        waits for its own come with that frame, at most the hold's time later."""
        if not (self._render_pending and time.perf_counter() < self._frames_held_until):
            return False
        if widget not in self._joining:
            self._joining.append(widget)
        return True

    def _render_now(self) -> None:
        """Draw one frame: the widget's repaint renders the scene (``plotter.render()`` would
        render it twice, once more in the repaint that shows it). :attr:`renders` records
        every frame's (start, end)."""
        if not self._render_pending:
            return  # drawn already (a frame held, then released)
        wait = self._frames_held_until - time.perf_counter()
        if wait > 0:
            self._hold_timer.start(int(wait * 1000) + 1)
            if self._roi_edits and not self._planes_stale:
                self._patch_planes()  # the stroke on the planes now, while the frame waits for its selection
            return
        joining, self._joining = self._joining, []
        for widget in joining:  # repainted in the same window update as this frame
            try:
                widget.update()
            except RuntimeError:  # gone meanwhile (its window closed)
                pass
        if self._roi_after_hold:  # (before the flag below: its own request is this frame)
            self._update_roi_surfaces()
        self._render_pending = False
        if self.plotter.ren_win is None:  # closed meanwhile
            return
        if self._planes_stale:
            self._update_planes()
        elif self._roi_edits:
            self._patch_planes()
        planes_shown = any(actor.GetVisibility() for _grid, actor in self._planes.values())
        if not self._camera_set and (planes_shown or self._fibers or self.glyphs.any()):  # something to frame
            self.reset_camera()
        if self._software() and self.plotter.ren_win.GetMultiSamples():
            # Software OpenGL draws every sample on the CPU: 4x multisampling makes each frame
            # cost 2.5 times as much (75 instead of 30 ms with glyphs on a 400 px view).
            self.plotter.ren_win.SetMultiSamples(0)
        self.plotter.interactor.update()

    def _frame_started(self, *_args) -> None:
        self._frame_start = time.perf_counter()

    def _frame_ended(self, *_args) -> None:
        if self.finish_frames:
            self.plotter.ren_win.WaitForCompletion()
        self.renders.append((self._frame_start, time.perf_counter()))
        self.frames_drawn += 1
        if self._after_frame:  # after this paint has returned to the event loop
            callbacks, self._after_frame = self._after_frame, []
            QTimer.singleShot(0, self, lambda: [callback() for callback in callbacks])

    def after_frame(self, callback) -> None:
        """Call ``callback()`` once the next frame is drawn (work that should not delay it), or at
        the next event-loop turn when no frame is due (none asked for, no glyphs awaited, or the
        view not shown: it draws none)."""
        frame_due = self._render_pending or not self.glyphs.ready()
        if not frame_due or not self.isVisible():
            QTimer.singleShot(0, self, callback)
        elif callback not in self._after_frame:
            self._after_frame.append(callback)

    def reset_camera(self) -> None:
        self._camera_set = True
        self.plotter.renderer.view_isometric(render=False)
        self.plotter.renderer.reset_camera(render=False)

    def view_from(self, view: str, radiological: bool = False) -> None:
        """Look along a world axis as the slice view of that name shows it: ``axial`` from above
        with anterior up, ``coronal`` from behind with superior up, ``sagittal`` from the
        patient's left with superior up (so the patient's left is on the screen's left, as in
        the neurological slice views; ``radiological`` looks at axial from below and coronal
        from the front instead); ``isometric`` is the starting view. Everything shown fits."""
        if view == "isometric":
            self.reset_camera()
        else:
            direction, up = CAMERA_VIEWS[view]
            if radiological and view != "sagittal":
                direction = tuple(-v for v in direction)
            camera = self.plotter.renderer.GetActiveCamera()
            focal = np.asarray(camera.GetFocalPoint())
            camera.SetPosition(*(focal - np.asarray(direction, dtype=float)))
            camera.SetViewUp(*up)
            self.plotter.renderer.reset_camera(render=False)
            self._camera_set = True
        self.request_render()

    # ---------------------------------------------------------------- planes
    def _patch_planes(self) -> None:
        """The ROI edits since the last frame on the planes: each plane's pixels an edit changed
        are composited again (:func:`widgets.render.patch_stroke`), in place in its colours; an
        edit that cannot say where it changed composites every plane again."""
        edits, self._roi_edits = self._roi_edits, []
        factor = display_oversample(self.document)
        if self.document.reference_affine is None or len(self._planes) < 3:
            return self._update_planes()
        for view, (grid, _actor) in self._planes.items():
            geometry = plane_geometry(self.document, view)
            height, width = (n * factor for n in geometry.voxels.shape[:2])
            colours = grid.GetPointData().GetArray("rgb")
            if tuple(grid.dimensions) != (width, height, 1) or colours is None:
                return self._update_planes()
            image = np.asarray(grid.point_data["rgb"]).reshape(height, width, 3)  # VTK's own memory
            patched = [patch_stroke(self.document, geometry, image, layer, voxels) for layer, voxels in edits]
            if None in patched:
                return self._update_planes()
            if any(patched):
                colours.Modified()  # the mapper sends the plane's colours again

    def _update_planes(self, moved_only: bool = False) -> None:
        """The three cursor planes composited again; ``moved_only`` (the cursor moved): only those
        whose slice moved, when nothing else is pending (a cursor step along one axis made all
        three again: half of a slice step's time on the GUI thread)."""
        doc = self.document
        moved_only = moved_only and not self._planes_stale and not self._roi_edits
        self._planes_stale = False
        self._roi_edits = []
        if doc.reference_affine is None:
            return
        # With no image shown the planes would be opaque black sheets hiding the fibres and ROI
        # surfaces behind them (ROIs have their own surfaces in 3-D): hide them then.
        any_volume = any(layer.visible and layer.kind in (*SCALAR_KINDS, "rgb", "labels") for layer in doc.layers)
        # an image finer than the reference grid (a 1 mm T1 over 2 mm DWI) shows at its own resolution
        factor = display_oversample(doc)
        for view in ("axial", "coronal", "sagittal"):
            at = (normal_slice(doc, view), factor, doc.reference_affine.tobytes(), tuple(doc.reference_shape))
            if moved_only and view in self._planes and self._plane_at.get(view) == at:
                continue
            self._plane_at[view] = at
            geometry = plane_geometry(doc, view)
            voxels = oversampled_voxels(geometry, factor)
            height, width = voxels.shape[:2]
            rgb = composite(doc, geometry, factor)
            points = voxels.reshape(-1, 3).astype(np.float64)
            points = points @ doc.reference_affine[:3, :3].T + doc.reference_affine[:3, 3]
            if view in self._planes and tuple(self._planes[view][0].dimensions) != (width, height, 1):
                self.plotter.remove_actor(self._planes.pop(view)[1], render=False)  # another resolution
            if view not in self._planes:
                grid = pv.StructuredGrid()
                grid.points = points
                grid.dimensions = (width, height, 1)
                grid.point_data["rgb"] = rgb.reshape(-1, 3)
                mapper = vtkPolyDataMapper()  # (not add_mesh: its mapper would draw a copy of the surface)
                mapper.SetInputData(plane_surface(width, height))  # its points and colours: below
                actor = rgb_actor(mapper)
                self.plotter.add_actor(actor, name=f"plane_{view}", **NO_RENDER)
                self._planes[view] = (grid, actor)
            grid, actor = self._planes[view]
            grid.points = points
            grid.point_data["rgb"] = rgb.reshape(-1, 3)
            share_plane(grid, actor.GetMapper().GetInput())
            actor.SetVisibility(any_volume and PLANE_MODES[self.plane_mode] > 0)
            actor.GetProperty().SetOpacity(PLANE_MODES[self.plane_mode] or 1.0)

    def set_plane_mode(self, mode: str) -> None:
        """The cursor planes drawn opaque, translucent (bundles and ROI surfaces show through) or
        not at all; the slice views are unchanged."""
        if mode not in PLANE_MODES:
            raise ValueError(f"plane mode {mode!r} is not one of {', '.join(PLANE_MODES)}")
        self.plane_mode = mode
        self._update_planes()
        self.request_render()

    # ------------------------------------------------------------ ROI surfaces
    def _roi_layers_key(self) -> tuple:
        return tuple(id(layer) for layer in self.document.layers if layer.kind == "roi")

    def _update_roi_surfaces(self) -> None:
        """Each visible ROI as a translucent surface (marching cubes at 0.5) in its colour. While
        frames are held (a live map on its way) this waits for the next frame: the map first."""
        self._roi_after_hold = time.perf_counter() < self._frames_held_until
        if self._roi_after_hold:
            self.request_render()
            return
        for actor in self._roi_surfaces.values():
            self.plotter.remove_actor(actor, render=False)  # one frame at the end, not one per ROI
        self._roi_surfaces.clear()
        for layer in self.document.layers:
            # Marching cubes over the mask's bounding box only: an ROI is small beside the grid
            # (a whole HCP grid took a brush stroke ~100 ms of the GUI thread). No box: empty.
            box = layer.data.box() if layer.kind == "roi" and layer.visible else None
            if box is None:
                continue
            padded = np.pad(layer.data.mask[box], 1).astype(np.float32)  # closed surfaces at the box's edge
            grid = pv.ImageData(dimensions=padded.shape, origin=tuple(float(s.start - 1) for s in box))
            grid.point_data["mask"] = padded.ravel(order="F")
            surface = grid.contour([0.5], scalars="mask")
            if surface.n_points == 0:
                continue
            surface.transform(layer.data.affine, inplace=True)
            actor = self.plotter.add_mesh(
                surface,
                color=layer.color_rgb(),
                opacity=0.45 * layer.opacity / 0.6,
                name=f"roi_{id(layer)}",
                smooth_shading=True,
                **NO_RENDER,
            )
            self._roi_surfaces[id(layer)] = actor
        self.request_render()

    # ---------------------------------------------------------- layer surfaces
    def set_layer_surface(self, layer: Layer, mesh, *, color, opacity: float = 0.5) -> None:
        """Show a surface that belongs to a layer, computed elsewhere (e.g. the isosurface of a
        tracking result): ``mesh`` a :class:`pyvista.PolyData` in world millimetres (or
        None, or empty: no surface). It replaces the layer's previous surface in the same actor,
        is shown and hidden with the layer (``opacity`` × the layer's), and goes when the layer
        leaves the document."""
        entry = self._layer_surfaces.get(id(layer))
        if mesh is None or mesh.n_points == 0:
            if entry is not None:
                self.plotter.remove_actor(self._layer_surfaces.pop(id(layer))["actor"], render=False)
                self.request_render()
            return
        if entry is None:
            actor = self.plotter.add_mesh(
                mesh, color=color, name=f"surface_{id(layer)}", show_scalar_bar=False, **NO_RENDER
            )
            entry = self._layer_surfaces[id(layer)] = {"layer": layer, "actor": actor}
        else:
            entry["actor"].GetMapper().SetInputData(mesh)
            entry["actor"].GetProperty().SetColor(*color)
        entry["mesh"], entry["opacity"] = mesh, float(opacity)
        self._style_layer_surface(entry)
        self.request_render()

    def layer_surface(self, layer: Layer):
        """(actor, mesh) of a layer's surface, or None (for tests and scripts)."""
        entry = self._layer_surfaces.get(id(layer))
        return None if entry is None else (entry["actor"], entry["mesh"])

    def _style_layer_surface(self, entry: dict) -> None:
        layer = entry["layer"]
        entry["actor"].SetVisibility(bool(layer.visible))
        entry["actor"].GetProperty().SetOpacity(entry["opacity"] * layer.opacity)

    def _drop_layer_surfaces(self) -> None:
        present = {id(layer) for layer in self.document.layers}
        for key in [key for key in self._layer_surfaces if key not in present]:
            self.plotter.remove_actor(self._layer_surfaces.pop(key)["actor"], render=False)

    def show_shape_widget(self, layer: Layer | None, on_change) -> None:
        """A handle on a shape ROI in 3-D (see :func:`widgets.shape_handles.new_shape_widget`):
        ``on_change(shape)`` gets the shape when an interaction ends. None: no handle."""
        self._clear_shape_widget()
        if layer is None or layer.data.shape is None:
            return
        self.shape_widget = new_shape_widget(self.plotter, layer, on_change)
        self.shape_layer = layer
        self.request_render()

    def handle_fits(self, layer: Layer) -> bool:
        """Is the handle shown the kind for ``layer``'s shape (a box handle on a box)?"""
        return handle_fits(self.shape_widget, layer)

    def follow_shape(self, layer: Layer) -> None:
        """Put the handle where its shape ROI is now (moved or resized on a slice, or undone)."""
        if self.shape_widget is None or layer is not self.shape_layer or layer.data.shape is None:
            return
        place_shape_widget(self.shape_widget, layer)
        self.request_render()

    def _clear_shape_widget(self) -> None:
        remove_shape_widget(self.plotter, self.shape_widget)
        self.shape_widget = self.shape_layer = None

    # -------------------------------------------------------- placing shapes
    def _left_pressed(self, *_args) -> None:
        self._press_at = self.plotter.iren.interactor.GetEventPosition() if self.pick_planes else None

    def _left_released(self, *_args) -> None:
        """A click (press and release within a few pixels) on a cursor plane while ``pick_planes``
        is on: :attr:`plane_clicked` with the reference voxel under it. A drag turns the camera."""
        start, self._press_at = self._press_at, None
        if start is None or not self.pick_planes:
            return
        x, y = self.plotter.iren.interactor.GetEventPosition()
        if abs(x - start[0]) > 3 or abs(y - start[1]) > 3:
            return
        ijk = self.plane_voxel_at(x, y)
        if ijk is not None:
            self.plane_clicked.emit(ijk)

    def plane_voxel_at(self, x: int, y: int) -> np.ndarray | None:
        """The reference voxel of the (visible) cursor plane under display pixel (x, y), VTK's
        convention (origin bottom left), or None where no plane is."""
        doc = self.document
        picker = vtkCellPicker()
        picker.SetTolerance(1e-4)
        picker.PickFromListOn()
        for _grid, actor in self._planes.values():
            if actor.GetVisibility():
                picker.AddPickList(actor)
        if doc.reference_affine is None or not picker.Pick(x, y, 0, self.plotter.renderer):
            return None
        world = np.asarray(picker.GetPickPosition(), dtype=float)
        ijk = np.rint(np.linalg.solve(doc.reference_affine, np.append(world, 1.0))[:3]).astype(int)
        if np.any(ijk < 0) or np.any(ijk >= np.array(doc.reference_shape)):
            return None
        return ijk

    def roi_surface(self, layer: Layer):
        """The surface actor of an ROI layer, or None (for tests and scripts)."""
        return self._roi_surfaces.get(id(layer))

    # ---------------------------------------------------------------- glyphs
    def _update_glyphs(self) -> None:
        self.glyphs.update()

    def glyphs_ready(self) -> bool:
        """Do the 3-D glyphs show the document as it is now (no build pending)?"""
        return self.glyphs.ready()

    def screenshot(self) -> np.ndarray:
        """The rendered 3-D view as (H, W, 3) uint8 (with the first camera placement, when the
        frame that would make it is still pending, and the ROI surfaces of the ROIs as they are
        now, when a stroke's rebuild still waits for the stroke to pause)."""
        if self._roi_timer.isActive():
            self._roi_timer.stop()
            self._frames_held_until = 0.0
            self._update_roi_surfaces()
        if self._render_pending:
            self._frames_held_until = 0.0  # what is asked for is drawn, held or not
            self._render_now()
        self.plotter.render()
        return self.plotter.screenshot(return_img=True)

    def close_plotter(self) -> None:
        self.plotter.close()
        # The interactor keeps Python wrappers of its GL context and surface (Qt's objects). Once
        # Qt deletes them with the widget, Shiboken still maps their addresses to those wrappers
        # while they live: a later QAction at the same address came back as a QSurface in a CI
        # run. Dropped now, while their objects exist (pyvistaqt's own reset for a lost context).
        forget = getattr(self.plotter, "_forget_context", None)
        if forget is not None:
            forget()
