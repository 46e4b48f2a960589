"""The fitting algorithms of the model toolbox, batched over voxels, on ``xp`` (NumPy or CuPy).

All voxels of a batch advance together as one array program (no Python loop over voxels):

* :func:`tensor_orientations` — a linear (log-signal) tensor fit whose eigenvectors start the
  model's orientations (cuDIMOT and FSL start from the tensor as well);
* :func:`grid_search` — every combination of the parameters' ``init_grid`` values, S0 solved in
  closed form per candidate, the best kept per voxel;
* :func:`levenberg_marquardt` — least squares in the unbounded internal parameters (the
  transforms of :mod:`.declare`), forward-difference Jacobian (all parameters perturbed in one
  batched signal evaluation), damping λ per voxel ((JᵀJ + λ diag JᵀJ) δ = Jᵀr; accepted steps
  divide λ by 10, rejected ones multiply it by 10); converged voxels leave the active set;
* :func:`metropolis` — Metropolis within Gibbs in the parameters' own units, FSL's energy
  ((M/2) log(SS/2), the noise variance integrated out under a Jeffreys prior) plus the
  parameters' priors, proposal widths adapted during burn-in, random numbers from
  Philox4x32-10 with one stream per voxel (counter = draw number, voxel number), as the
  ball & sticks fit draws them; returns posterior means and standard deviations.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from ..backend import Cancelled
from ..rng import normal_and_log_uniform, seed_key
from .declare import Model, all_parameters, as_columns, from_internal, to_internal

LM_LAMBDA0 = 1e-3
LM_LAMBDA_STOP = 1e12
LM_RELATIVE_TOL = 1e-10  #: a voxel has converged when an accepted step lowers its cost by less than this (relative)


def predict(xp, model: Model, acq, values):
    """S = S0 · E (N, M) of a value array (N, 1 + P) (S0 first, then the model's parameters)."""
    cols = as_columns(all_parameters(model), values)
    return cols["s0"] * model.signal(cols, acq, xp)


def values_from_internal(xp, model: Model, z):
    return xp.stack([from_internal(xp, p, z[:, i]) for i, p in enumerate(all_parameters(model))], axis=1)


def internal_from_values(xp, model: Model, values):
    return xp.stack([to_internal(xp, p, values[:, i]) for i, p in enumerate(all_parameters(model))], axis=1)


def angles(xp, v):
    """θ, φ of unit vectors (..., 3)."""
    theta = xp.arccos(xp.clip(v[..., 2], -1.0, 1.0))
    return theta, xp.arctan2(v[..., 1], v[..., 0])


def tensor_orientations(xp, y, acq, b0_threshold: float):
    """Eigenvectors (N, 3, 3) of a linear least-squares tensor fit of log y, principal first."""
    b, g = acq.bvals_xp, acq.bvecs_xp
    gx, gy, gz = g[:, 0], g[:, 1], g[:, 2]
    design = xp.stack(
        [
            -b * gx * gx,
            -b * gy * gy,
            -b * gz * gz,
            -2 * b * gx * gy,
            -2 * b * gx * gz,
            -2 * b * gy * gz,
            xp.ones_like(b),
        ],
        axis=1,
    )
    coef = xp.log(xp.maximum(y, 1e-6)) @ xp.linalg.pinv(design).T  # (N, 7)
    dxx, dyy, dzz, dxy, dxz, dyz = (coef[:, i] for i in range(6))
    tensor = xp.stack(
        [xp.stack([dxx, dxy, dxz], -1), xp.stack([dxy, dyy, dyz], -1), xp.stack([dxz, dyz, dzz], -1)], axis=1
    )
    tensor = xp.where(xp.isfinite(tensor), tensor, 0.0)
    _, vectors = xp.linalg.eigh(tensor)
    return vectors[:, :, ::-1]


def orientation_start(xp, model: Model, eigenvectors):
    """Values (N, 1 + P) with S0 = 1 and the orientations from the tensor's eigenvectors (the
    grid search sets the other parameters)."""
    n = eigenvectors.shape[0]
    start = xp.zeros((n, 1 + len(model.parameters)))
    start[:, 0] = 1.0
    for k, (th_name, ph_name) in enumerate(model.orientations):
        theta, phi = angles(xp, eigenvectors[:, :, min(k, 2)])
        start[:, 1 + model.names.index(th_name)] = theta
        start[:, 1 + model.names.index(ph_name)] = phi
    return start


def grid_search(xp, model: Model, acq, y, eigenvectors):
    """Best starting values (N, 1 + P) over the Cartesian product of the parameters' grids."""
    n = y.shape[0]
    params = model.parameters
    start = orientation_start(xp, model, eigenvectors)
    orient_index = {name for pair in model.orientations for name in pair}
    gridded = [i for i, p in enumerate(params) if p.name not in orient_index]
    axes = [params[i].init_grid or (params[i].default_start(),) for i in gridded]
    best_cost = xp.full(n, np.inf)
    best = start.copy()
    for combo in itertools.product(*axes):
        trial = start.copy()
        for i, value in zip(gridded, combo):
            trial[:, 1 + i] = value
        atten = model.signal(as_columns(all_parameters(model), trial), acq, xp)
        s0 = xp.maximum((atten * y).sum(axis=1) / xp.maximum((atten * atten).sum(axis=1), 1e-30), 1e-6)
        cost = ((y - s0[:, None] * atten) ** 2).sum(axis=1)
        better = cost < best_cost
        trial[:, 0] = s0
        best = xp.where(better[:, None], trial, best)
        best_cost = xp.where(better, cost, best_cost)
    return best


def _jacobian(xp, model, acq, z, base):
    """Forward differences (N, M, P) in the internal parameters, all perturbations in one evaluation."""
    n, p = z.shape
    step = 1e-6 * (1.0 + xp.abs(z))  # (N, P)
    perturbed = xp.repeat(z[None], p, axis=0)  # (P, N, P)
    idx = xp.arange(p)
    perturbed[idx, :, idx] += step.T
    signal = predict(xp, model, acq, values_from_internal(xp, model, perturbed.reshape(p * n, p)))
    signal = signal.reshape(p, n, -1)
    return ((signal - base[None]) / step.T[:, :, None]).transpose(1, 2, 0)


def levenberg_marquardt(xp, model: Model, acq, y, values0, iterations: int, cancelled=None):
    """LM from ``values0`` (N, 1 + P); returns the fitted values and the sum of squares (N,)."""
    z = internal_from_values(xp, model, values0)
    n, p = z.shape
    signal = predict(xp, model, acq, values_from_internal(xp, model, z))
    cost = ((y - signal) ** 2).sum(axis=1)
    cost = xp.where(xp.isfinite(cost), cost, np.inf)
    lam = xp.full(n, LM_LAMBDA0)
    active = xp.arange(n)
    eye = xp.eye(p)
    for _ in range(iterations):
        if cancelled is not None and cancelled():
            raise Cancelled()
        if active.size == 0:
            break
        za, ya, sa, ca, la = z[active], y[active], signal[active], cost[active], lam[active]
        jac = _jacobian(xp, model, acq, za, sa)
        jtj = xp.einsum("nmp,nmq->npq", jac, jac)
        jtr = xp.einsum("nmp,nm->np", jac, ya - sa)
        diag = xp.diagonal(jtj, axis1=1, axis2=2)
        system = jtj + (la[:, None] * diag + 1e-12)[:, :, None] * eye
        ok = xp.isfinite(system).all(axis=(1, 2)) & xp.isfinite(jtr).all(axis=1)
        system = xp.where(ok[:, None, None], system, eye)
        delta = xp.linalg.solve(system, xp.where(ok[:, None], jtr, 0.0)[:, :, None])[:, :, 0]
        trial = za + delta
        trial_signal = predict(xp, model, acq, values_from_internal(xp, model, trial))
        trial_cost = ((ya - trial_signal) ** 2).sum(axis=1)
        better = ok & xp.isfinite(trial_cost) & (trial_cost < ca)
        z[active] = xp.where(better[:, None], trial, za)
        signal[active] = xp.where(better[:, None], trial_signal, sa)
        cost[active] = xp.where(better, trial_cost, ca)
        la = xp.where(better, la / 10.0, la * 10.0)
        lam[active] = la
        done = (better & (ca - trial_cost <= LM_RELATIVE_TOL * ca)) | (la > LM_LAMBDA_STOP)
        active = active[~done]
    return values_from_internal(xp, model, z), cost


# --------------------------------------------------------------------------------------
# MCMC


def draws(xp, voxels, draw: int, seed: int):
    """A standard normal and the log of a uniform per voxel, from the voxel's own stream."""
    return normal_and_log_uniform(voxels, draw, seed_key(seed), xp)


def _prior_energy(xp, model: Model, values):
    energy = xp.zeros(values.shape[0])
    for i, p in enumerate(all_parameters(model)):
        v = values[:, i]
        if p.prior == "sphere":
            energy = energy - xp.log(xp.maximum(xp.abs(xp.sin(v)), 1e-30))
        elif callable(p.prior):
            energy = energy + p.prior(xp, v)
    return energy


def _energy(xp, model, acq, y, values):
    ss = ((y - predict(xp, model, acq, values)) ** 2).sum(axis=1)
    e = 0.5 * y.shape[1] * xp.log(xp.maximum(ss, 1e-30) / 2.0) + _prior_energy(xp, model, values)
    return xp.where(xp.isfinite(e), e, np.inf)


def _initial_widths(xp, model, values):
    widths = xp.empty_like(values)
    for i, p in enumerate(all_parameters(model)):
        if np.isfinite(p.lower) and np.isfinite(p.upper):
            widths[:, i] = 0.2 * min(p.upper - p.lower, 1.0)
        elif np.isfinite(p.lower) or np.isfinite(p.upper):
            widths[:, i] = xp.maximum(xp.abs(values[:, i]) / 10.0, 1e-12)
        else:
            widths[:, i] = 0.2
    return widths


def metropolis(
    xp,
    model: Model,
    acq,
    y,
    start,
    voxels,
    *,
    burnin: int,
    njumps: int,
    sample_every: int,
    update_every: int,
    seed: int,
    cancelled: Callable[[], bool] | None = None,
):
    """Metropolis within Gibbs from ``start`` (N, 1 + P); ``voxels`` (N,) the voxels' stream numbers.

    Returns the posterior mean and standard deviation (N, 1 + P) over the recorded samples,
    the mean dyadic tensors (N, K, 3, 3) of the K orientations, and the acceptance rates (N, 1 + P).
    """
    params = all_parameters(model)
    n, p = start.shape
    values = start.copy()
    energy = _energy(xp, model, acq, y, values)
    widths = _initial_widths(xp, model, values)
    acc = xp.zeros((n, p))
    rej = xp.zeros((n, p))
    total = xp.zeros((n, p))
    total_sq = xp.zeros((n, p))
    pairs = [(1 + model.names.index(a), 1 + model.names.index(b)) for a, b in model.orientations]
    dyadic = xp.zeros((n, len(pairs), 3, 3))
    recorded = 0
    lower = xp.asarray([q.lower for q in params])
    upper = xp.asarray([q.upper for q in params])
    for it in range(burnin + njumps):
        if cancelled is not None and cancelled():
            raise Cancelled()
        for i in range(p):
            normal, log_u = draws(xp, voxels, it * p + i, seed)
            proposal = values.copy()
            moved = values[:, i] + normal * widths[:, i]
            inside = (moved > lower[i]) & (moved < upper[i])
            proposal[:, i] = xp.where(inside, moved, values[:, i])  # out of bounds: rejected, not evaluated
            new_energy = _energy(xp, model, acq, y, proposal)
            accept = inside & (log_u < energy - new_energy)
            values[:, i] = xp.where(accept, proposal[:, i], values[:, i])
            energy = xp.where(accept, new_energy, energy)
            acc[:, i] += accept
            rej[:, i] += ~accept
        if it < burnin:
            if (it + 1) % update_every == 0:
                widths *= xp.sqrt((acc + 1.0) / (rej + 1.0))
                acc[:] = 0
                rej[:] = 0
            if it + 1 == burnin:
                acc[:] = 0
                rej[:] = 0
        elif (it - burnin + 1) % sample_every == 0:
            recorded += 1
            total += values
            total_sq += values * values
            for k, (a, b) in enumerate(pairs):
                st = xp.sin(values[:, a])
                v = xp.stack([st * xp.cos(values[:, b]), st * xp.sin(values[:, b]), xp.cos(values[:, a])], axis=1)
                dyadic[:, k] += v[:, :, None] * v[:, None, :]
    recorded = max(recorded, 1)
    mean = total / recorded
    std = xp.sqrt(xp.maximum(total_sq / recorded - mean * mean, 0.0))
    return mean, std, dyadic / recorded, acc / xp.maximum(acc + rej, 1.0)
