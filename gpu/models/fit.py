"""Fit a declared model to the signals of many voxels: host arrays in, host arrays out.

Per batch of voxels (sized to free memory), on the chosen backend: normalise by the mean
b = 0 signal, start the orientations from a tensor fit, grid search, Levenberg–Marquardt,
optionally MCMC (:mod:`.optimize`), then the model's derived maps. The NumPy backend runs the
same array code as CuPy, so it is the reference of the GPU path. On the CPU with numba, a model
that names compiled loops (NODDI-Watson) runs its grid search and LM in them instead, one voxel
at a time without the GIL, so that batches on several threads scale (:mod:`.host_fit`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from ..backend import Backend, flag_counts, get_backend, run_batched
from ..ballstick import BallStickParams
from ..host import host_threads
from ..params import meta, same_as
from .declare import Acquisition, Model, all_parameters
from .host_fit import compiled_fit
from .optimize import grid_search, levenberg_marquardt, metropolis, orientation_start, predict, tensor_orientations

FLAG_NOT_FITTED = 1  #: non-finite signal or no positive b = 0 signal: outputs are zero.
FLAG_NOT_CONVERGED = 2  #: the least-squares fit ended non-finite; the grid search's values are kept.
FLAG_NAMES = {FLAG_NOT_FITTED: "not fitted (bad signal)", FLAG_NOT_CONVERGED: "LM failed, grid values kept"}

METHODS = ("lm", "mcmc")


@dataclass(frozen=True)
class ModelFitParams:
    """How a microstructure model is fitted (and NODDI's fixed diffusivities)."""

    method: str = field(
        default="lm",
        metadata=meta(
            "Method",
            "lm: grid search then Levenberg-Marquardt; mcmc: then MCMC samples (means and standard deviations)",
            choices=METHODS,
        ),
    )
    d_par: float = field(
        default=1.7e-3,
        metadata=meta("Parallel diffusivity", "NODDI's fixed intrinsic diffusivity d∥", "mm²/s", (1e-4, 5e-3)),
    )
    d_iso: float = field(
        default=3.0e-3,
        metadata=meta("Isotropic diffusivity", "NODDI's fixed free-water diffusivity", "mm²/s", (1e-4, 5e-3)),
    )
    lm_iterations: int = field(
        default=60, metadata=meta("LM iterations", "cap on Levenberg-Marquardt iterations", "", (0, 10**4))
    )
    burnin: int = field(
        default=500, metadata=meta("Burn-in", "MCMC iterations before samples are recorded", "", (0, 10**6))
    )
    njumps: int = field(default=500, metadata=meta("Jumps", "MCMC iterations recorded over", "", (1, 10**6)))
    sample_every: int = field(
        default=10, metadata=meta("Sample every", "record every n-th MCMC iteration", "", (1, 10**6))
    )
    # the same as the ball & sticks fit's (its chain adapts and seeds as this one does)
    update_every: int = same_as(BallStickParams, "update_every")
    b0_threshold: float = same_as(BallStickParams, "b0_threshold")
    seed: int = same_as(BallStickParams, "seed")

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if not (self.d_par > 0 and self.d_iso > 0):
            raise ValueError("d_par and d_iso must be positive (mm²/s, e.g. 1.7e-3 and 3e-3)")
        if self.d_par > 0.1 or self.d_iso > 0.1:
            raise ValueError("d_par and d_iso are in mm²/s (e.g. 1.7e-3); the values given look like µm²/ms")
        if self.lm_iterations < 0 or self.burnin < 0 or self.njumps < 1 or self.sample_every < 1:
            raise ValueError("lm_iterations and burnin must be ≥ 0, njumps and sample_every ≥ 1")
        if self.njumps < self.sample_every:
            raise ValueError(f"njumps ({self.njumps}) must be at least sample_every ({self.sample_every})")
        if self.update_every < 1 or not 0 <= self.seed < 2**63:
            raise ValueError("update_every must be ≥ 1 and seed a non-negative 63-bit integer")


@dataclass
class ModelFit:
    """Fitted values of N voxels (host arrays).

    values : {parameter: (N,)}, S0 in signal units, the others in their own units.
    std : {parameter: (N,)} posterior standard deviations (MCMC only, else None).
    derived : {map: (N,)} the model's derived maps (NDI, ODI, ...).
    directions : (N, K, 3) unit vectors of the K orientations, in the gradient frame.
    residual : (N,) root-mean-square residual, signal units.
    flags : (N,) uint8 (FLAG_*).
    """

    values: dict[str, np.ndarray]
    std: dict[str, np.ndarray] | None
    derived: dict[str, np.ndarray]
    directions: np.ndarray
    residual: np.ndarray
    flags: np.ndarray
    provenance: dict = field(default_factory=dict)

    def flag_counts(self) -> dict[str, int]:
        return flag_counts(self.flags, FLAG_NAMES)


def bytes_per_voxel(model: Model, m: int) -> int:
    """Peak working memory of one voxel: the batched Jacobian evaluation dominates (P + 1
    signal copies, each with ~24 temporaries of (M,) doubles in the dispersed compartments)."""
    p = 1 + len(model.parameters)
    return 8 * m * (p + 2) * 24 + 4096


def _principal(xp, tensors):
    """Principal unit vectors (N, K, 3) of symmetric (N, K, 3, 3) tensors."""
    n, k = tensors.shape[:2]
    _, vectors = xp.linalg.eigh(tensors.reshape(n * k, 3, 3))
    return vectors[:, :, -1].reshape(n, k, 3)


def _directions_from_values(xp, model: Model, values):
    out = xp.zeros((values.shape[0], len(model.orientations), 3))
    for k, (a, b) in enumerate(model.orientations):
        th, ph = values[:, 1 + model.names.index(a)], values[:, 1 + model.names.index(b)]
        out[:, k] = xp.stack([xp.sin(th) * xp.cos(ph), xp.sin(th) * xp.sin(ph), xp.cos(th)], axis=1)
    return out


def fit_model(
    model: Model,
    signal: np.ndarray,
    bvals: np.ndarray,
    bvecs: np.ndarray,
    params: ModelFitParams | None = None,
    *,
    device: str | Backend = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_voxels: int | None = None,
    on_batch: Callable[[np.ndarray, ModelFit], None] | None = None,
) -> ModelFit:
    """Fit ``model`` to the (N, M) ``signal``; ``bvecs`` (M, 3) unit vectors of the frame the
    orientations are to be given in. ``on_batch(voxel_indices, partial_fit)`` after each batch
    (maps can be shown as they are computed); ``cancelled()`` is polled between batches and
    between iterations."""
    params = params or ModelFitParams()
    backend = get_backend(device)
    xp = backend.xp
    signal = np.asarray(signal)
    bvals = np.asarray(bvals, dtype=np.float64)
    bvecs = np.array(bvecs, dtype=np.float64)
    n, m = signal.shape if signal.ndim == 2 else (0, 0)
    if signal.ndim != 2 or m != len(bvals) or bvecs.shape != (m, 3):
        raise ValueError(f"signal must be (voxels, {len(bvals)}) and bvecs ({len(bvals)}, 3)")
    b0 = bvals <= params.b0_threshold
    if not b0.any():
        raise ValueError("no b=0 measurement: the fit normalises by the b=0 signal")
    bvecs[b0] = 0.0
    names = ("s0", *model.names)
    values = np.zeros((n, len(names)))
    stds = np.zeros((n, len(names))) if params.method == "mcmc" else None
    directions = np.zeros((n, len(model.orientations), 3))
    residual = np.zeros(n)
    flags = np.zeros(n, dtype=np.uint8)
    timings = {"grid_s": 0.0, "lm_s": 0.0, "mcmc_s": 0.0, "transfer_s": 0.0, "compiled_cpu_s": 0.0}
    acq = Acquisition(bvals, bvecs, xp)
    # on the CPU, NODDI-Watson's grid and LM as compiled loops without the GIL (numba), which
    # scale with the threads; the array program otherwise (the same algorithm)
    compiled = compiled_fit(model, acq, on_cpu=not backend.is_gpu)

    def process(start: int, stop: int) -> None:
        t0 = time.perf_counter()
        y = xp.asarray(np.asarray(signal[start:stop], dtype=np.float64))
        scale = y[:, xp.asarray(b0)].mean(axis=1)
        good = xp.isfinite(y).all(axis=1) & (scale > 0)
        y = xp.where(good[:, None], y / xp.where(good, scale, 1.0)[:, None], 1.0)
        backend.synchronize()
        t1 = time.perf_counter()
        eigenvectors = tensor_orientations(xp, y, acq, params.b0_threshold)
        inside = 0.0  # CPU seconds of this thread in compiled loops (without the GIL)
        if compiled is None:
            start_values = grid_search(xp, model, acq, y, eigenvectors)
        else:
            start_values, inside = compiled.grid_search(y, orientation_start(xp, model, eigenvectors), cancelled)
        backend.synchronize()
        t2 = time.perf_counter()
        if compiled is None:
            fitted, cost = levenberg_marquardt(xp, model, acq, y, start_values, params.lm_iterations, cancelled)
        else:
            fitted, cost, lm_inside = compiled.levenberg_marquardt(y, start_values, params.lm_iterations, cancelled)
            inside += lm_inside
        failed = ~xp.isfinite(fitted).all(axis=1) | ~xp.isfinite(cost)
        fitted = xp.where(failed[:, None], start_values, fitted)
        backend.synchronize()
        t3 = time.perf_counter()
        std = None
        dirs = _directions_from_values(xp, model, fitted)
        if params.method == "mcmc":
            voxels = xp.arange(start, stop)
            fitted, std, dyadic, _rate = metropolis(
                xp,
                model,
                acq,
                y,
                fitted,
                voxels,
                burnin=params.burnin,
                njumps=params.njumps,
                sample_every=params.sample_every,
                update_every=params.update_every,
                seed=params.seed,
                cancelled=cancelled,
            )
            if model.orientations:
                dirs = _principal(xp, dyadic)
            backend.synchronize()
        t4 = time.perf_counter()
        if compiled is None:
            rms = xp.sqrt(((y - predict(xp, model, acq, fitted)) ** 2).mean(axis=1)) * scale
        else:
            rms, rms_inside = compiled.rms(y, fitted)
            rms, inside = rms * scale, inside + rms_inside
        fitted[:, 0] *= scale
        sl = slice(start, stop)
        ok = backend.to_host(good)
        values[sl] = np.where(ok[:, None], backend.to_host(fitted), 0.0)
        if std is not None:
            std[:, 0] *= scale
            stds[sl] = np.where(ok[:, None], backend.to_host(std), 0.0)
        directions[sl] = np.where(ok[:, None, None], backend.to_host(dirs), 0.0)
        residual[sl] = np.where(ok, backend.to_host(rms), 0.0)
        flags[sl] = np.where(ok, np.where(backend.to_host(failed), FLAG_NOT_CONVERGED, 0), FLAG_NOT_FITTED)
        with timings_lock:  # batches run on several threads on the CPU
            timings["grid_s"] += t2 - t1
            timings["lm_s"] += t3 - t2
            timings["mcmc_s"] += t4 - t3
            timings["transfer_s"] += (t1 - t0) + (time.perf_counter() - t4)
            timings["compiled_cpu_s"] += inside
        if on_batch is not None:
            on_batch(
                np.arange(start, stop),
                _assemble(
                    model, values[sl], None if stds is None else stds[sl], directions[sl], residual[sl], flags[sl]
                ),
            )

    t_start = time.perf_counter()
    maximum = batch_voxels or (131072 if backend.is_gpu else 2048)
    timings_lock = threading.Lock()
    # On the CPU, batches side by side on its cores (not with on_batch: its caller takes the
    # batches on this thread, in order)
    threads = None if backend.is_gpu or on_batch is not None else host_threads()
    run_batched(
        backend, n, bytes_per_voxel(model, m), process, progress=progress, cancelled=cancelled, maximum=maximum,
        threads=threads,
    )  # fmt: skip
    fit = _assemble(model, values, stds, directions, residual, flags)
    fit.provenance = {
        "model": model.name,
        "parameters": list(names),
        "params": asdict(params),
        "backend": backend.name,
        "device": backend.device_name,
        "voxels": int(n),
        "measurements": int(m),
        "fit_s": time.perf_counter() - t_start,
        "engine": "arrays" if compiled is None else "compiled",
        **timings,
    }
    return fit


def _assemble(model, values, stds, directions, residual, flags) -> ModelFit:
    parameters = all_parameters(model)
    names = [p.name for p in parameters]
    by_name = {name: values[:, i].copy() for i, name in enumerate(names)}
    bad = flags & FLAG_NOT_FITTED != 0
    # unfitted voxels hold zeros, which may lie on a bound (ODI 0: κ infinite): derive from the
    # parameters' starting values there, then zero the maps
    inside = {p.name: np.where(bad, p.default_start(), by_name[p.name]) for p in parameters}
    derived = model.derived(inside, np) if model.derived is not None else {}
    derived = {k: np.where(bad, 0.0, np.asarray(v, dtype=np.float64)) for k, v in derived.items()}
    std = None if stds is None else {name: stds[:, i].copy() for i, name in enumerate(names)}
    return ModelFit(by_name, std, derived, directions, residual, flags)
