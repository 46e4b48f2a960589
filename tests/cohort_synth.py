"""A tiny BIDS cohort made from the MNI152 template: each subject's b=0 is the template sampled
every ``step`` mm (so that registration to ``mni`` finds it; the head lifted above the background), its diffusion signal that of one
tensor everywhere in the head, D = diag(λ1, λ2, λ2) with λ1 per subject (its FA known by hand)."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np

LAMBDA_2 = 0.4e-3  # mm²/s
B_VALUE = 1000.0


def fractional_anisotropy(l1: float, l2: float = LAMBDA_2) -> float:
    """FA of diag(l1, l2, l2): √½ · √((l1-l2)² + (l1-l2)²) / √(l1² + 2 l2²)."""
    return float(np.sqrt(0.5) * np.sqrt(2 * (l1 - l2) ** 2) / np.sqrt(l1**2 + 2 * l2**2))


def gradient_table() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    extra = rng.normal(size=(9, 3))
    directions = np.concatenate([np.eye(3), np.array([[1, 1, 0], [1, 0, 1], [0, 1, 1]]) / np.sqrt(2), extra])
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    bvecs = np.concatenate([np.zeros((2, 3)), directions])
    bvals = np.concatenate([[0.0, 0.0], np.full(len(directions), B_VALUE)])
    return bvals, bvecs


def subject_dwi(l1: float, step: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(DWI (X, Y, Z, N) float32, affine) of one subject."""
    from tractlens.app.atlases import load_template

    template, affine = load_template("mni")
    b0 = np.asarray(template[::step, ::step, ::step], np.float32)
    # the head lifted well above the background, so that fit-dti's brain mask keeps all of it
    # (the ventricles too); the template's contrast stays for the registration
    from scipy.ndimage import binary_fill_holes

    head = binary_fill_holes(b0 > 0.05 * b0.max())
    b0 = np.where(head, b0 + b0.max(), 0.0).astype(np.float32)
    grid_affine = affine.copy()
    grid_affine[:3, :3] = affine[:3, :3] * step
    bvals, bvecs = gradient_table()
    # the tensor in RAS; the FSL bvecs of a grid with a negative x voxel axis flip x (as dtifit reads them)
    tensor = np.diag([l1, LAMBDA_2, LAMBDA_2])
    decay = np.exp(-bvals * np.einsum("ni,ij,nj->n", bvecs, tensor, bvecs))
    return (b0[..., None] * decay[None, None, None, :]).astype(np.float32), grid_affine


def make_cohort(root: Path, lambdas: dict[str, float], step: int = 6) -> Path:
    """BIDS dataset ``root`` with one DWI per subject (``{"01": λ1, ...}``)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(json.dumps({"Name": "mni-cohort", "BIDSVersion": "1.9.0"}))
    bvals, bvecs = gradient_table()
    for subject, l1 in lambdas.items():
        folder = root / f"sub-{subject}" / "dwi"
        folder.mkdir(parents=True, exist_ok=True)
        data, affine = subject_dwi(l1, step)
        nib.save(nib.Nifti1Image(data, affine), folder / f"sub-{subject}_dwi.nii.gz")
        np.savetxt(folder / f"sub-{subject}_dwi.bval", bvals[None], fmt="%g")
        np.savetxt(folder / f"sub-{subject}_dwi.bvec", bvecs.T, fmt="%.6f")
    return root


def callosal_streamlines(affine: np.ndarray, n: int = 10, seed: int = 0) -> list[np.ndarray]:
    """Streamlines left → right through the middle of the brain (RAS x -30..30 mm, around
    y = -15, z = 20), in voxel coordinates of ``affine``."""
    rng = np.random.default_rng(seed)
    inverse = np.linalg.inv(affine)
    lines = []
    for _ in range(n):
        x = np.linspace(-30, 30, 25)
        mm = np.stack([x, np.full(25, -15 + rng.uniform(-4, 4)), np.full(25, 20 + rng.uniform(-4, 4))], axis=1)
        lines.append(mm @ inverse[:3, :3].T + inverse[:3, 3])
    return lines
