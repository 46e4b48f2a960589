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
) -> FitResult:
    """min ½‖A x − y‖² + λ Σ_{j < n_penalised} x_j over x ≥ 0 (on the columns divided by
    ``scale``: the returned x is for A itself). ``a``/``at`` apply A and Aᵀ on flat vectors
    of the array module ``xp``. Stops when the objective changes by less than ``tol``
    relatively between iterations (FISTA is not monotone: the change is taken as is)."""
    t0 = time.perf_counter()
    scale = xp.ones(n) if scale is None else xp.asarray(scale)
    inv = xp.where(scale > 0, 1.0 / xp.where(scale > 0, scale, 1.0), 0.0)  # empty columns stay 0

    def a_s(v):
        return a(v * inv)

    def at_s(r):
        return at(r) * inv

    y = xp.asarray(y, dtype=xp.float64).ravel()
    lipschitz = power_iteration(a_s, at_s, n, xp)
    penalty = xp.zeros(n)
    penalty[:n_penalised] = lambda_ / lipschitz
    x = xp.zeros(n)
    z = x.copy()
    ax = xp.zeros_like(y)  # A x and A z are kept, so an iteration costs one A and one Aᵀ
    az = ax.copy()
    # One scratch vector of the measurements for A z − y and the residual, and A z updated in
    # place: five measurement-sized vectors alive (y, A x, A z, the scratch, the new A x) rather
    # than seven or eight, with the same operations in the same order (the same numbers).
    scratch = xp.empty_like(y)
    t = 1.0
    objective: list[float] = []
    stopped = "max_iter"
    it = 0
    for it in range(1, max_iter + 1):
        if cancelled is not None and cancelled():
            raise Cancelled()
        xp.subtract(az, y, out=scratch)
        x_new = xp.maximum(z - at_s(scratch) / lipschitz - penalty, 0.0)
        ax_new = a_s(x_new)  # a new array (every operator's A allocates its result)
        residual = xp.subtract(ax_new, y, out=scratch)
        value = 0.5 * float(residual @ residual) + lambda_ * float(x_new[:n_penalised].sum())
        objective.append(value)
        t_new = (1.0 + np.sqrt(1.0 + 4.0 * t * t)) / 2.0
        beta = (t - 1.0) / t_new
        z = x_new + beta * (x_new - x)
        xp.subtract(ax_new, ax, out=az)  # az = ax_new + beta · (ax_new − ax), in A z's own vector
        az *= beta
        az += ax_new
        x, ax, t = x_new, ax_new, t_new
        if progress is not None:
            progress(it, max_iter, value)
        if it > 1 and abs(objective[-2] - value) <= tol * max(abs(value), 1e-300):
            stopped = "tolerance"
            break
    return FitResult(x * inv, it, objective, stopped, lipschitz, time.perf_counter() - t0)
