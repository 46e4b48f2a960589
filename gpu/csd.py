"""Constrained spherical deconvolution: fibre orientation distributions from diffusion signals.

The signal of a voxel is the fODF convolved with a response (the signal of one fibre, see
:mod:`gpu.csd_response`): in spherical harmonics S(b, g) = Σ_lm R_l(b) f_lm Y_lm(g), with
R_l = r_l / Y_l0(0) the rotational harmonics of the response (Funk-Hecke). Coefficients are
in MRtrix3's basis (:mod:`gpu.sh`) and the frame of the gradient directions given.

* Single-shell CSD (Tournier et al. 2007, NeuroImage 35:1459), one shell (the highest b):
  from the least-squares fODF truncated to l ≤ 4, directions of a dense hemisphere where the
  fODF is below τ × its mean amplitude (τ = 0.1) are penalised with weight λ (λ = 1, scaled
  by the number of measurements and the response as DIPY and MRtrix do) and the fit is
  repeated until that set stops changing ("super-resolved" when there are fewer measurements
  than coefficients). Batched: each voxel's normal equations AᵀA + λ² Σ_k∈neg c_k c_kᵀ are one
  matrix product over the voxels, solved as a batch of small systems.
* Multi-shell multi-tissue CSD (Jeurissen et al. 2014, NeuroImage 103:411): every shell (b=0
  included) is fitted at once with a WM fODF (lmax) and isotropic GM and CSF compartments,
  subject to the WM fODF ≥ 0 on 300 hemisphere directions and GM, CSF ≥ 0 — a quadratic
  program, solved exactly (as MRtrix's ICLS) by a batched active-set method on its dual,
  started from an interior point's guess (:mod:`gpu.csd_qp`). Both solvers compute in float64 on either backend.
  On the CPU with numba, single-shell CSD's iteration and the peak search run as compiled loops
  per voxel without the GIL (:mod:`gpu.csd_loops`: the same algorithms), so that batches on
  several threads scale with the cores.

Tissue compartments are the l=0 coefficients of isotropic ODFs (MRtrix ``dwi2fod msmt_csd``
writes the same for GM and CSF): a voxel's tissue signal fraction follows from them and the
responses (:func:`signal_fractions`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .backend import Backend, flag_counts, get_backend, run_batched
from .csd_peaks import PeakParams, compiled_peak_search, find_peaks
from .csd_qp import SharedQP, solve_batch
from .csd_response import Response, Shells, find_shells, response_rows
from .host import compile_or_uncached, host_threads, numba_module
from .params import meta
from .sh import Y00, degrees_orders, expand_per_coefficient, fibonacci_hemisphere, n_coefficients, sh_basis

FLAG_NONFINITE_SIGNAL = 1  #: NaN or Inf among the voxel's signals; not fitted.
FLAG_NOT_CONVERGED = 2  #: the solver stopped at its iteration limit.
FLAG_NAMES = {FLAG_NONFINITE_SIGNAL: "non-finite signal", FLAG_NOT_CONVERGED: "not converged"}

#: DIPY scales λ by √(its 362 regularisation directions); kept so λ = 1 means the same.
_DIPY_REGULARISATION_DIRECTIONS = 362.0


@dataclass(frozen=True)
class CSDParams:
    """Parameters of the CSD fit (defaults: Tournier 2007, Jeurissen 2014, DIPY, MRtrix).

    MD thresholds are in mm²/s (the units of the b-values' inverse when b is in s/mm²).
    """

    lmax: int = field(
        default=8, metadata=meta("SH order", "highest (even) spherical-harmonic order of the fODF", "", (2, 12))
    )
    msmt: bool = field(
        default=False,
        metadata=meta("Multi-shell multi-tissue", "multi-shell multi-tissue CSD (WM fODF, GM and CSF maps)"),
    )
    regularisation: float = field(
        default=1.0,
        metadata=meta("λ", "weight of the non-negativity penalty of single-shell CSD", "", (0.0, 100.0)),
    )
    threshold: float = field(
        default=0.1,
        metadata=meta(
            "τ",
            "fODF amplitudes below this fraction of the mean are penalised (single shell)",
            "",
            (0.0, 1.0),
        ),
    )
    max_iterations: int = field(
        default=50,
        metadata=meta("Iterations", "most iterations of the single-shell solver", "", (1, 1000)),
    )
    msmt_max_iterations: int = field(
        default=2000,
        metadata=meta(
            "Solver steps",
            "most batched solves (interior point, active-set changes) of the exact multi-tissue solver",
            "",
            (10, 100000),
        ),
    )
    constraint_directions: int = field(
        default=300,
        metadata=meta("Constraint directions", "hemisphere directions where the fODF must be ≥ 0", "", (60, 5000)),
    )
    fa_threshold: float = field(
        default=0.7,
        metadata=meta("Single-fibre FA", "voxels above this FA give the (WM) response", "", (0.3, 0.99)),
    )
    gm_fa: float = field(
        default=0.2, metadata=meta("GM FA below", "grey-matter response voxels: FA below", "", (0.0, 1.0))
    )
    gm_md: float = field(default=0.0011, metadata=meta("GM MD below", "grey-matter response voxels: MD below", "mm²/s"))
    csf_fa: float = field(default=0.1, metadata=meta("CSF FA below", "CSF response voxels: FA below", "", (0.0, 1.0)))
    csf_md: float = field(default=0.0025, metadata=meta("CSF MD above", "CSF response voxels: MD above", "mm²/s"))
    b0_threshold: float = field(
        default=50.0, metadata=meta("b=0 threshold", "b-values up to this count as b=0", "s/mm²", (0.0, 500.0))
    )

    def __post_init__(self):
        if self.lmax < 2 or self.lmax % 2 or self.lmax > 12:
            raise ValueError(f"lmax must be an even order from 2 to 12, got {self.lmax}")
        if self.regularisation < 0 or not 0 <= self.threshold <= 1:
            raise ValueError("λ must be ≥ 0 and τ in [0, 1]")
        if self.max_iterations < 1 or self.msmt_max_iterations < 1:
            raise ValueError("the iteration limit must be ≥ 1")
        if self.constraint_directions < 60:
            raise ValueError("at least 60 constraint directions are needed")


@dataclass
class CSDModel:
    """What a fit needs beyond the signals, built once on the host (:func:`build_model`).

    volumes : indices of the volumes fitted (single shell: the shell's; MSMT: all).
    design : (K, P) signal = design @ x; x = the WM fODF's C coefficients, then the
        isotropic tissues' l=0 coefficients (``tissues[1:]``).
    constraint : (D, C) fODF amplitudes on the constraint directions.
    """

    lmax: int
    msmt: bool
    shells: Shells
    responses: dict[str, Response]
    volumes: np.ndarray
    design: np.ndarray
    constraint: np.ndarray
    tissues: tuple[str, ...]
    shell_used: float | None = None

    @property
    def n_sh(self) -> int:
        return n_coefficients(self.lmax)


def minimum_directions(lmax: int) -> int:
    """Directions needed on a shell for an unconstrained fit up to ``lmax`` (its coefficient count)."""
    return n_coefficients(lmax)


def build_model(bvals: np.ndarray, bvecs: np.ndarray, responses: dict[str, Response], params: CSDParams) -> CSDModel:
    """Design and constraint matrices for the acquisition; ValueError names what is unusable.

    ``responses`` holds ``"wm"`` (and for MSMT ``"gm"``, ``"csf"``), each with a row for
    every shell used. Single-shell CSD uses the highest shell and may be super-resolved down
    to 15 directions (the l ≤ 4 start); MSMT needs at least two b-values besides b=0 (or
    b=0 and one shell, as Jeurissen et al. for two tissues) and at least as many measurements
    as unknowns.
    """
    bvals = np.asarray(bvals, dtype=np.float64)
    bvecs = np.array(bvecs, dtype=np.float64)
    shells = find_shells(bvals, params.b0_threshold)
    weighted = shells.weighted
    if not weighted:
        raise ValueError("no diffusion-weighted volumes (every b-value is at or below the b=0 threshold)")
    lmax, n_sh = params.lmax, n_coefficients(params.lmax)
    constraint = sh_basis(np, fibonacci_hemisphere(params.constraint_directions), lmax)
    if params.msmt:
        tissues = ("wm", "gm", "csf")
        if len(weighted) < 2:
            raise ValueError(
                f"multi-shell multi-tissue CSD needs at least two b-value shells above b=0; "
                f"this acquisition has one (b={shells.bvalues[weighted[0]]:g})"
            )
        if not shells.has_b0:
            tissues = ("wm", "gm", "csf")  # b=0 is not required: every shell informs the tissues
        volumes = np.flatnonzero(shells.of_volume >= 0)
        shell_used = None
    else:
        tissues = ("wm",)
        top = weighted[-1]
        volumes = shells.volumes(top)
        shell_used = float(shells.bvalues[top])
    missing = [t for t in tissues if t not in responses]
    if missing:
        raise ValueError(f"missing response(s): {', '.join(missing)}")
    k = len(volumes)
    low = n_coefficients(min(4, lmax))
    if not params.msmt and k < low:
        raise ValueError(
            f"{k} directions on the b={shell_used:g} shell are too few for CSD "
            f"(at least {low} are needed; {n_sh} for lmax {lmax} without super-resolution): use a lower --lmax"
        )
    unknowns = n_sh + len(tissues) - 1
    if params.msmt:
        for s in weighted:
            count = len(shells.volumes(s))
            if count < n_coefficients(min(4, lmax)):
                raise ValueError(
                    f"{count} directions on the b={shells.bvalues[s]:g} shell are too few for lmax {lmax} "
                    f"(at least {n_coefficients(min(4, lmax))}): use a lower --lmax"
                )
        if k < unknowns:
            raise ValueError(f"{k} measurements for {unknowns} unknowns (lmax {lmax}, 3 tissues): use a lower --lmax")
    directions = bvecs[volumes].copy()
    directions[~np.isfinite(directions).all(axis=1) | (np.linalg.norm(directions, axis=1) < 1e-6)] = (0.0, 0.0, 1.0)
    basis = sh_basis(np, directions, lmax)
    design = np.zeros((k, unknowns))
    for tissue_index, tissue in enumerate(tissues):
        rows = response_rows(responses[tissue], shells, lmax)  # (S, lmax/2+1)
        rh = np.stack([expand_per_coefficient(_rotational(row), lmax) for row in rows])  # (S, C)
        per_volume = rh[shells.of_volume[volumes]]
        if tissue_index == 0:
            design[:, :n_sh] = basis * per_volume
        else:
            design[:, n_sh + tissue_index - 1] = per_volume[:, 0] * Y00
    return CSDModel(lmax, params.msmt, shells, responses, volumes, design, constraint, tissues, shell_used)


def _rotational(row: np.ndarray) -> np.ndarray:
    degrees = np.arange(0, 2 * len(row), 2)
    return np.asarray(row, dtype=np.float64) / np.sqrt((2 * degrees + 1) / (4 * np.pi))


@dataclass
class CSDFit:
    """Result of a CSD fit over N voxels; host NumPy arrays.

    sh : (N, C) float32 WM fODF coefficients (MRtrix basis, the bvecs' frame).
    tissues : (N, T) float32 l=0 coefficients of GM and CSF (MSMT; T = 0 otherwise).
    peaks : (N, P, 3) float32 unit peak directions; peak_values : (N, P) their amplitudes.
    flags : (N,) uint8 (FLAG_*).
    """

    sh: np.ndarray
    tissues: np.ndarray
    peaks: np.ndarray
    peak_values: np.ndarray
    flags: np.ndarray
    provenance: dict = field(default_factory=dict)

    def flag_counts(self) -> dict[str, int]:
        """How many voxels carry each flag, by name (only flags that occur)."""
        return flag_counts(self.flags, FLAG_NAMES)


def signal_fractions(model: CSDModel, sh: np.ndarray, tissues: np.ndarray, shell: int | None = None) -> np.ndarray:
    """(N, T) fraction of each tissue's signal at b=0 (or ``shell``): WM, then GM, CSF."""
    shell = 0 if shell is None else shell
    parts = []
    for index, tissue in enumerate(model.tissues):
        r0 = response_rows(model.responses[tissue], model.shells, model.lmax)[shell, 0]
        coefficient = sh[:, 0] if index == 0 else tissues[:, index - 1]
        parts.append(r0 * math.sqrt(4 * math.pi) * Y00 * coefficient)
    parts = np.stack(parts, axis=1)
    total = parts.sum(axis=1, keepdims=True)
    return np.divide(parts, total, out=np.zeros_like(parts), where=total > 0)


# ----------------------------------------------------------------------- single-shell solver
def _ssst_batch(xp, signal, model: CSDModel, params: CSDParams):
    """Tournier's iteration for a batch (n, K) on ``xp``; float64. Returns (sh, iterations, converged)."""
    A = xp.asarray(model.design)
    n_sh = model.n_sh
    low = n_coefficients(min(4, model.lmax))
    C = xp.asarray(model.constraint)  # (D, n_sh)
    r0 = float(model.design[:, 0].mean() / Y00)  # R_0 of the response (column 0 is R_0 · Y00)
    # DIPY's scaling (Tournier 2012): λ · C · R_0 / √(D · 362), D the penalty directions
    lam = params.regularisation * n_sh * r0 / math.sqrt(C.shape[0] * _DIPY_REGULARISATION_DIRECTIONS)
    P = A.T @ A
    rhs = signal @ A  # (n, C)
    pinv_low = xp.asarray(np.linalg.pinv(model.design[:, :low]))
    f_low = signal @ pinv_low.T
    threshold = params.threshold * Y00 * f_low[:, 0]
    negative = (f_low @ C[:, :low].T) < threshold[:, None]  # (n, D)
    outer = (C[:, :, None] * C[:, None, :]).reshape(C.shape[0], n_sh * n_sh) * (lam * lam)
    ridge = xp.eye(n_sh) * (1e-10 * float(np.trace(model.design.T @ model.design)) / n_sh)
    sh = xp.zeros((signal.shape[0], n_sh))
    active = xp.arange(signal.shape[0])
    iterations = 0
    while active.size and iterations < params.max_iterations:
        iterations += 1
        w = negative[active].astype(xp.float64)
        normal = (w @ outer).reshape(-1, n_sh, n_sh) + (P + ridge)
        solution = xp.linalg.solve(normal, rhs[active][:, :, None])[:, :, 0]
        sh[active] = solution
        now = (solution @ C.T) < threshold[active][:, None]
        changed = (now != negative[active]).any(axis=1)
        negative[active] = now
        active = active[changed]
    converged = xp.ones(signal.shape[0], dtype=bool)
    converged[active] = False
    return sh, iterations, converged


def _ssst_compiled(model: CSDModel, params: CSDParams):
    """:func:`_ssst_batch` as a compiled loop per voxel (:mod:`gpu.csd_loops`), or None when it
    cannot run here (numba missing); ``solve(batch) -> (sh, iterations, converged)`` on the host."""
    if numba_module() is None:
        return None
    design = np.ascontiguousarray(model.design)
    n_sh, low = model.n_sh, n_coefficients(min(4, model.lmax))
    constraint = np.ascontiguousarray(model.constraint)
    r0 = float(model.design[:, 0].mean() / Y00)
    lam = params.regularisation * n_sh * r0 / math.sqrt(constraint.shape[0] * _DIPY_REGULARISATION_DIRECTIONS)
    base = design.T @ design + np.eye(n_sh) * (1e-10 * float(np.trace(design.T @ design)) / n_sh)
    pinv_low = np.ascontiguousarray(np.linalg.pinv(design[:, :low]))
    args = (design, base, pinv_low, constraint, lam * lam, params.threshold * Y00, params.max_iterations)

    def loops():
        from . import csd_loops

        return csd_loops.ssst_voxels

    def first_call(loop):
        loop(np.zeros((0, design.shape[0])), *args, np.zeros((0, n_sh)), np.zeros(0, np.int64))

    loop = compile_or_uncached(loops, first_call, "csd_loops")

    def solve(batch: np.ndarray):
        sh, iterations = np.zeros((len(batch), n_sh)), np.zeros(len(batch), np.int64)
        t = time.thread_time()
        loop(np.ascontiguousarray(batch), *args, sh, iterations)
        inside[threading.get_ident()] = inside.get(threading.get_ident(), 0.0) + time.thread_time() - t
        return sh, int(np.abs(iterations).max(initial=0)), iterations > 0

    inside = {}  # CPU seconds each thread spent in the loop (without the GIL), by thread
    solve.cpu_seconds = lambda: sum(inside.values())

    return solve


# ------------------------------------------------------------------------ multi-tissue solver
def constraint_matrix(model: CSDModel) -> np.ndarray:
    """(M, P) rows whose products with x must be ≥ 0: fODF amplitudes, then each isotropic tissue."""
    n_sh, n_unknowns = model.n_sh, model.design.shape[1]
    n_iso = n_unknowns - n_sh
    G = np.zeros((model.constraint.shape[0] + n_iso, n_unknowns))
    G[: model.constraint.shape[0], :n_sh] = model.constraint
    G[model.constraint.shape[0] :, n_sh:] = np.eye(n_iso)
    return G / np.linalg.norm(G, axis=1, keepdims=True)


def shared_program(model: CSDModel) -> SharedQP:
    """The multi-tissue program's voxel-independent matrices (H = AᵀA, G), factored once."""
    return SharedQP.from_matrices(model.design.T @ model.design, constraint_matrix(model))


def _msmt_batch(xp, signal, model: CSDModel, params: CSDParams, shared: SharedQP | None = None):
    """min ‖A x - S‖² with G x ≥ 0 for a batch (n, K), exactly (:func:`gpu.csd_qp.solve_batch`).

    Returns (x (n, P), iterations, converged).
    """
    shared = shared or shared_program(model)
    x, _, iterations, converged = solve_batch(xp, signal @ xp.asarray(model.design), shared, params.msmt_max_iterations)
    return x, iterations, converged


# ----------------------------------------------------------------------------- the fit
def fit_csd(
    signal: np.ndarray,
    model: CSDModel,
    params: CSDParams | None = None,
    peak_params: PeakParams | None = None,
    *,
    device: str | Backend = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_voxels: int | None = None,
) -> CSDFit:
    """Fit fODFs (and tissue maps) to the (N, K) signals of N voxels, then find their peaks.

    Batches are sized from the device's free memory (halved and retried on out-of-memory);
    ``progress(done, total)`` after each batch, ``cancelled()`` polled between batches.
    Voxels with a NaN or Inf signal are left at zero and flagged.
    """
    params = params or CSDParams(msmt=model.msmt, lmax=model.lmax)
    peak_params = peak_params or PeakParams()
    backend = get_backend(device)
    xp = backend.xp
    signal = np.asarray(signal)
    n = signal.shape[0]
    n_sh, n_iso = model.n_sh, model.design.shape[1] - model.n_sh
    out = {
        "sh": np.zeros((n, n_sh), np.float32),
        "tissues": np.zeros((n, n_iso), np.float32),
        "peaks": np.zeros((n, peak_params.n_peaks, 3), np.float32),
        "peak_values": np.zeros((n, peak_params.n_peaks), np.float32),
        "flags": np.zeros(n, np.uint8),
    }
    dtype = np.float64  # the constrained systems need it; the GPU's float64 is fast enough (see README)
    m = model.constraint.shape[0] + n_iso
    unknowns = n_sh + n_iso
    # the normal matrices and their factorisation, the active sets, amplitudes, the signal
    per_voxel = 8 * (3 * unknowns * unknowns + 3 * m + 4 * unknowns) + signal.shape[1] * 12
    if model.msmt:  # the interior point's normal matrices, factors, steps; the active set's systems
        per_voxel += 8 * (4 * unknowns * unknowns + 14 * m)
    per_voxel = max(per_voxel, 8 * 1200 * 3 + 2000)  # the peak search's dense sphere
    stats = {"transfer_s": 0.0, "compute_s": 0.0, "peaks_s": 0.0, "batches": 0, "max_iterations_used": 0}
    stats["not_converged_per_batch"] = []  # voxels each batch left at the iteration limit
    volumes = model.volumes
    shared = shared_program(model) if model.msmt else None
    # on the CPU, single-shell CSD's iteration as a compiled loop per voxel without the GIL
    # (numba), which scales with the threads; the array program otherwise (the same algorithm)
    compiled = None if model.msmt or backend.is_gpu else _ssst_compiled(model, params)
    compiled_peaks = None if backend.is_gpu else compiled_peak_search(model.lmax, peak_params)
    peaks_inside = {}  # CPU seconds each thread spent in the compiled peak search, by thread

    # The volumes fitted, as a slice when they are a run (MSMT: all of them), so that a batch goes
    # to the device straight from the caller's array instead of through a gathered host copy
    # (a third of the whole-brain fit's time on the H100 went to that copy).
    run = volumes.size and np.array_equal(volumes, np.arange(volumes[0], volumes[0] + volumes.size))
    columns = slice(int(volumes[0]), int(volumes[0]) + volumes.size) if run else volumes

    def process(start: int, stop: int) -> None:
        t0 = time.perf_counter()
        rows = signal[start:stop]
        batch = backend.asarray(rows[:, columns] if run else np.ascontiguousarray(rows[:, columns]))
        backend.synchronize()
        t1 = time.perf_counter()
        finite = xp.isfinite(batch).all(axis=1)
        batch = xp.where(finite[:, None], batch, 0).astype(xp.float64)
        if model.msmt:
            x, iterations, converged = _msmt_batch(xp, batch, model, params, shared)
            sh, iso = x[:, :n_sh], x[:, n_sh:]
        else:
            solve = compiled or (lambda b: _ssst_batch(xp, b, model, params))
            sh, iterations, converged = solve(batch)
            iso = xp.zeros((stop - start, 0))
        sh = xp.where(finite[:, None], sh, 0)
        iso = xp.where(finite[:, None], xp.maximum(iso, 0), 0)
        backend.synchronize()
        t2 = time.perf_counter()
        if compiled_peaks is None:
            directions, amplitudes = find_peaks(xp, sh.astype(dtype), model.lmax, peak_params)
        else:
            t = time.thread_time()
            directions, amplitudes = compiled_peaks(sh)
            peaks_inside[threading.get_ident()] = peaks_inside.get(threading.get_ident(), 0.0) + time.thread_time() - t
        backend.synchronize()
        t3 = time.perf_counter()
        flags = (~finite).astype(xp.uint8) * FLAG_NONFINITE_SIGNAL + (finite & ~converged).astype(
            xp.uint8
        ) * FLAG_NOT_CONVERGED
        for key, value in (
            ("sh", sh),
            ("tissues", iso),
            ("peaks", directions),
            ("peak_values", amplitudes),
            ("flags", flags),
        ):
            out[key][start:stop] = backend.to_host(value)
        with stats_lock:  # batches run on several threads on the CPU
            stats["transfer_s"] += (t1 - t0) + (time.perf_counter() - t3)
            stats["compute_s"] += t2 - t1
            stats["peaks_s"] += t3 - t2
            stats["batches"] += 1
            stats["max_iterations_used"] = max(stats["max_iterations_used"], int(iterations))
            not_converged[start] = int((finite & ~converged).sum())

    stats_lock, not_converged = threading.Lock(), {}
    threads = None if backend.is_gpu else host_threads()  # batches side by side on the CPU's cores
    run_batched(
        backend, n, per_voxel, process, progress=progress, cancelled=cancelled, maximum=batch_voxels, threads=threads
    )
    stats["not_converged_per_batch"] = [not_converged[start] for start in sorted(not_converged)]
    stats["compiled_cpu_s"] = (0.0 if compiled is None else compiled.cpu_seconds()) + sum(peaks_inside.values())
    fit = CSDFit(**out)
    fit.provenance = {
        "method": "msmt-csd (Jeurissen 2014)" if model.msmt else "csd (Tournier 2007)",
        "solver": "exact active set (dual Lawson-Hanson from an interior point's start)"
        if model.msmt
        else "iterative constrained least squares",
        "lmax": model.lmax,
        "tissues": list(model.tissues),
        "shell_used": model.shell_used,
        "shells": [float(b) for b in model.shells.bvalues],
        "precision": np.dtype(dtype).name,
        "engine": "arrays" if compiled is None else "compiled",
        "peak_engine": "arrays" if compiled_peaks is None else "compiled",
        "backend": backend.name,
        "device": backend.device_name,
        "voxels": n,
        "volumes": len(volumes),
        "peaks": {
            "n_peaks": peak_params.n_peaks,
            "relative_threshold": peak_params.relative_threshold,
            "min_separation_deg": peak_params.min_separation_deg,
        },
        **stats,
    }
    return fit


__all__ = [
    "FLAG_NONFINITE_SIGNAL",
    "FLAG_NOT_CONVERGED",
    "CSDFit",
    "CSDModel",
    "CSDParams",
    "build_model",
    "degrees_orders",
    "fit_csd",
    "minimum_directions",
    "signal_fractions",
]
