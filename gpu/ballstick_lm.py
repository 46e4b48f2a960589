"""Ball & sticks' Levenberg–Marquardt fit (:mod:`gpu.ballstick`, step 2; Hernández 2017, alg. 4.1):
least squares on all 2 + 3L parameters, in transformed parameters so the bounds hold by
construction. The NumPy reference (:func:`lm_numpy`) and the CUDA kernel ``ballstick_lm``
(:func:`lm_kernel`: one warp per voxel).
"""

from __future__ import annotations

import numpy as np

from .backend import Backend, Cancelled
from .ballstick import BallStickParams, compiled_kernel

# Levenberg–Marquardt in transformed parameters x = (s0, u, (θ, φ, q) per stick):
# d = exp(u), f_i = q_i² / (1 + Σ q_j²).

LM_LAMBDA0 = 1e-3  #: starting damping
LM_LAMBDA_STOP = 1e20  #: converged when the damping grows past this (Hernández 2017, alg. 4.1)


def fractions_from_q(xp, q):
    return q * q / (1.0 + (q * q).sum(axis=-1, keepdims=True))


def q_from_fractions(xp, f):
    total = f.sum(axis=-1, keepdims=True)
    return xp.sqrt(f * (1.0 + total / (1.0 - total)))


def lm_model(x, b, g, n_fibres: int):
    """Signal (N, M) and its Jacobian (N, M, 2 + 3L) w.r.t. the transformed parameters."""
    n, m = len(x), len(b)
    s0, d = x[:, 0], np.exp(x[:, 1])
    th, ph, q = x[:, 2::3], x[:, 3::3], x[:, 4::3]
    Q = (q * q).sum(axis=1)
    f = q * q / (1.0 + Q)[:, None]
    st, ct, sp, cp = np.sin(th), np.cos(th), np.sin(ph), np.cos(ph)
    v = np.stack([st * cp, st * sp, ct], axis=2)
    dv_th = np.stack([ct * cp, ct * sp, -st], axis=2)
    dv_ph = np.stack([-st * sp, st * cp, np.zeros_like(st)], axis=2)
    c = np.einsum("nlk,mk->nlm", v, g)
    bd = b[None, :] * d[:, None]  # (N, M)
    ball = np.exp(-bd)
    sticks = np.exp(-bd[:, None, :] * c * c)  # (N, L, M)
    ball_frac = 1.0 - f.sum(axis=1)
    a = ball_frac[:, None] * ball + (f[:, :, None] * sticks).sum(axis=1)
    signal = s0[:, None] * a
    jac = np.empty((n, m, 2 + 3 * n_fibres))
    jac[:, :, 0] = a
    jac[:, :, 1] = -s0[:, None] * bd * (ball_frac[:, None] * ball + (f[:, :, None] * c * c * sticks).sum(axis=1))
    common = (f[:, :, None] * (sticks - ball[:, None, :])).sum(axis=1)  # Σ f_i (E_i − e0)
    for i in range(n_fibres):
        k = -2.0 * s0[:, None] * f[:, i, None] * sticks[:, i] * bd * c[:, i]
        jac[:, :, 2 + 3 * i] = k * (dv_th[:, i] @ g.T)
        jac[:, :, 3 + 3 * i] = k * (dv_ph[:, i] @ g.T)
        scale = 2.0 * s0 * q[:, i] / (1.0 + Q)
        jac[:, :, 4 + 3 * i] = scale[:, None] * ((sticks[:, i] - ball) - common)
    return signal, jac


def lm_numpy(y, b, g, x0, n_fibres: int, iterations: int, cancelled=None):
    """Levenberg–Marquardt from ``x0`` (N, 2 + 3L), vectorised over voxels; the kernel's reference.

    Step: (JᵀJ + λ diag JᵀJ) δ = Jᵀ r, accepted when the sum of squares falls (λ /= 10),
    else λ *= 10; a voxel stops when λ > 1e20 or after ``iterations``.
    Returns x (N, 2 + 3L) and the final sum of squares (N,). ``cancelled()`` is polled
    every iteration (raising :class:`Cancelled`).
    """
    x = np.array(x0, dtype=np.float64)
    n, p = x.shape
    lam = np.full(n, LM_LAMBDA0)
    signal, jac = lm_model(x, b, g, n_fibres)
    cost = ((y - signal) ** 2).sum(axis=1)
    eye = np.eye(p)
    for _ in range(iterations):
        if cancelled is not None and cancelled():
            raise Cancelled()
        active = lam <= LM_LAMBDA_STOP
        if not active.any():
            break
        r = y - signal
        jtj = np.einsum("nmp,nmq->npq", jac, jac)
        jtr = np.einsum("nmp,nm->np", jac, r)
        diag = np.einsum("npp->np", jtj)
        system = jtj + (lam[:, None] * diag + 1e-12)[:, :, None] * eye
        ok = np.isfinite(system).all(axis=(1, 2)) & np.isfinite(jtr).all(axis=1)
        system[~ok] = eye
        delta = np.linalg.solve(system, np.where(ok[:, None], jtr, 0.0)[:, :, None])[:, :, 0]
        trial = x + delta
        trial_signal, trial_jac = lm_model(trial, b, g, n_fibres)
        with np.errstate(invalid="ignore"):
            trial_cost = ((y - trial_signal) ** 2).sum(axis=1)
        better = active & ok & (trial_cost < cost)
        x = np.where(better[:, None], trial, x)
        signal = np.where(better[:, None], trial_signal, signal)
        jac = np.where(better[:, None, None], trial_jac, jac)
        cost = np.where(better, trial_cost, cost)
        lam = np.where(active, np.where(better, lam / 10.0, lam * 10.0), lam)
    return x, cost


def lm_kernel(backend: Backend, y, b, g, x0, params: BallStickParams):
    """:func:`lm_numpy` as the CUDA kernel ``ballstick_lm`` (device arrays in and out)."""
    cp = backend.xp
    n, m = y.shape
    npl = 2 + 3 * params.n_fibres
    x_out = cp.empty((n, npl))
    cost = cp.empty(n)
    if n == 0:
        return x_out, cost
    kernel = compiled_kernel("ballstick_lm", params, m)
    per_warp = 8 * (npl * (npl + 1) // 2 + 2 * npl + (m * (npl + 1) + 1) // 2)
    warps = 2 if 2 * per_warp <= 48 * 1024 else 1
    if warps * per_warp > 48 * 1024:
        kernel.max_dynamic_shared_size_bytes = warps * per_warp
    kernel(
        ((n + warps - 1) // warps,),
        (32 * warps,),
        (
            cp.ascontiguousarray(y, dtype=cp.float32),
            cp.asarray(b, dtype=cp.float32),
            cp.asarray(g, dtype=cp.float32),
            cp.ascontiguousarray(x0, dtype=cp.float64),
            np.int64(n),
            np.int32(m),
            np.int32(params.lm_iterations),
            np.float64(LM_LAMBDA0),
            np.float64(LM_LAMBDA_STOP),
            x_out,
            cost,
        ),
        shared_mem=warps * per_warp,
    )
    return x_out, cost
