"""The 3-D view's glyph layers on the three cursor planes (issue 41: whole-slice glyphs within
100 ms a slice step): dyads sticks (lines, cheap: built on the GUI thread), tensor glyphs
(instances of source meshes) and fODF glyphs (SH surfaces, one actor per cursor plane), the
latter two built on worker threads (:class:`widgets.glyphs.LatestTask`: until the new glyphs
arrive the actors show the previous ones).

A layer's actors are its *parts*: ``"all"`` for sticks and tensor glyphs, the plane's normal
(0, 1, 2) for fODF glyphs (:class:`widgets.fod_glyphs.PlaneMeshes`). Each part remembers the
key of what it shows, so a slice step that moves one plane hands VTK that plane's mesh alone.
The 3-D frame of a step waits up to :data:`GLYPH_FRAME_HOLD_S` for its glyphs.
"""

from __future__ import annotations

import time

import numpy as np
from vtkmodules.vtkRenderingCore import vtkGlyph3DMapper

from tractlens.app.model import GLYPH_KINDS, Layer

from .fod_glyphs import PlaneMeshes, fod_mesh, volume_glyph_job
from .glyph_instances import glyph_actor, is_instances, show_instances
from .glyph_prefetch import MISSING, GlyphPrefetch, neighbours
from .glyphs import LatestTask, stick_mesh, stick_segments
from .render import plane_geometry

NO_RENDER = {"render": False, "reset_camera": False}
GLYPH_FRAME_HOLD_S = 0.1  # a 3-D frame waits this long at most for the glyphs of a slice step


