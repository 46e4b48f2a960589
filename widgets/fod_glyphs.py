"""fODF glyphs on the slice planes: spherical-harmonic surfaces in 3-D, their in-plane sections
on the slices, built off the GUI thread with the tensor glyphs' machinery.

The geometry (SH evaluated on a sphere mesh, radii, colours by direction) is
:mod:`app.fod_display`'s; here it becomes VTK meshes, and pictures of the sections drawn on the
worker (:mod:`widgets.section_raster`). The counts are bounded as
the tensor glyphs' are (:mod:`widgets.glyphs`): in 3-D the same cells per cursor plane
(:func:`widgets.glyphs.glyph_step_3d`) with a sphere as fine as the triangle budget allows
(:func:`app.fod_display.sphere_level`); in 2-D every n-th voxel with cells at least
:data:`MIN_FOD_CELL_PX` pixels apart (lobes smaller than that cannot be read) and at most
:data:`widgets.glyphs.MAX_GLYPHS_2D` per view. Builds run on the glyph workers
(:class:`widgets.glyphs.LatestTask`: the newest request wins, stale ones are dropped, so
stepping through slices never waits).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pyvista as pv

from tractlens.app.fod_display import (
    direction_colours,
    fitted,
    fod_amplitudes,
    fod_sections,
    glyph_radii,
    icosphere,
    sphere_level,
    surface_normals,
)
from tractlens.app.model import Document, Layer

from .glyph_planes import PlaneCache, picked, picked_count, plane_base, plane_choices, sample_volume
from .glyphs import (
    GLYPH_TRIANGLES,
    GLYPH_TRIANGLES_SOFTWARE,
    ellipse_job,
    glyph_step_2d,
    glyph_step_3d,
    plane_cells,
    plane_key,
    tensor_glyph_job,
)
from .section_raster import GlyphPicture, Lattice, section_pixels

MIN_FOD_CELL_PX = 14  # 2-D: fODF sections on voxels at least this many screen pixels apart
SECTION_VERTICES = 32  # 2-D: points around one section


def _voxel_mm(reference: np.ndarray) -> float:
    return float(np.sqrt((reference[:3, :3] ** 2).sum(0)).min())


def fod_mesh(points: np.ndarray, triangles: np.ndarray, rgb: np.ndarray, normals: np.ndarray) -> pv.PolyData:
    """One shaded PolyData of glyph surfaces (``rgb`` and ``normals`` per point: the latter from
    :func:`app.fod_display.surface_normals`, a fifth of VTK's normals filter's time; the
    triangles handed to VTK as they are)."""
    mesh = pv.PolyData.from_regular_faces(np.asarray(points, dtype=np.float32), triangles)
    mesh.point_data["rgb"] = rgb
    mesh.point_data["Normals"] = normals
    mesh.point_data.active_normals_name = "Normals"
    mesh.point_data.active_scalars_name = "rgb"
    return mesh


def _plane_surfaces(values: np.ndarray, look: tuple) -> dict:
    """One cursor plane's fODF glyphs on the sphere of ``look`` = (level, scaling): ``radii``
    (G, V) (min-max per voxel; for ``"global"`` the amplitudes, divided by the largest of the
    three planes' when joined) and ``normals`` (G, V, 3) (the same at any scale)."""
    level, scaling = look
    directions, _faces = icosphere(level)
    amplitudes = fod_amplitudes(values, directions)
    radii = glyph_radii(amplitudes, "voxel") if scaling == "voxel" else np.maximum(amplitudes, 0.0)
    normals = surface_normals(values, amplitudes, radii, level).reshape(len(values), len(directions), 3)
    return {"radii": radii.astype(np.float32), "normals": normals}


FOD_PLANES = ("fod", fitted, _plane_surfaces)  # widgets.glyph_planes' kind of plane


def plane_surfaces(plane: dict, rows, level: int, size_mm: float, top: float | None) -> tuple:
    """(points, triangles, rgb, normals) of one cursor plane's fODF glyphs (:func:`_plane_surfaces`
    on :func:`widgets.glyph_planes.plane_choices`' ``plane``; ``rows``: those drawn, None: all)
    as :func:`app.fod_display.fod_surfaces` makes them: float32 points, the radii divided by
    ``top`` (``"global"`` scaling: the largest of the three planes'; None: ``"voxel"``). The
    triangles (int32) and colours are views of arrays kept per sphere, the same for every glyph."""
    sphere, faces = icosphere(level)
    directions = sphere.astype(np.float32)
    radii, centres, normals = (picked(plane, rows, name) for name in ("radii", "centres", "normals"))
    if top is not None:
        radii = radii / np.float32(top) if top > 0 else np.zeros_like(radii)
    count = len(radii)
    reach = radii * np.float32(size_mm)
    points = np.empty((count, len(directions), 3), dtype=np.float32)
    for k in range(3):  # component by component: (G, V) arrays
        points[:, :, k] = reach * directions[:, k]
        points[:, :, k] += centres[:, k, None].astype(np.float32)
    triangles, rgb = _sphere_tiles(level, -(-count // TILE_GLYPHS) * TILE_GLYPHS)
    return (
        points.reshape(-1, 3),
        triangles[: count * len(faces)],
        rgb[: count * len(directions)],
        normals.reshape(-1, 3),
    )


TILE_GLYPHS = 1024  # the shared triangle and colour arrays are made for multiples of this many glyphs


@functools.lru_cache(maxsize=4)
def _sphere_tiles(level: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The triangles (int32, ``count`` spheres' vertices numbered one sphere after the other) and
    vertex colours of ``count`` glyphs on the sphere of ``level`` (read-only: meshes share them)."""
    directions, faces = icosphere(level)
    offsets = np.arange(count, dtype=np.int32)[:, None, None] * np.int32(len(directions))
    triangles = (faces.astype(np.int32)[None, :, :] + offsets).reshape(-1, 3)
    rgb = np.tile(direction_colours(directions), (count, 1))
    triangles.flags.writeable = rgb.flags.writeable = False
    return triangles, rgb


def _plane_surfaces_cached(data, plane: dict, rows, left: tuple, level: int, size_mm: float, top) -> tuple:
    """(key, surfaces) of one plane's glyphs (:func:`plane_surfaces`' arrays, from the cache when it
    holds them); (None, None) when the plane has none."""
    if not picked_count(plane, rows):
        return None, None
    key = (plane["key"], left, top, size_mm)
    return key, _surfaces.get(key, data, lambda: plane_surfaces(plane, rows, level, size_mm, top))


class PlaneMeshes(tuple):
    """A 3-D fODF glyph build: (key, surfaces or None) for each cursor plane (normal 0, 1, 2),
    one actor each; ``surfaces``: :func:`plane_surfaces`' arrays, made a mesh (:func:`fod_mesh`)
    on the GUI thread, where VTK objects are made and freed. The key names what a plane's
    glyphs show: a step that moves one plane leaves the other two keys as they were, so the view
    makes and uploads the moved plane's mesh alone."""


CACHED_SURFACES = 6  # the planes' surface arrays kept (a layer's three and the last step's)
_surfaces = PlaneCache(CACHED_SURFACES)


def fod_glyph_job(layer: Layer, doc: Document, software: bool = False, cursor=None):
    """A function that builds an fODF layer's 3-D glyphs, a :class:`PlaneMeshes` (or None), from
    a snapshot taken now (GUI thread), and the key of that picture; run the function on a worker.
    Opaque glyphs are whole planes (a glyph on two planes is drawn twice, in the same place: the
    same pixels), so a slice step builds the moved plane's surfaces only; translucent
    ones are each voxel once (drawn twice they would show darker), the planes whose lines of
    intersection moved built again as well. ``cursor``: the planes' voxel (default: the
    document's cursor)."""
    data, affine = layer.data.data, layer.data.affine.copy()
    reference, shape = doc.reference_affine.copy(), tuple(doc.reference_shape)
    cursor = np.array(doc.cursor if cursor is None else cursor, dtype=np.int64)
    step = glyph_step_3d(layer.glyph_step, shape, software)
    display = (float(layer.glyph_size), layer.fod_scaling, float(layer.opacity) < 1.0)
    key = ("fod", id(data), affine.tobytes(), reference.tobytes(), tuple(int(v) for v in cursor), step, display)
    budget = GLYPH_TRIANGLES_SOFTWARE if software else GLYPH_TRIANGLES
    size_mm = 0.5 * step * _voxel_mm(reference) * display[0]

    def build():
        planes = [
            plane_base(data, affine, reference, shape, normal, cursor[normal], step, FOD_PLANES) for normal in range(3)
        ]
        counts = sum(len(plane["linear"]) for plane in planes)
        if not counts:
            return None
        look = (sphere_level(counts, budget), display[1])  # from all three planes' glyphs: the same for each
        chosen = plane_choices(data, affine, reference, shape, cursor, step, look, FOD_PLANES, each_once=display[2])
        top = None
        if display[1] != "voxel":
            top = max(
                (float(plane["radii"].max()) for plane, _rows, _left in chosen if len(plane["radii"])), default=0.0
            )
        return PlaneMeshes(
            _plane_surfaces_cached(data, plane, rows, left, look[0], size_mm, top) for plane, rows, left in chosen
        )

    return build, key


def fod_section_job(layer: Layer, doc: Document, geometry, step: int, screen: tuple):
    """A function that builds an fODF layer's in-plane sections on a slice (``geometry``: a
    :class:`widgets.render.PlaneGeometry`) on the voxels whose in-plane indices are
    ≡ step // 2 (mod ``step``), as a :class:`widgets.section_raster.GlyphPicture` made for
    ``screen`` (target, area, ratio: the slice's rectangle on the widget and the part of it
    on screen, each (left, top, width, height) in widget pixels, and the device pixel ratio);
    and the key of that picture."""
    data, affine, reference = layer.data.data, layer.data.affine.copy(), doc.reference_affine.copy()
    info = (geometry.pixel_mm, geometry.screen_x_world, geometry.screen_up_world, 0.5 * step * min(geometry.pixel_mm))
    display = (float(layer.glyph_size), float(layer.opacity), layer.fod_scaling)
    key = ("fod", id(data), affine.tobytes(), reference.tobytes(), plane_key(geometry), step, info, display, screen)
    plane_shape = geometry.voxels.shape[:2]

    def build():
        voxels, grid_rows, grid_cols = plane_cells(geometry, step)
        values, inside = sample_volume(data, affine, reference, voxels)
        keep = inside & fitted(values)
        if not keep.any():
            return []
        return section_picture(values[keep], grid_rows, grid_cols, keep, info, display, screen, plane_shape, step)

    return build, key


def section_picture(sh, grid_rows, grid_cols, keep, info, display, screen, plane_shape, step: int,
                    vertices: int = SECTION_VERTICES) -> GlyphPicture | list:  # fmt: skip
    """The sections of fODFs ``sh`` (G, C) on the cells ``keep`` of a slice's glyph grid (plane
    rows and columns (R, C) each, ``step`` apart) drawn for ``screen`` (see
    :func:`fod_section_job`): each piece between two neighbouring section points in the
    colour of its direction. [] when the slice is off screen."""
    pixel_mm, screen_x, screen_up, radius_mm = info
    size, opacity, scaling = display
    (tl, tt, tw, th), (al, at, aw, ah), ratio = screen
    if aw <= 0 or ah <= 0:
        return []  # the slice is off screen (panned away): nothing to draw
    height, width = plane_shape
    radii, world = fod_sections(sh, screen_x, screen_up, scaling=scaling, vertices=vertices)
    px_per_row, px_per_column = th / height * ratio, tw / width * ratio  # picture pixels per plane pixel
    lattice = Lattice(
        x0=(tl - al) * ratio + (grid_cols[0, 0] + 0.5) * px_per_column,
        y0=(tt - at) * ratio + (grid_rows[0, 0] + 0.5) * px_per_row,
        dx=step * px_per_column,
        dy=step * px_per_row,
        rows=grid_rows.shape[0],
        columns=grid_rows.shape[1],
    )
    per_mm = px_per_column / pixel_mm[1]  # picture pixels per mm
    t = np.linspace(0.0, 2.0 * np.pi, vertices, endpoint=False)
    reach = radii * (radius_mm * size * per_mm)
    middle = world + np.roll(world, -1, axis=0)  # the direction between two section points
    colours = np.abs(middle) / np.maximum(np.abs(middle).max(axis=1, keepdims=True), 1e-12)
    cells = np.argwhere(keep)  # (G, 2): each glyph's (row, column) in the grid, in keep's order
    pixels = section_pixels(reach * np.cos(t), -reach * np.sin(t), colours, opacity, lattice, cells,
                            (math.ceil(ah * ratio), math.ceil(aw * ratio)))  # fmt: skip
    return GlyphPicture(pixels, (al, at, aw, ah), (tl, tt, tw, th), ratio)


def fod_step_2d(step: int, plane_shape, cell_px: float) -> int:
    """The step of a slice view's fODF sections: :func:`widgets.glyphs.glyph_step_2d`, and cells
    at least :data:`MIN_FOD_CELL_PX` pixels apart."""
    return max(glyph_step_2d(step, plane_shape, cell_px), math.ceil(MIN_FOD_CELL_PX / max(float(cell_px), 1e-6)))


# ------------------------------------------------------------------ one door per view
def slice_glyph_job(layer: Layer, doc: Document, geometry, plane_shape, cell_px: float, screen: tuple):
    """The 2-D glyph build of a tensor (ellipses) or fODF (sections, a picture made for
    ``screen``: see :func:`fod_section_job`) layer: (build, key)."""
    if layer.kind == "fod":
        return fod_section_job(layer, doc, geometry, fod_step_2d(layer.glyph_step, plane_shape, cell_px), screen)
    return ellipse_job(layer, doc, geometry, glyph_step_2d(layer.glyph_step, plane_shape, cell_px))


def volume_glyph_job(layer: Layer, doc: Document, software: bool = False, cursor=None):
    """The 3-D glyph build of a tensor (superquadrics) or fODF (SH surfaces) layer: (build, key);
    ``cursor``: the planes' voxel (default: the document's cursor)."""
    if layer.kind == "fod":
        return fod_glyph_job(layer, doc, software, cursor)
    return tensor_glyph_job(layer, doc, software, cursor)


SCALING_TEXT = {"voxel": "fODF glyphs: scale each voxel (min-max)", "global": "fODF glyphs: relative sizes"}


def add_fod_menu(menu, layer: Layer) -> None:
    """The fODF layer menu's scaling choice (:data:`app.model.FOD_SCALINGS`), one checked."""
    for scaling, text in SCALING_TEXT.items():
        action = menu.addAction(text)
        action.setCheckable(True)
        action.setChecked(layer.fod_scaling == scaling)
        action.triggered.connect(lambda *_, scaling=scaling: layer.set(fod_scaling=scaling))
    menu.addSeparator()
