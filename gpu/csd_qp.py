"""Exact batched solver of the multi-tissue CSD quadratic program, on NumPy and CuPy alike.

Multi-shell multi-tissue CSD (Jeurissen et al. 2014, NeuroImage 103:411) fits every voxel by

    min_x ½ xᵀ H x − qᵀ x   subject to   G x ≥ 0,

with H = AᵀA and q = Aᵀ y (A the design, y the voxel's signals) and G the constraint rows
(fODF amplitudes on a dense hemisphere, the isotropic tissues). H and G are the same for
every voxel; only q differs. The solver runs in three stages, each batched over voxels:

1. The unconstrained optimum H⁻¹q; voxels where it is feasible are done.
2. A primal-dual interior-point method (Mehrotra's predictor-corrector, as in Nocedal &
   Wright 2006, §16.6) on the program scaled per voxel (H by its mean eigenvalue, x by the
   norm of the unconstrained optimum): slacks s = Gx ≥ 0 and multipliers λ ≥ 0 are driven
   together to complementarity. Each iteration factors every voxel's P × P normal matrix
   H + Gᵀ diag(λ/s) G once (one batched GEMM over the voxels builds them, one batched
   Cholesky factors them) and solves it for the predictor and the corrector. A voxel leaves
   after ``interior_iterations`` or as soon as its mean complementarity sᵀλ/M falls below
   1e-12 (12.5 iterations on average on the benchmark's phantom); its guessed active set is
   {i : λ_i > s_i}, and its multipliers there are where the next stage starts.
3. The exact answer: the Lawson–Hanson active-set method (Lawson & Hanson 1974, ch. 23) on
   the dual, started from that guess. With x(λ) = H⁻¹(q + Gᵀλ) the dual is the
   non-negative least-squares problem

       min_{λ ≥ 0} ½ λᵀ Q λ + λᵀ G H⁻¹ q,   Q = G H⁻¹ Gᵀ (shared),

   whose gradient is the primal slack G x(λ) (Goldfarb & Idnani 1983 take the same route).
   Every voxel keeps its own passive set (the active constraints of the primal); one
   iteration solves each voxel's Q_PP λ_P = −(G H⁻¹ q)_P — the Schur complement of the KKT
   system on its active constraints, gathered from the shared Q and padded to the batch's
   largest set — as one batched solve. A voxel whose solution is positive takes it and adds
   its most violated constraint (steepest edge: the violation over √Q_jj, its length in the H
   metric); one whose solution is not moves from its multipliers towards it until the first
   reaches zero and drops the constraints that reach zero — and, where that step moved, adds
   the most violated constraint at once. Lawson–Hanson needs only a dual-feasible start
   (λ ≥ 0, the passive set its support), which the interior point's multipliers are, so it
   ends after finitely many changes whatever the guess; from the interior point's it usually
   ends after the first or second solve (1.3 a voxel on the benchmark's phantom).

A voxel stops when no constraint is violated by more than ``tolerance`` × ‖x‖, where the KKT
conditions (stationarity, primal and dual feasibility, complementarity) hold to rounding: the
interior point only chooses where the exact method starts. ``interior_iterations=0`` skips it
(the plain Lawson–Hanson method from an empty set, the former solver, for comparison).
Everything is float64 on the array module given (``numpy`` or ``cupy``). ``work``, when given
a list, receives one entry per batched step (stage, voxels, matrix size) to count the device's
work: batched factorisations and the GEMMs around them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .indices import flatnonzero

#: Violations smaller than this times the norm of the voxel's solution count as satisfied.
DEFAULT_TOLERANCE = 1e-10
#: Most interior-point iterations before the exact active-set stage.
DEFAULT_INTERIOR_ITERATIONS = 20
#: A voxel leaves the interior-point stage when its scaled mean complementarity falls below this.
_INTERIOR_COMPLEMENTARITY = 1e-12
#: Starting slacks (added to the unconstrained optimum's) and multipliers of the scaled program (x has
#: unit norm, G unit rows): 12 % fewer iterations on the benchmark's phantom than (0.01, 1e-3).
_INTERIOR_START = (0.3, 1e-4)
#: Fraction of the step to the boundary that the interior point takes.
_INTERIOR_STEP = 0.995


@dataclass
class SharedQP:
    """The voxel-independent parts of the program, factored once (host NumPy, float64).

    hessian_inverse : (P, P) H⁻¹; constraint : (M, P) G; gain : (P, M) H⁻¹ Gᵀ;
    dual_hessian : (M, M) Q = G H⁻¹ Gᵀ; hessian : (P, P) H.
    """

    hessian_inverse: np.ndarray
    constraint: np.ndarray
    gain: np.ndarray
    dual_hessian: np.ndarray
    hessian: np.ndarray | None = None

    @classmethod
    def from_matrices(cls, hessian: np.ndarray, constraint: np.ndarray) -> SharedQP:
        hessian = np.asarray(hessian, dtype=np.float64)
        constraint = np.asarray(constraint, dtype=np.float64)
        # inverse through the Cholesky factor: H is symmetric positive definite
        factor_inverse = np.linalg.inv(np.linalg.cholesky(hessian))
        hessian_inverse = factor_inverse.T @ factor_inverse
        gain = hessian_inverse @ constraint.T
        dual_hessian = constraint @ gain
        return cls(hessian_inverse, constraint, gain, 0.5 * (dual_hessian + dual_hessian.T), hessian)


def solve_batch(
    xp,
    linear: object,
    shared: SharedQP,
    max_iterations: int,
    tolerance: float = DEFAULT_TOLERANCE,
    start: object | None = None,
    interior_iterations: int = DEFAULT_INTERIOR_ITERATIONS,
    work: list | None = None,
):
    """Solve min ½ xᵀHx − qᵀx s.t. Gx ≥ 0 for each row q of ``linear`` (n, P) on ``xp``.

    ``start`` (n, M) optionally gives multipliers ≥ 0 to start from, their support the first
    active set (the interior-point stage is then skipped). Returns (x (n, P), multipliers λ (n, M),
    iterations, converged (n,) bool): x = H⁻¹(q + Gᵀλ), λ ≥ 0, λ = 0 where Gx > 0.
    ``iterations`` counts the batched solves: the unconstrained one, the interior point's,
    the active set's; voxels still working after ``max_iterations`` are returned as they
    stand (feasible for the dual, maybe not for the primal) with ``converged`` False.
    """
    linear = xp.asarray(linear, dtype=xp.float64)
    n = linear.shape[0]
    m, p = shared.constraint.shape
    G = xp.asarray(shared.constraint)
    x_free = linear @ xp.asarray(shared.hessian_inverse)  # unconstrained optimum (H symmetric)
    scale = xp.maximum(xp.linalg.norm(x_free, axis=1), 1e-300)
    threshold = tolerance * scale
    slack_free = x_free @ G.T  # G H⁻¹ q, the dual's linear term
    iterations = 1
    _count(work, "unconstrained", n, p)
    rows = flatnonzero(xp, ~(slack_free >= -threshold[:, None]).all(axis=1))  # voxels with work left
    guess = xp.zeros((rows.size, m))
    if start is not None:
        guess = xp.asarray(start, dtype=xp.float64)[rows]
    elif rows.size and interior_iterations > 0 and max_iterations > 1:
        used = min(interior_iterations, max_iterations - 1)
        guess, steps = interior_point_guess(xp, x_free[rows], shared, used, work)
        iterations += steps
    out_x, out_lam = x_free.copy(), xp.zeros((n, m))
    if rows.size and iterations < max_iterations:
        state = (x_free[rows], slack_free[rows], threshold[rows])
        x, lam, left, used = _active_set(xp, shared, state, guess, max_iterations - iterations, work)
        iterations += used
        out_x[rows], out_lam[rows] = x, lam
        rows = rows[left]
    converged = xp.ones(n, dtype=bool)
    converged[rows] = False
    return out_x, out_lam, iterations, converged


def interior_point_guess(xp, x_free, shared: SharedQP, max_iterations: int, work: list | None = None):
    """The multipliers of a primal-dual interior point on its guessed active set, and its iterations.

    Mehrotra's predictor-corrector on min ½ xᵀĤx − q̂ᵀx s.t. Gx − s = 0, s ≥ 0 with the
    multipliers λ ≥ 0, where Ĥ = H / h (h the mean of H's diagonal) and q̂ = q / (h c) (c the
    norm of the voxel's unconstrained optimum ``x_free`` (n, P)), so that every voxel's x and
    slacks are of order one and one start and one stopping level fit all. Returns (n, M)
    multipliers in the program's units, zero where λ ≤ s (constraints guessed inactive).
    """
    n = x_free.shape[0]
    size = xp.maximum(xp.linalg.norm(x_free, axis=1), 1e-300)
    m, p = shared.constraint.shape
    hessian = shared.hessian if shared.hessian is not None else np.linalg.inv(shared.hessian_inverse)
    h = float(np.trace(hessian)) / p
    H = xp.asarray(hessian / h)
    G = xp.asarray(shared.constraint)
    # G's rows' outer products, upper triangles only (half the GEMM), and where each of the P²
    # entries of the normal matrix finds its value among them
    upper_i, upper_j = np.triu_indices(p)
    outer = xp.asarray(shared.constraint[:, upper_i] * shared.constraint[:, upper_j])
    hessian_upper = xp.asarray(hessian[upper_i, upper_j] / h)
    position = np.zeros((p, p), dtype=np.int64)
    position[upper_i, upper_j] = position[upper_j, upper_i] = np.arange(upper_i.size)
    position = xp.asarray(position.ravel())
    x = x_free / size[:, None]
    q = x @ H  # q̂ = Ĥ x̂_free
    s = xp.maximum(x @ G.T, 0.0) + _INTERIOR_START[0]
    lam = xp.full((n, m), _INTERIOR_START[1])
    guess = xp.zeros((n, m))
    rows = xp.arange(n)
    iterations = 0
    while rows.size and iterations < max_iterations:
        iterations += 1
        _count(work, "interior", rows.size, p)
        dual_residual = x @ H - q - lam @ G
        primal_residual = x @ G.T - s
        mu = (s * lam).mean(axis=1)
        weight = lam / s
        try:
            factor = xp.linalg.cholesky(xp.take(weight @ outer + hessian_upper, position, axis=1).reshape(-1, p, p))
        except np.linalg.LinAlgError:  # rounding broke positive definiteness (NumPy raises)
            break  # the guess so far is only a start; the active-set stage is exact from any start
        factor_t = xp.ascontiguousarray(xp.swapaxes(factor, 1, 2))  # rows for the back substitution

        system = (xp, G, factor, factor_t, s, lam, primal_residual, dual_residual)
        dx, ds, dlam = _newton_direction(system, -s * lam)  # predictor (affine scaling)
        alpha = xp.minimum(_step_to_boundary(xp, s, ds), _step_to_boundary(xp, lam, dlam))
        mu_affine = ((s + alpha[:, None] * ds) * (lam + alpha[:, None] * dlam)).mean(axis=1)
        centring = (mu_affine / mu) ** 3
        dx, ds, dlam = _newton_direction(system, (centring * mu)[:, None] - s * lam - ds * dlam)  # corrector
        alpha = _INTERIOR_STEP * xp.minimum(_step_to_boundary(xp, s, ds), _step_to_boundary(xp, lam, dlam))
        x, s, lam = x + alpha[:, None] * dx, s + alpha[:, None] * ds, lam + alpha[:, None] * dlam
        mu = (s * lam).mean(axis=1)
        guess[rows] = xp.where(lam > s, lam, 0.0)
        keep = (mu > _INTERIOR_COMPLEMENTARITY) & xp.isfinite(mu)
        if not bool(keep.all()):
            rows, x, q, s, lam = (a[keep] for a in (rows, x, q, s, lam))
    return guess * (h * size)[:, None], iterations


def _newton_direction(system, complementarity):
    """The step (dx, ds, dλ) of the linearised KKT system whose complementarity rows read
    λ ds + s dλ = ``complementarity``: dx from the factored normal matrix, then ds, dλ."""
    xp, G, factor, factor_t, s, lam, primal_residual, dual_residual = system
    rhs = ((complementarity - lam * primal_residual) / s) @ G - dual_residual
    dx = _cholesky_solve(xp, factor, factor_t, rhs)
    ds = dx @ G.T + primal_residual
    return dx, ds, (complementarity - lam * ds) / s


def _step_to_boundary(xp, value, change):
    """Per voxel, the largest α ≤ 1 with value + α change ≥ 0 (value > 0)."""
    shrinking = change < 0
    ratio = xp.where(shrinking, -value / xp.where(shrinking, change, -1.0), xp.inf)
    return xp.minimum(ratio.min(axis=1), 1.0)


def _cholesky_solve(xp, factor, factor_t, rhs):
    """Solve L Lᵀ x = b for a batch: L (n, P, P) lower triangular and Lᵀ, b (n, P).

    Forward then back substitution, one row of the batch's factors at a time (memory-bound,
    2P small steps; batched triangular solves are not common to NumPy and CuPy).
    """
    p = factor.shape[1]
    y = xp.empty_like(rhs)
    for j in range(p):
        y[:, j] = (rhs[:, j] - (factor[:, j, :j] * y[:, :j]).sum(axis=1)) / factor[:, j, j]
    x = xp.empty_like(rhs)
    for j in range(p - 1, -1, -1):
        x[:, j] = (y[:, j] - (factor_t[:, j, j + 1 :] * x[:, j + 1 :]).sum(axis=1)) / factor[:, j, j]
    return x


def _active_set(xp, shared: SharedQP, state, start, max_iterations: int, work: list | None):
    """Lawson–Hanson on the dual from the multipliers ``start`` (n, M) ≥ 0, their support passive.

    ``state`` is (H⁻¹q, G H⁻¹q, threshold) of the voxels. Returns (x, λ, the voxels still
    working (indices into the batch), iterations).
    """
    free, slack_free, threshold = state
    n = free.shape[0]
    m, p = shared.constraint.shape
    G = xp.asarray(shared.constraint)
    # one padding constraint (index M) with a zero row: the slots a voxel does not use point at
    # it, gather zeros and get a unit diagonal and a zero right-hand side
    ridge = 1e-13 * float(np.trace(shared.dual_hessian)) / m  # regular despite near-dependent rows
    Q = np.zeros((m + 1, m + 1))
    Q[:m, :m] = shared.dual_hessian + ridge * np.eye(m)
    Q = xp.asarray(Q.ravel())
    gain_t = xp.zeros((m + 1, p))
    gain_t[:m] = xp.asarray(shared.gain.T)
    edge = xp.asarray(1.0 / np.sqrt(np.diag(shared.dual_hessian)))[None, :]  # steepest edge (H metric)
    out_x, out_lam = free.copy(), xp.zeros((n, m + 1))
    rows = xp.arange(n)
    slack_free = xp.concatenate([slack_free, xp.zeros((n, 1))], axis=1)
    lam = xp.zeros((n, m + 1))
    active = xp.zeros((n, m + 1), dtype=bool)
    lam[:, :m] = xp.maximum(start, 0.0)
    active[:, :m] = lam[:, :m] > 0
    iterations = 0
    while rows.size and iterations < max_iterations:
        iterations += 1
        trial, index, valid = _solve_passive(xp, active, slack_free, Q, m)
        _count(work, "active set", rows.size, index.shape[1])
        current = xp.take_along_axis(lam, index, axis=1)
        feasible = ((trial > 0) | ~valid).all(axis=1)
        # infeasible: move from λ towards the trial point until the first multiplier reaches 0
        blocking = valid & (trial <= 0)
        ratio = xp.where(blocking, current / xp.where(blocking, current - trial, 1.0), xp.inf)
        first = ratio.min(axis=1)
        step = xp.where(feasible, 1.0, xp.clip(first, 0.0, 1.0))
        new = current + step[:, None] * (trial - current)
        # the blocking multiplier leaves even when rounding keeps it a hair above zero
        dropped = ~feasible[:, None] & valid & ((new <= 0) | (ratio <= first[:, None]))
        slot_rows = xp.arange(rows.size)[:, None]
        lam = xp.zeros_like(lam)
        lam[slot_rows, index] = xp.where(valid & ~dropped, xp.maximum(new, 0.0), 0.0)
        active[slot_rows, index] &= ~dropped  # padded slots all write column M, never active
        x = free + lam @ gain_t
        violated = xp.where(active[:, :m], xp.inf, x @ G.T)
        worst = (violated * edge).argmin(axis=1)
        # after a step that moved, the next constraint enters at once (LH would re-solve first)
        add = (feasible | (step > 0)) & (violated[slot_rows[:, 0], worst] < -threshold)
        active[flatnonzero(xp, add), worst[add]] = True
        done = feasible & ~(violated[slot_rows[:, 0], worst] < -threshold)
        out_x[rows] = x
        out_lam[rows] = lam
        keep = ~done
        if not bool(keep.all()):
            rows, free, slack_free, threshold, lam, active = (
                a[keep] for a in (rows, free, slack_free, threshold, lam, active)
            )
    return out_x, out_lam[:, :m], rows, iterations


def _solve_passive(xp, passive, slack_free, Q, m):
    """Each voxel's Q_PP λ_P = −(G H⁻¹ q)_P, padded to the largest passive set of the batch.

    ``Q`` is the flattened (M+1)² padded matrix. Returns (λ_P (n, k), the constraint index of
    each slot (n, k): M on unused slots, valid slots (n, k)).
    """
    counts = passive.sum(axis=1)
    k = max(1, int(counts.max()) if passive.shape[0] else 0)  # one slot at least: reductions need it
    # passive constraints first (their order does not matter), then the padding constraint
    index = xp.argsort((~passive).astype(xp.int8), axis=1)[:, :k]
    valid = xp.arange(k)[None, :] < counts[:, None]
    index = xp.where(valid, index, m)
    system = Q[index[:, :, None] * (m + 1) + index[:, None, :]]
    diagonal = xp.arange(k)
    system[:, diagonal, diagonal] += ~valid
    rhs = -xp.take_along_axis(slack_free, index, axis=1)
    trial = xp.linalg.solve(system, rhs[:, :, None])[:, :, 0]
    return trial, index, valid


def _count(work: list | None, stage: str, voxels: int, size: int) -> None:
    if work is not None:
        work.append((stage, int(voxels), int(size)))


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


__all__ = [
    "DEFAULT_INTERIOR_ITERATIONS",
    "DEFAULT_TOLERANCE",
    "SharedQP",
    "interior_point_guess",
    "kkt_residuals",
    "solve_batch",
]
