"""COMMIT: Convex Optimization Modeling for Microstructure Informed Tractography
(Daducci et al. 2015, IEEE TMI 34(1): the linear model y = A x, x ≥ 0, solved as a
non-negative least-squares problem).

The measured signal of every voxel in a mask, normalised by the voxel's mean b=0
signal, is modelled as ``y = A x`` with ``x ≥ 0`` and three groups of columns:

- IC, one column per streamline: each of its segments in voxel v, of length ℓ mm and
  orientation o, adds ``ℓ · LUT_IC[o, :]`` to voxel v's measurements (the
  intra-axonal response rotated to o);
- EC, one column per (voxel, orientation) compartment: ``LUT_EC[o, :]`` in its voxel;
- ISO, one column per voxel and isotropic response: ``LUT_ISO[j, :]`` in its voxel.

Responses are pre-rotated into look-up tables over a discretised half sphere, as in
COMMIT: azimuth φ and polar angle θ in whole degrees, 0..180 each (181² = 32 761
orientations); a direction maps to the nearest after flipping it into φ ∈ [0°, 180°].
Models (diffusivities in mm²/s):

- ``stick-zeppelin-ball`` (COMMIT 2's defaults): IC a stick (d_par = 1.7e-3), EC a
  zeppelin (d_par, d_perp = 0.51e-3), ISO balls (d_iso = 1.7e-3 and 3.0e-3).
- ``cylinder-zeppelin-ball`` (the cylinder model of Daducci et al. 2015): IC one response per axon radius
  (default 1, 2, 4 and 8 µm), each a cylinder: free diffusion d_par along the axis times
  the restricted signal across it (Van Gelderen et al. 1994, the pulsed-gradient
  spin-echo series; needs the pulse duration δ and separation Δ, which NIfTI/FSL files do
  not carry); EC and ISO as above. A streamline then has one column per radius, and its
  weight is their sum (as COMMIT's ``stat_coeffs='sum'``).

The cylinder series is sometimes printed with Y(x) = exp(+dβ²x); the exponent is
negative (Van Gelderen et al. 1994), or the series diverges.

Streamlines become segments (:func:`gpu.commit_segments.segments`): every polyline segment is split exactly
where it crosses a voxel boundary, pieces outside the mask are dropped, and pieces of
one streamline in one voxel with one orientation are merged (summed lengths).

The fit minimises ``½‖Ax − y‖² + λ‖x_IC‖₁`` over ``x ≥ 0`` with FISTA on unit-norm
columns (step 1/L, L from a power iteration), stopping when the objective changes by
less than ``tol`` relatively. A streamline with weight 0 does not contribute and is
filtered out.

The operator is applied with segments sorted by voxel (A·x: one row block per voxel,
no atomics) and the per-segment dot products summed per streamline through a
streamline-sorted permutation (Aᵀ·y), in float64.

This module holds the parameters and the forward models (the look-up tables); the method's
other parts each have their own: :mod:`gpu.commit_segments` (streamlines to segments),
:mod:`gpu.commit_operator` (the problem and the NumPy reference of A and Aᵀ),
:mod:`gpu.commit_device` (A and Aᵀ as CUDA kernels), :mod:`gpu.commit_sparse` (A as a CPU
sparse matrix) and :mod:`gpu.commit_solver` (FISTA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .params import meta

N_AZIMUTH = N_POLAR = 181
N_ORIENTATIONS = N_AZIMUTH * N_POLAR
MODELS = ("stick-zeppelin-ball", "cylinder-zeppelin-ball")
GAMMA = 2.6751525e8  # proton gyromagnetic ratio, rad s⁻¹ T⁻¹


@dataclass(frozen=True)
class CommitParams:
    """The model and the fit's settings (COMMIT 2's defaults)."""

    model: str = field(
        default="stick-zeppelin-ball", metadata=meta("Model", "the forward model's compartments", choices=MODELS)
    )
    d_par: float = field(default=1.7e-3, metadata=meta("d∥", "axial diffusivity of stick and zeppelin", "mm²/s"))
    d_perp: float = field(default=0.51e-3, metadata=meta("d⊥", "radial diffusivity of the zeppelin", "mm²/s"))
    d_iso: tuple[float, ...] = field(default=(1.7e-3, 3.0e-3), metadata=meta("d iso", "ball diffusivities", "mm²/s"))
    lambda_: float = field(default=0.0, metadata=meta("λ", "ℓ1 weight on the streamline weights", "", (0.0, 1e6)))
    max_iter: int = field(default=1000, metadata=meta("Iterations", "FISTA iterations at most", "", (1, 10**6)))
    tol: float = field(default=1e-3, metadata=meta("Tolerance", "stop when the objective changes less", "", (0.0, 0.5)))
    min_segment_mm: float = field(default=1e-3, metadata=meta("Shortest segment", "shorter pieces are dropped", "mm"))
    ec_orientations: int = field(
        default=0,
        metadata=meta(
            "EC orientations",
            "extra-cellular compartments per voxel without a peaks file: 0 (default) one per distinct "
            "orientation of the segments (~20 a voxel whole-brain); k > 0: the voxel's k main orientations "
            "among its segments (the most segment length, at least 25° apart, at least 0.1 of the largest), "
            "as dmri-commit's peaks give: less memory (about 1.2 GB less at 1 M streamlines), other weights",
            "",
            (0, 64),
        ),
    )
    radii_um: tuple[float, ...] = field(
        default=(1.0, 2.0, 4.0, 8.0),
        metadata=meta(
            "Axon radii",
            "one cylinder response per radius",
            "µm",
        ),
    )
    small_delta_ms: float | None = field(
        default=None,
        metadata=meta(
            "δ",
            "gradient pulse duration (cylinder model)",
            "ms",
            (0.0, 1000.0),
        ),
    )
    big_delta_ms: float | None = field(
        default=None,
        metadata=meta(
            "Δ",
            "gradient pulse separation (cylinder model)",
            "ms",
            (0.0, 1000.0),
        ),
    )

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}: one of {', '.join(MODELS)}")
        if self.model == "cylinder-zeppelin-ball":
            if self.small_delta_ms is None or self.big_delta_ms is None:
                raise ValueError(
                    "the cylinder-zeppelin-ball model needs the gradient timing: the pulse duration δ and "
                    "separation Δ in ms (--small-delta, --big-delta; e.g. HCP: 10.6 and 43.1)"
                )
            if not 0 < self.small_delta_ms <= self.big_delta_ms:
                raise ValueError(f"need 0 < δ ≤ Δ, got δ = {self.small_delta_ms} ms, Δ = {self.big_delta_ms} ms")
            if not self.radii_um or min(self.radii_um) <= 0:
                raise ValueError("axon radii must be positive (µm)")
        if not (self.d_par > 0 and self.d_perp >= 0 and all(d >= 0 for d in self.d_iso)):
            raise ValueError("diffusivities must be positive (mm²/s, e.g. 1.7e-3)")
        if self.d_par > 0.1:
            raise ValueError(f"d_par = {self.d_par} is not in mm²/s (expected about 1.7e-3)")
        if self.ec_orientations < 0:
            raise ValueError("ec_orientations must be >= 0 (0: every distinct orientation of the segments)")
        if self.lambda_ < 0 or self.max_iter < 1 or not 0 <= self.tol < 1:
            raise ValueError("lambda must be >= 0, max_iter >= 1 and 0 <= tol < 1")

    @property
    def n_ic(self) -> int:
        """IC responses (columns) per streamline."""
        return len(self.radii_um) if self.model == "cylinder-zeppelin-ball" else 1


# ------------------------------------------------------------------ orientations and tables
def orientation_directions() -> np.ndarray:
    """(32761, 3) unit vectors of the look-up tables' orientations, index φ · 181 + θ (degrees)."""
    phi = np.deg2rad(np.arange(N_AZIMUTH))[:, None]
    theta = np.deg2rad(np.arange(N_POLAR))[None, :]
    d = np.stack(
        [
            np.sin(theta) * np.cos(phi),
            np.sin(theta) * np.sin(phi),
            np.broadcast_to(np.cos(theta), (N_AZIMUTH, N_POLAR)),
        ],
        -1,
    )
    return d.reshape(-1, 3)


