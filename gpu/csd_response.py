"""Response functions for spherical deconvolution: shells, single-fibre and tissue voxels.

A response is the signal of one tissue "particle" aligned with z, stored as MRtrix stores it
(``dwi2response``, the response file): one row per shell, the zonal SH coefficients
r_l (l = 0, 2, ..) of the signal as a function of the angle to the fibre, in signal units.
Isotropic tissues (grey matter, CSF) have only r_0.

* Single-fibre voxels (Tournier et al. 2007; DIPY ``auto_response_ssst``, MRtrix
  ``dwi2response fa``): FA ≥ ``fa_threshold``; when fewer than ``min_voxels`` pass, the
  ``fallback_voxels`` of highest FA. Each voxel's gradients are expressed relative to its
  tensor's main direction and one zonal series per shell is fitted by least squares over
  all selected voxels (MRtrix ``amp2response`` without its monotonicity constraint).
* Tissue voxels for MSMT (Jeurissen et al. 2014; DIPY ``mask_for_response_msmt`` /
  ``response_from_mask_msmt``): WM by FA, GM and CSF by low FA and their mean diffusivity;
  isotropic responses are the mean signal of each shell.

Host NumPy code: a few thousand voxels, computed once per fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sh import Y00, zonal_basis

#: b-values closer than this to a shell's first member belong to the shell (s/mm²), as
#: MRtrix's default ``BValueEpsilon`` (80) and DIPY's ``unique_bvals_tolerance`` (20) do.
SHELL_TOLERANCE = 80.0


@dataclass(frozen=True)
class Shells:
    """The shells of an acquisition: their b-values and each volume's shell.

    bvalues : (S,) mean b-value of each shell, ascending; shell 0 is b=0 when present.
    of_volume : (K,) shell index of every volume.
    has_b0 : whether shell 0 holds the non-diffusion-weighted volumes.
    """

    bvalues: np.ndarray
    of_volume: np.ndarray
    has_b0: bool

    @property
    def count(self) -> int:
        return len(self.bvalues)

    def volumes(self, shell: int) -> np.ndarray:
        return np.flatnonzero(self.of_volume == shell)

    @property
    def weighted(self) -> list[int]:
        """The diffusion-weighted shells (b > 0)."""
        return [s for s in range(self.count) if not (self.has_b0 and s == 0)]


def find_shells(bvals: np.ndarray, b0_threshold: float, tolerance: float = SHELL_TOLERANCE) -> Shells:
    """Group b-values into shells (b ≤ ``b0_threshold`` is the b=0 shell)."""
    bvals = np.asarray(bvals, dtype=np.float64)
    of_volume = np.full(bvals.shape, -1)
    starts: list[float] = []
    order = np.argsort(bvals, kind="stable")
    b0 = bvals <= b0_threshold
    groups: list[list[int]] = [list(np.flatnonzero(b0))] if b0.any() else []
    for k in order:
        if b0[k]:
            continue
        if not starts or bvals[k] - starts[-1] > tolerance:
            starts.append(bvals[k])
            groups.append([])
        groups[-1].append(int(k))
    means = []
    for s, members in enumerate(groups):
        of_volume[members] = s
        means.append(float(bvals[members].mean()) if not (b0.any() and s == 0) else 0.0)
    return Shells(np.array(means), of_volume, bool(b0.any()))


@dataclass
class Response:
    """One tissue's response: ``zonal[s]`` the zonal coefficients of shell ``bvalues[s]``."""

    tissue: str
    bvalues: np.ndarray
    zonal: np.ndarray  # (S, lmax/2 + 1)
    voxels: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def lmax(self) -> int:
        return 2 * (self.zonal.shape[1] - 1)

    def row_for(self, bvalue: float, tolerance: float = SHELL_TOLERANCE) -> np.ndarray:
        """The zonal row of the shell nearest ``bvalue`` (ValueError when none is within tolerance)."""
        distance = np.abs(self.bvalues - bvalue)
        best = int(np.argmin(distance))
        if distance[best] > tolerance:
            shells = ", ".join(f"{b:g}" for b in self.bvalues)
            raise ValueError(f"the {self.tissue} response has no shell at b={bvalue:g} (it has b={shells})")
        return self.zonal[best]


def select_single_fibre(
    fa: np.ndarray, fa_threshold: float = 0.7, min_voxels: int = 20, fallback_voxels: int = 300
) -> tuple[np.ndarray, str]:
    """Indices of single-fibre voxels among ``fa`` (N,), and how they were chosen."""
    fa = np.nan_to_num(np.asarray(fa, dtype=np.float64), nan=0.0)
    chosen = np.flatnonzero(fa >= fa_threshold)
    if chosen.size >= min_voxels:
        return chosen, f"{chosen.size} voxels with FA ≥ {fa_threshold:g}"
    count = min(fallback_voxels, int(np.count_nonzero(fa > 0)))
    chosen = np.argsort(-fa, kind="stable")[:count]
    lowest = float(fa[chosen].min()) if count else 0.0
    return chosen, (
        f"only {np.count_nonzero(fa >= fa_threshold)} voxels with FA ≥ {fa_threshold:g}: "
        f"the {count} of highest FA (≥ {lowest:.2f}) were used"
    )


