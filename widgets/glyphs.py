"""Glyphs on the slice planes: tensor ellipsoids and superquadrics (Kindlmann 2004) and
dyads sticks, each layer one mesh per view.

G. Kindlmann, "Superquadric Tensor Glyphs", VisSym 2004: with
cl = (λ1 − λ2)/Σλ and cp = 2(λ2 − λ3)/Σλ and sharpness γ,
if cl ≥ cp the glyph is q(θ, φ) = (cos^β φ, −sin^α θ sin^β φ, cos^α θ sin^β φ)
with α = (1 − cp)^γ, β = (1 − cl)^γ (round about x); otherwise
q(θ, φ) = (cos^α θ sin^β φ, sin^α θ sin^β φ, cos^β φ) with α = (1 − cl)^γ,
β = (1 − cp)^γ (round about z); x^a means sign(x)|x|^a. The glyph is then
scaled by (λ1, λ2, λ3) along x, y, z and rotated onto (e1, e2, e3). An
ellipsoid is the case α = β = 1.

Dyads sticks (ball & sticks / bedpostX fibre orientations) are line segments
centred on their voxel, one colour per stick number (:data:`app.model.STICK_COLOURS`).

Tensor glyphs are built off the GUI thread (:class:`LatestTask`: one computation at a
time per view, only the newest request's result delivered, stale ones dropped) and
their number is bounded so that drawing them stays fast whatever the image size:

* 3-D: at most :data:`MAX_GLYPHS_PER_PLANE` glyph cells per cursor plane; the
  layer's "every n-th voxel" is a minimum, raised as needed
  (:func:`glyph_step_3d`: a 128×128 plane at step 2 has 4096 cells, so step 3);
  the glyphs' surface resolution drops when there are many (:func:`glyph_resolution`,
  within :data:`GLYPH_TRIANGLES`). Where OpenGL is software-rendered (no GPU: a
  remote X session, a virtual machine, a CI server) every triangle costs about
  0.3 µs per frame on the CPU, so the bounds are lower
  (:data:`MAX_GLYPHS_PER_PLANE_SOFTWARE`, :data:`GLYPH_TRIANGLES_SOFTWARE`): a
  frame with glyphs then still takes ~50 ms instead of 250 ms.
* 2-D: ellipses on voxels at least :data:`MIN_GLYPH_CELL_PX` screen pixels apart
  and at most :data:`MAX_GLYPHS_2D` per view (:func:`glyph_step_2d`), drawn as one
  path per colour (:func:`ellipse_paths`).
"""

from __future__ import annotations

import logging
import math
import os
import time

import numpy as np
import pyvista as pv
from PySide6.QtCore import QByteArray, QDataStream, QIODevice, QObject, QRunnable, QThreadPool, QTimer, Signal
from PySide6.QtGui import QPainterPath

from tractlens.app.display_data import (
    affine_rotation,
    fractional_anisotropy,
    tensor_eigen,
    tensor_matrices,
    tensors_to_world,
)
from tractlens.app.model import STICK_COLOURS, Document, Layer

from .glyph_instances import _spow, _template, instances_mesh, joined_instances
from .glyph_planes import cursor_plane_tensors, sample_volume, tensor_fitted
from .render import sample_layer

log = logging.getLogger(__name__)

MAX_GLYPHS_PER_PLANE = 2500  # 3-D: glyph cells per cursor plane (the step grows to stay below)
MAX_GLYPHS_PER_PLANE_SOFTWARE = 600  # the same where OpenGL is software-rendered
# Instanced tensor glyphs (widgets.glyph_instances) cost a few numbers each per slice step: a whole
# 1.25 mm plane (145 × 174) with hardware OpenGL; their triangles are drawn, not built
MAX_INSTANCED_GLYPHS_PER_PLANE = 40_000
GLYPH_TRIANGLES_INSTANCED = 16_000_000
GLYPH_TRIANGLES = 1_500_000  # 3-D: triangles of all glyphs (the surface resolution drops to stay below)
GLYPH_TRIANGLES_SOFTWARE = 60_000
MIN_GLYPH_CELL_PX = 5  # 2-D: ellipses on voxels at least this many screen pixels apart
MAX_GLYPHS_2D = 4000  # 2-D: at most this many ellipse cells per view
COLOUR_LEVELS = 8  # 2-D: levels per colour channel (one path per colour); grey stays grey


