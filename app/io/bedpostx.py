"""FSL bedpostX output folders (read), for probabilistic tracking.

A folder holds, per fibre population i = 1, 2, ...: ``merged_th{i}samples``,
``merged_ph{i}samples`` and ``merged_f{i}samples`` (4-D, last axis the posterior
samples) and ``nodif_brain_mask``. Directions (sinθcosφ, sinθsinφ, cosθ) are in
FSL's voxel frame, like bvecs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError
from .nifti import load_image, read_array


@dataclass
class BedpostSamples:
    """Posterior samples: theta, phi, f are (X, Y, Z, n_fibres, n_samples) float32."""

    theta: np.ndarray
    phi: np.ndarray
    f: np.ndarray
    mask: np.ndarray
    affine: np.ndarray
    path: str = ""

    @property
    def n_fibres(self) -> int:
        return int(self.theta.shape[3])

    @property
    def n_samples(self) -> int:
        return int(self.theta.shape[4])


def _find(folder: Path, stem: str) -> Path | None:
    for suffix in (".nii.gz", ".nii"):
        candidate = folder / f"{stem}{suffix}"
        if candidate.exists():
            return candidate
    return None


def load_bedpostx(folder: str | os.PathLike) -> BedpostSamples:
    """Read a bedpostX output folder; raise :class:`InputError` naming what is missing or inconsistent."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("not a folder", path=folder, fix="Give the bedpostX output folder (e.g. subject.bedpostX)")
    mask_path = _find(folder, "nodif_brain_mask")
    if mask_path is None:
        raise InputError("no nodif_brain_mask in this folder: not a bedpostX output", path=folder)
    mask_img = load_image(mask_path, "bedpostX mask")
    mask = np.asanyarray(mask_img.dataobj) != 0
    if mask.ndim != 3:
        raise InputError("nodif_brain_mask must be 3-D", path=mask_path)
    thetas, phis, fs = [], [], []
    fibre = 1
    while _find(folder, f"merged_th{fibre}samples") is not None:
        parts = []
        for name in ("th", "ph", "f"):
            path = _find(folder, f"merged_{name}{fibre}samples")
            if path is None:
                raise InputError(f"merged_{name}{fibre}samples is missing", path=folder)
            img = load_image(path, "bedpostX samples")
            data = read_array(img, path)
            if data.ndim == 3:
                data = data[..., None]
            if data.shape[:3] != mask.shape:
                raise InputError(f"samples have grid {data.shape[:3]} but the mask has {mask.shape}", path=path)
            if not np.allclose(img.affine, mask_img.affine, atol=1e-3):
                raise InputError("samples and nodif_brain_mask are on different grids (affines differ)", path=path)
            parts.append(np.nan_to_num(data, nan=0.0, posinf=0.0, neginf=0.0))
        if len({p.shape for p in parts}) != 1:
            raise InputError(f"theta, phi and f samples of fibre {fibre} differ in shape", path=folder)
        thetas.append(parts[0])
        phis.append(parts[1])
        fs.append(parts[2])
        fibre += 1
    if not thetas:
        raise InputError("no merged_th1samples in this folder: not a bedpostX output", path=folder)
    if len({t.shape for t in thetas}) != 1:
        raise InputError("fibre populations have different numbers of samples", path=folder)
    return BedpostSamples(
        theta=np.stack(thetas, axis=3),
        phi=np.stack(phis, axis=3),
        f=np.stack(fs, axis=3),
        mask=mask,
        affine=mask_img.affine.copy(),
        path=str(folder),
    )
