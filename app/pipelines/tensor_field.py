"""The tensor field the tracking pipelines read (FA, fitted voxels) and what a tracking run returns.

Shared by the deterministic (:mod:`.track`), geodesic (:mod:`.track_geodesic`) and two-point
(:mod:`.track_two_point`) pipelines, which otherwise do not import each other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tractlens.gpu import sym3

from ..errors import InputError
from ..model import Tractogram, Volume
from ..regions import Regions


@dataclass
class TensorField:
    """A tensor field in voxel axes (order xx, xy, xz, yy, yz, zz) on a grid, with its FA and
    the voxels where it was fitted (``mask``)."""

    tensor: np.ndarray  # (X, Y, Z, 6) float32
    affine: np.ndarray
    fa: np.ndarray
    mask: np.ndarray
    source: str
    notes: list[str] = field(default_factory=list)
    not_positive_definite: int = 0  # fitted voxels whose smallest eigenvalue is ≤ 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.tensor.shape[:3])

    @property
    def voxel_size(self) -> np.ndarray:
        return np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0))

    @property
    def volume(self) -> Volume:
        return Volume("tensor", self.tensor, self.affine, kind="tensor", source=self.source)

    @classmethod
    def from_tensor(cls, tensor: np.ndarray, affine: np.ndarray, source: str = "", notes=None) -> TensorField:
        # C order whatever the file's (a tensor file is read in Fortran order, and reordered only
        # when its affine's handedness flips a component): the GPU then runs the same kernels
        # on every subject, which the shipped kernels and the rehearsal prepare
        tensor = np.ascontiguousarray(tensor, dtype=np.float32)
        finite = np.isfinite(tensor).all(axis=-1)
        clean = np.where(finite[..., None], tensor, 0.0)
        fa = np.clip(sym3.fractional_anisotropy_from_invariants(np, clean.astype(np.float64)), 0, 1)
        mask = finite & (np.abs(clean).sum(axis=-1) > 0)
        notes = list(notes or [])
        if (~finite).any():
            notes.append(f"{int((~finite).sum())} voxels have NaN or infinite tensors: treated as background")
        evals = np.linalg.eigvalsh(_matrices(clean[mask]))
        not_pd = int((evals[:, 0] <= 0).sum())
        if not_pd:
            notes.append(f"{not_pd} voxels have tensors that are not positive definite")
        return cls(tensor, np.asarray(affine, dtype=np.float64), fa.astype(np.float32), mask, source, notes, not_pd)


def _matrices(tensor: np.ndarray) -> np.ndarray:
    a, b, c, d, e, f = (tensor[:, i].astype(np.float64) for i in range(6))
    return np.stack([np.stack([a, b, c], -1), np.stack([b, d, e], -1), np.stack([c, e, f], -1)], -2)


@dataclass
class TrackResult:
    tractogram: Tractogram | None  # None when the streamlines went to a sink
    provenance: dict
    notes: list[str]

    def summary(self) -> dict:
        return {**self.provenance, "notes": self.notes}


def require_seed(regions: Regions) -> None:
    """Refuse regions without a seed on the tensor grid (the tracking use cases seed from it)."""
    if regions.seed is None:
        raise InputError(
            "no seed ROI lies on the tensor grid" + (": " + " ".join(regions.notes) if regions.notes else ""),
            fix="Paint or open a seed ROI inside the image",
        )