def glyph_mesh(
    tensors: np.ndarray,
    centres: np.ndarray,
    *,
    shape: str = "superquadric",
    size_mm: float = 2.0,
    resolution: int = 10,
    sharpness: float = 3.0,
    colour: str = "direction",
) -> pv.PolyData:
    """One PolyData of glyphs for world-frame tensors (G, 6) at world centres (G, 3).

    Each glyph's largest radius is ``size_mm`` × λ1 / max(λ1) (so relative sizes
    show); points carry an ``rgb`` uint8 colour by main direction (|e1|) or FA, and the
    surface's exact normals (Barr's superquadric normals: the same form with exponents
    2 − α and 2 − β, divided by the radii), so it is smoothly shaded without a normals
    filter.
    """
    tensors = np.asarray(tensors, dtype=np.float64)
    evals, evecs = tensor_eigen(tensors)
    evals = np.maximum(evals, 0.0)
    theta, phi, faces = _template(resolution)
    lam_max = max(float(evals[:, 0].max()), 1e-30) if len(evals) else 1.0
    total = np.maximum(evals.sum(1), 1e-30)
    cl = (evals[:, 0] - evals[:, 1]) / total
    cp = 2.0 * (evals[:, 1] - evals[:, 2]) / total
    linear = (cl >= cp)[:, None]
    if shape == "ellipsoid":
        alpha = beta = np.ones((len(tensors), 1))
    else:
        alpha = np.where(linear[:, 0], (1 - cp) ** sharpness, (1 - cl) ** sharpness)[:, None]
        beta = np.where(linear[:, 0], (1 - cl) ** sharpness, (1 - cp) ** sharpness)[:, None]
    ct, st, cf, sf = np.cos(theta)[None], np.sin(theta)[None], np.cos(phi)[None], np.sin(phi)[None]
    # Round about x (linear) or about z (planar).
    qx = np.stack([_spow(cf, beta), -_spow(st, alpha) * _spow(sf, beta), _spow(ct, alpha) * _spow(sf, beta)], -1)
    qz = np.stack([_spow(ct, alpha) * _spow(sf, beta), _spow(st, alpha) * _spow(sf, beta), _spow(cf, beta)], -1)
    unit = np.where(linear[:, :, None], qx, qz)  # (G, M, 3)
    radii = evals / lam_max * size_mm  # (G, 3)
    local = unit * radii[:, None, :]
    points = np.einsum("gij,gmj->gmi", evecs, local) + centres[:, None, :]
    a2, b2 = 2.0 - alpha, 2.0 - beta
    nx = np.stack([_spow(cf, b2), -_spow(st, a2) * _spow(sf, b2), _spow(ct, a2) * _spow(sf, b2)], -1)
    nz = np.stack([_spow(ct, a2) * _spow(sf, b2), _spow(st, a2) * _spow(sf, b2), _spow(cf, b2)], -1)
    normal_local = np.where(linear[:, :, None], nx, nz) / np.maximum(radii, 1e-6 * size_mm)[:, None, :]
    normals = np.einsum("gij,gmj->gmi", evecs, normal_local)
    normals /= np.maximum(np.linalg.norm(normals, axis=-1, keepdims=True), 1e-30)
    n_vertices = unit.shape[1]
    tri = faces[None, :, :] + (np.arange(len(tensors)) * n_vertices)[:, None, None]
    cells = np.concatenate([np.full((tri.shape[0] * tri.shape[1], 1), 3), tri.reshape(-1, 3)], axis=1)
    mesh = pv.PolyData(points.reshape(-1, 3), faces=cells.ravel())
    mesh.point_data["Normals"] = normals.reshape(-1, 3).astype(np.float32)
    mesh.point_data.active_normals_name = "Normals"
    if colour == "fa":
        fa = fractional_anisotropy(evals, evecs)
        rgb = np.stack([fa, fa, fa], 1)
    else:
        rgb = np.abs(evecs[:, :, 0])
    mesh.point_data["rgb"] = np.repeat((rgb * 255 + 0.5).astype(np.uint8), n_vertices, axis=0)
    mesh.point_data.active_scalars_name = "rgb"  # a mesh swapped into an actor is coloured by it, not the normals
    return mesh


