"""Tensor quantities the views draw (glyph shapes and colours), computed by the engine.

The glyph builders in ``widgets.glyphs`` need eigen-decompositions, FA and tensors in the
world frame; they get them here so that the interface reaches the compute engine only
through ``app`` (see the architecture's lanes). NumPy arrays in and out: the views run these
on worker threads over the few thousand voxels they show, not over the whole volume.

Tensors are in the order xx, xy, xz, yy, yz, zz (:mod:`gpu.sym3`); FA is Basser & Pierpaoli's
(1996) fractional anisotropy.
"""

from __future__ import annotations

import numpy as np

from tractlens.gpu import dti, sym3


def tensor_eigen(tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (G, 3), largest first, and eigenvectors (G, 3, 3) as columns of (G, 6) tensors."""
    return sym3.eigh(np, np.asarray(tensors, dtype=np.float64))


def fractional_anisotropy(evals: np.ndarray, evecs: np.ndarray) -> np.ndarray:
    """FA in [0, 1] from eigenvalues (G, 3) and eigenvectors (G, 3, 3), largest eigenvalue first."""
    return np.clip(dti.scalar_maps(np, evals, evecs)["fa"], 0.0, 1.0)


def affine_rotation(affine: np.ndarray) -> np.ndarray:
    """The rotation (or reflection) of an affine, without its voxel sizes and shear (polar factor)."""
    u, _s, vt = np.linalg.svd(np.asarray(affine)[:3, :3])
    return u @ vt


def tensors_to_world(tensors: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Voxel-axis tensors (G, 6) -> world (RAS) frame: R D Rᵀ with R the affine's rotation (a
    copy of them when R is the identity, as a scanner's axial grid has). As two matrix products
    over all tensors at once: NumPy's stacked 3 × 3 products took a fifth of a glyph build."""
    tensors = np.asarray(tensors)
    rotation = affine_rotation(affine)
    if np.allclose(rotation, np.eye(3), rtol=0.0, atol=1e-12):
        return tensors.copy()
    mat = sym3.to_matrix(np, tensors)
    rotation = rotation.astype(mat.dtype)
    right = (mat.reshape(-1, 3) @ rotation.T).reshape(mat.shape)  # D Rᵀ
    return sym3.from_matrix(np, np.tensordot(right, rotation, axes=([1], [1])).transpose(0, 2, 1))  # R D Rᵀ


def tensor_matrices(tensors: np.ndarray) -> np.ndarray:
    """(G, 6) tensors as symmetric (G, 3, 3) matrices."""
    return sym3.to_matrix(np, tensors)
