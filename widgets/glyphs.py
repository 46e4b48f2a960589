"""Tensor glyphs: ellipsoids and superquadrics (Kindlmann 2004) as one mesh per view.

G. Kindlmann, "Superquadric Tensor Glyphs", VisSym 2004: with
cl = (λ1 − λ2)/Σλ and cp = 2(λ2 − λ3)/Σλ and sharpness γ,
if cl ≥ cp the glyph is q(θ, φ) = (cos^β φ, −sin^α θ sin^β φ, cos^α θ sin^β φ)
with α = (1 − cp)^γ, β = (1 − cl)^γ (round about x); otherwise
q(θ, φ) = (cos^α θ sin^β φ, sin^α θ sin^β φ, cos^β φ) with α = (1 − cl)^γ,
β = (1 − cp)^γ (round about z); x^a means sign(x)|x|^a. The glyph is then
scaled by (λ1, λ2, λ3) along x, y, z and rotated onto (e1, e2, e3). An
ellipsoid is the case α = β = 1.
"""

from __future__ import annotations

import numpy as np
import pyvista as pv

from gpu import dti, sym3


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


def tensors_to_world(tensors: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Voxel-axis tensors -> world (RAS) frame: R D Rᵀ with R the affine's rotation."""
    u, _s, vt = np.linalg.svd(np.asarray(affine)[:3, :3])
    return sym3.rotate(np, tensors, u @ vt)
