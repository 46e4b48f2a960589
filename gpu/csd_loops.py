"""Single-shell CSD's iteration (Tournier 2007) on the CPU as a compiled loop, one voxel at a time,
in numba (the ``cpu`` extra; imported only when it is installed, by :mod:`gpu.csd`).

The algorithm of :func:`gpu.csd._ssst_batch` (the batched array program, which stays the
reference, the GPU's path and the path without numba), per voxel: the l ≤ 4 least-squares
start, the directions below τ × the mean amplitude penalised, the normal equations
AᵀA + ridge + λ² Σ_neg c cᵀ solved, repeated until the set stops changing (the normal matrix
updated by the directions that joined or left the set, rank one each, rather than rebuilt). A voxel's matrices
(45 × 45 at lmax 8) stay in the core's cache and the loop runs without the GIL, so threads over
voxel batches scale with the cores; the array program's batched normal matrices and products
(tens of MB a batch) were bound by memory bandwidth on many cores.

Module-level functions so that numba's on-disk cache finds them again in the next process.
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: 1/√(4π), sh.Y00
Y00 = 0.5 / math.sqrt(math.pi)

_jit = numba.njit(nogil=True, cache=True, fastmath=False, boundscheck=False)


@_jit
def ssst_voxels(signal, design, base, pinv_low, constraint, lam2, threshold_scale, max_iterations, sh, iterations):
    """Fit the (n, K) ``signal``: fODF coefficients into ``sh`` (n, C), each voxel's iteration
    count into ``iterations`` (n,) (negative when it stopped at ``max_iterations`` with its
    penalised set still changing). ``base`` = AᵀA + ridge; ``lam2`` = λ²; the threshold is
    ``threshold_scale`` × the l ≤ 4 fit's first coefficient."""
    n = signal.shape[0]
    d, c = constraint.shape
    low = pinv_low.shape[0]
    negative = np.zeros(d, dtype=np.bool_)
    rows = np.empty((d, c))
    for v in range(n):
        s = signal[v]
        rhs = np.dot(s, design)
        f_low = np.dot(pinv_low, s)
        threshold = threshold_scale * f_low[0]
        for j in range(d):
            total = 0.0
            for i in range(low):
                total += f_low[i] * constraint[j, i]
            negative[j] = total < threshold
        k = 0
        for j in range(d):
            if negative[j]:
                rows[k] = constraint[j]
                k += 1
        penalty = rows[:k]
        normal = base + lam2 * np.dot(penalty.T, penalty) if k else base.copy()
        count = 0
        converged = False
        while count < max_iterations:
            count += 1
            solution = np.linalg.solve(normal, rhs)
            changed = False
            amplitudes = np.dot(constraint, solution)
            for j in range(d):
                now = amplitudes[j] < threshold
                if now != negative[j]:  # the penalty gains or loses this direction: a rank-one update
                    changed = True
                    sign = lam2 if now else -lam2
                    for a in range(c):
                        f = sign * constraint[j, a]
                        for b in range(c):
                            normal[a, b] += f * constraint[j, b]
                negative[j] = now
            for i in range(c):
                sh[v, i] = solution[i]
            if not changed:
                converged = True
                break
        iterations[v] = count if converged else -count


