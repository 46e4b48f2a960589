"""Small synthetic heads for the registration tests: a smooth, asymmetric "brain" whose contrast can be
inverted (a T1 and a b=0-like image of the same anatomy), moved by known transforms."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from tractlens.app.grid import Grid


def grid(shape=(40, 44, 36), voxel_mm=3.0, origin=None) -> Grid:
    affine = np.diag([voxel_mm, voxel_mm, voxel_mm, 1.0])
    centre = (np.array(shape) - 1) / 2 * voxel_mm
    affine[:3, 3] = -centre if origin is None else origin
    return Grid(affine, shape)


def anatomy(points_mm: np.ndarray) -> np.ndarray:
    """Intensity of the synthetic head at RAS points (N, 3): an ellipsoid 'brain' of bright 'white matter'
        with dark 'ventricles', asymmetric blobs and a folded texture (gyri-like: it gives every region edges in
    every direction, so a deformation is visible everywhere, not only at the outline)."""
    x, y, z = (points_mm / np.array([45.0, 55.0, 40.0])).T
    r2 = x**2 + y**2 + z**2
    brain = 1 / (1 + np.exp((r2 - 1) * 12))
    wm = 1 / (1 + np.exp((x**2 / 0.3 + y**2 / 0.5 + z**2 / 0.4 - 1) * 8))
    vent = np.exp(-((x - 0.12) ** 2 / 0.01 + (y + 0.1) ** 2 / 0.06 + (z - 0.1) ** 2 / 0.02))
    blobs = 0.6 * np.exp(-((x - 0.5) ** 2 + (y - 0.3) ** 2 + (z + 0.2) ** 2) / 0.02)
    blobs += 0.5 * np.exp(-((x + 0.45) ** 2 + (y + 0.5) ** 2 + (z - 0.35) ** 2) / 0.015)
    px, py, pz = (points_mm / np.array([7.0, 8.0, 6.5])).T
    texture = np.sin(px + 0.5 * np.sin(py)) * np.sin(py + 0.7 * np.cos(pz)) * np.sin(pz + 0.4 * np.sin(px))
    return 100 * brain + 80 * wm - 70 * vent * brain + 60 * blobs * brain + 25 * texture * brain


def image_on(g: Grid, transform=None, contrast: str = "t1", noise: float = 0.0, seed: int = 0) -> np.ndarray:
    """The head drawn on ``g``; ``transform`` maps this image's RAS points to the anatomy's (a 4×4, or a
    callable on (N, 3) points). ``contrast`` 't2' inverts tissue contrast inside the head (b=0-like)."""
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in g.shape], indexing="ij"), -1).reshape(-1, 3)
    pts = ijk @ g.affine[:3, :3].T + g.affine[:3, 3]
    if transform is not None:
        pts = transform(pts) if callable(transform) else pts @ transform[:3, :3].T + transform[:3, 3]
    values = anatomy(pts)
    if contrast == "t2":
        head = ndimage.binary_fill_holes(values.reshape(g.shape) > 20).reshape(-1)
        values = np.where(head, 260 - values, 0.0)
    if noise:
        values = values + np.random.default_rng(seed).normal(0, noise, values.shape)
    return values.reshape(g.shape).astype(np.float32)


def rigid(rx=0.0, ry=0.0, rz=0.0, t=(0.0, 0.0, 0.0)) -> np.ndarray:
    """A 4×4 rotation (degrees about x, y, z) and translation (mm)."""
    out = np.eye(4)
    for axis, deg in ((0, rx), (1, ry), (2, rz)):
        c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
        i, j = [(1, 2), (0, 2), (0, 1)][axis]
        r = np.eye(4)
        r[i, i] = r[j, j] = c
        r[i, j], r[j, i] = -s, s
        out = r @ out
    out[:3, 3] = t
    return out


def smooth_warp(amplitude_mm: float = 3.0, scale_mm: float = 30.0):
    """A smooth, invertible displacement (a callable on RAS points) of at most ``amplitude_mm``."""

    def displace(points: np.ndarray) -> np.ndarray:
        x, y, z = (points / scale_mm).T
        d = np.stack([np.sin(y) * np.cos(z), np.sin(z) * np.cos(x), np.sin(x) * np.cos(y)], axis=1)
        return points + amplitude_mm * 0.6 * d

    return displace
