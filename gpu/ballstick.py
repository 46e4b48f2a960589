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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from . import cuda, sym3
from .backend import Backend, Cancelled, flag_counts, get_backend, run_batched
from .dti import FLAG_FIT_FAILED, FLAG_NO_SIGNAL, FLAG_NONFINITE_SIGNAL, DTIFitParams, fit_dti
from .engines import KERNEL, NUMPY, choose_engine
from .params import meta
from .rng import normal_and_log_uniform, seed_key

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
            flags=("--nfibres",),
        ),
    )
    burnin: int = field(
        default=1000,
        metadata=meta("Burn-in", "MCMC iterations before samples are recorded", "", (0, 10**6), flags=("--burnin",)),
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
            flags=("--sampleevery",),
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
            flags=("--model",),
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
        metadata=meta(
            "Rician noise", "Rician instead of Gaussian noise model", cli_help="Rician noise model (default Gaussian)"
        ),
    )
    update_every: int = field(
        default=40,
        metadata=meta("Adapt every", "burn-in iterations between proposal-width updates", "", (1, 10**6), cli=False),
    )
    lm_iterations: int = field(
        default=200, metadata=meta("LM iterations", "cap on Levenberg–Marquardt iterations", "", (0, 10**4), cli=False)
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
            flags=("--seed-rng",),
            metavar="N",
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
# The model in the fit's internal units: signal / S0_dti, b / b_scale, d · b_scale.


def _log_i0_tail(x):
    """log I0(x) − x + ½ log x for x ≥ 3.75 (Abramowitz & Stegun 9.8.2)."""
    t = 3.75 / x
    poly = 0.00392377
    for c in (-0.01647633, 0.02635537, -0.02057706, 0.00916281, -0.00157565, 0.00225319, 0.01328592, 0.39894228):
        poly = poly * t + c
    return np.log(poly)


def rician_terms(y, s, tau):
    """Per-measurement Rician energy τ/2 (y² + S²) − log I0(τ y S) (without −log y), stable form.

    For large arguments it is τ/2 (y − S)² + ½ log x − log(poly), x = τ|yS|, which avoids
    subtracting two large numbers (A&S 9.8.1/9.8.2 for I0)."""
    x = tau * np.abs(y * s)
    small = x < 3.75
    t = (np.where(small, x, 0.0) / 3.75) ** 2
    i0 = 0.0045813
    for c in (0.0360768, 0.2659732, 1.2067492, 3.0899424, 3.5156229, 1.0):
        i0 = i0 * t + c
    xs = np.where(small, 3.75, x)
    large = 0.5 * tau * (np.abs(y) - np.abs(s)) ** 2 + 0.5 * np.log(xs) - _log_i0_tail(xs)
    return np.where(small, 0.5 * tau * (y * y + s * s) - np.log(i0), large)


@dataclass
class _State:
    """MCMC state of N voxels (NumPy engine), internal units."""

    s0: np.ndarray  # (N,)
    d: np.ndarray  # (N,)
    th: np.ndarray  # (N, L)
    ph: np.ndarray
    f: np.ndarray
    tau: np.ndarray  # (N,) (Rician only)
    dstd: np.ndarray | None = None  # (N,) (model 2 only)

    def copy(self) -> _State:
        arrays = (self.s0, self.d, self.th, self.ph, self.f, self.tau)
        return _State(*(a.copy() for a in arrays), None if self.dstd is None else self.dstd.copy())

    def vector(self, rician: bool) -> np.ndarray:
        """(N, P) in the order S0, d, (θ, φ, f) per stick [, d_std] [, τ]."""
        sticks = np.stack([self.th, self.ph, self.f], axis=2).reshape(len(self.s0), -1)
        cols = [self.s0[:, None], self.d[:, None], sticks]
        cols += [self.dstd[:, None]] if self.dstd is not None else []
        cols += [self.tau[:, None]] if rician else []
        return np.concatenate(cols, axis=1)


def _stick_terms(b, g, d, th, ph, dstd=None):
    """exp(−b d (g·v)²) (model 1) or its gamma counterpart (model 2) for each stick: (N, L, M)."""
    c = np.einsum("nlk,mk->nlm", angles_to_vectors(np, th, ph), g)
    if dstd is None:
        return np.exp(-b[None, None, :] * d[:, None, None] * c * c)
    return compartment_signal(b[None, None, :] * c * c, d[:, None, None], dstd[:, None, None])


def _ball_term(b, d, dstd=None):
    """exp(−b d) (model 1) or its gamma counterpart (model 2): (N, M)."""
    if dstd is None:
        return np.exp(-b[None, :] * d[:, None])
    return compartment_signal(b[None, :], d[:, None], dstd[:, None])


def _energy(y, b, st: _State, ball, sticks, params: BallStickParams):
    """Likelihood and prior energies (N,) of a state with its cached exponentials."""
    s = st.s0[:, None] * ((1.0 - st.f.sum(axis=1))[:, None] * ball + (st.f[:, :, None] * sticks).sum(axis=1))
    if params.rician:
        lik = -y.shape[1] * np.log(st.tau) + rician_terms(y, s, st.tau[:, None]).sum(axis=1)
    else:
        ss = ((y - s) ** 2).sum(axis=1)
        lik = 0.5 * y.shape[1] * np.log(np.maximum(ss, 1e-30) / 2.0)
    prior = -np.log(np.maximum(np.abs(np.sin(st.th)), 1e-30)).sum(axis=1)
    if params.ard_weight and st.f.shape[1] > 1:
        prior = prior + params.ard_weight * np.log(np.maximum(st.f[:, 1:], 1e-30)).sum(axis=1)
    if st.dstd is not None:
        prior = prior + np.log(np.maximum(st.dstd, 1e-30))
    return lik + prior


def _proposal_order(n_fibres: int, rician: bool, model: int = 1) -> list[tuple[str, int]]:
    order = [("s0", -1), ("d", -1)]
    for i in range(n_fibres):
        order += [("th", i), ("ph", i), ("f", i)]
    return order + ([("dstd", -1)] if model == 2 else []) + ([("tau", -1)] if rician else [])


def mcmc_numpy(
    y,
    b,
    g,
    init: np.ndarray,
    voxels: np.ndarray,
    params: BallStickParams,
    cancelled=None,
    *,
    d_max: float = np.inf,
    d_std_max: float = np.inf,
):
    """The MCMC of the module docstring on N voxels, vectorised; the reference for the kernel.

    ``y`` (N, M) normalised signal, ``b`` (M,) scaled b-values, ``g`` (M, 3), ``init``
    (N, P) starting values (:meth:`_State.vector` order), ``voxels`` (N,) global voxel
    numbers (the random streams). ``d_max``, ``d_std_max``: model 2's bounds in the fit's
    internal units (mm²/s × the b-value scale). Returns samples (N, P, n_samples) and the
    acceptance rate of each parameter over the recorded iterations (N, P).
    """
    y = np.asarray(y, np.float64)
    n, L = len(y), params.n_fibres
    P = params.n_params
    st = _State(
        init[:, 0].copy(),
        init[:, 1].copy(),
        init[:, 2 : 2 + 3 * L : 3].copy(),
        init[:, 3 : 3 + 3 * L : 3].copy(),
        init[:, 4 : 4 + 3 * L : 3].copy(),
        init[:, -1].copy() if params.rician else np.ones(n),
        init[:, params.d_std_index].copy() if params.model == 2 else None,
    )
    model2 = params.model == 2
    ball = _ball_term(b, st.d, st.dstd)
    sticks = _stick_terms(b, g, st.d, st.th, st.ph, st.dstd)
    energy = _energy(y, b, st, ball, sticks, params)
    order = _proposal_order(L, params.rician, params.model)
    prop = np.empty((n, P))
    for p, (name, _) in enumerate(order):
        prop[:, p] = {"s0": st.s0 / 10, "d": st.d / 10, "tau": st.tau / 2}.get(name, 0.2)
        if name == "dstd":
            prop[:, p] = st.dstd / 10
    acc = np.zeros((n, P))
    rej = np.zeros((n, P))
    samples = np.zeros((n, P, params.n_samples), dtype=np.float32)
    key = seed_key(params.seed)
    total = params.burnin + params.njumps
    for it in range(total):
        if cancelled is not None and cancelled():
            raise Cancelled()
        for p, (name, i) in enumerate(order):
            normal, log_u = normal_and_log_uniform(voxels, it * P + p, key)
            new = st.copy()
            step = normal * prop[:, p]
            if name in ("th", "ph", "f"):
                getattr(new, name)[:, i] += step
            else:
                setattr(new, name, getattr(st, name) + step)
            new_ball, new_sticks = ball, sticks
            if name in ("d", "dstd"):
                with np.errstate(invalid="ignore", divide="ignore"):
                    new_ball = _ball_term(b, new.d, new.dstd)
                    new_sticks = _stick_terms(b, g, new.d, new.th, new.ph, new.dstd)
            elif name in ("th", "ph"):
                new_sticks = sticks.copy()
                one = _stick_terms(b, g, new.d, new.th[:, i : i + 1], new.ph[:, i : i + 1], new.dstd)
                new_sticks[:, i] = one[:, 0]
            valid = {
                "s0": new.s0 > 0,
                "d": (new.d > 0) & (new.d <= d_max) if model2 else new.d > 0,
                "dstd": (new.dstd > 0) & (new.dstd <= d_std_max) if model2 else None,
                "tau": new.tau > 0,
                "f": (new.f[:, i] > 0) & (new.f[:, i] < 1) & (new.f.sum(axis=1) <= 1),
            }.get(name, np.ones(n, dtype=bool))
            with np.errstate(invalid="ignore", divide="ignore"):
                new_energy = _energy(y, b, new, new_ball, new_sticks, params)
            accept = valid & (log_u < energy - new_energy)
            st.s0 = np.where(accept, new.s0, st.s0)
            st.d = np.where(accept, new.d, st.d)
            st.tau = np.where(accept, new.tau, st.tau)
            if model2:
                st.dstd = np.where(accept, new.dstd, st.dstd)
            for key_name in ("th", "ph", "f"):
                setattr(st, key_name, np.where(accept[:, None], getattr(new, key_name), getattr(st, key_name)))
            if name in ("d", "dstd"):
                ball = np.where(accept[:, None], new_ball, ball)
            if name in ("d", "dstd", "th", "ph"):
                sticks = np.where(accept[:, None, None], new_sticks, sticks)
            energy = np.where(accept, new_energy, energy)
            acc[:, p] += accept
            rej[:, p] += ~accept
        if it < params.burnin:
            if (it + 1) % params.update_every == 0:
                prop *= np.sqrt((acc + 1.0) / (rej + 1.0))
                acc[:] = 0
                rej[:] = 0
            if it + 1 == params.burnin:
                acc[:] = 0
                rej[:] = 0
        else:
            t = it - params.burnin + 1
            if t % params.sample_every == 0 and t // params.sample_every <= params.n_samples:
                samples[:, :, t // params.sample_every - 1] = st.vector(params.rician)
    rate = acc / np.maximum(acc + rej, 1)
    return samples, rate.astype(np.float32)


# --------------------------------------------------------------------------------------
# Levenberg–Marquardt in transformed parameters x = (s0, u, (θ, φ, q) per stick):
# d = exp(u), f_i = q_i² / (1 + Σ q_j²).

LM_LAMBDA0 = 1e-3  #: starting damping
LM_LAMBDA_STOP = 1e20  #: converged when the damping grows past this (Hernández 2017, alg. 4.1)


def fractions_from_q(xp, q):
    return q * q / (1.0 + (q * q).sum(axis=-1, keepdims=True))


def q_from_fractions(xp, f):
    total = f.sum(axis=-1, keepdims=True)
    return xp.sqrt(f * (1.0 + total / (1.0 - total)))


def lm_model(x, b, g, n_fibres: int):
    """Signal (N, M) and its Jacobian (N, M, 2 + 3L) w.r.t. the transformed parameters."""
    n, m = len(x), len(b)
    s0, d = x[:, 0], np.exp(x[:, 1])
    th, ph, q = x[:, 2::3], x[:, 3::3], x[:, 4::3]
    Q = (q * q).sum(axis=1)
    f = q * q / (1.0 + Q)[:, None]
    st, ct, sp, cp = np.sin(th), np.cos(th), np.sin(ph), np.cos(ph)
    v = np.stack([st * cp, st * sp, ct], axis=2)
    dv_th = np.stack([ct * cp, ct * sp, -st], axis=2)
    dv_ph = np.stack([-st * sp, st * cp, np.zeros_like(st)], axis=2)
    c = np.einsum("nlk,mk->nlm", v, g)
    bd = b[None, :] * d[:, None]  # (N, M)
    ball = np.exp(-bd)
    sticks = np.exp(-bd[:, None, :] * c * c)  # (N, L, M)
    ball_frac = 1.0 - f.sum(axis=1)
    a = ball_frac[:, None] * ball + (f[:, :, None] * sticks).sum(axis=1)
    signal = s0[:, None] * a
    jac = np.empty((n, m, 2 + 3 * n_fibres))
    jac[:, :, 0] = a
    jac[:, :, 1] = -s0[:, None] * bd * (ball_frac[:, None] * ball + (f[:, :, None] * c * c * sticks).sum(axis=1))
    common = (f[:, :, None] * (sticks - ball[:, None, :])).sum(axis=1)  # Σ f_i (E_i − e0)
    for i in range(n_fibres):
        k = -2.0 * s0[:, None] * f[:, i, None] * sticks[:, i] * bd * c[:, i]
        jac[:, :, 2 + 3 * i] = k * (dv_th[:, i] @ g.T)
        jac[:, :, 3 + 3 * i] = k * (dv_ph[:, i] @ g.T)
        scale = 2.0 * s0 * q[:, i] / (1.0 + Q)
        jac[:, :, 4 + 3 * i] = scale[:, None] * ((sticks[:, i] - ball) - common)
    return signal, jac


def lm_numpy(y, b, g, x0, n_fibres: int, iterations: int, cancelled=None):
    """Levenberg–Marquardt from ``x0`` (N, 2 + 3L), vectorised over voxels; the kernel's reference.

    Step: (JᵀJ + λ diag JᵀJ) δ = Jᵀ r, accepted when the sum of squares falls (λ /= 10),
    else λ *= 10; a voxel stops when λ > 1e20 or after ``iterations``.
    Returns x (N, 2 + 3L) and the final sum of squares (N,). ``cancelled()`` is polled
    every iteration (raising :class:`Cancelled`).
    """
    x = np.array(x0, dtype=np.float64)
    n, p = x.shape
    lam = np.full(n, LM_LAMBDA0)
    signal, jac = lm_model(x, b, g, n_fibres)
    cost = ((y - signal) ** 2).sum(axis=1)
    eye = np.eye(p)
    for _ in range(iterations):
        if cancelled is not None and cancelled():
            raise Cancelled()
        active = lam <= LM_LAMBDA_STOP
        if not active.any():
            break
        r = y - signal
        jtj = np.einsum("nmp,nmq->npq", jac, jac)
        jtr = np.einsum("nmp,nm->np", jac, r)
        diag = np.einsum("npp->np", jtj)
        system = jtj + (lam[:, None] * diag + 1e-12)[:, :, None] * eye
        ok = np.isfinite(system).all(axis=(1, 2)) & np.isfinite(jtr).all(axis=1)
        system[~ok] = eye
        delta = np.linalg.solve(system, np.where(ok[:, None], jtr, 0.0)[:, :, None])[:, :, 0]
        trial = x + delta
        trial_signal, trial_jac = lm_model(trial, b, g, n_fibres)
        with np.errstate(invalid="ignore"):
            trial_cost = ((y - trial_signal) ** 2).sum(axis=1)
        better = active & ok & (trial_cost < cost)
        x = np.where(better[:, None], trial, x)
        signal = np.where(better[:, None], trial_signal, signal)
        jac = np.where(better[:, None, None], trial_jac, jac)
        cost = np.where(better, trial_cost, cost)
        lam = np.where(active, np.where(better, lam / 10.0, lam * 10.0), lam)
    return x, cost


# --------------------------------------------------------------------------------------
# Driver


@dataclass
class BallStickFit:
    """Posterior samples of N voxels; host NumPy arrays, output units (signal units, mm²/s).

    theta, phi, f : (N, L, S) float32, S = ``njumps // sample_every`` samples.
    s0, d : (N, S) float32; tau : (N, S) noise precision 1/σ² (Rician only, else None).
    start : (N, P) the MCMC's starting point (Levenberg–Marquardt result, sticks sorted
        by fraction), in :meth:`_State.vector` order and output units.
    acceptance : (N, P) acceptance rate of each parameter over the recorded iterations.
    flags : (N,) uint8 (FLAG_*).
    provenance : parameters, engine, backend, device and timings.
    d_std : (N, S) std of the diffusivities, mm²/s (model 2 only, else None).
    """

    theta: np.ndarray
    phi: np.ndarray
    f: np.ndarray
    s0: np.ndarray
    d: np.ndarray
    tau: np.ndarray | None
    start: np.ndarray
    acceptance: np.ndarray
    flags: np.ndarray
    provenance: dict = field(default_factory=dict)
    d_std: np.ndarray | None = None

    def flag_counts(self) -> dict[str, int]:
        """How many voxels carry each flag, by name (only flags that occur)."""
        return flag_counts(self.flags, FLAG_NAMES)

    def dyads(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean directions (N, L, 3) and dispersions (N, L) (:func:`dyadic_mean`)."""
        return dyadic_mean(self.theta, self.phi)


def _initial_x(xp, dti_fit, n_fibres: int, b_scale: float):
    """LM starting points (N, 2 + 3L) from the tensor fit: s0 = 1 (normalised), d = MD,
    stick 1 along e1 with f = FA (0.05..0.8), sticks 2.. along e2, e3 with f = 0.05."""
    md = xp.maximum(xp.asarray(dti_fit.md) * b_scale, 1e-3)
    fa = xp.clip(xp.asarray(dti_fit.fa), 0.05, 0.8)
    evecs = xp.asarray(dti_fit.evecs)
    n = len(md)
    f = xp.full((n, n_fibres), 0.05)
    f[:, 0] = xp.minimum(fa, 0.95 - 0.05 * (n_fibres - 1))
    q = q_from_fractions(xp, f)
    x = xp.empty((n, 2 + 3 * n_fibres))
    x[:, 0] = 1.0
    x[:, 1] = xp.log(md)
    for i in range(n_fibres):
        th, ph = vectors_to_angles(xp, evecs[:, :, i])
        x[:, 2 + 3 * i] = th
        x[:, 3 + 3 * i] = ph
        x[:, 4 + 3 * i] = q[:, i]
    return x


#: Model 2's chain starts at d_std = this × d (nearly model 1: it fits as the model-1 LM did).
MODEL2_START_SPREAD = 0.1


def mcmc_start(xp, x, x_init, cost, m: int, params: BallStickParams):
    """The MCMC's starting vector (N, P) from the LM result ``x``, sticks sorted by fraction.

    Voxels whose LM result is unusable (non-finite, S0 ≤ 0, d outside (1e-4, 10) in
    internal units) start from ``x_init`` instead; returns (start, fallback mask)."""
    L = params.n_fibres
    bad = ~xp.isfinite(x).all(axis=1) | ~(x[:, 0] > 0) | ~(xp.abs(x[:, 1]) < 9.0) | ~xp.isfinite(cost)
    x = xp.where(bad[:, None], x_init, x)
    f = fractions_from_q(xp, x[:, 4::3])
    f = xp.maximum(f, 1e-6)
    f = f / xp.maximum(1.0, f.sum(axis=1, keepdims=True) / (1.0 - 1e-6))
    order = xp.argsort(-f, axis=1)
    th = xp.take_along_axis(x[:, 2::3], order, axis=1)
    ph = xp.take_along_axis(x[:, 3::3], order, axis=1)
    f = xp.take_along_axis(f, order, axis=1)
    start = xp.empty((len(x), params.n_params))
    start[:, 0] = x[:, 0]
    start[:, 1] = xp.exp(x[:, 1])
    start[:, 2 : 2 + 3 * L : 3] = th
    start[:, 3 : 3 + 3 * L : 3] = ph
    start[:, 4 : 4 + 3 * L : 3] = f
    if params.model == 2:
        start[:, params.d_std_index] = start[:, 1] * MODEL2_START_SPREAD
    if params.rician:
        start[:, -1] = m / xp.maximum(xp.where(bad, m * 1e-3, cost), 1e-12)
    return start, bad


#: Warps (voxels) per block of the MCMC kernel.
MCMC_BLOCK = 256


def _kernel_defines(params: BallStickParams, m: int, mcmc: bool) -> tuple:
    """Sticks per voxel, measurements per lane (held in registers: MCMC only), the noise
    model and the diffusivity model (MCMC only); the least-squares kernel gets fixed values, so
    it is compiled once per number of sticks."""
    per_lane, rician, model2 = (-(-m // 32), int(params.rician), int(params.model == 2)) if mcmc else (1, 0, 0)
    return (("NFIB", params.n_fibres), ("PER_LANE", per_lane), ("RICIAN", rician), ("MODEL2", model2))


def _kernel(name: str, params: BallStickParams, m: int):
    """``ballstick_lm`` or ``ballstick_mcmc`` for ``m`` measurements."""
    defines = _kernel_defines(params, m, name == "ballstick_mcmc")
    return cuda.function("ballstick.cu", name, ("philox.cuh",), defines=defines)


def lm_kernel(backend: Backend, y, b, g, x0, params: BallStickParams):
    """:func:`lm_numpy` as the CUDA kernel ``ballstick_lm`` (device arrays in and out)."""
    cp = backend.xp
    n, m = y.shape
    npl = 2 + 3 * params.n_fibres
    x_out = cp.empty((n, npl))
    cost = cp.empty(n)
    if n == 0:
        return x_out, cost
    kernel = _kernel("ballstick_lm", params, m)
    per_warp = 8 * (npl * (npl + 1) // 2 + 2 * npl + (m * (npl + 1) + 1) // 2)
    warps = 2 if 2 * per_warp <= 48 * 1024 else 1
    if warps * per_warp > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = warps * per_warp
    kernel(
        ((n + warps - 1) // warps,),
        (32 * warps,),
        (
            cp.ascontiguousarray(y, dtype=cp.float32),
            cp.asarray(b, dtype=cp.float32),
            cp.asarray(g, dtype=cp.float32),
            cp.ascontiguousarray(x0, dtype=cp.float64),
            np.int64(n),
            np.int32(m),
            np.int32(params.lm_iterations),
            np.float64(LM_LAMBDA0),
            np.float64(LM_LAMBDA_STOP),
            x_out,
            cost,
        ),
        shared_mem=warps * per_warp,
    )
    return x_out, cost


def mcmc_kernel(
    backend: Backend,
    y,
    b,
    g,
    start,
    voxel0: int,
    params: BallStickParams,
    *,
    d_max: float = np.inf,
    d_std_max: float = np.inf,
):
    """:func:`mcmc_numpy` as the CUDA kernel ``ballstick_mcmc``; voxels are ``voxel0 + arange(N)``."""
    cp = backend.xp
    n, m = y.shape
    P, S = params.n_params, params.n_samples
    samples = cp.zeros((n, P, S), dtype=cp.float32)
    rate = cp.zeros((n, P), dtype=cp.float32)
    if n == 0:
        return samples, rate
    kernel = _kernel("ballstick_mcmc", params, m)
    key0, key1 = seed_key(params.seed)
    warps = MCMC_BLOCK // 32
    kernel(
        ((n + warps - 1) // warps,),
        (MCMC_BLOCK,),
        (
            cp.ascontiguousarray(y, dtype=cp.float32),
            cp.asarray(b, dtype=cp.float32),
            cp.asarray(g, dtype=cp.float32),
            cp.ascontiguousarray(start, dtype=cp.float32),
            np.int64(n),
            np.int32(m),
            np.uint64(voxel0),
            np.uint32(key0),
            np.uint32(key1),
            np.int32(params.burnin),
            np.int32(params.njumps),
            np.int32(params.sample_every),
            np.int32(S),
            np.int32(params.update_every),
            np.float32(params.ard_weight),
            np.float32(min(d_max, 3.0e38)),
            np.float32(min(d_std_max, 3.0e38)),
            samples,
            rate,
        ),
    )
    return samples, rate


def fit_ballstick(
    signal: np.ndarray,
    bvals: np.ndarray,
    bvecs: np.ndarray,
    params: BallStickParams | None = None,
    *,
    device: str | Backend = "auto",
    engine: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_voxels: int | None = None,
) -> BallStickFit:
    """Fit ball & sticks to the (N, M) signals of N voxels; host arrays in, host arrays out.

    ``bvecs`` (M, 3) unit vectors in the frame the angles are to be expressed in.
    ``engine``: ``"kernel"`` (CUDA, the GPU default) or ``"numpy"`` (the reference, on
    the host; the CPU default). Voxels are processed in batches (memory-sized, at most
    ``batch_voxels``); ``progress(done, total)`` after each, ``cancelled()`` polled
    between batches (and between iterations on the NumPy engine).
    """

    params = params or BallStickParams()
    backend = get_backend(device)
    engine = choose_engine(engine, backend, available=(KERNEL, NUMPY), method="ball & sticks")
    signal = np.asarray(signal)
    bvals = np.asarray(bvals, dtype=np.float64)
    bvecs = np.array(bvecs, dtype=np.float64)
    if signal.ndim != 2 or signal.shape[1] != len(bvals) or bvecs.shape != (len(bvals), 3):
        raise ValueError(f"signal must be (voxels, {len(bvals)}) and bvecs ({len(bvals)}, 3)")
    dw = bvals > params.b0_threshold
    if dw.sum() < 2 + 3 * params.n_fibres:
        raise ValueError(f"{int(dw.sum())} diffusion-weighted measurements cannot determine {params.n_fibres} sticks")
    bvecs[~dw & ~np.isfinite(bvecs).all(axis=1)] = 0.0
    t0 = time.perf_counter()
    dti_fit = fit_dti(
        signal,
        bvals,
        bvecs,
        DTIFitParams(b0_threshold=params.b0_threshold),
        device=backend if engine == "kernel" else "cpu",
    )
    t_dti = time.perf_counter() - t0
    n, m = signal.shape
    bad_dti = (dti_fit.flags & (FLAG_NONFINITE_SIGNAL | FLAG_NO_SIGNAL | FLAG_FIT_FAILED)) != 0
    flags = np.where(bad_dti | ~(dti_fit.s0 > 0), FLAG_NOT_FITTED, 0).astype(np.uint8)
    fitted = np.flatnonzero(flags == 0)
    b_scale = float(bvals.max())
    b = bvals / b_scale
    bounds = {"d_max": MODEL2_D_MAX * b_scale, "d_std_max": MODEL2_D_STD_MAX * b_scale}
    L, P, S = params.n_fibres, params.n_params, params.n_samples
    out_samples = np.zeros((n, P, S), dtype=np.float32)
    out_rate = np.zeros((n, P), dtype=np.float32)
    out_start = np.zeros((n, P))
    x_init_all = _initial_x(np, dti_fit, L, b_scale)
    timings = {"dti_s": t_dti, "lm_s": 0.0, "mcmc_s": 0.0, "transfer_s": 0.0}
    host = backend if engine == "kernel" else get_backend("cpu")

    def process(start: int, stop: int) -> None:
        idx = fitted[start:stop]
        t_a = time.perf_counter()
        scale = dti_fit.s0[idx]
        y_host = (signal[idx] / scale[:, None]).astype(np.float32 if engine == "kernel" else np.float64)
        if engine == "kernel":
            xp = host.xp
            y = host.asarray(y_host)
            x_init = host.asarray(x_init_all[idx])
            host.synchronize()
            t_b = time.perf_counter()
            x, cost = lm_kernel(host, y, b, bvecs, x_init, params)
            start_vec, fallback = mcmc_start(xp, x, x_init, cost, m, params)
            host.synchronize()
            t_c = time.perf_counter()
            samples, rate = mcmc_kernel(host, y, b, bvecs, start_vec, start, params, **bounds)
            host.synchronize()
            t_d = time.perf_counter()
            samples, rate = host.to_host(samples), host.to_host(rate)
            start_vec, fallback = host.to_host(start_vec), host.to_host(fallback)
        else:
            t_b = time.perf_counter()
            x_init = x_init_all[idx]
            x, cost = lm_numpy(y_host, b, bvecs, x_init, L, params.lm_iterations, cancelled)
            start_vec, fallback = mcmc_start(np, x, x_init, cost, m, params)
            t_c = time.perf_counter()
            streams = np.arange(start, stop, dtype=np.uint64)
            samples, rate = mcmc_numpy(y_host, b, bvecs, start_vec, streams, params, cancelled=cancelled, **bounds)
            t_d = time.perf_counter()
        out_samples[idx] = samples
        out_rate[idx] = rate
        out_start[idx] = start_vec
        flags[idx] |= np.where(fallback, FLAG_LM_FALLBACK, 0).astype(np.uint8)
        timings["lm_s"] += t_c - t_b
        timings["mcmc_s"] += t_d - t_c
        timings["transfer_s"] += (t_b - t_a) + (time.perf_counter() - t_d)

    # Random stream of a voxel = its position among the fitted voxels (batch-independent).
    bytes_per_voxel = 4 * (2 * m + P * (S + 4)) + 8 * (4 * (2 + 3 * L)) + 256
    maximum = batch_voxels or (65536 if engine == "kernel" else 1024)
    maximum = -(-len(fitted) // -(-len(fitted) // maximum)) if len(fitted) else 1  # equal batches, no small tail
    run_batched(host, len(fitted), bytes_per_voxel, process, progress=progress, cancelled=cancelled, maximum=maximum)

    # Output units: S0 × the voxel's b=0 scale, d / b_scale, τ / scale².
    scale = np.where(flags & FLAG_NOT_FITTED, 0.0, dti_fit.s0)
    out_samples[:, 0] *= scale[:, None].astype(np.float32)
    out_samples[:, 1] /= b_scale
    out_start[:, 0] *= scale
    out_start[:, 1] /= b_scale
    d_std = None
    if params.model == 2:
        out_samples[:, params.d_std_index] /= b_scale
        out_start[:, params.d_std_index] /= b_scale
        d_std = out_samples[:, params.d_std_index].copy()
    tau = None
    if params.rician:
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(scale > 0, 1.0 / (scale * scale), 0.0).astype(np.float32)
        out_samples[:, -1] *= inv[:, None]
        out_start[:, -1] *= inv
        tau = out_samples[:, -1]
    sticks = out_samples[:, 2 : 2 + 3 * L].reshape(n, L, 3, S)
    # Number the sticks by mean fraction, largest first, as FSL's xfibres writes them: a chain
    # may hand a fibre from one stick to another (the LM's sticks are sorted, the chain's need not stay so).
    order = np.argsort(-sticks[:, :, 2].mean(axis=2), axis=1, kind="stable")
    sticks = np.take_along_axis(sticks, order[:, :, None, None], axis=1)
    rate = out_rate[:, 2 : 2 + 3 * L].reshape(n, L, 3)
    out_rate[:, 2 : 2 + 3 * L] = np.take_along_axis(rate, order[:, :, None], axis=1).reshape(n, 3 * L)
    theta, phi = wrap_angles(np.ascontiguousarray(sticks[:, :, 0]), np.ascontiguousarray(sticks[:, :, 1]))
    fit = BallStickFit(
        theta=theta,
        phi=phi,
        f=np.ascontiguousarray(sticks[:, :, 2]),
        s0=out_samples[:, 0].copy(),
        d=out_samples[:, 1].copy(),
        tau=None if tau is None else tau.copy(),
        start=out_start,
        acceptance=out_rate,
        flags=flags,
        d_std=d_std,
    )
    fit.provenance = {
        "params": asdict(params),
        "engine": engine,
        "backend": host.name,
        "device": host.device_name,
        "voxels": int(n),
        "measurements": int(m),
        **timings,
    }
    return fit
