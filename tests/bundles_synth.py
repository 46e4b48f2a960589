"""A small ``tractlens bundles`` output folder written by hand, with exactly the layout of the
bundles interface (bundles.json, NAME.trx, NAME_density.nii.gz), so that tractometry is tested
without bundle tracking. Streamlines are given in voxel coordinates of ``affine``."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np

from tractlens.app.io import save_tractogram
from tractlens.app.tractogram import Tractogram

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])
SHAPE = (40, 16, 12)


def straight_bundle(rng, n: int = 12, x=(5.0, 30.0), centre=(8.0, 6.0), spread: float = 1.5, reverse=()):
    """Streamlines along +x with unevenly spaced points, around ``centre`` (y, z) in voxels;
    those whose index is in ``reverse`` run the other way."""
    lines = []
    for s in range(n):
        count = int(rng.integers(12, 40))
        t = np.sort(rng.uniform(0, 1, count))
        t[0], t[-1] = 0.0, 1.0
        y, z = centre[0] + rng.uniform(-spread, spread), centre[1] + rng.uniform(-spread, spread)
        line = np.stack([x[0] + (x[1] - x[0]) * t, np.full(count, y), np.full(count, z)], axis=1)
        lines.append(line[::-1] if s in reverse else line)
    return lines


def write_bundles_folder(folder: Path, bundles: dict, *, affine=AFFINE, shape=SHAPE, statuses=None) -> Path:
    """``bundles``: name → list of streamlines (voxel coordinates), [] for a bundle without any
    (status empty), or None for one whose regions missed (no file). ``statuses`` overrides."""
    folder.mkdir(parents=True, exist_ok=True)
    listed = {}
    for name, lines in bundles.items():
        status = "regions-missed" if lines is None else ("ok" if lines else "empty")
        status = (statuses or {}).get(name, status)
        entry = {"file": None, "density": None, "streamlines": 0, "waytotal": 0, "volume_mm3": 0.0,
                 "status": status, "message": "" if status == "ok" else f"{name}: {status} (synthetic)",
                 "protocol": {"source": "synthetic", "citation": "none", "regions": {}}}  # fmt: skip
        if lines is not None:
            tract = Tractogram.from_list(lines, affine=affine, dimensions=shape) if lines else Tractogram(
                np.zeros((0, 3), np.float32), np.zeros(1, np.int64), affine=affine, dimensions=shape)  # fmt: skip
            save_tractogram(tract, folder / f"{name}.trx")
            density = np.zeros(shape, np.float32)
            nib.save(nib.Nifti1Image(density, affine), folder / f"{name}_density.nii.gz")
            entry.update(file=f"{name}.trx", density=f"{name}_density.nii.gz", streamlines=len(lines),
                         waytotal=len(lines))  # fmt: skip
        listed[name] = entry
    manifest = {"format": "tractlens-bundles", "version": 1, "engine": "deterministic", "device": "cpu",
                "seed_rng": 0, "registration": "synthetic", "reference": None, "protocols_version": "synthetic",
                "bundles": listed}  # fmt: skip
    (folder / "bundles.json").write_text(json.dumps(manifest, indent=1))
    return folder


def save_map(path: Path, data, affine=AFFINE) -> Path:
    nib.save(nib.Nifti1Image(np.asarray(data, np.float32), affine), path)
    return path


def linear_in_x(shape=SHAPE, affine=AFFINE, a: float = 0.2, b: float = 0.01) -> np.ndarray:
    """A map equal to ``a + b * x_mm`` (RAS x of each voxel centre): linear, so trilinear
    sampling on any grid gives it exactly."""
    x_mm = affine[0, 0] * np.arange(shape[0]) + affine[0, 3]
    return np.broadcast_to((a + b * x_mm)[:, None, None], shape).astype(np.float32)