def orientation_index(directions, xp=np):
    """Look-up table index of each (non-zero) direction (N, 3), sign ignored (``xp``: the
    array module of ``directions``)."""
    d = xp.asarray(directions, dtype=xp.float64)
    d = d / xp.sqrt((d**2).sum(-1, keepdims=True))
    phi = xp.degrees(xp.arctan2(d[:, 1], d[:, 0]))
    theta = xp.degrees(xp.arccos(xp.clip(d[:, 2], -1.0, 1.0)))
    flip = phi < 0  # the opposite direction: φ + 180°, 180° − θ
    phi = xp.where(flip, phi + 180.0, phi)
    theta = xp.where(flip, 180.0 - theta, theta)
    return (xp.rint(phi).astype(xp.int64) * N_POLAR + xp.rint(theta).astype(xp.int64)).astype(xp.int32)


def cylinder_perpendicular_log(b, radius_m: float, d: float, small_delta: float, big_delta: float, terms: int = 60):
    """ln of the signal across a cylinder of radius ``radius_m`` (m) per unit of sin²(angle to
    the axis), for b-values ``b`` (s/mm²), intra-axonal diffusivity ``d`` (mm²/s) and pulse
    duration / separation (s): Van Gelderen's series, ``ln S⊥ = −2γ²G⊥² Σ_m [2Dα²δ − 2 +
    2e^(−Dα²δ) + 2e^(−Dα²Δ) − e^(−Dα²(Δ−δ)) − e^(−Dα²(Δ+δ))] / [D²α⁶(R²α² − 1)]``, α_m R the
    roots of J1′, and G from b = γ²G²δ²(Δ − δ/3)."""
    from scipy.special import jnp_zeros

    b_si = np.asarray(b, dtype=np.float64) * 1e6  # s/m²
    dd = d * 1e-6  # m²/s
    g2 = b_si / (GAMMA**2 * small_delta**2 * (big_delta - small_delta / 3.0))
    alpha = jnp_zeros(1, terms) / radius_m
    a2 = dd * alpha**2
    numerator = (
        2 * a2 * small_delta
        - 2
        + 2 * np.exp(-a2 * small_delta)
        + 2 * np.exp(-a2 * big_delta)
        - np.exp(-a2 * (big_delta - small_delta))
        - np.exp(-a2 * (big_delta + small_delta))
    )
    series = (numerator / (dd**2 * alpha**6 * (radius_m**2 * alpha**2 - 1))).sum()
    return -2 * GAMMA**2 * g2 * series


