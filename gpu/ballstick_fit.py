"""Ball & sticks fitted per voxel, bedpostX style (:mod:`gpu.ballstick` gives the model and
the method): the tensor fit starts each voxel (:mod:`gpu.dti`), Levenberg–Marquardt refines the
start (:mod:`gpu.ballstick_lm`), the MCMC samples the posterior (:mod:`gpu.ballstick_mcmc`), in
batches of voxels sized to the device, on the CUDA kernels or the NumPy reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from .backend import Backend, flag_counts, get_backend, run_batched
from .ballstick import (
    FLAG_LM_FALLBACK,
    FLAG_NAMES,
    FLAG_NOT_FITTED,
    MODEL2_D_MAX,
    MODEL2_D_STD_MAX,
    BallStickParams,
    dyadic_mean,
    vectors_to_angles,
    wrap_angles,
)
from .ballstick_lm import lm_kernel, lm_numpy, q_from_fractions
from .ballstick_mcmc import mcmc_kernel, mcmc_numpy, mcmc_start
from .dti import FLAG_FIT_FAILED, FLAG_NO_SIGNAL, FLAG_NONFINITE_SIGNAL, DTIFitParams, fit_dti
from .engines import KERNEL, NUMPY, choose_engine


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


def initial_x(xp, dti_fit, n_fibres: int, b_scale: float):
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
    x_init_all = initial_x(np, dti_fit, L, b_scale)
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
