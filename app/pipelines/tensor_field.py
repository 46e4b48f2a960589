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
        all_finite = bool(finite.all())
        clean = tensor if all_finite else np.where(finite[..., None], tensor, np.float32(0))
        mask = (clean != 0).any(axis=-1)  # finite & nonzero (clean is 0 where not finite)
        fitted = clean[mask].astype(np.float64)  # (n, 6): FA and the check below need only these
        fa = np.zeros(mask.shape, np.float32)
        fa[mask] = np.clip(sym3.fractional_anisotropy_from_invariants(np, fitted), 0, 1)
        notes = list(notes or [])
        if not all_finite:
            notes.append(f"{int((~finite).sum())} voxels have NaN or infinite tensors: treated as background")
        not_pd = count_not_positive_definite(fitted)
        if not_pd:
            notes.append(f"{not_pd} voxels have tensors that are not positive definite")
        return cls(tensor, np.asarray(affine, dtype=np.float64), fa, mask, source, notes, not_pd)


#: The determinant's least share of its scale (the largest component, cubed) for Sylvester's
#: test alone to call a tensor positive definite; float64's rounding of the determinant of
#: float32 components is below 1e-14 of it, so these are positive definite beyond doubt.
SURE_DETERMINANT = 1e-9


def count_not_positive_definite(tensors: np.ndarray) -> int:
    """How many of the (n, 6) tensors (xx, xy, xz, yy, yz, zz) have a smallest eigenvalue ≤ 0, as
    ``numpy.linalg.eigvalsh`` finds it, without decomposing every tensor.

    Sylvester's criterion settles most voxels: xx > 0 and xx·yy − xy² > 0 have exact signs in
    float64 (products of float32 values are exact there), and a determinant above
    :data:`SURE_DETERMINANT` of the largest component cubed leaves the smallest eigenvalue at
    least ~1e-10 of the scale, far above ``eigvalsh``'s error. Only the others (the tensors not
    positive definite and those near the edge) are decomposed, so the count is ``eigvalsh``'s."""
    t = np.asarray(tensors, dtype=np.float64)
    if not len(t):
        return 0
    a, b, _, d, _, _ = sym3.components(t)
    minor2 = a * d - b * b
    det = sym3.determinant(t)
    scale = np.abs(t).max(axis=1)
    sure = (a > 0) & (minor2 > 0) & (det > SURE_DETERMINANT * scale**3)
    rest = t[~sure]
    if not len(rest):
        return 0
    return int((np.linalg.eigvalsh(sym3.to_matrix(np, rest))[:, 0] <= 0).sum())


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
