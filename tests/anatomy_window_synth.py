"""Small synthetic anatomy for the anatomy tests: a 2 mm "b0" image and a 1 mm "T1" of the same
head moved by a known shift, with another contrast, so that a registration finishes in seconds
on the CPU and its answer is known."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

B0_SHAPE = (24, 24, 24)
B0_VOXEL = 2.0
T1_SHAPE = (40, 40, 40)
T1_VOXEL = 1.0
SHIFT_MM = np.array([3.0, -2.0, 1.5])  # where the head lies in the T1's scanner space, minus where it is in the b0's


def _smooth_inside(points: np.ndarray, centre, radii, sharpness: float = 6.0) -> np.ndarray:
    r = np.sqrt((((points - np.asarray(centre)) / np.asarray(radii)) ** 2).sum(-1))
    return 1.0 / (1.0 + np.exp((r - 1.0) * sharpness))


def head(points_mm: np.ndarray) -> np.ndarray:
    """Tissue classes at RAS points: a brain (1), two unequal ventricles (0.15) and a bright
    nucleus off the midline (1.8), with smooth edges; no symmetry a registration could flip."""
    brain = _smooth_inside(points_mm, (0, 0, 0), (17, 19, 15))
    ventricle_l = _smooth_inside(points_mm, (-5, 3, 3), (3, 7, 4))
    ventricle_r = _smooth_inside(points_mm, (6, 1, 2), (2.5, 5, 3))
    nucleus = _smooth_inside(points_mm, (8, -9, -5), (4, 4, 4))
    return brain * (1 - 0.85 * np.maximum(ventricle_l, ventricle_r)) + 0.8 * nucleus


def grid_points(affine: np.ndarray, shape) -> np.ndarray:
    ijk = np.stack(np.meshgrid(*[np.arange(n) for n in shape], indexing="ij"), -1).astype(float)
    return ijk @ affine[:3, :3].T + affine[:3, 3]


def b0_affine() -> np.ndarray:
    affine = np.diag([B0_VOXEL, B0_VOXEL, B0_VOXEL, 1.0])
    affine[:3, 3] = -B0_VOXEL * (np.array(B0_SHAPE) - 1) / 2
    return affine


def t1_affine() -> np.ndarray:
    affine = np.diag([T1_VOXEL, T1_VOXEL, T1_VOXEL, 1.0])
    affine[:3, 3] = -T1_VOXEL * (np.array(T1_SHAPE) - 1) / 2 + np.array([0.4, -0.3, 0.2])  # off the b0's centres
    return affine


def write_pair(folder: Path, shift_mm=SHIFT_MM) -> tuple[Path, Path]:
    """``dwi_b0.nii.gz`` (float, 2 mm, b0-like contrast: bright ventricles) and ``T1w.nii.gz``
    (int16, 1 mm, T1-like contrast: dark ventricles) whose head lies ``shift_mm`` off."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    b0_points = grid_points(b0_affine(), B0_SHAPE)
    tissue = head(b0_points)
    ventricles = _smooth_inside(b0_points, (-5, 3, 3), (3, 7, 4)) + _smooth_inside(b0_points, (6, 1, 2), (2.5, 5, 3))
    b0 = 400 * tissue + 900 * np.clip(ventricles, 0, 1) * (tissue > 0.05) + rng.normal(0, 5, B0_SHAPE)
    t1_points = grid_points(t1_affine(), T1_SHAPE) - np.asarray(shift_mm)
    t1 = 1000 * head(t1_points) + rng.normal(0, 8, T1_SHAPE)
    b0_path, t1_path = folder / "dwi_b0.nii.gz", folder / "T1w.nii.gz"
    nib.save(nib.Nifti1Image(np.clip(b0, 0, None).astype(np.float32), b0_affine()), b0_path)
    nib.save(nib.Nifti1Image(np.clip(t1, 0, None).astype(np.int16), t1_affine()), t1_path)
    return b0_path, t1_path