def tissue_masks(
    fa: np.ndarray,
    md: np.ndarray,
    *,
    wm_fa: float = 0.7,
    gm_fa: float = 0.2,
    gm_md: float = 0.0011,
    csf_fa: float = 0.1,
    csf_md: float = 0.0025,
) -> dict[str, np.ndarray]:
    """Boolean (N,) masks of white matter (FA > ``wm_fa``), grey matter (FA < ``gm_fa``,
    0 < MD < ``gm_md``) and CSF (FA < ``csf_fa``, MD > ``csf_md``); MD in mm²/s."""
    fa = np.nan_to_num(np.asarray(fa, dtype=np.float64), nan=0.0)
    md = np.nan_to_num(np.asarray(md, dtype=np.float64), nan=0.0)
    return {
        "wm": fa > wm_fa,
        "gm": (fa < gm_fa) & (fa > 0) & (md > 0) & (md < gm_md),
        "csf": (fa < csf_fa) & (fa > 0) & (md > csf_md),
    }


def anisotropic_response(
    signal: np.ndarray, bvecs: np.ndarray, directions: np.ndarray, shells: Shells, lmax: int, tissue: str = "wm"
) -> Response:
    """Zonal response of single-fibre voxels: ``signal`` (n, K), their fibre ``directions``
    (n, 3) in the frame of ``bvecs`` (K, 3); ``lmax`` for the weighted shells, 0 at b=0."""
    signal = np.asarray(signal, dtype=np.float64)
    if signal.shape[0] == 0:
        raise ValueError(f"no {tissue} voxels to estimate the {tissue} response from")
    directions = np.asarray(directions, dtype=np.float64)
    directions = directions / np.maximum(np.linalg.norm(directions, axis=1, keepdims=True), 1e-12)
    zonal = np.zeros((shells.count, lmax // 2 + 1))
    for s in range(shells.count):
        volumes = shells.volumes(s)
        values = signal[:, volumes]
        if shells.has_b0 and s == 0:
            zonal[s, 0] = np.nanmean(values) / Y00
            continue
        g = np.asarray(bvecs, dtype=np.float64)[volumes]
        cosines = np.abs(directions @ g.T)  # (n, k): the angle to the fibre, antipodally symmetric
        order = min(lmax, _max_order(len(volumes)))
        basis = zonal_basis(cosines.ravel(), order)
        finite = np.isfinite(values.ravel())
        zonal[s, : order // 2 + 1] = np.linalg.lstsq(basis[finite], values.ravel()[finite], rcond=None)[0]
    return Response(tissue, shells.bvalues.copy(), zonal, voxels=int(signal.shape[0]))


def _max_order(directions: int) -> int:
    """Highest even order a zonal fit over ``directions`` per voxel supports (many voxels help)."""
    return 8 if directions >= 6 else 2 * max(0, (directions - 1) // 2)


def isotropic_response(signal: np.ndarray, shells: Shells, lmax: int, tissue: str) -> Response:
    """Response of an isotropic tissue: the mean signal of each shell as r_0 = mean / Y_00."""
    signal = np.asarray(signal, dtype=np.float64)
    if signal.shape[0] == 0:
        raise ValueError(f"no {tissue} voxels to estimate the {tissue} response from")
    zonal = np.zeros((shells.count, lmax // 2 + 1))
    for s in range(shells.count):
        zonal[s, 0] = np.nanmean(signal[:, shells.volumes(s)]) / Y00
    return Response(tissue, shells.bvalues.copy(), zonal, voxels=int(signal.shape[0]))


def response_rows(response: Response, shells: Shells, lmax: int) -> np.ndarray:
    """(S, lmax/2+1) zonal rows of ``response`` for each shell of the data, zero-padded."""
    rows = np.zeros((shells.count, lmax // 2 + 1))
    for s, bvalue in enumerate(shells.bvalues):
        row = response.row_for(bvalue)
        k = min(len(row), rows.shape[1])
        rows[s, :k] = row[:k]
    return rows


def simulate_response_signal(zonal: np.ndarray, cos_angle: np.ndarray) -> np.ndarray:
    """A response's signal at angles with cos = ``cos_angle`` to the fibre (for tests and checks)."""
    zonal = np.asarray(zonal, dtype=np.float64)
    return zonal_basis(cos_angle, 2 * (len(zonal) - 1)) @ zonal
