"""NODDI-Watson's grid search and Levenberg–Marquardt on the CPU as compiled loops, one voxel at a
time, in numba (the ``cpu`` extra; imported only when it is installed, by :mod:`.host_fit`).

The same algorithm as the batched array program of :mod:`.optimize` (which stays the reference,
the GPU's path and the path without numba), per voxel: the signal of
:func:`.library.noddi_watson` (the Watson series of :mod:`.compartments` and :mod:`.special`, its
quadrature and Legendre recursion), the parameters' transforms of :mod:`.declare`, the grid's
closed-form S0, and LM's forward-difference Jacobian, damping, acceptance and stopping rules.
Everything stays in one voxel's small arrays, without the GIL: the batch array program paid
NumPy's per-call cost, under the GIL, at every iteration of ever smaller active sets, and
allocated (and page-faulted) large temporaries, so its threads did not scale with the cores.

Module-level functions so that numba's on-disk cache finds them again in the next process.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)

#: Parameter transforms (declare.from_internal / to_internal): two finite bounds, a lower, an upper, none
LOGISTIC, LOWER, UPPER, FREE = 0, 1, 2, 3
#: Orders P_0, P_2, ..., P_12 of the Watson series (special.WATSON_ORDER)
ORDERS = 7


@_jit
def _from_internal(kind, lo, hi, z):
    if kind == LOGISTIC:
        return lo + (hi - lo) / (1.0 + math.exp(-min(max(z, -700.0), 700.0)))
    if kind == LOWER:
        return lo + math.exp(min(z, 700.0))
    if kind == UPPER:
        return hi - math.exp(min(z, 700.0))
    return z


@_jit
def _to_internal(kind, lo, hi, v):
    if kind == LOGISTIC:
        u = min(max((v - lo) / (hi - lo), 1e-9), 1.0 - 1e-9)
        return math.log(u / (1.0 - u))
    if kind == LOWER:
        return math.log(max(v - lo, 1e-300))
    if kind == UPPER:
        return math.log(max(hi - v, 1e-300))
    return v * 1.0


@_jit
def new_cache(m):
    """Scratch of :func:`watson_signal` for one thread: the last orientation's g·v and even
    Legendre polynomials (M, 7), the last ODI's Watson coefficients and second moment. Keyed by
    the exact input values, so a hit returns the very numbers a recomputation would."""
    keys = np.full(3, np.nan)  # θ, φ, ODI
    return keys, np.empty(m), np.empty((m, ORDERS)), np.empty(ORDERS + 1)


@_jit
def watson_signal(values, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, cache, out):
    """S = S0 · E of NODDI-Watson for one voxel's ``values`` (S0, v_ic, ODI, v_iso, θ, φ) into
    ``out`` (M,); ``stick`` (M, 7) the stick's Legendre coefficients at b·d∥, ``ball`` (M,) its
    attenuation at d_iso, ``legendre_nodes`` (7, nodes) the even Legendre polynomials at the
    nodes; ``cache`` from :func:`new_cache` (the Jacobian's steps in S0 and the fractions keep
    the orientation and ODI)."""
    s0, v_ic, odi, v_iso, theta, phi = values[0], values[1], values[2], values[3], values[4], values[5]
    keys, cosines, legendre, watson = cache
    if not odi == keys[2]:
        kappa = 1.0 / math.tan(np.pi / 2.0 * odi)
        for order in range(ORDERS):
            watson[order] = 0.0
        mass = 0.0
        second = 0.0
        for j in range(nodes.shape[0]):
            t = nodes[j]
            density = math.exp(kappa * (t * t - 1.0)) * weights[j]
            for order in range(ORDERS):
                watson[order] += density * legendre_nodes[order, j]
            mass += density
            second += density * t * t
        for order in range(ORDERS - 1, -1, -1):  # normalised: w_0 = 1
            watson[order] = watson[order] / watson[0]
        watson[ORDERS] = second / mass
        keys[2] = odi
    if not (theta == keys[0] and phi == keys[1]):
        st = math.sin(theta)
        vx, vy, vz = st * math.cos(phi), st * math.sin(phi), math.cos(theta)
        for m in range(bvals.shape[0]):
            c = bvecs[m, 0] * vx + bvecs[m, 1] * vy + bvecs[m, 2] * vz
            cosines[m] = c
            legendre[m, 0] = 1.0
            p_prev, p = 1.0, c
            for n in range(1, 12):
                p_prev, p = p, ((2 * n + 1) * c * p - n * p_prev) / (n + 1)
                if (n + 1) % 2 == 0:
                    legendre[m, (n + 1) // 2] = p
        keys[0], keys[1] = theta, phi
    t2 = watson[ORDERS]
    d_perp = d_par * (1.0 - v_ic)
    par = d_perp + (d_par - d_perp) * t2
    perp = d_perp + (d_par - d_perp) * (1.0 - t2) / 2.0
    for m in range(bvals.shape[0]):
        c = cosines[m]
        total = 0.0
        for order in range(ORDERS):
            total += (4 * order + 1) * watson[order] * stick[m, order] * legendre[m, order]
        intra = max(total, 0.0)
        extra = math.exp(-bvals[m] * (perp + (par - perp) * c * c))
        tissue = v_ic * intra + (1.0 - v_ic) * extra
        out[m] = s0 * ((1.0 - v_iso) * tissue + v_iso * ball[m])


@_jit
def grid_voxels(y, start, combos, gridded, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, best):
    """optimize.grid_search per voxel: every row of ``combos`` (values of the ``gridded`` columns)
    from the voxel's ``start`` row (its orientation), S0 in closed form, the cheapest kept in ``best``."""
    n, m = y.shape
    trial = np.empty(start.shape[1])
    atten = np.empty(m)
    cache = new_cache(m)
    for v in range(n):
        best_cost = np.inf
        for k in range(start.shape[1]):
            best[v, k] = start[v, k]
        for c in range(combos.shape[0]):
            for k in range(start.shape[1]):
                trial[k] = start[v, k]
            for i in range(gridded.shape[0]):
                trial[gridded[i]] = combos[c, i]
            trial[0] = 1.0
            watson_signal(trial, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, cache, atten)
            num = 0.0
            den = 0.0
            for j in range(m):
                num += atten[j] * y[v, j]
                den += atten[j] * atten[j]
            s0 = max(num / max(den, 1e-30), 1e-6)
            cost = 0.0
            for j in range(m):
                r = y[v, j] - s0 * atten[j]
                cost += r * r
            if cost < best_cost:
                best_cost = cost
                for k in range(start.shape[1]):
                    best[v, k] = trial[k]
                best[v, 0] = s0


