"""Seed points for tractography, in voxel coordinates, reproducible from an integer seed.

Seeds are drawn on the host with NumPy's PCG64 generator, so the same ``rng_seed``
gives the same seeds on every backend (and therefore the same streamlines).
"""

from __future__ import annotations

import math

import numpy as np

PLACEMENTS = ("random", "grid")


def seeds_in_mask(mask: np.ndarray, per_voxel: int = 1, *, placement: str = "random", rng_seed: int = 0) -> np.ndarray:
    """``per_voxel`` seeds in every voxel of ``mask``: ``(N, 3)`` float64 voxel coordinates.

    ``random``: uniform within each voxel (the cube ``v ± 0.5``). ``grid``: the centres
    of a regular ``m × m × m`` subdivision of the voxel, which needs ``per_voxel = m³``
    (1, 8, 27, ...).
    """
    mask = np.asarray(mask)
    if mask.ndim != 3:
        raise ValueError(f"a seed mask must be 3-D, got shape {mask.shape}")
    if per_voxel < 1:
        raise ValueError(f"seeds per voxel must be at least 1, got {per_voxel}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown seed placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    voxels = np.argwhere(mask != 0).astype(np.float64)
    if placement == "grid":
        m = round(per_voxel ** (1.0 / 3.0))
        if m**3 != per_voxel:
            lower = max(1, math.floor(per_voxel ** (1.0 / 3.0)))
            raise ValueError(
                f"grid seeding places m×m×m seeds per voxel; {per_voxel} is not a cube "
                f"(use {lower**3} or {(lower + 1) ** 3}, or random placement)"
            )
        ticks = (np.arange(m) + 0.5) / m - 0.5
        offsets = np.stack(np.meshgrid(ticks, ticks, ticks, indexing="ij"), -1).reshape(-1, 3)
    else:
        rng = np.random.default_rng(rng_seed)
        offsets = rng.uniform(-0.5, 0.5, size=(len(voxels), per_voxel, 3))
    return (voxels[:, None, :] + offsets).reshape(-1, 3)


def check_points(points, shape) -> np.ndarray:
    """Seed points given directly: ``(N, 3)`` finite voxel coordinates inside the grid."""
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] != 3:
        raise ValueError(f"seed points must be an (N, 3) array, got shape {points.shape}")
    if not np.isfinite(points).all():
        raise ValueError("seed points contain NaN or infinite coordinates")
    upper = np.asarray(shape[:3], dtype=np.float64) - 0.5
    outside = ~np.all((points >= -0.5) & (points < upper), axis=1)
    if outside.all() and len(points):
        raise ValueError(f"all {len(points)} seed points lie outside the volume {tuple(shape[:3])}")
    return points
