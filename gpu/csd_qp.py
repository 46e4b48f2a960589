"""Exact batched solver of the multi-tissue CSD quadratic program, on NumPy and CuPy alike.

Multi-shell multi-tissue CSD (Jeurissen et al. 2014, NeuroImage 103:411) fits every voxel by

    min_x ½ xᵀ H x − qᵀ x   subject to   G x ≥ 0,

with H = AᵀA and q = Aᵀ y (A the design, y the voxel's signals) and G the constraint rows
(fODF amplitudes on a dense hemisphere, the isotropic tissues). H and G are the same for
every voxel; only q differs. The program is solved through its dual (Goldfarb & Idnani 1983
take the same route): with x(λ) = H⁻¹(q + Gᵀλ) the dual is the non-negative least-squares
problem

    min_{λ ≥ 0} ½ λᵀ Q λ + λᵀ G H⁻¹ q,   Q = G H⁻¹ Gᵀ (shared),

whose gradient is the primal slack G x(λ). It is solved exactly by the Lawson–Hanson active
set method (Lawson & Hanson 1974, ch. 23), batched: every voxel keeps its own passive set
(the active constraints of the primal), and one iteration solves each voxel's equality
system Q_PP λ_P = −(G H⁻¹ q)_P — the Schur complement of the KKT system on its active
constraints — gathered from the shared Q and padded to the batch's largest set, as one
batched solve. A voxel whose solution is positive adds its most violated constraint (steepest edge: the violation
over √Q_jj, its length in the H metric); one
whose solution is not steps back to the boundary and drops the constraints that reach zero.
It stops when no constraint is violated by more than ``tolerance`` × ‖x‖, where the KKT
conditions (stationarity, primal and dual feasibility, complementarity) hold to rounding.
Everything is float64 on the array module given (``numpy`` or ``cupy``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Violations smaller than this times the norm of the voxel's solution count as satisfied.
DEFAULT_TOLERANCE = 1e-10


@dataclass
class SharedQP:
    """The voxel-independent parts of the program, factored once (host NumPy, float64).

    hessian_inverse : (P, P) H⁻¹; constraint : (M, P) G; gain : (P, M) H⁻¹ Gᵀ;
    dual_hessian : (M, M) Q = G H⁻¹ Gᵀ.
    """

    hessian_inverse: np.ndarray
    constraint: np.ndarray
    gain: np.ndarray
    dual_hessian: np.ndarray

    @classmethod
    def from_matrices(cls, hessian: np.ndarray, constraint: np.ndarray) -> SharedQP:
        hessian = np.asarray(hessian, dtype=np.float64)
        constraint = np.asarray(constraint, dtype=np.float64)
        # inverse through the Cholesky factor: H is symmetric positive definite
        factor_inverse = np.linalg.inv(np.linalg.cholesky(hessian))
        hessian_inverse = factor_inverse.T @ factor_inverse
        gain = hessian_inverse @ constraint.T
        dual_hessian = constraint @ gain
        return cls(hessian_inverse, constraint, gain, 0.5 * (dual_hessian + dual_hessian.T))


def solve_batch(
    xp,
    linear: object,
    shared: SharedQP,
    max_iterations: int,
    tolerance: float = DEFAULT_TOLERANCE,
):
    """Solve min ½ xᵀHx − qᵀx s.t. Gx ≥ 0 for each row q of ``linear`` (n, P) on ``xp``.

    Returns (x (n, P), multipliers λ (n, M), iterations, converged (n,) bool): x = H⁻¹(q + Gᵀλ),
    λ ≥ 0, λ = 0 where Gx > 0. ``iterations`` counts the batched solves; voxels still
    working after ``max_iterations`` are returned as they stand (feasible for the dual, maybe
    not for the primal) with ``converged`` False.
    """
    linear = xp.asarray(linear, dtype=xp.float64)
    n = linear.shape[0]
    n_constraints = shared.constraint.shape[0]
    G = xp.asarray(shared.constraint)
    gain_t = xp.asarray(shared.gain.T)  # (M, P)
    Q = xp.asarray(shared.dual_hessian)
    x_free = linear @ xp.asarray(shared.hessian_inverse)  # unconstrained optimum (H symmetric)
    slack_free = x_free @ G.T  # (n, M): the dual's linear term, G H⁻¹ q
    threshold = tolerance * xp.maximum(xp.linalg.norm(x_free, axis=1), 1e-300)
    edge = 1.0 / xp.sqrt(xp.asarray(np.diag(shared.dual_hessian)))[None, :]  # steepest edge in the H metric
    # a tiny ridge keeps the gathered systems regular when constraints are nearly dependent
    ridge = 1e-13 * float(np.trace(shared.dual_hessian)) / n_constraints
    multipliers = xp.zeros((n, n_constraints))
    passive = xp.zeros((n, n_constraints), dtype=bool)
    x = x_free.copy()
    working = xp.arange(n)
    iterations = 0
    while working.size and iterations < max_iterations:
        iterations += 1
        trial, index, valid = _solve_passive(xp, passive[working], slack_free[working], Q, ridge)
        lam = multipliers[working]
        current = xp.take_along_axis(lam, index, axis=1)
        feasible = ((trial > 0) | ~valid).all(axis=1)
        # infeasible: move from λ towards the trial point until the first multiplier reaches 0
        blocking = valid & (trial <= 0)
        ratio = xp.where(blocking, current / xp.where(blocking, current - trial, 1.0), xp.inf)
        first = ratio.min(axis=1)
        step = xp.where(feasible, 1.0, xp.clip(first, 0.0, 1.0))
        new = current + step[:, None] * (trial - current)
        new = xp.where(valid, new, 0.0)
        # the blocking multiplier leaves even when rounding keeps it a hair above zero
        dropped = ~feasible[:, None] & valid & ((new <= 0) | (ratio <= first[:, None]))
        rows = xp.arange(working.size)[:, None]
        lam[:] = 0.0
        lam[rows, index] = xp.where(valid & ~dropped, xp.maximum(new, 0.0), 0.0)
        still = passive[working]
        # clear the dropped constraints (index entries of invalid slots are harmless: not passive)
        drop_mask = xp.zeros_like(still)
        drop_mask[rows, index] = dropped
        still &= ~drop_mask
        xw = x_free[working] + lam @ gain_t
        slack = xw @ G.T
        violated = xp.where(still, xp.inf, slack)
        worst = (violated * edge).argmin(axis=1)
        worst_value = violated[xp.arange(working.size), worst]
        add = feasible & (worst_value < -threshold[working])
        done = feasible & ~add
        still[xp.flatnonzero(add), worst[add]] = True
        passive[working] = still
        multipliers[working] = lam
        x[working] = xw
        working = working[~done]
    converged = xp.ones(n, dtype=bool)
    converged[working] = False
    return x, multipliers, iterations, converged


def _solve_passive(xp, passive, slack_free, Q, ridge):
    """Each voxel's Q_PP λ_P = −(G H⁻¹ q)_P, padded to the largest passive set of the batch.

    Returns (λ_P (n, k), the constraint index of each slot (n, k), valid slots (n, k)).
    """
    n = passive.shape[0]
    counts = passive.sum(axis=1)
    k = max(1, int(counts.max()) if n else 0)  # one padded slot at least: reductions need it
    # passive constraints first, in index order (a stable sort of the complement)
    index = xp.argsort((~passive).astype(xp.int8), axis=1, kind="stable")[:, :k]
    valid = xp.arange(k)[None, :] < counts[:, None]
    system = Q[index[:, :, None], index[:, None, :]]
    pair = valid[:, :, None] & valid[:, None, :]
    eye = xp.eye(k, dtype=bool)[None]
    system = xp.where(pair, system, 0.0) + xp.where(eye, xp.where(valid[:, :, None], ridge, 1.0), 0.0)
    rhs = xp.where(valid, -xp.take_along_axis(slack_free, index, axis=1), 0.0)
    trial = xp.linalg.solve(system, rhs[:, :, None])[:, :, 0]
    return trial, index, valid


def kkt_residuals(x, multipliers, linear, hessian, constraint) -> dict[str, np.ndarray]:
    """Per-voxel KKT residuals of the program, relative to ‖q‖ (host NumPy arrays).

    stationarity ‖Hx − q − Gᵀλ‖, infeasibility max(−Gx, 0), dual infeasibility
    max(−λ, 0), complementarity max|λ_i (Gx)_i| / ‖q‖.
    """
    x, lam, q = (np.asarray(a, dtype=np.float64) for a in (x, multipliers, linear))
    scale = np.maximum(np.linalg.norm(q, axis=1), 1e-300)
    slack = x @ constraint.T
    x_scale = np.maximum(np.linalg.norm(x, axis=1), 1e-300)
    return {
        "stationarity": np.linalg.norm(x @ hessian - q - lam @ constraint, axis=1) / scale,
        "primal": np.maximum(-slack, 0).max(axis=1) / x_scale,
        "dual": np.maximum(-lam, 0).max(axis=1) / scale,
        "complementarity": np.abs(lam * slack).max(axis=1) / (scale * x_scale),
    }


__all__ = ["DEFAULT_TOLERANCE", "SharedQP", "kkt_residuals", "solve_batch"]
