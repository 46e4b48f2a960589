"""Ball & sticks' Markov chain Monte Carlo (:mod:`gpu.ballstick`, step 3; Behrens et al. 2003,
FSL's xfibres): random-walk Metropolis within Gibbs, one parameter at a time, Gaussian proposals
whose widths adapt during the burn-in, then every ``sample_every``-th of ``njumps`` iterations
recorded. The NumPy reference (:func:`mcmc_numpy`, vectorised over voxels) and the CUDA kernel
``ballstick_mcmc`` (:func:`mcmc_kernel`: one warp per voxel) draw the same Philox streams
(:mod:`gpu.rng`), so they run the same chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import Backend, Cancelled
from .ballstick import BallStickParams, angles_to_vectors, compartment_signal, compiled_kernel
from .ballstick_lm import fractions_from_q
from .rng import normal_and_log_uniform, seed_key

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
    kernel = compiled_kernel("ballstick_mcmc", params, m)
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
