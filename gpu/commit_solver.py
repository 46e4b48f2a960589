"""COMMIT's solver: FISTA (Beck & Teboulle 2009) on ``½‖Ax − y‖² + λ‖x_IC‖₁`` over ``x ≥ 0``
(Daducci et al. 2015; :mod:`gpu.commit`).

The fit runs on unit-norm columns (step 1/L, L from a power iteration on AᵀA) and stops when the
objective changes by less than ``tol`` relatively; A comes as any operator with ``a``, ``at``
and ``column_norms`` (:class:`gpu.commit_operator.NumpyOperator`,
:class:`gpu.commit_device.DeviceOperator`, ...). A streamline with weight 0 does not contribute
and is filtered out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .backend import Cancelled


@dataclass
class FitResult:
    """x (A's columns as given, ≥ 0), the iterations run, the objective per iteration, why it
    stopped, and timings."""

    x: np.ndarray
    iterations: int
    objective: list[float]
    stopped: str
    lipschitz: float
    seconds: float


def power_iteration(a, at, n: int, xp=np, iterations: int = 50, seed: int = 0) -> float:
    """Largest eigenvalue of AᵀA (the gradient's Lipschitz constant), with 1 % headroom."""
    v = xp.asarray(np.random.default_rng(seed).random(n))
    v /= xp.linalg.norm(v)
    value = 0.0
    for _ in range(iterations):
        w = at(a(v))
        value = float(xp.linalg.norm(w))
        if value == 0.0:
            return 1.0
        v = w / value
    return value * 1.01


def fista(
    a: Callable,
    at: Callable,
    y,
    n: int,
    *,
    scale=None,
    lambda_: float = 0.0,
    n_penalised: int = 0,
    max_iter: int = 1000,
    tol: float = 1e-3,
    xp=np,
    progress: Callable[[int, int, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    dtype=None,
    writes_into: bool = False,
) -> FitResult:
    """min ½‖A x − y‖² + λ Σ_{j < n_penalised} x_j over x ≥ 0 (on the columns divided by
    ``scale``: the returned x is for A itself). ``a``/``at`` apply A and Aᵀ on flat vectors
    of the array module ``xp``. Stops when the objective changes by less than ``tol``
    relatively between iterations (FISTA is not monotone: the change is taken as is).

    ``dtype``: the measurement-sized vectors' type (default float64; ``y`` is taken as it is
    when it has that type). ``writes_into``: ``a(v, out=)`` and ``at(r, out=)`` write into the
    given vectors (:class:`gpu.commit_host.HostOperator`) rather than allocate their results.

    Memory (:func:`fista_host_bytes`): besides ``y``, two measurement-sized vectors, A x and
    A z, rotated in place — the gradient's residual A z − y is formed in A z's own vector
    (A z is not needed after it), A x_new is then written there, and A z_new = A x_new + β
    (A x_new − A x) in A x's vector; the objective's residual is summed by blocks. The column
    vectors likewise: x, z and the gradient rotate, with ``1/scale``; no penalty vector."""
    t0 = time.perf_counter()
    dtype = xp.float64 if dtype is None else dtype
    scale = xp.ones(n) if scale is None else xp.asarray(scale)
    inv = xp.where(scale > 0, 1.0 / xp.where(scale > 0, scale, 1.0), 0.0)  # empty columns stay 0
    del scale  # the caller's, if it keeps one

    def a_s(v, out=None):
        v = v * inv
        if out is None:
            return a(v)
        if writes_into:
            a(v, out=out)
        else:
            out[...] = xp.ravel(a(v))
        return out

    def at_s(r, out=None):
        if out is None:
            return at(r) * inv
        if writes_into:
            at(r, out=out)
        else:
            out[...] = at(r)
        out *= inv
        return out

    y = xp.asarray(y, dtype=dtype).ravel()
    lipschitz = power_iteration(a_s, at_s, n, xp)
    step_penalty = lambda_ / lipschitz
    x = xp.zeros(n)
    z = xp.zeros(n)
    g = xp.empty(n)
    ax = xp.zeros_like(y)  # A x and A z are kept, so an iteration costs one A and one Aᵀ
    az = xp.zeros_like(y)
    t = 1.0
    objective: list[float] = []
    stopped = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        if cancelled is not None and cancelled():
            raise Cancelled()
        az -= y  # the residual at z, in A z's vector
        at_s(az, out=g)
        g /= lipschitz
        xp.subtract(z, g, out=g)  # x_new = max(z − ∇/L − λ/L on the penalised columns, 0), in g
        if n_penalised:
            g[:n_penalised] -= step_penalty
        x_new = xp.maximum(g, 0.0, out=g)
        ax_new = a_s(x_new, out=az)  # A x_new in A z's vector
        value = 0.5 * _residual_norm2(ax_new, y, xp) + lambda_ * float(x_new[:n_penalised].sum())
        objective.append(value)
        t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
        beta = (t - 1.0) / t_new
        # z_new = x_new + β (x_new − x) in x's vector, and A z_new alike in A x's vector
        x -= x_new
        x *= -beta
        x += x_new
        ax -= ax_new
        ax *= -beta
        ax += ax_new
        x, z, g = x_new, x, z
        ax, az = ax_new, ax
        t = t_new
        if progress is not None:
            progress(it, max_iter, value)
        if it > 1 and abs(objective[-2] - value) <= tol * max(abs(value), 1e-300):
            stopped = "tolerance"
            break
    return FitResult(x * inv, it, objective, stopped, lipschitz, time.perf_counter() - t0)


def power_iteration_fused(op, inv, n: int, iterations: int = 50, seed: int = 0) -> float:
    """:func:`power_iteration` of the scaled columns with ``op.fused`` (one visit of the voxel rows
    for Aᵀ A v: no measurement-sized vector), bit for bit its values."""
    v = np.random.default_rng(seed).random(n)
    v /= np.linalg.norm(v)
    w = np.empty(n)
    value = 0.0
    for _ in range(iterations):
        op.fused(v, inv, out=w)
        w *= inv
        value = float(np.linalg.norm(w))
        if value == 0.0:
            return 1.0
        np.divide(w, value, out=v)
    return value * 1.01


def fista_fused(
    op,
    y,
    n: int,
    *,
    scale,
    lambda_: float = 0.0,
    n_penalised: int = 0,
    max_iter: int = 1000,
    tol: float = 1e-3,
    progress: Callable[[int, int, float], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> FitResult:
    """:func:`fista` on the host for an operator with a fused step
    (:meth:`gpu.commit_host.HostOperator.step`): no measurement-sized vector besides ``y``.
    Each iteration's one visit of the voxel rows makes, row by row from the segments, A x_new
    (for the objective ‖A x_new − y‖²) and A z_new = (1 + β) A x_new − β A x (for the next
    gradient Aᵀ (A z_new − y)), both in float64; nothing of them is kept. The iterates are
    :func:`fista`'s, with A x and A z exact to float64 rather than rounded to float32 between
    iterations (the same weights to ~1e-6 relative on the test phantoms; a float64 :func:`fista`
    to ~1e-12). The last iteration makes A x_new only; one stopped by the tolerance has made one
    Aᵀ more than it uses.

    ``scale`` is turned into 1/scale in place (the caller's array: no copy); column vectors
    alive: x, z, the gradient and 1/scale (:data:`FISTA_FUSED_COLUMN_VECTORS`)."""
    t0 = time.perf_counter()
    inv = np.asarray(scale, dtype=np.float64)
    positive = inv > 0
    np.divide(1.0, inv, out=inv, where=positive)  # empty columns stay 0
    inv[~positive] = 0.0
    del positive
    y = np.asarray(y).ravel()
    if y.dtype not in (np.float32, np.float64):
        y = y.astype(np.float64)
    lipschitz = power_iteration_fused(op, inv, n)
    step_penalty = lambda_ / lipschitz
    x = np.zeros(n)
    z = np.zeros(n)
    g = op.at(y, out=np.empty(n))  # the gradient at z = 0, Aᵀ (0 − y): exactly −Aᵀ y
    np.negative(g, out=g)
    t = 1.0
    objective: list[float] = []
    stopped = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        if cancelled is not None and cancelled():
            raise Cancelled()
        g *= inv
        g /= lipschitz
        np.subtract(z, g, out=g)
        if n_penalised:
            g[:n_penalised] -= step_penalty
        x_new = np.maximum(g, 0.0, out=g)
        t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
        beta = (t - 1.0) / t_new
        # ‖A x_new − y‖², and the next gradient Aᵀ (A z_new − y) into z's vector (z is done)
        residual2 = op.step(x_new, x, inv, y, beta, out=z, transpose=it < max_iter)
        value = 0.5 * residual2 + lambda_ * float(x_new[:n_penalised].sum())
        objective.append(value)
        x -= x_new  # z_new = x_new + β (x_new − x) in x's vector
        x *= -beta
        x += x_new
        x, z, g = x_new, x, z
        t = t_new
        if progress is not None:
            progress(it, max_iter, value)
        if it > 1 and abs(objective[-2] - value) <= tol * max(abs(value), 1e-300):
            stopped = "tolerance"
            break
    del z, g
    x *= inv
    return FitResult(x, it, objective, stopped, lipschitz, time.perf_counter() - t0)


#: Column vectors :func:`fista_fused` keeps: x, z, the gradient and 1/scale (the caller's scale)
FISTA_FUSED_COLUMN_VECTORS = 4


#: Measurements summed at a time for the objective's ‖A x − y‖² (a float64 block of 8 MB)
RESIDUAL_BLOCK = 1 << 20


def _residual_norm2(ax, y, xp) -> float:
    """‖ax − y‖², in float64, by blocks (no measurement-sized temporary) on the host; on a GPU
    in one piece, as before (one temporary in device memory, one synchronisation per iteration
    rather than one per block)."""
    if xp is not np:
        d = ax.astype(xp.float64)
        d -= y
        return float(d @ d)
    total = 0.0
    for start in range(0, len(y), RESIDUAL_BLOCK):
        d = ax[start : start + RESIDUAL_BLOCK].astype(xp.float64)
        d -= y[start : start + RESIDUAL_BLOCK]
        total += float(d @ d)
    return total


#: FISTA's column vectors alive at once besides the operator's output: x, z, the gradient,
#: 1/scale, the caller's scale, the returned x and one temporary of x · 1/scale
FISTA_COLUMN_VECTORS = 7
#: ... and measurement-sized vectors besides y: A x and A z
FISTA_MEASUREMENT_VECTORS = 2


def fista_fused_host_bytes(n_cols: int, n_values: int) -> int:
    """Host bytes :func:`fista_fused` keeps besides ``y``, the operator and the caller's scale
    (which becomes 1/scale): x, z and the gradient; nothing per measurement (``n_values`` is
    taken for :func:`fista_host_bytes`' signature)."""
    return 8 * (FISTA_FUSED_COLUMN_VECTORS - 1) * n_cols


def fista_host_bytes(n_cols: int, n_values: int, itemsize: int = 8) -> int:
    """Host bytes :func:`fista` keeps besides ``y`` and the operator, with ``writes_into`` and
    measurement vectors of ``itemsize`` bytes: ``n_values`` = voxels × measurements."""
    return 8 * FISTA_COLUMN_VECTORS * n_cols + FISTA_MEASUREMENT_VECTORS * itemsize * n_values + 8 * RESIDUAL_BLOCK