@_jit
def _values(kinds, lo, hi, z, out):
    for i in range(z.shape[0]):
        out[i] = _from_internal(kinds[i], lo[i], hi[i], z[i])


@_jit
def _cost(y, v, signal):
    total = 0.0
    for j in range(signal.shape[0]):
        r = y[v, j] - signal[j]
        total += r * r
    return total


@_jit
def _solve(a, b, x):
    """x = a⁻¹ b by Gaussian elimination with partial pivoting (LAPACK gesv's algorithm); a, b overwritten."""
    p = b.shape[0]
    for col in range(p):
        pivot = col
        for row in range(col + 1, p):
            if abs(a[row, col]) > abs(a[pivot, col]):
                pivot = row
        if pivot != col:
            for k in range(p):
                a[col, k], a[pivot, k] = a[pivot, k], a[col, k]
            b[col], b[pivot] = b[pivot], b[col]
        for row in range(col + 1, p):
            f = a[row, col] / a[col, col]
            for k in range(col, p):
                a[row, k] -= f * a[col, k]
            b[row] -= f * b[col]
    for row in range(p - 1, -1, -1):
        s = b[row]
        for k in range(row + 1, p):
            s -= a[row, k] * x[k]
        x[row] = s / a[row, row]


@_jit
def lm_voxels(
    y, start, kinds, lo, hi, iterations, lambda0, lambda_stop, tolerance,
    bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, fitted, cost_out,
):  # fmt: skip
    """optimize.levenberg_marquardt per voxel from ``start`` (n, P) values: fitted values and the
    sum of squares of each voxel into ``fitted`` and ``cost_out``."""
    n, m = y.shape
    p = start.shape[1]
    z = np.empty(p)
    zp = np.empty(p)
    vals = np.empty(p)
    signal = np.empty(m)
    trial_signal = np.empty(m)
    jac = np.empty((p, m))  # one row per parameter: the sums below run along contiguous rows
    system = np.empty((p, p))
    jtr = np.empty(p)
    delta = np.empty(p)
    trial = np.empty(p)
    cache = new_cache(m)
    for v in range(n):
        for i in range(p):
            z[i] = _to_internal(kinds[i], lo[i], hi[i], start[v, i])
        _values(kinds, lo, hi, z, vals)
        watson_signal(vals, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, cache, signal)
        cost = _cost(y, v, signal)
        if not math.isfinite(cost):
            cost = np.inf
        lam = lambda0
        for _ in range(iterations):
            for q in range(p):  # forward differences, each parameter perturbed alone
                step = 1e-6 * (1.0 + abs(z[q]))
                for i in range(p):
                    zp[i] = z[i]
                zp[q] += step
                _values(kinds, lo, hi, zp, vals)
                watson_signal(
                    vals, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, cache, trial_signal
                )
                for j in range(m):
                    jac[q, j] = (trial_signal[j] - signal[j]) / step
            ok = True
            for a in range(p):
                s = 0.0
                for j in range(m):
                    s += jac[a, j] * (y[v, j] - signal[j])
                jtr[a] = s
                ok = ok and math.isfinite(s)
                for b in range(a + 1):
                    s = 0.0
                    for j in range(m):
                        s += jac[a, j] * jac[b, j]
                    system[a, b] = s
                    system[b, a] = s
            for a in range(p):
                system[a, a] += lam * system[a, a] + 1e-12
            for a in range(p):
                for b in range(p):
                    ok = ok and math.isfinite(system[a, b])
            if not ok:
                for a in range(p):
                    jtr[a] = 0.0
                    for b in range(p):
                        system[a, b] = 1.0 if a == b else 0.0
            _solve(system, jtr, delta)
            for i in range(p):
                trial[i] = z[i] + delta[i]
            _values(kinds, lo, hi, trial, vals)
            watson_signal(vals, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, cache, trial_signal)
            trial_cost = _cost(y, v, trial_signal)
            better = ok and math.isfinite(trial_cost) and trial_cost < cost
            previous = cost
            if better:
                for i in range(p):
                    z[i] = trial[i]
                for j in range(m):
                    signal[j] = trial_signal[j]
                cost = trial_cost
                lam = lam / 10.0
            else:
                lam = lam * 10.0
            if (better and previous - trial_cost <= tolerance * previous) or lam > lambda_stop:
                break
        _values(kinds, lo, hi, z, vals)
        for i in range(p):
            fitted[v, i] = vals[i]
        cost_out[v] = cost


@_jit
def rms_voxels(y, values, bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, out):
    """Root-mean-square residual of each voxel's signal ``y`` (n, M) at its ``values`` (n, P) into ``out``."""
    n, m = y.shape
    signal = np.empty(m)
    cache = new_cache(m)
    for v in range(n):
        watson_signal(values[v], bvals, bvecs, stick, ball, d_par, nodes, weights, legendre_nodes, cache, signal)
        out[v] = math.sqrt(_cost(y, v, signal) / m)