# ------------------------------------------------------------------------- the peak search
@_jit
def _sh_row(direction, lmax, out):
    """sh.sh_basis at one direction (normalised here, as there) into ``out`` (C,)."""
    norm = math.sqrt(direction[0] * direction[0] + direction[1] * direction[1] + direction[2] * direction[2])
    if not norm > 0:
        norm = 1.0
    x, y = direction[0] / norm, direction[1] / norm
    z = min(max(direction[2] / norm, -1.0), 1.0)
    phi = math.atan2(y, x)
    s = 1.0 - z * z
    legendre = np.empty(lmax + 1)
    for m in range(lmax + 1):
        value = Y00
        if m:
            helper = 1.0
            for j in range(1, m + 1):
                helper *= (2 * j - 1) / (2 * j)
            value = value * math.sqrt((2 * m + 1) * helper * max(s, 0.0) ** m)
            if m & 1:
                value = -value
        legendre[m] = value
        if lmax > m:
            f = math.sqrt(2 * m + 3)
            legendre[m + 1] = z * f * value
            for n in range(m + 2, lmax + 1):
                previous = z * legendre[n - 1] - legendre[n - 2] / f
                f = math.sqrt((4 * n * n - 1) / (n * n - m * m))
                legendre[n] = previous * f
        if m == 0:
            for degree in range(0, lmax + 1, 2):
                out[degree * (degree + 1) // 2] = legendre[degree]
            continue
        c, sn = math.sqrt(2.0) * math.cos(m * phi), math.sqrt(2.0) * math.sin(m * phi)
        for degree in range(m + (m & 1), lmax + 1, 2):
            out[degree * (degree + 1) // 2 + m] = legendre[degree] * c
            out[degree * (degree + 1) // 2 - m] = legendre[degree] * sn


@_jit
def _cross(u, w, out):
    out[0] = u[1] * w[2] - u[2] * w[1]
    out[1] = u[2] * w[0] - u[0] * w[2]
    out[2] = u[0] * w[1] - u[1] * w[0]


@_jit
def peak_voxels(
    coefficients, lmax, sphere, basis, neighbours, offsets, relative_threshold, cos_separation, refine_steps,
    directions, amplitudes,
):  # fmt: skip
    """csd_peaks.find_peaks per voxel: local maxima of the fODF on the search sphere, the
    largest first while they reach the threshold and lie apart, each refined by the pattern
    search; into ``directions`` (n, P, 3) and ``amplitudes`` (n, P) (zero where none)."""
    n, n_sh = coefficients.shape
    d = sphere.shape[0]
    n_peaks = amplitudes.shape[1]
    candidates = np.empty(d)
    row = np.empty(n_sh)
    v, a, b, helper = np.empty(3), np.empty(3), np.empty(3), np.empty(3)
    trials = np.empty((offsets.shape[0], 3))
    for voxel in range(n):
        c = coefficients[voxel]
        amplitude = np.dot(basis, c)
        for j in range(d):
            is_max = amplitude[j] > 0
            for k in range(neighbours.shape[1]):
                is_max = is_max and amplitude[j] >= amplitude[neighbours[j, k]]
            candidates[j] = amplitude[j] if is_max else -np.inf
        largest = 0.0
        for p in range(n_peaks):
            best = 0
            for j in range(1, d):
                if candidates[j] > candidates[best]:
                    best = j
            value = candidates[best]
            if p == 0:
                largest = value
            keep = math.isfinite(value) and value >= relative_threshold * largest and value > 0
            for k in range(3):
                directions[voxel, p, k] = sphere[best, k] if keep else 0.0
            amplitudes[voxel, p] = value if keep else 0.0
            for j in range(d):
                dot = sphere[best, 0] * sphere[j, 0] + sphere[best, 1] * sphere[j, 1] + sphere[best, 2] * sphere[j, 2]
                if abs(dot) >= cos_separation:
                    candidates[j] = -np.inf
        for p in range(n_peaks):  # the pattern search around each peak found
            top = amplitudes[voxel, p]
            if not top > 0:
                continue
            for k in range(3):
                v[k] = directions[voxel, p, k]
            step = math.radians(2.5)
            for _ in range(refine_steps):
                upright = abs(v[2]) < 0.9
                helper[0], helper[1], helper[2] = (0.0, 0.0, 1.0) if upright else (1.0, 0.0, 0.0)
                _cross(v, helper, a)
                norm = math.sqrt(a[0] * a[0] + a[1] * a[1] + a[2] * a[2])
                for k in range(3):
                    a[k] = a[k] / norm
                _cross(v, a, b)
                pick, pick_value = -1, -np.inf
                for t in range(offsets.shape[0]):
                    for k in range(3):
                        tangent = offsets[t, 0] * a[k] + offsets[t, 1] * b[k]
                        trials[t, k] = math.cos(step) * v[k] + math.sin(step) * tangent
                    _sh_row(trials[t], lmax, row)
                    total = 0.0
                    for i in range(n_sh):
                        total += row[i] * c[i]
                    if pick < 0 or total > pick_value:
                        pick, pick_value = t, total
                if pick_value > top:
                    top = pick_value
                    for k in range(3):
                        v[k] = trials[pick, k]
                step *= 0.5
            norm = math.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])
            sign = -1.0 if v[2] / norm < 0 else 1.0
            for k in range(3):
                directions[voxel, p, k] = sign * v[k] / norm
            amplitudes[voxel, p] = top