def lookup_tables(bvals: np.ndarray, bvecs: np.ndarray, params: CommitParams) -> dict[str, np.ndarray]:
    """Responses on every orientation: ``ic`` (n_ic, 32761, M), ``ec`` (32761, M) and ``iso``
    (n_iso, M), float32, for b-values ``bvals`` (M,) s/mm² and unit ``bvecs`` (M, 3) in the
    streamlines' axes."""
    b = np.asarray(bvals, dtype=np.float64)
    g = np.asarray(bvecs, dtype=np.float64)
    cos2 = (orientation_directions() @ g.T) ** 2  # (32761, M)
    parallel = np.exp(-b * params.d_par * cos2)
    if params.model == "cylinder-zeppelin-ball":
        delta, big = params.small_delta_ms * 1e-3, params.big_delta_ms * 1e-3
        ic = np.stack(
            [
                parallel * np.exp(cylinder_perpendicular_log(b, r * 1e-6, params.d_par, delta, big) * (1.0 - cos2))
                for r in params.radii_um
            ]
        )
    else:
        ic = parallel[None]
    ec = np.exp(-b * (params.d_perp + (params.d_par - params.d_perp) * cos2))
    iso = np.exp(-np.outer(params.d_iso, b))
    return {"ic": ic.astype(np.float32), "ec": ec.astype(np.float32), "iso": iso.astype(np.float32)}
