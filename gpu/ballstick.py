"""Ball-and-sticks fitting, bedpostX style (Behrens et al. 2003/2007; Hernández 2017, ch. 4).

Signal model for measurement m (b-value b_m, unit gradient g_m), L sticks:

    S_m = S0 [ (1 − Σ f_i) exp(−b_m d) + Σ f_i exp(−b_m d (g_mᵀ v_i)²) ],
    v_i = (sin θ_i cos φ_i, sin θ_i sin φ_i, cos θ_i)

(model 1), or, with ``model=2`` (FSL's default; Jbabdi et al. 2012, MRM 68:1846, the
multi-shell extension Hernández 2017 §4.6.1 names), the diffusivity of every compartment
gamma-distributed with mean d and standard deviation d_std, so each exponential becomes the
gamma's Laplace transform:

    S_m = S0 [ (1 − Σ f_i) (1 + b_m d_std²/d)^(−d²/d_std²)
               + Σ f_i (1 + b_m d_std² (g_mᵀ v_i)²/d)^(−d²/d_std²) ],

as FSL's ``fibre.h`` evaluates it (``exp(log(d / (d + b c² σ²)) d²/σ²)``; here through
``log1p``, which keeps float32 exact as d_std → 0, where the model becomes model 1).

in the frame of the gradient vectors given (the app passes FSL's bvec frame, so
θ and φ follow FSL's conventions and the output can replace FSL's).

Per voxel, as FSL's xfibres:

1. **Initialisation** from a linear tensor fit (:mod:`gpu.dti`): S0, d = MD,
   stick 1 along e1 with f1 = FA, sticks 2.. along e2, e3 with small fractions.
2. **Levenberg–Marquardt** on all 2 + 3L parameters, least squares. The fit runs
   in transformed parameters so the bounds hold by construction:
   d = exp(u), f_i = q_i² / (1 + Σ q_j²) (so f_i ≥ 0 and Σ f < 1). The
   sticks are then sorted by fraction, largest first.
3. **MCMC**: random-walk Metropolis, one parameter at a time in the order S0, d,
   (θ, φ, f) per stick [, τ]; Gaussian proposals whose widths adapt every
   ``update_every`` iterations of the burn-in (width ×= √((accepted+1)/(rejected+1)),
   FSL's rule); widths start at S0/10, d/10, 0.2 for θ, φ, f and τ/2.
   Energy (minus log posterior):

   * Gaussian noise with the noise variance integrated out (Jeffreys prior),
     as FSL: ``(M/2) log(SS/2)`` with SS the sum of squared residuals;
   * Rician noise (``rician``): an extra precision parameter τ = 1/σ² with
     ``−M log τ + τ/2 Σ (y² + S²) − Σ log I0(τ y S)``;
   * model 2: d in (0, 0.005] mm²/s (FSL's UPPERDIFF) and d_std in (0, 0.01] mm²/s with
     the prior 1/d_std (energy ``log d_std``), as FSL's ``compute_d_prior`` and
     ``compute_d_std_prior``; the chain proposes d_std right after the sticks;
   * priors: S0, d, τ > 0 (flat); θ_i, φ_i uniform on the sphere
     (``−log |sin θ_i|``); f_i in (0, 1) with Σ f ≤ 1, and the ARD (shrinkage)
     prior ``ard_weight · log f_i`` on sticks 2..L.

   After the burn-in, every ``sample_every``-th of ``njumps`` iterations is
   recorded: ``njumps // sample_every`` samples per parameter. The sticks are
   then numbered by mean fraction, largest first (as FSL's output), and the angles
   put in θ ∈ [0, π], φ ∈ (−π, π] (:func:`wrap_angles`; the directions stay the same).

Model 2 starts its chain from the model-1 Levenberg–Marquardt result with d_std = d/10
(nearly model 1, so the start fits as well as that result); FSL runs a second
Levenberg–Marquardt on model 2 first (its ``PVM_multi``), which we leave to the burn-in.

FSL keeps adapting the proposal widths while it records samples; we adapt during
the burn-in only, so the recorded chain is a proper Metropolis chain.

Engines: a CUDA kernel pair (``kernels/ballstick.cu``: one warp per voxel, the
warp's lanes share the measurements and reduce with shuffles) and a NumPy
reference of the same algorithm, vectorised over voxels (for tests and the CPU
fallback; practical for thousands of voxels, not whole brains). Both draw their
random numbers from Philox4x32-10 keyed by the seed, one stream per voxel
(counter = draw number, voxel index), so results do not depend on batch sizes.

This module holds the model (parameters, signal, angles, dyads) and the kernels' build; the
steps have their own modules: :mod:`gpu.ballstick_lm` (Levenberg–Marquardt),
:mod:`gpu.ballstick_mcmc` (the chain) and :mod:`gpu.ballstick_fit` (:func:`~gpu.ballstick_fit.fit_ballstick`,
the whole fit over batches of voxels).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import cuda, sym3
from .params import meta

#: Per-voxel flags in :attr:`BallStickFit.flags` (0 = fitted).
FLAG_NOT_FITTED = 1  #: non-finite signal or no b=0 signal: outputs are zero.
FLAG_LM_FALLBACK = 2  #: Levenberg–Marquardt diverged; MCMC started from the tensor fit.

FLAG_NAMES = {FLAG_NOT_FITTED: "not fitted (bad signal)", FLAG_LM_FALLBACK: "LM failed, started from DTI"}


@dataclass(frozen=True)
class BallStickParams:
    """Parameters of the fit; defaults are FSL bedpostx's.

    n_fibres : sticks per voxel (1..3).
    model : 1 (one diffusivity d) or 2 (gamma-distributed diffusivities, mean d, std d_std).
    burnin, njumps, sample_every : MCMC iterations before recording, iterations
        recorded over, and the thinning (``njumps // sample_every`` samples).
    ard_weight : weight of the ARD prior on the fractions of sticks 2..n (0 = off).
    rician : Rician instead of Gaussian noise.
    update_every : proposal widths adapt every this many burn-in iterations.
    lm_iterations : cap on Levenberg–Marquardt iterations.
    b0_threshold : b-values at or below this count as b=0.
    seed : random seed; the same seed gives the same samples on the same engine.
    """

    n_fibres: int = field(
        default=3,
        metadata=meta(
            "Fibres per voxel",
            "sticks (fibre populations) per voxel",
            "",
            (1, 3),
            choices=(1, 2, 3),
        ),
    )
    burnin: int = field(
        default=1000,
        metadata=meta("Burn-in", "MCMC iterations before samples are recorded", "", (0, 10**6)),
    )
    njumps: int = field(
        default=1250, metadata=meta("Jumps", "MCMC iterations over which samples are recorded", "", (1, 10**6))
    )
    sample_every: int = field(
        default=25,
        metadata=meta(
            "Sample every",
            "record every n-th iteration (njumps / n samples)",
            "",
            (1, 10**6),
        ),
    )
    model: int = field(
        # 1, not FSL's 2: results stay those of earlier versions, and model 2's chain is about 12 times
        # as slow on the GPU (H100, 216 k voxels: 92 s against 7.8 s); multi-shell data get a note
        default=1,
        metadata=meta(
            "Model",
            "1: sticks with one diffusivity; 2: gamma-distributed diffusivities for multi-shell data "
            "(FSL's default; about 12x slower here)",
            "",
            (1, 2),
            choices=(1, 2),
        ),
    )
    ard_weight: float = field(
        default=1.0,
        metadata=meta(
            "ARD weight", "weight of the prior that switches off unsupported sticks 2..n (0 = off)", "", (0.0, 10.0)
        ),
    )
    rician: bool = field(
        default=False,
        metadata=meta("Rician noise", "Rician instead of Gaussian noise model"),
    )
    update_every: int = field(
        default=40,
        metadata=meta("Adapt every", "burn-in iterations between proposal-width updates", "", (1, 10**6)),
    )
    lm_iterations: int = field(
        default=200, metadata=meta("LM iterations", "cap on Levenberg–Marquardt iterations", "", (0, 10**4))
    )
    b0_threshold: float = field(
        default=50.0, metadata=meta("b=0 threshold", "b-values up to this count as b=0", "s/mm²", (0.0, 500.0))
    )
    seed: int = field(
        default=0,
        metadata=meta(
            "Random seed",
            "the same seed gives the same samples",
            "",
            (0, 2**31 - 1),
        ),
    )

    def __post_init__(self):
        if self.model not in (1, 2):
            raise ValueError(f"model must be 1 or 2, got {self.model}")
        if not 1 <= self.n_fibres <= 3:
            raise ValueError(f"n_fibres must be 1, 2 or 3, got {self.n_fibres}")
        if self.burnin < 0 or self.njumps < 1 or self.sample_every < 1:
            raise ValueError("burnin must be ≥ 0, njumps and sample_every ≥ 1")
        if self.njumps < self.sample_every:
            raise ValueError(f"njumps ({self.njumps}) must be at least sample_every ({self.sample_every})")
        if self.ard_weight < 0:
            raise ValueError("ard_weight must be ≥ 0")
        if self.update_every < 1 or self.lm_iterations < 0:
            raise ValueError("update_every must be ≥ 1 and lm_iterations ≥ 0")
        if not 0 <= self.seed < 2**63:
            raise ValueError("seed must be a non-negative 63-bit integer")

    @property
    def n_samples(self) -> int:
        return self.njumps // self.sample_every

    @property
    def n_params(self) -> int:
        """Parameters per voxel in the MCMC: S0, d, (θ, φ, f) per stick [, d_std] [, τ]."""
        return 2 + 3 * self.n_fibres + int(self.model == 2) + int(self.rician)

    @property
    def d_std_index(self) -> int | None:
        """Where d_std sits in the MCMC's parameter vector (None for model 1)."""
        return 2 + 3 * self.n_fibres if self.model == 2 else None


#: Model 2's bounds on d and d_std, mm²/s (FSL's ``UPPERDIFF`` and ``compute_d_std_prior``).
MODEL2_D_MAX = 0.005
MODEL2_D_STD_MAX = 0.01


def angles_to_vectors(xp, theta, phi):
    """Unit vectors (..., 3) from polar angle θ and azimuth φ (FSL's convention)."""
    st = xp.sin(theta)
    return xp.stack([st * xp.cos(phi), st * xp.sin(phi), xp.cos(theta)], axis=-1)


def vectors_to_angles(xp, v):
    """θ in [0, π], φ in (−π, π] of vectors (..., 3) (need not be unit)."""
    r = xp.sqrt((v * v).sum(axis=-1))
    theta = xp.arccos(xp.clip(v[..., 2] / xp.where(r > 0, r, 1.0), -1.0, 1.0))
    phi = xp.arctan2(v[..., 1], v[..., 0])
    return theta, phi


#: Angles wrapped at a time (:func:`wrap_angles`): bounds its float64 temporaries to ~100 MB.
WRAP_BLOCK = 1 << 22


def wrap_angles(theta, phi, xp=np, block: int = WRAP_BLOCK):
    """θ into [0, π] and φ into (−π, π], the same directions (the chain's angles roam freely).

    Angles already in range are returned bit for bit; others are folded in float64:
    θ mod 2π, then θ > π becomes 2π − θ with φ + π (the same unit vector). ``block`` angles at
    a time: a whole brain's samples (150 M angles) would otherwise take gigabytes of float64
    temporaries, more than the samples themselves."""
    theta, phi = xp.asarray(theta), xp.asarray(phi)
    if theta.size <= block:
        return _wrap_block(theta, phi, xp)
    out_theta, out_phi = xp.empty_like(theta), xp.empty_like(phi)
    flat = (theta.reshape(-1), phi.reshape(-1), out_theta.reshape(-1), out_phi.reshape(-1))
    for a in range(0, theta.size, block):
        flat[2][a : a + block], flat[3][a : a + block] = _wrap_block(flat[0][a : a + block], flat[1][a : a + block], xp)
    return out_theta, out_phi


def _wrap_block(theta, phi, xp):
    th = theta.astype(xp.float64) % (2 * np.pi)
    flip = th > np.pi
    th = xp.where(flip, 2 * np.pi - th, th)
    ph = phi.astype(xp.float64) + xp.where(flip, np.pi, 0.0)
    ph = ph - 2 * np.pi * xp.ceil((ph - np.pi) / (2 * np.pi))
    th_in = (theta >= 0) & (theta <= np.pi)
    ph_in = (phi > -np.pi) & (phi <= np.pi) & th_in
    return (
        xp.where(th_in, theta, th.astype(theta.dtype)),
        xp.where(ph_in, phi, ph.astype(phi.dtype)),
    )


def compartment_signal(b_cos2, d, d_std=None):
    """exp(−b c² d) (model 1), or the gamma model's (1 + b c² d_std²/d)^(−d²/d_std²) (model 2);
    ``b_cos2`` is b (g·v)² (b for the ball), broadcast with ``d`` and ``d_std``."""
    if d_std is None:
        return np.exp(-b_cos2 * d)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = d / d_std
        return np.exp(-(ratio * ratio) * np.log1p(b_cos2 * d_std * d_std / d))


def ball_stick_signal(bvals, bvecs, s0, d, theta, phi, f, d_std=None):
    """The model's signal (N, M) for N voxels: s0, d (N,), theta, phi, f (N, L); float64, NumPy.

    With ``d_std`` (N,), model 2 (gamma-distributed diffusivities, mean d, std d_std)."""
    b = np.asarray(bvals, dtype=np.float64)
    g = np.asarray(bvecs, dtype=np.float64)
    s0, d = np.asarray(s0, np.float64), np.asarray(d, np.float64)
    v = angles_to_vectors(np, np.asarray(theta, np.float64), np.asarray(phi, np.float64))  # (N, L, 3)
    f = np.asarray(f, np.float64)
    cos2 = np.einsum("nlk,mk->nlm", v, g) ** 2
    if d_std is None:
        bd = b[None, :] * d[:, None]
        ball = np.exp(-bd)
        sticks = np.exp(-bd[:, None, :] * cos2)
    else:
        sd = np.asarray(d_std, np.float64)
        ball = compartment_signal(b[None, :], d[:, None], sd[:, None])
        sticks = compartment_signal(b[None, None, :] * cos2, d[:, None, None], sd[:, None, None])
    return s0[:, None] * ((1.0 - f.sum(axis=1))[:, None] * ball + (f[:, :, None] * sticks).sum(axis=1))


def dyadic_mean(theta, phi, xp=np):
    """Mean direction and dispersion of orientation samples, as FSL's make_dyadic_vectors.

    ``theta``, ``phi``: (..., S) samples. Returns ``dyads`` (..., 3), the principal
    eigenvector of the mean dyadic tensor ⟨v vᵀ⟩ (sign: largest component positive),
    and ``dispersion`` (...,) = 1 − its largest eigenvalue (0 = all samples agree).
    """
    v = angles_to_vectors(xp, xp.asarray(theta, dtype=xp.float64), xp.asarray(phi, dtype=xp.float64))
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    tensor = xp.stack(
        [(x * x).mean(-1), (x * y).mean(-1), (x * z).mean(-1), (y * y).mean(-1), (y * z).mean(-1), (z * z).mean(-1)],
        axis=-1,
    )
    shape = tensor.shape[:-1]
    evals, evecs = sym3.eigh(xp, tensor.reshape(-1, 6))
    dyads = evecs[:, :, 0]
    big = xp.take_along_axis(dyads, xp.abs(dyads).argmax(axis=1)[:, None], axis=1)
    dyads = dyads * xp.where(big < 0, -1.0, 1.0)
    return dyads.reshape(*shape, 3), (1.0 - evals[:, 0]).reshape(shape)


# --------------------------------------------------------------------------------------
# The CUDA kernels (kernels/ballstick.cu: LM and MCMC)


def kernel_defines(params: BallStickParams, m: int, mcmc: bool) -> tuple:
    """Sticks per voxel, measurements per lane (held in registers: MCMC only), the noise
    model and the diffusivity model (MCMC only); the least-squares kernel gets fixed values, so
    it is compiled once per number of sticks."""
    per_lane, rician, model2 = (-(-m // 32), int(params.rician), int(params.model == 2)) if mcmc else (1, 0, 0)
    return (("NFIB", params.n_fibres), ("PER_LANE", per_lane), ("RICIAN", rician), ("MODEL2", model2))


def compiled_kernel(name: str, params: BallStickParams, m: int):
    """``ballstick_lm`` or ``ballstick_mcmc`` for ``m`` measurements."""
    defines = kernel_defines(params, m, name == "ballstick_mcmc")
    return cuda.function("ballstick.cu", name, ("philox.cuh",), defines=defines)
