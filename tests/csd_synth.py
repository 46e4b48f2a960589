"""Synthetic diffusion signals of fibre crossings and isotropic tissues, for the CSD tests.

A fibre is a cylindrically symmetric tensor (Stejskal-Tanner, axial 1.7e-3, radial 0.3e-3
mm²/s, FA ≈ 0.80); grey matter and CSF are free diffusion (0.8e-3 and 3.0e-3 mm²/s). A voxel
sums its compartments' signals weighted by their signal fractions (S0 = ``s0`` each).
"""

from __future__ import annotations

import numpy as np

from tractlens.gpu.sh import fibonacci_hemisphere

AXIAL, RADIAL = 1.7e-3, 0.3e-3
GM_DIFFUSIVITY, CSF_DIFFUSIVITY = 0.8e-3, 3.0e-3


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def gradient_table(shells=(1000.0,), directions=64, b0=2, seed=0):
    """b-values and unit b-vectors: ``b0`` volumes at b=0, ``directions`` per shell (a Fibonacci
    hemisphere rotated differently on each shell, half of them flipped to the other side)."""
    rng = np.random.default_rng(seed)
    bvals, bvecs = [np.zeros(b0)], [np.zeros((b0, 3))]
    for b in shells:
        g = fibonacci_hemisphere(directions) @ random_rotation(rng).T
        g[::2] *= -1
        bvals.append(np.full(directions, float(b)))
        bvecs.append(g)
    return np.concatenate(bvals), np.concatenate(bvecs)


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def crossing(angle_deg: float, n_fibres: int = 2) -> np.ndarray:
    """Unit fibre directions: two at ``angle_deg`` in the xy plane, a third along z."""
    a = np.radians(angle_deg)
    fibres = [unit([1.0, 0.0, 0.2]), unit([np.cos(a), np.sin(a), 0.2])]
    if n_fibres == 3:
        fibres.append(unit([0.1, -0.2, 1.0]))
        fibres[1] = unit([0.0, 1.0, 0.1])
    return np.array(fibres[:n_fibres])


def fibre_signal(bvals, bvecs, direction, s0=100.0) -> np.ndarray:
    cos2 = (np.asarray(bvecs) @ unit(direction)) ** 2
    return s0 * np.exp(-np.asarray(bvals) * (RADIAL + (AXIAL - RADIAL) * cos2))


def voxel_signal(bvals, bvecs, fibres, fractions=None, gm=0.0, csf=0.0, s0=100.0) -> np.ndarray:
    """Signal of one voxel: fibres share ``1 - gm - csf`` in ``fractions`` (default equal)."""
    fibres = np.atleast_2d(fibres)
    fractions = np.full(len(fibres), 1.0 / len(fibres)) if fractions is None else np.asarray(fractions)
    wm = 1.0 - gm - csf
    signal = sum(wm * f * fibre_signal(bvals, bvecs, d, s0) for f, d in zip(fractions, fibres))
    bvals = np.asarray(bvals)
    return signal + s0 * (gm * np.exp(-bvals * GM_DIFFUSIVITY) + csf * np.exp(-bvals * CSF_DIFFUSIVITY))


def add_rician_noise(signal, snr: float, s0=100.0, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sigma = s0 / snr
    return np.hypot(signal + rng.normal(0, sigma, signal.shape), rng.normal(0, sigma, signal.shape))


def angle_deg(a, b) -> float:
    """Angle between two axes (antipodes equal), degrees."""
    c = abs(float(np.dot(unit(a), unit(b))))
    return float(np.degrees(np.arccos(min(1.0, c))))


def best_match_angles(found, truth) -> list[float]:
    """For each true fibre, the angle to the nearest found peak (found: (P, 3), zeros ignored)."""
    found = [p for p in np.asarray(found) if np.linalg.norm(p) > 0]
    return [min((angle_deg(p, t) for p in found), default=90.0) for t in truth]
