"""fODF glyph geometry: spherical-harmonic surfaces the views draw, computed from coefficients.

An fODF glyph is the fODF's amplitude on a sphere mesh, each vertex pushed out along its
direction by the amplitude (the "SH surface" of MRtrix's ``mrview`` ODF overlay and DIPY's
``odf_slicer``), coloured by direction (|x|, |y|, |z| of the world direction: red
left-right, green anterior-posterior, blue inferior-superior). Negative amplitudes (ringing)
are drawn as zero. Two scalings (the layer's ``fod_scaling``):

* ``"voxel"``: min-max normalised per voxel, r = (a − min a) / (max a − min a): every glyph
  as large as its cell, lobes as sharp as they can be (crossings read best);
* ``"global"``: r = a / A, A the largest amplitude among the glyphs of one picture (the
  cursor planes' glyphs in 3-D, the slice's in 2-D): relative fibre density shows.

Coefficients are in MRtrix's basis and the world (RAS) frame (:mod:`app.io.fod`), so
amplitudes are evaluated at world directions with :func:`gpu.sh.sh_basis`. NumPy arrays in
and out (the views run these on worker threads over the few thousand voxels they show); the
array module is a parameter so the same code runs on CuPy.
"""

from __future__ import annotations

import functools

import numpy as np

from tractlens.gpu.sh import lmax_of, sh_basis

from .layers import FOD_SCALINGS


