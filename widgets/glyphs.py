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
"""

from __future__ import annotations

import numpy as np
import pyvista as pv

from app.model import STICK_COLOURS, Document, Layer
from gpu import dti, sym3

from .render import sample_layer


def _spow(x: np.ndarray, power: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.abs(x) ** power


def _template(resolution: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Angles (θ around, φ from the pole) of a UV sphere's vertices and its triangles."""
    sphere = pv.Sphere(radius=1.0, theta_resolution=resolution, phi_resolution=resolution)
    pts = np.asarray(sphere.points, dtype=np.float64)
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    theta = np.arctan2(pts[:, 1], pts[:, 0])
    phi = np.arccos(np.clip(pts[:, 2], -1, 1))
    faces = np.asarray(sphere.faces).reshape(-1, 4)[:, 1:]
    return theta, phi, faces


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
    show); points carry an ``rgb`` uint8 colour by main direction (|e1|) or FA.
    """
    tensors = np.asarray(tensors, dtype=np.float64)
    evals, evecs = sym3.eigh(np, tensors)
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
    n_vertices = unit.shape[1]
    tri = faces[None, :, :] + (np.arange(len(tensors)) * n_vertices)[:, None, None]
    cells = np.concatenate([np.full((tri.shape[0] * tri.shape[1], 1), 3), tri.reshape(-1, 3)], axis=1)
    mesh = pv.PolyData(points.reshape(-1, 3), faces=cells.ravel())
    if colour == "fa":
        fa = np.clip(dti.scalar_maps(np, evals, evecs)["fa"], 0, 1)
        rgb = np.stack([fa, fa, fa], 1)
    else:
        rgb = np.abs(evecs[:, :, 0])
    mesh.point_data["rgb"] = np.repeat((rgb * 255 + 0.5).astype(np.uint8), n_vertices, axis=0)
    return mesh


def affine_rotation(affine: np.ndarray) -> np.ndarray:
    """The rotation (or reflection) of an affine, without its voxel sizes and shear (polar factor)."""
    u, _s, vt = np.linalg.svd(np.asarray(affine)[:3, :3])
    return u @ vt


def tensors_to_world(tensors: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Voxel-axis tensors -> world (RAS) frame: R D Rᵀ with R the affine's rotation."""
    return sym3.rotate(np, tensors, affine_rotation(affine))


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