class VolumeGlyphs:
    """The glyph actors of a :class:`widgets.view3d.View3D` (``view``: its plotter, document,
    frame holds and renders)."""

    def __init__(self, view):
        self.view = view
        self._actors: dict[int, dict] = {}  # layer id -> {part: actor}
        self._shown: dict[tuple, object] = {}  # (layer id, part) -> key of what the part's actor shows
        self.tasks: dict[int, LatestTask] = {}  # tensor and fODF layers -> their glyph builds (workers)
        self._hold_until = 0.0  # a hold of the view's frames for glyphs being built (released when they come)
        self.ahead = GlyphPrefetch()  # the neighbouring cursor positions' builds (widgets.glyph_prefetch)

    # ------------------------------------------------------------------ queries
    def any(self) -> bool:
        return any(self._actors.values())

    def actors(self, layer: Layer) -> list:
        """The layer's glyph actors (one; fODF glyphs: one per cursor plane that has glyphs)."""
        return list(self._actors.get(id(layer), {}).values())

    def ready(self) -> bool:
        """Do the glyphs show the document as it is now (no build pending)?"""
        return all(task.ready() for task in self.tasks.values())

    # ------------------------------------------------------------------ updates
    def update(self) -> None:
        """One actor (or one per plane) per visible glyph layer, for the cursor planes now."""
        doc = self.view.document
        layers = [layer for layer in doc.layers if layer.kind in GLYPH_KINDS]
        present = {id(layer) for layer in layers}
        for key in [k for k in self._actors if k not in present]:
            self._drop(key)
        for key in [k for k in self.tasks if k not in present]:
            self.tasks.pop(key).forget()
            self.ahead.stop()
        for layer in layers:
            shown = layer.visible and doc.reference_affine is not None
            if layer.kind in ("tensor", "fod"):
                if shown:
                    self._request(layer)
                else:
                    if task := self.tasks.get(id(layer)):
                        task.forget()
                    self._drop(id(layer))
                continue
            self._drop(id(layer))  # sticks: built again (the coalesced render follows)
            mesh = self.sticks_for(layer) if shown else None
            if mesh is None:
                continue
            actor = self.view.plotter.add_mesh(
                mesh,
                scalars="rgb",
                rgb=True,
                name=f"glyphs_{id(layer)}",
                show_scalar_bar=False,
                line_width=3,
                **NO_RENDER,
            )
            actor.GetProperty().SetOpacity(layer.opacity)
            # In front of the plane they lie in, at their full width.
            actor.GetMapper().SetRelativeCoincidentTopologyLineOffsetParameters(-1, -50)
            self._actors[id(layer)] = {"all": actor}

    def _request(self, layer: Layer) -> None:
        view = self.view
        task = self.tasks.get(id(layer))
        if task is None:
            task = LatestTask(lambda _key, built, layer=layer: self._show(layer, built), view)
            self.tasks[id(layer)] = task
        build, key = volume_glyph_job(layer, view.document, view._software())
        made = self.ahead.take(key, layer.data.data) if key != task.wanted else MISSING
        if made is not MISSING:  # built ahead: shown now, in this step's frame (no worker to wait for)
            task.settle(key, made)
        else:
            task.request(key, build)
        if not task.ready() and time.perf_counter() >= view._frames_held_until:  # one frame with the new glyphs
            view.hold_frames(GLYPH_FRAME_HOLD_S)  # (bounded: a fast scroll still draws every 0.1 s)
            self._hold_until = view._frames_held_until
        for actor in self.actors(layer):
            actor.GetProperty().SetOpacity(layer.opacity)

    def _drop(self, layer_id: int, parts=None) -> None:
        """Remove a layer's actors (``parts``: those only)."""
        actors = self._actors.get(layer_id, {})
        for part in list(actors) if parts is None else parts:
            if part in actors:
                self.view.plotter.remove_actor(actors.pop(part), render=False)
            self._shown.pop((layer_id, part), None)
        if not actors:
            self._actors.pop(layer_id, None)

    def _show(self, layer: Layer, built) -> None:
        """Glyphs built on a worker arrive: into the layer's actors (made the first time; a
        part whose key is what it shows is left as it is)."""
        view = self.view
        if layer in view.document.layers and layer.visible:
            planes = isinstance(built, PlaneMeshes)
            parts = dict(enumerate(built)) if planes else {"all": (None, built)}
            self._drop(id(layer), [part for part in self._actors.get(id(layer), {}) if part not in parts])
            for part, (key, mesh) in parts.items():
                if key is None or self._shown.get((id(layer), part)) != key:
                    if planes and mesh is not None:
                        mesh = fod_mesh(*mesh)  # a plane's surface arrays: the mesh made here
                    self._show_part(layer, part, mesh)
                    self._shown[(id(layer), part)] = key
        if self._hold_until >= view._frames_held_until > 0 and self.ready():  # the hold was theirs
            self._hold_until = 0.0
            view.release_frames()
        view.request_render()
        view.after_frame(self._build_ahead)

    def _build_ahead(self) -> None:
        """Once a step's frame is drawn: the glyphs of the cursor's neighbouring positions, built
        on a worker of their own (:mod:`widgets.glyph_prefetch`), for each shown tensor or fODF layer."""
        view, doc = self.view, self.view.document
        if doc.reference_affine is None:
            return
        jobs = []
        for layer in doc.layers:
            if layer.kind in ("tensor", "fod") and layer.visible and id(layer) in self.tasks:
                for cursor in neighbours(doc.cursor, doc.reference_shape):
                    jobs.append((*volume_glyph_job(layer, doc, view._software(), cursor), layer.data.data))
        self.ahead.ahead(jobs)

    def _show_part(self, layer: Layer, part, mesh) -> None:
        actors = self._actors.setdefault(id(layer), {})
        actor = actors.get(part)
        if actor is not None and (
            mesh is None or is_instances(mesh) != isinstance(actor.GetMapper(), vtkGlyph3DMapper)
        ):
            self._drop(id(layer), [part])  # gone, or another kind
            actors, actor = self._actors.setdefault(id(layer), {}), None
        name = f"glyphs_{id(layer)}_{part}"
        if mesh is None:
            pass
        elif is_instances(mesh):  # tensor glyphs: per-glyph arrays drawn as instances of source meshes
            if actor is None:
                actor = glyph_actor(mesh)
                self.view.plotter.add_actor(actor, name=name, **NO_RENDER)
            else:
                show_instances(actor, mesh)
        elif actor is None:
            actor = self.view.plotter.add_mesh(
                mesh, scalars="rgb", rgb=True, name=name, show_scalar_bar=False, **NO_RENDER
            )
            actor.GetProperty().SetInterpolationToPhong()  # with the mesh's exact normals
        else:
            actor.GetMapper().SetInputData(mesh)
        if actor is not None:
            actor.GetProperty().SetOpacity(layer.opacity)
            actors[part] = actor
        if not actors:
            self._actors.pop(id(layer), None)

    # ------------------------------------------------------------------ sticks
    def _plane_voxels(self, step: int) -> np.ndarray:
        """Every ``step``-th reference voxel of the three cursor planes, each once (M, 3)."""
        doc = self.view.document
        on_planes = np.zeros(doc.reference_shape, dtype=bool)
        for name in ("axial", "coronal", "sagittal"):
            plane = plane_geometry(doc, name).voxels[::step, ::step]
            on_planes[plane[..., 0], plane[..., 1], plane[..., 2]] = True
        return np.argwhere(on_planes)

    def sticks_for(self, layer: Layer):
        """The line mesh of a dyads layer's sticks on the three cursor planes (None if empty)."""
        doc = self.view.document
        ends, stick = stick_segments(layer, doc, self._plane_voxels(max(1, int(layer.glyph_step))))
        if len(stick) == 0:
            return None
        return stick_mesh(ends @ doc.reference_affine[:3, :3].T + doc.reference_affine[:3, 3], stick)
