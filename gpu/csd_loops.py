"""Single-shell CSD's iteration (Tournier 2007) on the CPU as a compiled loop, one voxel at a time,
in numba (the ``cpu`` extra; imported only when it is installed, by :mod:`gpu.csd`).

The algorithm of :func:`gpu.csd._ssst_batch` (the batched array program, which stays the
reference, the GPU's path and the path without numba), per voxel: the l ≤ 4 least-squares
start, the directions below τ × the mean amplitude penalised, the normal equations
AᵀA + ridge + λ² Σ_neg c cᵀ solved, repeated until the set stops changing. A voxel's matrices
(45 × 45 at lmax 8) stay in the core's cache and the loop runs without the GIL, so threads over
voxel batches scale with the cores; the array program's batched normal matrices and products
(tens of MB a batch) were bound by memory bandwidth on many cores.

Module-level functions so that numba's on-disk cache finds them again in the next process.
"""

from __future__ import annotations

import numba
import numpy as np

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
    rhs = np.empty(c)
    f_low = np.empty(low)
    negative = np.zeros(d, dtype=np.bool_)
    rows = np.empty((d, c))
    for v in range(n):
        s = signal[v]
        for i in range(c):
            total = 0.0
            for k in range(s.shape[0]):
                total += s[k] * design[k, i]
            rhs[i] = total
        for i in range(low):
            total = 0.0
            for k in range(s.shape[0]):
                total += s[k] * pinv_low[i, k]
            f_low[i] = total
        threshold = threshold_scale * f_low[0]
        for j in range(d):
            total = 0.0
            for i in range(low):
                total += f_low[i] * constraint[j, i]
            negative[j] = total < threshold
        count = 0
        converged = False
        while count < max_iterations:
            count += 1
            k = 0
            for j in range(d):
                if negative[j]:
                    rows[k] = constraint[j]
                    k += 1
            penalty = rows[:k]
            normal = base + lam2 * np.dot(penalty.T, penalty) if k else base.copy()
            solution = np.linalg.solve(normal, rhs)
            changed = False
            for j in range(d):
                total = 0.0
                for i in range(c):
                    total += solution[i] * constraint[j, i]
                now = total < threshold
                if now != negative[j]:
                    changed = True
                negative[j] = now
            for i in range(c):
                sh[v, i] = solution[i]
            if not changed:
                converged = True
                break
        iterations[v] = count if converged else -count