@functools.lru_cache(maxsize=8)
def icosphere(subdivisions: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit vertices (V, 3) and triangles (F, 3) of an icosahedron subdivided ``subdivisions``
    times (12, 42, 162, 642 vertices; 20·4^n triangles, outward-facing)."""
    t = (1.0 + 5.0**0.5) / 2.0
    vertices = [
        (-1, t, 0), (1, t, 0), (-1, -t, 0), (1, -t, 0), (0, -1, t), (0, 1, t),
        (0, -1, -t), (0, 1, -t), (t, 0, -1), (t, 0, 1), (-t, 0, -1), (-t, 0, 1),
    ]  # fmt: skip
    faces = [
        (0, 11, 5), (0, 5, 1), (0, 1, 7), (0, 7, 10), (0, 10, 11), (1, 5, 9), (5, 11, 4),
        (11, 10, 2), (10, 7, 6), (7, 1, 8), (3, 9, 4), (3, 4, 2), (3, 2, 6), (3, 6, 8),
        (3, 8, 9), (4, 9, 5), (2, 4, 11), (6, 2, 10), (8, 6, 7), (9, 8, 1),
    ]  # fmt: skip
    points = [np.asarray(v, dtype=np.float64) / np.linalg.norm(v) for v in vertices]
    for _ in range(int(subdivisions)):
        faces = _subdivide(points, faces)
    return np.array(points), np.array(faces, dtype=np.int64)


def _subdivide(points: list, faces: list) -> list:
    """Each triangle into four, new vertices (edge midpoints on the sphere) appended to ``points``."""
    midpoints: dict[tuple[int, int], int] = {}

    def middle(a: int, b: int) -> int:
        key = (min(a, b), max(a, b))
        if key not in midpoints:
            m = points[a] + points[b]
            points.append(m / np.linalg.norm(m))
            midpoints[key] = len(points) - 1
        return midpoints[key]

    finer = []
    for a, b, c in faces:
        ab, bc, ca = middle(a, b), middle(b, c), middle(c, a)
        finer += [(a, ab, ca), (b, bc, ab), (c, ca, bc), (ab, bc, ca)]
    return finer


def sphere_level(count: int, triangle_budget: int) -> int:
    """Subdivisions of the sphere mesh of ``count`` glyphs: 3 (1280 triangles each) when all fit
    in ``triangle_budget``, else 2 (320), else 1 (80)."""
    for level in (3, 2):
        if count * 20 * 4**level <= triangle_budget:
            return level
    return 1


def fod_amplitudes(sh, directions, xp=np):
    """fODF amplitudes (G, V) of coefficients (G, C) (MRtrix basis, world frame) at unit world
    ``directions`` (V, 3): ``sh @ Yᵀ`` with Y the basis of :func:`gpu.sh.sh_basis`."""
    sh = xp.asarray(sh)
    basis = sh_basis(xp, xp.asarray(directions, dtype=xp.float64), lmax_of(int(sh.shape[-1])))
    return sh.astype(xp.float64) @ basis.T


def glyph_radii(amplitudes, scaling: str, reference=None, xp=np):
    """Radii in 0..1 of glyph vertices from amplitudes (G, V), negative lobes at zero.

    ``scaling`` is one of :data:`FOD_SCALINGS`. ``reference``: amplitudes (G, R) of the same
    voxels on a finer sphere, whose extremes normalise (default: ``amplitudes`` itself), so a
    glyph's in-plane section (2-D views) is scaled as its whole surface is."""
    if scaling not in FOD_SCALINGS:
        raise ValueError(f"fODF scaling is one of {', '.join(FOD_SCALINGS)}, not {scaling!r}")
    a = xp.maximum(xp.asarray(amplitudes, dtype=xp.float64), 0.0)
    ref = a if reference is None else xp.maximum(xp.asarray(reference, dtype=xp.float64), 0.0)
    if scaling == "voxel":
        lo = ref.min(axis=1, keepdims=True)
        span = ref.max(axis=1, keepdims=True) - lo
        return xp.where(span > 0, xp.clip(a - lo, 0.0, None) / xp.where(span > 0, span, 1.0), 0.0)
    top = float(ref.max()) if ref.size else 0.0
    return a / top if top > 0 else xp.zeros_like(a)


def direction_colours(directions) -> np.ndarray:
    """RGB uint8 (V, 3) of unit world directions: |x|, |y|, |z| (the usual colour by direction)."""
    d = np.abs(np.asarray(directions, dtype=np.float64))
    d /= np.maximum(d.max(axis=-1, keepdims=True), 1e-12)  # full brightness along every direction
    return (d * 255 + 0.5).astype(np.uint8)


def fitted(sh: np.ndarray) -> np.ndarray:
    """Voxels (G,) holding an fODF: a positive l=0 term (outside the mask everything is 0)."""
    sh = np.asarray(sh)
    return np.isfinite(sh).all(axis=-1) & (sh[..., 0] > 0)


def fod_surfaces(
    sh: np.ndarray,
    centres_mm: np.ndarray,
    *,
    size_mm: float,
    scaling: str = "voxel",
    subdivisions: int = 2,
    normals: bool = False,
) -> tuple[np.ndarray, ...]:
    """The SH surfaces of (G, C) fODFs centred at world ``centres_mm`` (G, 3).

    Returns ``points`` (G·V, 3) in world mm (vertex k of glyph g at centre + r·size_mm·u_k,
    r from :func:`glyph_radii`), ``triangles`` (G·F, 3) indices into them, and ``rgb``
    (G·V, 3) uint8 by vertex direction; with ``normals``, also the vertex normals (G·V, 3)
    (:func:`surface_normals`)."""
    directions, faces = icosphere(subdivisions)
    amplitudes = fod_amplitudes(sh, directions)
    radii = glyph_radii(amplitudes, scaling)  # (G, V)
    points = centres_mm[:, None, :] + radii[:, :, None] * size_mm * directions[None, :, :]
    offsets = np.arange(len(sh), dtype=np.int64)[:, None, None] * len(directions)
    triangles = (faces[None, :, :] + offsets).reshape(-1, 3)
    rgb = np.tile(direction_colours(directions), (len(sh), 1))
    if normals:
        return points.reshape(-1, 3), triangles, rgb, surface_normals(sh, amplitudes, radii, subdivisions)
    return points.reshape(-1, 3), triangles, rgb


def surface_normals(sh: np.ndarray, amplitudes: np.ndarray, radii: np.ndarray, subdivisions: int) -> np.ndarray:
    """Unit vertex normals (G·V, 3) float32 of the SH surfaces of (G, C) fODFs on the sphere of
    ``subdivisions``, their ``amplitudes`` (G, V) drawn at ``radii`` (G, V, :func:`glyph_radii`
    of them): the exact normals of the surface x(u) = r(u)·u, not the mesh's. With t₁, t₂ an
    orthonormal tangent frame at u and ∇r = ∂r/∂t₁·t₁ + ∂r/∂t₂·t₂, ∂x/∂t₁ × ∂x/∂t₂ =
    r·(r·u − ∇r). The radii are the amplitudes less an offset, scaled by one factor per glyph,
    where positive (zero elsewhere), so ∇r is that factor times the amplitudes' gradient: a
    matrix product of the coefficients with the basis's tangential derivatives
    (:func:`_sphere_gradients`, the same for every glyph) instead of a pass over every
    triangle of every glyph, a tenth of its time. Where the surface is at the centre with no
    slope (lobes at zero), a normal is its direction."""
    directions, _faces = icosphere(subdivisions)
    sh = np.asarray(sh, dtype=np.float32)
    count, vertices = np.shape(radii)
    t1, t2, derivatives = _sphere_gradients(int(subdivisions), lmax_of(int(sh.shape[-1])))
    slopes = (sh @ derivatives).reshape(count, 2, vertices)  # ∂a/∂t₁, ∂a/∂t₂
    a = np.maximum(np.asarray(amplitudes, dtype=np.float32), 0.0)
    r = np.asarray(radii, dtype=np.float32)
    # r = f·(a − lo) (a ≥ 0; voxel: f = 1/span, lo the glyph's least; global: f = 1/A, lo = 0): f per glyph
    span = a.max(axis=1, keepdims=True) - a.min(axis=1, keepdims=True)
    reach = r.max(axis=1, keepdims=True) - r.min(axis=1, keepdims=True)
    f = np.where(span > 0, reach / np.where(span > 0, span, 1.0), 0.0)
    positive = a > 0
    scale = f * positive  # ∂r/∂a where the radius follows the amplitude
    g1, g2 = scale * slopes[:, 0], scale * slopes[:, 1]
    u = directions.astype(np.float32)
    normals = np.empty((count, vertices, 3), dtype=np.float32)
    for k in range(3):  # component by component: (G, V) arrays, no reduction over a short axis
        normals[:, :, k] = r * u[:, k] - g1 * t1[:, k] - g2 * t2[:, k]
    length = np.sqrt(np.einsum("gvk,gvk->gv", normals, normals))
    flat = length <= 1e-6 * r.max(axis=1, keepdims=True)  # (relative: amplitudes come at any scale)
    normals /= np.where(flat, np.float32(1.0), length)[:, :, None]
    if flat.any():  # at the centre with no slope: its direction
        normals[flat] = np.broadcast_to(u, normals.shape)[flat]
    return normals.reshape(-1, 3)


@functools.lru_cache(maxsize=8)
def _sphere_gradients(subdivisions: int, lmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An orthonormal tangent frame t₁, t₂ (V, 3) at the vertices of the sphere of
    ``subdivisions`` (t₁ × t₂ = u) and the basis's derivatives along them (C, 2·V) float32
    (central differences over ±1e-4 rad, in float64: errors of order 1e-8)."""
    directions, _faces = icosphere(subdivisions)
    helper = np.where(np.abs(directions[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    t1 = np.cross(helper, directions)
    t1 /= np.linalg.norm(t1, axis=1, keepdims=True)
    t2 = np.cross(directions, t1)
    step = 1e-4
    columns = []
    for tangent in (t1, t2):
        ahead = sh_basis(np, np.cos(step) * directions + np.sin(step) * tangent, lmax)
        behind = sh_basis(np, np.cos(step) * directions - np.sin(step) * tangent, lmax)
        columns.append(((ahead - behind) / (2 * step)).T)  # (C, V)
    derivatives = np.ascontiguousarray(np.concatenate(columns, axis=1), dtype=np.float32)
    for array in (t1, t2, derivatives):
        array.flags.writeable = False
    return t1.astype(np.float32), t2.astype(np.float32), derivatives


def fod_sections(
    sh: np.ndarray,
    screen_x_world: tuple[int, int],
    screen_up_world: tuple[int, int],
    *,
    scaling: str = "voxel",
    vertices: int = 32,
) -> tuple[np.ndarray, np.ndarray]:
    """In-plane sections of (G, C) fODFs on a slice (the 2-D views' glyphs): for screen angle
    t_k = 2πk/``vertices`` (counter-clockwise from the screen's right), the world direction
    cos t · x̂ + sin t · ŷ (``screen_x_world``/``screen_up_world``: (world axis, ±1) along
    the screen's right and up) and its radius (G, K) in 0..1, normalised over the whole sphere.

    Returns radii (G, K) and the world directions (K, 3); vertex k lies at the unit screen
    offset (cos t_k, −sin t_k) (y down) times its radius."""
    t = np.linspace(0.0, 2.0 * np.pi, vertices, endpoint=False)
    (hx, hs), (vy, vs) = screen_x_world, screen_up_world
    world = np.zeros((vertices, 3))
    world[:, hx] = hs * np.cos(t)
    world[:, vy] = vs * np.sin(t)
    sphere, _faces = icosphere(2)
    radii = glyph_radii(fod_amplitudes(sh, world), scaling, reference=fod_amplitudes(sh, sphere))
    return radii, world