def stick_segments(
    layer: Layer, doc: Document, voxels: np.ndarray, step: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The sticks of a dyads layer at reference voxels (N, 3), every ``step``-th voxel of a plane.

    Returns ``ends`` (S, 2, 3), the two end points of each shown stick in
    reference voxel coordinates, centred on its voxel, and ``stick`` (S,), its
    number (0 = first). A stick is f × ``step`` (default: the layer's
    ``glyph_step``) × ``glyph_size`` times the reference grid's smallest voxel
    size long, along its direction in world space, whatever the voxel shape;
    sticks with f = 0 are left out.
    """
    values, inside = sample_layer(layer, doc, voxels)  # (N, n_sticks, 4)
    fraction = np.where(inside[:, None], values[..., 3], 0.0)
    voxel, stick = np.nonzero(fraction > 0)
    reference = doc.reference_affine[:3, :3]
    world = values[voxel, stick, :3].astype(np.float64) @ affine_rotation(layer.data.affine).T
    voxel_mm = float(np.sqrt((reference**2).sum(axis=0)).min())
    step = max(1, int(layer.glyph_step if step is None else step))
    half_mm = 0.5 * fraction[voxel, stick] * step * layer.glyph_size * voxel_mm
    half = np.linalg.solve(reference, (world * half_mm[:, None]).T).T  # world mm -> reference voxels
    centres = voxels[voxel].astype(np.float64)
    return np.stack([centres - half, centres + half], axis=1), stick


def stick_mesh(ends_world: np.ndarray, stick: np.ndarray) -> pv.PolyData:
    """One line PolyData of sticks (S, 2, 3) in world mm, points coloured (``rgb``) by stick number."""
    points = np.asarray(ends_world, dtype=np.float64).reshape(-1, 3)
    count = len(stick)
    lines = np.column_stack([np.full(count, 2), 2 * np.arange(count), 2 * np.arange(count) + 1])
    mesh = pv.PolyData(points, lines=lines.ravel())
    colours = (np.asarray(STICK_COLOURS) * 255 + 0.5).astype(np.uint8)
    mesh.point_data["rgb"] = np.repeat(colours[np.asarray(stick) % len(colours)], 2, axis=0)
    return mesh


# ------------------------------------------------------------------ bounded glyph counts
def glyph_step_3d(step: int, reference_shape, software: bool = False, instanced: bool = False) -> int:
    """The step (every n-th voxel) of the 3-D glyphs: the layer's, or more so that no cursor
    plane has more than :data:`MAX_GLYPHS_PER_PLANE` glyph cells (``software``: OpenGL is
    software-rendered, :data:`MAX_GLYPHS_PER_PLANE_SOFTWARE`; ``instanced`` with hardware
    OpenGL: :data:`MAX_INSTANCED_GLYPHS_PER_PLANE`)."""
    a, b, c = (int(v) for v in reference_shape)
    largest = max(a * b, a * c, b * c)
    cap = MAX_GLYPHS_PER_PLANE_SOFTWARE if software else MAX_GLYPHS_PER_PLANE
    if instanced and not software:
        cap = MAX_INSTANCED_GLYPHS_PER_PLANE
    return max(1, int(step), math.ceil(math.sqrt(largest / cap)))


def glyph_step_2d(step: int, plane_shape, cell_px: float) -> int:
    """The step of a slice view's ellipses: the layer's, or more so that they are at least
    :data:`MIN_GLYPH_CELL_PX` pixels apart (``cell_px``: one voxel's size on the screen) and
    at most :data:`MAX_GLYPHS_2D` per view."""
    height, width = (int(v) for v in plane_shape[:2])
    spacing = math.ceil(MIN_GLYPH_CELL_PX / max(float(cell_px), 1e-6))
    count = math.ceil(math.sqrt(height * width / MAX_GLYPHS_2D))
    return max(1, int(step), spacing, count)


def glyph_resolution(count: int, software: bool = False, instanced: bool = False) -> int:
    """Surface resolution of ``count`` 3-D glyphs: 10 (160 triangles each) when all fit in
    :data:`GLYPH_TRIANGLES` (``software``: :data:`GLYPH_TRIANGLES_SOFTWARE`; ``instanced`` with
    hardware OpenGL: :data:`GLYPH_TRIANGLES_INSTANCED`), else 8 (96), else 6 (48)."""
    budget = GLYPH_TRIANGLES_SOFTWARE if software else GLYPH_TRIANGLES_INSTANCED if instanced else GLYPH_TRIANGLES
    for resolution in (10, 8):
        if count * 2 * resolution * (resolution - 2) <= budget:
            return resolution
    return 6


def tensor_glyph_job(layer: Layer, doc: Document, software: bool = False, cursor=None):
    """A function that builds a tensor layer's 3-D glyph mesh (or None) from a snapshot of what it
    needs, taken now on the GUI thread; run it on a worker. Returns (function, key): the key
    changes whenever the mesh would. ``software``: OpenGL is software-rendered (fewer glyphs);
    ``cursor``: the planes' voxel (default: the document's cursor)."""
    data, affine = layer.data.data, layer.data.affine.copy()
    reference, shape = doc.reference_affine.copy(), tuple(doc.reference_shape)
    cursor = np.array(doc.cursor if cursor is None else cursor, dtype=np.int64)
    step = glyph_step_3d(layer.glyph_step, shape, software, instanced=True)
    display = (layer.glyph, float(layer.glyph_size), "fa" if layer.color_by == "fa" else "direction")
    # The voxels a step's planes show depend on the cursor's position along each axis only.
    key = (id(data), affine.tobytes(), reference.tobytes(), tuple(int(v) for v in cursor), step, display)

    def build():
        # plane by plane, the planes the step did not move from the cache (widgets.glyph_planes)
        glyphs = cursor_plane_tensors(data, affine, reference, shape, cursor, step, (display[0], display[2]))
        if glyphs is None:
            return None
        voxel_mm = float(np.sqrt((reference[:3, :3] ** 2).sum(0)).min())
        arrays = joined_instances(  # per-glyph arrays: the view draws them as instances of source meshes
            glyphs,
            glyphs["centres"],
            shape=display[0],
            size_mm=0.5 * step * voxel_mm * display[1],
            resolution=glyph_resolution(len(glyphs["centres"]), software, instanced=True),
        )
        return OnGuiThread(instances_mesh, arrays)

    return build, key


def plane_key(geometry) -> tuple:
    """What names a slice's plane in a 2-D glyph picture's key: its shape and corner voxels."""
    voxels = geometry.voxels
    return voxels.shape, tuple(int(v) for v in voxels[0, 0]), tuple(int(v) for v in voxels[-1, -1])


def plane_cells(geometry, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference voxels (R, C, 3) of a slice's 2-D glyph cells, those whose in-plane indices
    are ≡ step // 2 (mod ``step``), and their (row, column) on the plane (R, C) each (on the
    worker: the GUI thread computes the key alone)."""
    offset = step // 2
    rows = np.flatnonzero(geometry.voxels[:, 0, geometry.v_axis] % step == offset)
    cols = np.flatnonzero(geometry.voxels[0, :, geometry.h_axis] % step == offset)
    grid_rows, grid_cols = np.meshgrid(rows, cols, indexing="ij")
    return geometry.voxels[np.ix_(rows, cols)], grid_rows, grid_cols


def ellipse_job(layer: Layer, doc: Document, geometry, step: int):
    """A function that builds a tensor layer's in-plane ellipses on a slice (``geometry``: a
    :class:`widgets.render.PlaneGeometry`) on the voxels whose in-plane indices are
    ≡ step // 2 (mod ``step``), as :func:`ellipse_paths` in plane millimetres (x right from
    the plane's left edge, y down from its top); and the key of that picture. The snapshot is
    taken now (GUI thread); run the function on a worker."""
    data, affine, reference = layer.data.data, layer.data.affine.copy(), doc.reference_affine.copy()
    info = (geometry.pixel_mm, geometry.screen_x_world, geometry.screen_up_world, 0.5 * step * min(geometry.pixel_mm))
    display = (float(layer.glyph_size), float(layer.opacity), "fa" if layer.color_by == "fa" else "direction")
    key = (id(data), affine.tobytes(), reference.tobytes(), plane_key(geometry), step, info, display)

    def build():
        voxels, grid_rows, grid_cols = plane_cells(geometry, step)
        return ellipses_for_plane(data, affine, reference, voxels, grid_rows, grid_cols, info, display)

    return build, key


def ellipse_paths(
    tensors_world: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    *,
    pixel_mm: tuple[float, float],
    screen_x_world: tuple[int, int],
    screen_up_world: tuple[int, int],
    radius_mm: float,
    opacity: float,
    colour: str,
    vertices: int = 16,
) -> list[tuple[tuple[int, int, int, int], QPainterPath]]:
    """In-plane ellipses of world-frame tensors (G, 6) centred on plane pixels (``rows``,
    ``cols``), in plane millimetres, grouped into one filled path per colour: [(rgba, path)].

    Each ellipse is the tensor's 2×2 in-plane part (screen frame: x right, y down), its
    largest semi-axis ``radius_mm`` × λ/λ1max of the layer's largest eigenvalue in view;
    coloured by the main direction |e1| or grey by FA, quantised to :data:`COLOUR_LEVELS`
    levels per channel."""
    world = tensor_matrices(tensors_world)
    (hx, hs), (vy, vs) = screen_x_world, screen_up_world
    block = np.stack(
        [
            np.stack([world[:, hx, hx], -hs * vs * world[:, hx, vy]], -1),
            np.stack([-hs * vs * world[:, vy, hx], world[:, vy, vy]], -1),
        ],
        -2,
    )
    lam, vec = np.linalg.eigh(block)  # ascending: column 1 is the larger axis
    lam = np.maximum(lam, 0.0)
    evals, evecs = np.linalg.eigh(world)
    evals = np.maximum(evals, 0.0)
    lam_max = max(float(evals[:, 2].max()), 1e-30)
    scale = radius_mm / lam_max
    t = np.linspace(0.0, 2.0 * np.pi, vertices, endpoint=False)
    circle = np.stack([np.cos(t), np.sin(t)], -1)  # (K, 2)
    # point = centre + a cos t · v_major + b sin t · v_minor (screen mm, y down)
    major = vec[:, :, 1] * (lam[:, 1] * scale)[:, None]
    minor = vec[:, :, 0] * (lam[:, 0] * scale)[:, None]
    centre = np.stack([(cols + 0.5) * pixel_mm[1], (rows + 0.5) * pixel_mm[0]], -1)
    polygons = centre[:, None, :] + circle[None, :, :1] * major[:, None, :] + circle[None, :, 1:] * minor[:, None, :]
    if colour == "fa":
        fa = fractional_anisotropy(evals[:, ::-1], evecs[:, :, ::-1])
        rgb = np.stack([fa, fa, fa], 1)
    else:
        rgb = np.abs(evecs[:, :, 2])
    levels = COLOUR_LEVELS - 1
    quantised = np.rint(np.clip(rgb, 0.0, 1.0) * levels).astype(np.int64)
    keys = (quantised[:, 0] * COLOUR_LEVELS + quantised[:, 1]) * COLOUR_LEVELS + quantised[:, 2]
    alpha = round(255 * opacity)
    out = []
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for group in np.split(order, bounds):
        if group.size == 0:
            continue
        r, g, b = (round(255 * float(v) / levels) for v in quantised[group[0]])
        out.append(((r, g, b, alpha), polygons_path(polygons[group])))
    return out


def polygons_path(polygons: np.ndarray) -> QPainterPath:
    """One QPainterPath (winding fill) of closed polygons (G, K, 2), built from an array in
    QPainterPath's QDataStream format (element count, (type, x, y) per element, the last
    subpath's start, the fill rule) instead of a Python call per vertex."""
    count, k = polygons.shape[:2]
    path = QPainterPath()
    if count == 0:
        return path
    elements = np.empty((count, k + 1), dtype=[("type", ">i4"), ("x", ">f8"), ("y", ">f8")])
    elements["type"] = 1  # LineToElement
    elements["type"][:, 0] = 0  # MoveToElement
    elements["x"][:, :k], elements["y"][:, :k] = polygons[..., 0], polygons[..., 1]
    elements["x"][:, k], elements["y"][:, k] = polygons[:, 0, 0], polygons[:, 0, 1]  # closed
    total = count * (k + 1)
    tail = np.array([total - (k + 1), 1], dtype=">i4")  # last subpath start, Qt::WindingFill
    buffer = QByteArray(np.array([total], dtype=">i4").tobytes() + elements.tobytes() + tail.tobytes())
    stream = QDataStream(buffer, QIODevice.OpenModeFlag.ReadOnly)  # keep ``buffer`` alive while reading
    stream >> path
    return path


def ellipses_for_plane(data, affine, reference_affine, voxels, rows, cols, geometry_info, display):
    """Worker part of the 2-D ellipses: sample, keep fitted voxels, build the coloured paths."""
    values, inside = sample_volume(data, affine, reference_affine, voxels)
    keep = inside & tensor_fitted(values)
    if not keep.any():
        return []
    world = tensors_to_world(values[keep].astype(np.float64), affine)
    pixel_mm, screen_x, screen_up, radius_mm = geometry_info
    size, opacity, colour = display
    return ellipse_paths(
        world,
        rows[keep],
        cols[keep],
        pixel_mm=pixel_mm,
        screen_x_world=screen_x,
        screen_up_world=screen_up,
        radius_mm=radius_mm * size,
        opacity=opacity,
        colour=colour,
    )


# ------------------------------------------------------------------ off the GUI thread
_POOL: QThreadPool | None = None


#: Worker threads of all glyph builds: a slice step asks for four at once (the 3-D glyphs and each
#: slice view's ellipses); at most half the cores, this being display work beside the jobs.
GLYPH_THREADS = max(2, min(4, (os.cpu_count() or 2) // 2))


class OnGuiThread:
    """The last step of a build, returned by the build (NumPy work, on a worker) for
    :class:`LatestTask` to run on the GUI thread before it delivers: whatever makes VTK objects.
    VTK releases Python's lock in its calls, so a worker making or dropping VTK objects would run
    beside the GUI thread's rendering, and VTK's bookkeeping of its Python objects is not made for
    that."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __call__(self):
        return self.fn(*self.args)


def _on_gui_thread(ok: bool, result) -> tuple[bool, object]:
    """A build's (ok, result) with its :class:`OnGuiThread` last step run (GUI thread); a last
    step that fails counts as a failed build: no glyphs, and the event loop goes on."""
    if ok and isinstance(result, OnGuiThread):
        try:
            return True, result()
        except Exception:
            log.exception("building glyphs failed")
            return False, None
    return ok, result


def _pool() -> QThreadPool:
    """The worker threads of all glyph builds (:data:`GLYPH_THREADS`)."""
    global _POOL
    if _POOL is None:
        _POOL = QThreadPool()
        _POOL.setMaxThreadCount(GLYPH_THREADS)
    return _POOL


def wait_for_builds(timeout_ms: int = 10_000) -> bool:
    """Wait until no glyph build runs (a window waits before it finalises its render window: a
    build still making VTK meshes, or delivering them, must not meet a destroyed view)."""
    return True if _POOL is None else bool(_POOL.waitForDone(timeout_ms))


class _Build(QRunnable):
    def __init__(self, done, generation: int, key, fn):
        super().__init__()
        self.done, self.generation, self.key, self.fn = done, generation, key, fn
        self.setAutoDelete(True)

    def run(self) -> None:
        # This frame holds what the build needs: nothing is left for the runnable's deletion by
        # QThreadPool after run() returns (outside any Python frame on this pool thread).
        fn, done, key, self.fn, self.done, self.key = self.fn, self.done, self.key, None, None, None
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            outcome = (True, fn(), start, time.perf_counter(), time.thread_time() - cpu)
        except Exception as exc:  # a failed build shows no glyphs; it must not reach the event loop
            log.exception("building glyphs failed")
            outcome = (False, exc, start, time.perf_counter(), time.thread_time() - cpu)
        try:
            done.emit(self.generation, key, outcome)
        except RuntimeError:  # the view went away meanwhile
            pass


class LatestTask(QObject):
    """Builds something for a view on a worker thread, one build at a time, and hands the
    newest request's result to ``deliver(key, result)`` on the GUI thread; a request made
    while a build runs waits, and only the last one waiting is built (stepping through ten
    slices quickly builds the first and the last). ``key`` names what a request would build:
    a request for the key already built or being built does nothing."""

    _done = Signal(int, object, object)

    def __init__(self, deliver, parent: QObject | None = None):
        super().__init__(parent)
        self._deliver = deliver
        self._generation = 0
        self._running = False
        self._waiting = None
        self.wanted = None  # key of the newest request
        self.delivered = None  # key of the result delivered last
        #: Seconds of the last delivered build: waiting for a worker, building (and the worker's CPU
        #: time of it: less when it waited for Python's lock), delivering (GUI thread).
        self.timings: dict[str, float] = {}
        self._requested = 0.0
        self.delivered_at = 0.0  # perf_counter time of the last delivery
        self._done.connect(self._finished)

    def request(self, key, fn, *, after_paint: bool = False) -> None:
        """Build ``fn()`` for ``key`` (see the class). ``after_paint``: the build starts once the
        event loop has finished what is queued now (the window's paint, the 3-D frame included),
        so that a worker holding the interpreter does not delay what the user sees first; it is
        wanted (not :meth:`ready`) from now."""
        if key == self.wanted:
            return
        self.wanted = key
        self._generation += 1
        self._waiting = (self._generation, key, fn)
        self._requested = time.perf_counter()
        if self._running:
            return
        if after_paint:
            QTimer.singleShot(0, self, self._start_waiting)
        else:
            self._start()

    def settle(self, key, result, deliver: bool = True):
        """Deliver ``result`` for ``key`` now, as a build's (one made ahead:
        :mod:`widgets.glyph_prefetch`); a build running or waiting is dropped. Without
        ``deliver`` the result is returned instead (a paint that uses it at once)."""
        self._generation += 1
        self._waiting = None
        self.wanted = key
        ok, result = _on_gui_thread(True, result)
        result = result if ok else None
        self.delivered = key
        start = self.delivered_at = time.perf_counter()
        if deliver:
            self._deliver(key, result)
        self.timings = {"made_ahead_s": 0.0, "deliver_s": time.perf_counter() - start}
        return result

    def _start_waiting(self) -> None:
        if not self._running and self._waiting is not None:
            self._start()

    def forget(self) -> None:
        """Nothing is wanted any more (the layer was hidden): a running build's result is dropped."""
        self._generation += 1
        self._waiting = None
        self.wanted = self.delivered = None

    def ready(self) -> bool:
        """Has the newest request's result been delivered (or was nothing requested)?"""
        return not self._running and self._waiting is None and self.delivered == self.wanted

    def _start(self) -> None:
        generation, key, fn = self._waiting
        self._waiting = None
        self._running = True
        _pool().start(_Build(self._done, generation, key, fn))

    def _finished(self, generation: int, key, outcome) -> None:
        self._running = False
        if generation == self._generation:  # the newest request: deliver
            ok, result, started, built, cpu = outcome
            ok, result = _on_gui_thread(ok, result)
            self.delivered = key
            arrived = self.delivered_at = time.perf_counter()
            self._deliver(key, result if ok else None)
            self.timings = {"wait_s": max(0.0, started - self._requested), "build_s": built - started,
                            "build_cpu_s": cpu, "to_gui_s": arrived - built,
                            "deliver_s": time.perf_counter() - arrived}  # fmt: skip
        if self._waiting is not None:
            self._start()
